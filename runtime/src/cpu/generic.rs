//! Products of the generic tier (Arm, x86 below AVX2) in plain Rust over groups of 8 values,
//! which the compiler turns into the target's vectors (NEON, SSE2).
//!
//! A batched decode step multiplies a few rows by each weight. Through the GEMM library
//! each call packed its operands for a handful of rows, a third of the step; here each
//! weight row is loaded once for up to four x rows, as the x86 tiers' `dots_few` do.

use super::kernels::OutPtr;

/// Values per group.
const W: usize = 8;

/// `y[i0 + i][r0 + r] = xs[i] · rows[r]` (`y` row-major with `n` columns at `out`) for each
/// weight row of `rows` (row-major, `xs[0].len()` columns) and each of the `X` rows `xs`.
///
/// # Safety
/// `out` holds the rows `i0..i0 + X` of `n` columns, and no other thread writes columns
/// `r0..r0 + rows` of them.
pub(crate) unsafe fn dots_few<const X: usize>(
    rows: &[f32],
    xs: [&[f32]; X],
    out: OutPtr,
    n: usize,
    (i0, r0): (usize, usize),
) {
    let k = xs[0].len();
    let body = k - k % W;
    for (r, w) in rows.chunks_exact(k).enumerate() {
        let mut acc = [[0f32; W]; X];
        for c in (0..body).step_by(W) {
            let wg: &[f32; W] = w[c..c + W].try_into().unwrap();
            for (a, x) in acc.iter_mut().zip(&xs) {
                let xg: &[f32; W] = x[c..c + W].try_into().unwrap();
                for l in 0..W {
                    a[l] += xg[l] * wg[l];
                }
            }
        }
        for (i, (a, x)) in acc.iter().zip(&xs).enumerate() {
            let tail: f32 = w[body..].iter().zip(&x[body..]).map(|(p, q)| p * q).sum();
            *out.get().add((i0 + i) * n + r0 + r) = a.iter().sum::<f32>() + tail;
        }
    }
}
