//! `T5ForConditionalGeneration` / `UMT5ForConditionalGeneration`: the encoder, a causal
//! decoder whose blocks also attend to the encoder's output, and the language-model head.
//!
//! Decoder layer `i` owns two layers of the [`KvCache`]: `2 i` for its self-attention (the
//! generated tokens) and `2 i + 1` for its cross-attention (the encoder's keys and values,
//! projected on the first call after the cache was made and read by every later step, as
//! transformers' `EncoderDecoderCache` keeps them).

use zoo_hub::PretrainedConfig;
use zoo_runtime::nn::{Embedding, Linear, RmsNorm, Weights};
use zoo_runtime::{DType, Device, Tensor};

use super::{
    checked_ids, padding_bias, position_bias, Attention, FeedForward, T5Config, T5EncoderModel,
};
use crate::cache::{CacheSpec, KvCache};
use crate::kinds::{Encoder, EncoderArgs, EncoderOutput, ForwardArgs, LogitsFor, Seq2SeqLm};
use crate::models::placement::execution_order;
use crate::{Error, Result};

/// `T5Block` of the decoder: causal self-attention, cross-attention, feed-forward, each
/// pre-normed with a residual.
#[derive(Clone, Debug)]
struct DecoderBlock {
    self_norm: RmsNorm,
    self_attention: Attention,
    cross_norm: RmsNorm,
    cross_attention: Attention,
    ff_norm: RmsNorm,
    ff: FeedForward,
}

impl DecoderBlock {
    fn load(w: &Weights, c: &T5Config, has_bias: bool) -> Result<DecoderBlock> {
        let (d, eps) = (c.d_model, c.layer_norm_epsilon);
        Ok(DecoderBlock {
            self_norm: RmsNorm::load(&w.pp("layer.0.layer_norm"), d, eps)?,
            self_attention: Attention::load(&w.pp("layer.0.SelfAttention"), c, has_bias)?,
            cross_norm: RmsNorm::load(&w.pp("layer.1.layer_norm"), d, eps)?,
            // Cross-attention has no position bias (a stored table is ignored, as in
            // transformers).
            cross_attention: Attention::load(&w.pp("layer.1.EncDecAttention"), c, false)?,
            ff_norm: RmsNorm::load(&w.pp("layer.2.layer_norm"), d, eps)?,
            ff: FeedForward::load(&w.pp("layer.2.DenseReluDense"), c)?,
        })
    }
}

/// `T5ForConditionalGeneration` / `UMT5ForConditionalGeneration`.
#[derive(Clone, Debug)]
pub struct T5ForConditionalGeneration {
    encoder: T5EncoderModel,
    embed_tokens: Embedding,
    blocks: Vec<DecoderBlock>,
    block_devices: Vec<Device>,
    final_layer_norm: RmsNorm,
    lm_head: Linear,
    /// `d_model ** -0.5` when the decoder's output is scaled before the head.
    output_scale: Option<f64>,
    decoder_start_token_id: u32,
    config: T5Config,
    dtype: DType,
}

impl T5ForConditionalGeneration {
    /// Loads `shared`, `encoder.*`, `decoder.*` and `lm_head` (the shared table when the
    /// checkpoint has no `lm_head.weight`, as transformers ties it).
    pub fn load(
        w: &Weights,
        c: &T5Config,
        config: &PretrainedConfig,
    ) -> Result<T5ForConditionalGeneration> {
        if !w.contains("decoder.final_layer_norm.weight") {
            return Err(Error::Config {
                path: c.path.clone(),
                reason: "the checkpoint has no decoder (`decoder.final_layer_norm.weight` is missing): \
                         it is an encoder only (T5EncoderModel); load it with AutoModel or zoo embed"
                    .into(),
            });
        }
        let decoder_start_token_id = config
            .extra
            .get("decoder_start_token_id")
            .and_then(serde_json::Value::as_u64)
            .or_else(|| {
                config
                    .bos_token_id
                    .as_ref()
                    .and_then(|t| t.to_vec().first().copied())
                    .map(u64::from)
            })
            .ok_or_else(|| Error::Config {
                path: c.path.clone(),
                reason: "`decoder_start_token_id` (or `bos_token_id`) must be set for encoder-decoder generation; T5 uses its pad id, 0"
                    .into(),
            })?;
        let decoder_start_token_id = u32::try_from(decoder_start_token_id)
            .ok()
            .filter(|&id| (id as usize) < c.vocab_size)
            .ok_or_else(|| Error::Config {
                path: c.path.clone(),
                reason: format!(
                    "`decoder_start_token_id` {decoder_start_token_id} is outside the vocabulary of {}",
                    c.vocab_size
                ),
            })?;
        let table = if w.contains("decoder.embed_tokens.weight") {
            w.pp("decoder.embed_tokens")
        } else {
            w.pp("shared")
        };
        let embed_tokens = Embedding::load(&table, c.vocab_size, c.d_model)?;
        let d = w.pp("decoder");
        let layers = c.decoder_layers();
        let mut blocks = Vec::with_capacity(layers);
        let mut block_devices = Vec::with_capacity(layers);
        for i in 0..layers {
            let bw = d.pp(format!("block.{i}"));
            block_devices.push(bw.device());
            blocks.push(DecoderBlock::load(&bw, c, i == 0 || c.bias_per_block())?);
        }
        let lm_head = if w.contains("lm_head.weight") {
            Linear::load(&w.pp("lm_head"), c.d_model, c.vocab_size, false)?
        } else {
            embed_tokens.as_linear()
        };
        Ok(T5ForConditionalGeneration {
            encoder: T5EncoderModel::load(w, c)?,
            embed_tokens,
            blocks,
            block_devices,
            final_layer_norm: RmsNorm::load(
                &d.pp("final_layer_norm"),
                c.d_model,
                c.layer_norm_epsilon,
            )?,
            lm_head,
            output_scale: c
                .scales_decoder_outputs()
                .then(|| (c.d_model as f64).powf(-0.5)),
            decoder_start_token_id,
            config: c.clone(),
            dtype: w.dtype(),
        })
    }

    /// The encoder stack.
    pub fn encoder(&self) -> &T5EncoderModel {
        &self.encoder
    }
}

/// Moves `x` to `device` when it is elsewhere.
fn on(x: &Tensor, device: &Device) -> Result<Tensor> {
    Ok(if x.device() == *device {
        x.clone()
    } else {
        x.to_device(device)?
    })
}

impl Seq2SeqLm for T5ForConditionalGeneration {
    fn encode(&self, args: EncoderArgs<'_>) -> Result<EncoderOutput> {
        self.encoder.forward(args)
    }

    fn decoder_start_token_id(&self) -> u32 {
        self.decoder_start_token_id
    }

    fn cache_specs(&self) -> Vec<CacheSpec> {
        let (h, d) = (self.config.num_heads, self.config.d_kv);
        self.block_devices
            .iter()
            .flat_map(|dev| {
                [
                    CacheSpec::self_attention(h, d, None, *dev),
                    CacheSpec::cross(h, d, *dev),
                ]
            })
            .collect()
    }

    fn dtype(&self) -> DType {
        self.dtype
    }

    fn device(&self) -> Device {
        self.encoder.device()
    }

    fn logits_device(&self) -> Device {
        self.lm_head.device()
    }

    fn devices(&self) -> Vec<Device> {
        let mut all = self.encoder.devices();
        let decoder = execution_order(
            self.embed_tokens.device(),
            &self.block_devices,
            self.lm_head.device(),
        );
        for d in decoder {
            if !all.contains(&d) {
                all.push(d);
            }
        }
        all
    }

    fn vocab_size(&self) -> usize {
        self.config.vocab_size
    }

    fn decode(
        &self,
        args: ForwardArgs<'_>,
        encoder_hidden_states: &Tensor,
        encoder_attention_mask: Option<&Tensor>,
        cache: &mut KvCache,
        which: LogitsFor<'_>,
    ) -> Result<Tensor> {
        let c = &self.config;
        let (b, t) = args.check(cache)?;
        let (ids, _, _) = checked_ids(args.input_ids, c.vocab_size)?;
        let [eb, s, width] = encoder_hidden_states.shape()[..] else {
            return Err(Error::invalid(
                "encoder_hidden_states",
                format!(
                    "encoder hidden states {:?} must be [batch, seq, d_model]",
                    encoder_hidden_states.shape()
                ),
            ));
        };
        if eb != b || width != c.d_model {
            return Err(Error::invalid(
                "encoder_hidden_states",
                format!(
                    "encoder hidden states {:?} must be [{b}, seq, {}] for a decoder batch of {b}",
                    encoder_hidden_states.shape(),
                    c.d_model
                ),
            ));
        }
        let cross_mask = match encoder_attention_mask {
            Some(m) if m.shape() == [b, s] => {
                let real = m.to_dtype(DType::I64)?.to_vec::<i64>()?;
                padding_bias(&real, (b, s), self.dtype, &self.embed_tokens.device())?
            }
            Some(m) => {
                return Err(Error::invalid(
                    "encoder_attention_mask",
                    format!(
                        "encoder attention mask {:?} must be [{b}, {s}] like the encoder's output",
                        m.shape()
                    ),
                ))
            }
            None => None,
        };
        let start = cache.begin(t, args.attention_mask)?;
        let device = self.embed_tokens.device();
        let mut x = self
            .embed_tokens
            .forward(&Tensor::from_vec(ids, &[b, t], &device)?)?;
        // The causal mask is built once per device and, in T5 (one bias shared by all
        // blocks), so is the self-attention bias: only UMT5's per-block tables change it.
        let mut causal: Vec<(Device, Tensor)> = Vec::new();
        let mut position: Option<Tensor> = None;
        let mut self_bias: Option<(Device, Tensor)> = None;
        for (i, (block, dev)) in self.blocks.iter().zip(&self.block_devices).enumerate() {
            x = on(&x, dev)?;
            let table = block.self_attention.relative_attention_bias.as_ref();
            if table.is_some() || self_bias.as_ref().is_none_or(|(d, _)| d != dev) {
                if let Some(table) = table {
                    let keys = cache.attended_len(dev);
                    position = Some(position_bias(c, table, start, t, keys, false, dev)?);
                }
                let Some(pos) = &position else {
                    return Err(Error::Internal(
                        "T5's first decoder block has no relative bias".into(),
                    ));
                };
                let mask = match causal.iter().find(|(d, _)| d == dev) {
                    Some((_, m)) => m.clone(),
                    None => {
                        let m = cache.attention_bias(start, t, None, self.dtype, dev)?;
                        causal.push((*dev, m.clone()));
                        m
                    }
                };
                self_bias = Some((*dev, on(pos, dev)?.add(&mask)?));
            }
            let Some((_, self_bias)) = &self_bias else {
                return Err(Error::Internal("no self-attention bias".into()));
            };

            let h = block.self_norm.forward(&x)?;
            let q = block.self_attention.query(&h)?;
            let (k, v) = block.self_attention.key_value(&h)?;
            let (k, v) = cache.update(2 * i, &k, &v, start)?;
            let a = block.self_attention.attend(&q, &k, &v, Some(self_bias))?;
            x = x.add(&a)?;

            let h = block.cross_norm.forward(&x)?;
            if cache.cross(2 * i + 1).is_none() {
                let (k, v) = block
                    .cross_attention
                    .key_value(&on(encoder_hidden_states, dev)?)?;
                cache.store_cross(2 * i + 1, &k, &v)?;
            }
            let Some((k, v)) = cache.cross(2 * i + 1) else {
                return Err(Error::invalid(
                    "cache",
                    format!(
                        "cross-attention layer {} of the KV cache holds no keys",
                        2 * i + 1
                    ),
                ));
            };
            let q = block.cross_attention.query(&h)?;
            let mask = cross_mask.as_ref().map(|m| on(m, dev)).transpose()?;
            let a = block.cross_attention.attend(&q, k, v, mask.as_ref())?;
            x = x.add(&a)?;

            let h = block.ff_norm.forward(&x)?;
            x = x.add(&block.ff.forward(&h)?)?;
        }
        let x = on(&x, &self.final_layer_norm.weight.device())?;
        let h = which.select(&self.final_layer_norm.forward(&x)?)?;
        let h = match self.output_scale {
            Some(scale) => h.mul_scalar(scale)?,
            None => h,
        };
        let h = on(&h, &self.lm_head.device())?;
        Ok(self.lm_head.forward(&h)?)
    }
}
