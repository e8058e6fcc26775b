//! A UNet2DConditionModel with Stable Diffusion 1.5's block layout at reduced width (random
//! weights, block_out_channels 64/128/256/256, 37.5M parameters), one denoising step on a
//! batch of 2 (classifier-free guidance) 64x64 latents with 77 text positions: zoo on candle
//! CPU and on the XLA CPU plugin beside diffusers on PyTorch CPU, the same checkpoint, inputs
//! and thread count, all measured in this run; peak RSS of each zoo backend.
//! Every side is measured in each of `ROUNDS` (2) alternating rounds and each figure is its
//! best over them, so a burst of other load on the host slows no side alone.
//!
//! The checkpoint is written once by `nightly/reference/unet_bench.py --write` into
//! `.cache/zoo-assets/unet-sd15-layout`, or read from `ZOO_UNET_BENCH_DIR`.
//!
//! Targets (judged under `--check`): seconds per step <= 0.8x PyTorch's, on candle CPU and on
//! the XLA CPU plugin.
//!
//! Run: `scripts/bench.sh [--check]`, or `cargo run --release --manifest-path
//! benchmarks/Cargo.toml --bin unet -- [--check] [--threads 2] [--runs 3]`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use zoo_benchmarks::{
    folded, keep_faster, peak_rss, python_figures, reset_peak_rss, Table, Target, ROUNDS,
};
use zoo_diffusers::{UNet2DConditionInput, UNet2DConditionModel};
use zoo_runtime::{lazy, DType, Device, PjrtDevice, PjrtPlatform, Tensor};

const HELP: &str = "\
unet: an SD 1.5-layout UNet at reduced width, one step at 64x64 latents, batch 2, beside diffusers

USAGE: unet [--check] [--threads N] [--runs N]

  --check       exit 1 when a target is missed or cannot be judged
  --threads N   threads on every side (default 2)
  --runs N      timed steps per figure, best kept (default 3)
  --new N, --prefill N   accepted and unused (scripts/bench.sh passes its flags to every benchmark)

Environment: ZOO_UNET_BENCH_DIR (default .cache/zoo-assets/unet-sd15-layout, written by
nightly/reference/unet_bench.py --write when missing), ZOO_PJRT_CPU_PLUGIN (the XLA CPU
plugin; its row is skipped without it), PYTHON (default .venv/bin/python).";

struct Args {
    threads: usize,
    runs: usize,
}

fn parse_args() -> Result<Args, String> {
    let (threads, runs) = zoo_benchmarks::threads_and_runs(HELP)?;
    Ok(Args { threads, runs })
}

fn checkpoint() -> Result<PathBuf, String> {
    zoo_benchmarks::reference_checkpoint(
        "ZOO_UNET_BENCH_DIR",
        "unet-sd15-layout",
        "config.json",
        "nightly/reference/unet_bench.py",
    )
}

/// Best seconds per UNet call on `device` over `runs` calls after a warm-up (which, on PJRT,
/// compiles), and the peak RSS of the load and the calls.
fn zoo_step(dir: &Path, device: Device, runs: usize) -> Result<(f64, u64), String> {
    reset_peak_rss();
    let unet = UNet2DConditionModel::from_pretrained(&dir.to_string_lossy(), DType::F32, &device)
        .map_err(|e| format!("zoo cannot load {}: {e}", dir.display()))?;
    let z = |shape: &[usize]| Tensor::zeros(shape, DType::F32, &device).map_err(|e| e.to_string());
    let sample = z(&[2, 4, 64, 64])?;
    let context = z(&[2, 77, 768])?;
    let step = || -> Result<f64, String> {
        let t =
            Tensor::from_f64s(&[500.0], &[1], DType::F32, &device).map_err(|e| e.to_string())?;
        let t0 = Instant::now();
        let out = unet
            .forward(UNet2DConditionInput {
                sample: &sample,
                timestep: &t,
                encoder_hidden_states: &context,
                class_labels: None,
                timestep_cond: None,
                text_embeds: None,
                time_ids: None,
            })
            .map_err(|e| e.to_string())?;
        out.to_vec::<f32>().map_err(|e| e.to_string())?;
        Ok(t0.elapsed().as_secs_f64())
    };
    step()?;
    let mut best = f64::INFINITY;
    for _ in 0..runs {
        best = best.min(step()?);
    }
    Ok((best, peak_rss()))
}

fn torch(dir: &Path, a: &Args) -> Result<f64, String> {
    let v = python_figures(
        "nightly/reference/unet_bench.py",
        &[
            "--model-dir".into(),
            dir.display().to_string(),
            "--threads".into(),
            a.threads.to_string(),
            "--runs".into(),
            a.runs.to_string(),
        ],
    )?;
    v["seconds_per_step"]
        .as_f64()
        .map(|s| s * 1e3)
        .ok_or("PyTorch printed no seconds_per_step".into())
}

fn run() -> Result<ExitCode, String> {
    let a = parse_args()?;
    std::env::set_var("RAYON_NUM_THREADS", a.threads.to_string());
    let dir = checkpoint()?;
    eprintln!(
        "measuring (each figure best of {} steps in each of {ROUNDS} alternating rounds)...",
        a.runs
    );
    let plugin = std::env::var_os("ZOO_PJRT_CPU_PLUGIN").filter(|v| !v.is_empty());
    let (mut peer, mut cpu, mut xla, mut cpu_rss, mut xla_rss) = (None, f64::INFINITY, None, 0, 0);
    for round in 0..ROUNDS {
        keep_faster(&mut peer, torch(&dir, &a));
        let (s, bytes) = zoo_step(&dir, Device::Cpu, a.runs)?;
        cpu = cpu.min(s);
        if round == 0 {
            // Measured before the plugin is loaded: candle CPU's peak RSS alone.
            cpu_rss = bytes;
        }
        if let Some(plugin) = &plugin {
            if round == 0 {
                lazy::configure(PjrtPlatform::Cpu, Some(PathBuf::from(plugin)), Some(1))
                    .map_err(|e| e.to_string())?;
            }
            let d = Device::Pjrt(PjrtDevice::new(PjrtPlatform::Cpu, 0));
            let (s, bytes) = zoo_step(&dir, d, a.runs)?;
            xla = Some(xla.map_or(s, |x: f64| x.min(s)));
            if round == 0 {
                xla_rss = bytes;
            }
        }
    }
    let torch = folded(&peer);
    let mut t = Table::new(format!(
        "UNet2DConditionModel, SD 1.5 layout at width 64/128/256/256 (37.5M parameters), f32, 64x64 latents, batch 2, {} threads; all in this run",
        a.threads
    ));
    t.add(
        "one step, candle CPU",
        "ms",
        cpu * 1e3,
        "diffusers (PyTorch)",
        torch.clone(),
        Some(Target::AtMost(0.8)),
    );
    if let Some(x) = xla {
        t.add(
            "one step, XLA CPU plugin",
            "ms",
            x * 1e3,
            "diffusers (PyTorch)",
            torch,
            Some(Target::AtMost(0.8)),
        );
    }
    let failures = t.print();
    if xla.is_some() {
        zoo_benchmarks::print_xla_plugin();
    }
    println!(
        "  peak RSS, candle CPU: {:.0} MiB",
        cpu_rss as f64 / 1048576.0
    );
    if xla.is_some() {
        println!(
            "  peak RSS, with the XLA CPU plugin: {:.0} MiB",
            xla_rss as f64 / 1048576.0
        );
    }
    Ok(zoo_benchmarks::exit_status(failures))
}

fn main() -> ExitCode {
    zoo_benchmarks::main_of("unet", run)
}
