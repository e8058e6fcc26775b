//! Hostile inputs through the real `zoo` binary, each run confined: an address-space limit of
//! 1 GiB (`ulimit -v`), a file-size limit where a full disk is simulated (`ulimit -f`, with
//! SIGXFSZ ignored so a write fails with EFBIG as on a full disk), and 60 s. A regression
//! (a size trusted before it is checked, an output that lies) then fails its test instead of
//! exhausting the machine. Every refused input must end in a typed `error:` line naming what
//! was wrong, exit 1 or 2, never panic or abort, and leave no file behind.

#![cfg(unix)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

mod common;
use common::{copy_dir, fixture_dir};

/// The address-space limit of every run (KiB).
const ADDRESS_SPACE_KIB: u64 = 1 << 20;

/// How a confined run ended.
struct Outcome {
    /// `None` when a signal ended it.
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// Runs `zoo args` under the limits (`file_blocks`: `ulimit -f` in 512-byte blocks, to fail
/// writes past that size), with stdout to `stdout` when given.
fn confined_with(
    args: &[&str],
    file_blocks: Option<u64>,
    stdout: Option<std::fs::File>,
) -> Outcome {
    let mut script = format!("ulimit -v {ADDRESS_SPACE_KIB}; trap '' XFSZ; ");
    if let Some(b) = file_blocks {
        script.push_str(&format!("ulimit -f {b}; "));
    }
    script.push_str("exec \"$0\" \"$@\"");
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg(script)
        .arg(env!("CARGO_BIN_EXE_zoo"))
        .args(args)
        .env("HF_HUB_OFFLINE", "1")
        // Thread pools and malloc arenas reserve address space per thread: keep the limit
        // about memory, not about the core count of the machine running the test.
        .env("RAYON_NUM_THREADS", "2")
        .env("MALLOC_ARENA_MAX", "2")
        .stdin(Stdio::null())
        .stderr(Stdio::piped());
    match stdout {
        Some(f) => cmd.stdout(f),
        None => cmd.stdout(Stdio::piped()),
    };
    let mut child = cmd.spawn().expect("run zoo under sh");
    let started = Instant::now();
    loop {
        if child.try_wait().expect("wait").is_some() {
            break;
        }
        if started.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("zoo {args:?} ran past 60 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().expect("output");
    Outcome {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn confined(args: &[&str]) -> Outcome {
    confined_with(args, None, None)
}

/// `args` is refused cleanly: exit 1 or 2 (no signal, no panic), an `error:` line holding
/// every one of `says`, no Rust debug formatting.
fn refused(args: &[&str], says: &[&str]) -> Outcome {
    let o = confined(args);
    check_refused(args, &o, says);
    o
}

fn check_refused(args: &[&str], o: &Outcome, says: &[&str]) {
    assert!(
        matches!(o.code, Some(1 | 2)),
        "zoo {args:?} ended with {:?}:\n{}",
        o.code,
        o.stderr
    );
    assert!(
        !o.stderr.contains("panicked"),
        "zoo {args:?}:\n{}",
        o.stderr
    );
    let error = o
        .stderr
        .lines()
        .find(|l| l.starts_with("error:"))
        .unwrap_or_else(|| panic!("zoo {args:?}: no error line:\n{}", o.stderr));
    for w in says {
        assert!(error.contains(w), "zoo {args:?}: {w:?} not in {error}");
    }
    for debug in ["Some(", "None,", " { ", "Error {"] {
        assert!(
            !error.contains(debug),
            "zoo {args:?}: debug text in {error}"
        );
    }
}

fn s(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn pipeline(name: &str) -> PathBuf {
    root().join("diffusers/tests/data/pipelines").join(name)
}

/// Sets `field` (dotted for a nested config) of the JSON file at `path` to `value`.
fn set(path: &Path, field: &str, value: Value) {
    let mut json: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    let mut at = &mut json;
    let parts: Vec<&str> = field.split('.').collect();
    for p in &parts[..parts.len() - 1] {
        at = &mut at[*p];
    }
    at[parts[parts.len() - 1]] = value;
    std::fs::write(path, json.to_string()).unwrap();
}

/// A copy of the nightly fixture `name` with its config's `field` set to `value`.
fn fixture_with(name: &str, field: &str, value: Value) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    copy_dir(&root().join("nightly/fixtures").join(name), dir.path());
    set(&dir.path().join("config.json"), field, value);
    dir
}

/// Every file under `dir`, relative.
fn files_in(dir: &Path) -> Vec<String> {
    let mut out: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    out.sort();
    out
}

#[test]
fn layer_counts_past_the_checkpoint_are_refused_before_allocation() {
    for count in [100_000_000u64, 1 << 31] {
        let dir = fixture_dir("llama-gqa-f32");
        set(
            &dir.path().join("config.json"),
            "num_hidden_layers",
            count.into(),
        );
        refused(
            &["generate", &s(dir.path()), "hi"],
            &["num_hidden_layers", &count.to_string(), "model.layers.1"],
        );
    }
    let bert = fixture_with("bert-base-f32", "num_hidden_layers", 100_000_000.into());
    refused(&["embed", &s(bert.path()), "hi"], &["num_hidden_layers"]);
    let clip = fixture_with("clip-text-f32", "num_hidden_layers", (1u64 << 31).into());
    refused(&["embed", &s(clip.path()), "hi"], &["num_hidden_layers"]);
    let vit = fixture_with(
        "vit-classifier-f32",
        "num_hidden_layers",
        (1u64 << 31).into(),
    );
    let img = root().join("transformers/tests/data/image_processors/palette.png");
    refused(
        &["classify", &s(vit.path()), &s(&img)],
        &["num_hidden_layers"],
    );
    // Diffusers components: the Flux transformer's block counts, SD's CLIP text encoder.
    let out = tempfile::tempdir().unwrap();
    let png = s(&out.path().join("o.png"));
    for (pipe, component, field) in [
        ("flux", "transformer", "num_layers"),
        ("flux", "transformer", "num_single_layers"),
        ("sd15", "text_encoder", "num_hidden_layers"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        copy_dir(&pipeline(pipe), dir.path());
        set(
            &dir.path().join(component).join("config.json"),
            field,
            100_000_000.into(),
        );
        refused(
            &["image", &s(dir.path()), "x", "--steps", "2", "--out", &png],
            &[field, component],
        );
    }
    assert!(files_in(out.path()).is_empty());
}

#[test]
fn pre_quantized_checkpoints_are_refused_not_read_without_their_scales() {
    // An fp8 config: its weights would load as plain values, off by their scales.
    let fp8 = fixture_with(
        "llama-gqa-f32",
        "quantization_config",
        json!({"quant_method": "fp8", "activation_scheme": "dynamic"}),
    );
    let o = refused(
        &["generate", &s(fp8.path()), "hi", "--max-new-tokens", "2"],
        &["quantization_config", "\"fp8\"", "pre-quantized"],
    );
    assert_eq!(o.code, Some(2), "{}", o.stderr);
    let gptq = fixture_with(
        "bert-base-f32",
        "quantization_config",
        json!({"quant_method": "gptq", "bits": 4}),
    );
    refused(
        &["embed", &s(gptq.path()), "hi"],
        &["quantization_config", "\"gptq\""],
    );
    // A diffusers component says so in its own config.json.
    let dir = tempfile::tempdir().unwrap();
    copy_dir(&pipeline("sd15"), dir.path());
    set(
        &dir.path().join("unet/config.json"),
        "quantization_config",
        json!({"quant_method": "bitsandbytes", "load_in_4bit": true}),
    );
    refused(
        &[
            "image",
            &s(dir.path()),
            "a cat",
            "--steps",
            "1",
            "--out",
            &s(&dir.path().join("x.png")),
        ],
        &["unet", "quantization_config", "\"bitsandbytes\""],
    );
}

#[test]
fn token_ids_past_32_bits_name_their_field() {
    for field in ["eos_token_id", "bos_token_id", "pad_token_id"] {
        let dir = fixture_dir("llama-gqa-f32");
        set(&dir.path().join("config.json"), field, (1u64 << 40).into());
        refused(&["generate", &s(dir.path()), "hi"], &[field, "token id"]);
    }
}

#[test]
fn absurd_new_token_counts_are_capped_by_the_context() {
    let dir = fixture_dir("llama-gqa-f32");
    for n in ["100000000", "18446744073709551614", "18446744073709551615"] {
        let o = confined(&["generate", &s(dir.path()), "hi", "--max-new-tokens", n]);
        assert_eq!(o.code, Some(0), "{n}: {}", o.stderr);
        assert!(o.stderr.contains("capped"), "{n}: {}", o.stderr);
    }
}

#[test]
fn plans_check_their_arithmetic_and_arguments() {
    let dir = fixture_dir("llama-gqa-f32");
    let m = s(dir.path());
    let plan = |extra: &[&str], says: &[&str]| {
        let mut args = vec!["plan", &m, "--max-memory", "8GiB", "--platform", "tpu"];
        args.extend_from_slice(extra);
        refused(&args, says);
    };
    plan(&["--batch", "18446744073709551615"], &["does not fit"]);
    plan(&["--seq", "18446744073709551615"], &["does not fit"]);
    plan(&["--reserve", "NaN"], &["reserve"]);
    plan(&["--reserve=-1"], &["reserve"]);
    plan(&["--seq", "0"], &["seq"]);
    plan(&["--devices", "100000000"], &["--devices"]);
    plan(&["--devices", "0"], &["--devices"]);
}

#[test]
fn image_sizes_and_counts_are_checked_against_memory() {
    let out = tempfile::tempdir().unwrap();
    let png = s(&out.path().join("o.png"));
    let sd = s(&pipeline("sd15"));
    let image = |extra: &[&str], says: &[&str]| {
        let mut args = vec!["image", &sd, "x", "--steps", "2", "--out", &png];
        args.extend_from_slice(extra);
        refused(&args, says);
    };
    image(&["--size", "65536x65536"], &["65536x65536", "host memory"]);
    image(&["--size", "4294967296x8"], &["host memory"]);
    image(&["--size", "1000000x8"], &["host memory"]);
    image(&["--num-images", "100000000"], &["100000000 image(s)"]);
    assert!(files_in(out.path()).is_empty());
}

#[test]
fn bombs_and_truncated_images_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let vit = s(&root().join("nightly/fixtures/vit-classifier-f32"));
    let bomb = dir.path().join("bomb.png");
    common::png_bomb(&bomb, 100_000);
    refused(&["classify", &vit, &s(&bomb)], &["100000x100000"]);
    let jpeg = std::fs::read(root().join("transformers/tests/data/image_processors/color420.jpg"))
        .expect("a JPEG fixture");
    let cut = dir.path().join("cut.jpg");
    std::fs::write(&cut, &jpeg[..jpeg.len() / 2]).unwrap();
    refused(&["classify", &vit, &s(&cut)], &["cut.jpg", "truncated"]);
}

#[test]
fn outputs_never_lie() {
    let dir = tempfile::tempdir().unwrap();
    let sd = s(&pipeline("sd15"));
    let image_to = |out: &Path| {
        vec![
            "image".to_string(),
            sd.clone(),
            "x".into(),
            "--steps".into(),
            "2".into(),
            "--size".into(),
            "32x32".into(),
            "--out".into(),
            s(out),
        ]
    };
    let run = |args: &[String]| refused(&args.iter().map(String::as_str).collect::<Vec<_>>(), &[]);
    // A symbolic link is refused and left as it was; its target is never written.
    let target = dir.path().join("target.png");
    let link = dir.path().join("link.png");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let o = run(&image_to(&link));
    assert!(o.stderr.contains("symbolic link"), "{}", o.stderr);
    assert!(std::fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());
    assert!(!target.exists());
    // A FIFO is refused (and never opened: the run would block).
    let fifo = dir.path().join("fifo.png");
    assert!(Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    let o = run(&image_to(&fifo));
    assert!(o.stderr.contains("not a regular file"), "{}", o.stderr);
    // A full disk: the write fails, the command fails, nothing is left.
    let full = tempfile::tempdir().unwrap();
    let args = image_to(&full.path().join("o.png"));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let o = confined_with(&args[..], Some(1), None);
    check_refused(&args, &o, &["o.png"]);
    assert!(
        files_in(full.path()).is_empty(),
        "{:?}",
        files_in(full.path())
    );
    let model = fixture_dir("llama-gqa-f32");
    let plan = full.path().join("plan.json");
    let args = [
        "plan",
        &s(model.path()),
        "--max-memory",
        "8GiB",
        "--platform",
        "tpu",
        "--devices",
        "2",
        "--out",
        &s(&plan),
    ];
    let o = confined_with(&args, Some(0), None);
    check_refused(&args, &o, &["plan.json"]);
    assert!(
        files_in(full.path()).is_empty(),
        "{:?}",
        files_in(full.path())
    );
    // Stdout on a full device: the command fails instead of claiming success.
    let devfull = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .unwrap();
    let args = ["inspect", &s(model.path())];
    let o = confined_with(&args, None, Some(devfull));
    check_refused(&args, &o, &["stdout"]);
}

#[test]
fn names_that_would_leave_their_folder_are_refused() {
    let model = fixture_dir("llama-gqa-f32");
    let m = s(model.path());
    refused(
        &["generate", &m, "hi", "--revision", "../../../../etc"],
        &["revision", "../../../../etc"],
    );
    refused(
        &["generate", "org/name@../../../etc", "hi"],
        &["revision", ".."],
    );
    refused(
        &["generate", &m, "hi", "--revision", "main"],
        &["local path"],
    );
    let out = tempfile::tempdir().unwrap();
    let png = s(&out.path().join("o.png"));
    let sd = s(&pipeline("sd15"));
    for variant in ["../../x", "a/b", ".."] {
        refused(
            &["image", &sd, "x", "--variant", variant, "--out", &png],
            &["variant"],
        );
    }
    // A component named as a path in model_index.json.
    let dir = tempfile::tempdir().unwrap();
    copy_dir(&pipeline("sd15"), dir.path());
    let index = dir.path().join("model_index.json");
    let mut json: Value = serde_json::from_slice(&std::fs::read(&index).unwrap()).unwrap();
    json["../unet"] = serde_json::json!(["diffusers", "UNet2DConditionModel"]);
    std::fs::write(&index, json.to_string()).unwrap();
    refused(
        &["image", &s(dir.path()), "x", "--out", &png],
        &["component", "../unet"],
    );
    // A symbolic link loop is reported as one.
    let loops = tempfile::tempdir().unwrap();
    let (a, b) = (loops.path().join("a"), loops.path().join("b"));
    std::os::unix::fs::symlink(&b, &a).unwrap();
    std::os::unix::fs::symlink(&a, &b).unwrap();
    refused(&["generate", &s(&a), "hi"], &["loop"]);
    assert!(files_in(out.path()).is_empty());
}

#[test]
fn device_maps_are_checked_against_the_modules() {
    let model = fixture_dir("llama-gqa-f32");
    let m = s(model.path());
    let map = |json: &str| {
        let p = model.path().join("map.json");
        std::fs::write(&p, json).unwrap();
        s(&p)
    };
    let unknown = map(r#"{"": "cpu", "model.layers.999": "cpu"}"#);
    refused(
        &["generate", &m, "hi", "--device-map", &unknown],
        &["model.layers.999", "does not have"],
    );
    let partial = map(r#"{"model.embed_tokens": "cpu"}"#);
    refused(
        &["generate", &m, "hi", "--device-map", &partial],
        &["no device", "lm_head"],
    );
    refused(
        &["generate", &m, "hi", "--device-map", "pjrt:bogus"],
        &["pjrt:bogus"],
    );
    // Everything covered, overlapping entries allowed (the longest prefix wins), and the
    // weightless rotary module accelerate lists accepted.
    let full = map(r#"{"": "cpu", "model.layers.0": "cpu", "model.rotary_emb": "cpu"}"#);
    let o = confined(&[
        "generate",
        &m,
        "hi",
        "--max-new-tokens",
        "2",
        "--device-map",
        &full,
    ]);
    assert_eq!(o.code, Some(0), "{}", o.stderr);
}

#[test]
fn checkpoints_are_found_in_transformers_order_and_pipelines_pointed_to_zoo_image() {
    // A stale index beside a complete single file: the single file loads, as in transformers.
    let model = fixture_dir("llama-gqa-f32");
    std::fs::write(
        model.path().join("model.safetensors.index.json"),
        r#"{"metadata": {}, "weight_map": {"model.norm.weight": "model-00001-of-00002.safetensors"}}"#,
    )
    .unwrap();
    let o = confined(&["generate", &s(model.path()), "hi", "--max-new-tokens", "2"]);
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    refused(
        &["generate", &s(&pipeline("sd15")), "hi"],
        &["diffusers pipeline", "zoo image"],
    );
    assert!(o.stdout.len() > 2);
}

#[test]
fn processor_sizes_and_server_batches_are_bounded() {
    let img = s(&root().join("transformers/tests/data/image_processors/rgb.png"));
    for (field, value) in [
        (
            "size",
            serde_json::json!({"height": 1_000_000, "width": 1_000_000}),
        ),
        ("size", serde_json::json!({"shortest_edge": 1u64 << 30})),
        (
            "crop_size",
            serde_json::json!({"height": 1 << 20, "width": 1 << 20}),
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        copy_dir(
            &root().join("nightly/fixtures/vit-classifier-f32"),
            dir.path(),
        );
        let pre = dir.path().join("preprocessor_config.json");
        let mut json: Value = serde_json::from_slice(&std::fs::read(&pre).unwrap()).unwrap();
        json[field] = value;
        json["do_center_crop"] = true.into();
        std::fs::write(&pre, json.to_string()).unwrap();
        refused(
            &["classify", &s(dir.path()), &img],
            &[field, "MAX_IMAGE_PIXELS"],
        );
    }
    // A server's KV pool holds what memory leaves, and every running sequence holds a block
    // of it: a batch past the blocks is refused at start.
    let model = fixture_dir("llama-gqa-f32");
    refused(
        &[
            "serve",
            &s(model.path()),
            "--port",
            "0",
            "--max-batch",
            "100000000",
        ],
        &["--max-batch 100000000", "blocks", "at most"],
    );
    // A step must feed every running sequence a token.
    refused(
        &[
            "serve",
            &s(model.path()),
            "--port",
            "0",
            "--max-batch",
            "4",
            "--max-step-tokens",
            "3",
        ],
        &["--max-step-tokens 3", "--max-batch 4", "at least 4"],
    );
    // A cpu limit that holds the weights (about 138 KiB) but not one sequence of cache (four
    // blocks of 4 KiB at 64 tokens) beside them.
    let m = s(model.path());
    let args = ["serve", &m, "--port", "0", "--max-memory", "cpu=150KiB"];
    for batch in [&["--max-batch", "16"][..], &[]] {
        refused(
            &[&args[..], batch].concat(),
            &["one sequence of 64 tokens", "--context", "--max-memory"],
        );
    }
}
