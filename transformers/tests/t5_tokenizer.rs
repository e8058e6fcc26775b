//! T5's tokenizer.json as transformers writes it (a Unigram model, Metaspace, `$A </s>`,
//! sentinels), through zoo's `Tokenizer`, against the ids transformers' `AutoTokenizer`
//! gives (transformers/tests/data/t5_tokenizer, written by
//! nightly/reference/t5_tokenizer.py): plain texts, padded and truncated as pipelines call
//! it, and decoded.

use std::path::{Path, PathBuf};

use serde_json::Value;
use zoo_hub::Pretrained;
use zoo_transformers::Tokenizer;

fn data() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/t5_tokenizer")
}

fn ids(v: &Value) -> Vec<u32> {
    serde_json::from_value(v.clone()).unwrap()
}

#[test]
fn t5_tokenizer_json_tokenizes_as_transformers() {
    let expected: Value =
        serde_json::from_str(&std::fs::read_to_string(data().join("expected.json")).unwrap())
            .unwrap();
    let tok =
        Tokenizer::from_pretrained(&Pretrained::open(data().to_str().unwrap()).unwrap()).unwrap();
    let max = expected["max_length"].as_u64().unwrap() as usize;
    let pad = expected["pad_token_id"].as_u64().unwrap() as u32;
    for case in expected["cases"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let got = tok.encode(text, true).unwrap();
        assert_eq!(got, ids(&case["ids"]), "{text:?}");
        // As a pipeline asks: at most max_length ids ending in </s>, padded with <pad>.
        let mut piped = tok.encode_truncated(text, max).unwrap();
        let real = piped.len();
        piped.resize(max, pad);
        assert_eq!(piped, ids(&case["pipeline_ids"]), "{text:?} for a pipeline");
        let mask: Vec<u32> = (0..max).map(|i| u32::from(i < real)).collect();
        assert_eq!(mask, ids(&case["pipeline_mask"]), "{text:?}");
        assert_eq!(
            tok.decode(&got, true).unwrap(),
            case["decoded"].as_str().unwrap(),
            "{text:?} decoded"
        );
    }
}
