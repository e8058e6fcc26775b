//! SmolLM2-135M in each legacy GGUF block type: zoo on candle CPU beside llama.cpp's
//! `llama-bench` on the same file, the same thread count and prompt lengths, both in this run.
//!
//! The shipped file stores its matrices as Q4_1; `benchmarks/requantize_gguf.py` (gguf-py, in
//! the reference venv) writes the same model with them as Q4_0, Q5_0, Q5_1 and Q8_0 into
//! `.cache/zoo-assets/smollm2-requantized` (or the folder `ZOO_SMOLLM2_REQUANTIZED` names).
//! The embedding (Q8_0, tied to the output) and the norms stay as stored. zoo multiplies in
//! f32 from the blocks, llama.cpp from its integer kernels. Targets (`--check` fails when one
//! is missed): decode >= 1.0x llama.cpp and prefill >= 1.5x at the AVX2 tier (1.0x above it)
//! for every type. Gemma 3's Q4_K_M file (benchmark `gemma3`) covers the K-quants.
//!
//! Run: `scripts/bench.sh`, or with `ZOO_SMOLLM2_GGUF`, `PYTHON` and `LLAMA_BENCH` set: `cargo
//! run --release --manifest-path benchmarks/Cargo.toml --bin quants -- [--threads 2] [--new 48]
//! [--prefill 512] [--runs 3] [--types q4_0,q8_0]`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use zoo_benchmarks::{positive, Table, ROUNDS};

const HELP: &str = "\
quants: SmolLM2-135M in Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 beside llama.cpp on the same files (same run)

USAGE: quants [--check] [--threads N] [--new N] [--prefill N] [--runs N] [--types LIST]

  --check       exit 1 when a target (decode >= 1.0x, prefill >= 1.5x llama.cpp at avx2) is missed
  --threads N   threads on both sides (default 2)
  --new N       greedy tokens timed after the first (default 48)
  --prefill N   prompt tokens of the prefill forward (default 512)
  --runs N      runs per figure, best kept (default 3)
  --types LIST  comma-separated block types (default q4_0,q4_1,q5_0,q5_1,q8_0)

Environment: ZOO_SMOLLM2_GGUF (the shipped Q4_1 file, from scripts/fetch-test-assets.sh),
PYTHON (the reference venv's python, which writes the other types once), LLAMA_BENCH (a
llama-bench binary; optional). scripts/bench.sh sets them.";

/// The block types measured; Q4_1 is the shipped file, the others are written from it.
const TYPES: [&str; 5] = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"];

struct Args {
    threads: usize,
    new: usize,
    prefill: usize,
    runs: usize,
    types: Vec<&'static str>,
}

fn parse() -> Result<Option<Args>, String> {
    let mut a = Args {
        threads: 2,
        new: 48,
        prefill: 512,
        runs: 3,
        types: TYPES.to_vec(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "--check" => {}
            "-h" | "--help" => {
                println!("{HELP}");
                return Ok(None);
            }
            "--threads" => a.threads = positive(&mut it, &flag)?,
            "--new" => a.new = positive(&mut it, &flag)?,
            "--prefill" => a.prefill = positive(&mut it, &flag)?,
            "--runs" => a.runs = positive(&mut it, &flag)?,
            "--types" => {
                let list = it.next().ok_or("--types needs a list, e.g. q4_0,q8_0")?;
                a.types = list
                    .split(',')
                    .map(|s| {
                        TYPES
                            .into_iter()
                            .find(|t| t.eq_ignore_ascii_case(s.trim()))
                            .ok_or(format!("--types: {s:?} is not one of {}", TYPES.join(", ")))
                    })
                    .collect::<Result<_, _>>()?;
            }
            other => return Err(format!("unknown argument {other:?}; see --help")),
        }
    }
    Ok(Some(a))
}

/// The file of block type `kind`: the shipped one for Q4_1, else the requantized copy.
fn file(shipped: &Path, kind: &str) -> Result<PathBuf, String> {
    if kind == "Q4_1" {
        return Ok(shipped.to_path_buf());
    }
    let dir = zoo_benchmarks::reference_checkpoint(
        "ZOO_SMOLLM2_REQUANTIZED",
        "smollm2-requantized",
        "SmolLM2-135M-Instruct.Q8_0.gguf",
        "benchmarks/requantize_gguf.py",
    )?;
    let path = dir.join(format!("SmolLM2-135M-Instruct.{kind}.gguf"));
    if path.exists() {
        Ok(path)
    } else {
        Err(format!(
            "{} is missing: delete {} to write the files again",
            path.display(),
            dir.display()
        ))
    }
}

fn run() -> Result<ExitCode, String> {
    let Some(a) = parse()? else {
        return Ok(ExitCode::SUCCESS);
    };
    std::env::set_var("RAYON_NUM_THREADS", a.threads.to_string());
    let shipped = std::env::var_os("ZOO_SMOLLM2_GGUF")
        .map(PathBuf::from)
        .ok_or("ZOO_SMOLLM2_GGUF is not set: run through scripts/bench.sh, which sets it")?;
    let bandwidth = zoo_benchmarks::read_bandwidth(a.threads) / 1e9;
    let mut t = Table::new(format!(
        "SmolLM2-135M-Instruct by block type (embedding Q8_0 in each), {} threads, {} greedy tokens, {}-token prefill; both in this run",
        a.threads, a.new, a.prefill
    ));
    for kind in &a.types {
        let gguf = file(&shipped, kind)?;
        eprintln!(
            "measuring {kind} (each figure best of {} runs in each of {ROUNDS} rounds alternating with llama.cpp)...",
            a.runs
        );
        zoo_benchmarks::gguf_rows(
            &mut t,
            kind,
            &gguf,
            (a.threads, a.prefill, a.new, a.runs),
            bandwidth,
        )?;
    }
    let failures = t.print();
    Ok(zoo_benchmarks::exit_status(failures))
}

fn main() -> ExitCode {
    zoo_benchmarks::main_of("quants", run)
}
