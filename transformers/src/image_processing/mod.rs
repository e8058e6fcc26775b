//! Image processors: `preprocessor_config.json` read as transformers reads it, and images
//! turned into `pixel_values` as its PIL backend computes them (`CLIPImageProcessor`,
//! `ViTImageProcessor` with `backend="pil"`, the only backend of transformers 4): RGB
//! conversion, resize (Pillow's filters, to the integer), center crop, rescale, normalize,
//! channels first.
//!
//! transformers 5 defaults to a torchvision backend when torchvision is installed; its
//! antialiased tensor resize differs from Pillow's by a level or two at some pixels, so
//! zoo's pixel values are those of `AutoImageProcessor.from_pretrained(.., backend="pil")`.

mod decode;
mod resample;

use std::path::{Path, PathBuf};

use serde_json::Value;
use zoo_hub::Pretrained;
use zoo_runtime::{Device, Tensor};

pub use decode::{ImageError, RgbImage, MAX_IMAGE_PIXELS};
pub use resample::{resize_rgb, Resample};

use crate::{Error, Result};

/// OpenAI CLIP's channel means (`OPENAI_CLIP_MEAN`).
pub const OPENAI_CLIP_MEAN: [f32; 3] = [0.481_454_66, 0.457_827_5, 0.408_210_73];
/// OpenAI CLIP's channel standard deviations (`OPENAI_CLIP_STD`).
pub const OPENAI_CLIP_STD: [f32; 3] = [0.268_629_54, 0.261_302_6, 0.275_777_1];
/// `IMAGENET_STANDARD_MEAN`.
pub const IMAGENET_STANDARD_MEAN: [f32; 3] = [0.5, 0.5, 0.5];
/// `IMAGENET_STANDARD_STD`.
pub const IMAGENET_STANDARD_STD: [f32; 3] = [0.5, 0.5, 0.5];

/// The target of a resize, as transformers' `SizeDict` holds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Size {
    /// Exactly `height x width`.
    Exact {
        /// Rows.
        height: usize,
        /// Columns.
        width: usize,
    },
    /// The shorter side becomes `shortest_edge`, the aspect ratio kept (the longer side
    /// truncated); with `longest_edge`, the longer side is capped there.
    ShortestEdge {
        /// The shorter side's length.
        shortest_edge: usize,
        /// A cap on the longer side.
        longest_edge: Option<usize>,
    },
}

impl Size {
    /// The `(height, width)` an image of `(h, w)` is resized to.
    pub fn output(self, h: usize, w: usize) -> (usize, usize) {
        match self {
            Size::Exact { height, width } => (height, width),
            Size::ShortestEdge {
                shortest_edge: s,
                longest_edge: None,
            } => {
                // transformers' `get_resize_output_image_size`: int(s * long / short).
                let (short, long) = if w <= h { (w, h) } else { (h, w) };
                let new_long = (s as f64 * long as f64 / short as f64) as usize;
                if w <= h {
                    (new_long, s)
                } else {
                    (s, new_long)
                }
            }
            Size::ShortestEdge {
                shortest_edge: s,
                longest_edge: Some(max),
            } => size_with_aspect_ratio(h, w, s, max),
        }
    }
}

/// transformers' `get_size_with_aspect_ratio` (the shorter side to `size`, the longer capped
/// at `max_size`).
fn size_with_aspect_ratio(h: usize, w: usize, mut size: usize, max: usize) -> (usize, usize) {
    let (lo, hi) = (h.min(w) as f64, h.max(w) as f64);
    let mut raw = None;
    if hi / lo * size as f64 > max as f64 {
        let r = max as f64 * lo / hi;
        // Python's round: half to even.
        size = r.round_ties_even() as usize;
        raw = Some(r);
    }
    if (h <= w && h == size) || (w <= h && w == size) {
        return (h, w);
    }
    let scaled = |num: usize, den: usize| -> usize {
        match raw {
            Some(r) => (r * num as f64 / den as f64) as usize,
            None => ((size * num) as f64 / den as f64) as usize,
        }
    };
    if w < h {
        (scaled(h, w), size)
    } else {
        (size, scaled(w, h))
    }
}

/// An image processor's settings (`preprocessor_config.json`), class defaults filled in.
#[derive(Clone, Debug, PartialEq)]
pub struct ImageProcessor {
    /// `image_processor_type` (or the legacy `feature_extractor_type`), without a `Fast` or
    /// `Pil` suffix.
    pub class: String,
    /// Resize to `size` first.
    pub do_resize: bool,
    /// The resize target.
    pub size: Size,
    /// The resize filter.
    pub resample: Resample,
    /// Crop the center `crop_size` after resizing (padding with zeros when smaller).
    pub do_center_crop: bool,
    /// `(height, width)` of the crop.
    pub crop_size: (usize, usize),
    /// Multiply by `rescale_factor` (1/255).
    pub do_rescale: bool,
    /// The rescale factor.
    pub rescale_factor: f64,
    /// Subtract `image_mean` and divide by `image_std` per channel.
    pub do_normalize: bool,
    /// Channel means.
    pub image_mean: [f32; 3],
    /// Channel standard deviations.
    pub image_std: [f32; 3],
    /// Convert to RGB as transformers' `convert_to_rgb` does (a PNG's keyed transparent
    /// color becomes white).
    pub do_convert_rgb: bool,
    /// The file the settings came from, for errors.
    pub path: PathBuf,
}

/// The processors zoo reads, with the defaults of their classes.
fn class_defaults(class: &str) -> Option<ImageProcessor> {
    let base = ImageProcessor {
        class: class.to_string(),
        do_resize: true,
        size: Size::Exact {
            height: 224,
            width: 224,
        },
        resample: Resample::Bilinear,
        do_center_crop: false,
        crop_size: (224, 224),
        do_rescale: true,
        rescale_factor: 1.0 / 255.0,
        do_normalize: true,
        image_mean: IMAGENET_STANDARD_MEAN,
        image_std: IMAGENET_STANDARD_STD,
        do_convert_rgb: false,
        path: PathBuf::new(),
    };
    match class {
        "CLIPImageProcessor" | "CLIPFeatureExtractor" => Some(ImageProcessor {
            size: Size::ShortestEdge {
                shortest_edge: 224,
                longest_edge: None,
            },
            resample: Resample::Bicubic,
            do_center_crop: true,
            image_mean: OPENAI_CLIP_MEAN,
            image_std: OPENAI_CLIP_STD,
            do_convert_rgb: true,
            ..base
        }),
        "ViTImageProcessor" | "ViTFeatureExtractor" => Some(base),
        "SiglipImageProcessor" => Some(ImageProcessor {
            resample: Resample::Bicubic,
            do_convert_rgb: true,
            ..base
        }),
        _ => None,
    }
}

/// The processor classes zoo reads.
pub const SUPPORTED_PROCESSORS: &[&str] = &[
    "CLIPImageProcessor",
    "ViTImageProcessor",
    "SiglipImageProcessor",
];

impl ImageProcessor {
    /// The processor of a model, found as transformers 5 finds it: the image processor
    /// nested under `"image_processor"` in `processor_config.json` (what a processor saved
    /// by transformers 5 writes), else `preprocessor_config.json`.
    pub fn from_pretrained(model: &Pretrained) -> Result<ImageProcessor> {
        if let Some(p) = model.processor_config_path()? {
            if let Some(nested) = zoo_hub::config::read_json::<Value>(&p)?.get("image_processor") {
                return ImageProcessor::from_value(nested, &p);
            }
        }
        match model.preprocessor_config_path()? {
            Some(p) => ImageProcessor::from_file(&p),
            None => Err(Error::Config {
                path: model.files().source().to_string().into(),
                reason: "no preprocessor_config.json, and no processor_config.json holding an image_processor: zoo needs the image processor's settings to turn an image into pixel values".into(),
            }),
        }
    }

    /// Reads `preprocessor_config.json`.
    pub fn from_file(path: &Path) -> Result<ImageProcessor> {
        ImageProcessor::from_value(&zoo_hub::config::read_json::<Value>(path)?, path)
    }

    /// Reads the settings from the parsed file at `path`.
    pub fn from_value(v: &Value, path: &Path) -> Result<ImageProcessor> {
        let err = |reason: String| Error::Config {
            path: path.to_path_buf(),
            reason,
        };
        let declared = v
            .get("image_processor_type")
            .or_else(|| v.get("feature_extractor_type"))
            .and_then(Value::as_str)
            .ok_or_else(|| err("names no `image_processor_type`".into()))?;
        let class = declared
            .strip_suffix("Fast")
            .or_else(|| declared.strip_suffix("Pil"))
            .unwrap_or(declared);
        let mut p = class_defaults(class).ok_or_else(|| {
            err(format!(
                "`image_processor_type` {declared} is not an image processor zoo runs; zoo runs {}",
                SUPPORTED_PROCESSORS.join(", ")
            ))
        })?;
        p.path = path.to_path_buf();
        let flag = |name: &str, default: bool| -> Result<bool> {
            match v.get(name) {
                None | Some(Value::Null) => Ok(default),
                Some(Value::Bool(b)) => Ok(*b),
                Some(other) => Err(err(format!("`{name}` is {other}, not true or false"))),
            }
        };
        p.do_resize = flag("do_resize", p.do_resize)?;
        p.do_center_crop = flag("do_center_crop", p.do_center_crop)?;
        p.do_rescale = flag("do_rescale", p.do_rescale)?;
        p.do_normalize = flag("do_normalize", p.do_normalize)?;
        p.do_convert_rgb = flag("do_convert_rgb", p.do_convert_rgb)?;
        // CLIP's `size` is a shortest edge when given as one number, ViT's a square.
        let square = !matches!(p.size, Size::ShortestEdge { .. });
        if let Some(s) = v.get("size").filter(|s| !s.is_null()) {
            p.size = parse_size(s, square).map_err(|r| err(format!("`size`: {r}")))?;
        }
        if let Some(s) = v.get("crop_size").filter(|s| !s.is_null()) {
            p.crop_size = match parse_size(s, true).map_err(|r| err(format!("`crop_size`: {r}")))? {
                Size::Exact { height, width } => (height, width),
                Size::ShortestEdge { .. } => {
                    return Err(err("`crop_size` needs `height` and `width`".into()))
                }
            };
        }
        if let Some(r) = v.get("resample").filter(|s| !s.is_null()) {
            p.resample = r.as_i64().and_then(Resample::from_pil).ok_or_else(|| {
                err(format!(
                    "`resample` is {r}; zoo reads PIL's filters 0 (nearest) to 5 (hamming)"
                ))
            })?;
        }
        if let Some(f) = v.get("rescale_factor").filter(|s| !s.is_null()) {
            p.rescale_factor = f
                .as_f64()
                .filter(|f| f.is_finite())
                .ok_or_else(|| err(format!("`rescale_factor` is {f}, not a number")))?;
        }
        for (name, out) in [
            ("image_mean", &mut p.image_mean),
            ("image_std", &mut p.image_std),
        ] {
            if let Some(m) = v.get(name).filter(|s| !s.is_null()) {
                *out = channels(m).map_err(|r| err(format!("`{name}`: {r}")))?;
            }
        }
        if p.image_std.contains(&0.0) {
            return Err(err(
                "`image_std` holds 0; normalizing would divide by it".into()
            ));
        }
        // Sizes that no image could be resized to without a bomb's allocation.
        let (field, (h, w)) = match p.size {
            Size::Exact { height, width } => ("size", (height, width)),
            Size::ShortestEdge { shortest_edge, .. } => ("size", (shortest_edge, shortest_edge)),
        };
        for (field, (h, w)) in [(field, (h, w)), ("crop_size", p.crop_size)] {
            if (h as u64).saturating_mul(w as u64) > MAX_IMAGE_PIXELS {
                return Err(err(format!(
                    "`{field}` asks for {w}x{h} pixels; zoo makes images of at most \
                     {MAX_IMAGE_PIXELS} pixels (Pillow's MAX_IMAGE_PIXELS)"
                )));
            }
        }
        Ok(p)
    }

    /// The `(height, width)` of the pixel values an image of `(h, w)` becomes.
    pub fn output_size(&self, h: usize, w: usize) -> (usize, usize) {
        let (h, w) = if self.do_resize {
            self.size.output(h, w)
        } else {
            (h, w)
        };
        if self.do_center_crop {
            self.crop_size
        } else {
            (h, w)
        }
    }

    /// One image's pixel values, `[3, H, W]` channels first, f32.
    pub fn process(&self, image: &RgbImage) -> Result<(Vec<f32>, usize, usize)> {
        let (mut h, mut w) = (image.height, image.width);
        let mut pixels = std::borrow::Cow::Borrowed(image.pixels.as_slice());
        if let (true, Some(key)) = (self.do_convert_rgb, image.transparent) {
            pixels = std::borrow::Cow::Owned(
                pixels
                    .chunks_exact(3)
                    .flat_map(|p| {
                        if p == key {
                            [255; 3]
                        } else {
                            [p[0], p[1], p[2]]
                        }
                    })
                    .collect(),
            );
        }
        if self.do_resize {
            let (oh, ow) = self.size.output(h, w);
            // A shortest edge stretches the long side by the aspect ratio: bound the result.
            if (oh as u64).saturating_mul(ow as u64) > MAX_IMAGE_PIXELS {
                return Err(Error::Config {
                    path: self.path.clone(),
                    reason: format!(
                        "resizing a {w}x{h} image by `size` gives {ow}x{oh} pixels; zoo makes \
                         images of at most {MAX_IMAGE_PIXELS} pixels (Pillow's MAX_IMAGE_PIXELS)"
                    ),
                });
            }
            if oh == 0 || ow == 0 {
                return Err(Error::Config {
                    path: self.path.clone(),
                    reason: format!("resizing a {w}x{h} image by `size` leaves no pixels"),
                });
            }
            pixels = std::borrow::Cow::Owned(resize_rgb(&pixels, w, h, ow, oh, self.resample));
            (h, w) = (oh, ow);
        }
        // Channels first, as transformers holds images from here on.
        let mut planes = vec![0u8; 3 * h * w];
        for (i, px) in pixels.chunks_exact(3).enumerate() {
            for c in 0..3 {
                planes[c * h * w + i] = px[c];
            }
        }
        if self.do_center_crop {
            (planes, h, w) = center_crop(&planes, h, w, self.crop_size);
        }
        let scale = self.rescale_factor;
        let out = planes
            .chunks_exact(h * w)
            .enumerate()
            .flat_map(|(c, plane)| {
                let (mean, std) = (self.image_mean[c], self.image_std[c]);
                let (rescale, normalize) = (self.do_rescale, self.do_normalize);
                plane.iter().map(move |&v| {
                    // transformers rescales in f64 then casts; normalizes in f32.
                    let x = if rescale {
                        (f64::from(v) * scale) as f32
                    } else {
                        f32::from(v)
                    };
                    if normalize {
                        (x - mean) / std
                    } else {
                        x
                    }
                })
            })
            .collect();
        Ok((out, h, w))
    }

    /// A batch's `pixel_values` `[N, 3, H, W]` (f32) on `device`; every image must come out
    /// the same size (a processor that crops or resizes to a fixed size guarantees it).
    pub fn pixel_values(&self, images: &[RgbImage], device: &Device) -> Result<Tensor> {
        let mut data = Vec::new();
        let mut dims = None;
        for (i, img) in images.iter().enumerate() {
            let (v, h, w) = self.process(img)?;
            match dims {
                None => dims = Some((h, w)),
                Some(d) if d != (h, w) => {
                    return Err(Error::invalid("images", format!(
                        "image {i} becomes {w}x{h} pixel values but image 0 became {}x{}; batch images of one size or use a processor that crops",
                        d.1, d.0
                    )))
                }
                Some(_) => {}
            }
            data.extend(v);
        }
        let Some((h, w)) = dims else {
            return Err(Error::invalid("images", "no image to process".into()));
        };
        Ok(Tensor::from_vec(data, &[images.len(), 3, h, w], device)?)
    }
}

/// A `size` / `crop_size` entry: a number (a square, or with `square` false a shortest
/// edge), `[h, w]`, or a dict with `height`/`width` or `shortest_edge` (and `longest_edge`).
fn parse_size(v: &Value, square: bool) -> Result<Size, String> {
    let dim = |x: &Value| -> Result<usize, String> {
        x.as_u64()
            .filter(|&n| n > 0)
            .map(|n| n as usize)
            .ok_or_else(|| format!("{x} is not a positive integer"))
    };
    match v {
        Value::Number(_) => {
            let n = dim(v)?;
            Ok(if square {
                Size::Exact {
                    height: n,
                    width: n,
                }
            } else {
                Size::ShortestEdge {
                    shortest_edge: n,
                    longest_edge: None,
                }
            })
        }
        Value::Array(a) if a.len() == 2 => Ok(Size::Exact {
            height: dim(&a[0])?,
            width: dim(&a[1])?,
        }),
        Value::Object(o) => {
            if let (Some(h), Some(w)) = (o.get("height"), o.get("width")) {
                Ok(Size::Exact {
                    height: dim(h)?,
                    width: dim(w)?,
                })
            } else if let Some(s) = o.get("shortest_edge") {
                Ok(Size::ShortestEdge {
                    shortest_edge: dim(s)?,
                    longest_edge: o
                        .get("longest_edge")
                        .filter(|l| !l.is_null())
                        .map(dim)
                        .transpose()?,
                })
            } else {
                Err(format!(
                    "{v} has neither `height` and `width` nor `shortest_edge`"
                ))
            }
        }
        _ => Err(format!("{v} is not a size")),
    }
}

/// Three per-channel values (a single number applies to all three).
fn channels(v: &Value) -> Result<[f32; 3], String> {
    let num = |x: &Value| -> Result<f32, String> {
        x.as_f64()
            .filter(|f| f.is_finite())
            .map(|f| f as f32)
            .ok_or_else(|| format!("{x} is not a number"))
    };
    match v {
        Value::Array(a) if a.len() == 3 => Ok([num(&a[0])?, num(&a[1])?, num(&a[2])?]),
        Value::Array(a) => Err(format!("{} values for 3 channels", a.len())),
        x => {
            let n = num(x)?;
            Ok([n; 3])
        }
    }
}

/// transformers' `center_crop` on channels-first bytes: the middle `crop`, its origin at
/// `floor((size - crop) / 2)` on each axis, zeros where it reaches past a smaller image
/// (transformers pads first, which lands on the same pixels).
fn center_crop(
    planes: &[u8],
    h: usize,
    w: usize,
    (ch, cw): (usize, usize),
) -> (Vec<u8>, usize, usize) {
    let top = (h as i64 - ch as i64).div_euclid(2);
    let left = (w as i64 - cw as i64).div_euclid(2);
    let mut out = vec![0u8; 3 * ch * cw];
    for c in 0..3 {
        for y in 0..ch {
            let sy = y as i64 + top;
            if !(0..h as i64).contains(&sy) {
                continue;
            }
            for x in 0..cw {
                let sx = x as i64 + left;
                if (0..w as i64).contains(&sx) {
                    out[(c * ch + y) * cw + x] = planes[(c * h + sy as usize) * w + sx as usize];
                }
            }
        }
    }
    (out, ch, cw)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> Result<ImageProcessor> {
        ImageProcessor::from_value(
            &serde_json::from_str(json).unwrap(),
            Path::new("preprocessor_config.json"),
        )
    }

    #[test]
    fn clip_and_vit_defaults_and_legacy_sizes() {
        let clip = parse(
            r#"{"feature_extractor_type": "CLIPFeatureExtractor", "size": 224, "crop_size": 224}"#,
        )
        .unwrap();
        assert_eq!(
            clip.size,
            Size::ShortestEdge {
                shortest_edge: 224,
                longest_edge: None
            }
        );
        assert_eq!(clip.crop_size, (224, 224));
        assert_eq!(clip.resample, Resample::Bicubic);
        let vit =
            parse(r#"{"image_processor_type": "ViTImageProcessorFast", "size": 32}"#).unwrap();
        assert_eq!(
            vit.size,
            Size::Exact {
                height: 32,
                width: 32
            }
        );
        assert!(!vit.do_center_crop);
        assert_eq!(vit.image_mean, IMAGENET_STANDARD_MEAN);
    }

    #[test]
    fn shortest_edge_keeps_the_aspect_ratio_truncating_the_long_side() {
        let s = Size::ShortestEdge {
            shortest_edge: 224,
            longest_edge: None,
        };
        assert_eq!(s.output(480, 640), (224, 298));
        assert_eq!(s.output(641, 480), (299, 224));
        assert_eq!(s.output(10, 10), (224, 224));
    }

    #[test]
    fn bad_settings_name_the_field() {
        for (json, field) in [
            (
                r#"{"image_processor_type": "Qwen2VLImageProcessor"}"#,
                "Qwen2VLImageProcessor",
            ),
            (
                r#"{"image_processor_type": "ViTImageProcessor", "size": {"w": 3}}"#,
                "`size`",
            ),
            (
                r#"{"image_processor_type": "ViTImageProcessor", "resample": 9}"#,
                "`resample`",
            ),
            (
                r#"{"image_processor_type": "ViTImageProcessor", "image_std": [1, 0, 1]}"#,
                "image_std",
            ),
            (
                r#"{"image_processor_type": "ViTImageProcessor", "image_mean": [1, 1]}"#,
                "image_mean",
            ),
            (r#"{"size": 3}"#, "image_processor_type"),
        ] {
            let e = parse(json).unwrap_err().to_string();
            assert!(e.contains(field), "{json}: {e}");
        }
    }

    #[test]
    fn center_crop_takes_the_middle_and_pads_a_small_image() {
        // 1 channel shown; all three are cropped alike. 4x4 -> 2x2: rows 1..3, cols 1..3.
        let planes: Vec<u8> = (0..3 * 16).map(|i| i as u8).collect();
        let (out, h, w) = center_crop(&planes, 4, 4, (2, 2));
        assert_eq!((h, w), (2, 2));
        assert_eq!(&out[..4], &[5, 6, 9, 10]);
        // 1x1 -> 3x2: padded to 3x2 with the pixel at row ceil(2/2)=1, col ceil(1/2)=1.
        let (out, _, _) = center_crop(&[7, 8, 9], 1, 1, (3, 2));
        assert_eq!(&out[..6], &[0, 0, 0, 7, 0, 0]);
    }
}
