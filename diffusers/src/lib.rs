//! zoo-diffusers: diffusion models, schedulers and pipelines, read from diffusers' own files.
//!
//! - `schedulers`: the noise schedulers, built from `scheduler/scheduler_config.json` by its
//!   `_class_name` as diffusers' `Scheduler.from_config` builds them.
//! - `models`: `UNet2DConditionModel`, `UNet2DModel`, the diffusion transformers (DiT,
//!   PixArt, SD3, Flux) and `AutoencoderKL` from their `config.json`, weights under
//!   diffusers' names.
//! - `pipelines`: Stable Diffusion (1.x, 2.x, XL), img2img, SD3, Flux, DiT, PixArt-α / Σ and
//!   DDPM from `model_index.json`.

#![forbid(unsafe_code)]

mod configuration;
mod error;
pub mod models;
pub mod pipelines;
pub mod schedulers;

pub use error::{Error, Result};
pub use models::autoencoder_kl::{AutoencoderKL, AutoencoderKLConfig, DiagonalGaussian};
pub use models::transformer_dit::{DiTTransformer2DConfig, DiTTransformer2DModel};
pub use models::transformer_flux::{
    FluxTransformer2DConfig, FluxTransformer2DModel, FluxTransformerInput,
};
pub use models::transformer_pixart::{
    PixArtTransformer2DConfig, PixArtTransformer2DModel, PixArtTransformerInput,
};
pub use models::transformer_sd3::{
    SD3Transformer2DConfig, SD3Transformer2DModel, SD3TransformerInput,
};
pub use models::unet_2d::{UNet2DConfig, UNet2DModel};
pub use models::unet_2d_condition::{
    UNet2DConditionConfig, UNet2DConditionInput, UNet2DConditionModel,
};
pub use schedulers::{Scheduler, SchedulerConfig};
