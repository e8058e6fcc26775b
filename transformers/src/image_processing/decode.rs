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

/// The most pixels an image may declare before it is decoded: Pillow's `MAX_IMAGE_PIXELS`
/// (a 74-byte PNG or a 2.5 KB JPEG can declare billions, and decoding allocates them).
/// [`RgbImage::open_limited`] takes another limit, or none for a trusted file.
pub const MAX_IMAGE_PIXELS: u64 = 89_478_485;

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
    /// The header declares more pixels than the limit ([`MAX_IMAGE_PIXELS`] by default):
    /// refused before any pixel is decoded.
    #[error("{path} declares {width}x{height} = {pixels} pixels, above the limit of {limit} (Pillow's MAX_IMAGE_PIXELS, a guard against decompression bombs); if the image is trusted, raise the limit (the CLI's --max-image-pixels; 0 for none)")]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// Declared width.
        width: u64,
        /// Declared height.
        height: u64,
        /// Their product.
        pixels: u64,
        /// The limit in force.
        limit: u64,
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

    /// Reads a PNG or JPEG file (the format from its bytes, not its name), refusing one
    /// that declares more than [`MAX_IMAGE_PIXELS`] pixels.
    pub fn open(path: &Path) -> Result<RgbImage, ImageError> {
        RgbImage::open_limited(path, Some(MAX_IMAGE_PIXELS))
    }

    /// [`RgbImage::open`] with another pixel limit (`None`: no limit, for trusted files).
    pub fn open_limited(path: &Path, max_pixels: Option<u64>) -> Result<RgbImage, ImageError> {
        let bytes = std::fs::read(path).map_err(|source| ImageError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        RgbImage::decode_limited(&bytes, path, max_pixels)
    }

    /// Decodes PNG or JPEG bytes; `name` is what errors call them. At most
    /// [`MAX_IMAGE_PIXELS`] pixels.
    pub fn decode(bytes: &[u8], name: &Path) -> Result<RgbImage, ImageError> {
        RgbImage::decode_limited(bytes, name, Some(MAX_IMAGE_PIXELS))
    }

    /// [`RgbImage::decode`] with another pixel limit (`None`: no limit), checked against
    /// the header before anything is decoded.
    pub fn decode_limited(
        bytes: &[u8],
        name: &Path,
        max_pixels: Option<u64>,
    ) -> Result<RgbImage, ImageError> {
        if bytes.starts_with(&[0xFF, 0xD8, 0xFF]) {
            return decode_jpeg(bytes, name, max_pixels);
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
        let (w, h) = decoder.dimensions();
        check_pixels(name, u64::from(w), u64::from(h), max_pixels)?;
        let orientation = decoder.orientation().map_err(decode_err)?;
        let mut img = DynamicImage::from_decoder(decoder).map_err(decode_err)?;
        img.apply_orientation(orientation);
        let mut rgb = from_dynamic(img, name)?;
        rgb.transparent = png_transparent_color(bytes);
        Ok(rgb)
    }
}

/// Refuses `width x height` above `max_pixels`.
fn check_pixels(
    path: &Path,
    width: u64,
    height: u64,
    max_pixels: Option<u64>,
) -> Result<(), ImageError> {
    let pixels = width.saturating_mul(height);
    match max_pixels {
        Some(limit) if pixels > limit => Err(ImageError::TooLarge {
            path: path.to_path_buf(),
            width,
            height,
            pixels,
            limit,
        }),
        _ => Ok(()),
    }
}

/// Decodes a JPEG with libjpeg-turbo's defaults (Pillow's: accurate integer IDCT, fancy
/// upsampling), converted to RGB by the library, then turned by its EXIF orientation.
fn decode_jpeg(bytes: &[u8], path: &Path, max_pixels: Option<u64>) -> Result<RgbImage, ImageError> {
    // libjpeg only warns on a truncated stream and fills the rest with gray; Pillow refuses it.
    if !jpeg_reaches_its_end(bytes) {
        return Err(ImageError::Decode {
            path: path.to_path_buf(),
            reason: "the JPEG is truncated: its data ends before its end-of-image marker".into(),
        });
    }
    // libjpeg reports a corrupt stream by unwinding out of its error handler; catch it here.
    let decoded = std::panic::catch_unwind(|| -> std::io::Result<_> {
        let d = mozjpeg::Decompress::with_markers(&[mozjpeg::Marker::APP(1)]).from_mem(bytes)?;
        // The header is read: refuse a bomb before the scanlines are allocated.
        if let Err(e) = check_pixels(path, d.width() as u64, d.height() as u64, max_pixels) {
            return Ok(Err(e));
        }
        let orientation = d
            .markers()
            .filter_map(|m| m.data.strip_prefix(b"Exif\0\0"))
            .find_map(Orientation::from_exif_chunk)
            .unwrap_or(Orientation::NoTransforms);
        let mut rgb = d.rgb()?;
        let (w, h) = (rgb.width(), rgb.height());
        let pixels = rgb.read_scanlines::<u8>()?;
        rgb.finish()?;
        Ok(Ok((w, h, pixels, orientation)))
    });
    let (w, h, pixels, orientation) = match decoded {
        Ok(Ok(Ok(d))) => d,
        Ok(Ok(Err(too_large))) => return Err(too_large),
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

/// Whether a JPEG stream's segments and scans run up to its end-of-image marker: marker
/// segments are skipped by their lengths, entropy-coded data up to the next marker (in it a
/// 0xFF byte is followed by a stuffed 0x00 or a restart marker).
fn jpeg_reaches_its_end(bytes: &[u8]) -> bool {
    let mut i = 2; // past SOI
    loop {
        // Markers may be preceded by fill bytes.
        while bytes.get(i) == Some(&0xFF) && bytes.get(i + 1) == Some(&0xFF) {
            i += 1;
        }
        let (Some(&0xFF), Some(&marker)) = (bytes.get(i), bytes.get(i + 1)) else {
            return false;
        };
        i += 2;
        match marker {
            0xD9 => return true,
            0x01 | 0xD0..=0xD8 => continue,
            _ => {}
        }
        let Some(len) = bytes
            .get(i..i + 2)
            .map(|b| u16::from_be_bytes([b[0], b[1]]) as usize)
        else {
            return false;
        };
        i += len;
        if marker == 0xDA {
            // The scan's entropy-coded data runs to the next marker that is not a restart.
            loop {
                match (bytes.get(i), bytes.get(i + 1)) {
                    (Some(&0xFF), Some(&(0x00 | 0xD0..=0xD7))) => i += 2,
                    (Some(&0xFF), Some(_)) => break,
                    (Some(_), _) => i += 1,
                    (None, _) => return false,
                }
            }
        }
    }
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

    /// A PNG of `w x h` gray pixels, written by the `image` crate.
    fn png(w: u32, h: u32) -> Vec<u8> {
        let img = image::GrayImage::from_pixel(w, h, image::Luma([7]));
        let mut out = std::io::Cursor::new(Vec::new());
        img.write_to(&mut out, image::ImageFormat::Png).unwrap();
        out.into_inner()
    }

    /// A JPEG of 8 x 8 RGB pixels whose frame header then claims `w x h`.
    fn jpeg_claiming(w: u16, h: u16) -> Vec<u8> {
        let mut c = mozjpeg::Compress::new(mozjpeg::ColorSpace::JCS_RGB);
        c.set_size(8, 8);
        let mut started = c.start_compress(Vec::new()).unwrap();
        started.write_scanlines(&[128u8; 8 * 8 * 3]).unwrap();
        let mut bytes = started.finish().unwrap();
        // SOF0/SOF2: FF C0|C2, length (2), precision (1), height (2), width (2).
        let at = bytes
            .windows(2)
            .position(|m| m[0] == 0xFF && (m[1] == 0xC0 || m[1] == 0xC2))
            .expect("a frame header");
        bytes[at + 5..at + 7].copy_from_slice(&h.to_be_bytes());
        bytes[at + 7..at + 9].copy_from_slice(&w.to_be_bytes());
        bytes
    }

    #[test]
    fn truncated_jpegs_are_refused_as_pillow_refuses_them() {
        let jpeg = jpeg_claiming(8, 8);
        assert!(RgbImage::decode(&jpeg, Path::new("j.jpg")).is_ok());
        for cut in [jpeg.len() - 2, jpeg.len() / 2, 20] {
            let e = RgbImage::decode(&jpeg[..cut], Path::new("cut.jpg")).unwrap_err();
            assert!(e.to_string().contains("truncated"), "{cut}: {e}");
        }
        // Bytes after the end-of-image marker are ignored, as libjpeg and Pillow ignore them.
        let mut trailing = jpeg.clone();
        trailing.extend_from_slice(b"trailing bytes");
        assert!(RgbImage::decode(&trailing, Path::new("t.jpg")).is_ok());
    }

    #[test]
    fn images_declaring_too_many_pixels_are_refused_before_decoding() {
        // A few hundred bytes declaring 100000 x 100000 (10^10 pixels): refused from the header.
        let mut bomb = png(1, 1);
        bomb[16..20].copy_from_slice(&100_000u32.to_be_bytes());
        bomb[20..24].copy_from_slice(&100_000u32.to_be_bytes());
        // IHDR's CRC-32 over its type and data (bytes 12..29), as a real bomb carries it.
        let crc = bomb[12..29].iter().fold(!0u32, |mut c, &b| {
            c ^= u32::from(b);
            for _ in 0..8 {
                c = if c & 1 == 1 {
                    (c >> 1) ^ 0xEDB8_8320
                } else {
                    c >> 1
                };
            }
            c
        });
        bomb[29..33].copy_from_slice(&(!crc).to_be_bytes());
        let err = RgbImage::decode(&bomb, Path::new("bomb.png")).unwrap_err();
        assert!(
            matches!(
                err,
                ImageError::TooLarge {
                    pixels: 10_000_000_000,
                    limit: MAX_IMAGE_PIXELS,
                    ..
                }
            ),
            "{err}"
        );
        assert!(
            err.to_string().contains("bomb.png") && err.to_string().contains("--max-image-pixels")
        );
        let err =
            RgbImage::decode(&jpeg_claiming(65_500, 65_500), Path::new("bomb.jpg")).unwrap_err();
        assert!(
            matches!(
                err,
                ImageError::TooLarge {
                    width: 65_500,
                    height: 65_500,
                    ..
                }
            ),
            "{err}"
        );

        // The limit is inclusive and can be moved either way.
        let small = png(4, 4);
        let at = |limit| RgbImage::decode_limited(&small, Path::new("s.png"), limit);
        assert!(matches!(
            at(Some(15)),
            Err(ImageError::TooLarge { pixels: 16, .. })
        ));
        assert_eq!(at(Some(16)).unwrap().pixels.len(), 4 * 4 * 3);
        assert_eq!(at(None).unwrap().width, 4);
        let jpeg = jpeg_claiming(8, 8);
        assert!(RgbImage::decode_limited(&jpeg, Path::new("j.jpg"), Some(63)).is_err());
        assert_eq!(
            RgbImage::decode_limited(&jpeg, Path::new("j.jpg"), Some(64))
                .unwrap()
                .height,
            8
        );
    }
}
