//! A decoder embedder (Qwen3-Embedding's layout: the decoder at the root, a tokenizer that
//! pads on the left, `lasttoken` pooling, Normalize) through `SentenceEmbedder`, on candle
//! CPU and on one device of the XLA CPU PJRT plugin, against what sentence-transformers
//! computes for the same sentences (`nightly/reference/decoder_embedder.py` wrote the tiny
//! random model and `expected.json`).

use std::path::Path;

use serde_json::Value;
use zoo_runtime::device_map::DeviceMap;
use zoo_transformers::sentence::{Pooling, SentenceEmbedder};
use zoo_transformers::LoadOptions;

#[path = "common/embeddings.rs"]
mod embeddings;
use embeddings::assert_embedding_matches;

fn matches_sentence_transformers(map: DeviceMap) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/qwen3_embedder");
    let expected: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).unwrap()).unwrap();
    let opts = LoadOptions {
        device_map: map,
        ..Default::default()
    };
    let embedder = SentenceEmbedder::load_pretrained(dir.to_str().unwrap(), opts).unwrap();
    assert_eq!(embedder.pooling(), Pooling::LastToken);
    assert!(embedder.normalizes());
    let sentences: Vec<&str> = expected["sentences"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap())
        .collect();
    // The tokens are sentence-transformers' (truncated to max_seq_length as it truncates).
    for (s, want) in sentences
        .iter()
        .zip(expected["input_ids"].as_array().unwrap())
    {
        let want: Vec<u32> = want
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        let got = embedder.encode(s).unwrap();
        assert_eq!(got, want[..want.len().min(64)], "{s}");
    }
    // One batch of different lengths: sentence-transformers pads it on the left, zoo on the
    // right with the padding hidden; the last real token's state is the same (rotary
    // positions are relative).
    let check = |got: Vec<Vec<f32>>, key: &str| {
        for (i, (g, want)) in got
            .iter()
            .zip(expected[key].as_array().unwrap())
            .enumerate()
        {
            let want: Vec<f32> = want
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap() as f32)
                .collect();
            assert_embedding_matches(g, &want, &format!("{key} {i}"));
        }
    };
    check(embedder.embed(&sentences).unwrap(), "embeddings");
    // The query prompt of config_sentence_transformers.json (`encode(prompt_name="query")`);
    // the document prompt is empty.
    assert_eq!(embedder.default_prompt_name(), None);
    assert_eq!(embedder.prompt("document").unwrap(), "");
    let query = embedder.prompt("query").unwrap();
    assert_eq!(query, expected["prompts"]["query"].as_str().unwrap());
    check(
        embedder.embed_with_prompt(&sentences, Some(query)).unwrap(),
        "query_embeddings",
    );
    let e = embedder.prompt("passage").unwrap_err().to_string();
    assert!(e.contains("document, query"), "{e}");
}

#[test]
fn a_decoder_embedder_matches_sentence_transformers_on_cpu() {
    matches_sentence_transformers(DeviceMap::Cpu);
}

#[test]
fn a_decoder_embedder_matches_sentence_transformers_on_the_xla_cpu_plugin() {
    std::env::var_os("ZOO_PJRT_CPU_PLUGIN")
        .expect("ZOO_PJRT_CPU_PLUGIN is unset: run the tests through scripts/run-tests.sh");
    matches_sentence_transformers(DeviceMap::Pjrt {
        platform: "cpu".into(),
        devices: Some(vec![0]),
    });
}

/// Decoder embedders ship naming their causal LM (`Qwen3ForCausalLM`): as a
/// sentence-transformers folder such a checkpoint embeds; a plain causal LM is pointed to
/// generation instead.
#[test]
fn a_causal_lm_embeds_only_as_a_sentence_transformers_folder() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/qwen3_embedder");
    let dir = tempfile::tempdir().unwrap();
    for e in walk(&src) {
        let to = dir.path().join(e.strip_prefix(&src).unwrap());
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(&e, &to).unwrap();
    }
    let config = dir.path().join("config.json");
    let mut c: Value = serde_json::from_str(&std::fs::read_to_string(&config).unwrap()).unwrap();
    c["architectures"] = serde_json::json!(["Qwen3ForCausalLM"]);
    std::fs::write(&config, c.to_string()).unwrap();
    let p = dir.path().to_str().unwrap();
    let embedder = SentenceEmbedder::load_pretrained(p, LoadOptions::default()).unwrap();
    let want = SentenceEmbedder::load_pretrained(src.to_str().unwrap(), LoadOptions::default())
        .unwrap()
        .embed(&["hello"])
        .unwrap();
    assert_eq!(embedder.embed(&["hello"]).unwrap(), want);
    std::fs::remove_file(dir.path().join("modules.json")).unwrap();
    let Err(err) = SentenceEmbedder::load_pretrained(p, LoadOptions::default()) else {
        panic!("a plain causal LM embedded");
    };
    assert!(err.to_string().contains("zoo generate"), "{err}");
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}
