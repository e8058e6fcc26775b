//! Llama-family models on the XLA CPU PJRT plugin (4 devices): one device, split over four,
//! what each decode step compiles, sampling on the device, and the device maps that resolve
//! to PJRT devices or refuse at once. Parity with transformers on PJRT is checked per fixture
//! by `nightly/tests/models.rs`; SmolLM2 on PJRT by `smollm2.rs`.
//!
//! `ZOO_PJRT_CPU_PLUGIN` names the plugin; when unset, `scripts/fetch-test-assets.sh` obtains
//! it. A missing plugin fails these tests.

use std::path::PathBuf;

use zoo_runtime::device_map::{DeviceMap, ExplicitMap};
use zoo_runtime::{lazy, DType, Device, PjrtPlatform, Tensor};
use zoo_transformers::{
    AutoModelForCausalLM, AutoModelForSeq2SeqLM, Error, GenerationOptions, TextGenerator,
};
use zoo_transformers::{ForwardArgs, LogitsFor};

#[path = "../../hub/tests/common/assets.rs"]
mod assets;

fn setup() {
    let plugin = assets::asset("ZOO_PJRT_CPU_PLUGIN");
    lazy::configure(PjrtPlatform::Cpu, Some(plugin), Some(4)).unwrap();
    // Comparisons with candle need f32 matmuls at full precision (process-wide; part of
    // every graph's key).
    lazy::set_matmul_precision(lazy::Precision::Highest);
}

/// A tiny Llama checkpoint made by the reference generator (GQA, 4 layers, f32).
fn fixture(name: &str) -> String {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../nightly/fixtures")
        .join(name);
    dir.to_string_lossy().into_owned()
}

fn pjrt(devices: &[usize]) -> DeviceMap {
    DeviceMap::Pjrt {
        platform: "cpu".into(),
        devices: Some(devices.to_vec()),
    }
}

fn load(case: &str, map: DeviceMap) -> TextGenerator {
    AutoModelForCausalLM::builder(&fixture(case))
        .device_map(map)
        .dtype(DType::F32)
        .load()
        .unwrap_or_else(|e| panic!("{case}: {e}"))
}

/// All-position logits of a left-padded batch of two prompts, as f32 on the host.
fn logits(model: &TextGenerator) -> Vec<f32> {
    let device = model.load_report().device;
    let ids: Vec<i64> = vec![0, 0, 5, 17, 3, 9, 11, 2, 8, 40, 7, 1, 6, 12];
    let pos: Vec<i64> = vec![0, 0, 0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 5, 6];
    let mask: Vec<Vec<bool>> = vec![
        (0..7).map(|i| i >= 2).collect(),
        (0..7).map(|_| true).collect(),
    ];
    let input = Tensor::from_vec(ids, &[2, 7], &device).unwrap();
    let positions = Tensor::from_vec(pos, &[2, 7], &device).unwrap();
    let lm = model.model();
    let mut cache = lm.model().new_cache(2, 7).unwrap();
    let args = ForwardArgs {
        input_ids: &input,
        position_ids: &positions,
        attention_mask: Some(&mask),
        output_hidden_states: false,
        inputs_embeds: None,
    };
    let (logits, _) = lm.forward(args, &mut cache, LogitsFor::All).unwrap();
    logits
        .to_dtype(DType::F32)
        .unwrap()
        .to_vec::<f32>()
        .unwrap()
}

#[test]
fn a_model_split_over_four_devices_equals_one_device() {
    setup();
    let one = load("llama-gqa-f32", pjrt(&[0]));
    let four = load("llama-gqa-f32", pjrt(&[0, 1, 2, 3]));
    let report = four.load_report();
    let devices: Vec<String> = report.devices.iter().map(|d| d.to_string()).collect();
    eprintln!("{}", report.plan.as_ref().expect("a split is planned"));
    assert!(
        devices.len() >= 2 && devices.iter().all(|d| d.starts_with("pjrt:cpu:")),
        "a balanced plan spreads the stages: {devices:?}"
    );
    // Each layer's KV cache lives where its layer runs.
    let cache = four.model().model().new_cache(1, 8).unwrap();
    assert_ne!(
        cache.devices()[0],
        cache.devices()[1],
        "{:?}",
        cache.devices()
    );

    let (a, b) = (logits(&one), logits(&four));
    assert_eq!(a.len(), b.len());
    let worst = a
        .iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs() / x.abs().max(1e-3))
        .fold(0f32, f32::max);
    assert!(worst <= 1e-6, "split vs one device: max rel diff {worst}");

    // Greedy generation agrees too, through the transfers at every cut.
    let opts = GenerationOptions {
        min_new_tokens: 12,
        ..GenerationOptions::greedy(12)
    };
    let prompts = [vec![3, 14, 15, 9, 2], vec![6, 5]];
    let (x, _) = one.generate_ids(&prompts, &opts, |_| true).unwrap();
    let (y, _) = four.generate_ids(&prompts, &opts, |_| true).unwrap();
    for (x, y) in x.iter().zip(&y) {
        assert_eq!(x.token_ids, y.token_ids);
        assert_eq!(x.token_ids.len(), 12);
    }
}

#[test]
fn tensor_parallel_maps_equal_one_device() {
    setup();
    let one = load("llama-gqa-f32", pjrt(&[0]));
    let tp = |s: &str| s.parse::<DeviceMap>().expect("a tp map");
    let four = load("llama-gqa-f32", tp("tp:pjrt:cpu:0,1,2,3"));
    assert_eq!(
        four.load_report().device.to_string(),
        "pjrt:cpu:0,1,2,3[model=4]"
    );
    // Two stages, each a mesh of two devices.
    let two_by_two = load("llama-gqa-f32", tp("tp2:pjrt:cpu:0,1,2,3"));
    let report = two_by_two.load_report();
    eprintln!("{}", report.plan.as_ref().expect("stages are planned"));
    let cache = two_by_two.model().model().new_cache(1, 8).unwrap();
    let stages: Vec<String> = cache.devices().iter().map(|d| d.to_string()).collect();
    assert!(
        stages.contains(&"pjrt:cpu:0,1[model=2]".to_string())
            && stages.contains(&"pjrt:cpu:2,3[model=2]".to_string()),
        "{stages:?}"
    );
    // Each layer's attention and MLP end in a row-parallel product: XLA sums their partial
    // products across the mesh (two all-reduces per layer at least).
    let device = four.load_report().device;
    let input = Tensor::from_vec(vec![5i64, 17, 3], &[1, 3], &device).unwrap();
    let positions = Tensor::from_vec(vec![0i64, 1, 2], &[1, 3], &device).unwrap();
    let mut cache = four.model().model().new_cache(1, 3).unwrap();
    let args = ForwardArgs {
        input_ids: &input,
        position_ids: &positions,
        attention_mask: None,
        output_hidden_states: false,
        inputs_embeds: None,
    };
    let (pending, _) = four
        .model()
        .forward(args, &mut cache, LogitsFor::All)
        .unwrap();
    let collectives = lazy::collectives(&[&pending]).unwrap();
    let all_reduces: usize = collectives
        .iter()
        .filter(|(op, _)| op.starts_with("all-reduce"))
        .map(|(_, n)| n)
        .sum();
    eprintln!("collectives of a tp4 forward: {collectives:?}");
    assert!(all_reduces >= 2 * 2, "{collectives:?}");
    drop((pending, cache));
    let a = logits(&one);
    for model in [&four, &two_by_two] {
        let b = logits(model);
        // Partial products are summed across devices in another order: differences are
        // rounding, relative to the logits' scale.
        let scale = a.iter().map(|x| x.abs()).fold(0f32, f32::max);
        let worst = a
            .iter()
            .zip(&b)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max);
        assert!(
            worst <= 1e-5 * scale,
            "tensor parallel vs one device: max abs diff {worst} at scale {scale}"
        );
    }
    let opts = GenerationOptions {
        min_new_tokens: 12,
        ..GenerationOptions::greedy(12)
    };
    let prompts = [vec![3, 14, 15, 9, 2], vec![6, 5]];
    let (x, _) = one.generate_ids(&prompts, &opts, |_| true).unwrap();
    for model in [&four, &two_by_two] {
        let (y, _) = model.generate_ids(&prompts, &opts, |_| true).unwrap();
        for (x, y) in x.iter().zip(&y) {
            assert_eq!(x.token_ids, y.token_ids);
        }
    }
    // Meshes that do not divide the devices are refused by name.
    let Err(err) = AutoModelForCausalLM::builder(&fixture("llama-gqa-f32"))
        .device_map(DeviceMap::TensorParallel {
            platform: "cpu".into(),
            devices: Some(vec![0, 1, 2]),
            tp: Some(2),
        })
        .load()
    else {
        panic!("3 devices in meshes of 2 loaded");
    };
    assert!(err.to_string().contains("meshes of 2"), "{err}");
}

#[test]
fn sampling_on_the_device_picks_what_the_host_picks() {
    setup();
    let cpu = load("mistral-swa-f32", DeviceMap::Cpu);
    let dev = load("mistral-swa-f32", pjrt(&[2]));
    let cases = [
        GenerationOptions {
            do_sample: true,
            temperature: 0.8,
            top_k: Some(20),
            top_p: Some(0.9),
            seed: 7,
            ..GenerationOptions::greedy(16)
        },
        GenerationOptions {
            do_sample: true,
            min_p: Some(0.05),
            repetition_penalty: Some(1.5),
            min_new_tokens: 16,
            seed: 11,
            ..GenerationOptions::greedy(16)
        },
        GenerationOptions {
            repetition_penalty: Some(2.0),
            ..GenerationOptions::greedy(16)
        },
        // Processors only the host runs: the compiled model hands its logits back each step.
        GenerationOptions {
            no_repeat_ngram_size: 2,
            suppress_tokens: vec![3],
            begin_suppress_tokens: vec![4],
            bad_words_ids: vec![vec![6, 7]],
            ..GenerationOptions::greedy(16)
        },
        GenerationOptions {
            do_sample: true,
            typical_p: Some(0.9),
            epsilon_cutoff: Some(0.001),
            eta_cutoff: Some(0.01),
            seed: 3,
            ..GenerationOptions::greedy(16)
        },
    ];
    let prompts = [vec![5, 6, 7, 8], vec![9, 10]];
    for opts in &cases {
        let (a, _) = cpu.generate_ids(&prompts, opts, |_| true).unwrap();
        let (b, _) = dev.generate_ids(&prompts, opts, |_| true).unwrap();
        for (a, b) in a.iter().zip(&b) {
            assert_eq!(a.token_ids, b.token_ids, "{opts:?}");
            assert_eq!(a.stop_reason, b.stop_reason);
            if opts.no_repeat_ngram_size == 2 {
                let seq: Vec<u32> = a.prompt_ids.iter().chain(&a.token_ids).copied().collect();
                let mut pairs: Vec<&[u32]> = seq.windows(2).collect();
                let n = pairs.len();
                pairs.sort_unstable();
                pairs.dedup();
                assert_eq!(pairs.len(), n, "a bigram repeats in {seq:?}");
                assert!(!a.token_ids.contains(&3) && a.token_ids[0] != 4);
            }
        }
    }
}

/// An encoder-decoder on the device with processors only the host runs: the decoder's
/// logits come back each step and the picks equal the eager model's.
#[test]
fn seq2seq_host_processors_pick_what_eager_picks() {
    setup();
    let load = |map| {
        AutoModelForSeq2SeqLM::builder(&fixture("t5-generate-f32"))
            .device_map(map)
            .dtype(DType::F32)
            .load()
            .unwrap()
    };
    let (cpu, dev) = (load(DeviceMap::Cpu), load(pjrt(&[1])));
    let opts = GenerationOptions {
        no_repeat_ngram_size: 1,
        suppress_tokens: vec![5],
        min_new_tokens: 8,
        ..GenerationOptions::greedy(8)
    };
    let prompts = [vec![8, 9, 10, 11, 1], vec![12, 13, 1]];
    let (a, _) = cpu.generate_ids(&prompts, &opts, |_| true).unwrap();
    let (b, _) = dev.generate_ids(&prompts, &opts, |_| true).unwrap();
    for (a, b) in a.iter().zip(&b) {
        assert_eq!(a.token_ids, b.token_ids);
        // No token twice, and never token 5.
        let mut seen = a.token_ids.clone();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), a.token_ids.len(), "{:?}", a.token_ids);
        assert!(!a.token_ids.contains(&5));
    }
}

/// A compiled decode loop records step N+1 from the device's picks and dispatches it before
/// reading step N's: a row that stops early (eos) ends exactly where the host's does while the
/// other runs on, a single sampled row draws what the host draws, and a split model (whose
/// picks cross devices) decodes the same.
#[test]
fn running_a_step_ahead_picks_what_the_host_picks() {
    setup();
    let cpu = load("mistral-swa-f32", DeviceMap::Cpu);
    let dev = load("mistral-swa-f32", pjrt(&[2]));
    let split = load("mistral-swa-f32", pjrt(&[0, 1, 2, 3]));
    let prompts = [vec![5, 6, 7, 8], vec![9, 10]];
    let free = GenerationOptions::greedy(12);
    let (plain, _) = cpu.generate_ids(&prompts, &free, |_| true).unwrap();
    // A token of row 0 that neither row produced before: row 0 stops there, row 1 runs on.
    let (r0, r1) = (&plain[0].token_ids, &plain[1].token_ids);
    let at = (2..r0.len())
        .find(|&i| !r0[..i].contains(&r0[i]) && !r1[..=i].contains(&r0[i]))
        .expect("the fixture's rows share no late token");
    let eos = r0[at];
    let stopping = GenerationOptions {
        eos_token_ids: Some(vec![eos]),
        ..free.clone()
    };
    let sampled = GenerationOptions {
        do_sample: true,
        temperature: 0.9,
        top_p: Some(0.95),
        seed: 3,
        ..free.clone()
    };
    let cases = [
        (&prompts[..], &free),
        (&prompts[..], &stopping),
        (&prompts[..1], &sampled),
    ];
    for (prompts, opts) in cases {
        let (want, _) = cpu.generate_ids(prompts, opts, |_| true).unwrap();
        for model in [&dev, &split] {
            let (got, stats) = model.generate_ids(prompts, opts, |_| true).unwrap();
            for (a, b) in want.iter().zip(&got) {
                assert_eq!(a.token_ids, b.token_ids, "{opts:?}");
                assert_eq!(a.stop_reason, b.stop_reason, "{opts:?}");
            }
            // That each step was dispatched is counted in `pjrt_compiles.rs`, a process of
            // its own (here other tests' graphs may take this one's pending steps along).
            let steps = got.iter().map(|o| o.token_ids.len()).max().unwrap();
            assert_eq!(stats.decode_steps + 1, steps);
        }
    }
    let (stopped, _) = cpu.generate_ids(&prompts, &stopping, |_| true).unwrap();
    assert_eq!(stopped[0].token_ids.len(), at + 1);
    assert!(stopped[1].token_ids.len() > at + 1);
}

#[test]
fn a_plan_file_loads_as_an_explicit_map_on_its_devices() {
    setup();
    let planned = load("llama-mha-tied-f32", pjrt(&[0, 1, 2]));
    let plan = planned.load_report().plan.clone().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("plan.json");
    std::fs::write(&file, serde_json::to_string(&plan.to_json()).unwrap()).unwrap();
    let map = ExplicitMap::from_file(&file).unwrap();
    let explicit = load("llama-mha-tied-f32", DeviceMap::Explicit(map));
    assert_eq!(
        explicit.load_report().devices,
        planned.load_report().devices
    );
    let prompts = [vec![4, 3, 2, 1]];
    let opts = GenerationOptions::greedy(6);
    let (a, _) = planned.generate_ids(&prompts, &opts, |_| true).unwrap();
    let (b, _) = explicit.generate_ids(&prompts, &opts, |_| true).unwrap();
    assert_eq!(a[0].token_ids, b[0].token_ids);

    // An index past the plugin's devices is refused before loading.
    let bad = ExplicitMap::from_json(
        &serde_json::json!({"model": 0, "lm_head": 9}),
        std::path::Path::new("map.json"),
    )
    .unwrap();
    let err = AutoModelForCausalLM::builder(&fixture("llama-mha-tied-f32"))
        .device_map(DeviceMap::Explicit(bad))
        .load()
        .err()
        .expect("device 9 does not exist");
    assert!(
        matches!(err, Error::DeviceUnavailable { .. }) && err.to_string().contains('9'),
        "{err}"
    );
}

#[test]
fn a_split_that_cannot_fit_fails_before_loading_and_names_the_shortfall() {
    setup();
    let max = zoo_runtime::device_map::parse_max_memory("0=10KiB,1=10KiB").unwrap();
    let err = AutoModelForCausalLM::builder(&fixture("llama-gqa-f32"))
        .device_map(pjrt(&[0, 1]))
        .max_memory(max)
        .load()
        .err()
        .expect("10 KiB per device cannot hold the model");
    let msg = err.to_string();
    assert!(
        msg.contains("does not fit") && msg.contains("cpu:0"),
        "{msg}"
    );
}

#[test]
fn tpu_maps_fail_at_once_without_tpus_and_auto_says_what_it_picked() {
    setup();
    if zoo_runtime::pjrt::discovery::tpu_allowed().is_ok()
        && zoo_runtime::pjrt::discovery::find_plugin(Some("tpu"), None).is_ok()
    {
        panic!("this test expects a host without TPUs");
    }
    let started = std::time::Instant::now();
    let err = AutoModelForCausalLM::load_pretrained(&fixture("llama-gqa-f32"), DeviceMap::Tpu)
        .err()
        .expect("no TPU here");
    assert!(matches!(err, Error::DeviceUnavailable { .. }), "{err}");
    assert!(err.to_string().contains("TPU"), "{err}");
    assert!(started.elapsed().as_secs() < 30, "answered at once");

    let auto =
        AutoModelForCausalLM::load_pretrained(&fixture("llama-gqa-f32"), DeviceMap::Auto).unwrap();
    let note = auto.load_report().note.clone().unwrap_or_default();
    assert!(note.contains("auto"), "{note}");
    assert_ne!(auto.load_report().devices, Vec::<Device>::new());
}
