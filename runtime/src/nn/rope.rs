//! Rotary position embeddings: the frequency tables of every rope type transformers defines
//! (`default`, `linear`, `dynamic`, `llama3`, `yarn`, `longrope`) and their application.
//!
//! Each type yields inverse frequencies `inv_freq[i]` for the `r/2` channel pairs plus an
//! attention scaling that multiplies cos and sin. Frequencies are computed in f64 and
//! rounded to f32, the precision HF keeps them in.

use std::f64::consts::PI;

use crate::{DType, Error, Result, RopeStyle, Tensor};

/// The scaling variant of a rope configuration (`rope_scaling.rope_type`).
#[derive(Clone, Debug, PartialEq)]
pub enum RopeScaling {
    /// `theta^(-2i/r)`.
    Default,
    /// Position interpolation: frequencies divided by `factor`.
    Linear { factor: f64 },
    /// Dynamic NTK: the base grows once the sequence outgrows `max_position_embeddings`.
    Dynamic { factor: f64 },
    /// Llama 3.1: long wavelengths divided by `factor`, short ones kept, a smooth blend between.
    Llama3 {
        factor: f64,
        low_freq_factor: f64,
        high_freq_factor: f64,
        original_max_position_embeddings: usize,
    },
    /// YaRN: interpolation for low frequencies, extrapolation for high ones, a linear ramp
    /// between, and an attention factor on cos/sin.
    Yarn {
        factor: f64,
        original_max_position_embeddings: usize,
        beta_fast: f64,
        beta_slow: f64,
        mscale: Option<f64>,
        mscale_all_dim: Option<f64>,
        attention_factor: Option<f64>,
        /// Round the ramp bounds to whole dims (HF's default); gpt-oss turns it off.
        truncate: bool,
    },
    /// LongRoPE (Phi-3): per-pair rescale factors, the long set beyond the original context.
    LongRope {
        short_factor: Vec<f64>,
        long_factor: Vec<f64>,
        factor: f64,
        attention_factor: Option<f64>,
        original_max_position_embeddings: usize,
    },
}

/// Everything needed to build rotary tables for one attention layer.
#[derive(Clone, Debug, PartialEq)]
pub struct RopeConfig {
    /// `rope_theta`, the base.
    pub theta: f64,
    /// Rotated channels per head: `head_dim * partial_rotary_factor`, even.
    pub rotary_dim: usize,
    /// `max_position_embeddings` of the config.
    pub max_position_embeddings: usize,
    pub scaling: RopeScaling,
}

fn f64_field(p: &zoo_hub::RopeParameters, field: &str) -> Option<f64> {
    p.f64(field)
}

fn required(p: &zoo_hub::RopeParameters, field: &str) -> Result<f64> {
    f64_field(p, field).ok_or_else(|| {
        Error::RopeConfig(format!(
            "rope_type `{}` needs a numeric `{field}` in rope_scaling / rope_parameters",
            p.rope_type
        ))
    })
}

fn factors(p: &zoo_hub::RopeParameters, field: &str, half: usize) -> Result<Vec<f64>> {
    let v = p
        .extra
        .get(field)
        .and_then(|v| v.as_array())
        .ok_or_else(|| Error::RopeConfig(format!("longrope needs a list `{field}`")))?;
    let out: Option<Vec<f64>> = v.iter().map(|x| x.as_f64()).collect();
    let out =
        out.ok_or_else(|| Error::RopeConfig(format!("longrope `{field}` holds a non-number")))?;
    if out.len() != half {
        return Err(Error::RopeConfig(format!(
            "longrope `{field}` has {} entries; rotary_dim / 2 = {half} expected",
            out.len()
        )));
    }
    Ok(out)
}

impl RopeConfig {
    /// Builds the config from the hub's normalised rope parameters and the model config's
    /// other fields. `original_max_position_embeddings` is the top-level config field some
    /// models (Phi-3) set outside `rope_scaling`.
    pub fn from_hub(
        p: &zoo_hub::RopeParameters,
        head_dim: usize,
        partial_rotary_factor: f64,
        max_position_embeddings: usize,
        original_max_position_embeddings: Option<usize>,
    ) -> Result<RopeConfig> {
        let theta = p.rope_theta.unwrap_or(10_000.0);
        if !(theta.is_finite() && theta > 0.0) {
            return Err(Error::RopeConfig(format!(
                "`rope_theta` is {theta}; the rotary base must be a positive number"
            )));
        }
        let rotary_dim = (head_dim as f64 * partial_rotary_factor) as usize;
        let orig = f64_field(p, "original_max_position_embeddings").map(|v| v as usize);
        let scaling = match p.rope_type.as_str() {
            "default" => RopeScaling::Default,
            "linear" => RopeScaling::Linear {
                factor: required(p, "factor")?,
            },
            "dynamic" => RopeScaling::Dynamic {
                factor: required(p, "factor")?,
            },
            "llama3" => RopeScaling::Llama3 {
                factor: required(p, "factor")?,
                low_freq_factor: required(p, "low_freq_factor")?,
                high_freq_factor: required(p, "high_freq_factor")?,
                original_max_position_embeddings: required(p, "original_max_position_embeddings")? as usize,
            },
            "yarn" => {
                // The pretrained context is `original_max_position_embeddings` where given (else
                // the model's); `factor` is taken as written, and only a config without one
                // (DeepSeek-V3 style) gets the ratio of the extended to the original context,
                // as transformers 5 reads it (4.x took the ratio whenever the original was set).
                let original = orig.unwrap_or(max_position_embeddings);
                let factor = match (f64_field(p, "factor"), orig) {
                    (Some(f), _) => f,
                    (None, Some(o)) => max_position_embeddings as f64 / o as f64,
                    (None, None) => required(p, "factor")?,
                };
                RopeScaling::Yarn {
                    factor,
                    original_max_position_embeddings: original,
                    beta_fast: f64_field(p, "beta_fast").unwrap_or(32.0),
                    beta_slow: f64_field(p, "beta_slow").unwrap_or(1.0),
                    mscale: f64_field(p, "mscale"),
                    mscale_all_dim: f64_field(p, "mscale_all_dim"),
                    attention_factor: f64_field(p, "attention_factor"),
                    truncate: p.extra.get("truncate").and_then(|v| v.as_bool()).unwrap_or(true),
                }
            }
            "longrope" => {
                // Phi-3 sets the pretrained context at the top level; the factor is then the
                // ratio of the extended to the original context.
                let (factor, original) = match original_max_position_embeddings.or(orig) {
                    Some(o) => (max_position_embeddings as f64 / o as f64, o),
                    None => (required(p, "factor")?, max_position_embeddings),
                };
                RopeScaling::LongRope {
                    short_factor: factors(p, "short_factor", rotary_dim / 2)?,
                    long_factor: factors(p, "long_factor", rotary_dim / 2)?,
                    factor,
                    attention_factor: f64_field(p, "attention_factor"),
                    original_max_position_embeddings: original,
                }
            }
            other => {
                return Err(Error::RopeConfig(format!(
                    "unknown rope_type `{other}`; supported: default, linear, dynamic, llama3, yarn, longrope"
                )))
            }
        };
        let cfg = RopeConfig {
            theta,
            rotary_dim,
            max_position_embeddings,
            scaling,
        };
        cfg.validate()?;
        Ok(cfg)
    }

    /// A plain (`default`) rope.
    pub fn default_rope(
        theta: f64,
        rotary_dim: usize,
        max_position_embeddings: usize,
    ) -> Result<RopeConfig> {
        let cfg = RopeConfig {
            theta,
            rotary_dim,
            max_position_embeddings,
            scaling: RopeScaling::Default,
        };
        cfg.validate()?;
        Ok(cfg)
    }

    fn validate(&self) -> Result<()> {
        if self.rotary_dim == 0 || !self.rotary_dim.is_multiple_of(2) {
            return Err(Error::RopeConfig(format!(
                "rotary_dim {} must be even and positive",
                self.rotary_dim
            )));
        }
        if self.theta <= 1.0 || !self.theta.is_finite() {
            return Err(Error::RopeConfig(format!(
                "rope_theta {} must be finite and above 1",
                self.theta
            )));
        }
        let factor = match &self.scaling {
            RopeScaling::Default => 1.0,
            RopeScaling::Linear { factor } | RopeScaling::Dynamic { factor } => *factor,
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                ..
            } => {
                if high_freq_factor <= low_freq_factor {
                    return Err(Error::RopeConfig(format!(
                        "llama3 high_freq_factor {high_freq_factor} must exceed low_freq_factor {low_freq_factor}"
                    )));
                }
                *factor
            }
            RopeScaling::Yarn { factor, .. } | RopeScaling::LongRope { factor, .. } => *factor,
        };
        if !(factor.is_finite() && factor > 0.0) {
            return Err(Error::RopeConfig(format!(
                "scaling factor {factor} must be positive"
            )));
        }
        Ok(())
    }

    /// Inverse frequencies (`rotary_dim / 2` of them) and the attention scaling of cos/sin
    /// for sequences of `seq_len` positions (only `dynamic` and `longrope` depend on it).
    pub fn inv_freq(&self, seq_len: usize) -> (Vec<f64>, f64) {
        let r = self.rotary_dim;
        let base_freqs = |base: f64| -> Vec<f64> {
            (0..r / 2)
                .map(|i| 1.0 / base.powf((2 * i) as f64 / r as f64))
                .collect()
        };
        let (freqs, scale) = match &self.scaling {
            RopeScaling::Default => (base_freqs(self.theta), 1.0),
            RopeScaling::Linear { factor } => (
                base_freqs(self.theta)
                    .into_iter()
                    .map(|f| f / factor)
                    .collect(),
                1.0,
            ),
            RopeScaling::Dynamic { factor } => {
                let max = self.max_position_embeddings as f64;
                let len = (seq_len as f64).max(max);
                let base = self.theta
                    * ((factor * len / max) - (factor - 1.0)).powf(r as f64 / (r as f64 - 2.0));
                (base_freqs(base), 1.0)
            }
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            } => {
                let old = *original_max_position_embeddings as f64;
                let low_wavelen = old / low_freq_factor;
                let high_wavelen = old / high_freq_factor;
                let f = base_freqs(self.theta)
                    .into_iter()
                    .map(|f| {
                        let wavelen = 2.0 * PI / f;
                        if wavelen < high_wavelen {
                            f
                        } else if wavelen > low_wavelen {
                            f / factor
                        } else {
                            let smooth = (old / wavelen - low_freq_factor)
                                / (high_freq_factor - low_freq_factor);
                            (1.0 - smooth) * f / factor + smooth * f
                        }
                    })
                    .collect();
                (f, 1.0)
            }
            RopeScaling::Yarn {
                factor,
                original_max_position_embeddings,
                beta_fast,
                beta_slow,
                mscale,
                mscale_all_dim,
                attention_factor,
                truncate,
            } => {
                let get_mscale = |scale: f64, m: f64| {
                    if scale <= 1.0 {
                        1.0
                    } else {
                        0.1 * m * scale.ln() + 1.0
                    }
                };
                let attn = attention_factor.unwrap_or_else(|| match (mscale, mscale_all_dim) {
                    (Some(m), Some(a)) if *m != 0.0 && *a != 0.0 => {
                        get_mscale(*factor, *m) / get_mscale(*factor, *a)
                    }
                    _ => get_mscale(*factor, 1.0),
                });
                let orig = *original_max_position_embeddings as f64;
                // The dim whose wavelength completes `rot` turns over the original context.
                let corr_dim = |rot: f64| {
                    (r as f64 * (orig / (rot * 2.0 * PI)).ln()) / (2.0 * self.theta.ln())
                };
                let (mut lo, mut hi) = (corr_dim(*beta_fast), corr_dim(*beta_slow));
                if *truncate {
                    lo = lo.floor();
                    hi = hi.ceil();
                }
                let lo = lo.max(0.0);
                let hi = hi.min(r as f64 - 1.0);
                let hi = if lo == hi { hi + 0.001 } else { hi };
                let f = base_freqs(self.theta)
                    .into_iter()
                    .enumerate()
                    .map(|(i, extrap)| {
                        let interp = extrap / factor;
                        let ramp = ((i as f64 - lo) / (hi - lo)).clamp(0.0, 1.0);
                        // ramp 0: keep the extrapolated (original) frequency; ramp 1: interpolate.
                        let extrap_weight = 1.0 - ramp;
                        interp * (1.0 - extrap_weight) + extrap * extrap_weight
                    })
                    .collect();
                (f, attn)
            }
            RopeScaling::LongRope {
                short_factor,
                long_factor,
                factor,
                attention_factor,
                original_max_position_embeddings,
            } => {
                let orig = *original_max_position_embeddings;
                let attn = attention_factor.unwrap_or_else(|| {
                    if *factor <= 1.0 {
                        1.0
                    } else {
                        (1.0 + factor.ln() / (orig as f64).ln()).sqrt()
                    }
                });
                let ext = if seq_len > orig {
                    long_factor
                } else {
                    short_factor
                };
                let f = base_freqs(self.theta)
                    .into_iter()
                    .zip(ext)
                    .map(|(f, e)| f / e)
                    .collect();
                (f, attn)
            }
        };
        // HF holds inv_freq in f32.
        (freqs.into_iter().map(|f| f as f32 as f64).collect(), scale)
    }
}

/// Rotary embedding of one attention layer: builds cos/sin for positions and rotates q, k.
#[derive(Clone, Debug)]
pub struct RotaryEmbedding {
    pub config: RopeConfig,
    pub style: RopeStyle,
}

impl RotaryEmbedding {
    /// A rotary embedding using `style` channel pairing.
    pub fn new(config: RopeConfig, style: RopeStyle) -> RotaryEmbedding {
        RotaryEmbedding { config, style }
    }

    fn depends_on_len(&self) -> bool {
        matches!(
            self.config.scaling,
            RopeScaling::Dynamic { .. } | RopeScaling::LongRope { .. }
        )
    }

    /// cos and sin tables (`positions.shape + [rotary_dim / 2]`, in `dtype`) for integer
    /// `positions` (`[T]` or `[B, T]`). The frequency product runs in f32 as in HF; for
    /// `dynamic`/`longrope` the sequence length is read back as `max(positions) + 1`.
    pub fn cos_sin(&self, positions: &Tensor, dtype: DType) -> Result<(Tensor, Tensor)> {
        let seq_len = if self.depends_on_len() && positions.elem_count() > 0 {
            // Positions usually come from the host; reading them back from a device would
            // run its pending graph.
            let max = match positions.host_known_i64() {
                Some(v) => v.into_iter().max().unwrap_or(0),
                None => positions
                    .max(&(0..positions.rank() as isize).collect::<Vec<_>>(), false)?
                    .into_dtype(DType::I64)?
                    .to_scalar::<i64>()?,
            };
            max.max(0) as usize + 1
        } else {
            0
        };
        self.cos_sin_for_len(positions, seq_len, dtype)
    }

    /// Like [`RotaryEmbedding::cos_sin`] with the sequence length given (no read-back).
    pub fn cos_sin_for_len(
        &self,
        positions: &Tensor,
        seq_len: usize,
        dtype: DType,
    ) -> Result<(Tensor, Tensor)> {
        let (inv, scale) = self.config.inv_freq(seq_len);
        let dev = positions.device();
        let inv = Tensor::from_f64s(&inv, &[inv.len()], DType::F32, &dev)?;
        let freqs = positions.to_dtype(DType::F32)?.unsqueeze(-1)?.mul(&inv)?;
        let (cos, sin) = (freqs.cos()?, freqs.sin()?);
        let (cos, sin) = if scale != 1.0 {
            (cos.affine(scale, 0.0)?, sin.affine(scale, 0.0)?)
        } else {
            (cos, sin)
        };
        Ok((cos.to_dtype(dtype)?, sin.to_dtype(dtype)?))
    }

    /// Rotates `q` and `k` (`[B, H, T, D]`) at `positions` (`[T]` or `[B, T]`).
    pub fn apply(&self, q: &Tensor, k: &Tensor, positions: &Tensor) -> Result<(Tensor, Tensor)> {
        let (cos, sin) = self.cos_sin(positions, q.dtype())?;
        // [B, T, r/2] tables broadcast over heads as [B, 1, T, r/2].
        let (cos, sin) = if cos.rank() == 3 {
            (cos.unsqueeze(1)?, sin.unsqueeze(1)?)
        } else {
            (cos, sin)
        };
        Ok((
            q.apply_rotary(&cos, &sin, self.style)?,
            k.apply_rotary(&cos, &sin, self.style)?,
        ))
    }
}
