//! Elementwise arithmetic, comparisons, matmul and reductions, with PyTorch's broadcasting
//! and type promotion.

use crate::dims::Dims;
use crate::op::{BinaryOp, CmpOp, Composite, Op, ReduceOp, UnaryOp};
use crate::tensor::{broadcast_shape, check_same_device};
use crate::{DType, Error, Result, Tensor};

impl Tensor {
    // ----- binary, tensor with tensor -----

    fn binary(&self, rhs: &Tensor, op: BinaryOp, name: &'static str) -> Result<Tensor> {
        check_same_device(name, self, rhs)?;
        if self.lazy().is_none() {
            // Recording derives (and checks) the shape anyway; candle would fail with a
            // message that names neither op nor shapes.
            broadcast_shape(name, self.shape(), rhs.shape())?;
        }
        let mut dt = DType::promote(self.dtype(), rhs.dtype());
        // True division and pow are float ops in PyTorch (int / int gives float).
        if matches!(op, BinaryOp::Div | BinaryOp::Pow) {
            dt = dt.float_or_default();
        }
        if dt == DType::Bool {
            // Bool arithmetic is logical: + and max are `or`, * and min are `and`.
            let op = match op {
                BinaryOp::Add | BinaryOp::Maximum => BinaryOp::Maximum,
                BinaryOp::Mul | BinaryOp::Minimum => BinaryOp::Minimum,
                _ => {
                    return Err(Error::UnsupportedDType {
                        op: name,
                        dtype: DType::Bool,
                        hint: "; use logical_xor or cast to an integer dtype".into(),
                    })
                }
            };
            return Tensor::apply(Op::Binary(op), &[self, rhs], DType::Bool);
        }
        if matches!(dt, DType::U8 | DType::I32)
            && matches!(op, BinaryOp::Add | BinaryOp::Sub | BinaryOp::Mul)
        {
            // Narrow integers compute in i64 and wrap on the way back, as PyTorch wraps;
            // candle's own kernels would trip Rust's overflow checks in debug builds.
            let a = self.cast(DType::I64)?;
            let b = rhs.cast(DType::I64)?;
            return Tensor::apply(Op::Binary(op), &[&a, &b], DType::I64)?.into_dtype(dt);
        }
        let a = self.cast(dt)?;
        let b = rhs.cast(dt)?;
        if let Some(y) = crate::cpu::binary::binary(&a, &b, op) {
            return y;
        }
        Tensor::apply(Op::Binary(op), &[&a, &b], dt)
    }

    /// `self + rhs`, broadcasting.
    pub fn add(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary(rhs, BinaryOp::Add, "add")
    }
    /// `self - rhs`, broadcasting.
    pub fn sub(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary(rhs, BinaryOp::Sub, "sub")
    }
    /// `self * rhs`, broadcasting.
    pub fn mul(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary(rhs, BinaryOp::Mul, "mul")
    }
    /// True division `self / rhs`, broadcasting (integers divide as f32).
    pub fn div(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary(rhs, BinaryOp::Div, "div")
    }
    /// Elementwise maximum, broadcasting.
    pub fn maximum(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary(rhs, BinaryOp::Maximum, "maximum")
    }
    /// Elementwise minimum, broadcasting.
    pub fn minimum(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary(rhs, BinaryOp::Minimum, "minimum")
    }
    /// `self ^ rhs`, broadcasting, computed in floating point.
    pub fn pow(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary(rhs, BinaryOp::Pow, "pow")
    }

    // ----- binary, tensor with scalar -----

    /// `self * mul + add` with a scalar promotion of the result dtype.
    pub fn affine(&self, mul: f64, add: f64) -> Result<Tensor> {
        let dt = self
            .dtype()
            .promote_scalar(mul)
            .max_float(self.dtype().promote_scalar(add));
        let dt = if dt == DType::Bool { DType::I64 } else { dt };
        if matches!(dt, DType::U8 | DType::I32) {
            // Wrap like PyTorch instead of overflowing inside candle (see `binary`).
            let x = self.cast(DType::I64)?;
            return x
                .apply1(Op::Affine { mul, add }, DType::I64)?
                .into_dtype(dt);
        }
        if matches!(dt, DType::BF16 | DType::F16) {
            // PyTorch computes a 16-bit tensor times a Python scalar in f32 with the scalar
            // unrounded, then rounds once; a 16-bit constant would round the scalar first.
            let x = self.cast(DType::F32)?;
            return x
                .apply1(Op::Affine { mul, add }, DType::F32)?
                .into_dtype(dt);
        }
        let x = self.cast(dt)?;
        x.apply1(Op::Affine { mul, add }, dt)
    }
    /// `self + v`.
    pub fn add_scalar(&self, v: f64) -> Result<Tensor> {
        self.affine(1.0, v)
    }
    /// `self - v`.
    pub fn sub_scalar(&self, v: f64) -> Result<Tensor> {
        self.affine(1.0, -v)
    }
    /// `self * v`.
    pub fn mul_scalar(&self, v: f64) -> Result<Tensor> {
        self.affine(v, 0.0)
    }
    /// `self / v` (true division: integer tensors give f32).
    pub fn div_scalar(&self, v: f64) -> Result<Tensor> {
        let x = self.cast(self.dtype().float_or_default())?;
        x.affine(1.0 / v, 0.0)
    }
    /// `self ^ e` for a scalar exponent, computed in floating point.
    pub fn pow_scalar(&self, e: f64) -> Result<Tensor> {
        let x = self.cast(self.dtype().float_or_default())?;
        let dt = x.dtype();
        if e == 2.0 {
            return x.mul(&x);
        }
        if e == 3.0 && matches!(dt, DType::BF16 | DType::F16) {
            // PyTorch's CPU kernel writes a 16-bit cube as `x * x * x`, rounding twice.
            return x.mul(&x)?.mul(&x);
        }
        x.apply1(Op::PowScalar(e), dt)
    }
    /// Clamps into `[min, max]`; pass `f64::NEG_INFINITY`/`f64::INFINITY` for a one-sided clamp.
    pub fn clamp(&self, min: f64, max: f64) -> Result<Tensor> {
        if min > max {
            return Err(Error::InvalidArgument {
                op: "clamp",
                msg: format!("min {min} is above max {max}"),
            });
        }
        // An infinite bound is "no bound" and must not turn an integer tensor into floats.
        let promote = |v: f64| {
            if v.is_infinite() {
                self.dtype()
            } else {
                self.dtype().promote_scalar(v)
            }
        };
        let dt = promote(min).max_float(promote(max));
        let x = self.cast(if dt == DType::Bool { DType::I64 } else { dt })?;
        let dt = x.dtype();
        // Integer dtypes cannot hold infinities: clamp the bounds into their range.
        let (lo, hi) = match dt {
            DType::U8 => (min.max(0.0), max.min(255.0)),
            DType::I32 => (min.max(i32::MIN as f64), max.min(i32::MAX as f64)),
            DType::I64 => (min.max(i64::MIN as f64), max.min(i64::MAX as f64)),
            _ => (min, max),
        };
        x.apply1(Op::Clamp { min: lo, max: hi }, dt)
    }

    // ----- comparisons and selection -----

    fn compare(&self, rhs: &Tensor, op: CmpOp, name: &'static str) -> Result<Tensor> {
        check_same_device(name, self, rhs)?;
        broadcast_shape(name, self.shape(), rhs.shape())?;
        let dt = DType::promote(self.dtype(), rhs.dtype());
        let a = self.cast(dt)?;
        let b = rhs.cast(dt)?;
        Tensor::apply(Op::Compare(op), &[&a, &b], DType::Bool)
    }
    /// `self == rhs` (bool), broadcasting.
    pub fn eq(&self, rhs: &Tensor) -> Result<Tensor> {
        self.compare(rhs, CmpOp::Eq, "eq")
    }
    /// `self != rhs` (bool), broadcasting.
    pub fn ne(&self, rhs: &Tensor) -> Result<Tensor> {
        self.compare(rhs, CmpOp::Ne, "ne")
    }
    /// `self < rhs` (bool), broadcasting.
    pub fn lt(&self, rhs: &Tensor) -> Result<Tensor> {
        self.compare(rhs, CmpOp::Lt, "lt")
    }
    /// `self <= rhs` (bool), broadcasting.
    pub fn le(&self, rhs: &Tensor) -> Result<Tensor> {
        self.compare(rhs, CmpOp::Le, "le")
    }
    /// `self > rhs` (bool), broadcasting.
    pub fn gt(&self, rhs: &Tensor) -> Result<Tensor> {
        self.compare(rhs, CmpOp::Gt, "gt")
    }
    /// `self >= rhs` (bool), broadcasting.
    pub fn ge(&self, rhs: &Tensor) -> Result<Tensor> {
        self.compare(rhs, CmpOp::Ge, "ge")
    }

    /// Compares with a scalar: `self <op> v` for `op` one of `==`, `!=`, `<`, `<=`, `>`, `>=`.
    pub fn cmp_scalar(&self, op: &str, v: f64) -> Result<Tensor> {
        let s = Tensor::scalar(v, self.dtype().promote_scalar(v), &self.device())?;
        match op {
            "==" => self.eq(&s),
            "!=" => self.ne(&s),
            "<" => self.lt(&s),
            "<=" => self.le(&s),
            ">" => self.gt(&s),
            ">=" => self.ge(&s),
            _ => Err(Error::InvalidArgument {
                op: "cmp_scalar",
                msg: format!("unknown comparison `{op}`; use ==, !=, <, <=, > or >="),
            }),
        }
    }

    /// Logical and of two bool tensors, broadcasting.
    pub fn logical_and(&self, rhs: &Tensor) -> Result<Tensor> {
        self.to_dtype(DType::Bool)?.binary(
            &*rhs.cast(DType::Bool)?,
            BinaryOp::Minimum,
            "logical_and",
        )
    }
    /// Logical or of two bool tensors, broadcasting.
    pub fn logical_or(&self, rhs: &Tensor) -> Result<Tensor> {
        self.to_dtype(DType::Bool)?.binary(
            &*rhs.cast(DType::Bool)?,
            BinaryOp::Maximum,
            "logical_or",
        )
    }
    /// Logical not.
    pub fn logical_not(&self) -> Result<Tensor> {
        let z = Tensor::scalar(0.0, DType::Bool, &self.device())?;
        self.to_dtype(DType::Bool)?.eq(&z)
    }

    /// `cond ? on_true : on_false` elementwise; `self` is the condition (any dtype, nonzero is
    /// true). All three broadcast; the branches promote to a common dtype.
    pub fn where_cond(&self, on_true: &Tensor, on_false: &Tensor) -> Result<Tensor> {
        let name = "where_cond";
        check_same_device(name, self, on_true)?;
        check_same_device(name, self, on_false)?;
        let s = broadcast_shape(name, self.shape(), on_true.shape())?;
        broadcast_shape(name, &s, on_false.shape())?;
        let dt = DType::promote(on_true.dtype(), on_false.dtype());
        let c = self.cast(DType::Bool)?;
        let a = on_true.cast(dt)?;
        let b = on_false.cast(dt)?;
        Tensor::apply(Op::Where, &[&c, &a, &b], dt)
    }

    /// Like [`Tensor::where_cond`] with a scalar for the false branch (`masked_fill` with the
    /// condition inverted).
    pub fn where_scalar(&self, on_true: &Tensor, on_false: f64) -> Result<Tensor> {
        let f = Tensor::scalar(on_false, on_true.dtype(), &on_true.device())?;
        self.where_cond(on_true, &f)
    }

    /// `masked_fill`: `value` where `mask` is true, `self` elsewhere.
    pub fn masked_fill(&self, mask: &Tensor, value: f64) -> Result<Tensor> {
        let v = Tensor::scalar(value, self.dtype(), &self.device())?;
        mask.where_cond(&v, self)
    }

    // ----- unary -----

    fn float_unary(&self, op: UnaryOp) -> Result<Tensor> {
        let x = self.cast(self.dtype().float_or_default())?;
        let dt = x.dtype();
        x.apply1(Op::Unary(op), dt)
    }
    /// e^x.
    pub fn exp(&self) -> Result<Tensor> {
        self.float_unary(UnaryOp::Exp)
    }
    /// Natural log.
    pub fn log(&self) -> Result<Tensor> {
        self.float_unary(UnaryOp::Log)
    }
    /// Sine.
    pub fn sin(&self) -> Result<Tensor> {
        self.float_unary(UnaryOp::Sin)
    }
    /// Cosine.
    pub fn cos(&self) -> Result<Tensor> {
        self.float_unary(UnaryOp::Cos)
    }
    /// Hyperbolic tangent.
    pub fn tanh(&self) -> Result<Tensor> {
        self.float_unary(UnaryOp::Tanh)
    }
    /// Square root.
    pub fn sqrt(&self) -> Result<Tensor> {
        self.float_unary(UnaryOp::Sqrt)
    }
    /// 1 / sqrt(x).
    pub fn rsqrt(&self) -> Result<Tensor> {
        self.sqrt()?.recip()
    }
    /// The error function.
    pub fn erf(&self) -> Result<Tensor> {
        self.float_unary(UnaryOp::Erf)
    }
    /// 1 / x.
    pub fn recip(&self) -> Result<Tensor> {
        self.float_unary(UnaryOp::Recip)
    }
    /// 1 / (1 + e^-x), written so large |x| neither overflows nor produces NaN.
    pub fn sigmoid(&self) -> Result<Tensor> {
        self.float_unary(UnaryOp::Neg)?
            .exp()?
            .add_scalar(1.0)?
            .recip()
    }
    /// Round toward -inf (identity on integers).
    pub fn floor(&self) -> Result<Tensor> {
        let dt = self.dtype();
        self.apply1(Op::Unary(UnaryOp::Floor), dt)
    }
    /// Round toward +inf (identity on integers).
    pub fn ceil(&self) -> Result<Tensor> {
        let dt = self.dtype();
        self.apply1(Op::Unary(UnaryOp::Ceil), dt)
    }
    /// -x (floats and signed integers).
    pub fn neg(&self) -> Result<Tensor> {
        self.signed_unary(UnaryOp::Neg, "neg")
    }
    /// |x| (floats and signed integers; identity on u8).
    pub fn abs(&self) -> Result<Tensor> {
        if self.dtype() == DType::U8 {
            return Ok(self.clone());
        }
        self.signed_unary(UnaryOp::Abs, "abs")
    }
    fn signed_unary(&self, op: UnaryOp, name: &'static str) -> Result<Tensor> {
        if matches!(self.dtype(), DType::U8 | DType::Bool) {
            return Err(Error::UnsupportedDType {
                op: name,
                dtype: self.dtype(),
                hint: "; cast to a signed or float dtype first".into(),
            });
        }
        self.apply1(Op::Unary(op), self.dtype())
    }
    /// x * x.
    pub fn square(&self) -> Result<Tensor> {
        self.mul(self)
    }

    // ----- matmul -----

    /// Matrix product over the last two dims, batch dims broadcast (`torch.matmul`). A
    /// rank-1 operand is treated as a row (lhs) or column (rhs) vector and its dim dropped
    /// from the result.
    pub fn matmul(&self, rhs: &Tensor) -> Result<Tensor> {
        self.matmul_into(rhs, false)
    }

    /// [`Tensor::matmul`] whose products sum into the operands' accumulation dtype and stay
    /// there: 16-bit operands give f32, unrounded, for a layer that adds its bias to the sums
    /// before its one rounding (PyTorch's `addmm`). On PJRT devices that is one `dot_general`
    /// from the 16-bit operands into f32, the native form of TPU and GPU matrix units;
    /// eagerly the operands are widened first, which gives the same values.
    pub(crate) fn matmul_wide(&self, rhs: &Tensor) -> Result<Tensor> {
        self.matmul_into(rhs, true)
    }

    fn matmul_into(&self, rhs: &Tensor, wide: bool) -> Result<Tensor> {
        let name = "matmul";
        check_same_device(name, self, rhs)?;
        let (ra, rb) = (self.rank(), rhs.rank());
        if ra == 0 || rb == 0 {
            return Err(Error::ShapeMismatch {
                op: name,
                lhs: self.shape().to_vec(),
                rhs: rhs.shape().to_vec(),
                hint: "; both operands need at least one dim".into(),
            });
        }
        if ra == 1 {
            return self.unsqueeze(0)?.matmul_into(rhs, wide)?.squeeze(-2);
        }
        if rb == 1 {
            return self.matmul_into(&rhs.unsqueeze(1)?, wide)?.squeeze(-1);
        }
        let (a, b) = (self.shape(), rhs.shape());
        if a[ra - 1] != b[rb - 2] {
            return Err(Error::ShapeMismatch {
                op: name,
                lhs: a.to_vec(),
                rhs: b.to_vec(),
                hint: format!("; contraction dims differ ({} vs {})", a[ra - 1], b[rb - 2]),
            });
        }
        broadcast_shape(name, &a[..ra - 2], &b[..rb - 2]).map_err(|_| Error::ShapeMismatch {
            op: name,
            lhs: a.to_vec(),
            rhs: b.to_vec(),
            hint: "; batch dims do not broadcast".into(),
        })?;
        let dt = DType::promote(self.dtype(), rhs.dtype());
        if !dt.is_float() {
            return Err(Error::UnsupportedDType {
                op: name,
                dtype: dt,
                hint: "; matmul runs on float dtypes, cast first".into(),
            });
        }
        let out = if wide { dt.accumulation() } else { dt };
        // candle multiplies in its operands' dtype, so eagerly they widen first.
        let operands = if self.lazy().is_some() { dt } else { out };
        let x = self.cast(operands)?;
        let y = rhs.cast(operands)?;
        Tensor::apply(Op::Matmul, &[&x, &y], out)
    }

    // ----- reductions -----

    fn reduce_dims(&self, name: &'static str, dims: &[isize]) -> Result<Dims> {
        let mut out = Dims::new();
        for &d in dims {
            let a = self.axis(name, d)?;
            if out.contains(&a) {
                return Err(Error::InvalidArgument {
                    op: name,
                    msg: format!("dim {d} listed twice for shape {:?}", self.shape()),
                });
            }
            out.push(a);
        }
        Ok(out)
    }

    /// Sum over `dims` (integers and bool sum as i64, 16-bit floats accumulate in f32, as
    /// PyTorch does).
    pub fn sum(&self, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        let dims = self.reduce_dims("sum", dims)?;
        let out = if self.dtype().is_float() {
            self.dtype()
        } else {
            DType::I64
        };
        let x = self.cast(self.dtype().accumulation().max_int64())?;
        let acc = x.dtype();
        x.apply1(
            Op::Reduce {
                op: ReduceOp::Sum,
                dims,
                keepdim,
            },
            acc,
        )?
        .into_dtype(out)
    }

    /// Sum of every element (0-d result).
    pub fn sum_all(&self) -> Result<Tensor> {
        let all: Vec<isize> = (0..self.rank() as isize).collect();
        self.sum(&all, false)
    }

    /// Mean over `dims`; float dtypes only, as in PyTorch.
    pub fn mean(&self, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        let name = "mean";
        if !self.dtype().is_float() {
            return Err(Error::UnsupportedDType {
                op: name,
                dtype: self.dtype(),
                hint: "; cast to a float dtype first".into(),
            });
        }
        let ds = self.reduce_dims(name, dims)?;
        let n: usize = ds.iter().map(|&d| self.shape()[d]).product();
        let x = self.cast(self.dtype().accumulation())?;
        let acc = x.dtype();
        x.apply1(
            Op::Reduce {
                op: ReduceOp::Sum,
                dims: ds,
                keepdim,
            },
            acc,
        )?
        .affine(1.0 / n as f64, 0.0)?
        .into_dtype(self.dtype())
    }

    /// Variance over `dims` with `correction` (1 = unbiased, PyTorch's default; 0 = biased).
    pub fn var(&self, dims: &[isize], keepdim: bool, correction: usize) -> Result<Tensor> {
        let name = "var";
        if !self.dtype().is_float() {
            return Err(Error::UnsupportedDType {
                op: name,
                dtype: self.dtype(),
                hint: "; cast to a float dtype first".into(),
            });
        }
        let ds = self.reduce_dims(name, dims)?;
        let n: usize = ds.iter().map(|&d| self.shape()[d]).product();
        let x = self.cast(self.dtype().accumulation())?;
        let mean = x.mean(dims, true)?;
        let d = x.sub(&mean)?;
        let acc = x.dtype();
        // n <= correction divides by zero (or less); PyTorch yields inf/nan there too.
        let denom = n as f64 - correction as f64;
        d.mul(&d)?
            .apply1(
                Op::Reduce {
                    op: ReduceOp::Sum,
                    dims: ds,
                    keepdim,
                },
                acc,
            )?
            .affine(1.0 / denom, 0.0)?
            .into_dtype(self.dtype())
    }

    fn extreme(
        &self,
        op: ReduceOp,
        name: &'static str,
        dims: &[isize],
        keepdim: bool,
    ) -> Result<Tensor> {
        let ds = self.reduce_dims(name, dims)?;
        if ds.iter().any(|&d| self.shape()[d] == 0) {
            return Err(Error::InvalidArgument {
                op: name,
                msg: format!("reducing an empty dim of shape {:?}", self.shape()),
            });
        }
        self.apply1(
            Op::Reduce {
                op,
                dims: ds,
                keepdim,
            },
            self.dtype(),
        )
    }
    /// Maximum over `dims`.
    pub fn max(&self, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        self.extreme(ReduceOp::Max, "max", dims, keepdim)
    }
    /// Minimum over `dims`.
    pub fn min(&self, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        self.extreme(ReduceOp::Min, "min", dims, keepdim)
    }
    /// Index (i64) of the maximum along `dim` (first one on ties).
    pub fn argmax(&self, dim: isize, keepdim: bool) -> Result<Tensor> {
        self.arg_extreme(true, "argmax", dim, keepdim)
    }
    /// Index (i64) of the minimum along `dim` (first one on ties).
    pub fn argmin(&self, dim: isize, keepdim: bool) -> Result<Tensor> {
        self.arg_extreme(false, "argmin", dim, keepdim)
    }
    fn arg_extreme(
        &self,
        max: bool,
        name: &'static str,
        dim: isize,
        keepdim: bool,
    ) -> Result<Tensor> {
        let d = self.axis(name, dim)?;
        if self.shape()[d] == 0 {
            return Err(Error::InvalidArgument {
                op: name,
                msg: format!("reducing an empty dim of shape {:?}", self.shape()),
            });
        }
        self.apply1(
            Op::ArgReduce {
                max,
                dim: d,
                keepdim,
            },
            DType::I64,
        )
    }

    /// Numerically stable softmax along `dim` (max subtracted first), computed in f32 for
    /// 16-bit inputs; the result has the input's float dtype.
    pub fn softmax(&self, dim: isize) -> Result<Tensor> {
        let name = "softmax";
        let d = self.axis(name, dim)?;
        if self.shape()[d] == 0 {
            return Err(Error::InvalidArgument {
                op: name,
                msg: format!("softmax over an empty dim of shape {:?}", self.shape()),
            });
        }
        let out = self.dtype().float_or_default();
        self.cast(out)?
            .apply1(Op::Composite(Composite::Softmax { dim: d }), out)
    }

    /// Numerically stable log-softmax along `dim`: `x - max - log(sum(exp(x - max)))`.
    pub fn log_softmax(&self, dim: isize) -> Result<Tensor> {
        let out = self.dtype().float_or_default();
        let x = self.cast(out.accumulation())?;
        let s = x.sub(&x.max(&[dim], true)?)?;
        let lse = s.exp()?.sum(&[dim], true)?.log()?;
        s.sub(&lse)?.into_dtype(out)
    }

    /// Inclusive prefix sum along `dim` (integers and bool accumulate as i64, 16-bit floats
    /// in f32). Runs as log2(n) shifted adds, which every backend has.
    pub fn cumsum(&self, dim: isize) -> Result<Tensor> {
        let d = self.axis("cumsum", dim)?;
        let n = self.shape()[d];
        let out = if self.dtype().is_float() {
            self.dtype()
        } else {
            DType::I64
        };
        let mut x = self.to_dtype(self.dtype().accumulation().max_int64())?;
        let mut shift = 1;
        while shift < n {
            let head = x.narrow(d as isize, 0, n - shift)?;
            let shifted = head.pad(d as isize, shift, 0, 0.0)?;
            x = x.add(&shifted)?;
            shift *= 2;
        }
        x.into_dtype(out)
    }

    /// The `k` largest values along `dim` and their indices (i64), largest first.
    pub fn topk(&self, k: usize, dim: isize) -> Result<(Tensor, Tensor)> {
        let name = "topk";
        let d = self.axis(name, dim)?;
        let n = self.shape()[d];
        if k > n {
            return Err(Error::InvalidArgument {
                op: name,
                msg: format!(
                    "k = {k} exceeds the size {n} of dim {dim} in shape {:?}",
                    self.shape()
                ),
            });
        }
        let last = self.rank() - 1;
        let x = if d == last {
            self.clone()
        } else {
            self.transpose(d as isize, -1)?
        };
        let idx = x.apply1(Op::ArgSortLastDim { descending: true }, DType::I64)?;
        let idx = idx.narrow(-1, 0, k)?.contiguous()?;
        let vals = x.gather(-1, &idx)?;
        if d == last {
            Ok((vals, idx))
        } else {
            Ok((
                vals.transpose(d as isize, -1)?,
                idx.transpose(d as isize, -1)?,
            ))
        }
    }
}

impl DType {
    /// The wider of two scalar-promoted dtypes (used when one op takes two scalars).
    fn max_float(self, other: DType) -> DType {
        DType::promote(self, other)
    }

    /// Integers and bool widen to i64 (PyTorch's accumulation type for sums).
    fn max_int64(self) -> DType {
        if self.is_float() {
            self
        } else {
            DType::I64
        }
    }
}
