//! Composite ops: the normalisations, softmax, rotary embedding and attention.
//!
//! A composite is one [`Op`] with one fixed expansion into primitives, written once here
//! against [`Prims`]. The eager backend runs the expansion op by op on candle tensors; the
//! StableHLO lowering emits it into the program; a lazy graph records the composite as a
//! single node. So both backends round exactly as the expansion says, and a decoder step
//! records a few nodes per layer where the primitives alone would take dozens: recording,
//! tracing and hashing a graph cost per node.

use std::hash::{Hash, Hasher};

use crate::dims::Dims;
use crate::op::{BinaryOp, Op, ReduceOp, UnaryOp};
use crate::ops::RopeStyle;
use crate::tensor::broadcast_shape;
use crate::{DType, Error, Result};

/// A composite op. Inputs are validated and cast by `Tensor` code first, as for every
/// [`Op`]; the input lists are documented per variant.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Composite {
    /// `[x]`, float: `x / sqrt(mean(x^2) + eps)` over the last dim, computed in x's
    /// accumulation dtype and returned in x's dtype.
    RmsNorm { eps: f64 },
    /// `[x]`, float: `(x - mean) / sqrt(var + eps)` over the last dim (biased variance),
    /// computed and returned in x's accumulation dtype.
    LayerNorm { eps: f64 },
    /// `[x]`, float: softmax along `dim`, max subtracted first, computed in x's accumulation
    /// dtype and returned in x's dtype.
    Softmax { dim: usize },
    /// `[x, cos, sin]`, one float dtype: rotates the first `2 * cos.last` channels of x's
    /// last dim in pairs; the rest pass through. `cos`/`sin` broadcast to x's shape with the
    /// last dim replaced by the pair count.
    Rotary(RopeStyle),
    /// `[q, k, v]` then the masks [`Attention`] names: scaled dot-product attention.
    Attention(Attention),
}

/// Scaled dot-product attention over `q [B, Hq, Lq, D]`, `k [B, Hkv, Lk, D]`,
/// `v [B, Hkv, Lk, Dv]` (one float dtype, `Hq` a multiple of `Hkv`) → `[B, Hq, Lq, Dv]`.
/// Scores are computed in the input dtype, scaled, capped and masked in the accumulation
/// dtype, softmaxed, and cast back for the value product (HF's eager attention).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Attention {
    pub scale: f64,
    /// `cap * tanh(scores / cap)` before masking.
    pub softcap: Option<f64>,
    /// The fourth input, if any: a mask broadcasting to `[B, Hq, Lq, Lk]`.
    pub mask: Option<MaskKind>,
    /// A last input: an additive mask in the accumulation dtype (causal or sliding-window
    /// positions), added after `mask`.
    pub positions: bool,
    /// Round the scores to the input dtype after the product, the scale, the cap and the
    /// mask, as transformers' eager attention does in 16-bit (each is a 16-bit tensor op
    /// there); otherwise they stay in the accumulation dtype until the softmax.
    pub round_scores: bool,
    /// Multiply f32 copies of q and k (GPT-2's `reorder_and_upcast_attn`).
    pub upcast_scores: bool,
}

/// How an attention mask applies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum MaskKind {
    /// Bool, true where a query may attend; elsewhere the score becomes -inf.
    Keep,
    /// Float, added to the scores (cast to the accumulation dtype first).
    Additive,
}

/// The primitives an expansion is written in, over one backend's values.
pub(crate) trait Prims {
    type V: Clone;
    fn shape(v: &Self::V) -> &[usize];
    fn dtype(v: &Self::V) -> DType;
    /// Applies primitive `op` to operands it accepts as they are; `dt` is the result dtype.
    fn prim(&mut self, op: Op, ins: &[&Self::V], dt: DType) -> Result<Self::V>;
    /// A 0-d constant on `like`'s device.
    fn scalar(&mut self, v: f64, dt: DType, like: &Self::V) -> Result<Self::V>;
    /// `softmax(x, -1)` of an f32 value in one kernel, where the backend has one; `None`
    /// expands it into primitives.
    fn softmax_last(&mut self, _x: &Self::V) -> Option<Result<Self::V>> {
        None
    }
}

impl Composite {
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Composite::RmsNorm { .. } => "rms_norm",
            Composite::LayerNorm { .. } => "layer_norm",
            Composite::Softmax { .. } => "softmax",
            Composite::Rotary(_) => "apply_rotary",
            Composite::Attention(_) => "scaled_dot_product_attention",
        }
    }

    /// The number of inputs.
    pub(crate) fn arity(&self) -> usize {
        match self {
            Composite::Rotary(_) => 3,
            Composite::Attention(a) => 3 + a.mask.is_some() as usize + a.positions as usize,
            _ => 1,
        }
    }

    /// Everything that changes the expansion, floats by their bits.
    pub(crate) fn hash<H: Hasher>(&self, h: &mut H) {
        std::mem::discriminant(self).hash(h);
        match self {
            Composite::RmsNorm { eps } | Composite::LayerNorm { eps } => eps.to_bits().hash(h),
            Composite::Softmax { dim } => dim.hash(h),
            Composite::Rotary(style) => style.hash(h),
            Composite::Attention(a) => {
                a.scale.to_bits().hash(h);
                a.softcap.map(f64::to_bits).hash(h);
                a.mask.hash(h);
                a.positions.hash(h);
                a.round_scores.hash(h);
                a.upcast_scores.hash(h);
            }
        }
    }

    /// The output shape over inputs of shapes `ins` (as many as [`Composite::arity`]),
    /// refusing operands the expansion cannot take.
    pub(crate) fn shape(&self, ins: &[&[usize]]) -> Result<Dims> {
        let name = self.name();
        let bad = |lhs: &[usize], rhs: &[usize], hint: &str| Error::ShapeMismatch {
            op: name,
            lhs: lhs.to_vec(),
            rhs: rhs.to_vec(),
            hint: format!("; {hint}"),
        };
        if ins.len() != self.arity() {
            return Err(Error::InvalidArgument {
                op: name,
                msg: format!("{} operands given, {} expected", ins.len(), self.arity()),
            });
        }
        let x = ins[0];
        match self {
            Composite::RmsNorm { .. } | Composite::LayerNorm { .. } => {
                if x.is_empty() {
                    return Err(bad(x, &[], "normalising needs at least one dim"));
                }
                Ok(Dims::from(x))
            }
            Composite::Softmax { dim } => {
                if *dim >= x.len() {
                    return Err(Error::DimOutOfRange {
                        op: name,
                        dim: *dim as isize,
                        shape: x.to_vec(),
                    });
                }
                Ok(Dims::from(x))
            }
            Composite::Rotary(_) => {
                let (cos, sin) = (ins[1], ins[2]);
                if cos != sin || x.len() < 2 || cos.is_empty() {
                    return Err(bad(cos, sin, "cos and sin must have one shape, x 2+ dims"));
                }
                let half = cos[cos.len() - 1];
                if half == 0 || 2 * half > x[x.len() - 1] {
                    return Err(bad(x, cos, "the rotary pairs do not fit the last dim"));
                }
                let mut pairs = Dims::from(x);
                *pairs.last_mut().unwrap_or(&mut 0) = half;
                if broadcast_shape(name, &pairs, cos)? != pairs {
                    return Err(bad(x, cos, "cos/sin must broadcast to x's leading dims"));
                }
                Ok(Dims::from(x))
            }
            Composite::Attention(_) => {
                let (k, v) = (ins[1], ins[2]);
                if x.len() != 4 || k.len() != 4 || v.len() != 4 {
                    return Err(bad(
                        x,
                        k,
                        "q, k and v must be [batch, heads, len, head_dim]",
                    ));
                }
                if k[0] != x[0] || k[3] != x[3] || v[..3] != k[..3] {
                    return Err(bad(
                        x,
                        k,
                        "q, k and v must share batch, k and v heads and length, q and k head_dim",
                    ));
                }
                if k[1] == 0 || !x[1].is_multiple_of(k[1]) {
                    return Err(bad(
                        x,
                        k,
                        "query heads must be a multiple of key/value heads",
                    ));
                }
                let scores = [x[0], x[1], x[2], k[2]];
                for m in &ins[3..] {
                    if broadcast_shape(name, &scores, m)?.as_slice() != scores {
                        return Err(bad(&scores, m, "masks must broadcast to the scores"));
                    }
                }
                Ok(Dims::from([x[0], x[1], x[2], v[3]]))
            }
        }
    }

    /// Runs the expansion over `ins` with `p`'s primitives. The operands must pass
    /// [`Composite::shape`].
    pub(crate) fn expand<P: Prims>(&self, p: &mut P, ins: &[&P::V]) -> Result<P::V> {
        let mut b = Build { p };
        let x = ins[0];
        match *self {
            Composite::RmsNorm { eps } => {
                let out = P::dtype(x);
                let x = b.cast(x, out.accumulation())?;
                let sq = b.bin(BinaryOp::Mul, &x, &x)?;
                let ms = b.mean_last(&sq)?;
                let r = b.rsqrt_plus(&ms, eps)?;
                let y = b.bin(BinaryOp::Mul, &x, &r)?;
                b.cast(&y, out)
            }
            Composite::LayerNorm { eps } => {
                let x = b.cast(x, P::dtype(x).accumulation())?;
                let mean = b.mean_last(&x)?;
                let xc = b.bin(BinaryOp::Sub, &x, &mean)?;
                let sq = b.bin(BinaryOp::Mul, &xc, &xc)?;
                let var = b.mean_last(&sq)?;
                let r = b.rsqrt_plus(&var, eps)?;
                b.bin(BinaryOp::Mul, &xc, &r)
            }
            Composite::Softmax { dim } => b.softmax(x, dim),
            Composite::Rotary(style) => b.rotary(x, ins[1], ins[2], style),
            Composite::Attention(a) => b.attention(&a, ins),
        }
    }
}

fn missing(what: &str) -> Error {
    Error::InvalidArgument {
        op: "scaled_dot_product_attention",
        msg: format!("{what} is not among the inputs"),
    }
}

/// Expansion helpers: each primitive with the dtype rule `Tensor` code would apply.
struct Build<'p, P: Prims> {
    p: &'p mut P,
}

impl<P: Prims> Build<'_, P> {
    fn op(&mut self, op: Op, ins: &[&P::V], dt: DType) -> Result<P::V> {
        self.p.prim(op, ins, dt)
    }

    fn cast(&mut self, x: &P::V, dt: DType) -> Result<P::V> {
        if P::dtype(x) == dt {
            return Ok(x.clone());
        }
        self.op(Op::Cast(dt), &[x], dt)
    }

    fn un(&mut self, u: UnaryOp, x: &P::V) -> Result<P::V> {
        self.op(Op::Unary(u), &[x], P::dtype(x))
    }

    fn bin(&mut self, op: BinaryOp, a: &P::V, b: &P::V) -> Result<P::V> {
        self.op(Op::Binary(op), &[a, b], P::dtype(a))
    }

    fn affine(&mut self, x: &P::V, mul: f64, add: f64) -> Result<P::V> {
        self.op(Op::Affine { mul, add }, &[x], P::dtype(x))
    }

    fn reduce(&mut self, op: ReduceOp, x: &P::V, dim: usize) -> Result<P::V> {
        let r = Op::Reduce {
            op,
            dims: Dims::from([dim]),
            keepdim: true,
        };
        self.op(r, &[x], P::dtype(x))
    }

    fn reshape(&mut self, x: &P::V, shape: &[usize]) -> Result<P::V> {
        if P::shape(x) == shape {
            return Ok(x.clone());
        }
        self.op(Op::Reshape(Dims::from(shape)), &[x], P::dtype(x))
    }

    fn narrow(&mut self, x: &P::V, dim: usize, start: usize, len: usize) -> Result<P::V> {
        if start == 0 && len == P::shape(x)[dim] {
            return Ok(x.clone());
        }
        self.op(Op::Narrow { dim, start, len }, &[x], P::dtype(x))
    }

    fn cat(&mut self, xs: &[&P::V], dim: usize) -> Result<P::V> {
        self.op(Op::Concat { dim }, xs, P::dtype(xs[0]))
    }

    /// Mean over the last dim, kept: a sum, then a multiplication by `1 / n`.
    fn mean_last(&mut self, x: &P::V) -> Result<P::V> {
        let last = P::shape(x).len() - 1;
        let n = P::shape(x)[last];
        let s = self.reduce(ReduceOp::Sum, x, last)?;
        self.affine(&s, 1.0 / n as f64, 0.0)
    }

    /// `1 / sqrt(x + eps)`.
    fn rsqrt_plus(&mut self, x: &P::V, eps: f64) -> Result<P::V> {
        let v = self.affine(x, 1.0, eps)?;
        let s = self.un(UnaryOp::Sqrt, &v)?;
        self.un(UnaryOp::Recip, &s)
    }

    fn softmax(&mut self, x: &P::V, dim: usize) -> Result<P::V> {
        let out = P::dtype(x);
        let x = self.cast(x, out.accumulation())?;
        if dim + 1 == P::shape(&x).len() && P::dtype(&x) == DType::F32 {
            if let Some(y) = self.p.softmax_last(&x) {
                return self.cast(&y?, out);
            }
        }
        let m = self.reduce(ReduceOp::Max, &x, dim)?;
        let d = self.bin(BinaryOp::Sub, &x, &m)?;
        let e = self.un(UnaryOp::Exp, &d)?;
        let s = self.reduce(ReduceOp::Sum, &e, dim)?;
        let y = self.bin(BinaryOp::Div, &e, &s)?;
        self.cast(&y, out)
    }

    /// `(a c - b s, b c + a s)`: one pair rotated.
    fn rotate(&mut self, a: &P::V, b: &P::V, c: &P::V, s: &P::V) -> Result<(P::V, P::V)> {
        let (ac, bs) = (
            self.bin(BinaryOp::Mul, a, c)?,
            self.bin(BinaryOp::Mul, b, s)?,
        );
        let oa = self.bin(BinaryOp::Sub, &ac, &bs)?;
        let (bc, as_) = (
            self.bin(BinaryOp::Mul, b, c)?,
            self.bin(BinaryOp::Mul, a, s)?,
        );
        let ob = self.bin(BinaryOp::Add, &bc, &as_)?;
        Ok((oa, ob))
    }

    fn rotary(&mut self, x: &P::V, c: &P::V, s: &P::V, style: RopeStyle) -> Result<P::V> {
        let last = P::shape(x).len() - 1;
        let d = P::shape(x)[last];
        let half = *P::shape(c).last().unwrap_or(&0);
        let r = 2 * half;
        let rot = self.narrow(x, last, 0, r)?;
        let rotated = match style {
            RopeStyle::RotateHalf => {
                let x1 = self.narrow(&rot, last, 0, half)?;
                let x2 = self.narrow(&rot, last, half, half)?;
                let (o1, o2) = self.rotate(&x1, &x2, c, s)?;
                self.cat(&[&o1, &o2], last)?
            }
            RopeStyle::Interleaved => {
                // [.., r] as [.., pairs, 2]: a pair's channels are neighbours.
                let lead = &P::shape(&rot)[..last];
                let pairs: Vec<usize> = lead.iter().copied().chain([half, 2]).collect();
                let one: Vec<usize> = lead.iter().copied().chain([half, 1]).collect();
                let flat: Vec<usize> = lead.iter().copied().chain([half]).collect();
                let p = self.reshape(&rot, &pairs)?;
                let a = self.narrow(&p, last + 1, 0, 1)?;
                let a = self.reshape(&a, &flat)?;
                let b = self.narrow(&p, last + 1, 1, 1)?;
                let b = self.reshape(&b, &flat)?;
                let (oa, ob) = self.rotate(&a, &b, c, s)?;
                let (oa, ob) = (self.reshape(&oa, &one)?, self.reshape(&ob, &one)?);
                let st = self.cat(&[&oa, &ob], last + 1)?;
                let mut rshape = flat;
                rshape[last] = r;
                self.reshape(&st, &rshape)?
            }
        };
        if r == d {
            return Ok(rotated);
        }
        let pass = self.narrow(x, last, r, d - r)?;
        self.cat(&[&rotated, &pass], last)
    }

    /// Shares each key/value head with `rep` query heads (`repeat_interleave` on dim 1).
    /// A mask that broadcasts to the scores `[B, Hkv * rep, Lq, Lk]`, viewed so that it
    /// broadcasts to the grouped scores `[B, Hkv, rep, Lq, Lk]`.
    fn group_mask(&mut self, m: &P::V, hkv: usize, rep: usize) -> Result<P::V> {
        let s = P::shape(m);
        let mut m4 = vec![1; 4 - s.len().min(4)];
        m4.extend_from_slice(s);
        let heads = if m4[1] == 1 { [1, 1] } else { [hkv, rep] };
        self.reshape(m, &[m4[0], heads[0], heads[1], m4[2], m4[3]])
    }

    fn attention(&mut self, a: &Attention, ins: &[&P::V]) -> Result<P::V> {
        let (q, k, v) = (ins[0], ins[1], ins[2]);
        let dt = P::dtype(q);
        let acc = dt.accumulation();
        // Where the scores live between steps: each step computes in `acc` and, with
        // `round_scores`, rounds to the input dtype as a 16-bit PyTorch op would.
        let keep = if a.round_scores { dt } else { acc };
        let (qs, ks) = (P::shape(q), P::shape(k));
        let (b, hq, lq, d, hkv, lk) = (qs[0], qs[1], qs[2], qs[3], ks[1], ks[2]);
        let rep = hq / hkv;
        // The `rep` query heads that share a key/value head are stacked along the query
        // axis, so one batched product per kv head serves them all: HF's `repeat_kv` gives
        // the same sums from `rep` copies of k and v, which this never makes.
        let q = self.reshape(q, &[b, hkv, rep * lq, d])?;
        let (q, k, sdt) = if a.upcast_scores {
            (self.cast(&q, acc)?, self.cast(k, acc)?, acc)
        } else {
            (q, k.clone(), dt)
        };
        let kt = self.op(Op::Permute(Dims::from([0, 1, 3, 2])), &[&k], sdt)?;
        let s = self.op(Op::Matmul, &[&q, &kt], sdt)?;
        let s = self.cast(&s, acc)?;
        let s = self.affine(&s, a.scale, 0.0)?;
        let mut s = self.cast(&s, keep)?;
        if let Some(cap) = a.softcap {
            // Three PyTorch ops (`/ cap`, `tanh`, `* cap`), each rounding to `keep`; the
            // division is a true division, as in transformers.
            let s32 = self.cast(&s, acc)?;
            let c = self.p.scalar(cap, acc, &s32)?;
            let t = self.bin(BinaryOp::Div, &s32, &c)?;
            let t = self.cast(&t, keep)?;
            let t = self.cast(&t, acc)?;
            let t = self.un(UnaryOp::Tanh, &t)?;
            let t = self.cast(&t, keep)?;
            let t = self.cast(&t, acc)?;
            let t = self.affine(&t, cap, 0.0)?;
            s = self.cast(&t, keep)?;
        }
        let s = self.cast(&s, acc)?;
        // Masks apply per query head: the scores viewed as `[B, Hkv, rep, Lq, Lk]`.
        let grouped = [b, hkv, rep, lq, lk];
        let mut s = if rep > 1 {
            self.reshape(&s, &grouped)?
        } else {
            s
        };
        let mut masks = ins[3..].iter();
        if let Some(kind) = a.mask {
            let m = masks.next().ok_or_else(|| missing("the mask"))?;
            let m = &if rep > 1 {
                self.group_mask(m, hkv, rep)?
            } else {
                (*m).clone()
            };
            s = match kind {
                MaskKind::Keep => {
                    let neg = self.p.scalar(f64::NEG_INFINITY, acc, &s)?;
                    self.op(Op::Where, &[m, &s, &neg], acc)?
                }
                MaskKind::Additive => {
                    let m = self.cast(m, acc)?;
                    let sum = self.bin(BinaryOp::Add, &s, &m)?;
                    let sum = self.cast(&sum, keep)?;
                    self.cast(&sum, acc)?
                }
            };
        }
        if a.positions {
            let m = masks.next().ok_or_else(|| missing("the position mask"))?;
            s = self.bin(BinaryOp::Add, &s, m)?;
        }
        let last = P::shape(&s).len() - 1;
        let pr = self.softmax(&s, last)?;
        let pr = self.cast(&pr, dt)?;
        let pr = self.reshape(&pr, &[b, hkv, rep * lq, lk])?;
        let out = self.op(Op::Matmul, &[&pr, v], dt)?;
        let dv = P::shape(&out)[3];
        self.reshape(&out, &[b, hq, lq, dv])
    }
}
