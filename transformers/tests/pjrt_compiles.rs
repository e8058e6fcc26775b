//! What each decode step compiles and dispatches on the XLA CPU PJRT plugin, in a process of
//! its own: the lazy backend's counters are process-wide, so no other test may run beside it.

use std::path::PathBuf;

use zoo_runtime::device_map::DeviceMap;
use zoo_runtime::{lazy, DType, PjrtPlatform};
use zoo_transformers::{AutoModelForCausalLM, GenerationOptions};

#[path = "../../hub/tests/common/assets.rs"]
mod assets;

#[test]
fn decode_steps_after_the_first_compile_nothing() {
    let plugin = assets::asset("ZOO_PJRT_CPU_PLUGIN");
    lazy::configure(PjrtPlatform::Cpu, Some(plugin), Some(4)).unwrap();
    let dir =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../nightly/fixtures/qwen3-qknorm-tied-f32");
    let model = AutoModelForCausalLM::builder(&dir.to_string_lossy())
        .device_map(DeviceMap::Pjrt {
            platform: "cpu".into(),
            devices: Some(vec![1]),
        })
        .dtype(DType::F32)
        .load()
        .unwrap();
    let opts = GenerationOptions {
        min_new_tokens: 10,
        repetition_penalty: Some(1.3),
        ..GenerationOptions::greedy(10)
    };
    let mut compiles = Vec::new();
    model
        .generate_ids(&[vec![1, 2, 3, 4, 5, 6, 7]], &opts, |_| {
            compiles.push(lazy::stats().compiles);
            true
        })
        .unwrap();
    assert_eq!(compiles.len(), 10);
    // Token 1 ends the prefill, token 2 the first decode step (its program is compiled or
    // found); every later step reuses that program.
    assert!(
        compiles[2..].iter().all(|&c| c == compiles[1]),
        "compiles after each token: {compiles:?}"
    );
    // A second call whose prompt lands in the same bucket compiles nothing at all, and runs
    // ahead of its reads: the prefill's pick and each of the 9 steps after it are handed to
    // the device without waiting.
    let before = lazy::stats();
    model
        .generate_ids(&[vec![9, 8, 7, 6]], &opts, |_| true)
        .unwrap();
    let after = lazy::stats();
    assert_eq!(after.compiles, before.compiles);
    assert_eq!(after.dispatched - before.dispatched, 10);
}
