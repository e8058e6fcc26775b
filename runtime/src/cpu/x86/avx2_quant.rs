//! The quantized products of the AVX2 tier (AVX2 + FMA + F16C), straight from GGUF blocks:
//! one-row dots, batched decode rows, rows rebuilt as f32. Dispatched from `cpu/quant`.

use std::arch::x86_64::*;

use super::avx2::hsum256;
use super::blocks;
use crate::cpu::quant::{PassOut, QKind, GROUP};

/// `ys[r] = rows[r] · x` for each weight row of `rows` (its bytes and the bytes per row) on
/// AVX2, `sums` holding x's half-group sums: `avx512_quant::dots`'s regrouped sum in 8-lane
/// vectors, each group's integers widened and multiplied with x before its scale applies.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dots_rows<const K: u8>(
    (rows, row_bytes): (&[u8], usize),
    x: &[f32],
    sums: &[f32],
    ys: &mut [f32],
) {
    let kind = QKind::from_id(K);
    for (row, y) in rows.chunks_exact(row_bytes).zip(ys) {
        // Even and odd groups in two accumulators (one dependent FMA per two groups each).
        let mut acc = [_mm256_setzero_ps(); 2];
        let mut off = 0f32;
        for g in 0..x.len() / GROUP {
            blocks::prefetch_ahead(kind, row, g);
            let q = blocks::ints::<false>(kind, row, g);
            let (a, m) = blocks::scales(kind, row, g);
            let xp = x.as_ptr().add(g * GROUP);
            let halves = [_mm256_castsi256_si128(q), _mm256_extracti128_si256::<1>(q)];
            // q · x over each half-group (16 weights), 8 lanes of partial sums.
            let half = |h: usize| {
                let lo = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(halves[h]));
                let hi = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128::<8>(halves[h])));
                let t = _mm256_mul_ps(lo, _mm256_loadu_ps(xp.add(16 * h)));
                _mm256_fmadd_ps(hi, _mm256_loadu_ps(xp.add(16 * h + 8)), t)
            };
            let (t0, t1) = (half(0), half(1));
            let a_acc = &mut acc[g % 2];
            if kind.split_scales() {
                *a_acc = _mm256_fmadd_ps(_mm256_set1_ps(a[0]), t0, *a_acc);
                *a_acc = _mm256_fmadd_ps(_mm256_set1_ps(a[1]), t1, *a_acc);
            } else {
                *a_acc = _mm256_fmadd_ps(_mm256_set1_ps(a[0]), _mm256_add_ps(t0, t1), *a_acc);
            }
            if kind.has_min() {
                off += m[0] * sums[2 * g] + m[1] * sums[2 * g + 1];
            }
        }
        *y = hsum256(_mm256_add_ps(acc[0], acc[1])) + off;
    }
}

/// `avx512_quant::rebuilt_rows` on AVX2 (a batched decode step): each group's 32 weights rebuilt once
/// in four 8-lane registers, `a * q + m` as the hub dequantizes them, and multiplied with
/// every x row, one accumulator per x row (13 registers at 8 rows). Rebuilding a row once
/// for all the x rows, where the few-row fallback wrote each rebuilt row to memory and read
/// it back per x row.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C; the output holds these rows and columns, and no other
/// thread writes them.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn rebuilt_rows<const K: u8, const R: usize>(
    (rows, row_bytes): (&[u8], usize),
    x: [&[f32]; R],
    (out, n, r0, i0, live): PassOut,
) {
    let kind = QKind::from_id(K);
    for (r, row) in rows.chunks_exact(row_bytes).enumerate() {
        let mut acc = [_mm256_setzero_ps(); R];
        for g in 0..x[0].len() / GROUP {
            blocks::prefetch_ahead(kind, row, g);
            let w = blocks::weights8(kind, row, g);
            for (a, x) in acc.iter_mut().zip(x) {
                let xp = x.as_ptr().add(g * GROUP);
                for (j, wj) in w.iter().enumerate() {
                    *a = _mm256_fmadd_ps(*wj, _mm256_loadu_ps(xp.add(8 * j)), *a);
                }
            }
        }
        for (i, a) in acc.iter().enumerate().take(live) {
            *out.get().add((i0 + i) * n + r0 + r) = hsum256(*a);
        }
    }
}

/// One row written out as f32.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dequant_row<const K: u8>(row: &[u8], out: &mut [f32]) {
    let kind = QKind::from_id(K);
    for (g, y) in out.chunks_exact_mut(GROUP).enumerate() {
        for (i, w) in blocks::weights8(kind, row, g).into_iter().enumerate() {
            _mm256_storeu_ps(y.as_mut_ptr().add(8 * i), w);
        }
    }
}
