//! `StableDiffusionPipeline` (and the denoising loop `StableDiffusionXLPipeline` shares):
//! mirrors diffusers' `pipelines/stable_diffusion/pipeline_stable_diffusion.py`.
//!
//! Prompts are tokenized to the tokenizer's `model_max_length` and encoded by the CLIP text
//! encoder; with classifier-free guidance (`guidance_scale > 1`) the negative prompt's
//! embeddings run beside them in one batch of two. Each step scales the latents for the
//! scheduler, predicts the noise with the UNet, combines the two halves
//! (`uncond + g * (text - uncond)`, optionally rescaled by `guidance_rescale`) and steps the
//! scheduler. The VAE decodes `latents / scaling_factor` (plus `shift_factor`).

use std::time::Instant;

use zoo_runtime::{DType, Device, Tensor};

use super::latents::{check_images_fit, decode_latents, init_noise_sigma, load_vae, model_input};
use super::text_encoders::TextEncoder;
pub use super::text_to_image::TextToImage;
use super::text_to_image::{check_counts, check_size, guide, negatives};
use super::{pipeline_dtype, step_bar, Generated, LoadOptions, Noise, PipelineFiles};
use crate::models::autoencoder_kl::{AutoencoderKL, AutoencoderKLConfig};
use crate::models::unet_2d_condition::{
    UNet2DConditionConfig, UNet2DConditionInput, UNet2DConditionModel,
};
use crate::{Error, Result, Scheduler, SchedulerConfig};

/// The conditioning of one pipeline call: what the UNet takes besides the latents.
#[derive(Clone, Debug)]
pub struct Conditioning {
    /// `[B, S, D]` (negative rows first under guidance).
    pub prompt_embeds: Tensor,
    /// SDXL: pooled text embeddings `[B, P]`.
    pub text_embeds: Option<Tensor>,
    /// SDXL: `[B, 6]` size and crop conditioning.
    pub time_ids: Option<Tensor>,
}

/// `StableDiffusionPipeline` / `StableDiffusionXLPipeline`.
#[derive(Debug)]
pub struct StableDiffusionPipeline {
    pub(crate) text_encoder: TextEncoder,
    /// SDXL's second tokenizer and encoder (`CLIPTextModelWithProjection`).
    pub(crate) text_encoder_2: Option<TextEncoder>,
    /// The denoiser.
    pub unet: UNet2DConditionModel,
    /// The autoencoder.
    pub vae: AutoencoderKL,
    scheduler_config: SchedulerConfig,
    /// SDXL's `force_zeros_for_empty_prompt`.
    pub(crate) force_zeros_for_empty_prompt: bool,
    dtype: DType,
    device: Device,
    xl: bool,
}

impl StableDiffusionPipeline {
    /// Loads a Stable Diffusion (1.x, 2.x or XL) pipeline folder or repo.
    pub fn from_pretrained(
        repo_or_path: &str,
        opts: &LoadOptions,
    ) -> Result<StableDiffusionPipeline> {
        let files = PipelineFiles::open(repo_or_path, opts.variant.as_deref())?;
        StableDiffusionPipeline::load(files, opts)
    }

    pub(crate) fn load(
        files: PipelineFiles,
        opts: &LoadOptions,
    ) -> Result<StableDiffusionPipeline> {
        let xl = files.index.class_name == "StableDiffusionXLPipeline";
        let dtype = pipeline_dtype(opts)?;
        // Configs first: a bad config fails before any weight is read.
        let unet_cfg = UNet2DConditionConfig::from_file(&files.file("unet", "config.json")?)?;
        let vae_cfg = AutoencoderKLConfig::from_file(&files.file("vae", "config.json")?)?;
        let scheduler_config = files.scheduler(opts.scheduler.as_deref())?;
        scheduler_config.build()?;
        let unet_files = files.component("unet", &["UNet2DConditionModel"])?;
        let vae_files = files.component("vae", &["AutoencoderKL"])?;
        let text_encoder = TextEncoder::load(&files, "tokenizer", "text_encoder", dtype, opts)?;
        let text_encoder_2 = if xl {
            Some(TextEncoder::load(
                &files,
                "tokenizer_2",
                "text_encoder_2",
                dtype,
                opts,
            )?)
        } else {
            None
        };
        if xl && !unet_cfg.takes_text_time() {
            return Err(Error::Config {
                path: unet_cfg.path.clone(),
                reason: "an SDXL pipeline needs a UNet with `addition_embed_type` \"text_time\""
                    .into(),
            });
        }
        // A UNet split over several devices: the pipeline's latents live on the first
        // stage's device, the VAE (unless planned elsewhere) on the last's.
        let (unet_w, device) = super::unet_weights(&unet_files, dtype, opts)?;
        let unet = UNet2DConditionModel::load(&unet_w, &unet_cfg)?;
        // diffusers runs a `force_upcast` VAE in float32 when the pipeline is float16.
        let vae = load_vae(&vae_files, &vae_cfg, dtype, opts)?;
        let force_zeros_for_empty_prompt = files
            .index
            .extra
            .get("force_zeros_for_empty_prompt")
            .and_then(serde_json::Value::as_bool)
            .unwrap_or(true);
        Ok(StableDiffusionPipeline {
            text_encoder,
            text_encoder_2,
            unet,
            vae,
            scheduler_config,
            force_zeros_for_empty_prompt,
            dtype,
            device,
            xl,
        })
    }

    /// The pipeline class.
    pub fn class_name(&self) -> &'static str {
        if self.xl {
            "StableDiffusionXLPipeline"
        } else {
            "StableDiffusionPipeline"
        }
    }

    super::scheduler_methods!();

    /// The default image size `(height, width)`: the UNet's `sample_size` times the VAE's
    /// scale factor.
    pub fn default_size(&self) -> (usize, usize) {
        let f = self.vae.config().scale_factor();
        let (h, w) = crate::models::sample_size(self.unet.config().sample_size.as_ref(), 64);
        (h * f, w * f)
    }

    /// The prompt embeddings `(positive, negative)` as `encode_prompt` returns them (SD 1.x /
    /// 2.x: the text encoder's last hidden state), one row per prompt.
    pub fn encode_prompt(
        &self,
        args: &TextToImage,
    ) -> Result<(Conditioning, Option<Conditioning>)> {
        if self.xl {
            let (h, w) = self.size(args);
            return super::stable_diffusion_xl::encode_prompt(self, args, (h, w));
        }
        let pos = self
            .text_encoder
            .encode(&args.prompt, false)?
            .last_hidden_state;
        let neg = if args.guidance_scale > 1.0 {
            let n = self.text_encoder.encode(&negatives(args)?, false)?;
            Some(Conditioning {
                prompt_embeds: n.last_hidden_state,
                text_embeds: None,
                time_ids: None,
            })
        } else {
            None
        };
        Ok((
            Conditioning {
                prompt_embeds: pos,
                text_embeds: None,
                time_ids: None,
            },
            neg,
        ))
    }

    fn size(&self, args: &TextToImage) -> (usize, usize) {
        if let Some(img) = &args.init_image {
            if let [_, _, h, w] = img.shape()[..] {
                return (h, w);
            }
        }
        let (dh, dw) = self.default_size();
        (args.height.unwrap_or(dh), args.width.unwrap_or(dw))
    }

    /// Checks a call's arguments before anything runs.
    pub fn check_inputs(&self, args: &TextToImage) -> Result<()> {
        check_counts(args)?;
        if !(args.guidance_scale.is_finite() && args.guidance_scale >= 0.0) {
            return Err(Error::Input(format!(
                "the guidance scale is {}; use 0 or more (above 1 turns on classifier-free guidance)",
                args.guidance_scale
            )));
        }
        if !(0.0..=1.0).contains(&args.guidance_rescale) {
            return Err(Error::Input(format!(
                "`guidance_rescale` is {}; use a value in [0, 1]",
                args.guidance_rescale
            )));
        }
        if let Some(img) = &args.init_image {
            if self.xl {
                return Err(Error::Unsupported(
                    "image-to-image with an SDXL pipeline (its aesthetic-score conditioning) is not built yet".into(),
                ));
            }
            let n = args.prompt.len() * args.num_images_per_prompt;
            let ok = matches!(img.shape(), [b, 3, _, _] if *b == n || *b == 1);
            if !ok {
                return Err(Error::Shape(format!(
                    "the init image is {:?}; give [1 or {n}, 3, height, width] in [0, 1]",
                    img.shape()
                )));
            }
            let (h, w) = (img.shape()[2], img.shape()[3]);
            if args.height.is_some_and(|x| x != h) || args.width.is_some_and(|x| x != w) {
                return Err(Error::Input(format!(
                    "the init image is {w}x{h} but the size asked for is {}x{}; resize the image or drop the size",
                    args.width.unwrap_or(w),
                    args.height.unwrap_or(h)
                )));
            }
            if !(0.0..=1.0).contains(&args.strength) {
                return Err(Error::Input(format!(
                    "`strength` is {}; use a value in [0, 1]",
                    args.strength
                )));
            }
            if img2img_start(args.num_inference_steps, args.strength) >= args.num_inference_steps {
                return Err(Error::Input(format!(
                    "strength {} leaves none of the {} steps to run; raise the strength or the steps",
                    args.strength, args.num_inference_steps
                )));
            }
        }
        let (h, w) = self.size(args);
        check_size(h, w, 8.max(self.vae.config().scale_factor()))?;
        check_images_fit(&self.vae, args, h, w)?;
        negatives(args)?;
        Ok(())
    }

    /// Generates images for `args`, drawing noise from `noise`.
    pub fn generate(&self, args: &TextToImage, noise: &mut Noise) -> Result<Generated> {
        self.check_inputs(args)?;
        let (h, w) = self.size(args);
        let f = self.vae.config().scale_factor();
        let (lh, lw) = (h / f, w / f);
        let batch = args.prompt.len() * args.num_images_per_prompt;
        let shape = [batch, self.unet.config().in_channels, lh, lw];
        if let Some(l) = &args.latents {
            if l.shape() != shape {
                return Err(Error::Shape(format!(
                    "the latents are {:?}; a {w}x{h} image with {batch} images needs {shape:?}",
                    l.shape()
                )));
            }
        }
        let mut scheduler = self.scheduler_config.build()?;
        scheduler.set_timesteps(args.num_inference_steps)?;
        scheduler.set_eta(args.eta);

        let t0 = Instant::now();
        let (pos, neg) = self.encode_prompt(args)?;
        let cond = combine(pos, neg, args.num_images_per_prompt)?;
        let encode_seconds = t0.elapsed().as_secs_f64();

        let (latents, begin) = match &args.init_image {
            Some(image) => {
                let begin = img2img_start(args.num_inference_steps, args.strength);
                scheduler.set_begin_index(begin)?;
                let l = self.noised_image_latents(image, &*scheduler, begin, batch, noise)?;
                (l, begin)
            }
            None => {
                let init = match &args.latents {
                    Some(l) => l.to_device(&self.device)?.to_dtype(DType::F32)?,
                    None => noise.randn(&shape, &self.device)?,
                };
                let sigma = init_noise_sigma(&*scheduler, &self.device)?;
                (init.mul(&sigma)?, 0)
            }
        };
        let t1 = Instant::now();
        let latents = self.denoise(&mut *scheduler, latents, begin, &cond, args, noise)?;
        let denoise_seconds = t1.elapsed().as_secs_f64();
        let t2 = Instant::now();
        let images = self.decode_latents(&latents)?;
        Ok(Generated {
            images,
            steps: scheduler.timesteps().len() - begin,
            denoise_seconds,
            encode_seconds,
            decode_seconds: t2.elapsed().as_secs_f64(),
        })
    }

    /// img2img's starting latents: the image encoded by the VAE (a draw of its posterior,
    /// times `scaling_factor`), then noised to step `begin`'s level.
    fn noised_image_latents(
        &self,
        image: &Tensor,
        scheduler: &dyn Scheduler,
        begin: usize,
        batch: usize,
        noise: &mut Noise,
    ) -> Result<Tensor> {
        let x = image
            .to_device(&self.vae.device())?
            .to_dtype(DType::F32)?
            .affine(2.0, -1.0)?;
        let dist = self.vae.encode(&x)?;
        let draw = noise.randn(dist.mean.shape(), &self.vae.device())?;
        let mut init = dist
            .sample(&draw)?
            .to_dtype(DType::F32)?
            .mul_scalar(self.vae.config().scaling_factor)?;
        if init.shape()[0] == 1 && batch > 1 {
            init = init.repeat_interleave(batch, 0)?;
        }
        let init = init.to_device(&self.device)?;
        let n = noise.randn(init.shape(), &self.device)?;
        scheduler.add_noise(&init, &n, begin)
    }

    /// The denoising loop from `latents` over the timesteps of `scheduler` from `begin`.
    pub fn denoise(
        &self,
        scheduler: &mut dyn Scheduler,
        mut latents: Tensor,
        begin: usize,
        cond: &Conditioning,
        args: &TextToImage,
        noise: &mut Noise,
    ) -> Result<Tensor> {
        let guided = args.guidance_scale > 1.0;
        let timesteps = scheduler.timesteps().to_vec();
        let bar = step_bar(timesteps.len().saturating_sub(begin), args.progress);
        let ctx = cond.prompt_embeds.to_dtype(self.dtype)?;
        let scale = Tensor::from_f64s(&[args.guidance_scale], &[1], DType::F32, &self.device)?;
        for (i, &t) in timesteps.iter().enumerate().skip(begin) {
            let input = model_input(&latents, guided, &*scheduler, i)?;
            let ts = Tensor::from_f64s(&[t], &[1], DType::F32, &self.device)?;
            let pred = self.unet.forward(UNet2DConditionInput {
                sample: &input,
                timestep: &ts,
                encoder_hidden_states: &ctx,
                class_labels: None,
                timestep_cond: None,
                text_embeds: cond.text_embeds.as_ref(),
                time_ids: cond.time_ids.as_ref(),
            })?;
            let pred = pred.to_dtype(DType::F32)?.to_device(&self.device)?;
            let pred = if guided {
                let (mut p, text) = guide(&pred, &scale)?;
                if args.guidance_rescale > 0.0 {
                    p = rescale_noise_cfg(&p, &text, args.guidance_rescale)?;
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

    /// Decodes final latents to `[N, H, W, 3]` images in `[0, 1]`.
    pub fn decode_latents(&self, latents: &Tensor) -> Result<Tensor> {
        decode_latents(&self.vae, latents)
    }
}

/// The first step img2img runs: `strength` of the `steps` run (diffusers' `get_timesteps`).
fn img2img_start(steps: usize, strength: f64) -> usize {
    let init = ((steps as f64 * strength) as usize).min(steps);
    steps - init
}

/// Repeats each prompt's conditioning `n` times and puts the negative rows first.
fn combine(pos: Conditioning, neg: Option<Conditioning>, n: usize) -> Result<Conditioning> {
    let rep = |t: &Tensor| -> Result<Tensor> {
        if n == 1 {
            return Ok(t.clone());
        }
        Ok(t.repeat_interleave(n, 0)?)
    };
    let rep_opt = |t: &Option<Tensor>| t.as_ref().map(rep).transpose();
    let pos = Conditioning {
        prompt_embeds: rep(&pos.prompt_embeds)?,
        text_embeds: rep_opt(&pos.text_embeds)?,
        time_ids: rep_opt(&pos.time_ids)?,
    };
    let Some(neg) = neg else {
        return Ok(pos);
    };
    let cat = |a: Tensor, b: &Tensor| -> Result<Tensor> { Ok(Tensor::cat(&[&rep(&a)?, b], 0)?) };
    let cat_opt = |a: Option<Tensor>, b: &Option<Tensor>| -> Result<Option<Tensor>> {
        match (a, b) {
            (Some(a), Some(b)) => Ok(Some(cat(a, b)?)),
            _ => Ok(None),
        }
    };
    Ok(Conditioning {
        prompt_embeds: cat(neg.prompt_embeds, &pos.prompt_embeds)?,
        text_embeds: cat_opt(neg.text_embeds, &pos.text_embeds)?,
        time_ids: cat_opt(neg.time_ids, &pos.time_ids)?,
    })
}

/// `rescale_noise_cfg`: rescales the guided prediction to the text prediction's standard
/// deviation, mixed by `rescale`.
fn rescale_noise_cfg(cfg: &Tensor, text: &Tensor, rescale: f64) -> Result<Tensor> {
    let dims: Vec<isize> = (1..cfg.rank() as isize).collect();
    let std_text = text.var(&dims, true, 1)?.sqrt()?;
    let std_cfg = cfg.var(&dims, true, 1)?.sqrt()?;
    let rescaled = cfg.mul(&std_text.div(&std_cfg)?)?;
    Ok(rescaled
        .mul_scalar(rescale)?
        .add(&cfg.mul_scalar(1.0 - rescale)?)?)
}
