//! One-query attention (a decode step) on any CPU: the scores of each query head straight
//! from the cached keys, the softmax and the weighted sum of the values in one pass per kv
//! head, in plain Rust the compiler vectorises for the target (NEON, SSE2).
//!
//! Below AVX2 (Arm, older x86) no fused kernel took a decode's attention, and the composite
//! ran two batched products per layer through the GEMM library, each a few rows wide, with
//! the cached keys and values copied to dense layouts first: in a batched decode those
//! products and copies were most of a step. The tiers above run `kernels::attention`.

use super::kernels::{par_units, visible_runs, OutPtr};
use super::softmax::exp_shifted;

/// Values per group of the vectorised loops.
const W: usize = 8;

/// An f32 tensor's values from its first element and its strides over its leading dims
/// (the last is contiguous).
pub(crate) type Strided<'a, const N: usize> = (&'a [f32], [usize; N]);

/// `softmax(q kᵀ · scale + bias) v` for one query per row: `q [B, H, 1, D]`, `k`, `v [B, KV,
/// L, D]` (query head `h` reads kv head `h / (H / KV)`), `bias [B, 1, 1, L]` (strides of B);
/// returns `[B, 1, H * D]`. Keys whose mask is f32's lowest are skipped (a paged cache's
/// row sees its own blocks of a shared pool), unless every key is (then all are computed,
/// as the composite does).
pub(crate) fn attention(
    (q, qs): Strided<3>,
    (k, ks): Strided<3>,
    (v, vs): Strided<3>,
    bias: Option<Strided<1>>,
    [b, h, kv, l, d]: [usize; 5],
    scale: f32,
) -> Vec<f32> {
    let rep = h / kv;
    let mut out: Vec<f32> = Vec::with_capacity(b * h * d);
    let op = OutPtr(out.as_mut_ptr());
    par_units(b * kv, |u| {
        let (bi, g) = (u / kv, u % kv);
        let mask = bias.map(|(m, ms)| &m[bi * ms[0]..][..l]);
        let mut runs = Vec::new();
        match mask {
            Some(row) => {
                let lo = row.iter().position(|&x| x != f32::MIN).unwrap_or(0);
                let hi = l - row.iter().rev().position(|&x| x != f32::MIN).unwrap_or(0);
                visible_runs(row, (lo, hi.max(lo)), &mut runs);
            }
            None => runs.push((0, l)),
        }
        let keys = |j: usize| &k[bi * ks[0] + g * ks[1] + j * ks[2]..][..d];
        let values = |j: usize| &v[bi * vs[0] + g * vs[1] + j * vs[2]..][..d];
        let n: usize = runs.iter().map(|(a, e)| e - a).sum();
        let (mut s, mut e) = (Vec::with_capacity(n), vec![0f32; n]);
        for r in 0..rep {
            let hq = g * rep + r;
            let qrow = &q[bi * qs[0] + hq * qs[1]..][..d];
            s.clear();
            for &(a, end) in &runs {
                for j in a..end {
                    let m = mask.map_or(0.0, |row| row[j]);
                    s.push(dot(qrow, keys(j)) * scale + m);
                }
            }
            // SAFETY: unit u alone writes the rep heads of kv head g in batch row bi.
            let o = unsafe { op.part((bi * h + hq) * d, d) };
            o.fill(0.0);
            let max = s.iter().fold(f32::NEG_INFINITY, |a, &x| a.max(x));
            if !max.is_finite() || s.iter().any(|x| x.is_nan()) {
                o.fill(f32::NAN);
                continue;
            }
            let total = exp_shifted(&s, max, &mut e);
            let mut at = 0;
            for &(a, end) in &runs {
                for j in a..end {
                    let w = e[at];
                    at += 1;
                    for (o, x) in o.iter_mut().zip(values(j)) {
                        *o += w * x;
                    }
                }
            }
            // The softmax's division, on the d outputs instead of the keys.
            for o in o.iter_mut() {
                *o /= total;
            }
        }
    });
    // SAFETY: the units wrote every head of every row.
    unsafe { out.set_len(b * h * d) };
    out
}

/// `a · b` in W partial sums.
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let (ac, bc) = (a.chunks_exact(W), b.chunks_exact(W));
    let tail: f32 = ac
        .remainder()
        .iter()
        .zip(bc.remainder())
        .map(|(x, y)| x * y)
        .sum();
    let mut acc = [0f32; W];
    for (x, y) in ac.zip(bc) {
        let (x, y): (&[f32; W], &[f32; W]) = (x.try_into().unwrap(), y.try_into().unwrap());
        for i in 0..W {
            acc[i] += x[i] * y[i];
        }
    }
    acc.iter().sum::<f32>() + tail
}
