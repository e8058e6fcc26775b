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

/// Writes a 69-byte PNG whose header declares `side x side` RGB pixels (no pixel data): an
/// image bomb that a decoder without a pixel limit would try to allocate.
pub fn png_bomb(path: &std::path::Path, side: u32) {
    let crc = |bytes: &[u8]| {
        !bytes.iter().fold(!0u32, |mut c, &b| {
            c ^= u32::from(b);
            for _ in 0..8 {
                c = if c & 1 == 1 {
                    (c >> 1) ^ 0xEDB8_8320
                } else {
                    c >> 1
                };
            }
            c
        })
    };
    let mut ihdr = b"IHDR".to_vec();
    ihdr.extend_from_slice(&side.to_be_bytes());
    ihdr.extend_from_slice(&side.to_be_bytes());
    ihdr.extend_from_slice(&[8, 2, 0, 0, 0]);
    let mut png = b"\x89PNG\r\n\x1a\n".to_vec();
    png.extend_from_slice(&13u32.to_be_bytes());
    png.extend_from_slice(&ihdr);
    png.extend_from_slice(&crc(&ihdr).to_be_bytes());
    for chunk in [b"IDAT", b"IEND"] {
        png.extend_from_slice(&[0, 0, 0, 0]);
        png.extend_from_slice(chunk);
        png.extend_from_slice(&crc(chunk).to_be_bytes());
    }
    std::fs::write(path, png).unwrap();
}
