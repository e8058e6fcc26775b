//! T5's encoder: mirrors transformers' `models/t5/modeling_t5.py` and
//! `models/umt5/modeling_umt5.py` (`T5EncoderModel`, `UMT5EncoderModel`, eager attention),
//! the text encoder diffusion pipelines (PixArt, SD3, Flux) read.
//!
//! Token embeddings (`shared`, no positions); per block, T5's RMS layer norm, self-attention
//! without score scaling whose scores add a learned relative-position bias (buckets of
//! `key - query`, exact up to half the buckets and logarithmic to `relative_attention_max_distance`;
//! the first block's bias is shared by all in T5, every block has its own in UMT5) and the
//! padding mask, a residual, layer norm, the feed-forward (`relu` for t5 v1.0, a gated
//! `gelu_new` for v1.1 / flan-t5 / umt5 — `feed_forward_proj`), a residual; a final norm.

use serde::Deserialize;
use zoo_hub::PretrainedConfig;
use zoo_runtime::device_map::ModelShape;
use zoo_runtime::nn::{Embedding, Linear, RmsNorm, Weights};
use zoo_runtime::{Activation, DType, Device, SdpaOptions, Tensor};

use crate::config::require_positive;
use crate::kinds::{Encoder, EncoderArgs, EncoderHead, EncoderOutput};
use crate::models::placement::execution_order;
use crate::registry::{Architecture, Family, Layout, Loaders, Task};
use crate::{Error, Result};

/// The registry entry of `t5`.
pub(crate) const FAMILY: Family = Family {
    model_type: "t5",
    modeling_file: "models/t5/modeling_t5.py",
    architectures: &[Architecture {
        name: "T5EncoderModel",
        task: Task::Base,
    }],
    gguf_architectures: &[],
    no_split_modules: &["T5Block"],
    validate: |c| T5Config::from_pretrained(c).map(drop),
    layout,
    loaders: Loaders::Encoder(load),
};

/// The registry entry of `umt5`: T5 v1.1 with a relative bias in every block.
pub(crate) const UMT5_FAMILY: Family = Family {
    model_type: "umt5",
    modeling_file: "models/umt5/modeling_umt5.py",
    architectures: &[Architecture {
        name: "UMT5EncoderModel",
        task: Task::Base,
    }],
    gguf_architectures: &[],
    no_split_modules: &["UMT5Block"],
    validate: |c| T5Config::from_pretrained(c).map(drop),
    layout,
    loaders: Loaders::Encoder(load),
};

fn default_d_kv() -> usize {
    64
}
fn default_buckets() -> usize {
    32
}
fn default_max_distance() -> usize {
    128
}
fn default_eps() -> f64 {
    1e-6
}
fn default_ff() -> String {
    "relu".into()
}

/// `config.json` of a T5 / UMT5, as transformers' `T5Config` reads it.
#[derive(Clone, Debug, Deserialize)]
pub struct T5Config {
    /// Rows of the shared embedding table.
    pub vocab_size: usize,
    /// Width of the residual stream.
    pub d_model: usize,
    /// Width of one head.
    #[serde(default = "default_d_kv")]
    pub d_kv: usize,
    /// Width of the feed-forward.
    pub d_ff: usize,
    /// Encoder blocks.
    pub num_layers: usize,
    /// Attention heads.
    pub num_heads: usize,
    /// Buckets of the relative-position bias.
    #[serde(default = "default_buckets")]
    pub relative_attention_num_buckets: usize,
    /// Distance past which positions share the last bucket.
    #[serde(default = "default_max_distance")]
    pub relative_attention_max_distance: usize,
    /// Epsilon of every layer norm.
    #[serde(default = "default_eps")]
    pub layer_norm_epsilon: f64,
    /// `relu`, `gelu`, `gated-gelu`, `gated-silu`, ...: the activation, gated or not.
    #[serde(default = "default_ff")]
    pub feed_forward_proj: String,
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
}

fn layout(config: &PretrainedConfig) -> Result<Layout> {
    let c = T5Config::from_pretrained(config)?;
    Ok(Layout {
        layer_containers: vec!["encoder.block".into()],
        inputs: vec!["shared".into(), "encoder.embed_tokens".into()],
        tied: vec![vec![
            "shared.weight".into(),
            "encoder.embed_tokens.weight".into(),
        ]],
        shape: ModelShape {
            layers: c.num_layers,
            hidden: c.d_model,
            intermediate: c.d_ff,
            heads: c.num_heads,
            kv_heads: c.num_heads,
            head_dim: c.d_kv,
            vocab: 0,
            kv_cache: false,
        },
        // Relative positions have no trained limit; plans are sized for 512 tokens, T5's
        // training length (and what PixArt and SD3 feed it).
        context: 512,
    })
}

fn load(w: &Weights, config: &PretrainedConfig, task: Task) -> Result<Box<dyn Encoder>> {
    let c = T5Config::from_pretrained(config)?;
    if task != Task::Base {
        return Err(Error::Config {
            path: c.path.clone(),
            reason: format!(
                "zoo runs T5's encoder (T5EncoderModel); it has no {} head",
                task.auto_class()
            ),
        });
    }
    Ok(Box::new(T5EncoderModel::load(w, &c)?))
}

/// The bucket of a relative position `key - query`, as transformers' float32 arithmetic
/// computes it (logarithmic buckets past `max_exact`).
fn relative_bucket(
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

/// `T5Attention` (self-attention, no scaling).
#[derive(Clone, Debug)]
struct Attention {
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    relative_attention_bias: Option<Embedding>,
    heads: usize,
    d_kv: usize,
}

/// `T5Block` of the encoder: self-attention then feed-forward, each pre-normed.
#[derive(Clone, Debug)]
struct Block {
    attn_norm: RmsNorm,
    attention: Attention,
    ff_norm: RmsNorm,
    wi: Vec<Linear>,
    wo: Linear,
    act: Activation,
}

impl Block {
    fn load(w: &Weights, c: &T5Config, has_bias: bool) -> Result<Block> {
        let (d, inner) = (c.d_model, c.num_heads * c.d_kv);
        let a = w.pp("layer.0.SelfAttention");
        let f = w.pp("layer.1.DenseReluDense");
        let (gated, act) = c.activation();
        let wi = if gated {
            vec![
                Linear::load(&f.pp("wi_0"), d, c.d_ff, false)?,
                Linear::load(&f.pp("wi_1"), d, c.d_ff, false)?,
            ]
        } else {
            vec![Linear::load(&f.pp("wi"), d, c.d_ff, false)?]
        };
        Ok(Block {
            attn_norm: RmsNorm::load(&w.pp("layer.0.layer_norm"), d, c.layer_norm_epsilon)?,
            attention: Attention {
                q: Linear::load(&a.pp("q"), d, inner, false)?,
                k: Linear::load(&a.pp("k"), d, inner, false)?,
                v: Linear::load(&a.pp("v"), d, inner, false)?,
                o: Linear::load(&a.pp("o"), inner, d, false)?,
                relative_attention_bias: if has_bias {
                    Some(Embedding::load(
                        &a.pp("relative_attention_bias"),
                        c.relative_attention_num_buckets,
                        c.num_heads,
                    )?)
                } else {
                    None
                },
                heads: c.num_heads,
                d_kv: c.d_kv,
            },
            ff_norm: RmsNorm::load(&w.pp("layer.1.layer_norm"), d, c.layer_norm_epsilon)?,
            wi,
            wo: Linear::load(&f.pp("wo"), c.d_ff, d, false)?,
            act: Activation::from_hf(act)?,
        })
    }

    /// `x [B, T, d_model]`; `bias [B, heads, T, T]` is the position bias plus the padding mask.
    fn forward(&self, x: &Tensor, bias: &Tensor) -> Result<Tensor> {
        let a = &self.attention;
        let (b, t) = (x.shape()[0], x.shape()[1]);
        let h = self.attn_norm.forward(x)?;
        let split = |y: Tensor| -> Result<Tensor> {
            Ok(y.reshape_to(&[b, t, a.heads, a.d_kv])?.transpose(1, 2)?)
        };
        let [q, k, v] = Linear::forward_each([&a.q, &a.k, &a.v], &h)?;
        let opts = SdpaOptions {
            mask: Some(bias),
            scale: Some(1.0),
            round_scores: true,
            ..Default::default()
        };
        let ctx = Tensor::scaled_dot_product_attention(&split(q)?, &split(k)?, &split(v)?, &opts)?;
        let ctx = ctx.transpose(1, 2)?.reshape_to(&[b, t, a.heads * a.d_kv])?;
        let x = x.add(&a.o.forward(&ctx)?)?;
        let h = self.ff_norm.forward(&x)?;
        let m = match &self.wi[..] {
            [wi] => self.act.apply(&wi.forward(&h)?)?,
            [wi_0, wi_1] => self
                .act
                .apply(&wi_0.forward(&h)?)?
                .mul(&wi_1.forward(&h)?)?,
            _ => unreachable!("one or two input projections"),
        };
        Ok(x.add(&self.wo.forward(&m)?)?)
    }
}

/// `T5EncoderModel` / `UMT5EncoderModel`.
#[derive(Clone, Debug)]
pub struct T5EncoderModel {
    embed_tokens: Embedding,
    blocks: Vec<Block>,
    block_devices: Vec<Device>,
    final_layer_norm: RmsNorm,
    config: T5Config,
    dtype: DType,
}

impl T5EncoderModel {
    /// Loads `shared` (or `encoder.embed_tokens`) and `encoder.*`.
    pub fn load(w: &Weights, c: &T5Config) -> Result<T5EncoderModel> {
        let table = if w.contains("encoder.embed_tokens.weight") {
            w.pp("encoder.embed_tokens")
        } else {
            w.pp("shared")
        };
        let e = w.pp("encoder");
        let mut blocks = Vec::with_capacity(c.num_layers);
        let mut block_devices = Vec::with_capacity(c.num_layers);
        for i in 0..c.num_layers {
            let bw = e.pp(format!("block.{i}"));
            block_devices.push(bw.device());
            blocks.push(Block::load(&bw, c, i == 0 || c.bias_per_block())?);
        }
        Ok(T5EncoderModel {
            embed_tokens: Embedding::load(&table, c.vocab_size, c.d_model)?,
            blocks,
            block_devices,
            final_layer_norm: RmsNorm::load(
                &e.pp("final_layer_norm"),
                c.d_model,
                c.layer_norm_epsilon,
            )?,
            config: c.clone(),
            dtype: w.dtype(),
        })
    }

    /// The position bias of `table [buckets, heads]` for `t` tokens, `[1, heads, t, t]`.
    fn position_bias(&self, table: &Embedding, t: usize, device: &Device) -> Result<Tensor> {
        let c = &self.config;
        let buckets: Vec<i64> = (0..t)
            .flat_map(|q| {
                (0..t).map(move |k| {
                    relative_bucket(
                        k as i64 - q as i64,
                        true,
                        c.relative_attention_num_buckets,
                        c.relative_attention_max_distance,
                    ) as i64
                })
            })
            .collect();
        let idx = Tensor::from_vec(buckets, &[t * t], &table.device())?;
        let values = table.forward(&idx)?.reshape_to(&[t, t, c.num_heads])?;
        Ok(values
            .permute(&[2, 0, 1])?
            .unsqueeze(0)?
            .to_device(device)?)
    }
}

const BASE: EncoderHead = EncoderHead::Base;

impl Encoder for T5EncoderModel {
    fn dtype(&self) -> DType {
        self.dtype
    }
    fn device(&self) -> Device {
        self.embed_tokens.device()
    }
    fn devices(&self) -> Vec<Device> {
        let last = self.final_layer_norm.weight.device();
        execution_order(self.device(), &self.block_devices, last)
    }
    fn vocab_size(&self) -> usize {
        self.config.vocab_size
    }
    fn max_position_embeddings(&self) -> usize {
        // Relative positions: any length runs; this is the length plans assume.
        512
    }
    fn head(&self) -> &EncoderHead {
        &BASE
    }
    fn hidden_state_modules(&self) -> Vec<String> {
        std::iter::once("encoder.embed_tokens".to_string())
            .chain((0..self.blocks.len()).map(|i| format!("encoder.block.{i}")))
            .collect()
    }
    fn forward(&self, args: EncoderArgs<'_>) -> Result<EncoderOutput> {
        let c = &self.config;
        let ids = args.input_ids;
        let [b, t] = ids.shape()[..] else {
            return Err(Error::Generation(format!(
                "input_ids {:?} must be [batch, seq]",
                ids.shape()
            )));
        };
        if t == 0 {
            return Err(Error::Generation(
                "empty input: at least one token is needed".into(),
            ));
        }
        let id_values = match ids.host_known_i64() {
            Some(v) => v,
            None => ids.to_dtype(DType::I64)?.to_vec::<i64>()?,
        };
        if let Some(&bad) = id_values
            .iter()
            .find(|&&i| i < 0 || i as usize >= c.vocab_size)
        {
            return Err(Error::Generation(format!(
                "input_ids holds {bad}, outside 0..{}",
                c.vocab_size
            )));
        }
        let real: Vec<i64> = match args.attention_mask {
            Some(m) if m.shape() == [b, t] => m.to_dtype(DType::I64)?.to_vec::<i64>()?,
            Some(m) => {
                return Err(Error::Generation(format!(
                    "attention_mask {:?} must have the shape of input_ids [{b}, {t}]",
                    m.shape()
                )))
            }
            None => vec![1; b * t],
        };
        let device = self.device();
        let ids_t = Tensor::from_vec(id_values, &[b, t], &device)?;
        let mut x = self.embed_tokens.forward(&ids_t)?;
        // The padding mask, additive over keys, in the model dtype.
        let low = self.dtype.finite_min();
        let pad: Vec<f64> = real
            .iter()
            .map(|&m| if m == 0 { low } else { 0.0 })
            .collect();
        let pad = Tensor::from_f64s(&pad, &[b, 1, 1, t], self.dtype, &device)?;
        let mut bias: Option<Tensor> = None;
        let mut hidden_states = Vec::new();
        for (block, dev) in self.blocks.iter().zip(&self.block_devices) {
            if x.device() != *dev {
                x = x.to_device(dev)?;
            }
            if args.output_hidden_states {
                hidden_states.push(x.clone());
            }
            // T5 computes the bias in its first block and passes it on; UMT5 in each block.
            if let Some(table) = &block.attention.relative_attention_bias {
                let pos = self.position_bias(table, t, dev)?;
                bias = Some(pos.add(&pad.to_device(dev)?)?);
            }
            let Some(layer_bias) = &bias else {
                return Err(Error::Generation(
                    "T5's first block has no relative bias".into(),
                ));
            };
            let layer_bias = if layer_bias.device() != *dev {
                layer_bias.to_device(dev)?
            } else {
                layer_bias.clone()
            };
            x = block.forward(&x, &layer_bias)?;
        }
        if args.output_hidden_states {
            hidden_states.push(x.clone());
        }
        let x = x.to_device(&self.final_layer_norm.weight.device())?;
        let last = self.final_layer_norm.forward(&x)?;
        Ok(EncoderOutput {
            last_hidden_state: last,
            pooler_output: None,
            hidden_states,
            logits: None,
            embeds: None,
        })
    }
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
