//! A text-to-image call shared by the pipelines: its arguments (`TextToImage`, diffusers'
//! `__call__` arguments), the checks every pipeline makes on them, the negative prompts,
//! classifier-free guidance's mix of the two halves of a prediction, and the
//! flow-matching schedule's shift from the image's token count (`calculate_shift`).

use zoo_runtime::Tensor;

use crate::{Error, Result, SchedulerConfig};

/// A call of a text-to-image pipeline (diffusers' `__call__` arguments).
#[derive(Clone, Debug)]
pub struct TextToImage {
    /// One prompt per image of the batch.
    pub prompt: Vec<String>,
    /// Negative prompts (one, or one per prompt); `None` is the empty prompt (SDXL: zeros
    /// when `force_zeros_for_empty_prompt`).
    pub negative_prompt: Option<Vec<String>>,
    /// Denoising steps.
    pub num_inference_steps: usize,
    /// Classifier-free guidance scale; guidance runs when it is above 1.
    pub guidance_scale: f64,
    /// `guidance_rescale` (0 = off), as in "Common Diffusion Noise Schedules" §3.4.
    pub guidance_rescale: f64,
    /// Image height in pixels (default: the UNet's `sample_size` times the VAE's factor).
    pub height: Option<usize>,
    /// Image width in pixels.
    pub width: Option<usize>,
    /// Images per prompt.
    pub num_images_per_prompt: usize,
    /// The initial latents `[N, C, h, w]` (diffusers' `latents=`); drawn from `noise`
    /// otherwise.
    pub latents: Option<Tensor>,
    /// DDIM's `eta`.
    pub eta: f32,
    /// Image-to-image (`StableDiffusionImg2ImgPipeline`): the starting image
    /// `[N, 3, H, W]` in `[0, 1]`, encoded by the VAE and noised to the level `strength`
    /// picks; the size is the image's.
    pub init_image: Option<Tensor>,
    /// How much of the schedule img2img runs: 1 starts from pure noise, 0 keeps the image.
    pub strength: f64,
    /// Show a progress bar over the steps.
    pub progress: bool,
    /// T5's prompt length (SD3: 256, Flux: 512 when `None`).
    pub max_sequence_length: Option<usize>,
    /// Flux's true classifier-free guidance: with a negative prompt and a scale above 1, a
    /// second transformer call on the negative prompt (`guidance_scale` is then the
    /// distilled guidance embedding, for checkpoints that have one).
    pub true_cfg_scale: f64,
    /// SD3's skip-layer guidance: the blocks skipped in the extra prediction (empty: off).
    pub skip_guidance_layers: Vec<usize>,
    /// How strongly skip-layer guidance pushes away from the skipped prediction.
    pub skip_layer_guidance_scale: f64,
    /// Fraction of the steps after which skip-layer guidance starts.
    pub skip_layer_guidance_start: f64,
    /// Fraction of the steps at which it stops.
    pub skip_layer_guidance_stop: f64,
    /// PixArt: generate at the closest size of diffusers' aspect-ratio table for the
    /// transformer's sample size, then resize and crop to the requested size.
    pub resolution_binning: bool,
}

impl Default for TextToImage {
    fn default() -> Self {
        TextToImage {
            prompt: Vec::new(),
            negative_prompt: None,
            num_inference_steps: 50,
            guidance_scale: 7.5,
            guidance_rescale: 0.0,
            height: None,
            width: None,
            num_images_per_prompt: 1,
            latents: None,
            eta: 0.0,
            init_image: None,
            strength: 0.8,
            progress: false,
            max_sequence_length: None,
            true_cfg_scale: 1.0,
            skip_guidance_layers: Vec::new(),
            skip_layer_guidance_scale: 2.8,
            skip_layer_guidance_start: 0.01,
            skip_layer_guidance_stop: 0.2,
            resolution_binning: true,
        }
    }
}

/// The counts every call needs at least one of: prompts, steps and images per prompt.
pub(crate) fn check_counts(args: &TextToImage) -> Result<()> {
    if args.prompt.is_empty() {
        return Err(Error::Input("give at least one prompt".into()));
    }
    if args.num_inference_steps == 0 {
        return Err(Error::Input(
            "`num_inference_steps` must be at least 1".into(),
        ));
    }
    if args.num_images_per_prompt == 0 {
        return Err(Error::Input(
            "`num_images_per_prompt` must be at least 1".into(),
        ));
    }
    Ok(())
}

/// The checks the transformer pipelines (SD3, Flux, PixArt, DiT) make on a call.
pub(crate) fn check_common(args: &TextToImage) -> Result<()> {
    check_counts(args)?;
    for (name, v) in [
        ("guidance scale", args.guidance_scale),
        ("true_cfg_scale", args.true_cfg_scale),
        ("skip_layer_guidance_scale", args.skip_layer_guidance_scale),
    ] {
        if !(v.is_finite() && v >= 0.0) {
            return Err(Error::Input(format!("the {name} is {v}; use 0 or more")));
        }
    }
    if args.max_sequence_length == Some(0) {
        return Err(Error::Input(
            "`max_sequence_length` must be at least 1".into(),
        ));
    }
    negatives(args)?;
    Ok(())
}

/// One negative prompt per prompt (the empty prompt when none is given).
pub(crate) fn negatives(args: &TextToImage) -> Result<Vec<String>> {
    let n = args.prompt.len();
    match &args.negative_prompt {
        None => Ok(vec![String::new(); n]),
        Some(v) if v.len() == 1 => Ok(vec![v[0].clone(); n]),
        Some(v) if v.len() == n => Ok(v.clone()),
        Some(v) => Err(Error::Input(format!(
            "{} negative prompts for {n} prompts; give one or one per prompt",
            v.len()
        ))),
    }
}

/// Classifier-free guidance on a prediction of the batch (negative rows, then positive):
/// `uncond + scale * (text - uncond)`, and the text half (for guidance rescale and
/// skip-layer guidance).
pub(crate) fn guide(pred: &Tensor, scale: &Tensor) -> Result<(Tensor, Tensor)> {
    let halves = pred.chunk(2, 0)?;
    let (uncond, text) = (&halves[0], &halves[1]);
    Ok((uncond.add(&text.sub(uncond)?.mul(scale)?)?, text.clone()))
}

/// Fails unless `height x width` are positive multiples of `multiple`.
pub(crate) fn check_size(height: usize, width: usize, multiple: usize) -> Result<()> {
    if height == 0
        || width == 0
        || !height.is_multiple_of(multiple)
        || !width.is_multiple_of(multiple)
    {
        return Err(Error::Input(format!(
            "the size {width}x{height} must be positive multiples of {multiple}"
        )));
    }
    Ok(())
}

/// `mu` of `use_dynamic_shifting` schedulers for `seq` image tokens (diffusers'
/// `calculate_shift` over the scheduler config's `base/max_image_seq_len` and
/// `base/max_shift`), `None` when the scheduler shifts statically.
pub(crate) fn dynamic_mu(config: &SchedulerConfig, seq: usize) -> Option<f64> {
    let f = &config.fields;
    if f.get("use_dynamic_shifting").and_then(|v| v.as_bool()) != Some(true) {
        return None;
    }
    // SD3's pipeline falls back to a max_shift of 1.16 where Flux's uses 1.15; diffusers'
    // schedulers always save the field.
    Some(calculate_shift(config, seq, 1.16))
}

/// diffusers' `calculate_shift`: `mu` linear in the token count between the config's
/// `(base_image_seq_len, base_shift)` and `(max_image_seq_len, max_shift)`.
pub(crate) fn calculate_shift(config: &SchedulerConfig, seq: usize, max_shift: f64) -> f64 {
    let f = &config.fields;
    let num = |k: &str, d: f64| f.get(k).and_then(|v| v.as_f64()).unwrap_or(d);
    let (base_len, max_len) = (
        num("base_image_seq_len", 256.0),
        num("max_image_seq_len", 4096.0),
    );
    let (base, max) = (num("base_shift", 0.5), num("max_shift", max_shift));
    let m = (max - base) / (max_len - base_len);
    let b = base - m * base_len;
    seq as f64 * m + b
}
