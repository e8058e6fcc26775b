//! The flow-matching pipeline cases of `tests/data/pipelines` (tiny random SD3, SD 3.5 and
//! Flux pipelines that `nightly/reference/flow_pipelines.py` saved with diffusers'
//! `save_pretrained`, and what diffusers computed with them): the transformer's prediction
//! for fixed latents, timestep and embeddings (skipping layers too); VAE decode and encode;
//! the prompt embeddings; the schedule; and the whole pipeline's image from diffusers'
//! initial latents (SD3 also without T5) — on candle's CPU and on the XLA CPU plugin, the
//! transformer also split over 4 of its devices. Tolerances as for Stable Diffusion.

mod common;

use common::{check, edited_copy, xla_cpu, Case};
use zoo_diffusers::pipelines::stable_diffusion::TextToImage;
use zoo_diffusers::pipelines::{FluxPipeline, LoadOptions, Noise, StableDiffusion3Pipeline};
use zoo_diffusers::{
    AutoencoderKL, FluxTransformer2DModel, FluxTransformerInput, SD3Transformer2DModel,
    SD3TransformerInput,
};
use zoo_runtime::{DType, Device, Tensor};

const SD3_CASES: &[&str] = &["sd3", "sd35", "sd3-crop"];
const FLUX_CASES: &[&str] = &["flux", "flux-dev"];

fn tol(case: &Case, what: &str) -> f64 {
    case.spec["tolerances"][what].as_f64().unwrap()
}

fn vae(case: &Case, device: &Device, report: &mut Vec<String>) {
    let vae = AutoencoderKL::from_pretrained(&case.path("vae"), DType::F32, device).unwrap();
    let t = |n: &str| case.tensor(n, device);
    let v = tol(case, "vae");
    check(
        &vae.decode(&t("vae.latents")).unwrap(),
        &t("vae.decoded"),
        v,
        "vae decode",
        report,
    );
    let dist = vae.encode(&t("vae.image")).unwrap();
    check(&dist.mean, &t("vae.mean"), v, "vae encode mean", report);
    check(
        &dist.logvar,
        &t("vae.logvar"),
        v,
        "vae encode logvar",
        report,
    );
}

fn sd3_transformer(case: &Case, device: &Device, report: &mut Vec<String>) {
    let model =
        SD3Transformer2DModel::from_pretrained(&case.path("transformer"), DType::F32, device)
            .unwrap();
    let t = |n: &str| case.tensor(n, device);
    let input = |skip: &'static [usize]| -> Tensor {
        model
            .forward(SD3TransformerInput {
                hidden_states: &t("transformer.hidden_states"),
                encoder_hidden_states: &t("transformer.encoder_hidden_states"),
                pooled_projections: &t("transformer.pooled_projections"),
                timestep: &t("transformer.timestep"),
                skip_layers: skip,
            })
            .unwrap()
    };
    let tt = tol(case, "transformer");
    check(
        &input(&[]),
        &t("transformer.out"),
        tt,
        "transformer",
        report,
    );
    if case.has("transformer.out_skip") {
        check(
            &input(&[1]),
            &t("transformer.out_skip"),
            tt,
            "transformer skipping block 1",
            report,
        );
    }
}

fn flux_transformer(case: &Case, device: &Device, report: &mut Vec<String>) {
    let model =
        FluxTransformer2DModel::from_pretrained(&case.path("transformer"), DType::F32, device)
            .unwrap();
    let t = |n: &str| case.tensor(n, device);
    let guidance = case
        .has("transformer.guidance")
        .then(|| t("transformer.guidance"));
    let out = model
        .forward(FluxTransformerInput {
            hidden_states: &t("transformer.hidden_states"),
            encoder_hidden_states: &t("transformer.encoder_hidden_states"),
            pooled_projections: &t("transformer.pooled_projections"),
            timestep: &t("transformer.timestep"),
            img_ids: &t("transformer.img_ids"),
            txt_ids: &t("transformer.txt_ids"),
            guidance: guidance.as_ref(),
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

/// The call the case made, from its case.json.
fn call(case: &Case, device: &Device) -> TextToImage {
    let s = &case.spec;
    let kw = &s["call"];
    let f = |k: &str, d: f64| kw[k].as_f64().unwrap_or(d);
    TextToImage {
        prompt: vec![case.str("prompt")],
        negative_prompt: s["negative_prompt"].as_str().map(|n| vec![n.to_string()]),
        num_inference_steps: s["num_inference_steps"].as_u64().unwrap() as usize,
        guidance_scale: f("guidance_scale", 7.0),
        true_cfg_scale: f("true_cfg_scale", 1.0),
        height: s["height"].as_u64().map(|v| v as usize),
        width: s["width"].as_u64().map(|v| v as usize),
        max_sequence_length: kw["max_sequence_length"].as_u64().map(|v| v as usize),
        skip_guidance_layers: kw["skip_guidance_layers"]
            .as_array()
            .map(|a| a.iter().map(|v| v.as_u64().unwrap() as usize).collect())
            .unwrap_or_default(),
        skip_layer_guidance_scale: f("skip_layer_guidance_scale", 2.8),
        skip_layer_guidance_start: f("skip_layer_guidance_start", 0.01),
        skip_layer_guidance_stop: f("skip_layer_guidance_stop", 0.2),
        latents: Some(case.tensor("pipe.latents", device)),
        ..Default::default()
    }
}

fn sd3_pipeline(case: &Case, opts: &LoadOptions, report: &mut Vec<String>) {
    let device = &opts.device;
    let mut p = StableDiffusion3Pipeline::from_pretrained(&case.path(""), opts).unwrap();
    let args = call(case, device);
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
        &neg.prompt_embeds,
        &t("negative_prompt_embeds"),
        e,
        "negative_prompt_embeds",
        report,
    );
    check(
        &pos.pooled_prompt_embeds,
        &t("pooled_prompt_embeds"),
        e,
        "pooled",
        report,
    );
    check(
        &neg.pooled_prompt_embeds,
        &t("negative_pooled_prompt_embeds"),
        e,
        "negative pooled",
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
    if case.has("no_t5.image") {
        p.drop_t5();
        let (pos, _) = p.encode_prompt(&args).unwrap();
        check(
            &pos.prompt_embeds,
            &t("no_t5.prompt_embeds"),
            e,
            "prompt_embeds without T5",
            report,
        );
        let out = p
            .generate(&args, &mut Noise::Given(Default::default()))
            .unwrap();
        check(
            &out.images,
            &t("no_t5.image"),
            tol(case, "image"),
            "image without T5",
            report,
        );
    }
}

fn flux_pipeline(case: &Case, opts: &LoadOptions, report: &mut Vec<String>) {
    let device = &opts.device;
    let p = FluxPipeline::from_pretrained(&case.path(""), opts).unwrap();
    let args = call(case, device);
    let (pos, neg) = p.encode_prompt(&args).unwrap();
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
        &pos.pooled_prompt_embeds,
        &t("pooled_prompt_embeds"),
        e,
        "pooled",
        report,
    );
    if let Some(neg) = neg {
        check(
            &neg.prompt_embeds,
            &t("negative_prompt_embeds"),
            e,
            "negative_prompt_embeds",
            report,
        );
    }
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
    for &name in SD3_CASES.iter().chain(FLUX_CASES) {
        let case = Case::open(name);
        let mut report = Vec::new();
        vae(&case, device, &mut report);
        if SD3_CASES.contains(&name) {
            sd3_transformer(&case, device, &mut report);
            sd3_pipeline(&case, &opts, &mut report);
        } else {
            flux_transformer(&case, device, &mut report);
            flux_pipeline(&case, &opts, &mut report);
        }
        eprintln!("{name} on {device:?}: {}", report.join(", "));
    }
}

#[test]
fn flow_pipelines_match_diffusers_on_candle_cpu() {
    run_all(&Device::Cpu);
}

#[test]
fn flow_pipelines_match_diffusers_on_the_xla_cpu_plugin() {
    run_all(&xla_cpu(0));
    // The transformer split over the plugin's 4 devices at its blocks gives the same images.
    let devices: Vec<Device> = (0..4).map(xla_cpu).collect();
    let opts = LoadOptions {
        device: devices[0],
        unet_devices: devices.clone(),
        ..Default::default()
    };
    for name in ["sd35", "flux"] {
        let case = Case::open(name);
        let mut report = Vec::new();
        if name == "flux" {
            let p = FluxPipeline::from_pretrained(&case.path(""), &opts).unwrap();
            assert!(p.transformer.devices().len() > 1, "flux: not split");
            flux_pipeline(&case, &opts, &mut report);
        } else {
            let p = StableDiffusion3Pipeline::from_pretrained(&case.path(""), &opts).unwrap();
            assert!(p.transformer.devices().len() > 1, "sd35: not split");
            sd3_pipeline(&case, &opts, &mut report);
        }
        eprintln!(
            "{name} with the transformer over 4 devices: {}",
            report.join(", ")
        );
    }
    // Planned `balanced` over the 4 devices: the transformer runs on the devices the plan
    // gives its blocks, T5 and the VAE where it puts them, and the images are diffusers'.
    use zoo_diffusers::pipelines::placement::{plan_devices, PlanShape};
    let case = Case::open("flux");
    let shape = PlanShape {
        size: Some((32, 32)),
        guidance: false,
        ..PlanShape::default()
    };
    let planned = |budget: u64| {
        let m = zoo_runtime::device_map::parse_max_memory(&budget.to_string()).unwrap();
        plan_devices(
            &case.path(""),
            zoo_runtime::PjrtPlatform::Cpu,
            &[0, 1, 2, 3],
            "balanced",
            Some(&m),
            &shape,
        )
        .unwrap()
    };
    let (opts, plan) = planned(1 << 30);
    let planned_devices: std::collections::BTreeSet<String> = plan
        .stages
        .iter()
        .filter(|s| s.units.iter().any(|u| u.starts_with("transformer")))
        .map(|s| s.device.name.clone())
        .collect();
    let p = FluxPipeline::from_pretrained(&case.path(""), &opts).unwrap();
    assert_eq!(
        p.transformer.devices().len(),
        planned_devices.len(),
        "{}",
        plan.table()
    );
    assert_eq!(
        p.vae.device(),
        opts.component_devices["vae"],
        "{}",
        plan.table()
    );
    drop(p);
    let mut report = Vec::new();
    flux_pipeline(&case, &opts, &mut report);
    eprintln!(
        "flux planned over {} devices: {}",
        plan.stages.len(),
        report.join(", ")
    );
}

/// Rewrites one field of a component's config.json.
fn set_field(root: &std::path::Path, component: &str, field: &str, value: serde_json::Value) {
    let path = root.join(component).join("config.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    v[field] = value;
    std::fs::write(&path, v.to_string()).unwrap();
}

#[test]
fn bad_flow_pipelines_and_calls_are_typed_errors() {
    let opts = LoadOptions::default();
    let err = |dir: &tempfile::TempDir| -> String {
        zoo_diffusers::pipelines::DiffusionPipeline::from_pretrained(
            &dir.path().to_string_lossy(),
            &opts,
        )
        .unwrap_err()
        .to_string()
    };
    // A Flux transformer whose in_channels disagree with the VAE's packed latents.
    let d = edited_copy("flux", |root| {
        set_field(root, "transformer", "in_channels", 32.into())
    });
    let e = err(&d);
    assert!(
        e.contains("latent channels") && e.contains("in_channels / 4"),
        "{e}"
    );
    // Flux without its T5.
    let d = edited_copy("flux", |root| {
        let path = root.join("model_index.json");
        let mut v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        v["text_encoder_2"] = serde_json::json!([null, null]);
        std::fs::write(&path, v.to_string()).unwrap();
    });
    let e = err(&d);
    assert!(e.contains("text_encoder_2") && e.contains("T5"), "{e}");
    // Rotary axes that do not cover a head, and an SD3 caption width that cannot join it.
    let d = edited_copy("flux", |root| {
        set_field(
            root,
            "transformer",
            "axes_dims_rope",
            serde_json::json!([2, 2, 2]),
        )
    });
    let e = err(&d);
    assert!(
        e.contains("axes_dims_rope") && e.contains("attention_head_dim"),
        "{e}"
    );
    let d = edited_copy("sd3", |root| {
        set_field(root, "transformer", "caption_projection_dim", 24.into())
    });
    let e = err(&d);
    assert!(e.contains("caption_projection_dim"), "{e}");

    // Calls: a size the VAE's factor times the patch size does not divide, skip layers past
    // the last block, a too-long T5 prompt; all before any step runs.
    let case = Case::open("flux");
    let flux = FluxPipeline::from_pretrained(&case.path(""), &opts).unwrap();
    let base = TextToImage {
        prompt: vec!["a photo".into()],
        num_inference_steps: 2,
        height: Some(34),
        width: Some(32),
        ..Default::default()
    };
    let e = flux
        .generate(&base, &mut Noise::seeded(0))
        .unwrap_err()
        .to_string();
    assert!(e.contains("32x34") && e.contains("multiples of 4"), "{e}");
    let long = TextToImage {
        height: Some(32),
        max_sequence_length: Some(513),
        ..base.clone()
    };
    let e = flux
        .generate(&long, &mut Noise::seeded(0))
        .unwrap_err()
        .to_string();
    assert!(e.contains("max_sequence_length"), "{e}");
    let case = Case::open("sd3");
    let sd3 = StableDiffusion3Pipeline::from_pretrained(&case.path(""), &opts).unwrap();
    let skip = TextToImage {
        height: Some(32),
        skip_guidance_layers: vec![2],
        ..base.clone()
    };
    let e = sd3
        .generate(&skip, &mut Noise::seeded(0))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("skip_guidance_layers") && e.contains("has 2"),
        "{e}"
    );
    let odd = TextToImage {
        height: Some(34),
        ..base
    };
    let e = sd3
        .generate(&odd, &mut Noise::seeded(0))
        .unwrap_err()
        .to_string();
    assert!(e.contains("multiples of 4"), "{e}");
}
