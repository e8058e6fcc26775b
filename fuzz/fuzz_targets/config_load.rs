//! Arbitrary bytes as the `config.json` beside a real tiny checkpoint, loaded as zoo loads a
//! model: the first byte picks the checkpoint (a decoder, an MoE decoder, GPT-2, BERT, ViT,
//! CLIP, T5), the rest is the config. A typed error or a loaded model, never a panic; run
//! with a 1 GiB limit (`scripts/fuzz.sh`), so a size trusted before it is checked against
//! the weights is an out-of-memory failure here.
#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use zoo_transformers::{AutoModel, LoadOptions};

const CHECKPOINTS: &[&str] = &[
    "llama-gqa-f32",
    "gemma3-pattern-f32",
    "mixtral-top2-f32",
    "phi3-fused-f32",
    "gpt2-base-f32",
    "bert-base-f32",
    "vit-f32",
    "clip-text-f32",
    "t5-encoder-f32",
];

/// One folder per checkpoint holding its weights; each run rewrites its config.json.
fn folders() -> &'static Vec<PathBuf> {
    static FOLDERS: OnceLock<(tempfile::TempDir, Vec<PathBuf>)> = OnceLock::new();
    &FOLDERS
        .get_or_init(|| {
            let root = tempfile::tempdir().expect("a temporary folder");
            let fixtures = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../nightly/fixtures");
            let dirs = CHECKPOINTS
                .iter()
                .map(|name| {
                    let dir = root.path().join(name);
                    std::fs::create_dir_all(&dir).expect("a checkpoint folder");
                    std::fs::copy(
                        fixtures.join(name).join("model.safetensors"),
                        dir.join("model.safetensors"),
                    )
                    .expect("the fixture's weights");
                    dir
                })
                .collect();
            (root, dirs)
        })
        .1
}

fuzz_target!(|data: &[u8]| {
    let Some((&pick, config)) = data.split_first() else {
        return;
    };
    let dirs = folders();
    let dir = &dirs[pick as usize % dirs.len()];
    std::fs::write(dir.join("config.json"), config).expect("write config.json");
    let _ = AutoModel::load_with(&dir.to_string_lossy(), LoadOptions::default());
});
