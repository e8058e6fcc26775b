//! The typed `config.json` of the Llama-shaped decoders (llama, mistral, qwen2, qwen3, phi3,
//! the Gemmas, mixtral, qwen2_moe, qwen3_moe).
//!
//! One serde struct reads them all: their configs share every field the decoder needs, and
//! each family's own switches (`attention_bias`, `mlp_bias`, `sliding_window`,
//! `use_sliding_window`, `layer_types`, the expert counts) are optional; the family file
//! supplies transformers' defaults. Which
//! switches a family turns on, its window rule included, is the family file's business.

use std::path::PathBuf;

use serde::Deserialize;
use zoo_hub::{PretrainedConfig, Rope};
use zoo_runtime::nn::RopeConfig;

use crate::{Error, Result};

/// A classifier's label names by index: `id2label` in index order, else `LABEL_i` for
/// `num_labels` (transformers' default 2).
pub(crate) fn labels(
    id2label: Option<&std::collections::BTreeMap<String, String>>,
    num_labels: Option<usize>,
    path: &std::path::Path,
) -> Result<Vec<String>> {
    let Some(map) = id2label else {
        return Ok((0..num_labels.unwrap_or(2))
            .map(|i| format!("LABEL_{i}"))
            .collect());
    };
    let mut labels = vec![None; map.len()];
    for (k, v) in map {
        let Some(i) = k.parse::<usize>().ok().filter(|&i| i < map.len()) else {
            return Err(Error::Config {
                path: path.to_path_buf(),
                reason: format!("`id2label` key {k:?} is not an index below {}", map.len()),
            });
        };
        labels[i] = Some(v.clone());
    }
    Ok(labels.into_iter().flatten().collect())
}

/// Refuses a size field of `cfg` that is 0, naming the file and the field.
pub(crate) fn require_positive(cfg: &PretrainedConfig, fields: &[(&str, usize)]) -> Result<()> {
    match fields.iter().find(|(_, v)| *v == 0) {
        Some((name, _)) => Err(config_error(
            cfg,
            format!("`{name}` is 0; it must be positive"),
        )),
        None => Ok(()),
    }
}

/// [`require_positive`] over fields of a typed config `c`, each error naming the field as
/// written in `config.json` (its Rust name, so the two cannot drift apart).
macro_rules! positive_fields {
    ($cfg:expr; $($c:ident . $field:ident),+ $(,)?) => {
        $crate::config::require_positive($cfg, &[$((stringify!($field), $c.$field)),+])
    };
}
pub(crate) use positive_fields;

/// Refuses a width that its heads do not split evenly, naming both fields.
pub(crate) fn require_divisible(
    cfg: &PretrainedConfig,
    (width_name, width): (&str, usize),
    (heads_name, heads): (&str, usize),
) -> Result<()> {
    if width.is_multiple_of(heads) {
        return Ok(());
    }
    let reason = format!("`{width_name}` ({width}) is not divisible by `{heads_name}` ({heads})");
    Err(config_error(cfg, reason))
}

/// [`require_divisible`] over two fields of a typed config `c`, named as written.
macro_rules! heads_divide {
    ($cfg:expr; $c:ident . $width:ident, $d:ident . $heads:ident) => {
        $crate::config::require_divisible(
            $cfg,
            (stringify!($width), $c.$width),
            (stringify!($heads), $d.$heads),
        )
    };
}
pub(crate) use heads_divide;

/// A config error naming `cfg`'s file.
pub(crate) fn config_error(cfg: &PretrainedConfig, reason: String) -> Error {
    Error::Config {
        path: cfg.path.clone(),
        reason,
    }
}

/// transformers' default values of config fields, one home for every typed config's
/// `#[serde(default = "defaults::…")]` (serde takes a function; numbers come through const
/// generics, the rest by name).
pub(crate) mod defaults {
    /// An integer field's default `N`.
    pub(crate) fn usize<const N: usize>() -> usize {
        N
    }
    /// A signed field's default `N`.
    pub(crate) fn i64<const N: i64>() -> i64 {
        N
    }
    /// `true`.
    pub(crate) fn yes() -> bool {
        true
    }
    /// An epsilon of 1e-12 (BERT, ViT).
    pub(crate) fn eps_1e12() -> f64 {
        1e-12
    }
    /// An epsilon of 1e-5 (GPT-2, CLIP).
    pub(crate) fn eps_1e5() -> f64 {
        1e-5
    }
    /// An epsilon of 1e-6 (Llama, T5).
    pub(crate) fn eps_1e6() -> f64 {
        1e-6
    }
    /// A string default (activation names, `position_embedding_type`).
    macro_rules! names {
        ($($name:ident),*) => {$(
            #[doc = concat!("`\"", stringify!($name), "\"`.")]
            pub(crate) fn $name() -> String {
                stringify!($name).into()
            }
        )*};
    }
    names!(
        absolute,
        gelu,
        gelu_new,
        gelu_pytorch_tanh,
        quick_gelu,
        relu,
        silu,
        tanh
    );
}

/// `config.json` of a Llama-family checkpoint, as transformers' `LlamaConfig` /
/// `MistralConfig` / `Qwen2Config` / `Qwen3Config` read it.
#[derive(Clone, Debug, Deserialize)]
pub struct DecoderConfig {
    /// Rows of the embedding table and of `lm_head`.
    pub vocab_size: usize,
    /// Width of the residual stream.
    pub hidden_size: usize,
    /// Width of the MLP.
    pub intermediate_size: usize,
    /// Decoder layers.
    pub num_hidden_layers: usize,
    /// Query heads.
    pub num_attention_heads: usize,
    /// Defaults to `num_attention_heads` (multi-head attention).
    #[serde(default)]
    pub num_key_value_heads: Option<usize>,
    /// Defaults to `hidden_size / num_attention_heads`.
    #[serde(default)]
    pub head_dim: Option<usize>,
    /// The context the model was trained for (rope scaling may stretch it).
    #[serde(default = "defaults::usize::<2048>")]
    pub max_position_embeddings: usize,
    /// MLP activation (`silu`).
    #[serde(default = "defaults::silu")]
    pub hidden_act: String,
    /// Epsilon of every RMSNorm.
    #[serde(default = "defaults::eps_1e6")]
    pub rms_norm_eps: f64,
    /// `lm_head` shares `model.embed_tokens.weight`.
    #[serde(default)]
    pub tie_word_embeddings: bool,
    /// Llama and Qwen3: bias on q/k/v/o.
    #[serde(default)]
    pub attention_bias: bool,
    /// Llama: bias on gate/up/down.
    #[serde(default)]
    pub mlp_bias: bool,
    /// Mistral: every layer; Qwen2/3: layers chosen by `use_sliding_window`, `max_window_layers`
    /// or `layer_types`.
    #[serde(default)]
    pub sliding_window: Option<usize>,
    /// Qwen2/3: whether `sliding_window` is used at all.
    #[serde(default)]
    pub use_sliding_window: Option<bool>,
    /// Qwen2/3: the first layer that slides (transformers' default 28).
    #[serde(default)]
    pub max_window_layers: Option<usize>,
    /// v5: `"full_attention"` or `"sliding_attention"` per layer.
    #[serde(default)]
    pub layer_types: Option<Vec<String>>,
    /// Fraction of each head that rope rotates (1 when absent; v5 configs may keep it in
    /// `rope_parameters`).
    #[serde(default)]
    pub partial_rotary_factor: Option<f64>,
    /// Phi-3: the pretrained context, outside `rope_scaling`; longrope switches from the
    /// short to the long factors past it.
    #[serde(default)]
    pub original_max_position_embeddings: Option<usize>,
    /// Qwen2-MoE: bias on q/k/v (transformers' default true).
    #[serde(default)]
    pub qkv_bias: Option<bool>,
    /// Mixtral / Qwen3-MoE: experts per layer (transformers' name; `num_experts` is its alias).
    #[serde(default)]
    pub num_local_experts: Option<usize>,
    /// Qwen2-MoE: experts per layer (0: every layer is a plain MLP); Mixtral / Qwen3-MoE:
    /// the alias of `num_local_experts`.
    #[serde(default)]
    pub num_experts: Option<usize>,
    /// Experts each token is routed to.
    #[serde(default)]
    pub num_experts_per_tok: Option<usize>,
    /// Qwen MoE: width of each routed expert (`intermediate_size` is the dense layers').
    #[serde(default)]
    pub moe_intermediate_size: Option<usize>,
    /// Qwen2-MoE: width of the shared expert.
    #[serde(default)]
    pub shared_expert_intermediate_size: Option<usize>,
    /// Qwen MoE: every `decoder_sparse_step`-th layer routes (layer `i` when `(i + 1) % step == 0`).
    #[serde(default)]
    pub decoder_sparse_step: Option<usize>,
    /// Qwen MoE: layers that keep a plain MLP whatever the step says.
    #[serde(default)]
    pub mlp_only_layers: Option<Vec<usize>>,
    /// Qwen MoE: renormalise the top-k routing weights to sum to 1.
    #[serde(default)]
    pub norm_topk_prob: Option<bool>,
    /// The `config.json` it came from, for errors.
    #[serde(skip)]
    pub path: PathBuf,
    #[serde(skip)]
    rope: Option<RopeConfig>,
}

impl DecoderConfig {
    /// Reads the typed config from a hub config; a missing or mistyped field is an error
    /// naming the file and the field, and impossible combinations are refused here.
    pub fn from_pretrained(cfg: &PretrainedConfig) -> Result<DecoderConfig> {
        let mut c: DecoderConfig = cfg.parse_as()?;
        c.path = cfg.path.clone();
        let bad = |reason: String| config_error(cfg, reason);
        positive_fields!(cfg; c.vocab_size, c.hidden_size, c.intermediate_size, c.num_hidden_layers,
            c.num_attention_heads)?;
        let kv = c.num_kv_heads();
        if kv == 0 || !c.num_attention_heads.is_multiple_of(kv) {
            return Err(bad(format!(
                "`num_attention_heads` ({}) must be a positive multiple of `num_key_value_heads` ({kv})",
                c.num_attention_heads
            )));
        }
        if c.head_dim.is_none() && !c.hidden_size.is_multiple_of(c.num_attention_heads) {
            return Err(bad(format!(
                "`hidden_size` ({}) is not divisible by `num_attention_heads` ({}) and no `head_dim` is given",
                c.hidden_size, c.num_attention_heads
            )));
        }
        if c.decoder_sparse_step == Some(0) {
            return Err(bad(
                "`decoder_sparse_step` is 0; it must be positive (1 routes every layer)".into(),
            ));
        }
        if let Some(types) = &c.layer_types {
            if types.len() != c.num_hidden_layers {
                return Err(bad(format!(
                    "`layer_types` lists {} layers but `num_hidden_layers` is {}",
                    types.len(),
                    c.num_hidden_layers
                )));
            }
            if let Some(t) = types
                .iter()
                .find(|t| *t != "full_attention" && *t != "sliding_attention")
            {
                return Err(bad(format!(
                    "`layer_types` holds `{t}`; only full_attention and sliding_attention exist in this family"
                )));
            }
        }
        zoo_runtime::Activation::from_hf(&c.hidden_act)
            .map_err(|e| bad(format!("`hidden_act`: {e}")))?;
        let params = match cfg.rope()? {
            None => zoo_hub::RopeParameters {
                rope_type: "default".into(),
                rope_theta: Some(10_000.0),
                extra: Default::default(),
            },
            Some(Rope::Single(p)) => p,
            Some(Rope::PerLayerType(m)) => m
                .get("full_attention")
                .or_else(|| m.values().next())
                .cloned()
                .ok_or_else(|| bad("`rope_parameters` is empty".into()))?,
        };
        // Phi-3's early configs named longrope `su` or `yarn` (transformers renames them).
        let mut params = params;
        if cfg.model_type.as_deref() == Some("phi3")
            && matches!(params.rope_type.as_str(), "su" | "yarn")
        {
            params.rope_type = "longrope".into();
        }
        if c.partial_rotary_factor.is_none() {
            c.partial_rotary_factor = params.f64("partial_rotary_factor");
        }
        let partial = c.partial_rotary_factor.unwrap_or(1.0);
        if !(partial > 0.0 && partial <= 1.0) {
            return Err(bad(format!(
                "`partial_rotary_factor` is {partial}; it must be in (0, 1]"
            )));
        }
        let rope = RopeConfig::from_hub(
            &params,
            c.head_dim(),
            partial,
            c.max_position_embeddings,
            c.original_max_position_embeddings,
        )
        .map_err(|e| bad(format!("rope: {e}")))?;
        c.rope = Some(rope);
        Ok(c)
    }

    /// Key/value heads (GQA when fewer than query heads, MQA when 1).
    pub fn num_kv_heads(&self) -> usize {
        self.num_key_value_heads.unwrap_or(self.num_attention_heads)
    }

    /// Channels per head.
    pub fn head_dim(&self) -> usize {
        self.head_dim
            .unwrap_or(self.hidden_size / self.num_attention_heads)
    }

    /// The rotary-embedding configuration (every rope type transformers applies here).
    pub fn rope(&self) -> Result<RopeConfig> {
        self.rope.clone().ok_or_else(|| Error::Config {
            path: self.path.clone(),
            reason: "rope configuration missing; build DecoderConfig with from_pretrained".into(),
        })
    }

    /// Mixtral's and Qwen3-MoE's expert count: `num_local_experts`, or its alias
    /// `num_experts` (transformers' `attribute_map`).
    pub fn local_experts(&self) -> Option<usize> {
        self.num_local_experts.or(self.num_experts)
    }

    /// The sliding window of each layer (`None` = full attention): v5 `layer_types` when
    /// the config lists them, else the family's rule `slides(i)`; no layer slides without
    /// a `sliding_window`.
    pub fn windows(&self, slides: impl Fn(usize) -> bool) -> Vec<Option<usize>> {
        (0..self.num_hidden_layers)
            .map(|i| {
                let window = self.sliding_window?;
                let on = match &self.layer_types {
                    Some(types) => types.get(i).map(String::as_str) == Some("sliding_attention"),
                    None => slides(i),
                };
                on.then_some(window)
            })
            .collect()
    }
}
