//! `zoo classify` on a text classifier: the tiny three-label BERT of
//! `transformers/tests/data/text_classifier` with all-MiniLM-L6-v2's tokenizer beside it, its
//! scores against what transformers' `text-classification` pipeline answers
//! (`expected.json`, written by `nightly/reference/text_classifier.py`), and bad input
//! refused by name.

use std::path::Path;

use serde_json::Value;

mod common;
use common::zoo;

#[path = "../../hub/tests/common/assets.rs"]
mod assets;
#[path = "../../transformers/tests/common/reranker.rs"]
mod reranker;

fn data() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../transformers/tests/data/text_classifier")
}

/// The classifier's folder with the tokenizer files of all-MiniLM-L6-v2.
fn folder() -> tempfile::TempDir {
    reranker::classifier_folder("text_classifier", &assets::asset("ZOO_MINILM_DIR"), |_| {})
}

#[test]
fn texts_score_as_the_pipeline() {
    let expected: Value =
        serde_json::from_str(&std::fs::read_to_string(data().join("expected.json")).unwrap())
            .unwrap();
    let dir = folder();
    let model = dir.path().to_str().unwrap();
    let texts: Vec<&str> = expected["texts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    let mut args = vec!["classify", model];
    args.extend(&texts);
    args.push("--json");
    let (ok, out, err) = zoo(&args);
    assert!(ok, "{err}");
    let got: Value = serde_json::from_str(&out).unwrap();
    for (i, (g, w)) in got
        .as_array()
        .unwrap()
        .iter()
        .zip(expected["softmax"].as_array().unwrap())
        .enumerate()
    {
        assert_eq!(g["text"], texts[i]);
        for (g, w) in g["labels"]
            .as_array()
            .unwrap()
            .iter()
            .zip(w.as_array().unwrap())
        {
            assert_eq!(g["label"], w["label"], "text {i}");
            let (gs, ws) = (g["score"].as_f64().unwrap(), w["score"].as_f64().unwrap());
            assert!((gs - ws).abs() < 1e-5, "text {i}: {gs} vs {ws}");
        }
    }
    // Plain output: percentages, best first; --top-k keeps the best.
    let (ok, out, err) = zoo(&["classify", model, texts[0], "--top-k", "1"]);
    assert!(ok, "{err}");
    let best = &expected["softmax"][0][0];
    let line = format!(
        "{:.2}%  {}",
        best["score"].as_f64().unwrap() * 100.0,
        best["label"].as_str().unwrap()
    );
    assert!(out.trim() == line, "{out:?} vs {line:?}");
}

#[test]
fn bad_text_input_is_refused_by_name() {
    let dir = folder();
    let model = dir.path().to_str().unwrap();
    let long = "word ".repeat(100);
    let (ok, _, err) = zoo(&["classify", model, &long]);
    assert!(
        !ok && err.contains("the model takes 64") && err.contains("truncate"),
        "{err}"
    );
    let (ok, _, err) = zoo(&["classify", model, &long, "--truncate", "--json"]);
    assert!(ok, "{err}");
    let (ok, _, err) = zoo(&["classify", model, "fine", "--function", "argmax"]);
    assert!(
        !ok && err.contains("--function") && err.contains("softmax"),
        "{err}"
    );
    let (ok, _, err) = zoo(&["classify", model, "fine", "--labels", "a,b"]);
    assert!(!ok && err.contains("--labels"), "{err}");
}
