//! Dynamic thresholding (Imagen's, diffusers' `_threshold_sample`) of a predicted clean
//! sample: its config fields, which DDPM, DDIM, DPM-Solver and UniPC share, and the op.

use zoo_runtime::Tensor;

use crate::configuration::register_to_config;
use crate::Result;

register_to_config! {
    /// `thresholding`, `dynamic_thresholding_ratio`, `sample_max_value`, with diffusers'
    /// defaults (off).
    #[derive(Copy)]
    pub struct Thresholding {
        /// Threshold the predicted clean sample.
        pub thresholding: bool = false,
        /// Quantile of |x| that sets the threshold.
        pub dynamic_thresholding_ratio: f64 = 0.995,
        /// Largest threshold.
        pub sample_max_value: f64 = 1.0,
    }
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

    /// DDPM's and DDIM's treatment of `x0`: thresholded when the config asks for it, else
    /// clipped to `[-r, r]` when `clip` is `Some(r)` (their `clip_sample`).
    pub fn apply_or_clip(&self, x0: Tensor, clip: Option<f64>) -> Result<Tensor> {
        match clip {
            Some(r) if !self.thresholding => Ok(x0.clamp(-r, r)?),
            _ => self.apply(x0),
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
        // torch.clamp's order (the lower bound, then the upper): a `sample_max_value` below 1
        // gives `s = max`, where `f32::clamp` would refuse the empty range.
        let s = q.max(1.0).min(max as f32);
        out.extend(row.iter().map(|v| v.max(-s).min(s) / s));
    }
    Ok(Tensor::from_vec(out, &shape, &x.device())?.to_dtype(x.dtype())?)
}
