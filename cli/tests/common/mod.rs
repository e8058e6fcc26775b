//! Running the `zoo` binary from the CLI tests.
#![allow(dead_code)]

use std::path::Path;
use std::process::Command;

use serde_json::{json, Value};

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

/// GPT-2's byte → printable character map (one token per byte).
fn byte_char(b: u8) -> char {
    let printable = |b: u8| {
        (b'!'..=b'~').contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b)
    };
    if printable(b) {
        return b as char;
    }
    char::from_u32(256 + (0..b).filter(|&x| !printable(x)).count() as u32).unwrap()
}

/// A decoder parity fixture (vocabulary of 256 ids) in a folder of its own, with a
/// byte-level tokenizer and a chat template.
pub fn fixture_dir(name: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../nightly/fixtures")
        .join(name);
    for f in ["config.json", "model.safetensors", "generation_config.json"] {
        std::fs::copy(src.join(f), dir.path().join(f)).unwrap();
    }
    let vocab: serde_json::Map<String, Value> = (0..=255u8)
        .map(|b| (byte_char(b).to_string(), json!(b)))
        .collect();
    let bl = json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true});
    let tok = json!({"version": "1.0", "truncation": null, "padding": null, "added_tokens": [], "normalizer": null,
        "pre_tokenizer": bl, "post_processor": null, "decoder": bl,
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "vocab": vocab, "merges": []}});
    std::fs::write(dir.path().join("tokenizer.json"), tok.to_string()).unwrap();
    let tc = json!({"bos_token": "<s>", "eos_token": "</s>",
        "chat_template": "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}"});
    std::fs::write(dir.path().join("tokenizer_config.json"), tc.to_string()).unwrap();
    dir
}

/// Copies the folder `from` (recursively) to `to`.
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let target = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), target).unwrap();
        }
    }
}
