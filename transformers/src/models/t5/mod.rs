//! T5: mirrors transformers' `models/t5/modeling_t5.py` and `models/umt5/modeling_umt5.py`
//! (`T5EncoderModel`, `T5ForConditionalGeneration` and the UMT5 ones, eager attention). The
//! encoder is the text encoder diffusion pipelines (PixArt, SD3, Flux) read; the whole model
//! generates text from a prompt the encoder reads.
//!
//! Token embeddings (`shared`, no positions); per block, T5's RMS layer norm, self-attention
//! without score scaling whose scores add a learned relative-position bias (buckets of
//! `key - query`, exact up to half the buckets and logarithmic to `relative_attention_max_distance`;
//! bidirectional in the encoder, the past only in the decoder; the first block's bias is
//! shared by all in T5, every block has its own in UMT5) and the mask, a residual, in the
//! decoder a cross-attention to the encoder's output (no position bias), then layer norm, the
//! feed-forward (`relu` for t5 v1.0, a gated `gelu_new` for v1.1 / flan-t5 / umt5 —
//! `feed_forward_proj`), a residual; a final norm.

mod conditional;
mod encoder;

use serde::Deserialize;
use zoo_hub::PretrainedConfig;
use zoo_runtime::device_map::{CacheLayout, ModelShape, TpPlan, TpStyle};
use zoo_runtime::nn::{Embedding, Linear, Weights};
use zoo_runtime::{Activation, DType, Device, SdpaOptions, Tensor};

pub use conditional::T5ForConditionalGeneration;
pub use encoder::T5EncoderModel;

use crate::config::defaults;
use crate::config::require_positive;
use crate::family::{family, Family, Layout, Loaders, Task};
use crate::kinds::{Encoder, Seq2SeqLm};
use crate::{Error, Result};

/// The registry entry of `t5`.
pub(crate) const FAMILY: Family = family! {
    "t5" in "t5", classes [T5EncoderModel: Base, T5ForConditionalGeneration: Seq2SeqLm],
    no_split ["T5Block"], tp TP_PLAN, config T5Config,
    loaders Loaders::Seq2Seq { encoder: load_encoder, seq2seq: load_seq2seq },
};

/// T5's tensor-parallel plan (UMT5's too): heads of self- and cross-attention (q/k/v
/// colwise, o rowwise), feed-forward columns (wi, wi_0, wi_1 colwise, wo rowwise), shared
/// embeddings and LM head by vocabulary.
const TP_PLAN: TpPlan = &[
    ("SelfAttention.q", TpStyle::Colwise),
    ("SelfAttention.k", TpStyle::Colwise),
    ("SelfAttention.v", TpStyle::Colwise),
    ("SelfAttention.o", TpStyle::Rowwise),
    ("EncDecAttention.q", TpStyle::Colwise),
    ("EncDecAttention.k", TpStyle::Colwise),
    ("EncDecAttention.v", TpStyle::Colwise),
    ("EncDecAttention.o", TpStyle::Rowwise),
    ("DenseReluDense.wi", TpStyle::Colwise),
    ("DenseReluDense.wi_0", TpStyle::Colwise),
    ("DenseReluDense.wi_1", TpStyle::Colwise),
    ("DenseReluDense.wo", TpStyle::Rowwise),
    ("shared", TpStyle::Vocab),
    ("lm_head", TpStyle::Vocab),
];

/// The registry entry of `umt5`: T5 v1.1 with a relative bias in every block.
pub(crate) const UMT5_FAMILY: Family = family! {
    "umt5" in "umt5",
    classes [UMT5EncoderModel: Base, UMT5ForConditionalGeneration: Seq2SeqLm],
    no_split ["UMT5Block"], tp TP_PLAN, config T5Config,
    loaders Loaders::Seq2Seq { encoder: load_encoder, seq2seq: load_seq2seq },
};

/// `config.json` of a T5 / UMT5, as transformers' `T5Config` reads it.
#[derive(Clone, Debug, Deserialize)]
pub struct T5Config {
    /// Rows of the shared embedding table.
    pub vocab_size: usize,
    /// Width of the residual stream.
    pub d_model: usize,
    /// Width of one head.
    #[serde(default = "defaults::usize::<64>")]
    pub d_kv: usize,
    /// Width of the feed-forward.
    pub d_ff: usize,
    /// Encoder blocks.
    pub num_layers: usize,
    /// Decoder blocks (`num_layers` when absent).
    #[serde(default)]
    pub num_decoder_layers: Option<usize>,
    /// Attention heads.
    pub num_heads: usize,
    /// Buckets of the relative-position bias.
    #[serde(default = "defaults::usize::<32>")]
    pub relative_attention_num_buckets: usize,
    /// Distance past which positions share the last bucket.
    #[serde(default = "defaults::usize::<128>")]
    pub relative_attention_max_distance: usize,
    /// Epsilon of every layer norm.
    #[serde(default = "defaults::eps_1e6")]
    pub layer_norm_epsilon: f64,
    /// `relu`, `gelu`, `gated-gelu`, `gated-silu`, ...: the activation, gated or not.
    #[serde(default = "defaults::relu")]
    pub feed_forward_proj: String,
    /// Whether the head shares the embedding table, which also scales the decoder's output
    /// by `d_model ** -0.5` (absent means true, as in T5 v1.0).
    #[serde(default)]
    pub tie_word_embeddings: Option<bool>,
    /// The scaling itself, as current transformers writes it beside a forced
    /// `tie_word_embeddings: true`; it wins when present.
    #[serde(default)]
    pub scale_decoder_outputs: Option<bool>,
    /// `t5` or `umt5`.
    #[serde(skip)]
    pub model_type: String,
    /// The config file, for errors.
    #[serde(skip)]
    pub path: std::path::PathBuf,
}

impl T5Config {
    /// Reads and checks the typed config.
    pub fn from_pretrained(cfg: &PretrainedConfig) -> Result<T5Config> {
        let mut c: T5Config = cfg.parse_as()?;
        c.path = cfg.path.clone();
        c.model_type = cfg.model_type.clone().unwrap_or_else(|| "t5".into());
        require_positive(
            cfg,
            &[
                ("vocab_size", c.vocab_size),
                ("d_model", c.d_model),
                ("d_kv", c.d_kv),
                ("d_ff", c.d_ff),
                ("num_layers", c.num_layers),
                ("num_decoder_layers", c.decoder_layers()),
                ("num_heads", c.num_heads),
                (
                    "relative_attention_num_buckets",
                    c.relative_attention_num_buckets,
                ),
            ],
        )?;
        let bad = |reason: String| Error::Config {
            path: c.path.clone(),
            reason,
        };
        if c.relative_attention_num_buckets < 4 || c.relative_attention_max_distance < 2 {
            return Err(bad(format!(
                "`relative_attention_num_buckets` ({}) must be at least 4 and `relative_attention_max_distance` ({}) at least 2",
                c.relative_attention_num_buckets, c.relative_attention_max_distance
            )));
        }
        let (gated, act) = c.activation();
        let parts = c.feed_forward_proj.split('-').count();
        if parts > 2 || (parts == 2 && !gated) {
            return Err(bad(format!(
                "`feed_forward_proj` {:?} must be `ACT` or `gated-ACT` (e.g. relu, gated-gelu)",
                c.feed_forward_proj
            )));
        }
        Activation::from_hf(act).map_err(|e| bad(format!("`feed_forward_proj`: {e}")))?;
        Ok(c)
    }

    /// Whether the feed-forward is gated, and its activation (`gated-gelu` is `gelu_new`, as
    /// transformers keeps for old configs).
    pub fn activation(&self) -> (bool, &str) {
        let f = self.feed_forward_proj.as_str();
        match f.split_once('-') {
            Some(("gated", "gelu")) => (true, "gelu_new"),
            Some(("gated", act)) => (true, act),
            _ => (false, f),
        }
    }

    /// Whether every block has its own relative bias (UMT5).
    pub fn bias_per_block(&self) -> bool {
        self.model_type == "umt5"
    }

    /// Decoder blocks.
    pub fn decoder_layers(&self) -> usize {
        self.num_decoder_layers.unwrap_or(self.num_layers)
    }

    /// Whether the decoder's output is scaled by `d_model ** -0.5` before the head
    /// (transformers' `scale_decoder_outputs`: unless `tie_word_embeddings` is false).
    pub fn scales_decoder_outputs(&self) -> bool {
        self.scale_decoder_outputs
            .unwrap_or(self.tie_word_embeddings != Some(false))
    }
}

/// The planner's view: encoder and decoder blocks are the no-split units (each decoder block
/// with its self- and cross-attention caches); the embedding table (and a head tied to it)
/// goes with the first.
fn layout(config: &PretrainedConfig) -> Result<Layout> {
    let c = T5Config::from_pretrained(config)?;
    let generates = config
        .architectures
        .iter()
        .any(|a| a.ends_with("ForConditionalGeneration"));
    let mut tied = vec![
        "shared.weight".to_string(),
        "encoder.embed_tokens.weight".into(),
    ];
    let (layer_containers, inputs, vocab, kv_cache) = if generates {
        tied.push("decoder.embed_tokens.weight".into());
        if c.tie_word_embeddings != Some(false) {
            tied.push("lm_head.weight".into());
        }
        (
            vec!["encoder.block".into(), "decoder.block".into()],
            vec![
                "shared".into(),
                "encoder.embed_tokens".into(),
                "decoder.embed_tokens".into(),
            ],
            c.vocab_size,
            CacheLayout::EncoderDecoder {
                decoder: "decoder.block",
            },
        )
    } else {
        (
            vec!["encoder.block".into()],
            vec!["shared".into(), "encoder.embed_tokens".into()],
            0,
            CacheLayout::None,
        )
    };
    Ok(Layout {
        layer_containers,
        inputs,
        tied: vec![tied],
        shape: ModelShape {
            layers: c.num_layers + if generates { c.decoder_layers() } else { 0 },
            hidden: c.d_model,
            intermediate: c.d_ff,
            heads: c.num_heads,
            kv_heads: c.num_heads,
            head_dim: c.d_kv,
            vocab,
            kv_cache,
        },
        // Relative positions have no trained limit; plans are sized for 512 tokens, T5's
        // training length (and what PixArt and SD3 feed it).
        context: 512,
    })
}

fn load_encoder(w: &Weights, config: &PretrainedConfig, task: Task) -> Result<Box<dyn Encoder>> {
    let c = T5Config::from_pretrained(config)?;
    task.base_only(
        config,
        "T5 has an encoder (T5EncoderModel) and a generating model (T5ForConditionalGeneration, AutoModelForSeq2SeqLM)",
    )?;
    Ok(Box::new(T5EncoderModel::load(w, &c)?))
}

fn load_seq2seq(w: &Weights, config: &PretrainedConfig) -> Result<Box<dyn Seq2SeqLm>> {
    let c = T5Config::from_pretrained(config)?;
    Ok(Box::new(T5ForConditionalGeneration::load(w, &c, config)?))
}

/// The bucket of a relative position `key - query`, as transformers' float32 arithmetic
/// computes it (logarithmic buckets past `max_exact`): T5's `_relative_position_bucket`, and
/// MPNet's `relative_position_bucket` (bidirectional).
pub(crate) fn relative_bucket(
    relative: i64,
    bidirectional: bool,
    buckets: usize,
    max_distance: usize,
) -> usize {
    let (mut n, mut base) = (buckets as i64, 0i64);
    let mut rp = relative;
    if bidirectional {
        n /= 2;
        if rp > 0 {
            base = n;
        }
        rp = rp.abs();
    } else {
        rp = -rp.min(0);
    }
    let max_exact = n / 2;
    if rp < max_exact {
        return (base + rp) as usize;
    }
    let ratio = (rp as f32 / max_exact as f32).ln()
        / ((max_distance as f64 / max_exact as f64).ln() as f32)
        * (n - max_exact) as f32;
    (base + (max_exact + ratio as i64).min(n - 1)) as usize
}

/// `T5Attention`: self- or cross-attention without score scaling; the layer that owns the
/// relative bias table (`relative_attention_bias`) computes the position bias of its stack.
#[derive(Clone, Debug)]
pub(super) struct Attention {
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    pub(super) relative_attention_bias: Option<Embedding>,
    heads: usize,
    d_kv: usize,
}

impl Attention {
    /// Loads `q`, `k`, `v`, `o` (and the bias table when `has_bias`) under `w`.
    pub(super) fn load(w: &Weights, c: &T5Config, has_bias: bool) -> Result<Attention> {
        let (d, inner) = (c.d_model, c.num_heads * c.d_kv);
        Ok(Attention {
            q: Linear::load(&w.pp("q"), d, inner, false)?,
            k: Linear::load(&w.pp("k"), d, inner, false)?,
            v: Linear::load(&w.pp("v"), d, inner, false)?,
            o: Linear::load(&w.pp("o"), inner, d, false)?,
            relative_attention_bias: if has_bias {
                Some(Embedding::load(
                    &w.pp("relative_attention_bias"),
                    c.relative_attention_num_buckets,
                    c.num_heads,
                )?)
            } else {
                None
            },
            heads: c.num_heads,
            d_kv: c.d_kv,
        })
    }

    /// `[B, T, heads * d_kv]` to `[B, heads, T, d_kv]`.
    fn split(&self, y: &Tensor) -> Result<Tensor> {
        let (b, t) = (y.shape()[0], y.shape()[1]);
        Ok(y.reshape_to(&[b, t, self.heads, self.d_kv])?
            .transpose(1, 2)?)
    }

    /// Queries of `x`, split into heads.
    pub(super) fn query(&self, x: &Tensor) -> Result<Tensor> {
        self.split(&self.q.forward(x)?)
    }

    /// Keys and values of `x`, split into heads.
    pub(super) fn key_value(&self, x: &Tensor) -> Result<(Tensor, Tensor)> {
        let [k, v] = Linear::forward_each([&self.k, &self.v], x)?;
        Ok((self.split(&k)?, self.split(&v)?))
    }

    /// Self-attention of `x [B, T, d_model]` over itself.
    pub(super) fn forward(&self, x: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
        let [q, k, v] = Linear::forward_each([&self.q, &self.k, &self.v], x)?;
        self.attend(&self.split(&q)?, &self.split(&k)?, &self.split(&v)?, bias)
    }

    /// Attention of split queries over split keys and values; `bias` (broadcast to
    /// `[B, heads, Tq, Tk]`) is the position bias plus the mask, added to unscaled scores.
    pub(super) fn attend(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        bias: Option<&Tensor>,
    ) -> Result<Tensor> {
        let opts = SdpaOptions {
            mask: bias,
            scale: Some(1.0),
            round_scores: true,
            ..Default::default()
        };
        let ctx = Tensor::scaled_dot_product_attention(q, k, v, &opts)?;
        let (b, t) = (ctx.shape()[0], ctx.shape()[2]);
        let ctx = ctx
            .transpose(1, 2)?
            .reshape_to(&[b, t, self.heads * self.d_kv])?;
        Ok(self.o.forward(&ctx)?)
    }
}

/// `T5DenseActDense` / `T5DenseGatedActDense`: `wo(act(wi(x)))` or `wo(act(wi_0(x)) * wi_1(x))`.
#[derive(Clone, Debug)]
pub(super) struct FeedForward {
    wi: Vec<Linear>,
    wo: Linear,
    act: Activation,
}

impl FeedForward {
    /// Loads `wi` (or `wi_0`, `wi_1`) and `wo` under `w` (`layer.N.DenseReluDense`).
    pub(super) fn load(w: &Weights, c: &T5Config) -> Result<FeedForward> {
        let d = c.d_model;
        let (gated, act) = c.activation();
        let wi = if gated {
            vec![
                Linear::load(&w.pp("wi_0"), d, c.d_ff, false)?,
                Linear::load(&w.pp("wi_1"), d, c.d_ff, false)?,
            ]
        } else {
            vec![Linear::load(&w.pp("wi"), d, c.d_ff, false)?]
        };
        Ok(FeedForward {
            wi,
            wo: Linear::load(&w.pp("wo"), c.d_ff, d, false)?,
            act: Activation::from_hf(act)?,
        })
    }

    pub(super) fn forward(&self, h: &Tensor) -> Result<Tensor> {
        let m = match &self.wi[..] {
            [wi] => self.act.apply(&wi.forward(h)?)?,
            [wi_0, wi_1] => self.act.apply(&wi_0.forward(h)?)?.mul(&wi_1.forward(h)?)?,
            _ => unreachable!("one or two input projections"),
        };
        Ok(self.wo.forward(&m)?)
    }
}

/// The position bias `[1, heads, queries, keys]` of `table [buckets, heads]` for queries at
/// positions `first_query..first_query + queries` over keys at `0..keys` (T5's
/// `compute_bias`), on `device`; causal stacks (`bidirectional == false`) bucket only the past.
pub(super) fn position_bias(
    c: &T5Config,
    table: &Embedding,
    first_query: usize,
    queries: usize,
    keys: usize,
    bidirectional: bool,
    device: &Device,
) -> Result<Tensor> {
    let buckets: Vec<i64> = (first_query..first_query + queries)
        .flat_map(|q| {
            (0..keys).map(move |k| {
                relative_bucket(
                    k as i64 - q as i64,
                    bidirectional,
                    c.relative_attention_num_buckets,
                    c.relative_attention_max_distance,
                ) as i64
            })
        })
        .collect();
    let idx = Tensor::from_vec(buckets, &[queries * keys], &table.device())?;
    let values = table
        .forward(&idx)?
        .reshape_to(&[queries, keys, c.num_heads])?;
    Ok(values
        .permute(&[2, 0, 1])?
        .unsqueeze(0)?
        .to_device(device)?)
}

/// The additive padding mask `[B, 1, 1, T]` of `real` (`[B * T]`, 0 for padding) in `dtype`,
/// or `None` when nothing is padded (transformers builds no mask then).
pub(super) fn padding_bias(
    real: &[i64],
    (b, t): (usize, usize),
    dtype: DType,
    device: &Device,
) -> Result<Option<Tensor>> {
    if real.iter().all(|&m| m != 0) {
        return Ok(None);
    }
    let low = dtype.finite_min();
    let pad: Vec<f64> = real
        .iter()
        .map(|&m| if m == 0 { low } else { 0.0 })
        .collect();
    Ok(Some(Tensor::from_f64s(&pad, &[b, 1, 1, t], dtype, device)?))
}

/// Checks `ids [B, T]` against the vocabulary and returns their values.
pub(super) fn checked_ids(ids: &Tensor, vocab: usize) -> Result<(Vec<i64>, usize, usize)> {
    let [b, t] = ids.shape()[..] else {
        return Err(Error::invalid(
            "input_ids",
            format!("input_ids {:?} must be [batch, seq]", ids.shape()),
        ));
    };
    if t == 0 {
        return Err(Error::invalid(
            "input_ids",
            "empty input: at least one token is needed".into(),
        ));
    }
    let values = match ids.host_known_i64() {
        Some(v) => v,
        None => ids.to_dtype(DType::I64)?.to_vec::<i64>()?,
    };
    if let Some(&bad) = values.iter().find(|&&i| i < 0 || i as usize >= vocab) {
        return Err(Error::invalid(
            "input_ids",
            format!("input_ids holds {bad}, outside 0..{vocab}"),
        ));
    }
    Ok((values, b, t))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_exact_near_and_logarithmic_far() {
        // Bidirectional, 32 buckets, max distance 128: 16 per direction, 8 exact.
        assert_eq!(relative_bucket(0, true, 32, 128), 0);
        assert_eq!(relative_bucket(3, true, 32, 128), 16 + 3);
        assert_eq!(relative_bucket(-3, true, 32, 128), 3);
        assert_eq!(relative_bucket(-8, true, 32, 128), 8);
        assert_eq!(relative_bucket(-500, true, 32, 128), 15);
        assert_eq!(relative_bucket(500, true, 32, 128), 31);
        // Causal: only the past has buckets.
        assert_eq!(relative_bucket(5, false, 32, 128), 0);
        assert_eq!(relative_bucket(-5, false, 32, 128), 5);
        assert_eq!(relative_bucket(-1000, false, 32, 128), 31);
    }
}
