//! `EulerDiscreteScheduler` and `EulerAncestralDiscreteScheduler` (diffusers'
//! `scheduling_euler_discrete.py`, `scheduling_euler_ancestral_discrete.py`): Euler steps
//! over sigmas `sqrt((1 - alpha_bar) / alpha_bar)` interpolated at the inference timesteps
//! (or Karras / exponential sigmas), the ancestral one adding noise at each step.

use serde::Deserialize;
use zoo_runtime::{DType, Tensor};

use super::schedule::{
    interp, linspace_f32, sigma_to_t, spaced_timesteps, NoiseConfig, NoiseSchedule, PredictionType,
    SigmaKind, SigmaSpacing, TimestepSpacing,
};
use super::{check_step, divide, require_noise, scale, Scheduler, StepInput, TimestepOptions};
use crate::configuration::register_to_config;
use crate::{Error, Result};

/// `interpolation_type`: how sigmas are taken at the inference timesteps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Interpolation {
    /// `np.interp` of the training sigmas.
    Linear,
    /// Evenly in log sigma from the smallest to the largest.
    LogLinear,
}

/// `timestep_type`: what the model is called with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TimestepType {
    /// The timestep.
    Discrete,
    /// `0.25 * ln(sigma)` (with v-prediction, as EDM-style models take it).
    Continuous,
}

/// `final_sigmas_type`: the noise level after the last step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinalSigmas {
    /// Zero: the last step lands on the clean sample.
    Zero,
    /// The first training timestep's sigma.
    SigmaMin,
}

register_to_config! {
    /// `EulerDiscreteScheduler`'s config fields, with the defaults of diffusers' `__init__`.
    pub struct EulerConfig {
        /// The training schedule.
        #[serde(flatten)]
        pub noise: NoiseConfig = NoiseConfig::default(),
        /// What the model predicts.
        pub prediction_type: PredictionType = PredictionType::Epsilon,
        /// How sigmas are taken at the inference timesteps.
        pub interpolation_type: Interpolation = Interpolation::Linear,
        /// Karras, exponential or beta sigmas instead of the interpolated ones.
        #[serde(flatten)]
        pub spacing: SigmaSpacing = SigmaSpacing::default(),
        /// Smallest sigma of the Karras / exponential schedules (default: the schedule's).
        pub sigma_min: Option<f64> = None,
        /// Largest sigma of those schedules (default: the schedule's).
        pub sigma_max: Option<f64> = None,
        /// How inference timesteps are spaced.
        pub timestep_spacing: TimestepSpacing = TimestepSpacing::Linspace,
        /// What the model is called with.
        pub timestep_type: TimestepType = TimestepType::Discrete,
        /// Added to `leading` timesteps.
        pub steps_offset: usize = 0,
        /// The noise level after the last step.
        pub final_sigmas_type: FinalSigmas = FinalSigmas::Zero,
    }
}

register_to_config! {
    /// `EulerAncestralDiscreteScheduler`'s config fields, with the defaults of diffusers'
    /// `__init__`.
    pub struct EulerAncestralConfig {
        /// The training schedule.
        #[serde(flatten)]
        pub noise: NoiseConfig = NoiseConfig::default(),
        /// What the model predicts (`epsilon` or `v_prediction`).
        pub prediction_type: PredictionType = PredictionType::Epsilon,
        /// How inference timesteps are spaced.
        pub timestep_spacing: TimestepSpacing = TimestepSpacing::Linspace,
        /// Added to `leading` timesteps.
        pub steps_offset: usize = 0,
    }
}

/// What both Euler schedulers hold: the training sigmas and the inference ones.
#[derive(Clone, Debug)]
struct Sigmas {
    schedule: NoiseSchedule,
    /// Training sigmas, float32.
    train: Vec<f32>,
    timesteps: Vec<f64>,
    sigmas: Vec<f32>,
    spacing: TimestepSpacing,
}

impl Sigmas {
    fn new(noise: &NoiseConfig, class: &str, spacing: TimestepSpacing) -> Result<Sigmas> {
        let schedule = NoiseSchedule::for_sigmas(noise, class)?;
        Ok(Sigmas {
            train: schedule.sigmas(),
            schedule,
            timesteps: Vec::new(),
            sigmas: Vec::new(),
            spacing,
        })
    }

    /// `init_noise_sigma`: the largest sigma, or `sqrt(max^2 + 1)` for `leading` spacing.
    fn init_noise_sigma(&self) -> f64 {
        let max = self
            .sigmas
            .iter()
            .copied()
            .fold(f32::NEG_INFINITY, f32::max);
        let max = if self.sigmas.is_empty() {
            self.train.iter().copied().fold(0.0, f32::max)
        } else {
            max
        };
        self.spacing.init_noise_sigma(max)
    }

    /// `sample / sqrt(sigma^2 + 1)`.
    fn scale_model_input(&self, class: &str, sample: &Tensor, step: usize) -> Result<Tensor> {
        super::scale_by_sigma(class, sample, &self.sigmas, self.timesteps.len(), step)
    }
}

impl EulerDiscreteScheduler {
    /// A scheduler from its config.
    pub fn new(config: EulerConfig) -> Result<EulerDiscreteScheduler> {
        let kind = config.spacing.kind(EULER)?;
        Ok(EulerDiscreteScheduler {
            sigmas: Sigmas::new(&config.noise, EULER, config.timestep_spacing)?,
            config,
            kind,
            model_timesteps: Vec::new(),
        })
    }

    fn continuous(&self) -> bool {
        self.config.timestep_type == TimestepType::Continuous
            && self.config.prediction_type == PredictionType::VPrediction
    }

    /// `steps` sigmas at `timesteps` (interpolated, log-linear, or the config's Karras,
    /// exponential or beta ones with their own timesteps), then the final sigma.
    fn schedule(&mut self, steps: usize, mut timesteps: Vec<f64>) -> Result<()> {
        let c = &self.config;
        let s = &self.sigmas;
        let log_sigmas: Vec<f32> = s.train.iter().map(|v| v.ln()).collect();
        let mut sigmas: Vec<f64> = match c.interpolation_type {
            Interpolation::Linear => timesteps.iter().map(|&t| interp(t, &s.train)).collect(),
            Interpolation::LogLinear => {
                let lo = (*s.train.last().unwrap_or(&1.0)).ln() as f64;
                let hi = s.train[0].ln() as f64;
                linspace_f32(lo, hi, steps + 1)
                    .into_iter()
                    .map(|v| v.exp() as f64)
                    .collect()
            }
        };
        let smin = c.sigma_min.unwrap_or(*sigmas.last().unwrap_or(&0.0));
        let smax = c.sigma_max.unwrap_or(sigmas[0]);
        if let Some(spaced) = self.kind.spaced(smin, smax, steps) {
            sigmas = spaced;
            timesteps = sigmas
                .iter()
                .map(|&sg| sigma_to_t(sg, &log_sigmas) as f32 as f64)
                .collect();
        }
        let last = match c.final_sigmas_type {
            FinalSigmas::Zero => 0.0,
            FinalSigmas::SigmaMin => {
                let a = s.schedule.alphas_cumprod[0];
                ((1.0 - a) / a).sqrt() as f64
            }
        };
        sigmas.push(last);
        self.finish(sigmas.into_iter().map(|v| v as f32).collect(), timesteps);
        Ok(())
    }

    /// Keeps `sigmas` (one per step and the final one) and the timesteps the model is called
    /// with: `timesteps`, or `0.25 ln sigma` when continuous.
    fn finish(&mut self, sigmas: Vec<f32>, timesteps: Vec<f64>) {
        self.model_timesteps = if self.continuous() {
            sigmas[..sigmas.len() - 1]
                .iter()
                .map(|sg| (0.25 * sg.ln()) as f64)
                .collect()
        } else {
            timesteps
        };
        self.sigmas.timesteps = self.model_timesteps.clone();
        self.sigmas.sigmas = sigmas;
    }
}

/// The inference timesteps of `spacing` as the Euler schedulers keep them (float32).
fn timesteps_f32(
    spacing: TimestepSpacing,
    noise: &NoiseConfig,
    steps: usize,
    offset: usize,
) -> Vec<f64> {
    spaced_timesteps(spacing, noise.num_train_timesteps, steps, offset, false)
        .into_iter()
        .map(|t| t as f32 as f64)
        .collect()
}

const EULER: &str = "EulerDiscreteScheduler";
const ANCESTRAL: &str = "EulerAncestralDiscreteScheduler";

/// `EulerDiscreteScheduler`.
#[derive(Clone, Debug)]
pub struct EulerDiscreteScheduler {
    config: EulerConfig,
    kind: SigmaKind,
    sigmas: Sigmas,
    /// What the model is called with (the timesteps, or `0.25 ln sigma` when continuous).
    model_timesteps: Vec<f64>,
}

impl Scheduler for EulerDiscreteScheduler {
    fn add_noise(&self, original: &Tensor, noise: &Tensor, step: usize) -> Result<Tensor> {
        let sigmas = self.sigmas().unwrap_or_default();
        check_step(EULER, step, sigmas.len())?;
        super::add_noise_scaled(original, noise, 1.0, sigmas[step])
    }

    fn class_name(&self) -> &'static str {
        EULER
    }

    fn choose_timesteps(&mut self, steps: usize) -> Result<()> {
        let c = &self.config;
        let timesteps = timesteps_f32(c.timestep_spacing, &c.noise, steps, c.steps_offset);
        self.schedule(steps, timesteps)
    }

    fn set_timesteps_with(&mut self, steps: usize, options: &TimestepOptions) -> Result<()> {
        if options.mu.is_some() {
            return Err(Error::Scheduler(format!(
                "{EULER}: `mu` is flow matching's (FlowMatchEulerDiscreteScheduler); this scheduler takes none"
            )));
        }
        let Some(n) = options.custom_steps(EULER, steps, false)? else {
            return self.set_timesteps(steps);
        };
        let finite = |v: &[f64], what: &str| match v.iter().find(|x| !x.is_finite() || **x < 0.0) {
            Some(bad) => Err(Error::Scheduler(format!(
                "{EULER}: custom {what} must be finite and not negative, got {bad}"
            ))),
            None => Ok(()),
        };
        if let Some(t) = &options.timesteps {
            finite(t, "timesteps")?;
            if self.kind != SigmaKind::Interpolated {
                return Err(Error::Scheduler(format!(
                    "{EULER}: custom timesteps take the interpolated sigmas; the config asks for Karras, exponential or beta sigmas"
                )));
            }
            if self.continuous() {
                return Err(Error::Scheduler(format!(
                    "{EULER}: custom timesteps do not apply to continuous v-prediction timesteps (timestep_type continuous)"
                )));
            }
            return self.schedule(n, t.iter().map(|&v| v as f32 as f64).collect());
        }
        // Custom sigmas, the final one included: the timesteps are theirs (`_sigma_to_t`,
        // which numpy runs in float32 on these float32 sigmas).
        let given = options.sigmas.as_deref().unwrap_or_default();
        finite(given, "sigmas")?;
        let sigmas: Vec<f32> = given.iter().map(|&v| v as f32).collect();
        let log_sigmas: Vec<f32> = self.sigmas.train.iter().map(|v| v.ln()).collect();
        let timesteps: Vec<f64> = sigmas[..n]
            .iter()
            .map(|&sg| sigma_to_t(sg as f64, &log_sigmas) as f32 as f64)
            .collect();
        self.finish(sigmas, timesteps);
        Ok(())
    }

    fn timesteps(&self) -> &[f64] {
        &self.model_timesteps
    }

    fn sigmas(&self) -> Option<&[f32]> {
        Some(&self.sigmas.sigmas)
    }

    fn init_noise_sigma(&self) -> f64 {
        self.sigmas.init_noise_sigma()
    }

    fn scale_model_input(&self, sample: &Tensor, step: usize) -> Result<Tensor> {
        self.sigmas.scale_model_input(EULER, sample, step)
    }

    fn step_checked(&mut self, x: StepInput<'_>) -> Result<Tensor> {
        let (model_output, step, sample, _) = x.parts();
        let sample = sample.to_dtype(DType::F32)?;
        // `s_churn` is 0 in every pipeline call, so sigma_hat is sigma.
        let sigma = self.sigmas.sigmas[step];
        let x0 = match self.config.prediction_type {
            PredictionType::Sample => model_output.to_dtype(DType::F32)?,
            PredictionType::Epsilon => sample.sub(&scale(model_output, sigma)?)?,
            PredictionType::VPrediction => v_to_x0(model_output, &sample, sigma)?,
        };
        let derivative = divide(&sample.sub(&x0)?, sigma)?;
        let dt = self.sigmas.sigmas[step + 1] - sigma;
        let prev = sample.add(&scale(&derivative, dt)?)?;
        Ok(prev.to_dtype(model_output.dtype())?)
    }
}

/// The clean sample of a v-prediction: `v * (-sigma / sqrt(sigma^2 + 1)) + x / (sigma^2 + 1)`.
fn v_to_x0(v: &Tensor, x: &Tensor, sigma: f32) -> Result<Tensor> {
    let s2 = sigma * sigma + 1.0;
    Ok(scale(v, -sigma / s2.sqrt())?.add(&divide(x, s2)?)?)
}

/// `EulerAncestralDiscreteScheduler`.
#[derive(Clone, Debug)]
pub struct EulerAncestralDiscreteScheduler {
    config: EulerAncestralConfig,
    sigmas: Sigmas,
}

impl EulerAncestralDiscreteScheduler {
    /// A scheduler from its config.
    pub fn new(config: EulerAncestralConfig) -> Result<EulerAncestralDiscreteScheduler> {
        if config.prediction_type == PredictionType::Sample {
            return Err(Error::Scheduler(format!(
                "{ANCESTRAL}: prediction_type `sample` is not implemented (as in diffusers); use epsilon or v_prediction"
            )));
        }
        Ok(EulerAncestralDiscreteScheduler {
            sigmas: Sigmas::new(&config.noise, ANCESTRAL, config.timestep_spacing)?,
            config,
        })
    }
}

impl Scheduler for EulerAncestralDiscreteScheduler {
    fn add_noise(&self, original: &Tensor, noise: &Tensor, step: usize) -> Result<Tensor> {
        let sigmas = self.sigmas().unwrap_or_default();
        check_step(ANCESTRAL, step, sigmas.len())?;
        super::add_noise_scaled(original, noise, 1.0, sigmas[step])
    }

    fn class_name(&self) -> &'static str {
        ANCESTRAL
    }

    fn choose_timesteps(&mut self, steps: usize) -> Result<()> {
        let c = &self.config;
        let timesteps = timesteps_f32(c.timestep_spacing, &c.noise, steps, c.steps_offset);
        let mut sigmas: Vec<f32> = timesteps
            .iter()
            .map(|&t| interp(t, &self.sigmas.train) as f32)
            .collect();
        sigmas.push(0.0);
        self.sigmas.timesteps = timesteps;
        self.sigmas.sigmas = sigmas;
        Ok(())
    }

    fn timesteps(&self) -> &[f64] {
        &self.sigmas.timesteps
    }

    fn sigmas(&self) -> Option<&[f32]> {
        Some(&self.sigmas.sigmas)
    }

    fn init_noise_sigma(&self) -> f64 {
        self.sigmas.init_noise_sigma()
    }

    fn scale_model_input(&self, sample: &Tensor, step: usize) -> Result<Tensor> {
        self.sigmas.scale_model_input(ANCESTRAL, sample, step)
    }

    fn needs_noise(&self, _step: usize) -> bool {
        true
    }

    fn step_checked(&mut self, x: StepInput<'_>) -> Result<Tensor> {
        let (model_output, step, sample, noise) = x.parts();
        let noise = require_noise(ANCESTRAL, noise, sample)?;
        let sample = sample.to_dtype(DType::F32)?;
        let (from, to) = (self.sigmas.sigmas[step], self.sigmas.sigmas[step + 1]);
        let x0 = match self.config.prediction_type {
            PredictionType::VPrediction => v_to_x0(model_output, &sample, from)?,
            _ => sample.sub(&scale(model_output, from)?)?,
        };
        let up = (to * to * (from * from - to * to) / (from * from)).sqrt();
        let down = (to * to - up * up).sqrt();
        let derivative = divide(&sample.sub(&x0)?, from)?;
        let prev = sample.add(&scale(&derivative, down - from)?)?;
        let prev = prev.add(&scale(noise, up)?)?;
        Ok(prev.to_dtype(model_output.dtype())?)
    }
}
