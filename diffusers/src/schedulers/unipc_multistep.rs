//! `UniPCMultistepScheduler` (diffusers' `scheduling_unipc_multistep.py`): the UniPC
//! predictor of order up to `solver_order` over the previous model outputs, and its
//! corrector (UniC) applied to each sample once the model has seen it, in the `bh1` or `bh2`
//! form, predicting data or noise, over interpolated, Karras, exponential or flow sigmas.

use serde::Deserialize;
use zoo_runtime::Tensor;

use super::dpmsolver_multistep::{alpha_sigma_lambda, DpmPrediction, FinalSigmas};
use super::schedule::{
    interp, linspace_f64, multistep_timesteps, sigma_to_t, NoiseConfig, NoiseSchedule, SigmaKind,
    SigmaSpacing, TimestepSpacing,
};
use super::thresholding::Thresholding;
use super::{check_step, divide, scale, Scheduler, StepInput};
use crate::configuration::register_to_config;
use crate::{Error, Result};

const CLASS: &str = "UniPCMultistepScheduler";

/// `solver_type`: the B(h) of the UniPC updates.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UniPCSolver {
    /// `B(h) = h` (unconditional sampling).
    Bh1,
    /// `B(h) = expm1(h)`, diffusers' default; DPM-Solver's names run as this.
    #[serde(alias = "midpoint", alias = "heun", alias = "logrho")]
    Bh2,
}

register_to_config! {
    /// `UniPCMultistepScheduler`'s config fields, with the defaults of diffusers' `__init__`
    /// (the `bh2` predictor of order 2).
    pub struct UniPCConfig {
        /// The training schedule.
        #[serde(flatten)]
        pub noise: NoiseConfig = NoiseConfig::default(),
        /// The predictor's order (the corrector's is one more).
        pub solver_order: usize = 2,
        /// What the model predicts.
        pub prediction_type: DpmPrediction = DpmPrediction::Epsilon,
        /// Dynamic thresholding of the predicted clean sample.
        #[serde(flatten)]
        pub thresholding: Thresholding = Thresholding::default(),
        /// Update the data prediction (true) or the noise prediction.
        pub predict_x0: bool = true,
        /// The B(h) form.
        pub solver_type: UniPCSolver = UniPCSolver::Bh2,
        /// Lower orders on the last steps.
        pub lower_order_final: bool = true,
        /// Steps whose sample is not corrected.
        pub disable_corrector: Vec<usize> = Vec::new(),
        /// Karras, exponential or beta sigmas instead of the interpolated ones.
        #[serde(flatten)]
        pub spacing: SigmaSpacing = SigmaSpacing::default(),
        /// Flow-matching sigmas shifted by `flow_shift`.
        pub use_flow_sigmas: Option<bool> = None,
        /// The flow shift.
        pub flow_shift: f64 = 1.0,
        /// How inference timesteps are spaced.
        pub timestep_spacing: TimestepSpacing = TimestepSpacing::Linspace,
        /// Added to `leading` timesteps.
        pub steps_offset: usize = 0,
        /// The noise level after the last step.
        pub final_sigmas_type: FinalSigmas = FinalSigmas::Zero,
        /// A resolution-dependent shift (`mu`), which flow pipelines pass.
        pub use_dynamic_shifting: bool = false,
        /// Smallest Karras / exponential sigma (default: the schedule's).
        pub sigma_min: Option<f64> = None,
        /// Largest Karras / exponential sigma (default: the schedule's).
        pub sigma_max: Option<f64> = None,
        /// Stretch flow sigmas to end at this value.
        pub shift_terminal: Option<f64> = None,
    }
}

/// `UniPCMultistepScheduler`.
#[derive(Clone, Debug)]
pub struct UniPCMultistepScheduler {
    config: UniPCConfig,
    kind: SigmaKind,
    schedule: NoiseSchedule,
    timesteps: Vec<f64>,
    sigmas: Vec<f32>,
    /// Converted model outputs of the last `solver_order` steps, oldest first.
    model_outputs: Vec<Option<Tensor>>,
    lower_order_nums: usize,
    this_order: usize,
    last_sample: Option<Tensor>,
    next_step: usize,
}

/// What both UniPC updates compute from the sigmas and the history.
struct Terms {
    h_phi_1: f32,
    b_h: f32,
    rks: Vec<f32>,
    d1s: Vec<Tensor>,
    b: Vec<f32>,
}

/// Solves `a x = b` (n <= 3) by Gaussian elimination with partial pivoting in f32, as
/// `torch.linalg.solve` does on float32 tensors.
fn solve(mut a: Vec<Vec<f32>>, mut b: Vec<f32>) -> Result<Vec<f32>> {
    let n = b.len();
    for col in 0..n {
        let pivot = (col..n)
            .max_by(|&i, &j| a[i][col].abs().total_cmp(&a[j][col].abs()))
            .unwrap_or(col);
        if a[pivot][col] == 0.0 {
            return Err(Error::Scheduler(format!(
                "{CLASS}: the UniPC coefficients' system is singular (repeated sigmas?)"
            )));
        }
        a.swap(col, pivot);
        b.swap(col, pivot);
        let pivot_row = a[col].clone();
        for row in col + 1..n {
            let f = a[row][col] / pivot_row[col];
            for (x, p) in a[row][col..].iter_mut().zip(&pivot_row[col..]) {
                *x -= f * p;
            }
            b[row] -= f * b[col];
        }
    }
    let mut x = vec![0f32; n];
    for row in (0..n).rev() {
        let s: f32 = (row + 1..n).map(|k| a[row][k] * x[k]).sum();
        x[row] = (b[row] - s) / a[row][row];
    }
    Ok(x)
}

impl UniPCMultistepScheduler {
    /// A scheduler from its config.
    pub fn new(config: UniPCConfig) -> Result<UniPCMultistepScheduler> {
        if config.solver_order == 0 {
            return Err(Error::Scheduler(format!(
                "{CLASS}: solver_order must be at least 1"
            )));
        }
        if config.use_dynamic_shifting {
            return Err(Error::Scheduler(format!(
                "{CLASS}: use_dynamic_shifting needs the pipeline's `mu`, which zoo's flow pipelines do not pass yet; set it false"
            )));
        }
        if config.shift_terminal.is_some() && config.use_flow_sigmas != Some(true) {
            return Err(Error::Scheduler(format!(
                "{CLASS}: shift_terminal applies to flow sigmas only (use_flow_sigmas)"
            )));
        }
        let kind = config.spacing.kind(CLASS)?;
        let schedule = NoiseSchedule::for_sigmas(&config.noise, CLASS)?;
        Ok(UniPCMultistepScheduler {
            model_outputs: vec![None; config.solver_order],
            config,
            kind,
            schedule,
            timesteps: Vec::new(),
            sigmas: Vec::new(),
            lower_order_nums: 0,
            this_order: 0,
            last_sample: None,
            next_step: 0,
        })
    }

    fn flow(&self) -> bool {
        self.config.use_flow_sigmas == Some(true)
    }

    /// `(alpha, sigma, lambda)` of noise level `s`.
    fn lambda(&self, s: f32) -> (f32, f32, f32) {
        alpha_sigma_lambda(s, self.flow())
    }

    fn convert(&self, output: &Tensor, sample: &Tensor, step: usize) -> Result<Tensor> {
        let c = &self.config;
        let sigma = self.sigmas[step];
        let (alpha_t, sigma_t, _) = self.lambda(sigma);
        let pred = c.prediction_type;
        if c.predict_x0 {
            let x0 = pred.clean_sample(output, sample, sigma, (alpha_t, sigma_t))?;
            return c.thresholding.apply(x0);
        }
        pred.noise(output, sample, (alpha_t, sigma_t))?
            .ok_or_else(|| {
                Error::Scheduler(format!(
                    "{CLASS}: prediction_type flow_prediction needs predict_x0"
                ))
            })
    }

    fn output(&self, back: usize) -> Result<&Tensor> {
        let k = self.model_outputs.len();
        self.model_outputs[k - 1 - back].as_ref().ok_or_else(|| {
            Error::Scheduler(format!(
                "{CLASS}: a multistep update ran before its earlier steps"
            ))
        })
    }

    /// `h_phi_1`, `B_h`, `rks`, `D1s` and `b` of an update of `order` from noise level
    /// index `s0` to `t`; the history's sigmas are at `s0 - 1, s0 - 2, ..` (the corrector
    /// runs a step later than the predictor, with the same history).
    fn terms(&self, t: usize, s0: usize, order: usize) -> Result<Terms> {
        let (_, _, lambda_t) = self.lambda(self.sigmas[t]);
        let (_, _, lambda_s0) = self.lambda(self.sigmas[s0]);
        let h = lambda_t - lambda_s0;
        let m0 = self.output(0)?;
        let mut rks = Vec::with_capacity(order);
        let mut d1s = Vec::with_capacity(order);
        for i in 1..order {
            let (_, _, lambda_si) = self.lambda(self.sigmas[s0 - i]);
            let rk = (lambda_si - lambda_s0) / h;
            rks.push(rk);
            d1s.push(divide(&self.output(i)?.sub(m0)?, rk)?);
        }
        rks.push(1.0);
        let hh = if self.config.predict_x0 { -h } else { h };
        let h_phi_1 = hh.exp_m1();
        let mut h_phi_k = h_phi_1 / hh - 1.0;
        let mut factorial = 1.0f32;
        let b_h = match self.config.solver_type {
            UniPCSolver::Bh1 => hh,
            UniPCSolver::Bh2 => hh.exp_m1(),
        };
        let mut b = Vec::with_capacity(order);
        for i in 1..=order {
            b.push(h_phi_k * factorial / b_h);
            factorial *= (i + 1) as f32;
            h_phi_k = h_phi_k / hh - 1.0 / factorial;
        }
        Ok(Terms {
            h_phi_1,
            b_h,
            rks,
            d1s,
            b,
        })
    }

    /// `sum_k rho_k D1_k`.
    fn combine(rhos: &[f32], d1s: &[Tensor]) -> Result<Option<Tensor>> {
        let mut acc: Option<Tensor> = None;
        for (r, d) in rhos.iter().zip(d1s) {
            let term = scale(d, *r)?;
            acc = Some(match acc {
                Some(a) => a.add(&term)?,
                None => term,
            });
        }
        Ok(acc)
    }

    /// The base of both updates: `sigma_t / sigma_s0 * x - alpha_t * h_phi_1 * m0` (data
    /// prediction) or `alpha_t / alpha_s0 * x - sigma_t * h_phi_1 * m0`, and the factor of
    /// the correction term.
    fn base(
        &self,
        x: &Tensor,
        t: usize,
        s0: usize,
        h_phi_1: f32,
        b_h: f32,
    ) -> Result<(Tensor, f32)> {
        let (alpha_t, sigma_t, _) = self.lambda(self.sigmas[t]);
        let (alpha_s0, sigma_s0, _) = self.lambda(self.sigmas[s0]);
        let m0 = self.output(0)?;
        Ok(if self.config.predict_x0 {
            (
                scale(x, sigma_t / sigma_s0)?.sub(&scale(m0, alpha_t * h_phi_1)?)?,
                alpha_t * b_h,
            )
        } else {
            (
                scale(x, alpha_t / alpha_s0)?.sub(&scale(m0, sigma_t * h_phi_1)?)?,
                sigma_t * b_h,
            )
        })
    }

    /// `multistep_uni_p_bh_update`: the predictor from step `step` to the next.
    fn predict(&self, x: &Tensor, step: usize, order: usize) -> Result<Tensor> {
        let Terms {
            h_phi_1,
            b_h,
            rks,
            d1s,
            b,
        } = self.terms(step + 1, step, order)?;
        let (x_t, factor) = self.base(x, step + 1, step, h_phi_1, b_h)?;
        let rhos: Vec<f32> = match d1s.len() {
            0 => Vec::new(),
            _ if order == 2 => vec![0.5],
            _ => {
                let m = order - 1;
                let r: Vec<Vec<f32>> = (0..m)
                    .map(|i| rks[..m].iter().map(|rk| rk.powi(i as i32)).collect())
                    .collect();
                solve(r, b[..m].to_vec())?
            }
        };
        Ok(match Self::combine(&rhos, &d1s)? {
            Some(res) => x_t.sub(&scale(&res, factor)?)?,
            None => x_t,
        })
    }

    /// `multistep_uni_c_bh_update`: corrects the sample of step `step` (predicted at the
    /// last step from `last`) with the model's output at it.
    fn correct(
        &self,
        model_t: &Tensor,
        last: &Tensor,
        step: usize,
        order: usize,
    ) -> Result<Tensor> {
        let Terms {
            h_phi_1,
            b_h,
            rks,
            d1s,
            b,
        } = self.terms(step, step - 1, order)?;
        let (x_t, factor) = self.base(last, step, step - 1, h_phi_1, b_h)?;
        let rhos: Vec<f32> = if order == 1 {
            vec![0.5]
        } else {
            let r: Vec<Vec<f32>> = (0..order)
                .map(|i| rks.iter().map(|rk| rk.powi(i as i32)).collect())
                .collect();
            solve(r, b)?
        };
        let (last_rho, rest) = rhos.split_last().expect("at least one coefficient");
        let d1_t = model_t.sub(self.output(0)?)?;
        let mut res = scale(&d1_t, *last_rho)?;
        if let Some(c) = Self::combine(rest, &d1s)? {
            res = c.add(&res)?;
        }
        Ok(x_t.sub(&scale(&res, factor)?)?)
    }
}

impl Scheduler for UniPCMultistepScheduler {
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
        let mut timesteps =
            multistep_timesteps(c.timestep_spacing, train, train, steps, c.steps_offset);
        let train_sigmas = self.schedule.sigmas();
        let log_sigmas: Vec<f32> = train_sigmas.iter().map(|s| s.ln()).collect();
        let (smin, smax) = (
            c.sigma_min.unwrap_or(train_sigmas[0] as f64),
            c.sigma_max.unwrap_or(*train_sigmas.last().unwrap() as f64),
        );
        let sigma_min_last = |sigmas: &[f64]| match c.final_sigmas_type {
            FinalSigmas::SigmaMin => *sigmas.last().unwrap_or(&0.0),
            FinalSigmas::Zero => 0.0,
        };
        let mut sigmas: Vec<f64> = match self.kind.spaced(smin, smax, steps) {
            Some(mut s) => {
                if self.kind == SigmaKind::Karras && self.flow() {
                    s = s.iter().map(|v| v / (v + 1.0)).collect();
                    timesteps = s.iter().map(|v| v * train as f64).collect();
                } else {
                    timesteps = s
                        .iter()
                        .map(|&v| {
                            let t = sigma_to_t(v, &log_sigmas);
                            if self.kind == SigmaKind::Karras {
                                t.round_ties_even()
                            } else {
                                t
                            }
                        })
                        .collect();
                }
                let last = sigma_min_last(&s);
                s.push(last);
                s
            }
            None if self.flow() => {
                let mut s: Vec<f64> = linspace_f64(1.0, 1.0 / train as f64, steps + 1);
                s.pop();
                let shift = c.flow_shift;
                s = s
                    .into_iter()
                    .map(|v| shift * v / (1.0 + (shift - 1.0) * v))
                    .collect();
                if let Some(terminal) = c.shift_terminal {
                    let scale_factor = (1.0 - s[s.len() - 1]) / (1.0 - terminal);
                    s = s
                        .into_iter()
                        .map(|v| 1.0 - (1.0 - v) / scale_factor)
                        .collect();
                }
                if (s[0] - 1.0).abs() < 1e-6 {
                    s[0] -= 1e-6;
                }
                timesteps = s.iter().map(|v| v * train as f64).collect();
                let last = sigma_min_last(&s);
                s.push(last);
                s
            }
            None => {
                let mut s: Vec<f64> = timesteps
                    .iter()
                    .map(|&t| interp(t, &train_sigmas))
                    .collect();
                s.push(match c.final_sigmas_type {
                    FinalSigmas::SigmaMin => {
                        let a = self.schedule.alphas_cumprod[0];
                        ((1.0 - a) / a).sqrt() as f64
                    }
                    FinalSigmas::Zero => 0.0,
                });
                s
            }
        };
        self.sigmas = sigmas.drain(..).map(|v| v as f32).collect();
        self.timesteps = timesteps.into_iter().map(f64::trunc).collect();
        self.model_outputs = vec![None; c.solver_order];
        self.lower_order_nums = 0;
        self.this_order = 0;
        self.last_sample = None;
        self.next_step = 0;
        Ok(())
    }

    fn timesteps(&self) -> &[f64] {
        &self.timesteps
    }

    fn sigmas(&self) -> Option<&[f32]> {
        Some(&self.sigmas)
    }

    fn step_checked(&mut self, x: StepInput<'_>) -> Result<Tensor> {
        let (model_output, step, sample, _) = x.parts();
        let n = self.timesteps.len();
        super::check_order(CLASS, step, self.next_step)?;
        let converted = self.convert(model_output, sample, step)?;
        let corrects = step > 0 && !self.config.disable_corrector.contains(&(step - 1));
        let sample = match (&self.last_sample, corrects) {
            (Some(last), true) => self.correct(&converted, last, step, self.this_order)?,
            _ => sample.clone(),
        };
        self.model_outputs.remove(0);
        self.model_outputs.push(Some(converted));
        let order = self.config.solver_order;
        let this = if self.config.lower_order_final {
            order.min(n - step)
        } else {
            order
        };
        self.this_order = this.min(self.lower_order_nums + 1);
        self.last_sample = Some(sample.clone());
        let prev = self.predict(&sample, step, self.this_order)?;
        if self.lower_order_nums < order {
            self.lower_order_nums += 1;
        }
        self.next_step += 1;
        Ok(prev.to_dtype(sample.dtype())?)
    }
}
