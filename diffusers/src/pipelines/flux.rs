//! `FluxPipeline`: mirrors diffusers' `pipelines/flux/pipeline_flux.py`.
//!
//! CLIP's pooled output and T5's hidden states condition the transformer; the latents are
//! packed 2x2 into tokens (`[B, (h/2)(w/2), 4C]`) with `(0, row, column)` position ids, the
//! text tokens at position 0. The flow-matching schedule runs sigmas `linspace(1, 1/n, n)`
//! shifted by `mu` from the image's token count. Guidance-distilled checkpoints embed
//! `guidance_scale`; `true_cfg_scale` with a negative prompt runs a second, negative call
//! and mixes the two (`neg + s * (pos - neg)`).

use std::time::Instant;

use zoo_runtime::{DType, Device, Tensor};

use super::latents::{
    check_images_fit, check_latent_channels, decode_latents, load_vae, repeat_rows,
};
use super::text_encoders::{TextEncoder, T5};
use super::text_to_image::{calculate_shift, check_common, check_size, negatives, TextToImage};
use super::{pipeline_dtype, step_bar, Generated, LoadOptions, Noise, PipelineFiles};
use crate::models::autoencoder_kl::{AutoencoderKL, AutoencoderKLConfig};
use crate::models::transformer_flux::{
    FluxTransformer2DConfig, FluxTransformer2DModel, FluxTransformerInput,
};
use crate::schedulers::TimestepOptions;
use crate::{Error, Result, SchedulerConfig};

/// T5's prompt length when the call does not set one, and the most FluxPipeline takes.
const MAX_SEQUENCE_LENGTH: usize = 512;

/// FluxPipeline's `default_sample_size`, in latent pixels.
const DEFAULT_SAMPLE_SIZE: usize = 128;

/// `FluxPipeline`.
#[derive(Debug)]
pub struct FluxPipeline {
    text_encoder: TextEncoder,
    text_encoder_2: TextEncoder,
    /// The denoiser.
    pub transformer: FluxTransformer2DModel,
    /// The autoencoder.
    pub vae: AutoencoderKL,
    scheduler_config: SchedulerConfig,
    dtype: DType,
    device: Device,
}

/// Prompt embeddings as `encode_prompt` returns them (the text ids are zeros).
#[derive(Clone, Debug)]
pub struct FluxEmbeddings {
    /// T5's hidden states `[B, S, joint_attention_dim]`.
    pub prompt_embeds: Tensor,
    /// CLIP's pooled output `[B, pooled_projection_dim]`.
    pub pooled_prompt_embeds: Tensor,
}

impl FluxPipeline {
    /// Loads a Flux pipeline folder or repo.
    pub fn from_pretrained(repo_or_path: &str, opts: &LoadOptions) -> Result<FluxPipeline> {
        let files = PipelineFiles::open(repo_or_path, opts.variant.as_deref())?;
        FluxPipeline::load(files, opts)
    }

    pub(crate) fn load(files: PipelineFiles, opts: &LoadOptions) -> Result<FluxPipeline> {
        let dtype = pipeline_dtype(opts)?;
        let cfg = FluxTransformer2DConfig::from_file(&files.file("transformer", "config.json")?)?;
        let vae_cfg = AutoencoderKLConfig::from_file(&files.file("vae", "config.json")?)?;
        if !cfg.in_channels.is_multiple_of(4) {
            return Err(Error::Config {
                path: cfg.path.clone(),
                reason: format!(
                    "`in_channels` = {} is not divisible by 4: FluxPipeline packs 2x2 latent pixels into each token",
                    cfg.in_channels
                ),
            });
        }
        check_latent_channels(&vae_cfg, cfg.in_channels / 4, "in_channels / 4")?;
        let scheduler_config = files.scheduler(opts.scheduler.as_deref())?;
        scheduler_config.build()?;
        if !files.index.components.contains_key("text_encoder_2") {
            return Err(Error::Config {
                path: files.index.path.clone(),
                reason: "FluxPipeline needs its T5 encoder (`text_encoder_2`), which model_index.json does not list".into(),
            });
        }
        let transformer_files = files.component("transformer", &["FluxTransformer2DModel"])?;
        let vae_files = files.component("vae", &["AutoencoderKL"])?;
        let text_encoder = TextEncoder::load(&files, "tokenizer", "text_encoder", dtype, opts)?;
        let text_encoder_2 = TextEncoder::load_kind(
            &files,
            "tokenizer_2",
            "text_encoder_2",
            T5,
            dtype,
            opts.text_encoder("text_encoder_2", true),
            opts,
        )?;
        let (w, first) = super::transformer_weights(&transformer_files, dtype, opts)?;
        let transformer = FluxTransformer2DModel::load(&w, &cfg)?;
        let vae = load_vae(&vae_files, &vae_cfg, dtype, opts)?;
        Ok(FluxPipeline {
            text_encoder,
            text_encoder_2,
            transformer,
            vae,
            scheduler_config,
            dtype,
            device: first,
        })
    }

    super::scheduler_methods!();

    /// The default image size (FluxPipeline's 128 latent pixels times the VAE's factor).
    pub fn default_size(&self) -> (usize, usize) {
        let s = DEFAULT_SAMPLE_SIZE * self.vae.config().scale_factor();
        (s, s)
    }

    fn size(&self, args: &TextToImage) -> (usize, usize) {
        let (dh, dw) = self.default_size();
        (args.height.unwrap_or(dh), args.width.unwrap_or(dw))
    }

    /// The embeddings of `texts` (one row each).
    pub fn encode(&self, texts: &[String], t5_len: usize) -> Result<FluxEmbeddings> {
        let device = self.transformer.device();
        let clip = self.text_encoder.encode(texts, false)?;
        let pooled = clip.pooler_output.ok_or_else(|| {
            Error::Unsupported(
                "text_encoder gave no pooled output: Flux needs a CLIPTextModel".into(),
            )
        })?;
        let t5 = self.text_encoder_2.encode_len(texts, t5_len, false)?;
        Ok(FluxEmbeddings {
            prompt_embeds: t5
                .last_hidden_state
                .to_device(&device)?
                .to_dtype(self.dtype)?,
            pooled_prompt_embeds: pooled.to_device(&device)?.to_dtype(self.dtype)?,
        })
    }

    /// Whether a call runs true classifier-free guidance (a negative prompt and a scale
    /// above 1).
    pub fn true_cfg(args: &TextToImage) -> bool {
        args.true_cfg_scale > 1.0 && args.negative_prompt.is_some()
    }

    /// `(positive, negative)` embeddings of a call; the negative under true CFG only.
    pub fn encode_prompt(
        &self,
        args: &TextToImage,
    ) -> Result<(FluxEmbeddings, Option<FluxEmbeddings>)> {
        let len = args.max_sequence_length.unwrap_or(MAX_SEQUENCE_LENGTH);
        let pos = self.encode(&args.prompt, len)?;
        let neg = if FluxPipeline::true_cfg(args) {
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
                "image-to-image with FluxPipeline is not built yet".into(),
            ));
        }
        if let Some(n) = args
            .max_sequence_length
            .filter(|&n| n > MAX_SEQUENCE_LENGTH)
        {
            return Err(Error::Input(format!(
                "`max_sequence_length` {n} is above FluxPipeline's {MAX_SEQUENCE_LENGTH}"
            )));
        }
        let (h, w) = self.size(args);
        check_size(h, w, self.vae.config().scale_factor() * 2)?;
        check_images_fit(&self.vae, args, h, w)
    }

    /// The packed latent grid `(rows, columns)` of an image of `h x w` pixels.
    fn grid(&self, h: usize, w: usize) -> (usize, usize) {
        let f = self.vae.config().scale_factor();
        (h / (f * 2), w / (f * 2))
    }

    /// Generates images for `args`, drawing noise from `noise`.
    pub fn generate(&self, args: &TextToImage, noise: &mut Noise) -> Result<Generated> {
        self.check_inputs(args)?;
        let (h, w) = self.size(args);
        let (gh, gw) = self.grid(h, w);
        let c = self.transformer.config();
        let channels = c.in_channels / 4;
        let batch = args.prompt.len() * args.num_images_per_prompt;
        let packed = [batch, gh * gw, c.in_channels];
        let latents = match &args.latents {
            Some(l) if l.shape() == packed => l.to_device(&self.device)?.to_dtype(DType::F32)?,
            Some(l) if l.shape() == [batch, channels, 2 * gh, 2 * gw] => {
                pack(&l.to_device(&self.device)?.to_dtype(DType::F32)?)?
            }
            Some(l) => {
                return Err(Error::Shape(format!(
                    "the latents are {:?}; a {w}x{h} image with {batch} images needs them packed {packed:?} (or unpacked [{batch}, {channels}, {}, {}])",
                    l.shape(),
                    2 * gh,
                    2 * gw
                )))
            }
            None => pack(&noise.randn(&[batch, channels, 2 * gh, 2 * gw], &self.device)?)?,
        };

        let n = args.num_inference_steps;
        let mut scheduler = self.scheduler_config.build()?;
        let uses_flow_sigmas = self
            .scheduler_config
            .fields
            .get("use_flow_sigmas")
            .and_then(|v| v.as_bool())
            == Some(true);
        let sigmas = (!uses_flow_sigmas)
            .then(|| crate::schedulers::schedule::linspace_f64(1.0, 1.0 / n as f64, n));
        let options = TimestepOptions {
            sigmas,
            mu: Some(calculate_shift(&self.scheduler_config, gh * gw, 1.15)),
            timesteps: None,
        };
        scheduler.set_timesteps_with(n, &options)?;

        let t0 = Instant::now();
        let (pos, neg) = self.encode_prompt(args)?;
        let rep = |e: FluxEmbeddings| -> Result<FluxEmbeddings> {
            Ok(FluxEmbeddings {
                prompt_embeds: repeat_rows(&e.prompt_embeds, args.num_images_per_prompt)?,
                pooled_prompt_embeds: repeat_rows(
                    &e.pooled_prompt_embeds,
                    args.num_images_per_prompt,
                )?,
            })
        };
        let pos = rep(pos)?;
        let neg = neg.map(rep).transpose()?;
        let encode_seconds = t0.elapsed().as_secs_f64();

        let t1 = Instant::now();
        let latents = self.denoise(
            &mut *scheduler,
            latents,
            (gh, gw),
            &pos,
            neg.as_ref(),
            args,
            noise,
        )?;
        let denoise_seconds = t1.elapsed().as_secs_f64();
        let t2 = Instant::now();
        let images = decode_latents(&self.vae, &unpack(&latents, gh, gw)?)?;
        Ok(Generated {
            images,
            steps: scheduler.timesteps().len(),
            denoise_seconds,
            encode_seconds,
            decode_seconds: t2.elapsed().as_secs_f64(),
        })
    }

    /// Position ids `[rows * cols, 3]` of the packed latents: `(0, row, column)`.
    pub fn latent_image_ids(rows: usize, cols: usize) -> Vec<f32> {
        (0..rows)
            .flat_map(|r| (0..cols).flat_map(move |c| [0.0, r as f32, c as f32]))
            .collect()
    }

    #[allow(clippy::too_many_arguments)]
    fn denoise(
        &self,
        scheduler: &mut dyn crate::Scheduler,
        mut latents: Tensor,
        (gh, gw): (usize, usize),
        pos: &FluxEmbeddings,
        neg: Option<&FluxEmbeddings>,
        args: &TextToImage,
        noise: &mut Noise,
    ) -> Result<Tensor> {
        let d = &self.device;
        let img_ids = Tensor::from_vec(FluxPipeline::latent_image_ids(gh, gw), &[gh * gw, 3], d)?;
        let txt_ids = |e: &FluxEmbeddings| -> Result<Tensor> {
            Ok(Tensor::zeros(
                &[e.prompt_embeds.shape()[1], 3],
                DType::F32,
                d,
            )?)
        };
        let (pos_ids, neg_ids) = (txt_ids(pos)?, neg.map(txt_ids).transpose()?);
        let guidance = self
            .transformer
            .config()
            .guidance_embeds
            .then(|| Tensor::from_f64s(&[args.guidance_scale], &[1], DType::F32, d))
            .transpose()?;
        let cfg = Tensor::from_f64s(&[args.true_cfg_scale], &[1], DType::F32, d)?;
        let timesteps = scheduler.timesteps().to_vec();
        let bar = step_bar(timesteps.len(), args.progress);
        for (i, &t) in timesteps.iter().enumerate() {
            // The pipeline passes `t / 1000` in float32; the model scales it back.
            let ts = Tensor::from_vec(vec![t as f32 / 1000.0], &[1], d)?;
            let predict = |e: &FluxEmbeddings, ids: &Tensor| -> Result<Tensor> {
                let p = self.transformer.forward(FluxTransformerInput {
                    hidden_states: &latents,
                    encoder_hidden_states: &e.prompt_embeds,
                    pooled_projections: &e.pooled_prompt_embeds,
                    timestep: &ts,
                    img_ids: &img_ids,
                    txt_ids: ids,
                    guidance: guidance.as_ref(),
                })?;
                Ok(p.to_dtype(DType::F32)?.to_device(d)?)
            };
            let mut pred = predict(pos, &pos_ids)?;
            if let (Some(n), Some(ids)) = (neg, &neg_ids) {
                let np = predict(n, ids)?;
                pred = np.add(&pred.sub(&np)?.mul(&cfg)?)?;
            }
            latents = super::scheduler_step(scheduler, &pred, i, &latents, noise)?;
            bar.inc(1);
        }
        bar.finish_and_clear();
        Ok(latents)
    }
}

/// `_pack_latents`: `[B, C, 2h, 2w]` → `[B, h * w, 4C]`, each token a 2x2 patch.
pub fn pack(latents: &Tensor) -> Result<Tensor> {
    let [b, c, h, w] = latents.shape()[..] else {
        return Err(Error::Shape(format!(
            "latents to pack must be [B, C, H, W], got {:?}",
            latents.shape()
        )));
    };
    Ok(latents
        .reshape_to(&[b, c, h / 2, 2, w / 2, 2])?
        .permute(&[0, 2, 4, 1, 3, 5])?
        .reshape_to(&[b, (h / 2) * (w / 2), c * 4])?)
}

/// `_unpack_latents`: `[B, rows * cols, 4C]` → `[B, C, 2 rows, 2 cols]`.
pub fn unpack(latents: &Tensor, rows: usize, cols: usize) -> Result<Tensor> {
    let [b, _, ch] = latents.shape()[..] else {
        return Err(Error::Shape(format!(
            "packed latents must be [B, tokens, channels], got {:?}",
            latents.shape()
        )));
    };
    Ok(latents
        .reshape_to(&[b, rows, cols, ch / 4, 2, 2])?
        .permute(&[0, 3, 1, 4, 2, 5])?
        .reshape_to(&[b, ch / 4, rows * 2, cols * 2])?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packing_round_trips_and_ids_follow_rows() {
        let v: Vec<f32> = (0..2 * 3 * 4 * 6).map(|i| i as f32).collect();
        let x = Tensor::from_vec(v.clone(), &[2, 3, 4, 6], &Device::Cpu).unwrap();
        let p = pack(&x).unwrap();
        assert_eq!(p.shape(), [2, 6, 12]);
        // Token 0 of image 0 is the top-left 2x2 patch of each channel, channel-major.
        let first: Vec<f32> = p.narrow(1, 0, 1).unwrap().to_vec().unwrap();
        assert_eq!(
            &first[..12],
            &[0., 1., 6., 7., 24., 25., 30., 31., 48., 49., 54., 55.]
        );
        let back: Vec<f32> = unpack(&p, 2, 3).unwrap().to_vec().unwrap();
        assert_eq!(back, v);
        assert_eq!(
            FluxPipeline::latent_image_ids(2, 2),
            vec![0., 0., 0., 0., 0., 1., 0., 1., 0., 0., 1., 1.]
        );
    }
}
