//! `zoo image`: text-to-image (and unconditional DDPM) generation from a diffusers pipeline
//! folder or repo, written as PNG.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use zoo_diffusers::pipelines::placement::PlanShape;
use zoo_diffusers::pipelines::stable_diffusion::TextToImage;
use zoo_diffusers::pipelines::{self, DiffusionPipeline, LoadOptions, Noise};
use zoo_runtime::device_map::{parse_max_memory, DeviceMap};
use zoo_runtime::{DType, Device, Tensor};

/// Generate images with a diffusers pipeline and write them as PNG.
///
/// The pipeline class comes from the folder's model_index.json: StableDiffusionPipeline
/// (SD 1.x / 2.x), StableDiffusionXLPipeline (two text encoders, size conditioning),
/// StableDiffusion3Pipeline (SD 3 / 3.5: two CLIP encoders and T5, an MMDiT, flow matching),
/// FluxPipeline (CLIP and T5, double- and single-stream blocks, packed latents),
/// DiTPipeline (class-conditional: the prompt is an ImageNet label of the pipeline's
/// id2label, e.g. "golden retriever", or a class id), PixArtAlphaPipeline /
/// PixArtSigmaPipeline (T5, adaLN-single DiT; sizes binned to the model's aspect-ratio table
/// and resized back unless --no-resolution-binning) or DDPMPipeline (unconditional; the
/// prompt is ignored). Each component is built from its own
/// config.json; the scheduler from scheduler/scheduler_config.json, or another class over the
/// same config with --scheduler (as diffusers' `Scheduler.from_config`).
///
/// The initial noise comes from zoo's seeded generator on the host, so --seed gives the same
/// image on every backend. --latents takes it from a safetensors file instead (tensor
/// `latents`, shaped as diffusers' `latents=` argument: [images, 4, height/8, width/8] for
/// Stable Diffusion, packed [images, tokens, 4 * channels] for Flux), which reproduces an
/// image from diffusers' own noise exactly.
///
/// Examples:
///   zoo image ./stable-diffusion-v1-5 "a photo of an astronaut riding a horse" --out astronaut.png
///   zoo image ./sdxl "a lighthouse at dawn" --negative "blurry" --steps 30 --guidance 5 \
///       --size 1024x1024 --seed 7 --out lighthouse.png
///   zoo image ./sd15 "a red fox" --scheduler DPMSolverMultistepScheduler --steps 20 --out fox.png
///   zoo image ./sd15 "a red fox" --latents noise.safetensors --device-map pjrt:cpu --out fox.png
///   zoo image ./sd15 "a watercolor painting" --init-image photo.png --strength 0.6 --out paint.png
///   zoo image ./stable-diffusion-3.5-medium "a cat holding a sign" --skip-guidance-layers 7,8,9 \
///       --max-sequence-length 256 --out cat.png
///   zoo image ./FLUX.1-dev "a misty forest" --guidance 3.5 --dtype bf16 --size 1024x768 --out forest.png
///   zoo image ./FLUX.1-schnell "a robot" --steps 4 --guidance 0 --device-map pjrt:cpu --out robot.png
///   zoo image ./DiT-XL-2-256 "golden retriever" --steps 25 --guidance 4 --out dog.png
///   zoo image ./PixArt-Sigma-XL-2-512-MS "a small cactus with a happy face" --size 768x512 \
///       --out cactus.png
///   zoo image ./ddpm-cifar10 "" --steps 1000 --num-images 4 --out samples.png
#[derive(clap::Args)]
#[command(verbatim_doc_comment)]
pub struct Args {
    /// Pipeline folder (model_index.json + component folders) or Hub repo id.
    model: String,
    /// The prompt.
    prompt: String,
    /// The negative prompt (guidance steers away from it).
    #[arg(long)]
    negative: Option<String>,
    /// Denoising steps (default: 50; SD3 and Flux 28, PixArt 20).
    #[arg(long)]
    steps: Option<usize>,
    /// Classifier-free guidance scale; above 1 turns guidance on (default: 7.5, SDXL 5,
    /// SD3 7, DiT 4, PixArt 4.5). For Flux it is the distilled guidance a guidance-embedding checkpoint (dev)
    /// embeds (default 3.5); see --true-cfg-scale for real guidance.
    #[arg(long)]
    guidance: Option<f64>,
    /// Flux: true classifier-free guidance with --negative (a second transformer call per
    /// step), on above 1.
    #[arg(long, default_value_t = 1.0)]
    true_cfg_scale: f64,
    /// SD3 / Flux / PixArt: the T5 prompt length in tokens (default: SD3 256, Flux 512,
    /// PixArt-α 120, PixArt-Σ 300).
    #[arg(long)]
    max_sequence_length: Option<usize>,
    /// SD3 (3.5 Medium): skip-layer guidance over these transformer blocks, e.g. 7,8,9.
    #[arg(long, value_delimiter = ',')]
    skip_guidance_layers: Vec<usize>,
    /// With --skip-guidance-layers: how strongly to push away from the skipped prediction.
    #[arg(long, default_value_t = 2.8)]
    skip_layer_scale: f64,
    /// With --skip-guidance-layers: the fraction of the steps after which it runs, and the
    /// fraction at which it stops, as START:STOP.
    #[arg(long, default_value = "0.01:0.2")]
    skip_layer_window: String,
    /// SD3: run without the T5 encoder (its tokens become zeros), saving its memory.
    #[arg(long)]
    drop_t5: bool,
    /// PixArt: generate at exactly --size instead of the closest size of the model's
    /// aspect-ratio table (resized back to --size afterwards).
    #[arg(long)]
    no_resolution_binning: bool,
    /// Rescale the guided prediction toward the text prediction's spread (0 to 1).
    #[arg(long, default_value_t = 0.0)]
    guidance_rescale: f64,
    /// Another scheduler class over the pipeline's scheduler config, e.g.
    /// EulerDiscreteScheduler, DPMSolverMultistepScheduler, DDIMScheduler.
    #[arg(long)]
    scheduler: Option<String>,
    /// Seed of the initial noise.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Image size WIDTHxHEIGHT, multiples of 8 (default: the UNet's sample size).
    #[arg(long)]
    size: Option<String>,
    /// Images to generate.
    #[arg(long, default_value_t = 1)]
    num_images: usize,
    /// Image-to-image: start from this PNG or JPEG (its size is the output's, a multiple
    /// of 8), as diffusers' StableDiffusionImg2ImgPipeline over the same components.
    #[arg(long)]
    init_image: Option<PathBuf>,
    /// With --init-image: how much of the schedule runs (1 = from pure noise, 0 = the image).
    #[arg(long, default_value_t = 0.8)]
    strength: f64,
    /// Refuse an --init-image whose header declares more pixels than this, before decoding it
    /// (Pillow's MAX_IMAGE_PIXELS by default: a few bytes can declare gigabytes); 0 for no
    /// limit, for trusted files.
    #[arg(long, value_name = "PIXELS", default_value_t = zoo_transformers::image_processing::MAX_IMAGE_PIXELS)]
    max_image_pixels: u64,
    /// Initial latents from a safetensors file (tensor `latents`).
    #[arg(long)]
    latents: Option<PathBuf>,
    /// Where the pipeline runs: cpu, cuda:N, one PJRT device (pjrt:cpu:0), or several the
    /// UNet or transformer is split over in balanced stages by its blocks (pjrt:PLATFORM for
    /// all of them, pjrt:cpu:0,1, tpu); the text encoders run on the first, the VAE on the
    /// last. tp:pjrt:PLATFORM[:0,1,..] runs every component on one mesh of those devices,
    /// the text encoders and the denoiser's transformer blocks split over it (tensor
    /// parallel); tpN:pjrt:PLATFORM splits the denoiser in stages of N-device meshes. Or a
    /// strategy planned over the host's accelerator (TPU, else CUDA) from the
    /// weights' headers and the image's activations, as accelerate's device_map: sequential
    /// (fill device 0, split only what does not fit), balanced, balanced_low_0, auto
    /// (balanced); each text encoder and the VAE where the plan puts it. `zoo plan MODEL`
    /// prints the same plan.
    #[arg(long, default_value = "cpu")]
    device_map: String,
    /// Memory budgets of a strategy --device-map, e.g. `0=16GiB,1=16GiB` or one size for
    /// every device (instead of what the devices report).
    #[arg(long)]
    max_memory: Option<String>,
    /// SD3 / Flux / PixArt: run the T5 text encoder on this one device instead (cpu,
    /// cuda:N, pjrt:cpu:N, ...), e.g. to keep a large T5 off the denoiser's devices.
    #[arg(long)]
    text_encoder_device: Option<String>,
    /// Weight and activation dtype: f32, bf16 or f16.
    #[arg(long, default_value = "f32")]
    dtype: String,
    /// A weights variant, e.g. fp16 for diffusion_pytorch_model.fp16.safetensors.
    #[arg(long)]
    variant: Option<String>,
    /// The PNG to write (several images: OUT-0.png, OUT-1.png, ...), through a temporary
    /// file renamed into place: a failed run leaves none. An existing symbolic link, folder,
    /// FIFO or device is refused (name a regular file).
    #[arg(long)]
    out: PathBuf,
}

fn parse_size(s: &str) -> Result<(usize, usize)> {
    let (w, h) = s
        .split_once(['x', 'X'])
        .with_context(|| format!("--size {s:?}: write it as WIDTHxHEIGHT, e.g. 512x512"))?;
    let n = |v: &str| -> Result<usize> {
        v.trim()
            .parse::<usize>()
            .with_context(|| format!("--size {s:?}: {v:?} is not a whole number"))
    };
    let (w, h) = (n(w)?, n(h)?);
    if w == 0 || h == 0 || w % 8 != 0 || h % 8 != 0 {
        bail!("--size {s}: width and height must be positive multiples of 8");
    }
    Ok((w, h))
}

/// The devices `--device-map` names: one, or several a UNet is split over (the first also
/// runs the text encoders, the last the VAE).
fn devices_of(map: &str) -> Result<Vec<Device>> {
    let parsed: DeviceMap = map.parse().context("--device-map")?;
    pipelines::devices_of(&parsed).with_context(|| format!("--device-map {map}"))
}

fn read_latents(path: &Path) -> Result<Tensor> {
    let w = zoo_hub::Weights::from_safetensors(&[path.to_path_buf()])
        .with_context(|| format!("reading {}", path.display()))?;
    let info = w
        .inventory()
        .get("latents")
        .with_context(|| format!("{}: no tensor named `latents`", path.display()))?
        .clone();
    let values = w.load_f32("latents")?;
    Ok(Tensor::from_vec(values, &info.shape, &Device::Cpu)?)
}

fn check_out(out: &Path) -> Result<()> {
    if out
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase)
        != Some("png".into())
    {
        bail!("--out {}: zoo writes PNG; name a .png file", out.display());
    }
    if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
        if !dir.is_dir() {
            bail!(
                "--out {}: the folder {} does not exist",
                out.display(),
                dir.display()
            );
        }
    }
    Ok(())
}

pub fn run(args: Args) -> Result<()> {
    // Everything a user can get wrong is checked before a weight is read.
    check_out(&args.out)?;
    let size = args.size.as_deref().map(parse_size).transpose()?;
    if let Some(g) = args.guidance {
        if !(g.is_finite() && g >= 0.0) {
            bail!("--guidance {g}: use 0 or more (above 1 turns on classifier-free guidance)");
        }
    }
    if args.steps == Some(0) || args.num_images == 0 {
        bail!("--steps and --num-images must be at least 1");
    }
    let dtype = match DType::parse(&args.dtype) {
        Some(d @ (DType::F32 | DType::BF16 | DType::F16)) => d,
        _ => bail!("--dtype {:?}: use f32, bf16 or f16", args.dtype),
    };
    let latents = args.latents.as_deref().map(read_latents).transpose()?;
    if !(0.0..=1.0).contains(&args.strength) {
        bail!("--strength {}: use a value in [0, 1]", args.strength);
    }
    if args.init_image.is_some() && (latents.is_some() || size.is_some()) {
        bail!("--init-image sets the size and the starting latents: drop --size and --latents");
    }
    let init_image = args
        .init_image
        .as_deref()
        .map(|p| {
            zoo_diffusers::pipelines::load_image_limited(
                p,
                crate::pixel_limit(args.max_image_pixels),
            )
        })
        .transpose()?;
    if let Some(img) = &init_image {
        let (h, w) = (img.shape()[2], img.shape()[3]);
        if h % 8 != 0 || w % 8 != 0 {
            bail!(
                "--init-image is {w}x{h}; img2img needs sides that are multiples of 8: resize or crop it"
            );
        }
    }
    let map: DeviceMap = args.device_map.parse().context("--device-map")?;
    let max_memory = args
        .max_memory
        .as_deref()
        .map(parse_max_memory)
        .transpose()
        .context("--max-memory")?;
    let shape = PlanShape {
        dtype: Some(dtype),
        size: size
            .or(init_image.as_ref().map(|i| (i.shape()[3], i.shape()[2])))
            .map(|(w, h)| (h, w)),
        images: args.num_images,
        guidance: args.guidance.is_none_or(|g| g > 1.0),
    };
    let placed = pipelines::placement::resolve(&args.model, &map, max_memory.as_ref(), &shape)
        .with_context(|| format!("placing {} (--device-map {})", args.model, args.device_map))?;
    if let Some(note) = &placed.note {
        eprintln!("note: {note}");
    }
    if let Some(plan) = &placed.plan {
        eprint!("{}", plan.table());
    }
    let text_encoder_device = match args.text_encoder_device.as_deref() {
        None => None,
        Some(map) => {
            match devices_of(map).with_context(|| format!("--text-encoder-device {map}"))?[..] {
                [one] => Some(one),
                _ => bail!("--text-encoder-device {map}: name one device, e.g. pjrt:cpu:3 or cpu"),
            }
        }
    };
    let opts = LoadOptions {
        text_encoder_device,
        dtype: Some(dtype),
        variant: args.variant.clone(),
        scheduler: args.scheduler.clone(),
        progress: true,
        ..placed.options
    };
    let t0 = Instant::now();
    let mut pipe = DiffusionPipeline::from_pretrained(&args.model, &opts)
        .with_context(|| format!("loading {}", args.model))?;
    let flow = matches!(
        pipe,
        DiffusionPipeline::StableDiffusion3(_) | DiffusionPipeline::Flux(_)
    );
    let pixart = matches!(pipe, DiffusionPipeline::PixArt(_));
    if !(flow || pixart) && args.max_sequence_length.is_some() {
        bail!(
            "--max-sequence-length applies to SD3, Flux and PixArt pipelines; {} has no T5",
            pipe.class_name()
        );
    }
    if !(flow || pixart) && args.text_encoder_device.is_some() {
        bail!(
            "--text-encoder-device places T5 (SD3, Flux, PixArt); {} has none",
            pipe.class_name()
        );
    }
    if !flow
        && (!args.skip_guidance_layers.is_empty() || args.true_cfg_scale != 1.0 || args.drop_t5)
    {
        bail!("--skip-guidance-layers, --true-cfg-scale and --drop-t5 apply to SD3 and Flux pipelines, not {}", pipe.class_name());
    }
    if !pixart && args.no_resolution_binning {
        bail!(
            "--no-resolution-binning applies to PixArt pipelines, not {}",
            pipe.class_name()
        );
    }
    let (skip_start, skip_stop) = args
        .skip_layer_window
        .split_once(':')
        .and_then(|(a, b)| Some((a.trim().parse::<f64>().ok()?, b.trim().parse::<f64>().ok()?)))
        .filter(|(a, b)| (0.0..=1.0).contains(a) && (0.0..=1.0).contains(b) && a <= b)
        .with_context(|| {
            format!(
                "--skip-layer-window {:?}: write START:STOP, fractions of the steps with START <= STOP, e.g. 0.01:0.2",
                args.skip_layer_window
            )
        })?;
    let call = TextToImage {
        prompt: vec![args.prompt.clone()],
        negative_prompt: args.negative.clone().map(|n| vec![n]),
        num_inference_steps: args.steps.unwrap_or(match () {
            _ if flow => 28,
            _ if pixart => 20,
            _ => 50,
        }),
        guidance_scale: args
            .guidance
            .unwrap_or(pipelines::default_guidance_scale(pipe.class_name())),
        guidance_rescale: args.guidance_rescale,
        height: size.map(|s| s.1),
        width: size.map(|s| s.0),
        num_images_per_prompt: args.num_images,
        latents,
        init_image,
        strength: args.strength,
        progress: true,
        max_sequence_length: args.max_sequence_length,
        true_cfg_scale: args.true_cfg_scale,
        skip_guidance_layers: args.skip_guidance_layers.clone(),
        skip_layer_guidance_scale: args.skip_layer_scale,
        skip_layer_guidance_start: skip_start,
        skip_layer_guidance_stop: skip_stop,
        resolution_binning: !args.no_resolution_binning,
        ..Default::default()
    };
    let load_seconds = t0.elapsed().as_secs_f64();
    let mut noise = Noise::seeded(args.seed);
    let out = match &mut pipe {
        DiffusionPipeline::StableDiffusion(p) => p.generate(&call, &mut noise)?,
        DiffusionPipeline::StableDiffusion3(p) => {
            if args.drop_t5 {
                p.drop_t5();
            }
            p.generate(&call, &mut noise)?
        }
        DiffusionPipeline::Flux(p) => {
            if args.drop_t5 {
                bail!("--drop-t5: FluxPipeline's prompt is T5's; it cannot run without it");
            }
            p.generate(&call, &mut noise)?
        }
        DiffusionPipeline::DiT(p) => p.generate(&call, &mut noise)?,
        DiffusionPipeline::PixArt(p) => p.generate(&call, &mut noise)?,
        DiffusionPipeline::Ddpm(p) => {
            if size.is_some() || call.latents.is_some() || call.init_image.is_some() {
                bail!("DDPMPipeline generates at its UNet's sample size from seeded noise: drop --size, --latents and --init-image");
            }
            p.generate(args.num_images, call.num_inference_steps, &mut noise, true)?
        }
    };
    let written = out.save_png(&args.out)?;
    for p in &written {
        outln!("{}", p.display());
    }
    eprintln!(
        "{}: loaded in {load_seconds:.2} s; {} steps at {:.3} s/step (text encoding {:.2} s, VAE decode {:.2} s)",
        pipe.class_name(),
        out.steps,
        out.seconds_per_step(),
        out.encode_seconds,
        out.decode_seconds
    );
    Ok(())
}
