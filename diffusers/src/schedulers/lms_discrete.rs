//! `LMSDiscreteScheduler` (diffusers' `scheduling_lms_discrete.py`): linear multistep over the
//! last four derivatives, each weighted by the integral of its Lagrange basis polynomial in
//! sigma between this step's sigma and the next.

use zoo_runtime::Tensor;

use super::schedule::{
    interp, sigma_to_t, spaced_timesteps, NoiseConfig, NoiseSchedule, PredictionType, SigmaKind,
    SigmaSpacing, TimestepSpacing,
};
use super::{check_step, divide, scale, Scheduler, StepInput};
use crate::configuration::register_to_config;
use crate::Result;

const CLASS: &str = "LMSDiscreteScheduler";
/// The multistep order pipelines step with (`step(..., order=4)`).
const ORDER: usize = 4;

register_to_config! {
    /// `LMSDiscreteScheduler`'s config fields, with the defaults of diffusers' `__init__`.
    pub struct LMSConfig {
        /// The training schedule.
        #[serde(flatten)]
        pub noise: NoiseConfig = NoiseConfig::default(),
        /// Karras, exponential or beta sigmas instead of the interpolated ones.
        #[serde(flatten)]
        pub spacing: SigmaSpacing = SigmaSpacing::default(),
        /// What the model predicts.
        pub prediction_type: PredictionType = PredictionType::Epsilon,
        /// How inference timesteps are spaced.
        pub timestep_spacing: TimestepSpacing = TimestepSpacing::Linspace,
        /// Added to `leading` timesteps.
        pub steps_offset: usize = 0,
    }
}

/// `LMSDiscreteScheduler`.
#[derive(Clone, Debug)]
pub struct LMSDiscreteScheduler {
    config: LMSConfig,
    kind: SigmaKind,
    train: Vec<f32>,
    timesteps: Vec<f64>,
    sigmas: Vec<f32>,
    derivatives: Vec<Tensor>,
    next_step: usize,
}

/// Nodes and weights of `n`-point Gauss-Legendre quadrature on [-1, 1] (Newton on the
/// Legendre polynomial), exact for polynomials of degree below `2n`.
fn gauss_legendre(n: usize) -> Vec<(f64, f64)> {
    (0..n)
        .map(|i| {
            let mut x = (std::f64::consts::PI * (i as f64 + 0.75) / (n as f64 + 0.5)).cos();
            let mut dp = 1.0;
            for _ in 0..100 {
                let (mut p0, mut p1) = (1.0, x);
                for k in 2..=n {
                    let p2 = ((2 * k - 1) as f64 * x * p1 - (k - 1) as f64 * p0) / k as f64;
                    p0 = p1;
                    p1 = p2;
                }
                dp = n as f64 * (x * p1 - p0) / (x * x - 1.0);
                let dx = p1 / dp;
                x -= dx;
                if dx.abs() < 1e-16 {
                    break;
                }
            }
            (x, 2.0 / ((1.0 - x * x) * dp * dp))
        })
        .collect()
}

impl LMSDiscreteScheduler {
    /// A scheduler from its config.
    pub fn new(config: LMSConfig) -> Result<LMSDiscreteScheduler> {
        let kind = config.spacing.kind(CLASS)?;
        let schedule = NoiseSchedule::new(&config.noise, CLASS, false)?;
        Ok(LMSDiscreteScheduler {
            kind,
            train: schedule.sigmas(),
            config,
            timesteps: Vec::new(),
            sigmas: Vec::new(),
            derivatives: Vec::new(),
            next_step: 0,
        })
    }

    /// `get_lms_coefficient`: the integral from sigma[t] to sigma[t + 1] of the Lagrange
    /// basis polynomial of derivative `current` among the last `order` sigmas.
    fn coefficient(&self, order: usize, t: usize, current: usize) -> f64 {
        let s = |i: usize| self.sigmas[i] as f64;
        let basis = |tau: f64| -> f64 {
            (0..order)
                .filter(|&k| k != current)
                .map(|k| (tau - s(t - k)) / (s(t - current) - s(t - k)))
                .product()
        };
        let (a, b) = (s(t), s(t + 1));
        let (mid, half) = ((a + b) / 2.0, (b - a) / 2.0);
        gauss_legendre(ORDER)
            .into_iter()
            .map(|(x, w)| w * basis(mid + half * x))
            .sum::<f64>()
            * half
    }
}

impl Scheduler for LMSDiscreteScheduler {
    fn add_noise(&self, original: &Tensor, noise: &Tensor, step: usize) -> Result<Tensor> {
        let sigmas = self.sigmas().unwrap_or_default();
        check_step(CLASS, step, sigmas.len())?;
        super::add_noise_scaled(original, noise, 1.0, sigmas[step])
    }

    fn restart_at(&mut self, begin: usize) {
        self.next_step = begin;
    }

    fn class_name(&self) -> &'static str {
        CLASS
    }

    fn choose_timesteps(&mut self, steps: usize) -> Result<()> {
        let c = &self.config;
        let mut timesteps: Vec<f64> = spaced_timesteps(
            c.timestep_spacing,
            c.noise.num_train_timesteps,
            steps,
            c.steps_offset,
            false,
        )
        .into_iter()
        .map(|t| t as f32 as f64)
        .collect();
        let log_sigmas: Vec<f32> = self.train.iter().map(|v| v.ln()).collect();
        let mut sigmas: Vec<f64> = timesteps.iter().map(|&t| interp(t, &self.train)).collect();
        let (smin, smax) = (*sigmas.last().unwrap_or(&0.0), sigmas[0]);
        if let Some(spaced) = self.kind.spaced(smin, smax, steps) {
            sigmas = spaced;
            timesteps = sigmas
                .iter()
                .map(|&s| sigma_to_t(s, &log_sigmas) as f32 as f64)
                .collect();
        }
        let mut sigmas: Vec<f32> = sigmas.into_iter().map(|v| v as f32).collect();
        sigmas.push(0.0);
        self.timesteps = timesteps;
        self.sigmas = sigmas;
        self.derivatives.clear();
        self.next_step = 0;
        Ok(())
    }

    fn timesteps(&self) -> &[f64] {
        &self.timesteps
    }

    fn sigmas(&self) -> Option<&[f32]> {
        Some(&self.sigmas)
    }

    fn init_noise_sigma(&self) -> f64 {
        let max = self.sigmas.iter().copied().fold(0.0f32, f32::max);
        self.config.timestep_spacing.init_noise_sigma(max)
    }

    fn scale_model_input(&self, sample: &Tensor, step: usize) -> Result<Tensor> {
        super::scale_by_sigma(CLASS, sample, &self.sigmas, self.timesteps.len(), step)
    }

    fn step_checked(&mut self, x: StepInput<'_>) -> Result<Tensor> {
        let (model_output, step, sample, _) = x.parts();
        super::check_order(CLASS, step, self.next_step)?;
        let sigma = self.sigmas[step];
        let x0 = match self.config.prediction_type {
            PredictionType::Epsilon => sample.sub(&scale(model_output, sigma)?)?,
            PredictionType::VPrediction => {
                let s2 = sigma * sigma + 1.0;
                scale(model_output, -sigma / s2.sqrt())?.add(&divide(sample, s2)?)?
            }
            PredictionType::Sample => model_output.to_dtype(sample.dtype())?,
        };
        self.derivatives.push(divide(&sample.sub(&x0)?, sigma)?);
        if self.derivatives.len() > ORDER {
            self.derivatives.remove(0);
        }
        let order = (step + 1).min(ORDER);
        let mut prev = sample.clone();
        for (current, d) in self.derivatives.iter().rev().enumerate().take(order) {
            let c = self.coefficient(order, step, current) as f32;
            prev = prev.add(&scale(d, c)?)?;
        }
        self.next_step += 1;
        Ok(prev)
    }
}
