//! Joint attention of the MMDiT transformers: diffusers' `Attention` with added KV projections
//! under `JointAttnProcessor2_0` (SD3) and `FluxAttention` under `FluxAttnProcessor` (Flux).
//! Image and text tokens are projected separately, normed per head, attended together as one
//! sequence and split again.

use zoo_runtime::nn::{LayerNorm, Linear, RmsNorm, SharedInput, Weights};
use zoo_runtime::{RopeStyle, Tensor};

use crate::{Error, Result};

/// `qk_norm`: the per-head norm of queries and keys.
#[derive(Clone, Debug)]
enum QkNorm {
    Rms(RmsNorm),
    Layer(LayerNorm),
}

impl QkNorm {
    fn load(w: &Weights, kind: &str, dim: usize, eps: f64) -> Result<QkNorm> {
        Ok(match kind {
            "rms_norm" => QkNorm::Rms(RmsNorm::load(w, dim, eps)?),
            "layer_norm" => QkNorm::Layer(LayerNorm::load(w, dim, eps)?),
            other => {
                return Err(Error::Unsupported(format!(
                    "qk_norm {other:?} (zoo runs rms_norm and layer_norm)"
                )))
            }
        })
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(match self {
            QkNorm::Rms(n) => n.forward(x)?,
            QkNorm::Layer(n) => n.forward(x)?,
        })
    }
}

/// The text stream's projections (`add_q_proj`, `add_k_proj`, `add_v_proj`, their norms and
/// `to_add_out`, absent in the last SD3 block, whose text output is dropped).
#[derive(Clone, Debug)]
struct Added {
    qkv: SharedInput<3>,
    norm_q: Option<QkNorm>,
    norm_k: Option<QkNorm>,
    out: Option<Linear>,
}

/// How a [`JointAttention`] is built.
#[derive(Clone, Copy, Debug)]
pub struct JointAttentionSpec<'a> {
    /// Width of the tokens (image and text alike).
    pub dim: usize,
    /// Heads.
    pub heads: usize,
    /// Width of a head.
    pub head_dim: usize,
    /// `qk_norm`, when the checkpoint norms queries and keys.
    pub qk_norm: Option<&'a str>,
    /// The norms' epsilon.
    pub eps: f64,
    /// A text stream (`added_kv_proj_dim`).
    pub added: bool,
    /// The text stream has an output projection (`context_pre_only` false).
    pub added_out: bool,
    /// The image stream has an output projection (`pre_only` false; Flux's single blocks
    /// project after concatenating the MLP).
    pub out: bool,
    /// Text tokens come first in the joint sequence (Flux) or after the image tokens (SD3).
    pub text_first: bool,
}

/// Joint attention over image tokens and (optionally) text tokens.
#[derive(Clone, Debug)]
pub struct JointAttention {
    /// `to_q`, `to_k`, `to_v` (stacked on PJRT devices).
    qkv: SharedInput<3>,
    norm_q: Option<QkNorm>,
    norm_k: Option<QkNorm>,
    added: Option<Added>,
    to_out: Option<Linear>,
    heads: usize,
    head_dim: usize,
    text_first: bool,
}

impl JointAttention {
    /// Loads the projections diffusers names `to_q`, `to_k`, `to_v`, `norm_q`, `norm_k`,
    /// `to_out.0` and, for a text stream, `add_{q,k,v}_proj`, `norm_added_{q,k}`, `to_add_out`.
    pub fn load(w: &Weights, s: JointAttentionSpec<'_>) -> Result<JointAttention> {
        let inner = s.heads * s.head_dim;
        let lin = |name: &str| Linear::load(&w.pp(name), s.dim, inner, true);
        let norm = |name: &str| -> Result<Option<QkNorm>> {
            s.qk_norm
                .map(|k| QkNorm::load(&w.pp(name), k, s.head_dim, s.eps))
                .transpose()
        };
        let added = if s.added {
            Some(Added {
                qkv: SharedInput::new([
                    lin("add_q_proj")?,
                    lin("add_k_proj")?,
                    lin("add_v_proj")?,
                ])?,
                norm_q: norm("norm_added_q")?,
                norm_k: norm("norm_added_k")?,
                out: if s.added_out {
                    Some(Linear::load(&w.pp("to_add_out"), inner, s.dim, true)?)
                } else {
                    None
                },
            })
        } else {
            None
        };
        Ok(JointAttention {
            qkv: SharedInput::new([lin("to_q")?, lin("to_k")?, lin("to_v")?])?,
            norm_q: norm("norm_q")?,
            norm_k: norm("norm_k")?,
            added,
            to_out: if s.out {
                Some(Linear::load(&w.pp("to_out.0"), inner, s.dim, true)?)
            } else {
                None
            },
            heads: s.heads,
            head_dim: s.head_dim,
            text_first: s.text_first,
        })
    }

    /// A projection `[B, L, inner]` → normed heads `[B, heads, L, head_dim]`.
    fn heads_of(&self, y: Tensor, norm: Option<&QkNorm>) -> Result<Tensor> {
        let (b, l) = (y.shape()[0], y.shape()[1]);
        let mut h = y.reshape_to(&[b, l, self.heads, self.head_dim])?;
        if let Some(n) = norm {
            h = n.forward(&h)?;
        }
        Ok(h.transpose(1, 2)?)
    }

    /// Attends over `x [B, L, dim]` and, with a text stream, `context [B, S, dim]` joined
    /// to it; `rope` (cos, sin `[L_joint, head_dim / 2]`, interleaved pairs) rotates queries
    /// and keys of the joint sequence. Returns the image tokens' output and the text tokens'.
    pub fn forward(
        &self,
        x: &Tensor,
        context: Option<&Tensor>,
        rope: Option<(&Tensor, &Tensor)>,
    ) -> Result<(Tensor, Option<Tensor>)> {
        let (b, l) = (x.shape()[0], x.shape()[1]);
        let [q, k, v] = self.qkv.forward(x)?;
        let mut q = self.heads_of(q, self.norm_q.as_ref())?;
        let mut k = self.heads_of(k, self.norm_k.as_ref())?;
        let mut v = self.heads_of(v, None)?;
        let text = match (context, &self.added) {
            (Some(c), Some(a)) => {
                let [cq, ck, cv] = a.qkv.forward(c)?;
                let cq = self.heads_of(cq, a.norm_q.as_ref())?;
                let ck = self.heads_of(ck, a.norm_k.as_ref())?;
                let cv = self.heads_of(cv, None)?;
                let join = |img: &Tensor, txt: &Tensor| -> Result<Tensor> {
                    Ok(if self.text_first {
                        Tensor::cat(&[txt, img], 2)?
                    } else {
                        Tensor::cat(&[img, txt], 2)?
                    })
                };
                q = join(&q, &cq)?;
                k = join(&k, &ck)?;
                v = join(&v, &cv)?;
                Some(c.shape()[1])
            }
            (Some(_), None) => {
                return Err(Error::Shape(
                    "joint attention without a text stream was given text tokens".into(),
                ))
            }
            _ => None,
        };
        if let Some((cos, sin)) = rope {
            q = q.apply_rotary(cos, sin, RopeStyle::Interleaved)?;
            k = k.apply_rotary(cos, sin, RopeStyle::Interleaved)?;
        }
        let o = Tensor::scaled_dot_product_attention(&q, &k, &v, &Default::default())?;
        let total = o.shape()[2];
        let o = o
            .transpose(1, 2)?
            .reshape_to(&[b, total, self.heads * self.head_dim])?;
        let (img, txt) = match text {
            Some(s) => {
                let (i0, t0) = if self.text_first { (s, 0) } else { (0, l) };
                (o.narrow(1, i0, l)?, Some(o.narrow(1, t0, s)?))
            }
            None => (o, None),
        };
        let img = match &self.to_out {
            Some(p) => p.forward(&img)?,
            None => img,
        };
        let txt = match (txt, self.added.as_ref().and_then(|a| a.out.as_ref())) {
            (Some(t), Some(p)) => Some(p.forward(&t)?),
            (t, _) => t,
        };
        Ok((img, txt))
    }
}
