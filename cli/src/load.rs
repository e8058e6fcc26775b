//! The options that say where and how a model loads, shared by the commands that load a
//! language model (`generate`, `serve`); `--dtype` and `--adapter` are every transformers
//! command's.

use anyhow::{bail, Context, Result};
use zoo_runtime::device_map::{parse_max_memory, DeviceMap, MaxMemory};
use zoo_runtime::DType;
use zoo_transformers::Adapter;

/// Where and how the model loads.
#[derive(clap::Args)]
pub struct LoadArgs {
    /// Where the model runs: cpu (candle), cuda:N (candle, cuda builds), pjrt:PLATFORM
    /// (every device of a PJRT plugin: cpu, cuda or tpu; several devices split the layers
    /// in balanced stages), pjrt:PLATFORM:0,1 (those devices), tp:pjrt:PLATFORM[:0,1,..]
    /// (tensor parallel: every layer split over a mesh of those devices by the family's
    /// plan), tpN:pjrt:PLATFORM (stages of N-device meshes), tpu (every TPU chip: one
    /// tensor-parallel mesh when the model fits them together, else stages of the largest
    /// meshes that fit), balanced / balanced_low_0 / sequential (stages over this host's
    /// accelerators), auto (TPU, then CUDA, as tpu does; then cpu), or a FILE.json device map (transformers' hf_device_map, or a
    /// plan written by `zoo plan --out`). On PJRT devices the first call of each prompt
    /// length bucket compiles; compiled programs are cached on disk (ZOO_PJRT_CACHE).
    #[arg(long, default_value = "cpu")]
    device_map: String,
    /// Weight and activation dtype: f32, bf16 or f16 (default: the checkpoint's). A
    /// quantized GGUF keeps its blocks (Q4–Q8, K-quants) by default and computes in f32 from
    /// them, as llama.cpp does; an explicit --dtype dequantizes it at load, as transformers'
    /// `from_pretrained(dir, gguf_file=...)` does (more memory, the same numbers as PyTorch).
    #[arg(long)]
    dtype: Option<String>,
    /// Memory limits, e.g. `cpu=2GiB` or `0=2GiB,1=2GiB`: budgets of a split (instead of
    /// what the devices report); loading fails early when the weights do not fit.
    #[arg(long)]
    max_memory: Option<String>,
    /// Hub revision (branch, tag or commit) for repo ids.
    #[arg(long)]
    revision: Option<String>,
    #[command(flatten)]
    adapters: AdapterArgs,
}

/// `--adapter`, on every command that loads a transformers model.
#[derive(clap::Args)]
pub struct AdapterArgs {
    /// A PEFT LoRA adapter (DoRA included) merged into the weights as they load: a folder
    /// holding adapter_config.json and adapter_model.safetensors, or a Hub repo id, then
    /// optionally :SCALE, its weight (1 as trained; PEFT's set_scale). Repeat to merge
    /// several, in order. The adapter must have been trained on this base model.
    #[arg(long = "adapter", value_name = "PATH_OR_REPO[:SCALE]")]
    adapter: Vec<String>,
}

impl AdapterArgs {
    /// The adapters parsed, each error naming the flag.
    pub fn parsed(&self) -> Result<Vec<Adapter>> {
        self.adapter
            .iter()
            .map(|a| a.parse().with_context(|| format!("--adapter {a:?}")))
            .collect()
    }
}

/// [`LoadArgs`] parsed.
pub struct Load {
    pub device_map: DeviceMap,
    pub dtype: Option<DType>,
    pub max_memory: Option<MaxMemory>,
    pub revision: Option<String>,
    pub adapters: Vec<Adapter>,
}

impl LoadArgs {
    /// The options parsed, each error naming its flag.
    pub fn parsed(&self) -> Result<Load> {
        let dtype = dtype_flag(self.dtype.as_deref())?;
        Ok(Load {
            device_map: self.device_map.parse().context("--device-map")?,
            dtype,
            max_memory: self
                .max_memory
                .as_deref()
                .map(parse_max_memory)
                .transpose()
                .context("--max-memory")?,
            revision: self.revision.clone(),
            adapters: self.adapters.parsed()?,
        })
    }
}

/// `--dtype`: f32, bf16 or f16 (`None`: the checkpoint's), the error naming the flag.
pub fn dtype_flag(d: Option<&str>) -> Result<Option<DType>> {
    match d {
        None => Ok(None),
        Some(d) => match DType::parse(d) {
            Some(dt @ (DType::F32 | DType::BF16 | DType::F16)) => Ok(Some(dt)),
            _ => bail!("--dtype {d:?}: use f32, bf16 or f16"),
        },
    }
}

/// The load options on either language-model builder (both take the same setters), with
/// progress shown.
macro_rules! with_load_options {
    ($builder:expr, $load:expr) => {{
        let load = &$load;
        let mut b = $builder.device_map(load.device_map.clone()).progress(true);
        if let Some(dt) = load.dtype {
            b = b.dtype(dt);
        }
        if let Some(r) = &load.revision {
            b = b.revision(r.clone());
        }
        if let Some(m) = &load.max_memory {
            b = b.max_memory(m.clone());
        }
        for a in &load.adapters {
            b = b.adapter(a.clone());
        }
        b
    }};
}
pub(crate) use with_load_options;
