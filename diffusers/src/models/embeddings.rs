//! Embeddings: mirrors diffusers' `models/embeddings.py` (`get_timestep_embedding`,
//! `Timesteps`, `TimestepEmbedding`, the diffusion transformers' combined conditionings,
//! `PatchEmbed` and its 2-D sin-cos positions).

use zoo_runtime::nn::{Conv2d, Embedding, Linear, Weights};
use zoo_runtime::{ConvParams, DType, Tensor};

use super::Act;
use crate::{Error, Result};

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

/// `CombinedTimestepLabelEmbeddings` (DiT): the timestep's 256-wide sinusoid (cosines first,
/// frequency shift 1) through `timestep_embedder`, plus the class label's row of
/// `class_embedder.embedding_table`, whose last row (`num_classes`) is the null label
/// classifier-free guidance uses.
#[derive(Clone, Debug)]
pub struct CombinedTimestepLabelEmbeddings {
    time_proj: Timesteps,
    timestep_embedder: TimestepEmbedding,
    class_embedder: Embedding,
    num_classes: usize,
}

impl CombinedTimestepLabelEmbeddings {
    /// Loads the embedders for `embedding_dim`-wide tokens and `num_classes` labels; `null`
    /// adds the null label's row (diffusers adds it whenever the class dropout is positive,
    /// as it always is for DiT).
    pub fn load(
        w: &Weights,
        num_classes: usize,
        embedding_dim: usize,
        null: bool,
    ) -> Result<CombinedTimestepLabelEmbeddings> {
        let silu = Act::Runtime(zoo_runtime::Activation::Silu);
        Ok(CombinedTimestepLabelEmbeddings {
            time_proj: Timesteps {
                num_channels: 256,
                flip_sin_to_cos: true,
                downscale_freq_shift: 1.0,
                scale: 1.0,
            },
            timestep_embedder: TimestepEmbedding::load(
                &w.pp("timestep_embedder"),
                256,
                embedding_dim,
                silu,
                None,
                None,
            )?,
            class_embedder: Embedding::load(
                &w.pp("class_embedder.embedding_table"),
                num_classes + usize::from(null),
                embedding_dim,
            )?,
            num_classes: num_classes + usize::from(null),
        })
    }

    /// Fails when a label whose value the host knows is not a row of the table.
    pub fn check_labels(&self, class_labels: &Tensor) -> Result<()> {
        let ids = class_labels.to_dtype(DType::I64)?;
        if let Some(bad) = ids.host_known_i64().and_then(|v| {
            v.into_iter()
                .find(|&i| i < 0 || i as usize >= self.num_classes)
        }) {
            return Err(Error::Input(format!(
                "class label {bad} is outside the model's {} labels (0..{})",
                self.num_classes,
                self.num_classes - 1
            )));
        }
        Ok(())
    }

    /// The conditioning `[B, dim]` (in `dtype`) of `timestep [B]` and `class_labels [B]`
    /// (integer ids, any numeric dtype).
    pub fn forward(
        &self,
        timestep: &Tensor,
        class_labels: &Tensor,
        dtype: DType,
    ) -> Result<Tensor> {
        let t = self
            .timestep_embedder
            .forward(&self.time_proj.forward(timestep)?.to_dtype(dtype)?, None)?;
        let ids = class_labels.to_dtype(DType::I64)?;
        let labels = self.class_embedder.forward(&ids)?.to_dtype(dtype)?;
        Ok(t.add(&labels)?)
    }
}

/// `PixArtAlphaCombinedTimestepSizeEmbeddings`: the timestep's embedding (cosines first, no
/// frequency shift), plus, with `use_additional_conditions`, the image's resolution (height,
/// width) and aspect ratio, each sinusoid through its own `dim / 3`-wide embedder and
/// concatenated as `[resolution (2 * dim / 3), aspect ratio (dim / 3)]`.
#[derive(Clone, Debug)]
pub struct TimestepSizeEmbeddings {
    time_proj: Timesteps,
    timestep_embedder: TimestepEmbedding,
    /// `resolution_embedder`, `aspect_ratio_embedder`.
    size: Option<(TimestepEmbedding, TimestepEmbedding)>,
}

impl TimestepSizeEmbeddings {
    /// Loads the embedders for `embedding_dim`-wide tokens.
    pub fn load(
        w: &Weights,
        embedding_dim: usize,
        use_additional_conditions: bool,
    ) -> Result<TimestepSizeEmbeddings> {
        let silu = Act::Runtime(zoo_runtime::Activation::Silu);
        let embedder = |name: &str, dim: usize| {
            TimestepEmbedding::load(&w.pp(name), 256, dim, silu, None, None)
        };
        let size = if use_additional_conditions {
            let d = embedding_dim / 3;
            Some((
                embedder("resolution_embedder", d)?,
                embedder("aspect_ratio_embedder", d)?,
            ))
        } else {
            None
        };
        Ok(TimestepSizeEmbeddings {
            time_proj: Timesteps {
                num_channels: 256,
                flip_sin_to_cos: true,
                downscale_freq_shift: 0.0,
                scale: 1.0,
            },
            timestep_embedder: embedder("timestep_embedder", embedding_dim)?,
            size,
        })
    }

    /// Whether it embeds the resolution and aspect ratio.
    pub fn uses_size(&self) -> bool {
        self.size.is_some()
    }

    /// The embedded timestep `[B, dim]` in `dtype`; `size` is `(resolution [B, 2],
    /// aspect_ratio [B, 1])`, required when the model uses them.
    pub fn forward(
        &self,
        timestep: &Tensor,
        size: Option<(&Tensor, &Tensor)>,
        dtype: DType,
    ) -> Result<Tensor> {
        let embed = |e: &TimestepEmbedding, t: &Tensor| -> Result<Tensor> {
            e.forward(&self.time_proj.forward(t)?.to_dtype(dtype)?, None)
        };
        let t = embed(&self.timestep_embedder, timestep)?;
        let Some((res_e, ar_e)) = &self.size else {
            return Ok(t);
        };
        let (res, ar) = size.ok_or_else(|| {
            Error::Input(
                "this transformer uses additional conditions (`use_additional_conditions`): pass the resolution and aspect ratio".into(),
            )
        })?;
        let b = t.shape()[0];
        let flat = |x: &Tensor| -> Result<Tensor> { Ok(x.reshape_to(&[x.elem_count()])?) };
        let r = embed(res_e, &flat(res)?)?.reshape(&[b as isize, -1])?;
        let a = embed(ar_e, &flat(ar)?)?.reshape(&[b as isize, -1])?;
        Ok(t.add(&Tensor::cat(&[&r, &a], 1)?)?)
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

/// `PatchEmbed`: a `patch_size`-strided convolution to tokens plus fixed 2-D sin-cos
/// positions, cropped from the centre of a stored `pos_embed_max_size` grid (SD3) or computed
/// for the input's grid over `base_size` and `interpolation_scale` (DiT, PixArt: diffusers
/// keeps that table out of the checkpoint).
#[derive(Clone, Debug)]
pub struct PatchEmbed {
    proj: Conv2d,
    /// `[max * max, dim]` stored positions (the checkpoint's buffer), when the grid is fixed.
    pos_embed: Option<Tensor>,
    patch_size: usize,
    max_size: Option<usize>,
    base_size: usize,
    interpolation_scale: f64,
    dim: usize,
}

impl PatchEmbed {
    /// Loads `proj` and, with `pos_embed_max_size`, the `pos_embed` buffer (computed as
    /// diffusers computes it when the checkpoint lacks it).
    pub fn load(
        w: &Weights,
        in_channels: usize,
        dim: usize,
        patch_size: usize,
        sample_size: usize,
        max_size: Option<usize>,
        interpolation_scale: f64,
    ) -> Result<PatchEmbed> {
        let params = ConvParams {
            stride: patch_size,
            ..Default::default()
        };
        let base_size = (sample_size / patch_size).max(1);
        let pos_embed = match max_size {
            Some(m) => Some(if w.contains("pos_embed") {
                w.get("pos_embed", &[1, m * m, dim])?
                    .reshape_to(&[m * m, dim])?
            } else {
                let v = sincos_pos_embed_2d(dim, m, m, base_size, interpolation_scale);
                Tensor::from_vec(v, &[m * m, dim], &w.device())?.to_dtype(w.dtype())?
            }),
            None => None,
        };
        Ok(PatchEmbed {
            proj: Conv2d::load(&w.pp("proj"), in_channels, dim, patch_size, params, true)?,
            pos_embed,
            patch_size,
            max_size,
            base_size,
            interpolation_scale,
            dim,
        })
    }

    /// `[B, C, H, W]` latents → `[B, (H/p)(W/p), dim]` tokens with positions.
    pub fn forward(&self, latents: &Tensor) -> Result<Tensor> {
        let (h, w) = (
            latents.shape()[2] / self.patch_size,
            latents.shape()[3] / self.patch_size,
        );
        let x = self.proj.forward(latents)?;
        let b = x.shape()[0];
        let x = x.reshape_to(&[b, self.dim, h * w])?.transpose(1, 2)?;
        let pos = match (&self.pos_embed, self.max_size) {
            (Some(table), Some(m)) => {
                if h > m || w > m {
                    return Err(Error::Input(format!(
                        "the latents give a {h}x{w} patch grid, larger than the transformer's pos_embed_max_size {m}: use a smaller image"
                    )));
                }
                let (top, left) = ((m - h) / 2, (m - w) / 2);
                table
                    .reshape_to(&[m, m, self.dim])?
                    .narrow(0, top, h)?
                    .narrow(1, left, w)?
                    .reshape_to(&[h * w, self.dim])?
            }
            _ => {
                let v =
                    sincos_pos_embed_2d(self.dim, h, w, self.base_size, self.interpolation_scale);
                Tensor::from_vec(v, &[h * w, self.dim], &x.device())?.to_dtype(x.dtype())?
            }
        };
        Ok(x.add(&pos.unsqueeze(0)?)?)
    }
}
