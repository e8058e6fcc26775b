//! Place a diffusers pipeline with a device map, as accelerate does: `sequential` fills the
//! first device and splits the UNet or transformer at its blocks only where it does not
//! fit; `balanced` spreads every component. The plan is made from the weights' headers and
//! the image's activations before anything loads, then the pipeline runs where it says.
//!
//! cargo run --release -p zoo-examples --example pipeline_device_map -- PIPELINE "PROMPT" OUT.png [MAP] [MAX_MEMORY]
//!
//! e.g. `... -- ./stable-diffusion-v1-5 "a red fox" fox.png sequential 0=8GiB,1=8GiB` on a
//! TPU or CUDA host (on a host without one, strategies place everything on the CPU).

use anyhow::{Context, Result};
use zoo_diffusers::pipelines::placement::{self, PlanShape};
use zoo_diffusers::pipelines::stable_diffusion::TextToImage;
use zoo_diffusers::pipelines::{DiffusionPipeline, LoadOptions, Noise};
use zoo_runtime::device_map::{parse_max_memory, DeviceMap};

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let usage = "usage: pipeline_device_map PIPELINE PROMPT OUT.png [MAP] [MAX_MEMORY]";
    let pipeline = args.next().context(usage)?;
    let prompt = args.next().context(usage)?;
    let out = args.next().context(usage)?;
    let map: DeviceMap = args.next().as_deref().unwrap_or("sequential").parse()?;
    let max_memory = args.next().map(|m| parse_max_memory(&m)).transpose()?;

    // One 512x512 image with classifier-free guidance (the UNet runs a batch of 2).
    let shape = PlanShape {
        size: Some((512, 512)),
        ..PlanShape::default()
    };
    let placed = placement::resolve(&pipeline, &map, max_memory.as_ref(), &shape)?;
    if let Some(plan) = &placed.plan {
        print!("{}", plan.table());
    }
    if let Some(note) = &placed.note {
        println!("{note}");
    }
    let opts = LoadOptions {
        progress: true,
        ..placed.options
    };
    let pipe = DiffusionPipeline::from_pretrained(&pipeline, &opts)?;
    let call = TextToImage {
        prompt: vec![prompt],
        height: Some(512),
        width: Some(512),
        progress: true,
        ..Default::default()
    };
    let image = pipe.generate(&call, &mut Noise::seeded(0))?;
    for path in image.save_png(std::path::Path::new(&out))? {
        println!("{}", path.display());
    }
    Ok(())
}
