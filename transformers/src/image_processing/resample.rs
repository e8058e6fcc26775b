//! Image resizing as Pillow computes it (`Image.resize` on an 8-bit RGB image), which is what
//! transformers' PIL image processors call: a separable convolution, horizontal pass first,
//! with the filter stretched over the source pixels when shrinking (antialiasing), weights
//! rounded to 22-bit fixed point and each pass rounded and clamped to 8 bits. Matching this
//! to the integer is what lets pixel values agree with transformers' to float rounding.

/// Pillow's resampling filters, by the numbers `preprocessor_config.json`'s `resample` uses
/// (`PILImageResampling`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resample {
    /// 0: the source pixel under each output pixel's center.
    Nearest,
    /// 4: the mean of the covered source pixels.
    Box,
    /// 2: a triangle filter.
    Bilinear,
    /// 5: a Hamming-windowed sinc.
    Hamming,
    /// 3: Keys' cubic convolution with a = -0.5.
    Bicubic,
    /// 1: a 3-lobe Lanczos-windowed sinc.
    Lanczos,
}

impl Resample {
    /// The filter `PILImageResampling(n)` names.
    pub fn from_pil(n: i64) -> Option<Resample> {
        Some(match n {
            0 => Resample::Nearest,
            1 => Resample::Lanczos,
            2 => Resample::Bilinear,
            3 => Resample::Bicubic,
            4 => Resample::Box,
            5 => Resample::Hamming,
            _ => return None,
        })
    }

    /// Half the filter's width in source pixels at scale 1.
    fn support(self) -> f64 {
        match self {
            Resample::Nearest | Resample::Box => 0.5,
            Resample::Bilinear | Resample::Hamming => 1.0,
            Resample::Bicubic => 2.0,
            Resample::Lanczos => 3.0,
        }
    }

    fn weight(self, x: f64) -> f64 {
        let sinc = |x: f64| {
            if x == 0.0 {
                1.0
            } else {
                let px = x * std::f64::consts::PI;
                px.sin() / px
            }
        };
        match self {
            Resample::Nearest | Resample::Box => {
                if x > -0.5 && x <= 0.5 {
                    1.0
                } else {
                    0.0
                }
            }
            Resample::Bilinear => (1.0 - x.abs()).max(0.0),
            Resample::Hamming => {
                let x = x.abs();
                if x == 0.0 {
                    1.0
                } else if x >= 1.0 {
                    0.0
                } else {
                    let px = x * std::f64::consts::PI;
                    // Pillow writes the window's constants as C floats.
                    px.sin() / px * (0.54f32 as f64 + 0.46f32 as f64 * px.cos())
                }
            }
            Resample::Bicubic => {
                const A: f64 = -0.5;
                let x = x.abs();
                if x < 1.0 {
                    ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0
                } else if x < 2.0 {
                    (((x - 5.0) * x + 8.0) * x - 4.0) * A
                } else {
                    0.0
                }
            }
            Resample::Lanczos => {
                if (-3.0..3.0).contains(&x) {
                    sinc(x) * sinc(x / 3.0)
                } else {
                    0.0
                }
            }
        }
    }
}

/// Fixed-point bits of a weight: 32 bits less 8 for the pixel and 2 for sums past 1.
const PRECISION_BITS: u32 = 32 - 8 - 2;

/// For each output pixel along one axis: the first source pixel and the fixed-point
/// weights of the source pixels from there.
struct Taps {
    first: Vec<usize>,
    weights: Vec<Vec<i32>>,
}

impl Taps {
    fn new(in_size: usize, out_size: usize, filter: Resample) -> Taps {
        let scale = in_size as f64 / out_size as f64;
        let filterscale = scale.max(1.0);
        let support = filter.support() * filterscale;
        let inv = 1.0 / filterscale;
        let mut first = Vec::with_capacity(out_size);
        let mut weights = Vec::with_capacity(out_size);
        for xx in 0..out_size {
            let center = (xx as f64 + 0.5) * scale;
            // C's truncating casts, as Pillow rounds the window's ends.
            let xmin = ((center - support + 0.5) as i64).max(0) as usize;
            let xmax = ((center + support + 0.5) as i64).min(in_size as i64) as usize;
            let mut w: Vec<f64> = (xmin..xmax)
                .map(|x| filter.weight((x as f64 - center + 0.5) * inv))
                .collect();
            let total: f64 = w.iter().sum();
            if total != 0.0 {
                for v in &mut w {
                    *v /= total;
                }
            }
            let one = f64::from(1u32 << PRECISION_BITS);
            let fixed = w
                .iter()
                .map(|&v| {
                    if v < 0.0 {
                        (-0.5 + v * one) as i32
                    } else {
                        (0.5 + v * one) as i32
                    }
                })
                .collect();
            first.push(xmin);
            weights.push(fixed);
        }
        Taps { first, weights }
    }

    /// The source rows the taps read, `first..end`.
    fn span(&self) -> (usize, usize) {
        let end = self
            .first
            .iter()
            .zip(&self.weights)
            .map(|(f, w)| f + w.len())
            .max()
            .unwrap_or(0);
        (self.first.first().copied().unwrap_or(0), end)
    }
}

/// A fixed-point sum back to 8 bits: Pillow's `clip8` (an arithmetic shift, then clamp).
fn clip8(sum: i32) -> u8 {
    (sum >> PRECISION_BITS).clamp(0, 255) as u8
}

const HALF: i32 = 1 << (PRECISION_BITS - 1);

/// Resizes an interleaved RGB image (`width x height`, 3 bytes per pixel) to
/// `out_w x out_h` as Pillow's `Image.resize(size, resample)` does (Pillow 13: the vertical
/// pass runs first when the height shrinks by more than twice what the width does).
pub fn resize_rgb(
    pixels: &[u8],
    width: usize,
    height: usize,
    out_w: usize,
    out_h: usize,
    filter: Resample,
) -> Vec<u8> {
    if (out_w, out_h) == (width, height) {
        return pixels.to_vec();
    }
    if filter == Resample::Nearest {
        return nearest(pixels, width, height, out_w, out_h);
    }
    let (need_h, need_v) = (out_w != width, out_h != height);
    let shrink_h = height as i64 - out_h as i64;
    let horizontal_first = !(shrink_h > 0 && shrink_h > (width as i64 - out_w as i64) * 2);
    let vert = Taps::new(height, out_h, filter);
    let horiz = Taps::new(width, out_w, filter);
    if horizontal_first {
        // Only the source rows the vertical pass reads are resampled horizontally.
        let (y0, y1) = if need_v { vert.span() } else { (0, height) };
        let mut img = pixels[y0 * width * 3..y1 * width * 3].to_vec();
        if need_h {
            img = horizontal(&img, width, y1 - y0, &horiz);
        }
        if need_v {
            img = vertical(&img, out_w, &vert, y0);
        }
        img
    } else {
        let img = vertical(pixels, width, &vert, 0);
        if need_h {
            horizontal(&img, width, out_h, &horiz)
        } else {
            img
        }
    }
}

/// One horizontal pass over `rows` rows of `width` pixels.
fn horizontal(src: &[u8], width: usize, rows: usize, taps: &Taps) -> Vec<u8> {
    let out_w = taps.first.len();
    let mut out = vec![0u8; rows * out_w * 3];
    for r in 0..rows {
        let line = &src[r * width * 3..(r + 1) * width * 3];
        let dst = &mut out[r * out_w * 3..(r + 1) * out_w * 3];
        for (xx, (first, k)) in taps.first.iter().zip(&taps.weights).enumerate() {
            for c in 0..3 {
                let mut ss = HALF;
                for (i, &w) in k.iter().enumerate() {
                    ss += i32::from(line[(first + i) * 3 + c]) * w;
                }
                dst[xx * 3 + c] = clip8(ss);
            }
        }
    }
    out
}

/// One vertical pass over rows of `width` pixels; `src` starts at source row `row0`.
fn vertical(src: &[u8], width: usize, taps: &Taps, row0: usize) -> Vec<u8> {
    let out_h = taps.first.len();
    let mut out = vec![0u8; out_h * width * 3];
    for (yy, (first, k)) in taps.first.iter().zip(&taps.weights).enumerate() {
        for x in 0..width * 3 {
            let mut ss = HALF;
            for (i, &w) in k.iter().enumerate() {
                ss += i32::from(src[(first - row0 + i) * width * 3 + x]) * w;
            }
            out[yy * width * 3 + x] = clip8(ss);
        }
    }
    out
}

/// Pillow's nearest-neighbour resize (`ImagingScaleAffine`): the source coordinate starts
/// at half a step and is advanced by adding the step, so it rounds as Pillow's does.
fn nearest(pixels: &[u8], width: usize, height: usize, out_w: usize, out_h: usize) -> Vec<u8> {
    let table = |n_out: usize, n_in: usize| -> Vec<usize> {
        let step = n_in as f64 / n_out as f64;
        let mut at = step * 0.5;
        (0..n_out)
            .map(|_| {
                let i = (at as usize).min(n_in - 1);
                at += step;
                i
            })
            .collect()
    };
    let (xs, ys) = (table(out_w, width), table(out_h, height));
    let mut out = Vec::with_capacity(out_w * out_h * 3);
    for &sy in &ys {
        for &sx in &xs {
            let at = (sy * width + sx) * 3;
            out.extend_from_slice(&pixels[at..at + 3]);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_sum_to_one_in_fixed_point_within_rounding() {
        for filter in [Resample::Bilinear, Resample::Bicubic, Resample::Lanczos] {
            for (i, o) in [(640, 224), (100, 224), (7, 3), (3, 7)] {
                let taps = Taps::new(i, o, filter);
                for k in &taps.weights {
                    let s: i64 = k.iter().map(|&w| i64::from(w)).sum();
                    assert!((s - (1 << PRECISION_BITS)).abs() <= k.len() as i64, "{s}");
                }
            }
        }
    }

    #[test]
    fn a_flat_image_stays_flat_and_same_size_is_a_copy() {
        let img = vec![77u8; 10 * 6 * 3];
        for filter in [Resample::Bilinear, Resample::Bicubic, Resample::Box] {
            let out = resize_rgb(&img, 10, 6, 4, 9, filter);
            assert_eq!(out.len(), 4 * 9 * 3);
            assert!(out.iter().all(|&v| v == 77), "{filter:?}");
        }
        assert_eq!(resize_rgb(&img, 10, 6, 10, 6, Resample::Bicubic), img);
    }
}
