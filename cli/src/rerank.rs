//! `zoo rerank`: documents scored against a query by a cross-encoder, highest first.

use anyhow::{bail, Context, Result};
use serde_json::json;
use zoo_runtime::device_map::DeviceMap;
use zoo_transformers::sentence::{CrossEncoder, ScoreActivation};
use zoo_transformers::LoadOptions;

/// Rerank documents against a query with a cross-encoder (sentence-transformers'
/// CrossEncoder): a sequence classifier with one label — ms-marco MiniLM rerankers (BERT),
/// bge-reranker (XLM-RoBERTa), a decoder family's *ForSequenceClassification — reads each
/// (query, document) pair as one input, cut longest-first to the model's length, and scores
/// it; the scores go through the model's activation (its config's activation_fn, else sigmoid
/// for one label) and print highest first.
///
/// Examples:
///   zoo rerank ./ms-marco-MiniLM-L6-v2 "How many people live in Berlin?" \
///       "Berlin has 3.5 million inhabitants." "New York is famous for its museums."
///   zoo rerank BAAI/bge-reranker-base "what is a panda?" "The giant panda is a bear." --json
///   zoo rerank ./reranker "query" "doc one" "doc two" --activation identity --top-k 1
#[derive(clap::Args)]
#[command(verbatim_doc_comment, after_help = zoo_transformers::registry::families_help(false))]
pub struct Args {
    /// Folder, .safetensors file, or Hub repo id `org/name[@revision]` of a cross-encoder.
    model: String,
    /// The query.
    query: String,
    /// The documents to score against it.
    #[arg(required = true)]
    documents: Vec<String>,
    /// Print only the best K documents.
    #[arg(long, value_name = "K")]
    top_k: Option<usize>,
    /// Override the score activation: sigmoid, identity (the raw logits) or tanh.
    #[arg(long)]
    activation: Option<String>,
    /// Where the model runs: cpu, cuda:N, pjrt:PLATFORM[:N,...], tpu, auto, balanced, or a
    /// FILE.json device map (see `zoo generate --help`).
    #[arg(long, default_value = "cpu")]
    device_map: String,
    /// Weight and activation dtype: f32, bf16 or f16 (default: the checkpoint's).
    #[arg(long)]
    dtype: Option<String>,
    #[command(flatten)]
    adapters: crate::load::AdapterArgs,
    /// Print the ranking as JSON (index, score and document of each).
    #[arg(long)]
    json: bool,
}

pub fn run(args: Args) -> Result<()> {
    let device_map: DeviceMap = args.device_map.parse().context("--device-map")?;
    let dtype = crate::load::dtype_flag(args.dtype.as_deref())?;
    let activation = match args.activation.as_deref() {
        None => None,
        Some("sigmoid") => Some(ScoreActivation::Sigmoid),
        Some("identity") => Some(ScoreActivation::Identity),
        Some("tanh") => Some(ScoreActivation::Tanh),
        Some(other) => bail!("--activation {other:?}: use sigmoid, identity or tanh"),
    };
    if args.top_k == Some(0) {
        bail!("--top-k 0 keeps no document: give at least 1");
    }
    let opts = LoadOptions {
        dtype,
        device_map,
        progress: true,
        adapters: args.adapters.parsed()?,
        ..Default::default()
    };
    let mut reranker = CrossEncoder::load_pretrained(&args.model, opts)
        .with_context(|| format!("loading {}", args.model))?;
    if let Some(a) = activation {
        reranker = reranker.with_activation(a);
    }
    let documents: Vec<&str> = args.documents.iter().map(String::as_str).collect();
    let mut ranked = reranker.rank(&args.query, &documents)?;
    ranked.truncate(args.top_k.unwrap_or(ranked.len()));
    if args.json {
        let out = json!({
            "model": args.model,
            "query": args.query,
            "activation": reranker.activation().name(),
            "results": ranked.iter().map(|r| json!({
                "index": r.index, "score": r.score, "document": documents[r.index],
            })).collect::<Vec<_>>(),
        });
        outln!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    outln!(
        "{} activation, pairs cut at {} tokens",
        reranker.activation().name(),
        reranker.max_length()
    );
    for (rank, r) in ranked.iter().enumerate() {
        outln!(
            "{:>3}. {:.6}  [{}] {}",
            rank + 1,
            r.score,
            r.index,
            documents[r.index]
        );
    }
    Ok(())
}
