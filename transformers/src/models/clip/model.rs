//! `CLIPModel`: both towers (`text_model.*`, `vision_model.*`), their projections
//! (`text_projection`, `visual_projection`) and the learned temperature `logit_scale`.
//! `logits_per_text` is `exp(logit_scale)` times the cosine similarity of the L2-normalized
//! embeddings; `logits_per_image` is its transpose.

use zoo_hub::PretrainedConfig;
use zoo_runtime::device_map::ModelShape;
use zoo_runtime::nn::Weights;
use zoo_runtime::{DType, Tensor};

use super::text::{CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection};
use super::vision::{CLIPVisionConfig, CLIPVisionModel, CLIPVisionModelWithProjection};
use super::WithProjection;
use crate::family::{family, Family, Layout, Loaders};
use crate::kinds::{
    Encoder, EncoderArgs, ImageArgs, ImageEncoder, ImageTextModel, ImageTextOutput,
};
use crate::{Error, Result};

/// The registry entry of `clip`.
pub(crate) const FAMILY: Family = family! {
    "clip" in "clip", classes [CLIPModel: Base],
    no_split ["CLIPTextEmbeddings", "CLIPEncoderLayer", "CLIPVisionEmbeddings"],
    tp super::TP_PLAN, config CLIPConfig, loaders Loaders::ImageText(load),
};

/// `config.json` of a `CLIPModel`: both towers' configs and the shared projection width.
#[derive(Clone, Debug)]
pub struct CLIPConfig {
    /// `text_config`.
    pub text: CLIPTextConfig,
    /// `vision_config`.
    pub vision: CLIPVisionConfig,
    /// Width of both projections (`projection_dim`, default 512).
    pub projection_dim: usize,
}

impl CLIPConfig {
    /// Reads `text_config`, `vision_config` and `projection_dim`.
    pub fn from_pretrained(cfg: &PretrainedConfig) -> Result<CLIPConfig> {
        for sub in ["text_config", "vision_config"] {
            if cfg.get(sub).is_none() {
                return Err(Error::Config {
                    path: cfg.path.clone(),
                    reason: format!("a CLIPModel config needs `{sub}`"),
                });
            }
        }
        let projection_dim = match cfg.get("projection_dim") {
            None => 512,
            Some(v) => v.as_u64().filter(|&n| n > 0).ok_or_else(|| Error::Config {
                path: cfg.path.clone(),
                reason: format!("`projection_dim` is {v}, not a positive integer"),
            })? as usize,
        };
        Ok(CLIPConfig {
            text: CLIPTextConfig::from_pretrained(cfg)?,
            vision: CLIPVisionConfig::from_pretrained(cfg)?,
            projection_dim,
        })
    }
}

/// The planner's view: the text tower's embeddings and layers, then the vision tower's.
/// Sized by the wider tower; the text context bounds the text side.
fn layout(config: &PretrainedConfig) -> Result<Layout> {
    let c = CLIPConfig::from_pretrained(config)?;
    let vision = super::vision::vision_layout(&c.vision);
    let (t, v) = (&c.text, &c.vision);
    Ok(Layout {
        layer_containers: vec![
            "text_model.encoder.layers".into(),
            "vision_model.encoder.layers".into(),
        ],
        inputs: vec![
            "text_model.embeddings".into(),
            "vision_model.embeddings".into(),
            "vision_model.pre_layrnorm".into(),
        ],
        tied: Vec::new(),
        shape: ModelShape::encoder(
            t.num_hidden_layers + v.num_hidden_layers,
            t.hidden_size.max(v.hidden_size),
            t.intermediate_size.max(v.intermediate_size),
            t.num_attention_heads.max(v.num_attention_heads),
            (t.hidden_size / t.num_attention_heads).max(v.hidden_size / v.num_attention_heads),
        ),
        context: vision.context.max(t.max_position_embeddings),
    })
}

fn load(w: &Weights, config: &PretrainedConfig) -> Result<Box<dyn ImageTextModel>> {
    let c = CLIPConfig::from_pretrained(config)?;
    let text = CLIPTextModel::load(&w.pp("text_model"), &c.text)?.under("text_model.");
    let vision = CLIPVisionModel::load_either(w, &c.vision)?;
    let text = WithProjection::load(
        text,
        w,
        "text_projection",
        c.text.hidden_size,
        c.projection_dim,
    )?;
    let vision = WithProjection::load(
        vision,
        w,
        "visual_projection",
        c.vision.hidden_size,
        c.projection_dim,
    )?;
    let logit_scale = w
        .get("logit_scale", &[])?
        .to_dtype(DType::F64)?
        .to_scalar::<f64>()?;
    Ok(Box::new(CLIPModel {
        text,
        vision,
        logit_scale,
        dtype: w.dtype(),
    }))
}

/// `CLIPModel`.
#[derive(Clone, Debug)]
pub struct CLIPModel {
    text: CLIPTextModelWithProjection,
    vision: CLIPVisionModelWithProjection,
    /// The stored (log) temperature; logits scale by its exponential.
    logit_scale: f64,
    dtype: DType,
}

impl CLIPModel {
    /// The learned log temperature (`logit_scale`, before `exp`).
    pub fn logit_scale(&self) -> f64 {
        self.logit_scale
    }
}

/// `x / ||x||` over the last dim, as transformers' `_get_vector_norm`: the sum of squares
/// and its square root in the embeddings' dtype.
pub(crate) fn normalized(x: &Tensor) -> Result<Tensor> {
    let norm = x.square()?.sum(&[-1], true)?.sqrt()?;
    Ok(x.div(&norm)?)
}

impl ImageTextModel for CLIPModel {
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

    fn forward(&self, text: EncoderArgs<'_>, image: ImageArgs<'_>) -> Result<ImageTextOutput> {
        let mut text_out = self.text.project_text(text)?;
        let mut vision_out = self.vision.project_image(image)?;
        let (Some(t), Some(v)) = (text_out.embeds.take(), vision_out.embeds.take()) else {
            return Err(Error::Internal(
                "CLIP's towers returned no projected embeddings".into(),
            ));
        };
        // transformers 5's CLIPModel reports each tower's pooled output after its projection
        // (`get_text_features` / `get_image_features` overwrite it).
        text_out.pooler_output = Some(t.clone());
        vision_out.pooler_output = Some(v.clone());
        let device = t.device();
        let text_embeds = normalized(&t)?;
        let image_embeds = normalized(&v.to_device(&device)?)?;
        // transformers scales by `logit_scale.exp()` computed in the parameter's dtype.
        let scale = Tensor::scalar(self.logit_scale, self.dtype, &device)?.exp()?;
        let logits_per_text = text_embeds.matmul(&image_embeds.t()?)?.mul(&scale)?;
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
