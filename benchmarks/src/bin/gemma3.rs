//! Gemma 3 270M, the Q4_K_M GGUF as shipped: zoo on candle CPU beside llama.cpp's `llama-bench`
//! on the same file, the same thread count and prompt lengths, both in this run.
//!
//! The file mixes Q8_0 (the tied embedding), Q5_0, Q4_K and Q6_K matrices; zoo keeps each as
//! its blocks and multiplies in f32 from them, llama.cpp from its integer kernels. Targets
//! (`--check` fails when one is missed): decode >= 1.0x llama.cpp, prefill >= 1.5x at the AVX2
//! tier (1.0x above it).
//!
//! Run: `scripts/bench.sh`, or with `ZOO_GEMMA3_GGUF` and `LLAMA_BENCH` set: `cargo run
//! --release --manifest-path benchmarks/Cargo.toml --bin gemma3 -- [--threads 2] [--new 48]
//! [--prefill 512] [--runs 3]`.

use std::path::PathBuf;
use std::process::ExitCode;

use zoo_benchmarks::{gguf_rows, positive, Table, ROUNDS};

const HELP: &str = "\
gemma3: Gemma 3 270M Q4_K_M beside llama.cpp on the same file (same run)

USAGE: gemma3 [--check] [--threads N] [--new N] [--prefill N] [--runs N]

  --check       exit 1 when a target (decode >= 1.0x, prefill >= 1.5x llama.cpp at avx2) is missed
  --threads N   threads on both sides (default 2)
  --new N       greedy tokens timed after the first (default 48)
  --prefill N   prompt tokens of the prefill forward (default 512)
  --runs N      runs per figure, best kept (default 3)

Environment: ZOO_GEMMA3_GGUF (the joined file, from scripts/fetch-test-assets.sh),
LLAMA_BENCH (a llama-bench binary; optional). scripts/bench.sh sets them.";

fn run() -> Result<ExitCode, String> {
    let (mut threads, mut new, mut prefill, mut runs) = (2, 48, 512, 3);
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "--check" => {}
            "-h" | "--help" => {
                println!("{HELP}");
                return Ok(ExitCode::SUCCESS);
            }
            "--threads" => threads = positive(&mut it, &flag)?,
            "--new" => new = positive(&mut it, &flag)?,
            "--prefill" => prefill = positive(&mut it, &flag)?,
            "--runs" => runs = positive(&mut it, &flag)?,
            other => return Err(format!("unknown argument {other:?}; see --help")),
        }
    }
    std::env::set_var("RAYON_NUM_THREADS", threads.to_string());
    let gguf = std::env::var_os("ZOO_GEMMA3_GGUF")
        .map(PathBuf::from)
        .ok_or("ZOO_GEMMA3_GGUF is not set: run through scripts/bench.sh, which sets it")?;
    eprintln!(
        "measuring Gemma 3 270M (each figure best of {runs} runs in each of {ROUNDS} rounds alternating with llama.cpp)..."
    );
    let bandwidth = zoo_benchmarks::read_bandwidth(threads) / 1e9;
    let mut t = Table::new(format!(
        "Gemma 3 270M, {threads} threads, {new} greedy tokens, {prefill}-token prefill; both in this run"
    ));
    gguf_rows(
        &mut t,
        "Q4_K_M",
        &gguf,
        (threads, prefill, new, runs),
        bandwidth,
    )?;
    let failures = t.print();
    Ok(zoo_benchmarks::exit_status(failures))
}

fn main() -> ExitCode {
    zoo_benchmarks::main_of("gemma3", run)
}
