//! The committed fixtures load, agree with their own case.json, stay within the size
//! budget, and the metrics judge them as the README says.

use std::path::{Path, PathBuf};

use zoo_nightly::case::{discover, Case, CaseDtype, CompareKind, Task};
use zoo_nightly::metrics::{compare_close, Tolerance};
use zoo_nightly::HostTensor;

fn fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures")
}

fn all_cases() -> Vec<Case> {
    let dirs = discover(&fixtures_dir()).expect("nightly/fixtures is readable");
    assert!(
        !dirs.is_empty(),
        "no fixtures found: run nightly/reference/generate.py"
    );
    dirs.iter()
        .map(|d| Case::load(d).unwrap_or_else(|e| panic!("{e}")))
        .collect()
}

fn dir_size(path: &Path) -> u64 {
    std::fs::read_dir(path)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let meta = e.metadata().unwrap();
            if meta.is_dir() {
                dir_size(&e.path())
            } else {
                meta.len()
            }
        })
        .sum()
}

#[test]
fn fixture_set_is_complete_and_under_budget() {
    let cases = all_cases();
    let names: Vec<&str> = cases.iter().map(|c| c.name()).collect();
    for arch in [
        "LlamaForCausalLM",
        "MistralForCausalLM",
        "Qwen2ForCausalLM",
        "Qwen3ForCausalLM",
        "BertModel",
    ] {
        let of_arch: Vec<&Case> = cases
            .iter()
            .filter(|c| c.spec.architecture == arch)
            .collect();
        assert!(of_arch.len() >= 3, "{arch}: only {} cases", of_arch.len());
        assert!(
            of_arch.iter().any(|c| c.spec.dtype == CaseDtype::Bf16),
            "{arch}: no bf16 case"
        );
    }
    for feature in [
        "gqa",
        "mha",
        "mqa",
        "tied",
        "untied",
        "head-dim",
        "rope:linear",
        "rope:dynamic",
        "rope:llama3",
        "rope:yarn",
        "attention-bias",
        "mlp-bias",
        "qkv-bias",
        "qk-norm",
        "sliding-window",
        "left-padding",
    ] {
        assert!(
            cases
                .iter()
                .any(|c| c.spec.features.iter().any(|f| f == feature)),
            "no case covers {feature}"
        );
    }
    for case in &cases {
        assert_eq!(
            case.dir.file_name().unwrap().to_str().unwrap(),
            case.name(),
            "folder != name"
        );
    }
    let size = dir_size(&fixtures_dir());
    // Room for every family's cases at the fixtures' tiny sizes (the encoder families of #54
    // brought it past 24 MiB, the adapters and quantized checkpoints of #55 past 28,
    // ModernBERT's past 30).
    assert!(
        size < 32 * 1024 * 1024,
        "fixtures take {size} bytes; the budget is 32 MiB"
    );
    assert!(names.len() >= 20);
}

#[test]
fn checkpoints_and_provenance_are_present() {
    for case in all_cases() {
        let ckpt = case.checkpoint_path();
        // A GGUF case's config is the one zoo-hub rebuilds from the file's metadata.
        let config: serde_json::Value = if case.spec.checkpoint.format == "gguf" {
            assert!(ckpt.is_file(), "{}: no {}", case.name(), ckpt.display());
            zoo_hub::gguf::open(&ckpt).unwrap().config
        } else {
            assert!(
                ckpt.join("config.json").is_file(),
                "{}: no config.json",
                case.name()
            );
            assert!(
                ckpt.join("model.safetensors").is_file(),
                "{}: no weights",
                case.name()
            );
            serde_json::from_str(&std::fs::read_to_string(ckpt.join("config.json")).unwrap())
                .unwrap()
        };
        assert_eq!(config["architectures"][0], case.spec.architecture.as_str());
        assert_eq!(config["model_type"], case.spec.model_type.as_str());
        let reference = &case.spec.reference;
        assert!(
            reference.command.contains("generate.py"),
            "{}",
            reference.command
        );
        for lib in ["torch", "transformers", "safetensors"] {
            assert!(
                reference.library_versions.contains_key(lib),
                "{}: no {lib} version",
                case.name()
            );
        }
        let expected_tol = match case.spec.dtype {
            CaseDtype::F32 => Tolerance {
                atol: 1e-4,
                rtol: 1e-4,
            },
            CaseDtype::Bf16 | CaseDtype::F16 => Tolerance {
                atol: 2e-2,
                rtol: 2e-2,
            },
        };
        assert_eq!(case.spec.tolerance, expected_tol, "{}", case.name());
    }
}

/// The reference output compared with itself passes with zero error, on every output.
#[test]
fn every_output_matches_itself() {
    for case in all_cases() {
        for entry in &case.spec.outputs {
            let report = case
                .compare_output(&entry.name, &case.expected[&entry.name])
                .unwrap();
            assert!(report.passed, "{}/{}", case.name(), entry.name);
            if let Some(close) = &report.close {
                assert_eq!(close.max_abs_diff, 0.0);
                assert!(close.compared > 0);
                // Argmax is kept where rows are whole: not for a span's start and end
                // logits, masked per position.
                let span = matches!(entry.name.as_str(), "start_logits" | "end_logits");
                if entry.name.ends_with("logits") && !span {
                    assert_eq!(close.top1_agreement, Some(1.0), "{}", case.name());
                }
            }
        }
    }
}

/// A port off by more than the tolerance at one real position fails; within the
/// tolerance it passes; off at a padding position it passes (the mask skips it).
#[test]
fn tolerance_and_mask_decide_logits() {
    for case in all_cases()
        .into_iter()
        .filter(|c| c.spec.task == Task::CausalLm)
    {
        let expected = &case.expected["logits"];
        let values = expected.as_f32().unwrap();
        let tol = case.spec.tolerance;
        let mask = case.inputs["attention_mask"].as_i64().unwrap();
        let vocab = *expected.shape.last().unwrap();
        let real = mask.iter().position(|m| *m == 1).unwrap() * vocab;

        let nudge = |index: usize, by: f64| {
            let mut v = values.to_vec();
            v[index] += by as f32;
            case.compare_output("logits", &HostTensor::f32(expected.shape.clone(), v))
                .unwrap()
        };
        let limit = tol.atol + tol.rtol * f64::from(values[real]).abs();
        let fail = nudge(real, 3.0 * limit);
        assert!(!fail.passed, "{}", case.name());
        let close = fail.close.unwrap();
        assert_eq!(close.mismatched, 1);
        assert!(close.max_abs_diff > limit);
        assert!(close.cosine > 0.99);
        assert!(nudge(real, 0.4 * limit).passed, "{}", case.name());

        if let Some(pad) = mask.iter().position(|m| *m == 0) {
            assert!(
                nudge(pad * vocab, 1e3).passed,
                "{}: padding was compared",
                case.name()
            );
        }
    }
}

/// The reference is self-consistent: the full forward's last-position logits equal the
/// first cached greedy step's, and each greedy token is the argmax of its step's logits
/// with eos suppressed (min_new_tokens).
#[test]
fn greedy_tokens_follow_the_recorded_logits() {
    for case in all_cases()
        .into_iter()
        .filter(|c| c.spec.task == Task::CausalLm)
    {
        let generation = case
            .spec
            .generation
            .as_ref()
            .expect("causal-lm cases record generation");
        assert!(!generation.do_sample);
        let eos = generation.eos_token_id.as_ref().unwrap().to_vec();
        let ids = case.expected["generated_ids"].as_i64().unwrap();
        let step_logits = &case.expected["generated_logits"];
        let [batch, steps, vocab] = step_logits.shape[..] else {
            panic!("generated_logits is 3-D")
        };
        assert_eq!(
            case.expected["generated_ids"].shape,
            vec![batch, generation.max_new_tokens]
        );
        assert_eq!(steps, generation.max_new_tokens);
        let logits = step_logits.as_f32().unwrap();
        for b in 0..batch {
            for s in 0..steps {
                let row = &logits[(b * steps + s) * vocab..(b * steps + s + 1) * vocab];
                let best = (0..vocab)
                    .filter(|t| !(s < generation.min_new_tokens && eos.contains(&(*t as i64))))
                    .fold(None, |best: Option<usize>, t| match best {
                        Some(i) if row[i] >= row[t] => Some(i),
                        _ => Some(t),
                    })
                    .unwrap();
                assert_eq!(
                    ids[b * steps + s],
                    best as i64,
                    "{} row {b} step {s}",
                    case.name()
                );
            }
        }

        let full = &case.expected["logits"];
        let seq = full.shape[1];
        let full_values = full.as_f32().unwrap();
        let last: Vec<f32> = (0..batch)
            .flat_map(|b| {
                full_values[(b * seq + seq - 1) * vocab..(b * seq + seq) * vocab].to_vec()
            })
            .collect();
        let first_step: Vec<f32> = (0..batch)
            .flat_map(|b| logits[b * steps * vocab..(b * steps + 1) * vocab].to_vec())
            .collect();
        let report = compare_close(
            &last,
            &first_step,
            &[batch, vocab],
            None,
            case.spec.tolerance,
        )
        .unwrap();
        assert!(
            report.passed,
            "{}: cached step 0 differs from the full forward: {report:?}",
            case.name()
        );
    }
}

/// bf16 and f16 cases store f32 outputs that are exact upcasts of values of that dtype.
#[test]
fn half_precision_outputs_are_exact_upcasts() {
    let mut checked = 0;
    for case in all_cases() {
        let representable: fn(f32) -> bool = match case.spec.dtype {
            CaseDtype::F32 => continue,
            CaseDtype::Bf16 => |v| half::bf16::from_f32(v).to_f32() == v,
            CaseDtype::F16 => |v| half::f16::from_f32(v).to_f32() == v,
        };
        for entry in case
            .spec
            .outputs
            .iter()
            .filter(|e| e.compare == Some(CompareKind::Allclose))
        {
            let values = case.expected[&entry.name].as_f32().unwrap();
            assert_eq!(entry.dtype, "F32");
            assert!(
                values.iter().all(|v| representable(*v)),
                "{}/{}: not an upcast from {}",
                case.name(),
                entry.name,
                case.spec.dtype.as_str()
            );
            checked += 1;
        }
    }
    assert!(checked > 0);
}
