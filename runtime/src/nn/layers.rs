//! Layers loaded by HF weight name.

use super::Weights;
use crate::{ConvParams, Result, Tensor};

/// `y = x W^T + b` with HF's weight layout `[out, in]` and optional bias `[out]`.
#[derive(Clone, Debug)]
pub struct Linear {
    pub weight: Tensor,
    pub bias: Option<Tensor>,
}

impl Linear {
    /// Loads `weight` `[out, in]` and, when `bias`, `bias` `[out]`.
    pub fn load(w: &Weights, in_dim: usize, out_dim: usize, bias: bool) -> Result<Linear> {
        let weight = w.get("weight", &[out_dim, in_dim])?;
        let bias = if bias {
            Some(w.get("bias", &[out_dim])?)
        } else {
            None
        };
        Ok(Linear { weight, bias })
    }

    /// Applies the layer to `x [.., in]`. Leading dims are folded into one matrix so the
    /// product is a single GEMM against the transposed weight view (no weight copy).
    ///
    /// With a bias on 16-bit inputs, PyTorch's `addmm` adds the bias to the f32 accumulator
    /// and rounds once; adding it to a rounded product would round twice, so that case runs
    /// in f32 and rounds at the end (candle's CPU kernel accumulates in f32 anyway).
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let dt = x.dtype();
        if let (Some(b), true) = (&self.bias, dt != dt.accumulation()) {
            let acc = dt.accumulation();
            let wide = Linear {
                weight: self.weight.to_dtype(acc)?,
                bias: Some(b.to_dtype(acc)?),
            };
            return wide.forward(&x.to_dtype(acc)?)?.into_dtype(dt);
        }
        let in_dim = x.dim(-1)?;
        let y = if x.rank() == 2 {
            x.matmul(&self.weight.t()?)?
        } else {
            let lead = &x.shape()[..x.rank() - 1];
            let rows: usize = lead.iter().product();
            let y = x.reshape_to(&[rows, in_dim])?.matmul(&self.weight.t()?)?;
            let mut out = lead.to_vec();
            out.push(self.weight.shape()[0]);
            y.reshape_to(&out)?
        };
        match &self.bias {
            Some(b) => y.add(b),
            None => Ok(y),
        }
    }
}

/// Token embedding table `[vocab, hidden]` loaded from `weight`.
#[derive(Clone, Debug)]
pub struct Embedding {
    pub weight: Tensor,
}

impl Embedding {
    /// Loads `weight` `[vocab, hidden]`.
    pub fn load(w: &Weights, vocab: usize, hidden: usize) -> Result<Embedding> {
        Ok(Embedding {
            weight: w.get("weight", &[vocab, hidden])?,
        })
    }

    /// Rows for every id in `ids` (any shape): `ids.shape + [hidden]`.
    pub fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        ids.embedding(&self.weight)
    }
}

/// RMS norm over the last dim.
#[derive(Clone, Debug)]
pub struct RmsNorm {
    pub weight: Tensor,
    pub eps: f64,
    /// Gemma's variant: scale by `1 + weight`, all in f32, cast at the end.
    pub unit_offset: bool,
}

impl RmsNorm {
    /// Llama-style RMS norm: `weight * (x / rms(x)).to(input dtype)`.
    pub fn load(w: &Weights, dim: usize, eps: f64) -> Result<RmsNorm> {
        Ok(RmsNorm {
            weight: w.get("weight", &[dim])?,
            eps,
            unit_offset: false,
        })
    }

    /// Gemma-style RMS norm: `(x / rms(x) * (1 + weight))` computed in f32.
    pub fn load_gemma(w: &Weights, dim: usize, eps: f64) -> Result<RmsNorm> {
        Ok(RmsNorm {
            weight: w.get("weight", &[dim])?,
            eps,
            unit_offset: true,
        })
    }

    /// Normalises `x [.., dim]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if !self.unit_offset {
            return x.rms_norm(Some(&self.weight), self.eps);
        }
        let out = x.dtype().float_or_default();
        let acc = out.accumulation();
        let y = x.cast(acc)?.rms_norm(None, self.eps)?;
        let scale = self.weight.to_dtype(acc)?.add_scalar(1.0)?;
        y.mul(&scale)?.into_dtype(out)
    }
}

/// Layer norm over the last dim, with optional affine weight and bias.
#[derive(Clone, Debug)]
pub struct LayerNorm {
    pub weight: Option<Tensor>,
    pub bias: Option<Tensor>,
    pub eps: f64,
}

impl LayerNorm {
    /// Loads `weight` and `bias` `[dim]` (bias optional: some models drop it).
    pub fn load(w: &Weights, dim: usize, eps: f64) -> Result<LayerNorm> {
        Ok(LayerNorm {
            weight: Some(w.get("weight", &[dim])?),
            bias: w.get_opt("bias", &[dim])?,
            eps,
        })
    }

    /// A norm without learned parameters (`elementwise_affine=False`).
    pub fn no_affine(eps: f64) -> LayerNorm {
        LayerNorm {
            weight: None,
            bias: None,
            eps,
        }
    }

    /// Normalises `x [.., dim]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.layer_norm(self.weight.as_ref(), self.bias.as_ref(), self.eps)
    }
}

/// Group norm over `[N, C, *]` with per-channel affine.
#[derive(Clone, Debug)]
pub struct GroupNorm {
    pub groups: usize,
    pub weight: Tensor,
    pub bias: Tensor,
    pub eps: f64,
}

impl GroupNorm {
    /// Loads `weight` and `bias` `[channels]`.
    pub fn load(w: &Weights, groups: usize, channels: usize, eps: f64) -> Result<GroupNorm> {
        Ok(GroupNorm {
            groups,
            weight: w.get("weight", &[channels])?,
            bias: w.get("bias", &[channels])?,
            eps,
        })
    }

    /// Normalises `x [N, C, ...]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.group_norm(self.groups, Some(&self.weight), Some(&self.bias), self.eps)
    }
}

/// 2-D convolution with weight `[out, in / groups, k, k]` and optional bias `[out]`.
#[derive(Clone, Debug)]
pub struct Conv2d {
    pub weight: Tensor,
    pub bias: Option<Tensor>,
    pub params: ConvParams,
}

impl Conv2d {
    /// Loads a square `kernel` x `kernel` convolution.
    pub fn load(
        w: &Weights,
        in_ch: usize,
        out_ch: usize,
        kernel: usize,
        params: ConvParams,
        bias: bool,
    ) -> Result<Conv2d> {
        let groups = params.groups.max(1);
        let weight = w.get("weight", &[out_ch, in_ch / groups, kernel, kernel])?;
        let bias = if bias {
            Some(w.get("bias", &[out_ch])?)
        } else {
            None
        };
        Ok(Conv2d {
            weight,
            bias,
            params,
        })
    }

    /// Convolves `x [N, in, H, W]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.conv2d(&self.weight, self.bias.as_ref(), self.params)
    }
}

/// Transposed 2-D convolution with weight `[in, out / groups, k, k]` and optional bias.
#[derive(Clone, Debug)]
pub struct ConvTranspose2d {
    pub weight: Tensor,
    pub bias: Option<Tensor>,
    pub params: ConvParams,
    pub output_padding: usize,
}

impl ConvTranspose2d {
    /// Loads a square `kernel` x `kernel` transposed convolution.
    pub fn load(
        w: &Weights,
        in_ch: usize,
        out_ch: usize,
        kernel: usize,
        params: ConvParams,
        output_padding: usize,
        bias: bool,
    ) -> Result<ConvTranspose2d> {
        let groups = params.groups.max(1);
        let weight = w.get("weight", &[in_ch, out_ch / groups, kernel, kernel])?;
        let bias = if bias {
            Some(w.get("bias", &[out_ch])?)
        } else {
            None
        };
        Ok(ConvTranspose2d {
            weight,
            bias,
            params,
            output_padding,
        })
    }

    /// Applies the layer to `x [N, in, H, W]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.conv_transpose2d(
            &self.weight,
            self.bias.as_ref(),
            self.params,
            self.output_padding,
        )
    }
}
