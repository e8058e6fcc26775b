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

/// `PixArtAlphaTextProjection`: `linear_2(act(linear_1(x)))`, the pooled-text (and caption)
/// projection of the diffusion transformers.
#[derive(Clone, Debug)]
pub struct TextProjection {
    linear_1: Linear,
    linear_2: Linear,
    act: Act,
}

impl TextProjection {
    /// Loads `linear_1` (`in_features` → `hidden`) and `linear_2` (`hidden` → `out`).
    pub fn load(
        w: &Weights,
        in_features: usize,
        hidden: usize,
        out: usize,
        act: Act,
    ) -> Result<TextProjection> {
        Ok(TextProjection {
            linear_1: Linear::load(&w.pp("linear_1"), in_features, hidden, true)?,
            linear_2: Linear::load(&w.pp("linear_2"), hidden, out, true)?,
            act,
        })
    }

    /// Projects `x [.., in_features]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let h = self.act.apply(&self.linear_1.forward(x)?)?;
        Ok(self.linear_2.forward(&h)?)
    }
}

/// `CombinedTimestepTextProjEmbeddings` (and, with a `guidance_embedder`,
/// `CombinedTimestepGuidanceTextProjEmbeddings`): the timestep's 256-wide sinusoid through
/// `timestep_embedder`, plus the guidance scale's through `guidance_embedder`, plus the pooled
/// text through `text_embedder`.
#[derive(Clone, Debug)]
pub struct CombinedTimestepTextProj {
    time_proj: Timesteps,
    timestep_embedder: TimestepEmbedding,
    guidance_embedder: Option<TimestepEmbedding>,
    text_embedder: TextProjection,
}

impl CombinedTimestepTextProj {
    /// Loads the embedders for `embedding_dim`-wide tokens from `pooled_projection_dim`-wide
    /// pooled text; `guidance` adds `guidance_embedder`.
    pub fn load(
        w: &Weights,
        embedding_dim: usize,
        pooled_projection_dim: usize,
        guidance: bool,
    ) -> Result<CombinedTimestepTextProj> {
        let silu = Act::Runtime(zoo_runtime::Activation::Silu);
        let embedder =
            |name: &str| TimestepEmbedding::load(&w.pp(name), 256, embedding_dim, silu, None, None);
        Ok(CombinedTimestepTextProj {
            time_proj: Timesteps {
                num_channels: 256,
                flip_sin_to_cos: true,
                downscale_freq_shift: 0.0,
                scale: 1.0,
            },
            timestep_embedder: embedder("timestep_embedder")?,
            guidance_embedder: if guidance {
                Some(embedder("guidance_embedder")?)
            } else {
                None
            },
            text_embedder: TextProjection::load(
                &w.pp("text_embedder"),
                pooled_projection_dim,
                embedding_dim,
                embedding_dim,
                silu,
            )?,
        })
    }

    /// Whether the model embeds a guidance scale (guidance-distilled checkpoints).
    pub fn has_guidance(&self) -> bool {
        self.guidance_embedder.is_some()
    }

    /// The conditioning `[B, dim]` of `timestep [B]`, `guidance [B]` (when embedded) and
    /// `pooled [B, pooled_projection_dim]`.
    pub fn forward(
        &self,
        timestep: &Tensor,
        guidance: Option<&Tensor>,
        pooled: &Tensor,
    ) -> Result<Tensor> {
        let dt = pooled.dtype();
        let embed = |e: &TimestepEmbedding, t: &Tensor| -> Result<Tensor> {
            e.forward(&self.time_proj.forward(t)?.to_dtype(dt)?, None)
        };
        let mut c = embed(&self.timestep_embedder, timestep)?;
        if let (Some(e), Some(g)) = (&self.guidance_embedder, guidance) {
            c = c.add(&embed(e, g)?)?;
        }
        Ok(c.add(&self.text_embedder.forward(pooled)?)?)
    }
}

/// `get_2d_sincos_pos_embed`: `[grid_h * grid_w, dim]` fixed sin-cos positions, the first half
/// of each row encoding the column, the second the row, as diffusers lays them out (positions
/// in float32, the sinusoids in float64, rounded to float32).
pub fn sincos_pos_embed_2d(
    dim: usize,
    grid_h: usize,
    grid_w: usize,
    base_size: usize,
    interpolation_scale: f64,
) -> Vec<f32> {
    let coords = |n: usize| -> Vec<f32> {
        let step = (n as f64 / base_size as f64) as f32;
        (0..n)
            .map(|i| i as f32 / step / interpolation_scale as f32)
            .collect()
    };
    let (hs, ws) = (coords(grid_h), coords(grid_w));
    let quarter = dim / 4;
    let omega: Vec<f64> = (0..quarter)
        .map(|i| 1.0 / 10000f64.powf(i as f64 / (dim as f64 / 4.0)))
        .collect();
    let mut out = Vec::with_capacity(grid_h * grid_w * dim);
    for &h in &hs {
        for &w in &ws {
            for pos in [w, h] {
                let p = pos as f64;
                out.extend(omega.iter().map(|o| (p * o).sin() as f32));
                out.extend(omega.iter().map(|o| (p * o).cos() as f32));
            }
        }
    }
    out
}
