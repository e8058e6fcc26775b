//! `zoo parity run` and `zoo parity dashboard` end to end on copies of committed fixtures.

use std::path::{Path, PathBuf};

use serde_json::Value;

#[path = "../../hub/tests/common/assets.rs"]
mod assets;
mod common;

const LLAMA: &str = "llama-gqa-f32";
const BERT: &str = "bert-base-f32";
/// A copy of the BERT case relabelled as a class zoo has no model for.
const UNPORTED: &str = "funnel-unported";

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../nightly/fixtures")
        .join(name)
}

/// Copies the committed case `name` to `cases/<as_name>`, named `as_name` in case.json.
fn copy_case(name: &str, cases: &Path, as_name: &str) -> PathBuf {
    let to = cases.join(as_name);
    std::fs::create_dir_all(&to).unwrap();
    for entry in std::fs::read_dir(fixture(name)).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
    }
    if as_name != name {
        let json = to.join("case.json");
        let mut doc: Value =
            serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        doc["name"] = as_name.into();
        std::fs::write(&json, doc.to_string()).unwrap();
    }
    to
}

/// Runs `zoo` with the XLA CPU plugin the test command provides (pjrt-cpu runs for real).
fn zoo(args: &[&str]) -> (bool, String, String) {
    let plugin = assets::asset("ZOO_PJRT_CPU_PLUGIN");
    common::zoo_with(args, &[("ZOO_PJRT_CPU_PLUGIN", plugin.as_os_str())])
}

fn results(out: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).unwrap()).unwrap()
}

fn result<'a>(run: &'a Value, case: &str, backend: &str) -> &'a Value {
    run["results"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["case"] == case && r["backend"] == backend)
        .unwrap_or_else(|| panic!("no result for {case} on {backend}"))
}

fn p(path: &Path) -> &str {
    path.to_str().unwrap()
}

#[test]
fn run_records_pass_not_available_and_unsupported_then_draws_the_dashboard() {
    // candle-cpu and pjrt-cpu pass, pjrt-tpu is not available here, the Funnel Transformer has no model.
    let tmp = tempfile::tempdir().unwrap();
    let cases = tmp.path().join("cases");
    copy_case(LLAMA, &cases, LLAMA);
    let unported = copy_case(BERT, &cases, UNPORTED).join("case.json");
    let mut doc: Value =
        serde_json::from_str(&std::fs::read_to_string(&unported).unwrap()).unwrap();
    doc["architecture"] = "FunnelModel".into();
    std::fs::write(&unported, doc.to_string()).unwrap();
    let out = tmp.path().join("out");
    let (ok, stdout, stderr) = zoo(&[
        "parity",
        "run",
        "--cases",
        p(&cases),
        "--backends",
        "candle-cpu,pjrt-cpu,pjrt-tpu",
        "--out",
        p(&out),
    ]);
    assert!(!ok, "the unported case must make the run fail\n{stdout}");
    assert!(
        stderr.contains("3 of 6 results failed or errored"),
        "{stderr}"
    );
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with(LLAMA) && l.contains("candle-cpu") && l.contains("passed")),
        "{stdout}"
    );

    let run = results(&out);
    let llama = result(&run, LLAMA, "candle-cpu");
    assert_eq!(llama["status"], "passed", "{llama}");
    assert_eq!(llama["dtype"], "f32");
    assert!(llama["worst"]["max_abs_diff"].as_f64().unwrap() < 1e-4);
    assert_eq!(llama["worst"]["greedy_match"], true);
    assert_eq!(llama["worst"]["top1_agreement"], 1.0);
    let names: Vec<&str> = llama["outputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["name"].as_str().unwrap())
        .collect();
    for expected in [
        "logits",
        "last_hidden_state",
        "model.layers.0.output",
        "generated_logits",
        "generated_ids",
    ] {
        assert!(
            names.contains(&expected),
            "{expected} not compared: {names:?}"
        );
    }

    let pjrt = result(&run, LLAMA, "pjrt-cpu");
    assert_eq!(pjrt["status"], "passed", "{pjrt}");
    assert!(pjrt["worst"]["max_abs_diff"].as_f64().unwrap() < 1e-4);
    assert_eq!(pjrt["worst"]["greedy_match"], true);
    // This host has no TPU: the search report says so, and it is not a failure.
    let tpu = result(&run, LLAMA, "pjrt-tpu");
    assert_eq!(tpu["status"], "not-available", "{tpu}");
    let why = tpu["message"].as_str().unwrap();
    assert!(why.contains("tpu") || why.contains("TPU"), "{why}");
    for backend in ["candle-cpu", "pjrt-cpu", "pjrt-tpu"] {
        let bert = result(&run, UNPORTED, backend);
        assert_eq!(bert["status"], "error", "{bert}");
        let why = bert["message"].as_str().unwrap();
        assert!(
            why.contains("unsupported") && why.contains("BertModel"),
            "{why}"
        );
    }
    let summary = &run["summary"];
    assert_eq!(summary["success"], 2);
    assert_eq!(summary["errors"], 3);
    assert_eq!(summary["not_available"], 1);
    let backends = &run["environment"]["backends"];
    assert_eq!(backends["candle-cpu"]["available"], true);
    assert_eq!(backends["pjrt-cpu"]["available"], true);
    assert_eq!(backends["pjrt-tpu"]["available"], false);
    let history: Vec<_> = std::fs::read_dir(out.join("history")).unwrap().collect();
    assert_eq!(history.len(), 1);

    let site = tmp.path().join("site");
    let (ok, stdout, stderr) = zoo(&[
        "parity",
        "dashboard",
        "--results",
        p(&out.join("history")),
        "--out",
        p(&site),
    ]);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("index.html"), "{stdout}");
    let html = std::fs::read_to_string(site.join("index.html")).unwrap();
    assert!(html.contains(LLAMA) && html.contains(UNPORTED));
}

#[test]
fn a_corrupted_case_is_an_error_and_the_run_goes_on() {
    let tmp = tempfile::tempdir().unwrap();
    let cases = tmp.path().join("cases");
    copy_case(LLAMA, &cases, LLAMA);
    let broken = copy_case(LLAMA, &cases, "a-truncated");
    let expected = broken.join("expected.safetensors");
    let bytes = std::fs::read(&expected).unwrap();
    std::fs::write(&expected, &bytes[..bytes.len() / 2]).unwrap();
    let out = tmp.path().join("out");
    let (ok, stdout, _) = zoo(&[
        "parity",
        "run",
        "--cases",
        p(&cases),
        "--backends",
        "candle-cpu",
        "--out",
        p(&out),
    ]);
    assert!(!ok, "{stdout}");
    let run = results(&out);
    assert_eq!(run["results"].as_array().unwrap().len(), 2);
    // case.json still names the case; the tensors are what is broken.
    let bad = result(&run, "a-truncated", "candle-cpu");
    assert_eq!(bad["status"], "error", "{bad}");
    assert_eq!(bad["architecture"], "LlamaForCausalLM");
    assert!(
        bad["message"]
            .as_str()
            .unwrap()
            .contains("expected.safetensors"),
        "{bad}"
    );
    assert_eq!(result(&run, LLAMA, "candle-cpu")["status"], "passed");
    assert_eq!(run["changes"]["new_failures"][0]["case"], "a-truncated");
}

#[test]
fn failures_exit_non_zero_and_the_next_run_lists_the_fix() {
    let tmp = tempfile::tempdir().unwrap();
    let cases = tmp.path().join("cases");
    let case = copy_case(LLAMA, &cases, LLAMA);
    let json_path = case.join("case.json");
    let original = std::fs::read_to_string(&json_path).unwrap();
    let mut doc: Value = serde_json::from_str(&original).unwrap();
    doc["tolerance"] = serde_json::json!({"atol": 0.0, "rtol": 0.0});
    std::fs::write(&json_path, doc.to_string()).unwrap();
    let out = tmp.path().join("out");
    let args = [
        "parity",
        "run",
        "--cases",
        p(&cases),
        "--backends",
        "candle-cpu",
        "--out",
        p(&out),
    ];

    let (ok, stdout, _) = zoo(&args);
    assert!(!ok, "{stdout}");
    let run = results(&out);
    let r = result(&run, LLAMA, "candle-cpu");
    assert_eq!(
        r["status"], "failed",
        "zero tolerance cannot hold in f32: {r}"
    );
    assert_eq!(run["changes"]["new_failures"][0]["case"], LLAMA);

    std::fs::write(&json_path, original).unwrap();
    let (ok, stdout, stderr) = zoo(&args);
    assert!(ok, "{stdout}\n{stderr}");
    assert!(stdout.contains("0 new failures, 1 fixes"), "{stdout}");
    let run = results(&out);
    assert_eq!(run["changes"]["fixes"][0]["case"], LLAMA);
    assert_eq!(std::fs::read_dir(out.join("history")).unwrap().count(), 2);
}

#[test]
fn bad_arguments_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let cases = tmp.path().join("cases");
    copy_case(LLAMA, &cases, LLAMA);
    let out = tmp.path().join("out");
    let (ok, _, stderr) = zoo(&[
        "parity",
        "run",
        "--cases",
        p(&cases),
        "--backends",
        "pjrt-gpu",
        "--out",
        p(&out),
    ]);
    assert!(
        !ok && stderr.contains("unknown backend `pjrt-gpu`"),
        "{stderr}"
    );
    let (ok, _, stderr) = zoo(&["parity", "run", "--cases", p(tmp.path()), "--out", p(&out)]);
    assert!(!ok && stderr.contains("no case folder"), "{stderr}");
    assert!(!out.join("results.json").exists());
}

#[test]
fn dtypes_the_case_was_not_made_in_are_skipped() {
    let tmp = tempfile::tempdir().unwrap();
    let cases = tmp.path().join("cases");
    copy_case(LLAMA, &cases, LLAMA);
    let out = tmp.path().join("out");
    let (ok, stdout, stderr) = zoo(&[
        "parity",
        "run",
        "--cases",
        p(&cases),
        "--backends",
        "candle-cpu",
        "--dtypes",
        "f32,bf16",
        "--out",
        p(&out),
    ]);
    assert!(ok, "{stdout}\n{stderr}");
    let run = results(&out);
    let rows = run["results"].as_array().unwrap();
    let status = |dtype: &str| {
        rows.iter()
            .find(|r| r["dtype"] == dtype)
            .map(|r| r["status"].as_str().unwrap().to_string())
    };
    assert_eq!(status("f32").as_deref(), Some("passed"));
    assert_eq!(status("bf16").as_deref(), Some("skipped"));
    assert_eq!(run["summary"]["skipped"], 1);
}

/// Runs `scripts/nightly-parity.sh` (what the nightly workflow runs) with this build's zoo.
fn nightly_script(args: &[&str]) -> (Option<i32>, String) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/nightly-parity.sh");
    let out = std::process::Command::new("bash")
        .arg(script)
        .args(args)
        .env("ZOO_BIN", env!("CARGO_BIN_EXE_zoo"))
        .env("HF_HUB_OFFLINE", "1")
        .output()
        .expect("run the nightly script");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn the_nightly_script_exits_with_zoo_status_and_keeps_the_summary() {
    // Every committed case on candle-cpu: green, summary kept beside the results.
    let tmp = tempfile::tempdir().unwrap();
    let (out, history) = (tmp.path().join("out"), tmp.path().join("history"));
    let fixtures = fixture("");
    let (code, err) = nightly_script(&["candle-cpu", p(&fixtures), p(&out), p(&history)]);
    assert_eq!(code, Some(0), "{err}");
    let summary = std::fs::read_to_string(out.join("summary.txt")).unwrap();
    let cases = zoo_nightly::case::discover(&fixtures).unwrap().len();
    assert!(
        summary.contains(&format!("{cases} passed, 0 failed, 0 errors")),
        "{summary}"
    );
    assert!(out.join("results.json").is_file());
    assert_eq!(std::fs::read_dir(&history).unwrap().count(), 1);

    // A case zoo cannot run: the script fails, and the summary and results still exist.
    let cases_dir = tmp.path().join("cases");
    let unported = copy_case(BERT, &cases_dir, UNPORTED).join("case.json");
    let mut doc: Value =
        serde_json::from_str(&std::fs::read_to_string(&unported).unwrap()).unwrap();
    doc["architecture"] = "FunnelModel".into();
    std::fs::write(&unported, doc.to_string()).unwrap();
    let out2 = tmp.path().join("out2");
    let (code, err) = nightly_script(&["candle-cpu", p(&cases_dir), p(&out2), p(&history)]);
    assert_ne!(code, Some(0), "{err}");
    assert!(err.contains("exited with 1"), "{err}");
    let summary = std::fs::read_to_string(out2.join("summary.txt")).unwrap();
    assert!(summary.contains("1 errors"), "{summary}");
}
