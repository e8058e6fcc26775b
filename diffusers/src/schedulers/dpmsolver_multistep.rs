//! `DPMSolverMultistepScheduler` (diffusers' `scheduling_dpmsolver_multistep.py`): DPM-Solver
//! and DPM-Solver++ of order 1 to 3 over the previous steps' model outputs, their SDE
//! variants, midpoint or Heun second-order terms, lower orders at the end, and every sigma
//! schedule diffusers offers (interpolated, Karras, exponential, uniform in lambda, flow).

use serde::{Deserialize, Deserializer};
use zoo_runtime::{DType, Tensor};

use super::schedule::{
    interp, karras_sigmas, linspace_f64, multistep_timesteps, sigma_to_t, BetaSchedule,
    NoiseConfig, NoiseSchedule, SigmaKind, SigmaSpacing, TimestepSpacing,
};
use super::thresholding::Thresholding;
use super::{check_step, divide, require_noise, scale, Scheduler, StepInput, TimestepOptions};
use crate::configuration::register_to_config;
use crate::{Error, Result};

const CLASS: &str = "DPMSolverMultistepScheduler";

/// `algorithm_type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
pub enum Algorithm {
    /// DPM-Solver (noise prediction).
    #[serde(rename = "dpmsolver")]
    DpmSolver,
    /// DPM-Solver++ (data prediction), diffusers' default; `deis` configs run as this.
    #[serde(rename = "dpmsolver++", alias = "deis")]
    DpmSolverPP,
    /// The SDE variant of DPM-Solver (adds noise).
    #[serde(rename = "sde-dpmsolver")]
    SdeDpmSolver,
    /// The SDE variant of DPM-Solver++ (adds noise).
    #[serde(rename = "sde-dpmsolver++")]
    SdeDpmSolverPP,
}

impl Algorithm {
    fn data_prediction(self) -> bool {
        matches!(self, Algorithm::DpmSolverPP | Algorithm::SdeDpmSolverPP)
    }
    fn sde(self) -> bool {
        matches!(self, Algorithm::SdeDpmSolver | Algorithm::SdeDpmSolverPP)
    }
}

/// `solver_type` of the second-order term.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SolverType {
    /// diffusers' default; `logrho`, `bh1`, `bh2` (UniPC's names) run as this.
    #[serde(alias = "logrho", alias = "bh1", alias = "bh2")]
    Midpoint,
    /// Heun's form.
    Heun,
}

/// `prediction_type`, with flow matching.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DpmPrediction {
    /// The noise.
    Epsilon,
    /// The clean sample.
    Sample,
    /// The velocity.
    VPrediction,
    /// A flow-matching velocity (with `use_flow_sigmas`).
    FlowPrediction,
}

impl DpmPrediction {
    /// The clean sample that `output`, the model's prediction for `sample` at noise level
    /// `sigma` (`alpha_t` and `sigma_t` its coefficients), stands for.
    pub(super) fn clean_sample(
        self,
        output: &Tensor,
        sample: &Tensor,
        sigma: f32,
        (alpha_t, sigma_t): (f32, f32),
    ) -> Result<Tensor> {
        Ok(match self {
            DpmPrediction::Epsilon => divide(&sample.sub(&scale(output, sigma_t)?)?, alpha_t)?,
            DpmPrediction::Sample => output.clone(),
            DpmPrediction::VPrediction => scale(sample, alpha_t)?.sub(&scale(output, sigma_t)?)?,
            DpmPrediction::FlowPrediction => sample.sub(&scale(output, sigma)?)?,
        })
    }

    /// The noise that `output` stands for; `None` for a flow velocity, which only the
    /// data-prediction solvers take.
    pub(super) fn noise(
        self,
        output: &Tensor,
        sample: &Tensor,
        (alpha_t, sigma_t): (f32, f32),
    ) -> Result<Option<Tensor>> {
        Ok(Some(match self {
            DpmPrediction::Epsilon => output.clone(),
            DpmPrediction::Sample => divide(&sample.sub(&scale(output, alpha_t)?)?, sigma_t)?,
            DpmPrediction::VPrediction => scale(output, alpha_t)?.add(&scale(sample, sigma_t)?)?,
            DpmPrediction::FlowPrediction => return Ok(None),
        }))
    }
}

/// `(alpha_t, sigma_t, lambda_t)` of noise level `sigma` (`_sigma_to_alpha_sigma_t`, and
/// the log-SNR `ln alpha_t - ln sigma_t`): `alpha_t = 1 - sigma` for flow sigmas, else
/// `1 / sqrt(sigma^2 + 1)`.
pub(super) fn alpha_sigma_lambda(sigma: f32, flow: bool) -> (f32, f32, f32) {
    let (alpha, sigma_t) = if flow {
        (1.0 - sigma, sigma)
    } else {
        let alpha = 1.0 / (sigma * sigma + 1.0).sqrt();
        (alpha, sigma * alpha)
    };
    (alpha, sigma_t, alpha.ln() - sigma_t.ln())
}

/// `final_sigmas_type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinalSigmas {
    /// Zero.
    Zero,
    /// The first training timestep's sigma.
    SigmaMin,
}

/// `variance_type`: whether the model also predicts a variance (ignored but for slicing).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LearnedVariance {
    /// A learned variance in the second half of the channels.
    Learned,
    /// A learned interpolation there.
    LearnedRange,
}

/// A float field that JSON from Python may write as `-Infinity` (kept as a string by
/// [`super::SchedulerConfig`]'s reader).
fn float_or_infinity<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<f64, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum F {
        N(f64),
        S(String),
    }
    match F::deserialize(d)? {
        F::N(v) => Ok(v),
        F::S(s) => match s.as_str() {
            "-Infinity" => Ok(f64::NEG_INFINITY),
            "Infinity" => Ok(f64::INFINITY),
            other => Err(serde::de::Error::custom(format!(
                "expected a number, got {other:?}"
            ))),
        },
    }
}

register_to_config! {
    /// `DPMSolverMultistepScheduler`'s config fields, with the defaults of diffusers' `__init__`
    /// (DPM-Solver++(2M)).
    pub struct DPMSolverConfig {
        /// The training schedule.
        #[serde(flatten)]
        pub noise: NoiseConfig = NoiseConfig::default(),
        /// 1, 2 or 3 (2 for guided sampling, 3 for unconditional).
        pub solver_order: usize = 2,
        /// What the model predicts.
        pub prediction_type: DpmPrediction = DpmPrediction::Epsilon,
        /// Dynamic thresholding of the predicted clean sample.
        #[serde(flatten)]
        pub thresholding: Thresholding = Thresholding::default(),
        /// The solver.
        pub algorithm_type: Algorithm = Algorithm::DpmSolverPP,
        /// The second-order term's form.
        pub solver_type: SolverType = SolverType::Midpoint,
        /// Lower orders on the last steps of short schedules (< 15 steps).
        pub lower_order_final: bool = true,
        /// A first-order last step.
        pub euler_at_final: bool = false,
        /// Karras, exponential or beta sigmas instead of the interpolated ones.
        #[serde(flatten)]
        pub spacing: SigmaSpacing = SigmaSpacing::default(),
        /// Steps uniform in log-SNR (lambda).
        pub use_lu_lambdas: Option<bool> = None,
        /// Flow-matching sigmas shifted by `flow_shift`.
        pub use_flow_sigmas: Option<bool> = None,
        /// The flow shift.
        pub flow_shift: f64 = 1.0,
        /// The noise level after the last step.
        pub final_sigmas_type: FinalSigmas = FinalSigmas::Zero,
        /// Timesteps whose lambda is below this are not used (cosine schedules).
        #[serde(deserialize_with = "float_or_infinity")]
        pub lambda_min_clipped: f64 = f64::NEG_INFINITY,
        /// A learned variance in the model's output.
        pub variance_type: Option<LearnedVariance> = None,
        /// How inference timesteps are spaced.
        pub timestep_spacing: TimestepSpacing = TimestepSpacing::Linspace,
        /// Added to `leading` timesteps.
        pub steps_offset: usize = 0,
    }
}

/// `DPMSolverMultistepScheduler`.
#[derive(Clone, Debug)]
pub struct DPMSolverMultistepScheduler {
    config: DPMSolverConfig,
    kind: SigmaKind,
    schedule: NoiseSchedule,
    timesteps: Vec<f64>,
    sigmas: Vec<f32>,
    /// The converted model outputs of the last `solver_order` steps, oldest first.
    model_outputs: Vec<Option<Tensor>>,
    lower_order_nums: usize,
    next_step: usize,
}

impl DPMSolverMultistepScheduler {
    /// A scheduler from its config.
    pub fn new(config: DPMSolverConfig) -> Result<DPMSolverMultistepScheduler> {
        let bad = |m: String| Err(Error::Scheduler(format!("{CLASS}: {m}")));
        if !(1..=3).contains(&config.solver_order) {
            return bad(format!(
                "solver_order must be 1, 2 or 3, got {}",
                config.solver_order
            ));
        }
        let kind = config.spacing.kind(CLASS)?;
        if !config.algorithm_type.data_prediction() && config.final_sigmas_type == FinalSigmas::Zero
        {
            return bad(format!(
                "final_sigmas_type zero is not supported for algorithm_type {:?}; choose sigma_min",
                config.algorithm_type
            ));
        }
        let schedule = NoiseSchedule::for_sigmas(&config.noise, CLASS)?;
        Ok(DPMSolverMultistepScheduler {
            kind,
            model_outputs: vec![None; config.solver_order],
            config,
            schedule,
            timesteps: Vec::new(),
            sigmas: Vec::new(),
            lower_order_nums: 0,
            next_step: 0,
        })
    }

    fn flow(&self) -> bool {
        self.config.use_flow_sigmas == Some(true)
    }

    fn lambda(&self, sigma: f32) -> (f32, f32, f32) {
        alpha_sigma_lambda(sigma, self.flow())
    }

    /// `convert_model_output`: the data prediction (DPM-Solver++) or noise prediction.
    fn convert(&self, model_output: &Tensor, sample: &Tensor, step: usize) -> Result<Tensor> {
        let c = &self.config;
        let sigma = self.sigmas[step];
        let (alpha_t, sigma_t, _) = self.lambda(sigma);
        let output = if c.variance_type.is_some() && c.prediction_type == DpmPrediction::Epsilon {
            model_output.narrow(1, 0, 3)?
        } else {
            model_output.clone()
        };
        let pred = c.prediction_type;
        if c.algorithm_type.data_prediction() {
            let x0 = pred.clean_sample(&output, sample, sigma, (alpha_t, sigma_t))?;
            return c.thresholding.apply(x0);
        }
        let eps = pred
            .noise(&output, sample, (alpha_t, sigma_t))?
            .ok_or_else(|| {
                Error::Scheduler(format!(
                    "{CLASS}: prediction_type flow_prediction needs algorithm_type dpmsolver++"
                ))
            })?;
        if c.thresholding.thresholding {
            let x0 = divide(&sample.sub(&scale(&eps, sigma_t)?)?, alpha_t)?;
            let x0 = c.thresholding.apply(x0)?;
            return divide(&sample.sub(&scale(&x0, alpha_t)?)?, sigma_t);
        }
        Ok(eps)
    }

    /// The order-1 update (DDIM in lambda).
    fn first_order(
        &self,
        m: &Tensor,
        sample: &Tensor,
        step: usize,
        noise: Option<&Tensor>,
    ) -> Result<Tensor> {
        let (alpha_t, sigma_t, lambda_t) = self.lambda(self.sigmas[step + 1]);
        let (alpha_s, sigma_s, lambda_s) = self.lambda(self.sigmas[step]);
        let h = lambda_t - lambda_s;
        Ok(match self.config.algorithm_type {
            Algorithm::DpmSolverPP => {
                scale(sample, sigma_t / sigma_s)?.sub(&scale(m, alpha_t * ((-h).exp() - 1.0))?)?
            }
            Algorithm::DpmSolver => {
                scale(sample, alpha_t / alpha_s)?.sub(&scale(m, sigma_t * (h.exp() - 1.0))?)?
            }
            Algorithm::SdeDpmSolverPP => {
                let n = require_noise(CLASS, noise, sample)?;
                scale(sample, sigma_t / sigma_s * (-h).exp())?
                    .add(&scale(m, alpha_t * (1.0 - (-2.0 * h).exp()))?)?
                    .add(&scale(n, sigma_t * (1.0 - (-2.0 * h).exp()).sqrt())?)?
            }
            Algorithm::SdeDpmSolver => {
                let n = require_noise(CLASS, noise, sample)?;
                scale(sample, alpha_t / alpha_s)?
                    .sub(&scale(m, 2.0 * (sigma_t * (h.exp() - 1.0)))?)?
                    .add(&scale(n, sigma_t * ((2.0 * h).exp() - 1.0).sqrt())?)?
            }
        })
    }

    /// The multistep order-2 update from the last two model outputs.
    fn second_order(&self, sample: &Tensor, step: usize, noise: Option<&Tensor>) -> Result<Tensor> {
        let (alpha_t, sigma_t, lambda_t) = self.lambda(self.sigmas[step + 1]);
        let (alpha_s0, sigma_s0, lambda_s0) = self.lambda(self.sigmas[step]);
        let (_, _, lambda_s1) = self.lambda(self.sigmas[step - 1]);
        let k = self.model_outputs.len();
        let (m0, m1) = (self.output(k - 1)?, self.output(k - 2)?);
        let (h, h0) = (lambda_t - lambda_s0, lambda_s0 - lambda_s1);
        let r0 = h0 / h;
        let d0 = m0;
        let d1 = scale(&m0.sub(m1)?, 1.0 / r0)?;
        let heun = self.config.solver_type == SolverType::Heun;
        let em = (-h).exp() - 1.0;
        let ep = h.exp() - 1.0;
        Ok(match self.config.algorithm_type {
            Algorithm::DpmSolverPP => {
                let x = scale(sample, sigma_t / sigma_s0)?.sub(&scale(d0, alpha_t * em)?)?;
                if heun {
                    x.add(&scale(&d1, alpha_t * (em / h + 1.0))?)?
                } else {
                    x.sub(&scale(&d1, 0.5 * (alpha_t * em))?)?
                }
            }
            Algorithm::DpmSolver => {
                let x = scale(sample, alpha_t / alpha_s0)?.sub(&scale(d0, sigma_t * ep)?)?;
                if heun {
                    x.sub(&scale(&d1, sigma_t * (ep / h - 1.0))?)?
                } else {
                    x.sub(&scale(&d1, 0.5 * (sigma_t * ep))?)?
                }
            }
            Algorithm::SdeDpmSolverPP => {
                let n = require_noise(CLASS, noise, sample)?;
                let e2 = 1.0 - (-2.0 * h).exp();
                let x = scale(sample, sigma_t / sigma_s0 * (-h).exp())?
                    .add(&scale(d0, alpha_t * e2)?)?;
                let x = if heun {
                    x.add(&scale(&d1, alpha_t * (e2 / (-2.0 * h) + 1.0))?)?
                } else {
                    x.add(&scale(&d1, 0.5 * (alpha_t * e2))?)?
                };
                x.add(&scale(n, sigma_t * (1.0 - (-2.0 * h).exp()).sqrt())?)?
            }
            Algorithm::SdeDpmSolver => {
                let n = require_noise(CLASS, noise, sample)?;
                let x =
                    scale(sample, alpha_t / alpha_s0)?.sub(&scale(d0, 2.0 * (sigma_t * ep))?)?;
                let x = if heun {
                    x.sub(&scale(&d1, 2.0 * (sigma_t * (ep / h - 1.0)))?)?
                } else {
                    x.sub(&scale(&d1, sigma_t * ep)?)?
                };
                x.add(&scale(n, sigma_t * ((2.0 * h).exp() - 1.0).sqrt())?)?
            }
        })
    }

    /// The multistep order-3 update from the last three model outputs.
    fn third_order(&self, sample: &Tensor, step: usize, noise: Option<&Tensor>) -> Result<Tensor> {
        let (alpha_t, sigma_t, lambda_t) = self.lambda(self.sigmas[step + 1]);
        let (alpha_s0, sigma_s0, lambda_s0) = self.lambda(self.sigmas[step]);
        let (_, _, lambda_s1) = self.lambda(self.sigmas[step - 1]);
        let (_, _, lambda_s2) = self.lambda(self.sigmas[step - 2]);
        let k = self.model_outputs.len();
        let (m0, m1, m2) = (
            self.output(k - 1)?,
            self.output(k - 2)?,
            self.output(k - 3)?,
        );
        let (h, h0, h1) = (
            lambda_t - lambda_s0,
            lambda_s0 - lambda_s1,
            lambda_s1 - lambda_s2,
        );
        let (r0, r1) = (h0 / h, h1 / h);
        let d0 = m0;
        let d1_0 = scale(&m0.sub(m1)?, 1.0 / r0)?;
        let d1_1 = scale(&m1.sub(m2)?, 1.0 / r1)?;
        let diff = d1_0.sub(&d1_1)?;
        let d1 = d1_0.add(&scale(&diff, r0 / (r0 + r1))?)?;
        let d2 = scale(&diff, 1.0 / (r0 + r1))?;
        Ok(match self.config.algorithm_type {
            Algorithm::DpmSolverPP => {
                let em = (-h).exp() - 1.0;
                scale(sample, sigma_t / sigma_s0)?
                    .sub(&scale(d0, alpha_t * em)?)?
                    .add(&scale(&d1, alpha_t * (em / h + 1.0))?)?
                    .sub(&scale(&d2, alpha_t * ((em + h) / (h * h) - 0.5))?)?
            }
            Algorithm::DpmSolver => {
                let ep = h.exp() - 1.0;
                scale(sample, alpha_t / alpha_s0)?
                    .sub(&scale(d0, sigma_t * ep)?)?
                    .sub(&scale(&d1, sigma_t * (ep / h - 1.0))?)?
                    .sub(&scale(&d2, sigma_t * ((ep - h) / (h * h) - 0.5))?)?
            }
            Algorithm::SdeDpmSolverPP => {
                let n = require_noise(CLASS, noise, sample)?;
                let e2 = 1.0 - (-2.0 * h).exp();
                scale(sample, sigma_t / sigma_s0 * (-h).exp())?
                    .add(&scale(d0, alpha_t * e2)?)?
                    .add(&scale(&d1, alpha_t * (e2 / (-2.0 * h) + 1.0))?)?
                    .add(&scale(
                        &d2,
                        alpha_t * ((e2 - 2.0 * h) / ((2.0 * h) * (2.0 * h)) - 0.5),
                    )?)?
                    .add(&scale(n, sigma_t * (1.0 - (-2.0 * h).exp()).sqrt())?)?
            }
            Algorithm::SdeDpmSolver => {
                return Err(Error::Scheduler(format!(
                "{CLASS}: solver_order 3 is not defined for sde-dpmsolver (as in diffusers); use 2"
            )))
            }
        })
    }

    fn output(&self, i: usize) -> Result<&Tensor> {
        self.model_outputs[i].as_ref().ok_or_else(|| {
            Error::Scheduler(format!(
                "{CLASS}: a multistep update ran before its earlier steps"
            ))
        })
    }
}

impl Scheduler for DPMSolverMultistepScheduler {
    fn add_noise(&self, original: &Tensor, noise: &Tensor, step: usize) -> Result<Tensor> {
        check_step(CLASS, step, self.timesteps.len())?;
        let (alpha, sigma, _) = self.lambda(self.sigmas[step]);
        super::add_noise_scaled(original, noise, alpha, sigma)
    }

    fn restart_at(&mut self, begin: usize) {
        self.next_step = begin;
    }

    fn class_name(&self) -> &'static str {
        CLASS
    }

    fn choose_timesteps(&mut self, steps: usize) -> Result<()> {
        let c = &self.config;
        let train = c.noise.num_train_timesteps;
        let ac = &self.schedule.alphas_cumprod;
        // lambda_t = log(sqrt(ac)) - log(sqrt(1 - ac)), float32; searchsorted on its reverse.
        let lambdas: Vec<f32> = ac
            .iter()
            .map(|a| a.sqrt().ln() - (1.0 - a).sqrt().ln())
            .rev()
            .collect();
        let clipped = lambdas
            .iter()
            .position(|&l| l as f64 >= c.lambda_min_clipped)
            .unwrap_or(lambdas.len());
        let last = train - clipped;
        let timesteps = multistep_timesteps(c.timestep_spacing, train, last, steps, c.steps_offset);
        self.schedule(steps, timesteps)
    }

    fn set_timesteps_with(&mut self, steps: usize, options: &TimestepOptions) -> Result<()> {
        if options.mu.is_some() || options.sigmas.is_some() {
            return Err(Error::Scheduler(format!(
                "{CLASS}: takes custom timesteps, not custom sigmas or `mu`"
            )));
        }
        let Some(n) = options.custom_steps(CLASS, steps, true)? else {
            return self.set_timesteps(steps);
        };
        let given = options.timesteps.as_deref().unwrap_or_default();
        if let Some(bad) = given.iter().find(|t| !t.is_finite() || **t < 0.0) {
            return Err(Error::Scheduler(format!(
                "{CLASS}: custom timesteps must be finite and not negative, got {bad}"
            )));
        }
        if self.kind != SigmaKind::Interpolated
            || self.config.use_lu_lambdas == Some(true)
            || self.flow()
        {
            return Err(Error::Scheduler(format!(
                "{CLASS}: custom timesteps take the interpolated sigmas; the config asks for Karras, exponential, beta, lambda-uniform or flow sigmas"
            )));
        }
        // As numpy's int64 cast: truncated.
        self.schedule(n, given.iter().map(|t| t.trunc()).collect())
    }

    fn timesteps(&self) -> &[f64] {
        &self.timesteps
    }

    fn sigmas(&self) -> Option<&[f32]> {
        Some(&self.sigmas)
    }

    fn needs_noise(&self, _step: usize) -> bool {
        self.config.algorithm_type.sde()
    }

    fn step_checked(&mut self, x: StepInput<'_>) -> Result<Tensor> {
        let (model_output, step, sample, noise) = x.parts();
        let n = self.timesteps.len();
        super::check_order(CLASS, step, self.next_step)?;
        let c = &self.config;
        let short = n < 15;
        let lower_final = step == n - 1
            && (c.euler_at_final
                || (c.lower_order_final && short)
                || c.final_sigmas_type == FinalSigmas::Zero);
        let lower_second = step + 2 == n && c.lower_order_final && short;
        let converted = self.convert(model_output, sample, step)?;
        self.model_outputs.remove(0);
        self.model_outputs.push(Some(converted.clone()));
        let sample = sample.to_dtype(DType::F32)?;
        let noise = match noise {
            Some(t) => Some(t.to_dtype(DType::F32)?),
            None => None,
        };
        let order = self.config.solver_order;
        let prev = if order == 1 || self.lower_order_nums < 1 || lower_final {
            self.first_order(&converted, &sample, step, noise.as_ref())?
        } else if order == 2 || self.lower_order_nums < 2 || lower_second {
            self.second_order(&sample, step, noise.as_ref())?
        } else {
            self.third_order(&sample, step, noise.as_ref())?
        };
        if self.lower_order_nums < order {
            self.lower_order_nums += 1;
        }
        self.next_step += 1;
        Ok(prev.to_dtype(model_output.dtype())?)
    }
}

impl DPMSolverMultistepScheduler {
    /// The sigmas of `steps` steps at `timesteps` (interpolated, or the config's Karras,
    /// lambda-uniform, exponential, beta or flow ones with their own timesteps), the final
    /// sigma, and a fresh multistep history.
    fn schedule(&mut self, steps: usize, mut timesteps: Vec<f64>) -> Result<()> {
        let c = &self.config;
        let train = c.noise.num_train_timesteps;
        let ac = &self.schedule.alphas_cumprod;
        let train_sigmas = self.schedule.sigmas();
        let log_sigmas: Vec<f32> = train_sigmas.iter().map(|s| s.ln()).collect();
        let descending = || -> (f64, f64) {
            (
                *train_sigmas.first().unwrap() as f64,
                *train_sigmas.last().unwrap() as f64,
            )
        };
        let round = c.noise.beta_schedule != BetaSchedule::SquaredcosCapV2;
        let to_t = |sigmas: &[f64], round: bool| -> Vec<f64> {
            sigmas
                .iter()
                .map(|&s| {
                    let t = sigma_to_t(s, &log_sigmas);
                    if round {
                        t.round_ties_even()
                    } else {
                        t
                    }
                })
                .collect()
        };
        let sigmas: Vec<f64> = if self.kind == SigmaKind::Karras {
            let (smin, smax) = descending();
            let s = karras_sigmas(smin, smax, steps);
            timesteps = to_t(&s, round);
            s
        } else if c.use_lu_lambdas == Some(true) {
            let (lmax, lmin) = (
                *log_sigmas.last().unwrap() as f64,
                *log_sigmas.first().unwrap() as f64,
            );
            let s: Vec<f64> = linspace_f64(0.0, 1.0, steps)
                .into_iter()
                .map(|r| (lmax + r * (lmin - lmax)).exp())
                .collect();
            timesteps = to_t(&s, round);
            s
        } else if matches!(self.kind, SigmaKind::Exponential | SigmaKind::Beta) {
            // Neither rounds its timesteps (diffusers' `.round()` is Karras' and lu's only).
            let (smin, smax) = descending();
            let s = self.kind.spaced(smin, smax, steps).unwrap_or_default();
            timesteps = to_t(&s, false);
            s
        } else if self.flow() {
            let shift = c.flow_shift;
            let mut s: Vec<f64> = linspace_f64(1.0, 1.0 / train as f64, steps + 1)
                .into_iter()
                .map(|a| {
                    let s = 1.0 - a;
                    shift * s / (1.0 + (shift - 1.0) * s)
                })
                .collect();
            s.reverse();
            s.pop();
            timesteps = s.iter().map(|v| v * train as f64).collect();
            s
        } else {
            timesteps
                .iter()
                .map(|&t| interp(t, &train_sigmas))
                .collect()
        };
        let sigma_last = match c.final_sigmas_type {
            FinalSigmas::Zero => 0.0,
            FinalSigmas::SigmaMin => {
                let a = ac[0];
                ((1.0 - a) / a).sqrt() as f64
            }
        };
        let mut sigmas: Vec<f32> = sigmas.into_iter().map(|v| v as f32).collect();
        sigmas.push(sigma_last as f32);
        // torch's int64 cast truncates toward zero.
        self.timesteps = timesteps.into_iter().map(|t| t.trunc()).collect();
        self.sigmas = sigmas;
        self.model_outputs = vec![None; c.solver_order];
        self.lower_order_nums = 0;
        self.next_step = 0;
        Ok(())
    }
}
