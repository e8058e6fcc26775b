//! `zoo classify` and `zoo embed --image` end to end on the committed vision cases, which
//! ship an image processor (and CLIP a tokenizer) like a Hub repo: probabilities against what
//! transformers' own pipelines answer for the same image (`pipeline.json`, written by
//! `nightly/reference/vision.py`), and typed errors for bad input.

use std::path::{Path, PathBuf};

use serde_json::Value;

mod common;
use common::zoo;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn fixture(name: &str) -> String {
    root()
        .join("nightly/fixtures")
        .join(name)
        .to_string_lossy()
        .into_owned()
}

fn image(name: &str) -> String {
    root()
        .join("transformers/tests/data/image_processors")
        .join(name)
        .to_string_lossy()
        .into_owned()
}

/// The pipeline's answer, and zoo's `--json` answer, as (label, score) lists.
fn compare(case: &str, args: &[&str]) {
    let want: Value = serde_json::from_str(
        &std::fs::read_to_string(Path::new(&fixture(case)).join("pipeline.json")).unwrap(),
    )
    .unwrap();
    let img = root().join(want["image"].as_str().unwrap());
    let model = fixture(case);
    let mut full = vec!["classify", &model, img.to_str().unwrap(), "--json"];
    full.extend_from_slice(args);
    let (ok, out, err) = zoo(&full);
    assert!(ok, "{err}");
    let got: Value = serde_json::from_str(&out).unwrap();
    let (got, want) = (got.as_array().unwrap(), want["result"].as_array().unwrap());
    assert_eq!(got.len(), want.len(), "{out}");
    for (g, w) in got.iter().zip(want) {
        assert_eq!(g["label"], w["label"], "{out}");
        let (g, w) = (g["score"].as_f64().unwrap(), w["score"].as_f64().unwrap());
        assert!((g - w).abs() < 1e-4, "{g} vs transformers' {w}");
    }
}

#[test]
fn zero_shot_matches_transformers_pipeline() {
    compare("clip-model-f32", &["--labels", "a cat,a dog,a red car"]);
}

/// SigLIP: prompts padded to 64 tokens, a sigmoid per label.
#[test]
fn siglip_zero_shot_matches_transformers_pipeline() {
    compare("siglip-model-f32", &["--labels", "a cat,a dog,a red car"]);
}

#[test]
fn image_classification_matches_transformers_pipeline() {
    compare("vit-classifier-f32", &[]);
}

#[test]
fn classify_prints_percentages_best_first() {
    let (ok, out, err) = zoo(&[
        "classify",
        &fixture("vit-classifier-f32"),
        &image("color420.jpg"),
        "--top-k",
        "2",
    ]);
    assert!(ok, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2, "{out}");
    let pct = |l: &str| l.trim().split('%').next().unwrap().parse::<f64>().unwrap();
    assert!(pct(lines[0]) >= pct(lines[1]), "{out}");
}

#[test]
fn embed_image_gives_one_vector_per_image() {
    let (ok, out, err) = zoo(&[
        "embed",
        &fixture("clip-model-f32"),
        "--image",
        &image("rgb.png"),
        "--image",
        &image("gray.jpg"),
        "--json",
    ]);
    assert!(ok, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["embedding"], "projection");
    let e = v["embeddings"].as_array().unwrap();
    assert_eq!(e.len(), 2);
    assert_eq!(e[0]["embedding"].as_array().unwrap().len(), 24);
    assert_eq!(v["cosine_similarity"].as_array().unwrap().len(), 2);
}

#[test]
fn bad_images_and_wrong_models_are_typed_errors() {
    let dir = tempfile::tempdir().unwrap();
    let notes = dir.path().join("notes.jpg");
    std::fs::write(&notes, "not a picture").unwrap();
    let (ok, _, err) = zoo(&[
        "classify",
        &fixture("vit-classifier-f32"),
        notes.to_str().unwrap(),
    ]);
    assert!(!ok);
    assert!(
        err.contains("notes.jpg") && !err.contains("panicked"),
        "{err}"
    );
    let (ok, _, err) = zoo(&[
        "classify",
        &fixture("vit-classifier-f32"),
        &image("gray16.png"),
    ]);
    assert!(!ok);
    assert!(
        err.contains("16-bit") && err.contains("gray16.png"),
        "{err}"
    );
    // A classifier is not an image-text model: zero-shot labels need a CLIPModel.
    let (ok, _, err) = zoo(&[
        "classify",
        &fixture("vit-classifier-f32"),
        &image("rgb.png"),
        "--labels",
        "a,b",
    ]);
    assert!(!ok);
    assert!(
        err.contains("AutoModelForZeroShotImageClassification"),
        "{err}"
    );
    let (ok, _, err) = zoo(&[
        "classify",
        &fixture("clip-model-f32"),
        &image("rgb.png"),
        "--labels",
        " , ",
    ]);
    assert!(!ok);
    assert!(err.contains("--labels"), "{err}");
    // A text encoder has no image classifier.
    let (ok, _, err) = zoo(&["classify", &fixture("clip-text-f32"), &image("rgb.png")]);
    assert!(!ok);
    assert!(err.contains("cannot be loaded"), "{err}");
}

#[test]
fn image_bombs_are_refused_before_decoding_and_the_limit_moves() {
    let dir = tempfile::tempdir().unwrap();
    let bomb = dir.path().join("bomb.png");
    common::png_bomb(&bomb, 100_000);
    let bomb = bomb.to_str().unwrap();
    let refused = |args: &[&str]| {
        let (ok, _, err) = zoo(args);
        assert!(!ok, "{args:?}");
        assert!(
            err.contains("bomb.png")
                && err.contains("100000x100000")
                && err.contains("--max-image-pixels")
                && !err.contains("panicked"),
            "{err}"
        );
    };
    refused(&["classify", &fixture("vit-classifier-f32"), bomb]);
    refused(&["embed", &fixture("clip-vision-f32"), "--image", bomb]);
    // The limit is the flag's: rgb.png (8x8 pixels here or more) is refused under 2 pixels
    // and read under the default.
    let (ok, _, err) = zoo(&[
        "classify",
        &fixture("vit-classifier-f32"),
        &image("rgb.png"),
        "--max-image-pixels",
        "1",
    ]);
    assert!(!ok);
    assert!(err.contains("above the limit of 1"), "{err}");
}
