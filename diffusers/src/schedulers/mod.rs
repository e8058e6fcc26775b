//! Noise schedulers, built from `scheduler/scheduler_config.json` by its `_class_name` (as
//! `SchedulerMixin.from_config` does in diffusers), reading every field diffusers reads with
//! diffusers' defaults.
//!
//! A scheduler owns the inference timesteps and the update from one sample to the next.
//! Coefficients are computed on the host in the precision diffusers computes them; the
//! update is tensor arithmetic with those coefficients as one-element tensors, so on a
//! compiled device one program serves every step (a coefficient baked in as a constant would
//! compile a program per timestep). Noise that a step adds (DDPM, ancestral samplers, DDIM
//! with `eta > 0`) is passed in by the caller, who draws it from zoo's seeded generator, or
//! from a parity case's recorded noise.

mod ddim;
mod ddpm;
mod dpmsolver_multistep;
mod euler;
mod flow_match_euler_discrete;
mod lms_discrete;
mod pndm;
pub mod schedule;
mod thresholding;
mod unipc_multistep;

use std::path::Path;

use serde::de::DeserializeOwned;
use serde_json::Value;
use zoo_runtime::{DType, Tensor};

pub use ddim::DDIMScheduler;
pub use ddpm::DDPMScheduler;
pub use dpmsolver_multistep::DPMSolverMultistepScheduler;
pub use euler::{EulerAncestralDiscreteScheduler, EulerDiscreteScheduler};
pub use flow_match_euler_discrete::{
    FlowMatchEulerConfig, FlowMatchEulerDiscreteScheduler, TimeShift,
};
pub use lms_discrete::LMSDiscreteScheduler;
pub use pndm::PNDMScheduler;
pub use unipc_multistep::UniPCMultistepScheduler;

use crate::{Error, Result};

/// A noise scheduler: the timesteps of an inference run and the update between them.
pub trait Scheduler: Send + Sync + std::fmt::Debug {
    /// The diffusers class (`DDIMScheduler`, ...).
    fn class_name(&self) -> &'static str;
    /// Chooses `num_inference_steps` (at least 1) timesteps (and sigmas) and resets the step
    /// state.
    fn set_timesteps(&mut self, num_inference_steps: usize) -> Result<()> {
        if num_inference_steps == 0 {
            return Err(Error::Scheduler(format!(
                "{}: num_inference_steps must be at least 1",
                self.class_name()
            )));
        }
        self.choose_timesteps(num_inference_steps)
    }
    /// The scheduler's own [`Scheduler::set_timesteps`], for at least one step.
    fn choose_timesteps(&mut self, num_inference_steps: usize) -> Result<()>;
    /// `set_timesteps` with the arguments pipelines may pass beyond the step count (custom
    /// `timesteps=` or `sigmas=`, flow shifting's `mu=`), as the scheduler's diffusers class
    /// takes them; a scheduler refuses what its class does not take.
    fn set_timesteps_with(
        &mut self,
        num_inference_steps: usize,
        options: &TimestepOptions,
    ) -> Result<()> {
        if options != &TimestepOptions::default() {
            return Err(Error::Scheduler(format!(
                "{} takes no custom timesteps, sigmas or `mu`; EulerDiscreteScheduler and DPMSolverMultistepScheduler take custom timesteps, EulerDiscreteScheduler and FlowMatchEulerDiscreteScheduler custom sigmas",
                self.class_name()
            )));
        }
        self.set_timesteps(num_inference_steps)
    }
    /// The timestep values the model is called with, one per step, in order.
    fn timesteps(&self) -> &[f64];
    /// The noise levels of sigma-parameterized schedulers, one more than the timesteps.
    fn sigmas(&self) -> Option<&[f32]> {
        None
    }
    /// What the initial Gaussian noise is multiplied by (1 but for the sigma schedulers).
    fn init_noise_sigma(&self) -> f64 {
        1.0
    }
    /// The model's input at step `step`: the sample itself but for the sigma schedulers,
    /// which divide by `sqrt(sigma^2 + 1)`.
    fn scale_model_input(&self, sample: &Tensor, _step: usize) -> Result<Tensor> {
        Ok(sample.clone())
    }
    /// Sets DDIM's `eta` (the pipelines' `eta` argument); false for schedulers without one,
    /// which ignore it, as diffusers' pipelines pass it only where `step` takes it.
    fn set_eta(&mut self, _eta: f32) -> bool {
        false
    }
    /// Starts stepping at index `begin` of `timesteps()` (img2img's `strength` skips the
    /// first steps, diffusers' `set_begin_index`): the next `step` call is step `begin`, with
    /// the multistep history empty. Call after `set_timesteps`.
    fn set_begin_index(&mut self, begin: usize) -> Result<()> {
        check_step(self.class_name(), begin, self.timesteps().len())?;
        self.restart_at(begin);
        Ok(())
    }
    /// Where [`Scheduler::set_begin_index`] restarts a multistep scheduler's history (the
    /// others keep none).
    fn restart_at(&mut self, _begin: usize) {}
    /// `add_noise`: `original` noised to the level of step `step` (img2img's starting
    /// latents), as diffusers' `add_noise` at `timesteps()[step]`.
    fn add_noise(&self, original: &Tensor, noise: &Tensor, step: usize) -> Result<Tensor>;
    /// Whether step `step` adds noise (the caller then passes `noise` of the sample's shape).
    fn needs_noise(&self, _step: usize) -> bool {
        false
    }
    /// The sample after step `step`, from the model's output at `timesteps()[step]`. Steps run
    /// in order from 0. Checks the step index and the sample's dtype, then runs
    /// [`Scheduler::step_checked`].
    fn step(
        &mut self,
        model_output: &Tensor,
        step: usize,
        sample: &Tensor,
        noise: Option<&Tensor>,
    ) -> Result<Tensor> {
        check_step(self.class_name(), step, self.timesteps().len())?;
        check_float(self.class_name(), sample)?;
        self.step_checked(StepInput {
            model_output,
            step,
            sample,
            noise,
        })
    }
    /// The scheduler's own update of [`Scheduler::step`], on a step index within the
    /// timesteps set and a floating-point sample.
    fn step_checked(&mut self, x: StepInput<'_>) -> Result<Tensor>;
}

/// The arguments of one [`Scheduler::step`].
#[derive(Clone, Copy, Debug)]
pub struct StepInput<'a> {
    /// The model's output at `timesteps()[step]`.
    pub model_output: &'a Tensor,
    /// The index of the step in `timesteps()`.
    pub step: usize,
    /// The current sample.
    pub sample: &'a Tensor,
    /// The noise the step draws, when [`Scheduler::needs_noise`] says it does.
    pub noise: Option<&'a Tensor>,
}

impl<'a> StepInput<'a> {
    /// `(model_output, step, sample, noise)`.
    pub fn parts(self) -> (&'a Tensor, usize, &'a Tensor, Option<&'a Tensor>) {
        (self.model_output, self.step, self.sample, self.noise)
    }
}

/// What a pipeline may pass to [`Scheduler::set_timesteps_with`] beyond the step count.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TimestepOptions {
    /// The sigmas to run instead of the scheduler's own spacing, as its diffusers class takes
    /// them: one per step for flow matching; one per step and the final one for Euler.
    pub sigmas: Option<Vec<f64>>,
    /// The resolution-dependent shift of `use_dynamic_shifting` schedulers.
    pub mu: Option<f64>,
    /// The timesteps to run (descending training timesteps, one per step) instead of the
    /// scheduler's spacing (diffusers' `set_timesteps(timesteps=...)`: Align-Your-Steps and
    /// other published schedules).
    pub timesteps: Option<Vec<f64>>,
}

impl TimestepOptions {
    /// The step count custom timesteps or sigmas imply (`sigmas_per_step`: whether the
    /// scheduler takes one sigma per step, or one more for the final one), checked against
    /// `num_inference_steps` (0 takes theirs); `None` when neither is given.
    pub(crate) fn custom_steps(
        &self,
        class: &str,
        num_inference_steps: usize,
        sigmas_per_step: bool,
    ) -> Result<Option<usize>> {
        let n = match (&self.timesteps, &self.sigmas) {
            (Some(_), Some(_)) => {
                return Err(Error::Scheduler(format!(
                    "{class}: pass custom timesteps or custom sigmas, not both"
                )))
            }
            (Some(t), None) => t.len(),
            (None, Some(s)) if sigmas_per_step => s.len(),
            (None, Some(s)) => s.len().saturating_sub(1),
            (None, None) => return Ok(None),
        };
        if n == 0 || (num_inference_steps != 0 && num_inference_steps != n) {
            return Err(Error::Scheduler(format!(
                "{class}: the custom schedule gives {n} steps, but {num_inference_steps} inference steps were asked; pass 0 or {n}, and at least one step"
            )));
        }
        Ok(Some(n))
    }
}

/// The classes [`SchedulerConfig::build`] knows.
pub const CLASSES: &[&str] = &[
    "DDPMScheduler",
    "DDIMScheduler",
    "PNDMScheduler",
    "EulerDiscreteScheduler",
    "EulerAncestralDiscreteScheduler",
    "DPMSolverMultistepScheduler",
    "LMSDiscreteScheduler",
    "UniPCMultistepScheduler",
    "FlowMatchEulerDiscreteScheduler",
];

/// A `scheduler_config.json`: its class and its fields.
#[derive(Clone, Debug)]
pub struct SchedulerConfig {
    /// `_class_name`.
    pub class_name: String,
    /// Every field, as written.
    pub fields: Value,
    /// Where it came from, for errors.
    pub path: std::path::PathBuf,
}

impl SchedulerConfig {
    /// Reads `scheduler_config.json` (or a pipeline folder's `scheduler/scheduler_config.json`).
    pub fn from_file(path: &Path) -> Result<SchedulerConfig> {
        let path = if path.is_dir() {
            let nested = path.join("scheduler").join("scheduler_config.json");
            if nested.exists() {
                nested
            } else {
                path.join("scheduler_config.json")
            }
        } else {
            path.to_path_buf()
        };
        let text = std::fs::read_to_string(&path).map_err(|e| Error::Config {
            path: path.clone(),
            reason: format!("cannot read it: {e}"),
        })?;
        let fields: Value =
            serde_json::from_str(&quote_non_finite(&text)).map_err(|e| Error::Config {
                path: path.clone(),
                reason: format!("not JSON: {e}"),
            })?;
        SchedulerConfig::from_json(fields, &path)
    }

    /// A config from its JSON; `path` names it in errors.
    pub fn from_json(fields: Value, path: &Path) -> Result<SchedulerConfig> {
        let class_name = fields
            .get("_class_name")
            .and_then(Value::as_str)
            .ok_or_else(|| Error::Config {
                path: path.to_path_buf(),
                reason: "`_class_name` is missing: it names the scheduler class".into(),
            })?
            .to_string();
        Ok(SchedulerConfig {
            class_name,
            fields,
            path: path.to_path_buf(),
        })
    }

    /// The same fields under another class (`Scheduler.from_config(other.config)` in
    /// diffusers: each class reads the fields it knows and defaults the rest).
    pub fn with_class(&self, class_name: &str) -> SchedulerConfig {
        let mut c = self.clone();
        c.class_name = class_name.to_string();
        c
    }

    /// Builds the scheduler its `_class_name` names.
    pub fn build(&self) -> Result<Box<dyn Scheduler>> {
        Ok(match self.class_name.as_str() {
            "DDPMScheduler" => self.build_with(DDPMScheduler::new)?,
            "DDIMScheduler" => self.build_with(DDIMScheduler::new)?,
            "PNDMScheduler" => self.build_with(PNDMScheduler::new)?,
            "EulerDiscreteScheduler" => self.build_with(EulerDiscreteScheduler::new)?,
            "EulerAncestralDiscreteScheduler" => {
                self.build_with(EulerAncestralDiscreteScheduler::new)?
            }
            "DPMSolverMultistepScheduler" => self.build_with(DPMSolverMultistepScheduler::new)?,
            "LMSDiscreteScheduler" => self.build_with(LMSDiscreteScheduler::new)?,
            "UniPCMultistepScheduler" => self.build_with(UniPCMultistepScheduler::new)?,
            "FlowMatchEulerDiscreteScheduler" => {
                self.build_with(FlowMatchEulerDiscreteScheduler::new)?
            }
            other => {
                return Err(Error::Config {
                    path: self.path.clone(),
                    reason: format!(
                        "`_class_name` {other:?} is not a scheduler zoo runs; zoo runs {}",
                        CLASSES.join(", ")
                    ),
                })
            }
        })
    }
}

impl SchedulerConfig {
    /// The scheduler `new` builds from the config's fields read as its config type.
    fn build_with<C: DeserializeOwned, S: Scheduler + 'static>(
        &self,
        new: fn(C) -> Result<S>,
    ) -> Result<Box<dyn Scheduler>> {
        let config = serde_json::from_value(self.fields.clone()).map_err(|e| Error::Config {
            path: self.path.clone(),
            reason: format!("{}: {e}", self.class_name),
        })?;
        Ok(Box::new(new(config)?))
    }
}

/// Python's `json` writes infinities and NaN bare (`-Infinity`), which JSON has not; they
/// become strings here, which the fields that may hold them read back as numbers.
fn quote_non_finite(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut in_string = false;
    let mut escaped = false;
    let mut rest = text;
    while let Some(c) = rest.chars().next() {
        if in_string {
            out.push(c);
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, '\\') => escaped = true,
                (false, '"') => in_string = false,
                _ => {}
            }
            rest = &rest[c.len_utf8()..];
            continue;
        }
        if c == '"' {
            in_string = true;
            out.push(c);
            rest = &rest[1..];
            continue;
        }
        if let Some(word) = ["-Infinity", "Infinity", "NaN"]
            .into_iter()
            .find(|w| rest.starts_with(w))
        {
            out.push('"');
            out.push_str(word);
            out.push('"');
            rest = &rest[word.len()..];
            continue;
        }
        out.push(c);
        rest = &rest[c.len_utf8()..];
    }
    out
}

/// `c` as a one-element tensor of `like`'s dtype on its device: a step coefficient.
fn coef(c: f32, like: &Tensor) -> Result<Tensor> {
    Ok(Tensor::from_f64s(
        &[c as f64],
        &[1],
        like.dtype(),
        &like.device(),
    )?)
}

/// `x * a`.
fn scale(x: &Tensor, a: f32) -> Result<Tensor> {
    Ok(x.mul(&coef(a, x)?)?)
}

/// `x / a`.
fn divide(x: &Tensor, a: f32) -> Result<Tensor> {
    Ok(x.div(&coef(a, x)?)?)
}

/// `sqrt(acp) * x + sqrt(1 - acp) * noise` at the training timestep of step `step` of
/// `timesteps` (the alpha-based schedulers' `add_noise`, in float32 as diffusers computes it).
fn add_noise_alphas(
    class: &str,
    alphas_cumprod: &[f32],
    timesteps: &[f64],
    step: usize,
    x: &Tensor,
    noise: &Tensor,
) -> Result<Tensor> {
    check_step(class, step, timesteps.len())?;
    let t = timesteps[step];
    let a = *alphas_cumprod.get(t as usize).ok_or_else(|| {
        Error::Scheduler(format!(
            "{class}: timestep {t} is outside the training schedule"
        ))
    })?;
    Ok(scale(x, a.sqrt())?.add(&scale(noise, (1.0 - a).sqrt())?)?)
}

/// `alpha * x + sigma * noise` (`sigma` alone with `alpha = 1`: the sigma schedulers).
fn add_noise_scaled(x: &Tensor, noise: &Tensor, alpha: f32, sigma: f32) -> Result<Tensor> {
    let x = if alpha == 1.0 {
        x.clone()
    } else {
        scale(x, alpha)?
    };
    Ok(x.add(&scale(noise, sigma)?)?)
}

/// The sigma schedulers' model input at step `step` of `steps`: `sample / sqrt(sigma^2 + 1)`.
fn scale_by_sigma(
    class: &str,
    sample: &Tensor,
    sigmas: &[f32],
    steps: usize,
    step: usize,
) -> Result<Tensor> {
    check_step(class, step, steps)?;
    let s = sigmas[step];
    divide(sample, (s * s + 1.0).sqrt())
}

/// Checks that `noise` is there and shaped like `sample` when a step needs it.
fn require_noise<'a>(
    class: &str,
    noise: Option<&'a Tensor>,
    sample: &Tensor,
) -> Result<&'a Tensor> {
    let n = noise.ok_or_else(|| {
        Error::Scheduler(format!(
            "{class} adds noise at this step; pass noise shaped like the sample {:?}",
            sample.shape()
        ))
    })?;
    if n.shape() != sample.shape() {
        return Err(Error::Scheduler(format!(
            "{class}: noise {:?} must be shaped like the sample {:?}",
            n.shape(),
            sample.shape()
        )));
    }
    Ok(n)
}

/// Checks the step index against the timesteps set.
fn check_step(class: &str, step: usize, steps: usize) -> Result<()> {
    if steps == 0 {
        return Err(Error::Scheduler(format!(
            "{class}: call set_timesteps before stepping"
        )));
    }
    if step >= steps {
        return Err(Error::Scheduler(format!(
            "{class}: step {step} is past the {steps} timesteps set"
        )));
    }
    Ok(())
}

/// Multistep schedulers keep a history: step `step` must be the `expected` next one.
fn check_order(class: &str, step: usize, expected: usize) -> Result<()> {
    if step != expected {
        return Err(Error::Scheduler(format!(
            "{class}: steps run in order; expected step {expected}, got {step} (set_timesteps restarts)"
        )));
    }
    Ok(())
}

/// Float samples only: schedulers compute in floating point.
fn check_float(class: &str, t: &Tensor) -> Result<()> {
    if !matches!(
        t.dtype(),
        DType::F32 | DType::F16 | DType::BF16 | DType::F64
    ) {
        return Err(Error::Scheduler(format!(
            "{class}: samples must be floating point, got {:?}",
            t.dtype()
        )));
    }
    Ok(())
}
