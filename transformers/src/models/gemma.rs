//! Gemma: mirrors transformers' `models/gemma/modeling_gemma.py` (`GemmaModel`,
//! `GemmaForCausalLM`, eager attention).
//!
//! The decoder here is the Gemma block that Gemma 2 and Gemma 3 reuse, as their `modular_*.py`
//! files derive them: the switches live in [`GemmaFeatures`] and `gemma2.rs` / `gemma3.rs` say
//! which ones they turn on. The attention and the MLP are Llama's (`llama::Attention` with
//! Gemma's scale, cap and q/k norms; `llama::Mlp` with Gemma's activation), as
//! `modular_gemma.py` derives them. What Gemma changes from Llama:
//! - the embeddings are multiplied by `sqrt(hidden_size)` rounded to the model dtype;
//! - every RMSNorm scales by `1 + weight`, in f32, casting at the end (`RmsNorm::load_gemma`);
//! - the MLP is GeGLU with the tanh GELU (`hidden_act` `"gelu"` is read as
//!   `gelu_pytorch_tanh`, as transformers does for the original releases);
//! - `head_dim` is its own field (256 in the releases), not `hidden / heads`;
//! - `lm_head` is tied to the embeddings unless a config unties it.

use std::collections::HashMap;

use zoo_hub::{PretrainedConfig, Rope};
use zoo_runtime::nn::{Embedding, RmsNorm, RopeConfig, RotaryEmbedding, Weights};
use zoo_runtime::{Activation, DType, Device, RopeStyle, Tensor};

use super::decoder::ForCausalLM;
use super::llama::{self, Attention, AttentionKind, DecoderFeatures, Mlp, Positions};
use super::placement::{execution_order, on_device};
use crate::cache::{CacheSpec, KvCache};
use crate::config::DecoderConfig;
use crate::family::{Architecture, Family, Layout, Loaders, Names, Task};
use crate::kinds::{checked_ids, CausalLm, DecoderModel, ForwardArgs, ModelOutput};
use crate::{Error, Result};

/// The registry entry of `gemma`.
pub(crate) const FAMILY: Family = family::<Gemma>(Names {
    model_type: "gemma",
    modeling_file: "models/gemma/modeling_gemma.py",
    architectures: &[
        Architecture::new("GemmaForCausalLM", Task::CausalLm),
        Architecture::new("GemmaModel", Task::Base),
        Architecture::new(
            "GemmaForSequenceClassification",
            Task::SequenceClassification,
        ),
        Architecture::new("GemmaForTokenClassification", Task::TokenClassification),
    ],
    gguf_architectures: &["gemma"],
    no_split_modules: &["GemmaDecoderLayer"],
    tp_plan: TP_PLAN,
});

/// Gemma's tensor-parallel plan: Llama's (the same module names).
pub(crate) const TP_PLAN: zoo_runtime::device_map::TpPlan = super::llama::TP_PLAN;

/// Gemma's own switches ([`features`]).
pub(crate) struct Gemma;
impl Switches for Gemma {
    const FEATURES: FeaturesFn = features;
}

/// How a family on this block reads its switches from the config.
pub(crate) type FeaturesFn = fn(&PretrainedConfig, &DecoderConfig) -> Result<GemmaFeatures>;

/// A family on this block: its switches, as transformers' `modular_gemma*.py` derive it.
pub(crate) trait Switches {
    /// The family's [`GemmaFeatures`] for a config.
    const FEATURES: FeaturesFn;
}

/// The registry entry of a family on this block with `F`'s switches.
pub(crate) const fn family<F: Switches>(names: Names) -> Family {
    names.family(
        |c| validate_with(c, F::FEATURES),
        |c| layout_with(c, F::FEATURES),
        Loaders::Decoder {
            base: |w, c| load_base_with(w, c, F::FEATURES),
            causal_lm: |w, c| load_causal_lm_with(w, c, F::FEATURES),
        },
    )
}

/// The switches of the Gemma block, per family.
#[derive(Clone, Debug)]
pub struct GemmaFeatures {
    /// Gemma 2/3: the attention output is normed (`post_attention_layernorm`) before the
    /// residual, and the MLP sits between `pre_feedforward_layernorm` and
    /// `post_feedforward_layernorm`. Gemma: `post_attention_layernorm` is the MLP's pre-norm.
    pub sandwich_norms: bool,
    /// Gemma 3: a Gemma RMSNorm over each head of q and k before rope.
    pub qk_norm: bool,
    /// Score scale: `head_dim ** -0.5` (Gemma), `query_pre_attn_scalar ** -0.5` (Gemma 2/3).
    pub scale: f64,
    /// `attn_logit_softcapping`: scores become `cap * tanh(scores / cap)` before the mask.
    pub attn_softcap: Option<f64>,
    /// `final_logit_softcapping`: the logits likewise.
    pub final_softcap: Option<f64>,
    /// The MLP's activation.
    pub activation: Activation,
    /// Sliding window per layer (`None` = full attention).
    pub windows: Vec<Option<usize>>,
    /// The rope of the full-attention layers (and of every layer when `local_rope` is none).
    pub rope: RopeConfig,
    /// Gemma 3: the rope of the sliding layers (`rope_local_base_freq`, never scaled).
    pub local_rope: Option<RopeConfig>,
    /// Whether `lm_head` shares the embedding table (`tie_word_embeddings`, default true).
    pub tie_word_embeddings: bool,
}

/// A float field that is absent (`None`), null (`Some(None)`) or a number.
pub(crate) fn nullable_f64(cfg: &PretrainedConfig, field: &str) -> Result<Option<Option<f64>>> {
    // `PretrainedConfig::get` reads null as absent; here null means "off".
    match cfg.to_value().get(field).cloned() {
        None => Ok(None),
        Some(serde_json::Value::Null) => Ok(Some(None)),
        Some(v) => v
            .as_f64()
            .filter(|x| x.is_finite() && *x > 0.0)
            .map(|x| Some(Some(x)))
            .ok_or_else(|| Error::Config {
                path: cfg.path.clone(),
                reason: format!("`{field}` is {v}; expected a positive number or null"),
            }),
    }
}

/// The activation a Gemma config names in `field` (`gelu` meaning the tanh GELU).
pub(crate) fn activation(cfg: &PretrainedConfig, field: &str, default: &str) -> Result<Activation> {
    let name = match cfg.get(field) {
        Some(serde_json::Value::String(s)) => s,
        Some(serde_json::Value::Null) | None => default.to_string(),
        Some(other) => {
            return Err(Error::Config {
                path: cfg.path.clone(),
                reason: format!("`{field}` is {other}; expected an activation name"),
            })
        }
    };
    let name = if name == "gelu" {
        "gelu_pytorch_tanh"
    } else {
        &name
    };
    Activation::from_hf(name).map_err(|e| Error::Config {
        path: cfg.path.clone(),
        reason: format!("`{field}`: {e}"),
    })
}

/// Whether `tie_word_embeddings` is on (Gemma's default: yes).
pub(crate) fn tied(cfg: &PretrainedConfig) -> bool {
    cfg.get("tie_word_embeddings")
        .and_then(|v| v.as_bool())
        .unwrap_or(true)
}

/// The rope of `c` with `params` (for per-layer-type configs, the `full_attention` entry).
pub(crate) fn rope_from(c: &DecoderConfig, params: &zoo_hub::RopeParameters) -> Result<RopeConfig> {
    RopeConfig::from_hub(
        params,
        c.head_dim(),
        c.partial_rotary_factor.unwrap_or(1.0),
        c.max_position_embeddings,
        None,
    )
    .map_err(|e| Error::Config {
        path: c.path.clone(),
        reason: format!("rope: {e}"),
    })
}

/// Gemma's switches: no sandwich norms, no q/k norms, `head_dim ** -0.5`, no caps, no
/// windows; the MLP's activation from `hidden_act`.
pub fn features(cfg: &PretrainedConfig, c: &DecoderConfig) -> Result<GemmaFeatures> {
    let params = match cfg.rope()? {
        Some(Rope::Single(p)) => p,
        Some(Rope::PerLayerType(m)) => {
            m.get("full_attention")
                .cloned()
                .ok_or_else(|| Error::Config {
                    path: cfg.path.clone(),
                    reason: "`rope_parameters` has no `full_attention` entry".into(),
                })?
        }
        None => zoo_hub::RopeParameters {
            rope_type: "default".into(),
            rope_theta: Some(10_000.0),
            extra: Default::default(),
        },
    };
    Ok(GemmaFeatures {
        sandwich_norms: false,
        qk_norm: false,
        scale: (c.head_dim() as f64).powf(-0.5),
        attn_softcap: None,
        final_softcap: None,
        activation: activation(cfg, "hidden_act", "gelu_pytorch_tanh")?,
        windows: vec![None; c.num_hidden_layers],
        rope: rope_from(c, &params)?,
        local_rope: None,
        tie_word_embeddings: tied(cfg),
    })
}

/// Reads the config as a family built on this block does (errors name the field).
pub(crate) fn validate_with(config: &PretrainedConfig, features: FeaturesFn) -> Result<()> {
    let c = DecoderConfig::from_pretrained(config)?;
    features(config, &c).map(drop)
}

/// The planner's view: `model.layers.N` are the no-split units, each with its KV cache; the
/// tied `lm_head` goes with the embeddings.
pub(crate) fn layout_with(config: &PretrainedConfig, features: FeaturesFn) -> Result<Layout> {
    let c = DecoderConfig::from_pretrained(config)?;
    let f = features(config, &c)?;
    Ok(llama::decoder_layout(&c, f.tie_word_embeddings))
}

/// The base decoder of a family built on this block, with its `features`.
pub(crate) fn load_base_with(
    w: &Weights,
    config: &PretrainedConfig,
    features: FeaturesFn,
) -> Result<Box<dyn DecoderModel>> {
    let c = DecoderConfig::from_pretrained(config)?;
    let f = features(config, &c)?;
    // A causal-LM checkpoint holds the base model under `model.`.
    let w = if w.contains("model.embed_tokens.weight") {
        w.pp("model")
    } else {
        w.clone()
    };
    Ok(Box::new(GemmaModel::load(&w, &c, f)?))
}

/// The causal LM of a family built on this block, with its `features`.
pub(crate) fn load_causal_lm_with(
    w: &Weights,
    config: &PretrainedConfig,
    features: FeaturesFn,
) -> Result<Box<dyn CausalLm>> {
    let c = DecoderConfig::from_pretrained(config)?;
    let f = features(config, &c)?;
    Ok(Box::new(GemmaForCausalLM::load(w, &c, f)?))
}

/// `GemmaDecoderLayer` / `Gemma2DecoderLayer` / `Gemma3DecoderLayer`.
#[derive(Clone, Debug)]
struct DecoderLayer {
    input_layernorm: RmsNorm,
    self_attn: Attention,
    post_attention_layernorm: RmsNorm,
    /// Gemma 2/3 only.
    pre_feedforward_layernorm: Option<RmsNorm>,
    /// Gemma 2/3 only.
    post_feedforward_layernorm: Option<RmsNorm>,
    mlp: Mlp,
}

/// `GemmaModel` (and `Gemma2Model`, `Gemma3TextModel`): scaled embeddings, decoder layers,
/// final norm; returns hidden states.
#[derive(Clone, Debug)]
pub struct GemmaModel {
    embed_tokens: Embedding,
    layers: Vec<DecoderLayer>,
    norm: RmsNorm,
    rotary: RotaryEmbedding,
    local_rotary: Option<RotaryEmbedding>,
    config: DecoderConfig,
    features: GemmaFeatures,
    dtype: DType,
    layer_devices: Vec<Device>,
    /// The module path the weights sit under (`model.` in a causal LM's checkpoint, nothing
    /// in a base model's), which the hidden states' module names start with.
    prefix: String,
}

impl GemmaModel {
    /// Loads the weights under `w` (the `model.` prefix of a causal-LM checkpoint, or the root
    /// of a base-model checkpoint).
    pub fn load(
        w: &Weights,
        config: &DecoderConfig,
        features: GemmaFeatures,
    ) -> Result<GemmaModel> {
        let c = config;
        let (hd, eps) = (c.hidden_size, c.rms_norm_eps);
        let norm = |lw: &Weights, name: &str| RmsNorm::load_gemma(&lw.pp(name), hd, eps);
        let embed_tokens = Embedding::load(&w.pp("embed_tokens"), c.vocab_size, hd)?;
        let mut layers = Vec::with_capacity(c.num_hidden_layers);
        let mut layer_devices = Vec::with_capacity(c.num_hidden_layers);
        // The Llama block's projections with Gemma's scale, cap and q/k norms.
        let llama_features = DecoderFeatures {
            qkv_bias: c.attention_bias,
            o_bias: c.attention_bias,
            qk_norm: features.qk_norm,
            windows: features.windows.clone(),
            ..Default::default()
        };
        let kind = AttentionKind {
            scale: Some(features.scale),
            softcap: features.attn_softcap,
            gemma_qk_norm: true,
        };
        for i in 0..c.num_hidden_layers {
            let lw = w.pp(format!("layers.{i}"));
            layer_devices.push(lw.device());
            let sandwich = |name: &str| -> Result<Option<RmsNorm>> {
                Ok(if features.sandwich_norms {
                    Some(norm(&lw, name)?)
                } else {
                    None
                })
            };
            layers.push(DecoderLayer {
                input_layernorm: norm(&lw, "input_layernorm")?,
                self_attn: Attention::load(&lw.pp("self_attn"), c, &llama_features, kind, i)?,
                post_attention_layernorm: norm(&lw, "post_attention_layernorm")?,
                pre_feedforward_layernorm: sandwich("pre_feedforward_layernorm")?,
                post_feedforward_layernorm: sandwich("post_feedforward_layernorm")?,
                mlp: Mlp::load(&lw.pp("mlp"), c, &llama_features, features.activation)?,
            });
        }
        Ok(GemmaModel {
            embed_tokens,
            layers,
            norm: norm(w, "norm")?,
            rotary: RotaryEmbedding::new(features.rope.clone(), RopeStyle::RotateHalf),
            local_rotary: features
                .local_rope
                .clone()
                .map(|r| RotaryEmbedding::new(r, RopeStyle::RotateHalf)),
            config: c.clone(),
            features,
            dtype: w.dtype(),
            layer_devices,
            prefix: w.full_name(""),
        })
    }

    /// The config the model was built from.
    pub fn config(&self) -> &DecoderConfig {
        &self.config
    }

    /// The switches in use.
    pub fn features(&self) -> &GemmaFeatures {
        &self.features
    }

    /// The rope of layer `i`: the local one on sliding layers when the family has one.
    fn rotary_of(&self, i: usize) -> (&RotaryEmbedding, bool) {
        match (&self.local_rotary, self.layers[i].self_attn.window) {
            (Some(local), Some(_)) => (local, true),
            _ => (&self.rotary, false),
        }
    }
}

impl GemmaModel {
    /// The token embeddings times `sqrt(hidden)`, held in the model dtype as transformers
    /// holds it (55.4256 becomes 55.5 in bf16).
    fn scaled_embeddings(&self, ids: &Tensor) -> Result<Tensor> {
        let normalizer = self
            .dtype
            .round_value((self.config.hidden_size as f64).sqrt());
        Ok(self.embed_tokens.forward(ids)?.mul_scalar(normalizer)?)
    }
}

impl DecoderModel for GemmaModel {
    fn dtype(&self) -> DType {
        self.dtype
    }

    fn device(&self) -> Device {
        self.embed_tokens.device()
    }

    fn vocab_size(&self) -> usize {
        self.config.vocab_size
    }

    fn max_position_embeddings(&self) -> usize {
        self.config.max_position_embeddings
    }

    fn hidden_size(&self) -> usize {
        self.config.hidden_size
    }

    fn input_embeddings(&self) -> &Embedding {
        &self.embed_tokens
    }

    fn embed(&self, ids: &Tensor) -> Result<Tensor> {
        self.scaled_embeddings(&checked_ids(ids, &self.device(), self.config.vocab_size)?)
    }

    fn stretches_context(&self) -> bool {
        matches!(
            self.rotary.config.scaling,
            zoo_runtime::nn::RopeScaling::Dynamic { .. }
        )
    }

    fn hidden_state_modules(&self) -> Vec<String> {
        let p = &self.prefix;
        std::iter::once(format!("{p}embed_tokens"))
            .chain((0..self.layers.len()).map(|i| format!("{p}layers.{i}")))
            .collect()
    }

    fn devices(&self) -> Vec<Device> {
        execution_order(
            self.device(),
            &self.layer_devices,
            self.norm.weight.device(),
        )
    }

    fn cache_specs(&self) -> Vec<CacheSpec> {
        let c = &self.config;
        self.layers
            .iter()
            .zip(&self.layer_devices)
            .map(|(l, d)| {
                CacheSpec::self_attention(c.num_kv_heads(), c.head_dim(), l.self_attn.window, *d)
            })
            .collect()
    }

    fn forward(&self, args: ForwardArgs<'_>, cache: &mut KvCache) -> Result<ModelOutput> {
        let (_, t) = args.check(cache)?;
        let c = &self.config;
        let mut x = args.embeddings(
            &self.device(),
            (c.vocab_size, c.hidden_size),
            self.dtype,
            |ids| self.scaled_embeddings(ids),
        )?;
        let start = cache.begin(t, args.attention_mask)?;
        // Rope tables (per device and rope) and masks (per window and device) once each.
        let mut tables: HashMap<(Device, bool), (Tensor, Tensor)> = HashMap::new();
        let mut biases: HashMap<(Option<usize>, Device), Tensor> = HashMap::new();
        let mut hidden_states = Vec::new();
        for (i, layer) in self.layers.iter().enumerate() {
            let dev = self.layer_devices[i];
            if x.device() != dev {
                x = x.to_device(&dev)?;
            }
            if args.output_hidden_states {
                hidden_states.push(x.clone());
            }
            let (rotary, local) = self.rotary_of(i);
            if let std::collections::hash_map::Entry::Vacant(e) = tables.entry((dev, local)) {
                let pos = on_device(args.position_ids, &dev)?;
                let (cos, sin) = rotary.cos_sin(&pos, self.dtype)?;
                e.insert((cos.unsqueeze(1)?, sin.unsqueeze(1)?));
            }
            let window = layer.self_attn.window;
            if let std::collections::hash_map::Entry::Vacant(e) = biases.entry((window, dev)) {
                e.insert(cache.attention_bias(start, t, window, self.dtype, &dev)?);
            }
            let (cos, sin) = &tables[&(dev, local)];
            let h = layer.input_layernorm.forward(&x)?;
            let at = Positions { cos, sin, start };
            let h = layer
                .self_attn
                .forward(&h, &at, &biases[&(window, dev)], cache, i)?;
            let h = match &layer.pre_feedforward_layernorm {
                // Gemma 2/3: the attention output is normed before the residual.
                Some(_) => layer.post_attention_layernorm.forward(&h)?,
                None => h,
            };
            x = x.add(&h)?;
            let h = match (
                &layer.pre_feedforward_layernorm,
                &layer.post_feedforward_layernorm,
            ) {
                (Some(pre), Some(post)) => post.forward(&layer.mlp.forward(&pre.forward(&x)?)?)?,
                _ => layer
                    .mlp
                    .forward(&layer.post_attention_layernorm.forward(&x)?)?,
            };
            x = x.add(&h)?;
        }
        let x = on_device(&x, &self.norm.weight.device())?;
        if args.output_hidden_states {
            hidden_states.push(x.clone());
        }
        Ok(ModelOutput {
            last_hidden_state: self.norm.forward(&x)?,
            hidden_states,
            module_outputs: Vec::new(),
        })
    }
}

/// `GemmaForCausalLM` (and Gemma 2/3's): the base model plus `lm_head`, tied to the
/// embeddings unless the config unties it, with Gemma 2's final logit soft-capping.
pub type GemmaForCausalLM = ForCausalLM<GemmaModel>;

impl GemmaForCausalLM {
    /// Loads from the checkpoint root (`model.*` and, when untied, `lm_head.weight`).
    pub fn load(
        w: &Weights,
        config: &DecoderConfig,
        features: GemmaFeatures,
    ) -> Result<GemmaForCausalLM> {
        let (tie, cap) = (features.tie_word_embeddings, features.final_softcap);
        let model = GemmaModel::load(&w.pp("model"), config, features)?;
        let embed = model.embed_tokens.clone();
        let shape = (config.hidden_size, config.vocab_size);
        Ok(ForCausalLM::with_head(w, model, &embed, tie, shape)?.with_final_softcap(cap))
    }
}
