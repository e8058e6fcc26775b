//! `DiTPipeline`: mirrors diffusers' `pipelines/dit/pipeline_dit.py`.
//!
//! Class-conditional generation: each prompt names an ImageNet class by one of the
//! comma-separated synonyms of `model_index.json`'s `id2label` (or gives its id). Under
//! guidance the batch is the labels then as many null labels, and the latents are doubled;
//! each step guides the first `in_channels` output channels (the noise; a learned-sigma
//! model's variance channels are dropped before the scheduler) and steps both halves, as
//! diffusers does. The VAE decodes `latents / scaling_factor`.

use std::collections::BTreeMap;
use std::time::Instant;

use zoo_runtime::{DType, Device, Tensor};

use super::latents::{check_latent_channels, decode_latents, initial_latents, load_vae};
use super::text_to_image::{check_common, TextToImage};
use super::{pipeline_dtype, step_bar, Generated, LoadOptions, Noise, PipelineFiles};
use crate::models::autoencoder_kl::{AutoencoderKL, AutoencoderKLConfig};
use crate::models::transformer_dit::{DiTTransformer2DConfig, DiTTransformer2DModel};
use crate::{Error, Result, SchedulerConfig};

/// `DiTPipeline`.
#[derive(Debug)]
pub struct DiTPipeline {
    /// The denoiser.
    pub transformer: DiTTransformer2DModel,
    /// The autoencoder.
    pub vae: AutoencoderKL,
    scheduler_config: SchedulerConfig,
    /// Every synonym of `id2label` → its class id (diffusers' `labels`).
    labels: BTreeMap<String, usize>,
    device: Device,
}

impl DiTPipeline {
    /// Loads a DiT pipeline folder or repo.
    pub fn from_pretrained(repo_or_path: &str, opts: &LoadOptions) -> Result<DiTPipeline> {
        let files = PipelineFiles::open(repo_or_path, opts.variant.as_deref())?;
        DiTPipeline::load(files, opts)
    }

    pub(crate) fn load(files: PipelineFiles, opts: &LoadOptions) -> Result<DiTPipeline> {
        let dtype = pipeline_dtype(opts)?;
        let cfg = DiTTransformer2DConfig::from_file(&files.file("transformer", "config.json")?)?;
        let vae_cfg = AutoencoderKLConfig::from_file(&files.file("vae", "config.json")?)?;
        check_latent_channels(&vae_cfg, cfg.in_channels, "in_channels")?;
        let scheduler_config = files.scheduler(opts.scheduler.as_deref())?;
        scheduler_config.build()?;
        let labels = read_labels(&files, cfg.num_classes())?;
        let transformer_files = files.component(
            "transformer",
            &["DiTTransformer2DModel", "Transformer2DModel"],
        )?;
        let vae_files = files.component("vae", &["AutoencoderKL"])?;
        let (w, first) = super::transformer_weights(&transformer_files, dtype, opts)?;
        let transformer = DiTTransformer2DModel::load(&w, &cfg)?;
        let vae = load_vae(&vae_files, &vae_cfg, dtype, opts)?;
        Ok(DiTPipeline {
            transformer,
            vae,
            scheduler_config,
            labels,
            device: first,
        })
    }

    super::scheduler_methods!();

    /// The label names the pipeline knows, each with its class id.
    pub fn labels(&self) -> &BTreeMap<String, usize> {
        &self.labels
    }

    /// The class id of each label (diffusers' `get_label_ids`): a synonym from `id2label`,
    /// or the id itself written as a number.
    pub fn get_label_ids(&self, labels: &[String]) -> Result<Vec<usize>> {
        let n = self.transformer.config().num_classes();
        labels
            .iter()
            .map(|l| {
                if let Some(&id) = self.labels.get(l.trim()) {
                    return Ok(id);
                }
                match l.trim().parse::<usize>() {
                    Ok(id) if id < n => Ok(id),
                    _ => {
                        let known: Vec<&str> = self.labels.keys().map(String::as_str).collect();
                        let shown = known.iter().take(12).copied().collect::<Vec<_>>().join(", ");
                        Err(Error::Input(format!(
                            "{l:?} is not a class of this DiT: give one of the {} label names of model_index.json's id2label ({shown}{}) or a class id below {n}",
                            known.len(),
                            if known.len() > 12 { ", ..." } else { "" }
                        )))
                    }
                }
            })
            .collect()
    }

    /// Checks a call's arguments before anything runs.
    pub fn check_inputs(&self, args: &TextToImage) -> Result<()> {
        check_common(args)?;
        if args.negative_prompt.is_some() {
            return Err(Error::Input(
                "DiTPipeline guides against the null class, not a negative prompt".into(),
            ));
        }
        if args.init_image.is_some() {
            return Err(Error::Unsupported(
                "DiTPipeline generates from noise; it has no image-to-image".into(),
            ));
        }
        let s = self.transformer.config().sample_size * self.vae.config().scale_factor();
        if args.height.is_some_and(|h| h != s) || args.width.is_some_and(|w| w != s) {
            return Err(Error::Input(format!(
                "DiTPipeline generates {s}x{s} images (the transformer's sample_size times the VAE's factor); drop the size"
            )));
        }
        self.get_label_ids(&args.prompt)?;
        Ok(())
    }

    /// Generates one image per label in `args.prompt` (times `num_images_per_prompt`).
    pub fn generate(&self, args: &TextToImage, noise: &mut Noise) -> Result<Generated> {
        self.check_inputs(args)?;
        let c = self.transformer.config();
        let mut ids = Vec::new();
        for id in self.get_label_ids(&args.prompt)? {
            ids.extend(std::iter::repeat_n(id, args.num_images_per_prompt));
        }
        let batch = ids.len();
        let guided = args.guidance_scale > 1.0;
        let mut labels: Vec<f64> = ids.iter().map(|&i| i as f64).collect();
        if guided {
            labels.extend(std::iter::repeat_n(c.num_classes() as f64, batch));
        }
        let labels = Tensor::from_f64s(&labels, &[labels.len()], DType::I64, &self.device)?;
        let side = c.sample_size;
        let shape = [batch, c.in_channels, side, side];
        let latents = initial_latents(args, &shape, &self.device, noise)?;
        let mut scheduler = self.scheduler_config.build()?;
        scheduler.set_timesteps(args.num_inference_steps)?;
        scheduler.set_eta(args.eta);

        let t1 = Instant::now();
        let mut x = if guided {
            Tensor::cat(&[&latents, &latents], 0)?
        } else {
            latents
        };
        let channels = c.in_channels;
        let learned_sigma = c.out_channels() / 2 == channels;
        let scale = Tensor::from_f64s(&[args.guidance_scale], &[1], DType::F32, &self.device)?;
        let timesteps = scheduler.timesteps().to_vec();
        let bar = step_bar(timesteps.len(), args.progress);
        for (i, &t) in timesteps.iter().enumerate() {
            if guided {
                let half = x.narrow(0, 0, batch)?;
                x = Tensor::cat(&[&half, &half], 0)?;
            }
            let input = scheduler.scale_model_input(&x, i)?;
            let ts = Tensor::from_f64s(&[t], &[1], DType::F32, &self.device)?;
            let pred = self
                .transformer
                .forward(&input, &ts, &labels)?
                .to_dtype(DType::F32)?
                .to_device(&self.device)?;
            let pred = if guided {
                let eps = pred.narrow(1, 0, channels)?;
                let (cond, uncond) = (eps.narrow(0, 0, batch)?, eps.narrow(0, batch, batch)?);
                let half = uncond.add(&cond.sub(&uncond)?.mul(&scale)?)?;
                let eps = Tensor::cat(&[&half, &half], 0)?;
                let rest = pred.shape()[1] - channels;
                if rest > 0 {
                    Tensor::cat(&[&eps, &pred.narrow(1, channels, rest)?], 1)?
                } else {
                    eps
                }
            } else {
                pred
            };
            let model_output = if learned_sigma {
                pred.narrow(1, 0, channels)?
            } else {
                pred
            };
            x = super::scheduler_step(&mut *scheduler, &model_output, i, &x, noise)?;
            bar.inc(1);
        }
        bar.finish_and_clear();
        let latents = if guided { x.narrow(0, 0, batch)? } else { x };
        let denoise_seconds = t1.elapsed().as_secs_f64();
        let t2 = Instant::now();
        let images = decode_latents(&self.vae, &latents)?;
        Ok(Generated {
            images,
            steps: timesteps.len(),
            denoise_seconds,
            encode_seconds: 0.0,
            decode_seconds: t2.elapsed().as_secs_f64(),
        })
    }
}

/// `id2label` of `model_index.json` as synonym → id: each label split at commas, stripped.
fn read_labels(files: &PipelineFiles, num_classes: usize) -> Result<BTreeMap<String, usize>> {
    let path = &files.index.path;
    let bad = |reason: String| Error::Config {
        path: path.clone(),
        reason,
    };
    let mut labels = BTreeMap::new();
    let Some(map) = files.index.extra.get("id2label") else {
        return Ok(labels);
    };
    let map = map
        .as_object()
        .ok_or_else(|| bad("`id2label` must map class ids to label names".into()))?;
    for (k, v) in map {
        let id: usize = k.parse().ok().filter(|&i| i < num_classes).ok_or_else(|| {
            bad(format!(
                "`id2label` key {k:?} is not a class id below num_embeds_ada_norm = {num_classes}"
            ))
        })?;
        let names = v
            .as_str()
            .ok_or_else(|| bad(format!("`id2label[{k:?}]` must be a string of names")))?;
        for name in names.split(',') {
            labels.insert(name.trim().to_string(), id);
        }
    }
    Ok(labels)
}
