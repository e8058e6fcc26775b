//! The patch-transformer cases of `tests/data/pipelines` (tiny random DiT, PixArt-α and
//! PixArt-Σ pipelines that `nightly/reference/patch_pipelines.py` saved with diffusers'
//! `save_pretrained`, and what diffusers computed with them): the transformer's prediction
//! (PixArt with masked text and, for α, the size conditioning), VAE decode, PixArt's prompt
//! embeddings and masks, and the whole pipeline's image (DiT from its recorded draw, PixArt
//! from given latents; Σ through resolution binning and the resize back) — on candle's CPU
//! and on the XLA CPU plugin, the transformer also split over 4 of its devices.

mod common;

use common::{check, edited_copy, xla_cpu, Case};
use zoo_diffusers::pipelines::pixart::binned_size;
use zoo_diffusers::pipelines::stable_diffusion::TextToImage;
use zoo_diffusers::pipelines::{
    DiTPipeline, DiffusionPipeline, LoadOptions, Noise, PixArtPipeline, PixArtVersion,
};
use zoo_diffusers::{
    AutoencoderKL, DiTTransformer2DModel, PixArtTransformer2DModel, PixArtTransformerInput,
};
use zoo_runtime::{DType, Device};

const PIXART_CASES: &[&str] = &["pixart-alpha", "pixart-sigma"];

fn tol(case: &Case, what: &str) -> f64 {
    case.spec["tolerances"][what].as_f64().unwrap()
}

fn vae(case: &Case, device: &Device, report: &mut Vec<String>) {
    let vae = AutoencoderKL::from_pretrained(&case.path("vae"), DType::F32, device).unwrap();
    let t = |n: &str| case.tensor(n, device);
    check(
        &vae.decode(&t("vae.latents")).unwrap(),
        &t("vae.decoded"),
        tol(case, "vae"),
        "vae decode",
        report,
    );
}

fn dit(case: &Case, opts: &LoadOptions, report: &mut Vec<String>) {
    let device = &opts.device;
    let t = |n: &str| case.tensor(n, device);
    let model =
        DiTTransformer2DModel::from_pretrained(&case.path("transformer"), DType::F32, device)
            .unwrap();
    let out = model
        .forward(
            &t("transformer.hidden_states"),
            &t("transformer.timestep"),
            &t("transformer.class_labels"),
        )
        .unwrap();
    check(
        &out,
        &t("transformer.out"),
        tol(case, "transformer"),
        "transformer",
        report,
    );
    let p = DiTPipeline::from_pretrained(&case.path(""), opts).unwrap();
    let labels: Vec<String> = case.spec["labels"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    let ids: Vec<usize> = case.spec["class_labels"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as usize)
        .collect();
    assert_eq!(p.get_label_ids(&labels).unwrap(), ids);
    let args = TextToImage {
        prompt: labels,
        num_inference_steps: case.spec["num_inference_steps"].as_u64().unwrap() as usize,
        guidance_scale: case.spec["call"]["guidance_scale"].as_f64().unwrap(),
        latents: Some(t("pipe.latents")),
        ..Default::default()
    };
    let out = p
        .generate(&args, &mut Noise::Given(Default::default()))
        .unwrap();
    check(
        &out.images,
        &t("pipe.image"),
        tol(case, "image"),
        "image",
        report,
    );
}

fn pixart_transformer(case: &Case, device: &Device, report: &mut Vec<String>) {
    let model =
        PixArtTransformer2DModel::from_pretrained(&case.path("transformer"), DType::F32, device)
            .unwrap();
    let t = |n: &str| case.tensor(n, device);
    let size = case
        .has("transformer.resolution")
        .then(|| (t("transformer.resolution"), t("transformer.aspect_ratio")));
    let out = model
        .forward(PixArtTransformerInput {
            hidden_states: &t("transformer.hidden_states"),
            encoder_hidden_states: &t("transformer.encoder_hidden_states"),
            encoder_attention_mask: Some(&t("transformer.encoder_attention_mask")),
            timestep: &t("transformer.timestep"),
            added_cond: size.as_ref().map(|(r, a)| (r, a)),
        })
        .unwrap();
    check(
        &out,
        &t("transformer.out"),
        tol(case, "transformer"),
        "transformer",
        report,
    );
}

fn pixart_call(case: &Case, device: &Device) -> TextToImage {
    let kw = &case.spec["call"];
    TextToImage {
        prompt: vec![case.str("prompt")],
        negative_prompt: Some(vec![case.str("negative_prompt")]),
        num_inference_steps: case.spec["num_inference_steps"].as_u64().unwrap() as usize,
        guidance_scale: kw["guidance_scale"].as_f64().unwrap(),
        height: kw["height"].as_u64().map(|v| v as usize),
        width: kw["width"].as_u64().map(|v| v as usize),
        max_sequence_length: kw["max_sequence_length"].as_u64().map(|v| v as usize),
        resolution_binning: kw["use_resolution_binning"].as_bool().unwrap(),
        latents: Some(case.tensor("pipe.latents", device)),
        ..Default::default()
    }
}

fn pixart_pipeline(case: &Case, opts: &LoadOptions, report: &mut Vec<String>) {
    let device = &opts.device;
    let p = PixArtPipeline::from_pretrained(&case.path(""), opts).unwrap();
    assert_eq!(p.class_name(), case.str("pipeline"));
    let args = pixart_call(case, device);
    let (pos, neg) = p.encode_prompt(&args).unwrap();
    let neg = neg.expect("guidance on");
    let t = |n: &str| case.tensor(n, device);
    let e = tol(case, "transformer");
    check(
        &pos.prompt_embeds,
        &t("prompt_embeds"),
        e,
        "prompt_embeds",
        report,
    );
    check(
        &pos.prompt_attention_mask,
        &t("prompt_attention_mask"),
        0.0,
        "prompt_attention_mask",
        report,
    );
    check(
        &neg.prompt_embeds,
        &t("negative_prompt_embeds"),
        e,
        "negative_prompt_embeds",
        report,
    );
    check(
        &neg.prompt_attention_mask,
        &t("negative_prompt_attention_mask"),
        0.0,
        "negative_prompt_attention_mask",
        report,
    );
    let out = p
        .generate(&args, &mut Noise::Given(Default::default()))
        .unwrap();
    check(
        &out.images,
        &t("pipe.image"),
        tol(case, "image"),
        "image",
        report,
    );
}

fn run_all(device: &Device) {
    let opts = LoadOptions {
        device: *device,
        ..Default::default()
    };
    let case = Case::open("dit");
    let mut report = Vec::new();
    vae(&case, device, &mut report);
    dit(&case, &opts, &mut report);
    eprintln!("dit on {device:?}: {}", report.join(", "));
    for &name in PIXART_CASES {
        let case = Case::open(name);
        let mut report = Vec::new();
        vae(&case, device, &mut report);
        pixart_transformer(&case, device, &mut report);
        pixart_pipeline(&case, &opts, &mut report);
        eprintln!("{name} on {device:?}: {}", report.join(", "));
    }
}

#[test]
fn patch_pipelines_match_diffusers_on_candle_cpu() {
    run_all(&Device::Cpu);
}

#[test]
fn patch_pipelines_match_diffusers_on_the_xla_cpu_plugin() {
    run_all(&xla_cpu(0));
    // The transformer split over the plugin's 4 devices at its blocks gives the same images.
    let devices: Vec<Device> = (0..4).map(xla_cpu).collect();
    let opts = LoadOptions {
        device: devices[0],
        unet_devices: devices.clone(),
        ..Default::default()
    };
    let case = Case::open("dit");
    let mut report = Vec::new();
    let p = DiTPipeline::from_pretrained(&case.path(""), &opts).unwrap();
    assert!(p.transformer.devices().len() > 1, "dit: not split");
    dit(&case, &opts, &mut report);
    let case = Case::open("pixart-sigma");
    let p = PixArtPipeline::from_pretrained(&case.path(""), &opts).unwrap();
    assert!(p.transformer.devices().len() > 1, "pixart-sigma: not split");
    pixart_pipeline(&case, &opts, &mut report);
    eprintln!(
        "dit and pixart-sigma with the transformer over 4 devices: {}",
        report.join(", ")
    );
}

#[test]
fn resolution_binning_picks_diffusers_sizes() {
    let case = Case::open("pixart-sigma");
    let want: Vec<usize> = case.spec["binned_size"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as usize)
        .collect();
    let kw = &case.spec["call"];
    let (h, w) = (
        kw["height"].as_u64().unwrap() as usize,
        kw["width"].as_u64().unwrap() as usize,
    );
    assert_eq!(
        binned_size(PixArtVersion::Sigma, 32, h, w),
        Some((want[0], want[1]))
    );
    // The 1024-px table's square and its extremes; Σ's 2048 table exists only for Σ.
    assert_eq!(
        binned_size(PixArtVersion::Alpha, 128, 1024, 1024),
        Some((1024, 1024))
    );
    assert_eq!(
        binned_size(PixArtVersion::Alpha, 128, 256, 4096),
        Some((512, 2048))
    );
    assert!(binned_size(PixArtVersion::Sigma, 256, 2048, 2048).is_some());
    assert_eq!(binned_size(PixArtVersion::Alpha, 256, 2048, 2048), None);
    assert_eq!(binned_size(PixArtVersion::Sigma, 48, 512, 512), None);
}

/// Rewrites one field of a JSON file under `root`.
fn set_field(root: &std::path::Path, file: &str, field: &str, value: serde_json::Value) {
    let path = root.join(file);
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    v[field] = value;
    std::fs::write(&path, v.to_string()).unwrap();
}

#[test]
fn hub_class_names_and_bad_inputs() {
    let opts = LoadOptions::default();
    let load = |dir: &tempfile::TempDir| {
        DiffusionPipeline::from_pretrained(&dir.path().to_string_lossy(), &opts)
    };
    // The Hub's DiT and PixArt checkpoints name the transformer `Transformer2DModel`.
    for name in ["dit", "pixart-alpha"] {
        let d = edited_copy(name, |root| {
            set_field(
                root,
                "transformer/config.json",
                "_class_name",
                "Transformer2DModel".into(),
            );
            set_field(
                root,
                "model_index.json",
                "transformer",
                serde_json::json!(["diffusers", "Transformer2DModel"]),
            );
        });
        load(&d).unwrap_or_else(|e| panic!("{name} as Transformer2DModel: {e}"));
        let plan = zoo_diffusers::pipelines::plan::plan_units(
            &d.path().to_string_lossy(),
            None,
            None,
            1,
            true,
        )
        .unwrap();
        assert!(
            plan.units
                .iter()
                .any(|u| u.name.starts_with("transformer.transformer_blocks.")),
            "{name}: {:?}",
            plan.units.iter().map(|u| &u.name).collect::<Vec<_>>()
        );
    }
    // A generic Transformer2DModel (no norm_type) is not read as a patch transformer.
    let d = edited_copy("dit", |root| {
        let path = root.join("transformer/config.json");
        let mut v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        v["_class_name"] = "Transformer2DModel".into();
        v.as_object_mut().unwrap().remove("norm_type");
        std::fs::write(&path, v.to_string()).unwrap();
    });
    let e = load(&d).unwrap_err().to_string();
    assert!(e.contains("without `norm_type`"), "{e}");
    // A PixArt transformer config in a DiT pipeline, and a caption width that cannot join
    // the tokens.
    let d = edited_copy("dit", |root| {
        set_field(
            root,
            "transformer/config.json",
            "norm_type",
            "ada_norm_single".into(),
        )
    });
    let e = load(&d).unwrap_err().to_string();
    assert!(
        e.contains("norm_type") && e.contains("ada_norm_zero"),
        "{e}"
    );
    let d = edited_copy("pixart-alpha", |root| {
        set_field(
            root,
            "transformer/config.json",
            "cross_attention_dim",
            16.into(),
        )
    });
    let e = load(&d).unwrap_err().to_string();
    assert!(e.contains("cross_attention_dim"), "{e}");
    let d = edited_copy("pixart-alpha", |root| {
        set_field(
            root,
            "transformer/config.json",
            "num_attention_heads",
            2.into(),
        );
        set_field(
            root,
            "transformer/config.json",
            "cross_attention_dim",
            16.into(),
        );
    });
    let e = load(&d).unwrap_err().to_string();
    assert!(e.contains("divisible by 3"), "{e}");

    // Calls: an unknown class, a DiT size, a PixArt size the patches do not divide, and
    // binning for a sample size diffusers has no table for; all before any step.
    let dit = DiTPipeline::from_pretrained(&Case::open("dit").path(""), &opts).unwrap();
    let base = TextToImage {
        prompt: vec!["zebra".into()],
        num_inference_steps: 2,
        ..Default::default()
    };
    let e = dit
        .generate(&base, &mut Noise::seeded(0))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("\"zebra\"") && e.contains("golden retriever"),
        "{e}"
    );
    let numbered = TextToImage {
        prompt: vec!["281".into()],
        ..base.clone()
    };
    assert_eq!(dit.get_label_ids(&numbered.prompt).unwrap(), vec![281]);
    let sized = TextToImage {
        height: Some(64),
        ..numbered
    };
    let e = dit
        .generate(&sized, &mut Noise::seeded(0))
        .unwrap_err()
        .to_string();
    assert!(e.contains("32x32"), "{e}");
    let sigma =
        PixArtPipeline::from_pretrained(&Case::open("pixart-sigma").path(""), &opts).unwrap();
    let odd = TextToImage {
        prompt: vec!["a photo".into()],
        height: Some(40),
        width: Some(48),
        resolution_binning: false,
        ..base.clone()
    };
    let e = sigma
        .generate(&odd, &mut Noise::seeded(0))
        .unwrap_err()
        .to_string();
    assert!(e.contains("48x40") && e.contains("multiples of 16"), "{e}");
    let d = edited_copy("pixart-sigma", |root| {
        set_field(root, "transformer/config.json", "sample_size", 48.into())
    });
    let sigma = PixArtPipeline::from_pretrained(&d.path().to_string_lossy(), &opts).unwrap();
    let binned = TextToImage {
        prompt: vec!["a photo".into()],
        ..base
    };
    let e = sigma
        .generate(&binned, &mut Noise::seeded(0))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("sample_size") && e.contains("binning off"),
        "{e}"
    );
}
