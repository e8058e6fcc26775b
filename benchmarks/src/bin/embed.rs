//! Sentence embeddings: all-MiniLM-L6-v2 (the real folder, `ZOO_MINILM_DIR`), an
//! MPNet-shaped encoder (all-mpnet-base-v2's shape, random weights, 110M parameters) and a
//! ModernBERT-shaped one (ModernBERT-base's shape, random weights, 149M parameters) through
//! zoo's `SentenceEmbedder` on candle CPU beside sentence-transformers on PyTorch CPU, the
//! same folders, sentences and thread count, all measured in this run: sentences per second
//! encoding one sentence and a batch of 32.
//! Every side is measured in each of `ROUNDS` (2) alternating rounds and each figure is its
//! best over them, so a burst of other load on the host slows no side alone.
//!
//! The random folders are written once by `nightly/reference/embed_bench.py --write` into
//! `.cache/zoo-assets/mpnet-base-shape` and `modernbert-base-shape`, or read from
//! `ZOO_MPNET_BENCH_DIR` and `ZOO_MODERNBERT_BENCH_DIR`.
//!
//! Targets (judged under `--check`): at a batch of 32, >= 1.5x sentence-transformers'
//! sentences per second for every model.
//!
//! Run: `scripts/bench.sh [--check]`, or `cargo run --release --manifest-path
//! benchmarks/Cargo.toml --bin embed -- [--check] [--threads 2] [--runs 3]`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use zoo_benchmarks::{folded, keep_faster, python_figures, Table, Target, ROUNDS};
use zoo_transformers::sentence::SentenceEmbedder;
use zoo_transformers::LoadOptions;

const HELP: &str = "\
embed: MiniLM, MPNet- and ModernBERT-shaped sentence encoders, batch 1 and 32, beside sentence-transformers

USAGE: embed [--check] [--threads N] [--runs N]

  --check       exit 1 when a target is missed or cannot be judged
  --threads N   threads on every side (default 2)
  --runs N      timed encodes per figure, best kept (default 3)
  --new N, --prefill N   accepted and unused (scripts/bench.sh passes its flags to every benchmark)

Environment: ZOO_MINILM_DIR (all-MiniLM-L6-v2, from scripts/fetch-test-assets.sh),
ZOO_MPNET_BENCH_DIR and ZOO_MODERNBERT_BENCH_DIR (default .cache/zoo-assets/mpnet-base-shape
and modernbert-base-shape, written by nightly/reference/embed_bench.py --write when missing),
PYTHON (default .venv/bin/python).";

/// Sentences per batch.
const BATCH: usize = 32;

struct Args {
    threads: usize,
    runs: usize,
}

fn parse_args() -> Result<Args, String> {
    let (threads, runs) = zoo_benchmarks::threads_and_runs(HELP)?;
    Ok(Args { threads, runs })
}

/// `BATCH` sentences of 6 to 37 words, as search queries and passages run.
fn sentences() -> Vec<String> {
    const WORDS: [&str; 16] = [
        "the",
        "model",
        "reads",
        "a",
        "sentence",
        "and",
        "writes",
        "one",
        "vector",
        "for",
        "search",
        "over",
        "many",
        "documents",
        "in",
        "seconds",
    ];
    (0..BATCH)
        .map(|i| {
            let n = 6 + (i * 7) % 32;
            (0..n)
                .map(|j| WORDS[(i * 3 + j * 5) % WORDS.len()])
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect()
}

/// zoo's best sentences per second on one sentence and on the batch.
fn zoo_rates(dir: &Path, sentences: &[&str], runs: usize) -> Result<(f64, f64), String> {
    let embedder =
        SentenceEmbedder::load_pretrained(&dir.to_string_lossy(), LoadOptions::default())
            .map_err(|e| format!("zoo cannot load {}: {e}", dir.display()))?;
    let rate = |batch: &[&str]| -> Result<f64, String> {
        embedder.embed(batch).map_err(|e| e.to_string())?;
        let mut best = f64::INFINITY;
        for _ in 0..runs {
            let t0 = Instant::now();
            embedder.embed(batch).map_err(|e| e.to_string())?;
            best = best.min(t0.elapsed().as_secs_f64());
        }
        Ok(batch.len() as f64 / best)
    };
    Ok((rate(&sentences[..1])?, rate(sentences)?))
}

fn torch_rates(dir: &Path, file: &Path, a: &Args) -> Result<(f64, f64), String> {
    let v = python_figures(
        "nightly/reference/embed_bench.py",
        &[
            "--model-dir".into(),
            dir.display().to_string(),
            "--sentences".into(),
            file.display().to_string(),
            "--threads".into(),
            a.threads.to_string(),
            "--runs".into(),
            a.runs.to_string(),
        ],
    )?;
    let get = |k: &str| {
        v[k].as_f64()
            .ok_or_else(|| format!("sentence-transformers printed no {k}"))
    };
    Ok((get("batch1_per_s")?, get("batch_per_s")?))
}

fn run() -> Result<ExitCode, String> {
    let a = parse_args()?;
    std::env::set_var("RAYON_NUM_THREADS", a.threads.to_string());
    let minilm = std::env::var_os("ZOO_MINILM_DIR")
        .map(PathBuf::from)
        .ok_or("ZOO_MINILM_DIR is unset: eval \"$(scripts/fetch-test-assets.sh)\" first")?;
    let mpnet = zoo_benchmarks::reference_checkpoint(
        "ZOO_MPNET_BENCH_DIR",
        "mpnet-base-shape",
        "modules.json",
        "nightly/reference/embed_bench.py",
    )?;
    let modernbert = zoo_benchmarks::reference_checkpoint_with(
        "ZOO_MODERNBERT_BENCH_DIR",
        "modernbert-base-shape",
        "modules.json",
        "nightly/reference/embed_bench.py",
        &["--shape", "modernbert"],
    )?;
    let owned = sentences();
    let sentences: Vec<&str> = owned.iter().map(String::as_str).collect();
    let file = std::env::temp_dir().join(format!("zoo-embed-bench-{}.json", std::process::id()));
    std::fs::write(
        &file,
        serde_json::to_string(&owned).map_err(|e| e.to_string())?,
    )
    .map_err(|e| format!("{}: {e}", file.display()))?;
    eprintln!(
        "measuring (each figure best of {} encodes in each of {ROUNDS} alternating rounds)...",
        a.runs
    );
    let mut t = Table::new(format!(
        "sentence embeddings, f32, candle CPU, {} threads, {BATCH} sentences of 6 to 37 words; all in this run",
        a.threads
    ));
    for (name, dir) in [
        ("all-MiniLM-L6-v2", minilm.as_path()),
        ("MPNet-shaped (all-mpnet-base-v2's shape)", mpnet.as_path()),
        (
            "ModernBERT-shaped (ModernBERT-base's shape)",
            modernbert.as_path(),
        ),
    ] {
        let (mut peer_one, mut peer_many) = (None, None);
        let (mut one, mut many) = (0f64, 0f64);
        for _ in 0..ROUNDS {
            match torch_rates(dir, &file, &a) {
                Ok((o, m)) => {
                    keep_faster(&mut peer_one, Ok(1.0 / o));
                    keep_faster(&mut peer_many, Ok(1.0 / m));
                }
                Err(e) => {
                    keep_faster(&mut peer_one, Err(e.clone()));
                    keep_faster(&mut peer_many, Err(e));
                }
            }
            let (o, m) = zoo_rates(dir, &sentences, a.runs)?;
            one = one.max(o);
            many = many.max(m);
        }
        let rate = |best: &Option<Result<f64, String>>| folded(best).map(|s| 1.0 / s);
        t.add(
            format!("{name}, one sentence"),
            "sent/s",
            one,
            "sentence-transformers",
            rate(&peer_one),
            None,
        );
        t.add(
            format!("{name}, batch of {BATCH}"),
            "sent/s",
            many,
            "sentence-transformers",
            rate(&peer_many),
            Some(Target::AtLeast(1.5)),
        );
    }
    let _ = std::fs::remove_file(&file);
    let failures = t.print();
    Ok(zoo_benchmarks::exit_status(failures))
}

fn main() -> ExitCode {
    zoo_benchmarks::main_of("embed", run)
}
