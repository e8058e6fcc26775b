//! A small random llama GGUF written by gguf-py (hub/tests/data/gguf/tiny_llama.gguf) against
//! what transformers makes of it (tiny_llama_reference.json), both from
//! nightly/reference/gguf_tiny_llama.py: an untied lm_head, grouped-query attention, every
//! quantized type among the weights, linear rope scaling, and a llama-3 style tokenizer that adds
//! BOS and has user-defined tokens.

mod common;

use std::path::{Path, PathBuf};

use serde_json::{json, Value as J};
use zoo_hub::gguf;
use zoo_hub::Weights;

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/gguf")
        .join(name)
}

fn reference() -> J {
    serde_json::from_str(&std::fs::read_to_string(data("tiny_llama_reference.json")).unwrap())
        .unwrap()
}

/// The fingerprint of nightly/reference/gguf_tiny_llama.py.
fn fingerprint(v: &[f32]) -> u64 {
    v.iter().enumerate().fold(0u64, |acc, (i, x)| {
        let mut z = (i as u64).wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        acc.wrapping_add(u64::from(x.to_bits()).wrapping_mul(z | 1))
    })
}

#[test]
fn tensors_match_transformers() {
    let ck = gguf::open(&data("tiny_llama.gguf")).unwrap();
    let r = reference();
    let tensors = r["tensors"].as_array().unwrap();
    assert_eq!(ck.inventory.len(), tensors.len());
    let w = Weights::open(ck.inventory.clone()).unwrap();
    for t in tensors {
        let hf = t["hf_name"].as_str().unwrap();
        common::check_gguf_reference_tensor(&ck.inventory, t, 4, 2);
        let v = w.tensor(hf).unwrap().to_f32().unwrap();
        let first: Vec<f32> = t["first"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap() as f32)
            .collect();
        assert_eq!(&v[..4], &first[..], "{hf}: first values");
        let want: u64 = t["fingerprint"].as_str().unwrap().parse().unwrap();
        assert_eq!(fingerprint(&v), want, "{hf} ({}): values differ", t["type"]);
    }
    assert!(ck.inventory.get("lm_head.weight").is_some());
}

#[test]
fn config_matches_transformers_and_keeps_rope_scaling() {
    let ck = gguf::open(&data("tiny_llama.gguf")).unwrap();
    let r = reference();
    for (key, want) in r["config"].as_object().unwrap() {
        let got = &ck.config[key];
        if key == "rms_norm_eps" || key == "rope_theta" {
            assert_eq!(
                got.as_f64().map(|x| x as f32),
                want.as_f64().map(|x| x as f32),
                "{key}"
            );
        } else {
            assert_eq!(got, want, "config field {key}");
        }
    }
    assert_eq!(ck.config["rms_norm_eps"], json!(1e-6));
    assert_eq!(ck.config["model_type"], json!("llama"));
    // transformers drops GGUF rope scaling; zoo keeps it.
    assert_eq!(
        ck.config["rope_scaling"],
        json!({"rope_type": "linear", "factor": 2.0})
    );
}

#[test]
fn tokenizer_matches_transformers() {
    let ck = gguf::open(&data("tiny_llama.gguf")).unwrap();
    let r = reference();
    let json = &ck.tokenizer_json().unwrap().unwrap();
    assert_eq!(
        json["pre_tokenizer"]["pretokenizers"][0]["type"],
        json!("Split"),
        "llama-bpe uses the llama 3 split"
    );
    let tok = tokenizers::Tokenizer::from_bytes(serde_json::to_vec(json).unwrap()).unwrap();
    for case in r["tokenizer"]["cases"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let want: Vec<u32> = case["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect();
        let got = tok.encode(text, true).unwrap().get_ids().to_vec();
        assert_eq!(got, want, "{text:?}");
    }
    let cfg = ck.tokenizer_config.as_ref().unwrap();
    for key in ["bos_token", "eos_token", "chat_template"] {
        assert_eq!(cfg[key], r["tokenizer"][key], "{key}");
    }
    assert_eq!(cfg["add_bos_token"], json!(true));
    // Control tokens are special; user-defined ones are added but not special.
    let added = json["added_tokens"].as_array().unwrap();
    let find = |c: &str| added.iter().find(|t| t["content"] == c).unwrap()["special"].clone();
    assert_eq!(find("<|eot_id|>"), json!(true));
    assert_eq!(find("<think>"), json!(false));
}

#[test]
fn open_refuses_other_architectures_and_unknown_tensors() {
    // The same file with its architecture renamed, and with a tensor renamed, in memory.
    let bytes = std::fs::read(data("tiny_llama.gguf")).unwrap();
    let path = Path::new("/x/tiny.gguf");
    let edit = |from: &[u8], to: &[u8]| {
        assert_eq!(from.len(), to.len());
        let mut b = bytes.clone();
        let at = b.windows(from.len()).position(|w| w == from).unwrap();
        b[at..at + to.len()].copy_from_slice(to);
        gguf::from_file(gguf::parse(&b, path).unwrap())
            .unwrap_err()
            .to_string()
    };
    // general.architecture is the string "llama" right after its key.
    let e = edit(
        b"architecture\x08\x00\x00\x00\x05\x00\x00\x00\x00\x00\x00\x00llama",
        b"architecture\x08\x00\x00\x00\x05\x00\x00\x00\x00\x00\x00\x00mamba",
    );
    assert!(
        e.contains("\"mamba\" is not supported")
            && e.contains("llama, qwen2")
            && e.contains("gemma3"),
        "{e}"
    );
    assert!(e.contains("/x/tiny.gguf"), "{e}");
    let e = edit(b"blk.1.ffn_up.weight", b"blk.1.ffn_xx.weight");
    assert!(
        e.contains("blk.1.ffn_xx.weight") && e.contains("no counterpart"),
        "{e}"
    );
    let e = edit(
        b"llama.attention.head_count\x04",
        b"llama.attention.head_cOunt\x04",
    );
    assert!(e.contains("llama.attention.head_count"), "{e}");
    let e = edit(
        b"tokenizer.ggml.pre\x08\x00\x00\x00\x09\x00\x00\x00\x00\x00\x00\x00llama-bpe",
        b"tokenizer.ggml.pre\x08\x00\x00\x00\x09\x00\x00\x00\x00\x00\x00\x00llama-xyz",
    );
    assert!(e.contains("\"llama-xyz\"") && e.contains("smollm"), "{e}");
}

#[test]
fn sentencepiece_tokenizer_matches_transformers() {
    let ck = gguf::open(&data("tiny_spm.gguf")).unwrap();
    let r = &reference()["spm"];
    assert!(ck.inventory.is_empty());
    let json = &ck.tokenizer_json().unwrap().unwrap();
    // The file stores no merges; zoo recovers the ones transformers does, in its order.
    assert_eq!(json["model"]["merges"], r["merges"]);
    let tok = tokenizers::Tokenizer::from_bytes(serde_json::to_vec(json).unwrap()).unwrap();
    for case in r["cases"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let want: Vec<u32> = case["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect();
        let got = tok.encode(text, true).unwrap().get_ids().to_vec();
        assert_eq!(got, want, "{text:?}");
        if !text.contains('<') && !text.starts_with(' ') {
            // Byte fallback and the prefix space undo exactly (a leading space merges into the
            // prefix one, as in SentencePiece).
            assert_eq!(tok.decode(&got, true).unwrap(), text, "{text:?}");
        }
    }
    let cfg = ck.tokenizer_config.as_ref().unwrap();
    for key in ["bos_token", "eos_token", "unk_token"] {
        assert_eq!(cfg[key], r[key], "{key}");
    }
    assert_eq!(cfg["add_bos_token"], json!(true));
    assert_eq!(cfg["tokenizer_class"], json!("LlamaTokenizer"));
}

#[test]
fn nan_scores_are_an_error_not_a_panic() {
    // Found by fuzzing: merges ranked by a NaN score have no order.
    let mut b = std::fs::read(data("tiny_spm.gguf")).unwrap();
    let key = b"tokenizer.ggml.scores";
    let at = b.windows(key.len()).position(|w| w == key).unwrap() + key.len();
    // Value type (array), item type (f32), count, then the first score.
    let first = at + 4 + 4 + 8;
    b[first..first + 4].copy_from_slice(&f32::NAN.to_le_bytes());
    let e = gguf::from_file(gguf::parse(&b, Path::new("/x/spm.gguf")).unwrap())
        .unwrap_err()
        .to_string();
    assert!(e.contains("scores item 0") && e.contains("NaN"), "{e}");
}
