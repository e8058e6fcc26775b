//! Adaptive norms of the diffusion transformers: mirrors diffusers' `normalization.py`
//! (`AdaLayerNormZero`, `SD35AdaLayerNormZeroX`, `AdaLayerNormZeroSingle`,
//! `AdaLayerNormContinuous`).

use zoo_runtime::nn::{LayerNorm, Linear, Weights};
use zoo_runtime::Tensor;

use crate::Result;

/// `x * (1 + scale) + shift`, `scale` and `shift` `[B, dim]` broadcast over the tokens of
/// `x [B, L, dim]`.
pub fn modulate(x: &Tensor, shift: &Tensor, scale: &Tensor) -> Result<Tensor> {
    Ok(x.mul(&scale.add_scalar(1.0)?.unsqueeze(1)?)?
        .add(&shift.unsqueeze(1)?)?)
}

/// `gate [B, dim]` times `x [B, L, dim]`.
pub fn gated(gate: &Tensor, x: &Tensor) -> Result<Tensor> {
    Ok(gate.unsqueeze(1)?.mul(x)?)
}

/// The adaLN-Zero family: `linear(silu(emb))` split into `chunks` modulations, the first two
/// (shift, scale) applied to a LayerNorm without affine (eps 1e-6). `AdaLayerNormZero` has 6
/// chunks, `SD35AdaLayerNormZeroX` 9, `AdaLayerNormZeroSingle` 3.
#[derive(Clone, Debug)]
pub struct AdaLayerNormZero {
    linear: Linear,
    norm: LayerNorm,
    chunks: usize,
}

/// What an [`AdaLayerNormZero`] gives: the modulated input and the remaining chunks in
/// diffusers' order (`gate_msa, shift_mlp, scale_mlp, gate_mlp[, shift_msa2, scale_msa2,
/// gate_msa2]`, or `gate_msa` alone), and the plain normed input (for the second attention).
pub struct AdaNormOutput {
    /// `norm(x) * (1 + scale_msa) + shift_msa`.
    pub x: Tensor,
    /// `norm(x)`.
    pub normed: Tensor,
    /// The chunks after `shift_msa, scale_msa`.
    pub rest: Vec<Tensor>,
}

impl AdaLayerNormZero {
    /// Loads `linear` (`dim` → `chunks * dim`).
    pub fn load(w: &Weights, dim: usize, chunks: usize) -> Result<AdaLayerNormZero> {
        Ok(AdaLayerNormZero {
            linear: Linear::load(&w.pp("linear"), dim, chunks * dim, true)?,
            norm: LayerNorm::no_affine(1e-6),
            chunks,
        })
    }

    /// Normalises and modulates `x [B, L, dim]` by `emb [B, dim]`.
    pub fn forward(&self, x: &Tensor, emb: &Tensor) -> Result<AdaNormOutput> {
        let mut parts = self.linear.forward(&emb.silu()?)?.chunk(self.chunks, 1)?;
        let rest = parts.split_off(2);
        let normed = self.norm.forward(x)?;
        Ok(AdaNormOutput {
            x: modulate(&normed, &parts[0], &parts[1])?,
            normed,
            rest,
        })
    }
}

/// `AdaLayerNormContinuous` with a LayerNorm: `norm(x) * (1 + scale) + shift` from
/// `linear(silu(cond))` split as (scale, shift) — the reverse of adaLN-Zero's order.
#[derive(Clone, Debug)]
pub struct AdaLayerNormContinuous {
    linear: Linear,
    norm: LayerNorm,
}

impl AdaLayerNormContinuous {
    /// Loads `linear` (`cond_dim` → `2 * dim`) and, with `affine`, `norm`'s weight and bias.
    pub fn load(
        w: &Weights,
        dim: usize,
        cond_dim: usize,
        affine: bool,
        eps: f64,
    ) -> Result<AdaLayerNormContinuous> {
        let norm = if affine {
            LayerNorm::load(&w.pp("norm"), dim, eps)?
        } else {
            LayerNorm::no_affine(eps)
        };
        Ok(AdaLayerNormContinuous {
            linear: Linear::load(&w.pp("linear"), cond_dim, 2 * dim, true)?,
            norm,
        })
    }

    /// Normalises `x [B, L, dim]` conditioned on `cond [B, cond_dim]`.
    pub fn forward(&self, x: &Tensor, cond: &Tensor) -> Result<Tensor> {
        let emb = self
            .linear
            .forward(&cond.silu()?.to_dtype(x.dtype())?)?
            .chunk(2, 1)?;
        modulate(&self.norm.forward(x)?, &emb[1], &emb[0])
    }
}
