//! `StableDiffusion3Pipeline`: mirrors diffusers'
//! `pipelines/stable_diffusion_3/pipeline_stable_diffusion_3.py`.
//!
//! Two CLIP encoders read the prompt: their penultimate hidden states are concatenated along
//! the features and zero-padded to T5's width, then T5's tokens (zeros when the pipeline has
//! no `text_encoder_3`) follow along the sequence; their projected `text_embeds`
//! concatenated are the pooled embedding. The MMDiT predicts a velocity, guided as a batch
//! of (negative, positive), optionally with skip-layer guidance, and the flow-matching
//! scheduler steps it. The VAE decodes `latents / scaling_factor + shift_factor`.

use std::time::Instant;

use zoo_runtime::{DType, Device, Tensor};

use super::latents::{
    check_images_fit, check_latent_channels, decode_latents, initial_latents, load_vae, repeat_rows,
};
use super::text_encoders::{TextEncoder, T5};
use super::text_to_image::{check_common, check_size, dynamic_mu, guide, negatives, TextToImage};
use super::{pipeline_dtype, step_bar, Generated, LoadOptions, Noise, PipelineFiles};
use crate::models::autoencoder_kl::{AutoencoderKL, AutoencoderKLConfig};
use crate::models::transformer_sd3::{
    SD3Transformer2DConfig, SD3Transformer2DModel, SD3TransformerInput,
};
use crate::schedulers::TimestepOptions;
use crate::{Error, Result, SchedulerConfig};

/// `StableDiffusion3Pipeline`.
#[derive(Debug)]
pub struct StableDiffusion3Pipeline {
    text_encoder: TextEncoder,
    text_encoder_2: TextEncoder,
    /// T5, absent when the pipeline was saved without it (its tokens are then zeros).
    text_encoder_3: Option<TextEncoder>,
    /// The denoiser.
    pub transformer: SD3Transformer2DModel,
    /// The autoencoder.
    pub vae: AutoencoderKL,
    scheduler_config: SchedulerConfig,
    dtype: DType,
    device: Device,
}

/// Prompt embeddings as `encode_prompt` returns them.
#[derive(Clone, Debug)]
pub struct SD3Embeddings {
    /// `[B, 77 + T5 length, joint_attention_dim]`.
    pub prompt_embeds: Tensor,
    /// `[B, pooled_projection_dim]`.
    pub pooled_prompt_embeds: Tensor,
}

/// T5's prompt length when the call does not set one.
const MAX_SEQUENCE_LENGTH: usize = 256;

impl StableDiffusion3Pipeline {
    /// Loads an SD3 / SD3.5 pipeline folder or repo.
    pub fn from_pretrained(
        repo_or_path: &str,
        opts: &LoadOptions,
    ) -> Result<StableDiffusion3Pipeline> {
        let files = PipelineFiles::open(repo_or_path, opts.variant.as_deref())?;
        StableDiffusion3Pipeline::load(files, opts)
    }

    pub(crate) fn load(
        files: PipelineFiles,
        opts: &LoadOptions,
    ) -> Result<StableDiffusion3Pipeline> {
        let dtype = pipeline_dtype(opts)?;
        // Configs first: a bad config fails before any weight is read.
        let cfg = SD3Transformer2DConfig::from_file(&files.file("transformer", "config.json")?)?;
        let vae_cfg = AutoencoderKLConfig::from_file(&files.file("vae", "config.json")?)?;
        check_latent_channels(&vae_cfg, cfg.in_channels, "in_channels")?;
        let scheduler_config = files.scheduler(opts.scheduler.as_deref())?;
        scheduler_config.build()?;
        let transformer_files = files.component("transformer", &["SD3Transformer2DModel"])?;
        let vae_files = files.component("vae", &["AutoencoderKL"])?;
        let text_encoder = TextEncoder::load(&files, "tokenizer", "text_encoder", dtype, opts)?;
        let text_encoder_2 =
            TextEncoder::load(&files, "tokenizer_2", "text_encoder_2", dtype, opts)?;
        let text_encoder_3 = if files.index.components.contains_key("text_encoder_3") {
            Some(TextEncoder::load_kind(
                &files,
                "tokenizer_3",
                "text_encoder_3",
                T5,
                dtype,
                opts.text_encoder("text_encoder_3", true),
                opts,
            )?)
        } else {
            None
        };
        let (w, first) = super::transformer_weights(&transformer_files, dtype, opts)?;
        let transformer = SD3Transformer2DModel::load(&w, &cfg)?;
        let vae = load_vae(&vae_files, &vae_cfg, dtype, opts)?;
        Ok(StableDiffusion3Pipeline {
            text_encoder,
            text_encoder_2,
            text_encoder_3,
            transformer,
            vae,
            scheduler_config,
            dtype,
            device: first,
        })
    }

    super::scheduler_methods!();

    /// Whether the pipeline has its T5 encoder.
    pub fn has_t5(&self) -> bool {
        self.text_encoder_3.is_some()
    }

    /// Drops T5 (its tokens become zeros), as passing `text_encoder_3=None` does.
    pub fn drop_t5(&mut self) {
        self.text_encoder_3 = None;
    }

    /// The default image size: the transformer's `sample_size` times the VAE's factor.
    pub fn default_size(&self) -> (usize, usize) {
        let s = self.transformer.config().sample_size * self.vae.config().scale_factor();
        (s, s)
    }

    fn size(&self, args: &TextToImage) -> (usize, usize) {
        let (dh, dw) = self.default_size();
        (args.height.unwrap_or(dh), args.width.unwrap_or(dw))
    }

    /// The embeddings of `texts` (one row each).
    pub fn encode(&self, texts: &[String], t5_len: usize) -> Result<SD3Embeddings> {
        let device = self.transformer.device();
        let joint = self.transformer.config().joint_attention_dim;
        let mut hidden = Vec::with_capacity(2);
        let mut pooled = Vec::with_capacity(2);
        for (name, enc) in [
            ("text_encoder", &self.text_encoder),
            ("text_encoder_2", &self.text_encoder_2),
        ] {
            let out = enc.encode(texts, true)?;
            let n = out.hidden_states.len();
            let embeds = out.embeds.ok_or_else(|| {
                Error::Unsupported(format!(
                    "{name} has no projection: SD3 needs CLIPTextModelWithProjection encoders"
                ))
            })?;
            if n < 2 {
                return Err(Error::Unsupported(format!(
                    "{name} returned no per-layer hidden states"
                )));
            }
            hidden.push(out.hidden_states[n - 2].to_device(&device)?);
            pooled.push(embeds.to_device(&device)?);
        }
        // Zero-padded to `joint_attention_dim`, or cropped to it when the encoders are wider
        // together: diffusers pads with `F.pad`, which crops for a negative width.
        let clip = Tensor::cat(&[&hidden[0], &hidden[1]], -1)?;
        let width = clip.shape()[2];
        let clip = match width <= joint {
            true => clip.pad(2, 0, joint - width, 0.0)?,
            false => clip.narrow(2, 0, joint)?,
        };
        let clip = clip.to_dtype(self.dtype)?;
        let t5 = match &self.text_encoder_3 {
            Some(enc) => enc
                .encode_len(texts, t5_len, false)?
                .last_hidden_state
                .to_device(&device)?
                .to_dtype(self.dtype)?,
            None => Tensor::zeros(&[texts.len(), t5_len, joint], self.dtype, &device)?,
        };
        if t5.shape()[2] != joint {
            return Err(Error::Config {
                path: self.transformer.config().path.clone(),
                reason: format!(
                    "T5's hidden size {} differs from `joint_attention_dim` = {joint}",
                    t5.shape()[2]
                ),
            });
        }
        Ok(SD3Embeddings {
            prompt_embeds: Tensor::cat(&[&clip, &t5], 1)?,
            pooled_prompt_embeds: Tensor::cat(&[&pooled[0], &pooled[1]], -1)?
                .to_dtype(self.dtype)?,
        })
    }

    /// `(positive, negative)` embeddings of a call, one row per prompt; the negative under
    /// guidance only.
    pub fn encode_prompt(
        &self,
        args: &TextToImage,
    ) -> Result<(SD3Embeddings, Option<SD3Embeddings>)> {
        let len = args.max_sequence_length.unwrap_or(MAX_SEQUENCE_LENGTH);
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
            return Err(Error::Unsupported(
                "image-to-image with StableDiffusion3Pipeline is not built yet".into(),
            ));
        }
        let c = self.transformer.config();
        if let Some(&bad) = args
            .skip_guidance_layers
            .iter()
            .find(|&&i| i >= c.num_layers)
        {
            return Err(Error::Input(format!(
                "skip_guidance_layers names block {bad}, but the transformer has {}",
                c.num_layers
            )));
        }
        let (h, w) = self.size(args);
        check_size(h, w, self.vae.config().scale_factor() * c.patch_size)?;
        check_images_fit(&self.vae, args, h, w)?;
        Ok(())
    }

    /// Generates images for `args`, drawing noise from `noise`.
    pub fn generate(&self, args: &TextToImage, noise: &mut Noise) -> Result<Generated> {
        self.check_inputs(args)?;
        let (h, w) = self.size(args);
        let f = self.vae.config().scale_factor();
        let c = self.transformer.config();
        let batch = args.prompt.len() * args.num_images_per_prompt;
        let shape = [batch, c.in_channels, h / f, w / f];
        let latents = initial_latents(args, &shape, &self.device, noise)?;

        let mut scheduler = self.scheduler_config.build()?;
        let seq = (h / f / c.patch_size) * (w / f / c.patch_size);
        let options = TimestepOptions {
            sigmas: None,
            mu: dynamic_mu(&self.scheduler_config, seq),
            timesteps: None,
        };
        scheduler.set_timesteps_with(args.num_inference_steps, &options)?;

        let t0 = Instant::now();
        let (pos, neg) = self.encode_prompt(args)?;
        let rep = |t: &Tensor| -> Result<Tensor> { repeat_rows(t, args.num_images_per_prompt) };
        let pos = SD3Embeddings {
            prompt_embeds: rep(&pos.prompt_embeds)?,
            pooled_prompt_embeds: rep(&pos.pooled_prompt_embeds)?,
        };
        let neg = neg
            .map(|n| -> Result<SD3Embeddings> {
                Ok(SD3Embeddings {
                    prompt_embeds: rep(&n.prompt_embeds)?,
                    pooled_prompt_embeds: rep(&n.pooled_prompt_embeds)?,
                })
            })
            .transpose()?;
        let encode_seconds = t0.elapsed().as_secs_f64();

        let t1 = Instant::now();
        let latents = self.denoise(&mut *scheduler, latents, &pos, neg.as_ref(), args, noise)?;
        let denoise_seconds = t1.elapsed().as_secs_f64();
        let t2 = Instant::now();
        let images = decode_latents(&self.vae, &latents)?;
        Ok(Generated {
            images,
            steps: scheduler.timesteps().len(),
            denoise_seconds,
            encode_seconds,
            decode_seconds: t2.elapsed().as_secs_f64(),
        })
    }

    /// The denoising loop from `latents`.
    fn denoise(
        &self,
        scheduler: &mut dyn crate::Scheduler,
        mut latents: Tensor,
        pos: &SD3Embeddings,
        neg: Option<&SD3Embeddings>,
        args: &TextToImage,
        noise: &mut Noise,
    ) -> Result<Tensor> {
        let (ctx, pooled) = match neg {
            Some(n) => (
                Tensor::cat(&[&n.prompt_embeds, &pos.prompt_embeds], 0)?,
                Tensor::cat(&[&n.pooled_prompt_embeds, &pos.pooled_prompt_embeds], 0)?,
            ),
            None => (pos.prompt_embeds.clone(), pos.pooled_prompt_embeds.clone()),
        };
        let timesteps = scheduler.timesteps().to_vec();
        let steps = args.num_inference_steps as f64;
        let bar = step_bar(timesteps.len(), args.progress);
        let scale = Tensor::from_f64s(&[args.guidance_scale], &[1], DType::F32, &self.device)?;
        let slg = Tensor::from_f64s(
            &[args.skip_layer_guidance_scale],
            &[1],
            DType::F32,
            &self.device,
        )?;
        for (i, &t) in timesteps.iter().enumerate() {
            let input = if neg.is_some() {
                Tensor::cat(&[&latents, &latents], 0)?
            } else {
                latents.clone()
            };
            let ts = Tensor::from_f64s(&[t], &[1], DType::F32, &self.device)?;
            let pred = self.predict(&input, &ctx, &pooled, &ts, &[])?;
            let pred = if neg.is_some() {
                let (mut p, text) = guide(&pred, &scale)?;
                // diffusers' window: strictly inside (start, stop) of the step count.
                let i = i as f64;
                let skip = !args.skip_guidance_layers.is_empty()
                    && i > steps * args.skip_layer_guidance_start
                    && i < steps * args.skip_layer_guidance_stop;
                if skip {
                    let skipped = self.predict(
                        &latents,
                        &pos.prompt_embeds,
                        &pos.pooled_prompt_embeds,
                        &ts,
                        &args.skip_guidance_layers,
                    )?;
                    p = p.add(&text.sub(&skipped)?.mul(&slg)?)?;
                }
                p
            } else {
                pred
            };
            latents = super::scheduler_step(scheduler, &pred, i, &latents, noise)?;
            bar.inc(1);
        }
        bar.finish_and_clear();
        Ok(latents)
    }

    fn predict(
        &self,
        latents: &Tensor,
        ctx: &Tensor,
        pooled: &Tensor,
        timestep: &Tensor,
        skip_layers: &[usize],
    ) -> Result<Tensor> {
        let pred = self.transformer.forward(SD3TransformerInput {
            hidden_states: latents,
            encoder_hidden_states: ctx,
            pooled_projections: pooled,
            timestep,
            skip_layers,
        })?;
        Ok(pred.to_dtype(DType::F32)?.to_device(&self.device)?)
    }
}
