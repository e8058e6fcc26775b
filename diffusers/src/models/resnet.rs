//! ResNet blocks and resampling: mirrors diffusers' `models/resnet.py` (`ResnetBlock2D`),
//! `downsampling.py` (`Downsample2D`) and `upsampling.py` (`Upsample2D`).

use zoo_runtime::nn::{Conv2d, GroupNorm, Linear, Weights};
use zoo_runtime::{ConvParams, Tensor};

use super::Act;
use crate::Result;

/// How a ResNet block takes the time embedding (`resnet_time_scale_shift`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimeNorm {
    /// `"default"`: added before `norm2`.
    Default,
    /// `"scale_shift"`: `norm2(h) * (1 + scale) + shift`.
    ScaleShift,
}

impl TimeNorm {
    /// Reads `resnet_time_scale_shift`.
    pub fn parse(s: &str) -> std::result::Result<TimeNorm, String> {
        match s {
            "default" => Ok(TimeNorm::Default),
            "scale_shift" => Ok(TimeNorm::ScaleShift),
            other => Err(format!(
                "`resnet_time_scale_shift` {other:?} is not supported (default, scale_shift)"
            )),
        }
    }
}

/// What a ResNet block is built from.
#[derive(Clone, Copy, Debug)]
pub struct ResnetSpec {
    /// Input channels.
    pub in_channels: usize,
    /// Output channels.
    pub out_channels: usize,
    /// Width of the time embedding, `None` in the VAE.
    pub temb_channels: Option<usize>,
    /// GroupNorm groups of `norm1` (and of `norm2` unless `groups_out`).
    pub groups: usize,
    /// GroupNorm groups of `norm2`.
    pub groups_out: Option<usize>,
    /// GroupNorm epsilon.
    pub eps: f64,
    /// The nonlinearity.
    pub act: Act,
    /// How the time embedding enters.
    pub time_norm: TimeNorm,
    /// The output is divided by this (`output_scale_factor`).
    pub output_scale_factor: f64,
    /// Skip the activation on the time embedding (`resnet_skip_time_act`).
    pub skip_time_act: bool,
}

/// `ResnetBlock2D`.
#[derive(Clone, Debug)]
pub struct ResnetBlock2D {
    norm1: GroupNorm,
    conv1: Conv2d,
    time_emb_proj: Option<Linear>,
    norm2: GroupNorm,
    conv2: Conv2d,
    conv_shortcut: Option<Conv2d>,
    spec: ResnetSpec,
}

fn conv3(w: &Weights, i: usize, o: usize) -> Result<Conv2d> {
    let p = ConvParams {
        padding: 1,
        ..Default::default()
    };
    Ok(Conv2d::load(w, i, o, 3, p, true)?)
}

impl ResnetBlock2D {
    /// Loads the block under `w`.
    pub fn load(w: &Weights, s: ResnetSpec) -> Result<ResnetBlock2D> {
        let (i, o) = (s.in_channels, s.out_channels);
        let time_emb_proj = match s.temb_channels {
            Some(t) => {
                let width = match s.time_norm {
                    TimeNorm::Default => o,
                    TimeNorm::ScaleShift => 2 * o,
                };
                Some(Linear::load(&w.pp("time_emb_proj"), t, width, true)?)
            }
            None => None,
        };
        let conv_shortcut = if i != o {
            let cw = w.pp("conv_shortcut");
            let bias = cw.contains("bias");
            Some(Conv2d::load(&cw, i, o, 1, ConvParams::default(), bias)?)
        } else {
            None
        };
        Ok(ResnetBlock2D {
            norm1: GroupNorm::load(&w.pp("norm1"), s.groups, i, s.eps)?,
            conv1: conv3(&w.pp("conv1"), i, o)?,
            time_emb_proj,
            norm2: GroupNorm::load(&w.pp("norm2"), s.groups_out.unwrap_or(s.groups), o, s.eps)?,
            conv2: conv3(&w.pp("conv2"), o, o)?,
            conv_shortcut,
            spec: s,
        })
    }

    /// Applies the block to `x [N, in, H, W]` with the time embedding `temb [N, temb]`.
    pub fn forward(&self, x: &Tensor, temb: Option<&Tensor>) -> Result<Tensor> {
        let act = &self.spec.act;
        let mut h = act.apply(&self.norm1.forward(x)?)?;
        h = self.conv1.forward(&h)?;
        let temb = match (&self.time_emb_proj, temb) {
            (Some(proj), Some(t)) => {
                let t = if self.spec.skip_time_act {
                    t.clone()
                } else {
                    act.apply(t)?
                };
                Some(proj.forward(&t)?.unsqueeze(-1)?.unsqueeze(-1)?)
            }
            _ => None,
        };
        h = match (self.spec.time_norm, temb) {
            (TimeNorm::Default, Some(t)) => self.norm2.forward(&h.add(&t)?)?,
            (TimeNorm::ScaleShift, Some(t)) => {
                let parts = t.chunk(2, 1)?;
                self.norm2
                    .forward(&h)?
                    .mul(&parts[0].add_scalar(1.0)?)?
                    .add(&parts[1])?
            }
            (_, None) => self.norm2.forward(&h)?,
        };
        h = self.conv2.forward(&act.apply(&h)?)?;
        let skip = match &self.conv_shortcut {
            Some(c) => c.forward(x)?,
            None => x.clone(),
        };
        let out = skip.add(&h)?;
        Ok(if self.spec.output_scale_factor == 1.0 {
            out
        } else {
            out.div_scalar(self.spec.output_scale_factor)?
        })
    }
}

/// `Downsample2D` with a convolution: stride 2, or (padding 0) a right/bottom zero pad first,
/// as the VAE's encoder does.
#[derive(Clone, Debug)]
pub struct Downsample2D {
    conv: Conv2d,
    pad_first: bool,
}

impl Downsample2D {
    /// Loads `conv` (`channels` → `out_channels`, 3x3, stride 2, `padding`).
    pub fn load(w: &Weights, channels: usize, out: usize, padding: usize) -> Result<Downsample2D> {
        let p = ConvParams {
            stride: 2,
            padding,
            ..Default::default()
        };
        Ok(Downsample2D {
            conv: Conv2d::load(&w.pp("conv"), channels, out, 3, p, true)?,
            pad_first: padding == 0,
        })
    }

    /// Halves `x [N, C, H, W]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let x = if self.pad_first {
            x.pad(2, 0, 1, 0.0)?.pad(3, 0, 1, 0.0)?
        } else {
            x.clone()
        };
        Ok(self.conv.forward(&x)?)
    }
}

/// `Upsample2D` with a convolution: nearest 2x (or to `output_size`), then a 3x3 conv.
#[derive(Clone, Debug)]
pub struct Upsample2D {
    conv: Conv2d,
}

impl Upsample2D {
    /// Loads `conv` (`channels` → `out_channels`, 3x3).
    pub fn load(w: &Weights, channels: usize, out: usize) -> Result<Upsample2D> {
        Ok(Upsample2D {
            conv: conv3(&w.pp("conv"), channels, out)?,
        })
    }

    /// Doubles `x` (or resizes it to `output_size`, the skip connection's size when the
    /// latent is not a multiple of the UNet's total downsampling).
    pub fn forward(&self, x: &Tensor, output_size: Option<(usize, usize)>) -> Result<Tensor> {
        let up = match output_size {
            Some((h, w)) => x.upsample_nearest2d(h, w)?,
            None => x.upsample_nearest2x()?,
        };
        Ok(self.conv.forward(&up)?)
    }
}
