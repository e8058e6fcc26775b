//! CLIP's vision tower (`CLIPVisionModel`, `CLIPVisionModelWithProjection`).
//!
//! Patches of `patch_size` embedded without bias, a learned class embedding in front,
//! absolute position embeddings (interpolated bicubically to other grids on request), a
//! LayerNorm (`pre_layrnorm`, transformers' spelling), the encoder layers without a mask, and
//! the pooled output: the class token's final state through `post_layernorm`. The projection
//! head multiplies it by `visual_projection` (`image_embeds`). Weight names are the
//! checkpoint's: under `vision_model.` in transformers 4 checkpoints and projection heads, at
//! the root for a bare `CLIPVisionModel` saved by transformers 5.

use serde::Deserialize;
use zoo_hub::PretrainedConfig;
use zoo_runtime::device_map::ModelShape;
use zoo_runtime::nn::{LayerNorm, Weights};
use zoo_runtime::{Activation, Device, Tensor};

use super::{CLIPEncoder, LayerSpec, WithProjection};
use crate::config::{config_error, defaults, heads_divide, positive_fields};
use crate::family::{family, Family, Layout, Loaders, Task};
use crate::kinds::{self, EncoderOutput, ImageArgs, ImageTower, Tower};
use crate::models::patches::{interpolate_positions, PatchEmbedding};
use crate::models::Placement;
use crate::Result;

/// The registry entry of `clip_vision_model`; which class loads follows `architectures`.
pub(crate) const FAMILY: Family = family! {
    "clip_vision_model" in "clip",
    classes [CLIPVisionModel: Base, CLIPVisionModelWithProjection: Base],
    no_split ["CLIPVisionEmbeddings", "CLIPEncoderLayer"],
    tp super::TP_PLAN, config CLIPVisionConfig, loaders Loaders::Image(load),
};

/// `config.json` of a CLIP vision tower, as transformers' `CLIPVisionConfig` reads it.
#[derive(Clone, Debug, Deserialize)]
pub struct CLIPVisionConfig {
    /// Width of the residual stream.
    pub hidden_size: usize,
    /// Width of the MLP.
    pub intermediate_size: usize,
    /// Encoder layers.
    pub num_hidden_layers: usize,
    /// Attention heads.
    pub num_attention_heads: usize,
    /// Channels of the pixel values.
    #[serde(default = "defaults::usize::<3>")]
    pub num_channels: usize,
    /// Side of the square image the position embeddings cover.
    pub image_size: usize,
    /// Side of a square patch.
    pub patch_size: usize,
    /// MLP activation (`quick_gelu`).
    #[serde(default = "defaults::quick_gelu")]
    pub hidden_act: String,
    /// Epsilon of every LayerNorm.
    #[serde(default = "defaults::eps_1e5")]
    pub layer_norm_eps: f64,
    /// Width of `image_embeds`.
    #[serde(default = "defaults::usize::<512>")]
    pub projection_dim: usize,
    /// The config file, for errors.
    #[serde(skip)]
    pub path: std::path::PathBuf,
}

impl CLIPVisionConfig {
    pub(crate) fn layer_spec(&self) -> LayerSpec<'_> {
        LayerSpec {
            hidden: self.hidden_size,
            intermediate: self.intermediate_size,
            heads: self.num_attention_heads,
            eps: self.layer_norm_eps,
            act: &self.hidden_act,
        }
    }

    /// Patches along one side of `image_size`.
    pub fn grid_side(&self) -> usize {
        self.image_size / self.patch_size
    }

    /// Reads the typed config; a CLIPModel config's `vision_config` is read when present.
    pub fn from_pretrained(cfg: &PretrainedConfig) -> Result<CLIPVisionConfig> {
        let mut c: CLIPVisionConfig = match cfg.get("vision_config") {
            Some(v) if cfg.model_type.as_deref() == Some("clip") => serde_json::from_value(v)
                .map_err(|e| config_error(cfg, format!("`vision_config`: {e}")))?,
            _ => cfg.parse_as()?,
        };
        c.path = cfg.path.clone();
        positive_fields!(cfg; c.hidden_size, c.intermediate_size, c.num_hidden_layers,
            c.num_attention_heads, c.num_channels, c.image_size, c.patch_size, c.projection_dim)?;
        let bad = |reason: String| config_error(cfg, reason);
        heads_divide!(cfg; c.hidden_size, c.num_attention_heads)?;
        if c.patch_size > c.image_size {
            return Err(bad(format!(
                "`patch_size` ({}) is larger than `image_size` ({})",
                c.patch_size, c.image_size
            )));
        }
        Activation::from_hf(&c.hidden_act).map_err(|e| bad(format!("`hidden_act`: {e}")))?;
        Ok(c)
    }
}

/// The planner's view: embeddings, then `encoder.layers.N` (under `vision_model.` in
/// transformers 4 checkpoints and projection heads), no KV cache.
fn layout(config: &PretrainedConfig) -> Result<Layout> {
    let c = CLIPVisionConfig::from_pretrained(config)?;
    Ok(vision_layout(&c))
}

pub(crate) fn vision_layout(c: &CLIPVisionConfig) -> Layout {
    let tokens = c.grid_side() * c.grid_side() + 1;
    Layout {
        layer_containers: vec![
            "encoder.layers".into(),
            "vision_model.encoder.layers".into(),
        ],
        inputs: vec![
            "embeddings".into(),
            "pre_layrnorm".into(),
            "vision_model.embeddings".into(),
            "vision_model.pre_layrnorm".into(),
        ],
        tied: Vec::new(),
        shape: ModelShape::encoder(
            c.num_hidden_layers,
            c.hidden_size,
            c.intermediate_size,
            c.num_attention_heads,
            c.hidden_size / c.num_attention_heads,
        ),
        context: tokens,
    }
}

/// The family's loader: the projection head for a `CLIPVisionModelWithProjection`, else the
/// bare vision model.
fn load(
    w: &Weights,
    config: &PretrainedConfig,
    task: Task,
) -> Result<Box<dyn kinds::ImageEncoder>> {
    let c = CLIPVisionConfig::from_pretrained(config)?;
    task.base_only(config, "CLIP's vision model computes embeddings")?;
    let projected = config
        .architectures
        .iter()
        .any(|a| a == "CLIPVisionModelWithProjection");
    let model = CLIPVisionModel::load_either(w, &c)?;
    Ok(if projected {
        Box::new(WithProjection::load(
            model,
            w,
            "visual_projection",
            c.hidden_size,
            c.projection_dim,
        )?)
    } else {
        Box::new(model)
    })
}

/// `CLIPVisionModel`: embeddings, `pre_layrnorm`, encoder layers, the class token's state
/// through `post_layernorm` as the pooled output.
#[derive(Clone, Debug)]
pub struct CLIPVisionModel {
    patch_embedding: PatchEmbedding,
    class_embedding: Tensor,
    position_embedding: Tensor,
    pre_layrnorm: LayerNorm,
    encoder: CLIPEncoder,
    post_layernorm: LayerNorm,
    config: CLIPVisionConfig,
    placement: Placement,
    prefix: &'static str,
}

impl CLIPVisionModel {
    /// Loads the tower under `w` (`embeddings.*`, `pre_layrnorm.*`, `encoder.*`,
    /// `post_layernorm.*`).
    pub fn load(w: &Weights, config: &CLIPVisionConfig) -> Result<CLIPVisionModel> {
        let c = config;
        let e = w.pp("embeddings");
        let side = c.grid_side();
        let encoder = CLIPEncoder::load(&w.pp("encoder"), c.num_hidden_layers, &c.layer_spec())?;
        let class_embedding = e.get("class_embedding", &[c.hidden_size])?;
        let post_layernorm =
            LayerNorm::load(&w.pp("post_layernorm"), c.hidden_size, c.layer_norm_eps)?;
        let first = class_embedding.device();
        let last = post_layernorm.device_or(first);
        Ok(CLIPVisionModel {
            placement: encoder.placement(w.dtype(), first, last),
            patch_embedding: PatchEmbedding::load(
                &e.pp("patch_embedding"),
                c.num_channels,
                c.hidden_size,
                (c.patch_size, c.patch_size),
                false,
            )?,
            class_embedding,
            position_embedding: e
                .pp("position_embedding")
                .get("weight", &[side * side + 1, c.hidden_size])?,
            pre_layrnorm: LayerNorm::load(&w.pp("pre_layrnorm"), c.hidden_size, c.layer_norm_eps)?,
            encoder,
            post_layernorm,
            config: c.clone(),
            prefix: "",
        })
    }

    /// Loads the tower at the root or under `vision_model.`, wherever the checkpoint has it.
    pub(crate) fn load_either(w: &Weights, c: &CLIPVisionConfig) -> Result<CLIPVisionModel> {
        if w.contains("vision_model.embeddings.class_embedding") {
            Ok(CLIPVisionModel::load(&w.pp("vision_model"), c)?.under("vision_model."))
        } else {
            CLIPVisionModel::load(w, c)
        }
    }

    fn under(mut self, prefix: &'static str) -> CLIPVisionModel {
        self.prefix = prefix;
        self
    }

    /// The config the model was built from.
    pub fn config(&self) -> &CLIPVisionConfig {
        &self.config
    }

    /// Position embeddings for a `rows x cols` patch grid: the trained table, or its patch
    /// rows interpolated when asked (transformers keeps the table when the grid has as many
    /// patches and the image is square).
    fn positions(&self, rows: usize, cols: usize, h: usize, w: usize) -> Result<Tensor> {
        let side = self.config.grid_side();
        if rows * cols == side * side && h == w {
            return Ok(self.position_embedding.clone());
        }
        let class = self.position_embedding.narrow(0, 0, 1)?;
        let grid = self.position_embedding.narrow(0, 1, side * side)?;
        let grid = interpolate_positions(&grid, side, (rows, cols))?;
        Ok(Tensor::cat(&[&class, &grid], 0)?)
    }

    fn post_layernorm_device(&self) -> Device {
        self.post_layernorm.device_or(self.device())
    }
}

impl Tower for CLIPVisionModel {
    fn placement(&self) -> &Placement {
        &self.placement
    }
    fn hidden_state_modules(&self) -> Vec<String> {
        self.encoder.modules(self.prefix, "pre_layrnorm")
    }
}

impl ImageTower for CLIPVisionModel {
    fn image_size(&self) -> (usize, usize) {
        (self.config.image_size, self.config.image_size)
    }
    fn run(&self, args: ImageArgs<'_>) -> Result<EncoderOutput> {
        let c = &self.config;
        let px = args.pixel_values;
        let (b, h, w) = args.check((c.image_size, c.image_size))?;
        let device = self.device();
        let patches = self
            .patch_embedding
            .forward(&px.to_device(&device)?, self.placement.dtype())?;
        let (rows, cols) = self.patch_embedding.grid(h, w);
        let class = self
            .class_embedding
            .reshape_to(&[1, 1, c.hidden_size])?
            .broadcast_as(&[b, 1, c.hidden_size])?;
        let positions = if args.interpolate_pos_encoding {
            self.positions(rows, cols, h, w)?
        } else {
            self.position_embedding.clone()
        };
        let x = Tensor::cat(&[&class, &patches], 1)?.add(&positions.unsqueeze(0)?)?;
        let x = self.pre_layrnorm.forward(&x)?;
        let mut hidden_states = Vec::new();
        let hidden = args.output_hidden_states.then_some(&mut hidden_states);
        let x = self.encoder.forward(x, None, hidden)?;
        if args.output_hidden_states {
            hidden_states.push(x.clone());
        }
        let x = x.to_device(&self.post_layernorm_device())?;
        let pooled = self
            .post_layernorm
            .forward(&x.narrow(1, 0, 1)?.squeeze(1)?)?;
        Ok(EncoderOutput {
            last_hidden_state: x,
            pooler_output: Some(pooled),
            hidden_states,
            logits: None,
            embeds: None,
        })
    }
}

/// `CLIPVisionModelWithProjection`: the pooled state through `visual_projection`, returned
/// as `embeds` (transformers' `image_embeds`; no pooled output).
pub type CLIPVisionModelWithProjection = WithProjection<CLIPVisionModel>;
