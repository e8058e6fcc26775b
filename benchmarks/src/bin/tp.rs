//! Tensor parallelism on the XLA CPU plugin: SmolLM2-135M (f32) and the FLUX-shaped
//! transformer step on one device, in four stages, and with every layer split over meshes
//! of two and four devices (and two stages of two-device meshes), all in this run: step
//! time, weight bytes per device, and the collectives XLA's SPMD partitioner put in the
//! compiled programs.
//!
//! The plugin's devices share this machine's cores, so a split cannot run faster here: the
//! rows show what each layout holds and exchanges, and its overhead on one host. The speed
//! claim waits for an accelerator (`scripts/gpu-check.sh`). No targets.
//!
//! Run: `cargo run --release --manifest-path benchmarks/Cargo.toml --bin tp -- [--threads 2]
//! [--new 32] [--runs 3]` with `ZOO_PJRT_CPU_PLUGIN`, `ZOO_SMOLLM2_F32_DIR` (or the folder
//! `scripts/bench.sh` writes) and optionally `ZOO_FLUX_BENCH_DIR` set.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use zoo_benchmarks::{FluxStep, FLUX_TEXT};
use zoo_diffusers::FluxTransformer2DModel;
use zoo_runtime::device_map::{footprint, DeviceMap, Mesh, TP_AXIS};
use zoo_runtime::{lazy, DType, Device, PjrtDevice, PjrtPlatform, Tensor};
use zoo_transformers::{
    AutoModelForCausalLM, ForwardArgs, GenerationOptions, LogitsFor, TextGenerator,
};

const HELP: &str = "\
tp: tensor parallelism on the XLA CPU plugin (SmolLM2 f32 decode, a FLUX-shaped step):
one device, four stages, tp2, tp4 and tp2 x 2 stages in this run

USAGE: tp [--threads N] [--new N] [--runs N]

  --threads N   threads (default 2)
  --new N       greedy tokens timed after the first (default 32)
  --runs N      timed runs per figure, best kept (default 3)
  --check, --prefill N, --pjrt P   accepted and unused (scripts/bench.sh passes its flags)

Environment: ZOO_PJRT_CPU_PLUGIN, ZOO_SMOLLM2_F32_DIR (default
.cache/zoo-assets/smollm2-135m-f32), ZOO_FLUX_BENCH_DIR (default
.cache/zoo-assets/flux-reduced; the FLUX rows are left out without it).
";

struct Args {
    threads: usize,
    new: usize,
    runs: usize,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        threads: 2,
        new: 32,
        runs: 3,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut num = |name: &str| -> Result<usize, String> {
            it.next()
                .and_then(|v| v.parse().ok())
                .filter(|&n| n > 0)
                .ok_or_else(|| format!("{name} takes a positive number"))
        };
        match flag.as_str() {
            "--threads" => a.threads = num("--threads")?,
            "--new" => a.new = num("--new")?,
            "--runs" => a.runs = num("--runs")?,
            "--prefill" => {
                num("--prefill")?;
            }
            "--pjrt" => {
                it.next();
            }
            "--check" => {}
            "-h" | "--help" => {
                print!("{HELP}");
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other:?}\n\n{HELP}")),
        }
    }
    Ok(a)
}

/// The layouts compared: a name and the device map.
const LAYOUTS: [(&str, &str); 5] = [
    ("one device", "pjrt:cpu:0"),
    ("4 stages", "pjrt:cpu:0,1,2,3"),
    ("tp2", "tp:pjrt:cpu:0,1"),
    ("tp4", "tp:pjrt:cpu:0,1,2,3"),
    ("tp2 x 2 stages", "tp2:pjrt:cpu:0,1,2,3"),
];

/// Meshes and stages of a layout: (devices per mesh, stages).
fn shape_of(map: &DeviceMap) -> (usize, usize) {
    match map {
        DeviceMap::TensorParallel { devices, tp, .. } => {
            let n = devices.as_ref().map_or(4, Vec::len);
            let tp = tp.unwrap_or(n);
            (tp, n / tp)
        }
        DeviceMap::Pjrt { devices, .. } => (1, devices.as_ref().map_or(4, Vec::len)),
        _ => (1, 1),
    }
}

fn dir(var: &str, default: &str) -> Option<PathBuf> {
    let p = std::env::var_os(var)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(default));
    p.join("config.json").exists().then_some(p)
}

/// Collectives of a one-token forward (a decode step's program), as `op×n` words.
fn step_collectives(model: &TextGenerator) -> Result<String, String> {
    let e = |e: zoo_transformers::Error| e.to_string();
    let device = model.load_report().device;
    let ids = Tensor::from_vec(vec![1i64], &[1, 1], &device).map_err(|e| e.to_string())?;
    let pos = Tensor::from_vec(vec![0i64], &[1, 1], &device).map_err(|e| e.to_string())?;
    let mut cache = model.model().model().new_cache(1, 1).map_err(e)?;
    let args = ForwardArgs {
        input_ids: &ids,
        position_ids: &pos,
        attention_mask: None,
        output_hidden_states: false,
        inputs_embeds: None,
    };
    let (logits, _) = model
        .model()
        .forward(args, &mut cache, LogitsFor::Last)
        .map_err(e)?;
    let c = lazy::collectives(&[&logits]).map_err(|e| e.to_string())?;
    Ok(words(&c))
}

fn words(c: &[(&str, usize)]) -> String {
    if c.is_empty() {
        return "none".into();
    }
    c.iter()
        .map(|(op, n)| format!("{op}×{n}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Weight bytes per device of `dir`'s checkpoint under a layout.
fn bytes_per_device(dir: &Path, plan: zoo_runtime::device_map::TpPlan, map: &DeviceMap) -> u64 {
    let (tp, stages) = shape_of(map);
    let Ok(pretrained) = zoo_hub::Pretrained::open(&dir.to_string_lossy()) else {
        return 0;
    };
    let Ok(ck) = pretrained.checkpoint() else {
        return 0;
    };
    let tensors: Vec<(&str, &[usize])> = ck
        .inventory
        .tensors()
        .iter()
        .map(|t| (t.name.as_str(), t.shape.as_slice()))
        .collect();
    footprint(plan, tp, tensors, 4).bytes_per_device / stages as u64
}

fn smollm2(a: &Args, dir: &Path) -> Result<(), String> {
    let pretrained =
        zoo_hub::Pretrained::open(&dir.to_string_lossy()).map_err(|e| e.to_string())?;
    let config = pretrained.config().map_err(|e| e.to_string())?;
    let family = zoo_transformers::registry::family_of(&config).ok_or("no family")?;
    println!(
        "SmolLM2-135M f32, greedy decode of {} tokens after the first, {} threads; XLA CPU plugin, all in this run",
        a.new, a.threads
    );
    println!(
        "  {:<16} {:>10} {:>10} {:>18}  collectives of a decode step (staged: the last stage's program)",
        "layout", "ms/step", "vs one", "weights/device"
    );
    let mut one = None;
    for (name, map) in LAYOUTS {
        let map: DeviceMap = map.parse().map_err(|e| format!("{e}"))?;
        let model = AutoModelForCausalLM::builder(&dir.to_string_lossy())
            .device_map(map.clone())
            .dtype(DType::F32)
            .load()
            .map_err(|e| format!("{name}: {e}"))?;
        let opts = GenerationOptions {
            min_new_tokens: a.new + 1,
            ..GenerationOptions::greedy(a.new + 1)
        };
        let prompt = vec![vec![1u32, 504, 3458, 5022, 6585, 359]];
        let mut best = f64::INFINITY;
        for _ in 0..=a.runs {
            let (_, stats) = model
                .generate_ids(&prompt, &opts, |_| true)
                .map_err(|e| format!("{name}: {e}"))?;
            best = best.min(stats.decode_seconds / stats.decode_steps.max(1) as f64);
        }
        let ms = best * 1e3;
        let base = *one.get_or_insert(ms);
        println!(
            "  {:<16} {:>10.2} {:>9.2}x {:>18}  {}",
            name,
            ms,
            ms / base,
            zoo_runtime::device_map::human(bytes_per_device(dir, family.tp_plan, &map)),
            step_collectives(&model)?
        );
    }
    Ok(())
}

fn flux(a: &Args, dir: &Path) -> Result<(), String> {
    println!(
        "FLUX-shaped transformer (4x64 heads, 2 double + 4 single blocks), one step at 256x256 with {FLUX_TEXT} text tokens, f32, {} threads; XLA CPU plugin, all in this run",
        a.threads
    );
    println!(
        "  {:<16} {:>10} {:>10}  collectives of the step (staged: the last stage's program)",
        "layout", "ms/step", "vs one"
    );
    let e = |e: zoo_runtime::Error| e.to_string();
    let mut one = None;
    for (name, map) in LAYOUTS {
        let map: DeviceMap = map.parse().map_err(|e| format!("{e}"))?;
        let devices = zoo_diffusers::pipelines::devices_of(&map).map_err(|e| e.to_string())?;
        let model = FluxTransformer2DModel::from_pretrained_split(
            &dir.to_string_lossy(),
            DType::F32,
            &devices,
        )
        .map_err(|e| format!("{name}: {e}"))?;
        let inputs = FluxStep::new(&devices[0], DType::F32)?;
        let step = || inputs.run(&model);
        let out = step()?;
        let collectives = lazy::collectives(&[&out]).map_err(e)?;
        out.to_vec_f64().map_err(e)?;
        let mut best = f64::INFINITY;
        for _ in 0..a.runs {
            let t0 = Instant::now();
            step()?.to_vec_f64().map_err(e)?;
            best = best.min(t0.elapsed().as_secs_f64());
        }
        let ms = best * 1e3;
        let base = *one.get_or_insert(ms);
        println!(
            "  {:<16} {:>10.2} {:>9.2}x  {}",
            name,
            ms,
            ms / base,
            words(&collectives)
        );
    }
    Ok(())
}

fn run() -> Result<ExitCode, String> {
    let a = parse_args()?;
    std::env::set_var("RAYON_NUM_THREADS", a.threads.to_string());
    let plugin = std::env::var_os("ZOO_PJRT_CPU_PLUGIN")
        .filter(|v| !v.is_empty())
        .ok_or("ZOO_PJRT_CPU_PLUGIN is not set (scripts/bench.sh sets it)")?;
    lazy::configure(PjrtPlatform::Cpu, Some(PathBuf::from(plugin)), Some(4))
        .map_err(|e| e.to_string())?;
    // The mesh devices exist before the first load (a check of the plugin's device count).
    let mesh = Mesh::new(&[(TP_AXIS, 4)], &[0, 1, 2, 3]).map_err(|e| e.to_string())?;
    let _ = Device::Pjrt(PjrtDevice::on_mesh(PjrtPlatform::Cpu, &mesh));
    match dir("ZOO_SMOLLM2_F32_DIR", ".cache/zoo-assets/smollm2-135m-f32") {
        Some(d) => smollm2(&a, &d)?,
        None => println!("SmolLM2 rows left out: no f32 folder (set ZOO_SMOLLM2_F32_DIR)"),
    }
    match dir("ZOO_FLUX_BENCH_DIR", ".cache/zoo-assets/flux-reduced") {
        Some(d) => flux(&a, &d)?,
        None => println!("FLUX rows left out: no checkpoint (set ZOO_FLUX_BENCH_DIR)"),
    }
    zoo_benchmarks::print_xla_plugin();
    println!(
        "  {}; the plugin's 4 devices share this machine's {} cores, so a split cannot be faster here: the figures are its overhead on one host, the speed claim waits for an accelerator",
        zoo_benchmarks::cpu_tier_line(),
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    Ok(ExitCode::SUCCESS)
}

fn main() -> ExitCode {
    match run() {
        Ok(code) => code,
        Err(e) => {
            eprintln!("tp: {e}");
            ExitCode::from(2)
        }
    }
}
