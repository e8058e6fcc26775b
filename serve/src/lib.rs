//! `zoo serve`: an OpenAI-compatible HTTP server over zoo-transformers' generation engine.
//!
//! This crate is HTTP only: routes, the OpenAI request and response bodies, server-sent
//! events, the bearer key, Prometheus metrics and the bound on waiting requests. It owns no
//! model logic. One worker thread owns the model's [`Engine`](zoo_transformers::Engine) and
//! advances it one step at a time; every request becomes sequences that join the running
//! batch at the next step (continuous batching) and leave when they stop, and a client that
//! disconnects cancels its sequences at the next step.
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

use zoo_transformers::{ChatTemplate, EngineConfig, TextGenerator};

pub use api::ApiError;

use metrics::Metrics;
use worker::Job;

/// How a server runs.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    /// The name clients send as `model` and `GET /v1/models` lists.
    pub served_model_name: String,
    /// The key clients must send as `Authorization: Bearer KEY` on `/v1/*`; none when `None`.
    pub api_key: Option<String>,
    /// Sequences that run at once (rows of the engine's KV cache).
    pub max_batch: usize,
    /// Requests that may wait for a row beyond those running; past it the server answers 429.
    pub max_waiting: usize,
    /// Token slots of the engine's KV cache timeline: a request's prompt plus its
    /// `max_tokens` must fit. `None`: the model's context, at most 4096.
    pub context: Option<usize>,
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
        }
    }
}

/// What every handler reads.
pub(crate) struct State {
    pub model: Arc<TextGenerator>,
    pub chat_template: Option<ChatTemplate>,
    pub options: ServeOptions,
    pub engine: EngineConfig,
    pub jobs: std::sync::Mutex<mpsc::Sender<Job>>,
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

/// A running server: the worker thread that drives the engine and the state the routes
/// share.
pub struct Server {
    state: Arc<State>,
    _worker: std::thread::JoinHandle<()>,
}

impl Server {
    /// Starts the worker thread over `model`. Fails when the options cannot be served (no
    /// tokenizer, a batch or context of zero, a context past the model's).
    pub fn start(model: TextGenerator, options: ServeOptions) -> Result<Server, ApiError> {
        let engine = worker::engine_config(&model, &options)?;
        let model = Arc::new(model);
        let chat_template = model.chat_template().ok();
        let (tx, rx) = mpsc::channel();
        let metrics = Arc::new(Metrics::default());
        let created = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let state = Arc::new(State {
            model: Arc::clone(&model),
            chat_template,
            options,
            engine,
            jobs: std::sync::Mutex::new(tx),
            metrics: Arc::clone(&metrics),
            in_flight: AtomicUsize::new(0),
            next_id: AtomicU64::new(0),
            created,
        });
        // The worker holds the model and the metrics, not the state: it ends once the
        // state's sender is gone and nothing runs.
        let worker = std::thread::Builder::new()
            .name("zoo-engine".into())
            .spawn(move || worker::run(&model, engine, rx, &metrics))
            .map_err(|e| ApiError::internal(format!("starting the engine thread: {e}")))?;
        Ok(Server {
            state,
            _worker: worker,
        })
    }

    /// The routes: `POST /v1/chat/completions`, `POST /v1/completions`, `GET /v1/models`,
    /// `GET /health`, `GET /metrics`.
    pub fn router(&self) -> axum::Router {
        routes::router(Arc::clone(&self.state))
    }

    /// The engine's shape: sequences at once and token slots.
    pub fn engine_config(&self) -> EngineConfig {
        self.state.engine
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
