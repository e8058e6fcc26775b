//! The static parity dashboard: one self-contained `index.html` (inline CSS and SVG, no
//! script, no network) drawn from the results history.
//!
//! Layout, top to bottom: the latest run's summary, its new failures and fixes, the grid
//! of cases × backends (each cell: status and worst max abs diff; rows with new failures
//! first), per-case history plots of error and time across runs, and the environment.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::results::{load_history, CaseResult, ResultKey, ResultsError, RunResults, Status};

/// How many runs the history plots show at most.
pub const PLOTTED_RUNS: usize = 30;

/// Why the dashboard could not be written.
#[derive(Debug, thiserror::Error)]
pub enum DashboardError {
    /// The history could not be read.
    #[error(transparent)]
    Results(#[from] ResultsError),
    /// The history folder holds no run.
    #[error("no results in {0}: run `zoo parity run --out DIR` first, then point --results at DIR/history")]
    NoRuns(PathBuf),
    /// index.html could not be written (atomically: a failed write leaves none).
    #[error(transparent)]
    Output(#[from] zoo_hub::OutputError),
    /// The output folder could not be made.
    #[error("cannot write {path}: {source}")]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
}

/// Reads every run in `history_dir` and writes `out_dir/index.html`; returns its path.
pub fn write_dashboard(history_dir: &Path, out_dir: &Path) -> Result<PathBuf, DashboardError> {
    let runs = load_history(history_dir)?;
    if runs.is_empty() {
        return Err(DashboardError::NoRuns(history_dir.to_path_buf()));
    }
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| DashboardError::Io { path, source }
    };
    std::fs::create_dir_all(out_dir).map_err(io(out_dir))?;
    let index = out_dir.join("index.html");
    zoo_hub::write_atomically(&index, render(&runs).as_bytes())?;
    Ok(index)
}

/// The dashboard page for `runs` (oldest first; the last one is the run shown).
/// An empty slice renders a page that says so.
pub fn render(runs: &[RunResults]) -> String {
    let mut html = String::with_capacity(64 * 1024);
    html.push_str(HEAD);
    let Some(latest) = runs.last() else {
        html.push_str("<h1>zoo parity</h1><p>No runs recorded yet.</p></body></html>\n");
        return html;
    };
    summary(&mut html, latest);
    changes(&mut html, latest);
    grid(&mut html, latest);
    history(&mut html, runs, latest);
    environment(&mut html, latest);
    html.push_str("</body>\n</html>\n");
    html
}

const HEAD: &str = r#"<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>zoo parity</title>
<style>
body { font-family: system-ui, sans-serif; margin: 1.5rem; color: #1b1b1b; }
h1 { margin-bottom: 0.2rem; } h2 { margin-top: 2rem; border-bottom: 1px solid #ddd; }
.meta { color: #555; }
.badges span { display: inline-block; margin: 0.3rem 0.5rem 0.3rem 0; padding: 0.3rem 0.7rem; border-radius: 4px; font-weight: 600; }
table { border-collapse: collapse; font-size: 0.9rem; }
th, td { border: 1px solid #ccc; padding: 0.25rem 0.5rem; text-align: left; }
th { background: #f3f3f3; }
.passed { background: #d9f2d9; } .failed { background: #f7c6c6; } .error { background: #f2a7a7; }
.skipped { background: #eee; color: #666; } .not-available { background: #fafafa; color: #999; }
.new { outline: 3px solid #c00; }
.num { font-family: ui-monospace, monospace; font-size: 0.8rem; }
.plots { display: flex; flex-wrap: wrap; gap: 1rem; }
.plot { border: 1px solid #ddd; padding: 0.4rem; }
.plot h3 { font-size: 0.85rem; margin: 0 0 0.2rem 0; }
.legend span { font-size: 0.75rem; margin-right: 0.6rem; }
</style>
</head>
<body>
"#;

fn summary(html: &mut String, run: &RunResults) {
    let s = &run.summary;
    let commit = run
        .environment
        .commit
        .as_deref()
        .unwrap_or("unknown commit");
    let _ = write!(
        html,
        "<h1>zoo parity</h1>\n<p class=\"meta\">run <b>{}</b> · started {} · {}</p>\n<div class=\"badges\">\
         <span class=\"passed\">{} passed</span><span class=\"failed\">{} failed</span>\
         <span class=\"error\">{} errors</span><span class=\"skipped\">{} skipped</span>\
         <span class=\"not-available\">{} not available</span><span>{:.1} s</span></div>\n",
        esc(&run.run_id),
        esc(&run.started_at),
        esc(commit),
        s.success,
        s.failed,
        s.errors,
        s.skipped,
        s.not_available,
        s.time_s
    );
}

fn changes(html: &mut String, run: &RunResults) {
    let against = run
        .changes
        .previous_run
        .as_deref()
        .map(|p| format!(" since run {}", esc(p)))
        .unwrap_or_else(|| " (first run)".into());
    let by_key: BTreeMap<ResultKey, &CaseResult> =
        run.results.iter().map(|r| (r.key(), r)).collect();
    let _ = writeln!(
        html,
        "<h2 id=\"new-failures\">New failures{against}: {}</h2>",
        run.changes.new_failures.len()
    );
    key_list(html, &run.changes.new_failures, &by_key);
    let _ = writeln!(
        html,
        "<h2 id=\"fixes\">Fixes{against}: {}</h2>",
        run.changes.fixes.len()
    );
    key_list(html, &run.changes.fixes, &by_key);
}

fn key_list(html: &mut String, keys: &[ResultKey], by_key: &BTreeMap<ResultKey, &CaseResult>) {
    if keys.is_empty() {
        html.push_str("<p>None.</p>\n");
        return;
    }
    html.push_str("<ul>\n");
    for key in keys {
        let detail = by_key
            .get(key)
            .map(|r| {
                let why = r
                    .message
                    .as_deref()
                    .map(|m| format!(": {}", esc(m)))
                    .unwrap_or_default();
                format!(
                    " — {} (max abs diff {}){why}",
                    r.status.as_str(),
                    sci(r.worst.max_abs_diff)
                )
            })
            .unwrap_or_default();
        let _ = writeln!(
            html,
            "<li><b>{}</b> on {} in {}{detail}</li>",
            esc(&key.case),
            esc(&key.backend),
            esc(&key.dtype)
        );
    }
    html.push_str("</ul>\n");
}

fn grid(html: &mut String, run: &RunResults) {
    let backends = backends_of(run);
    let new: BTreeSet<&ResultKey> = run.changes.new_failures.iter().collect();
    // Rows are case × dtype; a row holding a new failure sorts first, then any failure.
    let mut rows: BTreeMap<(String, String), Vec<&CaseResult>> = BTreeMap::new();
    for r in &run.results {
        rows.entry((r.case.clone(), r.dtype.clone()))
            .or_default()
            .push(r);
    }
    let mut ordered: Vec<_> = rows.into_iter().collect();
    ordered.sort_by_key(|((case, dtype), results)| {
        let has_new = results.iter().any(|r| new.contains(&r.key()));
        let has_bad = results.iter().any(|r| r.status.is_bad());
        (!has_new, !has_bad, case.clone(), dtype.clone())
    });
    // The peers' own tester configurations (`tester-*`, nightly/reference/tester.py) are a
    // group of their own, with their pass count.
    let (peers, own): (Vec<_>, Vec<_>) = ordered
        .iter()
        .partition(|((case, _), _)| case.starts_with(TESTER_PREFIX));
    html.push_str("<h2 id=\"grid\">Cases × backends</h2>\n");
    grid_table(html, &own, &backends, &new);
    if !peers.is_empty() {
        let results: Vec<&CaseResult> = peers.iter().flat_map(|(_, r)| r.iter().copied()).collect();
        let passed = results
            .iter()
            .filter(|r| r.status == Status::Passed)
            .count();
        let _ = writeln!(
            html,
            "<h2 id=\"tester-grid\">The peers' tester configurations × backends</h2>\n\
             <p class=\"meta\">transformers' own ModelTester configs (nightly/reference/tester.py): \
             {passed} of {} results passed</p>",
            results.len()
        );
        grid_table(html, &peers, &backends, &new);
    }
}

/// Case names of the cases on the peers' own tester configurations.
pub const TESTER_PREFIX: &str = "tester-";

type Row<'a> = ((String, String), Vec<&'a CaseResult>);

fn grid_table(
    html: &mut String,
    rows: &[&Row<'_>],
    backends: &[String],
    new: &BTreeSet<&ResultKey>,
) {
    html.push_str("<table class=\"grid\">\n<tr><th>case</th><th>architecture</th><th>dtype</th>");
    for b in backends {
        let _ = write!(html, "<th>{}</th>", esc(b));
    }
    html.push_str("</tr>\n");
    for ((case, dtype), results) in rows.iter().copied() {
        let arch = results
            .first()
            .map(|r| r.architecture.as_str())
            .unwrap_or("");
        let _ = write!(
            html,
            "<tr data-case=\"{}\"><td>{}</td><td>{}</td><td>{}</td>",
            esc(case),
            esc(case),
            esc(arch),
            esc(dtype)
        );
        for b in backends {
            match results.iter().find(|r| &r.backend == b) {
                Some(r) => cell(html, r, new.contains(&r.key())),
                None => html.push_str("<td class=\"not-available\">not run</td>"),
            }
        }
        html.push_str("</tr>\n");
    }
    html.push_str("</table>\n");
}

fn cell(html: &mut String, r: &CaseResult, is_new: bool) {
    let label = match r.status {
        Status::Passed => "pass",
        Status::Failed => "FAIL",
        Status::Error => "ERROR",
        Status::Skipped => "skipped",
        Status::NotAvailable => "not available",
    };
    let greedy = match r.worst.greedy_match {
        Some(true) => " · tokens ✓",
        Some(false) => " · tokens ✗",
        None => "",
    };
    let title = r.message.as_deref().unwrap_or("");
    let metrics = if r.worst.max_abs_diff.is_some() {
        format!(
            "<br><span class=\"num\">max {} · cos {}{greedy}</span>",
            sci(r.worst.max_abs_diff),
            fixed(r.worst.cosine)
        )
    } else {
        String::new()
    };
    let _ = write!(
        html,
        "<td class=\"cell {}{}\" data-backend=\"{}\" title=\"{}\">{label}{metrics}<br><span class=\"num\">{:.2} s</span></td>",
        r.status.as_str(),
        if is_new { " new" } else { "" },
        esc(&r.backend),
        esc(title),
        r.time_s
    );
}

fn backends_of(run: &RunResults) -> Vec<String> {
    let mut set: BTreeSet<String> = run.environment.backends.keys().cloned().collect();
    set.extend(run.results.iter().map(|r| r.backend.clone()));
    set.into_iter().collect()
}

const PALETTE: [&str; 6] = [
    "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf",
];
const PLOT_W: f64 = 260.0;
const PLOT_H: f64 = 70.0;

fn history(html: &mut String, runs: &[RunResults], latest: &RunResults) {
    let shown = &runs[runs.len().saturating_sub(PLOTTED_RUNS)..];
    let backends = backends_of(latest);
    let _ = writeln!(
        html,
        "<h2 id=\"history\">History (last {} runs)</h2>\n<p class=\"legend\">{}</p>\n<div class=\"plots\">",
        shown.len(),
        backends
            .iter()
            .enumerate()
            .map(|(i, b)| format!("<span style=\"color:{}\">■ {}</span>", PALETTE[i % PALETTE.len()], esc(b)))
            .collect::<String>()
    );
    let cases: BTreeSet<(&str, &str)> = latest
        .results
        .iter()
        .map(|r| (r.case.as_str(), r.dtype.as_str()))
        .collect();
    for (case, dtype) in cases {
        let _ = write!(
            html,
            "<div class=\"plot\"><h3>{} ({})</h3>",
            esc(case),
            esc(dtype)
        );
        for (metric, log, pick) in [
            (
                "max abs diff (log)",
                true,
                (|r: &CaseResult| r.worst.max_abs_diff) as fn(&CaseResult) -> Option<f64>,
            ),
            ("time s", false, |r: &CaseResult| Some(r.time_s)),
        ] {
            let series: Vec<(usize, Vec<Option<f64>>)> = backends
                .iter()
                .enumerate()
                .map(|(i, b)| {
                    let points = shown
                        .iter()
                        .map(|run| {
                            run.results
                                .iter()
                                .find(|r| r.case == case && r.dtype == dtype && &r.backend == b)
                                // A skipped or absent backend has no figures, only a gap.
                                .filter(|r| {
                                    !matches!(r.status, Status::Skipped | Status::NotAvailable)
                                })
                                .and_then(|r| pick(r).filter(|v| v.is_finite()))
                        })
                        .collect();
                    (i, points)
                })
                .collect();
            plot(
                html,
                &format!("{case} {dtype}: {metric}"),
                metric,
                log,
                &series,
                shown.len(),
            );
        }
        html.push_str("</div>\n");
    }
    html.push_str("</div>\n");
}

/// One inline SVG line plot; `None` points are gaps (backend absent or metric missing).
fn plot(
    html: &mut String,
    title: &str,
    label: &str,
    log: bool,
    series: &[(usize, Vec<Option<f64>>)],
    runs: usize,
) {
    let scale = |v: f64| if log { v.max(1e-12).log10() } else { v };
    let values: Vec<f64> = series
        .iter()
        .flat_map(|(_, p)| p.iter().flatten().map(|v| scale(*v)))
        .collect();
    let (lo, hi) = values
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
            (lo.min(*v), hi.max(*v))
        });
    let (lo, hi) = if values.is_empty() {
        (0.0, 1.0)
    } else if hi - lo < 1e-9 {
        (lo - 1.0, hi + 1.0)
    } else {
        (lo, hi)
    };
    let x = |i: usize| {
        30.0 + (PLOT_W - 40.0)
            * if runs > 1 {
                i as f64 / (runs - 1) as f64
            } else {
                0.5
            }
    };
    let y = |v: f64| 8.0 + (PLOT_H - 20.0) * (1.0 - (scale(v) - lo) / (hi - lo));
    let unscale = |v: f64| if log { 10f64.powf(v) } else { v };
    let _ = write!(
        html,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{PLOT_W}\" height=\"{PLOT_H}\" role=\"img\"><title>{}</title>\
         <rect x=\"30\" y=\"8\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#ddd\"/>\
         <text x=\"2\" y=\"14\" font-size=\"8\">{}</text><text x=\"2\" y=\"{}\" font-size=\"8\">{}</text>\
         <text x=\"32\" y=\"{}\" font-size=\"8\" fill=\"#666\">{}</text>",
        esc(title),
        PLOT_W - 40.0,
        PLOT_H - 20.0,
        short(unscale(hi)),
        PLOT_H - 12.0,
        short(unscale(lo)),
        PLOT_H - 2.0,
        esc(label)
    );
    for (color, points) in series {
        let color = PALETTE[color % PALETTE.len()];
        // A gap splits the line so an absent run is not drawn as a straight bridge.
        for segment in points
            .iter()
            .enumerate()
            .collect::<Vec<_>>()
            .split(|(_, v)| v.is_none())
        {
            let coords: Vec<String> = segment
                .iter()
                .filter_map(|(i, v)| v.map(|v| format!("{:.1},{:.1}", x(*i), y(v))))
                .collect();
            match coords.len() {
                0 => {}
                1 => {
                    let (cx, cy) = coords[0].split_once(',').unwrap_or(("0", "0"));
                    let _ = write!(
                        html,
                        "<circle cx=\"{cx}\" cy=\"{cy}\" r=\"2\" fill=\"{color}\"/>"
                    );
                }
                _ => {
                    let _ = write!(
                        html,
                        "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"1.5\" points=\"{}\"/>",
                        coords.join(" ")
                    );
                }
            }
        }
    }
    html.push_str("</svg>");
}

fn environment(html: &mut String, run: &RunResults) {
    let env = &run.environment;
    html.push_str("<h2 id=\"environment\">Environment</h2>\n<table>\n");
    for (k, v) in [
        ("commit", env.commit.as_deref()),
        ("zoo", env.zoo_version.as_deref()),
        ("host", env.host.as_deref()),
    ] {
        let _ = writeln!(
            html,
            "<tr><th>{k}</th><td>{}</td></tr>",
            esc(v.unwrap_or("unknown"))
        );
    }
    html.push_str("</table>\n<h3>Backends</h3>\n<table>\n<tr><th>backend</th><th>available</th><th>version</th><th>detail</th></tr>\n");
    for (name, b) in &env.backends {
        let _ = writeln!(
            html,
            "<tr><td>{}</td><td class=\"{}\">{}</td><td>{}</td><td>{}</td></tr>",
            esc(name),
            if b.available {
                "passed"
            } else {
                "not-available"
            },
            if b.available { "yes" } else { "no" },
            esc(b.version.as_deref().unwrap_or("")),
            esc(b.detail.as_deref().unwrap_or(""))
        );
    }
    html.push_str("</table>\n<h3>Libraries</h3>\n<table>\n");
    for (name, version) in &env.libraries {
        let _ = writeln!(
            html,
            "<tr><td>{}</td><td>{}</td></tr>",
            esc(name),
            esc(version)
        );
    }
    html.push_str("</table>\n");
}

fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

fn sci(v: Option<f64>) -> String {
    match v {
        None => "–".into(),
        Some(v) if v.is_nan() => "NaN".into(),
        Some(v) if v.is_infinite() => "inf".into(),
        Some(v) => format!("{v:.1e}"),
    }
}

fn fixed(v: Option<f64>) -> String {
    match v {
        None => "–".into(),
        Some(v) if !v.is_finite() => "NaN".into(),
        Some(v) => format!("{v:.6}"),
    }
}

fn short(v: f64) -> String {
    if v != 0.0 && (v.abs() < 1e-2 || v.abs() >= 1e4) {
        format!("{v:.0e}")
    } else {
        format!("{v:.2}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::results::{record_run, BackendInfo, Environment};

    fn result(
        case: &str,
        backend: &str,
        status: Status,
        max_abs: Option<f64>,
        time_s: f64,
    ) -> CaseResult {
        let mut r = CaseResult::without_outputs(
            case,
            "LlamaForCausalLM",
            backend,
            "f32",
            status,
            "",
            time_s,
        );
        r.message = (status != Status::Passed).then(|| format!("{case} <{backend}>"));
        r.worst.max_abs_diff = max_abs;
        r.worst.cosine = max_abs.map(|_| 0.99999);
        r
    }

    fn env() -> Environment {
        let mut env = Environment {
            commit: Some("abc123".into()),
            ..Environment::default()
        };
        env.backends.insert(
            "candle-cpu".into(),
            BackendInfo {
                available: true,
                version: Some("0.11".into()),
                detail: None,
            },
        );
        env.backends.insert(
            "pjrt-tpu".into(),
            BackendInfo {
                available: false,
                version: None,
                detail: Some("libtpu not found".into()),
            },
        );
        env.libraries.insert("transformers".into(), "5.24.0".into());
        env
    }

    fn two_runs(dir: &Path) -> PathBuf {
        let history = dir.join("history");
        let first = RunResults::new(
            "2026-11-29",
            "2026-11-29T02:00:00Z",
            env(),
            vec![
                result("llama-a", "candle-cpu", Status::Passed, Some(2e-6), 0.5),
                result("llama-b", "candle-cpu", Status::Passed, Some(3e-6), 0.7),
                result("llama-a", "pjrt-tpu", Status::NotAvailable, None, 0.0),
                result("llama-b", "pjrt-tpu", Status::NotAvailable, None, 0.0),
            ],
        );
        record_run(first, &dir.join("out1"), &history).unwrap();
        let second = RunResults::new(
            "2026-11-30",
            "2026-11-30T02:00:00Z",
            env(),
            vec![
                result("llama-a", "candle-cpu", Status::Passed, Some(1e-6), 0.4),
                result("llama-b", "candle-cpu", Status::Failed, Some(0.5), 0.8),
                result("llama-a", "pjrt-tpu", Status::NotAvailable, None, 0.0),
                result("llama-b", "pjrt-tpu", Status::NotAvailable, None, 0.0),
            ],
        );
        record_run(second, &dir.join("out2"), &history).unwrap();
        history
    }

    #[test]
    fn page_shows_every_result_new_failures_first_and_no_network() {
        let tmp = tempfile::tempdir().unwrap();
        let history = two_runs(tmp.path());
        let index = write_dashboard(&history, &tmp.path().join("site")).unwrap();
        let html = std::fs::read_to_string(index).unwrap();

        assert_eq!(
            html.matches("<td class=\"cell ").count(),
            4,
            "one cell per case × backend"
        );
        assert_eq!(html.matches("class=\"cell failed new\"").count(), 1);
        assert_eq!(html.matches("class=\"cell not-available\"").count(), 2);
        let b = html.find("<tr data-case=\"llama-b\"").unwrap();
        let a = html.find("<tr data-case=\"llama-a\"").unwrap();
        assert!(b < a, "the new failure's row comes first");
        assert!(html.contains("New failures since run 2026-11-29: 1"));
        assert!(html.contains("5.0e-1"), "worst error shown");
        assert!(
            html.contains("libtpu not found") && html.contains("abc123") && html.contains("5.24.0")
        );
        assert_eq!(
            html.matches("<svg").count(),
            4,
            "error and time plot per case"
        );
        assert!(html.contains("<polyline"), "two runs draw lines");
        assert_eq!(
            html.matches("<circle").count(),
            0,
            "absent backends plot nothing"
        );
        assert!(
            html.contains("llama-b &lt;candle-cpu&gt;"),
            "messages are escaped"
        );
        for banned in ["<script", "src=\"http", "href=\"http", "@import", "url("] {
            assert!(
                !html.contains(banned),
                "page must be self-contained: found {banned}"
            );
        }
    }

    #[test]
    fn the_peers_tester_configurations_are_a_group_with_their_count() {
        let run = RunResults::new(
            "2026-12-07",
            "2026-12-07T02:00:00Z",
            env(),
            vec![
                result("llama-a", "candle-cpu", Status::Passed, Some(1e-6), 0.1),
                result(
                    "tester-llama-f32",
                    "candle-cpu",
                    Status::Passed,
                    Some(1e-6),
                    0.1,
                ),
                result(
                    "tester-gemma-f32",
                    "candle-cpu",
                    Status::Failed,
                    Some(0.5),
                    0.1,
                ),
            ],
        );
        let html = render(&[run]);
        let (own, peers) = html
            .split_once("id=\"tester-grid\"")
            .expect("a group of their own");
        assert!(own.contains("data-case=\"llama-a\"") && !own.contains("data-case=\"tester-"));
        assert!(peers.contains("1 of 2 results passed"), "{peers}");
        assert!(peers.contains("data-case=\"tester-llama-f32\""));
        // Without such cases there is no such group.
        let plain = RunResults::new(
            "2026-12-07",
            "2026-12-07T02:00:00Z",
            env(),
            vec![result(
                "llama-a",
                "candle-cpu",
                Status::Passed,
                Some(1e-6),
                0.1,
            )],
        );
        assert!(!render(&[plain]).contains("tester-grid"));
    }

    #[test]
    fn empty_history_is_an_error_and_gaps_split_lines() {
        let tmp = tempfile::tempdir().unwrap();
        let err = write_dashboard(&tmp.path().join("none"), &tmp.path().join("site")).unwrap_err();
        assert!(matches!(err, DashboardError::NoRuns(_)));

        let mut html = String::new();
        plot(
            &mut html,
            "t",
            "l",
            true,
            &[(0, vec![Some(1e-3), None, Some(1e-5), Some(1e-4)])],
            4,
        );
        assert_eq!(
            html.matches("<circle").count(),
            1,
            "the lone point before the gap"
        );
        assert_eq!(
            html.matches("<polyline").count(),
            1,
            "the two points after it"
        );
        assert!(render(&[]).contains("No runs recorded yet"));
    }
}
