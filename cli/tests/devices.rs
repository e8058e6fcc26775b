//! `zoo devices` on the XLA CPU plugin that the test command fetches.

use std::process::Command;

fn plugin() -> String {
    std::env::var("ZOO_PJRT_CPU_PLUGIN")
        .expect("ZOO_PJRT_CPU_PLUGIN is unset: run the tests through scripts/run-tests.sh")
}

#[test]
fn devices_lists_the_plugin_its_version_and_devices() {
    let out = Command::new(env!("CARGO_BIN_EXE_zoo"))
        .args(["devices", "--platform", "cpu", "--plugin", &plugin()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains(&plugin()), "{text}");
    assert!(text.contains("PJRT API 0."), "{text}");
    assert!(text.contains("platform: cpu"), "{text}");
    assert!(text.contains("[0] cpu"), "{text}");
}

#[test]
fn devices_with_nothing_to_find_names_every_place_searched() {
    let empty = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_zoo"))
        .args(["devices", "--platform", "tpu"])
        .env_remove("PJRT_NAMES_AND_LIBRARY_PATHS")
        .env_remove("TPU_LIBRARY_PATH")
        .env("PYTHONPATH", empty.path())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("TPU_LIBRARY_PATH") || err.contains("no TPU"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn devices_names_the_cpu_tier_and_an_unknown_cap_is_refused() {
    let run = |cap: &str| {
        Command::new(env!("CARGO_BIN_EXE_zoo"))
            .args(["devices", "--platform", "cpu", "--plugin", &plugin()])
            .env("ZOO_CPU", cap)
            .output()
            .unwrap()
    };
    let out = run("generic");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(
        text.lines()
            .next()
            .is_some_and(|l| l.starts_with("CPU kernels: generic")),
        "{text}"
    );
    let out = run("sse");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("ZOO_CPU=\"sse\"") && err.contains("generic, avx2, avx512, amx"),
        "{err}"
    );
}
