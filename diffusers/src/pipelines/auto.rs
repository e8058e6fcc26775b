//! The dispatcher, as diffusers' `DiffusionPipeline.from_pretrained` dispatches: a
//! pipeline folder's `model_index.json` names its `_class_name`, and `DiffusionPipeline`
//! loads and runs whichever pipeline that is. It imports every pipeline; no pipeline
//! imports it.

use zoo_hub::ModelIndex;

use super::text_to_image::TextToImage;
use super::{
    DDPMPipeline, DiTPipeline, FluxPipeline, Generated, LoadOptions, Noise, PipelineFiles,
    PixArtPipeline, PixArtVersion, StableDiffusion3Pipeline, StableDiffusionPipeline,
};
use crate::{Error, Result};

/// The pipeline classes zoo runs.
pub const PIPELINES: &[&str] = &[
    "StableDiffusionPipeline",
    "StableDiffusionXLPipeline",
    "StableDiffusion3Pipeline",
    "FluxPipeline",
    "DiTPipeline",
    "PixArtAlphaPipeline",
    "PixArtSigmaPipeline",
    "DDPMPipeline",
];

/// The `guidance_scale` a pipeline class's `__call__` defaults to in diffusers.
pub fn default_guidance_scale(class_name: &str) -> f64 {
    match class_name {
        "StableDiffusionXLPipeline" => 5.0,
        "StableDiffusion3Pipeline" => 7.0,
        "FluxPipeline" => 3.5,
        "DiTPipeline" => 4.0,
        "PixArtAlphaPipeline" | "PixArtSigmaPipeline" => 4.5,
        _ => 7.5,
    }
}

/// A loaded pipeline of any class zoo runs.
#[derive(Debug)]
pub enum DiffusionPipeline {
    /// `StableDiffusionPipeline` or `StableDiffusionXLPipeline`.
    StableDiffusion(Box<StableDiffusionPipeline>),
    /// `StableDiffusion3Pipeline`.
    StableDiffusion3(Box<StableDiffusion3Pipeline>),
    /// `FluxPipeline`.
    Flux(Box<FluxPipeline>),
    /// `DiTPipeline`.
    DiT(Box<DiTPipeline>),
    /// `PixArtAlphaPipeline` or `PixArtSigmaPipeline`.
    PixArt(Box<PixArtPipeline>),
    /// `DDPMPipeline`.
    Ddpm(Box<DDPMPipeline>),
}

impl DiffusionPipeline {
    /// Loads the pipeline `model_index.json` names.
    pub fn from_pretrained(repo_or_path: &str, opts: &LoadOptions) -> Result<DiffusionPipeline> {
        let files = PipelineFiles::open(repo_or_path, opts.variant.as_deref())?;
        match files.index.class_name.as_str() {
            "StableDiffusionPipeline" | "StableDiffusionXLPipeline" => {
                Ok(DiffusionPipeline::StableDiffusion(Box::new(
                    StableDiffusionPipeline::load(files, opts)?,
                )))
            }
            "StableDiffusion3Pipeline" => Ok(DiffusionPipeline::StableDiffusion3(Box::new(
                StableDiffusion3Pipeline::load(files, opts)?,
            ))),
            "FluxPipeline" => Ok(DiffusionPipeline::Flux(Box::new(FluxPipeline::load(
                files, opts,
            )?))),
            "DiTPipeline" => Ok(DiffusionPipeline::DiT(Box::new(DiTPipeline::load(
                files, opts,
            )?))),
            "PixArtAlphaPipeline" => Ok(DiffusionPipeline::PixArt(Box::new(PixArtPipeline::load(
                files,
                PixArtVersion::Alpha,
                opts,
            )?))),
            "PixArtSigmaPipeline" => Ok(DiffusionPipeline::PixArt(Box::new(PixArtPipeline::load(
                files,
                PixArtVersion::Sigma,
                opts,
            )?))),
            "DDPMPipeline" => Ok(DiffusionPipeline::Ddpm(Box::new(DDPMPipeline::load(
                files, opts,
            )?))),
            other => Err(Error::Unsupported(format!(
                "{}: the pipeline class {other:?} is not one zoo runs ({})",
                files.index.path.display(),
                PIPELINES.join(", ")
            ))),
        }
    }

    /// Generates images for `args` with whichever pipeline this is (DDPM, unconditional,
    /// reads only the step count, the image count and `progress`; DiT reads each prompt as
    /// a class label).
    pub fn generate(&self, args: &TextToImage, noise: &mut Noise) -> Result<Generated> {
        match self {
            DiffusionPipeline::StableDiffusion(p) => p.generate(args, noise),
            DiffusionPipeline::StableDiffusion3(p) => p.generate(args, noise),
            DiffusionPipeline::Flux(p) => p.generate(args, noise),
            DiffusionPipeline::DiT(p) => p.generate(args, noise),
            DiffusionPipeline::PixArt(p) => p.generate(args, noise),
            DiffusionPipeline::Ddpm(p) => p.generate(
                args.num_images_per_prompt * args.prompt.len().max(1),
                args.num_inference_steps,
                noise,
                args.progress,
            ),
        }
    }

    /// The pipeline class.
    pub fn class_name(&self) -> &'static str {
        match self {
            DiffusionPipeline::StableDiffusion(p) => p.class_name(),
            DiffusionPipeline::StableDiffusion3(_) => "StableDiffusion3Pipeline",
            DiffusionPipeline::Flux(_) => "FluxPipeline",
            DiffusionPipeline::DiT(_) => "DiTPipeline",
            DiffusionPipeline::PixArt(p) => p.class_name(),
            DiffusionPipeline::Ddpm(_) => "DDPMPipeline",
        }
    }
}

/// The components of a pipeline folder with their classes, for `zoo inspect`.
pub fn components(repo_or_path: &str) -> Result<ModelIndex> {
    Ok(PipelineFiles::open(repo_or_path, None)?.index)
}
