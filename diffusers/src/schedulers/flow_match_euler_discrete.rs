//! `FlowMatchEulerDiscreteScheduler` (diffusers' `scheduling_flow_match_euler_discrete.py`):
//! Euler steps of a rectified-flow ODE, `x_next = x + (sigma_next - sigma) * v`, over sigmas
//! from 1 (noise) to 0 (data), shifted toward noise by a fixed `shift` (SD3) or by the
//! resolution-dependent `mu` the pipeline passes (`use_dynamic_shifting`, Flux).
//!
//! Precision follows diffusers: the default schedule is computed in float64 (numpy), sigmas a
//! pipeline passes in float32 (they are cast to float32 before shifting), the final sigmas and
//! timesteps in float32.

use serde::Deserialize;
use zoo_runtime::Tensor;

use super::schedule::{linspace_f64, SigmaKind, SigmaSpacing};
use super::{
    add_noise_scaled, check_step, require_noise, scale, Scheduler, StepInput, TimestepOptions,
};
use crate::configuration::register_to_config;
use crate::{Error, Result};

const CLASS: &str = "FlowMatchEulerDiscreteScheduler";

/// `time_shift_type`: how `mu` shifts the sigmas under dynamic shifting.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TimeShift {
    /// `e^mu / (e^mu + (1/t - 1))`.
    Exponential,
    /// `mu / (mu + (1/t - 1))`.
    Linear,
}

register_to_config! {
    /// `FlowMatchEulerDiscreteScheduler`'s config fields, with the defaults of diffusers'
    /// `__init__` but for the four fields of `mu`: those stay unset, and each pipeline falls
    /// back to its own values (SD3's `max_shift` is not Flux's).
    pub struct FlowMatchEulerConfig {
        /// Training timesteps: timestep = sigma * this.
        pub num_train_timesteps: usize = 1000,
        /// The fixed shift `shift * s / (1 + (shift - 1) * s)` (ignored under dynamic shifting).
        pub shift: f64 = 1.0,
        /// Shift by the pipeline's `mu` instead of `shift`.
        pub use_dynamic_shifting: bool = false,
        /// `mu` at `base_image_seq_len` tokens (read by the pipelines).
        pub base_shift: Option<f64> = None,
        /// `mu` at `max_image_seq_len` tokens (read by the pipelines).
        pub max_shift: Option<f64> = None,
        /// Token count of `base_shift`.
        pub base_image_seq_len: Option<usize> = None,
        /// Token count of `max_shift`.
        pub max_image_seq_len: Option<usize> = None,
        /// Sigmas run from 0 to 1 (`1 - sigma`), ending at 1.
        pub invert_sigmas: bool = false,
        /// Stretches the shifted sigmas so the last one is this value.
        pub shift_terminal: Option<f64> = None,
        /// Karras or exponential sigmas between the shifted ends.
        #[serde(flatten)]
        pub spacing: SigmaSpacing = SigmaSpacing::default(),
        /// How `mu` shifts the sigmas.
        pub time_shift_type: TimeShift = TimeShift::Exponential,
        /// Each step re-noises the predicted data to the next sigma instead of an Euler step.
        pub stochastic_sampling: bool = false,
    }
}

/// `FlowMatchEulerDiscreteScheduler`.
#[derive(Clone, Debug)]
pub struct FlowMatchEulerDiscreteScheduler {
    config: FlowMatchEulerConfig,
    kind: SigmaKind,
    /// The training schedule's extreme sigmas (after the fixed shift), as float32.
    sigma_max: f32,
    sigma_min: f32,
    timesteps: Vec<f64>,
    sigmas: Vec<f32>,
}

impl FlowMatchEulerDiscreteScheduler {
    /// A scheduler from its config.
    pub fn new(config: FlowMatchEulerConfig) -> Result<FlowMatchEulerDiscreteScheduler> {
        let kind = config.spacing.kind(CLASS)?;
        if config.num_train_timesteps == 0 {
            return Err(Error::Scheduler(format!(
                "{CLASS}: num_train_timesteps must be at least 1"
            )));
        }
        if config.shift.is_nan() || config.shift <= 0.0 {
            return Err(Error::Scheduler(format!(
                "{CLASS}: shift must be positive, got {}",
                config.shift
            )));
        }
        if let Some(t) = config.shift_terminal {
            if !(0.0..1.0).contains(&t) {
                return Err(Error::Scheduler(format!(
                    "{CLASS}: shift_terminal must be in [0, 1), got {t}"
                )));
            }
        }
        let n = config.num_train_timesteps as f32;
        // The training sigmas t/N for t = N..1, shifted in float32 unless shifting is dynamic.
        let shifted = |s: f32| {
            if config.use_dynamic_shifting {
                s
            } else {
                let (k, k1) = (config.shift as f32, (config.shift - 1.0) as f32);
                k * s / (1.0 + k1 * s)
            }
        };
        Ok(FlowMatchEulerDiscreteScheduler {
            // The first training sigma is N / N = 1.
            sigma_max: shifted(1.0),
            sigma_min: shifted(1.0 / n),
            config,
            kind,
            timesteps: Vec::new(),
            sigmas: Vec::new(),
        })
    }

    /// The config, for the pipelines' `mu` (`base_shift`, `max_image_seq_len`, ...).
    pub fn config(&self) -> &FlowMatchEulerConfig {
        &self.config
    }

    /// Shift, stretch and respace the sigmas, in the float type `F` diffusers computes in.
    fn shape_sigmas<F: Float>(&self, sigmas: Vec<F>, mu: Option<f64>, n: usize) -> Vec<f64> {
        let c = &self.config;
        let one = F::from(1.0);
        let mut s: Vec<F> = match (c.use_dynamic_shifting, mu) {
            (true, Some(mu)) => {
                let m = F::from(match c.time_shift_type {
                    TimeShift::Exponential => mu.exp(),
                    TimeShift::Linear => mu,
                });
                sigmas
                    .into_iter()
                    .map(|t| m / (m + (one / t - one)))
                    .collect()
            }
            _ => {
                let (k, k1) = (F::from(c.shift), F::from(c.shift - 1.0));
                sigmas.into_iter().map(|t| k * t / (one + k1 * t)).collect()
            }
        };
        if let Some(terminal) = c.shift_terminal.filter(|&t| t != 0.0) {
            let last = one - *s.last().unwrap_or(&one);
            let factor = last / F::from(1.0 - terminal);
            s = s.into_iter().map(|t| one - (one - t) / factor).collect();
        }
        let s: Vec<f64> = s.into_iter().map(F::to_f64).collect();
        // Neither bound is a config field of this class: the schedule's own ends.
        self.kind.spaced(s[s.len() - 1], s[0], n).unwrap_or(s)
    }
}

/// The two float widths the schedule is computed in.
trait Float:
    Copy
    + std::ops::Add<Output = Self>
    + std::ops::Sub<Output = Self>
    + std::ops::Mul<Output = Self>
    + std::ops::Div<Output = Self>
{
    fn from(v: f64) -> Self;
    fn to_f64(self) -> f64;
}

impl Float for f32 {
    fn from(v: f64) -> f32 {
        v as f32
    }
    fn to_f64(self) -> f64 {
        self as f64
    }
}

impl Float for f64 {
    fn from(v: f64) -> f64 {
        v
    }
    fn to_f64(self) -> f64 {
        self
    }
}

impl Scheduler for FlowMatchEulerDiscreteScheduler {
    fn class_name(&self) -> &'static str {
        CLASS
    }

    fn choose_timesteps(&mut self, steps: usize) -> Result<()> {
        self.set_timesteps_with(steps, &TimestepOptions::default())
    }

    fn set_timesteps_with(&mut self, steps: usize, options: &TimestepOptions) -> Result<()> {
        let c = &self.config;
        // diffusers runs custom timesteps as given beside sigmas shifted from them, which
        // disagree under any shift: the schedule is asked as sigmas here.
        if options.timesteps.is_some() {
            return Err(Error::Scheduler(format!(
                "{CLASS}: pass a custom schedule as sigmas (TimestepOptions::sigmas), not timesteps"
            )));
        }
        if c.use_dynamic_shifting && options.mu.is_none() {
            return Err(Error::Scheduler(format!(
                "{CLASS}: use_dynamic_shifting is set, so set_timesteps needs the pipeline's `mu` (TimestepOptions::mu)"
            )));
        }
        let n_train = c.num_train_timesteps as f64;
        let sigmas = match &options.sigmas {
            Some(given) => {
                if given.is_empty() || (steps != 0 && given.len() != steps) {
                    return Err(Error::Scheduler(format!(
                        "{CLASS}: {} sigmas given for {steps} inference steps; pass one per step",
                        given.len()
                    )));
                }
                if let Some(bad) = given.iter().find(|s| s.is_nan() || **s <= 0.0 || **s > 1.0) {
                    return Err(Error::Scheduler(format!(
                        "{CLASS}: sigmas must lie in (0, 1], got {bad}"
                    )));
                }
                let f32s: Vec<f32> = given.iter().map(|&s| s as f32).collect();
                let n = f32s.len();
                self.shape_sigmas(f32s, options.mu, n)
            }
            None => {
                if steps == 0 {
                    return Err(Error::Scheduler(format!(
                        "{CLASS}: num_inference_steps must be at least 1"
                    )));
                }
                let t = linspace_f64(
                    self.sigma_max as f64 * n_train,
                    self.sigma_min as f64 * n_train,
                    steps,
                );
                let s: Vec<f64> = t.into_iter().map(|t| t / n_train).collect();
                self.shape_sigmas(s, options.mu, steps)
            }
        };
        let mut sigmas: Vec<f32> = sigmas.into_iter().map(|s| s as f32).collect();
        let n = self.config.num_train_timesteps as f32;
        if self.config.invert_sigmas {
            sigmas = sigmas.into_iter().map(|s| 1.0 - s).collect();
        }
        self.timesteps = sigmas.iter().map(|&s| (s * n) as f64).collect();
        sigmas.push(if self.config.invert_sigmas { 1.0 } else { 0.0 });
        self.sigmas = sigmas;
        Ok(())
    }

    fn timesteps(&self) -> &[f64] {
        &self.timesteps
    }

    fn sigmas(&self) -> Option<&[f32]> {
        Some(&self.sigmas)
    }

    fn scale_model_input(&self, sample: &Tensor, step: usize) -> Result<Tensor> {
        check_step(CLASS, step, self.timesteps.len())?;
        Ok(sample.clone())
    }

    /// `scale_noise`: `sigma * noise + (1 - sigma) * x`.
    fn add_noise(&self, original: &Tensor, noise: &Tensor, step: usize) -> Result<Tensor> {
        check_step(CLASS, step, self.timesteps.len())?;
        let s = self.sigmas[step];
        add_noise_scaled(&scale(original, 1.0 - s)?, noise, 1.0, s)
    }

    fn needs_noise(&self, _step: usize) -> bool {
        self.config.stochastic_sampling
    }

    fn step_checked(&mut self, x: StepInput<'_>) -> Result<Tensor> {
        let (model_output, step, sample, noise) = x.parts();
        let (sigma, next) = (self.sigmas[step], self.sigmas[step + 1]);
        let dtype = model_output.dtype();
        let x = sample.to_dtype(zoo_runtime::DType::F32)?;
        let v = model_output.to_dtype(zoo_runtime::DType::F32)?;
        let prev = if self.config.stochastic_sampling {
            let noise = require_noise(CLASS, noise, sample)?.to_dtype(zoo_runtime::DType::F32)?;
            let x0 = x.sub(&scale(&v, sigma)?)?;
            add_noise_scaled(&x0, &noise, 1.0 - next, next)?
        } else {
            x.add(&scale(&v, next - sigma)?)?
        };
        Ok(prev.to_dtype(dtype)?)
    }
}
