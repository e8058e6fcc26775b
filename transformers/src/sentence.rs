//! Sentence embeddings as sentence-transformers computes them: an encoder, then the pooling
//! and normalisation its folder's `modules.json` lists (`1_Pooling/config.json`,
//! `2_Normalize`), with `sentence_bert_config.json`'s `max_seq_length`.
//!
//! A plain transformers checkpoint without `modules.json` gets what sentence-transformers
//! gives it too: mean pooling, no normalisation, the model's own position limit; a model
//! with a projection (CLIP's text model) gives its projected embedding.
//!
//! [`CrossEncoder`] is sentence-transformers' `CrossEncoder`: a sequence classifier reading a
//! (query, document) pair as one input, its scores through the configured activation
//! (sigmoid for one label): the rerankers (ms-marco MiniLM, bge-reranker).

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;
use serde_json::Value;
use zoo_runtime::{DType, Tensor};

use crate::auto::{load_encoder, LoadOptions};
use crate::kinds::{Encoder, EncoderArgs, EncoderHead};
use crate::registry::Task;
use crate::tokenizer::PairTruncation;
use crate::{Error, Result, Tokenizer};

/// How token embeddings become one sentence embedding (sentence-transformers' `Pooling`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pooling {
    /// The first token's embedding (`[CLS]`).
    Cls,
    /// The mean over real (unmasked) tokens.
    Mean,
    /// The element-wise maximum over real tokens.
    Max,
    /// The sum over real tokens divided by the square root of their count.
    MeanSqrtLen,
    /// The last real token's embedding (decoder-style embedders).
    LastToken,
    /// The model's own projected embedding (CLIP's `text_embeds`, what
    /// `CLIPModel.get_text_features` returns): the default for a projection model without
    /// `modules.json`.
    Projection,
}

impl Pooling {
    /// The pooling named `s` (`cls`, `mean`, `max`, `mean_sqrt_len_tokens`, `lasttoken`).
    pub fn parse(s: &str) -> Option<Pooling> {
        Some(match s {
            "cls" => Pooling::Cls,
            "mean" => Pooling::Mean,
            "max" => Pooling::Max,
            "mean_sqrt_len_tokens" => Pooling::MeanSqrtLen,
            "lasttoken" => Pooling::LastToken,
            "projection" => Pooling::Projection,
            _ => return None,
        })
    }

    /// The name [`Pooling::parse`] reads.
    pub fn name(self) -> &'static str {
        match self {
            Pooling::Cls => "cls",
            Pooling::Mean => "mean",
            Pooling::Max => "max",
            Pooling::MeanSqrtLen => "mean_sqrt_len_tokens",
            Pooling::LastToken => "lasttoken",
            Pooling::Projection => "projection",
        }
    }
}

/// `1_Pooling/config.json`: one `pooling_mode_*` flag set.
#[derive(Debug, Default, Deserialize)]
struct PoolingConfig {
    #[serde(default)]
    pooling_mode_cls_token: bool,
    #[serde(default)]
    pooling_mode_mean_tokens: bool,
    #[serde(default)]
    pooling_mode_max_tokens: bool,
    #[serde(default)]
    pooling_mode_mean_sqrt_len_tokens: bool,
    #[serde(default)]
    pooling_mode_lasttoken: bool,
    #[serde(default)]
    pooling_mode_weightedmean_tokens: bool,
    /// Whether a prompt's tokens count in the pooling (sentence-transformers' default).
    #[serde(default = "yes")]
    include_prompt: bool,
}

fn yes() -> bool {
    true
}

/// One entry of `modules.json`.
#[derive(Debug, Deserialize)]
struct Module {
    #[serde(default)]
    path: String,
    #[serde(rename = "type")]
    kind: String,
}

/// A sentence encoder: tokenizer, encoder, pooling, normalisation, and the prompts its
/// `config_sentence_transformers.json` names.
#[derive(Debug)]
pub struct SentenceEmbedder {
    encoder: Box<dyn Encoder>,
    tokenizer: Tokenizer,
    pooling: Pooling,
    normalize: bool,
    max_seq_length: usize,
    prompts: BTreeMap<String, String>,
    default_prompt_name: Option<String>,
    /// `1_Pooling/config.json`'s `include_prompt`.
    include_prompt: bool,
}

/// `config_sentence_transformers.json`: the prompts a model was trained with.
#[derive(Debug, Default, Deserialize)]
struct SentenceTransformersConfig {
    #[serde(default)]
    prompts: BTreeMap<String, String>,
    #[serde(default)]
    default_prompt_name: Option<String>,
}

fn read_json(path: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::Config {
        path: path.to_path_buf(),
        reason: format!("cannot be read: {e}"),
    })?;
    serde_json::from_str(&text).map_err(|e| Error::Config {
        path: path.to_path_buf(),
        reason: format!("is not valid JSON: {e}"),
    })
}

fn parse<T: serde::de::DeserializeOwned>(path: &Path, v: Value) -> Result<T> {
    serde_json::from_value(v).map_err(|e| Error::Config {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })
}

impl SentenceEmbedder {
    /// Loads the sentence-transformers folder or repo `repo_or_path` (any encoder family
    /// the registry knows) with its pooling.
    pub fn load_pretrained(repo_or_path: &str, opts: LoadOptions) -> Result<SentenceEmbedder> {
        let (encoder, _, pretrained) = load_encoder(repo_or_path, &opts, Task::Base)?;
        let files = pretrained.files();
        let tokenizer = Tokenizer::from_pretrained(&pretrained)?;
        let mut pooling = if encoder.projects() {
            Pooling::Projection
        } else {
            Pooling::Mean
        };
        let mut normalize = false;
        let mut include_prompt = true;
        if let Some(path) = files.get_optional("modules.json")? {
            let modules: Vec<Module> = parse(&path, read_json(&path)?)?;
            for m in &modules {
                match m.kind.rsplit('.').next().unwrap_or_default() {
                    "Pooling" => {
                        let p = files.get(&format!("{}/config.json", m.path))?;
                        let config: PoolingConfig = parse(&p, read_json(&p)?)?;
                        include_prompt = config.include_prompt;
                        pooling = pooling_of(&p, config)?;
                    }
                    "Normalize" => normalize = true,
                    "Transformer" => {}
                    other => {
                        return Err(Error::Config {
                            path: path.clone(),
                            reason: format!(
                                "module {other} ({}) is not one zoo runs; supported: Transformer, Pooling, Normalize",
                                m.kind
                            ),
                        })
                    }
                }
            }
        }
        let mut max_seq_length = encoder.max_position_embeddings();
        if let Some(path) = files.get_optional("sentence_bert_config.json")? {
            if let Some(n) = read_json(&path)?
                .get("max_seq_length")
                .and_then(Value::as_u64)
            {
                max_seq_length = max_seq_length.min(n as usize);
            }
        }
        let mut st = SentenceTransformersConfig::default();
        if let Some(path) = files.get_optional("config_sentence_transformers.json")? {
            st = parse(&path, read_json(&path)?)?;
            if let Some(name) = st.default_prompt_name.as_ref() {
                if !st.prompts.contains_key(name) {
                    return Err(Error::Config {
                        path,
                        reason: format!(
                            "default_prompt_name {name:?} is not among its prompts ({})",
                            st.prompts.keys().cloned().collect::<Vec<_>>().join(", ")
                        ),
                    });
                }
            }
        }
        Ok(SentenceEmbedder {
            encoder,
            tokenizer,
            pooling,
            normalize,
            max_seq_length,
            prompts: st.prompts,
            default_prompt_name: st.default_prompt_name,
            include_prompt,
        })
    }

    /// The prompts of `config_sentence_transformers.json` by name (`query`, `document`, ...).
    pub fn prompts(&self) -> &BTreeMap<String, String> {
        &self.prompts
    }

    /// The prompt [`SentenceEmbedder::embed`] puts before every sentence, if the folder names
    /// a default.
    pub fn default_prompt_name(&self) -> Option<&str> {
        self.default_prompt_name.as_deref()
    }

    /// The prompt called `name`, or an error listing the ones there are.
    pub fn prompt(&self, name: &str) -> Result<&str> {
        self.prompts.get(name).map(String::as_str).ok_or_else(|| {
            Error::invalid(
                "prompt_name",
                format!(
                    "no prompt {name:?}; this model's config_sentence_transformers.json names {}",
                    if self.prompts.is_empty() {
                        "none".to_string()
                    } else {
                        self.prompts.keys().cloned().collect::<Vec<_>>().join(", ")
                    }
                ),
            )
        })
    }

    /// Overrides the pooling the folder names.
    pub fn with_pooling(mut self, pooling: Pooling) -> SentenceEmbedder {
        self.pooling = pooling;
        self
    }

    /// The pooling in use.
    pub fn pooling(&self) -> Pooling {
        self.pooling
    }

    /// Whether embeddings are L2-normalised (a `Normalize` module).
    pub fn normalizes(&self) -> bool {
        self.normalize
    }

    /// Tokens past this are cut (`max_seq_length`).
    pub fn max_seq_length(&self) -> usize {
        self.max_seq_length
    }

    /// The encoder.
    pub fn encoder(&self) -> &dyn Encoder {
        &*self.encoder
    }

    /// A sentence's token ids as the model reads it (special tokens added, cut at
    /// `max_seq_length`).
    pub fn encode(&self, sentence: &str) -> Result<Vec<u32>> {
        self.tokenizer
            .encode_truncated(sentence, self.max_seq_length)
    }

    /// One embedding per sentence, as `SentenceTransformer.encode` returns them (with the
    /// folder's default prompt, if it names one).
    pub fn embed(&self, sentences: &[&str]) -> Result<Vec<Vec<f32>>> {
        let prompt = match &self.default_prompt_name {
            Some(name) => Some(self.prompt(name)?.to_string()),
            None => None,
        };
        self.embed_with_prompt(sentences, prompt.as_deref())
    }

    /// One embedding per sentence with `prompt` before each (`encode(prompt=...)`; a
    /// named one from [`SentenceEmbedder::prompt`]: Qwen3-Embedding's query instruction, e5's
    /// `"query: "`), or none.
    pub fn embed_with_prompt(
        &self,
        sentences: &[&str],
        prompt: Option<&str>,
    ) -> Result<Vec<Vec<f32>>> {
        if sentences.is_empty() {
            return Err(Error::invalid("sentences", "no sentences given".into()));
        }
        let prompt = prompt.filter(|p| !p.is_empty());
        if prompt.is_some() && !self.include_prompt {
            return Err(Error::invalid(
                "prompt",
                "this model's pooling leaves the prompt's tokens out (1_Pooling/config.json include_prompt false), which zoo does not do yet; embed without a prompt"
                    .into(),
            ));
        }
        let ids = sentences
            .iter()
            .map(|s| match prompt {
                Some(p) => self.encode(&format!("{p}{s}")),
                None => self.encode(s),
            })
            .collect::<Result<Vec<_>>>()?;
        self.embed_ids(&ids)
    }

    /// One embedding per row of token ids (as [`SentenceEmbedder::encode`] makes them: each
    /// at most `max_seq_length`, every id in the vocabulary).
    pub fn embed_ids(&self, ids: &[Vec<u32>]) -> Result<Vec<Vec<f32>>> {
        let vocab = self.encoder.vocab_size();
        if ids.is_empty() || ids.iter().any(Vec::is_empty) {
            return Err(Error::invalid(
                "input_ids",
                "every input needs at least one token".into(),
            ));
        }
        if let Some(row) = ids.iter().find(|r| r.len() > self.max_seq_length) {
            return Err(Error::invalid(
                "input_ids",
                format!(
                    "an input has {} tokens; this model reads at most {} (max_seq_length)",
                    row.len(),
                    self.max_seq_length
                ),
            ));
        }
        if let Some(&bad) = ids.iter().flatten().find(|&&i| i as usize >= vocab) {
            return Err(Error::invalid(
                "input_ids",
                format!("token id {bad} is outside the vocabulary of {vocab} ids"),
            ));
        }
        let (b, t) = (ids.len(), ids.iter().map(Vec::len).max().unwrap_or(0));
        // Right padding, as the tokenizer pads a batch; padded keys are masked.
        let mut flat = Vec::with_capacity(b * t);
        let mut mask = Vec::with_capacity(b * t);
        for row in ids {
            flat.extend(row.iter().map(|&i| i64::from(i)));
            flat.extend(std::iter::repeat_n(0, t - row.len()));
            mask.extend(std::iter::repeat_n(1i64, row.len()));
            mask.extend(std::iter::repeat_n(0, t - row.len()));
        }
        let device = self.encoder.device();
        let input_ids = Tensor::from_vec(flat, &[b, t], &device)?;
        let attention_mask = Tensor::from_vec(mask, &[b, t], &device)?;
        let out = self.encoder.forward(EncoderArgs {
            input_ids: &input_ids,
            attention_mask: Some(&attention_mask),
            token_type_ids: None,
            position_ids: None,
            output_hidden_states: false,
        })?;
        if self.pooling == Pooling::Projection {
            let Some(embeds) = out.embeds else {
                return Err(Error::invalid("pooling", 
                    "this model has no projection; pool its tokens (cls, mean, max, mean_sqrt_len_tokens, lasttoken)".into(),
                ));
            };
            let v = embeds.to_dtype(DType::F32)?.to_vec::<f32>()?;
            let dim = v.len() / b;
            return Ok(v
                .chunks(dim.max(1))
                .map(|e| {
                    let mut e = e.to_vec();
                    if self.normalize {
                        normalize(&mut e);
                    }
                    e
                })
                .collect());
        }
        let h = out
            .last_hidden_state
            .to_dtype(DType::F32)?
            .to_vec::<f32>()?;
        let dim = h.len() / (b * t).max(1);
        Ok(ids
            .iter()
            .enumerate()
            .map(|(r, row)| {
                let tokens = &h[r * t * dim..(r * t + row.len()) * dim];
                let mut e = pool(self.pooling, tokens, dim);
                if self.normalize {
                    normalize(&mut e);
                }
                e
            })
            .collect())
    }
}

/// What a cross-encoder applies to its head's scores (sentence-transformers'
/// `activation_fn`, by its torch class).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScoreActivation {
    /// `torch.nn.Sigmoid`: the default for one label.
    Sigmoid,
    /// `torch.nn.Identity`: the logits as they are; the default for several labels.
    Identity,
    /// `torch.nn.Tanh`.
    Tanh,
}

impl ScoreActivation {
    /// The activation a saved `activation_fn` path names (`torch.nn.modules.activation.Sigmoid`),
    /// `None` for one zoo does not apply.
    pub fn from_torch(path: &str) -> Option<ScoreActivation> {
        match path.rsplit('.').next()? {
            "Sigmoid" => Some(ScoreActivation::Sigmoid),
            "Identity" => Some(ScoreActivation::Identity),
            "Tanh" => Some(ScoreActivation::Tanh),
            _ => None,
        }
    }

    /// Its name.
    pub fn name(self) -> &'static str {
        match self {
            ScoreActivation::Sigmoid => "sigmoid",
            ScoreActivation::Identity => "identity",
            ScoreActivation::Tanh => "tanh",
        }
    }

    fn apply(self, x: f32) -> f32 {
        match self {
            ScoreActivation::Sigmoid => 1.0 / (1.0 + (-x).exp()),
            ScoreActivation::Identity => x,
            ScoreActivation::Tanh => x.tanh(),
        }
    }
}

/// One document of [`CrossEncoder::rank`]: its index among the documents and its score.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Ranked {
    /// Index in the documents given.
    pub index: usize,
    /// The cross-encoder's score of (query, document).
    pub score: f32,
}

/// A cross-encoder (sentence-transformers' `CrossEncoder`): a sequence classifier of any
/// encoder or decoder family reading each (query, document) pair as one input, cut to
/// `max_length` longest-first, its label scores through the configured activation.
#[derive(Debug)]
pub struct CrossEncoder {
    model: Box<dyn Encoder>,
    tokenizer: Tokenizer,
    activation: ScoreActivation,
    max_length: usize,
    labels: Vec<String>,
    pad_id: i64,
}

impl CrossEncoder {
    /// Loads the sequence-classification checkpoint `repo_or_path` (a folder, file or repo
    /// id) with its tokenizer; the activation comes from its config's
    /// `sentence_transformers.activation_fn` (or the older
    /// `sbert_ce_default_activation_function`), else sigmoid for one label and identity for
    /// several, as sentence-transformers chooses; `max_length` from
    /// `sentence_bert_config.json`, else `tokenizer_config.json`'s `model_max_length`, never
    /// past the model's positions.
    pub fn load_pretrained(repo_or_path: &str, opts: LoadOptions) -> Result<CrossEncoder> {
        let Classifier {
            model,
            tokenizer,
            labels,
            config,
            pretrained,
        } = Classifier::load(repo_or_path, &opts)?;
        let config = &config;
        let saved = config
            .get("sentence_transformers")
            .and_then(|st| st.get("activation_fn").cloned())
            .or_else(|| config.get("sbert_ce_default_activation_function"));
        let activation = match saved.as_ref().and_then(Value::as_str) {
            Some(path) => ScoreActivation::from_torch(path).ok_or_else(|| Error::Config {
                path: config.path.clone(),
                reason: format!(
                    "the cross-encoder's activation_fn {path:?} is not one zoo applies (Sigmoid, Identity, Tanh)"
                ),
            })?,
            None if labels.len() == 1 => ScoreActivation::Sigmoid,
            None => ScoreActivation::Identity,
        };
        let max_length = max_length_of(&pretrained, model.as_ref())?;
        let pad_id = pad_id_of(&tokenizer, config);
        Ok(CrossEncoder {
            model,
            tokenizer,
            activation,
            max_length,
            labels,
            pad_id,
        })
    }

    /// Overrides the activation.
    pub fn with_activation(mut self, activation: ScoreActivation) -> CrossEncoder {
        self.activation = activation;
        self
    }

    /// The activation in use.
    pub fn activation(&self) -> ScoreActivation {
        self.activation
    }

    /// The most tokens a pair is cut to.
    pub fn max_length(&self) -> usize {
        self.max_length
    }

    /// The head's label names (one for a reranker).
    pub fn labels(&self) -> &[String] {
        &self.labels
    }

    /// The scores of each pair: one row per pair, one score per label, after the activation
    /// (`CrossEncoder.predict`).
    pub fn predict(&self, pairs: &[(&str, &str)]) -> Result<Vec<Vec<f32>>> {
        Ok(self.predict_with(pairs, self.activation)?.0)
    }

    /// [`CrossEncoder::predict`] through `activation` instead of the model's, and the tokens
    /// the pairs took (what a server counts as usage).
    pub fn predict_with(
        &self,
        pairs: &[(&str, &str)],
        activation: ScoreActivation,
    ) -> Result<(Vec<Vec<f32>>, usize)> {
        if pairs.is_empty() {
            return Err(Error::invalid("pairs", "no pairs given".into()));
        }
        let encoded = pairs
            .iter()
            .map(|(a, b)| {
                self.tokenizer
                    .encode_pair(a, b, self.max_length, PairTruncation::LongestFirst)
            })
            .collect::<Result<Vec<_>>>()?;
        let tokens: usize = encoded.iter().map(|e| e.ids.len()).sum();
        let rows: Vec<(&[u32], &[u32])> = encoded
            .iter()
            .map(|e| (e.ids.as_slice(), e.type_ids.as_slice()))
            .collect();
        let v = classifier_logits(self.model.as_ref(), self.pad_id, &rows)?;
        let scores = v
            .chunks(self.labels.len().max(1))
            .map(|row| row.iter().map(|&x| activation.apply(x)).collect())
            .collect();
        Ok((scores, tokens))
    }

    /// The documents by their score against `query`, highest first (`CrossEncoder.rank`); a
    /// reranker has one label.
    pub fn rank(&self, query: &str, documents: &[&str]) -> Result<Vec<Ranked>> {
        if self.labels.len() != 1 {
            return Err(Error::invalid(
                "model",
                format!(
                    "ranking needs one score per pair; this classifier has {} labels ({}); use predict",
                    self.labels.len(),
                    self.labels.join(", ")
                ),
            ));
        }
        let pairs: Vec<(&str, &str)> = documents.iter().map(|d| (query, *d)).collect();
        let scores = self.predict(&pairs)?;
        let mut ranked: Vec<Ranked> = scores
            .iter()
            .enumerate()
            .map(|(index, s)| Ranked { index, score: s[0] })
            .collect();
        ranked.sort_by(|a, b| b.score.total_cmp(&a.score));
        Ok(ranked)
    }
}

/// A sequence classifier as loaded for the cross-encoder and the text classifier: the
/// model, its tokenizer, its labels (`id2label`), its config and files.
pub(crate) struct Classifier {
    pub model: Box<dyn Encoder>,
    pub tokenizer: Tokenizer,
    pub labels: Vec<String>,
    pub config: zoo_hub::PretrainedConfig,
    pub pretrained: zoo_hub::Pretrained,
}

impl Classifier {
    /// Loads the sequence-classification checkpoint `repo_or_path` with its tokenizer.
    pub(crate) fn load(repo_or_path: &str, opts: &LoadOptions) -> Result<Classifier> {
        let (model, cfg, pretrained) =
            load_encoder(repo_or_path, opts, Task::SequenceClassification)?;
        let tokenizer = Tokenizer::from_pretrained(&pretrained)?;
        let EncoderHead::SequenceClassification { labels } = model.head().clone() else {
            return Err(Error::Internal(
                "a sequence-classification load gave another head".into(),
            ));
        };
        Ok(Classifier {
            model,
            tokenizer,
            labels,
            config: cfg.pretrained,
            pretrained,
        })
    }
}

/// The longest input a sequence classifier takes: its positions, cut to
/// `sentence_bert_config.json`'s `max_seq_length`, else `tokenizer_config.json`'s
/// `model_max_length` (transformers writes a huge one for "no limit").
pub(crate) fn max_length_of(
    pretrained: &zoo_hub::Pretrained,
    model: &dyn Encoder,
) -> Result<usize> {
    let files = pretrained.files();
    let from = |name: &str, key: &str| -> Result<Option<u64>> {
        Ok(match files.get_optional(name)? {
            Some(path) => read_json(&path)?.get(key).and_then(Value::as_u64),
            None => None,
        })
    };
    let mut max_length = model.max_position_embeddings();
    if let Some(n) = from("sentence_bert_config.json", "max_seq_length")?
        .or(from("tokenizer_config.json", "model_max_length")?)
    {
        max_length = max_length.min(usize::try_from(n).unwrap_or(usize::MAX));
    }
    Ok(max_length)
}

/// The id a batch is padded with: the tokenizer's padding token, else the config's
/// `pad_token_id`, else 0 (padded positions are masked either way).
pub(crate) fn pad_id_of(tokenizer: &Tokenizer, config: &zoo_hub::PretrainedConfig) -> i64 {
    tokenizer
        .pad_id()
        .map(i64::from)
        .or_else(|| {
            config
                .pad_token_id
                .as_ref()
                .and_then(|p| p.to_vec().first().copied())
                .map(i64::from)
        })
        .unwrap_or(0)
}

/// A sequence classifier's raw logits, `labels` per row, over tokenized rows (ids and
/// segment ids) run as one batch, right-padded with `pad_id` as a tokenizer pads a batch,
/// the padding masked.
pub(crate) fn classifier_logits(
    model: &dyn Encoder,
    pad_id: i64,
    rows: &[(&[u32], &[u32])],
) -> Result<Vec<f32>> {
    let (n, t) = (
        rows.len(),
        rows.iter().map(|(ids, _)| ids.len()).max().unwrap_or(0),
    );
    let (mut ids, mut types, mut mask) = (
        Vec::with_capacity(n * t),
        Vec::with_capacity(n * t),
        Vec::with_capacity(n * t),
    );
    for (row_ids, row_types) in rows {
        let pad = t - row_ids.len();
        ids.extend(row_ids.iter().map(|&i| i64::from(i)));
        ids.extend(std::iter::repeat_n(pad_id, pad));
        types.extend(row_types.iter().map(|&i| i64::from(i)));
        types.extend(std::iter::repeat_n(0, t - row_types.len()));
        mask.extend(std::iter::repeat_n(1i64, row_ids.len()));
        mask.extend(std::iter::repeat_n(0, pad));
    }
    let device = model.device();
    let tensor = |v: Vec<i64>| Tensor::from_vec(v, &[n, t], &device);
    let (input_ids, token_type_ids, attention_mask) = (tensor(ids)?, tensor(types)?, tensor(mask)?);
    let out = model.forward(EncoderArgs {
        input_ids: &input_ids,
        attention_mask: Some(&attention_mask),
        token_type_ids: Some(&token_type_ids),
        position_ids: None,
        output_hidden_states: false,
    })?;
    let logits = out
        .logits
        .ok_or_else(|| Error::Internal("the classifier returned no logits".into()))?;
    Ok(logits.to_dtype(DType::F32)?.to_vec::<f32>()?)
}

fn pooling_of(path: &Path, c: PoolingConfig) -> Result<Pooling> {
    let modes = [
        (c.pooling_mode_cls_token, Pooling::Cls),
        (c.pooling_mode_mean_tokens, Pooling::Mean),
        (c.pooling_mode_max_tokens, Pooling::Max),
        (c.pooling_mode_mean_sqrt_len_tokens, Pooling::MeanSqrtLen),
        (c.pooling_mode_lasttoken, Pooling::LastToken),
    ];
    let on: Vec<Pooling> = modes.iter().filter(|m| m.0).map(|m| m.1).collect();
    match (on.as_slice(), c.pooling_mode_weightedmean_tokens) {
        ([one], false) => Ok(*one),
        _ => Err(Error::Config {
            path: path.to_path_buf(),
            reason: "exactly one of pooling_mode_cls_token, _mean_tokens, _max_tokens, \
                     _mean_sqrt_len_tokens, _lasttoken must be true (zoo does not concatenate \
                     poolings or run weighted mean)"
                .into(),
        }),
    }
}

/// Pools `tokens` (the real tokens of one sentence, `dim` values each), accumulating in f64.
fn pool(p: Pooling, tokens: &[f32], dim: usize) -> Vec<f32> {
    let n = tokens.len() / dim.max(1);
    let rows = tokens.chunks(dim.max(1));
    match p {
        // `embed` returns a projection model's own embeddings before pooling tokens.
        Pooling::Cls | Pooling::Projection => tokens[..dim].to_vec(),
        Pooling::LastToken => tokens[(n - 1) * dim..].to_vec(),
        Pooling::Max => (0..dim)
            .map(|j| rows.clone().map(|r| r[j]).fold(f32::NEG_INFINITY, f32::max))
            .collect(),
        Pooling::Mean | Pooling::MeanSqrtLen => {
            let div = if p == Pooling::Mean {
                n as f64
            } else {
                (n as f64).sqrt()
            };
            (0..dim)
                .map(|j| (rows.clone().map(|r| f64::from(r[j])).sum::<f64>() / div) as f32)
                .collect()
        }
    }
}

/// L2-normalises `e` in place (`torch.nn.functional.normalize`, eps 1e-12).
fn normalize(e: &mut [f32]) {
    let norm = e.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>().sqrt();
    let norm = norm.max(1e-12);
    for x in e {
        *x = (f64::from(*x) / norm) as f32;
    }
}

/// Cosine similarity of two embeddings.
pub fn cosine_similarity(a: &[f32], b: &[f32]) -> f32 {
    let dot: f64 = a
        .iter()
        .zip(b)
        .map(|(&x, &y)| f64::from(x) * f64::from(y))
        .sum();
    let na: f64 = a.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>().sqrt();
    (dot / (na * nb).max(1e-12)) as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn poolings_follow_sentence_transformers() {
        // Two tokens of three values.
        let t = [1.0f32, -2.0, 3.0, 3.0, 4.0, -1.0];
        assert_eq!(pool(Pooling::Cls, &t, 3), [1.0, -2.0, 3.0]);
        assert_eq!(pool(Pooling::LastToken, &t, 3), [3.0, 4.0, -1.0]);
        assert_eq!(pool(Pooling::Max, &t, 3), [3.0, 4.0, 3.0]);
        assert_eq!(pool(Pooling::Mean, &t, 3), [2.0, 1.0, 1.0]);
        let s = 2f32.sqrt();
        let m = pool(Pooling::MeanSqrtLen, &t, 3);
        assert!((m[0] - 4.0 / s).abs() < 1e-6 && (m[1] - 2.0 / s).abs() < 1e-6);
        let mut e = vec![3.0f32, 4.0];
        normalize(&mut e);
        assert_eq!(e, [0.6, 0.8]);
        assert!((cosine_similarity(&[1.0, 0.0], &[1.0, 1.0]) - 0.5f32.sqrt()).abs() < 1e-6);
        for p in ["cls", "mean", "max", "mean_sqrt_len_tokens", "lasttoken"] {
            assert_eq!(Pooling::parse(p).unwrap().name(), p);
        }
        assert!(Pooling::parse("weightedmean").is_none());
    }

    #[test]
    fn a_pooling_config_must_name_one_mode() {
        let p = Path::new("1_Pooling/config.json");
        let two = PoolingConfig {
            pooling_mode_cls_token: true,
            pooling_mode_mean_tokens: true,
            ..Default::default()
        };
        let err = pooling_of(p, two).unwrap_err().to_string();
        assert!(
            err.contains("1_Pooling/config.json") && err.contains("exactly one"),
            "{err}"
        );
        let max = PoolingConfig {
            pooling_mode_max_tokens: true,
            ..Default::default()
        };
        assert_eq!(pooling_of(p, max).unwrap(), Pooling::Max);
    }
}
