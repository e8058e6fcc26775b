//! The tiny BERT reranker of `transformers/tests/data/cross_encoder` (written by
//! `nightly/reference/cross_encoder.py`) with all-MiniLM-L6-v2's tokenizer files beside it,
//! in a temporary folder: what the cross-encoder tests of every crate load.

use std::path::Path;

/// The reranker folder, with the tokenizer files of the all-MiniLM-L6-v2 folder `minilm`.
pub fn reranker_folder(minilm: &Path) -> tempfile::TempDir {
    let data =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../transformers/tests/data/cross_encoder");
    let dir = tempfile::tempdir().unwrap();
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(data.join(f), dir.path().join(f)).unwrap();
    }
    for f in [
        "tokenizer.json",
        "tokenizer_config.json",
        "vocab.txt",
        "special_tokens_map.json",
    ] {
        if minilm.join(f).exists() {
            std::fs::copy(minilm.join(f), dir.path().join(f)).unwrap();
        }
    }
    dir
}

/// `expected.json`: what sentence-transformers' `CrossEncoder` made of it.
#[allow(dead_code)] // not every including test reads it
pub fn expected() -> serde_json::Value {
    serde_json::from_str(include_str!("../data/cross_encoder/expected.json")).unwrap()
}
