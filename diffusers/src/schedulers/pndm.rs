//! `PNDMScheduler` (diffusers' `scheduling_pndm.py`, Stable Diffusion 1.x's default):
//! pseudo Runge-Kutta warm-up steps, then linear multistep (PLMS) steps over the last four
//! model outputs; with `skip_prk_steps` (as Stable Diffusion ships it) PLMS from the start.

use zoo_runtime::Tensor;

use super::schedule::{
    integer_timesteps, NoiseConfig, NoiseSchedule, PredictionType, TimestepSpacing,
};
use super::{divide, scale, Scheduler, StepInput};
use crate::configuration::register_to_config;
use crate::{Error, Result};

const CLASS: &str = "PNDMScheduler";
const ORDER: usize = 4;

register_to_config! {
    /// `PNDMScheduler`'s config fields, with the defaults of diffusers' `__init__`.
    pub struct PNDMConfig {
        /// The training schedule.
        #[serde(flatten)]
        pub noise: NoiseConfig = NoiseConfig::default(),
        /// PLMS steps only, no Runge-Kutta warm-up.
        pub skip_prk_steps: bool = false,
        /// The cumulative alpha after the last step: 1, or the first training timestep's.
        pub set_alpha_to_one: bool = false,
        /// `epsilon` or `v_prediction`.
        pub prediction_type: PredictionType = PredictionType::Epsilon,
        /// How inference timesteps are spaced.
        pub timestep_spacing: TimestepSpacing = TimestepSpacing::Leading,
        /// Added to `leading` timesteps.
        pub steps_offset: usize = 0,
    }
}

/// `PNDMScheduler`.
#[derive(Clone, Debug)]
pub struct PNDMScheduler {
    config: PNDMConfig,
    schedule: NoiseSchedule,
    final_alpha_cumprod: f32,
    num_inference_steps: usize,
    prk_timesteps: Vec<i64>,
    timesteps: Vec<f64>,
    /// Model outputs of the PLMS history.
    ets: Vec<Tensor>,
    cur_model_output: Option<Tensor>,
    cur_sample: Option<Tensor>,
    counter: usize,
    /// The first step run (`set_begin_index`); `counter` counts from it.
    begin: usize,
}

impl PNDMScheduler {
    /// A scheduler from its config.
    pub fn new(config: PNDMConfig) -> Result<PNDMScheduler> {
        if config.prediction_type == PredictionType::Sample {
            return Err(Error::Scheduler(format!(
                "{CLASS}: prediction_type must be epsilon or v_prediction"
            )));
        }
        let schedule = NoiseSchedule::new(&config.noise, CLASS, false)?;
        let final_alpha_cumprod = if config.set_alpha_to_one {
            1.0
        } else {
            schedule.alphas_cumprod[0]
        };
        Ok(PNDMScheduler {
            config,
            schedule,
            final_alpha_cumprod,
            num_inference_steps: 0,
            prk_timesteps: Vec::new(),
            timesteps: Vec::new(),
            ets: Vec::new(),
            cur_model_output: None,
            cur_sample: None,
            counter: 0,
            begin: 0,
        })
    }

    /// `_get_prev_sample`: the DDIM-like update from `t` to `prev` with `output`.
    fn prev_sample(&self, sample: &Tensor, t: i64, prev: i64, output: &Tensor) -> Result<Tensor> {
        let ac = &self.schedule.alphas_cumprod;
        let at = *ac.get(t as usize).ok_or_else(|| {
            Error::Scheduler(format!(
                "{CLASS}: timestep {t} is past the training schedule"
            ))
        })?;
        let aprev = if prev >= 0 {
            ac[prev as usize]
        } else {
            self.final_alpha_cumprod
        };
        let (bt, bprev) = (1.0 - at, 1.0 - aprev);
        let output = if self.config.prediction_type == PredictionType::VPrediction {
            scale(output, at.sqrt())?.add(&scale(sample, bt.sqrt())?)?
        } else {
            output.clone()
        };
        let sample_coeff = (aprev / at).sqrt();
        let denom = at * bprev.sqrt() + (at * bt * aprev).sqrt();
        let step = divide(&scale(&output, aprev - at)?, denom)?;
        Ok(scale(sample, sample_coeff)?.sub(&step)?)
    }

    fn step_prk(&mut self, output: &Tensor, t: i64, sample: &Tensor) -> Result<Tensor> {
        let half = (self.config.noise.num_train_timesteps / self.num_inference_steps / 2) as i64;
        let diff = if self.counter % 2 == 1 { 0 } else { half };
        let prev = t - diff;
        let t = self.prk_timesteps[self.counter / 4 * 4];
        let acc = |cur: &Option<Tensor>, add: Tensor| -> Result<Tensor> {
            Ok(match cur {
                Some(c) => c.add(&add)?,
                None => add,
            })
        };
        let output = match self.counter % 4 {
            0 => {
                self.cur_model_output =
                    Some(acc(&self.cur_model_output, scale(output, 1.0 / 6.0)?)?);
                self.ets.push(output.clone());
                self.cur_sample = Some(sample.clone());
                output.clone()
            }
            1 | 2 => {
                self.cur_model_output =
                    Some(acc(&self.cur_model_output, scale(output, 1.0 / 3.0)?)?);
                output.clone()
            }
            _ => {
                let o = acc(&self.cur_model_output, scale(output, 1.0 / 6.0)?)?;
                self.cur_model_output = None;
                o
            }
        };
        let cur = self.cur_sample.clone().unwrap_or_else(|| sample.clone());
        self.prev_sample(&cur, t, prev, &output)
    }

    fn step_plms(&mut self, output: &Tensor, t: i64, sample: &Tensor) -> Result<Tensor> {
        if !self.config.skip_prk_steps && self.ets.len() < 3 {
            return Err(Error::Scheduler(format!(
                "{CLASS}: PLMS steps need 3 Runge-Kutta steps first"
            )));
        }
        let ratio = (self.config.noise.num_train_timesteps / self.num_inference_steps) as i64;
        let (mut t, mut prev) = (t, t - ratio);
        if self.counter != 1 {
            let keep = self.ets.len().saturating_sub(3);
            self.ets.drain(..keep);
            self.ets.push(output.clone());
        } else {
            prev = t;
            t += ratio;
        }
        let e = &self.ets;
        let n = e.len();
        let mut sample = sample.clone();
        let output = if n == 1 && self.counter == 0 {
            self.cur_sample = Some(sample.clone());
            output.clone()
        } else if n == 1 && self.counter == 1 {
            sample = self.cur_sample.take().unwrap_or(sample);
            divide(&output.add(&e[0])?, 2.0)?
        } else if n == 2 {
            divide(&scale(&e[1], 3.0)?.sub(&e[0])?, 2.0)?
        } else if n == 3 {
            let s = scale(&e[2], 23.0)?
                .sub(&scale(&e[1], 16.0)?)?
                .add(&scale(&e[0], 5.0)?)?;
            divide(&s, 12.0)?
        } else {
            let s = scale(&e[n - 1], 55.0)?
                .sub(&scale(&e[n - 2], 59.0)?)?
                .add(&scale(&e[n - 3], 37.0)?)?
                .sub(&scale(&e[n - 4], 9.0)?)?;
            scale(&s, 1.0 / 24.0)?
        };
        self.prev_sample(&sample, t, prev, &output)
    }
}

impl Scheduler for PNDMScheduler {
    fn add_noise(&self, original: &Tensor, noise: &Tensor, step: usize) -> Result<Tensor> {
        let ac = &self.schedule.alphas_cumprod;
        super::add_noise_alphas(CLASS, ac, &self.timesteps, step, original, noise)
    }

    fn restart_at(&mut self, begin: usize) {
        self.begin = begin;
    }

    fn class_name(&self) -> &'static str {
        CLASS
    }

    fn choose_timesteps(&mut self, steps: usize) -> Result<()> {
        let c = &self.config;
        let train = c.noise.num_train_timesteps;
        // Ascending, as PNDM keeps `_timesteps`.
        let mut base: Vec<i64> =
            integer_timesteps(CLASS, c.timestep_spacing, train, steps, c.steps_offset)?
                .into_iter()
                .map(|t| t as i64)
                .collect();
        base.reverse();
        let (prk, plms): (Vec<i64>, Vec<i64>) = if c.skip_prk_steps {
            let n = base.len();
            if n < 2 {
                return Err(Error::Scheduler(format!(
                    "{CLASS}: skip_prk_steps needs at least 2 inference steps"
                )));
            }
            let mut plms: Vec<i64> = base[..n - 1].to_vec();
            plms.push(base[n - 2]);
            plms.push(base[n - 1]);
            plms.reverse();
            (Vec::new(), plms)
        } else {
            if base.len() < ORDER {
                return Err(Error::Scheduler(format!(
                    "{CLASS}: Runge-Kutta warm-up needs at least {ORDER} inference steps"
                )));
            }
            let half = (train / steps / 2) as i64;
            let last: Vec<i64> = base[base.len() - ORDER..]
                .iter()
                .flat_map(|&t| [t, t + half])
                .collect();
            // prk[:-1].repeat(2)[1:-1][::-1]
            let mut rep: Vec<i64> = last[..last.len() - 1]
                .iter()
                .flat_map(|&t| [t, t])
                .collect();
            rep.remove(0);
            rep.pop();
            rep.reverse();
            let mut plms = base[..base.len() - 3].to_vec();
            plms.reverse();
            (rep, plms)
        };
        self.timesteps = prk.iter().chain(&plms).map(|&t| t as f64).collect();
        self.prk_timesteps = prk;
        self.num_inference_steps = steps;
        self.ets.clear();
        self.cur_model_output = None;
        self.cur_sample = None;
        self.counter = 0;
        self.begin = 0;
        Ok(())
    }

    fn timesteps(&self) -> &[f64] {
        &self.timesteps
    }

    fn step_checked(&mut self, x: StepInput<'_>) -> Result<Tensor> {
        let (model_output, step, sample, _) = x.parts();
        super::check_order(CLASS, step, self.begin + self.counter)?;
        let t = self.timesteps[step] as i64;
        let out = if self.counter < self.prk_timesteps.len() && !self.config.skip_prk_steps {
            self.step_prk(model_output, t, sample)?
        } else {
            self.step_plms(model_output, t, sample)?
        };
        self.counter += 1;
        Ok(out)
    }
}
