//! `config.json`, `generation_config.json` and `tokenizer_config.json` as typed serde values.
//!
//! Fields every architecture shares are typed; everything else is kept in `extra`, never
//! rejected, so that a model file can read its own fields with [`PretrainedConfig::parse_as`].

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::error::{io_err, HubError, Result};

/// One token id or several (`eos_token_id` is either in HF configs).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum TokenIds {
    One(u32),
    Many(Vec<u32>),
}

impl<'de> Deserialize<'de> for TokenIds {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let v = Value::deserialize(d)?;
        let id = |v: &Value| v.as_u64().and_then(|n| u32::try_from(n).ok());
        match &v {
            Value::Array(ids) => ids
                .iter()
                .map(id)
                .collect::<Option<_>>()
                .map(TokenIds::Many),
            _ => id(&v).map(TokenIds::One),
        }
        .ok_or_else(|| {
            serde::de::Error::custom(format!(
                "{v} is not a token id (a whole number below 2^32) or a list of them"
            ))
        })
    }
}

/// An optional token id field: absent, `null` or negative is `None` (older configs write
/// `-1` for "no such token"; no token has that id).
fn token_ids_or_none<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> std::result::Result<Option<TokenIds>, D::Error> {
    match Option::<Value>::deserialize(d)? {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) if n.as_i64().is_some_and(|i| i < 0) => Ok(None),
        Some(v) => TokenIds::deserialize(v)
            .map(Some)
            .map_err(serde::de::Error::custom),
    }
}

impl TokenIds {
    /// The ids as a list.
    pub fn to_vec(&self) -> Vec<u32> {
        match self {
            TokenIds::One(id) => vec![*id],
            TokenIds::Many(ids) => ids.clone(),
        }
    }
}

/// The fields of `config.json` that dispatch and most architectures use; the rest is in `extra`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct PretrainedConfig {
    /// Class names such as `["LlamaForCausalLM"]`: the first dispatch key.
    #[serde(default, deserialize_with = "null_as_default")]
    pub architectures: Vec<String>,
    /// The family (`"llama"`): the second dispatch key.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model_type: Option<String>,
    /// The dtype the checkpoint was saved in (`torch_dtype` in v4, `dtype` in v5).
    #[serde(alias = "dtype", skip_serializing_if = "Option::is_none")]
    pub torch_dtype: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vocab_size: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hidden_size: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub intermediate_size: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub num_hidden_layers: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub num_attention_heads: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub num_key_value_heads: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub head_dim: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_position_embeddings: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hidden_act: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rms_norm_eps: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub layer_norm_eps: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tie_word_embeddings: Option<bool>,
    #[serde(
        default,
        deserialize_with = "token_ids_or_none",
        skip_serializing_if = "Option::is_none"
    )]
    pub bos_token_id: Option<TokenIds>,
    #[serde(
        default,
        deserialize_with = "token_ids_or_none",
        skip_serializing_if = "Option::is_none"
    )]
    pub eos_token_id: Option<TokenIds>,
    #[serde(
        default,
        deserialize_with = "token_ids_or_none",
        skip_serializing_if = "Option::is_none"
    )]
    pub pad_token_id: Option<TokenIds>,
    /// Every other field, kept as written.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
    /// The file this was read from (not serialised).
    #[serde(skip)]
    pub path: PathBuf,
}

fn null_as_default<'de, D, T>(d: D) -> std::result::Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

impl PretrainedConfig {
    /// Reads `config.json` (or any file of that form) at `path`.
    pub fn from_file(path: &Path) -> Result<PretrainedConfig> {
        let mut c: PretrainedConfig = read_json(path)?;
        c.path = path.to_path_buf();
        Ok(c)
    }

    /// Parses a config from a JSON value (e.g. one built from GGUF metadata); `origin` names
    /// where it came from in errors.
    pub fn from_value(value: Value, origin: &Path) -> Result<PretrainedConfig> {
        let mut c: PretrainedConfig = from_value_at(value, origin)?;
        c.path = origin.to_path_buf();
        Ok(c)
    }

    /// The whole config as JSON, typed fields and `extra` merged back.
    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }

    /// Re-reads the whole config as a model's own typed config; an error names the field.
    pub fn parse_as<T: DeserializeOwned>(&self) -> Result<T> {
        from_value_at(self.to_value(), &self.path)
    }

    /// A field of `extra` or of the typed part, by its JSON name.
    pub fn get(&self, field: &str) -> Option<Value> {
        match self.to_value() {
            Value::Object(mut m) => m.remove(field).filter(|v| !v.is_null()),
            _ => None,
        }
    }

    /// A required `usize` field, or an error naming the file and the field.
    pub fn require_usize(&self, field: &str) -> Result<usize> {
        self.get(field)
            .and_then(|v| v.as_u64())
            .map(|v| v as usize)
            .ok_or_else(|| HubError::ConfigField {
                path: self.path.clone(),
                field: field.to_string(),
                reason: "missing or not a non-negative integer".into(),
            })
    }

    /// The rotary-embedding parameters, from either the v5 `rope_parameters` form or the v4
    /// `rope_theta` + `rope_scaling` form. `None` when the config names neither (the model's
    /// own default theta then applies).
    pub fn rope(&self) -> Result<Option<Rope>> {
        let field_err = |field: &str, reason: String| HubError::ConfigField {
            path: self.path.clone(),
            field: field.to_string(),
            reason,
        };
        if let Some(params) = self.extra.get("rope_parameters").filter(|v| !v.is_null()) {
            let obj = params
                .as_object()
                .ok_or_else(|| field_err("rope_parameters", "not a JSON object".into()))?;
            // v5 keys per-layer-type parameters by layer type when a model mixes attention kinds.
            let nested = !obj.is_empty() && obj.values().all(Value::is_object);
            if nested {
                let mut per_layer_type = BTreeMap::new();
                for (kind, p) in obj {
                    let field = format!("rope_parameters.{kind}");
                    per_layer_type.insert(
                        kind.clone(),
                        RopeParameters::from_json(p, None, &field, &self.path)?,
                    );
                }
                return Ok(Some(Rope::PerLayerType(per_layer_type)));
            }
            return Ok(Some(Rope::Single(RopeParameters::from_json(
                params,
                None,
                "rope_parameters",
                &self.path,
            )?)));
        }
        let theta = match self.extra.get("rope_theta") {
            None | Some(Value::Null) => None,
            Some(v) => Some(
                v.as_f64()
                    .ok_or_else(|| field_err("rope_theta", "not a number".into()))?,
            ),
        };
        match self.extra.get("rope_scaling").filter(|v| !v.is_null()) {
            Some(scaling) => Ok(Some(Rope::Single(RopeParameters::from_json(
                scaling,
                theta,
                "rope_scaling",
                &self.path,
            )?))),
            None => Ok(theta.map(|rope_theta| {
                Rope::Single(RopeParameters {
                    rope_type: "default".into(),
                    rope_theta: Some(rope_theta),
                    extra: Map::new(),
                })
            })),
        }
    }
}

/// Rotary-embedding configuration, normalised from both config forms.
#[derive(Clone, Debug, PartialEq)]
pub enum Rope {
    /// One set of parameters for every layer.
    Single(RopeParameters),
    /// Parameters per layer type (`"full_attention"`, `"sliding_attention"`, ...).
    PerLayerType(BTreeMap<String, RopeParameters>),
}

/// One rope configuration: its type, base, and the type's own fields (`factor`,
/// `original_max_position_embeddings`, `low_freq_factor`, `beta_fast`, ...).
#[derive(Clone, Debug, PartialEq)]
pub struct RopeParameters {
    /// `"default"`, `"linear"`, `"dynamic"`, `"llama3"`, `"yarn"`, `"longrope"`, ...
    pub rope_type: String,
    pub rope_theta: Option<f64>,
    pub extra: Map<String, Value>,
}

impl RopeParameters {
    fn from_json(
        v: &Value,
        theta: Option<f64>,
        field: &str,
        path: &Path,
    ) -> Result<RopeParameters> {
        let err = |reason: String| HubError::ConfigField {
            path: path.to_path_buf(),
            field: field.to_string(),
            reason,
        };
        let obj = v
            .as_object()
            .ok_or_else(|| err("not a JSON object".into()))?;
        // v4 configs wrote `type`, later ones `rope_type`.
        let rope_type = match obj.get("rope_type").or_else(|| obj.get("type")) {
            None => "default".to_string(),
            Some(Value::String(s)) => s.clone(),
            Some(other) => return Err(err(format!("rope_type {other} is not a string"))),
        };
        let rope_theta = match obj.get("rope_theta") {
            None | Some(Value::Null) => theta,
            Some(t) => Some(
                t.as_f64()
                    .ok_or_else(|| err("rope_theta is not a number".into()))?,
            ),
        };
        let mut extra = obj.clone();
        for k in ["rope_type", "type", "rope_theta"] {
            extra.remove(k);
        }
        Ok(RopeParameters {
            rope_type,
            rope_theta,
            extra,
        })
    }

    /// A numeric field of this rope type (`factor`, `beta_fast`, ...).
    pub fn f64(&self, field: &str) -> Option<f64> {
        self.extra.get(field).and_then(Value::as_f64)
    }
}

/// `generation_config.json`: decoding defaults shipped with a model.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct GenerationConfig {
    #[serde(default, deserialize_with = "token_ids_or_none")]
    pub bos_token_id: Option<TokenIds>,
    #[serde(default, deserialize_with = "token_ids_or_none")]
    pub eos_token_id: Option<TokenIds>,
    #[serde(default, deserialize_with = "token_ids_or_none")]
    pub pad_token_id: Option<TokenIds>,
    pub do_sample: Option<bool>,
    pub temperature: Option<f64>,
    pub top_k: Option<usize>,
    pub top_p: Option<f64>,
    pub min_p: Option<f64>,
    pub repetition_penalty: Option<f64>,
    pub max_length: Option<usize>,
    pub max_new_tokens: Option<usize>,
    pub min_new_tokens: Option<usize>,
    pub no_repeat_ngram_size: Option<usize>,
    /// Beam search width (zoo decodes one sequence: greedy or sampled).
    pub num_beams: Option<usize>,
    pub bad_words_ids: Option<Vec<Vec<u32>>>,
    pub suppress_tokens: Option<Vec<u32>>,
    pub begin_suppress_tokens: Option<Vec<u32>>,
    pub typical_p: Option<f64>,
    pub epsilon_cutoff: Option<f64>,
    pub eta_cutoff: Option<f64>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl GenerationConfig {
    /// Reads `generation_config.json` at `path`.
    pub fn from_file(path: &Path) -> Result<GenerationConfig> {
        read_json(path)
    }
}

/// A special token in `tokenizer_config.json`: a plain string or an `AddedToken` object.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum SpecialToken {
    Text(String),
    Added {
        content: String,
        #[serde(flatten)]
        extra: Map<String, Value>,
    },
}

impl SpecialToken {
    /// The token's text.
    pub fn content(&self) -> &str {
        match self {
            SpecialToken::Text(s) => s,
            SpecialToken::Added { content, .. } => content,
        }
    }
}

/// `chat_template`: one template, or several named ones (`default`, `tool_use`, ...).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ChatTemplate {
    One(String),
    Named(Vec<NamedTemplate>),
}

/// One entry of a list-form `chat_template`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NamedTemplate {
    pub name: String,
    pub template: String,
}

/// `tokenizer_config.json`: special tokens, chat template and tokenizer options.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct TokenizerConfig {
    pub chat_template: Option<ChatTemplate>,
    pub bos_token: Option<SpecialToken>,
    pub eos_token: Option<SpecialToken>,
    pub unk_token: Option<SpecialToken>,
    pub pad_token: Option<SpecialToken>,
    pub add_bos_token: Option<bool>,
    pub add_eos_token: Option<bool>,
    pub model_max_length: Option<f64>,
    pub tokenizer_class: Option<String>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl TokenizerConfig {
    /// Reads `tokenizer_config.json` at `path`.
    pub fn from_file(path: &Path) -> Result<TokenizerConfig> {
        read_json(path)
    }

    /// The chat template called `name` (`None` picks `default`, or the only one).
    pub fn template(&self, name: Option<&str>) -> Option<&str> {
        match (&self.chat_template, name) {
            (Some(ChatTemplate::One(t)), None | Some("default")) => Some(t),
            (Some(ChatTemplate::Named(list)), name) => {
                let want = name.unwrap_or("default");
                list.iter()
                    .find(|t| t.name == want)
                    .or_else(|| (name.is_none() && list.len() == 1).then(|| &list[0]))
                    .map(|t| t.template.as_str())
            }
            _ => None,
        }
    }
}

/// Reads a JSON file into `T`; a parse or type error names the file, line and column.
pub fn read_json<T: DeserializeOwned>(path: &Path) -> Result<T> {
    let bytes = std::fs::read(path).map_err(io_err(path))?;
    parse_json(path, &bytes)
}

/// Parses JSON bytes into `T`, naming `path` in errors. Split out for the fuzzer.
pub fn parse_json<T: DeserializeOwned>(path: &Path, bytes: &[u8]) -> Result<T> {
    serde_json::from_slice(bytes).map_err(|e| {
        // Valid JSON holding a wrong value: read again to name the field.
        if e.classify() == serde_json::error::Category::Data {
            if let Ok(value) = serde_json::from_slice::<Value>(bytes) {
                if let Err(named) = from_value_at::<T>(value, path) {
                    return named;
                }
            }
        }
        HubError::Json {
            path: path.to_path_buf(),
            reason: e.to_string(),
        }
    })
}

/// Deserialises `value`, naming the offending field's path (`rope_scaling.factor`) in errors.
fn from_value_at<T: DeserializeOwned>(value: Value, path: &Path) -> Result<T> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let field = e.path().to_string();
        HubError::ConfigField {
            path: path.to_path_buf(),
            field: if field == "." { "(root)".into() } else { field },
            reason: e.into_inner().to_string(),
        }
    })
}

/// Whether a config value is "off": null, false, or an empty list or object (how configs
/// write a feature they do not use).
pub fn is_off(v: &Value) -> bool {
    match v {
        Value::Null | Value::Bool(false) => true,
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        _ => false,
    }
}
