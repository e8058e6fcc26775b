//! bf16 CPU tensors on the f32 kernels.
//!
//! PyTorch's CPU ops on bf16 compute in f32 and round once: a GEMM accumulates in f32 (with
//! the bias added to the accumulator), an activation widens each element, computes and
//! rounds. So does this module: values widen to f32 as they are loaded (a GEMM on AVX-512
//! BF16 multiplies bf16 pairs into f32 sums instead), the kernels of [`super::kernels`] run,
//! and each result rounds to the nearest bf16 (ties to even) once. Candle's own bf16 CPU ops run scalar loops over libm instead, and a bf16
//! `Linear` with a bias widened its whole weight on every call.
//!
//! [`Lane`] (in `x86::avx512`, with this module's other AVX-512 loops) is the 16-lane
//! load/store both element types share, so one elementwise kernel serves f32 and bf16
//! tensors. x86-64 only, as the kernels are.

use half::bf16;

use super::kernels::{
    gemm, matmul_wt_with, pack_rows, par_units, row_start, with_slice, Dot, OutPtr, NR,
};
use super::x86::avx512::{combine, convert_row, Lane, Operand};
use crate::cpu::features;
use crate::{Device, Result, Tensor};

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
