//! `zoo image` end to end on the committed tiny pipelines (`diffusers/tests/data/pipelines`,
//! saved by diffusers): with diffusers' own initial latents (`--latents`) the PNG is the
//! image diffusers made, to one 8-bit level; a seed gives the same image on candle's CPU and
//! the XLA CPU plugin; bad input fails with a typed error before any step, leaving nothing at
//! `--out`.

use std::path::{Path, PathBuf};

use safetensors::SafeTensors;

mod common;
use common::{copy_dir, zoo, zoo_with};

fn pipeline(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../diffusers/tests/data/pipelines")
        .join(name)
}

fn s(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

/// `name` of the case's expected.safetensors as (shape, f32 values).
fn expected(case: &str, name: &str) -> (Vec<usize>, Vec<f32>) {
    let bytes = std::fs::read(pipeline(case).join("expected.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let t = st.tensor(name).unwrap();
    let v = t
        .data()
        .chunks(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    (t.shape().to_vec(), v)
}

fn pixels(path: &Path) -> Vec<u8> {
    image::open(path).unwrap().to_rgb8().into_raw()
}

/// `zoo image` on fixture `case` with diffusers' initial latents (`key`) and `flags`: the
/// PNG is diffusers' image to one 8-bit level.
fn png_is_diffusers_image(case: &str, key: &str, flags: &[&str]) {
    let mut argv = vec![
        "a photo of a red dog and a cat in the world",
        "--negative",
        "hello",
        "--size",
        "32x32",
    ];
    argv.extend_from_slice(flags);
    png_matches(case, key, &argv);
}

/// `zoo image` on fixture `case` with `args` (prompt and flags) and diffusers' initial
/// latents (`key`): the PNG is diffusers' image to one 8-bit level.
fn png_matches(case: &str, key: &str, args: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let (shape, latents) = expected(case, key);
    let bytes: Vec<u8> = latents.iter().flat_map(|v| v.to_le_bytes()).collect();
    let view =
        safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape, &bytes).unwrap();
    let file = dir.path().join("noise.safetensors");
    safetensors::serialize_to_file([("latents", view)], None, &file).unwrap();
    let out = dir.path().join("out.png");
    let path = s(&pipeline(case));
    let (file, out_s) = (s(&file), s(&out));
    let mut argv = vec!["image", &path];
    argv.extend_from_slice(args);
    argv.extend_from_slice(&["--latents", &file, "--out", &out_s]);
    let (ok, stdout, stderr) = zoo(&argv);
    assert!(ok, "{case}: {stderr}");
    assert!(stdout.contains("out"), "{stdout}");
    assert!(
        stderr.contains("s/step"),
        "load and step times are printed: {stderr}"
    );
    let (_, want) = expected(case, "pipe.image");
    // Several images are written as out-N.png.
    let written: Vec<std::path::PathBuf> = if out.exists() {
        vec![out.clone()]
    } else {
        (0..)
            .map(|i| dir.path().join(format!("out-{i}.png")))
            .take_while(|p| p.exists())
            .collect()
    };
    let got: Vec<u8> = written.iter().flat_map(|p| pixels(p)).collect();
    assert_eq!(got.len(), want.len());
    let worst = got
        .iter()
        .zip(&want)
        .map(|(&g, &w)| (g as f32 - (w * 255.0).round()).abs())
        .fold(0.0, f32::max);
    assert!(
        worst <= 1.0,
        "{case}: PNG differs from diffusers' image by {worst} levels"
    );
}

#[test]
fn dit_takes_a_class_label() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("dog.png");
    let path = s(&pipeline("dit"));
    let out_s = s(&out);
    let (ok, stdout, stderr) = zoo(&[
        "image",
        &path,
        "golden retriever",
        "--steps",
        "2",
        "--seed",
        "3",
        "--out",
        &out_s,
    ]);
    assert!(ok, "{stderr}");
    assert!(
        stdout.contains("dog.png") && stderr.contains("DiTPipeline"),
        "{stderr}"
    );
    let img = image::open(&out).unwrap();
    assert_eq!((img.width(), img.height()), (32, 32));
    let bad = dir.path().join("zebra.png");
    let (ok, _, stderr) = zoo(&["image", &path, "zebra", "--out", &s(&bad)]);
    assert!(
        !ok && stderr.contains("\"zebra\"") && stderr.contains("id2label"),
        "{stderr}"
    );
    assert!(!bad.exists());
}

#[test]
fn dit_and_pixart_pngs_are_diffusers_images() {
    png_matches(
        "pixart-sigma",
        "pipe.latents",
        &[
            "a photo of a red dog and a cat in the world",
            "--negative",
            "hello",
            "--size",
            "192x128",
            "--steps",
            "3",
            "--max-sequence-length",
            "16",
        ],
    );
    png_matches(
        "pixart-alpha",
        "pipe.latents",
        &[
            "a photo of a red dog and a cat in the world",
            "--negative",
            "hello",
            "--size",
            "48x32",
            "--no-resolution-binning",
            "--steps",
            "3",
            "--max-sequence-length",
            "16",
        ],
    );
    // The same on the XLA CPU plugin: the transformer over devices 0 and 1, T5 on device 3.
    std::env::var_os("ZOO_PJRT_CPU_PLUGIN")
        .filter(|v| !v.is_empty())
        .expect("ZOO_PJRT_CPU_PLUGIN is not set: run the tests through scripts/run-tests.sh");
    png_matches(
        "pixart-alpha",
        "pipe.latents",
        &[
            "a photo of a red dog and a cat in the world",
            "--negative",
            "hello",
            "--size",
            "48x32",
            "--no-resolution-binning",
            "--steps",
            "3",
            "--max-sequence-length",
            "16",
            "--device-map",
            "pjrt:cpu:0,1",
            "--text-encoder-device",
            "pjrt:cpu:3",
        ],
    );
}

#[test]
fn the_png_is_diffusers_image_from_its_latents() {
    png_is_diffusers_image("sd15", "pipe.latents", &["--steps", "3", "--guidance", "6"]);
    // A strategy device map on a host without a TPU or CUDA device: everything on the CPU.
    png_is_diffusers_image(
        "sd15",
        "pipe.latents",
        &[
            "--steps",
            "3",
            "--guidance",
            "6",
            "--device-map",
            "sequential",
            "--max-memory",
            "1GiB",
        ],
    );
    // SD 3.5 with skip-layer guidance; Flux with true CFG, from packed or unpacked latents.
    png_is_diffusers_image(
        "sd35",
        "pipe.latents",
        &[
            "--steps",
            "3",
            "--guidance",
            "5",
            "--max-sequence-length",
            "16",
            "--skip-guidance-layers",
            "1",
            "--skip-layer-window",
            "0:1",
        ],
    );
    let flux = [
        "--steps",
        "3",
        "--true-cfg-scale",
        "4",
        "--max-sequence-length",
        "16",
    ];
    png_is_diffusers_image("flux", "pipe.latents", &flux);
    png_is_diffusers_image("flux", "pipe.latents_unpacked", &flux);
}

#[test]
fn a_seed_gives_the_same_image_on_every_backend() {
    let plugin = std::env::var_os("ZOO_PJRT_CPU_PLUGIN")
        .filter(|v| !v.is_empty())
        .expect("ZOO_PJRT_CPU_PLUGIN is not set: run the tests through scripts/run-tests.sh");
    let dir = tempfile::tempdir().unwrap();
    let run = |device: &str, name: &str| -> Vec<u8> {
        let out = dir.path().join(name);
        let (ok, _, stderr) = zoo_with(
            &[
                "image",
                &s(&pipeline("sdxl")),
                "a red cat",
                "--steps",
                "3",
                "--seed",
                "7",
                "--device-map",
                device,
                "--out",
                &s(&out),
            ],
            &[("ZOO_PJRT_CPU_PLUGIN", &plugin)],
        );
        assert!(ok, "{device}: {stderr}");
        pixels(&out)
    };
    let cpu = run("cpu", "cpu.png");
    let pjrt = run("pjrt:cpu", "pjrt.png");
    let worst = cpu
        .iter()
        .zip(&pjrt)
        .map(|(&a, &b)| (a as i32 - b as i32).abs())
        .max()
        .unwrap();
    assert!(worst <= 1, "candle and XLA images differ by {worst} levels");
    let other = run("cpu", "again.png");
    assert_eq!(cpu, other, "same seed, same image");
}

#[test]
fn img2img_and_ddpm_write_images() {
    let dir = tempfile::tempdir().unwrap();
    let init = dir.path().join("init.png");
    image::RgbImage::from_fn(48, 40, |x, y| {
        image::Rgb([(x * 5) as u8, (y * 6) as u8, 128])
    })
    .save(&init)
    .unwrap();
    let out = dir.path().join("i2i.png");
    let (ok, _, stderr) = zoo(&[
        "image",
        &s(&pipeline("sd15")),
        "a cat",
        "--init-image",
        &s(&init),
        "--strength",
        "0.5",
        "--steps",
        "4",
        "--out",
        &s(&out),
    ]);
    assert!(ok, "{stderr}");
    assert_eq!(image::open(&out).unwrap().to_rgb8().dimensions(), (48, 40));
    let out = dir.path().join("ddpm.png");
    let (ok, _, stderr) = zoo(&[
        "image",
        &s(&pipeline("ddpm")),
        "",
        "--steps",
        "3",
        "--num-images",
        "2",
        "--out",
        &s(&out),
    ]);
    assert!(ok, "{stderr}");
    for i in 0..2 {
        let p = dir.path().join(format!("ddpm-{i}.png"));
        assert_eq!(image::open(&p).unwrap().to_rgb8().dimensions(), (16, 16));
    }
}

#[test]
fn bad_input_fails_before_any_step_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.png");
    let sd = s(&pipeline("sd15"));
    let fails = |args: &[&str], says: &[&str]| {
        let mut full = vec!["image"];
        full.extend_from_slice(args);
        let o = s(&out);
        full.extend_from_slice(&["--steps", "2", "--out", &o]);
        let (ok, _, stderr) = zoo(&full);
        assert!(!ok, "{args:?} should fail");
        for w in says {
            assert!(stderr.contains(w), "{args:?}: {w:?} not in {stderr}");
        }
        assert!(
            !stderr.contains("denoising"),
            "{args:?} ran steps: {stderr}"
        );
        assert!(!out.exists(), "{args:?} left {}", out.display());
        assert!(!dir.path().join("out.png.partial").exists());
    };
    fails(&[&sd, "x", "--size", "36x30"], &["multiples of 8"]);
    fails(&[&sd, "x", "--guidance=-2"], &["--guidance -2"]);
    fails(&[&sd, "x", "--strength", "1.5"], &["--strength"]);
    let odd = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../transformers/tests/data/image_processors/palette.png");
    fails(
        &[&sd, "x", "--init-image", &s(&odd)],
        &["35x25", "multiples of 8"],
    );
    // An image bomb as the init image: refused from its header, before anything loads.
    let bomb = dir.path().join("bomb.png");
    common::png_bomb(&bomb, 100_000);
    fails(
        &[&sd, "x", "--init-image", &s(&bomb)],
        &["100000x100000", "--max-image-pixels"],
    );
    // A class zoo lacks: the error lists what it runs.
    let kandinsky = dir.path().join("kandinsky");
    std::fs::create_dir_all(&kandinsky).unwrap();
    std::fs::write(
        kandinsky.join("model_index.json"),
        r#"{"_class_name": "KandinskyV22Pipeline", "unet": ["diffusers", "UNet2DConditionModel"]}"#,
    )
    .unwrap();
    fails(
        &[&s(&kandinsky), "x"],
        &[
            "KandinskyV22Pipeline",
            "StableDiffusionPipeline",
            "DDPMPipeline",
        ],
    );
    // A missing component folder is named.
    let broken = dir.path().join("no-vae");
    copy_dir(&pipeline("sd15"), &broken);
    std::fs::remove_dir_all(broken.join("vae")).unwrap();
    fails(&[&s(&broken), "x"], &["vae", "config.json"]);
    fails(&[&sd, "x", "--dtype", "f64"], &["--dtype"]);
    let (ok, _, stderr) = zoo(&["image", &sd, "x", "--out", &s(&dir.path().join("a.jpg"))]);
    assert!(!ok && stderr.contains("PNG"), "{stderr}");
}

#[test]
fn help_teaches_and_inspect_lists_components() {
    let (ok, stdout, _) = zoo(&["image", "--help"]);
    assert!(ok);
    for w in [
        "--latents",
        "--scheduler",
        "--init-image",
        "StableDiffusionXLPipeline",
        "DiTPipeline",
        "PixArtSigmaPipeline",
        "--no-resolution-binning",
        "Examples:",
    ] {
        assert!(stdout.contains(w), "--help lacks {w}");
    }
    let (ok, stdout, stderr) = zoo(&["inspect", &s(&pipeline("sdxl"))]);
    assert!(ok, "{stderr}");
    for w in [
        "StableDiffusionXLPipeline",
        "text_encoder_2",
        "CLIPTextModelWithProjection",
        "UNet2DConditionModel",
    ] {
        assert!(stdout.contains(w), "inspect lacks {w}: {stdout}");
    }
}
