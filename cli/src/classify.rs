//! `zoo classify`: the top labels of an image, from an image classifier or, with
//! `--labels`, zero-shot from a CLIP model.

use anyhow::{bail, Context, Result};
use serde_json::json;
use zoo_runtime::device_map::DeviceMap;
use zoo_transformers::vision::{
    open_images_limited, ImageClassifier, Scored, ZeroShotImageClassifier,
    DEFAULT_HYPOTHESIS_TEMPLATE,
};
use zoo_transformers::LoadOptions;

/// Classify an image and print its most probable labels with their probabilities.
///
/// An image classifier (ViTForImageClassification) scores its own labels (config.json's
/// id2label). With --labels, a CLIPModel scores the labels you give instead (zero-shot, as
/// transformers' zero-shot-image-classification pipeline): each label goes into --template,
/// the prompts are tokenized as CLIPProcessor does, and the softmax of logits_per_image ranks
/// them. The image (PNG or JPEG) is turned into pixel values by the model's
/// preprocessor_config.json, exactly as transformers' image processor does.
///
/// Examples:
///   zoo classify google/vit-base-patch16-224 cat.jpg
///   zoo classify ./vit-folder photo.png --top-k 3 --json
///   zoo classify openai/clip-vit-base-patch32 cat.jpg --labels "a cat,a dog,a car"
///   zoo classify ./clip cat.jpg --labels "cat,dog" --template "a photo of a {}"
#[derive(clap::Args)]
#[command(verbatim_doc_comment, after_help = zoo_transformers::registry::families_help(false))]
pub struct Args {
    /// Folder or Hub repo id `org/name[@revision]` of an image classifier or a CLIPModel.
    model: String,
    /// The image file.
    image: std::path::PathBuf,
    /// Comma-separated candidate labels for zero-shot classification (a CLIPModel).
    #[arg(long, value_delimiter = ',')]
    labels: Vec<String>,
    /// The prompt each zero-shot label is written into at `{}`; "{}" uses the labels as
    /// they are.
    #[arg(long, default_value = DEFAULT_HYPOTHESIS_TEMPLATE)]
    template: String,
    /// How many labels to print (all of them for zero-shot unless set).
    #[arg(long)]
    top_k: Option<usize>,
    /// Where the model runs: cpu, cuda:N, pjrt:PLATFORM[:N,...], tpu, auto, balanced, or a
    /// FILE.json device map (see `zoo generate --help`).
    #[arg(long, default_value = "cpu")]
    device_map: String,
    /// Weight and activation dtype: f32, bf16 or f16 (default: the checkpoint's).
    #[arg(long)]
    dtype: Option<String>,
    #[command(flatten)]
    adapters: crate::load::AdapterArgs,
    /// Print a JSON list of {"label", "score"}, best first.
    #[arg(long)]
    json: bool,
    /// Refuse an image whose header declares more pixels than this, before decoding it
    /// (Pillow's MAX_IMAGE_PIXELS by default: a few bytes can declare gigabytes); 0 for no
    /// limit, for trusted files.
    #[arg(long, value_name = "PIXELS", default_value_t = zoo_transformers::image_processing::MAX_IMAGE_PIXELS)]
    max_image_pixels: u64,
}

pub fn run(args: Args) -> Result<()> {
    let device_map: DeviceMap = args.device_map.parse().context("--device-map")?;
    let dtype = crate::load::dtype_flag(args.dtype.as_deref())?;
    if args.top_k == Some(0) {
        bail!("--top-k must be at least 1");
    }
    let opts = LoadOptions {
        dtype,
        device_map,
        progress: true,
        adapters: args.adapters.parsed()?,
        ..Default::default()
    };
    let images = open_images_limited(
        std::slice::from_ref(&args.image),
        crate::pixel_limit(args.max_image_pixels),
    )?;
    let mut scored: Vec<Scored> = if args.labels.is_empty() {
        let classifier = ImageClassifier::load_pretrained(&args.model, opts)
            .with_context(|| format!("loading {}", args.model))?;
        classifier
            .classify(&images, args.top_k.unwrap_or(5))?
            .remove(0)
    } else {
        let labels: Vec<&str> = args
            .labels
            .iter()
            .map(|l| l.trim())
            .filter(|l| !l.is_empty())
            .collect();
        if labels.is_empty() {
            bail!(
                "--labels holds no label; give them comma-separated, e.g. --labels \"a cat,a dog\""
            );
        }
        let classifier = ZeroShotImageClassifier::load_pretrained(&args.model, opts)
            .with_context(|| format!("loading {}", args.model))?;
        classifier
            .classify(&images, &labels, &args.template)?
            .remove(0)
    };
    if let Some(k) = args.top_k {
        scored.truncate(k);
    }
    if args.json {
        let list: Vec<_> = scored
            .iter()
            .map(|s| json!({"label": s.label, "score": s.score}))
            .collect();
        outln!("{}", serde_json::to_string_pretty(&list)?);
        return Ok(());
    }
    let width = scored.iter().map(|s| s.label.len()).max().unwrap_or(0);
    for s in &scored {
        outln!("{:>6.2}%  {:<width$}", s.score * 100.0, s.label);
    }
    Ok(())
}
