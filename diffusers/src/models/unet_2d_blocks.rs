//! The UNets' down, mid and up blocks: mirrors diffusers' `unets/unet_2d_blocks.py`
//! (`DownBlock2D`, `CrossAttnDownBlock2D`, `AttnDownBlock2D`, `DownEncoderBlock2D`,
//! `UNetMidBlock2D`, `UNetMidBlock2DCrossAttn`, `UpBlock2D`, `CrossAttnUpBlock2D`,
//! `AttnUpBlock2D`, `UpDecoderBlock2D`).
//!
//! One struct per direction: the block types differ only in whether each ResNet is followed
//! by a transformer (cross-attention), a spatial self-attention or nothing.

use zoo_runtime::nn::Weights;
use zoo_runtime::Tensor;

use super::attention::{Attention, AttentionSpec, Transformer2DModel, Transformer2DSpec};
use super::resnet::{Downsample2D, ResnetBlock2D, ResnetSpec, TimeNorm, Upsample2D};
use super::Act;
use crate::{Error, Result};

/// The down block types zoo builds.
pub const DOWN_BLOCKS: &[&str] = &[
    "DownBlock2D",
    "CrossAttnDownBlock2D",
    "AttnDownBlock2D",
    "DownEncoderBlock2D",
];
/// The up block types zoo builds.
pub const UP_BLOCKS: &[&str] = &[
    "UpBlock2D",
    "CrossAttnUpBlock2D",
    "AttnUpBlock2D",
    "UpDecoderBlock2D",
];
/// The mid block types zoo builds.
pub const MID_BLOCKS: &[&str] = &["UNetMidBlock2DCrossAttn", "UNetMidBlock2D"];

/// What follows each ResNet of a block.
#[derive(Clone, Debug)]
pub enum Mixer {
    /// `Transformer2DModel` (the `CrossAttn*` blocks).
    Transformer(Transformer2DModel),
    /// diffusers' spatial `Attention` (the `Attn*` blocks, the VAE's mid block).
    Spatial(Attention),
}

impl Mixer {
    fn forward(&self, x: &Tensor, context: Option<&Tensor>) -> Result<Tensor> {
        match self {
            Mixer::Transformer(t) => t.forward(x, context),
            Mixer::Spatial(a) => a.forward_spatial(x),
        }
    }
}

/// What a block is built with: the arguments diffusers' `get_down_block` / `get_up_block` /
/// `get_mid_block` receive.
#[derive(Clone, Copy, Debug)]
pub struct BlockArgs {
    /// ResNets in the block.
    pub num_layers: usize,
    /// Transformer blocks per `Transformer2DModel`, one per ResNet.
    pub transformer_layers: usize,
    /// Input channels (the previous block's output for an up block's skip width).
    pub in_channels: usize,
    /// Output channels.
    pub out_channels: usize,
    /// The previous up block's output (up blocks only).
    pub prev_output_channel: usize,
    /// Width of the time embedding (`None` in the VAE).
    pub temb_channels: Option<usize>,
    /// Add a down/up sampler.
    pub resample: bool,
    /// ResNet GroupNorm epsilon.
    pub resnet_eps: f64,
    /// Nonlinearity.
    pub act: Act,
    /// GroupNorm groups.
    pub groups: usize,
    /// How ResNets take the time embedding.
    pub time_norm: TimeNorm,
    /// Width of the context.
    pub cross_attention_dim: Option<usize>,
    /// Heads of the cross-attention transformer (`num_attention_heads`, diffusers' quirk:
    /// the UNet passes `attention_head_dim` here).
    pub num_attention_heads: usize,
    /// Width of a spatial attention head (`attention_head_dim` of the `Attn*` blocks).
    pub attention_head_dim: usize,
    /// `downsample_padding`.
    pub downsample_padding: usize,
    /// Linear transformer projections.
    pub use_linear_projection: bool,
    /// `only_cross_attention`.
    pub only_cross_attention: bool,
    /// ResNet and attention output scale.
    pub output_scale_factor: f64,
    /// `resnet_skip_time_act`.
    pub skip_time_act: bool,
}

impl BlockArgs {
    fn resnet(&self, in_channels: usize, out_channels: usize) -> ResnetSpec {
        ResnetSpec {
            in_channels,
            out_channels,
            temb_channels: self.temb_channels,
            groups: self.groups,
            groups_out: None,
            eps: self.resnet_eps,
            act: self.act,
            time_norm: self.time_norm,
            output_scale_factor: self.output_scale_factor,
            skip_time_act: self.skip_time_act,
        }
    }

    fn transformer(&self, w: &Weights, channels: usize) -> Result<Mixer> {
        let heads = self.num_attention_heads;
        if heads == 0 || !channels.is_multiple_of(heads) {
            return Err(Error::Unsupported(format!(
                "{channels} channels do not split into {heads} attention heads (`attention_head_dim`)"
            )));
        }
        Ok(Mixer::Transformer(Transformer2DModel::load(
            w,
            Transformer2DSpec {
                in_channels: channels,
                heads,
                head_dim: channels / heads,
                layers: self.transformer_layers,
                cross_attention_dim: self.cross_attention_dim,
                norm_num_groups: self.groups,
                use_linear_projection: self.use_linear_projection,
                only_cross_attention: self.only_cross_attention,
            },
        )?))
    }

    fn spatial(&self, w: &Weights, channels: usize, groups: Option<usize>) -> Result<Mixer> {
        let d = self.attention_head_dim;
        if d == 0 || !channels.is_multiple_of(d) {
            return Err(Error::Unsupported(format!(
                "{channels} channels do not split into heads of {d} (`attention_head_dim`)"
            )));
        }
        Ok(Mixer::Spatial(Attention::load(
            w,
            AttentionSpec {
                query_dim: channels,
                cross_attention_dim: channels,
                heads: channels / d,
                dim_head: d,
                bias: true,
                group_norm: groups.map(|g| (g, self.resnet_eps)),
                residual_connection: true,
                rescale_output_factor: self.output_scale_factor,
            },
        )?))
    }
}

/// The mixer after each ResNet for a block kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Plain,
    CrossAttn,
    Attn,
}

fn kind_of(block_type: &str) -> Kind {
    if block_type.starts_with("CrossAttn") {
        Kind::CrossAttn
    } else if block_type.starts_with("Attn") {
        Kind::Attn
    } else {
        Kind::Plain
    }
}

fn mixers(w: &Weights, kind: Kind, a: &BlockArgs, n: usize, channels: usize) -> Result<Vec<Mixer>> {
    (0..n)
        .filter(|_| kind != Kind::Plain)
        .map(|i| {
            let aw = w.pp(format!("attentions.{i}"));
            match kind {
                Kind::CrossAttn => a.transformer(&aw, channels),
                _ => a.spatial(&aw, channels, Some(a.groups)),
            }
        })
        .collect()
}

/// A down block: ResNets (each followed by its mixer) then an optional downsampler.
#[derive(Clone, Debug)]
pub struct DownBlock {
    resnets: Vec<ResnetBlock2D>,
    mixers: Vec<Mixer>,
    downsampler: Option<Downsample2D>,
}

impl DownBlock {
    /// Builds `block_type` under `w`.
    pub fn load(w: &Weights, block_type: &str, a: &BlockArgs) -> Result<DownBlock> {
        let block_type = block_type.strip_prefix("UNetRes").unwrap_or(block_type);
        if !DOWN_BLOCKS.contains(&block_type) {
            return Err(Error::Unsupported(format!(
                "down block {block_type:?} (zoo builds {})",
                DOWN_BLOCKS.join(", ")
            )));
        }
        let resnets = (0..a.num_layers)
            .map(|i| {
                let cin = if i == 0 {
                    a.in_channels
                } else {
                    a.out_channels
                };
                ResnetBlock2D::load(&w.pp(format!("resnets.{i}")), a.resnet(cin, a.out_channels))
            })
            .collect::<Result<_>>()?;
        let downsampler = if a.resample {
            Some(Downsample2D::load(
                &w.pp("downsamplers.0"),
                a.out_channels,
                a.out_channels,
                a.downsample_padding,
            )?)
        } else {
            None
        };
        Ok(DownBlock {
            resnets,
            mixers: mixers(w, kind_of(block_type), a, a.num_layers, a.out_channels)?,
            downsampler,
        })
    }

    /// Runs the block, returning its output and the states the up blocks take as skips.
    pub fn forward(
        &self,
        x: &Tensor,
        temb: Option<&Tensor>,
        context: Option<&Tensor>,
    ) -> Result<(Tensor, Vec<Tensor>)> {
        let mut h = x.clone();
        let mut states = Vec::with_capacity(self.resnets.len() + 1);
        for (i, resnet) in self.resnets.iter().enumerate() {
            h = resnet.forward(&h, temb)?;
            if let Some(m) = self.mixers.get(i) {
                h = m.forward(&h, context)?;
            }
            states.push(h.clone());
        }
        if let Some(d) = &self.downsampler {
            h = d.forward(&h)?;
            states.push(h.clone());
        }
        Ok((h, states))
    }
}

/// A mid block: a ResNet, then (mixer, ResNet) pairs.
#[derive(Clone, Debug)]
pub struct MidBlock {
    resnets: Vec<ResnetBlock2D>,
    mixers: Vec<Mixer>,
}

impl MidBlock {
    /// Builds `UNetMidBlock2DCrossAttn` or `UNetMidBlock2D` (with `add_attention` and the
    /// attention's GroupNorm groups `attn_groups`) over `a.in_channels`.
    pub fn load(
        w: &Weights,
        block_type: &str,
        a: &BlockArgs,
        add_attention: bool,
        attn_groups: Option<usize>,
    ) -> Result<MidBlock> {
        let c = a.in_channels;
        let kind = match block_type {
            "UNetMidBlock2DCrossAttn" => Kind::CrossAttn,
            "UNetMidBlock2D" if add_attention => Kind::Attn,
            "UNetMidBlock2D" => Kind::Plain,
            other => {
                return Err(Error::Unsupported(format!(
                    "mid block {other:?} (zoo builds {})",
                    MID_BLOCKS.join(", ")
                )))
            }
        };
        let n = a.num_layers;
        let resnets = (0..=n)
            .map(|i| ResnetBlock2D::load(&w.pp(format!("resnets.{i}")), a.resnet(c, c)))
            .collect::<Result<_>>()?;
        let mixers = match kind {
            Kind::Plain => Vec::new(),
            Kind::CrossAttn => mixers(w, kind, a, n, c)?,
            Kind::Attn => (0..n)
                .map(|i| a.spatial(&w.pp(format!("attentions.{i}")), c, attn_groups))
                .collect::<Result<_>>()?,
        };
        Ok(MidBlock { resnets, mixers })
    }

    /// Runs the block.
    pub fn forward(
        &self,
        x: &Tensor,
        temb: Option<&Tensor>,
        context: Option<&Tensor>,
    ) -> Result<Tensor> {
        let mut h = self.resnets[0].forward(x, temb)?;
        for (i, resnet) in self.resnets[1..].iter().enumerate() {
            if let Some(m) = self.mixers.get(i) {
                h = m.forward(&h, context)?;
            }
            h = resnet.forward(&h, temb)?;
        }
        Ok(h)
    }
}

/// An up block: ResNets over the input concatenated with a skip (none in the VAE's
/// decoder), each followed by its mixer, then an optional upsampler.
#[derive(Clone, Debug)]
pub struct UpBlock {
    resnets: Vec<ResnetBlock2D>,
    mixers: Vec<Mixer>,
    upsampler: Option<Upsample2D>,
    takes_skips: bool,
}

impl UpBlock {
    /// Builds `block_type` under `w`.
    pub fn load(w: &Weights, block_type: &str, a: &BlockArgs) -> Result<UpBlock> {
        let block_type = block_type.strip_prefix("UNetRes").unwrap_or(block_type);
        if !UP_BLOCKS.contains(&block_type) {
            return Err(Error::Unsupported(format!(
                "up block {block_type:?} (zoo builds {})",
                UP_BLOCKS.join(", ")
            )));
        }
        let takes_skips = block_type != "UpDecoderBlock2D";
        let n = a.num_layers;
        let resnets = (0..n)
            .map(|i| {
                let cin = if takes_skips {
                    let skip = if i == n - 1 {
                        a.in_channels
                    } else {
                        a.out_channels
                    };
                    let prev = if i == 0 {
                        a.prev_output_channel
                    } else {
                        a.out_channels
                    };
                    prev + skip
                } else if i == 0 {
                    a.in_channels
                } else {
                    a.out_channels
                };
                ResnetBlock2D::load(&w.pp(format!("resnets.{i}")), a.resnet(cin, a.out_channels))
            })
            .collect::<Result<_>>()?;
        let upsampler = if a.resample {
            Some(Upsample2D::load(
                &w.pp("upsamplers.0"),
                a.out_channels,
                a.out_channels,
            )?)
        } else {
            None
        };
        Ok(UpBlock {
            resnets,
            mixers: mixers(w, kind_of(block_type), a, n, a.out_channels)?,
            upsampler,
            takes_skips,
        })
    }

    /// ResNets in the block: how many skips it takes.
    pub fn len(&self) -> usize {
        self.resnets.len()
    }

    /// Whether the block has no ResNets.
    pub fn is_empty(&self) -> bool {
        self.resnets.is_empty()
    }

    /// Runs the block; `skips` are taken from the end, as diffusers pops them.
    pub fn forward(
        &self,
        x: &Tensor,
        skips: &[Tensor],
        temb: Option<&Tensor>,
        context: Option<&Tensor>,
        upsample_size: Option<(usize, usize)>,
    ) -> Result<Tensor> {
        let mut h = x.clone();
        let mut skips = skips.iter().rev();
        for (i, resnet) in self.resnets.iter().enumerate() {
            if self.takes_skips {
                let skip = skips.next().ok_or_else(|| {
                    Error::Shape("an up block ran out of skip connections".into())
                })?;
                h = Tensor::cat(&[&h, skip], 1)?;
            }
            h = resnet.forward(&h, temb)?;
            if let Some(m) = self.mixers.get(i) {
                h = m.forward(&h, context)?;
            }
        }
        if let Some(u) = &self.upsampler {
            h = u.forward(&h, upsample_size)?;
        }
        Ok(h)
    }
}
