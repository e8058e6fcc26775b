//! `DDPMScheduler` (diffusers' `scheduling_ddpm.py`): ancestral DDPM steps with the
//! configured posterior variance, from integer timesteps.

use serde::Deserialize;
use zoo_runtime::Tensor;

use super::schedule::{
    integer_timesteps, NoiseConfig, NoiseSchedule, PredictionType, TimestepSpacing,
};
use super::thresholding::Thresholding;
use super::{coef, divide, require_noise, scale, Scheduler, StepInput};
use crate::configuration::register_to_config;
use crate::{Error, Result};

const CLASS: &str = "DDPMScheduler";

/// `variance_type`: the variance of the noise each step adds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VarianceType {
    /// The posterior variance.
    FixedSmall,
    /// Its square root taken through the log.
    FixedSmallLog,
    /// The step's beta.
    FixedLarge,
    /// The log of the step's beta.
    FixedLargeLog,
    /// Predicted by the model (the second half of its output channels).
    Learned,
    /// Interpolated in log space between the two fixed ones by the model's prediction.
    LearnedRange,
}

register_to_config! {
    /// `DDPMScheduler`'s config fields, with the defaults of diffusers' `__init__`.
    pub struct DDPMConfig {
        /// The training schedule.
        #[serde(flatten)]
        pub noise: NoiseConfig = NoiseConfig::default(),
        /// The variance added at each step.
        pub variance_type: VarianceType = VarianceType::FixedSmall,
        /// Clip the predicted clean sample to `clip_sample_range`.
        pub clip_sample: bool = true,
        /// What the model predicts.
        pub prediction_type: PredictionType = PredictionType::Epsilon,
        /// Dynamic thresholding of the predicted clean sample.
        #[serde(flatten)]
        pub thresholding: Thresholding = Thresholding::default(),
        /// Bound of `clip_sample`.
        pub clip_sample_range: f64 = 1.0,
        /// How inference timesteps are spaced.
        pub timestep_spacing: TimestepSpacing = TimestepSpacing::Leading,
        /// Added to `leading` timesteps.
        pub steps_offset: usize = 0,
    }
}

/// `DDPMScheduler`.
#[derive(Clone, Debug)]
pub struct DDPMScheduler {
    config: DDPMConfig,
    schedule: NoiseSchedule,
    timesteps: Vec<f64>,
}

impl DDPMScheduler {
    /// A scheduler from its config.
    pub fn new(config: DDPMConfig) -> Result<DDPMScheduler> {
        Ok(DDPMScheduler {
            schedule: NoiseSchedule::new(&config.noise, CLASS, true)?,
            config,
            timesteps: Vec::new(),
        })
    }

    /// `(alpha_prod_t, alpha_prod_t_prev)` of step `step` (the next timestep's, or 1 after
    /// the last).
    fn alphas(&self, step: usize) -> Result<(f32, f32)> {
        let ac = &self.schedule.alphas_cumprod;
        let t = self.timesteps[step] as usize;
        let at = *ac.get(t).ok_or_else(|| {
            Error::Scheduler(format!(
                "{CLASS}: timestep {t} is past the training schedule"
            ))
        })?;
        let prev = match self.timesteps.get(step + 1) {
            Some(&p) => ac[p as usize],
            None => 1.0,
        };
        Ok((at, prev))
    }
}

impl Scheduler for DDPMScheduler {
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

    fn needs_noise(&self, step: usize) -> bool {
        self.timesteps.get(step).is_some_and(|&t| t > 0.0)
    }

    fn step_checked(&mut self, x: StepInput<'_>) -> Result<Tensor> {
        let (model_output, step, sample, noise) = x.parts();
        let c = &self.config;
        let learned = matches!(
            c.variance_type,
            VarianceType::Learned | VarianceType::LearnedRange
        );
        let channels = sample.shape().get(1).copied().unwrap_or(0);
        let (output, predicted_variance) =
            if learned && model_output.shape().get(1) == Some(&(2 * channels)) {
                (
                    model_output.narrow(1, 0, channels)?,
                    Some(model_output.narrow(1, channels, channels)?),
                )
            } else {
                (model_output.clone(), None)
            };
        let (at, aprev) = self.alphas(step)?;
        let (bt, bprev) = (1.0 - at, 1.0 - aprev);
        let current_alpha = at / aprev;
        let current_beta = 1.0 - current_alpha;
        let mut x0 = match c.prediction_type {
            PredictionType::Epsilon => {
                divide(&sample.sub(&scale(&output, bt.sqrt())?)?, at.sqrt())?
            }
            PredictionType::Sample => output.clone(),
            PredictionType::VPrediction => {
                scale(sample, at.sqrt())?.sub(&scale(&output, bt.sqrt())?)?
            }
        };
        let clip = c.clip_sample.then_some(c.clip_sample_range);
        x0 = c.thresholding.apply_or_clip(x0, clip)?;
        let x0_coeff = aprev.sqrt() * current_beta / bt;
        let sample_coeff = current_alpha.sqrt() * bprev / bt;
        let mut prev = scale(&x0, x0_coeff)?.add(&scale(sample, sample_coeff)?)?;
        if !self.needs_noise(step) {
            return Ok(prev);
        }
        let n = require_noise(CLASS, noise, sample)?;
        // `_get_variance`.
        let variance = ((bprev / bt) * current_beta).max(1e-20);
        let added = match c.variance_type {
            VarianceType::FixedSmall => scale(n, variance.sqrt())?,
            VarianceType::FixedSmallLog => scale(n, (0.5 * variance.ln()).exp())?,
            VarianceType::FixedLarge => scale(n, current_beta.sqrt())?,
            VarianceType::FixedLargeLog => scale(n, current_beta.ln().sqrt())?,
            VarianceType::Learned | VarianceType::LearnedRange => {
                let pv = predicted_variance.ok_or_else(|| {
                    Error::Scheduler(format!(
                        "{CLASS}: variance_type {:?} needs a model output of {} channels (twice the sample's)",
                        c.variance_type,
                        2 * channels
                    ))
                })?;
                if c.variance_type == VarianceType::Learned {
                    pv.sqrt()?.mul(n)?
                } else {
                    // frac * log(beta) + (1 - frac) * log(variance), frac = (v + 1) / 2;
                    // the noise scale is exp(0.5 * that).
                    let frac = divide(&pv.add(&coef(1.0, &pv)?)?, 2.0)?;
                    let (min_log, max_log) = (variance.ln(), current_beta.ln());
                    let one_minus = coef(1.0, &frac)?.sub(&frac)?;
                    let log_var = scale(&frac, max_log)?.add(&scale(&one_minus, min_log)?)?;
                    scale(&log_var, 0.5)?.exp()?.mul(n)?
                }
            }
        };
        prev = prev.add(&added)?;
        Ok(prev)
    }
}
