//! `AutoencoderKL`: mirrors diffusers' `autoencoders/autoencoder_kl.py` and `vae.py`
//! (`Encoder`, `Decoder`, `DiagonalGaussianDistribution`), built from its `config.json`.
//!
//! Images in `[-1, 1]` encode to the mean and log-variance of a diagonal Gaussian over the
//! latents; latents decode back to images. Pipelines scale latents by `scaling_factor` (and
//! shift them by `shift_factor`) around the model, as diffusers' pipelines do. Tiled decode
//! and encode split large inputs into overlapping tiles blended linearly, as diffusers'
//! `enable_tiling` does.

use std::path::PathBuf;

use serde_json::Value;
use zoo_runtime::nn::{Conv2d, GroupNorm, Weights};
use zoo_runtime::{ConvParams, DType, Device, Tensor};

use super::modeling::{config_mixin, model_mixin};
use super::resnet::TimeNorm;
use super::unet_2d_blocks::{BlockArgs, DownBlock, MidBlock, UpBlock};
use super::{ensure, Act};
use crate::configuration::register_to_config;
use crate::{Error, Result};

register_to_config! {
    /// `config.json` of an `AutoencoderKL`, with the defaults of diffusers' `__init__` (a
    /// one-block VAE).
    #[allow(missing_docs)]
    pub struct AutoencoderKLConfig {
        pub in_channels: usize = 3,
        pub out_channels: usize = 3,
        pub down_block_types: Vec<String> = vec!["DownEncoderBlock2D".into()],
        pub up_block_types: Vec<String> = vec!["UpDecoderBlock2D".into()],
        pub block_out_channels: Vec<usize> = vec![64],
        pub layers_per_block: usize = 1,
        pub act_fn: String = "silu".into(),
        pub latent_channels: usize = 4,
        pub norm_num_groups: usize = 32,
        pub sample_size: Value = Value::from(32),
        /// Latents the UNet sees are `scaling_factor * (z - shift_factor)`.
        pub scaling_factor: f64 = 0.18215,
        pub shift_factor: Option<f64> = None,
        pub latents_mean: Option<Vec<f64>> = None,
        pub latents_std: Option<Vec<f64>> = None,
        /// The VAE overflows in float16: pipelines run it in float32 (`force_upcast`).
        pub force_upcast: bool = true,
        pub use_quant_conv: bool = true,
        pub use_post_quant_conv: bool = true,
        pub mid_block_add_attention: bool = true,
        /// The file, for errors.
        #[serde(skip)]
        pub path: PathBuf = PathBuf::new(),
    }
}

config_mixin!(AutoencoderKLConfig, ["AutoencoderKL"]);

impl AutoencoderKLConfig {
    fn check(&self) -> Result<()> {
        let p = &self.path;
        let n = self.block_out_channels.len();
        ensure(n > 0, p, || "`block_out_channels` is empty".into())?;
        ensure(
            self.down_block_types.len() == n && self.up_block_types.len() == n,
            p,
            || {
                format!(
                    "{} down and {} up block types for {n} `block_out_channels`",
                    self.down_block_types.len(),
                    self.up_block_types.len()
                )
            },
        )?;
        super::check_groups(&self.block_out_channels, self.norm_num_groups, p)?;
        ensure(self.scaling_factor > 0.0, p, || {
            format!(
                "`scaling_factor` must be positive, got {}",
                self.scaling_factor
            )
        })?;
        Act::from_diffusers(&self.act_fn).map_err(|e| Error::Config {
            path: p.clone(),
            reason: format!("`act_fn`: {e}"),
        })?;
        Ok(())
    }

    /// How many pixels one latent covers along each side: `2^(blocks - 1)`, diffusers'
    /// `vae_scale_factor`.
    pub fn scale_factor(&self) -> usize {
        1 << self.block_out_channels.len().saturating_sub(1)
    }

    /// The tile side of tiled encode/decode, in pixels (`sample_size`).
    pub fn tile_sample_size(&self) -> usize {
        // diffusers tiles squares of the first side.
        super::sample_size(Some(&self.sample_size), 512).0
    }
}

/// `Encoder` of the VAE.
#[derive(Clone, Debug)]
struct Encoder {
    conv_in: Conv2d,
    down_blocks: Vec<DownBlock>,
    mid_block: MidBlock,
    conv_norm_out: GroupNorm,
    conv_out: Conv2d,
    act: Act,
}

/// `Decoder` of the VAE.
#[derive(Clone, Debug)]
struct Decoder {
    conv_in: Conv2d,
    mid_block: MidBlock,
    up_blocks: Vec<UpBlock>,
    conv_norm_out: GroupNorm,
    conv_out: Conv2d,
    act: Act,
}

fn conv(w: &Weights, i: usize, o: usize, k: usize) -> Result<Conv2d> {
    let p = ConvParams {
        padding: (k - 1) / 2,
        ..Default::default()
    };
    Ok(Conv2d::load(w, i, o, k, p, true)?)
}

fn block_args(c: &AutoencoderKLConfig, act: Act) -> BlockArgs {
    BlockArgs {
        num_layers: c.layers_per_block,
        transformer_layers: 0,
        in_channels: 0,
        out_channels: 0,
        prev_output_channel: 0,
        temb_channels: None,
        resample: false,
        resnet_eps: 1e-6,
        act,
        groups: c.norm_num_groups,
        time_norm: TimeNorm::Default,
        cross_attention_dim: None,
        num_attention_heads: 1,
        attention_head_dim: 0,
        downsample_padding: 0,
        use_linear_projection: false,
        only_cross_attention: false,
        output_scale_factor: 1.0,
        skip_time_act: false,
    }
}

fn mid(w: &Weights, c: &AutoencoderKLConfig, act: Act) -> Result<MidBlock> {
    let last = *c.block_out_channels.last().unwrap_or(&1);
    let a = BlockArgs {
        num_layers: 1,
        in_channels: last,
        out_channels: last,
        attention_head_dim: last,
        ..block_args(c, act)
    };
    MidBlock::load(
        w,
        "UNetMidBlock2D",
        &a,
        c.mid_block_add_attention,
        Some(c.norm_num_groups),
    )
}

impl Encoder {
    fn load(w: &Weights, c: &AutoencoderKLConfig, act: Act) -> Result<Encoder> {
        let ch = &c.block_out_channels;
        let n = ch.len();
        let mut down_blocks = Vec::with_capacity(n);
        let mut out = ch[0];
        for (i, ty) in c.down_block_types.iter().enumerate() {
            let input = out;
            out = ch[i];
            let a = BlockArgs {
                in_channels: input,
                out_channels: out,
                resample: i + 1 < n,
                attention_head_dim: out,
                ..block_args(c, act)
            };
            down_blocks.push(DownBlock::load(&w.pp(format!("down_blocks.{i}")), ty, &a)?);
        }
        Ok(Encoder {
            conv_in: conv(&w.pp("conv_in"), c.in_channels, ch[0], 3)?,
            down_blocks,
            mid_block: mid(&w.pp("mid_block"), c, act)?,
            conv_norm_out: GroupNorm::load(
                &w.pp("conv_norm_out"),
                c.norm_num_groups,
                ch[n - 1],
                1e-6,
            )?,
            conv_out: conv(&w.pp("conv_out"), ch[n - 1], 2 * c.latent_channels, 3)?,
            act,
        })
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut h = self.conv_in.forward(x)?;
        for block in &self.down_blocks {
            h = block.forward(&h, None, None)?.0;
        }
        h = self.mid_block.forward(&h, None, None)?;
        let h = self.act.apply(&self.conv_norm_out.forward(&h)?)?;
        Ok(self.conv_out.forward(&h)?)
    }
}

impl Decoder {
    fn load(w: &Weights, c: &AutoencoderKLConfig, act: Act) -> Result<Decoder> {
        let ch = &c.block_out_channels;
        let n = ch.len();
        let mut up_blocks = Vec::with_capacity(n);
        let mut out = ch[n - 1];
        for (i, ty) in c.up_block_types.iter().enumerate() {
            let prev = out;
            out = ch[n - 1 - i];
            let a = BlockArgs {
                num_layers: c.layers_per_block + 1,
                in_channels: prev,
                out_channels: out,
                prev_output_channel: prev,
                resample: i + 1 < n,
                attention_head_dim: out,
                ..block_args(c, act)
            };
            up_blocks.push(UpBlock::load(&w.pp(format!("up_blocks.{i}")), ty, &a)?);
        }
        Ok(Decoder {
            conv_in: conv(&w.pp("conv_in"), c.latent_channels, ch[n - 1], 3)?,
            mid_block: mid(&w.pp("mid_block"), c, act)?,
            up_blocks,
            conv_norm_out: GroupNorm::load(&w.pp("conv_norm_out"), c.norm_num_groups, ch[0], 1e-6)?,
            conv_out: conv(&w.pp("conv_out"), ch[0], c.out_channels, 3)?,
            act,
        })
    }

    fn forward(&self, z: &Tensor) -> Result<Tensor> {
        let mut h = self.conv_in.forward(z)?;
        h = self.mid_block.forward(&h, None, None)?;
        for block in &self.up_blocks {
            h = block.forward(&h, &[], None, None, None)?;
        }
        let h = self.act.apply(&self.conv_norm_out.forward(&h)?)?;
        Ok(self.conv_out.forward(&h)?)
    }
}

/// The encoder's output: a diagonal Gaussian over the latents
/// (`DiagonalGaussianDistribution`).
#[derive(Clone, Debug)]
pub struct DiagonalGaussian {
    /// `[B, latent_channels, h, w]`.
    pub mean: Tensor,
    /// Log-variance, clamped to `[-30, 20]` as diffusers clamps it.
    pub logvar: Tensor,
}

impl DiagonalGaussian {
    fn from_moments(moments: &Tensor) -> Result<DiagonalGaussian> {
        let parts = moments.chunk(2, 1)?;
        Ok(DiagonalGaussian {
            mean: parts[0].clone(),
            logvar: parts[1].clamp(-30.0, 20.0)?,
        })
    }

    /// The standard deviation `exp(logvar / 2)`.
    pub fn std(&self) -> Result<Tensor> {
        Ok(self.logvar.mul_scalar(0.5)?.exp()?)
    }

    /// A draw `mean + std * noise` with `noise` standard normal of the mean's shape (the
    /// caller draws it, so a seed gives the same latents on every backend).
    pub fn sample(&self, noise: &Tensor) -> Result<Tensor> {
        let noise = noise
            .to_device(&self.mean.device())?
            .to_dtype(self.mean.dtype())?;
        Ok(self.mean.add(&self.std()?.mul(&noise)?)?)
    }

    /// The mode (the mean).
    pub fn mode(&self) -> &Tensor {
        &self.mean
    }
}

/// `AutoencoderKL`.
#[derive(Clone, Debug)]
pub struct AutoencoderKL {
    encoder: Option<Encoder>,
    decoder: Decoder,
    quant_conv: Option<Conv2d>,
    post_quant_conv: Option<Conv2d>,
    config: AutoencoderKLConfig,
    dtype: DType,
    device: Device,
    /// Decode (and encode) in overlapping tiles above the tile size (`enable_tiling`).
    pub tiling: bool,
}

model_mixin!(AutoencoderKL, AutoencoderKLConfig);

impl AutoencoderKL {
    /// Builds the VAE of `config` from the weights under `w`. A checkpoint without the
    /// encoder (decode-only VAEs) loads; encoding then fails with a typed error.
    pub fn load(w: &Weights, config: &AutoencoderKLConfig) -> Result<AutoencoderKL> {
        let c = config;
        c.check()?;
        let act = Act::from_diffusers(&c.act_fn).map_err(Error::Unsupported)?;
        let l = c.latent_channels;
        let encoder = if w.contains("encoder.conv_in.weight") {
            Some(Encoder::load(&w.pp("encoder"), c, act)?)
        } else {
            None
        };
        let quant_conv = if c.use_quant_conv && encoder.is_some() {
            Some(conv(&w.pp("quant_conv"), 2 * l, 2 * l, 1)?)
        } else {
            None
        };
        let post_quant_conv = if c.use_post_quant_conv {
            Some(conv(&w.pp("post_quant_conv"), l, l, 1)?)
        } else {
            None
        };
        let decoder = Decoder::load(&w.pp("decoder"), c, act)?;
        let device = decoder.conv_in.weight.device();
        Ok(AutoencoderKL {
            encoder,
            decoder,
            quant_conv,
            post_quant_conv,
            config: c.clone(),
            dtype: w.dtype(),
            device,
            tiling: false,
        })
    }

    /// The config the model was built from.
    pub fn config(&self) -> &AutoencoderKLConfig {
        &self.config
    }

    /// The dtype of weights and activations.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The device the model runs on.
    pub fn device(&self) -> Device {
        self.device
    }

    fn check_input(&self, x: &Tensor, channels: usize, what: &str) -> Result<()> {
        match x.shape() {
            [_, c, h, w] if *c == channels && *h > 0 && *w > 0 => Ok(()),
            s => Err(Error::Shape(format!(
                "{what} must be [batch, {channels}, height, width], got {s:?}"
            ))),
        }
    }

    fn encode_moments(&self, x: &Tensor) -> Result<Tensor> {
        let enc = self.encoder.as_ref().ok_or_else(|| {
            Error::Unsupported("this VAE checkpoint has no encoder weights (encoder.*)".into())
        })?;
        let h = enc.forward(x)?;
        Ok(match &self.quant_conv {
            Some(q) => q.forward(&h)?,
            None => h,
        })
    }

    fn decode_tile(&self, z: &Tensor) -> Result<Tensor> {
        let z = match &self.post_quant_conv {
            Some(p) => p.forward(z)?,
            None => z.clone(),
        };
        self.decoder.forward(&z)
    }

    /// Encodes images `[B, in_channels, H, W]` in `[-1, 1]`.
    pub fn encode(&self, images: &Tensor) -> Result<DiagonalGaussian> {
        self.check_input(images, self.config.in_channels, "the image")?;
        let x = images.to_device(&self.device)?.to_dtype(self.dtype)?;
        let tile = self.config.tile_sample_size();
        let (h, w) = (x.shape()[2], x.shape()[3]);
        let moments = if self.tiling && (h > tile || w > tile) {
            let latent_tile = tile / self.config.scale_factor();
            tiled(&x, tile, latent_tile, |t| self.encode_moments(t))?
        } else {
            self.encode_moments(&x)?
        };
        DiagonalGaussian::from_moments(&moments)
    }

    /// Decodes latents `[B, latent_channels, h, w]` (already divided by `scaling_factor`)
    /// to images in about `[-1, 1]`.
    pub fn decode(&self, latents: &Tensor) -> Result<Tensor> {
        self.check_input(latents, self.config.latent_channels, "the latents")?;
        let z = latents.to_device(&self.device)?.to_dtype(self.dtype)?;
        let tile = self.config.tile_sample_size();
        let latent_tile = tile / self.config.scale_factor();
        let (h, w) = (z.shape()[2], z.shape()[3]);
        if self.tiling && (h > latent_tile || w > latent_tile) {
            tiled(&z, latent_tile, tile, |t| self.decode_tile(t))
        } else {
            self.decode_tile(&z)
        }
    }
}

/// diffusers' tiled encode/decode: tiles of `tile_in` every `tile_in * 3/4`, each mapped by
/// `f` to `tile_out`, blended over `tile_out / 4` rows and columns with the previous tile,
/// and cropped to `tile_out - blend` before concatenation.
fn tiled(
    x: &Tensor,
    tile_in: usize,
    tile_out: usize,
    f: impl Fn(&Tensor) -> Result<Tensor>,
) -> Result<Tensor> {
    let overlap = ((tile_in as f64) * 0.75) as usize;
    let blend = ((tile_out as f64) * 0.25) as usize;
    let limit = tile_out - blend;
    let (h, w) = (x.shape()[2], x.shape()[3]);
    let mut rows: Vec<Vec<Tensor>> = Vec::new();
    for i in (0..h).step_by(overlap.max(1)) {
        let mut row = Vec::new();
        for j in (0..w).step_by(overlap.max(1)) {
            let t = x
                .narrow(2, i, tile_in.min(h - i))?
                .narrow(3, j, tile_in.min(w - j))?;
            row.push(f(&t)?);
        }
        rows.push(row);
    }
    let mut out_rows = Vec::with_capacity(rows.len());
    for i in 0..rows.len() {
        let mut parts = Vec::with_capacity(rows[i].len());
        for j in 0..rows[i].len() {
            let mut t = rows[i][j].clone();
            if i > 0 {
                t = blend_axis(&rows[i - 1][j], &t, blend, 2)?;
            }
            if j > 0 {
                t = blend_axis(&rows[i][j - 1], &t, blend, 3)?;
            }
            // Later tiles blend against the blended tiles, as diffusers' in-place blend does.
            rows[i][j] = t.clone();
            let th = t.shape()[2].min(limit);
            let tw = t.shape()[3].min(limit);
            parts.push(t.narrow(2, 0, th)?.narrow(3, 0, tw)?);
        }
        let refs: Vec<&Tensor> = parts.iter().collect();
        out_rows.push(Tensor::cat(&refs, 3)?);
    }
    let refs: Vec<&Tensor> = out_rows.iter().collect();
    Ok(Tensor::cat(&refs, 2)?)
}

/// Blends the first `extent` rows (axis 2) or columns (axis 3) of `b` with the last of `a`:
/// `a * (1 - y / extent) + b * (y / extent)`.
fn blend_axis(a: &Tensor, b: &Tensor, extent: usize, axis: isize) -> Result<Tensor> {
    let ax = axis as usize;
    let extent = extent.min(a.shape()[ax]).min(b.shape()[ax]);
    if extent == 0 {
        return Ok(b.clone());
    }
    let weights: Vec<f32> = (0..extent)
        .map(|y| (y as f64 / extent as f64) as f32)
        .collect();
    let mut shape = vec![1usize; 4];
    shape[ax] = extent;
    let wb = Tensor::from_vec(weights, &shape, &b.device())?.to_dtype(b.dtype())?;
    let head_a = a.narrow(axis, a.shape()[ax] - extent, extent)?;
    let head_b = b.narrow(axis, 0, extent)?;
    let mixed = head_a.mul(&wb.affine(-1.0, 1.0)?)?.add(&head_b.mul(&wb)?)?;
    let rest = b.narrow(axis, extent, b.shape()[ax] - extent)?;
    Ok(Tensor::cat(&[&mixed, &rest], axis)?)
}
