//! The `avx2` tier's kernels (AVX2 + FMA, 8-lane f32 vectors in 16 registers): the
//! siblings of the AVX-512 kernels in `kernels`, `norm` and `quant`, called by the same
//! dispatch points where [`features::avx2`](crate::cpu::features::avx2) holds and
//! [`features::avx512`](crate::cpu::features::avx512) does not. Every function here needs AVX2
//! and FMA (its callers check); results match the AVX-512 kernels' up to summation order.

use std::arch::x86_64::*;

use crate::cpu::kernels::{Tile, EXP_LN2, EXP_POLY, MR_AVX2, NR, PACKED_A};

/// Lanes `0..n` set (all for `n >= 8`): the tail of a row as a `maskload`/`blendv` mask.
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn mask8(n: usize) -> __m256i {
    _mm256_cmpgt_epi32(
        _mm256_set1_epi32(n.min(8) as i32),
        _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
    )
}

/// The first `min(n, 8)` values at `p` (the rest zero), reading nothing past them.
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn load8(p: *const f32, n: usize) -> __m256 {
    if n >= 8 {
        _mm256_loadu_ps(p)
    } else {
        _mm256_maskload_ps(p, mask8(n))
    }
}

/// Stores the first `min(n, 8)` lanes of `v` at `p`.
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn store8(p: *mut f32, n: usize, v: __m256) {
    if n >= 8 {
        _mm256_storeu_ps(p, v)
    } else {
        _mm256_maskstore_ps(p, mask8(n), v)
    }
}

/// `e^x` in 8 lanes, within about 1 ulp: [`exp512`](crate::cpu::kernels)'s Cephes polynomial,
/// the power of two built in the exponent bits (AVX2 has no `scalef`). Results below
/// `e^-87.3` (the smallest normal f32) come out as 0 instead of subnormal: a difference of
/// under 1.2e-38 in every use (softmax weights beside a maximum of 1, `silu`'s and `gelu`'s
/// denominators). Not the smallest normal either: a masked key's weight times a value is
/// subnormal, and every FMA that adds one waits for a microcode assist (the decode of 16
/// paged sequences ran 5x slower than at `avx512`, whose `scalef` gives 0).
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn exp256(x: __m256) -> __m256 {
    let under = _mm256_cmp_ps::<_CMP_LT_OQ>(x, _mm256_set1_ps(-87.33));
    let x = _mm256_max_ps(
        _mm256_min_ps(x, _mm256_set1_ps(88.37)),
        _mm256_set1_ps(-87.33),
    );
    let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(
        x,
        _mm256_set1_ps(std::f32::consts::LOG2_E),
    ));
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(EXP_LN2.0), x);
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(EXP_LN2.1), r);
    let mut p = _mm256_set1_ps(EXP_POLY[0]);
    for c in &EXP_POLY[1..] {
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(*c));
    }
    let p = _mm256_fmadd_ps(
        _mm256_mul_ps(p, r),
        r,
        _mm256_add_ps(r, _mm256_set1_ps(1.0)),
    );
    // n in [-126, 127]: 2^n is a normal float.
    let pow2 = _mm256_slli_epi32::<23>(_mm256_add_epi32(
        _mm256_cvtps_epi32(n),
        _mm256_set1_epi32(127),
    ));
    _mm256_andnot_ps(under, _mm256_mul_ps(p, _mm256_castsi256_ps(pow2)))
}

/// The sums of 8 vectors' lanes: lane `i` of the result is the sum of `v[i]`'s lanes.
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn lane_sums8(v: [__m256; 8]) -> __m256 {
    let h = |a: __m256, b: __m256| _mm256_hadd_ps(a, b);
    let lo = h(h(v[0], v[1]), h(v[2], v[3]));
    let hi = h(h(v[4], v[5]), h(v[6], v[7]));
    _mm256_add_ps(
        _mm256_permute2f128_ps::<0x20>(lo, hi),
        _mm256_permute2f128_ps::<0x31>(lo, hi),
    )
}

/// The largest lane of `v`.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn hmax256(v: __m256) -> f32 {
    let m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    let m = _mm_max_ss(m, _mm_shuffle_ps::<1>(m, m));
    _mm_cvtss_f32(m)
}

/// [`scale_max`](crate::cpu::kernels) in 8 lanes: `s[j] * scale + bias[j]` (no bias when null)
/// in place over `[a, b)`; returns their max.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn scale_max(
    s: *mut f32,
    bias: *const f32,
    scale: f32,
    (a, b): (usize, usize),
) -> f32 {
    let vs = _mm256_set1_ps(scale);
    let ninf = _mm256_set1_ps(f32::NEG_INFINITY);
    // Whole vectors from a, then the tail under a mask.
    let full = a + (b - a) / 8 * 8;
    let tail = b - full;
    let scaled = |j: usize, n: usize| {
        let x = _mm256_mul_ps(load8(s.add(j), n), vs);
        if bias.is_null() {
            x
        } else {
            _mm256_add_ps(x, load8(bias.add(j), n))
        }
    };
    let mut mx = ninf;
    let mut j = a;
    while j < full {
        let x = scaled(j, 8);
        _mm256_storeu_ps(s.add(j), x);
        mx = _mm256_max_ps(mx, x);
        j += 8;
    }
    if tail > 0 {
        let x = scaled(full, tail);
        store8(s.add(full), tail, x);
        let live = _mm256_castsi256_ps(mask8(tail));
        mx = _mm256_max_ps(mx, _mm256_blendv_ps(ninf, x, live));
    }
    hmax256(mx)
}

/// [`exp_sum`](crate::cpu::kernels) in 8 lanes: `s[j] = exp(s[j] - max)` over `[a, b)`; returns
/// their sum.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn exp_sum(s: *mut f32, max: f32, (a, b): (usize, usize)) -> f32 {
    let vmax = _mm256_set1_ps(max);
    let full = a + (b - a) / 8 * 8;
    let tail = b - full;
    let mut sum = _mm256_setzero_ps();
    let mut j = a;
    while j < full {
        let e = exp256(_mm256_sub_ps(_mm256_loadu_ps(s.add(j)), vmax));
        sum = _mm256_add_ps(sum, e);
        _mm256_storeu_ps(s.add(j), e);
        j += 8;
    }
    if tail > 0 {
        let e = exp256(_mm256_sub_ps(load8(s.add(full), tail), vmax));
        let e = _mm256_and_ps(e, _mm256_castsi256_ps(mask8(tail)));
        sum = _mm256_add_ps(sum, e);
        store8(s.add(full), tail, e);
    }
    hsum256(sum)
}

/// `row[..n] /= sum`.
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn divide(row: *mut f32, n: usize, sum: f32) {
    let vs = _mm256_set1_ps(sum);
    let mut j = 0;
    while j < n {
        store8(
            row.add(j),
            n - j,
            _mm256_div_ps(load8(row.add(j), n - j), vs),
        );
        j += 8;
    }
}

/// [`dot_keys`](crate::cpu::kernels) in 8 lanes: the scores of `n` query rows against the keys
/// `[lo, hi)`, eight keys accumulating in eight vectors whose lanes are summed together.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn dot_keys(
    (q, ldq, n): (*const f32, usize, usize),
    (k, ldk, d): (*const f32, usize, usize),
    (lo, hi): (usize, usize),
    (s, lds): (*mut f32, usize),
) {
    let mut j = lo;
    while j < hi {
        let keys = (hi - j).min(8);
        for i in 0..n {
            let qi = q.add(i * ldq);
            let mut acc = [_mm256_setzero_ps(); 8];
            let mut c = 0;
            while c < d {
                let qc = load8(qi.add(c), d - c);
                for (jj, a) in acc.iter_mut().enumerate().take(keys) {
                    *a = _mm256_fmadd_ps(qc, load8(k.add((j + jj) * ldk + c), d - c), *a);
                }
                c += 8;
            }
            store8(s.add(i * lds + j), keys, lane_sums8(acc));
        }
        j += 8;
    }
}

/// [`NarrowPv`](crate::cpu::kernels)'s product for one probability row and 8 outputs in 8 lanes:
/// `c[w] = Σ_j a[j] · vt[w][j]`, the 8 sums reduced together. 8 accumulators, the row's
/// vector and v's: wider heads run this per 8 columns (16 accumulators would spill).
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn narrow_pv8(
    a: *const f32,
    (vt, ldvt): (*const f32, usize),
    depth: usize,
    c: *mut f32,
) {
    let mut acc = [_mm256_setzero_ps(); 8];
    let full = depth / 8 * 8;
    let mut j = 0;
    while j < full {
        let p = _mm256_loadu_ps(a.add(j));
        for (w, acc) in acc.iter_mut().enumerate() {
            *acc = _mm256_fmadd_ps(p, _mm256_loadu_ps(vt.add(w * ldvt + j)), *acc);
        }
        j += 8;
    }
    if full < depth {
        let n = depth - full;
        let p = load8(a.add(full), n);
        for (w, acc) in acc.iter_mut().enumerate() {
            *acc = _mm256_fmadd_ps(p, load8(vt.add(w * ldvt + full), n), *acc);
        }
    }
    _mm256_storeu_ps(c, lane_sums8(acc));
}

/// `silu(g) * u` for f32 (`g / (1 + e^-g)`, then the product), as
/// [`silu_mul`](crate::cpu::kernels::silu_mul) computes it with 16 lanes.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn silu_mul(g: &[f32], u: &[f32], y: *mut f32) {
    let one = _mm256_set1_ps(1.0);
    let mut j = 0;
    while j < g.len() {
        let n = g.len() - j;
        let x = load8(g.as_ptr().add(j), n);
        let e = exp256(_mm256_sub_ps(_mm256_setzero_ps(), x));
        let s = _mm256_div_ps(x, _mm256_add_ps(one, e));
        store8(y.add(j), n, _mm256_mul_ps(s, load8(u.as_ptr().add(j), n)));
        j += 8;
    }
}

/// Tanh-approximated GELU of f32 values, as [`gelu_tanh`](crate::cpu::kernels::gelu_tanh)
/// computes it with 16 lanes (`tanh(u) = 1 - 2 / (e^{2u} + 1)`).
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn gelu_tanh(x: &[f32], y: *mut f32) {
    let (half, one, two) = (
        _mm256_set1_ps(0.5),
        _mm256_set1_ps(1.0),
        _mm256_set1_ps(2.0),
    );
    let k0 = _mm256_set1_ps((2.0 / std::f32::consts::PI).sqrt());
    let k1 = _mm256_set1_ps(0.044_715);
    let mut j = 0;
    while j < x.len() {
        let n = x.len() - j;
        let v = load8(x.as_ptr().add(j), n);
        let cube = _mm256_mul_ps(_mm256_mul_ps(v, v), v);
        let inner = _mm256_mul_ps(k0, _mm256_fmadd_ps(k1, cube, v));
        let e = exp256(_mm256_mul_ps(two, inner));
        let tanh = _mm256_sub_ps(one, _mm256_div_ps(two, _mm256_add_ps(e, one)));
        let out = _mm256_mul_ps(_mm256_mul_ps(half, v), _mm256_add_ps(one, tanh));
        store8(y.add(j), n, out);
        j += 8;
    }
}

/// Exact GELU of f32 values, `0.5 x (1 + erf(x / sqrt 2))`, as
/// [`gelu_erf`](crate::cpu::kernels::gelu_erf) computes it with 16 lanes.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn gelu_erf(x: &[f32], y: *mut f32) {
    let (half, one) = (_mm256_set1_ps(0.5), _mm256_set1_ps(1.0));
    let k = _mm256_set1_ps(std::f32::consts::FRAC_1_SQRT_2);
    let mut j = 0;
    while j < x.len() {
        let n = x.len() - j;
        let v = load8(x.as_ptr().add(j), n);
        let e = erf256(_mm256_mul_ps(v, k));
        let out = _mm256_mul_ps(_mm256_mul_ps(v, half), _mm256_add_ps(one, e));
        store8(y.add(j), n, out);
        j += 8;
    }
}

/// `erf` in 8 lanes as PyTorch's vectorised CPU kernels compute it (Abramowitz and Stegun
/// 7.1.26: `1 - (p1 t + ... + p5 t^5) e^{-x^2}` with `t = 1 / (1 + p |x|)`, the sign put
/// back; within 1.5e-7 of the exact value).
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn erf256(x: __m256) -> __m256 {
    let [p, p1, p2, p3, p4, p5] = ERF_COEFFICIENTS.map(|c| _mm256_set1_ps(c));
    let (neg_zero, one) = (_mm256_set1_ps(-0.0), _mm256_set1_ps(1.0));
    let sign = _mm256_and_ps(neg_zero, x);
    let a = _mm256_xor_ps(sign, x);
    let t = _mm256_div_ps(one, _mm256_fmadd_ps(p, a, one));
    let r = _mm256_fmadd_ps(
        _mm256_fmadd_ps(_mm256_fmadd_ps(_mm256_fmadd_ps(p5, t, p4), t, p3), t, p2),
        t,
        p1,
    );
    let e = exp256(_mm256_xor_ps(neg_zero, _mm256_mul_ps(x, x)));
    let y = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_xor_ps(neg_zero, e), t), r, one);
    _mm256_xor_ps(sign, y)
}

/// `p` and `p1..p5` of Abramowitz and Stegun's 7.1.26 (`erf256`, `erf512`).
pub(crate) const ERF_COEFFICIENTS: [f32; 6] = [
    0.327_591_1,
    0.254_829_6,
    -0.284_496_74,
    1.421_413_7,
    -1.453_152_1,
    1.061_405_4,
];

/// One f32 row of [`norm_last`](crate::cpu::norm::norm_last): its mean (layer norm) and variance,
/// then the row centred and scaled into `y`.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn norm_row(x: &[f32], y: *mut f32, layer: bool, eps: f64) {
    let (n, p) = (x.len(), x.as_ptr());
    let inv_n = (1.0 / n as f64) as f32;
    let mean = if layer {
        let mut acc = _mm256_setzero_ps();
        let mut j = 0;
        while j < n {
            acc = _mm256_add_ps(acc, load8(p.add(j), n - j));
            j += 8;
        }
        hsum256(acc) * inv_n
    } else {
        0.0
    };
    let vm = _mm256_set1_ps(mean);
    // Lanes past the row are masked out of the squares (centred, they would add mean²).
    let mut acc = _mm256_setzero_ps();
    let mut j = 0;
    while j < n {
        let live = _mm256_castsi256_ps(mask8(n - j));
        let c = _mm256_and_ps(_mm256_sub_ps(load8(p.add(j), n - j), vm), live);
        acc = _mm256_fmadd_ps(c, c, acc);
        j += 8;
    }
    let var = hsum256(acc) * inv_n;
    let r = _mm256_set1_ps(1.0 / (var + eps as f32).sqrt());
    let mut j = 0;
    while j < n {
        let c = _mm256_sub_ps(load8(p.add(j), n - j), vm);
        store8(y.add(j), n - j, _mm256_mul_ps(c, r));
        j += 8;
    }
}

/// Half a [`Tile`] (the GEMM's register tile) on AVX2: `R` rows × 16 columns.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn tile<const R: usize>(t: Tile) {
    let mut lo = [_mm256_setzero_ps(); R];
    let mut hi = [_mm256_setzero_ps(); R];
    let (mut a, mut b) = (t.a, t.b);
    // Packed: rows adjacent, MR_AVX2 per k step (constant offsets from one pointer); else
    // rows `lda` apart, one per k step.
    macro_rules! step {
        ($row:expr) => {{
            let b0 = _mm256_loadu_ps(b);
            let b1 = _mm256_loadu_ps(b.add(8));
            for i in 0..R {
                let av = _mm256_broadcast_ss(&*a.add(i * $row));
                lo[i] = _mm256_fmadd_ps(av, b0, lo[i]);
                hi[i] = _mm256_fmadd_ps(av, b1, hi[i]);
            }
            b = b.add(t.ldb);
        }};
    }
    if t.lda == PACKED_A {
        for _ in 0..t.depth {
            step!(1);
            a = a.add(MR_AVX2);
        }
    } else {
        for _ in 0..t.depth {
            step!(t.lda);
            a = a.add(1);
        }
    }
    for i in 0..R {
        let c = t.c.add(i * t.ldc);
        if t.accumulate {
            lo[i] = _mm256_add_ps(lo[i], _mm256_loadu_ps(c));
            hi[i] = _mm256_add_ps(hi[i], _mm256_loadu_ps(c.add(8)));
        }
        _mm256_storeu_ps(c, lo[i]);
        _mm256_storeu_ps(c.add(8), hi[i]);
    }
}

/// The first `k / 8 * 8` columns of [`pack_rows`](crate::cpu::kernels::pack_rows) for a full
/// panel, in 8 × 8 blocks.
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn pack_panel(rows: &[&[f32]], k: usize, out: &mut [f32]) {
    let o = out.as_mut_ptr();
    let mut kk = 0;
    while kk + 8 <= k {
        for g in 0..NR / 8 {
            let mut r: [__m256; 8] =
                std::array::from_fn(|i| _mm256_loadu_ps(rows[g * 8 + i].as_ptr().add(kk)));
            transpose8(&mut r);
            for (c, v) in r.iter().enumerate() {
                _mm256_storeu_ps(o.add((kk + c) * NR + g * 8), *v);
            }
        }
        kk += 8;
    }
}

/// Transposes an 8 × 8 matrix of f32 held one row per register.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn transpose8(r: &mut [__m256; 8]) {
    let t: [__m256; 8] = std::array::from_fn(|i| {
        let (a, b) = (r[i / 2 * 2], r[i / 2 * 2 + 1]);
        if i % 2 == 0 {
            _mm256_unpacklo_ps(a, b)
        } else {
            _mm256_unpackhi_ps(a, b)
        }
    });
    // s[q] holds rows 0..4 (q < 4) or 4..8 of columns q % 4 and q % 4 + 4.
    let s: [__m256; 8] = std::array::from_fn(|q| {
        let (h, c) = (q / 4 * 4, q % 4);
        let (a, b) = (t[h + c / 2], t[h + 2 + c / 2]);
        if c % 2 == 0 {
            _mm256_shuffle_ps::<0x44>(a, b)
        } else {
            _mm256_shuffle_ps::<0xEE>(a, b)
        }
    });
    for c in 0..4 {
        r[c] = _mm256_permute2f128_ps::<0x20>(s[c], s[4 + c]);
        r[c + 4] = _mm256_permute2f128_ps::<0x31>(s[c], s[4 + c]);
    }
}

/// The sum of the 8 lanes of `v`.
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn hsum256(v: std::arch::x86_64::__m256) -> f32 {
    use std::arch::x86_64::*;
    let lo = _mm256_castps256_ps128(v);
    let hi = _mm256_extractf128_ps(v, 1);
    let s = _mm_add_ps(lo, hi);
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    _mm_cvtss_f32(s)
}

/// [`avx512::dots_few`](super::avx512::dots_few) in 8 lanes: `y[(at.0 + i) * n + at.1 + r] =
/// rows[r] · x[i]`, `W` weight rows at a time against the `X` x rows (`W * X` accumulators),
/// each product summed as [`dot_rows`] sums it, so a row's result does not depend on the batch.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn dots_few<const X: usize, const W: usize>(
    rows: &[f32],
    x: [&[f32]; X],
    y: crate::cpu::kernels::OutPtr,
    n: usize,
    at: (usize, usize),
) {
    let k = x[0].len();
    let vk = k / 8 * 8;
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
        let mut acc = [[_mm256_setzero_ps(); X]; W];
        let mut o = 0;
        while o < vk {
            let xv: [__m256; X] = std::array::from_fn(|i| _mm256_loadu_ps(x[i].as_ptr().add(o)));
            for j in 0..W {
                let wv = _mm256_loadu_ps(p[j].add(o));
                for i in 0..X {
                    acc[j][i] = _mm256_fmadd_ps(wv, xv[i], acc[j][i]);
                }
            }
            o += 8;
        }
        for j in 0..W {
            for i in 0..X {
                put(i, r + j, hsum256(acc[j][i]) + dot_tail(p[j], x[i]));
            }
        }
        r += W;
    }
    while r < count {
        let p = rows.as_ptr().add(r * k);
        let mut acc = [_mm256_setzero_ps(); X];
        let mut o = 0;
        while o < vk {
            let wv = _mm256_loadu_ps(p.add(o));
            for i in 0..X {
                acc[i] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x[i].as_ptr().add(o)), acc[i]);
            }
            o += 8;
        }
        for i in 0..X {
            put(i, r, hsum256(acc[i]) + dot_tail(p, x[i]));
        }
        r += 1;
    }
}

/// `ys[r] = rows[r] · x` for each row of `rows` (row-major, `x.len()` columns).
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn dot_rows(rows: &[f32], x: &[f32], ys: &mut [f32]) {
    use std::arch::x86_64::*;
    let k = x.len();
    let vk = k / 8 * 8;
    let hsum = |v: __m256| hsum256(v);
    let xp = x.as_ptr();
    let mut r = 0;
    // Four rows at a time share each load of x.
    while r + 4 <= ys.len() {
        let p = [0, 1, 2, 3].map(|i| rows.as_ptr().add((r + i) * k));
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut i = 0;
        while i < vk {
            let xv = _mm256_loadu_ps(xp.add(i));
            for j in 0..4 {
                acc[j] = _mm256_fmadd_ps(_mm256_loadu_ps(p[j].add(i)), xv, acc[j]);
            }
            i += 8;
        }
        for j in 0..4 {
            let tail: f32 = x[vk..]
                .iter()
                .enumerate()
                .map(|(o, &xv)| *p[j].add(vk + o) * xv)
                .sum();
            ys[r + j] = hsum(acc[j]) + tail;
        }
        r += 4;
    }
    while r < ys.len() {
        let p = rows.as_ptr().add(r * k);
        let mut acc = _mm256_setzero_ps();
        let mut i = 0;
        while i < vk {
            acc = _mm256_fmadd_ps(_mm256_loadu_ps(p.add(i)), _mm256_loadu_ps(xp.add(i)), acc);
            i += 8;
        }
        let tail: f32 = x[vk..]
            .iter()
            .enumerate()
            .map(|(o, &xv)| *p.add(vk + o) * xv)
            .sum();
        ys[r] = hsum(acc) + tail;
        r += 1;
    }
}
