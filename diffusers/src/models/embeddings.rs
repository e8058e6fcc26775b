//! Timestep embeddings: mirrors diffusers' `models/embeddings.py` (`get_timestep_embedding`,
//! `Timesteps`, `TimestepEmbedding`).

use zoo_runtime::nn::{Linear, Weights};
use zoo_runtime::{DType, Tensor};

use super::Act;
use crate::Result;

/// `Timesteps`: the sinusoidal embedding of (possibly fractional) timesteps.
#[derive(Clone, Debug)]
pub struct Timesteps {
    /// Width of the embedding.
    pub num_channels: usize,
    /// Put the cosines first (`flip_sin_to_cos`).
    pub flip_sin_to_cos: bool,
    /// `downscale_freq_shift`.
    pub downscale_freq_shift: f64,
    /// `scale`, multiplying the arguments.
    pub scale: f64,
}

impl Timesteps {
    /// The frequencies `exp(-ln(10000) * i / (half - shift))`, in float32 as diffusers
    /// computes them: the product and the division round to f32 at each op.
    fn frequencies(&self) -> Vec<f32> {
        let half = self.num_channels / 2;
        let log = -(10000f64.ln()) as f32;
        let denom = (half as f64 - self.downscale_freq_shift) as f32;
        (0..half)
            .map(|i| ((log * i as f32) / denom).exp())
            .collect()
    }

    /// Embeds `timesteps [N]` (any numeric dtype) as `[N, num_channels]` float32.
    pub fn forward(&self, timesteps: &Tensor) -> Result<Tensor> {
        let device = timesteps.device();
        let n = timesteps.elem_count();
        let half = self.num_channels / 2;
        let freqs = Tensor::from_vec(self.frequencies(), &[1, half], &device)?;
        let t = timesteps.to_dtype(DType::F32)?.reshape_to(&[n, 1])?;
        let mut args = t.mul(&freqs)?;
        if self.scale != 1.0 {
            args = args.mul_scalar(self.scale)?;
        }
        let (sin, cos) = (args.sin()?, args.cos()?);
        let mut emb = if self.flip_sin_to_cos {
            Tensor::cat(&[&cos, &sin], 1)?
        } else {
            Tensor::cat(&[&sin, &cos], 1)?
        };
        if self.num_channels % 2 == 1 {
            emb = emb.pad(1, 0, 1, 0.0)?;
        }
        Ok(emb)
    }
}

/// `TimestepEmbedding`: `linear_2(act(linear_1(x + cond_proj(cond))))`, then `post_act`.
#[derive(Clone, Debug)]
pub struct TimestepEmbedding {
    linear_1: Linear,
    linear_2: Linear,
    cond_proj: Option<Linear>,
    act: Act,
    post_act: Option<Act>,
}

impl TimestepEmbedding {
    /// Loads `linear_1` (`in_channels` → `time_embed_dim`), `linear_2` and, with
    /// `cond_proj_dim`, `cond_proj`.
    pub fn load(
        w: &Weights,
        in_channels: usize,
        time_embed_dim: usize,
        act: Act,
        post_act: Option<Act>,
        cond_proj_dim: Option<usize>,
    ) -> Result<TimestepEmbedding> {
        let cond_proj = match cond_proj_dim {
            Some(d) => Some(Linear::load(&w.pp("cond_proj"), d, in_channels, false)?),
            None => None,
        };
        Ok(TimestepEmbedding {
            linear_1: Linear::load(&w.pp("linear_1"), in_channels, time_embed_dim, true)?,
            linear_2: Linear::load(&w.pp("linear_2"), time_embed_dim, time_embed_dim, true)?,
            cond_proj,
            act,
            post_act,
        })
    }

    /// Embeds `sample [N, in_channels]`, adding the projected `condition` when given.
    pub fn forward(&self, sample: &Tensor, condition: Option<&Tensor>) -> Result<Tensor> {
        let mut x = sample.clone();
        if let (Some(c), Some(p)) = (condition, &self.cond_proj) {
            x = x.add(&p.forward(c)?)?;
        }
        let x = self.act.apply(&self.linear_1.forward(&x)?)?;
        let x = self.linear_2.forward(&x)?;
        Ok(match &self.post_act {
            Some(a) => a.apply(&x)?,
            None => x,
        })
    }
}
