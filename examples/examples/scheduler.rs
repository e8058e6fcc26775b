//! Read a pipeline's `scheduler/scheduler_config.json`, swap the class as
//! `Scheduler.from_config` does, and print the timesteps and sigmas of an inference run.
//!
//! cargo run --release -p zoo-examples --example scheduler -- PIPELINE_OR_CONFIG [CLASS] [STEPS]
//!
//! e.g. `... -- ./stable-diffusion-v1-5 DPMSolverMultistepScheduler 20`.

use anyhow::{Context, Result};
use zoo_diffusers::SchedulerConfig;

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let path = args
        .next()
        .context("usage: scheduler PIPELINE_OR_CONFIG [CLASS] [STEPS]")?;
    let config = SchedulerConfig::from_file(std::path::Path::new(&path))?;
    let config = match args.next() {
        Some(class) => config.with_class(&class),
        None => config,
    };
    let steps: usize = args.next().map_or(Ok(20), |s| s.parse())?;
    let mut scheduler = config.build()?;
    scheduler.set_timesteps(steps)?;
    println!("{} with {steps} steps", scheduler.class_name());
    println!("init_noise_sigma: {}", scheduler.init_noise_sigma());
    println!("timesteps: {:?}", scheduler.timesteps());
    if let Some(sigmas) = scheduler.sigmas() {
        println!("sigmas: {sigmas:?}");
    }
    Ok(())
}
