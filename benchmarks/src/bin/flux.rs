//! A FluxTransformer2DModel shaped like FLUX.1 at reduced width and depth (random weights,
//! 4 heads of 64, 2 double-stream and 4 single-stream blocks, guidance embedding), one
//! denoising step for a 256x256 image (256 packed latent tokens) with 128 text tokens, in f32
//! and in bf16: zoo on candle CPU, on the XLA CPU plugin and split over 4 of its devices,
//! beside diffusers on PyTorch CPU in the same dtype, the same checkpoint, inputs and thread
//! count, all measured in this run; peak RSS of each zoo backend.
//! Every side is measured in each of `ROUNDS` (2) alternating rounds and each figure is its
//! best over them, so a burst of other load on the host slows no side alone.
//!
//! The checkpoint is written once by `nightly/reference/flux_bench.py --write` into
//! `.cache/zoo-assets/flux-reduced`, or read from `ZOO_FLUX_BENCH_DIR`.
//!
//! Targets (judged under `--check`), per dtype: seconds per step <= 0.8x PyTorch's (1.25x its
//! speed) on candle CPU and on the XLA CPU plugin; the 4-device split within 1.15x one
//! device's time.
//!
//! Run: `scripts/bench.sh [--check]`, or `cargo run --release --manifest-path
//! benchmarks/Cargo.toml --bin flux -- [--check] [--threads 2] [--runs 3]`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use zoo_benchmarks::{
    folded, keep_faster, peak_rss, python_figures, reset_peak_rss, FluxStep, Table, Target,
    FLUX_TEXT, ROUNDS,
};
use zoo_diffusers::FluxTransformer2DModel;
use zoo_runtime::{lazy, DType, Device, PjrtDevice, PjrtPlatform};

const HELP: &str = "\
flux: a FLUX.1-shaped transformer at reduced width and depth, one step at 256x256 in f32 and
bf16, beside diffusers in the same dtype

USAGE: flux [--check] [--threads N] [--runs N] [--dtypes f32,bf16]

  --check       exit 1 when a target is missed or cannot be judged
  --threads N   threads on every side (default 2)
  --runs N      timed steps per figure, best kept (default 3)
  --dtypes L    comma-separated dtypes to measure, each on every side (default f32,bf16)
  --new N, --prefill N   accepted and unused (scripts/bench.sh passes its flags to every benchmark)

Environment: ZOO_FLUX_BENCH_DIR (default .cache/zoo-assets/flux-reduced, written by
nightly/reference/flux_bench.py --write when missing), ZOO_PJRT_CPU_PLUGIN (the XLA CPU
plugin; its rows are skipped without it), PYTHON (default .venv/bin/python).";

struct Args {
    threads: usize,
    runs: usize,
    dtypes: Vec<DType>,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        threads: 2,
        runs: 3,
        dtypes: vec![DType::F32, DType::BF16],
    };
    let mut unused = 0;
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let slot = match flag.as_str() {
            "--check" => continue,
            "-h" | "--help" => {
                println!("{HELP}");
                std::process::exit(0);
            }
            "--threads" => &mut a.threads,
            "--runs" => &mut a.runs,
            "--dtypes" => {
                let list = it.next().ok_or("--dtypes needs a list, e.g. f32,bf16")?;
                a.dtypes = list
                    .split(',')
                    .map(|d| match d.trim() {
                        "f32" | "float32" => Ok(DType::F32),
                        "bf16" | "bfloat16" => Ok(DType::BF16),
                        other => Err(format!("--dtypes: {other:?} is not f32 or bf16")),
                    })
                    .collect::<Result<_, _>>()?;
                continue;
            }
            "--new" | "--prefill" => &mut unused,
            other => return Err(format!("unknown argument {other:?}; see --help")),
        };
        *slot = zoo_benchmarks::positive(&mut it, &flag)?;
    }
    Ok(a)
}

fn checkpoint() -> Result<PathBuf, String> {
    zoo_benchmarks::reference_checkpoint(
        "ZOO_FLUX_BENCH_DIR",
        "flux-reduced",
        "config.json",
        "nightly/reference/flux_bench.py",
    )
}

/// Text tokens of the benchmark's prompt.
const TEXT: usize = FLUX_TEXT;

/// Best seconds per transformer call on `devices` (split over them when several) over `runs`
/// calls after a warm-up (which, on PJRT, compiles), and the peak RSS of the load and calls.
fn zoo_step(
    dir: &Path,
    dtype: DType,
    devices: &[Device],
    runs: usize,
) -> Result<(f64, u64), String> {
    reset_peak_rss();
    let model =
        FluxTransformer2DModel::from_pretrained_split(&dir.to_string_lossy(), dtype, devices)
            .map_err(|e| format!("zoo cannot load {}: {e}", dir.display()))?;
    let inputs = FluxStep::new(&devices[0], dtype)?;
    let step = || -> Result<f64, String> {
        let t0 = Instant::now();
        let out = inputs.run(&model)?;
        out.to_vec_f64().map_err(|e| e.to_string())?;
        Ok(t0.elapsed().as_secs_f64())
    };
    step()?;
    let mut best = f64::INFINITY;
    for _ in 0..runs {
        best = best.min(step()?);
    }
    Ok((best, peak_rss()))
}

fn torch(dir: &Path, dtype: DType, a: &Args) -> Result<f64, String> {
    let v = python_figures(
        "nightly/reference/flux_bench.py",
        &[
            "--model-dir".into(),
            dir.display().to_string(),
            "--dtype".into(),
            dtype.to_string(),
            "--threads".into(),
            a.threads.to_string(),
            "--runs".into(),
            a.runs.to_string(),
            "--text".into(),
            TEXT.to_string(),
        ],
    )?;
    v["seconds_per_step"]
        .as_f64()
        .map(|s| s * 1e3)
        .ok_or("PyTorch printed no seconds_per_step".into())
}

/// The XLA CPU plugin's device `ordinal`.
fn xla(ordinal: usize) -> Device {
    Device::Pjrt(PjrtDevice::new(PjrtPlatform::Cpu, ordinal))
}

fn run() -> Result<ExitCode, String> {
    let a = parse_args()?;
    std::env::set_var("RAYON_NUM_THREADS", a.threads.to_string());
    let dir = checkpoint()?;
    let plugin = std::env::var_os("ZOO_PJRT_CPU_PLUGIN").filter(|v| !v.is_empty());
    eprintln!(
        "measuring (each figure best of {} steps in each of {ROUNDS} alternating rounds)...",
        a.runs
    );
    let mut t = Table::new(format!(
        "FluxTransformer2DModel, FLUX.1 shape at 4x64 heads, 2 double + 4 single blocks, 256x256 image (256 latent + {TEXT} text tokens), {} threads; all in this run",
        a.threads
    ));
    let n = a.dtypes.len();
    let mut peer = vec![None; n];
    let (mut cpu, mut one, mut four) = (
        vec![f64::INFINITY; n],
        vec![f64::INFINITY; n],
        vec![f64::INFINITY; n],
    );
    let mut rss = Vec::new();
    for round in 0..ROUNDS {
        // The first round's candle CPU rows run before the plugin is loaded, so their peak
        // RSS is theirs alone.
        for (i, &dtype) in a.dtypes.iter().enumerate() {
            keep_faster(&mut peer[i], torch(&dir, dtype, &a));
            let (s, bytes) = zoo_step(&dir, dtype, &[Device::Cpu], a.runs)?;
            cpu[i] = cpu[i].min(s);
            if round == 0 {
                rss.push((format!("candle CPU, {dtype}"), bytes));
            }
        }
        let Some(plugin) = &plugin else { continue };
        if round == 0 {
            lazy::configure(PjrtPlatform::Cpu, Some(PathBuf::from(plugin)), Some(4))
                .map_err(|e| e.to_string())?;
        }
        for (i, &dtype) in a.dtypes.iter().enumerate() {
            let (s, bytes) = zoo_step(&dir, dtype, &[xla(0)], a.runs)?;
            one[i] = one[i].min(s);
            if round == 0 {
                rss.push((format!("XLA CPU plugin, {dtype}"), bytes));
            }
            let (s, _) = zoo_step(&dir, dtype, &[xla(0), xla(1), xla(2), xla(3)], a.runs)?;
            four[i] = four[i].min(s);
        }
    }
    for (i, &dtype) in a.dtypes.iter().enumerate() {
        let name = format!("diffusers (PyTorch) {dtype}");
        t.add(
            format!("one step, {dtype}, candle CPU"),
            "ms",
            cpu[i] * 1e3,
            &name,
            folded(&peer[i]),
            Some(Target::AtMost(0.8)),
        );
    }
    for (i, &dtype) in a.dtypes.iter().enumerate().filter(|_| plugin.is_some()) {
        let name = format!("diffusers (PyTorch) {dtype}");
        t.add(
            format!("one step, {dtype}, XLA CPU plugin"),
            "ms",
            one[i] * 1e3,
            &name,
            folded(&peer[i]),
            Some(Target::AtMost(0.8)),
        );
        t.add(
            format!("one step, {dtype}, split over 4 XLA CPU devices"),
            "ms",
            four[i] * 1e3,
            format!("one XLA CPU device, {dtype}"),
            Ok(one[i] * 1e3),
            Some(Target::AtMost(1.15)),
        );
    }
    let failures = t.print();
    if plugin.is_some() {
        zoo_benchmarks::print_xla_plugin();
    }
    for (what, bytes) in rss {
        println!("  peak RSS, {what}: {:.0} MiB", bytes as f64 / 1048576.0);
    }
    Ok(zoo_benchmarks::exit_status(failures))
}

fn main() -> ExitCode {
    zoo_benchmarks::main_of("flux", run)
}
