//! Prompts with images, as transformers' vision-language processors and models build them:
//! each image placeholder in the text becomes `tokens_per_image` copies of the image token
//! (`LlavaProcessor`), and the language model's first layer reads the image's features at
//! those positions instead of the token's embedding (`get_placeholder_mask` and
//! `masked_scatter` in `LlavaModel.forward`). Generation feeds such a prompt through the
//! engine's prompt embeddings ([`crate::Engine::add_batch_with_embeds`]).

use zoo_runtime::{DType, Tensor};

use crate::kinds::{CausalLm, VisionLanguage};
use crate::{Error, Result};

/// The model's image side, or an error naming what was asked of a text-only model.
pub fn vision_of(model: &dyn CausalLm) -> Result<&dyn VisionLanguage> {
    model.vision().ok_or_else(|| {
        Error::invalid(
            "images",
            "this model reads text only; images need a vision-language checkpoint \
             (LlavaForConditionalGeneration)"
                .into(),
        )
    })
}

/// `ids` with each image placeholder repeated to fill one image (`tokens_per_image`
/// copies), as the processor expands the image token in the text.
pub fn expand_image_tokens(ids: &[u32], vision: &dyn VisionLanguage) -> Vec<u32> {
    let (token, n) = (vision.image_token_id(), vision.tokens_per_image());
    let mut out = Vec::with_capacity(ids.len());
    for &id in ids {
        if id == token {
            out.extend(std::iter::repeat_n(id, n));
        } else {
            out.push(id);
        }
    }
    out
}

/// The first layer's input for `ids` `[batch, seq]` (host values) and the images
/// `pixel_values [images, channels, height, width]` their image tokens stand for, in order:
/// `[batch, seq, hidden]`. The image tokens must number `images * tokens_per_image`.
pub fn inputs_embeds(model: &dyn CausalLm, ids: &Tensor, pixel_values: &Tensor) -> Result<Tensor> {
    let vision = vision_of(model)?;
    let [batch, seq] = ids.shape()[..] else {
        return Err(Error::invalid(
            "input_ids",
            format!(
                "input_ids of shape {:?}; expected [batch, seq]",
                ids.shape()
            ),
        ));
    };
    let host = ids.to_dtype(DType::I64)?.to_vec::<i64>()?;
    let token = i64::from(vision.image_token_id());
    let placed = host.iter().filter(|&&t| t == token).count();
    let images = pixel_values.shape().first().copied().unwrap_or(0);
    let per_image = vision.tokens_per_image();
    if placed != images * per_image {
        return Err(Error::invalid(
            "images",
            format!(
                "the prompt holds {placed} image tokens (id {token}) but {images} image(s) fill \
                 {}: put one image placeholder in the text per image (each becomes \
                 {per_image} tokens)",
                images * per_image
            ),
        ));
    }
    let base = model.model();
    let embeds = base.embed(&ids.to_device(&base.device())?)?;
    if images == 0 {
        return Ok(embeds);
    }
    let features = vision.image_features(pixel_values)?;
    let hidden = embeds.dim(2)?;
    let features = features
        .reshape_to(&[images * per_image, hidden])?
        .to_device(&embeds.device())?
        .to_dtype(embeds.dtype())?;
    // Each row: runs of text tokens keep their embeddings, runs of image tokens take the
    // next features in order.
    let mut next = 0;
    let mut rows = Vec::with_capacity(batch);
    for (r, row_ids) in host.chunks(seq.max(1)).enumerate() {
        let row = embeds.narrow(0, r, 1)?.squeeze(0)?;
        let mut pieces = Vec::new();
        let mut at = 0;
        while at < seq {
            let image = row_ids[at] == token;
            let len = row_ids[at..]
                .iter()
                .take_while(|&&t| (t == token) == image)
                .count();
            pieces.push(if image {
                let f = features.narrow(0, next, len)?;
                next += len;
                f
            } else {
                row.narrow(0, at, len)?
            });
            at += len;
        }
        let refs: Vec<&Tensor> = pieces.iter().collect();
        rows.push(Tensor::cat(&refs, 0)?.unsqueeze(0)?);
    }
    let refs: Vec<&Tensor> = rows.iter().collect();
    Ok(Tensor::cat(&refs, 0)?)
}

/// One prompt's first-layer input, `[prompt, hidden]` (what
/// [`crate::Engine::add_batch_with_embeds`] takes).
pub fn prompt_embeds(
    model: &dyn CausalLm,
    prompt: &[u32],
    pixel_values: &Tensor,
) -> Result<Tensor> {
    let ids: Vec<i64> = prompt.iter().map(|&t| i64::from(t)).collect();
    let ids = Tensor::from_vec(ids, &[1, prompt.len()], &zoo_runtime::Device::Cpu)?;
    Ok(inputs_embeds(model, &ids, pixel_values)?.squeeze(0)?)
}
