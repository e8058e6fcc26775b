//! `zoo classify`: the top labels of an image, from an image classifier or, with
//! `--labels`, zero-shot from a CLIP model; or of texts, from a text classifier.

use anyhow::{bail, Context, Result};
use serde_json::json;
use zoo_runtime::device_map::DeviceMap;
use zoo_transformers::registry::Task;
use zoo_transformers::text_classification::{ClassificationFunction, TextClassifier};
use zoo_transformers::vision::{
    open_images_limited, ImageClassifier, Scored, ZeroShotImageClassifier,
    DEFAULT_HYPOTHESIS_TEMPLATE,
};
use zoo_transformers::{AutoConfig, LoadOptions};

/// Classify an image or texts and print the most probable labels with their scores.
///
/// A text classifier (any *ForSequenceClassification: BERT, RoBERTa, DistilBERT, ModernBERT,
/// a decoder's) scores each text given, as transformers' text-classification pipeline does:
/// a softmax over its labels, a sigmoid for one label or a multi-label problem_type
/// (--function overrides it); a text longer than the model takes is refused unless
/// --truncate cuts it.
///
/// An image classifier (ViTForImageClassification) scores its own labels (config.json's
/// id2label). With --labels, a CLIPModel scores the labels you give instead (zero-shot, as
/// transformers' zero-shot-image-classification pipeline): each label goes into --template,
/// the prompts are tokenized as CLIPProcessor does, and the softmax of logits_per_image ranks
/// them. The image (PNG or JPEG) is turned into pixel values by the model's
/// preprocessor_config.json, exactly as transformers' image processor does.
///
/// Examples:
///   zoo classify distilbert/distilbert-base-uncased-finetuned-sst-2-english "A wonderful film."
///   zoo classify ./sentiment-folder "Great!" "Awful." --json
///   zoo classify google/vit-base-patch16-224 cat.jpg
///   zoo classify ./vit-folder photo.png --top-k 3 --json
///   zoo classify openai/clip-vit-base-patch32 cat.jpg --labels "a cat,a dog,a car"
///   zoo classify ./clip cat.jpg --labels "cat,dog" --template "a photo of a {}"
#[derive(clap::Args)]
#[command(verbatim_doc_comment, after_help = zoo_transformers::registry::families_help(false))]
pub struct Args {
    /// Folder or Hub repo id `org/name[@revision]` of a text or image classifier or a
    /// CLIPModel.
    model: String,
    /// The image file, or for a text classifier the texts.
    #[arg(required = true)]
    inputs: Vec<String>,
    /// Comma-separated candidate labels for zero-shot classification (a CLIPModel).
    #[arg(long, value_delimiter = ',')]
    labels: Vec<String>,
    /// The prompt each zero-shot label is written into at `{}`; "{}" uses the labels as
    /// they are.
    #[arg(long, default_value = DEFAULT_HYPOTHESIS_TEMPLATE)]
    template: String,
    /// How many labels to print (all of them for zero-shot and text unless set).
    #[arg(long)]
    top_k: Option<usize>,
    /// A text classifier's scores: softmax, sigmoid or none (the logits); default as the
    /// pipeline chooses.
    #[arg(long)]
    function: Option<String>,
    /// Cut a text classifier's texts to the tokens the model takes instead of refusing them.
    #[arg(long)]
    truncate: bool,
    /// Where the model runs: cpu, cuda:N, pjrt:PLATFORM[:N,...], tpu, auto, balanced, or a
    /// FILE.json device map (see `zoo generate --help`).
    #[arg(long, default_value = "cpu")]
    device_map: String,
    /// Weight and activation dtype: f32, bf16 or f16 (default: the checkpoint's).
    #[arg(long)]
    dtype: Option<String>,
    #[command(flatten)]
    adapters: crate::load::AdapterArgs,
    /// Print a JSON list of {"label", "score"}, best first (for texts, one {"text", "labels"}
    /// per text).
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
    let config = AutoConfig::from_pretrained(&args.model)
        .with_context(|| format!("reading {}'s config", args.model))?;
    if config.task == Task::SequenceClassification {
        return classify_texts(&args, opts);
    }
    let [image] = args.inputs.as_slice() else {
        bail!(
            "{} classifies one image; {} inputs were given",
            config.architecture,
            args.inputs.len()
        );
    };
    let images = open_images_limited(
        &[std::path::PathBuf::from(image)],
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

/// The texts' labels from a text classifier.
fn classify_texts(args: &Args, opts: LoadOptions) -> Result<()> {
    if !args.labels.is_empty() {
        bail!("--labels is zero-shot image classification (a CLIPModel); a text classifier scores its own labels");
    }
    let function = match args.function.as_deref() {
        None => None,
        Some(name) => Some(
            ClassificationFunction::from_name(name)
                .with_context(|| format!("--function {name:?}: use softmax, sigmoid or none"))?,
        ),
    };
    let mut classifier = TextClassifier::load_pretrained(&args.model, opts)
        .with_context(|| format!("loading {}", args.model))?;
    if let Some(f) = function {
        classifier = classifier.with_function(f);
    }
    let texts: Vec<&str> = args.inputs.iter().map(String::as_str).collect();
    let mut rows = classifier.classify(&texts, args.truncate)?;
    for row in &mut rows {
        row.truncate(args.top_k.unwrap_or(row.len()));
    }
    if args.json {
        let list: Vec<_> = texts
            .iter()
            .zip(&rows)
            .map(|(text, row)| json!({"text": text, "labels": row}))
            .collect();
        outln!("{}", serde_json::to_string_pretty(&list)?);
        return Ok(());
    }
    let function = classifier.function();
    let width = rows
        .iter()
        .flatten()
        .map(|s| s.label.len())
        .max()
        .unwrap_or(0);
    for (text, row) in texts.iter().zip(&rows) {
        if texts.len() > 1 {
            outln!("{text}");
        }
        for s in row {
            match function {
                ClassificationFunction::None => outln!("{:>9.4}  {:<width$}", s.score, s.label),
                _ => outln!("{:>6.2}%  {:<width$}", s.score * 100.0, s.label),
            }
        }
    }
    Ok(())
}
