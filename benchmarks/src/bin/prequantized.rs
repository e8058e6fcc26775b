//! SmolLM2-135M as the pre-quantized checkpoints people download — W4A16 and W8A16
//! (compressed-tensors, as llm-compressor saves them) and FP8 with 128x128 blocks
//! (transformers' `fp8`, as DeepSeek's and Qwen's FP8 releases) — beside the same model's Q4_0
//! and Q8_0 GGUFs, all on zoo's CPU path in this run: prefill and decode tok/s against the GGUF
//! of the same width, and peak RSS of load + decode against the checkpoint's file size.
//!
//! `benchmarks/prequantize.py` writes the checkpoints once into
//! `.cache/zoo-assets/smollm2-prequantized` (or `ZOO_SMOLLM2_PREQUANTIZED`) from the f32 folder
//! (`ZOO_SMOLLM2_F32_DIR`); `benchmarks/requantize_gguf.py` the GGUFs (as for `quants`).
//! Target (`--check` fails when one is missed): peak RSS <= 1.3x the file for each checkpoint.
//!
//! Run: `scripts/bench.sh`, or with `ZOO_SMOLLM2_GGUF`, `ZOO_SMOLLM2_F32_DIR` and `PYTHON`
//! set: `cargo run --release --manifest-path benchmarks/Cargo.toml --bin prequantized --
//! [--threads 2] [--new 48] [--prefill 512] [--runs 3]`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use zoo_benchmarks::{peak_rss, positive, reset_peak_rss, zoo_figures, Table, Target};
use zoo_runtime::device_map::DeviceMap;
use zoo_transformers::AutoModelForCausalLM;

const HELP: &str = "\
prequantized: SmolLM2-135M as W4A16, W8A16 (compressed-tensors) and FP8 (128x128 blocks) beside
its Q4_0 and Q8_0 GGUFs on zoo (same run): tok/s, and peak RSS against the file size

USAGE: prequantized [--check] [--threads N] [--new N] [--prefill N] [--runs N]

  --check       exit 1 when a target (peak RSS <= 1.3x the file) is missed
  --threads N   threads (default 2)
  --new N       greedy tokens timed after the first (default 48)
  --prefill N   prompt tokens of the prefill forward (default 512)
  --runs N      runs per figure, best kept (default 3)

Environment: ZOO_SMOLLM2_GGUF, ZOO_SMOLLM2_F32_DIR (scripts/fetch-test-assets.sh --bench),
PYTHON (the reference venv's python, which writes the checkpoints once). scripts/bench.sh
sets them.";

struct Args {
    threads: usize,
    new: usize,
    prefill: usize,
    runs: usize,
}

fn parse() -> Result<Option<Args>, String> {
    let mut a = Args {
        threads: 2,
        new: 48,
        prefill: 512,
        runs: 3,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "--check" => {}
            "-h" | "--help" => {
                println!("{HELP}");
                return Ok(None);
            }
            "--threads" => a.threads = positive(&mut it, "--threads")?,
            "--new" => a.new = positive(&mut it, "--new")?,
            "--prefill" => a.prefill = positive(&mut it, "--prefill")?,
            "--runs" => a.runs = positive(&mut it, "--runs")?,
            other => return Err(format!("unknown argument {other:?}; see --help")),
        }
    }
    Ok(Some(a))
}

/// The bytes of a checkpoint's weight files.
fn file_bytes(path: &Path) -> u64 {
    if path.is_file() {
        return std::fs::metadata(path).map_or(0, |m| m.len());
    }
    std::fs::read_dir(path)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            name.ends_with(".safetensors") || name.ends_with(".gguf")
        })
        .map(|e| e.metadata().map_or(0, |m| m.len()))
        .sum()
}

/// (prefill tok/s, decode tok/s, peak RSS of the load and a decode, in bytes, resident
/// weight bytes, whether blocks were kept).
fn measure(path: &Path, a: &Args) -> Result<(f64, f64, u64, u64, bool), String> {
    reset_peak_rss();
    let model = AutoModelForCausalLM::builder(&path.to_string_lossy())
        .device_map(DeviceMap::Cpu)
        .load()
        .map_err(|e| format!("zoo cannot load {}: {e}", path.display()))?;
    let prompt = "The capital of France is";
    let report = model.load_report().clone();
    // Load and one decode first: the peak RSS a user's generation sees.
    let (_, decode) = zoo_figures(&model, prompt, 1, a.new, a.runs);
    let rss = peak_rss();
    let (prefill, _) = zoo_figures(&model, prompt, a.prefill, 1, a.runs);
    Ok((
        prefill,
        decode,
        rss,
        report.weight_bytes,
        report.blocks_kept,
    ))
}

fn run() -> Result<ExitCode, String> {
    let Some(a) = parse()? else {
        return Ok(ExitCode::SUCCESS);
    };
    std::env::set_var("RAYON_NUM_THREADS", a.threads.to_string());
    std::env::var_os("ZOO_SMOLLM2_F32_DIR")
        .ok_or("ZOO_SMOLLM2_F32_DIR is not set: run through scripts/bench.sh, which sets it")?;
    let checkpoints = zoo_benchmarks::reference_checkpoint(
        "ZOO_SMOLLM2_PREQUANTIZED",
        "smollm2-prequantized",
        "fp8/model.safetensors",
        "benchmarks/prequantize.py",
    )?;
    let ggufs = zoo_benchmarks::reference_checkpoint(
        "ZOO_SMOLLM2_REQUANTIZED",
        "smollm2-requantized",
        "SmolLM2-135M-Instruct.Q8_0.gguf",
        "benchmarks/requantize_gguf.py",
    )?;
    let gguf = |kind: &str| ggufs.join(format!("SmolLM2-135M-Instruct.{kind}.gguf"));
    let mib = |b: u64| b as f64 / 1048576.0;
    let mut t = Table::new(format!(
        "SmolLM2-135M-Instruct pre-quantized vs GGUF on zoo, {} threads, {} greedy tokens, {}-token prefill; all in this run",
        a.threads, a.new, a.prefill
    ));
    let peers: Vec<_> = ["Q4_0", "Q8_0"]
        .into_iter()
        .map(|kind| {
            eprintln!("measuring the {kind} GGUF...");
            (kind, measure(&gguf(kind), &a))
        })
        .collect();
    for (label, folder, peer) in [
        ("W4A16 (compressed-tensors)", "w4a16", "Q4_0"),
        ("W8A16 (compressed-tensors)", "w8a16", "Q8_0"),
        ("FP8 128x128 blocks", "fp8", "Q8_0"),
    ] {
        eprintln!("measuring {label}...");
        let path: PathBuf = checkpoints.join(folder);
        let (pf, dec, rss, resident, kept) = measure(&path, &a)?;
        let peer_of = |i: usize| {
            peers
                .iter()
                .find(|(k, _)| *k == peer)
                .map(|(_, r)| r)
                .expect("measured")
                .as_ref()
                .map(|p| if i == 0 { p.0 } else { p.1 })
                .map_err(Clone::clone)
        };
        let held = if kept { "blocks kept" } else { "dequantized" };
        t.add(
            format!("{label} decode ({held}, {:.0} MiB)", mib(resident)),
            "tok/s",
            dec,
            format!("{peer} GGUF"),
            peer_of(1),
            None,
        );
        t.add(
            format!("{label} prefill"),
            "tok/s",
            pf,
            format!("{peer} GGUF"),
            peer_of(0),
            None,
        );
        t.add(
            format!("{label} peak RSS, load + decode"),
            "MiB",
            mib(rss),
            "file size",
            Ok(mib(file_bytes(&path))),
            Some(Target::AtMost(1.3)),
        );
    }
    for (kind, r) in &peers {
        if let Ok((_, _, rss, _, _)) = r {
            t.add(
                format!("{kind} GGUF peak RSS, load + decode"),
                "MiB",
                mib(*rss),
                "file size",
                Ok(mib(file_bytes(&gguf(kind)))),
                None,
            );
        }
    }
    let failures = t.print();
    Ok(zoo_benchmarks::exit_status(failures))
}

fn main() -> ExitCode {
    zoo_benchmarks::main_of("prequantized", run)
}
