//! The repository's scripts that CI and developers run by hand: their argument checks and
//! their behaviour on a machine without what they measure.

use std::path::{Path, PathBuf};
use std::process::Command;

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../scripts")
        .join(name)
}

#[test]
fn the_gpu_check_says_in_one_line_that_there_is_no_gpu_and_exits_0() {
    // A stand-in nvidia-smi that lists no GPU, first on PATH.
    let bin = tempfile::tempdir().unwrap();
    let fake = bin.path().join("nvidia-smi");
    std::fs::write(
        &fake,
        "#!/bin/sh\necho 'No devices were found' >&2\nexit 6\n",
    )
    .unwrap();
    Command::new("chmod").arg("+x").arg(&fake).status().unwrap();
    let path = format!(
        "{}:{}",
        bin.path().display(),
        std::env::var("PATH").unwrap()
    );
    let out = Command::new("bash")
        .arg(script("gpu-check.sh"))
        .env("PATH", path)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert_eq!(stdout.lines().count(), 1, "{stdout:?}");
    assert!(stdout.contains("no NVIDIA GPU"), "{stdout}");
}

#[test]
fn the_fuzz_script_refuses_a_duration_that_is_not_a_number() {
    let out = Command::new("bash")
        .arg(script("fuzz.sh"))
        .arg("soon")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("SECONDS must be a number"), "{err}");
}

#[test]
fn the_benchmark_script_refuses_unknown_arguments_and_teaches_with_help() {
    let out = Command::new("bash")
        .arg(script("bench.sh"))
        .arg("--fast")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown argument --fast"));
    let help = Command::new("bash")
        .arg(script("bench.sh"))
        .arg("--help")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&help.stdout);
    assert!(help.status.success());
    assert!(
        text.contains("--check") && text.contains("--llama-cpp"),
        "{text}"
    );
}
