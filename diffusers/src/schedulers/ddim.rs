//! `DDIMScheduler` (diffusers' `scheduling_ddim.py`): deterministic DDIM steps (`eta = 0`)
//! or stochastic ones, from integer timesteps.

use zoo_runtime::Tensor;

use super::schedule::{
    integer_timesteps, NoiseConfig, NoiseSchedule, PredictionType, TimestepSpacing,
};
use super::thresholding::Thresholding;
use super::{divide, require_noise, scale, Scheduler, StepInput};
use crate::configuration::register_to_config;
use crate::{Error, Result};

const CLASS: &str = "DDIMScheduler";

register_to_config! {
    /// `DDIMScheduler`'s config fields, with the defaults of diffusers' `__init__`.
    pub struct DDIMConfig {
        /// The training schedule.
        #[serde(flatten)]
        pub noise: NoiseConfig = NoiseConfig::default(),
        /// Clip the predicted clean sample to `clip_sample_range`.
        pub clip_sample: bool = true,
        /// The cumulative alpha after the last step: 1, or the first training timestep's.
        pub set_alpha_to_one: bool = true,
        /// Added to `leading` timesteps.
        pub steps_offset: usize = 0,
        /// What the model predicts.
        pub prediction_type: PredictionType = PredictionType::Epsilon,
        /// Dynamic thresholding of the predicted clean sample.
        #[serde(flatten)]
        pub thresholding: Thresholding = Thresholding::default(),
        /// Bound of `clip_sample`.
        pub clip_sample_range: f64 = 1.0,
        /// How inference timesteps are spaced.
        pub timestep_spacing: TimestepSpacing = TimestepSpacing::Leading,
    }
}

/// `DDIMScheduler`.
#[derive(Clone, Debug)]
pub struct DDIMScheduler {
    config: DDIMConfig,
    schedule: NoiseSchedule,
    final_alpha_cumprod: f32,
    timesteps: Vec<f64>,
    /// `eta` of the pipeline's call: 0 is deterministic DDIM, 1 is DDPM-like.
    pub eta: f32,
    /// Recompute the noise from the clipped clean sample (`use_clipped_model_output`).
    pub use_clipped_model_output: bool,
}

impl DDIMScheduler {
    /// A scheduler from its config.
    pub fn new(config: DDIMConfig) -> Result<DDIMScheduler> {
        let schedule = NoiseSchedule::new(&config.noise, CLASS, false)?;
        let final_alpha_cumprod = if config.set_alpha_to_one {
            1.0
        } else {
            schedule.alphas_cumprod[0]
        };
        Ok(DDIMScheduler {
            config,
            schedule,
            final_alpha_cumprod,
            timesteps: Vec::new(),
            eta: 0.0,
            use_clipped_model_output: false,
        })
    }
}

impl Scheduler for DDIMScheduler {
    fn add_noise(&self, original: &Tensor, noise: &Tensor, step: usize) -> Result<Tensor> {
        let ac = &self.schedule.alphas_cumprod;
        super::add_noise_alphas(CLASS, ac, &self.timesteps, step, original, noise)
    }

    fn class_name(&self) -> &'static str {
        CLASS
    }

    fn choose_timesteps(&mut self, steps: usize) -> Result<()> {
        let c = &self.config;
        self.timesteps = integer_timesteps(
            CLASS,
            c.timestep_spacing,
            c.noise.num_train_timesteps,
            steps,
            c.steps_offset,
        )?;
        Ok(())
    }

    fn timesteps(&self) -> &[f64] {
        &self.timesteps
    }

    fn needs_noise(&self, _step: usize) -> bool {
        self.eta > 0.0
    }

    fn set_eta(&mut self, eta: f32) -> bool {
        self.eta = eta;
        true
    }

    fn step_checked(&mut self, x: StepInput<'_>) -> Result<Tensor> {
        let (model_output, step, sample, noise) = x.parts();
        let c = &self.config;
        let t = self.timesteps[step] as i64;
        let prev = t - (c.noise.num_train_timesteps / self.timesteps.len()) as i64;
        let ac = &self.schedule.alphas_cumprod;
        let alpha_t = *ac.get(t as usize).ok_or_else(|| {
            Error::Scheduler(format!(
                "{CLASS}: timestep {t} is past the training schedule"
            ))
        })?;
        let alpha_prev = if prev >= 0 {
            ac[prev as usize]
        } else {
            self.final_alpha_cumprod
        };
        let beta_t = 1.0 - alpha_t;
        let (sa, sb) = (alpha_t.sqrt(), beta_t.sqrt());
        let (mut x0, mut eps) = match c.prediction_type {
            PredictionType::Epsilon => (
                divide(&sample.sub(&scale(model_output, sb)?)?, sa)?,
                model_output.clone(),
            ),
            PredictionType::Sample => (
                model_output.clone(),
                divide(&sample.sub(&scale(model_output, sa)?)?, sb)?,
            ),
            PredictionType::VPrediction => (
                scale(sample, sa)?.sub(&scale(model_output, sb)?)?,
                scale(model_output, sa)?.add(&scale(sample, sb)?)?,
            ),
        };
        let clip = c.clip_sample.then_some(c.clip_sample_range);
        x0 = c.thresholding.apply_or_clip(x0, clip)?;
        // `_get_variance`, then the deviation `eta` asks for.
        let beta_prev = 1.0 - alpha_prev;
        let variance = beta_prev / beta_t * (1.0 - alpha_t / alpha_prev);
        let std_dev = self.eta * variance.sqrt();
        if self.use_clipped_model_output {
            eps = divide(&sample.sub(&scale(&x0, sa)?)?, sb)?;
        }
        let direction = scale(&eps, (1.0 - alpha_prev - std_dev * std_dev).sqrt())?;
        let mut prev_sample = scale(&x0, alpha_prev.sqrt())?.add(&direction)?;
        if self.eta > 0.0 {
            let n = require_noise(CLASS, noise, sample)?;
            prev_sample = prev_sample.add(&scale(n, std_dev)?)?;
        }
        Ok(prev_sample)
    }
}
