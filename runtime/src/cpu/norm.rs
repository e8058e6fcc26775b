//! Row norms over the last dim (`Tensor::rms_norm`, `Tensor::layer_norm`) of an f32 or bf16
//! CPU tensor, in one parallel pass: each row's statistics in f32, then the row scaled.
//!
//! The composites they replace run five and seven candle ops (products, sums, a square root,
//! differences), each a serial pass over the whole tensor with an allocation of its own: in a
//! FLUX.1-shaped step on two threads the norms ran on one while the other waited. The steps
//! here are the composites' (`x · 1/sqrt(mean(x²) + eps)`; `(x - mean) · 1/sqrt(mean((x -
//! mean)²) + eps)`), rounded where they round, but each sum runs in 16 lanes reduced at the
//! end, an order candle's sums do not share: results agree to f32 rounding, not bit for bit.

use half::bf16;

#[cfg(target_arch = "x86_64")]
use super::features;
use super::kernels::{par_fill, with_slice, Stored};
#[cfg(target_arch = "x86_64")]
use super::x86::avx512::Lane;
use crate::{DType, Device, Tensor};

/// Which norm.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Norm {
    /// `x / sqrt(mean(x²) + eps)`, in the input's dtype.
    Rms,
    /// `(x - mean) / sqrt(var + eps)`, in f32 (the composite's accumulation dtype, which
    /// `Tensor::layer_norm` applies its weight and bias in).
    Layer,
}

/// Values per parallel unit, in whole rows: enough to amortise handing the unit out.
const UNIT_VALUES: usize = 16 * 1024;

/// `norm` over the last dim of `x` (contiguous, on the CPU, f32 or bf16), or `None` where
/// this pass does not apply and the composite runs.
pub(crate) fn norm_last(x: &Tensor, norm: Norm, eps: f64) -> Option<crate::Result<Tensor>> {
    let n = *x.shape().last()?;
    if n == 0 || x.device() != Device::Cpu {
        return None;
    }
    #[cfg(target_arch = "x86_64")]
    {
        if !features::avx2() {
            return None;
        }
        if !features::avx512() {
            // The `avx2` tier: f32 rows only (bf16 takes the composite).
            if x.dtype() != DType::F32 {
                return None;
            }
            return with_slice(x, |v: &[f32]| {
                let y = par_fill(
                    v.len(),
                    (UNIT_VALUES / n).max(1) * n,
                    |a, e, out: *mut f32| {
                        for (i, row) in v[a..e].chunks_exact(n).enumerate() {
                            // SAFETY: AVX2 and FMA were detected; `out` holds this chunk's e - a
                            // outputs, row i of them n values.
                            unsafe {
                                super::x86::avx2::norm_row(
                                    row,
                                    out.add(i * n),
                                    norm == Norm::Layer,
                                    eps,
                                )
                            }
                        }
                    },
                );
                Tensor::from_vec(y, x.shape(), &Device::Cpu)
            });
        }
        fn go<T: Lane + Stored, O: Lane + Stored>(
            x: &Tensor,
            n: usize,
            norm: Norm,
            eps: f64,
        ) -> Option<crate::Result<Tensor>> {
            with_slice(x, |v: &[T]| {
                // Chunks of whole rows.
                let y = par_fill(
                    v.len(),
                    (UNIT_VALUES / n).max(1) * n,
                    |a, e, out: *mut O| {
                        for (i, row) in v[a..e].chunks_exact(n).enumerate() {
                            // SAFETY: AVX-512F was detected; `out` holds this chunk's e - a
                            // outputs, row i of them n values.
                            unsafe {
                                super::x86::avx512::norm_row(
                                    row,
                                    out.add(i * n),
                                    norm == Norm::Layer,
                                    eps,
                                )
                            }
                        }
                    },
                );
                Tensor::from_vec(y, x.shape(), &Device::Cpu)
            })
        }
        match (x.dtype(), norm) {
            (DType::F32, _) => go::<f32, f32>(x, n, norm, eps),
            (DType::BF16, Norm::Rms) => go::<bf16, bf16>(x, n, norm, eps),
            (DType::BF16, Norm::Layer) => go::<bf16, f32>(x, n, norm, eps),
            _ => None,
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (norm, eps);
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::features::{taken, Tier};
    use crate::op::Op;
    use crate::random::Generator;

    fn close(a: &[f32], b: &[f32], what: &str) {
        assert_eq!(a.len(), b.len(), "{what}: lengths");
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            assert!(
                (x - y).abs() <= 1e-5 + 1e-5 * y.abs(),
                "{what}: value {i}: {x} vs {y}"
            );
        }
    }

    /// The fused rows against the composites on the runtime's ops (the path every other
    /// device and dtype takes), over row lengths on and off the 16-lane grid, a row of one,
    /// rows far from zero mean and rows many enough to split across units.
    #[test]
    fn rows_match_the_composites() {
        crate::cpu::features::each_tier(|tier| {
            use crate::composite::Composite;
            let mut g = Generator::new(5);
            for (rows, n) in [
                (3usize, 64usize),
                (5, 37),
                (2, 1),
                (4, 16),
                (700, 40),
                (2, 3072),
            ] {
                let x = g
                    .randn(&[rows, n], DType::F32, &Device::Cpu)
                    .unwrap()
                    .affine(3.0, 5.0)
                    .unwrap();
                for (norm, eps) in [(Norm::Rms, 1e-6), (Norm::Layer, 1e-5)] {
                    let composite = match norm {
                        Norm::Rms => Composite::RmsNorm { eps },
                        Norm::Layer => Composite::LayerNorm { eps },
                    };
                    let slow = x
                        .apply1(Op::Composite(composite), DType::F32)
                        .unwrap()
                        .to_vec::<f32>()
                        .unwrap();
                    let Some(fast) =
                        taken(norm_last(&x, norm, eps), tier >= Tier::Avx2, "norm_last")
                    else {
                        continue;
                    };
                    let fast = fast.unwrap();
                    assert_eq!(fast.dtype(), DType::F32);
                    close(
                        &fast.to_vec::<f32>().unwrap(),
                        &slow,
                        &format!("{norm:?} {rows}x{n}"),
                    );
                    // bf16 in: rms stays bf16 (rounded once), layer comes out in f32.
                    let xb = x.to_dtype(DType::BF16).unwrap();
                    let out = match norm {
                        Norm::Rms => DType::BF16,
                        Norm::Layer => DType::F32,
                    };
                    let slow = xb.apply1(Op::Composite(composite), out).unwrap();
                    // bf16 rows at the `avx512` tier and up (`avx2` takes f32 only).
                    let Some(fast) = taken(
                        norm_last(&xb, norm, eps),
                        tier >= Tier::Avx512,
                        "norm_last bf16",
                    ) else {
                        continue;
                    };
                    let fast = fast.unwrap();
                    assert_eq!(fast.dtype(), slow.dtype(), "{norm:?}: dtype");
                    let (f, s) = (
                        fast.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap(),
                        slow.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap(),
                    );
                    for (i, (a, b)) in f.iter().zip(&s).enumerate() {
                        // One bf16 rounding apart at most.
                        assert!(
                            (a - b).abs() <= 1e-5 + b.abs() / 128.0,
                            "{norm:?} bf16 {rows}x{n}: value {i}: {a} vs {b}"
                        );
                    }
                }
            }
        });
    }
}
