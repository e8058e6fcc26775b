//! Softmax over the last dim of a contiguous f32 CPU tensor in one parallel pass, for any CPU.
//!
//! The composite it replaces runs five candle kernels (max, difference, `exp`, sum,
//! quotient), each a pass over the tensor, `exp` a C library call per value. Where no fused
//! attention kernel takes the scores (below AVX2: Arm, older x86), a prefill's softmax ran
//! that way. This is plain Rust over 8-wide groups, which the compiler turns into the
//! target's vectors (NEON, SSE2): `exp` is the x86 kernels' Cephes polynomial (within about
//! an ulp of `expf`), its rounding to an integer done by adding 1.5 · 2²³ (a `round` call is
//! a library call without SSE4.1), and each row is scaled by its sum's reciprocal, as
//! PyTorch's own vectorised softmax does.

use super::kernels::{par_fill, EXP_LN2, EXP_POLY};

/// Values per group of the vectorised loops (two SSE or NEON registers, one AVX register).
const W: usize = 8;

/// Values per parallel unit (whole rows).
const UNIT: usize = 16 * 1024;

/// `softmax(x, -1)` of a contiguous f32 CPU tensor; `None` for other dtypes, devices or
/// layouts.
pub(crate) fn last_dim(
    x: &candle_core::Tensor,
) -> Option<candle_core::Result<candle_core::Tensor>> {
    use candle_core::{CpuStorage, Storage};
    let d = *x.dims().last()?;
    let (storage, layout) = x.storage_and_layout();
    let (s, e) = layout.contiguous_offsets()?;
    let Storage::Cpu(CpuStorage::F32(v)) = &*storage else {
        return None;
    };
    let v = &v[s..e];
    if d == 0 || v.is_empty() {
        return None;
    }
    let y = par_fill(v.len(), (UNIT / d).max(1) * d, |a, e, out: *mut f32| {
        for (r, x) in v[a..e].chunks_exact(d).enumerate() {
            // SAFETY: `out` holds the e - a values a..e, whole rows of d.
            row(x, unsafe {
                std::slice::from_raw_parts_mut(out.add(r * d), d)
            });
        }
    });
    Some(candle_core::Tensor::from_vec(
        y,
        x.shape(),
        &candle_core::Device::Cpu,
    ))
}

/// One row: its max, `e^(x - max)` with their sum, then the scaling.
fn row(x: &[f32], y: &mut [f32]) {
    let (groups, tail) = (x.chunks_exact(W), x.len() % W);
    // A NaN anywhere makes the row NaN, as the composite (and PyTorch) give; `f32::max`
    // would skip it.
    let mut max = [f32::NEG_INFINITY; W];
    let mut nan = [0u32; W];
    for g in groups.clone() {
        let g: &[f32; W] = g.try_into().unwrap();
        for i in 0..W {
            max[i] = if g[i] > max[i] { g[i] } else { max[i] };
            nan[i] |= u32::from(g[i].is_nan());
        }
    }
    let mut m = max.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    for &v in &x[x.len() - tail..] {
        m = m.max(v);
        nan[0] |= u32::from(v.is_nan());
    }
    // And so does an infinite max: a row of -inf (every key masked) has no max to subtract,
    // and +inf - +inf is NaN. Past this, every difference is finite or -inf.
    if nan.iter().any(|&n| n != 0) || m.is_infinite() {
        y.fill(f32::NAN);
        return;
    }
    let total = exp_shifted(x, m, y);
    let inv = 1.0 / total;
    for v in y.iter_mut() {
        *v *= inv;
    }
}

/// `y[j] = e^(x[j] - m)` for a max `m` of `x` that is finite; returns their sum.
pub(crate) fn exp_shifted(x: &[f32], m: f32, y: &mut [f32]) -> f32 {
    let tail = x.len() % W;
    let mut sum = [0f32; W];
    for (yg, xg) in y.chunks_exact_mut(W).zip(x.chunks_exact(W)) {
        let (yg, xg): (&mut [f32; W], &[f32; W]) = (yg.try_into().unwrap(), xg.try_into().unwrap());
        let e = exp8(std::array::from_fn(|i| xg[i] - m));
        *yg = e;
        for i in 0..W {
            sum[i] += e[i];
        }
    }
    let mut total: f32 = sum.iter().sum();
    let n = x.len();
    // The tail as a group padded with -inf (whose exp is 0).
    let e = exp8(std::array::from_fn(|i| {
        x.get(n - tail + i).map_or(f32::NEG_INFINITY, |v| v - m)
    }));
    for (yv, ev) in y[n - tail..].iter_mut().zip(e) {
        *yv = ev;
        total += ev;
    }
    total
}

/// `e^x` of a group of finite or -inf values, each step over the whole group (which the
/// compiler keeps in vectors): within about an ulp of `expf`, by the x86 kernels'
/// polynomial; 0 below `e^-87.33` (under the smallest normal f32, as those kernels give: a
/// subnormal weight slows every product it enters).
#[inline(always)]
fn exp8(x: [f32; W]) -> [f32; W] {
    const ROUND: f32 = 12_582_912.0; // 1.5 · 2²³
    let x = x.map(|v| {
        if v < -87.33 {
            f32::NEG_INFINITY
        } else {
            v.min(88.37)
        }
    });
    let t = x.map(|v| v.max(-87.33) * std::f32::consts::LOG2_E + ROUND);
    let n = t.map(|v| v - ROUND);
    let r: [f32; W] =
        std::array::from_fn(|i| x[i].max(-87.33) - n[i] * EXP_LN2.0 - n[i] * EXP_LN2.1);
    let mut p = [EXP_POLY[0]; W];
    for c in &EXP_POLY[1..] {
        p = std::array::from_fn(|i| p[i] * r[i] + c);
    }
    std::array::from_fn(|i| {
        let k = t[i].to_bits() as i32 - ROUND.to_bits() as i32;
        let pow2 = f32::from_bits(((k + 127) << 23) as u32);
        let v = (p[i] * r[i] * r[i] + (r[i] + 1.0)) * pow2;
        if x[i] == f32::NEG_INFINITY {
            0.0
        } else {
            v
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Generator;

    /// Against f64 softmax: rows shorter and longer than a group, with tails, additive masks
    /// (f32's lowest), -inf masks, a NaN, a row of -inf; and `exp8` against `expf`.
    #[test]
    fn rows_match_the_f64_softmax() {
        let mut g = Generator::new(41);
        for d in [1, 3, 8, 13, 64, 517] {
            let rows = 7;
            let mut v: Vec<f32> = (0..rows * d)
                .map(|_| (g.next_f64() as f32 - 0.5) * 40.0)
                .collect();
            // Row 1 masked past its first half by f32::MIN, row 2 by -inf.
            for j in d / 2 + 1..d {
                v[d + j] = f32::MIN;
                v[2 * d + j] = f32::NEG_INFINITY;
            }
            v[3 * d + d / 2] = f32::NAN;
            v[4 * d..5 * d].fill(f32::NEG_INFINITY);
            let x = candle_core::Tensor::from_vec(v.clone(), (rows, d), &candle_core::Device::Cpu)
                .unwrap();
            let y = last_dim(&x).unwrap().unwrap().to_vec2::<f32>().unwrap();
            for (r, (yr, xr)) in y.iter().zip(v.chunks_exact(d)).enumerate() {
                if r == 3 || r == 4 {
                    assert!(yr.iter().all(|v| v.is_nan()), "row {r} of {d}: NaN");
                    continue;
                }
                // The difference rounds to f32 in every softmax; the rest is exact here.
                let m = xr.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
                let e: Vec<f64> = xr.iter().map(|&v| f64::from(v - m).exp()).collect();
                let s: f64 = e.iter().sum();
                for (j, (&got, want)) in yr.iter().zip(e.iter().map(|v| v / s)).enumerate() {
                    assert!(
                        (f64::from(got) - want).abs() <= 5e-7 * want + 1e-37,
                        "row {r} of {d}, {j}: {got} vs {want}"
                    );
                }
            }
        }
        for i in (0..20_000).step_by(W) {
            let x: [f32; W] = std::array::from_fn(|j| -87.0 + 175.0 * (i + j) as f32 / 20_000.0);
            for (x, got) in x.iter().zip(exp8(x)) {
                let want = x.exp();
                assert!((got - want).abs() <= 2.5e-7 * want, "{x}: {got} vs {want}");
            }
        }
        let edges = exp8([
            -90.0,
            f32::NEG_INFINITY,
            f32::MIN,
            -87.3,
            0.0,
            -0.0,
            1.0,
            88.0,
        ]);
        assert_eq!(edges[..3], [0.0; 3]);
        assert!(edges[3] > 0.0 && edges[4] == 1.0 && edges[5] == 1.0);
    }
}
