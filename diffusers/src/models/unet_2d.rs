//! `UNet2DModel`: mirrors diffusers' `unets/unet_2d.py` (unconditional UNets, e.g. DDPM's),
//! built from its `config.json`.

use std::path::PathBuf;

use serde_json::Value;
use zoo_runtime::nn::{Conv2d, Embedding, GroupNorm, Weights};
use zoo_runtime::{ConvParams, Tensor};

use super::embeddings::{TimestepEmbedding, Timesteps};
use super::modeling::{config_mixin, model_mixin, Stages};
use super::resnet::TimeNorm;
use super::unet_2d_blocks::{BlockArgs, DownBlock, MidBlock, UpBlock};
use super::{ensure, on, pop_skips, Act, BlockDevices};
use crate::configuration::register_to_config;
use crate::{Error, Result};

register_to_config! {
    /// `config.json` of a `UNet2DModel`, with the defaults of diffusers' `__init__`.
    #[allow(missing_docs)]
    pub struct UNet2DConfig {
        pub sample_size: Option<Value> = None,
        pub in_channels: usize = 3,
        pub out_channels: usize = 3,
        pub center_input_sample: bool = false,
        pub time_embedding_type: String = "positional".into(),
        pub time_embedding_dim: Option<usize> = None,
        pub freq_shift: f64 = 0.0,
        pub flip_sin_to_cos: bool = true,
        pub down_block_types: Vec<String> = vec![
            "DownBlock2D".into(),
            "AttnDownBlock2D".into(),
            "AttnDownBlock2D".into(),
            "AttnDownBlock2D".into(),
        ],
        pub mid_block_type: Option<String> = Some("UNetMidBlock2D".into()),
        pub up_block_types: Vec<String> = vec![
            "AttnUpBlock2D".into(),
            "AttnUpBlock2D".into(),
            "AttnUpBlock2D".into(),
            "UpBlock2D".into(),
        ],
        pub block_out_channels: Vec<usize> = vec![224, 448, 672, 896],
        pub layers_per_block: usize = 2,
        pub mid_block_scale_factor: f64 = 1.0,
        pub downsample_padding: usize = 1,
        pub downsample_type: String = "conv".into(),
        pub upsample_type: String = "conv".into(),
        pub act_fn: String = "silu".into(),
        pub attention_head_dim: Option<usize> = Some(8),
        pub norm_num_groups: usize = 32,
        pub attn_norm_num_groups: Option<usize> = None,
        pub norm_eps: f64 = 1e-5,
        pub resnet_time_scale_shift: String = "default".into(),
        pub add_attention: bool = true,
        pub class_embed_type: Option<String> = None,
        pub num_class_embeds: Option<usize> = None,
        /// The file, for errors.
        #[serde(skip)]
        pub path: PathBuf = PathBuf::new(),
    }
}

config_mixin!(UNet2DConfig, ["UNet2DModel"]);

impl UNet2DConfig {
    fn check(&self) -> Result<()> {
        let p = &self.path;
        let n = self.down_block_types.len();
        ensure(
            n > 0 && self.up_block_types.len() == n && self.block_out_channels.len() == n,
            p,
            || {
                format!(
                "{} down blocks, {} up blocks and {} `block_out_channels`: diffusers needs as many of each",
                n,
                self.up_block_types.len(),
                self.block_out_channels.len()
            )
            },
        )?;
        let bad = |field: &str, v: &str| Error::Config {
            path: p.clone(),
            reason: format!("`{field}` = {v:?} is not supported by zoo yet"),
        };
        if self.time_embedding_type != "positional" {
            return Err(bad("time_embedding_type", &self.time_embedding_type));
        }
        if self.downsample_type != "conv" {
            return Err(bad("downsample_type", &self.downsample_type));
        }
        if self.upsample_type != "conv" {
            return Err(bad("upsample_type", &self.upsample_type));
        }
        if let Some(t) = self.class_embed_type.as_deref() {
            if t != "identity" && t != "timestep" {
                return Err(bad("class_embed_type", t));
            }
        }
        super::check_groups(&self.block_out_channels, self.norm_num_groups, p)?;
        Act::from_diffusers(&self.act_fn).map_err(|e| Error::Config {
            path: p.clone(),
            reason: format!("`act_fn`: {e}"),
        })?;
        TimeNorm::parse(&self.resnet_time_scale_shift).map_err(|e| Error::Config {
            path: p.clone(),
            reason: e,
        })?;
        Ok(())
    }
}

#[derive(Clone, Debug)]
enum ClassEmbedding {
    Table(Embedding),
    Timestep(TimestepEmbedding),
    Identity,
}

/// `UNet2DModel`.
#[derive(Clone, Debug)]
pub struct UNet2DModel {
    conv_in: Conv2d,
    time_proj: Timesteps,
    time_embedding: TimestepEmbedding,
    class_embedding: Option<ClassEmbedding>,
    down_blocks: Vec<DownBlock>,
    mid_block: Option<MidBlock>,
    up_blocks: Vec<UpBlock>,
    conv_norm_out: GroupNorm,
    conv_out: Conv2d,
    /// Each block's device: one for all unless the weights were placed over several.
    devices: BlockDevices,
    stages: Stages,
    config: UNet2DConfig,
}

model_mixin!(UNet2DModel, UNet2DConfig);
model_mixin!(UNet2DModel, UNet2DConfig, stages);

impl UNet2DModel {
    /// Builds the UNet of `config` from the weights under `w`.
    pub fn load(w: &Weights, config: &UNet2DConfig) -> Result<UNet2DModel> {
        let c = config;
        c.check()?;
        let ch = &c.block_out_channels;
        let n = ch.len();
        let act = Act::from_diffusers(&c.act_fn).map_err(Error::Unsupported)?;
        let silu = Act::from_diffusers("silu").map_err(Error::Unsupported)?;
        let time_norm = TimeNorm::parse(&c.resnet_time_scale_shift).map_err(Error::Unsupported)?;
        let temb = c.time_embedding_dim.unwrap_or(ch[0] * 4);
        let conv3 = |name: &str, i: usize, o: usize| -> Result<Conv2d> {
            let p = ConvParams {
                padding: 1,
                ..Default::default()
            };
            Ok(Conv2d::load(&w.pp(name), i, o, 3, p, true)?)
        };
        let class_embedding = match (c.class_embed_type.as_deref(), c.num_class_embeds) {
            (None, Some(k)) => Some(ClassEmbedding::Table(Embedding::load(
                &w.pp("class_embedding"),
                k,
                temb,
            )?)),
            (Some("timestep"), _) => Some(ClassEmbedding::Timestep(TimestepEmbedding::load(
                &w.pp("class_embedding"),
                ch[0],
                temb,
                silu,
                None,
                None,
            )?)),
            (Some(_), _) => Some(ClassEmbedding::Identity),
            (None, None) => None,
        };
        let base = BlockArgs {
            num_layers: c.layers_per_block,
            transformer_layers: 0,
            in_channels: 0,
            out_channels: 0,
            prev_output_channel: 0,
            temb_channels: Some(temb),
            resample: false,
            resnet_eps: c.norm_eps,
            act,
            groups: c.norm_num_groups,
            time_norm,
            cross_attention_dim: None,
            num_attention_heads: 1,
            attention_head_dim: 0,
            downsample_padding: c.downsample_padding,
            use_linear_projection: false,
            only_cross_attention: false,
            output_scale_factor: 1.0,
            skip_time_act: false,
        };
        let mut down_blocks = Vec::with_capacity(n);
        let mut out = ch[0];
        for (i, ty) in c.down_block_types.iter().enumerate() {
            let input = out;
            out = ch[i];
            let a = BlockArgs {
                in_channels: input,
                out_channels: out,
                resample: i + 1 < n,
                attention_head_dim: c.attention_head_dim.unwrap_or(out),
                ..base
            };
            down_blocks.push(DownBlock::load(&w.pp(format!("down_blocks.{i}")), ty, &a)?);
        }
        let mid_block = match c.mid_block_type.as_deref() {
            Some(ty) => {
                let last = ch[n - 1];
                let a = BlockArgs {
                    num_layers: 1,
                    in_channels: last,
                    out_channels: last,
                    output_scale_factor: c.mid_block_scale_factor,
                    attention_head_dim: c.attention_head_dim.unwrap_or(last),
                    ..base
                };
                let attn_groups = c
                    .attn_norm_num_groups
                    .or((time_norm == TimeNorm::Default).then_some(c.norm_num_groups));
                Some(MidBlock::load(
                    &w.pp("mid_block"),
                    ty,
                    &a,
                    c.add_attention,
                    attn_groups,
                )?)
            }
            None => None,
        };
        let mut up_blocks = Vec::with_capacity(n);
        let mut out = ch[n - 1];
        for (i, ty) in c.up_block_types.iter().enumerate() {
            let prev = out;
            out = ch[n - 1 - i];
            let input = ch[n - 1 - (i + 1).min(n - 1)];
            let a = BlockArgs {
                num_layers: c.layers_per_block + 1,
                in_channels: input,
                out_channels: out,
                prev_output_channel: prev,
                resample: i + 1 < n,
                attention_head_dim: c.attention_head_dim.unwrap_or(out),
                ..base
            };
            up_blocks.push(UpBlock::load(&w.pp(format!("up_blocks.{i}")), ty, &a)?);
        }
        let conv_in = conv3("conv_in", c.in_channels, ch[0])?;
        let device = conv_in.weight.device();
        let devices = BlockDevices::of(w, n);
        Ok(UNet2DModel {
            conv_in,
            time_proj: Timesteps {
                num_channels: ch[0],
                flip_sin_to_cos: c.flip_sin_to_cos,
                downscale_freq_shift: c.freq_shift,
                scale: 1.0,
            },
            time_embedding: TimestepEmbedding::load(
                &w.pp("time_embedding"),
                ch[0],
                temb,
                silu,
                None,
                None,
            )?,
            class_embedding,
            down_blocks,
            mid_block,
            up_blocks,
            conv_norm_out: GroupNorm::load(
                &w.pp("conv_norm_out"),
                c.norm_num_groups,
                ch[0],
                c.norm_eps,
            )?,
            conv_out: conv3("conv_out", ch[0], c.out_channels)?,
            stages: devices.stages(device, w.dtype()),
            devices,
            config: c.clone(),
        })
    }

    /// The model's prediction for `sample [B, in_channels, H, W]` at `timestep` (`[]`,
    /// `[1]` or `[B]`), with `class_labels` for class-conditional UNets.
    pub fn forward(
        &self,
        sample: &Tensor,
        timestep: &Tensor,
        class_labels: Option<&Tensor>,
    ) -> Result<Tensor> {
        let c = &self.config;
        let (x, (b, _, _)) =
            self.stages
                .unet_input(sample, c.in_channels, c.center_input_sample)?;
        let t = timestep.to_device(&self.stages.input)?;
        let t = t.reshape_to(&[t.elem_count()])?;
        let t = if t.elem_count() == 1 {
            t.broadcast_as(&[b])?
        } else {
            t
        };
        let t_emb = self.time_proj.forward(&t)?.to_dtype(self.stages.dtype)?;
        let mut emb = self.time_embedding.forward(&t_emb, None)?;
        if let Some(ce) = &self.class_embedding {
            let labels = class_labels
                .ok_or_else(|| {
                    Error::Input("this UNet is class-conditional: pass class_labels".into())
                })?
                .to_device(&self.stages.input)?;
            let class = match ce {
                ClassEmbedding::Table(e) => e.forward(&labels)?,
                ClassEmbedding::Timestep(te) => te.forward(
                    &self
                        .time_proj
                        .forward(&labels)?
                        .to_dtype(self.stages.dtype)?,
                    None,
                )?,
                ClassEmbedding::Identity => labels.to_dtype(self.stages.dtype)?,
            };
            emb = emb.add(&class.to_dtype(self.stages.dtype)?)?;
        }
        // A split UNet moves the activations and the time embedding to each stage's device
        // as it reaches it (a no-op on one device).
        let mut h = self.conv_in.forward(&x)?;
        let mut skips = vec![h.clone()];
        for (block, &d) in self.down_blocks.iter().zip(&self.devices.down) {
            let (out, states) = block.forward(&on(&h, d)?, Some(&on(&emb, d)?), None)?;
            h = out;
            skips.extend(states);
        }
        if let Some(mid) = &self.mid_block {
            let d = self.devices.mid;
            h = mid.forward(&on(&h, d)?, Some(&on(&emb, d)?), None)?;
        }
        for (block, &d) in self.up_blocks.iter().zip(&self.devices.up) {
            let these = pop_skips(&mut skips, block.len(), d)?;
            h = block.forward(&on(&h, d)?, &these, Some(&on(&emb, d)?), None, None)?;
        }
        let silu = Act::from_diffusers("silu").map_err(Error::Unsupported)?;
        let h = on(&h, self.devices.head)?;
        let h = silu.apply(&self.conv_norm_out.forward(&h)?)?;
        Ok(self.conv_out.forward(&h)?)
    }
}
