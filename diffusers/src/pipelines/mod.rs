//! Pipelines, mirroring diffusers' `pipelines/`: one file per pipeline class,
//! `stable_diffusion.rs` (`StableDiffusionPipeline`, img2img, and the XL prompt encoding of
//! `stable_diffusion_xl.rs`), `stable_diffusion_3.rs` (`StableDiffusion3Pipeline`), `flux.rs`
//! (`FluxPipeline`), `dit.rs` (`DiTPipeline`), `pixart.rs` (`PixArtAlphaPipeline`,
//! `PixArtSigmaPipeline`), `ddpm.rs` (`DDPMPipeline`), built on leaf modules that every
//! pipeline imports and none of which imports a pipeline: `text_encoders.rs` (CLIP and T5
//! tokenizer + encoder pairs), `latents.rs` (first latents, the VAE and the decode to
//! images), `text_to_image.rs` (a call's arguments, its checks, guidance and the
//! flow-matching shift). `auto.rs` dispatches on `model_index.json`'s `_class_name` as
//! diffusers' `DiffusionPipeline.from_pretrained` does; `plan.rs` plans a pipeline's
//! components over devices; `placement.rs` resolves a device map to those devices. This file
//! holds what loading and running any pipeline shares: the load options, the component
//! files, the noise source, the output and the scheduler step.
//!
//! Initial noise (and every noise a scheduler step adds) comes from zoo's seeded generator
//! on the host, so a seed gives the same image on every backend; latents can be passed in
//! instead, which is how an image is reproduced from diffusers' own noise.

/// The scheduler methods of a pipeline that keeps its scheduler as a config (and builds a
/// fresh scheduler per call), as diffusers' `DiffusionPipeline` gives each pipeline its
/// `scheduler` component: the config, and a swap of the class over the same config
/// (`Scheduler.from_config`). Used inside each pipeline's `impl`.
macro_rules! scheduler_methods {
    () => {
        /// The scheduler's config (the pipeline builds a fresh scheduler per call).
        pub fn scheduler_config(&self) -> &$crate::schedulers::SchedulerConfig {
            &self.scheduler_config
        }

        /// Swaps the scheduler class over the same config (`Scheduler.from_config`).
        pub fn set_scheduler(&mut self, class_name: &str) -> $crate::Result<()> {
            let c = self.scheduler_config.with_class(class_name);
            c.build()?;
            self.scheduler_config = c;
            Ok(())
        }
    };
}
pub(crate) use scheduler_methods;

mod auto;
pub mod ddpm;
pub mod dit;
pub mod flux;
pub(crate) mod latents;
pub mod pixart;
pub mod placement;
pub mod plan;
pub mod stable_diffusion;
pub mod stable_diffusion_3;
pub mod stable_diffusion_xl;
pub(crate) mod text_encoders;
pub mod text_to_image;

use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};

use zoo_hub::{ModelIndex, Pretrained};
use zoo_runtime::device_map::{group_device, tp_groups, DeviceMap};
use zoo_runtime::nn::{DevicePlacement, Weights};
use zoo_runtime::{DType, Device, Generator, PjrtDevice, PjrtPlatform, Tensor};

pub use auto::{components, default_guidance_scale, DiffusionPipeline, PIPELINES};
pub use ddpm::DDPMPipeline;
pub use dit::DiTPipeline;
pub use flux::FluxPipeline;
pub use pixart::{PixArtPipeline, PixArtVersion};
pub use stable_diffusion::StableDiffusionPipeline;
pub use stable_diffusion_3::StableDiffusion3Pipeline;
pub use text_to_image::TextToImage;

use crate::models::loading::{component_weights, transformer_placement, unet_placement};
use crate::{Error, Result, SchedulerConfig};

/// How a pipeline is loaded.
#[derive(Clone, Debug)]
pub struct LoadOptions {
    /// Where every component runs (the text encoders always).
    pub device: Device,
    /// Devices the denoiser's blocks (a UNet's or a diffusion transformer's) are split over,
    /// in balanced stages by weight (the VAE then runs on the last); empty or one device: it
    /// runs on `device`.
    pub unet_devices: Vec<Device>,
    /// Where the T5 text encoder runs (SD3, Flux), when not on `device`: a large T5 can
    /// sit on its own device.
    pub text_encoder_device: Option<Device>,
    /// A component's own device by its `model_index.json` name (`text_encoder_2`, `vae`),
    /// as a planned device map places them; over `device`, `text_encoder_device` and the
    /// VAE's default (the denoiser's last device).
    pub component_devices: BTreeMap<String, Device>,
    /// The denoiser's blocks as a planned device map places them (module prefixes such as
    /// `down_blocks.1`, `transformer_blocks.3`), over the balanced split of
    /// `unet_devices`; its stem runs on the first of `unet_devices`.
    pub denoiser_placement: Option<DevicePlacement>,
    /// Dtype of weights and activations; `None` keeps float32 (diffusers' default).
    pub dtype: Option<DType>,
    /// A weights variant (`"fp16"`: `diffusion_pytorch_model.fp16.safetensors`).
    pub variant: Option<String>,
    /// Another scheduler class over the same config (`Scheduler.from_config`).
    pub scheduler: Option<String>,
    /// Progress bars while loading.
    pub progress: bool,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            device: Device::Cpu,
            unet_devices: Vec::new(),
            text_encoder_device: None,
            component_devices: BTreeMap::new(),
            denoiser_placement: None,
            dtype: None,
            variant: None,
            scheduler: None,
            progress: false,
        }
    }
}

impl LoadOptions {
    /// The VAE's device: planned, else the denoiser's last (where its latents end).
    pub(crate) fn vae_device(&self) -> Device {
        self.component_devices
            .get("vae")
            .copied()
            .unwrap_or_else(|| self.unet_devices.last().copied().unwrap_or(self.device))
    }

    /// The device of text encoder `component`: for a T5, `text_encoder_device` when set;
    /// else its planned device, else `device`.
    pub(crate) fn text_encoder(&self, component: &str, t5: bool) -> Device {
        match self.text_encoder_device {
            Some(d) if t5 => d,
            _ => self
                .component_devices
                .get(component)
                .copied()
                .unwrap_or(self.device),
        }
    }

    /// Options that run a pipeline on `devices`: every component on the first, the denoiser
    /// split over all of them when there are several (the VAE then on the last), as
    /// [`devices_of`] lists them for a device map.
    pub fn on_devices(devices: &[Device]) -> LoadOptions {
        LoadOptions {
            device: devices.first().copied().unwrap_or(Device::Cpu),
            unet_devices: if devices.len() > 1 {
                devices.to_vec()
            } else {
                Vec::new()
            },
            ..LoadOptions::default()
        }
    }
}

/// The devices a device map names for a pipeline: one, or the several its denoiser is
/// split over (`pjrt:cpu:0,1`, `tpu`: every chip). Planner strategies (`auto`, `balanced`,
/// an explicit module map) place transformer layers, not pipeline components, and are
/// refused with what to pass instead.
pub fn devices_of(map: &DeviceMap) -> Result<Vec<Device>> {
    let pjrt = |platform: PjrtPlatform, listed: Option<&[usize]>| -> Result<Vec<Device>> {
        let n = zoo_runtime::lazy::device_count(platform)?;
        let ordinals: Vec<usize> = match listed {
            None | Some([]) => (0..n).collect(),
            Some(l) => l.to_vec(),
        };
        if let Some(bad) = ordinals.iter().find(|&&o| o >= n) {
            return Err(Error::Input(format!(
                "device map {map}: device {bad} does not exist (the {} plugin has {n})",
                zoo_runtime::device_map::platform_name(platform)
            )));
        }
        Ok(ordinals
            .into_iter()
            .map(|ordinal| Device::Pjrt(PjrtDevice::new(platform, ordinal)))
            .collect())
    };
    let platform_of = |platform: &str| match platform {
        "cpu" => Ok(PjrtPlatform::Cpu),
        "cuda" | "gpu" => Ok(PjrtPlatform::Cuda),
        "tpu" => Ok(PjrtPlatform::Tpu),
        other => Err(Error::Input(format!(
            "device map pjrt:{other}: use pjrt:cpu, pjrt:cuda or pjrt:tpu"
        ))),
    };
    match map {
        DeviceMap::Cpu => Ok(vec![Device::Cpu]),
        DeviceMap::Cuda(i) => Ok(vec![Device::Cuda(*i)]),
        DeviceMap::Tpu => pjrt(PjrtPlatform::Tpu, None),
        DeviceMap::Pjrt { platform, devices } => pjrt(platform_of(platform)?, devices.as_deref()),
        // Meshes of `tp` devices (all of them in one by default): every component on the
        // first, the denoiser in stages over them, each split by its plan.
        DeviceMap::TensorParallel {
            platform,
            devices,
            tp,
        } => {
            let platform = platform_of(platform)?;
            let ordinals: Vec<usize> = pjrt(platform, devices.as_deref())?
                .iter()
                .filter_map(|d| match d {
                    Device::Pjrt(p) => Some(p.ordinal),
                    _ => None,
                })
                .collect();
            let bad = |e: zoo_runtime::device_map::DeviceMapError| {
                Error::Input(format!("device map {map}: {e}"))
            };
            tp_groups(&ordinals, *tp)
                .map_err(bad)?
                .iter()
                .map(|g| Ok(Device::Pjrt(group_device(platform, g).map_err(bad)?)))
                .collect()
        }
        other => Err(Error::Input(format!(
            "device map {other}: pipelines take cpu, cuda:N, tpu, pjrt:PLATFORM[:N,...] or tp[N]:pjrt:PLATFORM[:N,...]"
        ))),
    }
}

/// Where a draw of Gaussian noise comes from (diffusers' `randn_tensor`).
#[derive(Clone, Debug)]
pub enum Noise {
    /// zoo's seeded host generator: the same numbers on every backend.
    Seeded(Generator),
    /// Tensors given in advance, used in order (e.g. diffusers' own draws, for parity).
    Given(VecDeque<Tensor>),
}

impl Noise {
    /// A seeded stream.
    pub fn seeded(seed: u64) -> Noise {
        Noise::Seeded(Generator::new(seed))
    }

    /// The next standard normal tensor of `shape` (float32, on `device`).
    pub fn randn(&mut self, shape: &[usize], device: &Device) -> Result<Tensor> {
        match self {
            Noise::Seeded(g) => Ok(g.randn(shape, DType::F32, device)?),
            Noise::Given(q) => {
                let t = q.pop_front().ok_or_else(|| {
                    Error::Input(format!(
                        "the given noise ran out (a draw of {shape:?} was asked for)"
                    ))
                })?;
                if t.shape() != shape {
                    return Err(Error::Shape(format!(
                        "a given noise tensor is {:?} where {shape:?} was drawn",
                        t.shape()
                    )));
                }
                Ok(t.to_device(device)?)
            }
        }
    }
}

/// What a pipeline call produced.
#[derive(Debug)]
pub struct Generated {
    /// `[N, H, W, 3]` float32 in `[0, 1]` on the host (diffusers' `output_type="np"`).
    pub images: Tensor,
    /// Denoising steps run.
    pub steps: usize,
    /// Wall time of the denoising loop.
    pub denoise_seconds: f64,
    /// Wall time of the text encoding.
    pub encode_seconds: f64,
    /// Wall time of the VAE decode.
    pub decode_seconds: f64,
}

impl Generated {
    /// Seconds per denoising step.
    pub fn seconds_per_step(&self) -> f64 {
        self.denoise_seconds / self.steps.max(1) as f64
    }

    /// Image `i` as 8-bit RGB, rounded as diffusers' `numpy_to_pil` rounds.
    pub fn rgb8(&self, i: usize) -> Result<image::RgbImage> {
        let [n, h, w, 3] = self.images.shape()[..] else {
            return Err(Error::Shape(format!(
                "images are {:?}, not [N, H, W, 3]",
                self.images.shape()
            )));
        };
        if i >= n {
            return Err(Error::Input(format!("image {i} of {n}")));
        }
        let px: Vec<f32> = self.images.narrow(0, i, 1)?.to_vec::<f32>()?;
        let bytes = px
            .iter()
            .map(|&v| (v * 255.0).round().clamp(0.0, 255.0) as u8)
            .collect();
        image::RgbImage::from_raw(w as u32, h as u32, bytes)
            .ok_or_else(|| Error::Shape("image buffer size mismatch".into()))
    }

    /// Writes every image as PNG: `path` for one image, `stem-N.png` beside it for several.
    /// Each file is written to a temporary name, synced and renamed
    /// ([`zoo_hub::write_atomically`]); when one fails, those already written by this call
    /// are removed, so a failure leaves no image behind. Returns the paths written.
    pub fn save_png(&self, path: &Path) -> Result<Vec<PathBuf>> {
        let n = self.images.shape()[0];
        let paths: Vec<PathBuf> = if n == 1 {
            vec![path.to_path_buf()]
        } else {
            let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("image");
            (0..n)
                .map(|i| path.with_file_name(format!("{stem}-{i}.png")))
                .collect()
        };
        // Encode everything first: nothing is written unless every image converts.
        let images = (0..n).map(|i| self.rgb8(i)).collect::<Result<Vec<_>>>()?;
        for (i, (img, p)) in images.iter().zip(&paths).enumerate() {
            let mut png = Vec::new();
            let written = img
                .write_to(&mut std::io::Cursor::new(&mut png), image::ImageFormat::Png)
                .map_err(|e| Error::Output {
                    path: p.clone(),
                    reason: format!("cannot encode the PNG: {e}"),
                })
                .and_then(|()| {
                    zoo_hub::write_atomically(p, &png).map_err(|e| Error::Output {
                        path: e.path,
                        reason: e.reason,
                    })
                });
            if let Err(e) = written {
                for done in &paths[..i] {
                    let _ = std::fs::remove_file(done);
                }
                return Err(e);
            }
        }
        Ok(paths)
    }
}

/// A pipeline folder (or Hub repo) and its `model_index.json`.
pub(crate) struct PipelineFiles {
    pub pretrained: Pretrained,
    pub index: ModelIndex,
}

impl PipelineFiles {
    pub(crate) fn open(repo_or_path: &str, variant: Option<&str>) -> Result<PipelineFiles> {
        let pretrained = Pretrained::open(repo_or_path)?.with_variant(variant)?;
        let index = pretrained.model_index()?.ok_or_else(|| Error::Config {
            path: PathBuf::from(repo_or_path).join("model_index.json"),
            reason: "no model_index.json: this is not a diffusers pipeline folder".into(),
        })?;
        Ok(PipelineFiles { pretrained, index })
    }

    /// The component `name` of the index, checking its class is one of `classes`.
    pub(crate) fn component(&self, name: &str, classes: &[&str]) -> Result<Pretrained> {
        let Some((_, class)) = self.index.components.get(name) else {
            return Err(Error::Config {
                path: self.index.path.clone(),
                reason: format!(
                    "{} needs a `{name}` component, which model_index.json does not list",
                    self.index.class_name
                ),
            });
        };
        if !classes.contains(&class.as_str()) {
            return Err(Error::Config {
                path: self.index.path.clone(),
                reason: format!(
                    "`{name}` is a {class}; zoo runs {} there",
                    classes.join(" / ")
                ),
            });
        }
        Ok(self.pretrained.component(name)?)
    }

    /// The path of `rel` inside the pipeline (downloaded when a Hub repo), or a typed error
    /// naming the missing component folder.
    pub(crate) fn file(&self, component: &str, rel: &str) -> Result<PathBuf> {
        let full = format!("{component}/{rel}");
        self.pretrained
            .files()
            .get_optional(&full)?
            .ok_or_else(|| Error::Config {
                path: self.index.path.with_file_name(&full),
                reason: format!(
                    "the `{component}` component has no {rel}: the pipeline folder is incomplete; download it again"
                ),
            })
    }

    /// The folder of a component, for loaders that take a path (the text encoders).
    pub(crate) fn dir(&self, component: &str) -> Result<PathBuf> {
        let config = self.file(component, "config.json")?;
        Ok(config.parent().map(Path::to_path_buf).unwrap_or_default())
    }

    pub(crate) fn scheduler(&self, class: Option<&str>) -> Result<SchedulerConfig> {
        let path = self.file("scheduler", "scheduler_config.json")?;
        let c = SchedulerConfig::from_file(&path)?;
        Ok(match class {
            Some(name) => c.with_class(name),
            None => c,
        })
    }
}

/// A diffusion transformer's weights on the first of `opts.unet_devices` (else
/// `opts.device`), its blocks placed over all of them when there are several; and that
/// first device, where the denoising loop keeps its latents.
pub(crate) fn transformer_weights(
    component: &Pretrained,
    dtype: DType,
    opts: &LoadOptions,
) -> Result<(Weights, Device)> {
    denoiser_weights(component, dtype, opts, transformer_placement)
}

/// A UNet's weights, placed as [`transformer_weights`] places a transformer's.
pub(crate) fn unet_weights(
    component: &Pretrained,
    dtype: DType,
    opts: &LoadOptions,
) -> Result<(Weights, Device)> {
    denoiser_weights(component, dtype, opts, unet_placement)
}

/// The denoiser's weights on the first of `opts.unet_devices`, its blocks where
/// `opts.denoiser_placement` puts them, else in `balanced` stages over every device.
fn denoiser_weights(
    component: &Pretrained,
    dtype: DType,
    opts: &LoadOptions,
    balanced: fn(&Pretrained, &[Device], DType) -> Result<DevicePlacement>,
) -> Result<(Weights, Device)> {
    let first = opts.unet_devices.first().copied().unwrap_or(opts.device);
    let w = component_weights(component, dtype, &first)?;
    if opts.unet_devices.len() < 2 {
        return Ok((w, first));
    }
    let placement = match &opts.denoiser_placement {
        Some(p) => p.clone(),
        None => balanced(component, &opts.unet_devices, dtype)?,
    };
    Ok((w.with_placement(placement), first))
}

/// The pipeline's dtype: float16/bfloat16/float32 only.
pub(crate) fn pipeline_dtype(opts: &LoadOptions) -> Result<DType> {
    match opts.dtype.unwrap_or(DType::F32) {
        d @ (DType::F32 | DType::F16 | DType::BF16) => Ok(d),
        other => Err(Error::Input(format!(
            "dtype {other:?}: pipelines run in f32, f16 or bf16"
        ))),
    }
}

/// A progress bar over the denoising steps (hidden when `show` is false).
pub(crate) fn step_bar(steps: usize, show: bool) -> indicatif::ProgressBar {
    if !show {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(steps as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "denoising {bar:30} {pos}/{len} steps {elapsed} ({per_sec})",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    bar
}

/// An image file (PNG or JPEG) as img2img's `init_image`: `[1, 3, H, W]` float32 in
/// `[0, 1]` (RGB, as `load_image` converts it); at most Pillow's `MAX_IMAGE_PIXELS`.
pub fn load_image(path: &Path) -> Result<Tensor> {
    load_image_limited(
        path,
        Some(zoo_transformers::image_processing::MAX_IMAGE_PIXELS),
    )
}

/// [`load_image`] with another pixel limit (`None`: none, for trusted files).
pub fn load_image_limited(path: &Path, max_pixels: Option<u64>) -> Result<Tensor> {
    let img = zoo_transformers::vision::open_images_limited(&[path], max_pixels)
        .map_err(Box::new)?
        .remove(0);
    let (w, h) = (img.width, img.height);
    let mut chw = vec![0f32; 3 * h * w];
    for (i, px) in img.pixels.chunks(3).enumerate() {
        for c in 0..3 {
            chw[c * h * w + i] = px[c] as f32 / 255.0;
        }
    }
    Ok(Tensor::from_vec(chw, &[1, 3, h, w], &Device::Cpu)?)
}

/// One scheduler step from the model's prediction, with the noise the step draws (if any).
/// On PJRT each step is one compiled program, the same from step to step (the timestep and
/// the coefficients are inputs), handed to the device without waiting: the host records the
/// next step while this one runs, and waits only for the step before (`sample`), so one step
/// at most is queued and the progress bar counts finished steps.
pub(crate) fn scheduler_step(
    scheduler: &mut dyn crate::Scheduler,
    pred: &Tensor,
    step: usize,
    sample: &Tensor,
    noise: &mut Noise,
) -> Result<Tensor> {
    let drawn = if scheduler.needs_noise(step) {
        Some(noise.randn(sample.shape(), &sample.device())?)
    } else {
        None
    };
    let next = scheduler.step(pred, step, sample, drawn.as_ref())?;
    next.dispatch()?;
    sample.block_until_ready()?;
    Ok(next)
}
