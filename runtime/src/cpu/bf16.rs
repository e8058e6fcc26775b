//! bf16 CPU tensors on the f32 kernels.
//!
//! PyTorch's CPU ops on bf16 compute in f32 and round once: a GEMM accumulates in f32 (with
//! the bias added to the accumulator), an activation widens each element, computes and
//! rounds. So does this module: values widen to f32 as they are loaded (a GEMM on AVX-512
//! BF16 multiplies bf16 pairs into f32 sums instead), the kernels of [`super::kernels`] run,
//! and each result rounds to the nearest bf16 (ties to even) once. Candle's own bf16 CPU ops run scalar loops over libm instead, and a bf16
//! `Linear` with a bias widened its whole weight on every call.
//!
//! [`Lane`] is the 16-lane load/store both element types share, so one elementwise kernel
//! serves f32 and bf16 tensors. x86-64 only, as the kernels are.

use half::bf16;

use super::kernels::{
    gemm, matmul_wt_with, pack_rows, par_units, row_start, with_slice, Dot, OutPtr, NR,
};
use crate::cpu::features;
use crate::{Device, Result, Tensor};

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
        std::arch::x86_64::_mm512_maskz_loadu_ps(super::x86::avx512::tail_mask(n), p)
    }

    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn store16(p: *mut f32, n: usize, v: std::arch::x86_64::__m512) {
        std::arch::x86_64::_mm512_mask_storeu_ps(p, super::x86::avx512::tail_mask(n), v)
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
unsafe fn to_bf16_bits(v: std::arch::x86_64::__m512) -> std::arch::x86_64::__m512i {
    use std::arch::x86_64::*;
    let b = _mm512_castps_si512(v);
    let odd = _mm512_and_si512(_mm512_srli_epi32::<16>(b), _mm512_set1_epi32(1));
    let bias = _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF));
    let rounded = _mm512_srli_epi32::<16>(_mm512_add_epi32(b, bias));
    let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v, v);
    let quiet = _mm512_or_si512(_mm512_srli_epi32::<16>(b), _mm512_set1_epi32(0x40));
    _mm512_mask_mov_epi32(rounded, nan, quiet)
}

thread_local! {
    /// Per-thread f32 copies of the weight rows of one panel, reused across calls.
    static WIDE: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// `x [m, k] @ w [n, k]ᵀ (+ bias [n])` for contiguous bf16 CPU tensors, as PyTorch's
/// `addmm` computes it in bf16: the products of bf16 values are exact in f32, they and the
/// bias accumulate in f32, and the sum rounds once. With AVX-512 BF16 the tile kernel
/// multiplies bf16 pairs directly (`vdpbf16ps`, twice the products per instruction of an
/// f32 FMA, half the bytes per packed panel); otherwise the f32 tile kernel runs on the
/// values widened as they are packed. Either way no f32 copy of the weight is kept. `None`
/// where the tile kernel does not apply (see [`matmul_wt_with`]) or the operands are not
/// contiguous bf16 on the CPU.
pub(crate) fn matmul_wt(x: &Tensor, w: &Tensor, bias: Option<&Tensor>) -> Option<Result<Tensor>> {
    if x.rank() != 2 || w.rank() != 2 || x.shape()[1] != w.shape()[1] || !features::avx512() {
        return None;
    }
    let (m, k, n) = (x.shape()[0], x.shape()[1], w.shape()[0]);
    if bias.is_some_and(|b| b.shape() != [n]) {
        return None;
    }
    let c = with_slice(x, |a| with_slice(w, |b| product(a, b, m, k, n)))???;
    let bias = match bias {
        Some(b) => Some(with_slice(b, widen)?),
        None => None,
    };
    Some(Tensor::from_vec(
        narrow(&c, bias.as_deref()),
        &[m, n],
        &Device::Cpu,
    ))
}

/// The f32 sums of `a [m, k] @ b [n, k]ᵀ`.
fn product(a: &[bf16], b: &[bf16], m: usize, k: usize, n: usize) -> Option<Vec<f32>> {
    // On AMX, the tile unit's bf16 products (the ones oneDNN gives PyTorch there).
    use half::slice::HalfFloatSliceExt;
    let (ab, bb) = (a.reinterpret_cast(), b.reinterpret_cast());
    use crate::cpu::x86::amx_gemm::{matmul_wt as tiles, Operand};
    if let Some(c) = tiles(Operand::Bf16(ab), Operand::Bf16(bb), m, k, n) {
        return Some(c);
    }
    if let (Some(ap), Some(bp)) = (pairs(a, k), pairs(b, k)) {
        let kp = k / 2;
        let pack = |panel: usize, out: &mut [f32]| {
            let rows: [&[f32]; NR] =
                std::array::from_fn(|j| &bp[(panel * NR + j) * kp..(panel * NR + j + 1) * kp]);
            pack_rows(&rows, kp, out)
        };
        if let Some(c) = gemm(ap, m, kp, n, &pack, Dot::Bf16Pairs) {
            return Some(c);
        }
    }
    let a = widen(a);
    matmul_wt_with(&a, m, k, n, &|panel, out| {
        WIDE.with(|s| {
            let mut s = s.borrow_mut();
            s.resize(NR * k, 0.0);
            let rows = &b[panel * NR * k..(panel + 1) * NR * k];
            half::slice::HalfFloatSliceExt::convert_to_f32_slice(rows, &mut s[..]);
            let rows: [&[f32]; NR] = std::array::from_fn(|j| &s[j * k..(j + 1) * k]);
            pack_rows(&rows, k, out)
        })
    })
}

/// Rows of an even length `k` of bf16 values as pairs, each pair's bits in one f32 slot
/// (the lower k in the low half, as x86 stores them): what [`Dot::Bf16Pairs`] multiplies.
/// The slots are only moved (packed, broadcast), never computed on as f32. `None` for an
/// odd `k` or storage not 4-byte aligned.
fn pairs(v: &[bf16], k: usize) -> Option<&[f32]> {
    if !k.is_multiple_of(2) || !(v.as_ptr() as usize).is_multiple_of(4) {
        return None;
    }
    // SAFETY: the pointer is 4-byte aligned and the len/2 slots lie inside `v`; any bit
    // pattern is a valid f32.
    Some(unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<f32>(), v.len() / 2) })
}

/// bf16 values as f32 (exact).
fn widen(v: &[bf16]) -> Vec<f32> {
    convert_flat(v)
}

/// The f32 rows `v` (each `bias.len()` long when a bias is given) plus the bias, rounded to
/// bf16 once.
fn narrow(v: &[f32], bias: Option<&[f32]>) -> Vec<bf16> {
    match bias {
        Some(b) if !b.is_empty() => convert(v, v.len() / b.len(), b.len(), |r| r * b.len(), bias),
        _ => convert_flat(v),
    }
}

/// Candle's cast of an eager CPU tensor between f32 and bf16 (`Op::Cast`), as one
/// vectorised pass on the pool (candle's own converts element by element on one thread, a
/// fifth of a bf16 diffusion step): any layout whose last dim is contiguous, the output
/// contiguous. `None` for other dtypes, devices or layouts.
pub(crate) fn cast(
    x: &candle_core::Tensor,
    to: candle_core::DType,
) -> Option<candle_core::Result<candle_core::Tensor>> {
    use candle_core::{CpuStorage, DType as C, Storage};
    let (storage, layout) = x.storage_and_layout();
    let (dims, strides) = (layout.dims(), layout.stride());
    let row = *dims.last()?;
    if !features::avx512() || row == 0 || (strides.last() != Some(&1) && row > 1) {
        return None;
    }
    let rows = dims.iter().product::<usize>() / row;
    let at = row_start(layout);
    let flat = layout.contiguous_offsets();
    let cpu = &candle_core::Device::Cpu;
    let t = match (&*storage, to, flat) {
        (Storage::Cpu(CpuStorage::F32(v)), C::BF16, Some((a, e))) => {
            candle_core::Tensor::from_vec(convert_flat::<f32, bf16>(&v[a..e]), dims, cpu)
        }
        (Storage::Cpu(CpuStorage::BF16(v)), C::F32, Some((a, e))) => {
            candle_core::Tensor::from_vec(convert_flat::<bf16, f32>(&v[a..e]), dims, cpu)
        }
        (Storage::Cpu(CpuStorage::F32(v)), C::BF16, None) => {
            candle_core::Tensor::from_vec(convert::<f32, bf16>(v, rows, row, at, None), dims, cpu)
        }
        (Storage::Cpu(CpuStorage::BF16(v)), C::F32, None) => {
            candle_core::Tensor::from_vec(convert::<bf16, f32>(v, rows, row, at, None), dims, cpu)
        }
        _ => return None,
    };
    Some(t)
}

/// `rows` rows of `row` values from `v`, row r starting at `at(r)`, converted to `D` (plus
/// `bias`, `row` values, before the rounding), in chunks of whole rows on the pool.
/// The caller has checked AVX-512F.
fn convert<S: Lane, D: Lane>(
    v: &[S],
    rows: usize,
    row: usize,
    at: impl Fn(usize) -> usize + Sync,
    bias: Option<&[f32]>,
) -> Vec<D> {
    let n = rows * row;
    let mut out: Vec<D> = Vec::with_capacity(n);
    let op = OutPtr(out.as_mut_ptr());
    let per = (CHUNK / row).max(1);
    par_units(rows.div_ceil(per), |c| {
        for r in c * per..((c + 1) * per).min(rows) {
            // SAFETY: AVX-512F was checked by the callers; row r of the output is this
            // task's alone and inside out's capacity; the source row lies inside `v`.
            unsafe { convert_row(v[at(r)..].as_ptr(), op.get().add(r * row), row, bias) }
        }
    });
    // SAFETY: the tasks wrote all n values.
    unsafe { out.set_len(n) };
    out
}

/// A contiguous buffer converted to `D`, in chunks on the pool. The caller has checked
/// AVX-512F.
fn convert_flat<S: Lane, D: Lane>(v: &[S]) -> Vec<D> {
    let mut out: Vec<D> = Vec::with_capacity(v.len());
    let op = OutPtr(out.as_mut_ptr());
    par_units(v.len().div_ceil(CHUNK), |c| {
        let (a, e) = (c * CHUNK, ((c + 1) * CHUNK).min(v.len()));
        // SAFETY: AVX-512F was checked by the callers; a..e is this task's alone and inside
        // both buffers.
        unsafe { convert_row(v.as_ptr().add(a), op.get().add(a), e - a, None) }
    });
    // SAFETY: the tasks wrote all values.
    unsafe { out.set_len(v.len()) };
    out
}

/// Values per task of a conversion.
const CHUNK: usize = 16 * 1024;

/// One operand of [`binary`]: a buffer read at the output's index modulo `period`.
#[derive(Clone, Copy)]
struct Operand {
    p: *const bf16,
    period: usize,
}

// SAFETY: an Operand only reads a buffer that `binary` keeps borrowed until its tasks end.
unsafe impl Sync for Operand {}
unsafe impl Send for Operand {}

/// Candle's broadcasting `Op::Binary` add, sub, mul or div of two bf16 CPU tensors as one
/// vectorised pass on the pool: each pair widened, combined in f32 and rounded once, as
/// PyTorch's and candle's bf16 ops compute (candle's own pass rounds through a call per 8
/// values, on one thread for small tensors). Both operands contiguous, each either the
/// output's size or repeated along its leading dims (a bias, a modulation row, a scalar).
/// `None` otherwise.
pub(crate) fn binary(
    op: crate::op::BinaryOp,
    a: &candle_core::Tensor,
    b: &candle_core::Tensor,
) -> Option<candle_core::Result<candle_core::Tensor>> {
    use crate::op::BinaryOp as B;
    use candle_core::{CpuStorage, DType as C, Storage};
    // Every eager binary op asks: decline the others before any shape work.
    let bf16s = a.dtype() == C::BF16 && b.dtype() == C::BF16;
    if !bf16s || !matches!(op, B::Add | B::Sub | B::Mul | B::Div) || !features::avx512() {
        return None;
    }
    let out = a
        .shape()
        .broadcast_shape_binary_op(b.shape(), "binary")
        .ok()?;
    let n = out.elem_count();
    // Where `t`'s values repeat: n when it is the output's size, else its own size when its
    // dims (leading ones dropped) are the output's last dims, in runs of 16+ or one value.
    let period = |t: &candle_core::Tensor| {
        let own: Vec<usize> = t.dims().iter().copied().skip_while(|&d| d == 1).collect();
        let p = t.elem_count();
        let trailing = out.dims().ends_with(&own);
        (p == n || (trailing && (p == 1 || p >= 16))).then_some(p)
    };
    let (pa, pb) = (period(a)?, period(b)?);
    if n == 0 || (pa != n && pb != n) {
        return None;
    }
    let (sa, la) = a.storage_and_layout();
    let (sb, lb) = b.storage_and_layout();
    let (Storage::Cpu(CpuStorage::BF16(va)), Storage::Cpu(CpuStorage::BF16(vb))) = (&*sa, &*sb)
    else {
        return None;
    };
    let ((a0, _), (b0, _)) = (la.contiguous_offsets()?, lb.contiguous_offsets()?);
    let (x, y) = (
        Operand {
            p: va[a0..].as_ptr(),
            period: pa,
        },
        Operand {
            p: vb[b0..].as_ptr(),
            period: pb,
        },
    );
    // Chunks of whole periods of the repeated operand, so each run starts at its index 0.
    let step = match pa.min(pb) {
        1 => CHUNK,
        p if p == n => CHUNK,
        p => (CHUNK / p).max(1) * p,
    };
    let mut v: Vec<bf16> = Vec::with_capacity(n);
    let vp = OutPtr(v.as_mut_ptr());
    par_units(n.div_ceil(step), |c| {
        let (s, e) = (c * step, ((c + 1) * step).min(n));
        // SAFETY: AVX-512F was checked; s..e is this task's alone, inside the output, and
        // inside each operand at its index modulo its period.
        unsafe { combine(op, x, y, s, e, vp.get()) }
    });
    // SAFETY: the tasks wrote all n values.
    unsafe { v.set_len(n) };
    Some(candle_core::Tensor::from_vec(
        v,
        out,
        &candle_core::Device::Cpu,
    ))
}

/// Output values `s..e` of `x op y`, in runs that end where a repeated operand wraps, so
/// within a run each operand reads on from the run's start.
///
/// SAFETY: AVX-512F must be available; `out` valid for `e` values; `s` a multiple of each
/// period below `e - s`.
#[target_feature(enable = "avx512f")]
unsafe fn combine(
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
unsafe fn convert_row<S: Lane, D: Lane>(
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::features::taken;
    use crate::{DType, Generator};

    #[test]
    fn rounds_like_half() {
        if !features::avx512() {
            eprintln!("no AVX-512 here: the bf16 lanes are off");
            return;
        }
        let specials = [
            0.0f32,
            -0.0,
            1.0,
            f32::from_bits(0x3F80_8000), // 1 + 2^-8, a tie: rounds down to even
            f32::from_bits(0x3F81_8000), // 1 + 3 * 2^-8, a tie: rounds up to even
            f32::MAX,
            f32::MIN_POSITIVE,
            1e-40,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            f32::from_bits(0x7F80_0001), // a signalling NaN stays a NaN
        ];
        let mut g = Generator::new(5);
        let rand = g
            .randn(&[1000], DType::F32, &Device::Cpu)
            .unwrap()
            .to_vec::<f32>()
            .unwrap();
        let all: Vec<f32> = specials.iter().copied().chain(rand).collect();
        for chunk in all.chunks(16) {
            let mut got = [bf16::ZERO; 16];
            // SAFETY: AVX-512F was detected; both buffers hold chunk.len() <= 16 values.
            let back = unsafe {
                let v = f32::load16(chunk.as_ptr(), chunk.len());
                bf16::store16(got.as_mut_ptr(), chunk.len(), v);
                let mut r = [0f32; 16];
                f32::store16(r.as_mut_ptr(), 16, bf16::round(v));
                r
            };
            for (i, &x) in chunk.iter().enumerate() {
                let want = bf16::from_f32(x);
                assert!(
                    got[i].to_bits() == want.to_bits() || (x.is_nan() && got[i].is_nan()),
                    "{x:e}: {:#06x} vs half's {:#06x}",
                    got[i].to_bits(),
                    want.to_bits()
                );
                assert!(back[i].to_bits() == want.to_f32().to_bits() || x.is_nan());
            }
        }
    }

    #[test]
    fn matmul_matches_the_widened_product() {
        use crate::cpu::features::Tier;
        crate::cpu::features::each_tier(|tier| {
            // An even k takes the bf16-pair kernel (where the CPU has it), an odd one the
            // widened f32 kernel.
            for k in [70, 71] {
                product_case(37, k, 64, tier >= Tier::Avx512);
            }
            // k a multiple of 32 and 32+ rows: the tile unit where the CPU has AMX, with a
            // row block and a panel of columns cut short (which only the tiles take).
            product_case(37, 96, 50, tier >= Tier::Amx);
            product_case(64, 256, 64, tier >= Tier::Avx512);
            use crate::cpu::x86::amx_gemm::{matmul_wt as tiles, Operand};
            let (a, b) = (Operand::Bf16(&[0; 37 * 96]), Operand::Bf16(&[0; 50 * 96]));
            let taken = tiles(a, b, 37, 96, 50);
            assert_eq!(taken.is_some(), crate::cpu::features::amx());
        });
    }

    /// The pool's binary ops equal candle's bit for bit: same shapes, a repeated row either
    /// side, a scalar either side, tails shorter than 16 lanes; and decline what they skip.
    #[test]
    fn binary_ops_equal_candles() {
        crate::cpu::features::each_tier(|_tier| {
            use crate::op::BinaryOp as B;
            let mut g = Generator::new(9);
            let mut bf = |shape: &[usize]| {
                let t = g.randn(shape, DType::F32, &Device::Cpu).unwrap();
                t.to_dtype(DType::BF16)
                    .unwrap()
                    .as_candle()
                    .unwrap()
                    .clone()
            };
            let cases = [
                (vec![3, 37, 20], vec![3, 37, 20]),
                (vec![3, 37, 20], vec![1, 1, 20]),
                (vec![37], vec![2, 5, 37]),
                (vec![2, 3, 19], vec![1]),
                (vec![], vec![4, 33]),
                (vec![1, 70_001], vec![1, 70_001]),
            ];
            for (sa, sb) in cases {
                let (a, b) = (bf(&sa), bf(&sb));
                for op in [B::Add, B::Sub, B::Mul, B::Div] {
                    let Some(fast) = binary(op, &a, &b) else {
                        assert!(!features::avx512(), "{op:?} {sa:?} {sb:?} declined");
                        return;
                    };
                    let want = match op {
                        B::Add => a.broadcast_add(&b),
                        B::Sub => a.broadcast_sub(&b),
                        B::Mul => a.broadcast_mul(&b),
                        _ => a.broadcast_div(&b),
                    };
                    let bits = |t: candle_core::Tensor| -> Vec<u16> {
                        let v = t.flatten_all().unwrap().to_vec1::<bf16>().unwrap();
                        v.iter().map(|x| x.to_bits()).collect()
                    };
                    assert_eq!(
                        bits(fast.unwrap()),
                        bits(want.unwrap()),
                        "{op:?} {sa:?} {sb:?}"
                    );
                }
            }
            // A repeat shorter than 16 values, two repeated operands, another op: candle's.
            let (a, b, c) = (bf(&[4, 5]), bf(&[5]), bf(&[4, 1]));
            assert!(binary(B::Add, &a, &b).is_none());
            assert!(binary(B::Add, &b, &c).is_none());
            assert!(binary(B::Maximum, &a, &a).is_none());
        });
    }

    /// One product against the widened one, where `runs` says the fast path takes it.
    fn product_case(m: usize, k: usize, n: usize, runs: bool) {
        let mut g = Generator::new(8);
        let bf = |shape: &[usize], g: &mut Generator| {
            g.randn(shape, DType::F32, &Device::Cpu)
                .unwrap()
                .to_dtype(DType::BF16)
                .unwrap()
        };
        let (x, w, b) = (bf(&[m, k], &mut g), bf(&[n, k], &mut g), bf(&[n], &mut g));
        let Some(fast) = taken(matmul_wt(&x, &w, Some(&b)), runs, "bf16 matmul_wt") else {
            return;
        };
        let fast = fast.unwrap().to_vec::<bf16>().unwrap();
        let f = |t: &Tensor| t.to_dtype(DType::F32).unwrap();
        let want = f(&x)
            .matmul(&f(&w).t().unwrap())
            .unwrap()
            .add(&f(&b))
            .unwrap()
            .to_vec::<f32>()
            .unwrap();
        for (i, (got, want)) in fast.iter().zip(&want).enumerate() {
            // The sums agree to f32 rounding, so the rounded results are the same bf16 or
            // neighbours when the f32 sum sits next to a rounding boundary.
            let (a, e) = (got.to_f32(), bf16::from_f32(*want).to_f32());
            assert!(
                (a - e).abs() <= e.abs() / 128.0 + 1e-6,
                "element {i}: {a} vs {e}"
            );
        }
    }
}
