//! `zoo parity`: run parity cases against the PyTorch reference and draw the dashboard.

use std::path::PathBuf;

use anyhow::{bail, Result};
use zoo_nightly::harness::{self, Backend, RunOptions};
use zoo_nightly::results::Status;

/// Check zoo against the PyTorch reference: run parity cases, draw the dashboard.
///
/// A case is a folder with a checkpoint, inputs and the reference's outputs (format in
/// nightly/README.md).
///
/// Examples:
///   zoo parity run --backends candle-cpu --out parity-results
///   zoo parity dashboard --results parity-results/history --out site
#[derive(clap::Args)]
#[command(verbatim_doc_comment)]
pub struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Subcommand)]
enum Command {
    Run(RunArgs),
    Dashboard(DashboardArgs),
}

/// Run parity cases on each backend and dtype and record the results.
///
/// Runs every case folder under --cases (model cases against transformers, pipeline
/// cases against diffusers), prints a table
/// (case × backend × dtype: status, max abs diff, time) and record the run as
/// OUT/results.json and HISTORY/<run_id>.json, with new failures and fixes against the
/// previous run. A backend zoo cannot run models on here is "not-available", never a
/// pass; a case zoo has no model for, or a broken case, is an "error" and the run goes
/// on. Exits 1 when any result failed or errored.
///
/// Examples:
///   zoo parity run
///   zoo parity run --cases nightly/fixtures --backends candle-cpu --out parity-out
///   zoo parity run --cases ~/.cache/zoo/cases --cases nightly/fixtures --dtypes bf16
///   zoo parity run --backends candle-cpu,pjrt-cpu --history site-data/history
#[derive(clap::Args)]
#[command(verbatim_doc_comment)]
pub struct RunArgs {
    /// A case folder, or a folder of case folders; repeatable. Default: nightly/fixtures
    /// and diffusers/tests/data/pipelines under the current folder, those present.
    #[arg(long = "cases")]
    cases: Vec<PathBuf>,
    /// Comma-separated: candle-cpu, pjrt-cpu, pjrt-cpu-x4 (stages over four devices), pjrt-cpu-tp4 (every layer split over four), pjrt-cpu-tp2pp2 (two stages of two-device meshes), pjrt-cuda, pjrt-tpu, candle-cuda
    /// (cuda:0; a `--features cuda` build) (default: all).
    #[arg(long, value_delimiter = ',')]
    backends: Vec<String>,
    /// Comma-separated: f32, bf16, f16. Cases in other dtypes are recorded as skipped
    /// (default: every case in its own dtype).
    #[arg(long, value_delimiter = ',')]
    dtypes: Vec<String>,
    /// Where results.json goes.
    #[arg(long, default_value = "parity-results")]
    out: PathBuf,
    /// The history folder the run is added to (default: OUT/history).
    #[arg(long)]
    history: Option<PathBuf>,
}

/// Write the results dashboard (index.html) from a history folder.
///
/// Writes SITE_DIR/index.html, a self-contained page (no script, no network) drawn from
/// a history folder: the latest run's grid, new failures and fixes, per-case plots.
///
/// Examples:
///   zoo parity dashboard --results parity-results/history --out site
#[derive(clap::Args)]
#[command(verbatim_doc_comment)]
pub struct DashboardArgs {
    /// The history folder (`zoo parity run`'s --history, by default OUT/history).
    #[arg(long)]
    results: PathBuf,
    /// Where index.html is written.
    #[arg(long)]
    out: PathBuf,
}

pub fn run(args: Args) -> Result<()> {
    match args.command {
        Command::Run(a) => run_cases(a),
        Command::Dashboard(a) => {
            let index = zoo_nightly::dashboard::write_dashboard(&a.results, &a.out)?;
            outln!("wrote {}", index.display());
            Ok(())
        }
    }
}

/// The committed case folders `zoo parity run` runs without --cases: the language and
/// encoder models', then the diffusion pipelines'.
const DEFAULT_CASES: [&str; 2] = ["nightly/fixtures", "diffusers/tests/data/pipelines"];

fn run_cases(args: RunArgs) -> Result<()> {
    let cases = if args.cases.is_empty() {
        let defaults: Vec<PathBuf> = DEFAULT_CASES
            .iter()
            .map(PathBuf::from)
            .filter(|p| p.is_dir())
            .collect();
        if defaults.is_empty() {
            bail!(
                "no --cases given and none of {} exists here; pass --cases DIR",
                DEFAULT_CASES.join(", ")
            );
        }
        defaults
    } else {
        args.cases
    };
    let backends = args
        .backends
        .iter()
        .map(|b| Backend::parse(b.trim()))
        .collect::<Result<Vec<_>, _>>()?;
    let dtypes = args
        .dtypes
        .iter()
        .map(|d| harness::parse_dtype(d.trim()))
        .collect::<Result<Vec<_>, _>>()?;
    let opts = RunOptions {
        backends,
        dtypes,
        history: args.history,
        run_id: None,
    };
    let summary = harness::run_with(&cases, &args.out, &opts)?;
    let run = &summary.run;

    let width = run
        .results
        .iter()
        .map(|r| r.case.len())
        .max()
        .unwrap_or(4)
        .max(4);
    outln!(
        "{:<width$}  {:<11}  {:<5}  {:<13}  {:>12}  {:>8}",
        "case",
        "backend",
        "dtype",
        "status",
        "max abs diff",
        "time"
    );
    for r in &run.results {
        let diff = match r.worst.max_abs_diff {
            Some(d) => format!("{d:.2e}"),
            None => "-".into(),
        };
        outln!(
            "{:<width$}  {:<11}  {:<5}  {:<13}  {:>12}  {:>7.2}s",
            r.case,
            r.backend,
            r.dtype,
            r.status.as_str(),
            diff,
            r.time_s
        );
    }
    // Why results did not pass; one line per distinct reason (an absent backend or an
    // unported architecture gives the same reason many times).
    let mut notes: Vec<(String, Vec<String>)> = Vec::new();
    for r in run.results.iter().filter(|r| r.status != Status::Passed) {
        let Some(m) = &r.message else { continue };
        // The first line; multi-line reasons (every place a plugin was searched) are whole
        // in results.json.
        let mut lines = m.lines();
        let first = lines.next().unwrap_or("");
        let more = if lines.next().is_some() {
            " (more in results.json)"
        } else {
            ""
        };
        let reason = format!("{}: {first}{more}", r.status.as_str());
        let who = format!("{} [{} {}]", r.case, r.backend, r.dtype);
        match notes.iter_mut().find(|(n, _)| *n == reason) {
            Some((_, cases)) => cases.push(who),
            None => notes.push((reason, vec![who])),
        }
    }
    if !notes.is_empty() {
        outln!();
        for (reason, cases) in notes {
            let list = if cases.len() > 4 {
                format!("{}, ... ({} results)", cases[..3].join(", "), cases.len())
            } else {
                cases.join(", ")
            };
            outln!("{list}: {reason}");
        }
    }
    let s = &run.summary;
    outln!(
        "\n{} passed, {} failed, {} errors, {} skipped, {} not available in {:.1}s",
        s.success,
        s.failed,
        s.errors,
        s.skipped,
        s.not_available,
        s.time_s
    );
    let c = &run.changes;
    match &c.previous_run {
        Some(prev) => outln!(
            "against {prev}: {} new failures, {} fixes",
            c.new_failures.len(),
            c.fixes.len()
        ),
        None => outln!("first run in {}", summary.history_dir.display()),
    }
    for k in &c.new_failures {
        outln!("  new failure: {} [{} {}]", k.case, k.backend, k.dtype);
    }
    for k in &c.fixes {
        outln!("  fixed: {} [{} {}]", k.case, k.backend, k.dtype);
    }
    outln!("results: {}", summary.results_path.display());
    if summary.has_failures() {
        bail!(
            "{} of {} results failed or errored",
            s.failed + s.errors,
            run.results.len()
        );
    }
    Ok(())
}
