//! `T5EncoderModel` / `UMT5EncoderModel`: the encoder stack, also the first half of
//! `T5ForConditionalGeneration`.

use zoo_runtime::nn::{Embedding, RmsNorm, Weights};
use zoo_runtime::{DType, Device, Tensor};

use super::{checked_ids, padding_bias, position_bias, Attention, FeedForward, T5Config};
use crate::kinds::{EncoderArgs, EncoderOutput, TextTower, Tower};
use crate::models::Placement;
use crate::{Error, Result};

/// `T5Block` of the encoder: self-attention then feed-forward, each pre-normed.
#[derive(Clone, Debug)]
struct Block {
    attn_norm: RmsNorm,
    attention: Attention,
    ff_norm: RmsNorm,
    ff: FeedForward,
}

impl Block {
    fn load(w: &Weights, c: &T5Config, has_bias: bool) -> Result<Block> {
        let eps = c.layer_norm_epsilon;
        Ok(Block {
            attn_norm: RmsNorm::load(&w.pp("layer.0.layer_norm"), c.d_model, eps)?,
            attention: Attention::load(&w.pp("layer.0.SelfAttention"), c, has_bias)?,
            ff_norm: RmsNorm::load(&w.pp("layer.1.layer_norm"), c.d_model, eps)?,
            ff: FeedForward::load(&w.pp("layer.1.DenseReluDense"), c)?,
        })
    }

    /// `x [B, T, d_model]`; `bias [B, heads, T, T]` is the position bias plus the padding mask.
    fn forward(&self, x: &Tensor, bias: &Tensor) -> Result<Tensor> {
        let h = self.attn_norm.forward(x)?;
        let x = x.add(&self.attention.forward(&h, Some(bias))?)?;
        let h = self.ff_norm.forward(&x)?;
        Ok(x.add(&self.ff.forward(&h)?)?)
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
    placement: Placement,
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
        let embed_tokens = Embedding::load(&table, c.vocab_size, c.d_model)?;
        let final_layer_norm =
            RmsNorm::load(&e.pp("final_layer_norm"), c.d_model, c.layer_norm_epsilon)?;
        let placement = Placement::new(
            w.dtype(),
            embed_tokens.device(),
            block_devices
                .iter()
                .copied()
                .chain([final_layer_norm.weight.device()]),
        );
        Ok(T5EncoderModel {
            embed_tokens,
            blocks,
            block_devices,
            final_layer_norm,
            config: c.clone(),
            placement,
        })
    }

    /// The device of the final norm, where the encoder's output is.
    pub(super) fn output_device(&self) -> Device {
        self.final_layer_norm.weight.device()
    }
}

impl Tower for T5EncoderModel {
    fn placement(&self) -> &Placement {
        &self.placement
    }
    fn hidden_state_modules(&self) -> Vec<String> {
        std::iter::once("encoder.embed_tokens".to_string())
            .chain((0..self.blocks.len()).map(|i| format!("encoder.block.{i}")))
            .collect()
    }
}

impl TextTower for T5EncoderModel {
    fn vocab_size(&self) -> usize {
        self.config.vocab_size
    }
    fn max_position_embeddings(&self) -> usize {
        // Relative positions: any length runs; this is the length plans assume.
        512
    }

    fn run(&self, args: EncoderArgs<'_>) -> Result<EncoderOutput> {
        let c = &self.config;
        let (id_values, b, t) = checked_ids(args.input_ids, c.vocab_size)?;
        let real: Vec<i64> = match args.attention_mask {
            Some(m) if m.shape() == [b, t] => m.to_dtype(DType::I64)?.to_vec::<i64>()?,
            Some(m) => {
                return Err(Error::invalid(
                    "attention_mask",
                    format!(
                        "attention_mask {:?} must have the shape of input_ids [{b}, {t}]",
                        m.shape()
                    ),
                ))
            }
            None => vec![1; b * t],
        };
        let device = Tower::device(self);
        let ids_t = Tensor::from_vec(id_values, &[b, t], &device)?;
        let mut x = self.embed_tokens.forward(&ids_t)?;
        let pad = padding_bias(&real, (b, t), self.placement.dtype(), &device)?;
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
                let pos = position_bias(c, table, 0, t, t, true, dev)?;
                bias = Some(match &pad {
                    Some(p) => pos.add(&p.to_device(dev)?)?,
                    None => pos,
                });
            }
            let Some(layer_bias) = &bias else {
                return Err(Error::Internal(
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
        let x = x.to_device(&self.output_device())?;
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
