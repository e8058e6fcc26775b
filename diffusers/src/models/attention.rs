//! Attention: mirrors diffusers' `attention_processor.py` (`Attention` with
//! `AttnProcessor2_0`), `attention.py` (`BasicTransformerBlock`, `FeedForward`) and
//! `transformers/transformer_2d.py` (`Transformer2DModel` on continuous inputs).

use zoo_runtime::nn::{Conv2d, GroupNorm, LayerNorm, Linear, Weights};
use zoo_runtime::{ConvParams, Tensor};

use crate::{Error, Result};

/// diffusers' `Attention` with the projections it has in the UNet and the VAE.
#[derive(Clone, Debug)]
pub struct Attention {
    to_q: Linear,
    to_k: Linear,
    to_v: Linear,
    to_out: Linear,
    heads: usize,
    head_dim: usize,
    /// The VAE / UNet2D spatial block: GroupNorm over channels, a residual, a rescale.
    group_norm: Option<GroupNorm>,
    residual_connection: bool,
    rescale_output_factor: f64,
}

/// How an [`Attention`] is built.
#[derive(Clone, Copy, Debug)]
pub struct AttentionSpec {
    /// Width of the queries (and of the output).
    pub query_dim: usize,
    /// Width of what keys and values are projected from (`query_dim` for self-attention).
    pub cross_attention_dim: usize,
    /// Heads.
    pub heads: usize,
    /// Width of a head.
    pub dim_head: usize,
    /// Biases on `to_q`, `to_k`, `to_v`.
    pub bias: bool,
    /// `Some((groups, eps))` for the spatial block's GroupNorm.
    pub group_norm: Option<(usize, f64)>,
    /// Add the input back (`residual_connection`).
    pub residual_connection: bool,
    /// The output is divided by this.
    pub rescale_output_factor: f64,
}

impl Attention {
    /// Loads `to_q`, `to_k`, `to_v` and `to_out.0`; checkpoints saved before diffusers
    /// renamed the VAE's attention (`query`, `key`, `value`, `proj_attn`) load too.
    pub fn load(w: &Weights, s: AttentionSpec) -> Result<Attention> {
        let inner = s.heads * s.dim_head;
        let legacy = !w.contains("to_q.weight") && w.contains("query.weight");
        let (q, k, v, o) = if legacy {
            ("query", "key", "value", "proj_attn")
        } else {
            ("to_q", "to_k", "to_v", "to_out.0")
        };
        let group_norm = match s.group_norm {
            Some((groups, eps)) => Some(GroupNorm::load(
                &w.pp("group_norm"),
                groups,
                s.query_dim,
                eps,
            )?),
            None => None,
        };
        Ok(Attention {
            to_q: Linear::load(&w.pp(q), s.query_dim, inner, s.bias)?,
            to_k: Linear::load(&w.pp(k), s.cross_attention_dim, inner, s.bias)?,
            to_v: Linear::load(&w.pp(v), s.cross_attention_dim, inner, s.bias)?,
            to_out: Linear::load(&w.pp(o), inner, s.query_dim, true)?,
            heads: s.heads,
            head_dim: s.dim_head,
            group_norm,
            residual_connection: s.residual_connection,
            rescale_output_factor: s.rescale_output_factor,
        })
    }

    /// Attends from `x [B, L, query_dim]` to `context [B, S, cross_dim]` (to `x` itself when
    /// `None`).
    pub fn forward(&self, x: &Tensor, context: Option<&Tensor>) -> Result<Tensor> {
        self.forward_masked(x, context, None)
    }

    /// [`Attention::forward`] with an additive `mask` broadcast to the scores
    /// `[B, heads, L, S]` (PixArt's `[B, 1, 1, S]` bias on padded text tokens).
    pub fn forward_masked(
        &self,
        x: &Tensor,
        context: Option<&Tensor>,
        mask: Option<&Tensor>,
    ) -> Result<Tensor> {
        let (b, l) = (x.shape()[0], x.shape()[1]);
        let ctx = context.unwrap_or(x);
        let s = ctx.shape()[1];
        let split = |t: Tensor, len: usize| -> Result<Tensor> {
            Ok(t.reshape_to(&[b, len, self.heads, self.head_dim])?
                .transpose(1, 2)?)
        };
        let q = split(self.to_q.forward(x)?, l)?;
        let k = split(self.to_k.forward(ctx)?, s)?;
        let v = split(self.to_v.forward(ctx)?, s)?;
        let opts = zoo_runtime::SdpaOptions {
            mask,
            ..Default::default()
        };
        let o = Tensor::scaled_dot_product_attention(&q, &k, &v, &opts)?;
        let o = o
            .transpose(1, 2)?
            .reshape_to(&[b, l, self.heads * self.head_dim])?;
        Ok(self.to_out.forward(&o)?)
    }

    /// The spatial block on `x [B, C, H, W]`: GroupNorm, self-attention over the `H*W`
    /// positions, the residual and the rescale.
    pub fn forward_spatial(&self, x: &Tensor) -> Result<Tensor> {
        let [b, c, h, w] = x.shape()[..] else {
            return Err(Error::Shape(format!(
                "spatial attention takes [B, C, H, W], got {:?}",
                x.shape()
            )));
        };
        let normed = match &self.group_norm {
            Some(n) => n.forward(x)?,
            None => x.clone(),
        };
        let seq = normed.reshape_to(&[b, c, h * w])?.transpose(1, 2)?;
        let out = self.forward(&seq, None)?;
        let mut out = out.transpose(1, 2)?.reshape_to(&[b, c, h, w])?;
        if self.residual_connection {
            out = out.add(x)?;
        }
        if self.rescale_output_factor != 1.0 {
            out = out.div_scalar(self.rescale_output_factor)?;
        }
        Ok(out)
    }
}

/// `FeedForward`'s first layer (`activation_fn`).
#[derive(Clone, Debug)]
enum FfIn {
    /// `"geglu"`: `h * gelu(gate)` from one projection to twice the width.
    Geglu(Linear),
    /// `"gelu"`, `"gelu-approximate"`.
    Gelu(Linear, bool),
    /// `"geglu-approximate"`: `x * sigmoid(1.702 x)`.
    ApproxGelu(Linear),
}

/// `FeedForward`: `net.0` (the activation's projection), `net.2` (the output).
#[derive(Clone, Debug)]
pub struct FeedForward {
    first: FfIn,
    out: Linear,
}

impl FeedForward {
    /// Loads a feed-forward of `dim` → `inner` → `dim` with diffusers' `activation_fn`.
    pub fn load(w: &Weights, dim: usize, inner: usize, activation_fn: &str) -> Result<FeedForward> {
        let p = w.pp("net.0.proj");
        let first = match activation_fn {
            "geglu" => FfIn::Geglu(Linear::load(&p, dim, inner * 2, true)?),
            "gelu" => FfIn::Gelu(Linear::load(&p, dim, inner, true)?, false),
            "gelu-approximate" => FfIn::Gelu(Linear::load(&p, dim, inner, true)?, true),
            "geglu-approximate" => FfIn::ApproxGelu(Linear::load(&p, dim, inner, true)?),
            other => {
                return Err(Error::Unsupported(format!(
                    "feed-forward `activation_fn` {other:?} (zoo runs geglu, gelu, gelu-approximate, geglu-approximate)"
                )))
            }
        };
        Ok(FeedForward {
            first,
            out: Linear::load(&w.pp("net.2"), inner, dim, true)?,
        })
    }

    /// Applies the feed-forward to `x [.., dim]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let h = match &self.first {
            FfIn::Geglu(p) => {
                let parts = p.forward(x)?.chunk(2, -1)?;
                parts[0].mul(&parts[1].gelu()?)?
            }
            FfIn::Gelu(p, false) => p.forward(x)?.gelu()?,
            FfIn::Gelu(p, true) => p.forward(x)?.gelu_tanh()?,
            FfIn::ApproxGelu(p) => {
                let h = p.forward(x)?;
                h.mul(&h.mul_scalar(1.702)?.sigmoid()?)?
            }
        };
        Ok(self.out.forward(&h)?)
    }
}

/// `BasicTransformerBlock` with `norm_type = "layer_norm"`: self-attention, cross-attention
/// (when the block has a `cross_attention_dim`), feed-forward, each after a LayerNorm and
/// with a residual.
#[derive(Clone, Debug)]
pub struct BasicTransformerBlock {
    norm1: LayerNorm,
    attn1: Attention,
    /// Whether `attn1` attends to the context (`only_cross_attention`).
    attn1_cross: bool,
    attn2: Option<(LayerNorm, Attention)>,
    norm3: LayerNorm,
    ff: FeedForward,
}

/// How a [`BasicTransformerBlock`] is built.
#[derive(Clone, Copy, Debug)]
pub struct BlockSpec<'a> {
    /// Width of the tokens.
    pub dim: usize,
    /// Heads.
    pub heads: usize,
    /// Width of a head.
    pub head_dim: usize,
    /// Width of the context; `None` for a block without cross-attention.
    pub cross_attention_dim: Option<usize>,
    /// `only_cross_attention`: `attn1` attends to the context too.
    pub only_cross_attention: bool,
    /// `double_self_attention`: `attn2` is a second self-attention.
    pub double_self_attention: bool,
    /// Biases on q/k/v (`attention_bias`).
    pub attention_bias: bool,
    /// `activation_fn` of the feed-forward.
    pub activation_fn: &'a str,
    /// LayerNorm epsilon (`norm_eps`).
    pub norm_eps: f64,
}

impl BasicTransformerBlock {
    /// Loads the block under `w`.
    pub fn load(w: &Weights, s: BlockSpec<'_>) -> Result<BasicTransformerBlock> {
        let attn = |name: &str, cross: Option<usize>| {
            Attention::load(
                &w.pp(name),
                AttentionSpec {
                    query_dim: s.dim,
                    cross_attention_dim: cross.unwrap_or(s.dim),
                    heads: s.heads,
                    dim_head: s.head_dim,
                    bias: s.attention_bias,
                    group_norm: None,
                    residual_connection: false,
                    rescale_output_factor: 1.0,
                },
            )
        };
        let attn1_ctx = if s.only_cross_attention {
            s.cross_attention_dim
        } else {
            None
        };
        let attn2 = if s.cross_attention_dim.is_some() || s.double_self_attention {
            let ctx = if s.double_self_attention {
                None
            } else {
                s.cross_attention_dim
            };
            Some((
                LayerNorm::load(&w.pp("norm2"), s.dim, s.norm_eps)?,
                attn("attn2", ctx)?,
            ))
        } else {
            None
        };
        Ok(BasicTransformerBlock {
            norm1: LayerNorm::load(&w.pp("norm1"), s.dim, s.norm_eps)?,
            attn1: attn("attn1", attn1_ctx)?,
            attn1_cross: s.only_cross_attention,
            attn2,
            norm3: LayerNorm::load(&w.pp("norm3"), s.dim, s.norm_eps)?,
            ff: FeedForward::load(&w.pp("ff"), s.dim, 4 * s.dim, s.activation_fn)?,
        })
    }

    /// Applies the block to `x [B, L, dim]` with the context `[B, S, cross_dim]`.
    pub fn forward(&self, x: &Tensor, context: Option<&Tensor>) -> Result<Tensor> {
        let n = self.norm1.forward(x)?;
        let ctx1 = if self.attn1_cross { context } else { None };
        let mut x = x.add(&self.attn1.forward(&n, ctx1)?)?;
        if let Some((norm2, attn2)) = &self.attn2 {
            let n = norm2.forward(&x)?;
            x = x.add(&attn2.forward(&n, context)?)?;
        }
        let n = self.norm3.forward(&x)?;
        Ok(x.add(&self.ff.forward(&n)?)?)
    }
}

/// `proj_in` / `proj_out` of a [`Transformer2DModel`]: 1x1 convolutions, or linear layers
/// over the flattened positions (`use_linear_projection`).
#[derive(Clone, Debug)]
enum Projection {
    Conv(Conv2d),
    Linear(Linear),
}

/// `Transformer2DModel` on continuous inputs: GroupNorm, `proj_in`, the transformer blocks
/// over the `H*W` positions, `proj_out`, and the residual.
#[derive(Clone, Debug)]
pub struct Transformer2DModel {
    norm: GroupNorm,
    proj_in: Projection,
    blocks: Vec<BasicTransformerBlock>,
    proj_out: Projection,
    inner: usize,
}

/// How a [`Transformer2DModel`] is built (what the UNet blocks pass diffusers' class).
#[derive(Clone, Copy, Debug)]
pub struct Transformer2DSpec {
    /// Channels in and out.
    pub in_channels: usize,
    /// Heads.
    pub heads: usize,
    /// Width of a head.
    pub head_dim: usize,
    /// Transformer blocks.
    pub layers: usize,
    /// Width of the context.
    pub cross_attention_dim: Option<usize>,
    /// GroupNorm groups.
    pub norm_num_groups: usize,
    /// Linear `proj_in` / `proj_out` instead of 1x1 convolutions.
    pub use_linear_projection: bool,
    /// `only_cross_attention`.
    pub only_cross_attention: bool,
}

impl Transformer2DModel {
    /// Loads the model under `w`.
    pub fn load(w: &Weights, s: Transformer2DSpec) -> Result<Transformer2DModel> {
        let inner = s.heads * s.head_dim;
        let proj = |name: &str, i: usize, o: usize| -> Result<Projection> {
            Ok(if s.use_linear_projection {
                Projection::Linear(Linear::load(&w.pp(name), i, o, true)?)
            } else {
                Projection::Conv(Conv2d::load(
                    &w.pp(name),
                    i,
                    o,
                    1,
                    ConvParams::default(),
                    true,
                )?)
            })
        };
        let blocks = (0..s.layers)
            .map(|i| {
                BasicTransformerBlock::load(
                    &w.pp(format!("transformer_blocks.{i}")),
                    BlockSpec {
                        dim: inner,
                        heads: s.heads,
                        head_dim: s.head_dim,
                        cross_attention_dim: s.cross_attention_dim,
                        only_cross_attention: s.only_cross_attention,
                        double_self_attention: false,
                        attention_bias: false,
                        activation_fn: "geglu",
                        norm_eps: 1e-5,
                    },
                )
            })
            .collect::<Result<_>>()?;
        Ok(Transformer2DModel {
            norm: GroupNorm::load(&w.pp("norm"), s.norm_num_groups, s.in_channels, 1e-6)?,
            proj_in: proj("proj_in", s.in_channels, inner)?,
            blocks,
            proj_out: proj("proj_out", inner, s.in_channels)?,
            inner,
        })
    }

    /// Applies the model to `x [B, C, H, W]` with the context `[B, S, cross_dim]`.
    pub fn forward(&self, x: &Tensor, context: Option<&Tensor>) -> Result<Tensor> {
        let [b, c, h, w] = x.shape()[..] else {
            return Err(Error::Shape(format!(
                "Transformer2DModel takes [B, C, H, W], got {:?}",
                x.shape()
            )));
        };
        let n = self.norm.forward(x)?;
        let to_seq = |t: &Tensor, ch: usize| -> Result<Tensor> {
            Ok(t.permute(&[0, 2, 3, 1])?.reshape_to(&[b, h * w, ch])?)
        };
        let mut seq = match &self.proj_in {
            Projection::Conv(conv) => to_seq(&conv.forward(&n)?, self.inner)?,
            Projection::Linear(lin) => lin.forward(&to_seq(&n, c)?)?,
        };
        for block in &self.blocks {
            seq = block.forward(&seq, context)?;
        }
        let to_map = |t: &Tensor, ch: usize| -> Result<Tensor> {
            Ok(t.reshape_to(&[b, h, w, ch])?.permute(&[0, 3, 1, 2])?)
        };
        let out = match &self.proj_out {
            Projection::Conv(conv) => conv.forward(&to_map(&seq, self.inner)?)?,
            Projection::Linear(lin) => to_map(&lin.forward(&seq)?, c)?,
        };
        Ok(out.add(x)?)
    }
}
