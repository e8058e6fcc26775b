//! Neural-network functions: activations, normalisations, convolutions, attention and
//! rotary embeddings, composed from the primitive ops so every backend runs them.

use std::fmt;
use std::str::FromStr;

use crate::composite::{Attention, MaskKind};
use crate::dims::Dims;
use crate::op::{Composite, ConvGeom, Op, UnaryOp};
use crate::tensor::{broadcast_shape, check_same_device};
use crate::{DType, Device, Error, Result, Tensor};

/// An activation function, named as HF configs name it in `hidden_act` / `activation_fn`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Activation {
    /// `x * sigmoid(x)`: `"silu"`, `"swish"`.
    Silu,
    /// Exact GELU with erf: `"gelu"`, `"gelu_python"`.
    Gelu,
    /// Tanh-approximated GELU as one kernel: `"gelu_pytorch_tanh"`, `"gelu_fast"`.
    GeluTanh,
    /// Tanh-approximated GELU written as transformers' `NewGELUActivation` writes it
    /// (`"gelu_new"`: GPT-2, T5 v1.1): a chain of tensor ops, each rounding a 16-bit input.
    GeluNew,
    /// `x * sigmoid(1.702 x)`: `"quick_gelu"` (CLIP).
    QuickGelu,
    /// `"relu"`.
    Relu,
    /// `min(max(x, 0), 6)`: `"relu6"`.
    Relu6,
    /// `"sigmoid"`.
    Sigmoid,
    /// `"tanh"`.
    Tanh,
    /// Identity: `"linear"`, `"identity"`.
    Identity,
}

impl Activation {
    /// The activation HF names `name`, or an error listing the supported names.
    pub fn from_hf(name: &str) -> Result<Activation> {
        Ok(match name {
            "silu" | "swish" => Activation::Silu,
            "gelu" | "gelu_python" => Activation::Gelu,
            "gelu_new" => Activation::GeluNew,
            "gelu_pytorch_tanh" | "gelu_fast" => Activation::GeluTanh,
            "quick_gelu" => Activation::QuickGelu,
            "relu" => Activation::Relu,
            "relu6" => Activation::Relu6,
            "sigmoid" => Activation::Sigmoid,
            "tanh" => Activation::Tanh,
            "linear" | "identity" => Activation::Identity,
            _ => {
                return Err(Error::InvalidArgument {
                    op: "Activation::from_hf",
                    msg: format!(
                        "unknown activation `{name}`; supported: silu, swish, gelu, gelu_python, gelu_new, \
                         gelu_pytorch_tanh, gelu_fast, quick_gelu, relu, relu6, sigmoid, tanh, linear"
                    ),
                })
            }
        })
    }

    /// Applies the activation elementwise.
    ///
    /// 16-bit inputs are evaluated in f32 and rounded once, as PyTorch's kernels do (a
    /// 16-bit evaluation that rounds every intermediate drifts past bf16 tolerances).
    pub fn apply(&self, x: &Tensor) -> Result<Tensor> {
        let (dt, acc) = (x.dtype(), x.dtype().accumulation());
        if *self == Activation::GeluNew && dt != acc && dt.is_float() {
            // transformers evaluates this one op by op in the input dtype:
            // 0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x^3))).
            let inner = x
                .pow_scalar(3.0)?
                .mul_scalar(0.044715)?
                .add(x)?
                .mul_scalar((2.0 / std::f64::consts::PI).sqrt())?
                .tanh()?
                .add_scalar(1.0)?;
            return x.mul_scalar(0.5)?.mul(&inner);
        }
        if *self == Activation::QuickGelu && dt != acc && dt.is_float() {
            // Likewise `x * sigmoid(1.702 * x)`: three ops, each rounding to the input
            // dtype (the sigmoid kernel itself evaluates in f32).
            let s = x
                .mul_scalar(1.702)?
                .to_dtype(acc)?
                .sigmoid()?
                .to_dtype(dt)?;
            return x.mul(&s);
        }
        if dt != acc && dt.is_float() {
            return self.apply(&x.to_dtype(acc)?)?.into_dtype(dt);
        }
        match self {
            Activation::Silu => x.silu(),
            Activation::Gelu => x.gelu(),
            Activation::GeluTanh | Activation::GeluNew => x.gelu_tanh(),
            Activation::QuickGelu => x.mul(&x.affine(1.702, 0.0)?.sigmoid()?),
            Activation::Relu => x.relu(),
            Activation::Relu6 => x.to_dtype(x.dtype().float_or_default())?.clamp(0.0, 6.0),
            Activation::Sigmoid => x.sigmoid(),
            Activation::Tanh => x.tanh(),
            Activation::Identity => Ok(x.clone()),
        }
    }
}

impl Activation {
    /// `act(gate) * up`, a gated MLP's product (`LlamaMLP`'s `act_fn(gate_proj(x)) *
    /// up_proj(x)`); SiLU on f32 CPU tensors runs as one fused pass.
    pub fn apply_gated(&self, gate: &Tensor, up: &Tensor) -> Result<Tensor> {
        if *self == Activation::Silu {
            if let Some(y) = crate::cpu::kernels::silu_mul(gate, up) {
                return y;
            }
        }
        self.apply(gate)?.mul(up)
    }
}

impl FromStr for Activation {
    type Err = Error;
    fn from_str(s: &str) -> Result<Activation> {
        Activation::from_hf(s)
    }
}

impl fmt::Display for Activation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            Activation::Silu => "silu",
            Activation::Gelu => "gelu",
            Activation::GeluTanh => "gelu_pytorch_tanh",
            Activation::GeluNew => "gelu_new",
            Activation::QuickGelu => "quick_gelu",
            Activation::Relu => "relu",
            Activation::Relu6 => "relu6",
            Activation::Sigmoid => "sigmoid",
            Activation::Tanh => "tanh",
            Activation::Identity => "linear",
        };
        f.write_str(s)
    }
}

/// Stride, padding, dilation and groups of a 2-D convolution (the same for height and width).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ConvParams {
    pub stride: usize,
    pub padding: usize,
    pub dilation: usize,
    pub groups: usize,
}

impl Default for ConvParams {
    fn default() -> Self {
        ConvParams {
            stride: 1,
            padding: 0,
            dilation: 1,
            groups: 1,
        }
    }
}

/// How the rotary embedding pairs up channels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RopeStyle {
    /// Channel `i` pairs with `i + r/2` (Llama, Qwen, Mistral, ...: HF's `rotate_half`).
    RotateHalf,
    /// Channel `2i` pairs with `2i + 1` (GPT-J, CodeGen, Cohere, the original RoPE paper).
    Interleaved,
}

/// Options of [`Tensor::scaled_dot_product_attention`].
#[derive(Clone, Copy, Debug, Default)]
pub struct SdpaOptions<'a> {
    /// Mask future keys. With fewer queries than keys (decoding with a KV cache) the queries
    /// are the last positions: query `i` sees keys `0..=i + (lk - lq)`.
    pub causal: bool,
    /// Additive float mask, or bool mask where true means "attend"; broadcast to
    /// `[batch, heads, lq, lk]`.
    pub mask: Option<&'a Tensor>,
    /// Score scale; `1/sqrt(head_dim)` when `None`.
    pub scale: Option<f64>,
    /// Sliding window: query at position `p` sees only keys `j` with `p - j < window`.
    pub sliding_window: Option<usize>,
    /// Logit soft-capping `cap * tanh(scores / cap)` before masking (Gemma 2).
    pub softcap: Option<f64>,
    /// Round the scores to the input dtype after the product, the scale, the cap and an
    /// additive mask, as transformers' eager attention does on 16-bit tensors (bit-exact
    /// parity in bf16/f16); otherwise they stay in f32 until the softmax, as
    /// `torch.nn.functional.scaled_dot_product_attention`'s math path keeps them. No effect
    /// on f32 inputs.
    pub round_scores: bool,
    /// Compute the scores from f32 copies of q and k (transformers' GPT-2
    /// `reorder_and_upcast_attn`); the probabilities still meet v in its dtype. No effect on
    /// f32 inputs.
    pub upcast_scores: bool,
}

impl Tensor {
    // ----- activations -----

    /// SiLU / swish.
    pub fn silu(&self) -> Result<Tensor> {
        self.float_op(UnaryOp::Silu)
    }
    /// Exact GELU (erf form), HF `"gelu"`.
    pub fn gelu(&self) -> Result<Tensor> {
        if let Some(y) = crate::cpu::kernels::gelu_erf(self) {
            return y;
        }
        self.float_op(UnaryOp::GeluErf)
    }
    /// Tanh-approximated GELU, HF `"gelu_new"` / `"gelu_pytorch_tanh"` (f32 CPU tensors in
    /// one vectorised pass).
    pub fn gelu_tanh(&self) -> Result<Tensor> {
        if let Some(y) = crate::cpu::kernels::gelu_tanh(self) {
            return y;
        }
        self.float_op(UnaryOp::GeluTanh)
    }
    /// max(x, 0), in the input dtype.
    pub fn relu(&self) -> Result<Tensor> {
        if self.dtype() == DType::Bool {
            return Ok(self.clone());
        }
        self.clamp(0.0, f64::INFINITY)
    }
    /// Applies the activation HF names `name` (`"silu"`, `"gelu_pytorch_tanh"`, ...).
    pub fn activation(&self, name: &str) -> Result<Tensor> {
        Activation::from_hf(name)?.apply(self)
    }

    fn float_op(&self, op: UnaryOp) -> Result<Tensor> {
        let x = self.cast(self.dtype().float_or_default())?;
        let dt = x.dtype();
        x.apply1(Op::Unary(op), dt)
    }

    // ----- normalisation -----

    fn check_param(&self, op: &'static str, p: Option<&Tensor>, size: usize) -> Result<()> {
        if let Some(p) = p {
            check_same_device(op, self, p)?;
            if p.shape() != [size] {
                return Err(Error::ShapeMismatch {
                    op,
                    lhs: self.shape().to_vec(),
                    rhs: p.shape().to_vec(),
                    hint: format!("; weight/bias must be [{size}]"),
                });
            }
        }
        Ok(())
    }

    /// Layer norm over the last dim: `(x - mean) / sqrt(var + eps) * weight + bias`, computed
    /// in f32 for 16-bit inputs and returned in the input dtype.
    pub fn layer_norm(
        &self,
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        eps: f64,
    ) -> Result<Tensor> {
        let op = "layer_norm";
        let n = self.dim(-1).map_err(|_| Error::InvalidArgument {
            op,
            msg: "layer_norm needs at least one dim".into(),
        })?;
        self.check_param(op, weight, n)?;
        self.check_param(op, bias, n)?;
        let out = self.dtype().float_or_default();
        let x = self.cast(out)?;
        let mut y = match crate::cpu::norm::norm_last(&x, crate::cpu::norm::Norm::Layer, eps) {
            Some(y) => y?,
            None => x.apply1(
                Op::Composite(Composite::LayerNorm { eps }),
                out.accumulation(),
            )?,
        };
        if let Some(w) = weight {
            y = y.mul(&*w.cast(y.dtype())?)?;
        }
        if let Some(b) = bias {
            y = y.add(&*b.cast(y.dtype())?)?;
        }
        y.into_dtype(out)
    }

    /// RMS norm over the last dim as Llama defines it: normalise in f32, cast back to the
    /// input dtype, then multiply by `weight`.
    pub fn rms_norm(&self, weight: Option<&Tensor>, eps: f64) -> Result<Tensor> {
        let op = "rms_norm";
        let n = self.dim(-1).map_err(|_| Error::InvalidArgument {
            op,
            msg: "rms_norm needs at least one dim".into(),
        })?;
        self.check_param(op, weight, n)?;
        let out = self.dtype().float_or_default();
        let x = self.cast(out)?;
        let y = match crate::cpu::norm::norm_last(&x, crate::cpu::norm::Norm::Rms, eps) {
            Some(y) => y?,
            None => x.apply1(Op::Composite(Composite::RmsNorm { eps }), out)?,
        };
        match weight {
            Some(w) => w.mul(&y),
            None => Ok(y),
        }
    }

    /// Group norm over `[N, C, *]`: statistics per sample and group of `C / groups` channels,
    /// then a per-channel affine. Computed in f32 for 16-bit inputs.
    pub fn group_norm(
        &self,
        groups: usize,
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        eps: f64,
    ) -> Result<Tensor> {
        let op = "group_norm";
        if self.rank() < 2 || groups == 0 || !self.shape()[1].is_multiple_of(groups) {
            return Err(Error::InvalidArgument {
                op,
                msg: format!(
                    "input {:?} must be [N, C, ...] with C divisible by {groups} groups",
                    self.shape()
                ),
            });
        }
        let c = self.shape()[1];
        self.check_param(op, weight, c)?;
        self.check_param(op, bias, c)?;
        let out = self.dtype().float_or_default();
        let x = self.cast(out.accumulation())?;
        let n = self.shape()[0] as isize;
        let g = x.reshape(&[n, groups as isize, -1])?;
        let mean = g.mean(&[-1], true)?;
        let gc = g.sub(&mean)?;
        let var = gc.mul(&gc)?.mean(&[-1], true)?;
        let y = gc
            .mul(&var.add_scalar(eps)?.rsqrt()?)?
            .reshape_to(self.shape())?;
        let mut pshape = vec![1usize; self.rank()];
        pshape[1] = c;
        let mut y = y;
        if let Some(w) = weight {
            y = y.mul(&w.cast(y.dtype())?.reshape_to(&pshape)?)?;
        }
        if let Some(b) = bias {
            y = y.add(&b.cast(y.dtype())?.reshape_to(&pshape)?)?;
        }
        y.into_dtype(out)
    }

    // ----- convolution and resampling -----

    fn conv_operands(&self, op: &'static str, w: &Tensor) -> Result<(Tensor, Tensor)> {
        check_same_device(op, self, w)?;
        if self.rank() != 4 || w.rank() != 4 {
            return Err(Error::ShapeMismatch {
                op,
                lhs: self.shape().to_vec(),
                rhs: w.shape().to_vec(),
                hint: "; input must be [N, C, H, W] and weight 4-D".into(),
            });
        }
        let dt = DType::promote(self.dtype(), w.dtype());
        if !dt.is_float() {
            return Err(Error::UnsupportedDType {
                op,
                dtype: dt,
                hint: "; convolutions run on float dtypes".into(),
            });
        }
        Ok((self.to_dtype(dt)?, w.to_dtype(dt)?))
    }

    fn add_channel_bias(y: Tensor, bias: Option<&Tensor>, op: &'static str) -> Result<Tensor> {
        let Some(b) = bias else { return Ok(y) };
        let c = y.shape()[1];
        if b.shape() != [c] {
            return Err(Error::ShapeMismatch {
                op,
                lhs: y.shape().to_vec(),
                rhs: b.shape().to_vec(),
                hint: format!("; bias must be [{c}]"),
            });
        }
        let b = b.cast(y.dtype())?.reshape_to(&[1, c, 1, 1])?;
        y.add(&b)
    }

    /// 2-D convolution (`F.conv2d`): input `[N, C, H, W]`, weight `[O, C / groups, kh, kw]`,
    /// optional bias `[O]`.
    pub fn conv2d(&self, weight: &Tensor, bias: Option<&Tensor>, p: ConvParams) -> Result<Tensor> {
        let op = "conv2d";
        let (x, w) = self.conv_operands(op, weight)?;
        let (c, h, wd) = (x.shape()[1], x.shape()[2], x.shape()[3]);
        let (o, ci, kh, kw) = (w.shape()[0], w.shape()[1], w.shape()[2], w.shape()[3]);
        if p.stride == 0 || p.dilation == 0 || p.groups == 0 {
            return Err(Error::InvalidArgument {
                op,
                msg: format!("stride, dilation and groups must be positive: {p:?}"),
            });
        }
        if c % p.groups != 0 || o % p.groups != 0 || ci * p.groups != c {
            return Err(Error::ShapeMismatch {
                op,
                lhs: x.shape().to_vec(),
                rhs: w.shape().to_vec(),
                hint: format!("; with groups = {} the weight must be [O, {}, kh, kw] and O divisible by groups", p.groups, c / p.groups.max(1)),
            });
        }
        let ekh = p.dilation * (kh - 1) + 1;
        let ekw = p.dilation * (kw - 1) + 1;
        if kh == 0 || kw == 0 || ekh > h + 2 * p.padding || ekw > wd + 2 * p.padding {
            return Err(Error::ShapeMismatch {
                op,
                lhs: x.shape().to_vec(),
                rhs: w.shape().to_vec(),
                hint: "; the dilated kernel is larger than the padded input".into(),
            });
        }
        let g = ConvGeom {
            stride: p.stride,
            padding: p.padding,
            dilation: p.dilation,
            groups: p.groups,
            output_padding: 0,
        };
        let dt = x.dtype();
        let y = Tensor::apply(Op::Conv2d(g), &[&x, &w], dt)?;
        Tensor::add_channel_bias(y, bias, op)
    }

    /// Transposed 2-D convolution (`F.conv_transpose2d`): input `[N, C, H, W]`, weight
    /// `[C, O / groups, kh, kw]`, optional bias `[O]`.
    pub fn conv_transpose2d(
        &self,
        weight: &Tensor,
        bias: Option<&Tensor>,
        p: ConvParams,
        output_padding: usize,
    ) -> Result<Tensor> {
        let op = "conv_transpose2d";
        let (x, w) = self.conv_operands(op, weight)?;
        let (c, h, wd) = (x.shape()[1], x.shape()[2], x.shape()[3]);
        let (ci, kh, kw) = (w.shape()[0], w.shape()[2], w.shape()[3]);
        if p.stride == 0 || p.dilation == 0 || p.groups == 0 {
            return Err(Error::InvalidArgument {
                op,
                msg: format!("stride, dilation and groups must be positive: {p:?}"),
            });
        }
        if ci != c || c % p.groups != 0 {
            return Err(Error::ShapeMismatch {
                op,
                lhs: x.shape().to_vec(),
                rhs: w.shape().to_vec(),
                hint: format!(
                    "; the weight must be [{c}, O / groups, kh, kw] with C divisible by groups"
                ),
            });
        }
        if output_padding >= p.stride.max(p.dilation) {
            return Err(Error::InvalidArgument {
                op,
                msg: format!("output_padding {output_padding} must be below stride or dilation"),
            });
        }
        let out = |n: usize, k: usize| {
            ((n - 1) * p.stride + p.dilation * (k - 1) + output_padding + 1) as isize
                - 2 * p.padding as isize
        };
        if kh == 0 || kw == 0 || h == 0 || wd == 0 || out(h, kh) <= 0 || out(wd, kw) <= 0 {
            return Err(Error::ShapeMismatch {
                op,
                lhs: x.shape().to_vec(),
                rhs: w.shape().to_vec(),
                hint: "; the padding leaves no output".into(),
            });
        }
        let g = ConvGeom {
            stride: p.stride,
            padding: p.padding,
            dilation: p.dilation,
            groups: p.groups,
            output_padding,
        };
        let dt = x.dtype();
        let y = Tensor::apply(Op::ConvTranspose2d(g), &[&x, &w], dt)?;
        Tensor::add_channel_bias(y, bias, op)
    }

    /// Nearest-neighbour resize of `[N, C, H, W]` to `[N, C, h, w]`.
    pub fn upsample_nearest2d(&self, h: usize, w: usize) -> Result<Tensor> {
        if self.rank() != 4 || h == 0 || w == 0 {
            return Err(Error::InvalidArgument {
                op: "upsample_nearest2d",
                msg: format!(
                    "input {:?} must be [N, C, H, W] and the size {h}x{w} positive",
                    self.shape()
                ),
            });
        }
        self.apply1(Op::UpsampleNearest2d { h, w }, self.dtype())
    }

    /// Bilinear resize of `[N, C, H, W]` to `[N, C, h, w]` as PyTorch's
    /// `F.interpolate(mode="bilinear", align_corners=False)` without antialiasing: output
    /// pixel `d` reads source position `max((d + 0.5) * in / out - 0.5, 0)`, blended from its
    /// two neighbours per axis in float32 (float64 for float64 input). Built from two row
    /// gathers and a lerp per axis, so it runs on every backend.
    pub fn upsample_bilinear2d(&self, h: usize, w: usize) -> Result<Tensor> {
        let [_, _, ih, iw] = self.shape()[..] else {
            return Err(Error::InvalidArgument {
                op: "upsample_bilinear2d",
                msg: format!("input {:?} must be [N, C, H, W]", self.shape()),
            });
        };
        if h == 0 || w == 0 || ih == 0 || iw == 0 {
            return Err(Error::InvalidArgument {
                op: "upsample_bilinear2d",
                msg: format!("cannot resize {:?} to {h}x{w}", self.shape()),
            });
        }
        let device = self.device();
        // PyTorch computes positions and blends in float32, in float64 for float64 input.
        let wide = self.dtype() == DType::F64;
        let dt = if wide { DType::F64 } else { DType::F32 };
        let x = self.to_dtype(dt)?;
        // One axis: the two source rows of each output row and their weights.
        let lerp = |x: &Tensor, axis: usize, inp: usize, out: usize| -> Result<Tensor> {
            let (mut lo, mut hi, mut keep, mut frac) = (vec![], vec![], vec![], vec![]);
            for d in 0..out {
                let src = if wide {
                    ((d as f64 + 0.5) * (inp as f64 / out as f64) - 0.5).max(0.0)
                } else {
                    ((d as f32 + 0.5) * (inp as f32 / out as f32) - 0.5).max(0.0) as f64
                };
                let i0 = (src as usize).min(inp - 1);
                let l = if wide {
                    src - i0 as f64
                } else {
                    (src as f32 - i0 as f32) as f64
                };
                lo.push(i0 as i64);
                hi.push((i0 + 1).min(inp - 1) as i64);
                keep.push(if wide {
                    1.0 - l
                } else {
                    (1.0 - l as f32) as f64
                });
                frac.push(l);
            }
            let mut shape = [1usize; 4];
            shape[axis] = out;
            let keep = Tensor::from_f64s(&keep, &shape, dt, &device)?;
            let frac = Tensor::from_f64s(&frac, &shape, dt, &device)?;
            let a = x.index_select(axis as isize, &Tensor::from_vec(lo, &[out], &device)?)?;
            let b = x.index_select(axis as isize, &Tensor::from_vec(hi, &[out], &device)?)?;
            a.mul(&keep)?.add(&b.mul(&frac)?)
        };
        let y = lerp(&x, 2, ih, h)?;
        lerp(&y, 3, iw, w)?.to_dtype(self.dtype())
    }

    /// Nearest-neighbour 2x upsampling of `[N, C, H, W]` (diffusers' `Upsample2D`).
    pub fn upsample_nearest2x(&self) -> Result<Tensor> {
        if self.rank() != 4 {
            return Err(Error::InvalidArgument {
                op: "upsample_nearest2x",
                msg: format!("input {:?} must be [N, C, H, W]", self.shape()),
            });
        }
        self.upsample_nearest2d(self.shape()[2] * 2, self.shape()[3] * 2)
    }

    // ----- attention -----

    /// Scaled dot-product attention over `q [B, Hq, Lq, D]`, `k [B, Hkv, Lk, D]`,
    /// `v [B, Hkv, Lk, Dv]` → `[B, Hq, Lq, Dv]`. `Hq` must be a multiple of `Hkv`; key/value
    /// heads are repeated for GQA/MQA. Scores are computed in the input dtype, softmax in f32
    /// (as HF's eager attention does), then cast back for the value product.
    pub fn scaled_dot_product_attention(
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        opts: &SdpaOptions<'_>,
    ) -> Result<Tensor> {
        let op = "scaled_dot_product_attention";
        check_same_device(op, q, k)?;
        check_same_device(op, q, v)?;
        let bad = |a: &Tensor, b: &Tensor, hint: &str| Error::ShapeMismatch {
            op,
            lhs: a.shape().to_vec(),
            rhs: b.shape().to_vec(),
            hint: format!("; {hint}"),
        };
        if q.rank() != 4 || k.rank() != 4 || v.rank() != 4 {
            return Err(bad(
                q,
                k,
                "q, k and v must be [batch, heads, len, head_dim]",
            ));
        }
        let (b, hq, lq, d) = (q.shape()[0], q.shape()[1], q.shape()[2], q.shape()[3]);
        let (hkv, lk) = (k.shape()[1], k.shape()[2]);
        if k.shape()[0] != b || k.shape()[3] != d {
            return Err(bad(q, k, "q and k must share batch and head_dim"));
        }
        if v.shape()[..3] != k.shape()[..3] {
            return Err(bad(k, v, "k and v must share batch, heads and length"));
        }
        if hkv == 0 || hq % hkv != 0 {
            return Err(bad(
                q,
                k,
                "query heads must be a multiple of key/value heads",
            ));
        }
        let dt = DType::promote(DType::promote(q.dtype(), k.dtype()), v.dtype());
        if !dt.is_float() {
            return Err(Error::UnsupportedDType {
                op,
                dtype: dt,
                hint: "; attention runs on float dtypes".into(),
            });
        }
        let (q, k, v) = (q.cast(dt)?, k.cast(dt)?, v.cast(dt)?);
        let scores = [b, hq, lq, lk];
        let acc = dt.accumulation();
        let mut ins: Vec<&Tensor> = vec![&q, &k, &v];
        let mask = match opts.mask {
            Some(m) => {
                check_same_device(op, &q, m)?;
                if broadcast_shape(op, &scores, m.shape())?.as_slice() != scores {
                    return Err(bad(
                        m,
                        &q,
                        &format!("the mask must broadcast to the scores {scores:?}"),
                    ));
                }
                ins.push(m);
                Some(match m.dtype() {
                    DType::Bool => MaskKind::Keep,
                    _ => MaskKind::Additive,
                })
            }
            None => None,
        };
        let positions = opts.causal || opts.sliding_window.is_some();
        let pm;
        if positions {
            pm = position_mask(lq, lk, opts.causal, opts.sliding_window, acc, &q.device())?;
            ins.push(&pm);
        }
        let scale = opts.scale.unwrap_or(1.0 / (d as f64).sqrt());
        // f32 on the CPU with an additive mask or none, and nothing else: one fused pass (the
        // same operations in the same order), giving `[B, Lq, Hq * D]`, viewed back as heads.
        let plain = match (opts.mask, mask) {
            (None, _) => Some(None),
            (Some(m), Some(MaskKind::Additive)) => Some(Some(m)),
            _ => None,
        };
        if let (Some(bias), false, None, DType::F32) = (plain, positions, opts.softcap, dt) {
            if let Some(out) = crate::cpu::kernels::attention(&q, &k, &v, bias, scale) {
                return out?.reshape_to(&[b, lq, hq, d])?.transpose(1, 2);
            }
        }
        // bf16 on the CPU without rounded scores (`scaled_dot_product_attention`): PyTorch's
        // CPU kernel keeps the scores and the softmax in f32 and rounds the output, so the
        // fused f32 pass runs on widened copies (a few hundred KiB per call) and rounds once.
        // (PyTorch also rounds the probabilities to bf16 for the value product; kept in f32
        // here, the outputs stay within the bf16 parity tolerances.)
        let sdpa = !opts.round_scores && !opts.upcast_scores;
        let on_cpu = q.device() == Device::Cpu;
        if let (Some(bias), false, None, DType::BF16, true, true) =
            (plain, positions, opts.softcap, dt, sdpa, on_cpu)
        {
            let f = |t: &Tensor| t.to_dtype(acc);
            let bias = bias.map(f).transpose()?;
            if let Some(out) =
                crate::cpu::kernels::attention(&f(&q)?, &f(&k)?, &f(&v)?, bias.as_ref(), scale)
            {
                return out?
                    .into_dtype(dt)?
                    .reshape_to(&[b, lq, hq, d])?
                    .transpose(1, 2);
            }
        }
        let attn = Attention {
            scale,
            softcap: opts.softcap,
            mask,
            positions,
            round_scores: opts.round_scores && dt != acc,
            upcast_scores: opts.upcast_scores && dt != acc,
        };
        Tensor::apply(Op::Composite(Composite::Attention(attn)), &ins, dt)
    }

    // ----- rotary embedding -----

    /// Rotates channel pairs by position-dependent angles. `cos`/`sin` hold one entry per
    /// pair (`[.., T, r/2]`, broadcast against `self`'s leading dims) for the first `r`
    /// channels of `self` (`[.., T, D]`, `r <= D`); the remaining channels pass through
    /// (partial rotary). The tables are cast to `self`'s dtype first, as HF does.
    pub fn apply_rotary(&self, cos: &Tensor, sin: &Tensor, style: RopeStyle) -> Result<Tensor> {
        let op = "apply_rotary";
        check_same_device(op, self, cos)?;
        check_same_device(op, self, sin)?;
        if cos.shape() != sin.shape() || self.rank() < 2 || cos.rank() < 1 {
            return Err(Error::ShapeMismatch {
                op,
                lhs: cos.shape().to_vec(),
                rhs: sin.shape().to_vec(),
                hint: "; cos and sin must have one shape and x at least 2 dims".into(),
            });
        }
        let d = self.dim(-1)?;
        let half = cos.dim(-1)?;
        let r = 2 * half;
        if r > d || r == 0 {
            return Err(Error::ShapeMismatch {
                op,
                lhs: self.shape().to_vec(),
                rhs: cos.shape().to_vec(),
                hint: format!("; {half} rotary pairs do not fit head_dim {d}"),
            });
        }
        let mut pair_shape = Dims::from(self.shape());
        *pair_shape.last_mut().unwrap_or(&mut 0) = half;
        let pairs = broadcast_shape(op, &pair_shape, cos.shape())?;
        let dt = self.dtype().float_or_default();
        let mut x = self.cast(dt)?;
        if pairs != pair_shape {
            // Tables with more leading dims than x (per-batch positions) widen x first.
            let mut wide = pairs;
            *wide.last_mut().unwrap_or(&mut 0) = d;
            x = std::borrow::Cow::Owned(x.broadcast_as(&wide)?);
        }
        let (c, s) = (cos.cast(dt)?, sin.cast(dt)?);
        if let Some(y) = crate::cpu::rotary::rotary(&x, &c, &s, style) {
            return y;
        }
        Tensor::apply(Op::Composite(Composite::Rotary(style)), &[&x, &c, &s], dt)
    }
}

/// Additive `[lq, lk]` mask with -inf where a query may not see a key. Queries are the last
/// `lq` of `lk` positions.
fn position_mask(
    lq: usize,
    lk: usize,
    causal: bool,
    window: Option<usize>,
    dtype: DType,
    device: &crate::Device,
) -> Result<Tensor> {
    let off = lk as isize - lq as isize;
    let mut m = vec![0f64; lq * lk];
    for i in 0..lq {
        let p = i as isize + off;
        for j in 0..lk {
            let j = j as isize;
            let hidden = (causal && j > p) || window.is_some_and(|w| p - j >= w as isize);
            if hidden {
                m[i * lk + j as usize] = f64::NEG_INFINITY;
            }
        }
    }
    Tensor::from_f64s(&m, &[lq, lk], dtype, device)
}
