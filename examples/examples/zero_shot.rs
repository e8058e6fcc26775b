//! Zero-shot image classification with CLIP: score an image against labels you choose, as
//! transformers' `zero-shot-image-classification` pipeline does.
//!
//! cargo run -p zoo-examples --example zero_shot -- openai/clip-vit-base-patch32 cat.jpg "a cat" "a dog"

use zoo_runtime::device_map::DeviceMap;
use zoo_transformers::image_processing::RgbImage;
use zoo_transformers::vision::DEFAULT_HYPOTHESIS_TEMPLATE;
use zoo_transformers::{LoadOptions, ZeroShotImageClassifier};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [model, path, labels @ ..] = &args[..] else {
        anyhow::bail!("usage: zero_shot <clip-model> <image> <label>...");
    };
    if labels.is_empty() {
        anyhow::bail!("give at least one label");
    }
    let opts = LoadOptions {
        device_map: DeviceMap::Cpu,
        ..Default::default()
    };
    let clip = ZeroShotImageClassifier::load_pretrained(model, opts)?;
    let image = RgbImage::open(path.as_ref())?;
    let labels: Vec<&str> = labels.iter().map(String::as_str).collect();
    // Each label is written into "This is a photo of {}." before it is tokenized.
    for s in &clip.classify(&[image], &labels, DEFAULT_HYPOTHESIS_TEMPLATE)?[0] {
        println!("{:6.2}%  {}", s.score * 100.0, s.label);
    }
    Ok(())
}
