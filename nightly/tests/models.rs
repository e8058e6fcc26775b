//! Parity with transformers on every committed fixture, through the harness: each case of
//! a registered family passes on candle-cpu and on one device of the XLA CPU PJRT plugin
//! (pjrt-cpu); one case of each architecture and checkpoint format also passes split over
//! four of its devices in stages (pjrt-cpu-x4; the split is the family's layout, the same
//! for every case of it), with every layer split over a mesh of four (pjrt-cpu-tp4, the
//! family's tensor-parallel plan) and in two stages of two-device meshes (pjrt-cpu-tp2pp2);
//! the nightly workflow runs every case on all of them. Decoders (Llama, Mistral,
//! Qwen2, Qwen3, GPT-2): logits, hidden states, per-layer outputs, the logits of each cached
//! decode step fed the reference's tokens, and the greedy tokens of `generate`. Encoders
//! (BERT and its masked-LM, sequence- and token-classification heads): hidden states,
//! pooled output, per-layer outputs, head logits. Architectures zoo has no model
//! for are errors, never passes. A missing PJRT plugin fails the PJRT results.
//!
//! The case list is read from disk, so new fixtures are picked up without editing this file.

use std::collections::BTreeSet;
use std::path::Path;

use zoo_nightly::harness::{self, Backend};
use zoo_nightly::Status;

#[path = "../../hub/tests/common/assets.rs"]
mod assets;

#[test]
fn every_fixture_runs_and_every_registered_case_matches_transformers() {
    let plugin = assets::asset("ZOO_PJRT_CPU_PLUGIN");
    zoo_runtime::lazy::configure(zoo_runtime::PjrtPlatform::Cpu, Some(plugin), Some(4)).unwrap();
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures");
    let out = tempfile::tempdir().unwrap();
    let backends = [Backend::CandleCpu, Backend::PjrtCpu];
    let summary =
        harness::run(std::slice::from_ref(&fixtures), &backends, &[], out.path()).unwrap();
    let cases = zoo_nightly::case::discover(&fixtures).unwrap();
    let mut kinds = BTreeSet::new();
    let split: Vec<_> = cases
        .iter()
        .filter(|dir| {
            let spec = zoo_nightly::case::CaseSpec::read(dir).unwrap();
            kinds.insert((spec.architecture, spec.checkpoint.format))
        })
        .cloned()
        .collect();
    let out_x4 = tempfile::tempdir().unwrap();
    let split_backends = [
        Backend::PjrtCpuX4,
        Backend::PjrtCpuTp4,
        Backend::PjrtCpuTp2Pp2,
    ];
    let summary_x4 = harness::run(&split, &split_backends, &[], out_x4.path()).unwrap();
    assert_eq!(
        summary.run.results.len(),
        backends.len() * cases.len(),
        "one result per case × backend"
    );
    assert_eq!(
        summary_x4.run.results.len(),
        split_backends.len() * split.len()
    );

    let supported = harness::supported_architectures();
    let mut failures = Vec::new();
    let mut architectures = BTreeSet::new();
    let mut dtypes = BTreeSet::new();
    for r in summary.run.results.iter().chain(&summary_x4.run.results) {
        let ported = supported.contains(&r.architecture.as_str());
        let want = if ported {
            Status::Passed
        } else {
            Status::Error
        };
        if r.status != want {
            let bad: Vec<&str> = r
                .outputs
                .iter()
                .filter(|o| !o.passed)
                .map(|o| o.name.as_str())
                .collect();
            failures.push(format!(
                "{} on {}: {} (want {}), failing outputs {bad:?}, worst {:?}, {}",
                r.case,
                r.backend,
                r.status.as_str(),
                want.as_str(),
                r.worst,
                r.message.as_deref().unwrap_or("")
            ));
        }
        if r.status == Status::Passed {
            architectures.insert(r.architecture.clone());
            dtypes.insert(r.dtype.clone());
            let generates = zoo_transformers::registry::by_architecture(&r.architecture)
                .is_some_and(|(f, a)| {
                    f.is_decoder() && a.task == zoo_transformers::registry::Task::CausalLm
                });
            if generates {
                assert_eq!(r.worst.greedy_match, Some(true), "{}", r.case);
                // The generator keeps greedy steps clear of near-ties, not every prompt
                // position: a 16-bit port that rounds one op differently (GPT-2's
                // `gelu_new` runs fused in f32 here, step by step in bf16 there) may flip
                // a prompt position's argmax within tolerance, as the upcast bf16 case does.
                if r.dtype == "f32" {
                    assert_eq!(r.worst.top1_agreement, Some(1.0), "{}", r.case);
                }
            }
        }
        if !ported {
            let m = r.message.as_deref().unwrap_or("");
            assert!(m.contains("unsupported"), "{}: {m}", r.case);
        }
    }
    assert!(
        failures.is_empty(),
        "{} results off:\n{}",
        failures.len(),
        failures.join("\n")
    );
    // Every registered family is proven by at least one passing case.
    for f in zoo_transformers::registry::FAMILIES {
        assert!(
            f.architectures
                .iter()
                .any(|a| architectures.contains(a.name)),
            "no passing case for `{}` (passing: {architectures:?})",
            f.model_type
        );
    }
    assert!(
        ["f32", "bf16", "f16"].iter().all(|d| dtypes.contains(*d)),
        "{dtypes:?}"
    );
    assert!(summary.results_path.is_file());
}
