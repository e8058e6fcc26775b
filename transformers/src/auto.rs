//! `AutoConfig`, `AutoModel`, `AutoModelForCausalLM`, `AutoModelForSeq2SeqLM` and the
//! encoder and vision classes: read a checkpoint's config, pick the
//! family by `architectures` (then `model_type`), and load it onto the device map's device.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Instant;

use zoo_hub::{Inventory, Pretrained, PretrainedConfig, Source};
use zoo_runtime::device_map::{DeviceMap, MaxMemory, Placement};
use zoo_runtime::nn::{WeightSource, Weights};
use zoo_runtime::{DType, Device};

use crate::adapters::{self, Adapter};
use crate::cache::KvCache;
use crate::chat::{ChatTemplate, Message};
use crate::generation::{self, GenerationOptions, GenerationOutput, GenerationStats, TokenEvent};
use crate::image_processing::{ImageProcessor, RgbImage};
use crate::kinds::{CausalLm, DecoderModel, Encoder, ImageEncoder, ImageTextModel, Seq2SeqLm};
use crate::loading::HubSource;
use crate::placement;
use crate::registry::{self, Family, Loaders, Task};
use crate::{Error, Result, Tokenizer};

/// A checkpoint's config with its family resolved through the registry.
#[derive(Clone, Debug)]
pub struct AutoConfig {
    /// The config as the hub read it.
    pub pretrained: PretrainedConfig,
    /// The family dispatch chose.
    pub family: &'static Family,
    /// The architecture name dispatch matched (or the family's default class when only
    /// `model_type` matched).
    pub architecture: String,
    /// What that architecture computes.
    pub task: Task,
}

impl AutoConfig {
    /// A classifier's label count as transformers reads it: `id2label`'s size, else
    /// `num_labels`, else 2.
    pub fn num_labels(&self) -> usize {
        match (
            self.pretrained.get("id2label"),
            self.pretrained.get("num_labels"),
        ) {
            (Some(serde_json::Value::Object(m)), _) => m.len(),
            (_, Some(n)) => n.as_u64().map_or(2, |n| n as usize),
            _ => 2,
        }
    }

    /// Reads and dispatches the config of `repo_or_path`, its layer counts checked against
    /// its weights where it has any.
    pub fn from_pretrained(repo_or_path: &str) -> Result<AutoConfig> {
        // An adapter's config is its base model's, as a load opens it.
        let (pretrained, _) = open(repo_or_path, &LoadOptions::default())?;
        AutoConfig::of_checkpoint(&pretrained)
    }

    /// Dispatches an already read config: by `architectures` first, then `model_type`; an
    /// unknown one is [`Error::UnsupportedArchitecture`] listing what is supported. The
    /// family then checks the config (a missing field or an impossible value is an error
    /// naming `config.json` and the field).
    pub fn from_config(pretrained: PretrainedConfig) -> Result<AutoConfig> {
        AutoConfig::dispatch(pretrained, None)
    }

    /// The config of a checkpoint about to load: [`AutoConfig::from_config`], with its layer
    /// counts checked against the layers the checkpoint holds before the family reads them,
    /// so a config declaring more layers than its weights is refused before any per-layer
    /// table is allocated.
    pub(crate) fn of_checkpoint(pretrained: &Pretrained) -> Result<AutoConfig> {
        if pretrained.config_path()?.is_none() {
            if let Some(index) = pretrained.model_index()? {
                return Err(Error::WrongKind {
                    path: index.path,
                    architecture: index.class_name,
                    asked: "transformers' Auto classes",
                    hint: "it is a diffusers pipeline (model_index.json, no config.json): \
                           generate images with DiffusionPipeline or `zoo image`, or load one \
                           of its components by its folder (text_encoder, ...)"
                        .into(),
                });
            }
        }
        let config = pretrained.config()?;
        // No weights found: the load reports that, naming what it looked for.
        let inventory = pretrained.checkpoint().ok().map(|ck| ck.inventory);
        AutoConfig::dispatch(config, inventory.as_ref())
    }

    fn dispatch(pretrained: PretrainedConfig, inventory: Option<&Inventory>) -> Result<AutoConfig> {
        let by_arch = pretrained
            .architectures
            .iter()
            .find_map(|a| registry::by_architecture(a));
        let found = by_arch.or_else(|| {
            let f = registry::by_model_type(pretrained.model_type.as_deref()?)?;
            Some((f, &f.architectures[0]))
        });
        let Some((family, arch)) = found else {
            let found = if pretrained.architectures.is_empty() {
                format!(
                    "(none listed; model_type {:?})",
                    pretrained.model_type.as_deref().unwrap_or("absent")
                )
            } else {
                format!(
                    "{} (model_type {:?})",
                    pretrained.architectures.join(", "),
                    pretrained.model_type.as_deref().unwrap_or("absent")
                )
            };
            // Vision-language checkpoints (Gemma 3's `Gemma3ForConditionalGeneration`, ...)
            // nest the config of their text model.
            let text_type = pretrained
                .get("text_config")
                .and_then(|t| t.get("model_type")?.as_str().map(String::from));
            let hint = match text_type {
                Some(t) if registry::by_model_type(&t).is_some() => format!(
                    " (a multimodal checkpoint whose `text_config` is `{t}`; zoo runs the text model from a text-only checkpoint of model_type `{t}`)"
                ),
                Some(t) => format!(" (a multimodal checkpoint; its `text_config` is `{t}`)"),
                None => String::new(),
            };
            return Err(Error::UnsupportedArchitecture {
                path: pretrained.path.clone(),
                found,
                hint,
                supported_architectures: registry::architectures().map(|a| a.name).collect(),
                supported_model_types: registry::model_types(),
            });
        };
        if let Some(inventory) = inventory {
            inventory.check_layer_counts(&pretrained.to_value(), &pretrained.path)?;
        }
        (family.validate)(&pretrained)?;
        Ok(AutoConfig {
            pretrained,
            family,
            architecture: arch.name.to_string(),
            task: arch.task,
        })
    }

    /// The error for a family whose models are not what `asked` loads (decoders for
    /// generation, encoders for embeddings and classification), naming what fits.
    pub(crate) fn wrong_kind(&self, asked: &'static str) -> Error {
        let hint = if self.family.is_decoder() {
            "it is a causal language model: generate text with AutoModelForCausalLM or `zoo generate`"
        } else if matches!(self.family.loaders, Loaders::Seq2Seq { .. }) {
            "it is an encoder-decoder: generate text with AutoModelForSeq2SeqLM or `zoo generate`, \
             or embed sentences with its encoder (AutoModel, `zoo embed`)"
        } else if matches!(self.family.loaders, Loaders::Image(_)) {
            "it is a vision encoder: embed images with AutoModel / ImageEmbedder or `zoo embed --image`, \
             or classify them with AutoModelForImageClassification / `zoo classify`"
        } else if matches!(self.family.loaders, Loaders::ImageText(_)) {
            "it is an image-text model: score images against labels with \
             AutoModelForZeroShotImageClassification or `zoo classify --labels`, embed texts or \
             images with `zoo embed`"
        } else {
            "it is an encoder: embed sentences with AutoModel / SentenceEmbedder or `zoo embed`, \
             or load its head with AutoModelForMaskedLM / AutoModelForSequenceClassification / \
             AutoModelForTokenClassification / AutoModelForQuestionAnswering / \
             AutoModelForMultipleChoice"
        };
        Error::WrongKind {
            path: self.pretrained.path.clone(),
            architecture: self.architecture.clone(),
            asked,
            hint: hint.into(),
        }
    }
}

/// Options of `load_pretrained` beyond the device map (the builder of
/// [`AutoModelForCausalLM::builder`]).
#[derive(Clone, Debug)]
pub struct LoadOptions {
    /// Dtype of weights and activations; `None` keeps the checkpoint's float dtype, like
    /// transformers' `dtype="auto"`. A quantized GGUF then keeps its blocks (Q4–Q8, K-quants)
    /// and computes in f32 from them (as llama.cpp does); an explicit dtype dequantizes
    /// every tensor at load, as transformers' `gguf_file=` load does.
    pub dtype: Option<DType>,
    /// A Hub revision (branch, tag or commit) for repo ids.
    pub revision: Option<String>,
    /// Memory limits; on CPU the weights must fit the `cpu` limit.
    pub max_memory: Option<MaxMemory>,
    /// Show a progress bar while loading (stderr).
    pub progress: bool,
    /// Where the model goes.
    pub device_map: DeviceMap,
    /// PEFT LoRA adapters merged into the weights as they load, in order.
    pub adapters: Vec<Adapter>,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            dtype: None,
            revision: None,
            max_memory: None,
            progress: false,
            device_map: DeviceMap::Cpu,
            adapters: Vec::new(),
        }
    }
}

/// What a load did, for the CLI and logs.
#[derive(Clone, Debug)]
pub struct LoadReport {
    /// The device inputs go to (the one holding the embeddings).
    pub device: Device,
    /// The dtype of weights and activations.
    pub dtype: DType,
    /// Bytes of weights as resident after the load: GGUF blocks at their stored size when
    /// kept, every other tensor in `dtype`.
    pub weight_bytes: u64,
    /// Whether GGUF block-quantized matrices were kept as blocks (products compute in f32
    /// from them) rather than dequantized.
    pub blocks_kept: bool,
    /// Wall time of the load, tokenizer and configs included.
    pub seconds: f64,
    /// Every device the model runs on, in execution order (several for a split model).
    pub devices: Vec<Device>,
    /// A note about what `DeviceMap::Auto` picked, if it was used.
    pub note: Option<String>,
    /// The plan a strategy device map (balanced, sequential, a multi-device PJRT map) was
    /// resolved with: per-device bytes and the cuts.
    pub plan: Option<zoo_runtime::device_map::Plan>,
    /// What `max_memory`'s `cpu` limit leaves beside the weights of a model on the host:
    /// the room its KV caches may take (`None` without such a limit).
    pub cpu_room: Option<u64>,
}

/// The checkpoint `repo_or_path` names and the options its load takes: an adapter repo or
/// folder opens its base model, the adapter merged before any other.
fn open(repo_or_path: &str, opts: &LoadOptions) -> Result<(Pretrained, LoadOptions)> {
    let mut opts = opts.clone();
    let repo_or_path = match adapters::base_of(repo_or_path)? {
        Some((base, revision)) => {
            opts.adapters.insert(0, Adapter::new(repo_or_path));
            opts.revision = revision;
            base
        }
        None => repo_or_path.to_string(),
    };
    let mut source = Source::parse(&repo_or_path)?;
    if let Some(r) = &opts.revision {
        source = source.with_revision(r)?;
    }
    Ok((
        Pretrained::from_files(zoo_hub::ModelFiles::new(source)),
        opts,
    ))
}

fn checkpoint_dtype(cfg: &PretrainedConfig) -> DType {
    match cfg.torch_dtype.as_deref().and_then(DType::parse) {
        Some(d @ (DType::F32 | DType::BF16 | DType::F16)) => d,
        _ => DType::F32,
    }
}

/// Opens the weights of `pretrained` for `opts`, checking the memory budget first.
fn open_weights(
    pretrained: &Pretrained,
    cfg: &AutoConfig,
    opts: &LoadOptions,
) -> Result<(Weights, Arc<HubSource>, LoadReport)> {
    let ck = pretrained.checkpoint()?;
    // Mapped, nothing read but the packed weights' shapes.
    let files = zoo_hub::Weights::open(ck.inventory)?;
    let prequantized =
        zoo_hub::PreQuantized::open(&cfg.pretrained.to_value(), &files, &cfg.pretrained.path)?;
    // A quantized checkpoint (GGUF, compressed-tensors, FP8) keeps what blocks it can and
    // computes in f32 from them unless a dtype was asked for, as llama.cpp runs a GGUF; an
    // explicit dtype dequantizes at load, as transformers' `gguf_file=` and its CPU
    // decompression of pre-quantized weights do.
    let dtype = match opts.dtype {
        Some(d) => d,
        None if prequantized.is_some() => DType::F32,
        None => checkpoint_dtype(&cfg.pretrained),
    };
    if !dtype.is_float() || dtype == DType::F64 {
        return Err(Error::UnsupportedDType(dtype));
    }
    let keep_blocks = opts.dtype.is_none();
    // Planned from the inventory alone: an infeasible map fails before a weight is read.
    let resolved = placement::resolve(
        &opts.device_map,
        &placement::ModelFacts {
            inventory: files.inventory(),
            config: &cfg.pretrained,
            dtype,
            max_memory: opts.max_memory.as_ref(),
        },
    )?;
    let device = resolved.device;
    let hub = Arc::new(HubSource::new(files, prequantized, opts.progress));
    let (source, merged): (Arc<dyn WeightSource>, HashSet<String>) = if opts.adapters.is_empty() {
        (hub.clone(), HashSet::new())
    } else {
        let patched = adapters::merged(hub.clone(), &opts.adapters, cfg.family)?;
        let names = patched.patched().map(str::to_string).collect();
        (Arc::new(patched), names)
    };
    // Blocks are kept only for f32 products on the eager CPU of an unsplit model.
    let blocks_here =
        keep_blocks && dtype == DType::F32 && device == Device::Cpu && resolved.placement.is_none();
    let kept = |t: &zoo_hub::TensorInfo| {
        let zoo_hub::Dtype::Quantized(q) = t.dtype else {
            return false;
        };
        blocks_here
            && zoo_runtime::nn::keeps_blocks(q, &t.shape)
            // A weight an adapter changes is merged dense.
            && !merged.contains(&t.name)
    };
    // What stays resident: blocks as stored when kept, every other tensor in `dtype`; a
    // pre-quantized weight as the blocks it converts to, or dense.
    let inventory = hub.inventory();
    let prequantized = hub.prequantized();
    let mut weight_bytes: u64 = inventory
        .tensors()
        .iter()
        .filter(|t| !prequantized.is_some_and(|c| c.is_part(&t.name)))
        .map(|t| {
            if kept(t) {
                t.nbytes
            } else {
                (t.numel() * dtype.size_in_bytes()) as u64
            }
        })
        .sum();
    let mut blocks_kept = inventory.tensors().iter().any(kept);
    for (c, name) in prequantized
        .iter()
        .flat_map(|c| c.names().map(move |n| (c, n)))
    {
        let shape = c.get(name).map_or([0, 0], |q| q.shape);
        let as_blocks = if blocks_here && !merged.contains(name) {
            c.block_type(hub.files(), name).map_err(Error::from)?
        } else {
            None
        };
        weight_bytes += match as_blocks {
            Some((_, bytes)) => bytes,
            None => (shape[0] * shape[1] * dtype.size_in_bytes()) as u64,
        };
        blocks_kept |= as_blocks.is_some();
    }
    let host_only = device == Device::Cpu && resolved.placement.is_none();
    let cpu_limit = opts
        .max_memory
        .as_ref()
        .and_then(|m| m.get(&Placement::Cpu));
    if let Some(limit) = cpu_limit {
        if host_only && weight_bytes > limit {
            return Err(Error::UnsupportedDeviceMap {
                map: "cpu".into(),
                reason: format!(
                    "the weights take {weight_bytes} bytes in {dtype} but max_memory allows {limit} on cpu; \
                     raise the limit or load in a smaller dtype (bf16)"
                ),
            });
        }
    }
    let mut weights = Weights::new(source, dtype, device)
        .keeping_blocks(keep_blocks)
        .with_tp_plan(cfg.family.tp_plan);
    if let Some(p) = resolved.placement.clone() {
        weights = weights.with_placement(p);
    }
    let report = LoadReport {
        device,
        devices: vec![device],
        dtype,
        weight_bytes,
        blocks_kept,
        seconds: 0.0,
        note: resolved.note,
        plan: resolved.plan,
        cpu_room: cpu_limit
            .filter(|_| host_only)
            .map(|l| l.saturating_sub(weight_bytes)),
    };
    Ok((weights, hub, report))
}

/// The base model of any family: a decoder (hidden states with a KV cache) or an encoder.
#[derive(Debug)]
pub enum BaseModel {
    /// `LlamaModel`, `GPT2Model`, ...
    Decoder(Box<dyn DecoderModel>),
    /// `BertModel`, `CLIPTextModel`, ...
    Encoder(Box<dyn Encoder>),
    /// `ViTModel`, `CLIPVisionModel`, ...
    Image(Box<dyn ImageEncoder>),
    /// `CLIPModel`.
    ImageText(Box<dyn ImageTextModel>),
}

impl BaseModel {
    /// The decoder, for decoder families.
    pub fn as_decoder(&self) -> Option<&dyn DecoderModel> {
        match self {
            BaseModel::Decoder(m) => Some(&**m),
            _ => None,
        }
    }

    /// The encoder, for text encoder families.
    pub fn as_encoder(&self) -> Option<&dyn Encoder> {
        match self {
            BaseModel::Encoder(m) => Some(&**m),
            _ => None,
        }
    }

    /// The image encoder, for vision families.
    pub fn as_image_encoder(&self) -> Option<&dyn ImageEncoder> {
        match self {
            BaseModel::Image(m) => Some(&**m),
            _ => None,
        }
    }

    /// The image-text model, for contrastive families.
    pub fn as_image_text(&self) -> Option<&dyn ImageTextModel> {
        match self {
            BaseModel::ImageText(m) => Some(&**m),
            _ => None,
        }
    }
}

/// `AutoModel`: the base model (hidden states) of a checkpoint. A checkpoint with a head
/// (`LlamaForCausalLM`'s `model.*`, `BertForMaskedLM`'s `bert.*`) gives its base model, as
/// transformers does.
pub struct AutoModel;

impl AutoModel {
    /// Loads the base model of `repo_or_path` onto the device `device_map` names.
    pub fn load_pretrained(repo_or_path: &str, device_map: DeviceMap) -> Result<BaseModel> {
        AutoModel::load_with(
            repo_or_path,
            LoadOptions {
                device_map,
                ..Default::default()
            },
        )
    }

    /// [`AutoModel::load_pretrained`] with every option.
    pub fn load_with(repo_or_path: &str, opts: LoadOptions) -> Result<BaseModel> {
        let (pretrained, opts) = open(repo_or_path, &opts)?;
        let cfg = AutoConfig::of_checkpoint(&pretrained)?;
        let (w, source, _) = open_weights(&pretrained, &cfg, &opts)?;
        let m = match cfg.family.loaders {
            Loaders::Decoder { base, .. } => base(&w, &cfg.pretrained).map(BaseModel::Decoder),
            // An encoder-decoder's base model here is its encoder (what embeddings and
            // diffusion pipelines read).
            Loaders::Encoder(load) | Loaders::Seq2Seq { encoder: load, .. } => {
                load(&w, &cfg.pretrained, Task::Base).map(BaseModel::Encoder)
            }
            Loaders::Image(load) => load(&w, &cfg.pretrained, Task::Base).map(BaseModel::Image),
            Loaders::ImageText(load) => load(&w, &cfg.pretrained).map(BaseModel::ImageText),
        };
        source.finish();
        m
    }
}

/// Loads an encoder family's model with the head of `task`, with its config and files.
pub(crate) fn load_encoder(
    repo_or_path: &str,
    opts: &LoadOptions,
    task: Task,
) -> Result<(Box<dyn Encoder>, AutoConfig, Pretrained)> {
    let (pretrained, opts) = open(repo_or_path, opts)?;
    let opts = &opts;
    let cfg = AutoConfig::of_checkpoint(&pretrained)?;
    // A base model's checkpoint holds no head to load (transformers would draw a random one).
    if task != Task::Base
        && cfg.task == Task::Base
        && !cfg.pretrained.architectures.is_empty()
        && matches!(cfg.family.loaders, Loaders::Encoder(_))
    {
        return Err(Error::Config {
            path: cfg.pretrained.path.clone(),
            reason: format!(
                "the checkpoint is a {} (the base model, no head); {} needs one fine-tuned with its head (a *For{} checkpoint)",
                cfg.architecture,
                task.auto_class(),
                task.auto_class().trim_start_matches("AutoModelFor")
            ),
        });
    }
    let m = match cfg.family.loaders {
        Loaders::Encoder(load) | Loaders::Seq2Seq { encoder: load, .. } => {
            let (w, source, _) = open_weights(&pretrained, &cfg, opts)?;
            let m = load(&w, &cfg.pretrained, task);
            source.finish();
            m?
        }
        // Every decoder family takes transformers' generic classification heads, and its base
        // model embeds (the decoder embedders: sentence-transformers' `lasttoken` pooling).
        Loaders::Decoder { base, .. } => {
            use crate::models::decoder::{DecoderTower, ForClassification};
            let (w, source, _) = open_weights(&pretrained, &cfg, opts)?;
            let m: Result<Box<dyn Encoder>> = match task {
                // A causal LM's checkpoint embeds only as a sentence-transformers folder (how
                // decoder embedders ship, their config naming the causal LM); a plain LM is
                // pointed to generation instead.
                Task::Base
                    if cfg.task != Task::Base
                        && pretrained.files().get_optional("modules.json")?.is_none() =>
                {
                    Err(cfg.wrong_kind(task.auto_class()))
                }
                Task::Base => base(&w, &cfg.pretrained)
                    .map(|m| Box::new(DecoderTower::new(m)) as Box<dyn Encoder>),
                Task::SequenceClassification
                | Task::TokenClassification
                | Task::QuestionAnswering => {
                    ForClassification::load(base, &w, &cfg.pretrained, task)
                        .map(|m| Box::new(m) as Box<dyn Encoder>)
                }
                _ => Err(cfg.wrong_kind(task.auto_class())),
            };
            source.finish();
            m?
        }
        // A CLIPModel checkpoint embeds text with its projected text tower.
        Loaders::ImageText(load) if task == Task::Base => {
            let (w, source, _) = open_weights(&pretrained, &cfg, opts)?;
            let m = load(&w, &cfg.pretrained);
            source.finish();
            m?.into_text()
        }
        _ => return Err(cfg.wrong_kind(task.auto_class())),
    };
    Ok((m, cfg, pretrained))
}

/// Loads an encoder checkpoint with the head of `task` (what the parity harness and tools
/// that choose the head by task call; the `AutoModelFor*` classes are this with their task).
pub fn load_encoder_with(
    repo_or_path: &str,
    opts: LoadOptions,
    task: Task,
) -> Result<Box<dyn Encoder>> {
    Ok(load_encoder(repo_or_path, &opts, task)?.0)
}

/// Loads a vision family's model with the head of `task` (`Base`, `ImageClassification`).
pub fn load_image_encoder_with(
    repo_or_path: &str,
    opts: LoadOptions,
    task: Task,
) -> Result<Box<dyn ImageEncoder>> {
    Ok(load_image_encoder(repo_or_path, &opts, task)?.0)
}

/// Loads a vision family's model (or a CLIPModel's vision tower, for `Base`) with its files.
pub(crate) fn load_image_encoder(
    repo_or_path: &str,
    opts: &LoadOptions,
    task: Task,
) -> Result<(Box<dyn ImageEncoder>, Pretrained)> {
    let (pretrained, opts) = open(repo_or_path, opts)?;
    let opts = &opts;
    let cfg = AutoConfig::of_checkpoint(&pretrained)?;
    let m: Box<dyn ImageEncoder> = match cfg.family.loaders {
        Loaders::Image(load) => {
            let (w, source, _) = open_weights(&pretrained, &cfg, opts)?;
            let m = load(&w, &cfg.pretrained, task);
            source.finish();
            m?
        }
        Loaders::ImageText(load) if task == Task::Base => {
            let (w, source, _) = open_weights(&pretrained, &cfg, opts)?;
            let m = load(&w, &cfg.pretrained);
            source.finish();
            m?.into_vision()
        }
        _ => return Err(cfg.wrong_kind(task.auto_class())),
    };
    Ok((m, pretrained))
}

/// Loads a contrastive image-text checkpoint (`CLIPModel`).
pub fn load_image_text_with(
    repo_or_path: &str,
    opts: LoadOptions,
) -> Result<Box<dyn ImageTextModel>> {
    Ok(load_image_text(repo_or_path, &opts)?.0)
}

/// Loads a contrastive image-text checkpoint with its files.
pub(crate) fn load_image_text(
    repo_or_path: &str,
    opts: &LoadOptions,
) -> Result<(Box<dyn ImageTextModel>, Pretrained)> {
    let (pretrained, opts) = open(repo_or_path, opts)?;
    let opts = &opts;
    let cfg = AutoConfig::of_checkpoint(&pretrained)?;
    let Loaders::ImageText(load) = cfg.family.loaders else {
        return Err(cfg.wrong_kind("AutoModelForZeroShotImageClassification"));
    };
    let (w, source, _) = open_weights(&pretrained, &cfg, opts)?;
    let m = load(&w, &cfg.pretrained);
    source.finish();
    Ok((m?, pretrained))
}

/// `AutoModelForImageClassification`: a vision encoder with its classifier
/// (`ViTForImageClassification`; labels from `id2label`).
pub struct AutoModelForImageClassification;

impl AutoModelForImageClassification {
    /// Loads `repo_or_path` onto the device `device_map` names.
    pub fn load_pretrained(
        repo_or_path: &str,
        device_map: DeviceMap,
    ) -> Result<Box<dyn ImageEncoder>> {
        AutoModelForImageClassification::load_with(
            repo_or_path,
            LoadOptions {
                device_map,
                ..Default::default()
            },
        )
    }

    /// [`Self::load_pretrained`] with every option.
    pub fn load_with(repo_or_path: &str, opts: LoadOptions) -> Result<Box<dyn ImageEncoder>> {
        load_image_encoder_with(repo_or_path, opts, Task::ImageClassification)
    }
}

/// `AutoModelForZeroShotImageClassification`: a contrastive image-text model (`CLIPModel`)
/// whose `logits_per_image` score an image against label prompts.
pub struct AutoModelForZeroShotImageClassification;

impl AutoModelForZeroShotImageClassification {
    /// Loads `repo_or_path` onto the device `device_map` names.
    pub fn load_pretrained(
        repo_or_path: &str,
        device_map: DeviceMap,
    ) -> Result<Box<dyn ImageTextModel>> {
        load_image_text_with(
            repo_or_path,
            LoadOptions {
                device_map,
                ..Default::default()
            },
        )
    }

    /// [`Self::load_pretrained`] with every option.
    pub fn load_with(repo_or_path: &str, opts: LoadOptions) -> Result<Box<dyn ImageTextModel>> {
        load_image_text_with(repo_or_path, opts)
    }
}

macro_rules! encoder_auto_class {
    ($(#[$doc:meta])* $name:ident, $task:expr) => {
        $(#[$doc])*
        pub struct $name;

        impl $name {
            /// Loads `repo_or_path` onto the device `device_map` names.
            pub fn load_pretrained(repo_or_path: &str, device_map: DeviceMap) -> Result<Box<dyn Encoder>> {
                $name::load_with(repo_or_path, LoadOptions { device_map, ..Default::default() })
            }

            /// [`Self::load_pretrained`] with every option.
            pub fn load_with(repo_or_path: &str, opts: LoadOptions) -> Result<Box<dyn Encoder>> {
                load_encoder_with(repo_or_path, opts, $task)
            }
        }
    };
}

encoder_auto_class!(
    /// `AutoModelForMaskedLM`: an encoder with its masked-token head (`BertForMaskedLM`).
    AutoModelForMaskedLM,
    Task::MaskedLm
);
encoder_auto_class!(
    /// `AutoModelForSequenceClassification`: an encoder with a classifier over the pooled
    /// output (`BertForSequenceClassification`), or a decoder with `score` at each row's
    /// rightmost non-padding token (`LlamaForSequenceClassification`, `GPT2For…`, every
    /// decoder family's); labels from `id2label`.
    AutoModelForSequenceClassification,
    Task::SequenceClassification
);
encoder_auto_class!(
    /// `AutoModelForTokenClassification`: an encoder or a decoder with a classifier per token
    /// (`BertForTokenClassification`, `Qwen2ForTokenClassification`, ...; labels from
    /// `id2label`).
    AutoModelForTokenClassification,
    Task::TokenClassification
);

encoder_auto_class!(
    /// `AutoModelForQuestionAnswering`: an encoder or a decoder with `qa_outputs`, a span's
    /// start and end scores per token (`BertForQuestionAnswering`, `LlamaForQuestionAnswering`,
    /// ...; [`EncoderOutput::span_logits`](crate::EncoderOutput::span_logits) splits them).
    AutoModelForQuestionAnswering,
    Task::QuestionAnswering
);
encoder_auto_class!(
    /// `AutoModelForMultipleChoice`: an encoder scoring each choice of `[batch, choices, seq]`
    /// inputs (`BertForMultipleChoice`), logits `[batch, choices]`.
    AutoModelForMultipleChoice,
    Task::MultipleChoice
);

/// `AutoModelForCausalLM`: loads a causal LM with its tokenizer, chat template and
/// generation defaults.
pub struct AutoModelForCausalLM;

impl AutoModelForCausalLM {
    /// Loads `repo_or_path` (a folder, a `.safetensors`/`.gguf` file, or `org/name[@rev]`)
    /// onto the device `device_map` names, in the checkpoint's dtype.
    pub fn load_pretrained(repo_or_path: &str, device_map: DeviceMap) -> Result<TextGenerator> {
        AutoModelForCausalLM::builder(repo_or_path)
            .device_map(device_map)
            .load()
    }

    /// A builder for dtype, revision, max_memory and progress.
    pub fn builder(repo_or_path: &str) -> CausalLMBuilder {
        CausalLMBuilder {
            repo_or_path: repo_or_path.to_string(),
            opts: LoadOptions::default(),
        }
    }
}

/// Builder of [`AutoModelForCausalLM`] loads.
#[derive(Clone, Debug)]
pub struct CausalLMBuilder {
    repo_or_path: String,
    opts: LoadOptions,
}

/// The load options every generating model's builder takes.
macro_rules! load_option_setters {
    () => {
        /// Where the model goes.
        pub fn device_map(mut self, map: DeviceMap) -> Self {
            self.opts.device_map = map;
            self
        }
        /// The dtype of weights and activations. On a quantized GGUF this dequantizes every
        /// tensor at load (transformers' `gguf_file=` semantics); without it the blocks are
        /// kept.
        pub fn dtype(mut self, dtype: DType) -> Self {
            self.opts.dtype = Some(dtype);
            self
        }
        /// A Hub revision for repo ids.
        pub fn revision(mut self, revision: impl Into<String>) -> Self {
            self.opts.revision = Some(revision.into());
            self
        }
        /// Memory limits per device.
        pub fn max_memory(mut self, m: MaxMemory) -> Self {
            self.opts.max_memory = Some(m);
            self
        }
        /// Show a progress bar while loading.
        pub fn progress(mut self, on: bool) -> Self {
            self.opts.progress = on;
            self
        }
        /// Merges a PEFT LoRA adapter into the weights as they load (after any added
        /// before).
        pub fn adapter(mut self, adapter: Adapter) -> Self {
            self.opts.adapters.push(adapter);
            self
        }
    };
}

impl CausalLMBuilder {
    load_option_setters!();

    /// Loads the model.
    pub fn load(self) -> Result<TextGenerator> {
        let pick = |l: Loaders| match l {
            Loaders::Decoder { causal_lm, .. } => Some(causal_lm),
            _ => None,
        };
        let (model, cfg, text, mut report) =
            load_generator(&self.repo_or_path, &self.opts, "AutoModelForCausalLM", pick)?;
        report.devices = model.model().devices();
        Ok(TextGenerator {
            model,
            config: cfg,
            tokenizer: text.tokenizer,
            tokenizer_config: text.tokenizer_config,
            generation_config: text.generation_config,
            eos: text.eos,
            pad: text.pad,
            image_processor: text.image_processor,
            report,
        })
    }
}

/// `AutoModelForImageTextToText`: a vision-language model (`LlavaForConditionalGeneration`)
/// with its tokenizer, image processor and generation defaults; its
/// [`TextGenerator::generate_with_images`] reads images, and it generates from text alone
/// as any causal LM does.
pub struct AutoModelForImageTextToText;

impl AutoModelForImageTextToText {
    /// Loads `repo_or_path` onto the device `device_map` names, refusing a text-only model.
    pub fn load_pretrained(repo_or_path: &str, device_map: DeviceMap) -> Result<TextGenerator> {
        let g = AutoModelForCausalLM::load_pretrained(repo_or_path, device_map)?;
        crate::vision_language::vision_of(g.model())?;
        Ok(g)
    }

    /// A builder for dtype, revision, max_memory and progress (the causal LM's builder; a
    /// text-only model loads as one).
    pub fn builder(repo_or_path: &str) -> CausalLMBuilder {
        AutoModelForCausalLM::builder(repo_or_path)
    }
}

/// Opens `repo_or_path` and loads a generating model with the loader `pick` finds in its
/// family (`asked` names the class in the error when there is none), with its tokenizer side
/// and the load's report (its `seconds` counted to the end of the load; its `devices` are
/// the caller's to fill).
fn load_generator<M>(
    repo_or_path: &str,
    opts: &LoadOptions,
    asked: &'static str,
    pick: impl FnOnce(Loaders) -> Option<fn(&Weights, &zoo_hub::PretrainedConfig) -> Result<M>>,
) -> Result<(M, AutoConfig, TextSide, LoadReport)> {
    let started = Instant::now();
    let (pretrained, opts) = open(repo_or_path, opts)?;
    let opts = &opts;
    let cfg = AutoConfig::of_checkpoint(&pretrained)?;
    let Some(load) = pick(cfg.family.loaders) else {
        return Err(cfg.wrong_kind(asked));
    };
    // The tokenizer first: its build's scratch goes back to the system before the weights
    // arrive, so the two never peak together.
    let text = TextSide::load(&pretrained, &cfg)?;
    let (w, source, mut report) = open_weights(&pretrained, &cfg, opts)?;
    // A GGUF's header (its vocabulary and merges as parsed: 3 MiB for a 49k-token
    // vocabulary) is not needed past here either.
    drop(pretrained);
    zoo_runtime::cpu::release_freed_heap();
    let model = load(&w, &cfg.pretrained);
    source.finish();
    let model = model?;
    report.seconds = started.elapsed().as_secs_f64();
    Ok((model, cfg, text, report))
}

/// What text generation needs beside the model: the tokenizer and its config, the
/// generation defaults, and the eos and pad ids (generation_config.json, then config.json,
/// then the tokenizer's eos token).
struct TextSide {
    tokenizer: Option<Tokenizer>,
    tokenizer_config: Option<zoo_hub::TokenizerConfig>,
    generation_config: Option<zoo_hub::GenerationConfig>,
    eos: Vec<u32>,
    pad: u32,
    /// A vision-language family's image processor.
    image_processor: Option<ImageProcessor>,
}

impl TextSide {
    fn load(pretrained: &Pretrained, cfg: &AutoConfig) -> Result<TextSide> {
        let tokenizer = match Tokenizer::from_pretrained(pretrained) {
            Ok(t) => Some(t),
            Err(Error::NoTokenizer { .. }) => None,
            Err(e) => return Err(e),
        };
        let tokenizer_config = pretrained.tokenizer_config()?;
        let generation_config = pretrained.generation_config()?;
        let mut eos: Vec<u32> = generation_config
            .as_ref()
            .and_then(|g| g.eos_token_id.as_ref())
            .or(cfg.pretrained.eos_token_id.as_ref())
            .map(|t| t.to_vec())
            .unwrap_or_default();
        if eos.is_empty() {
            // Neither config names one: fall back to the tokenizer's eos token.
            if let (Some(t), Some(tc)) = (&tokenizer, &tokenizer_config) {
                if let Some(id) = tc
                    .eos_token
                    .as_ref()
                    .and_then(|e| t.token_to_id(e.content()))
                {
                    eos.push(id);
                }
            }
        }
        let pad = generation_config
            .as_ref()
            .and_then(|g| g.pad_token_id.as_ref())
            .or(cfg.pretrained.pad_token_id.as_ref())
            .and_then(|t| t.to_vec().first().copied())
            .or_else(|| eos.first().copied())
            .unwrap_or(0);
        let reads_images = cfg
            .family
            .architectures
            .iter()
            .any(|a| a.task == Task::ImageTextToText);
        // Read when the checkpoint has one: pixel values given directly need none.
        let has_processor = pretrained.processor_config_path()?.is_some()
            || pretrained.preprocessor_config_path()?.is_some();
        let image_processor = match reads_images && has_processor {
            true => Some(ImageProcessor::from_pretrained(pretrained)?),
            false => None,
        };
        Ok(TextSide {
            tokenizer,
            tokenizer_config,
            generation_config,
            eos,
            pad,
            image_processor,
        })
    }
}

/// Generates for one prompt through `run`, handing each newly complete piece of text to
/// `on_text` (and, at the end, text held back because its bytes never formed a character).
fn stream_one(
    ids: Vec<u32>,
    mut on_text: impl FnMut(&str),
    run: impl FnOnce(
        &[Vec<u32>],
        &mut dyn FnMut(TokenEvent<'_>) -> bool,
    ) -> Result<(Vec<GenerationOutput>, GenerationStats)>,
) -> Result<(GenerationOutput, GenerationStats)> {
    let mut streamed = 0;
    let (mut outs, stats) = run(&[ids], &mut |e| {
        if !e.text.is_empty() {
            streamed += e.text.len();
            on_text(e.text);
        }
        true
    })?;
    let out = outs
        .pop()
        .ok_or_else(|| Error::Internal("no output".into()))?;
    if let Some(rest) = out.text.as_deref().and_then(|t| t.get(streamed..)) {
        if !rest.is_empty() {
            on_text(rest);
        }
    }
    Ok((out, stats))
}

/// A loaded causal LM with what generation needs: tokenizer, chat template, eos and pad ids.
pub struct TextGenerator {
    model: Box<dyn CausalLm>,
    config: AutoConfig,
    tokenizer: Option<Tokenizer>,
    tokenizer_config: Option<zoo_hub::TokenizerConfig>,
    generation_config: Option<zoo_hub::GenerationConfig>,
    eos: Vec<u32>,
    pad: u32,
    image_processor: Option<ImageProcessor>,
    report: LoadReport,
}

impl TextGenerator {
    /// The model.
    pub fn model(&self) -> &dyn CausalLm {
        &*self.model
    }
    /// The dispatched config.
    pub fn config(&self) -> &AutoConfig {
        &self.config
    }
    /// The tokenizer, when the checkpoint has one.
    pub fn tokenizer(&self) -> Option<&Tokenizer> {
        self.tokenizer.as_ref()
    }
    /// Eos ids generation stops on by default.
    pub fn eos_token_ids(&self) -> &[u32] {
        &self.eos
    }
    /// The id used for left padding.
    pub fn pad_token_id(&self) -> u32 {
        self.pad
    }
    /// What the load did (device, dtype, bytes, seconds).
    pub fn load_report(&self) -> &LoadReport {
        &self.report
    }

    /// How many KV cache rows of `capacity` tokens fit the memory of every device the cache
    /// lies on: on the host, its available memory and what the load's `max_memory` `cpu`
    /// limit leaves beside the weights; on a PJRT device, nine tenths of what it reports free
    /// now that the weights are loaded (the rest for activations, as vLLM keeps a share),
    /// the XLA CPU plugin's devices sharing the host's available memory; on a mesh, its
    /// devices together when the cache splits by head over them. `None` when no device's
    /// room is known.
    pub fn cache_rows_that_fit(&self, capacity: usize) -> Option<usize> {
        let decoder = self.model.model();
        let specs = decoder.cache_specs();
        let mut devices: Vec<Device> = specs.iter().map(|s| s.device).collect();
        devices.dedup();
        devices
            .iter()
            .filter_map(|d| {
                let row = KvCache::bytes_on(d, &specs, 1, capacity, decoder.dtype(), false);
                let room = match d {
                    Device::Pjrt(p) => {
                        let ordinals = p.ordinals();
                        let budgets =
                            zoo_runtime::device_map::pjrt_budgets(p.platform, &ordinals, None);
                        let least = budgets.ok()?.iter().map(|b| b.bytes).min()? / 10 * 9;
                        // A mesh's devices each hold 1/N of a cache split by head, unless
                        // they are the XLA CPU plugin's, which share the host's memory.
                        let n = ordinals.len();
                        let split = specs.iter().all(|s| s.kv_heads % n == 0);
                        let separate = p.platform != zoo_runtime::PjrtPlatform::Cpu;
                        Some(if split && separate {
                            least.saturating_mul(n as u64)
                        } else {
                            least
                        })
                    }
                    _ => [
                        zoo_runtime::device_map::host_available(),
                        self.report.cpu_room,
                    ]
                    .into_iter()
                    .flatten()
                    .min(),
                };
                match (row, room?) {
                    (Some(0), _) => None,
                    (Some(row), room) => Some(usize::try_from(room / row).unwrap_or(usize::MAX)),
                    (None, _) => Some(0),
                }
            })
            .min()
    }

    /// Whether an engine over this model pages its KV cache (a pool of blocks the sequences
    /// share), rather than holding a row of the whole context per sequence (see
    /// [`generation::engine`]).
    pub fn pages_cache(&self) -> bool {
        generation::Engine::pages(&*self.model)
    }

    /// Refuses a KV cache of `rows` sequences × `capacity` tokens that would not fit what
    /// the load's `max_memory` `cpu` limit leaves beside the weights (the host's own memory
    /// is checked wherever a cache is made).
    pub fn check_cache_room(&self, rows: usize, capacity: usize) -> Result<()> {
        let Some(room) = self.report.cpu_room else {
            return Ok(());
        };
        let decoder = self.model.model();
        let needs = KvCache::host_bytes(
            &decoder.cache_specs(),
            rows,
            capacity,
            decoder.dtype(),
            false,
        );
        if needs.is_some_and(|n| n <= room) {
            return Ok(());
        }
        let human = zoo_runtime::device_map::human;
        Err(Error::invalid(
            "max_memory",
            format!(
                "a KV cache of {rows} sequence(s) × {capacity} tokens needs {}, and max_memory leaves {} on cpu beside the weights; \
                 raise the cpu limit or ask for fewer sequences or tokens",
                needs.map_or("more than 2^64 bytes".into(), human),
                human(room)
            ),
        ))
    }

    /// The model's `generation_config.json`, when it has one.
    pub fn generation_config(&self) -> Option<&zoo_hub::GenerationConfig> {
        self.generation_config.as_ref()
    }

    /// Generation defaults from `generation_config.json` (greedy, 20 tokens without one).
    pub fn default_options(&self) -> GenerationOptions {
        self.generation_config
            .as_ref()
            .map(GenerationOptions::from_generation_config)
            .unwrap_or_default()
    }

    fn require_tokenizer(&self) -> Result<&Tokenizer> {
        self.tokenizer.as_ref().ok_or_else(|| Error::NoTokenizer {
            source_name: self.config.pretrained.path.display().to_string(),
        })
    }

    /// The model's chat template.
    pub fn chat_template(&self) -> Result<ChatTemplate> {
        let tc = self.tokenizer_config.as_ref().ok_or_else(|| {
            Error::ChatTemplate(
                "this model has no tokenizer_config.json, so no chat template".into(),
            )
        })?;
        ChatTemplate::from_tokenizer_config(tc)
    }

    /// Renders `messages` with the chat template, ready for generation
    /// (`add_generation_prompt = true`).
    pub fn apply_chat_template(&self, messages: &[Message]) -> Result<String> {
        self.chat_template()?.apply(messages, true)
    }

    /// Token ids of a prompt: a plain prompt gets the tokenizer's special tokens (BOS), a
    /// rendered chat template does not (it writes its own), as in transformers.
    pub fn encode(&self, text: &str, chat_rendered: bool) -> Result<Vec<u32>> {
        if text.is_empty() {
            return Err(Error::invalid("prompt", "the prompt is empty".into()));
        }
        self.require_tokenizer()?.encode(text, !chat_rendered)
    }

    /// Generates from token ids for a batch (left-padded), calling `on_token` per new token.
    pub fn generate_ids(
        &self,
        prompts: &[Vec<u32>],
        opts: &GenerationOptions,
        on_token: impl FnMut(TokenEvent<'_>) -> bool,
    ) -> Result<(Vec<GenerationOutput>, GenerationStats)> {
        generation::generate(
            &*self.model,
            self.tokenizer.as_ref(),
            prompts,
            opts,
            &self.eos,
            self.pad,
            on_token,
        )
    }

    /// [`TextGenerator::generate_ids`] where a prompt may carry its first layer's input
    /// (`[prompt, hidden]`: a vision-language prompt's embeddings with its images' features,
    /// [`crate::vision_language::prompt_embeds`]).
    pub fn generate_ids_embedded(
        &self,
        prompts: &[Vec<u32>],
        embeds: Vec<Option<zoo_runtime::Tensor>>,
        opts: &GenerationOptions,
        on_token: impl FnMut(TokenEvent<'_>) -> bool,
    ) -> Result<(Vec<GenerationOutput>, GenerationStats)> {
        generation::generate_embedded(
            &*self.model,
            self.tokenizer.as_ref(),
            prompts,
            embeds,
            opts,
            (&self.eos, self.pad),
            on_token,
        )
    }

    /// A generation engine over this model with its tokenizer, eos and pad ids: sequences
    /// join it between steps and run together, each with its own options (what a server
    /// drives).
    pub fn engine(&self, config: generation::EngineConfig) -> Result<generation::Engine<'_>> {
        let (rows, slots) = generation::Engine::cache_shape(&*self.model, config);
        self.check_cache_room(rows, slots)?;
        generation::Engine::new(
            &*self.model,
            self.tokenizer.as_ref(),
            &self.eos,
            self.pad,
            config,
        )
    }

    /// Generates for a batch of text prompts.
    pub fn generate(
        &self,
        prompts: &[&str],
        opts: &GenerationOptions,
    ) -> Result<Vec<GenerationOutput>> {
        let ids = prompts
            .iter()
            .map(|p| self.encode(p, false))
            .collect::<Result<Vec<_>>>()?;
        Ok(self.generate_ids(&ids, opts, |_| true)?.0)
    }

    /// Generates for one text prompt and returns the new text.
    pub fn generate_text(&self, prompt: &str, opts: &GenerationOptions) -> Result<String> {
        let out = self.generate(&[prompt], opts)?;
        Ok(out
            .into_iter()
            .next()
            .and_then(|o| o.text)
            .unwrap_or_default())
    }

    /// Generates for one prompt (`chat_rendered` when it came from the chat template),
    /// handing each newly complete piece of text to `on_text`.
    pub fn generate_stream(
        &self,
        prompt: &str,
        chat_rendered: bool,
        opts: &GenerationOptions,
        on_text: impl FnMut(&str),
    ) -> Result<(GenerationOutput, GenerationStats)> {
        let ids = self.encode(prompt, chat_rendered)?;
        stream_one(ids, on_text, |prompts, on_token| {
            self.generate_ids(prompts, opts, on_token)
        })
    }

    /// A vision-language prompt's token ids, each image placeholder expanded, and the
    /// images' pixel values on the host (none without images): the prompt tokenized as
    /// transformers' processors tokenize it (special tokens added unless it starts with the
    /// bos token), the images through the model's image processor. A placeholder without an
    /// image, or an image for a text-only model, is refused.
    pub fn image_prompt(
        &self,
        prompt: &str,
        images: &[RgbImage],
    ) -> Result<(Vec<u32>, Option<zoo_runtime::Tensor>)> {
        let vision = crate::vision_language::vision_of(&*self.model)?;
        if prompt.is_empty() {
            return Err(Error::invalid("prompt", "the prompt is empty".into()));
        }
        let bos = self
            .tokenizer_config
            .as_ref()
            .and_then(|c| c.bos_token.as_ref())
            .map(|t| t.content().to_string())
            .filter(|b| !b.is_empty());
        let add_special = !bos.is_some_and(|b| prompt.starts_with(&b));
        let ids = self.require_tokenizer()?.encode(prompt, add_special)?;
        let ids = crate::vision_language::expand_image_tokens(&ids, vision);
        if images.is_empty() {
            if ids.contains(&vision.image_token_id()) {
                return Err(Error::invalid(
                    "images",
                    "the prompt holds an image placeholder but no image was given".into(),
                ));
            }
            return Ok((ids, None));
        }
        let processor = self.image_processor.as_ref().ok_or_else(|| {
            Error::invalid(
                "images",
                "the checkpoint has no preprocessor_config.json (nor a processor_config.json with an image_processor) to turn images into pixel values".into(),
            )
        })?;
        let pixels = processor.pixel_values(images, &Device::Cpu)?;
        Ok((ids, Some(pixels)))
    }

    /// The image processor of a vision-language model (when its checkpoint has one).
    pub fn image_processor(&self) -> Option<&ImageProcessor> {
        self.image_processor.as_ref()
    }

    /// Generates for one prompt about `images` (a vision-language model), streaming text to
    /// `on_text`: the prompt (rendered by the chat template or not) holds one image
    /// placeholder (the tokenizer's image token, e.g. `<image>`, as the chat template writes
    /// it) per image, in order; each is expanded to the image's tokens and takes its
    /// features. The prompt is tokenized as transformers' processors tokenize it: special
    /// tokens added unless it already starts with the bos token.
    pub fn generate_with_images(
        &self,
        prompt: &str,
        images: &[RgbImage],
        opts: &GenerationOptions,
        on_text: impl FnMut(&str),
    ) -> Result<(GenerationOutput, GenerationStats)> {
        let (ids, pixels) = self.image_prompt(prompt, images)?;
        let embeds = match &pixels {
            Some(px) => Some(crate::vision_language::prompt_embeds(
                &*self.model,
                &ids,
                px,
            )?),
            None => None,
        };
        stream_one(ids, on_text, |prompts, on_token| {
            self.generate_ids_embedded(prompts, vec![embeds], opts, on_token)
        })
    }
}

/// `AutoModelForSeq2SeqLM`: loads an encoder-decoder (T5, UMT5) with its tokenizer and
/// generation defaults.
pub struct AutoModelForSeq2SeqLM;

impl AutoModelForSeq2SeqLM {
    /// Loads `repo_or_path` (a folder, a `.safetensors` file, or `org/name[@rev]`) onto the
    /// device `device_map` names, in the checkpoint's dtype.
    pub fn load_pretrained(
        repo_or_path: &str,
        device_map: DeviceMap,
    ) -> Result<Text2TextGenerator> {
        AutoModelForSeq2SeqLM::builder(repo_or_path)
            .device_map(device_map)
            .load()
    }

    /// A builder for dtype, revision, max_memory and progress.
    pub fn builder(repo_or_path: &str) -> Seq2SeqLMBuilder {
        Seq2SeqLMBuilder {
            repo_or_path: repo_or_path.to_string(),
            opts: LoadOptions::default(),
        }
    }
}

/// Builder of [`AutoModelForSeq2SeqLM`] loads.
#[derive(Clone, Debug)]
pub struct Seq2SeqLMBuilder {
    repo_or_path: String,
    opts: LoadOptions,
}

impl Seq2SeqLMBuilder {
    load_option_setters!();

    /// Loads the model.
    pub fn load(self) -> Result<Text2TextGenerator> {
        let pick = |l: Loaders| match l {
            Loaders::Seq2Seq { seq2seq, .. } => Some(seq2seq),
            _ => None,
        };
        let (model, cfg, text, mut report) = load_generator(
            &self.repo_or_path,
            &self.opts,
            "AutoModelForSeq2SeqLM",
            pick,
        )?;
        report.devices = model.devices();
        // generation_config.json may name another start token than config.json.
        let decoder_start = text
            .generation_config
            .as_ref()
            .and_then(|g| g.extra.get("decoder_start_token_id"))
            .and_then(serde_json::Value::as_u64)
            .and_then(|id| u32::try_from(id).ok())
            .unwrap_or_else(|| model.decoder_start_token_id());
        Ok(Text2TextGenerator {
            model,
            config: cfg,
            text,
            decoder_start,
            report,
        })
    }
}

/// A loaded encoder-decoder with what generation needs: tokenizer, eos, pad and decoder
/// start ids.
pub struct Text2TextGenerator {
    model: Box<dyn Seq2SeqLm>,
    config: AutoConfig,
    text: TextSide,
    decoder_start: u32,
    report: LoadReport,
}

impl Text2TextGenerator {
    /// The model.
    pub fn model(&self) -> &dyn Seq2SeqLm {
        &*self.model
    }
    /// The dispatched config.
    pub fn config(&self) -> &AutoConfig {
        &self.config
    }
    /// The tokenizer, when the checkpoint has one.
    pub fn tokenizer(&self) -> Option<&Tokenizer> {
        self.text.tokenizer.as_ref()
    }
    /// Eos ids generation stops on by default.
    pub fn eos_token_ids(&self) -> &[u32] {
        &self.text.eos
    }
    /// The id the encoder's input is padded with.
    pub fn pad_token_id(&self) -> u32 {
        self.text.pad
    }
    /// The decoder's first input (generation_config.json, then config.json).
    pub fn decoder_start_token_id(&self) -> u32 {
        self.decoder_start
    }
    /// What the load did (device, dtype, bytes, seconds).
    pub fn load_report(&self) -> &LoadReport {
        &self.report
    }

    /// The model's `generation_config.json`, when it has one.
    pub fn generation_config(&self) -> Option<&zoo_hub::GenerationConfig> {
        self.text.generation_config.as_ref()
    }

    /// Generation defaults from `generation_config.json` (greedy, 20 tokens without one).
    pub fn default_options(&self) -> GenerationOptions {
        self.text
            .generation_config
            .as_ref()
            .map(GenerationOptions::from_generation_config)
            .unwrap_or_default()
    }

    /// Token ids of a prompt, with the tokenizer's special tokens (T5 appends `</s>`).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        if text.is_empty() {
            return Err(Error::invalid("prompt", "the prompt is empty".into()));
        }
        let tokenizer = self
            .text
            .tokenizer
            .as_ref()
            .ok_or_else(|| Error::NoTokenizer {
                source_name: self.config.pretrained.path.display().to_string(),
            })?;
        tokenizer.encode(text, true)
    }

    /// Generates from token ids for a batch, calling `on_token` per new token.
    pub fn generate_ids(
        &self,
        prompts: &[Vec<u32>],
        opts: &GenerationOptions,
        on_token: impl FnMut(TokenEvent<'_>) -> bool,
    ) -> Result<(Vec<GenerationOutput>, GenerationStats)> {
        generation::generate_seq2seq(
            &*self.model,
            self.text.tokenizer.as_ref(),
            prompts,
            opts,
            &self.text.eos,
            self.text.pad,
            self.decoder_start,
            on_token,
        )
    }

    /// Generates for a batch of text prompts.
    pub fn generate(
        &self,
        prompts: &[&str],
        opts: &GenerationOptions,
    ) -> Result<Vec<GenerationOutput>> {
        let ids = prompts
            .iter()
            .map(|p| self.encode(p))
            .collect::<Result<Vec<_>>>()?;
        Ok(self.generate_ids(&ids, opts, |_| true)?.0)
    }

    /// Generates for one text prompt and returns the new text.
    pub fn generate_text(&self, prompt: &str, opts: &GenerationOptions) -> Result<String> {
        let out = self.generate(&[prompt], opts)?;
        Ok(out
            .into_iter()
            .next()
            .and_then(|o| o.text)
            .unwrap_or_default())
    }

    /// Generates for one prompt, handing each newly complete piece of text to `on_text`.
    pub fn generate_stream(
        &self,
        prompt: &str,
        opts: &GenerationOptions,
        on_text: impl FnMut(&str),
    ) -> Result<(GenerationOutput, GenerationStats)> {
        let ids = self.encode(prompt)?;
        stream_one(ids, on_text, |prompts, on_token| {
            self.generate_ids(prompts, opts, on_token)
        })
    }
}
