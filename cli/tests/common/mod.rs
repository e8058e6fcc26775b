//! Running the `zoo` binary from the CLI tests.
#![allow(dead_code)]

use std::process::Command;

/// Runs `zoo args` with `env` set (offline: the Hub is never reached); (success, stdout, stderr).
pub fn zoo_with(args: &[&str], env: &[(&str, &std::ffi::OsStr)]) -> (bool, String, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_zoo"));
    cmd.args(args).env("HF_HUB_OFFLINE", "1");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run zoo");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// [`zoo_with`] and no extra environment.
pub fn zoo(args: &[&str]) -> (bool, String, String) {
    zoo_with(args, &[])
}
