//! `zoo serve` as a user runs it: it binds, answers, and on SIGTERM stops accepting, finishes
//! what runs and exits 0; a port already taken is a clear error.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, ChildStderr, Command, Stdio};
use std::time::{Duration, Instant};

#[path = "../../hub/tests/common/assets.rs"]
mod assets;
mod common;
#[path = "../../transformers/tests/common/reranker.rs"]
mod reranker;

fn get(addr: &str, path: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

/// `zoo serve ARGS --port 0` started: the process, its stderr past the line that says where
/// it listens, what it printed up to there, and the address.
fn start(args: &[&str]) -> (Child, BufReader<ChildStderr>, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_zoo"))
        .arg("serve")
        .args(args)
        .args(["--port", "0"])
        .env("HF_HUB_OFFLINE", "1")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let Some(stderr) = child.stderr.take() else {
        let _ = child.kill();
        let _ = child.wait();
        panic!("zoo serve's stderr is not piped");
    };
    let mut err = BufReader::new(stderr);
    let mut seen = String::new();
    loop {
        let mut line = String::new();
        if err.read_line(&mut line).unwrap_or(0) == 0 {
            let _ = child.wait();
            panic!("zoo serve exited early:\n{seen}");
        }
        seen.push_str(&line);
        if let Some(rest) = line.split("at http://").nth(1) {
            let end = |c: char| c == '/' || c.is_whitespace();
            let addr = rest.split(end).next().unwrap_or(rest).to_string();
            return (child, err, seen, addr);
        }
    }
}

#[test]
fn serve_answers_then_drains_on_sigterm_and_refuses_a_taken_port() {
    let gguf = assets::asset("ZOO_SMOLLM2_GGUF");
    let (mut child, mut err, _, addr) = start(&[
        gguf.to_str().unwrap(),
        "--served-model-name",
        "smollm2",
        "--max-batch",
        "2",
    ]);
    assert!(get(&addr, "/health").starts_with("HTTP/1.1 200"));
    assert!(get(&addr, "/v1/models").contains("\"smollm2\""));

    // The same port again: a clear error naming the address and the flags, exit code 1.
    let port = addr.rsplit(':').next().unwrap();
    let (ok, _, stderr) = common::zoo(&["serve", gguf.to_str().unwrap(), "--port", port]);
    assert!(!ok);
    assert!(
        stderr.contains(&format!("listening on 127.0.0.1:{port}")) && stderr.contains("--port"),
        "{stderr}"
    );

    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let t0 = Instant::now();
    let code = loop {
        if let Some(code) = child.try_wait().unwrap() {
            break code;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "zoo serve did not stop on SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(code.success(), "{code:?}");
    let mut rest = String::new();
    err.read_to_string(&mut rest).unwrap();
    assert!(rest.contains("stopped"), "{rest}");
}

#[test]
fn serve_help_teaches_the_routes_and_the_errors() {
    let (ok, out, _) = common::zoo(&["serve", "--help"]);
    assert!(ok);
    for needle in [
        "/v1/chat/completions",
        "/metrics",
        "429",
        "--max-batch",
        "--max-step-tokens",
        "--api-key",
        "SIGTERM",
    ] {
        assert!(out.contains(needle), "{needle} missing from:\n{out}");
    }
}

#[test]
fn an_encoder_decoder_is_refused_at_start_with_the_reason() {
    let t5 = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../nightly/fixtures/t5-generate-f32");
    let (ok, _, stderr) = common::zoo(&["serve", t5.to_str().unwrap(), "--port", "0"]);
    assert!(!ok);
    assert!(
        stderr.contains("encoder-decoder") && stderr.contains("zoo generate"),
        "{stderr}"
    );
}

#[test]
fn the_kv_pool_holds_what_a_cpu_limit_leaves() {
    // The fixture's weights take about 138 KiB; a block of 16 tokens of its cache 4 KiB: a
    // 200 KiB limit leaves room for 15 blocks, which 15 sequences of up to 64 tokens share
    // (each running one holds at least one block).
    let model = common::fixture_dir("llama-gqa-f32");
    let (mut child, _, seen, _) =
        start(&[model.path().to_str().unwrap(), "--max-memory", "cpu=200KiB"]);
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        seen.contains("--max-batch 15")
            && seen.contains("15 sequences at once")
            && seen.contains("sharing 15 KV blocks"),
        "{seen}"
    );
}

#[test]
fn a_sequence_classifier_serves_as_a_reranker() {
    let dir = reranker::reranker_folder(&assets::asset("ZOO_MINILM_DIR"));
    let (mut child, _, _, addr) =
        start(&[dir.path().to_str().unwrap(), "--served-model-name", "rr"]);
    let models = get(&addr, "/v1/models");
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        models.contains("\"rr\"") && models.contains("\"max_model_len\":64"),
        "{models}"
    );
}

#[test]
fn a_classifier_of_several_labels_serves_classification() {
    let dir =
        reranker::classifier_folder("text_classifier", &assets::asset("ZOO_MINILM_DIR"), |_| {});
    let (mut child, _, seen, addr) = start(&[
        dir.path().to_str().unwrap(),
        "--served-model-name",
        "sentiment",
    ]);
    let models = get(&addr, "/v1/models");
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        seen.contains("classifies text (/predict, /classify)"),
        "{seen}"
    );
    assert!(models.contains("\"sentiment\""), "{models}");
}
