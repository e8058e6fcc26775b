//! `zoo plan`: an exact device map for a model, from headers alone, with no hardware attached.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use zoo_hub::{Dtype, Pretrained};
use zoo_runtime::device_map::{
    parse_max_memory, plan, units_from_inventory, CacheLayout, DeviceBudget, Placement,
    PlanRequest, UnitRules, Workload,
};

/// Plan how a model splits across devices before loading it: per device the weights, KV cache,
/// activations, reserve and free memory, where the cuts fall and what crosses them per token
/// (for a pipeline: per denoising step inside the UNet or transformer, once per call between
/// components).
/// Works from safetensors/GGUF headers alone, so a TPU deployment can be planned from a laptop
/// and the plan file loaded on the real host as an explicit device map.
///
/// Examples:
///   zoo plan ./SmolLM2 --device-map balanced --max-memory 0=2GiB,1=2GiB --batch 1 --seq 2048
///   zoo plan Qwen/Qwen3-0.6B --platform tpu --devices 8 --max-memory 16GiB --out plan.json
///   zoo plan model.gguf --device-map sequential --max-memory 0=200MiB,cpu=8GiB --dtype f32
///   zoo plan ./stable-diffusion-xl --max-memory 0=4GiB,1=4GiB --size 1024x1024 --batch 2
///
/// A diffusers pipeline folder (model_index.json) is planned component by component: each
/// text encoder and the VAE is one unit, the UNet splits at its down, mid and up blocks (a
/// diffusion transformer at its transformer_blocks.N / single_transformer_blocks.N); the
/// activations are the denoiser's at --size for --batch images (twice that under guidance) and
/// the VAE decode's.
#[derive(clap::Args)]
#[command(verbatim_doc_comment)]
pub struct Args {
    /// Folder, .safetensors/.gguf file, or Hub repo id `org/name[@revision]`.
    model: String,
    /// balanced, balanced_low_0 or sequential.
    #[arg(long, default_value = "balanced")]
    device_map: String,
    /// Memory per device: `0=2GiB,1=2GiB,cpu=8GiB`, or one size for every device (`16GiB`).
    /// A `cpu` entry lets what does not fit spill to host memory.
    #[arg(long)]
    max_memory: String,
    /// The platform the plan is for (names devices in the table: tpu:0, cuda:1, ...).
    #[arg(long, default_value = "device")]
    platform: String,
    /// Number of accelerators; defaults to the highest index named in --max-memory plus one.
    #[arg(long)]
    devices: Option<usize>,
    /// Weight dtype after loading: f32, bf16 or f16 (default: as stored).
    #[arg(long)]
    dtype: Option<String>,
    /// Batch size the KV cache and activations are sized for.
    #[arg(long, default_value_t = 1)]
    batch: usize,
    /// Sequence length the plan is sized for: prompt + new tokens for a decoder's KV cache
    /// (default 2048), the input length for an encoder (default its max_position_embeddings),
    /// both the encoder's input and the decoder's output for an encoder-decoder such as T5
    /// (default 512; each decoder layer caches its own keys and the encoder's).
    #[arg(long)]
    seq: Option<usize>,
    /// Fraction of each budget kept for the runtime (compiled executables, allocator slack).
    #[arg(long, default_value_t = 0.05)]
    reserve: f64,
    /// Pipelines: the image size WIDTHxHEIGHT (default: the UNet's sample size).
    #[arg(long)]
    size: Option<String>,
    /// Pipelines: plan for no classifier-free guidance (the UNet's batch is not doubled).
    #[arg(long)]
    no_guidance: bool,
    /// Write the plan as JSON here (load it later with --device-map FILE.json).
    #[arg(long)]
    out: Option<PathBuf>,
}

pub fn run(args: Args) -> Result<()> {
    let model = Pretrained::open(&args.model)?;
    let dtype = match args.dtype.as_deref() {
        None => None,
        Some("f32") => Some(Dtype::F32),
        Some("bf16") => Some(Dtype::BF16),
        Some("f16") => Some(Dtype::F16),
        Some(other) => bail!("--dtype {other}: use f32, bf16 or f16"),
    };
    let elem_bytes = dtype.map_or(2, |d| d.plain_size() as usize);
    let devices = budgets(&args)?;
    if model.model_index()?.is_some() {
        return plan_pipeline(&args, dtype, devices);
    }
    let checkpoint = model.checkpoint()?;
    let config = model.config().ok();
    if let Some(c) = &config {
        checkpoint
            .inventory
            .check_layer_counts(&c.to_value(), &c.path)?;
    }

    let inv = &checkpoint.inventory;

    // The family says what its units are and what each costs; a checkpoint of no known
    // family is planned module by module from its weights alone.
    let layout = config
        .as_ref()
        .and_then(zoo_transformers::registry::layout)
        .transpose()?;
    let (units, shape, seq) = match &layout {
        Some(l) => {
            let default = if l.shape.kv_cache == CacheLayout::SelfAttention {
                2048
            } else {
                l.context
            };
            (
                l.units(inv, dtype),
                Some(l.shape),
                args.seq.unwrap_or(default),
            )
        }
        None => (
            units_from_inventory(inv, &UnitRules::default(), dtype),
            None,
            args.seq.unwrap_or(2048),
        ),
    };
    if let Some(l) = layout.as_ref().filter(|l| !l.shape.kv_cache.caches()) {
        if seq > l.context {
            bail!(
                "--seq {seq} is longer than the {} tokens this encoder takes (max_position_embeddings)",
                l.context
            );
        }
    }
    let request = PlanRequest {
        strategy: args.device_map.clone(),
        devices,
        units,
        shape,
        workload: Workload {
            batch: args.batch,
            seq,
            elem_bytes,
        },
        activations: None,
        reserve_fraction: args.reserve,
    };
    let plan = plan(&request)?;
    plan.check_covers(inv)?;
    out!("{plan}");
    if let Some(family) = config
        .as_ref()
        .and_then(zoo_transformers::registry::family_of)
    {
        let mesh_sizes: Vec<usize> = (1..)
            .map(|k| 1usize << k)
            .take_while(|&n| n <= request.devices.len().max(8))
            .collect();
        let elem = dtype.map_or(0, |d| d.plain_size());
        let tensors: Vec<(&str, &[usize], u64)> = inv
            .tensors()
            .iter()
            .map(|t| {
                // Block-quantized tensors load on a mesh widened to f32.
                let bytes = match (elem, t.dtype.plain_size()) {
                    (0, 0) => 4,
                    (0, own) => own,
                    (asked, _) => asked,
                };
                (t.name.as_str(), t.shape.as_slice(), bytes)
            })
            .collect();
        tp_table(family, &tensors, &mesh_sizes)?;
    }
    match &layout {
        None => outln!(
            "note: no registered family describes this checkpoint; KV cache and activations are not counted"
        ),
        Some(l) if !l.shape.kv_cache.caches() => {
            outln!("note: an encoder keeps no KV cache; activations are sized for {seq} tokens")
        }
        Some(l) if matches!(l.shape.kv_cache, CacheLayout::EncoderDecoder { .. }) => outln!(
            "note: an encoder-decoder: each decoder layer keeps a self-attention cache of {seq} generated tokens and a cross-attention cache of the encoder's {seq}-token output"
        ),
        Some(_) => {}
    }
    write_plan(&plan, args.out.as_deref())
}

/// The device budgets of `--max-memory` / `--devices` / `--platform`.
fn budgets(args: &Args) -> Result<Vec<DeviceBudget>> {
    let max_memory = parse_max_memory(&args.max_memory)?;
    let named_max = max_memory
        .per_device
        .keys()
        .filter_map(|p| match p {
            Placement::Device(i) => Some(i + 1),
            _ => None,
        })
        .max()
        .unwrap_or(0);
    let n = args.devices.unwrap_or(named_max.max(1));
    if n == 0 || n > MAX_DEVICES {
        bail!(
            "--devices {n} (or the highest index in --max-memory): plan for 1 to {MAX_DEVICES} devices, \
             more than any PJRT topology has"
        );
    }
    let mut devices = Vec::new();
    for i in 0..n {
        let place = Placement::Device(i);
        let bytes = max_memory.get(&place).with_context(|| {
            format!(
                "{}:{i} has no memory budget; pass --max-memory {i}=SIZE or one size for all",
                args.platform
            )
        })?;
        devices.push(DeviceBudget {
            place,
            name: format!("{}:{i}", args.platform),
            bytes,
        });
    }
    if let Some(bytes) = max_memory.get(&Placement::Cpu) {
        devices.push(DeviceBudget {
            place: Placement::Cpu,
            name: "cpu".into(),
            bytes,
        });
    }
    if max_memory.get(&Placement::Disk).is_some() {
        bail!("offloading to disk is not supported; give more device or cpu memory");
    }
    Ok(devices)
}

/// The most devices a plan spans: well past the largest TPU pod (8,960 chips), and small
/// enough that the table of budgets is never a memory hazard.
const MAX_DEVICES: usize = 65_536;

/// `zoo plan` on a diffusers pipeline folder.
fn plan_pipeline(args: &Args, dtype: Option<Dtype>, devices: Vec<DeviceBudget>) -> Result<()> {
    let size = match args.size.as_deref() {
        None => None,
        Some(s) => {
            let (w, h) = s
                .split_once(['x', 'X'])
                .with_context(|| format!("--size {s:?}: write it as WIDTHxHEIGHT"))?;
            let (w, h): (usize, usize) = (w.trim().parse()?, h.trim().parse()?);
            if w == 0 || h == 0 || w % 8 != 0 || h % 8 != 0 {
                bail!("--size {s}: width and height must be positive multiples of 8");
            }
            Some((h, w))
        }
    };
    let p = zoo_diffusers::pipelines::plan::plan_units(
        &args.model,
        dtype,
        size,
        args.batch,
        !args.no_guidance,
    )?;
    let request = PlanRequest {
        strategy: args.device_map.clone(),
        devices,
        units: p.units.clone(),
        shape: None,
        workload: Workload {
            batch: args.batch,
            seq: 1,
            elem_bytes: dtype.map_or(4, |d| d.plain_size() as usize),
        },
        activations: Some(p.activations),
        reserve_fraction: args.reserve,
    };
    let plan = plan(&request)?;
    plan.check_covers(&p.inventory)?;
    out!("{}", plan.table());
    for pair in plan.stages.windows(2) {
        let last = pair[0].units.last().map(String::as_str).unwrap_or("-");
        if let Some(c) = p.crossing(last) {
            outln!(
                "cut {} -> {}: after {last}, {} {} ({})",
                pair[0].device.name,
                pair[1].device.name,
                zoo_runtime::device_map::human(c.bytes),
                if c.per_step {
                    "per denoising step"
                } else {
                    "once per call"
                },
                c.what
            );
        }
    }
    outln!(
        "note: {} at {}x{}: the denoiser runs a batch of {} (activations {} per device, the largest component's peak)",
        p.class_name,
        p.size.1,
        p.size.0,
        p.unet_batch,
        zoo_runtime::device_map::human(p.activations)
    );
    write_plan(&plan, args.out.as_deref())
}

/// What tensor parallelism over meshes of each size in `sizes` makes of the weights (the
/// family's plan, `--device-map tp[N]:...`): bytes per device and the all-reduces of a
/// forward pass with what they carry per token.
fn tp_table(
    family: &zoo_transformers::registry::Family,
    tensors: &[(&str, &[usize], u64)],
    sizes: &[usize],
) -> Result<()> {
    if family.tp_plan.is_empty() {
        outln!(
            "tensor parallel: {} has no tensor-parallel plan; on a mesh its weights are whole on every device",
            family.model_type
        );
        return Ok(());
    }
    outln!("tensor parallel (every layer over a mesh, `--device-map tpN:...`):");
    outln!(
        "{:>6} {:>16} {:>8} {:>8} {:>12} {:>22}",
        "mesh",
        "weights/device",
        "split",
        "whole",
        "all-reduces",
        "all-reduce bytes/token"
    );
    for &tp in sizes {
        // Elements are counted at each tensor's own width.
        let mut total = zoo_runtime::device_map::TpFootprint::default();
        for &(name, shape, elem) in tensors {
            let f = zoo_runtime::device_map::footprint(family.tp_plan, tp, [(name, shape)], elem);
            total.bytes_per_device += f.bytes_per_device;
            total.split += f.split;
            total.whole += f.whole;
            total.all_reduces += f.all_reduces;
            total.all_reduce_bytes_per_token += f.all_reduce_bytes_per_token;
        }
        outln!(
            "{:>6} {:>16} {:>8} {:>8} {:>12} {:>22}",
            format!("tp{tp}"),
            zoo_runtime::device_map::human(total.bytes_per_device),
            total.split,
            total.whole,
            total.all_reduces,
            zoo_runtime::device_map::human(total.all_reduce_bytes_per_token)
        );
    }
    Ok(())
}

/// Writes the plan as JSON to `out`, atomically: a failed write leaves no plan behind.
fn write_plan(plan: &zoo_runtime::device_map::Plan, out: Option<&std::path::Path>) -> Result<()> {
    let Some(out) = out else {
        return Ok(());
    };
    let text = serde_json::to_string_pretty(&plan.to_json())?;
    zoo_hub::write_atomically(out, text.as_bytes())?;
    outln!("plan written to {}", out.display());
    Ok(())
}
