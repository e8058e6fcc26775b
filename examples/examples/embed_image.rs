//! Embed images with a vision model (CLIP's projected image_embeds, or a ViT's pooled
//! output) and print their cosine similarity.
//!
//! cargo run -p zoo-examples --example embed_image -- openai/clip-vit-base-patch32 a.jpg b.png

use zoo_runtime::device_map::DeviceMap;
use zoo_transformers::sentence::cosine_similarity;
use zoo_transformers::vision::open_images;
use zoo_transformers::{ImageEmbedder, LoadOptions};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [model, paths @ ..] = &args[..] else {
        anyhow::bail!("usage: embed_image <model> <image>...");
    };
    let opts = LoadOptions {
        device_map: DeviceMap::Cpu,
        ..Default::default()
    };
    let embedder = ImageEmbedder::load_pretrained(model, opts)?;
    let embeddings = embedder.embed(&open_images(paths)?)?;
    for (path, e) in paths.iter().zip(&embeddings) {
        println!("{path}: {} dims ({})", e.len(), embedder.kind());
    }
    if let [a, b, ..] = &embeddings[..] {
        println!(
            "cosine similarity of the first two: {:.4}",
            cosine_similarity(a, b)
        );
    }
    Ok(())
}
