//! What the vision transformers (ViT, CLIP's vision tower) share: the patch embedding and
//! position embeddings interpolated to another patch grid.

use zoo_runtime::nn::{Linear, Weights};
use zoo_runtime::{DType, Tensor};

use crate::{Error, Result};

/// A convolution whose stride is its kernel (`nn.Conv2d(C, hidden, kernel_size=patch,
/// stride=patch)`), computed as what it is: one matrix product over flattened
/// non-overlapping patches. Rows and columns past the last whole patch are dropped, as the
/// convolution drops them.
#[derive(Clone, Debug)]
pub struct PatchEmbedding {
    proj: Linear,
    channels: usize,
    patch: (usize, usize),
}

impl PatchEmbedding {
    /// Reads `weight [hidden, channels, ph, pw]` (and `bias [hidden]`) under `w`.
    pub fn load(
        w: &Weights,
        channels: usize,
        hidden: usize,
        patch: (usize, usize),
        bias: bool,
    ) -> Result<PatchEmbedding> {
        let (ph, pw) = patch;
        let weight = w
            .get("weight", &[hidden, channels, ph, pw])?
            .reshape_to(&[hidden, channels * ph * pw])?;
        let bias = if bias {
            Some(w.get("bias", &[hidden])?)
        } else {
            None
        };
        Ok(PatchEmbedding {
            proj: Linear::new(weight, bias),
            channels,
            patch,
        })
    }

    /// The patch grid `(rows, cols)` of an `h x w` image.
    pub fn grid(&self, h: usize, w: usize) -> (usize, usize) {
        (h / self.patch.0, w / self.patch.1)
    }

    /// `pixel_values [B, C, H, W]` to `[B, rows * cols, hidden]`, patches in row-major order
    /// (the convolution's output flattened).
    pub fn forward(&self, pixel_values: &Tensor, dtype: DType) -> Result<Tensor> {
        let [b, c, h, w] = pixel_values.shape()[..] else {
            return Err(Error::invalid(
                "pixel_values",
                format!(
                    "pixel_values {:?} must be [batch, channels, height, width]",
                    pixel_values.shape()
                ),
            ));
        };
        if c != self.channels {
            return Err(Error::invalid(
                "pixel_values",
                format!(
                    "pixel_values have {c} channels; the model takes {} (num_channels)",
                    self.channels
                ),
            ));
        }
        let (ph, pw) = self.patch;
        let (rows, cols) = self.grid(h, w);
        if rows == 0 || cols == 0 {
            return Err(Error::invalid(
                "pixel_values",
                format!("a {w}x{h} image holds no {pw}x{ph} patch"),
            ));
        }
        let mut x = pixel_values.to_dtype(dtype)?;
        if rows * ph != h {
            x = x.narrow(2, 0, rows * ph)?;
        }
        if cols * pw != w {
            x = x.narrow(3, 0, cols * pw)?;
        }
        let patches = x
            .reshape_to(&[b, c, rows, ph, cols, pw])?
            .permute(&[0, 2, 4, 1, 3, 5])?
            .reshape_to(&[b, rows * cols, c * ph * pw])?;
        Ok(self.proj.forward(&patches)?)
    }
}

/// Position embeddings of a square `side x side` patch grid (`[side * side, dim]`, row-major)
/// resized to `to = (rows, cols)` as `torch.nn.functional.interpolate(mode="bicubic",
/// align_corners=False)` does: Keys' cubic with a = -0.75, source coordinates
/// `(i + 0.5) * in / out - 0.5`, edge pixels repeated. Computed on the host in f64 and rounded
/// to the table's dtype.
pub fn interpolate_positions(grid: &Tensor, side: usize, to: (usize, usize)) -> Result<Tensor> {
    let dim = grid.dim(-1)?;
    let values = grid.to_vec_f64()?;
    let taps = |out: usize| -> Vec<([usize; 4], [f64; 4])> {
        const A: f64 = -0.75;
        let near = |x: f64| ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0;
        let far = |x: f64| ((A * x - 5.0 * A) * x + 8.0 * A) * x - 4.0 * A;
        let scale = side as f64 / out as f64;
        (0..out)
            .map(|o| {
                let real = scale * (o as f64 + 0.5) - 0.5;
                let base = real.floor();
                let t = real - base;
                let clamp = |d: i64| (base as i64 + d).clamp(0, side as i64 - 1) as usize;
                (
                    [clamp(-1), clamp(0), clamp(1), clamp(2)],
                    [far(t + 1.0), near(t), near(1.0 - t), far(2.0 - t)],
                )
            })
            .collect()
    };
    let (ty, tx) = (taps(to.0), taps(to.1));
    let mut out = vec![0f64; to.0 * to.1 * dim];
    for (oy, (ys, wy)) in ty.iter().enumerate() {
        for (ox, (xs, wx)) in tx.iter().enumerate() {
            let dst = &mut out[(oy * to.1 + ox) * dim..(oy * to.1 + ox + 1) * dim];
            for (y, wy) in ys.iter().zip(wy) {
                for (x, wx) in xs.iter().zip(wx) {
                    let src = &values[(y * side + x) * dim..(y * side + x + 1) * dim];
                    for (d, s) in dst.iter_mut().zip(src) {
                        *d += wy * wx * s;
                    }
                }
            }
        }
    }
    Ok(Tensor::from_f64s(
        &out,
        &[to.0 * to.1, dim],
        grid.dtype(),
        &grid.device(),
    )?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use zoo_runtime::Device;

    #[test]
    fn interpolating_to_the_same_grid_is_the_identity_and_flat_stays_flat() {
        let v: Vec<f32> = (0..9 * 2).map(|i| i as f32).collect();
        let g = Tensor::from_vec(v.clone(), &[9, 2], &Device::Cpu).unwrap();
        let same = interpolate_positions(&g, 3, (3, 3)).unwrap();
        let got = same.to_vec::<f32>().unwrap();
        for (a, b) in got.iter().zip(&v) {
            assert!((a - b).abs() < 1e-5, "{a} {b}");
        }
        let flat = Tensor::full(&[4, 3], 2.5, DType::F32, &Device::Cpu).unwrap();
        let up = interpolate_positions(&flat, 2, (5, 3)).unwrap();
        assert_eq!(up.shape(), [15, 3]);
        assert!(up
            .to_vec::<f32>()
            .unwrap()
            .iter()
            .all(|&x| (x - 2.5).abs() < 1e-6));
    }
}
