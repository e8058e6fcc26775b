//! A CLIP tokenizer as diffusion repos ship it (`vocab.json` + `merges.txt`, no
//! `tokenizer.json`), read into the `tokenizer.json` transformers builds, against the ids
//! transformers' `AutoTokenizer` gives (hub/tests/data/clip_tokenizer, written by
//! nightly/reference/clip_tokenizer.py): plain texts, and padded and truncated as pipelines
//! call it.

use std::path::{Path, PathBuf};

use serde_json::Value;
use zoo_hub::Pretrained;

fn data() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/clip_tokenizer")
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

#[test]
fn clip_vocab_and_merges_tokenize_as_transformers() {
    let expected: Value =
        serde_json::from_str(&std::fs::read_to_string(data().join("expected.json")).unwrap())
            .unwrap();
    let pretrained = Pretrained::open(data().to_str().unwrap()).unwrap();
    let json = pretrained
        .tokenizer_json()
        .unwrap()
        .expect("a CLIP tokenizer from vocab.json and merges.txt");
    let tok = tokenizers::Tokenizer::from_bytes(serde_json::to_vec(&json).unwrap()).unwrap();
    let max = expected["max_length"].as_u64().unwrap() as usize;
    let pad = expected["pad_token_id"].as_u64().unwrap() as u32;
    for case in expected["cases"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let got = tok.encode(text, true).unwrap().get_ids().to_vec();
        assert_eq!(got, ids(&case["ids"]), "{text:?}");
        // As a pipeline asks: truncated to max_length keeping the end token, padded with
        // pad_token_id, masked.
        let mut piped = got.clone();
        if piped.len() > max {
            let end = *piped.last().unwrap();
            piped.truncate(max - 1);
            piped.push(end);
        }
        let real = piped.len();
        piped.resize(max, pad);
        assert_eq!(piped, ids(&case["pipeline_ids"]), "{text:?} for a pipeline");
        let mask: Vec<u32> = (0..max).map(|i| u32::from(i < real)).collect();
        assert_eq!(mask, ids(&case["pipeline_mask"]), "{text:?}");
    }
}

#[test]
fn a_merge_naming_a_symbol_outside_the_vocabulary_is_refused_naming_the_line() {
    let dir = tempfile::tempdir().unwrap();
    for f in ["vocab.json", "tokenizer_config.json"] {
        std::fs::copy(data().join(f), dir.path().join(f)).unwrap();
    }
    std::fs::write(dir.path().join("merges.txt"), "#version: 0.2\nh e\nzz q\n").unwrap();
    let err = Pretrained::open(dir.path().to_str().unwrap())
        .unwrap()
        .tokenizer_json()
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("merges.txt") && err.contains("line 3") && err.contains("\"zz\""),
        "{err}"
    );
}
