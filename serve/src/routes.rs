//! The routes: OpenAI's completions and chat completions (whole or streamed as server-sent
//! events), embeddings, the model list, health and metrics.

use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::State as Shared;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use zoo_transformers::generation::GenerationOutput;
use zoo_transformers::sentence::ScoreActivation;
use zoo_transformers::text_classification::{ClassificationFunction, TextInput};

use crate::api::{self, Completion, Prompt};
use crate::stop::StopText;
use crate::worker::{Job, Update};
use crate::{ApiError, Backend, State};

pub(crate) fn router(state: Arc<State>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/embeddings", post(embeddings))
        .route("/rerank", post(rerank_tei))
        .route("/v1/rerank", post(rerank_v1))
        .route("/predict", post(predict))
        .route("/classify", post(classify_v1))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .with_state(state)
}

/// Chat completions or plain completions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Chat,
    Text,
}

impl Kind {
    fn object(self, streamed: bool) -> &'static str {
        match (self, streamed) {
            (Kind::Chat, false) => "chat.completion",
            (Kind::Chat, true) => "chat.completion.chunk",
            (Kind::Text, _) => "text_completion",
        }
    }
}

async fn chat(Shared(s): Shared<Arc<State>>, headers: HeaderMap, body: Bytes) -> Response {
    answer(&s, generate(&s, &headers, &body, Kind::Chat).await)
}

async fn completions(Shared(s): Shared<Arc<State>>, headers: HeaderMap, body: Bytes) -> Response {
    answer(&s, generate(&s, &headers, &body, Kind::Text).await)
}

fn answer(s: &State, r: Result<Response, ApiError>) -> Response {
    r.unwrap_or_else(|e| {
        s.metrics.requests_failed.fetch_add(1, Ordering::Relaxed);
        e.into_response()
    })
}

async fn models(Shared(s): Shared<Arc<State>>, headers: HeaderMap) -> Response {
    if let Err(e) = authorize(&s, &headers) {
        return e.into_response();
    }
    Json(json!({
        "object": "list",
        "data": [{
            "id": s.options.served_model_name,
            "object": "model",
            "created": s.created,
            "owned_by": "zoo",
            "max_model_len": match &s.backend {
                Backend::Text { engine, .. } => engine.capacity,
                Backend::Embeddings { embedder, .. } => embedder.max_seq_length(),
                Backend::Rerank { reranker, .. } => reranker.max_length(),
                Backend::Classify { classifier, .. } => classifier.max_length(),
            },
        }],
    }))
    .into_response()
}

async fn health() -> StatusCode {
    StatusCode::OK
}

async fn metrics(Shared(s): Shared<Arc<State>>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        s.metrics.render(),
    )
        .into_response()
}

async fn not_found() -> ApiError {
    ApiError {
        status: StatusCode::NOT_FOUND,
        message: "no such route; this server answers /v1/chat/completions, /v1/completions, /v1/embeddings, /rerank, /v1/rerank, /predict, /classify, /v1/models, /health and /metrics".into(),
        kind: "invalid_request_error",
        param: None,
        code: None,
    }
}

/// With a key set, `/v1/*` needs `Authorization: Bearer KEY`.
fn authorize(s: &State, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(key) = &s.options.api_key else {
        return Ok(());
    };
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    if given == Some(key.as_str()) {
        return Ok(());
    }
    Err(ApiError {
        status: StatusCode::UNAUTHORIZED,
        message: match given {
            None => "this server needs an API key: send `Authorization: Bearer KEY`".into(),
            Some(_) => "the API key is wrong".into(),
        },
        kind: "authentication_error",
        param: None,
        code: Some("invalid_api_key"),
    })
}

/// A request counted against the queue bound until its answer is complete.
struct Admitted(Arc<State>);

impl Admitted {
    fn new(s: &Arc<State>) -> Result<Admitted, ApiError> {
        let limit = s.options.max_batch + s.options.max_waiting;
        let before = s.in_flight.fetch_add(1, Ordering::AcqRel);
        if before >= limit {
            s.in_flight.fetch_sub(1, Ordering::AcqRel);
            return Err(ApiError {
                status: StatusCode::TOO_MANY_REQUESTS,
                message: format!(
                    "{before} requests run or wait, the most this server takes (--max-batch + --max-waiting); retry later"
                ),
                kind: "rate_limit_error",
                param: None,
                code: Some("queue_full"),
            });
        }
        Ok(Admitted(Arc::clone(s)))
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Reads the request, submits its sequences and answers, whole or streamed.
async fn generate(
    s: &Arc<State>,
    headers: &HeaderMap,
    body: &[u8],
    kind: Kind,
) -> Result<Response, ApiError> {
    authorize(s, headers)?;
    let body = api::object(body)?;
    api::check_model(&body, &s.options.served_model_name)?;
    let Backend::Text {
        model,
        chat_template,
        engine,
        jobs,
    } = &s.backend
    else {
        return Err(ApiError::invalid(
            "model",
            format!(
                "`{}` {}; it does not generate: serve a causal language model for completions",
                s.options.served_model_name,
                s.backend.serves()
            ),
        ));
    };
    let mut images = Vec::new();
    let prompts = match kind {
        Kind::Chat => {
            let (messages, given) = api::messages(&body)?;
            if !given.is_empty() && model.model().vision().is_none() {
                return Err(ApiError::invalid(
                    "messages",
                    format!(
                        "`{}` reads text only; image_url parts need a vision-language model",
                        s.options.served_model_name
                    ),
                ));
            }
            images = given;
            let Some(template) = chat_template else {
                return Err(ApiError::invalid(
                    "messages",
                    "this model has no chat template; send a prompt to /v1/completions",
                ));
            };
            let text = template
                .apply(&messages, true)
                .map_err(|e| ApiError::invalid("messages", e.to_string()))?;
            vec![Prompt::Text { text, chat: true }]
        }
        Kind::Text => api::prompts(&body)?,
    };
    let req = api::completion(
        &body,
        prompts,
        model.default_options(),
        engine.max_sequences,
    )?;
    // A vision-language model's chat prompt is tokenized as its processor does, each image
    // placeholder expanded; the images become pixel values here and features in the engine.
    let vision_chat = kind == Kind::Chat && model.model().vision().is_some();
    let mut pixels = None;
    let ids = req
        .prompts
        .iter()
        .map(|p| match p {
            Prompt::Text { text, .. } if vision_chat => {
                let (ids, px) = model.image_prompt(text, &images)?;
                pixels = px;
                Ok(ids)
            }
            Prompt::Text { text, chat } => model.encode(text, *chat),
            Prompt::Ids(ids) => Ok(ids.clone()),
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| ApiError::from_model(&e))?;

    let mut opts = req.opts.clone();
    let longest = ids.iter().map(Vec::len).max().unwrap_or(0);
    if longest >= engine.capacity {
        return Err(ApiError::invalid(
            if kind == Kind::Chat {
                "messages"
            } else {
                "prompt"
            },
            format!(
                "the prompt has {longest} tokens; this server's context is {} (--context)",
                engine.capacity
            ),
        ));
    }
    if !req.max_tokens_given {
        // As OpenAI: without max_tokens a completion may fill the context.
        opts.max_new_tokens = engine.capacity - longest;
    }
    let admitted = Admitted::new(s)?;
    let (tx, rx) = mpsc::unbounded_channel();
    let prompt_tokens: usize = ids.iter().map(Vec::len).sum();
    let job = Job {
        prompts: ids
            .iter()
            .flat_map(|p| std::iter::repeat_n(p.clone(), req.n))
            .collect(),
        pixels,
        n: req.n,
        opts,
        updates: tx,
        arrived: Instant::now(),
    };
    let choices = job.prompts.len();
    jobs.lock()
        .map_err(|_| ApiError::internal("the engine's queue is poisoned"))?
        .send(job)
        .map_err(|_| ApiError::internal("the engine has stopped"))?;
    let reply = Reply {
        id: s.response_id(if kind == Kind::Chat {
            "chatcmpl"
        } else {
            "cmpl"
        }),
        created: now(),
        model: s.options.served_model_name.clone(),
        kind,
        prompt_tokens,
        stops: req.opts.stop_strings.clone(),
    };
    if req.stream {
        Ok(stream(Arc::clone(s), reply, &req, choices, rx, admitted))
    } else {
        let out = whole(s, &reply, choices, rx).await;
        drop(admitted);
        out
    }
}

async fn embeddings(Shared(s): Shared<Arc<State>>, headers: HeaderMap, body: Bytes) -> Response {
    answer(&s, embed(&s, &headers, &body).await)
}

async fn rerank_tei(Shared(s): Shared<Arc<State>>, headers: HeaderMap, body: Bytes) -> Response {
    answer(&s, rerank(&s, &headers, &body, RerankApi::Tei).await)
}

async fn rerank_v1(Shared(s): Shared<Arc<State>>, headers: HeaderMap, body: Bytes) -> Response {
    answer(&s, rerank(&s, &headers, &body, RerankApi::V1).await)
}

/// Runs a request's `work` on tokio's blocking pool, one request at a time per model (its
/// threads serve one request well); `what` names the task if it fails outside the model.
async fn one_at_a_time<T: Send + 'static>(
    busy: &Arc<std::sync::Mutex<()>>,
    what: &str,
    work: impl FnOnce() -> zoo_transformers::Result<T> + Send + 'static,
) -> Result<zoo_transformers::Result<T>, ApiError> {
    let busy = Arc::clone(busy);
    tokio::task::spawn_blocking(move || {
        let _one = busy.lock();
        work()
    })
    .await
    .map_err(|e| ApiError::internal(format!("the {what} task failed: {e}")))
}

/// Which rerank API a request speaks.
#[derive(Clone, Copy, PartialEq, Eq)]
enum RerankApi {
    /// text-embeddings-inference's `/rerank`: `texts`, `raw_scores`, `return_text`; a list
    /// of `{index, score, text?}`.
    Tei,
    /// vLLM's and Jina's `/v1/rerank`: `model`, `documents`, `top_n`, `return_documents`;
    /// `results` of `{index, relevance_score, document?}` and `usage`.
    V1,
}

/// Pairs scored per forward pass.
const RERANK_BATCH: usize = 32;

/// The documents of a request scored against its query by the cross-encoder, best first.
async fn rerank(
    s: &Arc<State>,
    headers: &HeaderMap,
    body: &[u8],
    kind: RerankApi,
) -> Result<Response, ApiError> {
    authorize(s, headers)?;
    let body = api::object(body)?;
    if kind == RerankApi::V1 {
        api::check_model(&body, &s.options.served_model_name)?;
    }
    let Backend::Rerank { reranker, busy } = &s.backend else {
        return Err(ApiError::invalid(
            "model",
            format!(
                "`{}` {}; it does not rerank: serve a cross-encoder (a sequence classifier with one label) for /rerank",
                s.options.served_model_name,
                s.backend.serves()
            ),
        ));
    };
    let key = if kind == RerankApi::Tei {
        "texts"
    } else {
        "documents"
    };
    let request = api::rerank_request(&body, key)?;
    let raw = kind == RerankApi::Tei && api::flag(&body, "raw_scores", false)?;
    let return_text = match kind {
        RerankApi::Tei => api::flag(&body, "return_text", false)?,
        RerankApi::V1 => api::flag(&body, "return_documents", true)?,
    };
    let top_n = match kind {
        RerankApi::Tei => None,
        RerankApi::V1 => api::positive(&body, "top_n")?,
    };
    let _admitted = Admitted::new(s)?;
    let reranker = Arc::clone(reranker);
    let documents = request.documents.clone();
    let done = one_at_a_time(busy, "rerank", move || {
        let activation = if raw {
            ScoreActivation::Identity
        } else {
            reranker.activation()
        };
        let (mut scores, mut tokens) = (Vec::with_capacity(documents.len()), 0);
        for chunk in documents.chunks(RERANK_BATCH) {
            let pairs: Vec<(&str, &str)> = chunk
                .iter()
                .map(|d| (request.query.as_str(), d.as_str()))
                .collect();
            let (s, t) = reranker.predict_with(&pairs, activation)?;
            scores.extend(s.into_iter().map(|row| row[0]));
            tokens += t;
        }
        Ok::<_, zoo_transformers::Error>((scores, tokens))
    })
    .await?;
    let (scores, tokens) = done.map_err(|e| ApiError::from_model(&e))?;
    let mut order: Vec<usize> = (0..scores.len()).collect();
    order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]));
    order.truncate(top_n.unwrap_or(order.len()));
    s.metrics
        .prompt_tokens
        .fetch_add(tokens as u64, Ordering::Relaxed);
    s.metrics.requests_ok.fetch_add(1, Ordering::Relaxed);
    let text = |i: usize| request.documents[i].clone();
    Ok(match kind {
        RerankApi::Tei => Json(Value::Array(
            order
                .iter()
                .map(|&i| {
                    let mut r = json!({"index": i, "score": scores[i]});
                    if return_text {
                        r["text"] = json!(text(i));
                    }
                    r
                })
                .collect(),
        ))
        .into_response(),
        RerankApi::V1 => Json(json!({
            "id": s.response_id("rerank"),
            "model": s.options.served_model_name,
            "usage": {"total_tokens": tokens},
            "results": order.iter().map(|&i| {
                let mut r = json!({"index": i, "relevance_score": scores[i]});
                if return_text {
                    r["document"] = json!({"text": text(i)});
                }
                r
            }).collect::<Vec<_>>(),
        }))
        .into_response(),
    })
}

async fn predict(Shared(s): Shared<Arc<State>>, headers: HeaderMap, body: Bytes) -> Response {
    answer(&s, classify(&s, &headers, &body, ClassifyApi::Tei).await)
}

async fn classify_v1(Shared(s): Shared<Arc<State>>, headers: HeaderMap, body: Bytes) -> Response {
    answer(&s, classify(&s, &headers, &body, ClassifyApi::V1).await)
}

/// Which classification API a request speaks.
#[derive(Clone, Copy, PartialEq, Eq)]
enum ClassifyApi {
    /// text-embeddings-inference's `/predict`: `inputs` (texts or pairs), `truncate`,
    /// `raw_scores`; every label's `{score, label}` best first, a list per input for a batch.
    Tei,
    /// vLLM's `/classify`: `model`, `input`, `truncate_prompt_tokens`, `use_activation`;
    /// `data` of `{index, label, probs, num_classes}` and `usage`.
    V1,
}

/// Inputs classified per forward pass.
const CLASSIFY_BATCH: usize = 32;

/// Every label's score for each input of a request, as `zoo classify` scores them (the
/// `text-classification` pipeline's function: softmax over several labels, a sigmoid each for
/// a multi-label classifier).
async fn classify(
    s: &Arc<State>,
    headers: &HeaderMap,
    body: &[u8],
    kind: ClassifyApi,
) -> Result<Response, ApiError> {
    authorize(s, headers)?;
    let body = api::object(body)?;
    if kind == ClassifyApi::V1 {
        api::check_model(&body, &s.options.served_model_name)?;
    }
    let Backend::Classify { classifier, busy } = &s.backend else {
        return Err(ApiError::invalid(
            "model",
            format!(
                "`{}` {}; it does not classify: serve a sequence classifier of several labels for /predict and /classify",
                s.options.served_model_name,
                s.backend.serves()
            ),
        ));
    };
    let (inputs, batch) = match kind {
        ClassifyApi::Tei => api::predict_inputs(&body)?,
        ClassifyApi::V1 => (api::classify_inputs(&body)?, true),
    };
    let max = classifier.max_length();
    let (truncate, raw) = match kind {
        ClassifyApi::Tei => {
            if let Some(d) = body.get("truncation_direction").filter(|d| !d.is_null()) {
                if !d.as_str().is_some_and(|d| d.eq_ignore_ascii_case("right")) {
                    return Err(ApiError::invalid(
                        "truncation_direction",
                        format!("`truncation_direction` is {d}; zoo cuts texts on the right only"),
                    ));
                }
            }
            (
                api::flag(&body, "truncate", false)?.then_some(max),
                api::flag(&body, "raw_scores", false)?,
            )
        }
        ClassifyApi::V1 => {
            let truncate = match api::integer(&body, "truncate_prompt_tokens")? {
                None => None,
                Some(-1) => Some(max),
                Some(n) if n > 0 => Some(n as usize),
                Some(n) => {
                    return Err(ApiError::invalid(
                        "truncate_prompt_tokens",
                        format!("`truncate_prompt_tokens` is {n}; give a positive count, or -1 for the model's length"),
                    ))
                }
            };
            (truncate, !api::flag(&body, "use_activation", true)?)
        }
    };
    let _admitted = Admitted::new(s)?;
    let model = Arc::clone(classifier);
    let done = one_at_a_time(busy, "classify", move || {
        let function = if raw {
            ClassificationFunction::None
        } else {
            model.function()
        };
        let (mut scored, mut tokens) = (Vec::with_capacity(inputs.len()), 0);
        for chunk in inputs.chunks(CLASSIFY_BATCH) {
            let texts: Vec<TextInput> = chunk
                .iter()
                .map(|(a, b)| match b {
                    Some(b) => TextInput::Pair(a, b),
                    None => TextInput::Text(a),
                })
                .collect();
            let (s, t) = model.classify_with(&texts, truncate, function)?;
            scored.extend(s);
            tokens += t;
        }
        Ok::<_, zoo_transformers::Error>((scored, tokens))
    })
    .await?;
    let (scored, tokens) = done.map_err(|e| ApiError::from_model(&e))?;
    s.metrics
        .prompt_tokens
        .fetch_add(tokens as u64, Ordering::Relaxed);
    s.metrics.requests_ok.fetch_add(1, Ordering::Relaxed);
    let predictions = |labels: &[zoo_transformers::vision::Scored]| -> Value {
        labels
            .iter()
            .map(|l| json!({"score": l.score, "label": l.label}))
            .collect()
    };
    Ok(match kind {
        ClassifyApi::Tei if batch => Json(Value::Array(
            scored.iter().map(|l| predictions(l)).collect(),
        ))
        .into_response(),
        ClassifyApi::Tei => Json(predictions(&scored[0])).into_response(),
        ClassifyApi::V1 => {
            // Scores in label order, the best one's label.
            let data: Vec<Value> = scored
                .iter()
                .enumerate()
                .map(|(index, row)| {
                    let probs: Vec<f32> = classifier
                        .labels()
                        .iter()
                        .map(|name| {
                            row.iter()
                                .find(|l| &l.label == name)
                                .map_or(f32::NAN, |l| l.score)
                        })
                        .collect();
                    json!({
                        "index": index,
                        "label": row.first().map(|l| l.label.clone()),
                        "probs": probs,
                        "num_classes": probs.len(),
                    })
                })
                .collect();
            Json(json!({
                "id": s.response_id("classify"),
                "object": "list",
                "created": s.created,
                "model": s.options.served_model_name,
                "data": data,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0},
            }))
            .into_response()
        }
    })
}

/// Inputs embedded per forward pass: a request of thousands of inputs runs in batches.
const EMBED_BATCH: usize = 32;

/// OpenAI's embeddings: every input through the sentence encoder and its pooling.
async fn embed(s: &Arc<State>, headers: &HeaderMap, body: &[u8]) -> Result<Response, ApiError> {
    authorize(s, headers)?;
    let body = api::object(body)?;
    api::check_model(&body, &s.options.served_model_name)?;
    let Backend::Embeddings { embedder, busy } = &s.backend else {
        return Err(ApiError::invalid(
            "model",
            format!(
                "`{}` {}; it does not embed: serve an embedding model (a sentence-transformers folder) for /v1/embeddings",
                s.options.served_model_name,
                s.backend.serves()
            ),
        ));
    };
    let inputs = api::embedding_inputs(&body)?;
    let base64 = api::encoding_format(&body)?;
    let _admitted = Admitted::new(s)?;
    let embedder = Arc::clone(embedder);
    let done = one_at_a_time(busy, "embedding", move || {
        let ids = inputs
            .iter()
            .map(|p| match p {
                Prompt::Text { text, .. } => embedder.encode(text),
                Prompt::Ids(ids) => Ok(ids.clone()),
            })
            .collect::<Result<Vec<_>, _>>()?;
        let tokens: usize = ids.iter().map(Vec::len).sum();
        let mut vectors = Vec::with_capacity(ids.len());
        for chunk in ids.chunks(EMBED_BATCH) {
            vectors.extend(embedder.embed_ids(chunk)?);
        }
        Ok::<_, zoo_transformers::Error>((vectors, tokens))
    })
    .await?;
    let (vectors, tokens) = done.map_err(|e| {
        let mut e = ApiError::from_model(&e);
        if e.param.as_deref() == Some("input_ids") {
            e.param = Some("input".into());
        }
        e
    })?;
    if let Some(d) = api::dimensions(&body)? {
        let native = vectors.first().map_or(0, Vec::len);
        if d != native {
            return Err(ApiError::invalid(
                "dimensions",
                format!("this model embeds in {native} dimensions and does not shorten them; leave `dimensions` out or set it to {native}"),
            ));
        }
    }
    let data: Vec<Value> = vectors
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let embedding = if base64 {
                json!(api::base64_f32(v))
            } else {
                json!(v)
            };
            json!({"object": "embedding", "index": i, "embedding": embedding})
        })
        .collect();
    s.metrics
        .prompt_tokens
        .fetch_add(tokens as u64, Ordering::Relaxed);
    s.metrics.requests_ok.fetch_add(1, Ordering::Relaxed);
    Ok(Json(json!({
        "object": "list",
        "data": data,
        "model": s.options.served_model_name,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }))
    .into_response())
}

/// What every body of one request repeats.
struct Reply {
    id: String,
    created: u64,
    model: String,
    kind: Kind,
    prompt_tokens: usize,
    stops: Vec<String>,
}

impl Reply {
    fn usage(&self, completion_tokens: usize) -> Value {
        json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": self.prompt_tokens + completion_tokens,
        })
    }

    fn body(&self, streamed: bool, choices: Vec<Value>, usage: Option<Value>) -> Value {
        let mut v = json!({
            "id": self.id,
            "object": self.kind.object(streamed),
            "created": self.created,
            "model": self.model,
            "choices": choices,
        });
        if let Some(u) = usage {
            v["usage"] = u;
        }
        v
    }

    /// A choice of a whole answer, or a streamed piece (`delta` content) of one.
    fn choice(&self, index: usize, text: &str, finish: Option<&str>, streamed: bool) -> Value {
        match (self.kind, streamed) {
            (Kind::Chat, false) => json!({
                "index": index,
                "message": {"role": "assistant", "content": text},
                "logprobs": null,
                "finish_reason": finish,
            }),
            (Kind::Chat, true) => json!({
                "index": index,
                "delta": if finish.is_some() && text.is_empty() { json!({}) } else { json!({"content": text}) },
                "logprobs": null,
                "finish_reason": finish,
            }),
            (Kind::Text, _) => json!({
                "index": index,
                "text": text,
                "logprobs": null,
                "finish_reason": finish,
            }),
        }
    }
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Waits for every sequence and answers with the whole completion.
async fn whole(
    s: &State,
    reply: &Reply,
    choices: usize,
    mut rx: mpsc::UnboundedReceiver<Update>,
) -> Result<Response, ApiError> {
    let mut outputs: Vec<Option<GenerationOutput>> = vec![None; choices];
    while outputs.iter().any(Option::is_none) {
        match rx.recv().await {
            Some(Update::Token { .. }) => {}
            Some(Update::Finished { index, output }) => {
                if let Some(slot) = outputs.get_mut(index) {
                    *slot = Some(output);
                }
            }
            Some(Update::Failed(e)) => return Err(e),
            None => {
                return Err(ApiError::internal(
                    "the engine stopped before the answer was complete",
                ))
            }
        }
    }
    let mut generated = 0;
    let choices = outputs
        .into_iter()
        .flatten()
        .enumerate()
        .map(|(i, o)| {
            generated += o.token_ids.len();
            let mut text = StopText::new(&reply.stops);
            text.push(o.text.as_deref().unwrap_or_default());
            reply.choice(
                i,
                text.full(),
                Some(api::finish_reason(o.stop_reason)),
                false,
            )
        })
        .collect();
    s.metrics.requests_ok.fetch_add(1, Ordering::Relaxed);
    Ok(Json(reply.body(false, choices, Some(reply.usage(generated)))).into_response())
}

/// Streams the completion as server-sent events, ending with `data: [DONE]`.
fn stream(
    s: Arc<State>,
    reply: Reply,
    req: &Completion,
    choices: usize,
    mut rx: mpsc::UnboundedReceiver<Update>,
    admitted: Admitted,
) -> Response {
    let (tx, events) = mpsc::channel::<Result<Event, Infallible>>(64);
    let include_usage = req.include_usage;
    tokio::spawn(async move {
        let _admitted = admitted;
        let usage_null = include_usage.then_some(Value::Null);
        let send = |v: Value| {
            let tx = tx.clone();
            async move {
                tx.send(Ok(Event::default().data(v.to_string())))
                    .await
                    .is_ok()
            }
        };
        if reply.kind == Kind::Chat {
            for i in 0..choices {
                let first = json!({"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null});
                if !send(reply.body(true, vec![first], usage_null.clone())).await {
                    return;
                }
            }
        }
        let mut texts: Vec<StopText> = (0..choices).map(|_| StopText::new(&reply.stops)).collect();
        let (mut open, mut generated) = (choices, 0);
        while open > 0 {
            let (index, piece, finish) = match rx.recv().await {
                Some(Update::Token { index, text }) => match texts.get_mut(index) {
                    Some(t) => (index, t.push(&text), None),
                    None => continue,
                },
                Some(Update::Finished { index, output }) => {
                    open -= 1;
                    generated += output.token_ids.len();
                    let Some(t) = texts.get_mut(index) else {
                        continue;
                    };
                    (
                        index,
                        t.finish(),
                        Some(api::finish_reason(output.stop_reason)),
                    )
                }
                Some(Update::Failed(e)) => {
                    s.metrics.requests_failed.fetch_add(1, Ordering::Relaxed);
                    let _ = send(e.body()).await;
                    break;
                }
                None => break,
            };
            if piece.is_empty() && finish.is_none() {
                continue;
            }
            let choice = reply.choice(index, &piece, finish, true);
            if !send(reply.body(true, vec![choice], usage_null.clone())).await {
                // The client left: dropping `rx` cancels the sequences at the next step.
                return;
            }
        }
        if open == 0 {
            s.metrics.requests_ok.fetch_add(1, Ordering::Relaxed);
            if include_usage {
                let _ = send(reply.body(true, Vec::new(), Some(reply.usage(generated)))).await;
            }
        }
        let _ = tx.send(Ok(Event::default().data("[DONE]"))).await;
    });
    Sse::new(ReceiverStream::new(events)).into_response()
}
