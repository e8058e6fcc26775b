//! `PixArtAlphaPipeline` and `PixArtSigmaPipeline`: mirror diffusers'
//! `pipelines/pixart_alpha/pipeline_pixart_alpha.py` and `pipeline_pixart_sigma.py`.
//!
//! The prompt, lower-cased and stripped, is T5-encoded with its padding masked (in T5 and in
//! the transformer's cross-attention); under guidance the negative prompt (empty by default)
//! runs first in one batch of two. With resolution binning (the default) the requested size
//! is replaced by the closest aspect ratio of the table for the transformer's `sample_size`,
//! and the decoded image is resized (bilinear) and centre-cropped back to the request.
//! PixArt-α models at `sample_size` 128 are also conditioned on the generated resolution and
//! aspect ratio. The two classes differ only in the default prompt length (120 vs 300 T5
//! tokens) and in which sizes bin.
//!
//! diffusers' `clean_caption` (an HTML / URL / punctuation scrub that runs only where `bs4`
//! and `ftfy` are installed) is not replicated: prompts are lower-cased and stripped, as
//! diffusers does without those packages or with `clean_caption=False`.

use std::sync::OnceLock;
use std::time::Instant;

use serde_json::Value;
use zoo_runtime::{DType, Device, Tensor};

use super::latents::{
    check_images_fit, check_latent_channels, initial_latents, load_vae, model_input, postprocess,
    repeat_rows,
};
use super::text_encoders::{TextEncoder, T5};
use super::text_to_image::{check_common, check_size, guide, negatives, TextToImage};
use super::{pipeline_dtype, step_bar, Generated, LoadOptions, Noise, PipelineFiles};
use crate::models::autoencoder_kl::{AutoencoderKL, AutoencoderKLConfig};
use crate::models::transformer_pixart::{
    PixArtTransformer2DConfig, PixArtTransformer2DModel, PixArtTransformerInput,
};
use crate::{Error, Result, SchedulerConfig};

/// PixArt-α or PixArt-Σ.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PixArtVersion {
    /// `PixArtAlphaPipeline`.
    Alpha,
    /// `PixArtSigmaPipeline`.
    Sigma,
}

/// `PixArtAlphaPipeline` / `PixArtSigmaPipeline`.
#[derive(Debug)]
pub struct PixArtPipeline {
    text_encoder: TextEncoder,
    /// The denoiser.
    pub transformer: PixArtTransformer2DModel,
    /// The autoencoder.
    pub vae: AutoencoderKL,
    scheduler_config: SchedulerConfig,
    version: PixArtVersion,
    device: Device,
}

/// T5 embeddings of prompts and their padding masks, as `encode_prompt` returns them.
#[derive(Clone, Debug)]
pub struct PixArtEmbeddings {
    /// `[B, S, d_model]`.
    pub prompt_embeds: Tensor,
    /// `[B, S]`: 1 for a token, 0 for padding.
    pub prompt_attention_mask: Tensor,
}

/// diffusers' resolution-binning tables (`ASPECT_RATIO_*_BIN`), keyed by `sample_size`:
/// aspect ratio (height / width) → `[height, width]`.
const BINS_JSON: &str = include_str!("aspect_ratio_bins.json");

type Bins = Vec<(usize, Vec<(f64, [usize; 2])>)>;

fn bins() -> &'static Bins {
    static BINS: OnceLock<Bins> = OnceLock::new();
    BINS.get_or_init(|| {
        let v: Value = serde_json::from_str(BINS_JSON).unwrap_or(Value::Null);
        let mut out = Vec::new();
        for (k, table) in v.as_object().into_iter().flatten() {
            let (Ok(size), Some(table)) = (k.parse::<usize>(), table.as_object()) else {
                continue;
            };
            let mut rows: Vec<(f64, [usize; 2])> = table
                .iter()
                .filter_map(|(r, hw)| {
                    let hw = hw.as_array()?;
                    Some((
                        r.parse().ok()?,
                        [
                            hw.first()?.as_u64()? as usize,
                            hw.get(1)?.as_u64()? as usize,
                        ],
                    ))
                })
                .collect();
            rows.sort_by(|a, b| a.0.total_cmp(&b.0));
            out.push((size, rows));
        }
        out
    })
}

/// The binned `(height, width)` for a request of `height x width` on a transformer of
/// `sample_size` (diffusers' `classify_height_width_bin`: the table's closest aspect ratio),
/// or `None` when the version bins no such sample size.
pub fn binned_size(
    version: PixArtVersion,
    sample_size: usize,
    height: usize,
    width: usize,
) -> Option<(usize, usize)> {
    if version == PixArtVersion::Alpha && sample_size == 256 {
        return None;
    }
    let (_, table) = bins().iter().find(|(s, _)| *s == sample_size)?;
    let ar = height as f64 / width as f64;
    let mut best: Option<&(f64, [usize; 2])> = None;
    for row in table {
        if best.is_none_or(|b| (row.0 - ar).abs() < (b.0 - ar).abs()) {
            best = Some(row);
        }
    }
    best.map(|(_, [h, w])| (*h, *w))
}

impl PixArtPipeline {
    /// Loads a PixArt-α or PixArt-Σ pipeline folder or repo.
    pub fn from_pretrained(repo_or_path: &str, opts: &LoadOptions) -> Result<PixArtPipeline> {
        let files = PipelineFiles::open(repo_or_path, opts.variant.as_deref())?;
        let version = match files.index.class_name.as_str() {
            "PixArtSigmaPipeline" => PixArtVersion::Sigma,
            _ => PixArtVersion::Alpha,
        };
        PixArtPipeline::load(files, version, opts)
    }

    pub(crate) fn load(
        files: PipelineFiles,
        version: PixArtVersion,
        opts: &LoadOptions,
    ) -> Result<PixArtPipeline> {
        let dtype = pipeline_dtype(opts)?;
        let cfg = PixArtTransformer2DConfig::from_file(&files.file("transformer", "config.json")?)?;
        let vae_cfg = AutoencoderKLConfig::from_file(&files.file("vae", "config.json")?)?;
        check_latent_channels(&vae_cfg, cfg.in_channels, "in_channels")?;
        let scheduler_config = files.scheduler(opts.scheduler.as_deref())?;
        scheduler_config.build()?;
        let transformer_files = files.component(
            "transformer",
            &["PixArtTransformer2DModel", "Transformer2DModel"],
        )?;
        let vae_files = files.component("vae", &["AutoencoderKL"])?;
        let text_encoder = TextEncoder::load_kind(
            &files,
            "tokenizer",
            "text_encoder",
            T5,
            dtype,
            opts.text_encoder("text_encoder", true),
            opts,
        )?;
        let (w, first) = super::transformer_weights(&transformer_files, dtype, opts)?;
        let transformer = PixArtTransformer2DModel::load(&w, &cfg)?;
        let vae = load_vae(&vae_files, &vae_cfg, dtype, opts)?;
        Ok(PixArtPipeline {
            text_encoder,
            transformer,
            vae,
            scheduler_config,
            version,
            device: first,
        })
    }

    /// The pipeline class.
    pub fn class_name(&self) -> &'static str {
        match self.version {
            PixArtVersion::Alpha => "PixArtAlphaPipeline",
            PixArtVersion::Sigma => "PixArtSigmaPipeline",
        }
    }

    super::scheduler_methods!();

    /// T5's prompt length when the call sets none (α 120, Σ 300).
    pub fn default_max_sequence_length(&self) -> usize {
        match self.version {
            PixArtVersion::Alpha => 120,
            PixArtVersion::Sigma => 300,
        }
    }

    /// The default image size: the transformer's `sample_size` times the VAE's factor.
    pub fn default_size(&self) -> (usize, usize) {
        let s = self.transformer.config().sample_size * self.vae.config().scale_factor();
        (s, s)
    }

    /// `(requested, generated)` sizes of a call: the generated one binned unless
    /// `resolution_binning` is off.
    fn sizes(&self, args: &TextToImage) -> Result<((usize, usize), (usize, usize))> {
        let (dh, dw) = self.default_size();
        let req = (args.height.unwrap_or(dh), args.width.unwrap_or(dw));
        if !args.resolution_binning {
            return Ok((req, req));
        }
        let s = self.transformer.config().sample_size;
        let binned = binned_size(self.version, s, req.0, req.1).ok_or_else(|| {
            Error::Input(format!(
                "{} bins sizes only for transformers of sample_size {}; this one has {s}: turn resolution binning off",
                self.class_name(),
                if self.version == PixArtVersion::Sigma { "32, 64, 128 or 256" } else { "32, 64 or 128" }
            ))
        })?;
        Ok((req, binned))
    }

    /// The embeddings and masks of `texts` (lower-cased and stripped) at `len` tokens.
    pub fn encode(&self, texts: &[String], len: usize) -> Result<PixArtEmbeddings> {
        let texts: Vec<String> = texts
            .iter()
            .map(|t| t.to_lowercase().trim().to_string())
            .collect();
        let (embeds, mask) = self.text_encoder.encode_masked(&texts, len)?;
        let d = self.transformer.device();
        Ok(PixArtEmbeddings {
            prompt_embeds: embeds.to_device(&d)?.to_dtype(self.transformer.dtype())?,
            prompt_attention_mask: mask.to_device(&d)?,
        })
    }

    /// `(positive, negative)` embeddings of a call, one row per prompt; the negative under
    /// guidance only.
    pub fn encode_prompt(
        &self,
        args: &TextToImage,
    ) -> Result<(PixArtEmbeddings, Option<PixArtEmbeddings>)> {
        let len = args
            .max_sequence_length
            .unwrap_or(self.default_max_sequence_length());
        let pos = self.encode(&args.prompt, len)?;
        let neg = if args.guidance_scale > 1.0 {
            Some(self.encode(&negatives(args)?, len)?)
        } else {
            None
        };
        Ok((pos, neg))
    }

    /// Checks a call's arguments before anything runs.
    pub fn check_inputs(&self, args: &TextToImage) -> Result<()> {
        check_common(args)?;
        if args.init_image.is_some() {
            return Err(Error::Unsupported(format!(
                "image-to-image with {} is not built yet",
                self.class_name()
            )));
        }
        let ((rh, rw), (h, w)) = self.sizes(args)?;
        check_size(rh, rw, 8)?;
        let multiple = self.vae.config().scale_factor() * self.transformer.config().patch_size;
        check_size(h, w, multiple)?;
        check_images_fit(&self.vae, args, h, w)?;
        Ok(())
    }

    /// Generates images for `args`, drawing noise from `noise`.
    pub fn generate(&self, args: &TextToImage, noise: &mut Noise) -> Result<Generated> {
        self.check_inputs(args)?;
        let ((rh, rw), (h, w)) = self.sizes(args)?;
        let f = self.vae.config().scale_factor();
        let c = self.transformer.config();
        let batch = args.prompt.len() * args.num_images_per_prompt;
        let shape = [batch, c.in_channels, h / f, w / f];
        let mut scheduler = self.scheduler_config.build()?;
        scheduler.set_timesteps(args.num_inference_steps)?;
        scheduler.set_eta(args.eta);
        let latents = initial_latents(args, &shape, &self.device, noise)?;
        let sigma = scheduler.init_noise_sigma();
        let mut latents = if sigma == 1.0 {
            latents
        } else {
            latents.mul_scalar(sigma)?
        };

        let t0 = Instant::now();
        let (pos, neg) = self.encode_prompt(args)?;
        let n = args.num_images_per_prompt;
        let (ctx, mask) = match &neg {
            Some(neg) => (
                Tensor::cat(
                    &[
                        &repeat_rows(&neg.prompt_embeds, n)?,
                        &repeat_rows(&pos.prompt_embeds, n)?,
                    ],
                    0,
                )?,
                Tensor::cat(
                    &[
                        &repeat_rows(&neg.prompt_attention_mask, n)?,
                        &repeat_rows(&pos.prompt_attention_mask, n)?,
                    ],
                    0,
                )?,
            ),
            None => (
                repeat_rows(&pos.prompt_embeds, n)?,
                repeat_rows(&pos.prompt_attention_mask, n)?,
            ),
        };
        let encode_seconds = t0.elapsed().as_secs_f64();
        let guided = neg.is_some();
        let rows = if guided { 2 * batch } else { batch };
        let dt = self.transformer.dtype();
        let added = if c.use_additional_conditions() {
            let res: Vec<f64> = (0..rows).flat_map(|_| [h as f64, w as f64]).collect();
            let ar = vec![h as f64 / w as f64; rows];
            Some((
                Tensor::from_f64s(&res, &[rows, 2], dt, &self.device)?,
                Tensor::from_f64s(&ar, &[rows, 1], dt, &self.device)?,
            ))
        } else {
            None
        };

        let t1 = Instant::now();
        let channels = c.in_channels;
        let learned_sigma = c.out_channels() / 2 == channels;
        let scale = Tensor::from_f64s(&[args.guidance_scale], &[1], DType::F32, &self.device)?;
        let timesteps = scheduler.timesteps().to_vec();
        let bar = step_bar(timesteps.len(), args.progress);
        for (i, &t) in timesteps.iter().enumerate() {
            let input = model_input(&latents, guided, &*scheduler, i)?;
            let ts = Tensor::from_f64s(&[t], &[1], DType::F32, &self.device)?;
            let pred = self
                .transformer
                .forward(PixArtTransformerInput {
                    hidden_states: &input,
                    encoder_hidden_states: &ctx,
                    encoder_attention_mask: Some(&mask),
                    timestep: &ts,
                    added_cond: added.as_ref().map(|(r, a)| (r, a)),
                })?
                .to_dtype(DType::F32)?
                .to_device(&self.device)?;
            let pred = if guided {
                guide(&pred, &scale)?.0
            } else {
                pred
            };
            let pred = if learned_sigma {
                pred.narrow(1, 0, channels)?
            } else {
                pred
            };
            latents = super::scheduler_step(&mut *scheduler, &pred, i, &latents, noise)?;
            bar.inc(1);
        }
        bar.finish_and_clear();
        let denoise_seconds = t1.elapsed().as_secs_f64();

        let t2 = Instant::now();
        // PixArt decodes `latents / scaling_factor` (no shift factor).
        let z = latents
            .to_device(&self.vae.device())?
            .to_dtype(self.vae.dtype())?
            .div_scalar(self.vae.config().scaling_factor)?;
        let mut decoded = self.vae.decode(&z)?;
        if (rh, rw) != (h, w) {
            decoded = resize_and_crop(&decoded, rh, rw)?;
        }
        let images = postprocess(&decoded)?;
        Ok(Generated {
            images,
            steps: timesteps.len(),
            denoise_seconds,
            encode_seconds,
            decode_seconds: t2.elapsed().as_secs_f64(),
        })
    }
}

/// diffusers' `resize_and_crop_tensor` on `[N, C, H, W]` images: scaled (bilinear,
/// `align_corners=False`) until both sides cover the target, then centre-cropped to
/// `height x width`.
pub fn resize_and_crop(images: &Tensor, height: usize, width: usize) -> Result<Tensor> {
    let [_, _, ih, iw] = images.shape()[..] else {
        return Err(Error::Shape(format!(
            "images must be [N, C, H, W], got {:?}",
            images.shape()
        )));
    };
    let ratio = (height as f64 / ih as f64).max(width as f64 / iw as f64);
    let (rh, rw) = ((ih as f64 * ratio) as usize, (iw as f64 * ratio) as usize);
    // Truncation can leave a side a pixel short of the target: crop what there is.
    let (height, width) = (height.min(rh), width.min(rw));
    Ok(images
        .upsample_bilinear2d(rh, rw)?
        .narrow(2, (rh - height) / 2, height)?
        .narrow(3, (rw - width) / 2, width)?)
}
