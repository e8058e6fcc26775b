//! `zoo serve`: load a causal LM and answer OpenAI's API over HTTP.

use anyhow::{bail, Context, Result};
use zoo_serve::{ServeOptions, Served, Server};
use zoo_transformers::generation::BLOCK_SIZE;
use zoo_transformers::registry::Loaders;
use zoo_transformers::sentence::{CrossEncoder, SentenceEmbedder};
use zoo_transformers::text_classification::TextClassifier;
use zoo_transformers::{AutoConfig, AutoModelForCausalLM, LoadOptions};

use crate::load::{with_load_options, LoadArgs};

/// Serve a causal language model over an OpenAI-compatible HTTP API, batching requests
/// continuously: every request joins the running batch at the next decode step and leaves
/// when it stops (a long prompt joins in chunks of --max-step-tokens, so the others keep
/// their pace); a client that disconnects frees its rows at once; prompts that open with
/// a prompt already computed (a shared system prompt) reuse its keys and values. An encoder
/// checkpoint (a sentence-transformers folder such as all-MiniLM-L6-v2) serves embeddings,
/// pooled as `zoo embed` pools them; a sequence classifier with one label (a cross-encoder
/// reranker: ms-marco MiniLM, bge-reranker) serves reranking, scored as `zoo rerank` scores;
/// one of several labels (sentiment, topics, NLI) serves classification, scored as `zoo
/// classify` scores.
///
/// Routes:
///   POST /v1/chat/completions   messages through the model's chat template (stream: true
///                               for server-sent events ending with `data: [DONE]`)
///   POST /v1/completions        a prompt string, a list of them, or token ids
///   POST /v1/embeddings         (encoders) input strings or token ids; float or base64
///   POST /rerank                (rerankers) text-embeddings-inference's: query, texts,
///                               raw_scores, return_text; [{index, score, text}] best first
///   POST /v1/rerank             (rerankers) vLLM's and Jina's: model, query, documents,
///                               top_n, return_documents; results with relevance_score
///   POST /predict               (classifiers) text-embeddings-inference's: inputs (a text,
///                               a pair [a, b], or a batch of both), truncate, raw_scores;
///                               every label's {score, label} best first
///   POST /classify              (classifiers) vLLM's: model, input, truncate_prompt_tokens,
///                               use_activation; data of {index, label, probs, num_classes}
///   GET  /v1/models             the served model
///   GET  /health                200 while the server runs
///   GET  /metrics               Prometheus counters: running and waiting sequences,
///                               prompt and generated tokens, time to first token and
///                               inter-token latency histograms
///
/// Request fields: model, messages / prompt, max_tokens (max_completion_tokens), temperature
/// (0 is greedy), top_p, n, stop, seed, presence_penalty, frequency_penalty, logit_bias,
/// stream, stream_options.include_usage, and vLLM's extras top_k, min_p,
/// repetition_penalty, ignore_eos and min_tokens. What a request leaves out comes from the
/// model's generation_config.json, as vLLM does. Fields zoo does not apply yet (logprobs,
/// tools, response_format other than text) are refused with 400 naming the field;
/// unknown fields are ignored. Errors use OpenAI's body {"error": {"message", "type",
/// "param", "code"}}: 400 for a bad request, 401 for a missing or wrong key, 404 for
/// another model, 429 (with Retry-After) when --max-batch + --max-waiting requests are in
/// flight, 500 when a request fails inside the server (the server keeps serving).
///
/// Ctrl-C or SIGTERM stops accepting connections and finishes the requests that run.
///
/// Examples:
///   zoo serve ./SmolLM2-135M-Instruct.Q4_1.gguf --served-model-name smollm2
///   zoo serve HuggingFaceTB/SmolLM2-135M-Instruct --port 9000 --max-batch 32 --api-key s3cret
///   zoo serve ./all-MiniLM-L6-v2 --served-model-name minilm          # /v1/embeddings
///   zoo serve ./distilbert-sst-2 --served-model-name sentiment        # /predict, /classify
///   curl http://127.0.0.1:8080/v1/chat/completions -H 'Content-Type: application/json' \
///       -d '{"model": "smollm2", "messages": [{"role": "user", "content": "Hi!"}]}'
#[derive(clap::Args)]
#[command(verbatim_doc_comment, after_help = zoo_transformers::registry::families_help(true))]
pub struct Args {
    /// Folder (config.json + safetensors), .safetensors/.gguf file, or Hub repo id `org/name[@revision]`.
    model: String,
    /// Address to listen on; 127.0.0.1 keeps the server to this machine (0.0.0.0 opens it).
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on (0 picks a free one).
    #[arg(long, default_value_t = 8080)]
    port: u16,
    #[command(flatten)]
    load: LoadArgs,
    /// The name clients send as `model` (default: MODEL as given).
    #[arg(long)]
    served_model_name: Option<String>,
    /// Require `Authorization: Bearer KEY` on /v1/* (default: the ZOO_API_KEY variable; none
    /// when unset).
    #[arg(long)]
    api_key: Option<String>,
    /// Sequences that run at once (default 16). They share a paged KV cache of as many
    /// blocks as they need at the whole context or as memory holds (the host's, or a
    /// --max-memory cpu limit beside the weights; on a PJRT device nine tenths of what it has
    /// free after the weights), the last admitted preempted and run again later when blocks
    /// run out. A cache split over CPU and PJRT devices holds a row of the whole context per
    /// sequence instead, and the default is as many rows as memory holds, at most 16.
    #[arg(long)]
    max_batch: Option<usize>,
    /// Requests that may wait beyond --max-batch before the server answers 429.
    #[arg(long, default_value_t = 64)]
    max_waiting: usize,
    /// Tokens one sequence may hold: a prompt plus its max_tokens must fit (default: the
    /// model's context, at most 4096).
    #[arg(long)]
    context: Option<usize>,
    /// Tokens one step feeds at most, vLLM's --max-num-batched-tokens (default 2048, or
    /// --max-batch when larger): running sequences' next tokens first, then waiting prompts
    /// in arrival order, a prompt past what is left fed in chunks over the next steps. Lower
    /// keeps running streams smoother while long prompts join; at least --max-batch.
    #[arg(long)]
    max_step_tokens: Option<usize>,
}

/// `--max-batch` when memory holds it.
const DEFAULT_BATCH: usize = 16;

pub fn run(args: Args) -> Result<()> {
    let load = args.load.parsed()?;
    // An encoder's config names its family: it serves embeddings; anything else goes to the
    // causal path, whose errors say what the checkpoint is.
    let config = AutoConfig::from_pretrained(&args.model);
    let loaders = config.as_ref().map(|c| c.family.loaders);
    // A sequence classifier of one label serves as a reranker (a cross-encoder scores
    // query-document pairs), one of several classifies; any other encoder embeds.
    let classifier = config
        .as_ref()
        .is_ok_and(|c| c.task == zoo_transformers::registry::Task::SequenceClassification);
    if let Ok(Loaders::Seq2Seq { .. }) = loaders {
        bail!(
            "{} is an encoder-decoder: zoo serve runs decoders (chat and completions) and \
             encoders (embeddings); its engine decodes only the batch one encoder pass read, so \
             requests could not join it. Generate with `zoo generate` or AutoModelForSeq2SeqLM",
            args.model
        );
    }
    let encoder = matches!(loaders, Ok(Loaders::Encoder(_)));
    let opts = LoadOptions {
        dtype: load.dtype,
        revision: load.revision.clone(),
        max_memory: load.max_memory.clone(),
        progress: true,
        device_map: load.device_map.clone(),
        adapters: load.adapters.clone(),
    };
    let labels = config.as_ref().map_or(0, |c| c.num_labels());
    let model: Served = if classifier && labels > 1 {
        TextClassifier::load_pretrained(&args.model, opts)
            .with_context(|| format!("loading {}", args.model))?
            .into()
    } else if classifier {
        CrossEncoder::load_pretrained(&args.model, opts)
            .with_context(|| format!("loading {}", args.model))?
            .into()
    } else if encoder {
        SentenceEmbedder::load_pretrained(&args.model, opts)
            .with_context(|| format!("loading {}", args.model))?
            .into()
    } else {
        let builder = AutoModelForCausalLM::builder(&args.model);
        let model = with_load_options!(builder, load)
            .load()
            .with_context(|| format!("loading {}", args.model))?;
        if let Some(plan) = &model.load_report().plan {
            eprint!("{plan}");
        }
        model.into()
    };
    let max_batch = match (&model, args.max_batch) {
        (_, Some(n)) => n,
        (Served::Text(m), None) => {
            let n = zoo_serve::batch_that_fits(m, args.context, DEFAULT_BATCH)?;
            if n < DEFAULT_BATCH {
                eprintln!(
                    "note: --max-batch {n}: what memory holds of the KV cache at this context (pass --max-batch or --context to choose)"
                );
            }
            n
        }
        (Served::Embeddings(_) | Served::Rerank(_) | Served::Classify(_), None) => DEFAULT_BATCH,
    };
    let options = ServeOptions {
        served_model_name: args.served_model_name.unwrap_or_else(|| args.model.clone()),
        api_key: args
            .api_key
            .or_else(|| std::env::var("ZOO_API_KEY").ok().filter(|k| !k.is_empty())),
        max_batch,
        max_waiting: args.max_waiting,
        context: args.context,
        max_step_tokens: args.max_step_tokens,
    };
    let name = options.served_model_name.clone();
    let server = Server::start(model, options)?;
    let engine = server.engine_config();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the HTTP runtime")?;
    runtime.block_on(async move {
        let address = format!("{}:{}", args.host, args.port);
        let listener = tokio::net::TcpListener::bind(&address)
            .await
            .with_context(|| format!("listening on {address} (--host, --port)"))?;
        let bound = listener.local_addr()?;
        match engine {
            Some(e) => {
                let cache = match e.kv_blocks {
                    Some(n) => format!(
                        "up to {} tokens each, sharing {n} KV blocks of {BLOCK_SIZE} tokens",
                        e.capacity
                    ),
                    None => format!("{} token slots", e.capacity),
                };
                eprintln!(
                    "zoo serve: `{name}` at http://{bound}/v1 ({} sequences at once, {cache}); Ctrl-C stops",
                    e.max_sequences
                )
            }
            None => eprintln!(
                "zoo serve: `{name}` at http://{bound} ({}); Ctrl-C stops",
                server.serves()
            ),
        }
        server.serve(listener, shutdown()).await?;
        eprintln!("zoo serve: stopped");
        Ok(())
    })
}

/// Completes at Ctrl-C or SIGTERM.
async fn shutdown() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = term => {}
    }
}
