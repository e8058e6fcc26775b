//! Every pipeline case of `tests/data/pipelines` (tiny random pipelines that
//! `nightly/reference/pipelines.py` saved with diffusers' `save_pretrained`, and what
//! diffusers computed with them): the UNet's prediction for fixed latents, timestep and
//! embeddings; VAE decode and encode; the prompt embeddings; and the whole pipeline's image
//! from diffusers' initial latents (DDPM: from its recorded noise) — on candle's CPU and on
//! the XLA CPU plugin. Tolerances as diffusers' tests set them: 1e-4 max abs for the UNet and
//! the VAE, 1e-3 on images in [0, 1].

mod common;

use std::collections::VecDeque;
use std::path::PathBuf;

use common::{case_dir, check, Case};
use zoo_diffusers::pipelines::stable_diffusion::TextToImage;
use zoo_diffusers::pipelines::{DiffusionPipeline, LoadOptions, Noise, StableDiffusionPipeline};
use zoo_diffusers::{AutoencoderKL, UNet2DConditionInput, UNet2DConditionModel, UNet2DModel};
use zoo_runtime::{lazy, DType, Device, PjrtDevice, PjrtPlatform, Tensor};

fn unet_conditioned(case: &Case, device: &Device, report: &mut Vec<String>) {
    let unet =
        UNet2DConditionModel::from_pretrained(&case.path("unet"), DType::F32, device).unwrap();
    let t = |n: &str| case.tensor(n, device);
    let (text, ids) = if case.has("unet.text_embeds") {
        (Some(t("unet.text_embeds")), Some(t("unet.time_ids")))
    } else {
        (None, None)
    };
    let out = unet
        .forward(UNet2DConditionInput {
            sample: &t("unet.sample"),
            timestep: &t("unet.timestep"),
            encoder_hidden_states: &t("unet.encoder_hidden_states"),
            class_labels: None,
            timestep_cond: None,
            text_embeds: text.as_ref(),
            time_ids: ids.as_ref(),
        })
        .unwrap();
    check(&out, &t("unet.out"), 1e-4, "unet", report);
}

fn vae(case: &Case, device: &Device, report: &mut Vec<String>) {
    let vae = AutoencoderKL::from_pretrained(&case.path("vae"), DType::F32, device).unwrap();
    let t = |n: &str| case.tensor(n, device);
    check(
        &vae.decode(&t("vae.latents")).unwrap(),
        &t("vae.decoded"),
        1e-4,
        "vae decode",
        report,
    );
    let dist = vae.encode(&t("vae.image")).unwrap();
    check(&dist.mean, &t("vae.mean"), 1e-4, "vae encode mean", report);
    check(
        &dist.logvar,
        &t("vae.logvar"),
        1e-4,
        "vae encode logvar",
        report,
    );
    if case.has("vae.tiled.latents") {
        let mut vae = vae;
        vae.tiling = true;
        let dec = vae.decode(&t("vae.tiled.latents")).unwrap();
        check(&dec, &t("vae.tiled.decoded"), 1e-4, "tiled decode", report);
        let dist = vae.encode(&t("vae.tiled.image")).unwrap();
        check(
            &dist.mean,
            &t("vae.tiled.mean"),
            1e-4,
            "tiled encode mean",
            report,
        );
        check(
            &dist.logvar,
            &t("vae.tiled.logvar"),
            1e-4,
            "tiled encode logvar",
            report,
        );
    }
}

fn pipeline(case: &Case, device: &Device, report: &mut Vec<String>) {
    let opts = LoadOptions {
        device: *device,
        ..Default::default()
    };
    pipeline_with(case, &opts, report);
}

fn pipeline_with(case: &Case, opts: &LoadOptions, report: &mut Vec<String>) {
    let device = &opts.device;
    let p = StableDiffusionPipeline::from_pretrained(&case.path(""), opts).unwrap();
    let spec = &case.spec;
    let args = TextToImage {
        prompt: vec![case.str("prompt")],
        negative_prompt: Some(vec![case.str("negative_prompt")]),
        num_inference_steps: spec["num_inference_steps"].as_u64().unwrap() as usize,
        guidance_scale: spec["guidance_scale"].as_f64().unwrap(),
        guidance_rescale: spec["guidance_rescale"].as_f64().unwrap_or(0.0),
        height: Some(spec["height"].as_u64().unwrap() as usize),
        width: Some(spec["width"].as_u64().unwrap() as usize),
        latents: Some(case.tensor("pipe.latents", device)),
        ..Default::default()
    };
    let (pos, neg) = p.encode_prompt(&args).unwrap();
    check(
        &pos.prompt_embeds,
        &case.tensor("prompt_embeds", device),
        1e-4,
        "prompt_embeds",
        report,
    );
    check(
        &neg.unwrap().prompt_embeds,
        &case.tensor("negative_prompt_embeds", device),
        1e-4,
        "negative_prompt_embeds",
        report,
    );
    if let Some(pooled) = &pos.text_embeds {
        check(
            pooled,
            &case.tensor("pooled_prompt_embeds", device),
            1e-4,
            "pooled",
            report,
        );
    }
    let out = p
        .generate(&args, &mut Noise::Given(VecDeque::new()))
        .unwrap();
    let want = case.tensor("pipe.image", &Device::Cpu);
    check(&out.images, &want, 1e-3, "image", report);
    if let Some(i2i) = spec.get("img2img") {
        // The two draws diffusers made: the VAE posterior's, then add_noise's.
        let noise: VecDeque<Tensor> = ["img2img.noise.0", "img2img.noise.1"]
            .iter()
            .map(|n| case.tensor(n, device))
            .collect();
        let args = TextToImage {
            num_inference_steps: i2i["num_inference_steps"].as_u64().unwrap() as usize,
            guidance_scale: i2i["guidance_scale"].as_f64().unwrap(),
            strength: i2i["strength"].as_f64().unwrap(),
            init_image: Some(case.tensor("img2img.init_image", device)),
            latents: None,
            height: None,
            width: None,
            ..args
        };
        let out = p.generate(&args, &mut Noise::Given(noise)).unwrap();
        let want = case.tensor("img2img.image", &Device::Cpu);
        check(&out.images, &want, 1e-3, "img2img image", report);
        let steps = case.tensor("img2img.timesteps", &Device::Cpu).elem_count();
        assert_eq!(out.steps, steps);
    }
}

fn ddpm(case: &Case, device: &Device, report: &mut Vec<String>) {
    let t = |n: &str| case.tensor(n, device);
    let unet = UNet2DModel::from_pretrained(&case.path("unet"), DType::F32, device).unwrap();
    let out = unet
        .forward(&t("unet.sample"), &t("unet.timestep"), None)
        .unwrap();
    check(&out, &t("unet.out"), 1e-4, "unet", report);
    let opts = LoadOptions {
        device: *device,
        ..Default::default()
    };
    ddpm_pipeline(case, &opts, report);
}

/// Returns the UNet's devices.
fn ddpm_pipeline(case: &Case, opts: &LoadOptions, report: &mut Vec<String>) -> Vec<Device> {
    let t = |n: &str| case.tensor(n, &opts.device);
    let DiffusionPipeline::Ddpm(p) =
        DiffusionPipeline::from_pretrained(&case.path(""), opts).unwrap()
    else {
        panic!("not a DDPM pipeline");
    };
    let noise: VecDeque<Tensor> = (0..)
        .map(|i| format!("pipe.noise.{i}"))
        .take_while(|n| case.has(n))
        .map(|n| t(&n))
        .collect();
    let steps = case.spec["num_inference_steps"].as_u64().unwrap() as usize;
    let out = p
        .generate(1, steps, &mut Noise::Given(noise), false)
        .unwrap();
    check(
        &out.images,
        &case.tensor("pipe.image", &Device::Cpu),
        1e-3,
        "image",
        report,
    );
    p.unet.devices()
}

fn run_all(device: &Device) {
    for name in ["sd15", "sd2-vpred", "sdxl"] {
        let case = Case::open(name);
        let mut report = Vec::new();
        unet_conditioned(&case, device, &mut report);
        vae(&case, device, &mut report);
        pipeline(&case, device, &mut report);
        eprintln!("{name} on {device:?}: {}", report.join(", "));
    }
    let case = Case::open("ddpm");
    let mut report = Vec::new();
    ddpm(&case, device, &mut report);
    eprintln!("ddpm on {device:?}: {}", report.join(", "));
}

/// The pipeline planned over the plugin's 4 devices with the planner's `sequential`
/// strategy: whole on device 0 when its budget holds everything, the UNet split (each
/// component where the plan puts it) when budgets are tight, an error naming the shortfall
/// when they cannot hold it; the planned images are diffusers'.
fn planned_placements(case: &Case) {
    use zoo_diffusers::pipelines::placement::{plan_devices, PlanShape};
    use zoo_runtime::device_map::parse_max_memory;
    let shape = PlanShape {
        size: Some((32, 32)),
        ..PlanShape::default()
    };
    let planned = |budget: &str| {
        let m = parse_max_memory(budget).unwrap();
        plan_devices(
            &case.path(""),
            PjrtPlatform::Cpu,
            &[0, 1, 2, 3],
            "sequential",
            Some(&m),
            &shape,
        )
    };
    let (whole, plan) = planned("1GiB").unwrap();
    assert_eq!(plan.stages.len(), 1, "{}", plan.table());
    assert!(whole.denoiser_placement.is_none());
    let p = StableDiffusionPipeline::from_pretrained(&case.path(""), &whole).unwrap();
    assert_eq!(p.unet.devices().len(), 1);
    drop(p);
    let mut report = Vec::new();
    pipeline_with(case, &whole, &mut report);
    // Room for the activations and half the weights each (5% is kept in reserve): the
    // UNet must cross devices.
    let (weights, activations) = (plan.stages[0].weights, plan.stages[0].activations);
    let tight = (activations + weights / 2) * 100 / 95;
    let (split, plan) = planned(&tight.to_string()).unwrap();
    assert!(plan.stages.len() >= 2, "{}", plan.table());
    let p = StableDiffusionPipeline::from_pretrained(&case.path(""), &split).unwrap();
    assert!(p.unet.devices().len() > 1, "{}", plan.table());
    drop(p);
    pipeline_with(case, &split, &mut report);
    eprintln!(
        "{} planned whole and over {} devices: {}",
        case.str("name"),
        plan.stages.len(),
        report.join(", ")
    );
    let e = planned(&activations.to_string()).unwrap_err().to_string();
    assert!(e.contains("does not fit"), "{e}");
}

#[test]
fn pipelines_match_diffusers_on_candle_cpu() {
    run_all(&Device::Cpu);
}

#[test]
fn pipelines_match_diffusers_on_the_xla_cpu_plugin() {
    let plugin = std::env::var_os("ZOO_PJRT_CPU_PLUGIN")
        .filter(|v| !v.is_empty())
        .expect("ZOO_PJRT_CPU_PLUGIN is not set: run the tests through scripts/run-tests.sh, which downloads the PJRT CPU plugins");
    lazy::configure(PjrtPlatform::Cpu, Some(PathBuf::from(plugin)), Some(4)).unwrap();
    lazy::set_matmul_precision(lazy::Precision::Highest);
    let device = Device::Pjrt(PjrtDevice::new(PjrtPlatform::Cpu, 0));
    run_all(&device);
    // The UNet split over the plugin's 4 devices in balanced stages gives the same images.
    let devices: Vec<Device> = (0..4)
        .map(|ordinal| Device::Pjrt(PjrtDevice::new(PjrtPlatform::Cpu, ordinal)))
        .collect();
    for name in ["sd15", "sdxl"] {
        let case = Case::open(name);
        let opts = LoadOptions {
            device: devices[0],
            unet_devices: devices.clone(),
            ..Default::default()
        };
        let p = StableDiffusionPipeline::from_pretrained(&case.path(""), &opts).unwrap();
        assert_eq!(
            p.unet.devices().len(),
            4,
            "{name}: the UNet is not split over 4 devices"
        );
        let mut report = Vec::new();
        pipeline_with(&case, &opts, &mut report);
        eprintln!("{name} with the UNet over 4 devices: {}", report.join(", "));
    }
    let opts = LoadOptions::on_devices(&devices);
    let mut report = Vec::new();
    let used = ddpm_pipeline(&Case::open("ddpm"), &opts, &mut report);
    assert!(used.len() > 1, "the DDPM UNet is not split: {used:?}");
    eprintln!(
        "ddpm with the UNet over {} devices: {}",
        used.len(),
        report.join(", ")
    );
    planned_placements(&Case::open("sd15"));
    // Compiled once per (size, batch): the first, a middle and the last step are the
    // programs there are, so more steps of the same call compile nothing new.
    let case = Case::open("sdxl");
    let p = StableDiffusionPipeline::from_pretrained(
        &case.path(""),
        &LoadOptions {
            device,
            ..Default::default()
        },
    )
    .unwrap();
    let mut args = TextToImage {
        prompt: vec![case.str("prompt")],
        num_inference_steps: 3,
        guidance_scale: 5.0,
        height: Some(32),
        width: Some(32),
        ..Default::default()
    };
    p.generate(&args, &mut Noise::seeded(1)).unwrap();
    let before = lazy::stats();
    args.num_inference_steps = 6;
    p.generate(&args, &mut Noise::seeded(2)).unwrap();
    let after = lazy::stats();
    let compiles = after.compiles - before.compiles;
    assert_eq!(
        compiles, 0,
        "6 steps after 3 compiled {compiles} new programs"
    );
    // Each step was handed to the device without waiting for it (the host records the next
    // one meanwhile).
    assert!(after.dispatched - before.dispatched >= 6);
}

#[test]
fn bad_configs_and_arguments_are_typed_errors() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, json: &str| -> PathBuf {
        let p = dir.path().join(name);
        std::fs::write(&p, json).unwrap();
        p
    };
    let err = |r: zoo_diffusers::Result<zoo_diffusers::UNet2DConditionConfig>| {
        r.expect_err("should fail").to_string()
    };
    let e = err(zoo_diffusers::UNet2DConditionConfig::from_file(&write(
        "a.json",
        r#"{"_class_name": "UNet2DConditionModel", "num_attention_heads": 8}"#,
    )));
    assert!(
        e.contains("num_attention_heads") && e.contains("attention_head_dim"),
        "{e}"
    );
    let e = err(zoo_diffusers::UNet2DConditionConfig::from_file(&write(
        "b.json",
        r#"{"block_out_channels": [32, 64], "down_block_types": ["DownBlock2D"], "up_block_types": ["UpBlock2D"]}"#,
    )));
    assert!(e.contains("block_out_channels"), "{e}");
    let e = err(zoo_diffusers::UNet2DConditionConfig::from_file(&write(
        "c.json",
        r#"{"block_out_channels": [30], "down_block_types": ["DownBlock2D"], "up_block_types": ["UpBlock2D"], "norm_num_groups": 32}"#,
    )));
    assert!(e.contains("norm_num_groups"), "{e}");
    let e = err(zoo_diffusers::UNet2DConditionConfig::from_file(&write(
        "d.json",
        r#"{"_class_name": "UNet2DModel"}"#,
    )));
    assert!(e.contains("UNet2DModel"), "{e}");
    let e = err(zoo_diffusers::UNet2DConditionConfig::from_file(&write(
        "e.json",
        r#"{"addition_embed_type": "text_time"}"#,
    )));
    assert!(e.contains("addition_time_embed_dim"), "{e}");

    let p = StableDiffusionPipeline::from_pretrained(
        &case_dir("sd15").to_string_lossy(),
        &LoadOptions::default(),
    )
    .unwrap();
    let base = TextToImage {
        prompt: vec!["a cat".into()],
        num_inference_steps: 2,
        ..Default::default()
    };
    let bad = |args: TextToImage, says: &str| {
        let e = p
            .generate(&args, &mut Noise::seeded(0))
            .expect_err("should fail")
            .to_string();
        assert!(e.contains(says), "{says:?} not in {e}");
    };
    bad(
        TextToImage {
            guidance_scale: -1.0,
            ..base.clone()
        },
        "guidance scale",
    );
    bad(
        TextToImage {
            height: Some(36),
            ..base.clone()
        },
        "multiples of 8",
    );
    // Sizes and counts whose images no host holds are refused before anything is drawn.
    bad(
        TextToImage {
            height: Some(1 << 32),
            width: Some(1 << 32),
            ..base.clone()
        },
        "host memory",
    );
    bad(
        TextToImage {
            num_images_per_prompt: 1 << 40,
            ..base.clone()
        },
        "host memory",
    );
    bad(
        TextToImage {
            latents: Some(Tensor::zeros(&[1, 4, 8, 8], DType::F32, &Device::Cpu).unwrap()),
            ..base.clone()
        },
        "latents",
    );
    bad(
        TextToImage {
            init_image: Some(Tensor::zeros(&[1, 3, 32, 32], DType::F32, &Device::Cpu).unwrap()),
            height: Some(48),
            ..base.clone()
        },
        "init image is 32x32",
    );
    bad(
        TextToImage {
            negative_prompt: Some(vec!["a".into(), "b".into()]),
            ..base.clone()
        },
        "negative prompts",
    );
}
