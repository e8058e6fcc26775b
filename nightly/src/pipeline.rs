//! Diffusion pipeline cases: a folder a diffusers generator (`nightly/reference/
//! pipelines.py`, `flow_pipelines.py`, `patch_pipelines.py`) saved with `save_pretrained`,
//! beside its `case.json` (`"pipeline"`: the class, the call it made, per-output
//! tolerances) and `expected.safetensors` (what diffusers computed, and the latents and
//! noise it drew). The harness runs each on zoo-diffusers and judges, per backend:
//!
//! - the denoiser's prediction for the recorded inputs (`unet.out`, `transformer.out`, SD3's
//!   `transformer.out_skip`), on the backend's first device;
//! - the VAE's decode and encode (`vae.decoded`, `vae.mean`, `vae.logvar`, and the tiled
//!   `vae.tiled.*` where recorded);
//! - the whole pipeline's image from diffusers' own latents or noise (`pipe.image`, and
//!   `img2img.image` where the case ran image-to-image), the denoiser split over every
//!   device of the backend (`pjrt-cpu-x4`: four).

use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::{Map, Value};
use zoo_diffusers::pipelines::stable_diffusion::TextToImage;
use zoo_diffusers::pipelines::{self, DiffusionPipeline, LoadOptions, Noise};
use zoo_diffusers::{
    AutoencoderKL, DiTTransformer2DModel, FluxTransformer2DModel, FluxTransformerInput,
    PixArtTransformer2DModel, PixArtTransformerInput, SD3Transformer2DModel, SD3TransformerInput,
    UNet2DConditionInput, UNet2DConditionModel, UNet2DModel,
};
use zoo_runtime::{DType, Device, Tensor};

use crate::case::{CaseError, OutputReport, CASE_JSON, EXPECTED_FILE};
use crate::metrics::{compare_close, Tolerance};
use crate::tensor::{read_safetensors, HostTensor, TensorSet};
use crate::CompareKind;

/// The outputs judged when the case recorded them.
pub const JUDGED: &[&str] = &[
    "unet.out",
    "transformer.out",
    "transformer.out_skip",
    "vae.decoded",
    "vae.mean",
    "vae.logvar",
    "vae.tiled.decoded",
    "vae.tiled.mean",
    "vae.tiled.logvar",
    "pipe.image",
    "img2img.image",
];

/// The parts of a pipeline case's `case.json` the harness reads.
#[derive(Debug, Clone, Deserialize)]
pub struct PipelineSpec {
    /// Case id.
    pub name: String,
    /// The diffusers pipeline class (`model_index.json`'s `_class_name`).
    pub pipeline: String,
    /// Max-abs tolerance per kind of output: `unet` or `transformer`, `vae`, `image`.
    pub tolerances: BTreeMap<String, f64>,
    /// Library name -> version of the reference run.
    pub library_versions: BTreeMap<String, String>,
    /// The generator's command line.
    pub command: String,
    /// The keyword arguments of diffusers' `__call__`; older cases keep them at the top
    /// level (`prompt`, `num_inference_steps`, `guidance_scale`, ...).
    #[serde(default)]
    pub call: Option<Map<String, Value>>,
    /// Everything else (the image-to-image call, notes, token ids).
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// A loaded pipeline case.
#[derive(Debug, Clone)]
pub struct PipelineCase {
    /// The case folder (the pipeline folder itself).
    pub dir: PathBuf,
    /// case.json.
    pub spec: PipelineSpec,
    /// expected.safetensors.
    pub expected: TensorSet,
}

/// True when `dir/case.json` describes a pipeline case (it names a `pipeline` class).
pub fn is_pipeline_case(dir: &Path) -> bool {
    std::fs::read_to_string(dir.join(CASE_JSON))
        .ok()
        .and_then(|text| serde_json::from_str::<Value>(&text).ok())
        .is_some_and(|v| v.get("pipeline").is_some_and(Value::is_string))
}

impl PipelineSpec {
    /// Reads `dir/case.json` only.
    pub fn read(dir: &Path) -> Result<Self, CaseError> {
        crate::case::read_case_json(dir)
    }
}

impl PipelineCase {
    /// Reads case.json and expected.safetensors.
    pub fn load(dir: &Path) -> Result<Self, CaseError> {
        let spec = PipelineSpec::read(dir)?;
        let expected = read_safetensors(&dir.join(EXPECTED_FILE))?;
        Ok(PipelineCase {
            dir: dir.to_path_buf(),
            spec,
            expected,
        })
    }

    fn has(&self, name: &str) -> bool {
        self.expected.contains_key(name)
    }

    fn path(&self, component: &str) -> String {
        self.dir.join(component).to_string_lossy().into_owned()
    }

    /// A recorded float tensor on `device`.
    fn tensor(&self, name: &str, device: &Device) -> Result<Tensor, String> {
        let t = self
            .expected
            .get(name)
            .ok_or_else(|| format!("expected.safetensors has no `{name}`"))?;
        let data = t
            .as_f32()
            .ok_or_else(|| format!("`{name}` holds integers, not floats"))?;
        Tensor::from_vec(data.to_vec(), &t.shape, device).map_err(|e| format!("{name}: {e}"))
    }

    /// The tolerance of an output kind, from case.json.
    pub fn tolerance(&self, kind: &str) -> Result<Tolerance, String> {
        let atol = *self.spec.tolerances.get(kind).ok_or_else(|| {
            format!(
                "{}: tolerances has no `{kind}`",
                self.dir.join(CASE_JSON).display()
            )
        })?;
        Ok(Tolerance { atol, rtol: 0.0 })
    }

    /// The tolerance kind that judges output `name`.
    fn kind_of(&self, name: &str) -> &'static str {
        match name.split('.').next() {
            Some("unet") => "unet",
            Some("transformer") => "transformer",
            Some("vae") => "vae",
            _ => "image",
        }
    }

    /// Compares a produced tensor with the recorded output `name` (max-abs, the case's
    /// tolerance for its kind).
    pub fn compare(&self, name: &str, actual: &HostTensor) -> Result<OutputReport, String> {
        let expected = &self.expected[name];
        let (Some(act), Some(exp)) = (actual.as_f32(), expected.as_f32()) else {
            return Err(format!("`{name}` must hold floats"));
        };
        let tol = self.tolerance(self.kind_of(name))?;
        let close = compare_close(act, exp, &expected.shape, None, tol)
            .map_err(|e| format!("`{name}`: {e}"))?;
        Ok(OutputReport {
            name: name.to_string(),
            compare: CompareKind::Allclose,
            passed: close.passed,
            close: Some(close),
            tokens: None,
        })
    }
}

/// Why a pipeline case could not produce its outputs.
pub(crate) type Failure = String;

fn host(t: &Tensor) -> Result<HostTensor, Failure> {
    let f = t
        .to_dtype(DType::F32)
        .and_then(|t| t.to_vec::<f32>())
        .map_err(|e| format!("reading an output back: {e}"))?;
    Ok(HostTensor::f32(t.shape().to_vec(), f))
}

fn failed<E: std::fmt::Display>(what: &'static str) -> impl Fn(E) -> Failure {
    move |e| format!("{what}: {e}")
}

/// Runs every recorded stage of the case on `devices` and returns the produced outputs.
pub(crate) fn run(
    case: &PipelineCase,
    devices: &[Device],
) -> Result<BTreeMap<String, HostTensor>, Failure> {
    let first = devices.first().copied().unwrap_or(Device::Cpu);
    let mut out = BTreeMap::new();
    denoiser(case, &first, &mut out)?;
    if case.dir.join("vae").is_dir() {
        vae(case, devices.last().unwrap_or(&first), &mut out)?;
    }
    let opts = LoadOptions::on_devices(devices);
    let pipe = DiffusionPipeline::from_pretrained(&case.dir.to_string_lossy(), &opts)
        .map_err(failed("loading the pipeline"))?;
    if pipe.class_name() != case.spec.pipeline {
        return Err(format!(
            "case.json names {} but model_index.json loads {}",
            case.spec.pipeline,
            pipe.class_name()
        ));
    }
    let (args, mut noise) = text_to_image(case, &first)?;
    let image = pipe
        .generate(&args, &mut noise)
        .map_err(failed("the pipeline"))?;
    out.insert("pipe.image".into(), host(&image.images)?);
    if let Some(i2i) = case.spec.extra.get("img2img").and_then(Value::as_object) {
        let args = image_to_image(case, i2i, args, &first)?;
        let noise: VecDeque<Tensor> = numbered(case, "img2img.noise", &first)?;
        let image = pipe
            .generate(&args, &mut Noise::Given(noise))
            .map_err(failed("image-to-image"))?;
        out.insert("img2img.image".into(), host(&image.images)?);
    }
    Ok(out)
}

/// `prefix.0`, `prefix.1`, ... as recorded.
fn numbered(
    case: &PipelineCase,
    prefix: &str,
    device: &Device,
) -> Result<VecDeque<Tensor>, Failure> {
    (0..)
        .map(|i| format!("{prefix}.{i}"))
        .take_while(|n| case.has(n))
        .map(|n| case.tensor(&n, device))
        .collect()
}

/// The denoiser alone, on the recorded inputs.
fn denoiser(
    case: &PipelineCase,
    device: &Device,
    out: &mut BTreeMap<String, HostTensor>,
) -> Result<(), Failure> {
    let t = |n: &str| case.tensor(n, device);
    let opt = |n: &str| case.has(n).then(|| t(n)).transpose();
    let load = failed("loading the denoiser");
    let forward = failed("the denoiser");
    match case.spec.pipeline.as_str() {
        "StableDiffusionPipeline" | "StableDiffusionXLPipeline" => {
            let unet =
                UNet2DConditionModel::from_pretrained(&case.path("unet"), DType::F32, device)
                    .map_err(load)?;
            let (text, ids) = (opt("unet.text_embeds")?, opt("unet.time_ids")?);
            let y = unet
                .forward(UNet2DConditionInput {
                    sample: &t("unet.sample")?,
                    timestep: &t("unet.timestep")?,
                    encoder_hidden_states: &t("unet.encoder_hidden_states")?,
                    class_labels: None,
                    timestep_cond: None,
                    text_embeds: text.as_ref(),
                    time_ids: ids.as_ref(),
                })
                .map_err(forward)?;
            out.insert("unet.out".into(), host(&y)?);
        }
        "DDPMPipeline" => {
            let unet = UNet2DModel::from_pretrained(&case.path("unet"), DType::F32, device)
                .map_err(load)?;
            let y = unet
                .forward(&t("unet.sample")?, &t("unet.timestep")?, None)
                .map_err(forward)?;
            out.insert("unet.out".into(), host(&y)?);
        }
        "StableDiffusion3Pipeline" => {
            let model = SD3Transformer2DModel::from_pretrained(
                &case.path("transformer"),
                DType::F32,
                device,
            )
            .map_err(load)?;
            let (x, text, pooled, step) = (
                t("transformer.hidden_states")?,
                t("transformer.encoder_hidden_states")?,
                t("transformer.pooled_projections")?,
                t("transformer.timestep")?,
            );
            let run = |skip_layers: &[usize]| {
                model
                    .forward(SD3TransformerInput {
                        hidden_states: &x,
                        encoder_hidden_states: &text,
                        pooled_projections: &pooled,
                        timestep: &step,
                        skip_layers,
                    })
                    .map_err(&forward)
            };
            out.insert("transformer.out".into(), host(&run(&[])?)?);
            if case.has("transformer.out_skip") {
                // The generator skips block 1 (its notes say so).
                out.insert("transformer.out_skip".into(), host(&run(&[1])?)?);
            }
        }
        "FluxPipeline" => {
            let model = FluxTransformer2DModel::from_pretrained(
                &case.path("transformer"),
                DType::F32,
                device,
            )
            .map_err(load)?;
            let guidance = opt("transformer.guidance")?;
            let y = model
                .forward(FluxTransformerInput {
                    hidden_states: &t("transformer.hidden_states")?,
                    encoder_hidden_states: &t("transformer.encoder_hidden_states")?,
                    pooled_projections: &t("transformer.pooled_projections")?,
                    timestep: &t("transformer.timestep")?,
                    img_ids: &t("transformer.img_ids")?,
                    txt_ids: &t("transformer.txt_ids")?,
                    guidance: guidance.as_ref(),
                })
                .map_err(forward)?;
            out.insert("transformer.out".into(), host(&y)?);
        }
        "DiTPipeline" => {
            let model = DiTTransformer2DModel::from_pretrained(
                &case.path("transformer"),
                DType::F32,
                device,
            )
            .map_err(load)?;
            let y = model
                .forward(
                    &t("transformer.hidden_states")?,
                    &t("transformer.timestep")?,
                    &t("transformer.class_labels")?,
                )
                .map_err(forward)?;
            out.insert("transformer.out".into(), host(&y)?);
        }
        "PixArtAlphaPipeline" | "PixArtSigmaPipeline" => {
            let model = PixArtTransformer2DModel::from_pretrained(
                &case.path("transformer"),
                DType::F32,
                device,
            )
            .map_err(load)?;
            let size = match (
                opt("transformer.resolution")?,
                opt("transformer.aspect_ratio")?,
            ) {
                (Some(r), Some(a)) => Some((r, a)),
                _ => None,
            };
            let y = model
                .forward(PixArtTransformerInput {
                    hidden_states: &t("transformer.hidden_states")?,
                    encoder_hidden_states: &t("transformer.encoder_hidden_states")?,
                    encoder_attention_mask: opt("transformer.encoder_attention_mask")?.as_ref(),
                    timestep: &t("transformer.timestep")?,
                    added_cond: size.as_ref().map(|(r, a)| (r, a)),
                })
                .map_err(forward)?;
            out.insert("transformer.out".into(), host(&y)?);
        }
        other => {
            return Err(format!(
                "the harness has no denoiser runner for {other}; zoo runs {}",
                pipelines::PIPELINES.join(", ")
            ))
        }
    }
    Ok(())
}

/// VAE decode and encode on the recorded latents and image, tiled too where recorded.
fn vae(
    case: &PipelineCase,
    device: &Device,
    out: &mut BTreeMap<String, HostTensor>,
) -> Result<(), Failure> {
    let mut vae = AutoencoderKL::from_pretrained(&case.path("vae"), DType::F32, device)
        .map_err(failed("loading the VAE"))?;
    for (prefix, tiling) in [("vae", false), ("vae.tiled", true)] {
        vae.tiling = tiling;
        let name = |what: &str| format!("{prefix}.{what}");
        if case.has(&name("latents")) {
            let y = vae
                .decode(&case.tensor(&name("latents"), device)?)
                .map_err(failed("VAE decode"))?;
            out.insert(name("decoded"), host(&y)?);
        }
        if case.has(&name("image")) && case.has(&name("mean")) {
            let dist = vae
                .encode(&case.tensor(&name("image"), device)?)
                .map_err(failed("VAE encode"))?;
            out.insert(name("mean"), host(&dist.mean)?);
            out.insert(name("logvar"), host(&dist.logvar)?);
        }
    }
    Ok(())
}

/// The keyword arguments of the case's call: `call`, or the older cases' top-level fields.
fn call_kwargs(spec: &PipelineSpec) -> Map<String, Value> {
    if let Some(call) = &spec.call {
        return call.clone();
    }
    const TOP_LEVEL: [&str; 7] = [
        "prompt",
        "negative_prompt",
        "num_inference_steps",
        "guidance_scale",
        "guidance_rescale",
        "height",
        "width",
    ];
    TOP_LEVEL
        .iter()
        .filter_map(|k| spec.extra.get(*k).map(|v| (k.to_string(), v.clone())))
        .collect()
}

/// The text-to-image arguments and noise source of the case's call, as diffusers received
/// them (latents given where it drew them, DDPM's per-step noise as recorded).
fn text_to_image(case: &PipelineCase, device: &Device) -> Result<(TextToImage, Noise), Failure> {
    let spec = &case.spec;
    let kw = call_kwargs(spec);
    let bad = |k: &str, want: &str| format!("case.json: call.{k} must be {want}");
    let num = |k: &str| -> Result<Option<f64>, Failure> {
        kw.get(k)
            .map(|v| v.as_f64().ok_or_else(|| bad(k, "a number")))
            .transpose()
    };
    let count = |k: &str| -> Result<Option<usize>, Failure> {
        kw.get(k)
            .map(|v| {
                v.as_u64()
                    .map(|n| n as usize)
                    .ok_or_else(|| bad(k, "a count"))
            })
            .transpose()
    };
    let texts = |k: &str| -> Result<Option<Vec<String>>, Failure> {
        match kw.get(k) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(vec![s.clone()])),
            Some(Value::Array(a)) => a
                .iter()
                .map(|v| match v {
                    Value::String(s) => Ok(s.clone()),
                    // DiT's class ids, read by the pipeline as labels.
                    Value::Number(n) => Ok(n.to_string()),
                    _ => Err(bad(k, "a string or a list of strings")),
                })
                .collect::<Result<_, _>>()
                .map(Some),
            Some(_) => Err(bad(k, "a string or a list of strings")),
        }
    };
    for key in kw.keys() {
        const KNOWN: &[&str] = &[
            "prompt",
            "negative_prompt",
            "class_labels",
            "num_inference_steps",
            "guidance_scale",
            "guidance_rescale",
            "height",
            "width",
            "num_images_per_prompt",
            "eta",
            "latents",
            "output_type",
            "max_sequence_length",
            "true_cfg_scale",
            "skip_guidance_layers",
            "skip_layer_guidance_scale",
            "skip_layer_guidance_start",
            "skip_layer_guidance_stop",
            "use_resolution_binning",
            "clean_caption",
        ];
        if !KNOWN.contains(&key.as_str()) {
            return Err(format!(
                "case.json: call.{key} is a diffusers argument the harness does not pass on; it passes {}",
                KNOWN.join(", ")
            ));
        }
    }
    if kw.get("output_type").is_some_and(|v| v != "np") {
        return Err(bad("output_type", "\"np\" (images in [0, 1])"));
    }
    if kw.get("clean_caption") == Some(&Value::Bool(true)) {
        return Err("case.json: call.clean_caption is true; zoo does not run PixArt's caption cleaning (bs4 + ftfy): record the case with clean_caption=False".into());
    }
    let pixart = spec.pipeline.starts_with("PixArt");
    let prompt = match texts("class_labels")? {
        Some(labels) => labels,
        None => texts("prompt")?.unwrap_or_default(),
    };
    let args = TextToImage {
        prompt,
        negative_prompt: texts("negative_prompt")?,
        num_inference_steps: count("num_inference_steps")?
            .ok_or_else(|| bad("num_inference_steps", "given"))?,
        guidance_scale: num("guidance_scale")?.unwrap_or(
            zoo_diffusers::pipelines::default_guidance_scale(&spec.pipeline),
        ),
        guidance_rescale: num("guidance_rescale")?.unwrap_or(0.0),
        height: count("height")?,
        width: count("width")?,
        num_images_per_prompt: count("num_images_per_prompt")?.unwrap_or(1),
        eta: num("eta")?.unwrap_or(0.0) as f32,
        max_sequence_length: count("max_sequence_length")?,
        true_cfg_scale: num("true_cfg_scale")?.unwrap_or(1.0),
        skip_guidance_layers: match kw.get("skip_guidance_layers") {
            None | Some(Value::Null) => Vec::new(),
            Some(v) => v
                .as_array()
                .and_then(|a| a.iter().map(|n| n.as_u64().map(|n| n as usize)).collect())
                .ok_or_else(|| bad("skip_guidance_layers", "a list of block indices"))?,
        },
        skip_layer_guidance_scale: num("skip_layer_guidance_scale")?.unwrap_or(2.8),
        skip_layer_guidance_start: num("skip_layer_guidance_start")?.unwrap_or(0.01),
        skip_layer_guidance_stop: num("skip_layer_guidance_stop")?.unwrap_or(0.2),
        resolution_binning: match kw.get("use_resolution_binning") {
            None => pixart,
            Some(v) => v
                .as_bool()
                .ok_or_else(|| bad("use_resolution_binning", "true or false"))?,
        },
        latents: case
            .has("pipe.latents")
            .then(|| case.tensor("pipe.latents", device))
            .transpose()?,
        ..TextToImage::default()
    };
    let noise = numbered(case, "pipe.noise", device)?;
    Ok((args, Noise::Given(noise)))
}

/// The image-to-image call of an `img2img` record: the text call's prompts with its own
/// steps, guidance and strength, from the recorded init image.
fn image_to_image(
    case: &PipelineCase,
    i2i: &Map<String, Value>,
    text: TextToImage,
    device: &Device,
) -> Result<TextToImage, Failure> {
    let get = |k: &str| {
        i2i.get(k)
            .and_then(Value::as_f64)
            .ok_or_else(|| format!("case.json: img2img.{k} must be a number"))
    };
    Ok(TextToImage {
        num_inference_steps: get("num_inference_steps")? as usize,
        guidance_scale: get("guidance_scale")?,
        strength: get("strength")?,
        init_image: Some(case.tensor("img2img.init_image", device)?),
        latents: None,
        height: None,
        width: None,
        ..text
    })
}
