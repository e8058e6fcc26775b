//! Generate ImageNet-class images with a DiT pipeline folder (`DiTPipeline`, as diffusers'
//! `save_pretrained` writes it, `id2label` in its model_index.json) and save them as PNG.
//!
//! cargo run --release -p zoo-examples --example class_to_image -- PIPELINE OUT.png LABEL [LABEL...]
//!
//! e.g. `... -- ./DiT-XL-2-256 out.png "golden retriever" "tabby"`: one image per label,
//! written as out-0.png, out-1.png. A label is one of id2label's comma-separated names, or a
//! class id.

use anyhow::{Context, Result};
use zoo_diffusers::pipelines::stable_diffusion::TextToImage;
use zoo_diffusers::pipelines::{DiTPipeline, LoadOptions, Noise};

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let usage = "usage: class_to_image PIPELINE OUT.png LABEL [LABEL...]";
    let pipeline = args.next().context(usage)?;
    let out = args.next().context(usage)?;
    let labels: Vec<String> = args.collect();
    anyhow::ensure!(!labels.is_empty(), "{usage}");

    let opts = LoadOptions {
        progress: true,
        ..Default::default()
    };
    let pipe = DiTPipeline::from_pretrained(&pipeline, &opts)?;
    // Unknown names fail here with the names the pipeline knows.
    let ids = pipe.get_label_ids(&labels)?;
    println!("class ids {ids:?}");
    let call = TextToImage {
        prompt: labels,
        num_inference_steps: 25,
        // DiT's default: guidance against the null class at 4.
        guidance_scale: 4.0,
        progress: true,
        ..Default::default()
    };
    let image = pipe.generate(&call, &mut Noise::seeded(0))?;
    for path in image.save_png(std::path::Path::new(&out))? {
        println!(
            "{} ({:.2} s/step)",
            path.display(),
            image.seconds_per_step()
        );
    }
    Ok(())
}
