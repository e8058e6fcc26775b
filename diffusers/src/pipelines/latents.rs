//! Latents in and out of the denoiser, shared by every latent pipeline: the first latents
//! of a call (given or drawn), each prompt's rows repeated per image, the VAE (its dtype and
//! device, its `latent_channels` against the denoiser's) and the decode of final latents
//! to images in `[0, 1]` (`VaeImageProcessor.postprocess`).

use zoo_hub::Pretrained;
use zoo_runtime::{DType, Device, Tensor};

use super::text_to_image::TextToImage;
use super::{LoadOptions, Noise};
use crate::models::autoencoder_kl::{AutoencoderKL, AutoencoderKLConfig};
use crate::models::loading::component_weights;
use crate::schedulers::Scheduler;
use crate::{Error, Result};

/// The call's latents (checked against `shape`) or a fresh draw, float32 on `device`.
pub(crate) fn initial_latents(
    args: &TextToImage,
    shape: &[usize],
    device: &Device,
    noise: &mut Noise,
) -> Result<Tensor> {
    match &args.latents {
        Some(l) if l.shape() != shape => Err(Error::Shape(format!(
            "the latents are {:?}; this size and batch need {shape:?}",
            l.shape()
        ))),
        Some(l) => Ok(l.to_device(device)?.to_dtype(DType::F32)?),
        None => noise.randn(shape, device),
    }
}

/// Refuses a call whose decoded images would not fit the host's memory before anything is
/// drawn: `images` of `height x width`, as float32 pixels and, where the VAE runs on the
/// host, the decoder's widest maps (three of its first level's channels at full size). A
/// library caller's absurd size is then an error, as the CLI's is from its plan.
pub(crate) fn check_images_fit(
    vae: &AutoencoderKL,
    args: &TextToImage,
    height: usize,
    width: usize,
) -> Result<()> {
    let Some(available) = zoo_runtime::device_map::host_available() else {
        return Ok(());
    };
    let images = args.prompt.len().saturating_mul(args.num_images_per_prompt);
    let channels = match vae.device() {
        Device::Cpu => {
            let first = vae
                .config()
                .block_out_channels
                .first()
                .copied()
                .unwrap_or(0);
            3u64.saturating_add((first as u64).saturating_mul(3))
        }
        _ => 3,
    };
    let needs = [images as u64, height as u64, width as u64, channels, 4]
        .iter()
        .fold(1u64, |n, &d| n.saturating_mul(d));
    if needs <= available {
        return Ok(());
    }
    Err(Error::Input(format!(
        "{images} image(s) of {width}x{height} need at least {} of host memory to decode, and \
         {} is available; ask for a smaller size or fewer images",
        zoo_runtime::device_map::human(needs),
        zoo_runtime::device_map::human(available)
    )))
}

/// The scheduler's `init_noise_sigma` as a `[1]` float32 tensor on `device`: an input, not
/// a constant, so a compiled first step stays the same for any step count.
pub(crate) fn init_noise_sigma(scheduler: &dyn Scheduler, device: &Device) -> Result<Tensor> {
    Ok(Tensor::from_f64s(
        &[scheduler.init_noise_sigma()],
        &[1],
        DType::F32,
        device,
    )?)
}

/// The denoiser's input at step `i`: the latents, twice under classifier-free guidance
/// (unconditional and conditional rows), through the scheduler's input scaling.
pub(crate) fn model_input(
    latents: &Tensor,
    guided: bool,
    scheduler: &dyn Scheduler,
    i: usize,
) -> Result<Tensor> {
    let input = if guided {
        Tensor::cat(&[latents, latents], 0)?
    } else {
        latents.clone()
    };
    scheduler.scale_model_input(&input, i)
}

/// Each row of `t` repeated `n` times in place (`num_images_per_prompt`).
pub(crate) fn repeat_rows(t: &Tensor, n: usize) -> Result<Tensor> {
    Ok(if n == 1 {
        t.clone()
    } else {
        t.repeat_interleave(n, 0)?
    })
}

/// The VAE's dtype in a pipeline of `dtype`: a `force_upcast` VAE stays float32 under f16.
pub(crate) fn vae_dtype(dtype: DType, vae: &AutoencoderKLConfig) -> DType {
    if dtype == DType::F16 && vae.force_upcast {
        DType::F32
    } else {
        dtype
    }
}

/// The VAE of a pipeline of `dtype` (f32 when it must upcast under f16), on its planned
/// device, else the last of `opts.unet_devices` (else `opts.device`): after a split
/// denoiser, where its latents end.
pub(crate) fn load_vae(
    component: &Pretrained,
    config: &AutoencoderKLConfig,
    dtype: DType,
    opts: &LoadOptions,
) -> Result<AutoencoderKL> {
    let device = opts.vae_device();
    let dtype = vae_dtype(dtype, config);
    AutoencoderKL::load(&component_weights(component, dtype, &device)?, config)
}

/// The VAE's `latent_channels` must be what the denoiser takes (`expected`, from its
/// config field `field`).
pub(crate) fn check_latent_channels(
    vae: &AutoencoderKLConfig,
    expected: usize,
    field: &str,
) -> Result<()> {
    if vae.latent_channels != expected {
        return Err(Error::Config {
            path: vae.path.clone(),
            reason: format!(
                "the VAE has {} latent channels, but the transformer's `{field}` asks for {expected}: the components come from different models",
                vae.latent_channels
            ),
        });
    }
    Ok(())
}

/// Final latents → `[N, H, W, 3]` images in `[0, 1]`: undoes the VAE's latent scaling
/// (`latents_mean`/`latents_std`, or `scaling_factor` and `shift_factor`) and decodes.
pub(crate) fn decode_latents(vae: &AutoencoderKL, latents: &Tensor) -> Result<Tensor> {
    let c = vae.config();
    let mut z = latents.to_device(&vae.device())?.to_dtype(vae.dtype())?;
    z = match (&c.latents_mean, &c.latents_std) {
        (Some(mean), Some(std)) => {
            let n = mean.len();
            let d = vae.device();
            let m = Tensor::from_f64s(mean, &[1, n, 1, 1], z.dtype(), &d)?;
            let s = Tensor::from_f64s(std, &[1, n, 1, 1], z.dtype(), &d)?;
            z.mul(&s)?.div_scalar(c.scaling_factor)?.add(&m)?
        }
        _ => {
            let z = z.div_scalar(c.scaling_factor)?;
            match c.shift_factor {
                Some(s) => z.add_scalar(s)?,
                None => z,
            }
        }
    };
    postprocess(&vae.decode(&z)?)
}

/// `[N, C, H, W]` in about `[-1, 1]` → `[N, H, W, C]` float32 in `[0, 1]` on the host
/// (`VaeImageProcessor.postprocess(output_type="np")`).
pub(crate) fn postprocess(decoded: &Tensor) -> Result<Tensor> {
    let x = decoded
        .to_dtype(DType::F32)?
        .affine(0.5, 0.5)?
        .clamp(0.0, 1.0)?;
    Ok(x.permute(&[0, 2, 3, 1])?
        .contiguous()?
        .to_device(&Device::Cpu)?)
}
