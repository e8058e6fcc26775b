//! `DDPMPipeline`: mirrors diffusers' `pipelines/ddpm/pipeline_ddpm.py` — unconditional
//! generation with a `UNet2DModel`, from Gaussian noise through every scheduler step; the
//! sample is the image.

use std::time::Instant;

use zoo_runtime::{DType, Device, Tensor};

use super::latents::{init_noise_sigma, postprocess};
use super::{pipeline_dtype, step_bar, Generated, LoadOptions, Noise, PipelineFiles};
use crate::models::unet_2d::{UNet2DConfig, UNet2DModel};
use crate::{Error, Result, SchedulerConfig};

/// `DDPMPipeline`.
#[derive(Debug)]
pub struct DDPMPipeline {
    /// The denoiser.
    pub unet: UNet2DModel,
    scheduler_config: SchedulerConfig,
    device: Device,
}

impl DDPMPipeline {
    /// Loads a DDPM pipeline folder or repo.
    pub fn from_pretrained(repo_or_path: &str, opts: &LoadOptions) -> Result<DDPMPipeline> {
        DDPMPipeline::load(
            PipelineFiles::open(repo_or_path, opts.variant.as_deref())?,
            opts,
        )
    }

    pub(crate) fn load(files: PipelineFiles, opts: &LoadOptions) -> Result<DDPMPipeline> {
        let dtype = pipeline_dtype(opts)?;
        let cfg = UNet2DConfig::from_file(&files.file("unet", "config.json")?)?;
        let scheduler_config = files.scheduler(opts.scheduler.as_deref())?;
        scheduler_config.build()?;
        let unet_files = files.component("unet", &["UNet2DModel"])?;
        // Split over several devices, the sample stays on the first stage's device.
        let (w, device) = super::unet_weights(&unet_files, dtype, opts)?;
        let unet = UNet2DModel::load(&w, &cfg)?;
        Ok(DDPMPipeline {
            unet,
            scheduler_config,
            device,
        })
    }

    /// The image size `(height, width)`: the UNet's `sample_size`.
    pub fn sample_size(&self) -> (usize, usize) {
        crate::models::sample_size(self.unet.config().sample_size.as_ref(), 32)
    }

    /// Generates `batch_size` images in `num_inference_steps` steps.
    pub fn generate(
        &self,
        batch_size: usize,
        num_inference_steps: usize,
        noise: &mut Noise,
        progress: bool,
    ) -> Result<Generated> {
        if batch_size == 0 || num_inference_steps == 0 {
            return Err(Error::Input(
                "the batch size and `num_inference_steps` must be at least 1".into(),
            ));
        }
        let (h, w) = self.sample_size();
        let shape = [batch_size, self.unet.config().in_channels, h, w];
        let mut scheduler = self.scheduler_config.build()?;
        scheduler.set_timesteps(num_inference_steps)?;
        let t0 = Instant::now();
        let sigma = init_noise_sigma(&*scheduler, &self.device)?;
        let mut image = noise.randn(&shape, &self.device)?.mul(&sigma)?;
        let timesteps = scheduler.timesteps().to_vec();
        let bar = step_bar(timesteps.len(), progress);
        for (i, &t) in timesteps.iter().enumerate() {
            let input = scheduler.scale_model_input(&image, i)?;
            let ts = Tensor::from_f64s(&[t], &[1], DType::F32, &self.device)?;
            let pred = self
                .unet
                .forward(&input, &ts, None)?
                .to_dtype(DType::F32)?
                .to_device(&self.device)?;
            image = super::scheduler_step(&mut *scheduler, &pred, i, &image, noise)?;
            bar.inc(1);
        }
        bar.finish_and_clear();
        let denoise_seconds = t0.elapsed().as_secs_f64();
        let t1 = Instant::now();
        let images = postprocess(&image)?;
        Ok(Generated {
            images,
            steps: timesteps.len(),
            denoise_seconds,
            encode_seconds: 0.0,
            decode_seconds: t1.elapsed().as_secs_f64(),
        })
    }
}
