//! Dynamic thresholding (Imagen's, diffusers' `_threshold_sample`) of a predicted clean
//! sample: its config fields, which DDPM, DDIM, DPM-Solver and UniPC share, and the op.

use serde::Deserialize;
use zoo_runtime::Tensor;

use super::defaults::one;
use crate::Result;

fn ratio() -> f64 {
    0.995
}

/// `thresholding`, `dynamic_thresholding_ratio`, `sample_max_value`.
#[derive(Clone, Copy, Debug, Deserialize)]
pub struct Thresholding {
    /// Threshold the predicted clean sample.
    #[serde(default)]
    pub thresholding: bool,
    /// Quantile of |x| that sets the threshold.
    #[serde(default = "ratio")]
    pub dynamic_thresholding_ratio: f64,
    /// Largest threshold.
    #[serde(default = "one")]
    pub sample_max_value: f64,
}

impl Thresholding {
    /// `x0` thresholded when the config asks for it.
    pub fn apply(&self, x0: Tensor) -> Result<Tensor> {
        if self.thresholding {
            threshold(&x0, self.dynamic_thresholding_ratio, self.sample_max_value)
        } else {
            Ok(x0)
        }
    }
}

/// Dynamic thresholding (`_threshold_sample`): per batch row, the `ratio` quantile `s` of
/// |x| (clamped to `[1, max]`); values clamped to `[-s, s]` and divided by `s`. Computed on
/// the host, in f32.
fn threshold(x: &Tensor, ratio: f64, max: f64) -> Result<Tensor> {
    let shape = x.shape().to_vec();
    let rows = shape[0];
    let values = x.to_dtype(zoo_runtime::DType::F32)?.to_vec::<f32>()?;
    let per = values.len() / rows.max(1);
    let mut out = Vec::with_capacity(values.len());
    for row in values.chunks(per.max(1)) {
        let mut sorted: Vec<f32> = row.iter().map(|v| v.abs()).collect();
        sorted.sort_by(f32::total_cmp);
        let pos = ratio * (sorted.len() - 1) as f64;
        let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
        let w = (pos - lo as f64) as f32;
        let q = sorted[lo] + (sorted[hi] - sorted[lo]) * w;
        let s = q.clamp(1.0, max as f32);
        out.extend(row.iter().map(|v| v.clamp(-s, s) / s));
    }
    Ok(Tensor::from_vec(out, &shape, &x.device())?.to_dtype(x.dtype())?)
}
