//! Layers loaded by HF weight name.

use std::sync::Arc;

use super::Weights;
use crate::cpu::kernels;
use crate::cpu::quant::QMatrix;
use crate::{ConvParams, DType, Device, Error, Result, Tensor};

/// The weight of a [`Linear`] or an [`Embedding`]: a tensor, or GGUF blocks kept as stored.
///
/// Blocks are kept when a checkpoint stores a matrix as Q4_0–Q8_0 or a K-quant and it loads in
/// f32 onto the eager CPU device (`Weights::get_quantized`): products and lookups then read
/// the blocks (`cpu::quant`), a quarter to a sixth of the f32 bytes. On PJRT devices and in
/// 16-bit the hub dequantizes them at load, so the compiled graph sees plain tensors: the
/// lowering has no block arithmetic, and TPUs and GPUs run the f32/bf16 matmul natively.
#[derive(Clone, Debug)]
enum Matrix {
    Dense(Tensor),
    Blocks(Arc<QMatrix>),
}

impl Matrix {
    /// The `weight` `[rows, cols]` under `w`, as blocks when they are kept.
    fn load(w: &Weights, rows: usize, cols: usize) -> Result<Matrix> {
        if let Some(q) = w.get_quantized("weight", &[rows, cols])? {
            if let Some(m) = QMatrix::new(q)? {
                return Ok(Matrix::Blocks(Arc::new(m)));
            }
        }
        Ok(Matrix::Dense(w.get("weight", &[rows, cols])?))
    }

    fn device(&self) -> Device {
        match self {
            Matrix::Dense(t) => t.device(),
            Matrix::Blocks(_) => Device::Cpu,
        }
    }

    fn shape(&self) -> [usize; 2] {
        match self {
            Matrix::Dense(t) => [t.shape()[0], t.shape()[1]],
            Matrix::Blocks(m) => [m.rows(), m.cols()],
        }
    }

    fn tensor(&self) -> Result<Tensor> {
        match self {
            Matrix::Dense(t) => Ok(t.clone()),
            Matrix::Blocks(m) => m.to_tensor(),
        }
    }
}

/// `y = x W^T + b` with HF's weight layout `[out, in]` and optional bias `[out]`; the weight
/// is a tensor or GGUF blocks kept as stored (see `Linear::load`).
#[derive(Clone, Debug)]
pub struct Linear {
    weight: Matrix,
    /// `[out]`, added to the product.
    pub bias: Option<Tensor>,
}

impl Linear {
    /// A layer over the tensor `weight` `[out, in]` (a view is fine: a transposed `Conv1D`
    /// weight multiplies without a copy).
    pub fn new(weight: Tensor, bias: Option<Tensor>) -> Linear {
        Linear {
            weight: Matrix::Dense(weight),
            bias,
        }
    }

    /// Loads `weight` `[out, in]` and, when `bias`, `bias` `[out]`. A GGUF weight in a block
    /// type the CPU kernels multiply stays in its blocks when it loads in f32 onto the CPU.
    pub fn load(w: &Weights, in_dim: usize, out_dim: usize, bias: bool) -> Result<Linear> {
        let weight = Matrix::load(w, out_dim, in_dim)?;
        let bias = if bias {
            Some(w.get("bias", &[out_dim])?)
        } else {
            None
        };
        Ok(Linear { weight, bias })
    }

    /// One layer computing `layers`' outputs side by side (their weights stacked by rows,
    /// their biases concatenated), for layers that take the same input (q/k/v, gate/up), when
    /// every weight is a tensor on a PJRT device; `None` otherwise, the layers kept as they are.
    ///
    /// A compiled program then holds one product per input instead of one per layer: on the
    /// XLA CPU plugin a decode step's weight dots per Llama layer go from 7 to 4, and each
    /// larger gemv streams its rows at a higher rate (an accelerator gets fewer, larger
    /// kernels). Every output is the same sum over the same inputs as before. The eager CPU
    /// kernels already share one parallel pass among such layers (`forward_each`) and keep
    /// GGUF blocks, so they are left separate. The stacked weight is materialised once, here.
    pub fn concat_rows(layers: &[&Linear]) -> Result<Option<Linear>> {
        let mut weights = Vec::with_capacity(layers.len());
        for l in layers {
            match &l.weight {
                // Split weights stay separate: stacking tiles of a mesh would make the
                // stack whole on every device.
                Matrix::Dense(w) if !w.device().is_eager() && w.sharding().is_none() => {
                    weights.push(w)
                }
                _ => return Ok(None),
            }
        }
        let Some(first) = weights.first() else {
            return Ok(None);
        };
        let (dev, dt) = (first.device(), first.dtype());
        let with_bias = layers.iter().filter(|l| l.bias.is_some()).count();
        if weights.iter().any(|w| w.device() != dev || w.dtype() != dt)
            || (with_bias != 0 && with_bias != layers.len())
        {
            return Ok(None);
        }
        let weight = Tensor::cat(&weights, 0)?;
        let bias = match with_bias {
            0 => None,
            _ => {
                let bs: Vec<&Tensor> = layers.iter().filter_map(|l| l.bias.as_ref()).collect();
                Some(Tensor::cat(&bs, 0)?)
            }
        };
        // Materialise now, so each step's program reads the stacked buffer instead of
        // concatenating the separate ones again.
        let mut stacked = vec![&weight];
        stacked.extend(&bias);
        Tensor::sync_all(&stacked)?;
        Ok(Some(Linear::new(weight, bias)))
    }

    /// The weight `[out, in]` as a tensor (blocks are widened to f32 for the call).
    pub fn weight(&self) -> Result<Tensor> {
        self.weight.tensor()
    }

    /// The device the weight lives on.
    pub fn device(&self) -> Device {
        self.weight.device()
    }

    /// `out` of `[out, in]`.
    pub fn out_features(&self) -> usize {
        self.weight.shape()[0]
    }

    /// Applies the layer to `x [.., in]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let [y] = Linear::forward_each([self], x)?;
        Ok(y)
    }

    /// [`Linear::forward`] for layers that take the same input (a layer's q, k and v; gate
    /// and up): blocks on AMX tiles split the input for the tiles once for all of them.
    pub fn forward_each<const N: usize>(layers: [&Linear; N], x: &Tensor) -> Result<[Tensor; N]> {
        let blocks: Option<Vec<&QMatrix>> = layers
            .iter()
            .map(|l| match &l.weight {
                Matrix::Blocks(m) => Some(&**m),
                Matrix::Dense(_) => None,
            })
            .collect();
        let ys: Vec<Tensor> = match blocks {
            Some(ms) if x.dtype() == DType::F32 && x.device() == Device::Cpu => {
                let ys = quantized_products(&ms, x)?;
                layers
                    .iter()
                    .zip(ys)
                    .map(|(l, y)| match &l.bias {
                        Some(b) => y.add(b),
                        None => Ok(y),
                    })
                    .collect::<Result<_>>()?
            }
            _ => layers
                .iter()
                .map(|l| l.forward_one(x))
                .collect::<Result<_>>()?,
        };
        ys.try_into().map_err(|_| Error::InvalidArgument {
            op: "linear",
            msg: "a layer returned no output".into(),
        })
    }

    fn forward_one(&self, x: &Tensor) -> Result<Tensor> {
        let w = match &self.weight {
            Matrix::Dense(w) => w,
            // Blocks meet an input they have no kernel for (another dtype or device).
            Matrix::Blocks(m) => return Linear::new(m.to_tensor()?, self.bias.clone()).forward(x),
        };
        let dt = x.dtype();
        let in_dim = x.dim(-1)?;
        let rows = x.elem_count() / in_dim.max(1);
        let mut out = x.shape().to_vec();
        if let Some(last) = out.last_mut() {
            *last = w.shape()[0];
        }
        // bf16 on the CPU, many rows: the tile kernel on bf16 pairs (on values widened as it
        // packs them without AVX-512 BF16), the bias added to the f32 sums, one rounding
        // (PyTorch's `addmm` in bf16).
        #[cfg(target_arch = "x86_64")]
        if dt == DType::BF16 && rows >= kernels::FEW_ROWS {
            let x2 = x.reshape_to(&[rows, in_dim])?;
            if let Some(y) = crate::cpu::bf16::matmul_wt(&x2, w, self.bias.as_ref()) {
                return y?.reshape_to(&out);
            }
        }
        // With a bias on 16-bit inputs, PyTorch's `addmm` adds the bias to the f32
        // accumulator and rounds once; adding it to a rounded product would round twice.
        if let (Some(b), true) = (&self.bias, dt != dt.accumulation()) {
            let acc = dt.accumulation();
            if x.device() == Device::Cpu {
                // On widened copies, through the f32 kernels below (candle's CPU kernel
                // accumulates in f32 anyway).
                let wide = Linear::new(w.to_dtype(acc)?, Some(b.to_dtype(acc)?));
                return wide.forward_one(&x.to_dtype(acc)?)?.into_dtype(dt);
            }
            // Elsewhere one product from the 16-bit operands into f32 sums (on PJRT devices
            // the TPU's and GPU's native form; widening first put f32 matmuls in the graph).
            let y = plain_product(w, x, (rows, in_dim), &out, true)?;
            return y.add(&b.to_dtype(acc)?)?.into_dtype(dt);
        }
        // f32 on the CPU: one row streams the weight once in memory order (a decode step), a
        // few rows (a batch of decode steps) too, many rows take the AVX-512 tile kernel;
        // each when the CPU has the instructions.
        let fast = if rows == 1 {
            kernels::matvec(w, x)
        } else if rows < kernels::FEW_ROWS {
            kernels::matmul_wt_few(&x.reshape_to(&[rows, in_dim])?, w)
        } else {
            kernels::matmul_wt(&x.reshape_to(&[rows, in_dim])?, w)
        };
        let y = match fast {
            Some(y) => y?.reshape_to(&out)?,
            None => plain_product(w, x, (rows, in_dim), &out, false)?,
        };
        match &self.bias {
            Some(b) => y.add(b),
            None => Ok(y),
        }
    }
}

/// Layers that take the same input (an attention's q, k and v): one product over their
/// weights stacked at load where [`Linear::concat_rows`] stacks them (PJRT devices), their own
/// products sharing one pass elsewhere ([`Linear::forward_each`]). Outputs are the layers'
/// outputs, in order, either way.
#[derive(Clone, Debug)]
pub struct SharedInput<const N: usize> {
    parts: Parts<N>,
}

#[derive(Clone, Debug)]
enum Parts<const N: usize> {
    Separate([Linear; N]),
    Stacked { layer: Linear, sizes: [usize; N] },
}

impl<const N: usize> SharedInput<N> {
    /// `layers`, stacked when they can be.
    pub fn new(layers: [Linear; N]) -> Result<SharedInput<N>> {
        let refs: Vec<&Linear> = layers.iter().collect();
        let parts = match Linear::concat_rows(&refs)? {
            Some(layer) => Parts::Stacked {
                layer,
                sizes: layers.each_ref().map(Linear::out_features),
            },
            None => Parts::Separate(layers),
        };
        Ok(SharedInput { parts })
    }

    /// One layer whose outputs are `sizes` wide in order, as a checkpoint stores them
    /// (Phi-3's `qkv_proj` and `gate_up_proj`).
    pub fn stacked(layer: Linear, sizes: [usize; N]) -> Result<SharedInput<N>> {
        let rows = layer.out_features();
        if sizes.iter().sum::<usize>() != rows {
            return Err(Error::InvalidArgument {
                op: "linear",
                msg: format!("a stacked weight of {rows} rows cannot split into {sizes:?}"),
            });
        }
        Ok(SharedInput {
            parts: Parts::Stacked { layer, sizes },
        })
    }

    /// Each layer applied to `x [.., in]`.
    pub fn forward(&self, x: &Tensor) -> Result<[Tensor; N]> {
        match &self.parts {
            Parts::Separate(layers) => Linear::forward_each(layers.each_ref(), x),
            Parts::Stacked { layer, sizes } => {
                let y = layer.forward(x)?;
                let mut start = 0;
                let mut out = Vec::with_capacity(N);
                for &n in sizes {
                    out.push(y.narrow(-1, start, n)?);
                    start += n;
                }
                out.try_into().map_err(|_| Error::InvalidArgument {
                    op: "linear",
                    msg: "a stacked layer lost an output".into(),
                })
            }
        }
    }
}

/// `x [.., in] @ wᵀ` reshaped to `out` without a CPU kernel: one row as `W x`, which reads the
/// weight in its stored order (a compiled graph gets no transpose of the weight to fold or
/// copy per step); more as one GEMM against the transposed view, leading dims folded. `wide`
/// keeps 16-bit operands' f32 sums ([`Tensor::matmul_wide`]).
fn plain_product(
    w: &Tensor,
    x: &Tensor,
    (rows, in_dim): (usize, usize),
    out: &[usize],
    wide: bool,
) -> Result<Tensor> {
    let mm = |a: &Tensor, b: &Tensor| if wide { a.matmul_wide(b) } else { a.matmul(b) };
    let y = if rows == 1 {
        mm(w, &x.reshape_to(&[in_dim, 1])?)?
    } else {
        mm(&x.reshape_to(&[rows, in_dim])?, &w.t()?)?
    };
    y.reshape_to(out)
}

/// `x @ wᵀ` for each block matrix of `ms`, `x [.., cols]` f32 on the CPU; the input's own
/// storage is borrowed when it is contiguous (a prefill's is megabytes).
fn quantized_products(ms: &[&QMatrix], x: &Tensor) -> Result<Vec<Tensor>> {
    let n = x.dim(-1)?;
    let rows = x.elem_count() / n.max(1);
    let product = |xv: &[f32]| QMatrix::matmul_t_each(ms, xv, rows);
    let x = x.contiguous()?;
    let ys = match kernels::with_f32(&x, product) {
        Some(ys) => ys,
        None => product(&x.to_vec::<f32>()?),
    };
    ms.iter()
        .zip(ys)
        .map(|(m, y)| {
            let mut shape = x.shape().to_vec();
            if let Some(last) = shape.last_mut() {
                *last = m.rows();
            }
            Tensor::from_vec(y, &shape, &Device::Cpu)
        })
        .collect()
}

/// Token embedding table `[vocab, hidden]` loaded from `weight`: a tensor, or GGUF blocks
/// whose rows are rebuilt on lookup.
#[derive(Clone, Debug)]
pub struct Embedding {
    table: Matrix,
}

impl Embedding {
    /// A table over the tensor `weight` `[vocab, hidden]`.
    pub fn new(weight: Tensor) -> Embedding {
        Embedding {
            table: Matrix::Dense(weight),
        }
    }

    /// Loads `weight` `[vocab, hidden]` (kept as blocks as [`Linear::load`] keeps them).
    pub fn load(w: &Weights, vocab: usize, hidden: usize) -> Result<Embedding> {
        Ok(Embedding {
            table: Matrix::load(w, vocab, hidden)?,
        })
    }

    /// The table `[vocab, hidden]` as a tensor (blocks are widened to f32 for the call).
    pub fn weight(&self) -> Result<Tensor> {
        self.table.tensor()
    }

    /// The device the table lives on.
    pub fn device(&self) -> Device {
        self.table.device()
    }

    /// The output projection that shares this table (a tied `lm_head`), blocks included.
    pub fn as_linear(&self) -> Linear {
        Linear {
            weight: self.table.clone(),
            bias: None,
        }
    }

    /// Rows for every id in `ids` (any shape): `ids.shape + [hidden]`.
    pub fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        match &self.table {
            Matrix::Dense(w) => ids.embedding(w),
            Matrix::Blocks(m) => {
                let host = match ids.host_known_i64() {
                    Some(v) => v,
                    None => ids.to_dtype(DType::I64)?.to_vec::<i64>()?,
                };
                let mut shape = ids.shape().to_vec();
                shape.push(m.cols());
                Tensor::from_vec(m.gather_rows(&host)?, &shape, &Device::Cpu)
            }
        }
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
    /// Where the norm runs: its weight's device, `or` for a norm without weights.
    pub fn device_or(&self, or: Device) -> Device {
        self.weight.as_ref().map_or(or, Tensor::device)
    }

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
