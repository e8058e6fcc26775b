//! A random-weight Mixtral (8 experts, top-2, about 330M parameters in f32), zoo on candle CPU
//! beside transformers on PyTorch CPU: the same checkpoint, dtype, prompt ids and thread count,
//! both measured in this run.
//!
//! The checkpoint is written once by `nightly/reference/mixtral_bench.py --write` (transformers'
//! own init, seeded) into `.cache/zoo-assets/mixtral-random-330m`, or read from
//! `ZOO_MIXTRAL_DIR`. The figure is greedy decode tok/s after the first token over a 16-token
//! prompt, eos suppressed, the best of `--runs`; zoo's experts run over exactly the tokens
//! routed to them, as transformers' expert loop does.
//!
//! Target (judged under `--check`, which exits 1 when it is missed or cannot be judged):
//! decode >= 1.5x PyTorch.
//!
//! Run: `scripts/bench.sh [--check]`, or `cargo run --release --manifest-path
//! benchmarks/Cargo.toml --bin mixtral -- [--check] [--threads 2] [--new 32] [--runs 3]`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use zoo_benchmarks::{best_of, python_figures, Table, Target};
use zoo_runtime::device_map::DeviceMap;
use zoo_transformers::{AutoModelForCausalLM, GenerationOptions};

const HELP: &str = "\
mixtral: a random 330M-parameter Mixtral (8 experts, top-2) beside PyTorch (same run)

USAGE: mixtral [--check] [--threads N] [--new N] [--runs N]

  --check       exit 1 when the target is missed or cannot be judged (PyTorch missing)
  --threads N   threads on both sides (default 2)
  --new N       greedy tokens timed after the first (default 32)
  --runs N      runs per figure, best kept (default 3)
  --prefill N   accepted and unused (scripts/bench.sh passes its flags to every benchmark)

Environment: ZOO_MIXTRAL_DIR (the checkpoint; default .cache/zoo-assets/mixtral-random-330m,
written by nightly/reference/mixtral_bench.py --write when missing), PYTHON (the reference
venv's interpreter; default .venv/bin/python).";

struct Args {
    threads: usize,
    new: usize,
    runs: usize,
    prefill: usize,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        threads: 2,
        new: 32,
        runs: 3,
        prefill: 0,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let slot = match flag.as_str() {
            "--check" => continue,
            "-h" | "--help" => {
                println!("{HELP}");
                std::process::exit(0);
            }
            "--threads" => &mut a.threads,
            "--new" => &mut a.new,
            "--runs" => &mut a.runs,
            "--prefill" => &mut a.prefill,
            other => return Err(format!("unknown argument {other:?}; see --help")),
        };
        *slot = zoo_benchmarks::positive(&mut it, &flag)?;
    }
    Ok(a)
}

/// The checkpoint folder, written by the Python script when it does not exist yet (into a
/// sibling first, renamed when complete).
fn checkpoint() -> Result<PathBuf, String> {
    zoo_benchmarks::reference_checkpoint(
        "ZOO_MIXTRAL_DIR",
        "mixtral-random-330m",
        "model.safetensors",
        "nightly/reference/mixtral_bench.py",
    )
}

/// The prompt both sides run: 100 + 37 i for 16 positions.
fn prompt() -> Vec<u32> {
    (0..16).map(|i| 100 + 37 * i).collect()
}

fn zoo_decode(dir: &Path, a: &Args) -> Result<f64, String> {
    let model = AutoModelForCausalLM::builder(&dir.to_string_lossy())
        .device_map(DeviceMap::Cpu)
        .load()
        .map_err(|e| format!("zoo cannot load {}: {e}", dir.display()))?;
    let prompts = [prompt()];
    let warm = GenerationOptions {
        min_new_tokens: 4,
        ..GenerationOptions::greedy(4)
    };
    model
        .generate_ids(&prompts, &warm, |_| true)
        .map_err(|e| e.to_string())?;
    let opts = GenerationOptions {
        min_new_tokens: a.new + 1,
        ..GenerationOptions::greedy(a.new + 1)
    };
    let mut err = None;
    let best = best_of(a.runs, || {
        match model.generate_ids(&prompts, &opts, |_| true) {
            Ok((_, stats)) => stats.decode_tokens_per_second(),
            Err(e) => {
                err = Some(e.to_string());
                0.0
            }
        }
    });
    match err {
        Some(e) => Err(e),
        None => Ok(best),
    }
}

fn torch(dir: &Path, a: &Args) -> Result<f64, String> {
    let v = python_figures(
        "nightly/reference/mixtral_bench.py",
        &[
            "--model-dir".into(),
            dir.display().to_string(),
            "--threads".into(),
            a.threads.to_string(),
            "--new".into(),
            a.new.to_string(),
            "--runs".into(),
            a.runs.to_string(),
        ],
    )?;
    v["decode_tok_s"]
        .as_f64()
        .ok_or("PyTorch printed no decode_tok_s".into())
}

fn run() -> Result<ExitCode, String> {
    let a = parse_args()?;
    std::env::set_var("RAYON_NUM_THREADS", a.threads.to_string());
    let dir = checkpoint()?;
    eprintln!("measuring (each figure best of {} runs)...", a.runs);
    let zoo = zoo_decode(&dir, &a)?;
    let torch = torch(&dir, &a);
    let mut t = Table::new(format!(
        "random Mixtral, 8 experts top-2, 330M parameters, f32, {} threads, {} greedy tokens; both in this run",
        a.threads, a.new
    ));
    t.add(
        "f32 decode, candle CPU",
        "tok/s",
        zoo,
        "PyTorch",
        torch,
        Some(Target::AtLeast(1.5)),
    );
    let failures = t.print();
    Ok(zoo_benchmarks::exit_status(failures))
}

fn main() -> ExitCode {
    zoo_benchmarks::main_of("mixtral", run)
}
