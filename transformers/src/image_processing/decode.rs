//! Reading an image file into 8-bit RGB as transformers' `load_image` leaves it
//! (`exif_transpose`, then Pillow's `convert("RGB")`): EXIF orientation applied, grayscale
//! repeated over the three channels, alpha dropped, a palette's colors looked up. JPEG is
//! decoded by libjpeg-turbo's decoder, as Pillow does, so the bytes are Pillow's.

use std::path::{Path, PathBuf};

use image::metadata::Orientation;
use image::{DynamicImage, ImageDecoder, ImageReader};

/// An 8-bit RGB image, rows top to bottom, 3 bytes per pixel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RgbImage {
    /// Pixels in a row.
    pub width: usize,
    /// Rows.
    pub height: usize,
    /// `width * height * 3` bytes, interleaved R, G, B.
    pub pixels: Vec<u8>,
    /// The color a PNG's `tRNS` chunk keys as transparent (a single palette entry, gray
    /// level or RGB color). Pillow keeps it through `convert("RGB")`, and processors that
    /// convert to RGB (`do_convert_rgb`) turn those pixels white.
    pub transparent: Option<[u8; 3]>,
}

/// Why an image could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// The file could not be opened or read.
    #[error("cannot read image {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The bytes are not an image zoo decodes.
    #[error("{path} is not a PNG or JPEG image zoo can decode: {reason}")]
    Decode {
        /// The file.
        path: PathBuf,
        /// The decoder's message.
        reason: String,
    },
    /// The image is not 8 bits per channel.
    #[error("{path} has {bits}-bit channels ({color}); zoo reads 8-bit images as the image processors do; convert it to 8-bit RGB first")]
    Depth {
        /// The file.
        path: PathBuf,
        /// Bits per channel.
        bits: u16,
        /// The decoder's color type.
        color: String,
    },
    /// The image has no pixels, or pixel values a processor cannot take.
    #[error("{path}: {reason}")]
    Invalid {
        /// The file (or `<memory>`).
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

impl RgbImage {
    /// Wraps interleaved RGB bytes, checking their count.
    pub fn new(width: usize, height: usize, pixels: Vec<u8>) -> Result<RgbImage, ImageError> {
        if width == 0 || height == 0 || pixels.len() != width * height * 3 {
            return Err(ImageError::Invalid {
                path: PathBuf::from("<memory>"),
                reason: format!(
                    "{} bytes cannot be a {width}x{height} RGB image (width * height * 3, both at least 1)",
                    pixels.len()
                ),
            });
        }
        Ok(RgbImage {
            width,
            height,
            pixels,
            transparent: None,
        })
    }

    /// Reads a PNG or JPEG file (the format from its bytes, not its name).
    pub fn open(path: &Path) -> Result<RgbImage, ImageError> {
        let bytes = std::fs::read(path).map_err(|source| ImageError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        RgbImage::decode(&bytes, path)
    }

    /// Decodes PNG or JPEG bytes; `name` is what errors call them.
    pub fn decode(bytes: &[u8], name: &Path) -> Result<RgbImage, ImageError> {
        if bytes.starts_with(&[0xFF, 0xD8, 0xFF]) {
            return decode_jpeg(bytes, name);
        }
        let decode_err = |e: image::ImageError| ImageError::Decode {
            path: name.to_path_buf(),
            reason: e.to_string(),
        };
        let reader = ImageReader::new(std::io::Cursor::new(bytes))
            .with_guessed_format()
            .map_err(|source| ImageError::Io {
                path: name.to_path_buf(),
                source,
            })?;
        let mut decoder = reader.into_decoder().map_err(decode_err)?;
        let orientation = decoder.orientation().map_err(decode_err)?;
        let mut img = DynamicImage::from_decoder(decoder).map_err(decode_err)?;
        img.apply_orientation(orientation);
        let mut rgb = from_dynamic(img, name)?;
        rgb.transparent = png_transparent_color(bytes);
        Ok(rgb)
    }
}

/// Decodes a JPEG with libjpeg-turbo's defaults (Pillow's: accurate integer IDCT, fancy
/// upsampling), converted to RGB by the library, then turned by its EXIF orientation.
fn decode_jpeg(bytes: &[u8], path: &Path) -> Result<RgbImage, ImageError> {
    // libjpeg reports a corrupt stream by unwinding out of its error handler; catch it here.
    let decoded = std::panic::catch_unwind(|| -> std::io::Result<_> {
        let d = mozjpeg::Decompress::with_markers(&[mozjpeg::Marker::APP(1)]).from_mem(bytes)?;
        let orientation = d
            .markers()
            .filter_map(|m| m.data.strip_prefix(b"Exif\0\0"))
            .find_map(Orientation::from_exif_chunk)
            .unwrap_or(Orientation::NoTransforms);
        let mut rgb = d.rgb()?;
        let (w, h) = (rgb.width(), rgb.height());
        let pixels = rgb.read_scanlines::<u8>()?;
        rgb.finish()?;
        Ok((w, h, pixels, orientation))
    });
    let (w, h, pixels, orientation) = match decoded {
        Ok(Ok(d)) => d,
        Ok(Err(e)) => {
            return Err(ImageError::Decode {
                path: path.to_path_buf(),
                reason: e.to_string(),
            })
        }
        Err(payload) => {
            let reason = payload
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "libjpeg failed".into());
            return Err(ImageError::Decode {
                path: path.to_path_buf(),
                reason,
            });
        }
    };
    let buffer = image::RgbImage::from_raw(w as u32, h as u32, pixels).ok_or_else(|| {
        ImageError::Decode {
            path: path.to_path_buf(),
            reason: format!("the decoder returned too few bytes for {w}x{h}"),
        }
    })?;
    let mut img = DynamicImage::ImageRgb8(buffer);
    img.apply_orientation(orientation);
    from_dynamic(img, path)
}

fn from_dynamic(img: DynamicImage, path: &Path) -> Result<RgbImage, ImageError> {
    use image::ColorType as C;
    let (w, h) = (img.width() as usize, img.height() as usize);
    if w == 0 || h == 0 {
        return Err(ImageError::Invalid {
            path: path.to_path_buf(),
            reason: "the image has no pixels".into(),
        });
    }
    let color = img.color();
    let pixels = match img {
        DynamicImage::ImageRgb8(b) => b.into_raw(),
        DynamicImage::ImageLuma8(b) => b.into_raw().iter().flat_map(|&v| [v, v, v]).collect(),
        DynamicImage::ImageRgba8(b) => b
            .as_raw()
            .chunks_exact(4)
            .flat_map(|p| [p[0], p[1], p[2]])
            .collect(),
        DynamicImage::ImageLumaA8(b) => b
            .as_raw()
            .chunks_exact(2)
            .flat_map(|p| [p[0], p[0], p[0]])
            .collect(),
        _ => {
            let bits = match color {
                C::L16 | C::La16 | C::Rgb16 | C::Rgba16 => 16,
                C::Rgb32F | C::Rgba32F => 32,
                _ => 0,
            };
            return Err(ImageError::Depth {
                path: path.to_path_buf(),
                bits,
                color: format!("{color:?}"),
            });
        }
    };
    Ok(RgbImage {
        width: w,
        height: h,
        pixels,
        transparent: None,
    })
}

/// The single color a PNG's `tRNS` chunk makes transparent, as Pillow reads it: for a
/// palette, the one entry with alpha 0 when every other is opaque (per-entry alphas are
/// dropped by `convert("RGB")`); for 8-bit gray and RGB, the keyed value.
fn png_transparent_color(bytes: &[u8]) -> Option<[u8; 3]> {
    if !bytes.starts_with(b"\x89PNG") {
        return None;
    }
    let reader = png::Decoder::new(std::io::Cursor::new(bytes))
        .read_info()
        .ok()?;
    let info = reader.info();
    let trns = info.trns.as_deref()?;
    match info.color_type {
        png::ColorType::Indexed => {
            let zero = trns.iter().position(|&a| a == 0)?;
            let simple = trns
                .iter()
                .enumerate()
                .all(|(i, &a)| if i == zero { a == 0 } else { a == 255 });
            let palette = info.palette.as_deref()?;
            (simple && palette.len() >= zero * 3 + 3).then(|| {
                [
                    palette[zero * 3],
                    palette[zero * 3 + 1],
                    palette[zero * 3 + 2],
                ]
            })
        }
        png::ColorType::Grayscale if info.bit_depth == png::BitDepth::Eight => {
            let v = u8::try_from(u16::from_be_bytes([*trns.first()?, *trns.get(1)?])).ok()?;
            Some([v, v, v])
        }
        png::ColorType::Rgb if info.bit_depth == png::BitDepth::Eight => {
            let c = |i: usize| -> Option<u8> {
                u8::try_from(u16::from_be_bytes([*trns.get(i)?, *trns.get(i + 1)?])).ok()
            };
            Some([c(0)?, c(2)?, c(4)?])
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_that_are_no_image_are_a_typed_error() {
        let err = RgbImage::decode(b"not an image", Path::new("x.png")).unwrap_err();
        assert!(matches!(err, ImageError::Decode { .. }), "{err}");
        assert!(err.to_string().contains("x.png"));
    }
}
