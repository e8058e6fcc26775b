//! Elementwise `+ - * /` of f32 or bf16 CPU tensors where one operand repeats along the
//! other's leading dims (`x * (1 + scale[:, None]) + shift[:, None]`, a bias row), in one
//! parallel pass.
//!
//! Candle runs a broadcast operand on the calling thread: a diffusion transformer's
//! modulations and gates were, after its norms and joins, the largest serial stretch of its
//! step. Each value is computed in f32 and rounded once to the dtype, as candle's bf16 ops
//! round, so results are the same bit for bit.

#[cfg(target_arch = "x86_64")]
use super::features;
use super::kernels::{par_fill, with_slice, Stored};
#[cfg(target_arch = "x86_64")]
use super::x86::avx512::Lane;
use crate::op::BinaryOp;
use crate::{DType, Device, Tensor};

/// Output values per parallel unit.
const UNIT: usize = 16 * 1024;

/// `a op b` where one of them has the output's shape and the other a suffix of it (leading
/// dims of 1 dropped) of at least 16 values, or `None` where this pass does not apply.
pub(crate) fn binary(a: &Tensor, b: &Tensor, op: BinaryOp) -> Option<crate::Result<Tensor>> {
    if a.device() != Device::Cpu || b.device() != Device::Cpu || a.dtype() != b.dtype() {
        return None;
    }
    if !matches!(
        op,
        BinaryOp::Add | BinaryOp::Sub | BinaryOp::Mul | BinaryOp::Div
    ) {
        return None;
    }
    // The full operand and the repeated one (its values, as a suffix of the full shape).
    let (full, part, part_left) = if suffix(b.shape(), a.shape()) {
        (a, b, false)
    } else if suffix(a.shape(), b.shape()) {
        (b, a, true)
    } else {
        return None;
    };
    let n: usize = full.shape().iter().product();
    let m: usize = part.shape().iter().product();
    // Same-shape operands already run in parallel in candle; small ones are not worth a
    // region, and repeats shorter than a vector would run lane by lane.
    if m == n || m < 16 || n < 2 * UNIT {
        return None;
    }
    #[cfg(target_arch = "x86_64")]
    {
        if !features::avx512() {
            return None;
        }
        fn go<T: Lane + Stored>(
            full: &Tensor,
            part: &Tensor,
            (op, part_left): (BinaryOp, bool),
            (n, m): (usize, usize),
        ) -> Option<crate::Result<Tensor>> {
            with_slice(full, |f: &[T]| {
                with_slice(part, |p: &[T]| {
                    // Chunks of whole repeats, so each walks its rows against the whole of `p`.
                    let y = par_fill(n, (UNIT / m).max(1) * m, |s, e, out| {
                        // SAFETY: AVX-512F was detected; `out` holds the e - s outputs s..e,
                        // read from f[s..e] and p (s is a multiple of m).
                        unsafe { rows(&f[s..e], p, out, op, part_left) }
                    });
                    Tensor::from_vec(y, full.shape(), &Device::Cpu)
                })
            })
            .flatten()
        }
        let dims = (n, m);
        match full.dtype() {
            DType::F32 => go::<f32>(full, part, (op, part_left), dims),
            DType::BF16 => go::<half::bf16>(full, part, (op, part_left), dims),
            _ => None,
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = part_left;
        None
    }
}

/// bf16 `a + b` and `a * b` of candle CPU tensors (any layout, broadcasting) as PyTorch
/// computes them: each pair widened to f32, combined, rounded once to the nearest bf16 (ties
/// to even). Off x86-64 candle's own kernels for these two (NEON, on aarch64) keep the top
/// half of the f32 result instead of rounding it, one bf16 ulp low in about half of the
/// values that are not exact, where PyTorch (and candle on x86) round. Widening and
/// narrowing are exact and candle's f32 arithmetic is IEEE, so this is the rounded result
/// bit for bit. `None` for other dtypes and ops (candle's scalar loops round).
#[cfg(not(target_arch = "x86_64"))]
pub(crate) fn bf16_rounded(
    op: BinaryOp,
    a: &candle_core::Tensor,
    b: &candle_core::Tensor,
) -> Option<candle_core::Result<candle_core::Tensor>> {
    use candle_core::DType as C;
    if a.dtype() != C::BF16 || b.dtype() != C::BF16 || !a.device().is_cpu() {
        return None;
    }
    let combine = match op {
        BinaryOp::Add => candle_core::Tensor::broadcast_add,
        BinaryOp::Mul => candle_core::Tensor::broadcast_mul,
        _ => return None,
    };
    Some((|| {
        combine(&a.to_dtype(C::F32)?, &b.to_dtype(C::F32)?)?.to_dtype(C::BF16)
    })())
}

/// Whether `small` (leading 1s dropped) is a suffix of `big` and has no more dims than it,
/// so that the broadcast's shape is `big`'s.
fn suffix(small: &[usize], big: &[usize]) -> bool {
    let lead = small.iter().take_while(|&&d| d == 1).count();
    small.len() <= big.len() && big.ends_with(&small[lead..])
}

/// `f op p` (or `p op f` when `part_left`) over `f`, `p` repeated along it, into `y`.
///
/// # Safety
/// AVX-512F is available, `f.len()` is a multiple of `p.len()` and `y` holds `f.len()` values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn rows<T: Lane>(f: &[T], p: &[T], y: *mut T, op: BinaryOp, part_left: bool) {
    use std::arch::x86_64::*;
    let m = p.len();
    let apply = |x: __m512, q: __m512| {
        let (l, r) = if part_left { (q, x) } else { (x, q) };
        match op {
            BinaryOp::Add => _mm512_add_ps(l, r),
            BinaryOp::Sub => _mm512_sub_ps(l, r),
            BinaryOp::Mul => _mm512_mul_ps(l, r),
            _ => _mm512_div_ps(l, r),
        }
    };
    for (i, row) in f.chunks_exact(m).enumerate() {
        let out = y.add(i * m);
        let mut j = 0;
        while j < m {
            let k = m - j;
            let v = apply(
                T::load16(row.as_ptr().add(j), k),
                T::load16(p.as_ptr().add(j), k),
            );
            T::store16(out.add(j), k, v);
            j += 16;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::features::{taken, Tier};
    use crate::random::Generator;

    /// Every op, either side repeated, f32 and bf16: the same bits as the backend's own
    /// broadcast; shapes this pass does not take are left to it.
    #[test]
    fn repeated_operands_match_the_backend_bit_for_bit() {
        crate::cpu::features::each_tier(|tier| {
            let mut g = Generator::new(13);
            for (big, small) in [
                (vec![1usize, 384, 256], vec![1usize, 1, 256]),
                (vec![2, 300, 70], vec![70]),
                (vec![3, 40, 500], vec![40, 500]),
            ] {
                for dtype in [DType::F32, DType::BF16] {
                    let x = g.randn(&big, DType::F32, &Device::Cpu).unwrap();
                    let x = x.to_dtype(dtype).unwrap();
                    let s = g.randn(&small, DType::F32, &Device::Cpu).unwrap();
                    let s = s.affine(1.0, 3.0).unwrap().to_dtype(dtype).unwrap();
                    for op in [BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div] {
                        for (l, r) in [(&x, &s), (&s, &x)] {
                            let slow =
                                Tensor::apply(crate::op::Op::Binary(op), &[l, r], dtype).unwrap();
                            // Where the pass does not run, the op's own path gives the backend's.
                            let fast = match taken(binary(l, r, op), tier >= Tier::Avx512, "binary")
                            {
                                Some(fast) => fast.unwrap(),
                                None => match op {
                                    BinaryOp::Add => l.add(r),
                                    BinaryOp::Sub => l.sub(r),
                                    BinaryOp::Mul => l.mul(r),
                                    _ => l.div(r),
                                }
                                .unwrap(),
                            };
                            assert_eq!(fast.shape(), slow.shape());
                            let bits = |t: &Tensor| {
                                t.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap()
                            };
                            let (f, s) = (bits(&fast), bits(&slow));
                            assert!(
                                f.iter().zip(&s).all(|(a, b)| a.to_bits() == b.to_bits()),
                                "{op:?} {big:?} with {small:?}, {dtype:?}"
                            );
                        }
                    }
                }
            }
            let x = Tensor::zeros(&[64, 64, 64], DType::F32, &Device::Cpu).unwrap();
            let col = Tensor::zeros(&[64, 1], DType::F32, &Device::Cpu).unwrap();
            assert!(binary(&x, &col, BinaryOp::Add).is_none(), "not a suffix");
            assert!(binary(&x, &x, BinaryOp::Add).is_none(), "same shape");
            // More dims than the full operand: the broadcast's shape is not the full one's.
            let rows = Tensor::zeros(&[384, 256], DType::F32, &Device::Cpu).unwrap();
            let wide = Tensor::zeros(&[1, 1, 256], DType::F32, &Device::Cpu).unwrap();
            assert!(binary(&rows, &wide, BinaryOp::Add).is_none(), "higher rank");
            assert_eq!(rows.add(&wide).unwrap().shape(), [1, 384, 256]);
            let one = Tensor::zeros(&[1], DType::F32, &Device::Cpu).unwrap();
            assert!(
                binary(&x, &one, BinaryOp::Add).is_none(),
                "shorter than a vector"
            );
        });
    }

    /// bf16 sums and products through the op (whichever path takes them on this CPU and tier:
    /// contiguous, broadcast, strided, a scalar) round as PyTorch's do, element by element.
    #[test]
    fn bf16_sums_and_products_round_to_nearest() {
        crate::cpu::features::each_tier(|_tier| {
            let mut g = Generator::new(21);
            let mut bf = |shape: &[usize]| {
                let t = g.randn(shape, DType::F32, &Device::Cpu).unwrap();
                t.to_dtype(DType::BF16).unwrap()
            };
            let x = bf(&[3, 37, 40]);
            let cases = [
                (x.clone(), bf(&[3, 37, 40])),
                (x.clone(), bf(&[40])),
                (x.clone(), bf(&[37, 1])),
                (x.clone(), bf(&[1])),
                (x.transpose(1, 2).unwrap(), bf(&[37])),
                (x.narrow(2, 3, 20).unwrap(), bf(&[3, 37, 20])),
            ];
            for (a, b) in cases {
                let shape = crate::tensor::broadcast_shape("test", a.shape(), b.shape()).unwrap();
                let flat = |t: &Tensor| -> Vec<f32> {
                    let t = t
                        .broadcast_as(&shape)
                        .unwrap()
                        .to_dtype(DType::F32)
                        .unwrap();
                    t.to_vec::<f32>().unwrap()
                };
                let (va, vb) = (flat(&a), flat(&b));
                for (op, f) in [
                    (BinaryOp::Add, (|p, q| p + q) as fn(f32, f32) -> f32),
                    (BinaryOp::Mul, |p, q| p * q),
                ] {
                    let got = Tensor::apply(crate::op::Op::Binary(op), &[&a, &b], DType::BF16)
                        .unwrap()
                        .to_dtype(DType::F32)
                        .unwrap()
                        .to_vec::<f32>()
                        .unwrap();
                    for (i, (&p, &q)) in va.iter().zip(&vb).enumerate() {
                        let want = half::bf16::from_f32(f(p, q)).to_f32();
                        assert_eq!(
                            got[i].to_bits(),
                            want.to_bits(),
                            "{op:?} {:?} by {:?}, value {i}: {p} and {q}",
                            a.shape(),
                            b.shape()
                        );
                    }
                }
            }
        });
    }
}
