//! `zoo embed`: sentence embeddings from an encoder, pooled as its sentence-transformers
//! folder says, or image embeddings from a vision model, with their cosine similarities.

use anyhow::{bail, Context, Result};
use serde_json::json;
use zoo_runtime::device_map::DeviceMap;
use zoo_transformers::sentence::{cosine_similarity, Pooling, SentenceEmbedder};
use zoo_transformers::vision::{open_images_limited, ImageEmbedder};
use zoo_transformers::LoadOptions;

/// Embed sentences with an encoder (a sentence-transformers folder such as
/// all-MiniLM-L6-v2, or a plain BERT checkpoint) or a decoder embedder (a decoder family's
/// base model with `lasttoken` pooling, as Qwen3-Embedding and gte-Qwen2 are published) and
/// print each embedding's norm and first values; with two or more sentences, their cosine
/// similarity matrix.
///
/// Pooling and normalisation come from the folder's modules.json (1_Pooling/config.json,
/// 2_Normalize) and inputs are cut at sentence_bert_config.json's max_seq_length, as
/// sentence-transformers does; a checkpoint without them is mean-pooled, not normalised, and
/// a CLIP text model with a projection (or a CLIPModel) gives its text_embeds.
///
/// --prompt-name puts one of the prompts the folder's config_sentence_transformers.json names
/// before every sentence (Qwen3-Embedding's `query` instruction, e5's "query: "), --prompt any
/// text; a folder's default_prompt_name applies when neither is given.
///
/// With --image, the inputs are image files (PNG, JPEG) instead, turned into pixel values by
/// the model's preprocessor_config.json: a CLIPModel or CLIPVisionModelWithProjection gives
/// its image_embeds, a ViTModel or CLIPVisionModel its pooled output.
///
/// Examples:
///   zoo embed ./all-MiniLM-L6-v2 "The capital of France is Paris." "Paris is in France."
///   zoo embed sentence-transformers/all-MiniLM-L6-v2 "Hello" --json
///   zoo embed ./bert-folder "one sentence" "another" --pooling cls --device-map pjrt:cpu
///   zoo embed ./Qwen3-Embedding-0.6B "What is the capital of China?" --prompt-name query
///   zoo embed openai/clip-vit-base-patch32 --image cat.jpg --image dog.png
#[derive(clap::Args)]
#[command(verbatim_doc_comment, after_help = zoo_transformers::registry::families_help(false))]
pub struct Args {
    /// Folder, .safetensors file, or Hub repo id `org/name[@revision]` of an encoder.
    model: String,
    /// The sentences to embed.
    #[arg(required_unless_present = "image", conflicts_with = "image")]
    sentences: Vec<String>,
    /// Put the model's prompt of this name before every sentence (config_sentence_transformers.json's
    /// `prompts`: Qwen3-Embedding's and e5's `query`, ...).
    #[arg(long, value_name = "NAME", conflicts_with = "prompt")]
    prompt_name: Option<String>,
    /// Put this text before every sentence (e.g. "query: ").
    #[arg(long, value_name = "TEXT")]
    prompt: Option<String>,
    /// Embed this image file instead (repeat for several).
    #[arg(long, value_name = "FILE")]
    image: Vec<std::path::PathBuf>,
    /// Override the pooling: cls, mean, max, mean_sqrt_len_tokens, lasttoken or projection
    /// (the model's projected embedding, CLIP's text_embeds: the default for CLIP text models
    /// with a projection).
    #[arg(long)]
    pooling: Option<String>,
    /// Where the model runs: cpu, cuda:N, pjrt:PLATFORM[:N,...], tpu, auto, balanced, or a
    /// FILE.json device map (see `zoo generate --help`).
    #[arg(long, default_value = "cpu")]
    device_map: String,
    /// Weight and activation dtype: f32, bf16 or f16 (default: the checkpoint's).
    #[arg(long)]
    dtype: Option<String>,
    #[command(flatten)]
    adapters: crate::load::AdapterArgs,
    /// Print every embedding in full, and the similarities, as JSON.
    #[arg(long)]
    json: bool,
    /// How many leading values of each embedding to print (without --json).
    #[arg(long, default_value_t = 8)]
    show: usize,
    /// Refuse an image whose header declares more pixels than this, before decoding it
    /// (Pillow's MAX_IMAGE_PIXELS by default: a few bytes can declare gigabytes); 0 for no
    /// limit, for trusted files.
    #[arg(long, value_name = "PIXELS", default_value_t = zoo_transformers::image_processing::MAX_IMAGE_PIXELS)]
    max_image_pixels: u64,
}

pub fn run(args: Args) -> Result<()> {
    let device_map: DeviceMap = args.device_map.parse().context("--device-map")?;
    let dtype = crate::load::dtype_flag(args.dtype.as_deref())?;
    let opts = LoadOptions {
        dtype,
        device_map,
        progress: true,
        adapters: args.adapters.parsed()?,
        ..Default::default()
    };
    if !args.image.is_empty() {
        return run_images(&args, opts);
    }
    let mut embedder = SentenceEmbedder::load_pretrained(&args.model, opts)
        .with_context(|| format!("loading {}", args.model))?;
    if let Some(p) = &args.pooling {
        let pooling = Pooling::parse(p).with_context(|| {
            format!("--pooling {p:?}: use cls, mean, max, mean_sqrt_len_tokens, lasttoken or projection")
        })?;
        embedder = embedder.with_pooling(pooling);
    }
    let sentences: Vec<&str> = args.sentences.iter().map(String::as_str).collect();
    let prompt = match (&args.prompt_name, &args.prompt) {
        (Some(name), _) => Some(
            embedder
                .prompt(name)
                .map_err(|e| anyhow::anyhow!("--prompt-name: {e}"))?
                .to_string(),
        ),
        (None, Some(text)) => Some(text.clone()),
        // The folder's default prompt, if it names one.
        (None, None) => match embedder.default_prompt_name() {
            Some(name) => Some(embedder.prompt(name)?.to_string()),
            None => None,
        },
    };
    let embeddings = embedder.embed_with_prompt(&sentences, prompt.as_deref())?;
    let similarity: Vec<Vec<f32>> = embeddings
        .iter()
        .map(|a| embeddings.iter().map(|b| cosine_similarity(a, b)).collect())
        .collect();
    if args.json {
        let out = json!({
            "model": args.model,
            "pooling": embedder.pooling().name(),
            "normalized": embedder.normalizes(),
            "prompt": prompt,
            "embeddings": sentences.iter().zip(&embeddings).map(|(s, e)| json!({"sentence": s, "embedding": e})).collect::<Vec<_>>(),
            "cosine_similarity": similarity,
        });
        outln!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    outln!(
        "{} dims, {} pooling{}, at most {} tokens",
        embeddings.first().map_or(0, Vec::len),
        embedder.pooling().name(),
        if embedder.normalizes() {
            ", normalized"
        } else {
            ""
        },
        embedder.max_seq_length()
    );
    print_table(&sentences, &embeddings, &similarity, args.show)?;
    Ok(())
}

/// `--image`: one embedding per image file.
fn run_images(args: &Args, opts: LoadOptions) -> Result<()> {
    if args.pooling.is_some() {
        bail!("--pooling applies to sentences; an image's embedding is the model's projection or pooled output");
    }
    if args.prompt_name.is_some() || args.prompt.is_some() {
        bail!("--prompt and --prompt-name apply to sentences, not images");
    }
    // The images first: a bad file fails before the model loads.
    let images = open_images_limited(&args.image, crate::pixel_limit(args.max_image_pixels))?;
    let embedder = ImageEmbedder::load_pretrained(&args.model, opts)
        .with_context(|| format!("loading {}", args.model))?;
    let embeddings = embedder.embed(&images)?;
    let similarity: Vec<Vec<f32>> = embeddings
        .iter()
        .map(|a| embeddings.iter().map(|b| cosine_similarity(a, b)).collect())
        .collect();
    let names: Vec<String> = args.image.iter().map(|p| p.display().to_string()).collect();
    if args.json {
        let out = json!({
            "model": args.model,
            "embedding": embedder.kind(),
            "embeddings": names.iter().zip(&embeddings).map(|(s, e)| json!({"image": s, "embedding": e})).collect::<Vec<_>>(),
            "cosine_similarity": similarity,
        });
        outln!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    outln!(
        "{} dims, {} embedding",
        embeddings.first().map_or(0, Vec::len),
        embedder.kind()
    );
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    print_table(&names, &embeddings, &similarity, args.show)?;
    Ok(())
}

fn print_table(
    inputs: &[&str],
    embeddings: &[Vec<f32>],
    similarity: &[Vec<f32>],
    show: usize,
) -> Result<()> {
    for (i, (s, e)) in inputs.iter().zip(embeddings).enumerate() {
        let norm = e.iter().map(|x| x * x).sum::<f32>().sqrt();
        let head: Vec<String> = e.iter().take(show).map(|x| format!("{x:.4}")).collect();
        outln!("[{i}] norm {norm:.4}  [{} ...]  {s}", head.join(", "));
    }
    if embeddings.len() > 1 {
        outln!("cosine similarity:");
        for (i, row) in similarity.iter().enumerate() {
            let cells: Vec<String> = row.iter().map(|c| format!("{c:7.4}")).collect();
            outln!("[{i}] {}", cells.join(" "));
        }
    }
    Ok(())
}
