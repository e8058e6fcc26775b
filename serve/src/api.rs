//! OpenAI's request fields read into zoo's generation options, and its error body.
//!
//! Fields are read from the JSON by name so that an error names the field (`param`) and
//! unknown fields are ignored, as OpenAI's clients expect. A field zoo knows but does not
//! apply (`logprobs`, `tools`, `response_format`, ...) is refused by name rather than
//! ignored.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Map, Value};
use zoo_transformers::generation::{GenerationOptions, StopReason};
use zoo_transformers::image_processing::RgbImage;
use zoo_transformers::Message;

/// An error as OpenAI's API returns it: a status and `{"error": {"message", "type",
/// "param", "code"}}`.
#[derive(Clone, Debug, PartialEq)]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// What went wrong and what to do.
    pub message: String,
    /// OpenAI's error type (`invalid_request_error`, `authentication_error`, ...).
    pub kind: &'static str,
    /// The request field at fault.
    pub param: Option<String>,
    /// A machine-readable code (`model_not_found`, `invalid_api_key`, ...).
    pub code: Option<&'static str>,
}

impl ApiError {
    /// 400: the request is wrong in `param`.
    pub fn invalid(param: &str, message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: Some(param.to_string()),
            code: None,
        }
    }

    /// 500: something failed inside the server.
    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: message.into(),
            kind: "server_error",
            param: None,
            code: None,
        }
    }

    /// A model error: the caller's (400, naming the field where zoo says which) or the
    /// server's (500).
    pub fn from_model(e: &zoo_transformers::Error) -> ApiError {
        if e.is_caller_error() {
            // transformers' names of the fields a request sets, in OpenAI's words.
            let param = match e {
                zoo_transformers::Error::InvalidInput { field, .. } => match *field {
                    "max_new_tokens" => "max_tokens",
                    "stop_strings" => "stop",
                    "prompts" => "prompt",
                    f => f,
                },
                _ => "messages",
            };
            ApiError::invalid(param, e.to_string())
        } else {
            ApiError::internal(e.to_string())
        }
    }

    /// The response body.
    pub fn body(&self) -> Value {
        json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.code,
        }})
    }
}

/// The message alone: an HTTP answer carries the status, and a refusal at start (read by a
/// person on a terminal) has none that means anything.
impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ApiError {}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, axum::Json(self.body())).into_response();
        if self.status == StatusCode::TOO_MANY_REQUESTS {
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        r
    }
}

/// What a completion request asks for, read and checked.
#[derive(Clone, Debug)]
pub(crate) struct Completion {
    /// The prompts (one per entry of a completions `prompt` list; one for chat).
    pub prompts: Vec<Prompt>,
    pub opts: GenerationOptions,
    /// Whether `max_tokens` was given (otherwise each prompt may fill the context).
    pub max_tokens_given: bool,
    /// Choices per prompt.
    pub n: usize,
    pub stream: bool,
    pub include_usage: bool,
}

/// One prompt: text to tokenize (rendered chat or raw), or token ids.
#[derive(Clone, Debug)]
pub(crate) enum Prompt {
    /// Text; `chat` when it came from the chat template (which writes its own special
    /// tokens).
    Text { text: String, chat: bool },
    /// Token ids as sent.
    Ids(Vec<u32>),
}

/// The request's JSON object.
pub(crate) fn object(body: &[u8]) -> Result<Map<String, Value>, ApiError> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(ApiError::invalid(
            "body",
            "the request body must be a JSON object",
        )),
        Err(e) => Err(ApiError::invalid(
            "body",
            format!("the request body is not valid JSON: {e}"),
        )),
    }
}

/// Checks `model` against the served name: 404 for any other.
pub(crate) fn check_model(body: &Map<String, Value>, served: &str) -> Result<(), ApiError> {
    match body.get("model") {
        None | Some(Value::Null) => Err(ApiError::invalid("model", "`model` is required")),
        Some(Value::String(m)) if m == served => Ok(()),
        Some(Value::String(m)) => Err(ApiError {
            status: StatusCode::NOT_FOUND,
            message: format!("the model `{m}` does not exist; this server serves `{served}`"),
            kind: "invalid_request_error",
            param: Some("model".into()),
            code: Some("model_not_found"),
        }),
        Some(v) => Err(ApiError::invalid(
            "model",
            format!("`model` must be a string, not {v}"),
        )),
    }
}

/// The chat messages as the chat template takes them — `content` a string or a list of text
/// and `image_url` parts — and the images in the order they come. A message's images are
/// rendered before its text (`Message::with_images`). Images come inline as `data:` URLs
/// (base64 PNG or JPEG, at most `MAX_IMAGE_PIXELS` pixels); the server fetches nothing.
pub(crate) fn messages(
    body: &Map<String, Value>,
) -> Result<(Vec<Message>, Vec<RgbImage>), ApiError> {
    let Some(list) = body.get("messages") else {
        return Err(ApiError::invalid("messages", "`messages` is required"));
    };
    let Value::Array(list) = list else {
        return Err(ApiError::invalid("messages", "`messages` must be a list"));
    };
    if list.is_empty() {
        return Err(ApiError::invalid("messages", "`messages` is empty"));
    }
    let mut images = Vec::new();
    let messages = list
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let at = |f: &str| format!("messages[{i}].{f}");
            let before = images.len();
            let role = match m.get("role") {
                Some(Value::String(r)) => r.clone(),
                _ => return Err(ApiError::invalid(&at("role"), "each message needs a string `role`")),
            };
            let content = match m.get("content") {
                Some(Value::String(c)) => c.clone(),
                Some(Value::Null) | None => String::new(),
                Some(Value::Array(parts)) => {
                    let mut text = String::new();
                    for (j, p) in parts.iter().enumerate() {
                        let field = format!("messages[{i}].content[{j}]");
                        match (p.get("type").and_then(Value::as_str), p.get("text")) {
                            (Some("text"), Some(Value::String(t))) => text.push_str(t),
                            (Some("image_url"), _) => images.push(image_part(p, &field)?),
                            (kind, _) => {
                                return Err(ApiError::invalid(
                                    &field,
                                    format!(
                                        "content parts of type {} are not served: send `text` and `image_url` parts",
                                        kind.unwrap_or("(none)")
                                    ),
                                ))
                            }
                        }
                    }
                    text
                }
                Some(v) => {
                    return Err(ApiError::invalid(
                        &at("content"),
                        format!("`content` must be a string or a list of parts, not {v}"),
                    ))
                }
            };
            Ok(Message::new(role, content).with_images(images.len() - before))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok((messages, images))
}

/// An `image_url` part's image: `{"image_url": {"url": "data:image/png;base64,..."}}` (or
/// the URL as a string), decoded with the pixel limit checked before decoding.
fn image_part(part: &Value, field: &str) -> Result<RgbImage, ApiError> {
    let url = match part.get("image_url") {
        Some(Value::String(u)) => u.as_str(),
        Some(Value::Object(o)) => match o.get("url") {
            Some(Value::String(u)) => u.as_str(),
            _ => return Err(ApiError::invalid(field, "`image_url.url` must be a string")),
        },
        _ => {
            return Err(ApiError::invalid(
                field,
                "an `image_url` part needs `image_url.url`",
            ))
        }
    };
    let Some(rest) = url.strip_prefix("data:") else {
        return Err(ApiError::invalid(
            field,
            "zoo serve fetches no URLs: send the image inline as a data: URL (data:image/png;base64,...)",
        ));
    };
    let Some((_, data)) = rest.split_once(";base64,") else {
        return Err(ApiError::invalid(
            field,
            "the data: URL must be base64 (data:image/png;base64,...)",
        ));
    };
    use base64::Engine as _;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(data.trim())
        .map_err(|e| {
            ApiError::invalid(field, format!("the image's base64 does not decode: {e}"))
        })?;
    RgbImage::decode(&bytes, std::path::Path::new(field))
        .map_err(|e| ApiError::invalid(field, e.to_string()))
}

/// The completions `prompt`: a string, a list of strings, a list of token ids or a list of
/// such lists.
pub(crate) fn prompts(body: &Map<String, Value>) -> Result<Vec<Prompt>, ApiError> {
    let text = |s: &str| Prompt::Text {
        text: s.to_string(),
        chat: false,
    };
    let bad = || {
        ApiError::invalid(
            "prompt",
            "`prompt` must be a string, a list of strings, a list of token ids or a list of such lists",
        )
    };
    let ids = |v: &[Value]| -> Result<Vec<u32>, ApiError> {
        v.iter()
            .map(|t| {
                t.as_u64()
                    .and_then(|t| u32::try_from(t).ok())
                    .ok_or_else(bad)
            })
            .collect()
    };
    let out = match body.get("prompt") {
        None | Some(Value::Null) => {
            return Err(ApiError::invalid("prompt", "`prompt` is required"))
        }
        Some(Value::String(s)) => vec![text(s)],
        Some(Value::Array(items)) if items.is_empty() => return Err(bad()),
        Some(Value::Array(items)) if items.iter().all(Value::is_string) => items
            .iter()
            .map(|s| text(s.as_str().unwrap_or_default()))
            .collect(),
        Some(Value::Array(items)) if items.iter().all(Value::is_number) => {
            vec![Prompt::Ids(ids(items)?)]
        }
        Some(Value::Array(items)) => items
            .iter()
            .map(|i| match i {
                Value::Array(v) => Ok(Prompt::Ids(ids(v)?)),
                _ => Err(bad()),
            })
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(bad()),
    };
    Ok(out)
}

/// Inputs one request may embed (OpenAI's limit).
const MAX_EMBEDDING_INPUTS: usize = 2048;

/// The embeddings `input`: a string, a list of strings, token ids or lists of them.
pub(crate) fn embedding_inputs(body: &Map<String, Value>) -> Result<Vec<Prompt>, ApiError> {
    let mut m = body.clone();
    match m.remove("input") {
        None | Some(Value::Null) => return Err(ApiError::invalid("input", "`input` is required")),
        Some(v) => m.insert("prompt".into(), v),
    };
    let inputs = prompts(&m).map_err(|mut e| {
        e.param = Some("input".into());
        e.message = e.message.replace("`prompt`", "`input`");
        e
    })?;
    if inputs.len() > MAX_EMBEDDING_INPUTS {
        return Err(ApiError::invalid(
            "input",
            format!(
                "{} inputs; a request embeds at most {MAX_EMBEDDING_INPUTS}",
                inputs.len()
            ),
        ));
    }
    if inputs.iter().any(|p| match p {
        Prompt::Text { text, .. } => text.is_empty(),
        Prompt::Ids(ids) => ids.is_empty(),
    }) {
        return Err(ApiError::invalid("input", "an input is empty"));
    }
    Ok(inputs)
}

/// Documents one rerank request may score.
const MAX_RERANK_DOCUMENTS: usize = 1000;

/// A rerank request: the query and its documents, under `texts` (text-embeddings-inference)
/// or `documents` (vLLM and Jina: strings or `{"text": ...}` objects).
pub(crate) struct RerankRequest {
    pub query: String,
    pub documents: Vec<String>,
}

pub(crate) fn rerank_request(
    body: &Map<String, Value>,
    key: &str,
) -> Result<RerankRequest, ApiError> {
    let query = match body.get("query") {
        Some(Value::String(q)) if !q.is_empty() => q.clone(),
        Some(Value::String(_)) => return Err(ApiError::invalid("query", "`query` is empty")),
        None | Some(Value::Null) => return Err(ApiError::invalid("query", "`query` is required")),
        Some(v) => {
            return Err(ApiError::invalid(
                "query",
                format!("`query` must be a string, not {v}"),
            ))
        }
    };
    let Some(Value::Array(items)) = body.get(key) else {
        return Err(ApiError::invalid(
            key,
            format!("`{key}` is required: a list of the documents to score"),
        ));
    };
    if items.is_empty() {
        return Err(ApiError::invalid(key, format!("`{key}` is empty")));
    }
    if items.len() > MAX_RERANK_DOCUMENTS {
        return Err(ApiError::invalid(
            key,
            format!(
                "{} documents; a request scores at most {MAX_RERANK_DOCUMENTS}",
                items.len()
            ),
        ));
    }
    let documents = items
        .iter()
        .enumerate()
        .map(|(i, d)| match d {
            Value::String(t) => Ok(t.clone()),
            Value::Object(o) if key == "documents" => match o.get("text") {
                Some(Value::String(t)) => Ok(t.clone()),
                _ => Err(ApiError::invalid(
                    key,
                    format!("document {i} has no string `text`"),
                )),
            },
            other => Err(ApiError::invalid(
                key,
                format!("document {i} must be a string, not {other}"),
            )),
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(RerankRequest { query, documents })
}

/// Inputs one classification request may score.
const MAX_CLASSIFY_INPUTS: usize = 1000;

/// One input to classify: a text, or a pair of texts read as one input.
pub(crate) type ClassifyInput = (String, Option<String>);

/// text-embeddings-inference's `/predict` `inputs`: a string, a pair `[a, b]`, or a batch of
/// `[a]` and `[a, b]` lists. The inputs, and whether they came as a batch (its answer is a
/// list per input).
pub(crate) fn predict_inputs(
    body: &Map<String, Value>,
) -> Result<(Vec<ClassifyInput>, bool), ApiError> {
    let shape = "`inputs` must be a string, a pair [string, string], or a batch of [string] and [string, string] lists";
    let bad = || ApiError::invalid("inputs", shape);
    // A list of one or two strings: a text or a pair.
    let sequence = |items: &[Value]| -> Result<ClassifyInput, ApiError> {
        let text = |v: &Value| v.as_str().map(str::to_string).ok_or_else(bad);
        match items {
            [a] => Ok((text(a)?, None)),
            [a, b] => Ok((text(a)?, Some(text(b)?))),
            _ => Err(bad()),
        }
    };
    let (inputs, batch) = match body.get("inputs") {
        None | Some(Value::Null) => {
            return Err(ApiError::invalid("inputs", "`inputs` is required"))
        }
        Some(Value::String(t)) => (vec![(t.clone(), None)], false),
        Some(Value::Array(items)) if items.first().is_some_and(Value::is_string) => {
            (vec![sequence(items)?], false)
        }
        Some(Value::Array(items)) if !items.is_empty() => {
            let batch = items
                .iter()
                .map(|i| i.as_array().ok_or_else(bad).and_then(|v| sequence(v)))
                .collect::<Result<Vec<_>, _>>()?;
            (batch, true)
        }
        Some(_) => return Err(bad()),
    };
    check_classify_inputs(&inputs, "inputs")?;
    Ok((inputs, batch))
}

/// vLLM's `/classify` `input`: a string or a list of strings.
pub(crate) fn classify_inputs(body: &Map<String, Value>) -> Result<Vec<ClassifyInput>, ApiError> {
    let bad = || {
        ApiError::invalid(
            "input",
            "`input` must be a string or a list of strings (token ids are not read here)",
        )
    };
    let inputs = match body.get("input") {
        None | Some(Value::Null) => return Err(ApiError::invalid("input", "`input` is required")),
        Some(Value::String(t)) => vec![(t.clone(), None)],
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| v.as_str().map(|t| (t.to_string(), None)).ok_or_else(bad))
            .collect::<Result<Vec<_>, _>>()?,
        Some(_) => return Err(bad()),
    };
    check_classify_inputs(&inputs, "input")?;
    Ok(inputs)
}

fn check_classify_inputs(inputs: &[ClassifyInput], key: &str) -> Result<(), ApiError> {
    if inputs.is_empty() {
        return Err(ApiError::invalid(key, format!("`{key}` is empty")));
    }
    if inputs.len() > MAX_CLASSIFY_INPUTS {
        return Err(ApiError::invalid(
            key,
            format!(
                "{} inputs; a request classifies at most {MAX_CLASSIFY_INPUTS}",
                inputs.len()
            ),
        ));
    }
    if let Some(i) = inputs
        .iter()
        .position(|(a, b)| a.is_empty() || b.as_ref().is_some_and(String::is_empty))
    {
        return Err(ApiError::invalid(key, format!("input {i} is empty")));
    }
    Ok(())
}

/// A boolean field, `default` when absent.
pub(crate) fn flag(body: &Map<String, Value>, key: &str, default: bool) -> Result<bool, ApiError> {
    match body.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(v) => Err(ApiError::invalid(
            key,
            format!("`{key}` must be true or false, not {v}"),
        )),
    }
}

/// A positive count, when given (`top_n`).
pub(crate) fn positive(body: &Map<String, Value>, key: &str) -> Result<Option<usize>, ApiError> {
    match integer(body, key)? {
        None => Ok(None),
        Some(n) if n > 0 => Ok(Some(n as usize)),
        Some(n) => Err(ApiError::invalid(
            key,
            format!("`{key}` is {n}; it must be positive"),
        )),
    }
}

/// Whether `encoding_format` asks for base64 (else floats).
pub(crate) fn encoding_format(body: &Map<String, Value>) -> Result<bool, ApiError> {
    match body.get("encoding_format") {
        None | Some(Value::Null) => Ok(false),
        Some(Value::String(f)) if f == "float" => Ok(false),
        Some(Value::String(f)) if f == "base64" => Ok(true),
        Some(v) => Err(ApiError::invalid(
            "encoding_format",
            format!("`encoding_format` is {v}; use \"float\" or \"base64\""),
        )),
    }
}

/// The `dimensions` asked for, when given.
pub(crate) fn dimensions(body: &Map<String, Value>) -> Result<Option<usize>, ApiError> {
    match integer(body, "dimensions")? {
        None => Ok(None),
        Some(d) if d > 0 => Ok(Some(d as usize)),
        Some(d) => Err(ApiError::invalid(
            "dimensions",
            format!("`dimensions` is {d}; it must be positive"),
        )),
    }
}

/// An embedding as OpenAI's base64 form: its float32s, little-endian, in standard base64.
pub(crate) fn base64_f32(v: &[f32]) -> String {
    use base64::Engine as _;
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn number(body: &Map<String, Value>, field: &str) -> Result<Option<f64>, ApiError> {
    match body.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v.as_f64().map(Some).ok_or_else(|| {
            ApiError::invalid(field, format!("`{field}` must be a number, not {v}"))
        }),
    }
}

pub(crate) fn integer(body: &Map<String, Value>, field: &str) -> Result<Option<i64>, ApiError> {
    match body.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v.as_i64().map(Some).ok_or_else(|| {
            ApiError::invalid(field, format!("`{field}` must be an integer, not {v}"))
        }),
    }
}

fn boolean(body: &Map<String, Value>, field: &str) -> Result<bool, ApiError> {
    flag(body, field, false)
}

fn in_range(field: &str, v: f64, lo: f64, hi: f64) -> Result<f64, ApiError> {
    if v.is_finite() && v >= lo && v <= hi {
        Ok(v)
    } else {
        Err(ApiError::invalid(
            field,
            format!("`{field}` is {v}; it must be in [{lo}, {hi}]"),
        ))
    }
}

/// Refuses what zoo does not apply: known OpenAI fields set to anything but their no-op.
fn refuse_unapplied(body: &Map<String, Value>) -> Result<(), ApiError> {
    for field in ["logprobs", "echo"] {
        if body
            .get(field)
            .is_some_and(|v| v.as_bool() == Some(true) || v.as_u64().is_some())
        {
            return Err(ApiError::invalid(
                field,
                format!("zoo does not return `{field}` yet; leave it out"),
            ));
        }
    }
    if body.get("top_logprobs").is_some_and(|v| !v.is_null()) {
        return Err(ApiError::invalid(
            "top_logprobs",
            "zoo does not return log probabilities yet; leave it out",
        ));
    }
    if body
        .get("tools")
        .is_some_and(|v| v.as_array().is_some_and(|t| !t.is_empty()))
    {
        return Err(ApiError::invalid(
            "tools",
            "zoo does not call tools; leave `tools` out",
        ));
    }
    if let Some(kind) = body
        .get("response_format")
        .and_then(|f| f.get("type"))
        .and_then(Value::as_str)
        .filter(|k| *k != "text")
    {
        return Err(ApiError::invalid(
            "response_format",
            format!("zoo does not constrain output to `{kind}`; leave `response_format` out"),
        ));
    }
    if body.get("suffix").is_some_and(|v| !v.is_null()) {
        return Err(ApiError::invalid(
            "suffix",
            "zoo does not insert after a `suffix`; leave it out",
        ));
    }
    if let Some(b) = integer(body, "best_of")? {
        let n = integer(body, "n")?.unwrap_or(1);
        if b != n {
            return Err(ApiError::invalid(
                "best_of",
                "zoo returns every sequence it generates; leave `best_of` out or equal to `n`",
            ));
        }
    }
    Ok(())
}

/// The sampling fields over the model's defaults (`generation_config.json`), as vLLM reads
/// them: `temperature` 0 is greedy; a sampling field turns sampling on; what the request
/// leaves out keeps the model's default.
pub(crate) fn completion(
    body: &Map<String, Value>,
    prompts: Vec<Prompt>,
    defaults: GenerationOptions,
    max_batch: usize,
) -> Result<Completion, ApiError> {
    refuse_unapplied(body)?;
    let mut opts = defaults;
    let max_tokens = match integer(body, "max_completion_tokens")? {
        Some(v) => Some(("max_completion_tokens", v)),
        None => integer(body, "max_tokens")?.map(|v| ("max_tokens", v)),
    };
    if let Some((field, v)) = max_tokens {
        if v < 1 {
            return Err(ApiError::invalid(
                field,
                format!("`{field}` is {v}; it must be at least 1"),
            ));
        }
        opts.max_new_tokens = usize::try_from(v).unwrap_or(usize::MAX);
    }
    let temperature = number(body, "temperature")?;
    let top_p = number(body, "top_p")?;
    let top_k = integer(body, "top_k")?;
    let min_p = number(body, "min_p")?;
    if let Some(t) = temperature {
        let t = in_range("temperature", t, 0.0, 2.0)?;
        opts.do_sample = t > 0.0;
        if t > 0.0 {
            opts.temperature = t;
        }
    } else if top_p.is_some() || top_k.is_some() || min_p.is_some() {
        opts.do_sample = true;
    }
    if let Some(p) = top_p {
        let p = in_range("top_p", p, f64::MIN_POSITIVE, 1.0)?;
        opts.top_p = (p < 1.0).then_some(p);
    }
    if let Some(k) = top_k {
        // vLLM's -1 (and transformers' 0) keep every token.
        if k < -1 {
            return Err(ApiError::invalid(
                "top_k",
                format!("`top_k` is {k}; use -1 or 0 for all tokens, or a positive count"),
            ));
        }
        opts.top_k = usize::try_from(k).ok().filter(|&k| k > 0);
    }
    if let Some(p) = min_p {
        opts.min_p = Some(in_range("min_p", p, 0.0, 1.0)?).filter(|&p| p > 0.0);
    }
    if let Some(r) = number(body, "repetition_penalty")? {
        if !(r.is_finite() && r > 0.0) {
            return Err(ApiError::invalid(
                "repetition_penalty",
                format!("`repetition_penalty` is {r}; it must be positive"),
            ));
        }
        opts.repetition_penalty = (r != 1.0).then_some(r);
    }
    if let Some(p) = number(body, "presence_penalty")? {
        opts.presence_penalty = in_range("presence_penalty", p, -2.0, 2.0)?;
    }
    if let Some(p) = number(body, "frequency_penalty")? {
        opts.frequency_penalty = in_range("frequency_penalty", p, -2.0, 2.0)?;
    }
    opts.logit_bias = match body.get("logit_bias") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Object(m)) => m
            .iter()
            .map(|(id, b)| {
                let id = id.parse::<u32>().map_err(|_| {
                    ApiError::invalid(
                        "logit_bias",
                        format!("`logit_bias` keys are token ids; {id:?} is not one"),
                    )
                })?;
                let b = b.as_f64().ok_or_else(|| {
                    ApiError::invalid(
                        "logit_bias",
                        format!("the bias of token {id} must be a number, not {b}"),
                    )
                })?;
                Ok((id, in_range("logit_bias", b, -100.0, 100.0)? as f32))
            })
            .collect::<Result<_, ApiError>>()?,
        Some(v) => {
            return Err(ApiError::invalid(
                "logit_bias",
                format!("`logit_bias` must map token ids to biases, not {v}"),
            ))
        }
    };
    opts.seed = match body.get("seed") {
        None | Some(Value::Null) => fresh_seed(),
        Some(v) => v.as_i64().map(|s| s as u64).ok_or_else(|| {
            ApiError::invalid("seed", format!("`seed` must be an integer, not {v}"))
        })?,
    };
    opts.stop_strings = match body.get("stop") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(l)) if l.iter().all(Value::is_string) => l
            .iter()
            .filter_map(|s| s.as_str().map(String::from))
            .collect(),
        Some(_) => {
            return Err(ApiError::invalid(
                "stop",
                "`stop` must be a string or a list of strings",
            ))
        }
    };
    if opts.stop_strings.iter().any(String::is_empty) {
        return Err(ApiError::invalid("stop", "a stop string is empty"));
    }
    let n = integer(body, "n")?.unwrap_or(1);
    let n = match usize::try_from(n) {
        Ok(n) if (1..=max_batch).contains(&n) => n,
        _ => {
            return Err(ApiError::invalid(
                "n",
                format!(
                    "`n` is {n}; this server runs 1 to {max_batch} sequences at once (--max-batch)"
                ),
            ))
        }
    };
    if n * prompts.len() > max_batch {
        return Err(ApiError::invalid(
            "prompt",
            format!(
                "{} prompts of {n} choices each need {} sequences; this server runs {max_batch} at once (--max-batch)",
                prompts.len(),
                n * prompts.len()
            ),
        ));
    }
    // vLLM's extras.
    if boolean(body, "ignore_eos")? {
        opts.eos_token_ids = Some(Vec::new());
    }
    if let Some(m) = integer(body, "min_tokens")? {
        opts.min_new_tokens = usize::try_from(m).map_err(|_| {
            ApiError::invalid(
                "min_tokens",
                format!("`min_tokens` is {m}; it must be at least 0"),
            )
        })?;
    }
    let stream = boolean(body, "stream")?;
    let include_usage = match body.get("stream_options") {
        None | Some(Value::Null) => false,
        Some(Value::Object(o)) => boolean(o, "include_usage")?,
        Some(_) => {
            return Err(ApiError::invalid(
                "stream_options",
                "`stream_options` must be an object",
            ))
        }
    };
    Ok(Completion {
        prompts,
        opts,
        max_tokens_given: max_tokens.is_some(),
        n,
        stream,
        include_usage,
    })
}

/// A seed for a request that names none: different per request, as OpenAI's sampling is.
fn fresh_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish()
}

/// OpenAI's `finish_reason`.
pub(crate) fn finish_reason(r: StopReason) -> &'static str {
    match r {
        StopReason::Eos | StopReason::StopString | StopReason::Cancelled => "stop",
        StopReason::Length => "length",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_the_standard_alphabet_and_padding() {
        // 1.0f32 is 00 00 80 3f little-endian.
        assert_eq!(base64_f32(&[1.0]), "AACAPw==");
        assert_eq!(base64_f32(&[1.0, -2.0]), "AACAPwAAAMA=");
        assert_eq!(base64_f32(&[]), "");
    }
}
