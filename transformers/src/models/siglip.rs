//! SigLIP: mirrors transformers' `models/siglip/modeling_siglip.py`. Three registry entries,
//! as transformers has three configs: the text tower (`siglip_text_model`:
//! `SiglipTextModel`), the vision tower (`siglip_vision_model`: `SiglipVisionModel`) and both
//! with the learned scale and bias of the sigmoid loss (`siglip`: `SiglipModel`).
//!
//! Both towers run CLIP's pre-norm encoder layers (the same weight names) without a causal
//! mask. The vision tower has no class token: patches with a biased convolution, learned
//! positions, the encoder, `post_layernorm` over every token, and the pooled output from a
//! multi-head attention pooling head (a learned probe attending to the tokens, then a
//! LayerNorm'd MLP added to it). The text tower pools its last position (padding included,
//! as SigLIP was trained on `max_length` padding) through `head`. `SiglipModel`'s logits are
//! `exp(logit_scale)` times the cosine similarity plus `logit_bias`; zero-shot
//! classification reads them through a sigmoid. Weight names are the checkpoint's: under
//! `text_model.` / `vision_model.` in transformers 4 checkpoints and `SiglipModel`, at the
//! root for a bare tower saved by transformers 5.

use serde::Deserialize;
use zoo_hub::PretrainedConfig;
use zoo_runtime::device_map::ModelShape;
use zoo_runtime::nn::{Embedding, LayerNorm, Linear, Weights};
use zoo_runtime::{Activation, DType, SdpaOptions, Tensor};

use super::clip::{normalized, CLIPEncoder, HostBias, LayerSpec};
use super::patches::{interpolate_positions, PatchEmbedding};
use super::Placement;
use crate::config::{config_error, defaults, heads_divide, positive_fields};
use crate::family::{family, Family, Layout, Loaders, Task};
use crate::kinds::{
    Encoder, EncoderArgs, EncoderOutput, ImageArgs, ImageEncoder, ImageTextModel, ImageTextOutput,
    ImageTower, TextTower, Tower, ZeroShotScores,
};
use crate::{Error, Result};

/// The registry entry of `siglip_text_model`.
pub(crate) const TEXT_FAMILY: Family = Family {
    layout: text_layout,
    ..family! {
        "siglip_text_model" in "siglip", classes [SiglipTextModel: Base],
        no_split ["SiglipTextEmbeddings", "SiglipEncoderLayer"],
        tp super::clip::TP_PLAN, config SiglipTextConfig, loaders Loaders::Encoder(load_text),
    }
};

/// The registry entry of `siglip_vision_model`.
pub(crate) const VISION_FAMILY: Family = Family {
    layout: vision_layout,
    ..family! {
        "siglip_vision_model" in "siglip", classes [SiglipVisionModel: Base],
        no_split ["SiglipVisionEmbeddings", "SiglipEncoderLayer", "SiglipMultiheadAttentionPoolingHead"],
        tp super::clip::TP_PLAN, config SiglipVisionConfig, loaders Loaders::Image(load_vision),
    }
};

/// The registry entry of `siglip`.
pub(crate) const FAMILY: Family = family! {
    "siglip" in "siglip", classes [SiglipModel: Base],
    no_split ["SiglipTextEmbeddings", "SiglipEncoderLayer", "SiglipVisionEmbeddings",
        "SiglipMultiheadAttentionPoolingHead"],
    tp super::clip::TP_PLAN, config SiglipConfig, loaders Loaders::ImageText(load),
};

/// `text_config` of SigLIP, as transformers' `SiglipTextConfig` reads it.
#[derive(Clone, Debug, Deserialize)]
pub struct SiglipTextConfig {
    /// Rows of the token embedding table.
    #[serde(default = "defaults::usize::<32000>")]
    pub vocab_size: usize,
    /// Width of the residual stream.
    #[serde(default = "defaults::usize::<768>")]
    pub hidden_size: usize,
    /// Width of the MLP.
    #[serde(default = "defaults::usize::<3072>")]
    pub intermediate_size: usize,
    /// Encoder layers.
    #[serde(default = "defaults::usize::<12>")]
    pub num_hidden_layers: usize,
    /// Attention heads.
    #[serde(default = "defaults::usize::<12>")]
    pub num_attention_heads: usize,
    /// Positions the embeddings cover.
    #[serde(default = "defaults::usize::<64>")]
    pub max_position_embeddings: usize,
    /// MLP activation.
    #[serde(default = "defaults::gelu_pytorch_tanh")]
    pub hidden_act: String,
    /// Epsilon of every LayerNorm.
    #[serde(default = "defaults::eps_1e6")]
    pub layer_norm_eps: f64,
    /// Width of `head` (the pooled output); the hidden size when absent.
    pub projection_size: Option<usize>,
}

/// `vision_config` of SigLIP, as transformers' `SiglipVisionConfig` reads it.
#[derive(Clone, Debug, Deserialize)]
pub struct SiglipVisionConfig {
    /// Width of the residual stream.
    #[serde(default = "defaults::usize::<768>")]
    pub hidden_size: usize,
    /// Width of the MLP.
    #[serde(default = "defaults::usize::<3072>")]
    pub intermediate_size: usize,
    /// Encoder layers.
    #[serde(default = "defaults::usize::<12>")]
    pub num_hidden_layers: usize,
    /// Attention heads.
    #[serde(default = "defaults::usize::<12>")]
    pub num_attention_heads: usize,
    /// Channels of the pixel values.
    #[serde(default = "defaults::usize::<3>")]
    pub num_channels: usize,
    /// Side of the square image the position embeddings cover.
    #[serde(default = "defaults::usize::<224>")]
    pub image_size: usize,
    /// Side of a square patch.
    #[serde(default = "defaults::usize::<16>")]
    pub patch_size: usize,
    /// MLP activation.
    #[serde(default = "defaults::gelu_pytorch_tanh")]
    pub hidden_act: String,
    /// Epsilon of every LayerNorm.
    #[serde(default = "defaults::eps_1e6")]
    pub layer_norm_eps: f64,
    /// Whether the attention pooling head computes a pooled output.
    #[serde(default = "defaults::yes")]
    pub vision_use_head: bool,
}

/// Reads a tower's config: the `key` sub-config of a `siglip` config, else the whole file.
fn sub_config<T: serde::de::DeserializeOwned>(cfg: &PretrainedConfig, key: &str) -> Result<T> {
    match cfg.get(key) {
        Some(v) if cfg.model_type.as_deref() == Some("siglip") => {
            serde_json::from_value(v).map_err(|e| config_error(cfg, format!("`{key}`: {e}")))
        }
        _ => Ok(cfg.parse_as()?),
    }
}

impl SiglipTextConfig {
    /// Reads and checks the text tower's config (`text_config` of a `siglip` config).
    pub fn from_pretrained(cfg: &PretrainedConfig) -> Result<SiglipTextConfig> {
        let c: SiglipTextConfig = sub_config(cfg, "text_config")?;
        positive_fields!(cfg; c.vocab_size, c.hidden_size, c.intermediate_size,
            c.num_hidden_layers, c.num_attention_heads, c.max_position_embeddings)?;
        heads_divide!(cfg; c.hidden_size, c.num_attention_heads)?;
        if c.projection_size == Some(0) {
            return Err(config_error(cfg, "`projection_size` is 0".into()));
        }
        Activation::from_hf(&c.hidden_act)
            .map_err(|e| config_error(cfg, format!("`hidden_act`: {e}")))?;
        Ok(c)
    }

    fn layer_spec(&self) -> LayerSpec<'_> {
        LayerSpec {
            hidden: self.hidden_size,
            intermediate: self.intermediate_size,
            heads: self.num_attention_heads,
            eps: self.layer_norm_eps,
            act: &self.hidden_act,
        }
    }
}

impl SiglipVisionConfig {
    /// Reads and checks the vision tower's config (`vision_config` of a `siglip` config).
    pub fn from_pretrained(cfg: &PretrainedConfig) -> Result<SiglipVisionConfig> {
        let c: SiglipVisionConfig = sub_config(cfg, "vision_config")?;
        positive_fields!(cfg; c.hidden_size, c.intermediate_size, c.num_hidden_layers,
            c.num_attention_heads, c.num_channels, c.image_size, c.patch_size)?;
        heads_divide!(cfg; c.hidden_size, c.num_attention_heads)?;
        if c.patch_size > c.image_size {
            return Err(config_error(
                cfg,
                format!(
                    "`patch_size` ({}) is larger than `image_size` ({})",
                    c.patch_size, c.image_size
                ),
            ));
        }
        Activation::from_hf(&c.hidden_act)
            .map_err(|e| config_error(cfg, format!("`hidden_act`: {e}")))?;
        Ok(c)
    }

    /// Patches along one side of `image_size`.
    pub fn grid_side(&self) -> usize {
        self.image_size / self.patch_size
    }

    fn layer_spec(&self) -> LayerSpec<'_> {
        LayerSpec {
            hidden: self.hidden_size,
            intermediate: self.intermediate_size,
            heads: self.num_attention_heads,
            eps: self.layer_norm_eps,
            act: &self.hidden_act,
        }
    }
}

/// `config.json` of a `SiglipModel`: both towers' configs.
#[derive(Clone, Debug)]
pub struct SiglipConfig {
    /// `text_config`.
    pub text: SiglipTextConfig,
    /// `vision_config`.
    pub vision: SiglipVisionConfig,
}

impl SiglipConfig {
    /// Reads both sub-configs.
    pub fn from_pretrained(cfg: &PretrainedConfig) -> Result<SiglipConfig> {
        Ok(SiglipConfig {
            text: SiglipTextConfig::from_pretrained(cfg)?,
            vision: SiglipVisionConfig::from_pretrained(cfg)?,
        })
    }
}

fn encoder_shape(layers: usize, hidden: usize, intermediate: usize, heads: usize) -> ModelShape {
    ModelShape::encoder(layers, hidden, intermediate, heads, hidden / heads)
}

/// The text tower's planner view: embeddings, then `encoder.layers.N` (under `text_model.`
/// in transformers 4 checkpoints).
fn text_layout(config: &PretrainedConfig) -> Result<Layout> {
    let c = SiglipTextConfig::from_pretrained(config)?;
    Ok(Layout {
        layer_containers: vec!["encoder.layers".into(), "text_model.encoder.layers".into()],
        inputs: vec!["embeddings".into(), "text_model.embeddings".into()],
        tied: Vec::new(),
        shape: encoder_shape(
            c.num_hidden_layers,
            c.hidden_size,
            c.intermediate_size,
            c.num_attention_heads,
        ),
        context: c.max_position_embeddings,
    })
}

/// The vision tower's planner view.
fn vision_layout(config: &PretrainedConfig) -> Result<Layout> {
    Ok(vision_layout_of(&SiglipVisionConfig::from_pretrained(
        config,
    )?))
}

/// The vision tower's planner view from its typed config.
pub(crate) fn vision_layout_of(c: &SiglipVisionConfig) -> Layout {
    Layout {
        layer_containers: vec![
            "encoder.layers".into(),
            "vision_model.encoder.layers".into(),
        ],
        inputs: vec!["embeddings".into(), "vision_model.embeddings".into()],
        tied: Vec::new(),
        shape: encoder_shape(
            c.num_hidden_layers,
            c.hidden_size,
            c.intermediate_size,
            c.num_attention_heads,
        ),
        context: c.grid_side() * c.grid_side(),
    }
}

/// `SiglipModel`'s planner view: the text tower's layers, then the vision tower's.
fn layout(config: &PretrainedConfig) -> Result<Layout> {
    let c = SiglipConfig::from_pretrained(config)?;
    let (t, v) = (&c.text, &c.vision);
    Ok(Layout {
        layer_containers: vec![
            "text_model.encoder.layers".into(),
            "vision_model.encoder.layers".into(),
        ],
        inputs: vec![
            "text_model.embeddings".into(),
            "vision_model.embeddings".into(),
        ],
        tied: Vec::new(),
        shape: encoder_shape(
            t.num_hidden_layers + v.num_hidden_layers,
            t.hidden_size.max(v.hidden_size),
            t.intermediate_size.max(v.intermediate_size),
            t.num_attention_heads.max(v.num_attention_heads),
        ),
        context: t.max_position_embeddings.max(v.grid_side() * v.grid_side()),
    })
}

/// The module prefix a tower's weights sit under: `name.` when the checkpoint has it there.
fn tower_root(w: &Weights, name: &'static str, probe: &str) -> (Weights, &'static str) {
    if w.contains(&format!("{name}.{probe}")) {
        (
            w.pp(name),
            if name == "text_model" {
                "text_model."
            } else {
                "vision_model."
            },
        )
    } else {
        (w.clone(), "")
    }
}

fn load_text(w: &Weights, config: &PretrainedConfig, task: Task) -> Result<Box<dyn Encoder>> {
    task.base_only(config, "SigLIP's text model computes embeddings")?;
    let c = SiglipTextConfig::from_pretrained(config)?;
    Ok(Box::new(SiglipTextModel::load_either(w, &c)?))
}

fn load_vision(
    w: &Weights,
    config: &PretrainedConfig,
    task: Task,
) -> Result<Box<dyn ImageEncoder>> {
    task.base_only(config, "SigLIP's vision model computes embeddings")?;
    let c = SiglipVisionConfig::from_pretrained(config)?;
    Ok(Box::new(SiglipVisionModel::load_either(w, &c)?))
}

fn load(w: &Weights, config: &PretrainedConfig) -> Result<Box<dyn ImageTextModel>> {
    let c = SiglipConfig::from_pretrained(config)?;
    let scalar = |name: &str| -> Result<f64> {
        Ok(w.get(name, &[1])?.to_dtype(DType::F64)?.to_vec::<f64>()?[0])
    };
    Ok(Box::new(SiglipModel {
        text: SiglipTextModel::load(&w.pp("text_model"), &c.text, "text_model.")?,
        vision: SiglipVisionModel::load(&w.pp("vision_model"), &c.vision, "vision_model.")?,
        logit_scale: scalar("logit_scale")?,
        logit_bias: scalar("logit_bias")?,
        dtype: w.dtype(),
    }))
}

/// `SiglipTextModel`: token and position embeddings, the encoder with the padding mask,
/// `final_layer_norm`, and the last position through `head` as the pooled output.
#[derive(Clone, Debug)]
pub struct SiglipTextModel {
    token_embedding: Embedding,
    position_embedding: Embedding,
    encoder: CLIPEncoder,
    final_layer_norm: LayerNorm,
    head: Linear,
    config: SiglipTextConfig,
    placement: Placement,
    prefix: &'static str,
}

impl SiglipTextModel {
    /// Loads the tower under `w`, its hidden states named under `prefix`.
    pub fn load(
        w: &Weights,
        c: &SiglipTextConfig,
        prefix: &'static str,
    ) -> Result<SiglipTextModel> {
        let e = w.pp("embeddings");
        let encoder = CLIPEncoder::load(&w.pp("encoder"), c.num_hidden_layers, &c.layer_spec())?;
        let token_embedding =
            Embedding::load(&e.pp("token_embedding"), c.vocab_size, c.hidden_size)?;
        let final_layer_norm =
            LayerNorm::load(&w.pp("final_layer_norm"), c.hidden_size, c.layer_norm_eps)?;
        let first = token_embedding.device();
        let last = final_layer_norm.device_or(first);
        let out = c.projection_size.unwrap_or(c.hidden_size);
        Ok(SiglipTextModel {
            placement: encoder.placement(w.dtype(), first, last),
            token_embedding,
            position_embedding: Embedding::load(
                &e.pp("position_embedding"),
                c.max_position_embeddings,
                c.hidden_size,
            )?,
            encoder,
            final_layer_norm,
            head: Linear::load(&w.pp("head"), c.hidden_size, out, true)?,
            config: c.clone(),
            prefix,
        })
    }

    fn load_either(w: &Weights, c: &SiglipTextConfig) -> Result<SiglipTextModel> {
        let (root, prefix) = tower_root(w, "text_model", "final_layer_norm.weight");
        SiglipTextModel::load(&root, c, prefix)
    }
}

impl Tower for SiglipTextModel {
    fn placement(&self) -> &Placement {
        &self.placement
    }
    fn hidden_state_modules(&self) -> Vec<String> {
        self.encoder.modules(self.prefix, "embeddings")
    }
}

impl TextTower for SiglipTextModel {
    fn vocab_size(&self) -> usize {
        self.config.vocab_size
    }
    fn max_position_embeddings(&self) -> usize {
        self.config.max_position_embeddings
    }
    fn run(&self, args: EncoderArgs<'_>) -> Result<EncoderOutput> {
        let c = &self.config;
        let [b, t] = args.input_ids.shape()[..] else {
            return Err(Error::invalid(
                "input_ids",
                format!(
                    "input_ids {:?} must be [batch, seq]",
                    args.input_ids.shape()
                ),
            ));
        };
        if t == 0 || t > c.max_position_embeddings {
            return Err(Error::invalid("input_ids", format!(
                "the input has {t} tokens; SigLIP's text model takes 1 to {} (max_position_embeddings); truncate it",
                c.max_position_embeddings
            )));
        }
        let host = |x: &Tensor, name: &'static str, below: usize| -> Result<Vec<i64>> {
            if x.shape() != [b, t] {
                return Err(Error::invalid(
                    name,
                    format!("{name} {:?} must be [{b}, {t}]", x.shape()),
                ));
            }
            let v = x.to_dtype(DType::I64)?.to_vec::<i64>()?;
            if let Some(bad) = v.iter().find(|&&i| i < 0 || i as usize >= below) {
                return Err(Error::invalid(
                    name,
                    format!("{name} holds {bad}, outside 0..{below}"),
                ));
            }
            Ok(v)
        };
        let ids = host(args.input_ids, "input_ids", c.vocab_size)?;
        let positions = match args.position_ids {
            Some(p) => host(p, "position_ids", c.max_position_embeddings)?,
            None => (0..b).flat_map(|_| 0..t as i64).collect(),
        };
        let real = match args.attention_mask {
            Some(m) => host(m, "attention_mask", 2)?,
            None => vec![1; b * t],
        };
        let device = Tower::device(self);
        let x = self
            .token_embedding
            .forward(&Tensor::from_vec(ids, &[b, t], &device)?)?
            .add(&self.position_embedding.forward(&Tensor::from_vec(
                positions,
                &[b, t],
                &device,
            )?)?)?;
        // Bidirectional: every query sees the row's real keys.
        let bias = real.contains(&0).then(|| {
            let low = self.placement.dtype().finite_min();
            let mut m = vec![0f64; b * t * t];
            for r in 0..b {
                for q in 0..t {
                    for k in 0..t {
                        if real[r * t + k] == 0 {
                            m[(r * t + q) * t + k] = low;
                        }
                    }
                }
            }
            m
        });
        let bias = bias.as_ref().map(|m| HostBias {
            values: m,
            shape: [b, 1, t, t],
            dtype: self.placement.dtype(),
        });
        let mut hidden_states = Vec::new();
        let hidden = args.output_hidden_states.then_some(&mut hidden_states);
        let x = self.encoder.forward(x, bias, hidden)?;
        if args.output_hidden_states {
            hidden_states.push(x.clone());
        }
        let x = x.to_device(&self.final_layer_norm.device_or(device))?;
        let last = self.final_layer_norm.forward(&x)?;
        let pooled = last.narrow(1, t - 1, 1)?.squeeze(1)?;
        let pooled = self.head.forward(&pooled.to_device(&self.head.device())?)?;
        Ok(EncoderOutput {
            last_hidden_state: last,
            pooler_output: Some(pooled),
            hidden_states,
            logits: None,
            embeds: None,
        })
    }
}

/// `SiglipMultiheadAttentionPoolingHead`: a learned probe attends to the tokens
/// (`torch.nn.MultiheadAttention` with packed `in_proj_weight`), then a LayerNorm'd MLP is
/// added to what it read.
#[derive(Clone, Debug)]
struct PoolingHead {
    probe: Tensor,
    q: Linear,
    k: Linear,
    v: Linear,
    out_proj: Linear,
    layernorm: LayerNorm,
    fc1: Linear,
    fc2: Linear,
    act: Activation,
    heads: usize,
}

impl PoolingHead {
    fn load(w: &Weights, c: &SiglipVisionConfig) -> Result<PoolingHead> {
        let h = c.hidden_size;
        let a = w.pp("attention");
        let packed = a.get("in_proj_weight", &[3 * h, h])?;
        let bias = a.get("in_proj_bias", &[3 * h])?;
        let part = |i: usize| -> Result<Linear> {
            Ok(Linear::new(
                packed.narrow(0, i * h, h)?.contiguous()?,
                Some(bias.narrow(0, i * h, h)?.contiguous()?),
            ))
        };
        Ok(PoolingHead {
            probe: w.get("probe", &[1, 1, h])?,
            q: part(0)?,
            k: part(1)?,
            v: part(2)?,
            out_proj: Linear::load(&a.pp("out_proj"), h, h, true)?,
            layernorm: LayerNorm::load(&w.pp("layernorm"), h, c.layer_norm_eps)?,
            fc1: Linear::load(&w.pp("mlp.fc1"), h, c.intermediate_size, true)?,
            fc2: Linear::load(&w.pp("mlp.fc2"), c.intermediate_size, h, true)?,
            act: Activation::from_hf(&c.hidden_act)?,
            heads: c.num_attention_heads,
        })
    }

    /// `x [B, T, hidden]` to `[B, hidden]`.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let (b, t, h) = (x.dim(0)?, x.dim(1)?, x.dim(2)?);
        let d = h / self.heads;
        let split = |y: Tensor, n: usize| -> Result<Tensor> {
            Ok(y.reshape_to(&[b, n, self.heads, d])?.transpose(1, 2)?)
        };
        let x = x.to_device(&self.q.device())?;
        let probe = self.probe.broadcast_as(&[b, 1, h])?;
        let q = split(self.q.forward(&probe)?, 1)?;
        let k = split(self.k.forward(&x)?, t)?;
        let v = split(self.v.forward(&x)?, t)?;
        let ctx = Tensor::scaled_dot_product_attention(&q, &k, &v, &SdpaOptions::default())?;
        let a = self
            .out_proj
            .forward(&ctx.transpose(1, 2)?.reshape_to(&[b, 1, h])?)?;
        let m = self.fc2.forward(
            &self
                .act
                .apply(&self.fc1.forward(&self.layernorm.forward(&a)?)?)?,
        )?;
        Ok(a.add(&m)?.squeeze(1)?)
    }
}

/// `SiglipVisionModel`: patch embeddings and positions (no class token), the encoder,
/// `post_layernorm` over every token, and the attention pooling head's output as the pooled
/// output (none with `vision_use_head: false`).
#[derive(Clone, Debug)]
pub struct SiglipVisionModel {
    patch_embedding: PatchEmbedding,
    position_embedding: Tensor,
    encoder: CLIPEncoder,
    post_layernorm: LayerNorm,
    head: Option<PoolingHead>,
    config: SiglipVisionConfig,
    placement: Placement,
    prefix: &'static str,
}

impl SiglipVisionModel {
    /// Loads the tower under `w`, its hidden states named under `prefix`.
    pub fn load(
        w: &Weights,
        c: &SiglipVisionConfig,
        prefix: &'static str,
    ) -> Result<SiglipVisionModel> {
        let e = w.pp("embeddings");
        let side = c.grid_side();
        let encoder = CLIPEncoder::load(&w.pp("encoder"), c.num_hidden_layers, &c.layer_spec())?;
        let patch_embedding = PatchEmbedding::load(
            &e.pp("patch_embedding"),
            c.num_channels,
            c.hidden_size,
            (c.patch_size, c.patch_size),
            true,
        )?;
        let position_embedding = e
            .pp("position_embedding")
            .get("weight", &[side * side, c.hidden_size])?;
        let post_layernorm =
            LayerNorm::load(&w.pp("post_layernorm"), c.hidden_size, c.layer_norm_eps)?;
        let first = position_embedding.device();
        let last = post_layernorm.device_or(first);
        Ok(SiglipVisionModel {
            placement: encoder.placement(w.dtype(), first, last),
            patch_embedding,
            position_embedding,
            encoder,
            post_layernorm,
            head: match c.vision_use_head {
                true => Some(PoolingHead::load(&w.pp("head"), c)?),
                false => None,
            },
            config: c.clone(),
            prefix,
        })
    }

    /// Loads the tower at the root or under `vision_model.`, wherever the checkpoint has it.
    pub(crate) fn load_either(w: &Weights, c: &SiglipVisionConfig) -> Result<SiglipVisionModel> {
        let (root, prefix) = tower_root(w, "vision_model", "post_layernorm.weight");
        SiglipVisionModel::load(&root, c, prefix)
    }

    /// The config the model was built from.
    pub fn config(&self) -> &SiglipVisionConfig {
        &self.config
    }
}

impl Tower for SiglipVisionModel {
    fn placement(&self) -> &Placement {
        &self.placement
    }
    fn hidden_state_modules(&self) -> Vec<String> {
        self.encoder.modules(self.prefix, "embeddings")
    }
}

impl ImageTower for SiglipVisionModel {
    fn image_size(&self) -> (usize, usize) {
        (self.config.image_size, self.config.image_size)
    }
    fn run(&self, args: ImageArgs<'_>) -> Result<EncoderOutput> {
        let c = &self.config;
        let (_, h, w) = args.check((c.image_size, c.image_size))?;
        let device = Tower::device(self);
        let x = self.patch_embedding.forward(
            &args.pixel_values.to_device(&device)?,
            self.placement.dtype(),
        )?;
        let (rows, cols) = self.patch_embedding.grid(h, w);
        let side = c.grid_side();
        // transformers keeps the table when the grid has as many patches and the image is
        // square, and interpolates otherwise (when asked).
        let positions = if args.interpolate_pos_encoding && !(rows * cols == side * side && h == w)
        {
            interpolate_positions(&self.position_embedding, side, (rows, cols))?
        } else {
            self.position_embedding.clone()
        };
        let x = x.add(&positions.unsqueeze(0)?)?;
        let mut hidden_states = Vec::new();
        let hidden = args.output_hidden_states.then_some(&mut hidden_states);
        let x = self.encoder.forward(x, None, hidden)?;
        if args.output_hidden_states {
            hidden_states.push(x.clone());
        }
        let x = x.to_device(&self.post_layernorm.device_or(device))?;
        let last = self.post_layernorm.forward(&x)?;
        let pooled = match &self.head {
            Some(head) => Some(head.forward(&last)?),
            None => None,
        };
        Ok(EncoderOutput {
            last_hidden_state: last,
            pooler_output: pooled,
            hidden_states,
            logits: None,
            embeds: None,
        })
    }
}

/// `SiglipModel`.
#[derive(Clone, Debug)]
pub struct SiglipModel {
    text: SiglipTextModel,
    vision: SiglipVisionModel,
    logit_scale: f64,
    logit_bias: f64,
    dtype: DType,
}

impl ImageTextModel for SiglipModel {
    fn text(&self) -> &dyn Encoder {
        &self.text
    }
    fn vision(&self) -> &dyn ImageEncoder {
        &self.vision
    }
    fn into_text(self: Box<Self>) -> Box<dyn Encoder> {
        Box::new(self.text)
    }
    fn into_vision(self: Box<Self>) -> Box<dyn ImageEncoder> {
        Box::new(self.vision)
    }
    fn zero_shot(&self) -> ZeroShotScores {
        ZeroShotScores::Sigmoid {
            max_length: self.text.config.max_position_embeddings.min(64),
        }
    }
    fn forward(&self, text: EncoderArgs<'_>, image: ImageArgs<'_>) -> Result<ImageTextOutput> {
        let text_out = self.text.run(text)?;
        let vision_out = self.vision.run(image)?;
        let (Some(t), Some(v)) = (&text_out.pooler_output, &vision_out.pooler_output) else {
            return Err(Error::invalid(
                "model",
                "this SigLIP's vision tower has no pooling head (vision_use_head is false)".into(),
            ));
        };
        let device = t.device();
        let text_embeds = normalized(t)?;
        let image_embeds = normalized(&v.to_device(&device)?)?;
        let scale = Tensor::scalar(self.logit_scale, self.dtype, &device)?.exp()?;
        let bias = Tensor::scalar(self.logit_bias, self.dtype, &device)?;
        let logits_per_text = text_embeds
            .matmul(&image_embeds.t()?)?
            .mul(&scale)?
            .add(&bias)?;
        let logits_per_image = logits_per_text.t()?.contiguous()?;
        Ok(ImageTextOutput {
            logits_per_image,
            logits_per_text,
            text_embeds,
            image_embeds,
            text_model_output: text_out,
            vision_model_output: vision_out,
        })
    }
}

impl SiglipModel {
    /// The learned log scale and the bias of the logits.
    pub fn logit_scale_and_bias(&self) -> (f64, f64) {
        (self.logit_scale, self.logit_bias)
    }
}
