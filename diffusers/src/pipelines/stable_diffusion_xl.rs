//! `StableDiffusionXLPipeline`'s prompt encoding: mirrors diffusers'
//! `pipelines/stable_diffusion_xl/pipeline_stable_diffusion_xl.py` (`encode_prompt`,
//! `_get_add_time_ids`). The denoising loop is Stable Diffusion's.
//!
//! Both CLIP encoders read the prompt; their penultimate hidden states are concatenated
//! along the features, and the second encoder's projected `text_embeds` are the pooled
//! embedding. A missing negative prompt gives zero embeddings when the pipeline says
//! `force_zeros_for_empty_prompt`; the size conditioning is
//! `[height, width, 0, 0, height, width]` for both halves.

use zoo_runtime::{DType, Tensor};

use super::stable_diffusion::{Conditioning, StableDiffusionPipeline};
use super::text_encoders::TextEncoder;
use super::text_to_image::{negatives, TextToImage};
use crate::{Error, Result};

fn encode_both(p: &StableDiffusionPipeline, texts: &[String]) -> Result<(Tensor, Tensor)> {
    let second: &TextEncoder = p
        .text_encoder_2
        .as_ref()
        .ok_or_else(|| Error::Unsupported("an SDXL pipeline without text_encoder_2".into()))?;
    let mut hidden = Vec::with_capacity(2);
    let mut pooled = None;
    for (i, enc) in [&p.text_encoder, second].into_iter().enumerate() {
        let out = enc.encode(texts, true)?;
        let n = out.hidden_states.len();
        if n < 2 {
            return Err(Error::Unsupported(
                "the text encoder returned no per-layer hidden states".into(),
            ));
        }
        hidden.push(out.hidden_states[n - 2].clone());
        if i == 1 {
            pooled = out.embeds.clone();
        }
    }
    let pooled = pooled.ok_or_else(|| {
        Error::Unsupported(
            "text_encoder_2 has no projection: SDXL needs a CLIPTextModelWithProjection".into(),
        )
    })?;
    let device = p.unet.device();
    let a = hidden[0].to_device(&device)?;
    let b = hidden[1].to_device(&device)?;
    Ok((Tensor::cat(&[&a, &b], -1)?, pooled.to_device(&device)?))
}

/// `(positive, negative)` conditioning for an SDXL call at `(height, width)`.
pub(crate) fn encode_prompt(
    p: &StableDiffusionPipeline,
    args: &TextToImage,
    (h, w): (usize, usize),
) -> Result<(Conditioning, Option<Conditioning>)> {
    let n = args.prompt.len();
    let device = p.unet.device();
    let ids: Vec<f64> = (0..n)
        .flat_map(|_| [h as f64, w as f64, 0.0, 0.0, h as f64, w as f64])
        .collect();
    let time_ids = Tensor::from_f64s(&ids, &[n, 6], DType::F32, &device)?;
    let c = p.unet.config();
    let projection = c.projection_class_embeddings_input_dim.unwrap_or_default();
    let (embeds, pooled) = encode_both(p, &args.prompt)?;
    let expected = c.addition_time_embed_dim.unwrap_or_default() * 6 + pooled.shape()[1];
    if expected != projection {
        return Err(Error::Config {
            path: c.path.clone(),
            reason: format!(
                "the UNet's `projection_class_embeddings_input_dim` is {projection}, but 6 time ids x `addition_time_embed_dim` plus text_encoder_2's projection give {expected}: the UNet and text_encoder_2 do not belong together"
            ),
        });
    }
    let pos = Conditioning {
        prompt_embeds: embeds,
        text_embeds: Some(pooled),
        time_ids: Some(time_ids.clone()),
    };
    if args.guidance_scale <= 1.0 {
        return Ok((pos, None));
    }
    let neg = if args.negative_prompt.is_none() && p.force_zeros_for_empty_prompt {
        Conditioning {
            prompt_embeds: pos.prompt_embeds.zeros_like()?,
            text_embeds: pos
                .text_embeds
                .as_ref()
                .map(Tensor::zeros_like)
                .transpose()?,
            time_ids: Some(time_ids),
        }
    } else {
        let (e, pl) = encode_both(p, &negatives(args)?)?;
        Conditioning {
            prompt_embeds: e,
            text_embeds: Some(pl),
            time_ids: Some(time_ids),
        }
    };
    Ok((pos, Some(neg)))
}
