//! A reranker through `CrossEncoder`: a tiny random `BertForSequenceClassification` with one
//! label (`tests/data/cross_encoder`, written by `nightly/reference/cross_encoder.py`) reading
//! all-MiniLM-L6-v2's tokenizer, on candle CPU and on one device of the XLA CPU PJRT plugin,
//! against sentence-transformers' `CrossEncoder` on the same files: the pair encoding (one
//! document cut longest-first at 64 tokens), the sigmoid scores, the raw logits and the
//! ranking.
//!
//! `ZOO_MINILM_DIR` and `ZOO_PJRT_CPU_PLUGIN` name the files; when unset,
//! `scripts/fetch-test-assets.sh` obtains them.

use serde_json::Value;
use zoo_runtime::device_map::DeviceMap;
use zoo_transformers::sentence::{CrossEncoder, ScoreActivation};
use zoo_transformers::LoadOptions;

#[path = "../../hub/tests/common/assets.rs"]
mod assets;
use assets::asset;

#[path = "common/reranker.rs"]
mod reranker;

fn reranker_folder() -> tempfile::TempDir {
    reranker::reranker_folder(&asset("ZOO_MINILM_DIR"))
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

fn matches_sentence_transformers(map: DeviceMap) {
    let expected = reranker::expected();
    let dir = reranker_folder();
    let opts = LoadOptions {
        device_map: map,
        ..Default::default()
    };
    let ce = CrossEncoder::load_pretrained(dir.path().to_str().unwrap(), opts).unwrap();
    assert_eq!(ce.activation(), ScoreActivation::Sigmoid);
    assert_eq!(
        ce.max_length() as u64,
        expected["max_seq_length"].as_u64().unwrap()
    );
    assert_eq!(ce.labels().len(), 1);
    let query = expected["query"].as_str().unwrap();
    let documents: Vec<&str> = expected["documents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_str().unwrap())
        .collect();
    let pairs: Vec<(&str, &str)> = documents.iter().map(|d| (query, *d)).collect();
    let close = |got: &[Vec<f32>], want: &[f32], what: &str| {
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            assert!((g[0] - w).abs() <= 1e-5, "{what} {i}: {} vs {w}", g[0]);
        }
    };
    close(
        &ce.predict(&pairs).unwrap(),
        &floats(&expected["scores"]),
        "score",
    );
    let raw = ce.with_activation(ScoreActivation::Identity);
    close(
        &raw.predict(&pairs).unwrap(),
        &floats(&expected["logits"]),
        "logit",
    );
    let ce = raw.with_activation(ScoreActivation::Sigmoid);
    let ranked = ce.rank(query, &documents).unwrap();
    let order: Vec<u64> = expected["rank"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["corpus_id"].as_u64().unwrap())
        .collect();
    let got: Vec<u64> = ranked.iter().map(|r| r.index as u64).collect();
    assert_eq!(got, order);
}

#[test]
fn reranker_scores_equal_sentence_transformers_on_cpu() {
    matches_sentence_transformers(DeviceMap::Cpu);
}

#[test]
fn reranker_scores_equal_sentence_transformers_on_the_pjrt_cpu_plugin() {
    let plugin = asset("ZOO_PJRT_CPU_PLUGIN");
    zoo_runtime::lazy::configure(zoo_runtime::PjrtPlatform::Cpu, Some(plugin), Some(4)).unwrap();
    matches_sentence_transformers(DeviceMap::Pjrt {
        platform: "cpu".into(),
        devices: Some(vec![0]),
    });
}

#[test]
fn an_empty_batch_and_a_head_of_another_width_are_refused() {
    let dir = reranker_folder();
    let ce = CrossEncoder::load_pretrained(dir.path().to_str().unwrap(), LoadOptions::default())
        .unwrap();
    let e = ce.predict(&[]).unwrap_err().to_string();
    assert!(e.contains("no pairs"), "{e}");
    // A classifier of several labels predicts but does not rank.
    let mut config: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("config.json")).unwrap())
            .unwrap();
    config["id2label"] = serde_json::json!({"0": "a", "1": "b"});
    std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
    let e = CrossEncoder::load_pretrained(dir.path().to_str().unwrap(), LoadOptions::default())
        .unwrap_err()
        .to_string();
    // The saved head has one row: two labels do not fit it.
    assert!(e.contains("classifier"), "{e}");
}
