//! Diffusion models, mirroring diffusers' `models/`: the UNets (`unet_2d_condition.rs`,
//! `unet_2d.rs`), the diffusion transformers (`transformer_dit.rs`, `transformer_pixart.rs`,
//! `transformer_sd3.rs`, `transformer_flux.rs`),
//! the KL autoencoder (`autoencoder_kl.rs`) and the blocks they share (`resnet.rs`,
//! `attention.rs`, `joint_attention.rs`, `normalization.rs`, `embeddings.rs`,
//! `unet_2d_blocks.rs`).
//!
//! Every model is built from its `config.json` as diffusers' `from_config` builds it; the
//! weights keep diffusers' names (`down_blocks.0.attentions.1.transformer_blocks.0.attn2.to_k`).

pub mod attention;
pub mod autoencoder_kl;
pub mod embeddings;
pub mod joint_attention;
pub(crate) mod loading;
pub(crate) mod modeling;
pub mod normalization;
pub mod resnet;
pub mod transformer_dit;
pub mod transformer_flux;
pub mod transformer_pixart;
pub mod transformer_sd3;
pub mod unet_2d;
pub mod unet_2d_blocks;
pub mod unet_2d_condition;

use std::path::Path;

use serde::de::DeserializeOwned;
use serde_json::Value;
use zoo_runtime::nn::Weights;
use zoo_runtime::{Activation, DType, Device, Tensor};

use crate::{Error, Result};

/// A diffusers activation name (`get_activation`: `silu`/`swish`, `mish`, `gelu`, `relu`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Act {
    /// One of the runtime's activations.
    Runtime(Activation),
    /// `x * tanh(softplus(x))`, with PyTorch's softplus threshold of 20.
    Mish,
}

impl Act {
    /// Reads `name` as diffusers' `get_activation` does (case-insensitive).
    pub fn from_diffusers(name: &str) -> std::result::Result<Act, String> {
        match name.to_ascii_lowercase().as_str() {
            "silu" | "swish" => Ok(Act::Runtime(Activation::Silu)),
            "gelu" => Ok(Act::Runtime(Activation::Gelu)),
            "relu" => Ok(Act::Runtime(Activation::Relu)),
            "mish" => Ok(Act::Mish),
            other => Err(format!(
                "activation {other:?} is not one diffusers knows (silu, swish, mish, gelu, relu)"
            )),
        }
    }

    /// Applies the activation.
    pub fn apply(&self, x: &Tensor) -> zoo_runtime::Result<Tensor> {
        match self {
            Act::Runtime(a) => a.apply(x),
            Act::Mish => {
                let softplus = x.exp()?.add_scalar(1.0)?.log()?;
                let big = x.cmp_scalar(">", 20.0)?;
                let sp = big.where_cond(x, &softplus)?;
                x.mul(&sp.tanh()?)
            }
        }
    }
}

/// A config field diffusers accepts as one value or one per block
/// (`attention_head_dim`, `layers_per_block`, `cross_attention_dim`, ...).
pub(crate) fn per_block<T: DeserializeOwned + Clone>(
    value: &Value,
    blocks: usize,
    field: &str,
    path: &Path,
) -> Result<Vec<T>> {
    let bad = |reason: String| Error::Config {
        path: path.to_path_buf(),
        reason: format!("`{field}`: {reason}"),
    };
    if let Value::Array(items) = value {
        if items.len() != blocks {
            return Err(bad(format!(
                "has {} entries but there are {blocks} down blocks; give one per block or a single value",
                items.len()
            )));
        }
        items
            .iter()
            .map(|v| serde_json::from_value(v.clone()).map_err(|e| bad(e.to_string())))
            .collect()
    } else {
        let one: T = serde_json::from_value(value.clone()).map_err(|e| bad(e.to_string()))?;
        Ok(vec![one; blocks])
    }
}

/// Reads a component's `config.json` (checking `_class_name` when it is there).
pub(crate) fn read_config<T: DeserializeOwned>(
    path: &Path,
    class_names: &[&str],
) -> Result<(T, Value)> {
    let bad = |reason: String| Error::Config {
        path: path.to_path_buf(),
        reason,
    };
    let bytes = std::fs::read(path).map_err(|e| bad(format!("cannot read it: {e}")))?;
    let value: Value =
        serde_json::from_slice(&bytes).map_err(|e| bad(format!("not valid JSON: {e}")))?;
    if let Some(class) = value.get("_class_name").and_then(Value::as_str) {
        if !class_names.contains(&class) {
            return Err(bad(format!(
                "`_class_name` is {class:?}, but this loader reads {}",
                class_names.join(" / ")
            )));
        }
    }
    let config = serde_json::from_value(value.clone()).map_err(|e| bad(e.to_string()))?;
    Ok((config, value))
}

/// A model's config read by [`read_config`], refusing a generic `Transformer2DModel` that
/// does not say which patch transformer it is: what every model config's `from_file` reads.
pub(crate) fn read_model_config<T: DeserializeOwned>(
    path: &Path,
    class_names: &[&str],
) -> Result<T> {
    let (config, value) = read_config(path, class_names)?;
    // A generic `Transformer2DModel` defaults to another norm: only an explicit `norm_type`
    // makes it DiT's or PixArt's (diffusers' class remapping reads the same field).
    if value.get("_class_name").and_then(Value::as_str) == Some("Transformer2DModel")
        && value.get("norm_type").is_none()
    {
        return Err(Error::Config {
            path: path.to_path_buf(),
            reason: "a Transformer2DModel config without `norm_type` is not a patch diffusion transformer (DiT has \"ada_norm_zero\", PixArt \"ada_norm_single\")".into(),
        });
    }
    Ok(config)
}

/// Fails with a config error when `cond` is false.
pub(crate) fn ensure(cond: bool, path: &Path, reason: impl FnOnce() -> String) -> Result<()> {
    if cond {
        Ok(())
    } else {
        Err(Error::Config {
            path: path.to_path_buf(),
            reason: reason(),
        })
    }
}

/// `(height, width)` of a `sample_size` given as one side or `[height, width]`, `default`
/// on both sides when the config has none.
pub(crate) fn sample_size(value: Option<&Value>, default: usize) -> (usize, usize) {
    let side = |v: &Value| v.as_u64().map_or(default, |x| x as usize);
    match value {
        Some(Value::Array(a)) if a.len() == 2 => (side(&a[0]), side(&a[1])),
        Some(v) if !v.is_null() => (side(v), side(v)),
        _ => (default, default),
    }
}

/// Every `block_out_channels` entry must be positive and split into `norm_num_groups` groups.
pub(crate) fn check_groups(channels: &[usize], groups: usize, path: &Path) -> Result<()> {
    for (i, &c) in channels.iter().enumerate() {
        ensure(
            c > 0 && groups > 0 && c.is_multiple_of(groups),
            path,
            || {
                format!("`block_out_channels[{i}]` = {c} is not divisible by `norm_num_groups` = {groups}")
            },
        )?;
    }
    Ok(())
}

/// `first`, then every device of `rest` not seen yet: a split model's devices in execution
/// order, each once.
pub(crate) fn devices_in_order<'a>(
    first: zoo_runtime::Device,
    rest: impl IntoIterator<Item = &'a zoo_runtime::Device>,
) -> Vec<zoo_runtime::Device> {
    let mut all = vec![first];
    for d in rest {
        if !all.contains(d) {
            all.push(*d);
        }
    }
    all
}

/// The shape checks every patch transformer's config passes: positive patch size, heads,
/// head width, channels and layers, and a token width the 2-D sin-cos positions split in 4.
pub(crate) fn check_patch_transformer(
    path: &Path,
    patch_size: usize,
    heads: usize,
    head_dim: usize,
    in_channels: usize,
    layers: usize,
) -> Result<()> {
    ensure(
        patch_size > 0 && heads > 0 && head_dim > 0 && in_channels > 0 && layers > 0,
        path,
        || {
            "`patch_size`, `num_attention_heads`, `attention_head_dim`, `in_channels` and `num_layers` must be positive".into()
        },
    )?;
    let dim = heads * head_dim;
    ensure(dim.is_multiple_of(4), path, || {
        format!("the token width {dim} must be divisible by 4 for the 2-D sin-cos positions")
    })
}

/// Where each stage of a split UNet runs (`UNet2DConditionModel` and `UNet2DModel` share
/// diffusers' block names): one device for all unless the weights were placed over several.
#[derive(Clone, Debug)]
pub(crate) struct BlockDevices {
    pub down: Vec<Device>,
    pub mid: Device,
    pub up: Vec<Device>,
    /// `conv_norm_out` and `conv_out`.
    pub head: Device,
}

impl BlockDevices {
    /// The devices the weights under `w` place a UNet of `blocks` down and up blocks on.
    pub fn of(w: &Weights, blocks: usize) -> BlockDevices {
        let each = |kind: &str| {
            (0..blocks)
                .map(|i| w.pp(format!("{kind}.{i}")).device())
                .collect()
        };
        BlockDevices {
            down: each("down_blocks"),
            mid: w.pp("mid_block").device(),
            up: each("up_blocks"),
            head: w.pp("conv_out").device(),
        }
    }

    /// The stages of a UNet whose stem runs on `input`: the down blocks, the mid block and
    /// the up blocks, then the head.
    pub fn stages(&self, input: Device, dtype: DType) -> modeling::Stages {
        let blocks = self.down.iter().chain([&self.mid]).chain(&self.up);
        modeling::Stages::new(input, blocks, self.head, dtype)
    }
}

/// `t` on device `d` (a copy only when it lives elsewhere).
pub(crate) fn on(t: &Tensor, d: zoo_runtime::Device) -> Result<Tensor> {
    Ok(if t.device() == d {
        t.clone()
    } else {
        t.to_device(&d)?
    })
}

/// The skips an up block of `n` ResNets takes (fewer when fewer are left), popped off the
/// end of `skips` and moved to its device `d`.
pub(crate) fn pop_skips(skips: &mut Vec<Tensor>, n: usize, d: Device) -> Result<Vec<Tensor>> {
    let take = n.min(skips.len());
    skips
        .split_off(skips.len() - take)
        .iter()
        .map(|s| on(s, d))
        .collect()
}

/// `(batch, height, width)` of `[B, channels, H, W]` latents whose sides `patch` divides.
pub(crate) fn check_latents(
    latents: &Tensor,
    channels: usize,
    patch: usize,
) -> Result<(usize, usize, usize)> {
    match latents.shape()[..] {
        [b, ch, h, w]
            if ch == channels && h.is_multiple_of(patch) && w.is_multiple_of(patch) =>
        {
            Ok((b, h, w))
        }
        _ => Err(Error::Shape(format!(
            "the latents {:?} must be [batch, {channels}, height, width] with sides divisible by patch_size {patch}",
            latents.shape()
        ))),
    }
}

/// One value per sample of a batch of `b` from `t` holding one or `b` values.
pub(crate) fn per_sample(t: &Tensor, b: usize, what: &str) -> Result<Tensor> {
    match t.elem_count() {
        1 => Ok(t.reshape_to(&[1])?.broadcast_as(&[b])?),
        n if n == b => Ok(t.reshape_to(&[b])?),
        n => Err(Error::Shape(format!(
            "{n} {what} for a batch of {b}: pass one per sample or one for all"
        ))),
    }
}

/// Patch tokens `[B, (H/p)(W/p), p * p * C]` back to `[B, C, H, W]` (diffusers' einsum
/// `nhwpqc -> nchpwq`).
pub(crate) fn unpatchify(
    x: &Tensor,
    b: usize,
    height: usize,
    width: usize,
    p: usize,
    channels: usize,
) -> Result<Tensor> {
    let (gh, gw) = (height / p, width / p);
    Ok(x.reshape_to(&[b, gh, gw, p, p, channels])?
        .permute(&[0, 5, 1, 3, 2, 4])?
        .reshape_to(&[b, channels, height, width])?)
}
