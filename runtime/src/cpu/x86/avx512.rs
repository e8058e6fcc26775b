//! The `avx512` tier's f32 kernels (AVX-512 F, 16-lane vectors in 32 registers, and
//! AVX-512 BF16 pairs): the GEMV and few-row products, panel packing, the 14×32 GEMM
//! register tiles, attention's key dots, softmax pieces and narrow probability × v
//! products, and the gated activations. [`super::super::kernels`] dispatches to them where
//! [`features::avx512`](crate::cpu::features::avx512) holds (each caller checks); the
//! `avx2` tier's siblings are in [`super::avx2`]. Also the 16-lane f32/bf16 loads and stores
//! ([`Lane`]) every AVX-512 elementwise loop shares, and those loops: bf16 conversions and
//! broadcasting arithmetic (`cpu::bf16`), row norms (`cpu::norm`), the rotary rotation
//! (`cpu::rotary`).

use half::bf16;

use crate::cpu::kernels::{NarrowPv, OutPtr, Tile, EXP_LN2, EXP_POLY, MR, NR, PACKED_A};

/// Writes a tile's rows of sums (`$lo`: columns 0..16, `$hi`: 16..32) to `$t.c`, added to
/// what is there when `$t.accumulate`. A macro, not a function: the accumulators must stay
/// in registers (a call took them through memory).
macro_rules! store_tile {
    ($t:expr, $lo:expr, $hi:expr) => {
        for i in 0..$lo.len() {
            let c = $t.c.add(i * $t.ldc);
            if $t.accumulate {
                $lo[i] = _mm512_add_ps($lo[i], _mm512_loadu_ps(c));
                $hi[i] = _mm512_add_ps($hi[i], _mm512_loadu_ps(c.add(16)));
            }
            _mm512_storeu_ps(c, $lo[i]);
            _mm512_storeu_ps(c.add(16), $hi[i]);
        }
    };
}

/// Lanes `0..min(n, 16)` of a 16-lane register: the mask of a loop's last, partial step.
#[inline]
pub(crate) fn tail_mask(n: usize) -> std::arch::x86_64::__mmask16 {
    if n >= 16 {
        0xFFFF
    } else {
        ((1u32 << n) - 1) as u16
    }
}

/// `ys[r] = rows[r] · x` as [`super::avx2::dot_rows`], 16 lanes wide: eight rows at a time share each
/// load of x, so eight weight streams are in flight per thread.
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn dot_rows(rows: &[f32], x: &[f32], ys: &mut [f32]) {
    use std::arch::x86_64::*;
    const R: usize = 8;
    let k = x.len();
    let vk = k / 16 * 16;
    let xp = x.as_ptr();
    let tail = |p: *const f32| -> f32 {
        x[vk..]
            .iter()
            .enumerate()
            .map(|(o, &xv)| *p.add(vk + o) * xv)
            .sum()
    };
    let mut r = 0;
    while r + R <= ys.len() {
        let p: [*const f32; R] = std::array::from_fn(|j| rows.as_ptr().add((r + j) * k));
        let mut acc = [_mm512_setzero_ps(); R];
        let mut i = 0;
        while i < vk {
            let xv = _mm512_loadu_ps(xp.add(i));
            for j in 0..R {
                acc[j] = _mm512_fmadd_ps(_mm512_loadu_ps(p[j].add(i)), xv, acc[j]);
            }
            i += 16;
        }
        for j in 0..R {
            ys[r + j] = _mm512_reduce_add_ps(acc[j]) + tail(p[j]);
        }
        r += R;
    }
    while r < ys.len() {
        let p = rows.as_ptr().add(r * k);
        let mut acc = _mm512_setzero_ps();
        let mut i = 0;
        while i < vk {
            acc = _mm512_fmadd_ps(_mm512_loadu_ps(p.add(i)), _mm512_loadu_ps(xp.add(i)), acc);
            i += 16;
        }
        ys[r] = _mm512_reduce_add_ps(acc) + tail(p);
        r += 1;
    }
}

/// `y[(at.0 + i) * n + at.1 + r] = rows[r] · x[i]`: `W` weight rows at a time against the
/// `X` x rows (`W * X` accumulators in registers), each weight load shared by `X` products
/// and each x load by `W`.
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn dots_few<const X: usize, const W: usize>(
    rows: &[f32],
    x: [&[f32]; X],
    y: OutPtr,
    n: usize,
    at: (usize, usize),
) {
    use std::arch::x86_64::*;
    let k = x[0].len();
    let vk = k / 16 * 16;
    let count = rows.len() / k.max(1);
    let dot_tail = |p: *const f32, xi: &[f32]| -> f32 {
        xi[vk..]
            .iter()
            .enumerate()
            .map(|(o, &xv)| *p.add(vk + o) * xv)
            .sum()
    };
    let put = |i: usize, r: usize, v: f32| *y.get().add((at.0 + i) * n + at.1 + r) = v;
    let mut r = 0;
    while r + W <= count {
        let p: [*const f32; W] = std::array::from_fn(|j| rows.as_ptr().add((r + j) * k));
        let mut acc = [[_mm512_setzero_ps(); X]; W];
        let mut o = 0;
        while o < vk {
            let xv: [__m512; X] = std::array::from_fn(|i| _mm512_loadu_ps(x[i].as_ptr().add(o)));
            for j in 0..W {
                // The next W rows' same line: they stream in while these products run
                // (waiting on weight loads had left half the time idle at 8 x rows).
                _mm_prefetch::<_MM_HINT_T0>(p[j].wrapping_add(o + W * k) as *const i8);
                let wv = _mm512_loadu_ps(p[j].add(o));
                for i in 0..X {
                    acc[j][i] = _mm512_fmadd_ps(wv, xv[i], acc[j][i]);
                }
            }
            o += 16;
        }
        for j in 0..W {
            for i in 0..X {
                put(
                    i,
                    r + j,
                    _mm512_reduce_add_ps(acc[j][i]) + dot_tail(p[j], x[i]),
                );
            }
        }
        r += W;
    }
    while r < count {
        let p = rows.as_ptr().add(r * k);
        let mut acc = [_mm512_setzero_ps(); X];
        let mut o = 0;
        while o < vk {
            let wv = _mm512_loadu_ps(p.add(o));
            for i in 0..X {
                acc[i] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(x[i].as_ptr().add(o)), acc[i]);
            }
            o += 16;
        }
        for i in 0..X {
            put(i, r, _mm512_reduce_add_ps(acc[i]) + dot_tail(p, x[i]));
        }
        r += 1;
    }
}

/// The first `k / 16 * 16` columns of [`pack_rows`](crate::cpu::kernels::pack_rows) for a full panel.
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn pack(rows: &[&[f32]], k: usize, out: &mut [f32]) {
    use std::arch::x86_64::*;
    let o = out.as_mut_ptr();
    let mut kk = 0;
    while kk + 16 <= k {
        for g in 0..2 {
            let mut r: [__m512i; 16] = std::array::from_fn(|i| {
                _mm512_castps_si512(_mm512_loadu_ps(rows[g * 16 + i].as_ptr().add(kk)))
            });
            transpose16(&mut r);
            for (c, v) in r.iter().enumerate() {
                _mm512_storeu_si512(o.add((kk + c) * NR + g * 16) as *mut __m512i, *v);
            }
        }
        kk += 16;
    }
}

/// Transposes a 16 × 16 matrix of 32-bit values held one row per register: afterwards
/// `r[j]` lane `i` is the former `r[i]` lane `j`.
#[inline]
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn transpose16(r: &mut [std::arch::x86_64::__m512i; 16]) {
    use std::arch::x86_64::*;
    let mut t = [_mm512_setzero_si512(); 16];
    for i in 0..8 {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    for i in 0..4 {
        let b = 4 * i;
        r[b] = _mm512_unpacklo_epi64(t[b], t[b + 2]);
        r[b + 1] = _mm512_unpackhi_epi64(t[b], t[b + 2]);
        r[b + 2] = _mm512_unpacklo_epi64(t[b + 1], t[b + 3]);
        r[b + 3] = _mm512_unpackhi_epi64(t[b + 1], t[b + 3]);
    }
    for h in 0..2 {
        let b = 8 * h;
        for i in 0..4 {
            t[b + i] = _mm512_shuffle_i32x4::<0x88>(r[b + i], r[b + 4 + i]);
            t[b + 4 + i] = _mm512_shuffle_i32x4::<0xDD>(r[b + i], r[b + 4 + i]);
        }
    }
    for i in 0..8 {
        r[i] = _mm512_shuffle_i32x4::<0x88>(t[i], t[8 + i]);
        r[8 + i] = _mm512_shuffle_i32x4::<0xDD>(t[i], t[8 + i]);
    }
}

/// [`Tile`] over bf16 pairs ([`Dot::Bf16Pairs`](crate::cpu::kernels::Dot::Bf16Pairs)), `a` packed ([`PACKED_A`]): one broadcast
/// of a row's pair and two `vdpbf16ps` per row and k pair. The instruction multiplies
/// exactly and adds in f32 (denormal inputs and results count as zero, as in PyTorch's
/// oneDNN kernels on the same instruction).
#[target_feature(enable = "avx512f,avx512bf16")]
pub(crate) unsafe fn tile_pairs<const R: usize>(t: Tile) {
    use std::arch::x86_64::*;
    debug_assert_eq!(t.lda, PACKED_A);
    let mut lo = [_mm512_setzero_ps(); R];
    let mut hi = [_mm512_setzero_ps(); R];
    let (mut a, mut b) = (t.a.cast::<i32>(), t.b);
    for _ in 0..t.depth {
        let b0: __m512bh = std::mem::transmute(_mm512_loadu_ps(b));
        let b1: __m512bh = std::mem::transmute(_mm512_loadu_ps(b.add(16)));
        for i in 0..R {
            let av: __m512bh = std::mem::transmute(_mm512_set1_epi32(*a.add(i)));
            lo[i] = _mm512_dpbf16_ps(lo[i], av, b0);
            hi[i] = _mm512_dpbf16_ps(hi[i], av, b1);
        }
        a = a.add(MR);
        b = b.add(t.ldb);
    }
    store_tile!(t, lo, hi);
}

/// [`Tile`] with `R` rows: accumulated in registers over `depth` (one broadcast of `a` per
/// row and kk, two FMAs).
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn tile<const R: usize>(t: Tile) {
    use std::arch::x86_64::*;
    let mut lo = [_mm512_setzero_ps(); R];
    let mut hi = [_mm512_setzero_ps(); R];
    let (mut a, mut b) = (t.a, t.b);
    if t.lda == PACKED_A {
        for _ in 0..t.depth {
            let b0 = _mm512_loadu_ps(b);
            let b1 = _mm512_loadu_ps(b.add(16));
            for i in 0..R {
                let av = _mm512_set1_ps(*a.add(i));
                lo[i] = _mm512_fmadd_ps(av, b0, lo[i]);
                hi[i] = _mm512_fmadd_ps(av, b1, hi[i]);
            }
            a = a.add(MR);
            b = b.add(t.ldb);
        }
    } else {
        for _ in 0..t.depth {
            let b0 = _mm512_loadu_ps(b);
            let b1 = _mm512_loadu_ps(b.add(16));
            for i in 0..R {
                let av = _mm512_set1_ps(*a.add(i * t.lda));
                lo[i] = _mm512_fmadd_ps(av, b0, lo[i]);
                hi[i] = _mm512_fmadd_ps(av, b1, hi[i]);
            }
            a = a.add(1);
            b = b.add(t.ldb);
        }
    }
    store_tile!(t, lo, hi);
}

/// [`NarrowPv`] for `R` rows of `W` outputs; returns `R`.
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn narrow_pv<const R: usize, const W: usize>(t: &NarrowPv) -> usize {
    use std::arch::x86_64::*;
    let mut acc = [[_mm512_setzero_ps(); W]; R];
    let mut j = 0;
    while j < t.depth {
        let m = tail_mask(t.depth - j);
        let p: [__m512; R] =
            std::array::from_fn(|i| _mm512_maskz_loadu_ps(m, t.a.add(i * t.lda + j)));
        for c in 0..W {
            let v = _mm512_maskz_loadu_ps(m, t.vt.add(c * t.ldvt + j));
            for (row, p) in acc.iter_mut().zip(&p) {
                row[c] = _mm512_fmadd_ps(*p, v, row[c]);
            }
        }
        j += 16;
    }
    for (i, row) in acc.iter().enumerate() {
        for (c, r) in row.iter().enumerate() {
            *t.c.add(i * t.ldc + c) = _mm512_reduce_add_ps(*r);
        }
    }
    R
}

/// The scores of `n` query rows (at `q`, `ldq` apart) against the keys `[lo, hi)` (at `k`,
/// `ldk` apart, `d` values each), written to `s` (rows `lds` apart) at the keys' columns.
/// Sixteen keys accumulate in sixteen vectors, each load of a query chunk serving them all,
/// and their lanes are summed together ([`lane_sums16`]).
///
/// # Safety
/// AVX-512F is available; the rows, keys and outputs named are in bounds.
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn dot_keys(
    (q, ldq, n): (*const f32, usize, usize),
    (k, ldk, d): (*const f32, usize, usize),
    (lo, hi): (usize, usize),
    (s, lds): (*mut f32, usize),
) {
    use std::arch::x86_64::*;
    let chunks = d.div_ceil(16);
    let mut j = lo;
    while j < hi {
        let keys = (hi - j).min(16);
        for i in 0..n {
            let qi = q.add(i * ldq);
            let mut acc = [_mm512_setzero_ps(); 16];
            for c in 0..chunks {
                let m = tail_mask(d - c * 16);
                let qc = _mm512_maskz_loadu_ps(m, qi.add(c * 16));
                for (jj, a) in acc.iter_mut().enumerate().take(keys) {
                    let kc = _mm512_maskz_loadu_ps(m, k.add((j + jj) * ldk + c * 16));
                    *a = _mm512_fmadd_ps(qc, kc, *a);
                }
            }
            _mm512_mask_storeu_ps(s.add(i * lds + j), tail_mask(keys), lane_sums16(acc));
        }
        j += 16;
    }
}

/// Lane `i` of the result is the sum of `v[i]`'s lanes: pairs, then quads summed within
/// 128-bit quarters, then the quarters (45 operations for 16 sums, where 16 separate
/// reductions take about 130).
#[inline(always)]
pub(crate) unsafe fn lane_sums16(v: [std::arch::x86_64::__m512; 16]) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    // Per quarter, [a0 + a2, b0 + b2, a1 + a3, b1 + b3] for the pair (a, b) = v[2p], v[2p+1].
    let t: [__m512; 8] = std::array::from_fn(|p| {
        let (a, b) = (v[2 * p], v[2 * p + 1]);
        _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b))
    });
    // Per quarter, the quarter's sums of v[4m..4m + 4].
    let u: [__m512; 4] = std::array::from_fn(|m| {
        let (a, b) = (t[2 * m], t[2 * m + 1]);
        _mm512_add_ps(
            _mm512_shuffle_ps::<0b01_00_01_00>(a, b),
            _mm512_shuffle_ps::<0b11_10_11_10>(a, b),
        )
    });
    // Quarters [x.q0 + x.q1, x.q2 + x.q3, y.q0 + y.q1, y.q2 + y.q3].
    let halves = |x: __m512, y: __m512| {
        _mm512_add_ps(
            _mm512_shuffle_f32x4::<0b10_00_10_00>(x, y),
            _mm512_shuffle_f32x4::<0b11_01_11_01>(x, y),
        )
    };
    halves(halves(u[0], u[1]), halves(u[2], u[3]))
}

/// Scores `s[j] * scale + bias[j]` (no bias when `bias` is null) in place over `[a, b)`;
/// returns their max.
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn scale_max(
    s: *mut f32,
    bias: *const f32,
    scale: f32,
    (a, b): (usize, usize),
) -> f32 {
    use std::arch::x86_64::*;
    let vs = _mm512_set1_ps(scale);
    let mut mx = _mm512_set1_ps(f32::NEG_INFINITY);
    let mut j = a;
    while j < b {
        let m = tail_mask(b - j);
        let mut x = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, s.add(j)), vs);
        if !bias.is_null() {
            x = _mm512_add_ps(x, _mm512_maskz_loadu_ps(m, bias.add(j)));
        }
        _mm512_mask_storeu_ps(s.add(j), m, x);
        mx = _mm512_mask_max_ps(mx, m, mx, x);
        j += 16;
    }
    _mm512_reduce_max_ps(mx)
}

/// `s[j] = exp(s[j] - max)` in place over `[a, b)`; returns their sum (partial sums in 16
/// lanes, then reduced: the eager sum's order differs as much).
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn exp_sum(s: *mut f32, max: f32, (a, b): (usize, usize)) -> f32 {
    use std::arch::x86_64::*;
    let vmax = _mm512_set1_ps(max);
    let mut sum = _mm512_setzero_ps();
    let mut j = a;
    while j < b {
        let m = tail_mask(b - j);
        let e = exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, s.add(j)), vmax));
        sum = _mm512_mask_add_ps(sum, m, sum, e);
        _mm512_mask_storeu_ps(s.add(j), m, e);
        j += 16;
    }
    _mm512_reduce_add_ps(sum)
}

/// `row[..n] /= sum`.
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn divide(row: *mut f32, n: usize, sum: f32) {
    use std::arch::x86_64::*;
    let vs = _mm512_set1_ps(sum);
    let mut j = 0;
    while j < n {
        let m = tail_mask(n - j);
        let y = _mm512_div_ps(_mm512_maskz_loadu_ps(m, row.add(j)), vs);
        _mm512_mask_storeu_ps(row.add(j), m, y);
        j += 16;
    }
}

/// `e^x` in 16 lanes, within about 1 ulp (Cephes' `expf` polynomial; `scalef` applies the
/// power of two, so results that underflow go through the subnormals to 0 as `expf` does).
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn exp512(x: std::arch::x86_64::__m512) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    let x = _mm512_max_ps(
        _mm512_min_ps(x, _mm512_set1_ps(88.7)),
        _mm512_set1_ps(-104.0),
    );
    let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
        _mm512_mul_ps(x, _mm512_set1_ps(std::f32::consts::LOG2_E)),
    );
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(EXP_LN2.0), x);
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(EXP_LN2.1), r);
    let mut p = _mm512_set1_ps(EXP_POLY[0]);
    for c in &EXP_POLY[1..] {
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(*c));
    }
    let p = _mm512_fmadd_ps(
        _mm512_mul_ps(p, r),
        r,
        _mm512_add_ps(r, _mm512_set1_ps(1.0)),
    );
    _mm512_scalef_ps(p, n)
}

#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn silu_mul<T: Lane>(g: &[T], u: &[T], y: *mut T) {
    use std::arch::x86_64::*;
    let one = _mm512_set1_ps(1.0);
    let mut j = 0;
    while j < g.len() {
        let n = g.len() - j;
        let x = T::load16(g.as_ptr().add(j), n);
        let e = exp512(_mm512_sub_ps(_mm512_setzero_ps(), x));
        let s = T::round(_mm512_div_ps(x, _mm512_add_ps(one, e)));
        let p = _mm512_mul_ps(s, T::load16(u.as_ptr().add(j), n));
        T::store16(y.add(j), n, p);
        j += 16;
    }
}

/// Exact GELU (`0.5 x (1 + erf(x / sqrt 2))`) of f32 or bf16 values in 16 lanes, `erf` as
/// PyTorch's vectorised kernels compute it (see [`avx2::erf256`](super::avx2::erf256)).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(crate) unsafe fn gelu_erf<T: Lane>(x: &[T], y: *mut T) {
    use std::arch::x86_64::*;
    let [p, p1, p2, p3, p4, p5] = super::avx2::ERF_COEFFICIENTS.map(|c| _mm512_set1_ps(c));
    let (half, one) = (_mm512_set1_ps(0.5), _mm512_set1_ps(1.0));
    let k = _mm512_set1_ps(std::f32::consts::FRAC_1_SQRT_2);
    let mut j = 0;
    while j < x.len() {
        let n = x.len() - j;
        let v = T::load16(x.as_ptr().add(j), n);
        let u = _mm512_mul_ps(v, k);
        let a = _mm512_abs_ps(u);
        let t = _mm512_div_ps(one, _mm512_fmadd_ps(p, a, one));
        let r = _mm512_fmadd_ps(
            _mm512_fmadd_ps(_mm512_fmadd_ps(_mm512_fmadd_ps(p5, t, p4), t, p3), t, p2),
            t,
            p1,
        );
        let e = exp512(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_mul_ps(u, u)));
        // 1 - r t e^{-u^2}, with u's sign.
        let m = _mm512_fnmadd_ps(_mm512_mul_ps(e, t), r, one);
        let sign = _mm512_and_si512(_mm512_castps_si512(u), _mm512_set1_epi32(i32::MIN));
        let erf = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(m), sign));
        let g = _mm512_mul_ps(_mm512_mul_ps(v, half), _mm512_add_ps(one, erf));
        T::store16(y.add(j), n, g);
        j += 16;
    }
}

#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn gelu_tanh<T: Lane>(x: &[T], y: *mut T) {
    use std::arch::x86_64::*;
    let (one, half) = (_mm512_set1_ps(1.0), _mm512_set1_ps(0.5));
    let c = _mm512_set1_ps((2.0 / std::f32::consts::PI).sqrt());
    let k = _mm512_set1_ps(0.044_715);
    let mut j = 0;
    while j < x.len() {
        let n = x.len() - j;
        let v = T::load16(x.as_ptr().add(j), n);
        let cube = _mm512_mul_ps(_mm512_mul_ps(v, v), v);
        let u = _mm512_mul_ps(c, _mm512_fmadd_ps(k, cube, v));
        let e = exp512(_mm512_add_ps(u, u));
        let t = _mm512_sub_ps(
            one,
            _mm512_div_ps(_mm512_set1_ps(2.0), _mm512_add_ps(e, one)),
        );
        let g = _mm512_mul_ps(_mm512_mul_ps(half, v), _mm512_add_ps(one, t));
        T::store16(y.add(j), n, g);
        j += 16;
    }
}

/// An element type the vectorised kernels load and store 16 lanes of, as f32.
pub(crate) trait Lane: Copy + Send + Sync + crate::Element {
    /// `n` values from `p` (16 when `n >= 16`; lanes past `n` are zero) as f32.
    ///
    /// SAFETY: AVX-512F must be available and `p` valid for `min(n, 16)` reads.
    unsafe fn load16(p: *const Self, n: usize) -> std::arch::x86_64::__m512;

    /// The first `min(n, 16)` lanes of `v` to `p`, rounded to this type.
    ///
    /// SAFETY: AVX-512F must be available and `p` valid for `min(n, 16)` writes.
    unsafe fn store16(p: *mut Self, n: usize, v: std::arch::x86_64::__m512);

    /// `v` rounded to this type and widened back: what a PyTorch op in this dtype hands the
    /// next op.
    ///
    /// SAFETY: AVX-512F must be available.
    unsafe fn round(v: std::arch::x86_64::__m512) -> std::arch::x86_64::__m512;
}

impl Lane for f32 {
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn load16(p: *const f32, n: usize) -> std::arch::x86_64::__m512 {
        std::arch::x86_64::_mm512_maskz_loadu_ps(tail_mask(n), p)
    }

    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn store16(p: *mut f32, n: usize, v: std::arch::x86_64::__m512) {
        std::arch::x86_64::_mm512_mask_storeu_ps(p, tail_mask(n), v)
    }

    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn round(v: std::arch::x86_64::__m512) -> std::arch::x86_64::__m512 {
        v
    }
}

impl Lane for bf16 {
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn load16(p: *const bf16, n: usize) -> std::arch::x86_64::__m512 {
        use std::arch::x86_64::*;
        let raw = if n >= 16 {
            _mm256_loadu_si256(p.cast())
        } else {
            let mut buf = [0u16; 16];
            std::ptr::copy_nonoverlapping(p.cast::<u16>(), buf.as_mut_ptr(), n);
            _mm256_loadu_si256(buf.as_ptr().cast())
        };
        // A bf16 is the high half of an f32.
        _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(raw)))
    }

    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn store16(p: *mut bf16, n: usize, v: std::arch::x86_64::__m512) {
        use std::arch::x86_64::*;
        let h = _mm512_cvtepi32_epi16(to_bf16_bits(v));
        if n >= 16 {
            _mm256_storeu_si256(p.cast(), h);
        } else {
            let mut buf = [0u16; 16];
            _mm256_storeu_si256(buf.as_mut_ptr().cast(), h);
            std::ptr::copy_nonoverlapping(buf.as_ptr(), p.cast::<u16>(), n);
        }
    }

    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn round(v: std::arch::x86_64::__m512) -> std::arch::x86_64::__m512 {
        use std::arch::x86_64::*;
        _mm512_castsi512_ps(_mm512_slli_epi32::<16>(to_bf16_bits(v)))
    }
}

/// The bf16 bit patterns of 16 f32 lanes (in the low half of each 32-bit lane): round to
/// nearest, ties to even; a NaN stays a quiet NaN, as `half::bf16::from_f32` rounds.
#[inline]
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn to_bf16_bits(v: std::arch::x86_64::__m512) -> std::arch::x86_64::__m512i {
    use std::arch::x86_64::*;
    let b = _mm512_castps_si512(v);
    let odd = _mm512_and_si512(_mm512_srli_epi32::<16>(b), _mm512_set1_epi32(1));
    let bias = _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF));
    let rounded = _mm512_srli_epi32::<16>(_mm512_add_epi32(b, bias));
    let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v, v);
    let quiet = _mm512_or_si512(_mm512_srli_epi32::<16>(b), _mm512_set1_epi32(0x40));
    _mm512_mask_mov_epi32(rounded, nan, quiet)
}

/// One operand of bf16's broadcasting `binary`: a buffer read at the output's index modulo `period`.
#[derive(Clone, Copy)]
pub(crate) struct Operand {
    pub p: *const bf16,
    pub period: usize,
}

// SAFETY: an Operand only reads a buffer that bf16's `binary` keeps borrowed until its
// tasks end.
unsafe impl Sync for Operand {}
unsafe impl Send for Operand {}

/// Output values `s..e` of `x op y`, in runs that end where a repeated operand wraps, so
/// within a run each operand reads on from the run's start.
///
/// SAFETY: AVX-512F must be available; `out` valid for `e` values; `s` a multiple of each
/// period below `e - s`.
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn combine(
    op: crate::op::BinaryOp,
    x: Operand,
    y: Operand,
    s: usize,
    e: usize,
    out: *mut half::bf16,
) {
    use crate::op::BinaryOp as B;
    use std::arch::x86_64::*;
    // A run: as long as the shorter non-scalar period, or the chunk.
    let run = [x.period, y.period]
        .into_iter()
        .filter(|&p| p > 1)
        .min()
        .map_or(e - s, |p| p.min(e - s));
    let load = |o: Operand, at: usize, n: usize| {
        if o.period == 1 {
            _mm512_set1_ps(half::bf16::to_f32(*o.p))
        } else {
            <half::bf16 as Lane>::load16(o.p.add(at), n)
        }
    };
    let mut r = s;
    while r < e {
        let end = (r + run).min(e);
        let (bx, by) = (r % x.period, r % y.period);
        let mut j = r;
        while j < end {
            let n = end - j;
            let (a, b) = (load(x, bx + j - r, n), load(y, by + j - r, n));
            let v = match op {
                B::Add => _mm512_add_ps(a, b),
                B::Sub => _mm512_sub_ps(a, b),
                B::Mul => _mm512_mul_ps(a, b),
                _ => _mm512_div_ps(a, b),
            };
            <half::bf16 as Lane>::store16(out.add(j), n, v);
            j += 16;
        }
        r = end;
    }
}

/// `len` values from `src` to `dst`, plus `bias` (`len` values) when given.
///
/// SAFETY: AVX-512F must be available; `src`, `dst` (and `bias`) valid for `len` values.
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn convert_row<S: Lane, D: Lane>(
    src: *const S,
    dst: *mut D,
    len: usize,
    bias: Option<&[f32]>,
) {
    use std::arch::x86_64::_mm512_add_ps;
    let mut j = 0;
    while j < len {
        let mut x = S::load16(src.add(j), len - j);
        if let Some(b) = bias {
            x = _mm512_add_ps(x, f32::load16(b.as_ptr().add(j), len - j));
        }
        D::store16(dst.add(j), len - j, x);
        j += 16;
    }
}

/// One row of a norm over the last dim (`layer`: LayerNorm's centred statistics, else RMS):
/// its statistics, then the row scaled into `y` (rounded to `O`).
///
/// # Safety
/// AVX-512F is available and `y` is valid for `x.len()` writes.
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn norm_row<T: Lane, O: Lane>(x: &[T], y: *mut O, layer: bool, eps: f64) {
    use std::arch::x86_64::*;
    let (n, p) = (x.len(), x.as_ptr());
    let inv_n = (1.0 / n as f64) as f32;
    let mean = match layer {
        false => 0.0,
        true => {
            let mut acc = _mm512_setzero_ps();
            let mut j = 0;
            while j < n {
                acc = _mm512_add_ps(acc, T::load16(p.add(j), n - j));
                j += 16;
            }
            _mm512_reduce_add_ps(acc) * inv_n
        }
    };
    let vm = _mm512_set1_ps(mean);
    // Lanes past the row load as zero; centred, they would add mean² each, so they are
    // masked out of the squares.
    let mut acc = _mm512_setzero_ps();
    let mut j = 0;
    while j < n {
        let m = tail_mask(n - j);
        let c = _mm512_maskz_sub_ps(m, T::load16(p.add(j), n - j), vm);
        acc = _mm512_fmadd_ps(c, c, acc);
        j += 16;
    }
    let var = _mm512_reduce_add_ps(acc) * inv_n;
    let r = _mm512_set1_ps(1.0 / (var + eps as f32).sqrt());
    let mut j = 0;
    while j < n {
        let c = _mm512_sub_ps(T::load16(p.add(j), n - j), vm);
        O::store16(y.add(j), n - j, _mm512_mul_ps(c, r));
        j += 16;
    }
}

/// The rotary pass's (`cpu::rotary`) rotation of one row, 16 lanes at a time: the same products, rounded
/// where it rounds, so the two agree bit for bit. Interleaved pairs are neighbouring lanes:
/// each table entry is duplicated onto its pair and the pair swapped for the cross products.
///
/// SAFETY: AVX-512F must be available; `x` readable and `y` writable for `2 * half` values,
/// `c` and `s` readable for `half`.
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn rotate16<T: Lane>(
    x: *const T,
    y: *mut T,
    (c, s): (*const T, *const T),
    half: usize,
    style: crate::RopeStyle,
) {
    use std::arch::x86_64::*;
    let mul = |a, b| <T as Lane>::round(_mm512_mul_ps(a, b));
    match style {
        crate::RopeStyle::RotateHalf => {
            for k in (0..half).step_by(16) {
                let n = half - k;
                let (a, b) = (T::load16(x.add(k), n), T::load16(x.add(half + k), n));
                let (cv, sv) = (T::load16(c.add(k), n), T::load16(s.add(k), n));
                T::store16(y.add(k), n, _mm512_sub_ps(mul(a, cv), mul(b, sv)));
                T::store16(y.add(half + k), n, _mm512_add_ps(mul(b, cv), mul(a, sv)));
            }
        }
        crate::RopeStyle::Interleaved => {
            // 16 pairs per step: one full load of each table (a shorter one is a copy through
            // the stack), duplicated onto the lanes of two 16-lane halves of x.
            let lo = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
            let hi = _mm512_set_epi32(15, 15, 14, 14, 13, 13, 12, 12, 11, 11, 10, 10, 9, 9, 8, 8);
            let swap = _mm512_set_epi32(14, 15, 12, 13, 10, 11, 8, 9, 6, 7, 4, 5, 2, 3, 0, 1);
            for k in (0..half).step_by(16) {
                let pairs = half - k;
                let (cv, sv) = (T::load16(c.add(k), pairs), T::load16(s.add(k), pairs));
                for (h, dup) in [(0, lo), (8, hi)] {
                    if h >= pairs {
                        break;
                    }
                    let n = 2 * (pairs - h).min(8);
                    let v = T::load16(x.add(2 * (k + h)), n);
                    let (cd, sd) = (
                        _mm512_permutexvar_ps(dup, cv),
                        _mm512_permutexvar_ps(dup, sv),
                    );
                    let (p, q) = (mul(v, cd), mul(_mm512_permutexvar_ps(swap, v), sd));
                    // Even lanes (a): a c - b s; odd lanes (b): b c + a s.
                    let r = _mm512_mask_add_ps(_mm512_sub_ps(p, q), 0xAAAA, p, q);
                    T::store16(y.add(2 * (k + h)), n, r);
                }
            }
        }
    }
}
