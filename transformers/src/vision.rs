//! Images in, as transformers' pipelines take them: `image-feature-extraction`
//! ([`ImageEmbedder`]), `image-classification` ([`ImageClassifier`]) and
//! `zero-shot-image-classification` ([`ZeroShotImageClassifier`]). Each loads the model with
//! its image processor (`preprocessor_config.json`) and, for zero-shot, its tokenizer.

use std::path::Path;

use zoo_runtime::{DType, Tensor};

use crate::auto::{load_image_encoder, load_image_text, LoadOptions};
use crate::image_processing::{ImageProcessor, RgbImage};
use crate::kinds::{
    EncoderArgs, EncoderHead, ImageArgs, ImageEncoder, ImageTextModel, ZeroShotScores,
};
use crate::registry::Task;
use crate::tokenizer::Tokenizer;
use crate::{Error, Result};

/// A label and its score (a probability for the image classifiers; what the text
/// classifier's function gives for text).
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Scored {
    /// The label.
    pub label: String,
    /// Its score.
    pub score: f32,
}

/// Reads image files, naming the one at fault; each may declare at most
/// [`MAX_IMAGE_PIXELS`](crate::image_processing::MAX_IMAGE_PIXELS) pixels.
pub fn open_images(paths: &[impl AsRef<Path>]) -> Result<Vec<RgbImage>> {
    open_images_limited(paths, Some(crate::image_processing::MAX_IMAGE_PIXELS))
}

/// [`open_images`] with another pixel limit (`None`: none, for trusted files).
pub fn open_images_limited(
    paths: &[impl AsRef<Path>],
    max_pixels: Option<u64>,
) -> Result<Vec<RgbImage>> {
    paths
        .iter()
        .map(|p| {
            RgbImage::open_limited(p.as_ref(), max_pixels).map_err(|e| Error::Image(Box::new(e)))
        })
        .collect()
}

/// Rows of a `[rows, cols]` tensor as f32 vectors.
fn rows(t: &Tensor) -> Result<Vec<Vec<f32>>> {
    let cols = t.dim(-1)?;
    let v = t.to_dtype(DType::F32)?.to_vec::<f32>()?;
    Ok(v.chunks(cols.max(1)).map(<[f32]>::to_vec).collect())
}

/// The best `top_k` labels by softmax probability (computed in f64 from the logits).
fn ranked(logits: &[f32], labels: &[String], top_k: usize) -> Vec<Scored> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let exp: Vec<f64> = logits.iter().map(|&l| f64::from(l - max).exp()).collect();
    let total: f64 = exp.iter().sum();
    let scores: Vec<f64> = exp.iter().map(|e| e / total).collect();
    best(&scores, labels, top_k)
}

/// The best `top_k` labels by each one's sigmoid (SigLIP's independent probabilities).
fn ranked_sigmoid(logits: &[f32], labels: &[String], top_k: usize) -> Vec<Scored> {
    let scores: Vec<f64> = logits
        .iter()
        .map(|&l| 1.0 / (1.0 + (-f64::from(l)).exp()))
        .collect();
    best(&scores, labels, top_k)
}

fn best(scores: &[f64], labels: &[String], top_k: usize) -> Vec<Scored> {
    let mut out: Vec<Scored> = labels
        .iter()
        .zip(scores)
        .map(|(label, &s)| Scored {
            label: label.clone(),
            score: s as f32,
        })
        .collect();
    out.sort_by(|a, b| b.score.total_cmp(&a.score));
    out.truncate(top_k);
    out
}

/// Pixel values for `images` on the model's device, refusing an empty batch.
fn pixels(
    processor: &ImageProcessor,
    images: &[RgbImage],
    model: &dyn ImageEncoder,
) -> Result<Tensor> {
    if images.is_empty() {
        return Err(Error::invalid("images", "no image given".into()));
    }
    processor.pixel_values(images, &model.device())
}

/// One vector per image: the projected embedding (`image_embeds`, CLIP's
/// `get_image_features`) where the model has a projection, else its pooled output (ViT's
/// pooler, CLIP's `post_layernorm` class token), else the final class token.
#[derive(Debug)]
pub struct ImageEmbedder {
    model: Box<dyn ImageEncoder>,
    processor: ImageProcessor,
}

impl ImageEmbedder {
    /// Loads a vision checkpoint (or a CLIPModel's vision tower) and its image processor.
    pub fn load_pretrained(repo_or_path: &str, opts: LoadOptions) -> Result<ImageEmbedder> {
        let (model, pretrained) = load_image_encoder(repo_or_path, &opts, Task::Base)?;
        Ok(ImageEmbedder {
            model,
            processor: ImageProcessor::from_pretrained(&pretrained)?,
        })
    }

    /// What the vectors are: `projection` (a projected embedding) or `pooled` (the pooled
    /// output, or the class token where the model has no pooler).
    pub fn kind(&self) -> &'static str {
        if self.model.projects() {
            "projection"
        } else {
            "pooled"
        }
    }

    /// The model.
    pub fn model(&self) -> &dyn ImageEncoder {
        &*self.model
    }

    /// Embeds `images`.
    pub fn embed(&self, images: &[RgbImage]) -> Result<Vec<Vec<f32>>> {
        let px = pixels(&self.processor, images, &*self.model)?;
        let out = self.model.forward(ImageArgs::new(&px))?;
        match (out.embeds, out.pooler_output) {
            (Some(e), _) | (None, Some(e)) => rows(&e),
            (None, None) => rows(&out.last_hidden_state.narrow(1, 0, 1)?.squeeze(1)?),
        }
    }
}

/// An image classifier (`ViTForImageClassification`) with its processor and labels.
#[derive(Debug)]
pub struct ImageClassifier {
    model: Box<dyn ImageEncoder>,
    processor: ImageProcessor,
    labels: Vec<String>,
}

impl ImageClassifier {
    /// Loads an image-classification checkpoint and its image processor.
    pub fn load_pretrained(repo_or_path: &str, opts: LoadOptions) -> Result<ImageClassifier> {
        let (model, pretrained) =
            load_image_encoder(repo_or_path, &opts, Task::ImageClassification)?;
        let EncoderHead::ImageClassification { labels } = model.head().clone() else {
            return Err(Error::invalid(
                "model",
                format!("{repo_or_path} has no image classifier head"),
            ));
        };
        Ok(ImageClassifier {
            model,
            processor: ImageProcessor::from_pretrained(&pretrained)?,
            labels,
        })
    }

    /// The labels, by index (`id2label`).
    pub fn labels(&self) -> &[String] {
        &self.labels
    }

    /// The `top_k` most probable labels of each image, best first.
    pub fn classify(&self, images: &[RgbImage], top_k: usize) -> Result<Vec<Vec<Scored>>> {
        let px = pixels(&self.processor, images, &*self.model)?;
        let out = self.model.forward(ImageArgs::new(&px))?;
        let logits = out
            .logits
            .ok_or_else(|| Error::Internal("the classifier returned no logits".into()))?;
        Ok(rows(&logits)?
            .iter()
            .map(|l| ranked(l, &self.labels, top_k))
            .collect())
    }
}

/// transformers' zero-shot image pipeline's default prompt.
pub const DEFAULT_HYPOTHESIS_TEMPLATE: &str = "This is a photo of {}.";

/// Zero-shot image classification with a contrastive image-text model (`CLIPModel`,
/// `SiglipModel`): each label is put in a prompt, the prompts are tokenized as transformers'
/// pipeline does (a batch padded to the longest with its attention mask; SigLIP's to 64
/// tokens) and `logits_per_image` ranks them (a softmax over the labels; SigLIP's sigmoid
/// of each).
#[derive(Debug)]
pub struct ZeroShotImageClassifier {
    model: Box<dyn ImageTextModel>,
    processor: ImageProcessor,
    tokenizer: Tokenizer,
    /// The padding id: `tokenizer_config.json`'s pad token, else `tokenizer.json`'s, else
    /// CLIP's end-of-text.
    pad: i64,
}

impl ZeroShotImageClassifier {
    /// Loads a CLIPModel checkpoint with its image processor and tokenizer.
    pub fn load_pretrained(
        repo_or_path: &str,
        opts: LoadOptions,
    ) -> Result<ZeroShotImageClassifier> {
        let (model, pretrained) = load_image_text(repo_or_path, &opts)?;
        let tokenizer = Tokenizer::from_pretrained(&pretrained)?;
        let configured = pretrained
            .tokenizer_config()?
            .and_then(|c| c.pad_token.map(|t| t.content().to_string()))
            .and_then(|t| tokenizer.token_to_id(&t));
        let pad = configured
            .or_else(|| tokenizer.pad_id())
            .or_else(|| tokenizer.token_to_id("<|endoftext|>"))
            .map_or(0, i64::from);
        Ok(ZeroShotImageClassifier {
            model,
            processor: ImageProcessor::from_pretrained(&pretrained)?,
            tokenizer,
            pad,
        })
    }

    /// The model.
    pub fn model(&self) -> &dyn ImageTextModel {
        &*self.model
    }

    /// Every label's probability for each image, best first; each label is written into
    /// `template` at `{}` (`"{}"` uses the labels as they are).
    pub fn classify(
        &self,
        images: &[RgbImage],
        labels: &[&str],
        template: &str,
    ) -> Result<Vec<Vec<Scored>>> {
        if labels.is_empty() {
            return Err(Error::invalid("labels", "no candidate labels given".into()));
        }
        if !template.contains("{}") {
            return Err(Error::invalid(
                "template",
                format!("the hypothesis template {template:?} has no {{}} for the label"),
            ));
        }
        let text = self.model.text();
        let scores = self.model.zero_shot();
        let max = match scores {
            ZeroShotScores::Softmax => text.max_position_embeddings(),
            ZeroShotScores::Sigmoid { max_length } => max_length,
        };
        let ids = labels
            .iter()
            .map(|l| {
                self.tokenizer
                    .encode_truncated(&template.replacen("{}", l, 1), max)
            })
            .collect::<Result<Vec<_>>>()?;
        let longest = ids.iter().map(Vec::len).max().unwrap_or(0);
        let (b, t) = match scores {
            ZeroShotScores::Softmax => (ids.len(), longest),
            ZeroShotScores::Sigmoid { max_length } => (ids.len(), max_length),
        };
        // Right padding, masked.
        let pad = self.pad;
        let mut flat = Vec::with_capacity(b * t);
        let mut mask = Vec::with_capacity(b * t);
        for row in &ids {
            flat.extend(row.iter().map(|&i| i64::from(i)));
            flat.extend(std::iter::repeat_n(pad, t - row.len()));
            mask.extend(std::iter::repeat_n(1i64, row.len()));
            mask.extend(std::iter::repeat_n(0, t - row.len()));
        }
        let device = text.device();
        let input_ids = Tensor::from_vec(flat, &[b, t], &device)?;
        let attention_mask = Tensor::from_vec(mask, &[b, t], &device)?;
        let px = pixels(&self.processor, images, self.model.vision())?;
        let out = self.model.forward(
            EncoderArgs {
                input_ids: &input_ids,
                attention_mask: Some(&attention_mask),
                token_type_ids: None,
                position_ids: None,
                output_hidden_states: false,
            },
            ImageArgs::new(&px),
        )?;
        let labels: Vec<String> = labels.iter().map(|l| l.to_string()).collect();
        Ok(rows(&out.logits_per_image)?
            .iter()
            .map(|l| match scores {
                ZeroShotScores::Softmax => ranked(l, &labels, labels.len()),
                ZeroShotScores::Sigmoid { .. } => ranked_sigmoid(l, &labels, labels.len()),
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranking_is_a_softmax_best_first() {
        let labels: Vec<String> = ["a", "b", "c"].map(String::from).to_vec();
        let r = ranked(&[1.0, 3.0, 2.0], &labels, 2);
        assert_eq!(r.len(), 2);
        assert_eq!(r[0].label, "b");
        assert_eq!(r[1].label, "c");
        let total: f32 = ranked(&[1.0, 3.0, 2.0], &labels, 3)
            .iter()
            .map(|s| s.score)
            .sum();
        assert!((total - 1.0).abs() < 1e-6);
    }
}
