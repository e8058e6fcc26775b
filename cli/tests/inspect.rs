//! `zoo inspect` end to end: the real binary on real files.

use std::process::Command;

mod common;
use common::zoo;

/// A folder with a config and a two-tensor checkpoint written by hand in the safetensors layout.
fn tiny_model(dir: &std::path::Path) {
    let header = r#"{"__metadata__":{"format":"pt"},"lm_head.weight":{"dtype":"BF16","shape":[4,2],"data_offsets":[0,16]},"model.norm.weight":{"dtype":"F32","shape":[2],"data_offsets":[16,24]}}"#;
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend_from_slice(&[0u8; 24]);
    std::fs::write(dir.join("model.safetensors"), bytes).unwrap();
    std::fs::write(
        dir.join("config.json"),
        r#"{"architectures":["LlamaForCausalLM"],"model_type":"llama","hidden_size":2,"num_hidden_layers":1,"rope_theta":10000.0}"#,
    )
    .unwrap();
}

#[test]
fn inspect_prints_files_config_tensors_and_totals() {
    let dir = tempfile::tempdir().unwrap();
    tiny_model(dir.path());
    let (ok, out, err) = zoo(&["inspect", dir.path().to_str().unwrap()]);
    assert!(ok, "{err}");
    assert!(out.contains("model.safetensors"), "{out}");
    assert!(out.contains("architectures: LlamaForCausalLM"), "{out}");
    assert!(out.contains("hidden_size: 2"), "{out}");
    assert!(
        out.contains("lm_head.weight") && out.contains("[4, 2]") && out.contains("BF16"),
        "{out}"
    );
    assert!(out.contains("tensors: 2"), "{out}");
    assert!(out.contains("BF16") && out.contains("F32"), "{out}");
    assert!(out.contains("(10 parameters)"), "{out}");
}

#[test]
fn inspect_names_a_checkpoints_quantization_scheme() {
    let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../nightly/fixtures");
    for (case, scheme) in [
        (
            "llama-w4a16-f32",
            "compressed-tensors pack-quantized: int4 group of 32 symmetric",
        ),
        ("llama-w4a16-asym-bf16", "int4 group of 64 asymmetric"),
        (
            "llama-fp8-bf16",
            "compressed-tensors float-quantized: float8 channel symmetric",
        ),
    ] {
        let (ok, out, err) = zoo(&["inspect", fixtures.join(case).to_str().unwrap()]);
        assert!(ok, "{err}");
        assert!(
            out.contains("quantization: compressed-tensors") && out.contains(scheme),
            "{out}"
        );
    }
    let (ok, out, err) = zoo(&[
        "inspect",
        fixtures.join("llama-fp8-blocks-f32").to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    assert!(
        out.contains("quantization: fp8 e4m3 weights, a scale per [32,32] block"),
        "{out}"
    );
}

#[test]
fn inspect_of_a_missing_repo_fails_with_the_places_searched() {
    let cache = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_zoo"))
        .args(["inspect", "nobody/nothing"])
        .env("HF_HUB_OFFLINE", "1")
        .env("HF_HUB_CACHE", cache.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("nobody/nothing") && err.contains("huggingface-cli download"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn inspect_of_a_corrupt_file_names_it() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("broken.safetensors");
    std::fs::write(&p, [200u8, 0, 0, 0, 0, 0, 0, 0, b'{']).unwrap();
    let (ok, _, err) = zoo(&["inspect", p.to_str().unwrap()]);
    assert!(!ok);
    assert!(
        err.contains("broken.safetensors") && err.contains("past the end"),
        "{err}"
    );
}

#[test]
fn help_teaches_the_model_forms() {
    let (ok, out, _) = zoo(&["inspect", "--help"]);
    assert!(ok);
    assert!(
        out.contains("org/name") && out.contains("--variant") && out.contains("Examples"),
        "{out}"
    );
}
