//! CLIP's text tower (`CLIPTextModel`, `CLIPTextModelWithProjection`).
//!
//! A pre-norm causal encoder: token + absolute position embeddings; per layer, LayerNorm,
//! self-attention that sees earlier real tokens only (causal and padding masks), a residual,
//! LayerNorm, an MLP (`quick_gelu` by default) and a residual; a final LayerNorm. The pooled
//! output is the final state at the end-of-text token of each row: the first position
//! holding `eos_token_id`, or, for configs written before transformers corrected it (`eos_token_id`
//! 2), the position of the row's highest id (the end-of-text token has CLIP's highest id). The
//! projection head multiplies it by `text_projection` (`text_embeds`). Weight names are the
//! checkpoint's (`text_model.encoder.layers.3.self_attn.q_proj.weight`, or without
//! `text_model.` as transformers 5 saves a bare `CLIPTextModel`).

use serde::Deserialize;
use zoo_hub::PretrainedConfig;
use zoo_runtime::device_map::ModelShape;
use zoo_runtime::nn::{Embedding, LayerNorm, Weights};
use zoo_runtime::{Activation, DType, Device, Tensor};

use super::{CLIPEncoder, HostBias, LayerSpec, WithProjection};

use crate::config::{config_error, defaults, heads_divide, positive_fields};
use crate::family::{family, Family, Layout, Loaders, Task};
use crate::kinds::{self, EncoderArgs, EncoderOutput, TextTower, Tower};
use crate::models::Placement;
use crate::{Error, Result};

/// The registry entry of `clip_text_model`. Both classes serve `AutoModel`'s task; which one
/// loads follows the checkpoint's `architectures`.
pub(crate) const FAMILY: Family = family! {
    "clip_text_model" in "clip", classes [CLIPTextModel: Base, CLIPTextModelWithProjection: Base],
    no_split ["CLIPTextEmbeddings", "CLIPEncoderLayer"],
    tp super::TP_PLAN, config CLIPTextConfig, loaders Loaders::Encoder(load),
};

/// `config.json` of a CLIP text tower, as transformers' `CLIPTextConfig` reads it.
#[derive(Clone, Debug, Deserialize)]
pub struct CLIPTextConfig {
    /// Rows of the token embedding table.
    pub vocab_size: usize,
    /// Width of the residual stream.
    pub hidden_size: usize,
    /// Width of the MLP.
    pub intermediate_size: usize,
    /// Encoder layers.
    pub num_hidden_layers: usize,
    /// Attention heads.
    pub num_attention_heads: usize,
    /// Positions the embeddings cover (77 in CLIP).
    #[serde(default = "defaults::usize::<77>")]
    pub max_position_embeddings: usize,
    /// MLP activation (`quick_gelu`).
    #[serde(default = "defaults::quick_gelu")]
    pub hidden_act: String,
    /// Epsilon of every LayerNorm.
    #[serde(default = "defaults::eps_1e5")]
    pub layer_norm_eps: f64,
    /// Width of `text_embeds`.
    #[serde(default = "defaults::usize::<512>")]
    pub projection_dim: usize,
    /// The end-of-text token the pooled output is taken at; 2 selects the legacy rule.
    #[serde(default = "defaults::i64::<2>")]
    pub eos_token_id: i64,
    /// The config file, for errors.
    #[serde(skip)]
    pub path: std::path::PathBuf,
}

impl CLIPTextConfig {
    pub(crate) fn layer_spec(&self) -> LayerSpec<'_> {
        LayerSpec {
            hidden: self.hidden_size,
            intermediate: self.intermediate_size,
            heads: self.num_attention_heads,
            eps: self.layer_norm_eps,
            act: &self.hidden_act,
        }
    }

    /// Reads the typed config; a CLIPModel config's `text_config` is read when present.
    pub fn from_pretrained(cfg: &PretrainedConfig) -> Result<CLIPTextConfig> {
        let mut c: CLIPTextConfig = match cfg.get("text_config") {
            Some(text) if cfg.model_type.as_deref() == Some("clip") => serde_json::from_value(text)
                .map_err(|e| config_error(cfg, format!("`text_config`: {e}")))?,
            _ => cfg.parse_as()?,
        };
        c.path = cfg.path.clone();
        positive_fields!(cfg; c.vocab_size, c.hidden_size, c.intermediate_size, c.num_hidden_layers,
            c.num_attention_heads, c.max_position_embeddings, c.projection_dim)?;
        heads_divide!(cfg; c.hidden_size, c.num_attention_heads)?;
        Activation::from_hf(&c.hidden_act)
            .map_err(|e| config_error(cfg, format!("`hidden_act`: {e}")))?;
        Ok(c)
    }
}

/// The planner's view: embeddings, then `encoder.layers.N` (under `text_model.` in
/// transformers 4 checkpoints and projection heads), no KV cache.
fn layout(config: &PretrainedConfig) -> Result<Layout> {
    let c = CLIPTextConfig::from_pretrained(config)?;
    Ok(Layout {
        layer_containers: vec!["encoder.layers".into(), "text_model.encoder.layers".into()],
        inputs: vec!["embeddings".into(), "text_model.embeddings".into()],
        tied: Vec::new(),
        shape: ModelShape::encoder(
            c.num_hidden_layers,
            c.hidden_size,
            c.intermediate_size,
            c.num_attention_heads,
            c.hidden_size / c.num_attention_heads,
        ),
        context: c.max_position_embeddings,
    })
}

/// The family's loader: the projection head when the checkpoint is a
/// `CLIPTextModelWithProjection`, else the bare text model.
fn load(w: &Weights, config: &PretrainedConfig, task: Task) -> Result<Box<dyn kinds::Encoder>> {
    let c = CLIPTextConfig::from_pretrained(config)?;
    task.base_only(config, "CLIP's text model computes embeddings")?;
    let projected = config
        .architectures
        .iter()
        .any(|a| a == "CLIPTextModelWithProjection" || a == "CLIPModel");
    // transformers 4 saved a CLIPTextModel's transformer under `text_model.`; transformers 5
    // saves it at the root; the projection head keeps it under `text_model.`.
    let model = if w.contains("text_model.embeddings.token_embedding.weight") {
        CLIPTextModel::load(&w.pp("text_model"), &c)?.under("text_model.")
    } else {
        CLIPTextModel::load(w, &c)?
    };
    Ok(if projected {
        Box::new(WithProjection::load(
            model,
            w,
            "text_projection",
            c.hidden_size,
            c.projection_dim,
        )?)
    } else {
        Box::new(model)
    })
}

/// `CLIPTextModel` (its `CLIPTextTransformer`): embeddings, encoder layers, final LayerNorm,
/// the pooled state at each row's end-of-text token.
#[derive(Clone, Debug)]
pub struct CLIPTextModel {
    token_embedding: Embedding,
    position_embedding: Embedding,
    encoder: CLIPEncoder,
    final_layer_norm: LayerNorm,
    config: CLIPTextConfig,
    placement: Placement,
    /// The module prefix of the transformer in its checkpoint (`text_model.` or none).
    prefix: &'static str,
}

impl CLIPTextModel {
    /// Loads the transformer's weights under `w` (`embeddings.*`, `encoder.*`,
    /// `final_layer_norm.*`).
    pub fn load(w: &Weights, config: &CLIPTextConfig) -> Result<CLIPTextModel> {
        let c = config;
        let e = w.pp("embeddings");
        let encoder = CLIPEncoder::load(&w.pp("encoder"), c.num_hidden_layers, &c.layer_spec())?;
        let token_embedding =
            Embedding::load(&e.pp("token_embedding"), c.vocab_size, c.hidden_size)?;
        let final_layer_norm =
            LayerNorm::load(&w.pp("final_layer_norm"), c.hidden_size, c.layer_norm_eps)?;
        let first = token_embedding.device();
        let last = final_layer_norm.device_or(first);
        Ok(CLIPTextModel {
            placement: encoder.placement(w.dtype(), first, last),
            token_embedding,
            position_embedding: Embedding::load(
                &e.pp("position_embedding"),
                c.max_position_embeddings,
                c.hidden_size,
            )?,
            encoder,
            final_layer_norm,
            config: c.clone(),
            prefix: "",
        })
    }

    pub(crate) fn under(mut self, prefix: &'static str) -> CLIPTextModel {
        self.prefix = prefix;
        self
    }

    /// The config the model was built from.
    pub fn config(&self) -> &CLIPTextConfig {
        &self.config
    }

    fn final_layer_norm_device(&self) -> Device {
        self.final_layer_norm.device_or(self.device())
    }
}

impl Tower for CLIPTextModel {
    fn placement(&self) -> &Placement {
        &self.placement
    }
    fn hidden_state_modules(&self) -> Vec<String> {
        self.encoder.modules(self.prefix, "embeddings")
    }
}

impl TextTower for CLIPTextModel {
    fn vocab_size(&self) -> usize {
        self.config.vocab_size
    }
    fn max_position_embeddings(&self) -> usize {
        self.config.max_position_embeddings
    }
    fn run(&self, args: EncoderArgs<'_>) -> Result<EncoderOutput> {
        let c = &self.config;
        let ids = args.input_ids;
        let (b, t) = match ids.shape() {
            [b, t] => (*b, *t),
            s => {
                return Err(Error::invalid(
                    "input_ids",
                    format!("input_ids {s:?} must be [batch, seq]"),
                ))
            }
        };
        if t == 0 || t > c.max_position_embeddings {
            return Err(Error::invalid("input_ids", format!(
                "the input has {t} tokens; CLIP's text model takes 1 to {} (max_position_embeddings); truncate it as CLIPTokenizer does",
                c.max_position_embeddings
            )));
        }
        let host = |x: &Tensor, name: &'static str| -> Result<Vec<i64>> {
            if x.shape() != [b, t] {
                return Err(Error::invalid(
                    name,
                    format!(
                        "{name} {:?} must have the shape of input_ids [{b}, {t}]",
                        x.shape()
                    ),
                ));
            }
            match x.host_known_i64() {
                Some(v) => Ok(v),
                None => Ok(x.to_dtype(DType::I64)?.to_vec::<i64>()?),
            }
        };
        let id_values = host(ids, "input_ids")?;
        if let Some(&bad) = id_values
            .iter()
            .find(|&&i| i < 0 || i as usize >= c.vocab_size)
        {
            return Err(Error::invalid(
                "input_ids",
                format!("input_ids holds {bad}, outside 0..{}", c.vocab_size),
            ));
        }
        let real = match args.attention_mask {
            Some(m) => host(m, "attention_mask")?,
            None => vec![1; b * t],
        };
        let positions = match args.position_ids {
            Some(p) => host(p, "position_ids")?,
            None => (0..b).flat_map(|_| 0..t as i64).collect(),
        };
        if let Some(&bad) = positions
            .iter()
            .find(|&&p| p < 0 || p as usize >= c.max_position_embeddings)
        {
            return Err(Error::invalid(
                "position_ids",
                format!(
                    "position_ids holds {bad}, outside 0..{}",
                    c.max_position_embeddings
                ),
            ));
        }
        let device = self.device();
        let ids_t = Tensor::from_vec(id_values.clone(), &[b, t], &device)?;
        let pos_t = Tensor::from_vec(positions, &[b, t], &device)?;
        let x = self
            .token_embedding
            .forward(&ids_t)?
            .add(&self.position_embedding.forward(&pos_t)?)?;
        // transformers' causal mask with padding: a query sees the real keys at or before it.
        let low = self.placement.dtype().finite_min();
        let mut m = vec![0f64; b * t * t];
        for r in 0..b {
            for q in 0..t {
                for k in 0..t {
                    if k > q || real[r * t + k] == 0 {
                        m[(r * t + q) * t + k] = low;
                    }
                }
            }
        }
        let mut hidden_states = Vec::new();
        let bias = HostBias {
            values: &m,
            shape: [b, 1, t, t],
            dtype: self.placement.dtype(),
        };
        let hidden = args.output_hidden_states.then_some(&mut hidden_states);
        let x = self.encoder.forward(x, Some(bias), hidden)?;
        if args.output_hidden_states {
            hidden_states.push(x.clone());
        }
        let x = x.to_device(&self.final_layer_norm_device())?;
        let last = self.final_layer_norm.forward(&x)?;
        // Each row's end-of-text position (the first one).
        let rows: Vec<i64> = id_values
            .chunks(t)
            .enumerate()
            .map(|(r, row)| {
                let at = if c.eos_token_id == 2 {
                    let top = row.iter().copied().max().unwrap_or(0);
                    row.iter().position(|&i| i == top)
                } else {
                    row.iter().position(|&i| i == c.eos_token_id)
                };
                (r * t + at.unwrap_or(0)) as i64
            })
            .collect();
        let rows = Tensor::from_vec(rows, &[b], &last.device())?;
        let pooled = last
            .reshape_to(&[b * t, c.hidden_size])?
            .index_select(0, &rows)?;
        Ok(EncoderOutput {
            last_hidden_state: last,
            pooler_output: Some(pooled),
            hidden_states,
            logits: None,
            embeds: None,
        })
    }
}

/// `CLIPTextModelWithProjection`: the text model's pooled state through `text_projection`,
/// returned as `embeds` (transformers' `text_embeds`; no pooled output).
pub type CLIPTextModelWithProjection = WithProjection<CLIPTextModel>;
