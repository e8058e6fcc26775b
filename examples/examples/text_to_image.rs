//! Generate an image with a diffusers pipeline folder (Stable Diffusion 1.x, 2.x, XL or 3,
//! Flux, PixArt-α or PixArt-Σ, as diffusers' `save_pretrained` writes it) and save it as PNG.
//! (DiT takes class labels: see `class_to_image`.)
//!
//! cargo run --release -p zoo-examples --example text_to_image -- PIPELINE "PROMPT" OUT.png [STEPS] [SEED]
//!
//! e.g. `... -- ./stable-diffusion-v1-5 "a photo of an astronaut riding a horse" out.png 30 7`,
//! or `... -- ./FLUX.1-schnell "a lighthouse at dawn" out.png 4`.

use anyhow::{Context, Result};
use zoo_diffusers::pipelines::stable_diffusion::TextToImage;
use zoo_diffusers::pipelines::{DiffusionPipeline, LoadOptions, Noise};

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let usage = "usage: text_to_image PIPELINE PROMPT OUT.png [STEPS] [SEED]";
    let pipeline = args.next().context(usage)?;
    let prompt = args.next().context(usage)?;
    let out = args.next().context(usage)?;
    let steps: usize = args.next().map_or(Ok(30), |s| s.parse())?;
    let seed: u64 = args.next().map_or(Ok(0), |s| s.parse())?;

    // Every component on candle's CPU backend in f32; `device` picks a PJRT device instead.
    let opts = LoadOptions {
        progress: true,
        ..Default::default()
    };
    // The class comes from model_index.json, as DiffusionPipeline.from_pretrained does.
    let pipe = DiffusionPipeline::from_pretrained(&pipeline, &opts)?;
    println!("{}", pipe.class_name());
    let call = TextToImage {
        prompt: vec![prompt],
        negative_prompt: Some(vec!["blurry, low quality".into()]),
        num_inference_steps: steps,
        progress: true,
        ..Default::default()
    };
    // The same seed gives the same image on every backend: the noise is drawn on the host.
    let image = pipe.generate(&call, &mut Noise::seeded(seed))?;
    for path in image.save_png(std::path::Path::new(&out))? {
        println!(
            "{} ({:.2} s/step)",
            path.display(),
            image.seconds_per_step()
        );
    }
    Ok(())
}
