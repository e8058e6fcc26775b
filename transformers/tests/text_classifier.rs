//! Text classification as transformers' `text-classification` pipeline does it: a tiny random
//! three-label `BertForSequenceClassification` (`tests/data/text_classifier`, written by
//! `nightly/reference/text_classifier.py`) reading all-MiniLM-L6-v2's tokenizer, on candle CPU
//! and on one device of the XLA CPU PJRT plugin, against the pipeline on the same files: every
//! label's softmax score best first, the sigmoid a multi-label `problem_type` asks, the raw
//! logits, text pairs read as one input, and a text past the model's positions refused
//! unless truncated (to the model's length or fewer tokens).
//!
//! `ZOO_MINILM_DIR` and `ZOO_PJRT_CPU_PLUGIN` name the files; when unset,
//! `scripts/fetch-test-assets.sh` obtains them.

use serde_json::Value;
use zoo_runtime::device_map::DeviceMap;
use zoo_transformers::text_classification::{ClassificationFunction, TextClassifier, TextInput};
use zoo_transformers::vision::Scored;
use zoo_transformers::LoadOptions;

#[path = "../../hub/tests/common/assets.rs"]
mod assets;
use assets::asset;

#[path = "common/reranker.rs"]
mod reranker;

fn expected() -> Value {
    serde_json::from_str(include_str!("data/text_classifier/expected.json")).unwrap()
}

/// The classifier's folder with all-MiniLM-L6-v2's tokenizer files beside it; with
/// `multi_label`, its config says `problem_type: multi_label_classification`.
fn folder(multi_label: bool) -> tempfile::TempDir {
    reranker::classifier_folder("text_classifier", &asset("ZOO_MINILM_DIR"), |c| {
        if multi_label {
            c["problem_type"] = "multi_label_classification".into();
        }
    })
}

fn texts(expected: &Value) -> Vec<String> {
    expected["texts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap().to_string())
        .collect()
}

/// `got` equals the pipeline's rows (labels in its order, scores within 1e-5).
fn same(got: &[Vec<Scored>], want: &Value, what: &str) {
    let want = want.as_array().unwrap();
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let w = w.as_array().unwrap();
        assert_eq!(g.len(), w.len(), "{what} {i}");
        for (g, w) in g.iter().zip(w) {
            assert_eq!(g.label, w["label"].as_str().unwrap(), "{what} {i}");
            let ws = w["score"].as_f64().unwrap() as f32;
            assert!(
                (g.score - ws).abs() <= 1e-5,
                "{what} {i} {}: {} vs {ws}",
                g.label,
                g.score
            );
        }
    }
}

fn matches_the_pipeline(map: DeviceMap) {
    let expected = expected();
    let owned = texts(&expected);
    let texts: Vec<&str> = owned.iter().map(String::as_str).collect();
    let opts = || LoadOptions {
        device_map: map.clone(),
        ..Default::default()
    };
    let dir = folder(false);
    let tc = TextClassifier::load_pretrained(dir.path().to_str().unwrap(), opts()).unwrap();
    assert_eq!(tc.function(), ClassificationFunction::Softmax);
    assert_eq!(tc.labels(), ["negative", "neutral", "positive"]);
    same(
        &tc.classify(&texts, false).unwrap(),
        &expected["softmax"],
        "softmax",
    );
    // Pairs: one input each, `[CLS] a [SEP] b [SEP]` with the second segment's token types.
    let pairs: Vec<(String, String)> = expected["pairs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p[0].as_str().unwrap().into(), p[1].as_str().unwrap().into()))
        .collect();
    let inputs: Vec<TextInput> = pairs.iter().map(|(a, b)| TextInput::Pair(a, b)).collect();
    let (got, tokens) = tc
        .classify_with(&inputs, None, ClassificationFunction::Softmax)
        .unwrap();
    same(&got, &expected["pairs_softmax"], "pairs");
    assert!(tokens > 20, "{tokens} tokens read");
    // The raw logits, by label index.
    let raw = tc
        .with_function(ClassificationFunction::None)
        .classify(&texts, false)
        .unwrap();
    for (i, (row, want)) in raw
        .iter()
        .zip(expected["logits"].as_array().unwrap())
        .enumerate()
    {
        for (j, label) in ["negative", "neutral", "positive"].iter().enumerate() {
            let got = row.iter().find(|s| s.label == *label).unwrap().score;
            let w = want[j].as_f64().unwrap() as f32;
            assert!((got - w).abs() <= 1e-5, "logit {i} {label}: {got} vs {w}");
        }
    }
    let dir = folder(true);
    let tc = TextClassifier::load_pretrained(dir.path().to_str().unwrap(), opts()).unwrap();
    assert_eq!(tc.function(), ClassificationFunction::Sigmoid);
    same(
        &tc.classify(&texts, false).unwrap(),
        &expected["multi_label_sigmoid"],
        "multi-label sigmoid",
    );
}

#[test]
fn text_classifier_scores_equal_the_pipeline_on_cpu() {
    matches_the_pipeline(DeviceMap::Cpu);
}

#[test]
fn text_classifier_scores_equal_the_pipeline_on_the_pjrt_cpu_plugin() {
    let plugin = asset("ZOO_PJRT_CPU_PLUGIN");
    zoo_runtime::lazy::configure(zoo_runtime::PjrtPlatform::Cpu, Some(plugin), Some(4)).unwrap();
    matches_the_pipeline(DeviceMap::Pjrt {
        platform: "cpu".into(),
        devices: Some(vec![0]),
    });
}

#[test]
fn long_texts_are_refused_unless_truncated_and_no_text_is_an_error() {
    let dir = folder(false);
    let tc = TextClassifier::load_pretrained(dir.path().to_str().unwrap(), LoadOptions::default())
        .unwrap();
    assert_eq!(tc.max_length(), 64);
    let long = "word ".repeat(100);
    let err = tc.classify(&[&long], false).unwrap_err().to_string();
    assert!(
        err.contains("the model takes 64") && err.contains("truncate"),
        "{err}"
    );
    let cut = tc.classify(&[&long], true).unwrap();
    assert_eq!(cut[0].len(), 3);
    // Fewer tokens than the model takes, for a text and a pair; never more.
    let f = tc.function();
    let (_, n) = tc
        .classify_with(&[TextInput::Text(&long)], Some(10), f)
        .unwrap();
    assert_eq!(n, 10);
    let (_, n) = tc
        .classify_with(&[TextInput::Pair(&long, &long)], Some(12), f)
        .unwrap();
    assert_eq!(n, 12);
    let (_, n) = tc
        .classify_with(&[TextInput::Text(&long)], Some(500), f)
        .unwrap();
    assert_eq!(n, 64);
    let err = tc.classify(&[], false).unwrap_err().to_string();
    assert!(err.contains("no text"), "{err}");
}
