//! ModernBERT: mirrors transformers' `models/modernbert/modeling_modernbert.py`
//! (`ModernBertModel` and its masked-LM, sequence-, token-classification, question-answering
//! and multiple-choice heads, eager attention).
//!
//! A pre-norm encoder unlike BERT's: token embeddings and a LayerNorm (no positions, no token
//! types); per layer a LayerNorm (none in layer 0), attention through one `Wqkv` with rotary
//! positions, a LayerNorm and a gated MLP (`Wi` holds the input and the gate, `act(input) *
//! gate` through `Wo`); a final norm. Layers alternate between full attention and attention
//! over the tokens at most `local_attention / 2` positions away (`layer_types`, or one full
//! layer every `global_attn_every_n_layers`), each kind with its own rotary base
//! (`rope_parameters` keyed by layer type, or v4's `global_rope_theta`/`local_rope_theta`).
//! Norms and projections have biases only where `norm_bias`, `attention_bias`, `mlp_bias`
//! say. The heads share `ModernBertPredictionHead` (dense, `classifier_activation`, norm) and
//! pool a sequence by its first token or by the mean over real tokens (`classifier_pooling`).

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Deserialize;
use zoo_hub::{PretrainedConfig, Rope, RopeParameters};
use zoo_runtime::device_map::{ModelShape, TpPlan, TpStyle};
use zoo_runtime::nn::{
    Embedding, LayerNorm, Linear, RopeConfig, RotaryEmbedding, SharedInput, Weights,
};
use zoo_runtime::{Activation, DType, Device, RopeStyle, SdpaOptions, Tensor};

use super::bert::{check_ids, like_ids, ChoiceRows};
use crate::config::{config_error, defaults, heads_divide, positive_fields};
use crate::family::{family, Family, Layout, Loaders, Task};
use crate::kinds::{self, EncoderArgs, EncoderHead, EncoderOutput, TextTower, Tower};
use crate::models::packed::Packed;
use crate::models::Placement;
use crate::{Error, Result};

/// The registry entry of `modernbert`.
pub(crate) const FAMILY: Family = family! {
    "modernbert" in "modernbert",
    classes [ModernBertModel: Base, ModernBertForMaskedLM: MaskedLm,
        ModernBertForSequenceClassification: SequenceClassification,
        ModernBertForTokenClassification: TokenClassification,
        ModernBertForQuestionAnswering: QuestionAnswering,
        ModernBertForMultipleChoice: MultipleChoice],
    no_split ["ModernBertEmbeddings", "ModernBertEncoderLayer"], tp TP_PLAN,
    config ModernBertConfig, loaders Loaders::Encoder(load),
};

/// ModernBERT's tensor-parallel plan: the output projections split by their inputs and the
/// embeddings by vocabulary. `Wqkv` and `Wi` stack q, k, v (input, gate) in one weight, so a
/// split by rows would cut across them: they stay whole.
const TP_PLAN: TpPlan = &[
    ("layers.*.attn.Wo", TpStyle::Rowwise),
    ("layers.*.mlp.Wo", TpStyle::Rowwise),
    ("embeddings.tok_embeddings", TpStyle::Vocab),
];

/// `config.json` of a ModernBERT checkpoint, as transformers' `ModernBertConfig` reads it
/// (its defaults are ModernBERT-base's).
#[derive(Clone, Debug, Deserialize)]
pub struct ModernBertConfig {
    /// Rows of the token embedding table.
    #[serde(default = "defaults::usize::<50368>")]
    pub vocab_size: usize,
    /// Width of the residual stream.
    #[serde(default = "defaults::usize::<768>")]
    pub hidden_size: usize,
    /// Width of the gated MLP (`Wi` has twice as many rows).
    #[serde(default = "defaults::usize::<1152>")]
    pub intermediate_size: usize,
    /// Encoder layers.
    #[serde(default = "defaults::usize::<22>")]
    pub num_hidden_layers: usize,
    /// Attention heads.
    #[serde(default = "defaults::usize::<12>")]
    pub num_attention_heads: usize,
    /// The MLP's activation (applied to the input half).
    #[serde(default = "defaults::gelu")]
    pub hidden_activation: String,
    /// The longest input.
    #[serde(default = "defaults::usize::<8192>")]
    pub max_position_embeddings: usize,
    /// Epsilon of every LayerNorm.
    #[serde(default = "defaults::eps_1e5")]
    pub norm_eps: f64,
    /// Whether the LayerNorms have biases.
    #[serde(default)]
    pub norm_bias: bool,
    /// Whether `Wqkv` and the attention's `Wo` have biases.
    #[serde(default)]
    pub attention_bias: bool,
    /// Whether the MLP's `Wi` and `Wo` have biases.
    #[serde(default)]
    pub mlp_bias: bool,
    /// The local layers' window: a token sees the tokens at most half of it away.
    #[serde(default = "defaults::usize::<128>")]
    pub local_attention: usize,
    /// v4's pattern: layer `i` attends globally when `i % n == 0` (without `layer_types`).
    #[serde(default = "defaults::usize::<3>")]
    pub global_attn_every_n_layers: usize,
    /// `"full_attention"` or `"sliding_attention"` per layer.
    #[serde(default)]
    pub layer_types: Option<Vec<String>>,
    /// v4's rotary base of the global layers.
    #[serde(default)]
    pub global_rope_theta: Option<f64>,
    /// v4's rotary base of the local layers.
    #[serde(default)]
    pub local_rope_theta: Option<f64>,
    /// Whether the masked-LM decoder has a bias.
    #[serde(default = "defaults::yes")]
    pub decoder_bias: bool,
    /// How a sequence is pooled for classification: `"cls"` or `"mean"`.
    #[serde(default = "cls")]
    pub classifier_pooling: String,
    /// Whether the prediction head's dense layer has a bias.
    #[serde(default)]
    pub classifier_bias: bool,
    /// The prediction head's activation.
    #[serde(default = "defaults::gelu")]
    pub classifier_activation: String,
    /// Whether the masked-LM decoder is the token embedding table.
    #[serde(default = "defaults::yes")]
    pub tie_word_embeddings: bool,
    /// Set only by configs that name it; must equal `hidden_size / num_attention_heads`.
    #[serde(default)]
    pub head_dim: Option<usize>,
    /// Label names of a classification head, by index.
    #[serde(default)]
    pub id2label: Option<BTreeMap<String, String>>,
    /// Labels of a classification head when `id2label` is absent (transformers' default 2).
    #[serde(default)]
    pub num_labels: Option<usize>,
    /// The rotary embedding of the full-attention layers.
    #[serde(skip)]
    full_rope: Option<RopeConfig>,
    /// The rotary embedding of the local layers.
    #[serde(skip)]
    local_rope: Option<RopeConfig>,
    /// Whether each layer attends locally.
    #[serde(skip)]
    local: Vec<bool>,
    /// The `config.json` it came from, for errors.
    #[serde(skip)]
    pub path: PathBuf,
}

fn cls() -> String {
    "cls".into()
}

impl ModernBertConfig {
    /// Reads the typed config; a missing, mistyped or unsupported field names the file and
    /// the field.
    pub fn from_pretrained(cfg: &PretrainedConfig) -> Result<ModernBertConfig> {
        let mut c: ModernBertConfig = cfg.parse_as()?;
        c.path = cfg.path.clone();
        let bad = |reason: String| config_error(cfg, reason);
        positive_fields!(cfg; c.vocab_size, c.hidden_size, c.num_hidden_layers,
            c.num_attention_heads, c.intermediate_size, c.max_position_embeddings,
            c.global_attn_every_n_layers)?;
        heads_divide!(cfg; c.hidden_size, c.num_attention_heads)?;
        let d = c.hidden_size / c.num_attention_heads;
        if let Some(hd) = c.head_dim.filter(|&hd| hd != d) {
            return Err(bad(format!(
                "`head_dim` is {hd}, but ModernBERT's attention splits hidden_size {} into {} heads of {d}",
                c.hidden_size, c.num_attention_heads
            )));
        }
        for (field, name) in [
            ("hidden_activation", &c.hidden_activation),
            ("classifier_activation", &c.classifier_activation),
        ] {
            Activation::from_hf(name).map_err(|e| bad(format!("`{field}`: {e}")))?;
        }
        if !matches!(c.classifier_pooling.as_str(), "cls" | "mean") {
            return Err(bad(format!(
                "`classifier_pooling` is {:?}; ModernBERT pools by \"cls\" or \"mean\"",
                c.classifier_pooling
            )));
        }
        // `sliding_window` (half the window) sets `local_attention` where a config names it.
        if let Some(v) = cfg.get("sliding_window").filter(|v| !v.is_null()) {
            let half = v
                .as_u64()
                .ok_or_else(|| bad(format!("`sliding_window` is {v}; expected an integer")))?;
            c.local_attention = 2 * half as usize;
        }
        c.local = match &c.layer_types {
            Some(types) => {
                if types.len() != c.num_hidden_layers {
                    return Err(bad(format!(
                        "`layer_types` lists {} layers; num_hidden_layers is {}",
                        types.len(),
                        c.num_hidden_layers
                    )));
                }
                types
                    .iter()
                    .map(|t| match t.as_str() {
                        "full_attention" => Ok(false),
                        "sliding_attention" => Ok(true),
                        other => Err(bad(format!(
                            "`layer_types` holds {other:?}; ModernBERT's layers are \"full_attention\" or \"sliding_attention\""
                        ))),
                    })
                    .collect::<Result<_>>()?
            }
            None => (0..c.num_hidden_layers)
                .map(|i| i % c.global_attn_every_n_layers != 0)
                .collect(),
        };
        let (full, local) = c.ropes(cfg)?;
        let rope = |p: &RopeParameters| {
            RopeConfig::from_hub(p, d, 1.0, c.max_position_embeddings, None)
                .map_err(|e| bad(format!("rope: {e}")))
        };
        c.full_rope = Some(rope(&full)?);
        c.local_rope = Some(rope(&local)?);
        Ok(c)
    }

    /// The rotary parameters of the full and the local layers: v5's `rope_parameters` by
    /// layer type, else v4's `rope_scaling` for both with `global_rope_theta` (160000) and
    /// `local_rope_theta` (10000), as `ModernBertConfig` converts them.
    fn ropes(&self, cfg: &PretrainedConfig) -> Result<(RopeParameters, RopeParameters)> {
        let plain = || RopeParameters {
            rope_type: "default".into(),
            rope_theta: None,
            extra: Default::default(),
        };
        let (full, local) = match cfg.rope()? {
            Some(Rope::PerLayerType(m)) => (
                m.get("full_attention").cloned().unwrap_or_else(plain),
                m.get("sliding_attention").cloned().unwrap_or_else(plain),
            ),
            Some(Rope::Single(p)) => (p.clone(), p),
            None => (plain(), plain()),
        };
        let with = |mut p: RopeParameters, theta: Option<f64>, default: f64| {
            p.rope_theta = p.rope_theta.or(theta).or(Some(default));
            p
        };
        Ok((
            with(full, self.global_rope_theta, 160_000.0),
            with(local, self.local_rope_theta, 10_000.0),
        ))
    }

    /// Label names by index: `id2label` in index order, else `LABEL_i` for `num_labels`.
    pub fn labels(&self) -> Result<Vec<String>> {
        crate::config::labels(self.id2label.as_ref(), self.num_labels, &self.path)
    }

    fn head_dim(&self) -> usize {
        self.hidden_size / self.num_attention_heads
    }
}

/// The planner's view: embeddings, then `layers.N` (under `model.` when a head is present),
/// no KV cache; planned for the full `max_position_embeddings`.
fn layout(config: &PretrainedConfig) -> Result<Layout> {
    let c = ModernBertConfig::from_pretrained(config)?;
    Ok(Layout {
        layer_containers: vec!["layers".into(), "model.layers".into()],
        inputs: vec!["embeddings".into(), "model.embeddings".into()],
        tied: vec![vec![
            "model.embeddings.tok_embeddings.weight".into(),
            "decoder.weight".into(),
        ]],
        shape: ModelShape::encoder(
            c.num_hidden_layers,
            c.hidden_size,
            2 * c.intermediate_size,
            c.num_attention_heads,
            c.head_dim(),
        ),
        context: c.max_position_embeddings,
    })
}

/// The family's loader: the base model for [`Task::Base`], else the head's class.
fn load(w: &Weights, config: &PretrainedConfig, task: Task) -> Result<Box<dyn kinds::Encoder>> {
    let c = ModernBertConfig::from_pretrained(config)?;
    Ok(match task {
        Task::Base => {
            // A base checkpoint holds the model at its root; a head's under `model.`.
            let w = if w.contains("model.embeddings.tok_embeddings.weight") {
                w.pp("model")
            } else {
                w.clone()
            };
            Box::new(ModernBertModel::load(&w, &c)?)
        }
        Task::MaskedLm => Box::new(ModernBertForMaskedLM::load(w, &c)?),
        Task::SequenceClassification
        | Task::TokenClassification
        | Task::QuestionAnswering
        | Task::MultipleChoice => Box::new(Classifier::load(w, &c, task)?),
        Task::CausalLm | Task::ImageClassification | Task::Seq2SeqLm | Task::ImageTextToText => {
            return Err(Error::Config {
                path: c.path.clone(),
                reason: format!(
                    "ModernBERT is a text encoder; it has no {} head",
                    task.auto_class()
                ),
            })
        }
    })
}

/// A LayerNorm with a bias only where `norm_bias` says.
fn norm(w: &Weights, c: &ModernBertConfig) -> Result<LayerNorm> {
    let h = c.hidden_size;
    Ok(LayerNorm {
        weight: Some(w.get("weight", &[h])?),
        bias: if c.norm_bias {
            Some(w.get("bias", &[h])?)
        } else {
            None
        },
        eps: c.norm_eps,
    })
}

/// What the layers of one kind (full or local) read on one device: the additive mask and
/// the rotary tables (`[B, 1, T, d/2]`, f32).
#[derive(Clone, Debug)]
struct KindInputs {
    mask: Tensor,
    cos: Tensor,
    sin: Tensor,
}

/// `ModernBertEncoderLayer`: pre-norm attention and gated MLP, each added to the residual.
#[derive(Clone, Debug)]
struct Layer {
    /// None in layer 0 (the embeddings' norm precedes it).
    attn_norm: Option<LayerNorm>,
    /// `Wqkv`, split into q, k and v.
    qkv: SharedInput<3>,
    attn_out: Linear,
    mlp_norm: LayerNorm,
    /// `Wi`, split into the input and the gate.
    wi: SharedInput<2>,
    mlp_out: Linear,
    act: Activation,
    heads: usize,
    /// Attends only to tokens at most `local_attention / 2` away.
    local: bool,
}

impl Layer {
    fn load(w: &Weights, c: &ModernBertConfig, i: usize) -> Result<Layer> {
        let (h, m) = (c.hidden_size, c.intermediate_size);
        Ok(Layer {
            attn_norm: if i == 0 {
                None
            } else {
                Some(norm(&w.pp("attn_norm"), c)?)
            },
            qkv: SharedInput::stacked(
                Linear::load(&w.pp("attn.Wqkv"), h, 3 * h, c.attention_bias)?,
                [h, h, h],
            )?,
            attn_out: Linear::load(&w.pp("attn.Wo"), h, h, c.attention_bias)?,
            mlp_norm: norm(&w.pp("mlp_norm"), c)?,
            wi: SharedInput::stacked(Linear::load(&w.pp("mlp.Wi"), h, 2 * m, c.mlp_bias)?, [m, m])?,
            mlp_out: Linear::load(&w.pp("mlp.Wo"), m, h, c.mlp_bias)?,
            act: Activation::from_hf(&c.hidden_activation)?,
            heads: c.num_attention_heads,
            local: c.local[i],
        })
    }

    /// `x [B, T, hidden]`, or the real tokens `[1, N, hidden]` of `packed`; `inputs` the
    /// mask and rotary tables of this layer's kind.
    fn forward(&self, x: &Tensor, inputs: &KindInputs, packed: Option<&Packed>) -> Result<Tensor> {
        let KindInputs { mask, cos, sin } = inputs;
        let h = x.shape()[2];
        let (b, t) = packed.map_or((x.shape()[0], x.shape()[1]), |p| (p.batch, p.seq));
        let d = h / self.heads;
        let normed = match &self.attn_norm {
            Some(n) => n.forward(x)?,
            None => x.clone(),
        };
        // Attention runs on the padded layout; everything else on the packed rows.
        let split = |y: Tensor| -> Result<Tensor> {
            let y = match packed {
                Some(p) => p.unpack(&y)?,
                None => y,
            };
            Ok(y.reshape_to(&[b, t, self.heads, d])?.transpose(1, 2)?)
        };
        let [q, k, v] = self.qkv.forward(&normed)?;
        let (q, k, v) = (split(q)?, split(k)?, split(v)?);
        // transformers rotates in f32 and rounds back to the activations' dtype.
        let dtype = q.dtype();
        let rotate = |y: &Tensor| -> Result<Tensor> {
            Ok(y.to_dtype(DType::F32)?
                .apply_rotary(cos, sin, RopeStyle::RotateHalf)?
                .to_dtype(dtype)?)
        };
        let (q, k) = (rotate(&q)?, rotate(&k)?);
        let opts = SdpaOptions {
            mask: Some(mask),
            round_scores: true,
            ..Default::default()
        };
        let ctx = Tensor::scaled_dot_product_attention(&q, &k, &v, &opts)?;
        let ctx = ctx.transpose(1, 2)?.reshape_to(&[b, t, h])?;
        let ctx = match packed {
            Some(p) => p.pack(&ctx)?,
            None => ctx,
        };
        let x = x.add(&self.attn_out.forward(&ctx)?)?;
        let [input, gate] = self.wi.forward(&self.mlp_norm.forward(&x)?)?;
        let y = self.mlp_out.forward(&self.act.apply(&input)?.mul(&gate)?)?;
        Ok(x.add(&y)?)
    }
}

/// `ModernBertModel`: embeddings (token table, norm), layers, final norm.
#[derive(Clone, Debug)]
pub struct ModernBertModel {
    tok_embeddings: Embedding,
    embeddings_norm: LayerNorm,
    layers: Vec<Layer>,
    final_norm: LayerNorm,
    config: ModernBertConfig,
    placement: Placement,
    /// Where each layer runs; activations move between devices at the cuts.
    layer_devices: Vec<Device>,
    /// The module prefix of the base model in its checkpoint (`model.` under a head).
    prefix: &'static str,
}

impl ModernBertModel {
    /// Loads the base model from the weights under `w` (its root: `embeddings.*`,
    /// `layers.*`, `final_norm.*`).
    pub fn load(w: &Weights, config: &ModernBertConfig) -> Result<ModernBertModel> {
        let c = config;
        let tok_embeddings = Embedding::load(
            &w.pp("embeddings.tok_embeddings"),
            c.vocab_size,
            c.hidden_size,
        )?;
        let embeddings_norm = norm(&w.pp("embeddings.norm"), c)?;
        let mut layers = Vec::with_capacity(c.num_hidden_layers);
        let mut layer_devices = Vec::with_capacity(c.num_hidden_layers);
        for i in 0..c.num_hidden_layers {
            let lw = w.pp(format!("layers.{i}"));
            layer_devices.push(lw.device());
            layers.push(Layer::load(&lw, c, i)?);
        }
        let final_norm = norm(&w.pp("final_norm"), c)?;
        let placement = Placement::new(
            w.dtype(),
            tok_embeddings.device(),
            layer_devices.iter().copied(),
        );
        Ok(ModernBertModel {
            tok_embeddings,
            embeddings_norm,
            layers,
            final_norm,
            config: c.clone(),
            placement,
            layer_devices,
            prefix: "",
        })
    }

    /// The base model of a head's checkpoint, under `model.`.
    fn load_under_head(w: &Weights, c: &ModernBertConfig) -> Result<ModernBertModel> {
        let mut model = ModernBertModel::load(&w.pp("model"), c)?;
        model.prefix = "model.";
        Ok(model)
    }

    /// The config the model was built from.
    pub fn config(&self) -> &ModernBertConfig {
        &self.config
    }

    /// Additive masks in the model's dtype for the full and the local layers: padding keys
    /// hidden (`keep`, `[B * T]`) in both, `[B, 1, 1, T]`; in the local one also every key
    /// more than `local_attention / 2` positions from its query, `[B, 1, T, T]` (the full
    /// one again when no two tokens are that far apart).
    fn masks(&self, keep: &[bool], (b, t): (usize, usize), device: &Device) -> Result<[Tensor; 2]> {
        let dtype = self.placement.dtype();
        // 0 to attend, the dtype's lowest finite value (exact in f32) to hide.
        let low = dtype.finite_min() as f32;
        let additive = |values: Vec<f32>, shape: &[usize]| -> Result<Tensor> {
            Ok(Tensor::from_vec(values, shape, device)?.to_dtype(dtype)?)
        };
        let flag = |real: bool| if real { 0.0 } else { low };
        let full = additive(keep.iter().map(|&k| flag(k)).collect(), &[b, 1, 1, t])?;
        let half = self.config.local_attention / 2;
        if t <= half + 1 {
            return Ok([full.clone(), full]);
        }
        let mut local = Vec::with_capacity(b * t * t);
        for row in keep.chunks(t) {
            for q in 0..t {
                local.extend(
                    row.iter()
                        .enumerate()
                        .map(|(k, &real)| flag(real && q.abs_diff(k) <= half)),
                );
            }
        }
        Ok([full, additive(local, &[b, 1, t, t])?])
    }
}

impl Tower for ModernBertModel {
    fn placement(&self) -> &Placement {
        &self.placement
    }
    fn hidden_state_modules(&self) -> Vec<String> {
        let p = self.prefix;
        std::iter::once(format!("{p}embeddings"))
            .chain((0..self.layers.len()).map(|i| format!("{p}layers.{i}")))
            .collect()
    }
}

impl TextTower for ModernBertModel {
    fn vocab_size(&self) -> usize {
        self.config.vocab_size
    }
    fn max_position_embeddings(&self) -> usize {
        self.config.max_position_embeddings
    }
    fn run(&self, args: EncoderArgs<'_>) -> Result<EncoderOutput> {
        let ids = args.input_ids;
        if ids.rank() != 2 {
            return Err(Error::invalid(
                "input_ids",
                format!("input_ids {:?} must be [batch, seq]", ids.shape()),
            ));
        }
        let (b, t) = (ids.shape()[0], ids.shape()[1]);
        let c = &self.config;
        if t == 0 || t > c.max_position_embeddings {
            return Err(Error::invalid(
                "input_ids",
                format!(
                    "the input has {t} tokens; the model takes 1 to {} (max_position_embeddings); truncate it",
                    c.max_position_embeddings
                ),
            ));
        }
        let device = self.device();
        let same = |name, x| like_ids(name, x, ids, &device);
        let ids = ids.to_device(&device)?.to_dtype(DType::I64)?;
        check_ids(&ids, c.vocab_size, "input_ids")?;
        let positions = match same("position_ids", args.position_ids)? {
            Some(p) => p,
            None => {
                let rows: Vec<i64> = (0..b).flat_map(|_| 0..t as i64).collect();
                Tensor::from_vec(rows, &[b, t], &device)?
            }
        };
        let keep: Vec<bool> = match same("attention_mask", args.attention_mask)? {
            Some(m) => m.to_vec::<i64>()?.iter().map(|&v| v != 0).collect(),
            None => vec![true; b * t],
        };
        let x = self.tok_embeddings.forward(&ids)?;
        let mut x = self.embeddings_norm.forward(&x)?;
        // A padded batch's real tokens run packed through the layers (see `Packed`).
        let packing = Packed::new(&keep, (b, t), &x.device())?;
        if let Some(p) = &packing {
            x = p.pack(&x)?;
        }
        let mut packings = Vec::new();
        let tables = |rope: &Option<RopeConfig>| -> Result<(Tensor, Tensor)> {
            let rope = rope.clone().ok_or_else(|| Error::Config {
                path: c.path.clone(),
                reason: "the config was not read with ModernBertConfig::from_pretrained".into(),
            })?;
            let rope = RotaryEmbedding::new(rope, RopeStyle::RotateHalf);
            // transformers rounds the tables to the activations' dtype, then rotates in f32.
            let (cos, sin) = rope.cos_sin(&positions, self.placement.dtype())?;
            let f32 = |t: Tensor| t.to_dtype(DType::F32)?.unsqueeze(1);
            Ok((f32(cos)?, f32(sin)?))
        };
        let full_tables = tables(&c.full_rope)?;
        let local_tables = tables(&c.local_rope)?;
        // Masks and tables per device, made where the first layer on it needs them.
        let mut per_device: Vec<(Device, [KindInputs; 2])> = Vec::new();
        let mut hidden_states = Vec::new();
        for (layer, dev) in self.layers.iter().zip(&self.layer_devices) {
            if x.device() != *dev {
                x = x.to_device(dev)?;
            }
            let inputs = match per_device.iter().find(|(d, _)| d == dev) {
                Some((_, inputs)) => inputs.clone(),
                None => {
                    let [full, local] = self.masks(&keep, (b, t), dev)?;
                    let on = |mask: Tensor, (cos, sin): &(Tensor, Tensor)| -> Result<KindInputs> {
                        Ok(KindInputs {
                            mask,
                            cos: cos.to_device(dev)?,
                            sin: sin.to_device(dev)?,
                        })
                    };
                    let inputs = [on(full, &full_tables)?, on(local, &local_tables)?];
                    per_device.push((*dev, inputs.clone()));
                    inputs
                }
            };
            let packed = match &packing {
                Some(p) => Some(p.on(dev, &mut packings)?),
                None => None,
            };
            if args.output_hidden_states {
                hidden_states.push(match &packed {
                    Some(p) => p.unpack(&x)?,
                    None => x.clone(),
                });
            }
            x = layer.forward(&x, &inputs[usize::from(layer.local)], packed.as_ref())?;
        }
        if let Some(p) = &packing {
            x = p.on(&x.device(), &mut packings)?.unpack(&x)?;
        }
        if args.output_hidden_states {
            hidden_states.push(x.clone());
        }
        let x = x.to_device(&self.final_norm.device_or(x.device()))?;
        Ok(EncoderOutput {
            last_hidden_state: self.final_norm.forward(&x)?,
            pooler_output: None,
            hidden_states,
            logits: None,
            embeds: None,
        })
    }
}

/// `ModernBertPredictionHead`: dense (bias where `classifier_bias`), activation, norm.
#[derive(Clone, Debug)]
struct PredictionHead {
    dense: Linear,
    act: Activation,
    norm: LayerNorm,
}

impl PredictionHead {
    fn load(w: &Weights, c: &ModernBertConfig) -> Result<PredictionHead> {
        let h = c.hidden_size;
        Ok(PredictionHead {
            dense: Linear::load(&w.pp("dense"), h, h, c.classifier_bias)?,
            act: Activation::from_hf(&c.classifier_activation)?,
            norm: norm(&w.pp("norm"), c)?,
        })
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let x = x.to_device(&self.dense.device())?;
        Ok(self
            .norm
            .forward(&self.act.apply(&self.dense.forward(&x)?)?)?)
    }
}

/// `ModernBertForMaskedLM`: the prediction head, then the decoder tied to the token
/// embeddings (bias where `decoder_bias`).
#[derive(Clone, Debug)]
pub struct ModernBertForMaskedLM {
    model: ModernBertModel,
    head: PredictionHead,
    decoder: Linear,
}

impl ModernBertForMaskedLM {
    /// Loads from the checkpoint root (`model.*`, `head.*`, `decoder.*`).
    pub fn load(w: &Weights, c: &ModernBertConfig) -> Result<ModernBertForMaskedLM> {
        let model = ModernBertModel::load_under_head(w, c)?;
        let shape = [c.vocab_size, c.hidden_size];
        let weight = match w.get_opt("decoder.weight", &shape)? {
            Some(weight) => weight,
            None if c.tie_word_embeddings => model.tok_embeddings.weight()?,
            None => {
                return Err(Error::Config {
                    path: c.path.clone(),
                    reason: format!(
                        "`tie_word_embeddings` is false but the checkpoint has no `{}`",
                        w.full_name("decoder.weight")
                    ),
                })
            }
        };
        let bias = if c.decoder_bias {
            Some(
                w.get("decoder.bias", &[c.vocab_size])?
                    .to_device(&weight.device())?,
            )
        } else {
            None
        };
        Ok(ModernBertForMaskedLM {
            head: PredictionHead::load(&w.pp("head"), c)?,
            decoder: Linear::new(weight, bias),
            model,
        })
    }
}

impl kinds::Encoder for ModernBertForMaskedLM {
    fn tower(&self) -> &dyn TextTower {
        &self.model
    }
    fn head(&self) -> &EncoderHead {
        &EncoderHead::MaskedLm
    }
    fn forward(&self, args: EncoderArgs<'_>) -> Result<EncoderOutput> {
        let mut out = self.model.run(args)?;
        let x = self.head.forward(&out.last_hidden_state)?;
        out.logits = Some(
            self.decoder
                .forward(&x.to_device(&self.decoder.device())?)?,
        );
        Ok(out)
    }
}

/// The classification heads: the prediction head over each token (token classification,
/// question answering) or over each pooled sequence (sequence classification, multiple
/// choice), then `classifier`.
#[derive(Clone, Debug)]
pub struct Classifier {
    model: ModernBertModel,
    head: PredictionHead,
    classifier: Linear,
    kind: EncoderHead,
    /// Pool by the mean over real tokens, else by the first token.
    mean: bool,
}

impl Classifier {
    /// Loads the head of `task` from the checkpoint root (`model.*`, `head.*`,
    /// `classifier.*`).
    fn load(w: &Weights, c: &ModernBertConfig, task: Task) -> Result<Classifier> {
        let (kind, outputs) = match task {
            Task::SequenceClassification => {
                let labels = c.labels()?;
                let n = labels.len();
                (EncoderHead::SequenceClassification { labels }, n)
            }
            Task::TokenClassification => {
                let labels = c.labels()?;
                let n = labels.len();
                (EncoderHead::TokenClassification { labels }, n)
            }
            Task::QuestionAnswering => {
                // transformers sizes the classifier by `num_labels` and splits it into two.
                if let Some(n) = c.num_labels.filter(|&n| n != 2) {
                    return Err(Error::Config {
                        path: c.path.clone(),
                        reason: format!(
                            "the question-answering head scores a span's start and end: `num_labels` must be 2, not {n}"
                        ),
                    });
                }
                (EncoderHead::QuestionAnswering, 2)
            }
            _ => (EncoderHead::MultipleChoice, 1),
        };
        Ok(Classifier {
            model: ModernBertModel::load_under_head(w, c)?,
            head: PredictionHead::load(&w.pp("head"), c)?,
            classifier: Linear::load(&w.pp("classifier"), c.hidden_size, outputs, true)?,
            kind,
            mean: c.classifier_pooling == "mean",
        })
    }

    /// One row per sequence of `x [B, T, hidden]`: the mean over its real tokens, or its
    /// first token — for multiple choice the first real one (`attention_mask.argmax`), as
    /// transformers picks it there.
    fn pool(&self, x: &Tensor, mask: Option<&Tensor>) -> Result<Tensor> {
        let (b, t, h) = (x.shape()[0], x.shape()[1], x.shape()[2]);
        let device = x.device();
        let mask = match mask {
            Some(m) => m.to_device(&device)?.to_dtype(DType::I64)?,
            None => Tensor::ones(&[b, t], DType::I64, &device)?,
        };
        if self.mean {
            let m = mask.to_dtype(x.dtype())?.unsqueeze(-1)?;
            let sum = x.mul(&m)?.sum(&[1], false)?;
            let count = mask.sum(&[1], true)?.to_dtype(x.dtype())?;
            return Ok(sum.div(&count)?);
        }
        let first: Vec<i64> = if matches!(self.kind, EncoderHead::MultipleChoice) {
            let flags = mask.to_vec::<i64>()?;
            flags
                .chunks(t)
                .enumerate()
                .map(|(row, f)| {
                    // argmax returns the first maximum: the first real token, or 0 if none.
                    let max = f.iter().copied().max().unwrap_or(0);
                    let at = f.iter().position(|&v| v == max).unwrap_or(0);
                    (row * t + at) as i64
                })
                .collect()
        } else {
            (0..b).map(|row| (row * t) as i64).collect()
        };
        let idx = Tensor::from_vec(first, &[b], &device)?;
        Ok(x.reshape_to(&[b * t, h])?.index_select(0, &idx)?)
    }
}

impl kinds::Encoder for Classifier {
    fn tower(&self) -> &dyn TextTower {
        &self.model
    }
    fn head(&self) -> &EncoderHead {
        &self.kind
    }
    fn forward(&self, args: EncoderArgs<'_>) -> Result<EncoderOutput> {
        if !matches!(self.kind, EncoderHead::MultipleChoice) {
            let mut out = self.model.run(args)?;
            let x = match self.kind {
                EncoderHead::SequenceClassification { .. } => {
                    self.pool(&out.last_hidden_state, args.attention_mask)?
                }
                _ => out.last_hidden_state.clone(),
            };
            let x = self.head.forward(&x)?;
            out.logits = Some(
                self.classifier
                    .forward(&x.to_device(&self.classifier.device())?)?,
            );
            return Ok(out);
        }
        let rows = ChoiceRows::of(&args)?;
        let mut out = self.model.run(rows.args(args.output_hidden_states))?;
        let pooled = self.pool(&out.last_hidden_state, rows.mask.as_ref())?;
        let x = self.head.forward(&pooled)?;
        let scores = self
            .classifier
            .forward(&x.to_device(&self.classifier.device())?)?;
        out.logits = Some(rows.scores(&scores)?);
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn config(extra: serde_json::Value) -> Result<ModernBertConfig> {
        let mut v = json!({
            "model_type": "modernbert", "vocab_size": 16, "hidden_size": 8,
            "intermediate_size": 12, "num_hidden_layers": 4, "num_attention_heads": 2,
        });
        v.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        ModernBertConfig::from_pretrained(
            &PretrainedConfig::from_value(v, std::path::Path::new("config.json")).unwrap(),
        )
    }

    #[test]
    fn a_v4_config_reads_its_pattern_and_two_bases() {
        // How ModernBERT-base ships: no layer_types, no rope_parameters.
        let c = config(
            json!({"global_attn_every_n_layers": 3, "global_rope_theta": 160000.0,
            "local_rope_theta": 10000.0, "local_attention": 128}),
        )
        .unwrap();
        assert_eq!(c.local, [false, true, true, false]);
        assert_eq!(c.full_rope.unwrap().theta, 160_000.0);
        assert_eq!(c.local_rope.unwrap().theta, 10_000.0);
        assert_eq!(c.local_attention, 128);
    }

    #[test]
    fn a_v5_config_reads_layer_types_and_ropes_by_layer_type() {
        let c = config(json!({
            "layer_types": ["full_attention", "full_attention", "sliding_attention", "full_attention"],
            "rope_parameters": {
                "full_attention": {"rope_type": "default", "rope_theta": 5000.0},
                "sliding_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 300.0},
            },
        }))
        .unwrap();
        assert_eq!(c.local, [false, false, true, false]);
        assert_eq!(c.full_rope.unwrap().theta, 5000.0);
        let local = c.local_rope.unwrap();
        assert_eq!(local.theta, 300.0);
        assert_eq!(
            local.scaling,
            zoo_runtime::nn::RopeScaling::Linear { factor: 2.0 }
        );
    }

    #[test]
    fn fields_zoo_cannot_apply_are_refused_by_name() {
        for (extra, field) in [
            (json!({"classifier_pooling": "max"}), "classifier_pooling"),
            (json!({"layer_types": ["full_attention"]}), "layer_types"),
            (
                json!({"layer_types": ["full_attention", "chunked_attention", "full_attention", "full_attention"]}),
                "chunked_attention",
            ),
            (json!({"hidden_activation": "swishy"}), "hidden_activation"),
            (json!({"head_dim": 3}), "head_dim"),
            (
                json!({"global_attn_every_n_layers": 0}),
                "global_attn_every_n_layers",
            ),
        ] {
            let err = config(extra).unwrap_err().to_string();
            assert!(err.contains(field), "{err}");
        }
    }
}
