//! 2-D convolution of f32 CPU tensors as the tile GEMM of [`super::kernels`], with the
//! input's patches gathered straight into the GEMM's packed panels (an implicit im2col).
//!
//! Per image, the output `[O, H'·W']` is the weight `[O, C·kh·kw]` (as stored) times the
//! patch matrix `[C·kh·kw, H'·W']`; each 32-position panel of that matrix is built when the
//! GEMM packs it, so no patch buffer is materialised. Candle's path (an im2col buffer, then
//! its AVX2 GEMM on a second thread pool) was a quarter of a UNet step; this runs on the
//! runtime's one pool. Sums run in another order than candle's, so results agree to f32
//! rounding, as any two GEMMs do.

use candle_core::{CpuStorage, Storage, Tensor as CT};

use super::kernels::{matmul_wt_with, NR};
use crate::op::ConvGeom;

/// `conv2d(x [N, C, H, W], w [O, C, kh, kw])` for contiguous f32 CPU tensors with one group;
/// `None` where this path does not apply (other dtypes, layouts or groups, no AVX2, an
/// output whose positions are not a multiple of 32, fewer than 8 output channels).
pub(crate) fn conv2d(x: &CT, w: &CT, g: &ConvGeom) -> Option<candle_core::Result<CT>> {
    let (&[n, c, h, wd], &[o, wc, kh, kw]) = (x.dims(), w.dims()) else {
        return None;
    };
    if g.groups != 1 || wc != c || g.stride == 0 || g.dilation == 0 {
        return None;
    }
    let span = |size: usize, k: usize| {
        (size + 2 * g.padding)
            .checked_sub(g.dilation * (k - 1) + 1)
            .map(|r| r / g.stride + 1)
    };
    let (oh, ow) = (span(h, kh)?, span(wd, kw)?);
    let (positions, depth) = (oh * ow, c * kh * kw);
    if !positions.is_multiple_of(NR) || depth == 0 {
        return None;
    }
    let (xs, xl) = x.storage_and_layout();
    let (ws, wl) = w.storage_and_layout();
    let (Storage::Cpu(CpuStorage::F32(xv)), Storage::Cpu(CpuStorage::F32(wv))) = (&*xs, &*ws)
    else {
        return None;
    };
    let ((x0, x1), (w0, w1)) = (xl.contiguous_offsets()?, wl.contiguous_offsets()?);
    let (xv, wv) = (&xv[x0..x1], &wv[w0..w1]);
    let geo = Patches {
        c,
        h,
        w: wd,
        kh,
        kw,
        ow,
        g: *g,
    };
    let images: Option<Vec<Vec<f32>>> = xv
        .chunks_exact(c * h * wd)
        .map(|img| matmul_wt_with(wv, o, depth, positions, &|p, dst| geo.pack(img, p, dst)))
        .collect();
    // One image's product is the output as it is; several are laid one after another.
    let mut images = images?;
    let out = match images.len() {
        1 => images.pop()?,
        _ => images.concat(),
    };
    Some(CT::from_vec(out, (n, o, oh, ow), &candle_core::Device::Cpu))
}

/// Where one image's patches come from.
struct Patches {
    c: usize,
    h: usize,
    w: usize,
    kh: usize,
    kw: usize,
    /// Output width.
    ow: usize,
    g: ConvGeom,
}

impl Patches {
    /// Panel `panel` of the patch matrix (output positions `panel·32 ..`, each a column of
    /// `C·kh·kw` values in the weight's `(c, ky, kx)` order), packed `dst[kk·32 + j]`; zeros
    /// where a patch reaches into the padding.
    fn pack(&self, img: &[f32], panel: usize, dst: &mut [f32]) {
        let (s, p, d) = (self.g.stride, self.g.padding as isize, self.g.dilation);
        let taps = self.kh * self.kw;
        // The offset inside one channel that each (tap, position) reads, or None for padding.
        let mut at = vec![None; taps * NR];
        for j in 0..NR {
            let pos = panel * NR + j;
            let (y, x) = ((pos / self.ow * s) as isize, (pos % self.ow * s) as isize);
            for ky in 0..self.kh {
                for kx in 0..self.kw {
                    let iy = y + (ky * d) as isize - p;
                    let ix = x + (kx * d) as isize - p;
                    let inside =
                        (0..self.h as isize).contains(&iy) && (0..self.w as isize).contains(&ix);
                    at[(ky * self.kw + kx) * NR + j] =
                        inside.then(|| iy as usize * self.w + ix as usize);
                }
            }
        }
        let plane = self.h * self.w;
        for (ch, rows) in dst.chunks_exact_mut(taps * NR).take(self.c).enumerate() {
            let src = &img[ch * plane..(ch + 1) * plane];
            for (v, a) in rows.iter_mut().zip(&at) {
                *v = a.map_or(0.0, |a| src[a]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_candles_convolution() {
        crate::cpu::features::each_tier(|_tier| {
            let dev = candle_core::Device::Cpu;
            // (N, C, H, W, O, k, stride, padding, dilation): a UNet's 3x3 and 1x1 convs, a
            // strided downsample, a dilated kernel, a rectangular image.
            for (n, c, h, w, o, k, stride, padding, dilation) in [
                (
                    2usize, 5usize, 8usize, 8usize, 12usize, 3usize, 1usize, 1usize, 1usize,
                ),
                (1, 7, 8, 12, 9, 1, 1, 0, 1),
                (1, 4, 16, 16, 8, 3, 2, 1, 1),
                (1, 3, 10, 10, 8, 3, 1, 1, 2),
            ] {
                let x = CT::randn(0f32, 1.0, (n, c, h, w), &dev).unwrap();
                let wt = CT::randn(0f32, 1.0, (o, c, k, k), &dev).unwrap();
                let g = ConvGeom {
                    stride,
                    padding,
                    dilation,
                    groups: 1,
                    output_padding: 0,
                };
                let Some(fast) = conv2d(&x, &wt, &g) else {
                    assert!(!crate::cpu::features::avx2(), "the path should apply");
                    continue;
                };
                let fast = fast.unwrap();
                let want = x.conv2d(&wt, padding, stride, dilation, 1).unwrap();
                assert_eq!(fast.dims(), want.dims());
                let (a, b) = (
                    fast.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
                    want.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
                );
                for (i, (a, b)) in a.iter().zip(&b).enumerate() {
                    assert!((a - b).abs() <= 1e-5 * (1.0 + b.abs()), "{i}: {a} vs {b}");
                }
            }
        });
    }

    #[test]
    fn declines_what_it_does_not_cover() {
        let dev = candle_core::Device::Cpu;
        let g = |groups| ConvGeom {
            stride: 1,
            padding: 1,
            dilation: 1,
            groups,
            output_padding: 0,
        };
        let x = CT::randn(0f32, 1.0, (1, 4, 8, 8), &dev).unwrap();
        // Grouped, and 7x7 = 49 output positions (not a multiple of 32).
        let grouped = CT::randn(0f32, 1.0, (8, 2, 3, 3), &dev).unwrap();
        assert!(conv2d(&x, &grouped, &g(2)).is_none());
        let odd = CT::randn(0f32, 1.0, (1, 4, 7, 7), &dev).unwrap();
        let wt = CT::randn(0f32, 1.0, (8, 4, 3, 3), &dev).unwrap();
        assert!(conv2d(&odd, &wt, &g(1)).is_none());
    }
}
