//! `zoo serve`: an OpenAI-compatible HTTP server over zoo-transformers' generation engine.
//!
//! This crate is HTTP only: routes, the OpenAI request and response bodies, server-sent
//! events, the bearer key, Prometheus metrics and the bound on waiting requests. It owns no
//! model logic. For a language model, one worker thread owns the model's
//! [`Engine`](zoo_transformers::Engine) and advances it one step at a time; every request
//! becomes sequences that join the running batch at the next step (continuous batching)
//! and leave when they stop, and a client that disconnects cancels its sequences at the next
//! step. A sentence encoder ([`SentenceEmbedder`]) answers `/v1/embeddings` instead, a
//! cross-encoder ([`CrossEncoder`]) `/rerank` and `/v1/rerank`, a text classifier of several
//! labels ([`TextClassifier`]) `/predict` and `/classify`.
//!
//! ```no_run
//! use zoo_serve::{ServeOptions, Server};
//! use zoo_transformers::AutoModelForCausalLM;
//! use zoo_runtime::device_map::DeviceMap;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let model = AutoModelForCausalLM::load_pretrained("./SmolLM2-135M-Instruct.Q4_1.gguf", DeviceMap::Cpu)?;
//! let server = Server::start(model, ServeOptions::new("smollm2"))?;
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
//! server.serve(listener, std::future::pending()).await?;
//! # Ok(())
//! # }
//! ```

mod api;
mod metrics;
mod routes;
mod stop;
mod worker;

use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{SystemTime, UNIX_EPOCH};

use zoo_transformers::sentence::{CrossEncoder, SentenceEmbedder};
use zoo_transformers::text_classification::TextClassifier;
use zoo_transformers::{ChatTemplate, EngineConfig, TextGenerator};

pub use api::ApiError;
pub use worker::batch_that_fits;

use metrics::Metrics;
use worker::Job;

/// How a server runs.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    /// The name clients send as `model` and `GET /v1/models` lists.
    pub served_model_name: String,
    /// The key clients must send as `Authorization: Bearer KEY` on `/v1/*`; none when `None`.
    pub api_key: Option<String>,
    /// Sequences that run at once (rows of the engine's batch; on CPU/CUDA they share the
    /// blocks of a paged KV cache).
    pub max_batch: usize,
    /// Requests that may wait for a row beyond those running; past it the server answers 429.
    pub max_waiting: usize,
    /// Tokens one sequence may hold: a request's prompt plus its `max_tokens` must fit.
    /// `None`: the model's context, at most 4096.
    pub context: Option<usize>,
    /// Tokens one engine step feeds at most (vLLM's `max_num_batched_tokens`): a prompt past
    /// what the running sequences leave joins in chunks over several steps, so that they
    /// keep their pace. `None`: 2048, or `max_batch` when larger (vLLM's default for its
    /// server). Paged caches only.
    pub max_step_tokens: Option<usize>,
}

impl ServeOptions {
    /// Defaults: no key, 16 sequences at once, 64 waiting, the model's context (≤ 4096).
    pub fn new(served_model_name: impl Into<String>) -> ServeOptions {
        ServeOptions {
            served_model_name: served_model_name.into(),
            api_key: None,
            max_batch: 16,
            max_waiting: 64,
            context: None,
            max_step_tokens: None,
        }
    }
}

/// What a server serves.
pub enum Served {
    /// A causal LM: `/v1/completions` and `/v1/chat/completions`.
    Text(Box<TextGenerator>),
    /// A sentence encoder with its pooling: `/v1/embeddings`.
    Embeddings(Box<SentenceEmbedder>),
    /// A cross-encoder with one label: `/rerank` (text-embeddings-inference's shape) and
    /// `/v1/rerank` (vLLM's and Jina's).
    Rerank(Box<CrossEncoder>),
    /// A sequence classifier of several labels: `/predict` (text-embeddings-inference's
    /// shape) and `/classify` (vLLM's).
    Classify(Box<TextClassifier>),
}

impl From<TextClassifier> for Served {
    fn from(m: TextClassifier) -> Served {
        Served::Classify(Box::new(m))
    }
}

impl From<CrossEncoder> for Served {
    fn from(m: CrossEncoder) -> Served {
        Served::Rerank(Box::new(m))
    }
}

impl From<TextGenerator> for Served {
    fn from(m: TextGenerator) -> Served {
        Served::Text(Box::new(m))
    }
}

impl From<SentenceEmbedder> for Served {
    fn from(m: SentenceEmbedder) -> Served {
        Served::Embeddings(Box::new(m))
    }
}

/// The model side of the routes.
pub(crate) enum Backend {
    /// Requests go to the engine's worker thread.
    Text {
        model: Arc<TextGenerator>,
        chat_template: Option<Box<ChatTemplate>>,
        engine: EngineConfig,
        jobs: std::sync::Mutex<mpsc::Sender<Job>>,
    },
    /// Requests embed on the blocking pool, one batch at a time.
    Embeddings {
        embedder: Arc<SentenceEmbedder>,
        busy: Arc<std::sync::Mutex<()>>,
    },
    /// Requests rerank on the blocking pool, one batch at a time.
    Rerank {
        reranker: Arc<CrossEncoder>,
        busy: Arc<std::sync::Mutex<()>>,
    },
    /// Requests classify on the blocking pool, one batch at a time.
    Classify {
        classifier: Arc<TextClassifier>,
        busy: Arc<std::sync::Mutex<()>>,
    },
}

impl Backend {
    /// What this server does and where, for a request sent to another route.
    pub(crate) fn serves(&self) -> &'static str {
        match self {
            Backend::Text { .. } => "generates text (/v1/chat/completions, /v1/completions)",
            Backend::Embeddings { .. } => "embeds text (/v1/embeddings)",
            Backend::Rerank { .. } => "reranks documents (/rerank, /v1/rerank)",
            Backend::Classify { .. } => "classifies text (/predict, /classify)",
        }
    }
}

/// What every handler reads.
pub(crate) struct State {
    pub backend: Backend,
    pub options: ServeOptions,
    pub metrics: Arc<Metrics>,
    /// Requests accepted and not yet answered in full.
    pub in_flight: AtomicUsize,
    next_id: AtomicU64,
    pub created: u64,
}

impl State {
    /// A fresh response id with `prefix` (`chatcmpl`, `cmpl`).
    pub fn response_id(&self, prefix: &str) -> String {
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        format!("{prefix}-{:x}{n:06x}", self.created)
    }
}

/// A running server: the state the routes share and, for a language model, the worker
/// thread that drives its engine.
pub struct Server {
    state: Arc<State>,
    _worker: Option<std::thread::JoinHandle<()>>,
}

impl Server {
    /// Starts serving `model` (a [`TextGenerator`], [`SentenceEmbedder`], [`CrossEncoder`] or
    /// [`TextClassifier`]). Fails when the options cannot be served (no tokenizer, a batch or
    /// context of zero, a context past the model's).
    pub fn start(model: impl Into<Served>, options: ServeOptions) -> Result<Server, ApiError> {
        if options.max_batch == 0 {
            return Err(ApiError::invalid(
                "max_batch",
                "--max-batch must be at least 1",
            ));
        }
        let metrics = Arc::new(Metrics::default());
        let created = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let state = |backend| State {
            backend,
            options: options.clone(),
            metrics: Arc::clone(&metrics),
            in_flight: AtomicUsize::new(0),
            next_id: AtomicU64::new(0),
            created,
        };
        // The models other than a language model run on tokio's blocking pool.
        let pooled = |backend| {
            Ok(Server {
                state: Arc::new(state(backend)),
                _worker: None,
            })
        };
        let model = match model.into() {
            Served::Embeddings(embedder) => {
                return pooled(Backend::Embeddings {
                    embedder: Arc::from(embedder),
                    busy: Arc::default(),
                })
            }
            Served::Rerank(reranker) => {
                if reranker.labels().len() != 1 {
                    return Err(ApiError::invalid(
                        "model",
                        format!(
                            "a reranker scores each pair once; this classifier has {} labels",
                            reranker.labels().len()
                        ),
                    ));
                }
                return pooled(Backend::Rerank {
                    reranker: Arc::from(reranker),
                    busy: Arc::default(),
                });
            }
            Served::Classify(classifier) => {
                return pooled(Backend::Classify {
                    classifier: Arc::from(classifier),
                    busy: Arc::default(),
                })
            }
            Served::Text(model) => model,
        };
        let engine = worker::engine_config(&model, &options)?;
        let model: Arc<TextGenerator> = Arc::from(model);
        let (tx, rx) = mpsc::channel();
        let backend = Backend::Text {
            model: Arc::clone(&model),
            chat_template: model.chat_template().ok().map(Box::new),
            engine,
            jobs: std::sync::Mutex::new(tx),
        };
        let worker_metrics = Arc::clone(&metrics);
        // The worker holds the model and the metrics, not the state: it ends once the
        // state's sender is gone and nothing runs.
        let worker = std::thread::Builder::new()
            .name("zoo-engine".into())
            .spawn(move || worker::run(&model, engine, rx, &worker_metrics))
            .map_err(|e| ApiError::internal(format!("starting the engine thread: {e}")))?;
        Ok(Server {
            state: Arc::new(state(backend)),
            _worker: Some(worker),
        })
    }

    /// The routes: `POST /v1/chat/completions`, `POST /v1/completions`, `POST
    /// /v1/embeddings`, `POST /rerank`, `POST /v1/rerank`, `POST /predict`, `POST /classify`,
    /// `GET /v1/models`, `GET /health`, `GET /metrics`.
    pub fn router(&self) -> axum::Router {
        routes::router(Arc::clone(&self.state))
    }

    /// What the server does and on which routes (`"embeds text (/v1/embeddings)"`).
    pub fn serves(&self) -> &'static str {
        self.state.backend.serves()
    }

    /// The engine's shape (sequences at once, tokens each, KV blocks when paged) of a
    /// language model's server.
    pub fn engine_config(&self) -> Option<EngineConfig> {
        match &self.state.backend {
            Backend::Text { engine, .. } => Some(*engine),
            _ => None,
        }
    }

    /// Serves on `listener` until `shutdown` completes, then stops accepting and finishes
    /// the requests that run.
    pub async fn serve(
        self,
        listener: tokio::net::TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        axum::serve(listener, self.router())
            .with_graceful_shutdown(shutdown)
            .await
    }
}
