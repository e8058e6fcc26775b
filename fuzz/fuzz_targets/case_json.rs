//! Arbitrary bytes as a parity case's `case.json`, beside the committed tensors of a real case
//! (nightly/fixtures/llama-gqa-f32): a typed error, or a case whose entries all agree with its
//! tensors and whose tolerances can be read.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::path::PathBuf;
use std::sync::OnceLock;
use zoo_nightly::case::Case;

/// A private folder holding the fixture's tensors; case.json is rewritten per input.
fn folder() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let fixture =
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../nightly/fixtures/llama-gqa-f32");
        let dir = std::env::temp_dir().join(format!("zoo-fuzz-case-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for f in [
            "inputs.safetensors",
            "expected.safetensors",
            "config.json",
            "model.safetensors",
        ] {
            std::fs::copy(fixture.join(f), dir.join(f)).unwrap();
        }
        dir
    })
}

fuzz_target!(|data: &[u8]| {
    let dir = folder();
    std::fs::write(dir.join("case.json"), data).unwrap();
    if let Ok(case) = Case::load(dir) {
        let _ = case.checkpoint_path();
        for entry in &case.spec.outputs {
            let _ = case.tolerance_for(entry);
            assert!(
                case.expected.get(&entry.name).is_some(),
                "{} has no tensor",
                entry.name
            );
        }
    }
});
