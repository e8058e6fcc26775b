//! zoo-diffusers: diffusion model families and schedulers, read from diffusers' own files.
//!
//! So far: the noise schedulers (`schedulers`), built from `scheduler/scheduler_config.json`
//! by its `_class_name` as diffusers' `Scheduler.from_config` builds them.

mod error;
pub mod schedulers;

pub use error::{Error, Result};
pub use schedulers::{Scheduler, SchedulerConfig};
