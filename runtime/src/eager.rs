//! The eager backend: executes one [`Op`] at once with candle-core.
//!
//! Operands arrive validated and promoted by `Tensor`; this file only maps each primitive to
//! candle calls. Candle's unary kernels abort on integer dtypes, so those paths never reach
//! them: integer `Neg`/`Abs` are rewritten here and other unary ops are refused.

use candle_core::{DType as CDType, Tensor as CT};

use crate::composite::Prims;
use crate::error::BackendContext;
use crate::op::{BinaryOp, CmpOp, ConvGeom, Op, ReduceOp, UnaryOp};
use crate::{DType, Error, Result};

fn is_int(t: &CT) -> bool {
    matches!(
        t.dtype(),
        CDType::U8 | CDType::U32 | CDType::I16 | CDType::I32 | CDType::I64
    )
}

/// Index tensors go to candle as i64 (candle's gather/index_select take u8/u32/i64).
fn as_index(t: &CT, op: &'static str) -> Result<CT> {
    match t.dtype() {
        CDType::I64 | CDType::U32 | CDType::U8 => Ok(t.clone()),
        _ => t.to_dtype(CDType::I64).op(op),
    }
}

/// Executes `op` on `x` and returns the candle result.
pub(crate) fn run(op: &Op, x: &[&CT]) -> Result<CT> {
    crate::cpu::heap::keep_freed_pages();
    let name = op.name();
    let r = match op {
        Op::Unary(u) => return unary(*u, x[0]),
        Op::Binary(b) => {
            let (a, c) = (x[0], x[1]);
            #[cfg(target_arch = "x86_64")]
            if let Some(y) = crate::cpu::bf16::binary(*b, a, c) {
                return y.op(name);
            }
            #[cfg(not(target_arch = "x86_64"))]
            if let Some(y) = crate::cpu::binary::bf16_rounded(*b, a, c) {
                return y.op(name);
            }
            match b {
                BinaryOp::Add => a.broadcast_add(c),
                BinaryOp::Sub => a.broadcast_sub(c),
                BinaryOp::Mul => a.broadcast_mul(c),
                BinaryOp::Div => a.broadcast_div(c),
                BinaryOp::Maximum => a.broadcast_maximum(c),
                BinaryOp::Minimum => a.broadcast_minimum(c),
                BinaryOp::Pow => a.broadcast_pow(c),
            }
        }
        Op::Compare(c) => {
            let (a, b) = (x[0], x[1]);
            match c {
                CmpOp::Eq => a.broadcast_eq(b),
                CmpOp::Ne => a.broadcast_ne(b),
                CmpOp::Lt => a.broadcast_lt(b),
                CmpOp::Le => a.broadcast_le(b),
                CmpOp::Gt => a.broadcast_gt(b),
                CmpOp::Ge => a.broadcast_ge(b),
            }
        }
        Op::Affine { mul, add } => x[0].affine(*mul, *add),
        Op::PowScalar(e) => x[0].powf(*e),
        Op::Clamp { min, max } => x[0].clamp(*min, *max),
        Op::Where => {
            let (c, a, b) = (x[0], x[1], x[2]);
            let shape = c
                .shape()
                .broadcast_shape_binary_op(a.shape(), "where_cond")
                .and_then(|s| s.broadcast_shape_binary_op(b.shape(), "where_cond"))
                .op(name)?;
            c.broadcast_as(&shape)
                .and_then(|c| c.where_cond(&a.broadcast_as(&shape)?, &b.broadcast_as(&shape)?))
        }
        Op::Cast(DType::Bool) => x[0].ne(0f64),
        Op::Cast(d) => {
            #[cfg(target_arch = "x86_64")]
            if let Some(y) = crate::cpu::bf16::cast(x[0], d.to_candle()) {
                return y.op(name);
            }
            x[0].to_dtype(d.to_candle())
        }
        Op::Matmul => return matmul(x[0], x[1]),
        Op::Reduce { op, dims, keepdim } => return reduce(*op, x[0], dims, *keepdim),
        Op::ArgReduce { max, dim, keepdim } => {
            let t = x[0];
            let r = match (max, keepdim) {
                (true, true) => t.argmax_keepdim(*dim),
                (true, false) => t.argmax(*dim),
                (false, true) => t.argmin_keepdim(*dim),
                (false, false) => t.argmin(*dim),
            };
            r.and_then(|r| r.to_dtype(CDType::I64))
        }
        Op::ArgSortLastDim { descending } => x[0]
            .contiguous()
            .and_then(|t| t.arg_sort_last_dim(!descending))
            .and_then(|t| t.to_dtype(CDType::I64)),
        Op::Reshape(s) => x[0].reshape(s.as_slice()),
        Op::Permute(p) => x[0].permute(p.as_slice()),
        Op::Broadcast(s) => x[0].broadcast_as(s.as_slice()),
        Op::Narrow { dim, start, len } => x[0].narrow(*dim, *start, *len),
        Op::IndexSelect { dim } => x[0].index_select(&as_index(x[1], name)?, *dim),
        Op::Gather { dim } => x[0].gather(&as_index(x[1], name)?.contiguous().op(name)?, *dim),
        Op::Concat { dim } => CT::cat(x, *dim),
        Op::DynamicSlice { sizes } => return dynamic_slice(x[0], x[1], sizes),
        Op::DynamicUpdateSlice => return dynamic_update_slice(x[0], x[1], x[2]),
        Op::IndexCopy { dim } => return index_copy(x[0], x[1], x[2], *dim),
        Op::Conv2d(g) if x[0].dtype() == CDType::BF16 => {
            // Candle's CPU im2col path has no bf16 GEMM; run in f32 (PyTorch accumulates
            // bf16 convolutions in f32 as well) and round once at the end.
            let f = |t: &CT| t.to_dtype(CDType::F32).op(name);
            return conv2d(&f(x[0])?, &f(x[1])?, g)?
                .to_dtype(CDType::BF16)
                .op(name);
        }
        Op::Conv2d(g) => return conv2d(x[0], x[1], g),
        Op::ConvTranspose2d(g) => return conv_transpose2d(x[0], x[1], g),
        Op::UpsampleNearest2d { h, w } => x[0].upsample_nearest2d(*h, *w),
        Op::Contiguous => x[0].contiguous(),
        // A layout over a mesh: nothing to do on one device.
        Op::Shard(_) => Ok(x[0].clone()),
        Op::Composite(c) => {
            let shapes: Vec<&[usize]> = x.iter().map(|t| t.dims()).collect();
            c.shape(&shapes)?;
            return c.expand(&mut Candle, x);
        }
    };
    r.op(name)
}

/// Composites expand into [`run`] calls, one candle kernel per primitive.
struct Candle;

impl Prims for Candle {
    type V = CT;
    fn shape(v: &CT) -> &[usize] {
        v.dims()
    }
    fn dtype(v: &CT) -> DType {
        // Expansions ask only of float operands; other dtypes never pass as floats.
        DType::from_candle(v.dtype()).unwrap_or(DType::U8)
    }
    fn prim(&mut self, op: Op, ins: &[&CT], _dt: DType) -> Result<CT> {
        run(&op, ins)
    }
    fn scalar(&mut self, v: f64, dt: DType, like: &CT) -> Result<CT> {
        CT::new(v, like.device())
            .and_then(|t| t.to_dtype(dt.to_candle()))
            .op("scalar")
    }
    fn softmax_last(&mut self, x: &CT) -> Option<Result<CT>> {
        crate::cpu::softmax::last_dim(x).map(|y| y.op("softmax"))
    }
}

fn unary(u: UnaryOp, t: &CT) -> Result<CT> {
    let name = "unary";
    if is_int(t) {
        // Only sign ops make sense on integers, and candle's unary kernels abort on them.
        return match u {
            UnaryOp::Neg => t.affine(-1.0, 0.0).op("neg"),
            UnaryOp::Abs => t.affine(-1.0, 0.0).and_then(|n| t.maximum(&n)).op("abs"),
            UnaryOp::Floor | UnaryOp::Ceil => Ok(t.clone()),
            _ => Err(Error::UnsupportedDType {
                op: name,
                dtype: DType::from_candle(t.dtype()).unwrap_or(DType::I64),
                hint: format!("; {u:?} needs a float input"),
            }),
        };
    }
    let r = match u {
        UnaryOp::Exp => match crate::cpu::kernels::exp(t) {
            Some(y) => y,
            None => t.exp(),
        },
        UnaryOp::Log => t.log(),
        UnaryOp::Sin => t.sin(),
        UnaryOp::Cos => t.cos(),
        UnaryOp::Tanh => t.tanh(),
        UnaryOp::Sqrt => t.sqrt(),
        UnaryOp::Erf => t.erf(),
        UnaryOp::Recip => t.recip(),
        UnaryOp::Neg => t.neg(),
        UnaryOp::Abs => t.abs(),
        UnaryOp::Silu => t.silu(),
        UnaryOp::GeluErf => t.gelu_erf(),
        UnaryOp::GeluTanh => t.gelu(),
        UnaryOp::Floor => t.floor(),
        UnaryOp::Ceil => t.ceil(),
    };
    r.op(name)
}

fn matmul(a: &CT, b: &CT) -> Result<CT> {
    let (ra, rb) = (a.rank(), b.rank());
    let same_batch = ra == rb && a.dims()[..ra - 2] == b.dims()[..rb - 2];
    let run = |a: &CT, b: &CT| {
        if same_batch {
            a.matmul(b)
        } else {
            a.broadcast_matmul(b)
        }
    };
    match run(a, b) {
        Ok(t) => Ok(t),
        // gemm takes row- or column-major operands; other strided layouts need a dense copy.
        Err(_) if !a.is_contiguous() || !b.is_contiguous() => {
            run(&a.contiguous().op("matmul")?, &b.contiguous().op("matmul")?).op("matmul")
        }
        Err(source) => Err(Error::Backend {
            op: "matmul",
            source: Box::new(source),
        }),
    }
}

fn reduce(op: ReduceOp, t: &CT, dims: &[usize], keepdim: bool) -> Result<CT> {
    let name = "reduce";
    if dims.is_empty() {
        return Ok(t.clone());
    }
    let r = match op {
        ReduceOp::Sum => t.sum_keepdim(dims),
        ReduceOp::Max | ReduceOp::Min => {
            let mut r = t.clone();
            for &d in dims {
                r = if op == ReduceOp::Max {
                    r.max_keepdim(d)
                } else {
                    r.min_keepdim(d)
                }
                .op(name)?;
            }
            Ok(r)
        }
    }
    .op(name)?;
    if keepdim {
        return Ok(r);
    }
    let mut sorted = dims.to_vec();
    sorted.sort_unstable();
    let mut r = r;
    for &d in sorted.iter().rev() {
        r = r.squeeze(d).op(name)?;
    }
    Ok(r)
}

/// Reads the start indices of a dynamic slice and clamps them so `sizes` fits, as XLA does.
fn clamped_starts(x: &CT, start: &CT, sizes: &[usize], op: &'static str) -> Result<Vec<usize>> {
    let starts = start
        .to_dtype(CDType::I64)
        .and_then(|s| s.flatten_all())
        .and_then(|s| s.to_vec1::<i64>())
        .op(op)?;
    Ok(starts
        .iter()
        .zip(x.dims().iter().zip(sizes))
        .map(|(&s, (&dim, &size))| (s.max(0) as usize).min(dim - size))
        .collect())
}

fn dynamic_slice(x: &CT, start: &CT, sizes: &[usize]) -> Result<CT> {
    let op = "dynamic_slice";
    let starts = clamped_starts(x, start, sizes, op)?;
    let mut r = x.clone();
    for (d, (&s, &n)) in starts.iter().zip(sizes).enumerate() {
        if n != x.dims()[d] {
            r = r.narrow(d, s, n).op(op)?;
        }
    }
    Ok(r)
}

fn dynamic_update_slice(x: &CT, update: &CT, start: &CT) -> Result<CT> {
    let op = "dynamic_update_slice";
    let starts = clamped_starts(x, start, update.dims(), op)?;
    update_region(x, update, &starts, 0)
}

/// `torch.index_copy` through candle's `scatter`, whose index has the source's shape.
fn index_copy(x: &CT, index: &CT, source: &CT, dim: usize) -> Result<CT> {
    let op = "index_copy";
    let mut along = vec![1; source.rank()];
    along[dim] = source.dims()[dim];
    let index = as_index(index, op)?
        .reshape(along)
        .and_then(|i| i.broadcast_as(source.dims()))
        .and_then(|i| i.contiguous())
        .op(op)?;
    x.scatter(&index, &source.contiguous().op(op)?, dim).op(op)
}

/// Writes `update` into `x` at `starts`, one differing dim at a time: the band of `x` along
/// the first dim where `update` is smaller is updated recursively, then scattered back.
fn update_region(x: &CT, update: &CT, starts: &[usize], from: usize) -> Result<CT> {
    let op = "dynamic_update_slice";
    let Some(d) = (from..x.rank()).find(|&d| update.dims()[d] != x.dims()[d]) else {
        return Ok(update.clone());
    };
    let band = x.narrow(d, starts[d], update.dims()[d]).op(op)?;
    let band = update_region(&band, update, starts, d + 1)?;
    x.slice_scatter(&band, d, starts[d]).op(op)
}

/// `conv2d` of candle tensors: the runtime's tile GEMM where it applies (f32 on the CPU),
/// else candle's.
fn conv2d(x: &CT, w: &CT, g: &ConvGeom) -> Result<CT> {
    #[cfg(target_arch = "x86_64")]
    if let Some(y) = crate::cpu::conv::conv2d(x, w, g) {
        return y.op("conv2d");
    }
    x.conv2d(w, g.padding, g.stride, g.dilation, g.groups)
        .op("conv2d")
}

fn conv_transpose2d(x: &CT, w: &CT, g: &ConvGeom) -> Result<CT> {
    let op = "conv_transpose2d";
    let run =
        |x: &CT, w: &CT| x.conv_transpose2d(w, g.padding, g.output_padding, g.stride, g.dilation);
    if g.groups == 1 {
        return run(x, w).op(op);
    }
    // Candle has no grouped transposed conv: run each group and join along channels.
    let cin = x.dims()[1] / g.groups;
    let mut outs = Vec::with_capacity(g.groups);
    for i in 0..g.groups {
        let xi = x.narrow(1, i * cin, cin).op(op)?;
        let wi = w.narrow(0, i * cin, cin).op(op)?;
        outs.push(run(&xi, &wi).op(op)?);
    }
    CT::cat(&outs, 1).op(op)
}
