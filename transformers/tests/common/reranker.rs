//! The tiny BERT classifiers of `transformers/tests/data` (the reranker of `cross_encoder`,
//! written by `nightly/reference/cross_encoder.py`; the three-label text classifier of
//! `text_classifier`, by `text_classifier.py`) with all-MiniLM-L6-v2's tokenizer files beside
//! them, in a temporary folder: what the cross-encoder and text-classification tests of every
//! crate load.

use std::path::Path;

/// The reranker folder, with the tokenizer files of the all-MiniLM-L6-v2 folder `minilm`.
#[allow(dead_code)] // not every including test reads it
pub fn reranker_folder(minilm: &Path) -> tempfile::TempDir {
    classifier_folder("cross_encoder", minilm, |_| {})
}

/// The classifier of `transformers/tests/data/{name}` with the tokenizer files of `minilm`,
/// its `config.json` first passed through `edit`.
pub fn classifier_folder(
    name: &str,
    minilm: &Path,
    edit: impl FnOnce(&mut serde_json::Value),
) -> tempfile::TempDir {
    let data = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../transformers/tests/data")
        .join(name);
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        data.join("model.safetensors"),
        dir.path().join("model.safetensors"),
    )
    .unwrap();
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(data.join("config.json")).unwrap()).unwrap();
    edit(&mut config);
    std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
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
