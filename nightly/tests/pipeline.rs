//! Committed cases → comparisons → results JSON → history → dashboard, without a model.
//!
//! The "port" here is the reference itself, once exact and once with its logits pushed
//! past the tolerance, so the chain must report one pass and one failure per case; the
//! harness that runs real backends reuses every step.

use std::path::Path;

use zoo_nightly::case::{discover, Case};
use zoo_nightly::dashboard::write_dashboard;
use zoo_nightly::results::{
    load_history, record_run, BackendInfo, CaseResult, Environment, RunResults, Status,
};
use zoo_nightly::HostTensor;

const EXACT: &str = "reference-copy";
const SHIFTED: &str = "reference-shifted";

fn compare_all(case: &Case, shift: f32) -> Vec<zoo_nightly::OutputReport> {
    case.spec
        .outputs
        .iter()
        .map(|entry| {
            let expected = &case.expected[&entry.name];
            let actual = match expected.as_f32() {
                Some(v) if entry.name.ends_with("logits") => HostTensor::f32(
                    expected.shape.clone(),
                    v.iter().map(|x| x + shift).collect(),
                ),
                _ => expected.clone(),
            };
            case.compare_output(&entry.name, &actual).unwrap()
        })
        .collect()
}

#[test]
fn results_and_dashboard_cover_every_committed_case() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures");
    let cases: Vec<Case> = discover(&fixtures)
        .unwrap()
        .iter()
        .map(|d| Case::load(d).unwrap())
        .collect();
    let mut results = Vec::new();
    for case in &cases {
        results.push(CaseResult::compared(
            case,
            EXACT,
            compare_all(case, 0.0),
            0.01,
        ));
        // 0.5 is beyond atol + rtol*|e| for both f32 and bf16 tolerances at these scales.
        results.push(CaseResult::compared(
            case,
            SHIFTED,
            compare_all(case, 0.5),
            0.02,
        ));
        results.push(CaseResult::without_outputs(
            case.name(),
            &case.spec.architecture,
            "pjrt-tpu",
            case.spec.dtype.as_str(),
            Status::NotAvailable,
            "no TPU on this machine",
            0.0,
        ));
    }
    let mut env = Environment::default();
    env.backends.insert(
        "pjrt-tpu".into(),
        BackendInfo {
            available: false,
            version: None,
            detail: Some("no TPU on this machine".into()),
        },
    );
    let tmp = tempfile::tempdir().unwrap();
    let history = tmp.path().join("history");
    let run = record_run(
        RunResults::new("2026-11-30T00-00-00Z", "2026-11-30T00:00:00Z", env, results),
        &tmp.path().join("out"),
        &history,
    )
    .unwrap();

    let n = cases.len();
    // Cases with logits (causal LMs, encoder heads, a span's start logits) fail on shifted
    // logits; base encoders have none, so they pass.
    let lms = cases
        .iter()
        .filter(|c| c.expected.contains_key("logits") || c.expected.contains_key("start_logits"))
        .count();
    assert!(lms > 0 && lms < n);
    assert_eq!(run.summary.success, 2 * n - lms);
    assert_eq!(run.summary.not_available, n);
    assert_eq!(run.summary.failed, lms);
    assert_eq!(run.changes.new_failures.len(), lms);
    let generates = |name: &str| {
        cases
            .iter()
            .any(|c| c.name() == name && c.expected.contains_key("generated_ids"))
    };
    for r in run
        .results
        .iter()
        .filter(|r| r.backend == SHIFTED && r.status == Status::Failed)
    {
        if generates(&r.case) {
            assert_eq!(r.worst.greedy_match, Some(true), "tokens were not shifted");
        }
        assert!(r.worst.max_abs_diff.unwrap() >= 0.49);
    }
    assert_eq!(load_history(&history).unwrap(), vec![run.clone()]);

    // ZOO_NIGHTLY_KEEP_SITE=DIR keeps the page for a look in a browser.
    let site = std::env::var_os("ZOO_NIGHTLY_KEEP_SITE")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| tmp.path().join("site"));
    let index = write_dashboard(&history, &site).unwrap();
    let html = std::fs::read_to_string(index).unwrap();
    for case in &cases {
        assert!(
            html.contains(&format!("<tr data-case=\"{}\">", case.name())),
            "{} missing",
            case.name()
        );
    }
    assert_eq!(html.matches("<td class=\"cell ").count(), 3 * n);
}

/// Renders a dashboard in headless Chromium (Debian's `chromium` package) and checks the
/// browser's DOM shows every committed case and a screenshot is produced. The test command
/// (`scripts/run-tests.sh`) installs chromium where it is missing; a machine without it fails
/// here rather than skipping.
#[test]
fn dashboard_renders_in_headless_chromium() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures");
    let cases: Vec<Case> = discover(&fixtures)
        .unwrap()
        .iter()
        .map(|d| Case::load(d).unwrap())
        .collect();
    let results = cases
        .iter()
        .map(|c| CaseResult::compared(c, EXACT, compare_all(c, 0.0), 0.01))
        .collect();
    let tmp = tempfile::tempdir().unwrap();
    let history = tmp.path().join("history");
    record_run(
        RunResults::new("r1", "t", Environment::default(), results),
        &tmp.path().join("out"),
        &history,
    )
    .unwrap();
    let index = write_dashboard(&history, &tmp.path().join("site")).unwrap();
    let url = format!("file://{}", index.display());
    let profile = tmp.path().join("chromium-profile");
    let user_data = format!("--user-data-dir={}", profile.display());
    let chromium = |args: &[&str]| {
        // No network: the page is self-contained, and background services would only time out.
        std::process::Command::new("chromium")
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--disable-quic",
                "--window-size=1400,3000",
                user_data.as_str(),
            ])
            .args(args)
            .arg(&url)
            .output()
            .expect("chromium runs (scripts/run-tests.sh installs it; or apt-get install chromium)")
    };
    let dom = String::from_utf8(chromium(&["--dump-dom"]).stdout).unwrap();
    for case in &cases {
        assert!(
            dom.contains(&format!("data-case=\"{}\"", case.name())),
            "{} not rendered",
            case.name()
        );
    }
    let shot = tmp.path().join("shot.png");
    chromium(&[&format!("--screenshot={}", shot.display())]);
    let png = std::fs::read(&shot).unwrap();
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 10_000,
        "screenshot is a real picture"
    );
}
