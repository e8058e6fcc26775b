//! zoo's image processors against transformers' PIL backend: every image of
//! `tests/data/image_processors` (PNG RGB, RGBA, grayscale, grayscale+alpha, palette with
//! transparency; JPEG 4:2:0, 4:4:4 and grayscale) under every processor config there (one
//! saved by transformers 5's CLIPProcessor, nested in processor_config.json beside a stale
//! preprocessor_config.json), pixel values within 1e-5 of those
//! `nightly/reference/image_processors.py` recorded.

use std::path::{Path, PathBuf};

use zoo_hub::Pretrained;
use zoo_transformers::image_processing::{ImageError, ImageProcessor, RgbImage};

fn data() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/image_processors")
}

#[test]
fn pixel_values_match_transformers_pil_backend() {
    let bytes = std::fs::read(data().join("expected.safetensors")).unwrap();
    let expected = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut names: Vec<String> = expected.names().into_iter().map(str::to_string).collect();
    names.sort();
    assert!(names.len() >= 60, "only {} arrays", names.len());
    let mut worst = 0f32;
    let mut failures = Vec::new();
    for name in &names {
        let (proc_name, image_name) = name.split_once('/').unwrap();
        // Each folder as a model folder, found as transformers finds it (a processor saved
        // by transformers 5 nests its settings in processor_config.json).
        let folder = data().join("processors").join(proc_name);
        let model = Pretrained::open(folder.to_str().unwrap()).unwrap();
        let processor = ImageProcessor::from_pretrained(&model).unwrap();
        let image = RgbImage::open(&data().join(image_name)).unwrap();
        let (got, h, w) = processor.process(&image).unwrap();
        let want = expected.tensor(name).unwrap();
        assert_eq!(want.shape(), [3, h, w], "{name}");
        let want: Vec<f32> = want
            .data()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        let diff = got
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        worst = worst.max(diff);
        if diff > 1e-5 {
            let off = got
                .iter()
                .zip(&want)
                .filter(|(a, b)| (*a - *b).abs() > 1e-5)
                .count();
            failures.push(format!(
                "{name}: max |diff| {diff:.3e} at {off} of {} values",
                got.len()
            ));
        }
    }
    eprintln!("{} arrays, max |diff| {worst:.3e}", names.len());
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn a_16_bit_png_is_refused_by_name() {
    let err = RgbImage::open(&data().join("gray16.png")).unwrap_err();
    assert!(matches!(err, ImageError::Depth { bits: 16, .. }), "{err}");
    assert!(err.to_string().contains("gray16.png"), "{err}");
}

#[test]
fn a_file_that_is_not_an_image_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("notes.png");
    std::fs::write(&path, b"these are notes, not pixels").unwrap();
    let err = RgbImage::open(&path).unwrap_err();
    assert!(matches!(err, ImageError::Decode { .. }), "{err}");
    assert!(err.to_string().contains("notes.png"), "{err}");
    let missing = RgbImage::open(&dir.path().join("absent.jpg")).unwrap_err();
    assert!(matches!(missing, ImageError::Io { .. }), "{missing}");
}
