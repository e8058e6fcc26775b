//! The closed set of primitive operations every backend implements.
//!
//! `Tensor` methods validate their operands (shapes, dtypes, devices), apply PyTorch's
//! promotion, and then describe the work as one [`Op`] over already-compatible inputs.
//! The eager backend executes an `Op` at once ([`crate::eager`]); the PJRT backend records
//! it as a graph node and lowers it to StableHLO later. The hot composites (norms, softmax,
//! rotary embedding, attention) are ops too, each with one expansion into these primitives
//! ([`crate::composite`]) that both backends run; the rest are written in `Tensor` code.

pub(crate) use crate::composite::Composite;
use crate::dims::Dims;
use crate::DType;

/// Elementwise unary primitives. Inputs are float unless noted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum UnaryOp {
    Exp,
    Log,
    Sin,
    Cos,
    Tanh,
    Sqrt,
    Erf,
    Recip,
    /// Any signed or float dtype.
    Neg,
    /// Any signed or float dtype.
    Abs,
    /// `x * sigmoid(x)`, one fused kernel.
    Silu,
    /// `0.5 x (1 + erf(x / sqrt 2))`.
    GeluErf,
    /// `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`.
    GeluTanh,
    Floor,
    Ceil,
}

/// Elementwise binary primitives over inputs of one dtype whose shapes broadcast.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum BinaryOp {
    Add,
    Sub,
    Mul,
    Div,
    Maximum,
    Minimum,
    /// Float only.
    Pow,
}

/// Comparisons; the output is bool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum CmpOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

/// Reductions over a set of dims.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum ReduceOp {
    Sum,
    Max,
    Min,
}

/// Convolution geometry shared by conv2d and conv_transpose2d (square, as diffusers uses).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct ConvGeom {
    pub stride: usize,
    pub padding: usize,
    pub dilation: usize,
    pub groups: usize,
    /// conv_transpose2d only.
    pub output_padding: usize,
}

/// One primitive operation. Inputs are passed alongside, in the order documented per variant.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Op {
    /// `[x]`
    Unary(UnaryOp),
    /// `[a, b]`, same dtype, broadcastable shapes.
    Binary(BinaryOp),
    /// `[a, b]`, same dtype, broadcastable shapes; output bool.
    Compare(CmpOp),
    /// `[x]`: `x * mul + add` in x's dtype.
    Affine { mul: f64, add: f64 },
    /// `[x]`: `x ^ e`, float.
    PowScalar(f64),
    /// `[x]`: clamp into `[min, max]`.
    Clamp { min: f64, max: f64 },
    /// `[cond(bool), a, b]`, broadcastable; a and b share a dtype.
    Where,
    /// `[x]`
    Cast(DType),
    /// `[a, b]`: `[.., m, k] @ [.., k, n]`, batch dims broadcast.
    Matmul,
    /// `[x]`
    Reduce {
        op: ReduceOp,
        dims: Dims,
        keepdim: bool,
    },
    /// `[x]`: index of the max (or min) along `dim`, i64.
    ArgReduce {
        max: bool,
        dim: usize,
        keepdim: bool,
    },
    /// `[x]`: indices (i64) that sort the last dim.
    ArgSortLastDim { descending: bool },
    /// `[x]`
    Reshape(Dims),
    /// `[x]`
    Permute(Dims),
    /// `[x]`: broadcast to this shape (new leading dims, size-1 dims stretched).
    Broadcast(Dims),
    /// `[x]`
    Narrow {
        dim: usize,
        start: usize,
        len: usize,
    },
    /// `[x, indices(1-D int)]`
    IndexSelect { dim: usize },
    /// `[x, indices(int, same rank)]`
    Gather { dim: usize },
    /// `[x0, x1, ...]`, same dtype.
    Concat { dim: usize },
    /// `[x, start(1-D int, len = rank)]`: XLA's dynamic_slice, start clamped into range.
    DynamicSlice { sizes: Dims },
    /// `[x, update, start(1-D int)]`: XLA's dynamic_update_slice, start clamped into range.
    DynamicUpdateSlice,
    /// `[x, index(1-D int), source]`: `x` with `source`'s slices along `dim` written at
    /// `index` (`torch.index_copy`).
    IndexCopy { dim: usize },
    /// `[x, w]`: NCHW input, OIHW weight.
    Conv2d(ConvGeom),
    /// `[x, w]`: NCHW input, IOHW weight.
    ConvTranspose2d(ConvGeom),
    /// `[x]`: NCHW nearest-neighbour resize to `(h, w)`.
    UpsampleNearest2d { h: usize, w: usize },
    /// `[x]`: a copy laid out densely.
    Contiguous,
    /// `[x]`: `x`, laid out over its mesh device by the interned sharding (`lazy::shard`);
    /// recorded only on mesh devices.
    Shard(u32),
    /// Inputs as the composite documents: one node, expanded into the primitives above.
    Composite(Composite),
}

impl Op {
    /// Short name used in error messages.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Op::Unary(_) => "unary",
            Op::Binary(_) => "binary",
            Op::Compare(_) => "compare",
            Op::Affine { .. } => "affine",
            Op::PowScalar(_) => "pow",
            Op::Clamp { .. } => "clamp",
            Op::Where => "where_cond",
            Op::Cast(_) => "to_dtype",
            Op::Matmul => "matmul",
            Op::Reduce { .. } => "reduce",
            Op::ArgReduce { .. } => "argmax",
            Op::ArgSortLastDim { .. } => "argsort",
            Op::Reshape(_) => "reshape",
            Op::Permute(_) => "permute",
            Op::Broadcast(_) => "expand",
            Op::Narrow { .. } => "narrow",
            Op::IndexSelect { .. } => "index_select",
            Op::Gather { .. } => "gather",
            Op::Concat { .. } => "cat",
            Op::DynamicSlice { .. } => "dynamic_slice",
            Op::DynamicUpdateSlice => "dynamic_update_slice",
            Op::IndexCopy { .. } => "index_copy",
            Op::Conv2d(_) => "conv2d",
            Op::ConvTranspose2d(_) => "conv_transpose2d",
            Op::UpsampleNearest2d { .. } => "upsample_nearest2d",
            Op::Contiguous => "contiguous",
            Op::Shard(_) => "shard",
            Op::Composite(c) => c.name(),
        }
    }
}
