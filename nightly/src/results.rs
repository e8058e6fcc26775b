//! The results of one harness run, its history, and what changed since the last run.
//!
//! One JSON document per run (schema in `nightly/README.md`), modelled on transformers'
//! daily-CI `model_results.json`: per-model success/failed/skipped/errors counts and
//! time, plus zoo's per case × backend × dtype metrics. A backend the machine lacks is
//! recorded as [`Status::NotAvailable`], which never counts as a success.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::case::{Case, CompareKind, OutputReport};

/// The `schema_version` this crate writes and reads.
pub const RESULTS_SCHEMA_VERSION: u32 = 1;
/// File name of a run's results inside `--out`.
pub const RESULTS_FILE: &str = "results.json";

/// Why results could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum ResultsError {
    /// A file or folder could not be read or written.
    #[error("cannot access {path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A results file could not be written (atomically: a failed write leaves none).
    #[error(transparent)]
    Output(#[from] zoo_hub::OutputError),
    /// A results file is not valid results JSON.
    #[error("{path}: field `{field}`: {source}")]
    Json {
        /// The file.
        path: PathBuf,
        /// Path of the offending field.
        field: String,
        /// The parser's message.
        #[source]
        source: serde_json::Error,
    },
    /// A results file has a schema version this crate does not read.
    #[error("{path}: schema_version {found}; this zoo reads {supported}")]
    UnsupportedSchema {
        /// The file.
        path: PathBuf,
        /// Version found.
        found: u32,
        /// Version supported.
        supported: u32,
    },
    /// A run id would not make a safe file name.
    #[error("run id `{0}` may only contain ASCII letters, digits, '-', '_' and '.', and must not start with '.'")]
    BadRunId(String),
}

/// Outcome of one case on one backend in one dtype.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Status {
    /// Every judged output within tolerance.
    Passed,
    /// Ran, and at least one output was outside tolerance.
    Failed,
    /// Crashed or could not be compared (load error, shape mismatch, panic).
    Error,
    /// Deliberately not run (filtered out, unsupported dtype for the backend).
    Skipped,
    /// The backend is not on this machine. Never a pass.
    NotAvailable,
}

impl Status {
    /// True for [`Status::Failed`] and [`Status::Error`].
    pub fn is_bad(self) -> bool {
        matches!(self, Status::Failed | Status::Error)
    }

    /// The kebab-case name used in JSON and on the dashboard.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Passed => "passed",
            Status::Failed => "failed",
            Status::Error => "error",
            Status::Skipped => "skipped",
            Status::NotAvailable => "not-available",
        }
    }
}

/// The worst figure of each metric over a result's outputs, for the grid and the plots.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Worst {
    /// Largest max abs diff over `allclose` outputs.
    #[serde(with = "crate::metrics::nonfinite_opt", default)]
    pub max_abs_diff: Option<f64>,
    /// Largest mean relative diff over `allclose` outputs.
    #[serde(with = "crate::metrics::nonfinite_opt", default)]
    pub mean_rel_diff: Option<f64>,
    /// Largest mismatch percentage over `allclose` outputs.
    #[serde(with = "crate::metrics::nonfinite_opt", default)]
    pub mismatch_pct: Option<f64>,
    /// Smallest cosine similarity over `allclose` outputs.
    #[serde(with = "crate::metrics::nonfinite_opt", default)]
    pub cosine: Option<f64>,
    /// Smallest top-1 agreement over logits outputs.
    #[serde(with = "crate::metrics::nonfinite_opt", default)]
    pub top1_agreement: Option<f64>,
    /// All `exact` outputs (greedy tokens) equal; `None` when the case has none.
    pub greedy_match: Option<bool>,
}

impl Worst {
    /// Folds the judged outputs' metrics (`info` outputs are ignored).
    pub fn of(outputs: &[OutputReport]) -> Self {
        let mut worst = Worst::default();
        for report in outputs.iter().filter(|r| r.compare != CompareKind::Info) {
            if let Some(c) = &report.close {
                worst.max_abs_diff = Some(max(worst.max_abs_diff, c.max_abs_diff));
                worst.mean_rel_diff = Some(max(worst.mean_rel_diff, c.mean_rel_diff));
                worst.mismatch_pct = Some(max(worst.mismatch_pct, c.mismatch_pct));
                worst.cosine = Some(min(worst.cosine, c.cosine));
                if let Some(t) = c.top1_agreement {
                    worst.top1_agreement = Some(min(worst.top1_agreement, t));
                }
            }
            if let Some(t) = &report.tokens {
                worst.greedy_match = Some(worst.greedy_match.unwrap_or(true) && t.passed);
            }
        }
        worst
    }
}

// NaN must win both folds: it marks a broken output.
fn max(acc: Option<f64>, v: f64) -> f64 {
    match acc {
        Some(a) if a.is_nan() || a >= v => a,
        _ => v,
    }
}

fn min(acc: Option<f64>, v: f64) -> f64 {
    match acc {
        Some(a) if a.is_nan() || a <= v => a,
        _ => v,
    }
}

/// One case × backend × dtype.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CaseResult {
    /// Case name.
    pub case: String,
    /// The case's architecture (the "model" of the per-model counts).
    pub architecture: String,
    /// Backend name (`candle-cpu`, `pjrt-cpu`, `pjrt-cpu-x4`, `pjrt-cuda`, `pjrt-tpu`).
    pub backend: String,
    /// Dtype the case ran in (`f32`, `bf16`, `f16`).
    pub dtype: String,
    /// Outcome.
    pub status: Status,
    /// Wall time of loading and running the case, in seconds.
    pub time_s: f64,
    /// Why it errored, was skipped or is not available; `None` for a normal pass/fail.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Worst metrics over the outputs.
    #[serde(default)]
    pub worst: Worst,
    /// Every compared output.
    #[serde(default)]
    pub outputs: Vec<OutputReport>,
}

impl CaseResult {
    /// A result from compared outputs: passed when every judged output passed.
    pub fn compared(case: &Case, backend: &str, outputs: Vec<OutputReport>, time_s: f64) -> Self {
        Self::from_outputs(
            case.name(),
            &case.spec.architecture,
            backend,
            case.spec.dtype.as_str(),
            outputs,
            time_s,
        )
    }

    /// A result from compared outputs of any kind of case (a model's, a pipeline's):
    /// passed when every judged output passed.
    pub fn from_outputs(
        case: &str,
        architecture: &str,
        backend: &str,
        dtype: &str,
        outputs: Vec<OutputReport>,
        time_s: f64,
    ) -> Self {
        let status = if outputs.iter().all(|o| o.passed) {
            Status::Passed
        } else {
            Status::Failed
        };
        Self {
            case: case.to_string(),
            architecture: architecture.to_string(),
            backend: backend.to_string(),
            dtype: dtype.to_string(),
            status,
            time_s,
            message: None,
            worst: Worst::of(&outputs),
            outputs,
        }
    }

    /// A result without outputs: an error, a skip or an absent backend.
    pub fn without_outputs(
        case: &str,
        architecture: &str,
        backend: &str,
        dtype: &str,
        status: Status,
        message: impl Into<String>,
        time_s: f64,
    ) -> Self {
        Self {
            case: case.to_string(),
            architecture: architecture.to_string(),
            backend: backend.to_string(),
            dtype: dtype.to_string(),
            status,
            time_s,
            message: Some(message.into()),
            worst: Worst::default(),
            outputs: Vec::new(),
        }
    }

    /// The identity of this result across runs.
    pub fn key(&self) -> ResultKey {
        ResultKey {
            case: self.case.clone(),
            backend: self.backend.clone(),
            dtype: self.dtype.clone(),
        }
    }
}

/// case × backend × dtype: what a result is compared against in the previous run.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ResultKey {
    /// Case name.
    pub case: String,
    /// Backend name.
    pub backend: String,
    /// Dtype.
    pub dtype: String,
}

/// Counts over a set of results, as in transformers' `model_results.json`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Counts {
    /// Passed results.
    pub success: usize,
    /// Failed results.
    pub failed: usize,
    /// Skipped results.
    pub skipped: usize,
    /// Results that crashed or could not be compared.
    pub errors: usize,
    /// Results on backends this machine lacks.
    pub not_available: usize,
    /// Summed wall time, seconds.
    pub time_s: f64,
}

impl Counts {
    fn add(&mut self, r: &CaseResult) {
        match r.status {
            Status::Passed => self.success += 1,
            Status::Failed => self.failed += 1,
            Status::Skipped => self.skipped += 1,
            Status::Error => self.errors += 1,
            Status::NotAvailable => self.not_available += 1,
        }
        self.time_s += r.time_s;
    }
}

/// One backend as the run saw it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BackendInfo {
    /// Whether the backend could run here.
    pub available: bool,
    /// Plugin or library version, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Why it is not available, or other detail (plugin path, device count).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// Where and with what the run happened.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Environment {
    /// Git commit of zoo, when known.
    #[serde(default)]
    pub commit: Option<String>,
    /// zoo's version.
    #[serde(default)]
    pub zoo_version: Option<String>,
    /// Machine description (OS, CPU).
    #[serde(default)]
    pub host: Option<String>,
    /// Backend name -> what the run found.
    #[serde(default)]
    pub backends: BTreeMap<String, BackendInfo>,
    /// Library name -> version (candle, the reference stack of the cases, ...).
    #[serde(default)]
    pub libraries: BTreeMap<String, String>,
}

/// What changed against the previous run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Changes {
    /// Run id of the run compared against; `None` for the first run.
    pub previous_run: Option<String>,
    /// Failed or errored now, and not so before (including results new in this run).
    pub new_failures: Vec<ResultKey>,
    /// Failed or errored before, passed now.
    pub fixes: Vec<ResultKey>,
}

impl Changes {
    /// New failures and fixes of `current` against `previous`.
    pub fn between(previous: Option<&RunResults>, current: &RunResults) -> Self {
        let before: BTreeMap<ResultKey, Status> = previous
            .map(|p| p.results.iter().map(|r| (r.key(), r.status)).collect())
            .unwrap_or_default();
        let mut changes = Changes {
            previous_run: previous.map(|p| p.run_id.clone()),
            ..Changes::default()
        };
        for r in &current.results {
            let was = before.get(&r.key()).copied();
            if r.status.is_bad() && !was.is_some_and(Status::is_bad) {
                changes.new_failures.push(r.key());
            } else if r.status == Status::Passed && was.is_some_and(Status::is_bad) {
                changes.fixes.push(r.key());
            }
        }
        changes.new_failures.sort();
        changes.fixes.sort();
        changes
    }
}

/// One harness run: the document written to `--out/results.json` and to the history.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunResults {
    /// [`RESULTS_SCHEMA_VERSION`].
    pub schema_version: u32,
    /// Sortable id, also the history file name (e.g. `2026-11-30T10-12-00Z`).
    pub run_id: String,
    /// Start time, RFC 3339 UTC.
    pub started_at: String,
    /// Machine, backends, libraries, commit.
    pub environment: Environment,
    /// Counts over every result.
    pub summary: Counts,
    /// Counts per architecture.
    pub models: BTreeMap<String, Counts>,
    /// Against the previous run in the history.
    pub changes: Changes,
    /// Every case × backend × dtype.
    pub results: Vec<CaseResult>,
}

impl RunResults {
    /// A run from its results; counts are computed here, `changes` by [`record_run`].
    pub fn new(
        run_id: &str,
        started_at: &str,
        environment: Environment,
        results: Vec<CaseResult>,
    ) -> Self {
        let mut summary = Counts::default();
        let mut models: BTreeMap<String, Counts> = BTreeMap::new();
        for r in &results {
            summary.add(r);
            models.entry(r.architecture.clone()).or_default().add(r);
        }
        Self {
            schema_version: RESULTS_SCHEMA_VERSION,
            run_id: run_id.to_string(),
            started_at: started_at.to_string(),
            environment,
            summary,
            models,
            changes: Changes::default(),
            results,
        }
    }

    /// Reads a results JSON file.
    pub fn read(path: &Path) -> Result<Self, ResultsError> {
        let text = std::fs::read_to_string(path).map_err(|source| ResultsError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let mut de = serde_json::Deserializer::from_str(&text);
        let run: RunResults =
            serde_path_to_error::deserialize(&mut de).map_err(|e| ResultsError::Json {
                path: path.to_path_buf(),
                field: e.path().to_string(),
                source: e.into_inner(),
            })?;
        if run.schema_version != RESULTS_SCHEMA_VERSION {
            return Err(ResultsError::UnsupportedSchema {
                path: path.to_path_buf(),
                found: run.schema_version,
                supported: RESULTS_SCHEMA_VERSION,
            });
        }
        Ok(run)
    }

    /// Writes the run as pretty JSON to `path`.
    pub fn write(&self, path: &Path) -> Result<(), ResultsError> {
        let io = |source| ResultsError::Io {
            path: path.to_path_buf(),
            source,
        };
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(io)?;
        }
        let text = serde_json::to_string_pretty(self)
            .expect("results serialize: no maps with non-string keys");
        Ok(zoo_hub::write_atomically(path, (text + "\n").as_bytes())?)
    }
}

/// The runs in a history folder (`<run_id>.json` each), oldest first.
pub fn load_history(dir: &Path) -> Result<Vec<RunResults>, ResultsError> {
    if !dir.exists() {
        return Ok(Vec::new());
    }
    let io = |source| ResultsError::Io {
        path: dir.to_path_buf(),
        source,
    };
    let mut runs = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io)? {
        let path = entry.map_err(io)?.path();
        if path.extension().is_some_and(|e| e == "json") {
            runs.push(RunResults::read(&path)?);
        }
    }
    runs.sort_by(|a, b| a.run_id.cmp(&b.run_id));
    Ok(runs)
}

/// Records a finished run: computes its changes against the newest earlier run in
/// `history_dir`, writes `out_dir/results.json` and `history_dir/<run_id>.json`, and
/// returns the run with its changes filled in.
pub fn record_run(
    mut run: RunResults,
    out_dir: &Path,
    history_dir: &Path,
) -> Result<RunResults, ResultsError> {
    check_run_id(&run.run_id)?;
    let history = load_history(history_dir)?;
    let previous = history.iter().rev().find(|r| r.run_id < run.run_id);
    run.changes = Changes::between(previous, &run);
    run.write(&out_dir.join(RESULTS_FILE))?;
    run.write(&history_dir.join(format!("{}.json", run.run_id)))?;
    Ok(run)
}

fn check_run_id(id: &str) -> Result<(), ResultsError> {
    let ok = !id.is_empty()
        && !id.starts_with('.')
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(())
    } else {
        Err(ResultsError::BadRunId(id.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::CloseMetrics;

    fn result(case: &str, backend: &str, status: Status) -> CaseResult {
        CaseResult::without_outputs(case, "LlamaForCausalLM", backend, "f32", status, "x", 1.5)
    }

    fn close(max_abs: f64, cosine: f64, top1: Option<f64>) -> CloseMetrics {
        CloseMetrics {
            passed: true,
            compared: 4,
            mismatched: 0,
            max_abs_diff: max_abs,
            mean_rel_diff: max_abs / 10.0,
            mismatch_pct: 0.0,
            cosine,
            top1_agreement: top1,
        }
    }

    #[test]
    fn counts_never_treat_absent_backends_as_passes() {
        let run = RunResults::new(
            "r1",
            "2026-11-30T00:00:00Z",
            Environment::default(),
            vec![
                result("a", "candle-cpu", Status::Passed),
                result("a", "pjrt-tpu", Status::NotAvailable),
                result("b", "candle-cpu", Status::Failed),
                result("c", "candle-cpu", Status::Error),
                result("d", "candle-cpu", Status::Skipped),
            ],
        );
        let s = &run.summary;
        assert_eq!(
            (s.success, s.failed, s.errors, s.skipped, s.not_available),
            (1, 1, 1, 1, 1)
        );
        assert!((s.time_s - 7.5).abs() < 1e-12);
        assert_eq!(run.models["LlamaForCausalLM"].success, 1);
    }

    #[test]
    fn changes_list_new_failures_and_fixes() {
        let before = RunResults::new(
            "r1",
            "t",
            Environment::default(),
            vec![
                result("a", "candle-cpu", Status::Passed),
                result("b", "candle-cpu", Status::Failed),
                result("c", "candle-cpu", Status::Error),
                result("e", "pjrt-tpu", Status::NotAvailable),
            ],
        );
        let after = RunResults::new(
            "r2",
            "t",
            Environment::default(),
            vec![
                result("a", "candle-cpu", Status::Error),
                result("b", "candle-cpu", Status::Passed),
                result("c", "candle-cpu", Status::Failed),
                result("new", "candle-cpu", Status::Failed),
                result("e", "pjrt-tpu", Status::NotAvailable),
            ],
        );
        let changes = Changes::between(Some(&before), &after);
        let names = |keys: &[ResultKey]| keys.iter().map(|k| k.case.clone()).collect::<Vec<_>>();
        assert_eq!(names(&changes.new_failures), vec!["a", "new"]);
        assert_eq!(names(&changes.fixes), vec!["b"]);
        assert_eq!(changes.previous_run.as_deref(), Some("r1"));
        let first = Changes::between(None, &before);
        assert_eq!(names(&first.new_failures), vec!["b", "c"]);
    }

    #[test]
    fn worst_folds_outputs_and_ignores_info() {
        let out = |name: &str, compare, c: CloseMetrics| OutputReport {
            name: name.into(),
            compare,
            passed: true,
            close: Some(c),
            tokens: None,
        };
        let worst = Worst::of(&[
            out(
                "logits",
                CompareKind::Allclose,
                close(1e-5, 0.999, Some(0.9)),
            ),
            out("hidden", CompareKind::Allclose, close(3e-5, 0.9999, None)),
            out("margins", CompareKind::Info, close(9.0, 0.1, Some(0.0))),
        ]);
        assert_eq!(worst.max_abs_diff, Some(3e-5));
        assert_eq!(worst.cosine, Some(0.999));
        assert_eq!(worst.top1_agreement, Some(0.9));
        assert_eq!(worst.greedy_match, None);
        let nan = Worst::of(&[
            out("x", CompareKind::Allclose, close(f64::NAN, f64::NAN, None)),
            out("y", CompareKind::Allclose, close(1.0, 1.0, None)),
        ]);
        assert!(nan.max_abs_diff.unwrap().is_nan() && nan.cosine.unwrap().is_nan());
    }

    #[test]
    fn record_run_writes_out_and_history_and_round_trips() {
        let tmp = tempfile::tempdir().unwrap();
        let (out, hist) = (tmp.path().join("out"), tmp.path().join("history"));
        let mut first = RunResults::new(
            "2026-11-29",
            "t",
            Environment::default(),
            vec![result("a", "candle-cpu", Status::Passed)],
        );
        first.results[0].worst.max_abs_diff = Some(f64::INFINITY);
        let first = record_run(first, &out, &hist).unwrap();
        assert_eq!(first.changes.previous_run, None);
        let second = RunResults::new(
            "2026-11-30",
            "t",
            Environment::default(),
            vec![result("a", "candle-cpu", Status::Failed)],
        );
        let second = record_run(second, &out, &hist).unwrap();
        assert_eq!(second.changes.previous_run.as_deref(), Some("2026-11-29"));
        assert_eq!(second.changes.new_failures.len(), 1);

        let history = load_history(&hist).unwrap();
        assert_eq!(history.len(), 2);
        assert_eq!(history[0], first, "infinity survives the JSON round trip");
        assert_eq!(RunResults::read(&out.join(RESULTS_FILE)).unwrap(), second);

        assert!(matches!(
            record_run(second.clone_with_id("../evil"), &out, &hist),
            Err(ResultsError::BadRunId(_))
        ));
        std::fs::write(hist.join("broken.json"), "{\"schema_version\": 1}").unwrap();
        let err = load_history(&hist).unwrap_err();
        assert!(err.to_string().contains("broken.json"), "{err}");
    }

    impl RunResults {
        fn clone_with_id(&self, id: &str) -> Self {
            Self {
                run_id: id.into(),
                ..self.clone()
            }
        }
    }
}
