//! What each decode step compiles and dispatches on the XLA CPU PJRT plugin, in a process of
//! its own: the lazy backend's counters are process-wide, so no other test may run beside it
//! (the tests here take turns).

use std::path::PathBuf;

use std::sync::Mutex;
use zoo_runtime::device_map::DeviceMap;
use zoo_runtime::{lazy, DType, PjrtPlatform};

use zoo_transformers::{AutoModelForCausalLM, EngineConfig, GenerationOptions, TextGenerator};

#[path = "../../hub/tests/common/assets.rs"]
mod assets;

static TURNS: Mutex<()> = Mutex::new(());

fn load() -> TextGenerator {
    // Count what the plugin compiles, not what the disk cache holds from earlier runs.
    lazy::set_cache_dir(None);
    let plugin = assets::asset("ZOO_PJRT_CPU_PLUGIN");
    lazy::configure(PjrtPlatform::Cpu, Some(plugin), Some(4)).unwrap();
    let dir =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../nightly/fixtures/qwen3-qknorm-tied-f32");
    AutoModelForCausalLM::builder(&dir.to_string_lossy())
        .device_map(DeviceMap::Pjrt {
            platform: "cpu".into(),
            devices: Some(vec![1]),
        })
        .dtype(DType::F32)
        .load()
        .unwrap()
}

#[test]
fn decode_steps_after_the_first_compile_nothing() {
    let _turn = TURNS.lock().unwrap_or_else(|e| e.into_inner());
    let model = load();
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
    // ahead of its reads: the zero fill of its KV pool, the prefill's pick and each of the 9
    // steps after it are handed to the device without waiting.
    let before = lazy::stats();
    model
        .generate_ids(&[vec![9, 8, 7, 6]], &opts, |_| true)
        .unwrap();
    let after = lazy::stats();
    assert_eq!(after.compiles, before.compiles);
    assert_eq!(after.dispatched - before.dispatched, 11);
}

/// Requests arriving at a running engine on the plugin (paged: rows, widths and spans in a few
/// buckets): a second stream with the same arrivals and lengths but other tokens compiles no
/// program the first did not.
#[test]
fn a_steady_stream_of_joining_requests_compiles_nothing_new() {
    let _turn = TURNS.lock().unwrap_or_else(|e| e.into_inner());
    let model = load();
    let mut engine = model.engine(EngineConfig::new(4, 256)).unwrap();
    assert!(engine.kv_blocks().is_some(), "the cache is paged");
    let opts = GenerationOptions {
        eos_token_ids: Some(vec![]),
        ..GenerationOptions::greedy(12)
    };
    let mut stream = |offset: u32| {
        let arrivals = [0, 0, 3, 5, 6, 9, 14, 15];
        let (mut added, mut step) = (0, 0);
        while added < arrivals.len() || !engine.is_idle() {
            while added < arrivals.len() && arrivals[added] <= step {
                let len = 3 + (added * 5) % 11;
                let prompt = (0..len as u32).map(|i| 1 + (i * 7 + offset) % 90).collect();
                engine.add(prompt, opts.clone()).unwrap();
                added += 1;
            }
            engine.step().unwrap();
            step += 1;
            assert!(step < 200, "the engine never went idle");
        }
    };
    stream(0);
    let before = lazy::stats().compiles;
    stream(13);
    assert_eq!(lazy::stats().compiles, before, "the second stream compiled");
}
