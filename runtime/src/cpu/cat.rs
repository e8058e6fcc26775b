//! `Tensor::cat` of contiguous f32 or bf16 CPU tensors, copied on every pool thread.
//!
//! Candle's concatenation copies on the calling thread. A diffusion transformer joins its
//! text and image streams, and each single-stream block its attention and MLP outputs,
//! several times per step: in a FLUX.1-shaped step on two threads those copies were the
//! largest serial stretch. The result is the same values in the same places.

use super::kernels::{par_fill, with_slice, Stored};
use crate::{DType, Device, Tensor};

/// Output values per parallel unit.
const UNIT: usize = 32 * 1024;

/// `tensors` joined along `dim` (shapes already checked to agree elsewhere), or `None` where
/// this copy does not apply (another device or dtype, a strided input, or too few values to
/// be worth a parallel region).
pub(crate) fn cat(tensors: &[&Tensor], dim: usize) -> Option<crate::Result<Tensor>> {
    let first = tensors.first()?;
    let numel = |t: &Tensor| t.shape().iter().product::<usize>();
    let total: usize = tensors.iter().map(|t| numel(t)).sum();
    if total < 2 * UNIT || tensors.iter().any(|t| t.device() != Device::Cpu) {
        return None;
    }
    let mut shape = first.shape().to_vec();
    shape[dim] = tensors.iter().map(|t| t.shape()[dim]).sum();
    // Each input contributes `inner[i]` consecutive values to every one of `outer` rows.
    let outer: usize = shape[..dim].iter().product();
    let inner: Vec<usize> = tensors.iter().map(|t| numel(t) / outer.max(1)).collect();
    fn go<T: Stored + crate::Element + Copy + Send + Sync>(
        tensors: &[&Tensor],
        inner: &[usize],
        shape: &[usize],
        total: usize,
    ) -> Option<crate::Result<Tensor>> {
        with_all::<T, _>(tensors, &mut Vec::new(), &mut |srcs| {
            let row: usize = inner.iter().sum();
            let y = par_fill(total, UNIT, |start, end, out: *mut T| {
                let mut at = start;
                while at < end {
                    let (o, mut off) = (at / row, at % row);
                    let mut i = 0;
                    while off >= inner[i] {
                        off -= inner[i];
                        i += 1;
                    }
                    let n = (inner[i] - off).min(end - at);
                    // SAFETY: input i holds `outer * inner[i]` values and its row o starts at
                    // o * inner[i]; `out` holds this chunk's outputs [start, end), of which
                    // [at, at + n) lie inside; the inputs' storage is borrowed for the region.
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            srcs[i].get().add(o * inner[i] + off),
                            out.add(at - start),
                            n,
                        )
                    };
                    at += n;
                }
            });
            Tensor::from_vec(y, shape, &Device::Cpu)
        })
    }
    match first.dtype() {
        DType::F32 => go::<f32>(tensors, &inner, &shape, total),
        DType::BF16 => go::<half::bf16>(tensors, &inner, &shape, total),
        _ => None,
    }
}

/// An input's first value, shared with the pool's threads (which only read it).
struct SrcPtr<T>(*const T);
// Copy whatever `T` is (a derive would ask `T: Copy`).
impl<T> Clone for SrcPtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for SrcPtr<T> {}
// SAFETY: the pointee is read, never written, while the parallel region runs.
unsafe impl<T> Send for SrcPtr<T> {}
unsafe impl<T> Sync for SrcPtr<T> {}

impl<T> SrcPtr<T> {
    fn get(self) -> *const T {
        self.0
    }
}

/// Calls `f` with the first value of each of `tensors`, all borrowed at once (each borrow
/// holds its storage's lock until `f` returns); `None` when one is not a contiguous CPU
/// tensor of `T`.
fn with_all<T: Stored, R>(
    tensors: &[&Tensor],
    got: &mut Vec<SrcPtr<T>>,
    f: &mut dyn FnMut(&[SrcPtr<T>]) -> R,
) -> Option<R> {
    match tensors.split_first() {
        None => Some(f(got)),
        Some((t, rest)) => with_slice(t, |s: &[T]| {
            got.push(SrcPtr(s.as_ptr()));
            let r = with_all(rest, got, f);
            got.pop();
            r
        })
        .flatten(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::random::Generator;

    /// Joins along every dim, of two and three inputs, f32 and bf16, equal to the backend's
    /// own concatenation value for value; small or strided inputs are left to it.
    #[test]
    fn joins_equal_the_backends() {
        let mut g = Generator::new(3);
        for (shapes, dim) in [
            (vec![[2usize, 300, 64], [2, 212, 64]], 1usize),
            (vec![[1, 384, 256], [1, 384, 1024]], 2),
            (vec![[40, 30, 64], [9, 30, 64], [70, 30, 64]], 0),
            (vec![[3, 5000, 7], [3, 5000, 1]], 2),
        ] {
            for dtype in [DType::F32, DType::BF16] {
                let ts: Vec<Tensor> = shapes
                    .iter()
                    .map(|s| g.randn(s, DType::F32, &Device::Cpu).unwrap())
                    .map(|t| t.to_dtype(dtype).unwrap())
                    .collect();
                let refs: Vec<&Tensor> = ts.iter().collect();
                let fast = cat(&refs, dim).expect("a large contiguous join").unwrap();
                let slow = Tensor::apply(crate::op::Op::Concat { dim }, &refs, dtype).unwrap();
                assert_eq!(fast.shape(), slow.shape());
                assert_eq!(
                    fast.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap(),
                    slow.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap(),
                    "{shapes:?} along {dim}, {dtype:?}"
                );
            }
        }
        let small = Tensor::zeros(&[2, 3], DType::F32, &Device::Cpu).unwrap();
        assert!(cat(&[&small, &small], 0).is_none());
        let big = g.randn(&[300, 400], DType::F32, &Device::Cpu).unwrap();
        let strided = big.transpose(0, 1).unwrap();
        assert!(cat(&[&strided, &strided], 0).is_none());
    }
}
