//! `zoo rerank` end to end on the tiny BERT reranker of
//! `transformers/tests/data/cross_encoder` with all-MiniLM-L6-v2's tokenizer (fetched by the
//! test command), against sentence-transformers' `CrossEncoder.rank` on the same files.

use serde_json::Value;

mod common;
use common::zoo;

#[path = "../../hub/tests/common/assets.rs"]
mod assets;

#[path = "../../transformers/tests/common/reranker.rs"]
mod reranker;
use reranker::expected;

/// The reranker with all-MiniLM-L6-v2's tokenizer files beside it.
fn reranker() -> tempfile::TempDir {
    reranker::reranker_folder(&assets::asset("ZOO_MINILM_DIR"))
}

#[test]
fn rerank_orders_documents_as_sentence_transformers_does() {
    let dir = reranker();
    let p = dir.path().to_str().unwrap();
    let want = expected();
    let query = want["query"].as_str().unwrap();
    let docs: Vec<&str> = want["documents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_str().unwrap())
        .collect();
    let mut args = vec!["rerank", p, query];
    args.extend(&docs);
    args.push("--json");
    let (ok, out, err) = zoo(&args);
    assert!(ok, "{err}");
    let got: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(got["activation"], "sigmoid");
    let results = got["results"].as_array().unwrap();
    for (g, w) in results.iter().zip(want["rank"].as_array().unwrap()) {
        assert_eq!(g["index"], w["corpus_id"]);
        let (gs, ws) = (g["score"].as_f64().unwrap(), w["score"].as_f64().unwrap());
        assert!((gs - ws).abs() < 1e-5, "{gs} vs {ws}");
        assert_eq!(
            g["document"],
            docs[w["corpus_id"].as_u64().unwrap() as usize]
        );
    }

    // The table: the best document first, with the activation and the length.
    let mut args = vec!["rerank", p, query];
    args.extend(&docs);
    args.extend(["--top-k", "2"]);
    let (ok, out, err) = zoo(&args);
    assert!(ok, "{err}");
    let best = want["rank"][0]["corpus_id"].as_u64().unwrap() as usize;
    assert!(
        out.contains("sigmoid activation, pairs cut at 64 tokens"),
        "{out}"
    );
    assert!(out.contains("  1. ") && out.contains(docs[best]), "{out}");
    assert_eq!(out.lines().filter(|l| l.contains("[")).count(), 2, "{out}");
}

#[test]
fn rerank_refuses_bad_arguments_and_models_by_name() {
    let dir = reranker();
    let p = dir.path().to_str().unwrap();
    let fails = |args: &[&str], needles: &[&str]| {
        let (ok, _, err) = zoo(args);
        assert!(!ok, "{args:?} succeeded");
        for n in needles {
            assert!(err.contains(n), "{args:?}: {err}");
        }
    };
    fails(
        &["rerank", p, "q", "d", "--activation", "relu"],
        &["--activation", "sigmoid"],
    );
    fails(&["rerank", p, "q", "d", "--top-k", "0"], &["--top-k"]);
    fails(&["rerank", p, "q"], &["DOCUMENTS"]);
    // An embedder has no classifier to score pairs with.
    let minilm = assets::asset("ZOO_MINILM_DIR");
    fails(
        &["rerank", minilm.to_str().unwrap(), "q", "d"],
        &["AutoModelForSequenceClassification"],
    );
}
