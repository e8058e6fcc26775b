//! The harness: runs every case folder it is pointed at on zoo's models, per backend and
//! dtype, judges the outputs with [`Case::compare_output`] and records the run with
//! [`record_run`].
//!
//! Rules (see `nightly/README.md`): a backend the models cannot run on here is
//! [`Status::NotAvailable`] with the reason, never a pass; an architecture zoo has no
//! model for, a broken case folder, a load or forward error and a panic are each
//! [`Status::Error`] with a message, and the run goes on with the next case.

use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use zoo_runtime::device_map::DeviceMap;
use zoo_runtime::{DType, Tensor};
use zoo_transformers::registry::{self, Loaders};
use zoo_transformers::{
    decode_step, AutoModelForCausalLM, AutoModelForSeq2SeqLM, DecodeHistory, EncoderArgs,
    ForwardArgs, GenerationOptions, ImageArgs, LoadOptions, LogitsFor, Text2TextGenerator,
    TextGenerator,
};

use crate::case::{discover, Case, CaseDtype, CaseError, CaseSpec, CompareKind, Task};
use crate::pipeline::PipelineCase;
use crate::results::{
    record_run, BackendInfo, CaseResult, Environment, ResultsError, RunResults, Status,
};
use crate::tensor::HostTensor;

/// Architectures the harness can run: every class of zoo-transformers' registry but an
/// encoder-decoder's heads other than its encoder and its generator.
pub fn supported_architectures() -> Vec<&'static str> {
    registry::FAMILIES
        .iter()
        .flat_map(|f| f.architectures.iter().map(move |a| (f, a)))
        .filter(|(f, a)| {
            !matches!(f.loaders, Loaders::Seq2Seq { .. })
                || matches!(a.task, registry::Task::Base | registry::Task::Seq2SeqLm)
        })
        .map(|(_, a)| a.name)
        .collect()
}

/// How a case runs: which kind of model its architecture is.
#[derive(Clone, Copy, Debug)]
enum Runner {
    CausalLm,
    Seq2SeqLm,
    Encoder(registry::Task),
    Image(registry::Task),
    ImageText,
}

/// The runner for a case's architecture and task, or why there is none.
fn runner(spec: &CaseSpec) -> Result<Runner, String> {
    let unsupported = || {
        format!(
            "unsupported: zoo has no model for {} ({:?}); zoo runs {}",
            spec.architecture,
            spec.task,
            supported_architectures().join(", ")
        )
    };
    let (family, arch) = registry::by_architecture(&spec.architecture).ok_or_else(unsupported)?;
    match (&family.loaders, spec.task, arch.task) {
        (Loaders::Decoder { .. }, Task::CausalLm, registry::Task::CausalLm)
        | (Loaders::Decoder { .. }, Task::ImageTextToText, registry::Task::ImageTextToText) => {
            Ok(Runner::CausalLm)
        }
        (Loaders::Seq2Seq { .. }, Task::Text2TextGeneration, registry::Task::Seq2SeqLm) => {
            Ok(Runner::Seq2SeqLm)
        }
        (Loaders::Seq2Seq { .. }, Task::FeatureExtraction, t @ registry::Task::Base)
        | (Loaders::Decoder { .. }, Task::FeatureExtraction, t @ registry::Task::Base)
        | (Loaders::Encoder(_), Task::FeatureExtraction, t @ registry::Task::Base)
        | (Loaders::Encoder(_), Task::FillMask, t @ registry::Task::MaskedLm)
        | (
            Loaders::Encoder(_) | Loaders::Decoder { .. },
            Task::TextClassification,
            t @ registry::Task::SequenceClassification,
        )
        | (
            Loaders::Encoder(_) | Loaders::Decoder { .. },
            Task::TokenClassification,
            t @ registry::Task::TokenClassification,
        )
        | (
            Loaders::Encoder(_) | Loaders::Decoder { .. },
            Task::QuestionAnswering,
            t @ registry::Task::QuestionAnswering,
        )
        | (Loaders::Encoder(_), Task::MultipleChoice, t @ registry::Task::MultipleChoice) => {
            Ok(Runner::Encoder(t))
        }
        (Loaders::Image(_), Task::ImageFeatureExtraction, t @ registry::Task::Base)
        | (Loaders::Image(_), Task::ImageClassification, t @ registry::Task::ImageClassification) => {
            Ok(Runner::Image(t))
        }
        (Loaders::ImageText(_), Task::ZeroShotImageClassification, registry::Task::Base) => {
            Ok(Runner::ImageText)
        }
        _ => Err(unsupported()),
    }
}

/// Where a case runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Backend {
    /// candle, eager, on the host CPU.
    CandleCpu,
    /// The XLA CPU PJRT plugin, one device.
    PjrtCpu,
    /// The XLA CPU PJRT plugin, four devices in stages.
    PjrtCpuX4,
    /// The XLA CPU PJRT plugin, every layer split over a mesh of four devices (tensor
    /// parallel, the family's plan).
    PjrtCpuTp4,
    /// The XLA CPU PJRT plugin, two stages, each a tensor-parallel mesh of two devices.
    PjrtCpuTp2Pp2,
    /// A CUDA PJRT plugin.
    PjrtCuda,
    /// libtpu.
    PjrtTpu,
    /// candle, eager, on CUDA device 0 (a build with the `cuda` feature).
    CandleCuda,
}

impl Backend {
    /// Every backend, in the order runs list them.
    pub const ALL: [Backend; 8] = [
        Backend::CandleCpu,
        Backend::PjrtCpu,
        Backend::PjrtCpuX4,
        Backend::PjrtCpuTp4,
        Backend::PjrtCpuTp2Pp2,
        Backend::PjrtCuda,
        Backend::PjrtTpu,
        Backend::CandleCuda,
    ];

    /// The name used on the command line and in results.
    pub fn as_str(self) -> &'static str {
        match self {
            Backend::CandleCpu => "candle-cpu",
            Backend::PjrtCpu => "pjrt-cpu",
            Backend::PjrtCpuX4 => "pjrt-cpu-x4",
            Backend::PjrtCpuTp4 => "pjrt-cpu-tp4",
            Backend::PjrtCpuTp2Pp2 => "pjrt-cpu-tp2pp2",
            Backend::PjrtCuda => "pjrt-cuda",
            Backend::PjrtTpu => "pjrt-tpu",
            Backend::CandleCuda => "candle-cuda",
        }
    }

    /// The PJRT platform of the backend's devices.
    pub fn pjrt_device_platform(self) -> Option<zoo_runtime::PjrtPlatform> {
        use zoo_runtime::PjrtPlatform as P;
        match self {
            Backend::CandleCpu | Backend::CandleCuda => None,
            Backend::PjrtCpu
            | Backend::PjrtCpuX4
            | Backend::PjrtCpuTp4
            | Backend::PjrtCpuTp2Pp2 => Some(P::Cpu),
            Backend::PjrtCuda => Some(P::Cuda),
            Backend::PjrtTpu => Some(P::Tpu),
        }
    }

    /// Reads a name written by [`Backend::as_str`].
    pub fn parse(s: &str) -> Result<Backend, HarnessError> {
        Backend::ALL
            .into_iter()
            .find(|b| b.as_str() == s)
            .ok_or_else(|| HarnessError::UnknownBackend(s.to_string()))
    }

    /// The PJRT platform whose plugin the backend needs; `None` for candle.
    pub fn pjrt_platform(self) -> Option<&'static str> {
        match self {
            Backend::CandleCpu | Backend::CandleCuda => None,
            Backend::PjrtCpu
            | Backend::PjrtCpuX4
            | Backend::PjrtCpuTp4
            | Backend::PjrtCpuTp2Pp2 => Some("cpu"),
            Backend::PjrtCuda => Some("cuda"),
            Backend::PjrtTpu => Some("tpu"),
        }
    }

    /// The device map a model is loaded with for this backend.
    pub fn device_map(self) -> DeviceMap {
        let pjrt = |platform: &str, devices: Option<Vec<usize>>| DeviceMap::Pjrt {
            platform: platform.to_string(),
            devices,
        };
        match self {
            Backend::CandleCpu => DeviceMap::Cpu,
            Backend::PjrtCpu => pjrt("cpu", Some(vec![0])),
            Backend::PjrtCpuX4 => pjrt("cpu", Some(vec![0, 1, 2, 3])),
            Backend::PjrtCpuTp4 | Backend::PjrtCpuTp2Pp2 => DeviceMap::TensorParallel {
                platform: "cpu".into(),
                devices: Some(vec![0, 1, 2, 3]),
                tp: (self == Backend::PjrtCpuTp2Pp2).then_some(2),
            },
            Backend::PjrtCuda => pjrt("cuda", None),
            Backend::PjrtTpu => pjrt("tpu", None),
            Backend::CandleCuda => DeviceMap::Cuda(0),
        }
    }
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Reads a dtype name (`f32`, `bf16`, `f16`).
pub fn parse_dtype(s: &str) -> Result<CaseDtype, HarnessError> {
    match s {
        "f32" => Ok(CaseDtype::F32),
        "bf16" => Ok(CaseDtype::Bf16),
        "f16" => Ok(CaseDtype::F16),
        _ => Err(HarnessError::UnknownDtype(s.to_string())),
    }
}

/// Why a run could not be made or recorded (problems of one case are recorded in the run
/// instead).
#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    /// A backend name that is not one of [`Backend::ALL`].
    #[error("unknown backend `{0}`; use candle-cpu, candle-cuda, pjrt-cpu, pjrt-cpu-x4, pjrt-cpu-tp4, pjrt-cpu-tp2pp2, pjrt-cuda or pjrt-tpu")]
    UnknownBackend(String),
    /// A dtype name that is not f32, bf16 or f16.
    #[error("unknown dtype `{0}`; use f32, bf16 or f16")]
    UnknownDtype(String),
    /// A cases folder could not be listed.
    #[error(transparent)]
    Discover(#[from] CaseError),
    /// The folders hold no case.
    #[error("no case folder (a folder with case.json) under {0}")]
    NoCases(String),
    /// The results could not be written.
    #[error(transparent)]
    Results(#[from] ResultsError),
}

/// What [`run`] is asked to do besides the cases.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Backends; empty means every one of [`Backend::ALL`].
    pub backends: Vec<Backend>,
    /// Dtypes; empty means each case's own. A case whose dtype is not listed is recorded
    /// as skipped: its reference outputs were made in its own dtype only.
    pub dtypes: Vec<CaseDtype>,
    /// History folder; `None` means `<out>/history`.
    pub history: Option<PathBuf>,
    /// The run id (history file name); `None` derives one from the start time.
    pub run_id: Option<String>,
}

/// A recorded run.
#[derive(Debug, Clone)]
pub struct RunSummary {
    /// The run, with its changes against the previous run.
    pub run: RunResults,
    /// `<out>/results.json`.
    pub results_path: PathBuf,
    /// The history folder the run was added to.
    pub history_dir: PathBuf,
}

impl RunSummary {
    /// True when some result failed or errored.
    pub fn has_failures(&self) -> bool {
        self.run.results.iter().any(|r| r.status.is_bad())
    }
}

/// Runs every case found under `cases` (each a case folder or a folder of them) on the
/// asked backends and dtypes, and records the run in `out` and the history folder.
pub fn run(
    cases: &[PathBuf],
    backends: &[Backend],
    dtypes: &[CaseDtype],
    out: &Path,
) -> Result<RunSummary, HarnessError> {
    run_with(
        cases,
        out,
        &RunOptions {
            backends: backends.to_vec(),
            dtypes: dtypes.to_vec(),
            ..RunOptions::default()
        },
    )
}

/// [`run`] with every option.
pub fn run_with(
    cases: &[PathBuf],
    out: &Path,
    opts: &RunOptions,
) -> Result<RunSummary, HarnessError> {
    let (secs, millis) = now();
    let started_at = rfc3339(secs);
    let run_id = opts.run_id.clone().unwrap_or_else(|| run_id(secs, millis));
    let backends: Vec<Backend> = if opts.backends.is_empty() {
        Backend::ALL.to_vec()
    } else {
        opts.backends.clone()
    };
    let mut dirs = Vec::new();
    for root in cases {
        dirs.extend(discover(root)?);
    }
    if dirs.is_empty() {
        let roots: Vec<String> = cases.iter().map(|p| p.display().to_string()).collect();
        return Err(HarnessError::NoCases(roots.join(", ")));
    }
    let probes: BTreeMap<Backend, Probe> = backends.iter().map(|&b| (b, probe(b))).collect();
    let mut results = Vec::new();
    let mut libraries = BTreeMap::new();
    for dir in &dirs {
        run_case_dir(dir, &probes, &opts.dtypes, &mut results, &mut libraries);
    }
    let environment = environment(&probes, &results, libraries);
    let run = RunResults::new(&run_id, &started_at, environment, results);
    let history_dir = opts.history.clone().unwrap_or_else(|| out.join("history"));
    let run = record_run(run, out, &history_dir)?;
    Ok(RunSummary {
        run,
        results_path: out.join(crate::results::RESULTS_FILE),
        history_dir,
    })
}

/// What the machine offers for a backend before any model is loaded.
enum Probe {
    /// candle: always here.
    Candle,
    /// The PJRT plugin file found for the backend's platform.
    Plugin(String),
    /// No plugin: why (every place searched).
    Absent(String),
}

fn probe(backend: Backend) -> Probe {
    if backend == Backend::CandleCuda && !zoo_runtime::Device::cuda_is_available() {
        return Probe::Absent(if cfg!(feature = "cuda") {
            "no CUDA device visible to candle (driver or GPU missing)".into()
        } else {
            "this zoo was built without the `cuda` feature (cargo build --features cuda)".into()
        });
    }
    match backend.pjrt_platform() {
        None => Probe::Candle,
        // The plugin the lazy backend itself will use (ZOO_PJRT_CPU_PLUGIN, else discovery).
        Some(platform) => match backend
            .pjrt_device_platform()
            .map(zoo_runtime::lazy::plugin_identity)
        {
            Some(Ok(identity)) => Probe::Plugin(identity),
            Some(Err(e)) => {
                Probe::Absent(format!("no PJRT {platform} plugin on this machine: {e}"))
            }
            None => Probe::Absent(format!("unknown PJRT platform {platform}")),
        },
    }
}

/// Loads one case folder and runs it on every backend × dtype, appending the results.
fn run_case_dir(
    dir: &Path,
    probes: &BTreeMap<Backend, Probe>,
    dtypes: &[CaseDtype],
    results: &mut Vec<CaseResult>,
    libraries: &mut BTreeMap<String, String>,
) {
    if crate::pipeline::is_pipeline_case(dir) {
        run_pipeline_dir(dir, probes, dtypes, results, libraries);
        return;
    }
    let started = Instant::now();
    let folder = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| dir.display().to_string());
    // case.json alone first: its name, architecture and dtype label every result even
    // when the tensors are broken.
    let spec = match CaseSpec::read(dir) {
        Ok(spec) => spec,
        Err(e) => {
            for b in probes.keys() {
                results.push(CaseResult::without_outputs(
                    &folder,
                    "unknown",
                    b.as_str(),
                    "unknown",
                    Status::Error,
                    format!("case folder: {e}"),
                    started.elapsed().as_secs_f64(),
                ));
            }
            return;
        }
    };
    for (k, v) in &spec.reference.library_versions {
        libraries.entry(k.clone()).or_insert_with(|| v.clone());
    }
    let load_started = Instant::now();
    let loaded = Case::load(dir);
    let load_time = load_started.elapsed().as_secs_f64();
    let dtypes: Vec<CaseDtype> = if dtypes.is_empty() {
        vec![spec.dtype]
    } else {
        dtypes.to_vec()
    };
    for (&backend, probe) in probes {
        for &dtype in &dtypes {
            let label = |status, message: String, time_s| {
                CaseResult::without_outputs(
                    &spec.name,
                    &spec.architecture,
                    backend.as_str(),
                    dtype.as_str(),
                    status,
                    message,
                    time_s,
                )
            };
            if dtype != spec.dtype {
                results.push(label(
                    Status::Skipped,
                    format!(
                        "the reference ran in {}; no {} outputs to compare with",
                        spec.dtype.as_str(),
                        dtype.as_str()
                    ),
                    0.0,
                ));
                continue;
            }
            let case = match &loaded {
                Ok(case) => case,
                Err(e) => {
                    results.push(label(Status::Error, format!("case folder: {e}"), load_time));
                    continue;
                }
            };
            let run = match runner(&spec) {
                Ok(r) => r,
                Err(why) => {
                    results.push(label(Status::Error, why, 0.0));
                    continue;
                }
            };
            if let Probe::Absent(why) = probe {
                results.push(label(Status::NotAvailable, why.clone(), 0.0));
                continue;
            }
            results.push(run_and_judge(
                backend,
                load_time,
                || match run {
                    Runner::CausalLm => run_causal_lm(case, backend),
                    Runner::Seq2SeqLm => run_seq2seq(case, backend),
                    Runner::Encoder(task) => run_encoder(case, backend, task),
                    Runner::Image(task) => run_image(case, backend, task),
                    Runner::ImageText => run_image_text(case, backend),
                },
                |produced, time_s| judge(case, backend, produced, time_s),
                label,
            ));
        }
    }
}

/// Runs one case on `backend` (panics caught), timed with its load, and judges what it
/// produced; a backend that cannot serve it is not-available, a failure or panic an error.
fn run_and_judge<T>(
    backend: Backend,
    load_time: f64,
    run: impl FnOnce() -> Result<T, RunError>,
    judge: impl FnOnce(T, f64) -> CaseResult,
    label: impl Fn(Status, String, f64) -> CaseResult,
) -> CaseResult {
    let started = Instant::now();
    let outcome = guarded(run);
    let time_s = load_time + started.elapsed().as_secs_f64();
    // A finished case's executables are not reused by the next one (other weights, other
    // shapes); kept, a run of many cases exhausts the process's memory maps with JIT code.
    // The disk cache still serves a rerun.
    if backend.pjrt_platform().is_some() {
        zoo_runtime::lazy::clear_memory_cache();
    }
    match outcome {
        Ok(Ok(produced)) => judge(produced, time_s),
        Ok(Err(RunError::NotAvailable(why))) => label(Status::NotAvailable, why, 0.0),
        Ok(Err(RunError::Failed(why))) => label(Status::Error, why, time_s),
        Err(panic) => label(Status::Error, panic, time_s),
    }
}

/// Loads one pipeline case folder and runs it on every backend, appending the results.
/// Pipeline references are float32 only: another asked dtype is recorded as skipped.
fn run_pipeline_dir(
    dir: &Path,
    probes: &BTreeMap<Backend, Probe>,
    dtypes: &[CaseDtype],
    results: &mut Vec<CaseResult>,
    libraries: &mut BTreeMap<String, String>,
) {
    let started = Instant::now();
    let loaded = PipelineCase::load(dir);
    let load_time = started.elapsed().as_secs_f64();
    let (name, class) = match &loaded {
        Ok(case) => (case.spec.name.clone(), case.spec.pipeline.clone()),
        Err(_) => (
            dir.file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| dir.display().to_string()),
            "unknown".to_string(),
        ),
    };
    if let Ok(case) = &loaded {
        for (k, v) in &case.spec.library_versions {
            libraries.entry(k.clone()).or_insert_with(|| v.clone());
        }
    }
    let dtypes: Vec<CaseDtype> = if dtypes.is_empty() {
        vec![CaseDtype::F32]
    } else {
        dtypes.to_vec()
    };
    for (&backend, probe) in probes {
        for &dtype in &dtypes {
            let label = |status, message: String, time_s| {
                CaseResult::without_outputs(
                    &name,
                    &class,
                    backend.as_str(),
                    dtype.as_str(),
                    status,
                    message,
                    time_s,
                )
            };
            if dtype != CaseDtype::F32 {
                results.push(label(
                    Status::Skipped,
                    format!(
                        "the pipeline reference ran in f32; no {} outputs to compare with",
                        dtype.as_str()
                    ),
                    0.0,
                ));
                continue;
            }
            let case = match &loaded {
                Ok(case) => case,
                Err(e) => {
                    results.push(label(Status::Error, format!("case folder: {e}"), load_time));
                    continue;
                }
            };
            if let Probe::Absent(why) = probe {
                results.push(label(Status::NotAvailable, why.clone(), 0.0));
                continue;
            }
            if backend.pjrt_platform().is_some() {
                zoo_runtime::set_matmul_precision(zoo_runtime::Precision::Highest);
            }
            results.push(run_and_judge(
                backend,
                load_time,
                || {
                    let devices = zoo_diffusers::pipelines::devices_of(&backend.device_map())
                        .map_err(|e| RunError::NotAvailable(e.to_string()))?;
                    crate::pipeline::run(case, &devices).map_err(RunError::Failed)
                },
                |produced, time_s| judge_pipeline(case, backend, produced, time_s),
                label,
            ));
        }
    }
}

/// Compares every output a pipeline case produced with its recorded counterpart; a
/// recorded output the run did not produce is an error.
fn judge_pipeline(
    case: &PipelineCase,
    backend: Backend,
    produced: BTreeMap<String, HostTensor>,
    time_s: f64,
) -> CaseResult {
    let mut reports = Vec::new();
    let mut problems = Vec::new();
    for (name, actual) in &produced {
        match case.compare(name, actual) {
            Ok(report) => reports.push(report),
            Err(e) => problems.push(e),
        }
    }
    for missing in crate::pipeline::JUDGED
        .iter()
        .filter(|n| case.expected.contains_key(**n) && !produced.contains_key(**n))
    {
        problems.push(format!("the pipeline produced no `{missing}`"));
    }
    let mut result = CaseResult::from_outputs(
        &case.spec.name,
        &case.spec.pipeline,
        backend.as_str(),
        CaseDtype::F32.as_str(),
        reports,
        time_s,
    );
    if !problems.is_empty() {
        result.status = Status::Error;
        result.message = Some(problems.join("; "));
    }
    result
}

/// Compares every output the model produced; an expected (non-info) output it did not
/// produce makes the result an error.
fn judge(
    case: &Case,
    backend: Backend,
    produced: BTreeMap<String, HostTensor>,
    time_s: f64,
) -> CaseResult {
    let mut reports = Vec::new();
    let mut problems = Vec::new();
    for entry in &case.spec.outputs {
        let kind = entry.compare.unwrap_or(CompareKind::Allclose);
        match produced.get(&entry.name) {
            Some(actual) => match case.compare_output(&entry.name, actual) {
                Ok(report) => reports.push(report),
                Err(e) => problems.push(e.to_string()),
            },
            None if kind == CompareKind::Info => {}
            None => problems.push(format!("the model produced no `{}`", entry.name)),
        }
    }
    let mut result = CaseResult::compared(case, backend.as_str(), reports, time_s);
    if !problems.is_empty() {
        result.status = Status::Error;
        result.message = Some(problems.join("; "));
    }
    result
}

enum RunError {
    /// The backend cannot run the model here.
    NotAvailable(String),
    /// Loading or running failed.
    Failed(String),
}

/// Loads a causal-LM case's checkpoint on `backend` and produces the case's outputs:
/// a full forward (logits, hidden states, per-layer outputs), the logits of each cached
/// decode step fed the reference's tokens, and the greedy tokens of `generate`.
/// The dtype a case's checkpoint loads in; PJRT backends multiply at full precision, since
/// parity compares against PyTorch's f32 matmuls.
fn prepare(case: &Case, backend: Backend) -> DType {
    if backend.pjrt_platform().is_some() {
        zoo_runtime::set_matmul_precision(zoo_runtime::Precision::Highest);
    }
    match case.spec.dtype {
        CaseDtype::F32 => DType::F32,
        CaseDtype::Bf16 => DType::BF16,
        CaseDtype::F16 => DType::F16,
    }
}

/// Whether the checkpoint's config.json names a quantization (`quantization_config`).
fn pre_quantized(ckpt: &Path) -> bool {
    std::fs::read_to_string(ckpt.join("config.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .is_some_and(|c| c.get("quantization_config").is_some_and(|q| !q.is_null()))
}

/// A load error: not available when the backend cannot serve the map, else a failure.
fn load_error(ckpt: &Path) -> impl Fn(zoo_transformers::Error) -> RunError + '_ {
    move |e| match e {
        zoo_transformers::Error::UnsupportedDeviceMap { .. }
        | zoo_transformers::Error::DeviceUnavailable { .. } => {
            RunError::NotAvailable(e.to_string())
        }
        e => RunError::Failed(format!("load {}: {e}", ckpt.display())),
    }
}

fn input<'a>(case: &'a Case, name: &str) -> Result<&'a HostTensor, RunError> {
    case.inputs
        .get(name)
        .ok_or_else(|| RunError::Failed(format!("the case has no input `{name}`")))
}

/// An integer input of the shape of `input_ids`, if the case has it.
fn like_ids(case: &Case, name: &str, ids: &HostTensor) -> Result<Option<Vec<i64>>, RunError> {
    match case.inputs.get(name) {
        Some(m) if m.shape == ids.shape => Ok(Some(ints(m, name)?.to_vec())),
        Some(m) => Err(RunError::Failed(format!(
            "{name} has shape {:?}, input_ids {:?}",
            m.shape, ids.shape
        ))),
        None => Ok(None),
    }
}

/// Loads an encoder case's checkpoint with the head of `task` and produces its outputs:
/// `last_hidden_state`, `pooler_output`, `logits` (a question-answering head's as
/// `start_logits` and `end_logits`), `text_embeds` and the per-module outputs.
fn run_encoder(
    case: &Case,
    backend: Backend,
    task: registry::Task,
) -> Result<BTreeMap<String, HostTensor>, RunError> {
    let failed = |e: zoo_transformers::Error| RunError::Failed(format!("forward: {e}"));
    let dtype = prepare(case, backend);
    let ckpt = case.checkpoint_path();
    let opts = LoadOptions {
        dtype: Some(dtype),
        device_map: backend.device_map(),
        adapters: case.adapters(),
        ..Default::default()
    };
    let model = zoo_transformers::auto::load_encoder_with(&ckpt.to_string_lossy(), opts, task)
        .map_err(load_error(&ckpt))?;
    let ids_t = input(case, "input_ids")?;
    let device = model.device();
    let tensor =
        |v: Vec<i64>| Tensor::from_vec(v, &ids_t.shape, &device).map_err(|e| failed(e.into()));
    let ids = tensor(ints(ids_t, "input_ids")?.to_vec())?;
    let optional = |name: &str| -> Result<Option<Tensor>, RunError> {
        like_ids(case, name, ids_t)?.map(tensor).transpose()
    };
    let (mask, types, positions) = (
        optional("attention_mask")?,
        optional("token_type_ids")?,
        optional("position_ids")?,
    );
    let out = model
        .forward(EncoderArgs {
            input_ids: &ids,
            attention_mask: mask.as_ref(),
            token_type_ids: types.as_ref(),
            position_ids: positions.as_ref(),
            output_hidden_states: true,
        })
        .map_err(failed)?;
    let mut produced = BTreeMap::new();
    produced.insert(
        "last_hidden_state".into(),
        host(&out.last_hidden_state).map_err(failed)?,
    );
    // A question-answering head's logits are transformers' start_logits and end_logits.
    let (logits, start, end) = if task == registry::Task::QuestionAnswering {
        let (start, end) = out.span_logits().map_err(failed)?;
        (None, Some(start), Some(end))
    } else {
        (out.logits.clone(), None, None)
    };
    for (name, t) in [
        ("pooler_output", &out.pooler_output),
        ("logits", &logits),
        ("start_logits", &start),
        ("end_logits", &end),
        ("text_embeds", &out.embeds),
    ] {
        if let Some(t) = t {
            produced.insert(name.into(), host(t).map_err(failed)?);
        }
    }
    let modules = model.hidden_state_modules();
    module_outputs(case, modules.iter().zip(&out.hidden_states), &mut produced).map_err(failed)?;
    Ok(produced)
}

/// The case's `pixel_values` on `device`.
fn pixel_values(case: &Case, device: &zoo_runtime::Device) -> Result<Tensor, RunError> {
    let px = input(case, "pixel_values")?;
    let data = px
        .as_f32()
        .ok_or_else(|| RunError::Failed("input `pixel_values` must hold floats".into()))?;
    Tensor::from_vec(data.to_vec(), &px.shape, device)
        .map_err(|e| RunError::Failed(format!("pixel_values: {e}")))
}

/// Loads a vision case's checkpoint with the head of `task` and produces its outputs:
/// `last_hidden_state`, `pooler_output`, `logits`, `image_embeds` and the per-module outputs.
fn run_image(
    case: &Case,
    backend: Backend,
    task: registry::Task,
) -> Result<BTreeMap<String, HostTensor>, RunError> {
    let failed = |e: zoo_transformers::Error| RunError::Failed(format!("forward: {e}"));
    let dtype = prepare(case, backend);
    let ckpt = case.checkpoint_path();
    let opts = LoadOptions {
        dtype: Some(dtype),
        device_map: backend.device_map(),
        adapters: case.adapters(),
        ..Default::default()
    };
    let model =
        zoo_transformers::auto::load_image_encoder_with(&ckpt.to_string_lossy(), opts, task)
            .map_err(load_error(&ckpt))?;
    let px = pixel_values(case, &model.device())?;
    let out = model
        .forward(ImageArgs {
            pixel_values: &px,
            interpolate_pos_encoding: case.spec.interpolate_pos_encoding,
            output_hidden_states: true,
        })
        .map_err(failed)?;
    let mut produced = BTreeMap::new();
    produced.insert(
        "last_hidden_state".into(),
        host(&out.last_hidden_state).map_err(failed)?,
    );
    for (name, t) in [
        ("pooler_output", &out.pooler_output),
        ("logits", &out.logits),
        ("image_embeds", &out.embeds),
    ] {
        if let Some(t) = t {
            produced.insert(name.into(), host(t).map_err(failed)?);
        }
    }
    let modules = model.hidden_state_modules();
    module_outputs(case, modules.iter().zip(&out.hidden_states), &mut produced).map_err(failed)?;
    Ok(produced)
}

/// Loads a contrastive image-text case (`CLIPModel`) and produces `logits_per_image`,
/// `logits_per_text`, both normalized embeddings, each tower's states and the vision
/// tower's per-module outputs.
fn run_image_text(case: &Case, backend: Backend) -> Result<BTreeMap<String, HostTensor>, RunError> {
    let failed = |e: zoo_transformers::Error| RunError::Failed(format!("forward: {e}"));
    let dtype = prepare(case, backend);
    let ckpt = case.checkpoint_path();
    let opts = LoadOptions {
        dtype: Some(dtype),
        device_map: backend.device_map(),
        adapters: case.adapters(),
        ..Default::default()
    };
    let model = zoo_transformers::auto::load_image_text_with(&ckpt.to_string_lossy(), opts)
        .map_err(load_error(&ckpt))?;
    let ids_t = input(case, "input_ids")?;
    let device = model.text().device();
    let tensor =
        |v: Vec<i64>| Tensor::from_vec(v, &ids_t.shape, &device).map_err(|e| failed(e.into()));
    let ids = tensor(ints(ids_t, "input_ids")?.to_vec())?;
    let mask = like_ids(case, "attention_mask", ids_t)?
        .map(tensor)
        .transpose()?;
    let px = pixel_values(case, &model.vision().device())?;
    let out = model
        .forward(
            EncoderArgs {
                input_ids: &ids,
                attention_mask: mask.as_ref(),
                token_type_ids: None,
                position_ids: None,
                output_hidden_states: false,
            },
            ImageArgs {
                pixel_values: &px,
                interpolate_pos_encoding: case.spec.interpolate_pos_encoding,
                output_hidden_states: true,
            },
        )
        .map_err(failed)?;
    let mut produced = BTreeMap::new();
    let vision = &out.vision_model_output;
    for (name, t) in [
        ("logits_per_image", Some(&out.logits_per_image)),
        ("logits_per_text", Some(&out.logits_per_text)),
        ("text_embeds", Some(&out.text_embeds)),
        ("image_embeds", Some(&out.image_embeds)),
        (
            "text_model_output.last_hidden_state",
            Some(&out.text_model_output.last_hidden_state),
        ),
        (
            "vision_model_output.last_hidden_state",
            Some(&vision.last_hidden_state),
        ),
        (
            "vision_model_output.pooler_output",
            vision.pooler_output.as_ref(),
        ),
    ] {
        if let Some(t) = t {
            produced.insert(name.into(), host(t).map_err(failed)?);
        }
    }
    let modules = model.vision().hidden_state_modules();
    module_outputs(
        case,
        modules.iter().zip(&vision.hidden_states),
        &mut produced,
    )
    .map_err(failed)?;
    Ok(produced)
}

/// The per-module outputs a case lists (`<module>.output`), from `(module, output)` pairs:
/// a model's `hidden_state_modules` zipped with its hidden states, or its `module_outputs`.
fn module_outputs<'a>(
    case: &Case,
    outputs: impl IntoIterator<Item = (&'a String, &'a Tensor)>,
    out: &mut BTreeMap<String, HostTensor>,
) -> Result<(), zoo_transformers::Error> {
    for (module, h) in outputs {
        let name = format!("{module}.output");
        if case.output_entry(&name).is_some() {
            out.insert(name, host(h)?);
        }
    }
    Ok(())
}

fn run_causal_lm(case: &Case, backend: Backend) -> Result<BTreeMap<String, HostTensor>, RunError> {
    let failed = |what: &str| {
        let what = what.to_string();
        move |e: zoo_transformers::Error| RunError::Failed(format!("{what}: {e}"))
    };
    let dtype = prepare(case, backend);
    let ckpt = case.checkpoint_path();
    let mut builder =
        AutoModelForCausalLM::builder(&ckpt.to_string_lossy()).device_map(backend.device_map());
    for adapter in case.adapters() {
        builder = builder.adapter(adapter);
    }
    // An f32 case of a quantized GGUF or compressed-tensors checkpoint runs as zoo runs the
    // file by default: blocks kept on the eager CPU, products computed in f32 from them (the
    // dequantized matrix, summed in another order), so the parity cases cover the block
    // kernels.
    let quantized = case.spec.checkpoint.format == "gguf" || pre_quantized(&ckpt);
    if !(dtype == DType::F32 && quantized) {
        builder = builder.dtype(dtype);
    }
    let model = builder.load().map_err(load_error(&ckpt))?;
    let ids_t = input(case, "input_ids")?;
    let ids = ints(ids_t, "input_ids")?;
    let [b, t] = ids_t.shape[..] else {
        return Err(RunError::Failed(format!(
            "input_ids has shape {:?}; expected [batch, seq]",
            ids_t.shape
        )));
    };
    let mask: Vec<i64> = like_ids(case, "attention_mask", ids_t)?.unwrap_or_else(|| vec![1; b * t]);
    let positions: Vec<i64> = match like_ids(case, "position_ids", ids_t)? {
        Some(p) => p,
        // transformers' generate: cumsum(mask) - 1, 0 on padding.
        None => mask
            .chunks(t.max(1))
            .flat_map(|row| {
                let mut n = -1;
                row.iter()
                    .map(|&m| {
                        n += i64::from(m != 0);
                        if m != 0 {
                            n
                        } else {
                            0
                        }
                    })
                    .collect::<Vec<_>>()
            })
            .collect(),
    };
    let mut out = BTreeMap::new();
    let images = match case.inputs.get("pixel_values") {
        Some(_) => Some(pixel_values(case, &model.load_report().device)?),
        None => None,
    };
    if let Some(px) = &images {
        let failed = failed("image features");
        let vision =
            zoo_transformers::vision_language::vision_of(model.model()).map_err(&failed)?;
        let features = vision.image_features(px).map_err(&failed)?;
        out.insert("image_features".into(), host(&features).map_err(failed)?);
    }
    full_forward(case, &model, ids, &mask, &positions, (b, t), &mut out)?;
    let gen_ids = case.expected.get("generated_ids");
    if let Some(g) = gen_ids.filter(|g| g.shape.len() != 2 || g.shape[0] != b) {
        return Err(RunError::Failed(format!(
            "generated_ids has shape {:?}; expected [{b}, new_tokens] for {b} prompts",
            g.shape
        )));
    }
    if let Some(gen_ids) = gen_ids.filter(|_| case.output_entry("generated_logits").is_some()) {
        let steps = gen_ids.shape[1];
        let gen_ids = ints(gen_ids, "generated_ids")?;
        let logits = decode_steps(&model, ids, &mask, &positions, (b, t), gen_ids, steps)
            .map_err(failed("cached decode"))?;
        out.insert("generated_logits".into(), logits);
    }
    if let Some(gen) = &case.spec.generation {
        let steps = gen_ids.and_then(|g| g.shape.get(1).copied());
        let tokens = generate(&model, ids, &mask, (b, t), gen, steps, images.as_ref())?;
        out.insert("generated_ids".into(), tokens);
    }
    Ok(out)
}

/// An encoder-decoder case: the encoder's output, the decoder's logits over
/// `decoder_input_ids` in one pass, one cached step per reference token, and greedy
/// `generate` from the unpadded prompts.
fn run_seq2seq(case: &Case, backend: Backend) -> Result<BTreeMap<String, HostTensor>, RunError> {
    let failed = |what: &'static str| {
        move |e: zoo_transformers::Error| RunError::Failed(format!("{what}: {e}"))
    };
    let dtype = prepare(case, backend);
    let ckpt = case.checkpoint_path();
    let model = case
        .adapters()
        .into_iter()
        .fold(
            AutoModelForSeq2SeqLM::builder(&ckpt.to_string_lossy())
                .device_map(backend.device_map())
                .dtype(dtype),
            |b, a| b.adapter(a),
        )
        .load()
        .map_err(load_error(&ckpt))?;
    let lm = model.model();
    let ids_t = input(case, "input_ids")?;
    let ids = ints(ids_t, "input_ids")?;
    let [b, t] = ids_t.shape[..] else {
        return Err(RunError::Failed(format!(
            "input_ids has shape {:?}; expected [batch, seq]",
            ids_t.shape
        )));
    };
    let mask: Vec<i64> = like_ids(case, "attention_mask", ids_t)?.unwrap_or_else(|| vec![1; b * t]);
    let to = |v: Vec<i64>, shape: &[usize], device: &zoo_runtime::Device| {
        Tensor::from_vec(v, shape, device).map_err(|e| failed("inputs")(e.into()))
    };
    let cpu = zoo_runtime::Device::Cpu;
    let input_ids = to(ids.to_vec(), &[b, t], &lm.device())?;
    let mask_t = to(mask.clone(), &[b, t], &cpu)?;
    let encoded = lm
        .encode(EncoderArgs {
            input_ids: &input_ids,
            attention_mask: Some(&mask_t),
            token_type_ids: None,
            position_ids: None,
            output_hidden_states: false,
        })
        .map_err(failed("encoder"))?;
    let hidden = &encoded.last_hidden_state;
    let mut out = BTreeMap::new();
    out.insert(
        "encoder_last_hidden_state".into(),
        host(hidden).map_err(failed("encoder"))?,
    );
    // The decoder over `decoder_input_ids` at once, then token by token with the cache.
    let dec_t = input(case, "decoder_input_ids")?;
    let dec = ints(dec_t, "decoder_input_ids")?;
    let [db, n] = dec_t.shape[..] else {
        return Err(RunError::Failed(format!(
            "decoder_input_ids has shape {:?}; expected [batch, steps]",
            dec_t.shape
        )));
    };
    if db != b || n == 0 {
        return Err(RunError::Failed(format!(
            "decoder_input_ids has shape {:?}; expected [{b}, steps >= 1]",
            dec_t.shape
        )));
    }
    let decode = |tokens: Vec<i64>,
                  first: usize,
                  steps: usize,
                  cache: &mut zoo_transformers::KvCache,
                  which| {
        let pos: Vec<i64> = (0..b)
            .flat_map(|_| (first..first + steps).map(|p| p as i64))
            .collect();
        let ids = to(tokens, &[b, steps], &cpu)?;
        let pos = to(pos, &[b, steps], &cpu)?;
        let args = ForwardArgs {
            input_ids: &ids,
            position_ids: &pos,
            attention_mask: None,
            output_hidden_states: false,
            inputs_embeds: None,
        };
        lm.decode(args, hidden, Some(&mask_t), cache, which)
            .map_err(failed("decoder"))
    };
    let mut cache = lm.new_cache(b, n).map_err(failed("decoder"))?;
    let logits = decode(dec.to_vec(), 0, n, &mut cache, LogitsFor::All)?;
    out.insert("logits".into(), host(&logits).map_err(failed("decoder"))?);
    let mut cache = lm.new_cache(b, n).map_err(failed("cached decode"))?;
    let mut per_step = Vec::with_capacity(n);
    for s in 0..n {
        let column: Vec<i64> = (0..b).map(|r| dec[r * n + s]).collect();
        let step = decode(column, s, 1, &mut cache, LogitsFor::Last)?;
        per_step.push(host(&step).map_err(failed("cached decode"))?);
    }
    let vocab = per_step[0].shape.last().copied().unwrap_or(0);
    let mut data = Vec::with_capacity(b * n * vocab);
    for r in 0..b {
        for step in &per_step {
            let row = step
                .as_f32()
                .ok_or_else(|| RunError::Failed("logits are not f32".into()))?;
            data.extend_from_slice(&row[r * vocab..(r + 1) * vocab]);
        }
    }
    out.insert(
        "generated_logits".into(),
        HostTensor::f32(vec![b, n, vocab], data),
    );
    if let Some(gen) = &case.spec.generation {
        let steps = case
            .expected
            .get("generated_ids")
            .and_then(|g| g.shape.get(1).copied());
        out.insert(
            "generated_ids".into(),
            generate_seq2seq(&model, ids, &mask, (b, t), gen, steps)?,
        );
    }
    Ok(out)
}

/// Greedy seq2seq `generate` on the unpadded prompts (rows that stop early padded with -1).
fn generate_seq2seq(
    model: &Text2TextGenerator,
    ids: &[i64],
    mask: &[i64],
    (b, t): (usize, usize),
    gen: &crate::case::GenerationSpec,
    steps: Option<usize>,
) -> Result<HostTensor, RunError> {
    let prompts = unpadded(ids, mask, (b, t))?;
    let opts = GenerationOptions {
        max_new_tokens: gen.max_new_tokens,
        min_new_tokens: gen.min_new_tokens,
        eos_token_ids: eos_of(gen),
        ..Default::default()
    };
    let start = match gen.decoder_start_token_id {
        Some(id) => u32::try_from(id).map_err(|_| {
            RunError::Failed(format!("decoder_start_token_id {id} is not a token id"))
        })?,
        None => model.decoder_start_token_id(),
    };
    let pad = gen
        .pad_token_id
        .and_then(|p| u32::try_from(p).ok())
        .unwrap_or(model.pad_token_id());
    let (outs, _) = zoo_transformers::generate_seq2seq(
        model.model(),
        model.tokenizer(),
        &prompts,
        &opts,
        model.eos_token_ids(),
        pad,
        start,
        |_| true,
    )
    .map_err(|e| RunError::Failed(format!("generate: {e}")))?;
    Ok(token_table(&outs, steps))
}

fn ints<'a>(t: &'a HostTensor, name: &str) -> Result<&'a [i64], RunError> {
    t.as_i64()
        .ok_or_else(|| RunError::Failed(format!("input `{name}` must hold integers")))
}

fn host(t: &Tensor) -> Result<HostTensor, zoo_transformers::Error> {
    let data = t.to_dtype(DType::F32)?.to_vec::<f32>()?;
    Ok(HostTensor::f32(t.shape().to_vec(), data))
}

fn mask_rows(mask: &[i64], t: usize) -> Vec<Vec<bool>> {
    mask.chunks(t.max(1))
        .map(|r| r.iter().map(|&m| m != 0).collect())
        .collect()
}

/// Forward over the whole input, no cache: `logits`, `last_hidden_state` and
/// `model.embed_tokens.output` / `model.layers.{i}.output`.
fn full_forward(
    case: &Case,
    model: &TextGenerator,
    ids: &[i64],
    mask: &[i64],
    positions: &[i64],
    (b, t): (usize, usize),
    out: &mut BTreeMap<String, HostTensor>,
) -> Result<(), RunError> {
    let failed = |e: zoo_transformers::Error| RunError::Failed(format!("forward: {e}"));
    let device = model.load_report().device;
    let lm = model.model();
    let input = Tensor::from_vec(ids.to_vec(), &[b, t], &device).map_err(|e| failed(e.into()))?;
    // A vision-language case: its images' features over the image tokens.
    let images = match case.inputs.get("pixel_values") {
        Some(_) => Some(pixel_values(case, &device)?),
        None => None,
    };
    let embeds = match &images {
        Some(px) => {
            let host_ids = Tensor::from_vec(ids.to_vec(), &[b, t], &zoo_runtime::Device::Cpu)
                .map_err(|e| failed(e.into()))?;
            Some(
                zoo_transformers::vision_language::inputs_embeds(lm, &host_ids, px)
                    .map_err(failed)?,
            )
        }
        None => None,
    };
    let pos =
        Tensor::from_vec(positions.to_vec(), &[b, t], &device).map_err(|e| failed(e.into()))?;
    let rows = mask_rows(mask, t);
    let mut cache = lm.model().new_cache(b, t).map_err(failed)?;
    let args = ForwardArgs {
        input_ids: &input,
        position_ids: &pos,
        attention_mask: Some(&rows),
        output_hidden_states: true,
        inputs_embeds: embeds.as_ref(),
    };
    let (logits, states) = lm
        .forward(args, &mut cache, LogitsFor::All)
        .map_err(failed)?;
    out.insert("logits".into(), host(&logits).map_err(failed)?);
    out.insert(
        "last_hidden_state".into(),
        host(&states.last_hidden_state).map_err(failed)?,
    );
    // hidden_states: the embeddings, then each layer's output; the last entry is the
    // normed output, already `last_hidden_state`.
    let modules = lm.model().hidden_state_modules();
    module_outputs(case, modules.iter().zip(&states.hidden_states), out).map_err(failed)?;
    let extra = states.module_outputs.iter().map(|(m, t)| (m, t));
    module_outputs(case, extra, out).map_err(failed)
}

/// Prefill, then one cached step per reference token: the logits of every step,
/// `[batch, steps, vocab]`.
fn decode_steps(
    model: &TextGenerator,
    ids: &[i64],
    mask: &[i64],
    positions: &[i64],
    (b, t): (usize, usize),
    gen_ids: &[i64],
    steps: usize,
) -> Result<HostTensor, zoo_transformers::Error> {
    let device = model.load_report().device;
    let lm = model.model();
    let input = Tensor::from_vec(ids.to_vec(), &[b, t], &device)?;
    let pos = Tensor::from_vec(positions.to_vec(), &[b, t], &device)?;
    let rows = mask_rows(mask, t);
    let real: Vec<i64> = rows
        .iter()
        .map(|r| r.iter().filter(|&&m| m).count() as i64)
        .collect();
    let mut cache = lm.model().new_cache(b, t + steps)?;
    let args = ForwardArgs {
        input_ids: &input,
        position_ids: &pos,
        attention_mask: Some(&rows),
        output_hidden_states: false,
        inputs_embeds: None,
    };
    let (mut logits, _) = lm.forward(args, &mut cache, LogitsFor::Last)?;
    // The steps run as `generate` runs them, a whole-sequence recompute included.
    let mut history = DecodeHistory::new(ids, positions, &rows, t, 0);
    let mut per_step: Vec<Vec<f32>> = Vec::with_capacity(steps);
    let mut vocab = 0;
    for s in 0..steps {
        vocab = *logits.shape().last().unwrap_or(&0);
        per_step.push(logits.to_dtype(DType::F32)?.to_vec::<f32>()?);
        if s + 1 == steps {
            break;
        }
        let next: Vec<i64> = (0..b).map(|r| gen_ids[r * steps + s]).collect();
        let p: Vec<i64> = real.iter().map(|&n| n + s as i64).collect();
        history.push(&next, &p);
        logits = decode_step(lm, &mut cache, &history)?;
    }
    // per_step[s] is [b, vocab]; the reference stores [b, steps, vocab].
    let mut data = Vec::with_capacity(b * steps * vocab);
    for r in 0..b {
        for step in &per_step {
            data.extend_from_slice(&step[r * vocab..(r + 1) * vocab]);
        }
    }
    Ok(HostTensor::f32(vec![b, steps, vocab], data))
}

/// Greedy `generate` on the unpadded prompts; rows shorter than the reference (an early
/// eos) are padded with -1 so the token metrics show where they diverge.
fn generate(
    model: &TextGenerator,
    ids: &[i64],
    mask: &[i64],
    (b, t): (usize, usize),
    gen: &crate::case::GenerationSpec,
    steps: Option<usize>,
    images: Option<&Tensor>,
) -> Result<HostTensor, RunError> {
    let failed = |e: zoo_transformers::Error| RunError::Failed(format!("generate: {e}"));
    let prompts = unpadded(ids, mask, (b, t))?;
    let opts = GenerationOptions {
        max_new_tokens: gen.max_new_tokens,
        min_new_tokens: gen.min_new_tokens,
        eos_token_ids: eos_of(gen),
        ..Default::default()
    };
    // Each prompt takes the next images, as many as its image tokens fill.
    let mut embeds = Vec::with_capacity(prompts.len());
    let mut next = 0;
    for p in &prompts {
        let Some(px) = images else {
            embeds.push(None);
            continue;
        };
        let vision = zoo_transformers::vision_language::vision_of(model.model()).map_err(failed)?;
        let token = vision.image_token_id();
        let n = p.iter().filter(|&&t| t == token).count() / vision.tokens_per_image().max(1);
        let mine = px.narrow(0, next, n).map_err(|e| failed(e.into()))?;
        next += n;
        embeds.push(Some(
            zoo_transformers::vision_language::prompt_embeds(model.model(), p, &mine)
                .map_err(failed)?,
        ));
    }
    let (outs, _) = model
        .generate_ids_embedded(&prompts, embeds, &opts, |_| true)
        .map_err(failed)?;
    Ok(token_table(&outs, steps))
}

/// The real tokens of each row of `ids [b, t]` (where `mask` is not 0).
fn unpadded(ids: &[i64], mask: &[i64], (b, t): (usize, usize)) -> Result<Vec<Vec<u32>>, RunError> {
    (0..b)
        .map(|r| {
            (0..t)
                .filter(|&i| mask[r * t + i] != 0)
                .map(|i| u32::try_from(ids[r * t + i]))
                .collect::<Result<Vec<u32>, _>>()
        })
        .collect::<Result<_, _>>()
        .map_err(|_| RunError::Failed("input_ids holds an id outside 0..2^32".into()))
}

/// The case's eos ids, when it names them.
fn eos_of(gen: &crate::case::GenerationSpec) -> Option<Vec<u32>> {
    gen.eos_token_id.as_ref().map(|e| {
        e.to_vec()
            .into_iter()
            .filter_map(|i| u32::try_from(i).ok())
            .collect()
    })
}

/// The generated ids as `[rows, width]`, rows shorter than `width` (an early eos) padded
/// with -1 so the token metrics show where they diverge.
fn token_table(outs: &[zoo_transformers::GenerationOutput], steps: Option<usize>) -> HostTensor {
    let width = steps.unwrap_or_else(|| outs.iter().map(|o| o.token_ids.len()).max().unwrap_or(0));
    let mut data = Vec::with_capacity(outs.len() * width);
    for o in outs {
        let row: Vec<i64> = o.token_ids.iter().map(|&i| i64::from(i)).collect();
        data.extend(row.iter().copied().chain(std::iter::repeat(-1)).take(width));
    }
    HostTensor::i64(vec![outs.len(), width], data)
}

/// Runs `f`, turning a panic into `Err("panicked: <message>")` so one case cannot end
/// the run.
fn guarded<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    catch_unwind(AssertUnwindSafe(f)).map_err(|panic| {
        let message = if let Some(s) = panic.downcast_ref::<&str>() {
            s.to_string()
        } else if let Some(s) = panic.downcast_ref::<String>() {
            s.clone()
        } else {
            "a panic without a message".to_string()
        };
        format!("panicked: {message}")
    })
}

/// The run's environment: per backend whether any case ran there (and why not otherwise).
fn environment(
    probes: &BTreeMap<Backend, Probe>,
    results: &[CaseResult],
    libraries: BTreeMap<String, String>,
) -> Environment {
    let mut env = Environment {
        commit: std::env::var("ZOO_COMMIT")
            .or_else(|_| std::env::var("GITHUB_SHA"))
            .ok()
            .filter(|c| !c.is_empty()),
        zoo_version: Some(env!("CARGO_PKG_VERSION").to_string()),
        host: Some(format!(
            "{} {}",
            std::env::consts::OS,
            std::env::consts::ARCH
        )),
        libraries,
        ..Environment::default()
    };
    for (&b, probe) in probes {
        let mine: Vec<&CaseResult> = results.iter().filter(|r| r.backend == b.as_str()).collect();
        let absent = mine.iter().find(|r| r.status == Status::NotAvailable);
        let ran = mine
            .iter()
            .any(|r| matches!(r.status, Status::Passed | Status::Failed));
        let plugin = match probe {
            Probe::Plugin(identity) => Some(format!("plugin {identity}")),
            Probe::Candle | Probe::Absent(_) => None,
        };
        let why = match (ran, absent) {
            (true, _) => None,
            (false, Some(r)) => r.message.clone(),
            (false, None) => Some("no case ran on it in this run".into()),
        };
        let detail = match (plugin, why) {
            (Some(p), Some(w)) => Some(format!("{p}; {w}")),
            (p, w) => p.or(w),
        };
        let info = BackendInfo {
            available: ran,
            version: None,
            detail,
        };
        env.backends.insert(b.as_str().to_string(), info);
    }
    env
}

fn now() -> (u64, u32) {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    (d.as_secs(), d.subsec_millis())
}

/// (year, month, day, hour, minute, second) of a Unix time, UTC.
fn civil(secs: u64) -> (i64, u32, u32, u64, u64, u64) {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Howard Hinnant's days-to-civil.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day, rem / 3600, rem % 3600 / 60, rem % 60)
}

fn rfc3339(secs: u64) -> String {
    let (y, mo, d, h, mi, s) = civil(secs);
    format!("{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}Z")
}

/// Sortable and a safe file name; milliseconds keep two runs in one second apart.
fn run_id(secs: u64, millis: u32) -> String {
    let (y, mo, d, h, mi, s) = civil(secs);
    format!("{y:04}-{mo:02}-{d:02}T{h:02}-{mi:02}-{s:02}.{millis:03}Z")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backends_parse_back_and_reject_unknown_names() {
        for b in Backend::ALL {
            assert_eq!(Backend::parse(b.as_str()).unwrap(), b);
        }
        assert!(matches!(
            Backend::parse("pjrt-gpu"),
            Err(HarnessError::UnknownBackend(_))
        ));
        assert!(parse_dtype("f64").is_err());
        assert_eq!(parse_dtype("bf16").unwrap(), CaseDtype::Bf16);
    }

    #[cfg(not(feature = "cuda"))]
    #[test]
    fn candle_cuda_on_a_build_without_the_feature_is_not_available_and_says_how_to_build() {
        assert_eq!(Backend::CandleCuda.device_map(), DeviceMap::Cuda(0));
        match probe(Backend::CandleCuda) {
            Probe::Absent(why) => assert!(why.contains("--features cuda"), "{why}"),
            _ => panic!("candle-cuda probed as available without the cuda feature"),
        }
    }

    #[test]
    fn a_panic_becomes_an_error_message() {
        assert_eq!(guarded(|| 7), Ok(7));
        let err = guarded(|| -> u8 { panic!("bad shape {}", 3) }).unwrap_err();
        assert_eq!(err, "panicked: bad shape 3");
        let err = guarded(|| std::panic::panic_any(5u8)).unwrap_err();
        assert_eq!(err, "panicked: a panic without a message");
    }

    #[test]
    fn timestamps_are_utc_calendar_dates() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        // 2024-02-29 12:34:56 UTC, a leap day.
        assert_eq!(rfc3339(1_709_210_096), "2024-02-29T12:34:56Z");
        assert_eq!(run_id(1_709_210_096, 7), "2024-02-29T12-34-56.007Z");
    }
}
