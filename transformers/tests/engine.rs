//! The generation engine: sequences that join a running engine at different steps, each with
//! its own options, produce token for token what each produces alone, on candle CPU and on the
//! XLA CPU PJRT plugin; over full attention, sliding windows and soft-capping; with prefix
//! caching and preemption, paged on both; a steady stream on the plugin compiles nothing new.
//!
//! `ZOO_PJRT_CPU_PLUGIN` names the plugin; when unset, `scripts/fetch-test-assets.sh` obtains
//! it. A missing plugin fails the PJRT test.

use std::collections::HashMap;
use std::path::PathBuf;

use zoo_runtime::device_map::DeviceMap;
use zoo_runtime::{lazy, DType, PjrtPlatform};
use zoo_transformers::{
    AutoModelForCausalLM, EngineConfig, EngineEvent, Error, GenerationOptions, SequenceId,
    StopReason, TextGenerator,
};

#[path = "../../hub/tests/common/assets.rs"]
mod assets;

fn load(case: &str, map: DeviceMap) -> TextGenerator {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../nightly/fixtures")
        .join(case);
    AutoModelForCausalLM::builder(&dir.to_string_lossy())
        .device_map(map)
        .dtype(DType::F32)
        .load()
        .unwrap_or_else(|e| panic!("{case}: {e}"))
}

/// The tokens `prompt` generates alone.
fn alone(model: &TextGenerator, prompt: &[u32], opts: &GenerationOptions) -> Vec<u32> {
    let out = model
        .generate_ids(&[prompt.to_vec()], opts, |_| true)
        .unwrap()
        .0;
    out[0].token_ids.clone()
}

/// Three requests: prompts of different lengths, lengths to generate and options (one with a
/// repetition penalty and no-repeat n-grams, processors that read the row's own tokens).
fn requests() -> Vec<(Vec<u32>, GenerationOptions)> {
    let plain = |n| GenerationOptions {
        eos_token_ids: Some(vec![]),
        ..GenerationOptions::greedy(n)
    };
    vec![
        (vec![5, 17, 3, 9, 11], plain(12)),
        (vec![2, 8, 40, 7, 1, 6, 12, 4, 19], plain(7)),
        (
            vec![3, 3],
            GenerationOptions {
                repetition_penalty: Some(1.5),
                no_repeat_ngram_size: 2,
                ..plain(9)
            },
        ),
    ]
}

/// Runs the requests through one engine, the second joining after 2 steps and the third after
/// 5, and checks each sequence's tokens against the same request generated alone.
fn joins_match_alone(model: &TextGenerator, capacity: usize, what: &str) {
    let reqs = requests();
    let alone: Vec<Vec<u32>> = reqs.iter().map(|(p, o)| alone(model, p, o)).collect();
    let mut engine = model.engine(EngineConfig::new(2, capacity)).unwrap();
    assert!(engine.kv_blocks().is_some(), "{what}: the cache is paged");
    let mut ids: Vec<SequenceId> = Vec::new();
    let mut tokens: HashMap<SequenceId, Vec<u32>> = HashMap::new();
    let mut finished: HashMap<SequenceId, Vec<u32>> = HashMap::new();
    let mut step = 0;
    let mut running_at_join = Vec::new();
    while ids.len() < reqs.len() || !engine.is_idle() {
        if [0, 2, 5].contains(&step) && ids.len() < reqs.len() {
            let (p, o) = &reqs[ids.len()];
            running_at_join.push(engine.counts().0);
            ids.push(engine.add(p.clone(), o.clone()).unwrap());
        }
        for event in engine.step().unwrap() {
            match event {
                EngineEvent::Token { id, token_id, .. } => {
                    tokens.entry(id).or_default().push(token_id)
                }
                EngineEvent::Finished { id, output } => {
                    assert_eq!(output.stop_reason, StopReason::Length, "{what}");
                    finished.insert(id, output.token_ids);
                }
            }
        }
        step += 1;
        assert!(step < 100, "{what}: the engine never went idle");
    }
    // The second joined a running sequence; the third waited for a free row (two rows).
    assert_eq!(running_at_join, vec![0, 1, 2], "{what}");
    for (i, id) in ids.iter().enumerate() {
        assert_eq!(tokens[id], alone[i], "{what}: request {i} streamed");
        assert_eq!(finished[id], alone[i], "{what}: request {i} finished");
    }
}

#[test]
fn sequences_joining_a_running_engine_match_each_alone_on_cpu() {
    for case in [
        "llama-gqa-f32",
        "mistral-swa-f32",
        "gemma2-softcap-swa-f32",
        "gemma3-pattern-f32",
        "mixtral-top1-swa-fused-f32",
        "qwen2-qkvbias-tied-f32",
    ] {
        let model = load(case, DeviceMap::Cpu);
        joins_match_alone(&model, 64, case);
    }
}

#[test]
fn sequences_joining_a_running_engine_match_each_alone_on_pjrt() {
    let map = pjrt();
    for case in ["llama-gqa-f32", "mistral-swa-f32"] {
        let model = load(case, map.clone());
        joins_match_alone(&model, 256, case);
    }
}

#[test]
fn engine_refuses_what_cannot_fit_and_cancels() {
    let model = load("llama-gqa-f32", DeviceMap::Cpu);
    // A pool past the host's memory is refused before anything is allocated, in blocks.
    let mut config = EngineConfig::new(1, 16);
    config.kv_blocks = Some(1 << 40);
    let err = model.engine(config).err().expect("a pool past memory");
    assert!(
        matches!(
            err,
            Error::InvalidInput {
                field: "kv_blocks",
                ..
            }
        ) && err
            .to_string()
            .contains("1099511627776 blocks of 16 tokens"),
        "{err}"
    );
    let mut engine = model.engine(EngineConfig::new(1, 16)).unwrap();
    // 10 prompt tokens and 8 new ones need 17 slots.
    let err = engine
        .add(vec![1; 10], GenerationOptions::greedy(8))
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::InvalidInput {
                field: "max_new_tokens",
                ..
            }
        ) && err.is_caller_error(),
        "{err}"
    );
    let a = engine
        .add(vec![4, 5, 6], GenerationOptions::greedy(10))
        .unwrap();
    let b = engine
        .add(vec![7, 8], GenerationOptions::greedy(3))
        .unwrap();
    engine.step().unwrap();
    assert_eq!(engine.counts(), (1, 1), "one row: the second waits");
    let out = engine.cancel(a).unwrap().expect("a runs");
    assert_eq!(
        (out.stop_reason, out.token_ids.len()),
        (StopReason::Cancelled, 1)
    );
    assert!(engine.cancel(a).unwrap().is_none(), "cancelled once");
    let mut done = None;
    while !engine.is_idle() {
        for e in engine.step().unwrap() {
            if let EngineEvent::Finished { id, output } = e {
                assert_eq!(id, b);
                done = Some(output);
            }
        }
    }
    let alone = model
        .generate_ids(&[vec![7, 8]], &GenerationOptions::greedy(3), |_| true)
        .unwrap()
        .0;
    assert_eq!(done.unwrap().token_ids, alone[0].token_ids);
}

/// Runs `prompts` through `engine`, prompt `i` added at step `at[i]`, to the end; each
/// sequence's tokens.
fn run_staggered(
    engine: &mut zoo_transformers::Engine<'_>,
    prompts: &[Vec<u32>],
    at: &[usize],
    opts: &GenerationOptions,
) -> Vec<Vec<u32>> {
    let mut ids = Vec::new();
    let mut out: HashMap<SequenceId, Vec<u32>> = HashMap::new();
    let mut step = 0;
    while ids.len() < prompts.len() || !engine.is_idle() {
        while ids.len() < prompts.len() && at[ids.len()] <= step {
            ids.push(
                engine
                    .add(prompts[ids.len()].clone(), opts.clone())
                    .unwrap(),
            );
        }
        for e in engine.step().unwrap() {
            if let EngineEvent::Finished { id, output } = e {
                out.insert(id, output.token_ids);
            }
        }
        step += 1;
        assert!(step < 200, "the engine never went idle");
    }
    ids.iter().map(|id| out[id].clone()).collect()
}

fn pjrt() -> DeviceMap {
    let plugin = assets::asset("ZOO_PJRT_CPU_PLUGIN");
    lazy::configure(PjrtPlatform::Cpu, Some(plugin), Some(4)).unwrap();
    lazy::set_matmul_precision(lazy::Precision::Highest);
    DeviceMap::Pjrt {
        platform: "cpu".into(),
        devices: Some(vec![0]),
    }
}

#[test]
fn prompts_sharing_a_cached_prefix_reuse_it_and_match_each_alone() {
    let cases = [
        ("llama-gqa-f32", DeviceMap::Cpu),
        ("mistral-swa-f32", DeviceMap::Cpu),
        ("gemma2-softcap-swa-f32", DeviceMap::Cpu),
        ("llama-gqa-f32", pjrt()),
    ];
    for (case, map) in cases {
        let case = &*format!("{case} on {map}");
        let model = load(case.split(' ').next().unwrap(), map);
        // Two full blocks of 16 tokens and half a third.
        let system: Vec<u32> = (0..40).map(|i| 3 + (i * 7) % 50).collect();
        let with = |tail: &[u32]| system.iter().chain(tail).copied().collect::<Vec<u32>>();
        let prompts = [with(&[5, 9]), with(&[11]), with(&[2, 8, 13]), with(&[6])];
        let opts = GenerationOptions {
            eos_token_ids: Some(vec![]),
            ..GenerationOptions::greedy(6)
        };
        let alone: Vec<Vec<u32>> = prompts.iter().map(|p| alone(&model, p, &opts)).collect();
        let mut engine = model.engine(EngineConfig::new(2, 160)).unwrap();
        engine.set_prefix_caching(true).unwrap();
        // The second joins the first mid-run; the third waits for a row; the fourth comes
        // after the engine went idle and still finds the prefix.
        let got = run_staggered(&mut engine, &prompts[..3], &[0, 2, 3], &opts);
        assert_eq!(got, alone[..3], "{case}");
        assert_eq!(
            engine.prefix_hits(),
            (2, 64),
            "{case}: the later two reused the two full blocks each"
        );
        let got = run_staggered(&mut engine, &prompts[3..], &[0], &opts);
        assert_eq!(got, alone[3..], "{case}: after the engine went idle");
        assert_eq!(engine.prefix_hits(), (3, 96), "{case}");
        // A prompt that shares less than a block computes everything.
        let short: Vec<u32> = system[..10].iter().chain(&[40, 41]).copied().collect();
        run_staggered(&mut engine, &[short], &[0], &opts);
        assert_eq!(engine.prefix_hits(), (3, 96), "{case}");
        assert_eq!(
            engine.kv_blocks().map(|b| b.0),
            Some(0),
            "{case}: all released"
        );
    }
}

/// A model that reruns its history past some length (Phi-3's long-context RoPE) keeps a
/// timeline, where rows cannot share blocks.
#[test]
fn prefix_caching_is_refused_where_rows_cannot_share_blocks() {
    let model = load("phi3-longrope-cross-f32", DeviceMap::Cpu);
    let mut engine = model.engine(EngineConfig::new(2, 64)).unwrap();
    assert_eq!(engine.kv_blocks(), None, "a timeline");
    let err = engine.set_prefix_caching(true).unwrap_err();
    assert!(
        matches!(
            err,
            Error::InvalidInput {
                field: "prefix_caching",
                ..
            }
        ),
        "{err}"
    );
    engine.set_prefix_caching(false).unwrap();
}

/// A pool too small for every running sequence at once: the sequence that arrived last is
/// preempted when blocks run out, runs again later from its prompt and tokens, and every
/// sequence still matches its tokens alone; cancelling gives its blocks back at once.
#[test]
fn sequences_preempted_for_blocks_resume_and_match_each_alone() {
    let cases = [
        ("llama-gqa-f32", DeviceMap::Cpu),
        ("mistral-swa-f32", DeviceMap::Cpu),
        ("mistral-swa-f32", pjrt()),
    ];
    for (case, map) in cases {
        let case = &*format!("{case} on {map}");
        let model = load(case.split(' ').next().unwrap(), map);
        let opts = GenerationOptions {
            eos_token_ids: Some(vec![]),
            ..GenerationOptions::greedy(30)
        };
        let prompts: Vec<Vec<u32>> = (0..3)
            .map(|r| (0..10).map(|i| 2 + (i * 5 + r * 11) % 60).collect())
            .collect();
        let alone: Vec<Vec<u32>> = prompts.iter().map(|p| alone(&model, p, &opts)).collect();
        for caching in [false, true] {
            // 40 tokens take 3 blocks each; 5 blocks hold one sequence and a part.
            let mut config = EngineConfig::new(3, 48);
            config.kv_blocks = Some(5);
            let mut engine = model.engine(config).unwrap();
            engine.set_prefix_caching(caching).unwrap();
            let got = run_staggered(&mut engine, &prompts, &[0, 0, 3], &opts);
            assert_eq!(got, alone, "{case}, prefix caching {caching}");
            assert!(engine.preemptions() > 0, "{case}: nothing was preempted");
            assert_eq!(engine.kv_blocks(), Some((0, 5)), "{case}: all released");
        }
        let mut engine = model.engine(EngineConfig::new(2, 48)).unwrap();
        let a = engine.add(prompts[0].clone(), opts.clone()).unwrap();
        engine.add(prompts[1].clone(), opts.clone()).unwrap();
        engine.step().unwrap();
        assert_eq!(engine.kv_blocks(), Some((2, 6)), "{case}: a block each");
        engine.cancel(a).unwrap().expect("a runs");
        assert_eq!(
            engine.kv_blocks(),
            Some((1, 6)),
            "{case}: a's block is back"
        );
        // A preempted sequence cancelled while it waits: what it generated, nothing held.
        let mut config = EngineConfig::new(2, 48);
        config.kv_blocks = Some(4);
        let mut engine = model.engine(config).unwrap();
        engine.add(prompts[0].clone(), opts.clone()).unwrap();
        let b = engine.add(prompts[1].clone(), opts.clone()).unwrap();
        for _ in 0..40 {
            if engine.preemptions() > 0 {
                break;
            }
            engine.step().unwrap();
        }
        assert_eq!(engine.counts(), (1, 1), "{case}: b was preempted");
        let out = engine.cancel(b).unwrap().expect("b waits");
        assert_eq!(out.stop_reason, StopReason::Cancelled);
        assert!(!out.token_ids.is_empty(), "{case}");
        while !engine.is_idle() {
            engine.step().unwrap();
        }
        assert_eq!(engine.kv_blocks(), Some((0, 4)), "{case}");
        // A pool that cannot hold one sequence at its capacity is refused.
        let mut config = EngineConfig::new(2, 48);
        config.kv_blocks = Some(2);
        let err = model.engine(config).err().expect("too few blocks");
        assert!(
            matches!(
                err,
                Error::InvalidInput {
                    field: "kv_blocks",
                    ..
                }
            ),
            "{err}"
        );
    }
}

/// With a step budget (`max_step_tokens`), a long prompt joins in chunks over several steps
/// while the running sequence gets a token at every one of them, and both still match their
/// tokens alone.
#[test]
fn long_prompts_join_in_chunks_beside_running_sequences() {
    let cases = [
        ("llama-gqa-f32", DeviceMap::Cpu),
        ("mistral-swa-f32", DeviceMap::Cpu),
        ("llama-gqa-f32", pjrt()),
    ];
    for (case, map) in cases {
        let case = &*format!("{case} on {map}");
        let model = load(case.split(' ').next().unwrap(), map);
        let opts = GenerationOptions {
            eos_token_ids: Some(vec![]),
            ..GenerationOptions::greedy(12)
        };
        let short = vec![5, 17, 3];
        let long: Vec<u32> = (0..37).map(|i| 2 + (i * 7) % 60).collect();
        let alone_short = alone(&model, &short, &opts);
        let alone_long = alone(&model, &long, &opts);
        let mut config = EngineConfig::new(2, 64);
        config.max_step_tokens = Some(8);
        let mut engine = model.engine(config).unwrap();
        let a = engine.add(short, opts.clone()).unwrap();
        engine.step().unwrap();
        let b = engine.add(long, opts.clone()).unwrap();
        let mut out: HashMap<SequenceId, Vec<u32>> = HashMap::new();
        let mut steps_to_b = None;
        let mut step = 0;
        while !engine.is_idle() {
            let events = engine.step().unwrap();
            step += 1;
            let token_of = |id| {
                events
                    .iter()
                    .any(|e| matches!(e, EngineEvent::Token { id: x, .. } if *x == id))
            };
            if steps_to_b.is_none() {
                assert!(token_of(a), "{case}: a stalled at step {step}");
                if token_of(b) {
                    steps_to_b = Some(step);
                }
            }
            for e in events {
                if let EngineEvent::Finished { id, output } = e {
                    out.insert(id, output.token_ids);
                }
            }
            assert!(step < 100, "{case}: the engine never went idle");
        }
        // 37 prompt tokens, 7 a step beside a's one: the sixth step ends the prompt.
        assert_eq!(steps_to_b, Some(6), "{case}");
        assert_eq!(out[&a], alone_short, "{case}: the running sequence");
        assert_eq!(out[&b], alone_long, "{case}: the chunked prompt");
    }
    let model = load("llama-gqa-f32", DeviceMap::Cpu);
    let mut config = EngineConfig::new(4, 64);
    config.max_step_tokens = Some(3);
    let err = model
        .engine(config)
        .err()
        .expect("a budget below the sequences");
    assert!(
        matches!(
            err,
            Error::InvalidInput {
                field: "max_step_tokens",
                ..
            }
        ),
        "{err}"
    );
}
