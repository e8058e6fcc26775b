//! What zoo's benchmarks share: peak-RSS windows, best-of timing, the Python peer's figures,
//! and a table of figures with their targets that `--check` turns into an exit status.
//!
//! A figure is zoo's measurement beside a peer's taken in the same run (same weights, dtype,
//! prompt and thread count). A target is a ratio the figure must reach; under `--check` a
//! missed target, or a target whose peer figure is missing, makes the benchmark exit non-zero.
//! A ratio is never printed against a missing figure.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use serde_json::Value;
use zoo_runtime::Tensor;
use zoo_transformers::{ForwardArgs, GenerationOptions, LogitsFor, TextGenerator};

/// Rounds of the benchmarks that alternate sides (the diffusion steps; zoo and llama.cpp on
/// a GGUF): each measures every side in turn, and a figure is the best over all of them, so a
/// burst of the host's other load that slows one round cannot favour either side.
pub const ROUNDS: usize = 2;

/// Folds a round's timing into `best`: the lower one; a failure (the first round's message)
/// only while every round has failed.
pub fn keep_faster(best: &mut Option<Result<f64, String>>, r: Result<f64, String>) {
    *best = Some(match (best.take(), r) {
        (None, r) | (Some(Err(_)), r @ Ok(_)) => r,
        (Some(Ok(x)), Ok(y)) => Ok(x.min(y)),
        (Some(b), Err(_)) => b,
    });
}

/// A figure folded by [`keep_faster`], or "not measured" when no round ran.
pub fn folded(best: &Option<Result<f64, String>>) -> Result<f64, String> {
    best.clone().unwrap_or_else(|| Err("not measured".into()))
}

/// Prints the XLA CPU plugin the PJRT rows ran on (its path, PJRT API and XLA version), so a
/// figure can be traced to the XLA build behind it. Call only once the plugin is loaded.
pub fn print_xla_plugin() {
    if let Ok(id) = zoo_runtime::lazy::plugin_identity(zoo_runtime::PjrtPlatform::Cpu) {
        println!("  XLA CPU plugin: {id}");
    }
}

/// The CPU kernels zoo runs here (`ZOO_CPU` caps them; `scripts/bench.sh` runs every tier the
/// CPU has), and what the peers were told to match it.
pub fn cpu_tier_line() -> String {
    use zoo_runtime::cpu::features;
    let tier = match features::tier() {
        Ok(t) => t.to_string(),
        Err(e) => format!("unknown ({e})"),
    };
    let peers = std::env::var("ZOO_BENCH_PEER_TIER").unwrap_or_else(|_| "native".into());
    format!(
        "CPU kernels: zoo {tier} (this CPU runs {}); peers: {peers}",
        features::hardware_tier()
    )
}

/// The repository root (this crate lives in `benchmarks/`).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Starts a new peak-RSS window (Linux: writing 5 to `clear_refs` resets `VmHWM`).
pub fn reset_peak_rss() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

/// The peak resident set size since the last [`reset_peak_rss`], in bytes.
pub fn peak_rss() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

/// The machine's streaming read bandwidth on `threads` threads, in bytes per second: the best
/// of five passes summing a 1 GiB buffer (far larger than any cache), each thread over its
/// own slice. A decode step streams its weights once, so this bounds decode tokens/s at
/// bandwidth / weight bytes.
pub fn read_bandwidth(threads: usize) -> f64 {
    const BYTES: usize = 1 << 30;
    let buf: Vec<u64> = (0..BYTES / 8).map(|i| i as u64).collect();
    let per = buf.len().div_ceil(threads.max(1));
    best_of(5, || {
        let t = Instant::now();
        std::thread::scope(|s| {
            for part in buf.chunks(per) {
                s.spawn(move || {
                    // Eight independent sums, so the adds keep up with the loads.
                    let mut acc = [0u64; 8];
                    for c in part.chunks_exact(8) {
                        for (a, v) in acc.iter_mut().zip(c) {
                            *a = a.wrapping_add(*v);
                        }
                    }
                    std::hint::black_box(acc);
                });
            }
        });
        BYTES as f64 / t.elapsed().as_secs_f64()
    })
}

/// The best (largest) of `runs` calls of `f`: load from other processes on a shared machine
/// only ever slows a run down.
pub fn best_of(runs: usize, mut f: impl FnMut() -> f64) -> f64 {
    (0..runs).map(|_| f()).fold(0.0, f64::max)
}

/// The Python interpreter of the reference stack: `PYTHON`, else the repository's `.venv`.
pub fn python() -> PathBuf {
    std::env::var_os("PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join(".venv/bin/python"))
}

/// Runs a Python peer script and parses the JSON object its last stdout line holds; the
/// error is one line naming what to install.
pub fn python_figures(script: &str, args: &[String]) -> Result<Value, String> {
    let python = python();
    if !python.exists() {
        return Err(format!(
            "{} not found: create the reference venv (python3 -m venv .venv && .venv/bin/pip install -r nightly/reference/requirements.txt) or set PYTHON",
            python.display()
        ));
    }
    let out = Command::new(&python)
        .arg(repo_root().join(script))
        .args(args)
        .output()
        .map_err(|e| format!("{}: {e}", python.display()))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let last = err
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("");
        return Err(format!("{script} failed: {last}"));
    }
    let s = String::from_utf8_lossy(&out.stdout);
    s.lines()
        .rev()
        .find_map(|l| serde_json::from_str(l).ok())
        .ok_or_else(|| format!("{script} printed no JSON figures"))
}

/// How a figure is judged against its peer.
#[derive(Clone, Copy, Debug)]
pub enum Target {
    /// zoo / peer must be at least this (throughput: higher is better).
    AtLeast(f64),
    /// zoo / peer must be at most this (memory, wall time: lower is better).
    AtMost(f64),
}

/// One row of the table: zoo's figure, the peer's (or why it is missing), the target.
#[derive(Debug)]
pub struct Row {
    pub what: String,
    pub unit: &'static str,
    pub zoo: f64,
    pub peer_name: String,
    pub peer: Result<f64, String>,
    pub target: Option<Target>,
}

impl Row {
    /// The ratio zoo / peer, when the peer was measured.
    pub fn ratio(&self) -> Option<f64> {
        self.peer.as_ref().ok().map(|p| self.zoo / p)
    }

    /// Whether the target (if any) is met; `None` when it cannot be judged.
    pub fn met(&self) -> Option<bool> {
        let (t, r) = (self.target?, self.ratio()?);
        Some(match t {
            Target::AtLeast(x) => r >= x,
            Target::AtMost(x) => r <= x,
        })
    }
}

/// The figures of one benchmark run.
#[derive(Debug, Default)]
pub struct Table {
    pub title: String,
    pub rows: Vec<Row>,
}

impl Table {
    pub fn new(title: impl Into<String>) -> Table {
        Table {
            title: title.into(),
            rows: Vec::new(),
        }
    }

    /// Adds a row; `peer` is the peer's figure or why it is missing.
    pub fn add(
        &mut self,
        what: impl Into<String>,
        unit: &'static str,
        zoo: f64,
        peer_name: impl Into<String>,
        peer: Result<f64, String>,
        target: Option<Target>,
    ) {
        self.rows.push(Row {
            what: what.into(),
            unit,
            zoo,
            peer_name: peer_name.into(),
            peer,
            target,
        });
    }

    /// Prints the table; returns the number of targets missed or not judged.
    pub fn print(&self) -> usize {
        println!("{}", self.title);
        println!("  {}", cpu_tier_line());
        println!(
            "  {:<44} {:>12} {:>24} {:>12}  {:<8} target",
            "figure", "zoo", "peer", "peer value", "ratio"
        );
        let mut failures = 0;
        for r in &self.rows {
            let peer = match &r.peer {
                Ok(v) => format!("{v:.1}"),
                Err(_) => "not measured".into(),
            };
            let ratio = r.ratio().map_or("-".into(), |x| format!("{x:.2}x"));
            let target = match (r.target, r.met()) {
                (None, _) => String::new(),
                (Some(t), verdict) => {
                    let t = match t {
                        Target::AtLeast(x) => format!(">= {x:.2}x"),
                        Target::AtMost(x) => format!("<= {x:.2}x"),
                    };
                    let v = match verdict {
                        Some(true) => "met",
                        Some(false) => "MISSED",
                        None => "NOT JUDGED",
                    };
                    if verdict != Some(true) {
                        failures += 1;
                    }
                    format!("{t} {v}")
                }
            };
            println!(
                "  {:<44} {:>8.1} {:<3} {:>24} {:>12}  {:<8} {target}",
                r.what, r.zoo, r.unit, r.peer_name, peer, ratio
            );
            if let Err(why) = &r.peer {
                println!("      {} not measured: {why}", r.peer_name);
            }
        }
        failures
    }
}

/// The flags of a benchmark that takes only `--threads` and `--runs` (defaults 2 and 3),
/// besides `--check` and the flags `scripts/bench.sh` passes every benchmark (`--new`,
/// `--prefill`, accepted and unused); `--help` prints `help` and exits.
pub fn threads_and_runs(help: &str) -> Result<(usize, usize), String> {
    let (mut threads, mut runs, mut unused) = (2, 3, 0);
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let slot = match flag.as_str() {
            "--check" => continue,
            "-h" | "--help" => {
                println!("{help}");
                std::process::exit(0);
            }
            "--threads" => &mut threads,
            "--runs" => &mut runs,
            "--new" | "--prefill" => &mut unused,
            other => return Err(format!("unknown argument {other:?}; see --help")),
        };
        *slot = positive(&mut it, &flag)?;
    }
    Ok((threads, runs))
}

/// The positive number after `flag` on the command line.
pub fn positive(args: &mut impl Iterator<Item = String>, flag: &str) -> Result<usize, String> {
    let v = args.next().ok_or(format!("{flag} needs a number"))?;
    v.parse()
        .ok()
        .filter(|&n: &usize| n > 0)
        .ok_or(format!("{flag} {v:?}: expected a positive number"))
}

/// `--check`: whether targets decide the exit status.
pub fn check_mode() -> bool {
    std::env::args().any(|a| a == "--check")
}

/// The exit status for `failures` targets missed or not judged: 1 under `--check` (saying
/// how many), else success.
pub fn exit_status(failures: usize) -> std::process::ExitCode {
    if check_mode() && failures > 0 {
        println!("--check: {failures} target(s) missed or not judged");
        return std::process::ExitCode::from(1);
    }
    std::process::ExitCode::SUCCESS
}

/// A benchmark's `main`: the status `run` gives, or its error on stderr after `name` and
/// status 2.
pub fn main_of(
    name: &str,
    run: impl FnOnce() -> Result<std::process::ExitCode, String>,
) -> std::process::ExitCode {
    run().unwrap_or_else(|e| {
        eprintln!("{name}: {e}");
        std::process::ExitCode::from(2)
    })
}

/// The prefill prompt every side runs: `100 + (1000 + i) % 40000`.
pub fn prefill_ids(n: usize) -> Vec<u32> {
    (0..n as u32).map(|i| 100 + (1000 + i) % 40000).collect()
}

/// zoo's figures for one load: the tok/s of one `prefill`-token forward computing the last
/// position's logits, and greedy decode tok/s over `new` tokens after the first of `prompt`
/// (eos suppressed), each the best of `runs` after a warm-up (which compiles on PJRT).
pub fn zoo_figures(
    model: &TextGenerator,
    prompt: &str,
    prefill: usize,
    new: usize,
    runs: usize,
) -> (f64, f64) {
    let device = model.load_report().device;
    let lm = model.model();
    let ids: Vec<i64> = prefill_ids(prefill).iter().map(|&i| i64::from(i)).collect();
    let input = Tensor::from_vec(ids, &[1, prefill], &device).unwrap();
    let pos = (0..prefill as i64).collect::<Vec<_>>();
    let pos = Tensor::from_vec(pos, &[1, prefill], &device).unwrap();
    let prefill_once = || {
        let mut cache = lm.model().new_cache(1, prefill + 1).unwrap();
        let t = Instant::now();
        let args = ForwardArgs {
            input_ids: &input,
            position_ids: &pos,
            attention_mask: None,
            output_hidden_states: false,
            inputs_embeds: None,
        };
        let (logits, _) = lm.forward(args, &mut cache, LogitsFor::Last).unwrap();
        logits.to_vec::<f32>().unwrap();
        prefill as f64 / t.elapsed().as_secs_f64()
    };
    prefill_once();
    let prefill_tps = best_of(runs, prefill_once);
    let prompts = [model.encode(prompt, false).unwrap()];
    let opts = GenerationOptions {
        min_new_tokens: new + 1,
        ..GenerationOptions::greedy(new + 1)
    };
    model
        .generate_ids(&prompts, &GenerationOptions::greedy(4), |_| true)
        .unwrap();
    let decode = best_of(runs, || {
        let (_, stats) = model.generate_ids(&prompts, &opts, |_| true).unwrap();
        stats.decode_tokens_per_second()
    });
    (prefill_tps, decode)
}

/// Where a compiled decode step's time goes, in milliseconds per step over `new` greedy
/// steps of `prompt` (best of `runs` by total): `(device, host)`. `host` is how long the
/// device sat waiting for the host between programs (the plugin's completion callbacks
/// against the next dispatch: recording, tracing and dispatching a step, reading its token,
/// whatever of it the decode loop does not overlap with the previous step's run); `device`
/// is the rest of the step. The first step's graph compiles before the timed window opens.
pub fn decode_phases(model: &TextGenerator, prompt: &str, new: usize, runs: usize) -> (f64, f64) {
    let prompts = [model.encode(prompt, false).unwrap()];
    let opts = GenerationOptions {
        min_new_tokens: new + 1,
        ..GenerationOptions::greedy(new + 1)
    };
    model.generate_ids(&prompts, &opts, |_| true).unwrap();
    let mut best = (f64::INFINITY, 0.0, 0.0);
    for _ in 0..runs.max(1) {
        // The window opens at the first token (after the prefill) and closes at the last.
        let mut first: Option<(Instant, zoo_runtime::lazy::LazyStats)> = None;
        let mut steps = 0usize;
        let mut last = None;
        model
            .generate_ids(&prompts, &opts, |_| {
                match first {
                    None => first = Some((Instant::now(), zoo_runtime::lazy::stats())),
                    Some(_) => steps += 1,
                }
                last = Some((Instant::now(), zoo_runtime::lazy::stats()));
                true
            })
            .unwrap();
        let (Some((t0, s0)), Some((t1, s1))) = (first, last) else {
            continue;
        };
        if steps == 0 {
            continue;
        }
        let wall = (t1 - t0).as_secs_f64() * 1e3 / steps as f64;
        let host = (s1.idle_nanos - s0.idle_nanos) as f64 / 1e6 / steps as f64;
        if wall < best.0 {
            best = (wall, wall - host, host);
        }
    }
    (best.1, best.2)
}

/// [`zoo_figures`] and [`llama_bench`] on the same GGUF in [`ROUNDS`] alternating rounds,
/// each figure the best over all its runs: `((zoo prefill, zoo decode), llama.cpp's)`. The
/// host's other load moves either side's figures by a fifth within minutes; alternating lets
/// no burst of it fall on one side only.
pub fn zoo_and_llama_cpp(
    model: &TextGenerator,
    gguf: &Path,
    prompt: &str,
    (threads, prefill, new, runs): (usize, usize, usize, usize),
) -> ((f64, f64), Result<(f64, f64), String>) {
    let mut zoo = (0f64, 0f64);
    let mut llama: Option<Result<(f64, f64), String>> = None;
    for _ in 0..ROUNDS {
        let (p, d) = zoo_figures(model, prompt, prefill, new, runs);
        zoo = (zoo.0.max(p), zoo.1.max(d));
        let r = llama_bench(gguf, threads, prefill, new, runs);
        llama = Some(match (llama.take(), r) {
            (Some(Ok(a)), Ok(b)) => Ok((a.0.max(b.0), a.1.max(b.1))),
            (Some(Ok(a)), Err(_)) => Ok(a),
            (_, r) => r,
        });
    }
    (zoo, llama.unwrap_or_else(|| Err("not measured".into())))
}

/// A GGUF's rows beside llama.cpp on the same file: zoo loads it on candle CPU (blocks
/// kept), then [`zoo_and_llama_cpp`] measures both sides; decode and prefill against
/// llama.cpp (target >= 1.0x), and decode's block bytes per second against `bandwidth`
/// (GB/s). Each row starts with `label`.
pub fn gguf_rows(
    t: &mut Table,
    label: &str,
    gguf: &Path,
    (threads, prefill, new, runs): (usize, usize, usize, usize),
    bandwidth: f64,
) -> Result<(), String> {
    let model = zoo_transformers::AutoModelForCausalLM::builder(&gguf.to_string_lossy())
        .device_map(zoo_runtime::device_map::DeviceMap::Cpu)
        .load()
        .map_err(|e| format!("zoo cannot load {}: {e}", gguf.display()))?;
    let mib = model.load_report().weight_bytes as f64 / 1048576.0;
    let ((pf, dec), llama) = zoo_and_llama_cpp(
        &model,
        gguf,
        "The capital of France is",
        (threads, prefill, new, runs),
    );
    drop(model);
    let pick = |i: usize| {
        llama
            .as_ref()
            .map(|p| if i == 0 { p.0 } else { p.1 })
            .map_err(Clone::clone)
    };
    // #48's targets for every block type at the AVX2 tier: decode at least llama.cpp's,
    // prefill 1.5x it; above it (AVX-512, AMX) the rows guard against regressions at 1.0x.
    let at_least = Some(Target::AtLeast(1.0));
    let avx2 = zoo_runtime::cpu::features::tier()
        .is_ok_and(|t| t == zoo_runtime::cpu::features::Tier::Avx2);
    let prefill_target = Some(Target::AtLeast(if avx2 { 1.5 } else { 1.0 }));
    t.add(
        format!("{label} decode ({mib:.0} MiB)"),
        "tok/s",
        dec,
        "llama.cpp",
        pick(1),
        at_least,
    );
    // A decode step reads every block once (a tied lm_head reads the embedding table).
    t.add(
        format!("{label} decode, blocks streamed"),
        "GB/s",
        dec * mib * 1048576.0 / 1e9,
        "read bandwidth",
        Ok(bandwidth),
        None,
    );
    t.add(
        format!("{label} prefill"),
        "tok/s",
        pf,
        "llama.cpp",
        pick(0),
        prefill_target,
    );
    Ok(())
}

/// llama.cpp's own `llama-bench` (`LLAMA_BENCH`) on `gguf` with `threads` threads: (prefill
/// tok/s over `prefill` tokens, decode tok/s over `new`), the best of `runs` (as zoo's
/// figures are; llama-bench's own summary is their mean).
pub fn llama_bench(
    gguf: &Path,
    threads: usize,
    prefill: usize,
    new: usize,
    runs: usize,
) -> Result<(f64, f64), String> {
    let bin = std::env::var_os("LLAMA_BENCH").filter(|p| !p.is_empty()).map(PathBuf::from).ok_or(
        "LLAMA_BENCH is not set (scripts/bench.sh sets none at the generic tier): build llama-bench (scripts/bench.sh --llama-cpp) or point LLAMA_BENCH at one",
    )?;
    let out = Command::new(&bin)
        .arg("-m")
        .arg(gguf)
        .args(["-t", &threads.to_string()])
        .args(["-p", &prefill.to_string(), "-n", &new.to_string()])
        .args(["-r", &runs.to_string(), "-o", "json"])
        .output()
        .map_err(|e| format!("{}: {e}", bin.display()))?;
    if !out.status.success() {
        return Err(format!(
            "{} failed: {}",
            bin.display(),
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .last()
                .unwrap_or("")
        ));
    }
    let v: Value = serde_json::from_slice(&out.stdout)
        .map_err(|e| format!("llama-bench printed no JSON: {e}"))?;
    let rate = |prompt: bool| {
        let row = v
            .as_array()?
            .iter()
            .find(|r| (r["n_prompt"].as_u64().unwrap_or(0) > 0) == prompt)?;
        let best = row["samples_ts"]
            .as_array()
            .and_then(|s| s.iter().filter_map(Value::as_f64).reduce(f64::max));
        best.or_else(|| row["avg_ts"].as_f64())
    };
    Ok((
        rate(true).ok_or("llama-bench JSON has no prompt-processing row")?,
        rate(false).ok_or("llama-bench JSON has no generation row")?,
    ))
}

/// A checkpoint the reference `script` writes (`script --write DIR`: random weights, or the
/// shipped GGUF requantized): the folder
/// `env` names, else `.cache/zoo-assets/NAME`, written when `marker` is missing there (into
/// a sibling first, renamed when complete, so an interrupted write is never read).
pub fn reference_checkpoint(
    env: &str,
    name: &str,
    marker: &str,
    script: &str,
) -> Result<PathBuf, String> {
    reference_checkpoint_with(env, name, marker, script, &[])
}

/// [`reference_checkpoint`] with more arguments after `--write DIR` (the shape to write).
pub fn reference_checkpoint_with(
    env: &str,
    name: &str,
    marker: &str,
    script: &str,
    args: &[&str],
) -> Result<PathBuf, String> {
    if let Some(dir) = std::env::var_os(env) {
        return Ok(PathBuf::from(dir));
    }
    let dir = repo_root().join(".cache/zoo-assets").join(name);
    if dir.join(marker).exists() {
        return Ok(dir);
    }
    let partial = dir.with_extension("partial");
    let _ = std::fs::remove_dir_all(&partial);
    eprintln!("writing {name} with {script} into {}...", dir.display());
    let status = std::process::Command::new(python())
        .arg(repo_root().join(script))
        .arg("--write")
        .arg(&partial)
        .args(args)
        .status()
        .map_err(|e| format!("{}: {e}", python().display()))?;
    if !status.success() {
        return Err(format!(
            "{script} --write failed (is the reference venv installed?)"
        ));
    }
    std::fs::rename(&partial, &dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    Ok(dir)
}

/// Text tokens of the FLUX-shaped step (`flux` and `tp`).
pub const FLUX_TEXT: usize = 128;

/// The inputs of one FLUX-shaped transformer step at 256x256 (256 packed latent tokens of
/// 64 channels, [`FLUX_TEXT`] text tokens of 512, a pooled 768, timestep 0.5, guidance
/// 3.5), zeros where the values do not matter, on `device` in `dtype`.
pub struct FluxStep {
    latents: Tensor,
    context: Tensor,
    pooled: Tensor,
    txt_ids: Tensor,
    img_ids: Tensor,
    t: Tensor,
    g: Tensor,
}

impl FluxStep {
    pub fn new(device: &zoo_runtime::Device, dtype: zoo_runtime::DType) -> Result<Self, String> {
        let e = |e: zoo_runtime::Error| e.to_string();
        let z = |shape: &[usize]| Tensor::zeros(shape, dtype, device).map_err(e);
        let ids: Vec<f32> = (0..16)
            .flat_map(|r| (0..16).flat_map(move |c| [0.0, r as f32, c as f32]))
            .collect();
        Ok(FluxStep {
            latents: z(&[1, 256, 64])?,
            context: z(&[1, FLUX_TEXT, 512])?,
            pooled: z(&[1, 768])?,
            txt_ids: z(&[FLUX_TEXT, 3])?,
            img_ids: Tensor::from_vec(ids, &[256, 3], device)
                .and_then(|t| t.to_dtype(dtype))
                .map_err(e)?,
            t: Tensor::from_f64s(&[0.5], &[1], dtype, device).map_err(e)?,
            g: Tensor::from_f64s(&[3.5], &[1], dtype, device).map_err(e)?,
        })
    }

    /// One call of `model` on these inputs (pending on a PJRT device until read).
    pub fn run(&self, model: &zoo_diffusers::FluxTransformer2DModel) -> Result<Tensor, String> {
        model
            .forward(zoo_diffusers::FluxTransformerInput {
                hidden_states: &self.latents,
                encoder_hidden_states: &self.context,
                pooled_projections: &self.pooled,
                timestep: &self.t,
                img_ids: &self.img_ids,
                txt_ids: &self.txt_ids,
                guidance: Some(&self.g),
            })
            .map_err(|e| e.to_string())
    }
}
