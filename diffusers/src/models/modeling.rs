//! What every model shares, as diffusers' `ModelMixin` and `ConfigMixin` give it: a config
//! read and checked from `config.json`, `from_pretrained` from a
//! component folder, and for the denoisers the split over devices (`from_pretrained_split`
//! for the diffusion transformers) and the stages that run it, each block on the device
//! its weights were placed on, the activations moved there as the loop reaches it. A model
//! file holds only what differs: its config, its blocks and its forward.

use zoo_runtime::nn::Weights;
use zoo_runtime::{DType, Device, Tensor};

use crate::{Error, Result};

/// One kind of block of a model (`transformer_blocks.N`, `single_transformer_blocks.N`),
/// each with the device its weights were placed on (one for all unless split).
#[derive(Clone, Debug)]
pub(crate) struct Blocks<B> {
    blocks: Vec<B>,
    devices: Vec<Device>,
}

impl<B> Blocks<B> {
    /// Loads the `n` blocks `{name}.0` .. `{name}.{n-1}` under `w` with `load(i, weights)`.
    pub fn load(
        w: &Weights,
        name: &str,
        n: usize,
        mut load: impl FnMut(usize, &Weights) -> Result<B>,
    ) -> Result<Blocks<B>> {
        let (mut blocks, mut devices) = (Vec::with_capacity(n), Vec::with_capacity(n));
        for i in 0..n {
            let bw = w.pp(format!("{name}.{i}"));
            devices.push(bw.device());
            blocks.push(load(i, &bw)?);
        }
        Ok(Blocks { blocks, devices })
    }

    /// Each block with its device, in order.
    pub fn iter(&self) -> impl Iterator<Item = (&B, Device)> {
        self.blocks.iter().zip(self.devices.iter().copied())
    }

    /// The first block.
    pub fn first(&self) -> Option<&B> {
        self.blocks.first()
    }

    /// Each block's device, in order.
    pub fn devices(&self) -> &[Device] {
        &self.devices
    }
}

/// Where a model runs: the device its input enters on (the stem's), the device its output
/// head runs on (the last stage's), every device in execution order, and its dtype.
#[derive(Clone, Debug)]
pub(crate) struct Stages {
    pub input: Device,
    pub head: Device,
    pub order: Vec<Device>,
    pub dtype: DType,
}

impl Stages {
    /// The stages of weights `w` whose stages run on `blocks` (in order), then the head
    /// `head` names.
    pub fn of<'a>(w: &Weights, blocks: impl IntoIterator<Item = &'a Device>, head: &str) -> Stages {
        let head = w.pp(head).device();
        Stages::new(w.device(), blocks, head, w.dtype())
    }

    /// Stages from the input device, the blocks' devices, the head's and the dtype.
    pub fn new<'a>(
        input: Device,
        blocks: impl IntoIterator<Item = &'a Device>,
        head: Device,
        dtype: DType,
    ) -> Stages {
        let mut order = super::devices_in_order(input, blocks);
        if !order.contains(&head) {
            order.push(head);
        }
        Stages {
            input,
            head,
            order,
            dtype,
        }
    }

    /// `t` on the input device in the model's dtype.
    pub fn input(&self, t: &Tensor) -> Result<Tensor> {
        Ok(t.to_device(&self.input)?.to_dtype(self.dtype)?)
    }

    /// A UNet's `sample` on the input device in the model's dtype, checked to be
    /// `[batch, in_channels, height, width]` and mapped from `[0, 1]` to `[-1, 1]` when
    /// `center` (`center_input_sample`); and `(B, H, W)`.
    pub fn unet_input(
        &self,
        sample: &Tensor,
        in_channels: usize,
        center: bool,
    ) -> Result<(Tensor, (usize, usize, usize))> {
        let x = self.input(sample)?;
        let [b, chans, h, w] = x.shape()[..] else {
            return Err(Error::Shape(format!(
                "the sample must be [batch, {in_channels}, height, width], got {:?}",
                x.shape()
            )));
        };
        if chans != in_channels {
            return Err(Error::Shape(format!(
                "the sample has {chans} channels but the UNet's `in_channels` is {in_channels}"
            )));
        }
        let x = if center { x.affine(2.0, -1.0)? } else { x };
        Ok((x, (b, h, w)))
    }

    /// A patch transformer's inputs: latents `[B, channels, H, W]` (sides divisible by
    /// `patch`) on the input device in the model's dtype, one timestep per sample, and
    /// `(B, H, W)`.
    pub fn patch_input(
        &self,
        latents: &Tensor,
        timestep: &Tensor,
        channels: usize,
        patch: usize,
    ) -> Result<(Tensor, Tensor, (usize, usize, usize))> {
        let latents = self.input(latents)?;
        let (b, h, w) = super::check_latents(&latents, channels, patch)?;
        let t = super::per_sample(&timestep.to_device(&self.input)?, b, "timesteps")?;
        Ok((latents, t, (b, h, w)))
    }
}

/// `from_pretrained` of a model `$model` with config `$config` (a type with
/// `from_file(&Path)`), and with `split` the rest of what a split denoiser shows:
/// `from_pretrained_split`, `config`, `dtype`, `device`, `output_device` and `devices`, read
/// from its `config` and `stages: Stages` fields.
macro_rules! model_mixin {
    ($model:ident, $config:ident) => {
        impl $model {
            /// Loads a component folder (`config.json` + `diffusion_pytorch_model.safetensors`),
            /// as diffusers' `from_pretrained` does.
            pub fn from_pretrained(
                repo_or_path: &str,
                dtype: zoo_runtime::DType,
                device: &zoo_runtime::Device,
            ) -> $crate::Result<$model> {
                let (config, w) =
                    $crate::models::loading::open_component(repo_or_path, dtype, device)?;
                $model::load(&w, &$config::from_file(&config)?)
            }
        }
    };
    ($model:ident, $config:ident, split) => {
        $crate::models::modeling::model_mixin!($model, $config);
        $crate::models::modeling::model_mixin!($model, $config, stages);

        impl $model {
            /// Loads a component folder split over `devices` at its blocks, in contiguous
            /// stages balanced by weight bytes (one device: no split).
            pub fn from_pretrained_split(
                repo_or_path: &str,
                dtype: zoo_runtime::DType,
                devices: &[zoo_runtime::Device],
            ) -> $crate::Result<$model> {
                let (config, w) =
                    $crate::models::loading::open_split(repo_or_path, dtype, devices)?;
                $model::load(&w, &$config::from_file(&config)?)
            }
        }
    };
    ($model:ident, $config:ident, stages) => {
        impl $model {
            /// The config it was built from.
            pub fn config(&self) -> &$config {
                &self.config
            }

            /// The dtype of its weights and activations.
            pub fn dtype(&self) -> zoo_runtime::DType {
                self.stages.dtype
            }

            /// The device its input goes to (the first stage's).
            pub fn device(&self) -> zoo_runtime::Device {
                self.stages.input
            }

            /// The device the prediction comes out on (the last stage's).
            pub fn output_device(&self) -> zoo_runtime::Device {
                self.stages.head
            }

            /// Every device it runs on, in execution order, each once.
            pub fn devices(&self) -> Vec<zoo_runtime::Device> {
                self.stages.order.clone()
            }
        }
    };
}

/// diffusers' `ConfigMixin` for a model config `$config` read from a `config.json` whose
/// `_class_name` is one of `$class`: `from_file` reads it, records where it came from (its
/// `path` field, for errors) and runs its `check`. With `transformer`, also the token width
/// and output channels every diffusion transformer's config computes.
macro_rules! config_mixin {
    ($config:ident, [$($class:literal),+]) => {
        impl $config {
            /// Reads and checks `config.json`.
            pub fn from_file(path: &std::path::Path) -> $crate::Result<$config> {
                let mut c: $config = $crate::models::read_model_config(path, &[$($class),+])?;
                c.path = path.to_path_buf();
                c.check()?;
                Ok(c)
            }
        }
    };
    ($config:ident, [$($class:literal),+], transformer) => {
        $crate::models::modeling::config_mixin!($config, [$($class),+]);

        impl $config {
            /// Width of the tokens: `num_attention_heads * attention_head_dim`.
            pub fn inner_dim(&self) -> usize {
                self.num_attention_heads * self.attention_head_dim
            }

            /// Output channels (`in_channels` when unset; twice that for learned-sigma
            /// models).
            pub fn out_channels(&self) -> usize {
                self.out_channels.unwrap_or(self.in_channels)
            }
        }
    };
}

pub(crate) use {config_mixin, model_mixin};
