//! The rotary embedding (`Tensor::apply_rotary`) of an f32 or bf16 CPU tensor (any layout
//! whose last dim is contiguous: heads transposed out of a projection) in one pass over it.
//!
//! The composite it replaces runs ten candle ops (narrows, four products, a sum and a
//! difference, a concatenation, strided copies), each a pass over the heads; a diffusion
//! transformer rotates every query and key of every block that way. This pass computes the
//! same ops in the same order and rounds where they round: each product, then the sum, to
//! the tensor's dtype (exactly what the composite's bf16 ops hand each other), so its results
//! equal the composite's bit for bit.

use half::bf16;

#[cfg(target_arch = "x86_64")]
use super::features;
use super::kernels::{par_units, row_start, with_slice, OutPtr, Stored};
#[cfg(target_arch = "x86_64")]
use super::x86::avx512::Lane;
use crate::{DType, Device, RopeStyle, Tensor};

/// What the vectorised rotation needs of an element type: its 16-lane loads and stores
/// where there are AVX-512 lanes, nothing elsewhere (the scalar loop serves).
#[cfg(target_arch = "x86_64")]
trait Lanes: Lane {}
#[cfg(not(target_arch = "x86_64"))]
trait Lanes {}
impl Lanes for f32 {}
impl Lanes for bf16 {}

/// An element type the pass reads and writes, computing in f32.
trait Value: Copy + Send + Sync + Stored + crate::Element + Lanes {
    fn wide(self) -> f32;
    /// `v` rounded to this type.
    fn narrow(v: f32) -> Self;
    /// `v` rounded to this type and widened back.
    fn rounded(v: f32) -> f32 {
        Self::narrow(v).wide()
    }
}

impl Value for f32 {
    fn wide(self) -> f32 {
        self
    }
    fn narrow(v: f32) -> f32 {
        v
    }
}

impl Value for bf16 {
    fn wide(self) -> f32 {
        self.to_f32()
    }
    fn narrow(v: f32) -> bf16 {
        // half's rounding (nearest, ties to even; a NaN stays a quiet NaN) without its
        // branches, so the loops over a row vectorise.
        let b = v.to_bits();
        let rounded = b.wrapping_add(0x7FFF + ((b >> 16) & 1)) >> 16;
        let quiet = (b >> 16) | 0x40;
        bf16::from_bits(if v.is_nan() { quiet } else { rounded } as u16)
    }
}

/// The storage of an eager CPU tensor of `T` and where each of its rows (last dim) starts;
/// `None` unless the last dim is contiguous.
fn with_rows<T: Value, R>(
    t: &Tensor,
    f: impl FnOnce(&[T], &(dyn Fn(usize) -> usize + Sync)) -> R,
) -> Option<R> {
    let c = t.as_candle()?;
    let (storage, layout) = c.storage_and_layout();
    let candle_core::Storage::Cpu(cpu) = &*storage else {
        return None;
    };
    let last = layout.dims().len().checked_sub(1)?;
    if layout.stride()[last] != 1 && layout.dims()[last] > 1 {
        return None;
    }
    Some(f(T::slice(cpu)?, &row_start(layout)))
}

/// `x [.., T, D]` rotated by the tables `cos`, `sin` (`[T, r/2]`, any leading dims of size
/// one; x's dtype), as the rotary composite computes it, into a contiguous tensor; `None`
/// when this path does not apply (another dtype or device, a last dim that is not
/// contiguous, tables that vary over x's leading dims).
pub(crate) fn rotary(
    x: &Tensor,
    cos: &Tensor,
    sin: &Tensor,
    style: RopeStyle,
) -> Option<crate::Result<Tensor>> {
    if x.rank() < 2 || cos.shape() != sin.shape() || cos.dtype() != x.dtype() {
        return None;
    }
    if x.device() != Device::Cpu {
        return None;
    }
    let (t, d) = (x.shape()[x.rank() - 2], x.shape()[x.rank() - 1]);
    let half = *cos.shape().last()?;
    let table: Vec<usize> = cos
        .shape()
        .iter()
        .copied()
        .skip_while(|&n| n == 1)
        .collect();
    let fits = table == [t, half] || (t == 1 && table.as_slice() == [half]);
    if !fits || half == 0 || 2 * half > d {
        return None;
    }
    fn go<T: Value>(
        x: &Tensor,
        [c, s]: [&Tensor; 2],
        dims: (usize, usize),
        style: RopeStyle,
    ) -> Option<crate::Result<Tensor>> {
        let y = with_slice(c, |c| {
            with_slice(s, |s| {
                with_rows::<T, _>(x, |v, at| pass(v, at, x.elem_count(), c, s, dims, style))
            })
        })???;
        Some(Tensor::from_vec(y, x.shape(), &Device::Cpu))
    }
    match x.dtype() {
        DType::F32 => go::<f32>(x, [cos, sin], (d, half), style),
        DType::BF16 => go::<bf16>(x, [cos, sin], (d, half), style),
        _ => None,
    }
}

/// The `n / d` rows of `d` values of `x`, row `i` at `at(i)`, each rotated by row `i % T` of
/// the tables `c`, `s` (`T` rows of `half` values); channels past `2 * half` pass through.
fn pass<T: Value>(
    x: &[T],
    at: &(dyn Fn(usize) -> usize + Sync),
    n: usize,
    c: &[T],
    s: &[T],
    (d, half): (usize, usize),
    style: RopeStyle,
) -> Vec<T> {
    let (rows, positions) = (n / d, c.len() / half);
    let mut out: Vec<T> = Vec::with_capacity(n);
    let op = OutPtr(out.as_mut_ptr());
    let per = (16 * 1024 / d).max(1);
    #[cfg(target_arch = "x86_64")]
    let avx512 = features::avx512();
    par_units(rows.div_ceil(per), |u| {
        for row in u * per..((u + 1) * per).min(rows) {
            let p = (row % positions) * half;
            let (c, s) = (&c[p..p + half], &s[p..p + half]);
            let x = &x[at(row)..at(row) + d];
            // Row `row` of the output, this task's alone and inside out's capacity.
            let y = op.get().wrapping_add(row * d);
            // The pair (a, b) of channels (i, j) becomes (a c - b s, b c + a s).
            let rotate = |i: usize, j: usize, k: usize| {
                let (a, b, c, s) = (x[i].wide(), x[j].wide(), c[k].wide(), s[k].wide());
                // SAFETY: i, j < d: inside this task's row.
                unsafe {
                    y.add(i)
                        .write(T::narrow(T::rounded(a * c) - T::rounded(b * s)));
                    y.add(j)
                        .write(T::narrow(T::rounded(b * c) + T::rounded(a * s)));
                }
            };
            match style {
                // SAFETY: AVX-512F is present; x, c and s hold the row's 2 * half values and
                // half table entries, y has the row's d slots.
                #[cfg(target_arch = "x86_64")]
                _ if avx512 => unsafe {
                    super::x86::avx512::rotate16(
                        x.as_ptr(),
                        y,
                        (c.as_ptr(), s.as_ptr()),
                        half,
                        style,
                    )
                },
                RopeStyle::RotateHalf => (0..half).for_each(|k| rotate(k, k + half, k)),
                RopeStyle::Interleaved => (0..half).for_each(|k| rotate(2 * k, 2 * k + 1, k)),
            }
            let pass = &x[2 * half..];
            // SAFETY: the last d - 2 * half values of this task's row.
            unsafe { std::ptr::copy_nonoverlapping(pass.as_ptr(), y.add(2 * half), pass.len()) };
        }
    });
    // SAFETY: the tasks wrote every row.
    unsafe { out.set_len(n) };
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::composite::Composite;
    use crate::op::Op;
    use crate::Generator;

    #[test]
    fn equals_the_composite_bit_for_bit() {
        crate::cpu::features::each_tier(|_tier| {
            let mut g = Generator::new(3);
            for dt in [DType::F32, DType::BF16] {
                for style in [RopeStyle::RotateHalf, RopeStyle::Interleaved] {
                    // Whole and partial rotary; tables with and without leading ones; rows longer
                    // than one 16-lane step, with a tail.
                    for (d, half, table) in [
                        (16, 8, vec![5, 8]),
                        (20, 6, vec![1, 1, 5, 6]),
                        (80, 37, vec![5, 37]),
                    ] {
                        // Heads transposed out of a [B, T, H, D] projection, as attention has them.
                        let x = g.randn(&[2, 5, 3, d], dt, &Device::Cpu).unwrap();
                        let x = x.transpose(1, 2).unwrap();
                        let c = g.randn(&table, dt, &Device::Cpu).unwrap();
                        let s = g.randn(&table, dt, &Device::Cpu).unwrap();
                        assert_eq!(*table.last().unwrap(), half);
                        let fast = rotary(&x, &c, &s, style)
                            .expect("the pass applies")
                            .unwrap();
                        let composite = Composite::Rotary(style);
                        let want =
                            Tensor::apply(Op::Composite(composite), &[&x, &c, &s], dt).unwrap();
                        let bits = |t: &Tensor| {
                            t.to_dtype(DType::F32)
                                .unwrap()
                                .to_vec::<f32>()
                                .unwrap()
                                .iter()
                                .map(|v| v.to_bits())
                                .collect::<Vec<_>>()
                        };
                        assert_eq!(bits(&fast), bits(&want), "{dt} {style:?} d={d}");
                    }
                }
            }
        });
    }

    #[test]
    fn declines_what_it_does_not_cover() {
        crate::cpu::features::each_tier(|_tier| {
            let mut g = Generator::new(4);
            let x = g.randn(&[2, 5, 8], DType::F32, &Device::Cpu).unwrap();
            // Per-batch tables, an input whose last dim is strided, transposed tables.
            let per_batch = g.randn(&[2, 5, 4], DType::F32, &Device::Cpu).unwrap();
            assert!(rotary(&x, &per_batch, &per_batch, RopeStyle::RotateHalf).is_none());
            let c = g.randn(&[5, 4], DType::F32, &Device::Cpu).unwrap();
            let xt = g.randn(&[2, 8, 5], DType::F32, &Device::Cpu).unwrap();
            let xt = xt.transpose(1, 2).unwrap();
            assert!(rotary(&xt, &c, &c, RopeStyle::RotateHalf).is_none());
            let ct = g.randn(&[4, 5], DType::F32, &Device::Cpu).unwrap();
            let ct = ct.t().unwrap();
            assert!(rotary(&x, &ct, &ct, RopeStyle::RotateHalf).is_none());
            let f16 = x.to_dtype(DType::F16).unwrap();
            let c16 = c.to_dtype(DType::F16).unwrap();
            assert!(rotary(&f16, &c16, &c16, RopeStyle::RotateHalf).is_none());
        });
    }
}
