//! `zoo generate` end to end: the real binary on a tiny real checkpoint (the `llama-gqa-f32`
//! parity fixture) with a byte-level tokenizer and a chat template.

use std::path::Path;

use serde_json::Value;

mod common;
use common::{fixture_dir, zoo};

fn model_dir() -> tempfile::TempDir {
    fixture_dir("llama-gqa-f32")
}

#[path = "../../hub/tests/common/assets.rs"]
mod assets;

#[test]
fn generate_streams_text_and_reports_speed() {
    let dir = model_dir();
    let p = dir.path().to_str().unwrap();
    let (ok, out, err) = zoo(&[
        "generate",
        p,
        "hello",
        "--max-new-tokens",
        "6",
        "--min-new-tokens",
        "6",
    ]);
    assert!(ok, "{err}");
    assert!(
        out.trim_end_matches('\n').chars().count() >= 2,
        "stdout {out:?}"
    );
    for needle in [
        "load",
        "time to first token",
        "tok/s",
        "6 tokens",
        "LlamaForCausalLM",
        "float32",
    ] {
        assert!(err.contains(needle), "{needle:?} missing from {err}");
    }
    // Greedy is deterministic: the same command prints the same text.
    let (_, again, _) = zoo(&[
        "generate",
        p,
        "hello",
        "--max-new-tokens",
        "6",
        "--min-new-tokens",
        "6",
    ]);
    assert_eq!(out, again);

    // The same greedy text from the XLA CPU plugin, the model split in planned stages over
    // two of its devices (the plan is printed).
    let plugin = assets::asset("ZOO_PJRT_CPU_PLUGIN");
    let (ok, split_out, err) = common::zoo_with(
        &[
            "generate",
            p,
            "hello",
            "--max-new-tokens",
            "6",
            "--min-new-tokens",
            "6",
            "--device-map",
            "pjrt:cpu:0,1",
        ],
        &[("ZOO_PJRT_CPU_PLUGIN", plugin.as_os_str())],
    );
    assert!(ok, "{err}");
    assert_eq!(split_out, out);
    assert!(
        err.contains("pjrt:cpu:0 → pjrt:cpu:1") && err.contains("cpu:1"),
        "{err}"
    );

    let (ok, _, err) = zoo(&[
        "generate",
        p,
        "hi",
        "--chat",
        "--system",
        "be brief",
        "--dtype",
        "bf16",
        "--temperature",
        "0.8",
        "--top-k",
        "20",
        "--top-p",
        "0.9",
        "--min-p",
        "0.05",
        "--repetition-penalty",
        "1.1",
        "--seed",
        "7",
        "--max-new-tokens",
        "4",
    ]);
    assert!(ok, "{err}");
    assert!(err.contains("bfloat16"), "{err}");
}

#[test]
fn generate_runs_gpt2_and_lists_the_registered_families() {
    let dir = fixture_dir("gpt2-base-f32");
    let p = dir.path().to_str().unwrap();
    let args = [
        "generate",
        p,
        "hello",
        "--max-new-tokens",
        "5",
        "--min-new-tokens",
        "5",
    ];
    let (ok, out, err) = zoo(&args);
    assert!(ok, "{err}");
    assert!(
        err.contains("GPT2LMHeadModel") && err.contains("5 tokens"),
        "{err}"
    );
    let (_, again, _) = zoo(&args);
    assert_eq!(out, again);
    // The help's family list comes from the registry: decoders only.
    let (ok, help, _) = zoo(&["generate", "--help"]);
    assert!(ok);
    assert!(
        help.contains("gpt2 (GPT2LMHeadModel, GPT2Model)")
            && help.contains("qwen3")
            && !help.contains("BertModel"),
        "{help}"
    );
}

#[test]
fn generate_refuses_bad_input_with_a_message() {
    let dir = model_dir();
    let p = dir.path().to_str().unwrap();
    for (args, needle) in [
        (
            vec!["generate", p, "hi", "--device-map", "tpu"],
            "no usable TPU",
        ),
        (
            vec!["generate", p, "hi", "--device-map", "gpu7"],
            "device map",
        ),
        (vec!["generate", p, "hi", "--dtype", "int8"], "--dtype"),
        (vec!["generate", p, ""], "empty"),
        (vec!["generate", p, "hi", "--top-p", "2"], "top_p"),
    ] {
        let (ok, _, err) = zoo(&args);
        assert!(!ok, "{args:?} should fail");
        assert!(
            err.contains(needle),
            "{args:?}: {needle:?} missing from {err}"
        );
        assert!(!err.contains("panicked"), "{err}");
    }
    // The caller's mistakes exit with 2 (a server's 400), as a bad command line does.
    for args in [
        vec!["generate", p, ""],
        vec!["generate", p, "hi", "--top-p", "2"],
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_zoo"))
            .args(&args)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
    }
    let (ok, out, _) = zoo(&["generate", "--help"]);
    assert!(
        ok && out.contains("Examples:") && out.contains("--chat") && out.contains(".gguf"),
        "{out}"
    );
}

/// The committed T5 case that ships a T5 tokenizer and what transformers' `generate` made of
/// a prompt (`generate.json`, from `nightly/reference/seq2seq.py`).
fn t5_case() -> (std::path::PathBuf, Value) {
    let dir =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../nightly/fixtures/t5-generate-gated-f32");
    let want: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("generate.json")).unwrap()).unwrap();
    (dir, want)
}

#[test]
fn generate_runs_an_encoder_decoder_as_transformers_does() {
    let (dir, want) = t5_case();
    let n = want["max_new_tokens"].to_string();
    let prompt = want["prompt"].as_str().unwrap();
    for device in ["cpu", "pjrt:cpu"] {
        let (ok, out, err) = zoo(&[
            "generate",
            dir.to_str().unwrap(),
            prompt,
            "--max-new-tokens",
            &n,
            "--device-map",
            device,
        ]);
        assert!(ok, "{device}: {err}");
        // The prompt goes to the encoder; only generated text is printed.
        assert_eq!(
            out.trim_end_matches('\n'),
            want["text"].as_str().unwrap(),
            "{device}: {err}"
        );
        assert!(err.contains("T5ForConditionalGeneration on"), "{err}");
        assert!(err.contains(&format!("{n} tokens")), "{err}");
    }
    let (ok, _, err) = zoo(&["generate", dir.to_str().unwrap(), prompt, "--chat"]);
    assert!(!ok);
    assert!(err.contains("encoder-decoder"), "{err}");
}

#[test]
fn seq2seq_api_tokenizes_and_generates_like_transformers() {
    use zoo_runtime::device_map::DeviceMap;
    use zoo_transformers::{AutoModelForSeq2SeqLM, GenerationOptions};
    let (dir, want) = t5_case();
    let model =
        AutoModelForSeq2SeqLM::load_pretrained(dir.to_str().unwrap(), DeviceMap::Cpu).unwrap();
    let ids = model.encode(want["prompt"].as_str().unwrap()).unwrap();
    let want_ids: Vec<u32> = serde_json::from_value(want["input_ids"].clone()).unwrap();
    assert_eq!(ids, want_ids, "T5 tokenizer ids");
    let n = want["max_new_tokens"].as_u64().unwrap() as usize;
    let outs = model
        .generate_ids(&[ids], &GenerationOptions::greedy(n), |_| true)
        .unwrap()
        .0;
    let want_gen: Vec<u32> = serde_json::from_value(want["generated_ids"].clone()).unwrap();
    assert_eq!(outs[0].token_ids, want_gen);
    assert_eq!(outs[0].text.as_deref(), want["text"].as_str());
    // An encoder-only checkpoint is refused with a reason, not a missing-tensor panic.
    let enc = Path::new(env!("CARGO_MANIFEST_DIR")).join("../nightly/fixtures/t5-encoder-f32");
    let err = AutoModelForSeq2SeqLM::load_pretrained(enc.to_str().unwrap(), DeviceMap::Cpu)
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("T5EncoderModel") || err.contains("encoder"),
        "{err}"
    );
}

/// `zoo generate --image --chat` on the committed tiny LLaVA answers what transformers'
/// processor and `generate` answer for the same image and question (`pipeline.json`); an
/// image for a text-only model and a missing file are refused by name.
#[test]
fn generate_reads_images_with_a_vision_language_model() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let dir = root.join("nightly/fixtures/llava-f32");
    let want: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("pipeline.json")).unwrap()).unwrap();
    let image = root.join(want["image"].as_str().unwrap());
    let n = want["max_new_tokens"].to_string();
    let (ok, out, err) = zoo(&[
        "generate",
        dir.to_str().unwrap(),
        want["question"].as_str().unwrap(),
        "--chat",
        "--image",
        image.to_str().unwrap(),
        "--max-new-tokens",
        &n,
        "--min-new-tokens",
        &n,
        "--greedy",
    ]);
    assert!(ok, "{err}");
    // The word-level tokenizer decodes without spaces between words, as transformers does.
    let text = want["text"].as_str().unwrap();
    assert_eq!(out.lines().next().unwrap_or(""), text, "{out}");
    let llama = model_dir();
    let (ok, _, err) = zoo(&[
        "generate",
        llama.path().to_str().unwrap(),
        "hello",
        "--image",
        image.to_str().unwrap(),
    ]);
    assert!(!ok && err.contains("reads text only"), "{err}");
    let (ok, _, err) = zoo(&[
        "generate",
        dir.to_str().unwrap(),
        "what is this ?",
        "--chat",
        "--image",
        "/nonexistent/cat.png",
    ]);
    assert!(!ok && err.contains("/nonexistent/cat.png"), "{err}");
}

#[test]
fn generate_merges_peft_adapters_and_refuses_bad_ones() {
    let dir = fixture_dir("llama-lora-f32");
    let p = dir.path().to_str().unwrap();
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../nightly/fixtures");
    let adapter = fixtures.join("llama-lora-f32/adapter_0");
    let a = adapter.to_str().unwrap();
    let run = |extra: &[&str]| {
        let mut args = vec![
            "generate",
            p,
            "hello",
            "--max-new-tokens",
            "8",
            "--min-new-tokens",
            "8",
        ];
        args.extend_from_slice(extra);
        zoo(&args)
    };
    let (ok, base, err) = run(&[]);
    assert!(ok, "{err}");
    let (ok, adapted, err) = run(&["--adapter", a]);
    assert!(ok, "{err}");
    assert_ne!(base, adapted, "the adapter changed nothing");
    // Weight 0 leaves the LoRA products out; what remains is the adapter's `lm_head`
    // (modules_to_save), so the text still differs from the base's.
    let zero = format!("{a}:0");
    let (ok, _, err) = run(&["--adapter", &zero]);
    assert!(ok, "{err}");

    // An adapter trained on another model names the module it cannot place.
    let gpt2 = fixtures.join("gpt2-dora-f32/adapter_0");
    let (ok, _, err) = run(&["--adapter", gpt2.to_str().unwrap()]);
    assert!(!ok);
    assert!(
        err.contains("transformer.h.0") && err.contains("another model"),
        "{err}"
    );
    // A folder without an adapter config, a pickle and other PEFT methods are refused by name.
    let (ok, _, err) = run(&["--adapter", p]);
    assert!(!ok && err.contains("adapter_config.json"), "{err}");
    let odd = tempfile::tempdir().unwrap();
    let config: Value = serde_json::from_str(
        &std::fs::read_to_string(adapter.join("adapter_config.json")).unwrap(),
    )
    .unwrap();
    std::fs::write(odd.path().join("adapter_model.bin"), b"pickle").unwrap();
    std::fs::write(odd.path().join("adapter_config.json"), config.to_string()).unwrap();
    let o = odd.path().to_str().unwrap();
    let (ok, _, err) = run(&["--adapter", o]);
    assert!(
        !ok && err.contains("pickle") && err.contains("safetensors"),
        "{err}"
    );
    let mut ia3 = config.clone();
    ia3["peft_type"] = "IA3".into();
    std::fs::write(odd.path().join("adapter_config.json"), ia3.to_string()).unwrap();
    let (ok, _, err) = run(&["--adapter", o]);
    assert!(!ok && err.contains("IA3"), "{err}");
    let mut bias = config.clone();
    bias["lora_bias"] = true.into();
    std::fs::write(odd.path().join("adapter_config.json"), bias.to_string()).unwrap();
    let (ok, _, err) = run(&["--adapter", o]);
    assert!(!ok && err.contains("lora_bias"), "{err}");
    let (ok, help, _) = zoo(&["generate", "--help"]);
    assert!(
        ok && help.contains("--adapter <PATH_OR_REPO[:SCALE]>"),
        "{help}"
    );

    // An adapter folder given as the model loads the base its config names, as transformers'
    // from_pretrained does; without one it says what to do.
    let own = tempfile::tempdir().unwrap();
    let mut named = config.clone();
    named["base_model_name_or_path"] = p.into();
    std::fs::write(own.path().join("adapter_config.json"), named.to_string()).unwrap();
    std::fs::copy(
        adapter.join("adapter_model.safetensors"),
        own.path().join("adapter_model.safetensors"),
    )
    .unwrap();
    let own_path = own.path().to_str().unwrap();
    let args = [
        "generate",
        own_path,
        "hello",
        "--max-new-tokens",
        "8",
        "--min-new-tokens",
        "8",
    ];
    let (ok, out, err) = zoo(&args);
    assert!(ok, "{err}");
    assert_eq!(out, adapted);
    let mut unnamed = config;
    unnamed["base_model_name_or_path"] = Value::Null;
    std::fs::write(own.path().join("adapter_config.json"), unnamed.to_string()).unwrap();
    let (ok, _, err) = zoo(&args);
    assert!(
        !ok && err.contains("base_model_name_or_path") && err.contains("--adapter"),
        "{err}"
    );
}

#[test]
fn generate_runs_compressed_tensors_checkpoints_and_refuses_what_it_does_not_apply() {
    let dir = fixture_dir("llama-w4a16-f32");
    let p = dir.path().to_str().unwrap();
    let run = |extra: &[&str]| {
        let mut args = vec![
            "generate",
            p,
            "hello",
            "--max-new-tokens",
            "8",
            "--min-new-tokens",
            "8",
        ];
        args.extend_from_slice(extra);
        zoo(&args)
    };
    // By default the int4 weights stay as blocks (Q4_0) and products compute in f32 from
    // them; `--dtype f32` dequantizes at load. Both give the same greedy text.
    let (ok, kept, err) = run(&[]);
    assert!(ok, "{err}");
    assert!(err.contains("float32 (quantized blocks kept)"), "{err}");
    let (ok, dense, err) = run(&["--dtype", "f32"]);
    assert!(ok, "{err}");
    assert!(!err.contains("blocks kept"), "{err}");
    assert_eq!(kept, dense);

    // What a scheme computes beyond stored weights is refused by name.
    let config_path = dir.path().join("config.json");
    let original = std::fs::read_to_string(&config_path).unwrap();
    let config: Value = serde_json::from_str(&original).unwrap();
    for (pointer, value, needle) in [
        (
            "/quantization_config/config_groups/group_0/input_activations",
            serde_json::json!({"num_bits": 8, "type": "float", "strategy": "token", "dynamic": true}),
            "input_activations",
        ),
        (
            "/quantization_config/kv_cache_scheme",
            serde_json::json!({"num_bits": 8, "type": "float"}),
            "kv_cache_scheme",
        ),
        (
            "/quantization_config/config_groups/group_0/weights/strategy",
            serde_json::json!("tensor_group"),
            "tensor_group",
        ),
        (
            "/quantization_config/quant_method",
            serde_json::json!("gptq"),
            "gptq",
        ),
    ] {
        let mut c = config.clone();
        *c.pointer_mut(pointer).unwrap() = value;
        std::fs::write(&config_path, c.to_string()).unwrap();
        let (ok, _, err) = run(&[]);
        assert!(!ok && err.contains(needle), "{needle}: {err}");
    }
}
