//! The quantized products of the AVX-512 tier (F/BW/VL + F16C), straight from GGUF blocks:
//! one-row dots with the sum regrouped, batched decode rows rebuilt once for all x rows,
//! and the AMX path's panels filled from Q4_0/Q4_1/Q8_0 blocks. Dispatched from `cpu/quant`.

use std::arch::x86_64::*;

use super::amx::Panel;
use super::blocks;
use crate::cpu::quant::{PassOut, QKind, QMatrix, GROUP};

/// `ys[r] = rows[r] · x` for each weight row of `rows` (its bytes and the bytes per row),
/// `sums` holding x's half-group sums.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(crate) unsafe fn dots_rows<const K: u8>(
    (rows, row_bytes): (&[u8], usize),
    x: &[f32],
    sums: &[f32],
    ys: &mut [f32],
) {
    for (row, y) in rows.chunks_exact(row_bytes).zip(ys) {
        *y = dots::<K>(row, x, sums);
    }
}

/// Each weight row of `rows` (its bytes and the bytes per row) times the real x rows of `x`
/// (the first `live`; the rest repeat one of them and are dropped), written to `y[i][r]`.
///
/// # Safety
/// The CPU has AVX-512F/BW/VL, FMA and F16C; the output holds these rows and columns, and no
/// other thread writes them.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(crate) unsafe fn rebuilt_rows<const K: u8, const R: usize>(
    (rows, row_bytes): (&[u8], usize),
    x: [&[f32]; R],
    (out, n, r0, i0, live): PassOut,
) {
    // Three weight rows at a time share each load of x: 24 accumulators, 6 weight
    // registers, one for x.
    const W: usize = 3;
    let count = rows.len() / row_bytes;
    let row = |r: usize| &rows[r * row_bytes..(r + 1) * row_bytes];
    let write = |r: usize, d: &[f32; R]| {
        for (i, v) in d.iter().take(live).enumerate() {
            *out.get().add((i0 + i) * n + r0 + r) = *v;
        }
    };
    let mut r = 0;
    while r + W <= count {
        let d = rebuilt_dots::<K, R, W>([row(r), row(r + 1), row(r + 2)], x);
        for (j, d) in d.iter().enumerate() {
            write(r + j, d);
        }
        r += W;
    }
    for r in r..count {
        write(r, &rebuilt_dots::<K, R, 1>([row(r)], x)[0]);
    }
}

/// `rows[r] · x[i]` for `W` weight rows and `R` vectors `x` (a batched decode step): each
/// group's 32 weights are rebuilt once as f32, `a * q + m` exactly as the hub dequantizes
/// them, then multiplied with every x row, each load of x serving all `W` weight rows.
/// The rebuilding is shared by the rows, where the regrouped sum of [`dots`] spends
/// one more operation per row and 16 weights, and a scalar offset sum: from two rows on,
/// rebuilding is the cheaper. SmolLM2 Q4_1 decoding 8 prompts at once: 213 -> 353 tok/s
/// (one prompt: 110), with x copied to a 64-byte boundary and written as `[m, rows]` by the
/// kernel (the transpose after the products had been serial).
#[inline(always)]
unsafe fn rebuilt_dots<const K: u8, const R: usize, const W: usize>(
    rows: [&[u8]; W],
    x: [&[f32]; R],
) -> [[f32; R]; W] {
    let kind = QKind::from_id(K);
    // One accumulator per weight row and x row (two FMAs per group each).
    let mut acc = [[_mm512_setzero_ps(); R]; W];
    for g in 0..x[0].len() / GROUP {
        let mut w = [[_mm512_setzero_ps(); 2]; W];
        for r in 0..W {
            blocks::prefetch_ahead(kind, rows[r], g);
            if matches!(kind, QKind::Q4_0 | QKind::Q4_1) {
                let (w0, w1) = blocks::weights16_by_table(kind, rows[r], g);
                w[r] = [w0, w1];
                continue;
            }
            let (f0, f1) = blocks::floats16(kind, rows[r], g);
            let (a, m) = blocks::scales(kind, rows[r], g);
            w[r] = [
                _mm512_mul_ps(_mm512_set1_ps(a[0]), f0),
                _mm512_mul_ps(_mm512_set1_ps(a[1]), f1),
            ];
            if kind.has_min() {
                w[r][0] = _mm512_add_ps(w[r][0], _mm512_set1_ps(m[0]));
                w[r][1] = _mm512_add_ps(w[r][1], _mm512_set1_ps(m[1]));
            }
        }
        for (i, x) in x.iter().enumerate() {
            let xp = x.as_ptr().add(g * GROUP);
            let (x0, x1) = (_mm512_loadu_ps(xp), _mm512_loadu_ps(xp.add(16)));
            for r in 0..W {
                acc[r][i] = _mm512_fmadd_ps(w[r][0], x0, acc[r][i]);
                acc[r][i] = _mm512_fmadd_ps(w[r][1], x1, acc[r][i]);
            }
        }
    }
    let mut out = [[0f32; R]; W];
    for r in 0..W {
        if R == 8 {
            let sums = sum8(std::array::from_fn(|i| acc[r][i]));
            out[r].copy_from_slice(&sums[..R]);
        } else {
            for i in 0..R {
                out[r][i] = _mm512_reduce_add_ps(acc[r][i]);
            }
        }
    }
    out
}

/// The lane sums of eight vectors, reduced together: quarters of pairs, then quarters of
/// quads, then within quarters (23 operations, where eight separate reductions take 64:
/// the batched kernel over SmolLM2's 576-wide rows ran 6% faster).
#[inline(always)]
unsafe fn sum8(v: [__m512; 8]) -> [f32; 8] {
    // [a.q0 + a.q2, a.q1 + a.q3, b.q0 + b.q2, b.q1 + b.q3] for pairs (a, b).
    let pair = |a: __m512, b: __m512| {
        _mm512_add_ps(
            _mm512_shuffle_f32x4::<0b01_00_01_00>(a, b),
            _mm512_shuffle_f32x4::<0b11_10_11_10>(a, b),
        )
    };
    // Quarter q: four partial sums of vector q of the quad.
    let quad = |ab: __m512, cd: __m512| {
        _mm512_add_ps(
            _mm512_shuffle_f32x4::<0b10_00_10_00>(ab, cd),
            _mm512_shuffle_f32x4::<0b11_01_11_01>(ab, cd),
        )
    };
    let lo = quad(pair(v[0], v[1]), pair(v[2], v[3]));
    let hi = quad(pair(v[4], v[5]), pair(v[6], v[7]));
    // Quarter q: [lo0 + lo2, hi0 + hi2, lo1 + lo3, hi1 + hi3], then its halves summed.
    let w = _mm512_add_ps(_mm512_unpacklo_ps(lo, hi), _mm512_unpackhi_ps(lo, hi));
    let r = _mm512_add_ps(w, _mm512_permute_ps::<0b01_00_11_10>(w));
    let mut lanes = [0f32; 16];
    _mm512_storeu_ps(lanes.as_mut_ptr(), r);
    std::array::from_fn(|i| lanes[4 * (i % 4) + i / 4])
}

/// `row · x` with 16-lane vectors: a group's 32 integers are widened, multiplied with x, and
/// the group's scale multiplies their sum.
///
/// Weights are `a * q + m` (see `cpu/quant/group.rs`); the products sum as `Σ a·(Σ q·x) + Σ m·(Σ x)`, the
/// sums of x per half-group (`sums`) computed once per call. That is the dequantized matrix's
/// product regrouped, at f32 rounding like any other summation order, and it spends
/// one and a half vector operations per 16 weights where rebuilding each weight spends two:
/// on two cores, a one-row decode is bound by that arithmetic, not by memory.
#[inline(always)]
unsafe fn dots<const K: u8>(row: &[u8], x: &[f32], sums: &[f32]) -> f32 {
    let groups = x.len() / GROUP;
    // Two accumulators, for even and odd groups: each takes one dependent FMA per two groups.
    let mut acc = [_mm512_setzero_ps(); 2];
    // The offsets' share, per accumulator.
    let mut off = [0f32; 2];
    let mut g = 0;
    while g + 2 <= groups {
        group_step::<K>(row, x, sums, g, &mut acc[0], &mut off[0]);
        group_step::<K>(row, x, sums, g + 1, &mut acc[1], &mut off[1]);
        g += 2;
    }
    if g < groups {
        group_step::<K>(row, x, sums, g, &mut acc[0], &mut off[0]);
    }
    _mm512_reduce_add_ps(_mm512_add_ps(acc[0], acc[1])) + (off[0] + off[1])
}

/// Group `g` of [`dots`] into one of its accumulators and offset sums.
///
/// # Safety
/// As [`dots`], whose features this compiles with (always inlined; a closure would
/// compile without them).
#[inline(always)]
unsafe fn group_step<const K: u8>(
    row: &[u8],
    x: &[f32],
    sums: &[f32],
    g: usize,
    acc: &mut __m512,
    off: &mut f32,
) {
    let kind = QKind::from_id(K);
    blocks::prefetch_ahead(kind, row, g);
    let (f0, f1) = blocks::floats16(kind, row, g);
    let (a, m) = blocks::scales(kind, row, g);
    let xp = x.as_ptr().add(g * GROUP);
    let (x0, x1) = (_mm512_loadu_ps(xp), _mm512_loadu_ps(xp.add(16)));
    if kind.split_scales() {
        let t = _mm512_mul_ps(f0, x0);
        *acc = _mm512_fmadd_ps(_mm512_set1_ps(a[0]), t, *acc);
        let t = _mm512_mul_ps(f1, x1);
        *acc = _mm512_fmadd_ps(_mm512_set1_ps(a[1]), t, *acc);
    } else {
        let t = _mm512_fmadd_ps(f1, x1, _mm512_mul_ps(f0, x0));
        *acc = _mm512_fmadd_ps(_mm512_set1_ps(a[0]), t, *acc);
    }
    if kind.has_min() {
        let s = sums.as_ptr().add(2 * g);
        *off += if kind.split_scales() {
            m[0] * *s + m[1] * *s.add(1)
        } else {
            m[0] * (*s + *s.add(1))
        };
    }
}

/// `QMatrix::fill_panel` for its first `cols` columns of `q`: per block and 16 columns, each
/// column's 32 values become one register of bf16 pairs, and a 16 × 16 transpose turns
/// those into the panel's k-pair rows; the 16 blocks' leading f16 fields (scale, and
/// minimum for Q4_1) are gathered as one vector.
#[target_feature(enable = "avx512f,avx512bw,f16c")]
pub(crate) unsafe fn fill_pairs(q: &QMatrix, g: usize, cols: usize, p: &mut Panel) {
    use super::amx::{bf16_int, BLOCK, GROUP};
    // bf16 of each nibble (Q4_0 centred on 8), indexed by vpermw.
    let lut: [u16; 32] =
        std::array::from_fn(|v| bf16_int(v as i32 - if q.kind() == QKind::Q4_0 { 8 } else { 0 }));
    let lut = _mm512_loadu_si512(lut.as_ptr() as *const __m512i);
    let bb = q.kind().block_bytes();
    let column = |blk: *const u8| -> __m512i {
        match q.kind() {
            QKind::Q4_0 | QKind::Q4_1 => {
                let qs = _mm_loadu_si128(blk.add(bb - 16) as *const __m128i);
                let low = _mm_set1_epi8(0x0f);
                let lo = _mm_and_si128(qs, low);
                let hi = _mm_and_si128(_mm_srli_epi16::<4>(qs), low);
                let idx = _mm512_cvtepu8_epi16(_mm256_set_m128i(hi, lo));
                _mm512_permutexvar_epi16(idx, lut)
            }
            QKind::Q8_0 => {
                let bf = |o: usize| {
                    let q = _mm512_cvtepi8_epi32(_mm_loadu_si128(blk.add(o) as *const __m128i));
                    let f = _mm512_castps_si512(_mm512_cvtepi32_ps(q));
                    _mm512_cvtepi32_epi16(_mm512_srli_epi32::<16>(f))
                };
                _mm512_inserti64x4::<1>(_mm512_castsi256_si512(bf(2)), bf(18))
            }
            _ => unreachable!("`matmul_t_each` sends only `on_tiles` types to the tiles"),
        }
    };
    let o = p.pairs.as_mut_ptr();
    let row_bytes = q.row_bytes();
    // Byte offsets of 16 consecutive rows' first block.
    let rows16 = _mm512_mullo_epi32(
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
        _mm512_set1_epi32(row_bytes as i32),
    );
    for b in 0..q.cols() / BLOCK {
        for ct in 0..GROUP / 16 {
            let live = cols.saturating_sub(ct * 16).min(16);
            let first = (g * GROUP + ct * 16).min(q.rows() - 1);
            let base = q.data().as_ptr().add(first * row_bytes + b * bb);
            // Absent columns stay zero (their rows are not read).
            let fields = _mm512_mask_i32gather_epi32::<1>(
                _mm512_setzero_si512(),
                ((1u32 << live) - 1) as u16,
                rows16,
                base as *const i32,
            );
            let at = b * GROUP + ct * 16;
            let f16s = |v: __m512i| _mm512_cvtph_ps(_mm512_cvtepi32_epi16(v));
            _mm512_storeu_ps(p.scale.as_mut_ptr().add(at), f16s(fields));
            let min = if q.kind() == QKind::Q4_1 {
                f16s(_mm512_srli_epi32::<16>(fields))
            } else {
                _mm512_setzero_ps()
            };
            _mm512_storeu_ps(p.min.as_mut_ptr().add(at), min);
            let mut r: [__m512i; 16] = std::array::from_fn(|c| {
                if ct * 16 + c < cols {
                    column(q.row(g * GROUP + ct * 16 + c).as_ptr().add(b * bb))
                } else {
                    _mm512_setzero_si512()
                }
            });
            super::avx512::transpose16(&mut r);
            for (kp, v) in r.iter().enumerate() {
                let dst = o.add((b * BLOCK / 2 + kp) * GROUP + ct * 16);
                _mm512_storeu_si512(dst as *mut __m512i, *v);
            }
        }
    }
}
