//! Parity with transformers on every committed Llama-family fixture (nightly/fixtures), on
//! candle CPU: logits, hidden states and per-layer outputs of a full forward, the logits of
//! each cached decode step, and the greedy tokens of `generate`.
//!
//! Every case folder whose `model_type` is llama, mistral, qwen2 or qwen3 is run; the list
//! is read from disk, so new cases are picked up without editing this file.

use std::path::{Path, PathBuf};

use serde_json::Value;
use zoo_runtime::device_map::DeviceMap;
use zoo_runtime::{DType, Device, Tensor};
use zoo_transformers::{AutoModelForCausalLM, CausalLM, ForwardArgs, GenerationOptions, LogitsFor};

const FAMILIES: [&str; 4] = ["llama", "mistral", "qwen2", "qwen3"];

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../nightly/fixtures")
}

struct Case {
    dir: PathBuf,
    json: Value,
    inputs: zoo_hub::Weights,
    expected: zoo_hub::Weights,
}

impl Case {
    fn tensor_f32(w: &zoo_hub::Weights, name: &str) -> (Vec<f32>, Vec<usize>) {
        let v = w.tensor(name).unwrap_or_else(|e| panic!("{name}: {e}"));
        (v.to_f32().unwrap(), v.info.shape.clone())
    }
    fn tensor_i64(w: &zoo_hub::Weights, name: &str) -> (Vec<i64>, Vec<usize>) {
        let v = w.tensor(name).unwrap_or_else(|e| panic!("{name}: {e}"));
        (v.to_i64().unwrap(), v.info.shape.clone())
    }
    fn name(&self) -> &str {
        self.json["name"].as_str().unwrap_or("?")
    }
    fn dtype(&self) -> DType {
        match self.json["dtype"].as_str() {
            Some("bf16") => DType::BF16,
            Some("f16") => DType::F16,
            _ => DType::F32,
        }
    }
    fn tol(&self, output: &str) -> (f64, f64) {
        let entry = self.json["outputs"]
            .as_array()
            .and_then(|o| o.iter().find(|e| e["name"] == output))
            .and_then(|e| e.get("tolerance"))
            .unwrap_or(&self.json["tolerance"]);
        (
            entry["atol"].as_f64().unwrap(),
            entry["rtol"].as_f64().unwrap(),
        )
    }
    fn has_output(&self, name: &str) -> bool {
        self.json["outputs"]
            .as_array()
            .is_some_and(|o| o.iter().any(|e| e["name"] == name))
    }
}

fn cases() -> Vec<Case> {
    let mut out = Vec::new();
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(fixtures())
        .expect("nightly/fixtures must exist")
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("case.json").is_file())
        .collect();
    dirs.sort();
    for dir in dirs {
        let json: Value =
            serde_json::from_slice(&std::fs::read(dir.join("case.json")).unwrap()).unwrap();
        if !FAMILIES.contains(&json["model_type"].as_str().unwrap_or("")) {
            continue;
        }
        assert_eq!(
            json["format_version"],
            1,
            "{}: unknown case format",
            dir.display()
        );
        assert_eq!(
            json["checkpoint"]["format"],
            "safetensors",
            "{}",
            dir.display()
        );
        let inputs = zoo_hub::Weights::from_safetensors(&[dir.join("inputs.safetensors")]).unwrap();
        let expected =
            zoo_hub::Weights::from_safetensors(&[dir.join("expected.safetensors")]).unwrap();
        out.push(Case {
            dir,
            json,
            inputs,
            expected,
        });
    }
    out
}

/// Worst violation of `|a - e| <= atol + rtol |e|` over rows whose mask is set (`mask` is
/// per `[batch, seq]` row of the trailing dim, `None` compares everything).
fn check(
    case: &str,
    what: &str,
    actual: &[f32],
    expected: &[f32],
    row: usize,
    mask: Option<&[i64]>,
    tol: (f64, f64),
) -> Result<f64, String> {
    if actual.len() != expected.len() {
        return Err(format!(
            "{case}: {what}: {} values, expected {}",
            actual.len(),
            expected.len()
        ));
    }
    let mut worst = 0f64;
    for (i, (a, e)) in actual.iter().zip(expected).enumerate() {
        if mask.is_some_and(|m| m[i / row] == 0) {
            continue;
        }
        let (a, e) = (*a as f64, *e as f64);
        let diff = (a - e).abs();
        if diff.is_nan() || diff > tol.0 + tol.1 * e.abs() {
            return Err(format!("{case}: {what}: element {i}: got {a}, expected {e} (|diff| {diff} > atol {} + rtol {} * |e|)", tol.0, tol.1));
        }
        worst = worst.max(diff);
    }
    Ok(worst)
}

fn to_f32(t: &Tensor) -> Vec<f32> {
    t.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap()
}

fn run_case(case: &Case, model: &CausalLM) -> Result<String, String> {
    let name = case.name();
    let lm = model.model();
    let (ids, shape) = Case::tensor_i64(&case.inputs, "input_ids");
    let (mask, _) = Case::tensor_i64(&case.inputs, "attention_mask");
    let (pos, _) = Case::tensor_i64(&case.inputs, "position_ids");
    let (b, t) = (shape[0], shape[1]);
    let input = Tensor::from_vec(ids.clone(), &[b, t], &Device::Cpu).unwrap();
    let positions = Tensor::from_vec(pos, &[b, t], &Device::Cpu).unwrap();
    let rows: Vec<Vec<bool>> = mask
        .chunks(t)
        .map(|r| r.iter().map(|&m| m != 0).collect())
        .collect();
    let mut cache = lm.model().new_cache(b, t + 32).map_err(|e| e.to_string())?;
    let args = ForwardArgs {
        input_ids: &input,
        position_ids: &positions,
        attention_mask: Some(&rows),
        output_hidden_states: true,
    };
    let (logits, out) = lm
        .forward(args, &mut cache, LogitsFor::All)
        .map_err(|e| format!("{name}: forward: {e}"))?;
    let mut report = Vec::new();
    let vocab = logits.shape()[2];
    let (exp, _) = Case::tensor_f32(&case.expected, "logits");
    let mut errors = Vec::new();
    match check(
        name,
        "logits",
        &to_f32(&logits),
        &exp,
        vocab,
        Some(&mask),
        case.tol("logits"),
    ) {
        Ok(worst) => report.push(format!("logits {worst:.1e}")),
        Err(e) => errors.push(e),
    }
    let hidden = out.last_hidden_state.shape()[2];
    let (exp, _) = Case::tensor_f32(&case.expected, "last_hidden_state");
    if let Err(e) = check(
        name,
        "last_hidden_state",
        &to_f32(&out.last_hidden_state),
        &exp,
        hidden,
        Some(&mask),
        case.tol("last_hidden_state"),
    ) {
        errors.push(e);
    }
    let mut points = vec![("model.embed_tokens.output".to_string(), 0usize)];
    for i in 0..out.hidden_states.len() - 1 {
        points.push((format!("model.layers.{i}.output"), i + 1));
    }
    for (point, idx) in points {
        if case.has_output(&point) {
            let (exp, _) = Case::tensor_f32(&case.expected, &point);
            if let Err(e) = check(
                name,
                &point,
                &to_f32(&out.hidden_states[idx]),
                &exp,
                hidden,
                Some(&mask),
                case.tol(&point),
            ) {
                errors.push(e);
            }
        }
    }
    if !errors.is_empty() {
        // Every failing point is reported, so the first layer that drifts is visible.
        return Err(errors.join("\n  "));
    }

    // Cached decoding, teacher-forced with the reference's tokens: the logits of every step.
    let gen = &case.json["generation"];
    let (gen_ids, gshape) = Case::tensor_i64(&case.expected, "generated_ids");
    let steps = gshape[1];
    let (gen_logits, _) = Case::tensor_f32(&case.expected, "generated_logits");
    let real: Vec<i64> = rows
        .iter()
        .map(|r| r.iter().filter(|&&m| m).count() as i64)
        .collect();
    let mut cache = lm
        .model()
        .new_cache(b, t + steps)
        .map_err(|e| e.to_string())?;
    let args = ForwardArgs {
        input_ids: &input,
        position_ids: &positions,
        attention_mask: Some(&rows),
        output_hidden_states: false,
    };
    let (mut step_logits, _) = lm
        .forward(args, &mut cache, LogitsFor::Last)
        .map_err(|e| e.to_string())?;
    let tol = case.tol("generated_logits");
    for s in 0..steps {
        let got = to_f32(&step_logits);
        let want: Vec<f32> = (0..b)
            .flat_map(|r| gen_logits[(r * steps + s) * vocab..(r * steps + s + 1) * vocab].to_vec())
            .collect();
        check(
            name,
            &format!("generated_logits step {s}"),
            &got,
            &want,
            vocab,
            None,
            tol,
        )?;
        if s + 1 == steps {
            break;
        }
        let next: Vec<i64> = (0..b).map(|r| gen_ids[r * steps + s]).collect();
        let p: Vec<i64> = real.iter().map(|&n| n + s as i64).collect();
        let ids = Tensor::from_vec(next, &[b, 1], &Device::Cpu).unwrap();
        let p = Tensor::from_vec(p, &[b, 1], &Device::Cpu).unwrap();
        let args = ForwardArgs {
            input_ids: &ids,
            position_ids: &p,
            attention_mask: None,
            output_hidden_states: false,
        };
        step_logits = lm
            .forward(args, &mut cache, LogitsFor::Last)
            .map_err(|e| e.to_string())?
            .0;
    }
    report.push(format!("{steps} cached steps"));

    // generate(): greedy tokens identical.
    let prompts: Vec<Vec<u32>> = (0..b)
        .map(|r| {
            (0..t)
                .filter(|&i| mask[r * t + i] != 0)
                .map(|i| ids[r * t + i] as u32)
                .collect()
        })
        .collect();
    let opts = GenerationOptions {
        max_new_tokens: gen["max_new_tokens"].as_u64().unwrap() as usize,
        min_new_tokens: gen["min_new_tokens"].as_u64().unwrap_or(0) as usize,
        eos_token_ids: Some(vec![gen["eos_token_id"].as_u64().unwrap() as u32]),
        ..Default::default()
    };
    let (outs, _) = model
        .generate_ids(&prompts, &opts, |_| true)
        .map_err(|e| format!("{name}: generate: {e}"))?;
    for (r, o) in outs.iter().enumerate() {
        let want: Vec<u32> = gen_ids[r * steps..(r + 1) * steps]
            .iter()
            .map(|&v| v as u32)
            .collect();
        if o.token_ids != want {
            return Err(format!(
                "{name}: row {r}: greedy tokens {:?}, transformers {:?}",
                o.token_ids, want
            ));
        }
    }
    report.push(format!("{steps} greedy tokens equal"));
    Ok(report.join(", "))
}

#[test]
fn every_llama_family_fixture_matches_transformers() {
    let cases = cases();
    assert!(
        cases.len() >= 4,
        "expected Llama-family fixtures in {}",
        fixtures().display()
    );
    let mut failures = Vec::new();
    let mut seen_families = std::collections::BTreeSet::new();
    let mut seen_dtypes = std::collections::BTreeSet::new();
    for case in &cases {
        let model = AutoModelForCausalLM::builder(case.dir.to_str().unwrap())
            .device_map(DeviceMap::Cpu)
            .dtype(case.dtype())
            .load();
        let result = model
            .map_err(|e| format!("{}: load: {e}", case.name()))
            .and_then(|m| run_case(case, &m));
        match result {
            Ok(r) => {
                eprintln!("pass {}: {r}", case.name());
                seen_families.insert(case.json["model_type"].as_str().unwrap().to_string());
                seen_dtypes.insert(case.json["dtype"].as_str().unwrap().to_string());
            }
            Err(e) => failures.push(e),
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
    eprintln!(
        "{} cases passed; families {seen_families:?}, dtypes {seen_dtypes:?}",
        cases.len()
    );
}
