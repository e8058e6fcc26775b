//! Classify an image with an image classifier (ViTForImageClassification; labels from its
//! `id2label`), the image turned into pixel values by the model's `preprocessor_config.json`.
//!
//! cargo run -p zoo-examples --example classify_image -- google/vit-base-patch16-224 cat.jpg

use zoo_runtime::device_map::DeviceMap;
use zoo_transformers::image_processing::RgbImage;
use zoo_transformers::{ImageClassifier, LoadOptions};

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let (Some(model), Some(path)) = (args.next(), args.next()) else {
        anyhow::bail!("usage: classify_image <model> <image>");
    };
    let opts = LoadOptions {
        device_map: DeviceMap::Cpu,
        ..Default::default()
    };
    let classifier = ImageClassifier::load_pretrained(&model, opts)?;
    let image = RgbImage::open(path.as_ref())?;
    for s in &classifier.classify(&[image], 5)?[0] {
        println!("{:6.2}%  {}", s.score * 100.0, s.label);
    }
    Ok(())
}
