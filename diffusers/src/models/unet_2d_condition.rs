//! `UNet2DConditionModel`: mirrors diffusers' `unets/unet_2d_condition.py`, built from its
//! `config.json` (Stable Diffusion 1.x / 2.x / XL and the UNets shaped like them).
//!
//! The time embedding (sinusoidal, then an MLP) plus optional class and SDXL `text_time`
//! embeddings condition every ResNet; the text encoder's hidden states condition every
//! transformer through cross-attention. Down blocks leave skips the up blocks consume in
//! reverse. Naming quirk kept from diffusers: `attention_head_dim` in the config is the
//! number of heads of the cross-attention blocks (`num_attention_heads` must stay unset).

use std::path::PathBuf;

use serde_json::Value;
use zoo_runtime::nn::{Conv2d, Embedding, GroupNorm, Linear, Weights};
use zoo_runtime::{ConvParams, DType, Tensor};

use super::embeddings::{TimestepEmbedding, Timesteps};
use super::modeling::{config_mixin, model_mixin, Stages};
use super::resnet::TimeNorm;
use super::unet_2d_blocks::{BlockArgs, DownBlock, MidBlock, UpBlock};
use super::{ensure, per_block, Act, BlockDevices};
use crate::configuration::register_to_config;
use crate::{Error, Result};

register_to_config! {
    /// `config.json` of a `UNet2DConditionModel`, with the defaults of diffusers' `__init__`
    /// (Stable Diffusion 1.x's UNet).
    #[allow(missing_docs)]
    pub struct UNet2DConditionConfig {
        pub sample_size: Option<Value> = None,
        pub in_channels: usize = 4,
        pub out_channels: usize = 4,
        pub center_input_sample: bool = false,
        pub flip_sin_to_cos: bool = true,
        pub freq_shift: f64 = 0.0,
        pub down_block_types: Vec<String> = vec![
            "CrossAttnDownBlock2D".into(),
            "CrossAttnDownBlock2D".into(),
            "CrossAttnDownBlock2D".into(),
            "DownBlock2D".into(),
        ],
        pub mid_block_type: Option<String> = Some("UNetMidBlock2DCrossAttn".into()),
        pub up_block_types: Vec<String> = vec![
            "UpBlock2D".into(),
            "CrossAttnUpBlock2D".into(),
            "CrossAttnUpBlock2D".into(),
            "CrossAttnUpBlock2D".into(),
        ],
        pub only_cross_attention: Value = Value::from(false),
        pub block_out_channels: Vec<usize> = vec![320, 640, 1280, 1280],
        pub layers_per_block: Value = Value::from(2),
        pub downsample_padding: usize = 1,
        pub mid_block_scale_factor: f64 = 1.0,
        pub act_fn: String = "silu".into(),
        pub norm_num_groups: Option<usize> = Some(32),
        pub norm_eps: f64 = 1e-5,
        pub cross_attention_dim: Value = Value::from(1280),
        pub transformer_layers_per_block: Value = Value::from(1),
        pub reverse_transformer_layers_per_block: Option<Value> = None,
        pub encoder_hid_dim: Option<usize> = None,
        pub encoder_hid_dim_type: Option<String> = None,
        pub attention_head_dim: Value = Value::from(8),
        pub num_attention_heads: Option<Value> = None,
        pub dual_cross_attention: bool = false,
        pub use_linear_projection: bool = false,
        pub class_embed_type: Option<String> = None,
        pub addition_embed_type: Option<String> = None,
        pub addition_time_embed_dim: Option<usize> = None,
        pub num_class_embeds: Option<usize> = None,
        pub upcast_attention: bool = false,
        pub resnet_time_scale_shift: String = "default".into(),
        pub resnet_skip_time_act: bool = false,
        pub resnet_out_scale_factor: f64 = 1.0,
        pub time_embedding_type: String = "positional".into(),
        pub time_embedding_dim: Option<usize> = None,
        pub time_embedding_act_fn: Option<String> = None,
        pub timestep_post_act: Option<String> = None,
        pub time_cond_proj_dim: Option<usize> = None,
        pub conv_in_kernel: usize = 3,
        pub conv_out_kernel: usize = 3,
        pub projection_class_embeddings_input_dim: Option<usize> = None,
        pub attention_type: String = "default".into(),
        pub class_embeddings_concat: bool = false,
        pub mid_block_only_cross_attention: Option<bool> = None,
        pub cross_attention_norm: Option<String> = None,
        pub addition_embed_type_num_heads: usize = 64,
        /// The file, for errors.
        #[serde(skip)]
        pub path: PathBuf = PathBuf::new(),
    }
}

/// The per-block lists a config resolves to.
#[derive(Clone, Debug)]
struct Resolved {
    layers: Vec<usize>,
    transformer_layers: Vec<usize>,
    heads: Vec<usize>,
    cross: Vec<usize>,
    only_cross: Vec<bool>,
    act: Act,
    time_norm: TimeNorm,
    groups: usize,
}

config_mixin!(UNet2DConditionConfig, ["UNet2DConditionModel"]);

impl UNet2DConditionConfig {
    fn bad(&self, reason: String) -> Error {
        Error::Config {
            path: self.path.clone(),
            reason,
        }
    }

    /// The checks diffusers' constructor would fail on (those [`Self::resolve`] makes).
    fn check(&self) -> Result<()> {
        self.resolve().map(|_| ())
    }

    fn resolve(&self) -> Result<Resolved> {
        let p = &self.path;
        let n = self.down_block_types.len();
        ensure(n > 0, p, || "`down_block_types` is empty".into())?;
        ensure(self.up_block_types.len() == n, p, || {
            format!(
                "{} `up_block_types` for {n} `down_block_types`; diffusers needs as many",
                self.up_block_types.len()
            )
        })?;
        ensure(self.block_out_channels.len() == n, p, || {
            format!(
                "{} `block_out_channels` for {n} down blocks",
                self.block_out_channels.len()
            )
        })?;
        if self
            .num_attention_heads
            .as_ref()
            .is_some_and(|v| !v.is_null())
        {
            return Err(self.bad(
                "`num_attention_heads` is set; diffusers refuses it too (its naming issue #2011): give the head count as `attention_head_dim`".into(),
            ));
        }
        let unsupported = |field: &str, value: String| -> Error {
            self.bad(format!("`{field}` = {value} is not supported by zoo yet"))
        };
        if self.dual_cross_attention {
            return Err(unsupported("dual_cross_attention", "true".into()));
        }
        if self.attention_type != "default" {
            return Err(unsupported(
                "attention_type",
                format!("{:?}", self.attention_type),
            ));
        }
        if let Some(v) = &self.cross_attention_norm {
            return Err(unsupported("cross_attention_norm", format!("{v:?}")));
        }
        if self.time_embedding_type != "positional" {
            return Err(unsupported(
                "time_embedding_type",
                format!("{:?} (zoo runs positional)", self.time_embedding_type),
            ));
        }
        if self
            .reverse_transformer_layers_per_block
            .as_ref()
            .is_some_and(|v| !v.is_null())
        {
            return Err(unsupported(
                "reverse_transformer_layers_per_block",
                "a list".into(),
            ));
        }
        match self.addition_embed_type.as_deref() {
            None => {}
            Some("text_time") => {
                ensure(
                    self.addition_time_embed_dim.is_some()
                        && self.projection_class_embeddings_input_dim.is_some(),
                    p,
                    || {
                        "`addition_embed_type` \"text_time\" needs `addition_time_embed_dim` and `projection_class_embeddings_input_dim`".into()
                    },
                )?;
            }
            Some(other) => {
                return Err(unsupported(
                    "addition_embed_type",
                    format!("{other:?} (zoo runs text_time)"),
                ))
            }
        }
        match (self.encoder_hid_dim_type.as_deref(), self.encoder_hid_dim) {
            (None | Some("text_proj"), _) => {}
            (Some(other), _) => {
                return Err(unsupported(
                    "encoder_hid_dim_type",
                    format!("{other:?} (zoo runs text_proj)"),
                ))
            }
        }
        if let Some(t) = self.class_embed_type.as_deref() {
            let ok = ["timestep", "identity", "projection", "simple_projection"];
            if !ok.contains(&t) {
                return Err(self.bad(format!(
                    "`class_embed_type` {t:?} is not one of {}",
                    ok.join(", ")
                )));
            }
            if matches!(t, "projection" | "simple_projection") {
                ensure(
                    self.projection_class_embeddings_input_dim.is_some(),
                    p,
                    || {
                        format!("`class_embed_type` {t:?} needs `projection_class_embeddings_input_dim`")
                    },
                )?;
            }
        }
        let groups = self.norm_num_groups.ok_or_else(|| {
            self.bad("`norm_num_groups` is null; zoo builds UNets with GroupNorm".into())
        })?;
        super::check_groups(&self.block_out_channels, groups, p)?;
        for k in [self.conv_in_kernel, self.conv_out_kernel] {
            ensure(k % 2 == 1, p, || {
                format!("conv kernels must be odd, got {k}")
            })?;
        }
        let act =
            Act::from_diffusers(&self.act_fn).map_err(|e| self.bad(format!("`act_fn`: {e}")))?;
        for (field, v) in [
            ("time_embedding_act_fn", &self.time_embedding_act_fn),
            ("timestep_post_act", &self.timestep_post_act),
        ] {
            if let Some(name) = v {
                Act::from_diffusers(name).map_err(|e| self.bad(format!("`{field}`: {e}")))?;
            }
        }
        let time_norm = TimeNorm::parse(&self.resnet_time_scale_shift).map_err(|e| self.bad(e))?;
        let layers: Vec<usize> = per_block(&self.layers_per_block, n, "layers_per_block", p)?;
        if let Value::Array(items) = &self.transformer_layers_per_block {
            if items.iter().any(Value::is_array) {
                return Err(unsupported(
                    "transformer_layers_per_block",
                    "nested lists (an asymmetric UNet)".into(),
                ));
            }
        }
        let transformer_layers: Vec<usize> = per_block(
            &self.transformer_layers_per_block,
            n,
            "transformer_layers_per_block",
            p,
        )?;
        let heads: Vec<usize> = per_block(&self.attention_head_dim, n, "attention_head_dim", p)?;
        let cross: Vec<usize> = per_block(&self.cross_attention_dim, n, "cross_attention_dim", p)?;
        let only_cross: Vec<bool> =
            per_block(&self.only_cross_attention, n, "only_cross_attention", p)?;
        Ok(Resolved {
            layers,
            transformer_layers,
            heads,
            cross,
            only_cross,
            act,
            time_norm,
            groups,
        })
    }

    /// How many times the UNet halves the latent: the latent's sides should be multiples of
    /// `2^downsamplings()` (others are resized at each upsampler, as diffusers does).
    pub fn downsamplings(&self) -> usize {
        self.block_out_channels.len().saturating_sub(1)
    }

    /// The width of the time embedding.
    pub fn time_embed_dim(&self) -> usize {
        self.time_embedding_dim
            .unwrap_or(self.block_out_channels[0] * 4)
    }

    /// Whether the UNet takes SDXL's `text_embeds` and `time_ids`.
    pub fn takes_text_time(&self) -> bool {
        self.addition_embed_type.as_deref() == Some("text_time")
    }
}

/// The class embedding (`class_embed_type` / `num_class_embeds`).
#[derive(Clone, Debug)]
enum ClassEmbedding {
    Table(Embedding),
    Timestep(TimestepEmbedding),
    Identity,
    Projection(TimestepEmbedding),
    SimpleProjection(Linear),
}

/// SDXL's `text_time` added embedding.
#[derive(Clone, Debug)]
struct TextTime {
    add_time_proj: Timesteps,
    add_embedding: TimestepEmbedding,
}

/// What the UNet is called with (diffusers' `forward` arguments).
#[derive(Clone, Copy, Debug)]
pub struct UNet2DConditionInput<'a> {
    /// The noisy latents `[B, in_channels, h, w]`.
    pub sample: &'a Tensor,
    /// The timestep: `[]`, `[1]` or `[B]`, any numeric dtype (uploaded, so a compiled UNet
    /// does not recompile per timestep).
    pub timestep: &'a Tensor,
    /// The text encoder's hidden states `[B, S, cross_attention_dim]`.
    pub encoder_hidden_states: &'a Tensor,
    /// Class labels for class-conditional UNets.
    pub class_labels: Option<&'a Tensor>,
    /// `timestep_cond` for UNets with `time_cond_proj_dim` (LCM).
    pub timestep_cond: Option<&'a Tensor>,
    /// SDXL: the pooled text embeddings `[B, pooled]`.
    pub text_embeds: Option<&'a Tensor>,
    /// SDXL: `[B, 6]` original size, crop and target size.
    pub time_ids: Option<&'a Tensor>,
}

/// `UNet2DConditionModel`.
#[derive(Clone, Debug)]
pub struct UNet2DConditionModel {
    conv_in: Conv2d,
    time_proj: Timesteps,
    time_embedding: TimestepEmbedding,
    class_embedding: Option<ClassEmbedding>,
    text_time: Option<TextTime>,
    encoder_hid_proj: Option<Linear>,
    time_embed_act: Option<Act>,
    down_blocks: Vec<DownBlock>,
    mid_block: Option<MidBlock>,
    up_blocks: Vec<UpBlock>,
    conv_norm_out: GroupNorm,
    act: Act,
    conv_out: Conv2d,
    /// The device of each down block, the mid block, each up block and the output head:
    /// one for all unless the weights were placed over several (a split UNet).
    devices: BlockDevices,
    stages: Stages,
    config: UNet2DConditionConfig,
}

model_mixin!(UNet2DConditionModel, UNet2DConditionConfig);
model_mixin!(UNet2DConditionModel, UNet2DConditionConfig, stages);

impl UNet2DConditionModel {
    /// Builds the UNet of `config` from the weights under `w` (diffusers' names).
    pub fn load(w: &Weights, config: &UNet2DConditionConfig) -> Result<UNet2DConditionModel> {
        let c = config;
        let r = c.resolve()?;
        let ch = &c.block_out_channels;
        let n = ch.len();
        let conv = |name: &str, i: usize, o: usize, k: usize| -> Result<Conv2d> {
            let params = ConvParams {
                padding: (k - 1) / 2,
                ..Default::default()
            };
            Ok(Conv2d::load(&w.pp(name), i, o, k, params, true)?)
        };
        let time_embed_dim = c.time_embed_dim();
        let timestep_input_dim = ch[0];
        let time_proj = Timesteps {
            num_channels: timestep_input_dim,
            flip_sin_to_cos: c.flip_sin_to_cos,
            downscale_freq_shift: c.freq_shift,
            scale: 1.0,
        };
        let post_act = c
            .timestep_post_act
            .as_deref()
            .map(Act::from_diffusers)
            .transpose()
            .map_err(|e| c.bad(e))?;
        let time_embedding = TimestepEmbedding::load(
            &w.pp("time_embedding"),
            timestep_input_dim,
            time_embed_dim,
            r.act,
            post_act,
            c.time_cond_proj_dim,
        )?;
        let silu = Act::from_diffusers("silu").map_err(|e| c.bad(e))?;
        let class_embedding = match (c.class_embed_type.as_deref(), c.num_class_embeds) {
            (None, Some(k)) => Some(ClassEmbedding::Table(Embedding::load(
                &w.pp("class_embedding"),
                k,
                time_embed_dim,
            )?)),
            (None, None) => None,
            (Some("timestep"), _) => Some(ClassEmbedding::Timestep(TimestepEmbedding::load(
                &w.pp("class_embedding"),
                timestep_input_dim,
                time_embed_dim,
                r.act,
                None,
                None,
            )?)),
            (Some("identity"), _) => Some(ClassEmbedding::Identity),
            (Some("projection"), _) => Some(ClassEmbedding::Projection(TimestepEmbedding::load(
                &w.pp("class_embedding"),
                c.projection_class_embeddings_input_dim.unwrap_or_default(),
                time_embed_dim,
                silu,
                None,
                None,
            )?)),
            (Some(_), _) => Some(ClassEmbedding::SimpleProjection(Linear::load(
                &w.pp("class_embedding"),
                c.projection_class_embeddings_input_dim.unwrap_or_default(),
                time_embed_dim,
                true,
            )?)),
        };
        let text_time = if c.takes_text_time() {
            Some(TextTime {
                add_time_proj: Timesteps {
                    num_channels: c.addition_time_embed_dim.unwrap_or_default(),
                    flip_sin_to_cos: c.flip_sin_to_cos,
                    downscale_freq_shift: c.freq_shift,
                    scale: 1.0,
                },
                add_embedding: TimestepEmbedding::load(
                    &w.pp("add_embedding"),
                    c.projection_class_embeddings_input_dim.unwrap_or_default(),
                    time_embed_dim,
                    silu,
                    None,
                    None,
                )?,
            })
        } else {
            None
        };
        let encoder_hid_proj = match c.encoder_hid_dim {
            Some(d) => Some(Linear::load(
                &w.pp("encoder_hid_proj"),
                d,
                r.cross[0],
                true,
            )?),
            None => None,
        };
        let time_embed_act = c
            .time_embedding_act_fn
            .as_deref()
            .map(Act::from_diffusers)
            .transpose()
            .map_err(|e| c.bad(e))?;
        let blocks_temb = if c.class_embeddings_concat {
            time_embed_dim * 2
        } else {
            time_embed_dim
        };
        let args = |i: usize, layers: usize, tl: usize| BlockArgs {
            num_layers: layers,
            transformer_layers: tl,
            in_channels: 0,
            out_channels: 0,
            prev_output_channel: 0,
            temb_channels: Some(blocks_temb),
            resample: false,
            resnet_eps: c.norm_eps,
            act: r.act,
            groups: r.groups,
            time_norm: r.time_norm,
            cross_attention_dim: Some(r.cross[i]),
            num_attention_heads: r.heads[i],
            attention_head_dim: r.heads[i],
            downsample_padding: c.downsample_padding,
            use_linear_projection: c.use_linear_projection,
            only_cross_attention: r.only_cross[i],
            output_scale_factor: c.resnet_out_scale_factor,
            skip_time_act: c.resnet_skip_time_act,
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
                ..args(i, r.layers[i], r.transformer_layers[i])
            };
            down_blocks.push(DownBlock::load(&w.pp(format!("down_blocks.{i}")), ty, &a)?);
        }
        let mid_block = match c.mid_block_type.as_deref() {
            Some(ty) => {
                let a = BlockArgs {
                    in_channels: ch[n - 1],
                    out_channels: ch[n - 1],
                    output_scale_factor: c.mid_block_scale_factor,
                    only_cross_attention: c.mid_block_only_cross_attention.unwrap_or(false),
                    ..args(
                        n - 1,
                        if ty == "UNetMidBlock2D" { 0 } else { 1 },
                        r.transformer_layers[n - 1],
                    )
                };
                Some(MidBlock::load(&w.pp("mid_block"), ty, &a, false, None)?)
            }
            None => None,
        };
        let mut up_blocks = Vec::with_capacity(n);
        let rev = |v: &[usize], i: usize| v[n - 1 - i];
        let mut out = ch[n - 1];
        for (i, ty) in c.up_block_types.iter().enumerate() {
            let prev = out;
            out = rev(ch, i);
            let input = rev(ch, (i + 1).min(n - 1));
            let ri = n - 1 - i;
            let a = BlockArgs {
                in_channels: input,
                out_channels: out,
                prev_output_channel: prev,
                resample: i + 1 < n,
                ..args(ri, r.layers[ri] + 1, r.transformer_layers[ri])
            };
            up_blocks.push(UpBlock::load(&w.pp(format!("up_blocks.{i}")), ty, &a)?);
        }
        let conv_in = conv("conv_in", c.in_channels, ch[0], c.conv_in_kernel)?;
        let device = conv_in.weight.device();
        let devices = BlockDevices::of(w, n);
        Ok(UNet2DConditionModel {
            conv_in,
            time_proj,
            time_embedding,
            class_embedding,
            text_time,
            encoder_hid_proj,
            time_embed_act,
            down_blocks,
            mid_block,
            up_blocks,
            conv_norm_out: GroupNorm::load(&w.pp("conv_norm_out"), r.groups, ch[0], c.norm_eps)?,
            act: r.act,
            conv_out: conv("conv_out", ch[0], c.out_channels, c.conv_out_kernel)?,
            stages: devices.stages(device, w.dtype()),
            devices,
            config: c.clone(),
        })
    }

    fn time_embedding(&self, x: &UNet2DConditionInput<'_>, batch: usize) -> Result<Tensor> {
        let t = x.timestep.to_device(&self.stages.input)?;
        let t = t.reshape_to(&[t.elem_count()])?;
        let t = match t.elem_count() {
            1 => t.reshape_to(&[1])?.broadcast_as(&[batch])?,
            n if n == batch => t,
            n => {
                return Err(Error::Shape(format!(
                    "the timestep has {n} values for a batch of {batch}; give one or one per sample"
                )))
            }
        };
        let t_emb = self.time_proj.forward(&t)?.to_dtype(self.stages.dtype)?;
        let cond = x
            .timestep_cond
            .map(|c| c.to_device(&self.stages.input))
            .transpose()?;
        let mut emb = self.time_embedding.forward(&t_emb, cond.as_ref())?;
        if let Some(ce) = &self.class_embedding {
            let labels = x.class_labels.ok_or_else(|| {
                Error::Input("this UNet is class-conditional: pass class_labels".into())
            })?;
            let labels = labels.to_device(&self.stages.input)?;
            let class = match ce {
                ClassEmbedding::Table(e) => e.forward(&labels)?,
                ClassEmbedding::Timestep(te) => {
                    let l = self
                        .time_proj
                        .forward(&labels)?
                        .to_dtype(self.stages.dtype)?;
                    te.forward(&l, None)?
                }
                ClassEmbedding::Identity => labels.to_dtype(self.stages.dtype)?,
                ClassEmbedding::Projection(te) => {
                    te.forward(&labels.to_dtype(self.stages.dtype)?, None)?
                }
                ClassEmbedding::SimpleProjection(l) => {
                    l.forward(&labels.to_dtype(self.stages.dtype)?)?
                }
            }
            .to_dtype(self.stages.dtype)?;
            emb = if self.config.class_embeddings_concat {
                Tensor::cat(&[&emb, &class], -1)?
            } else {
                emb.add(&class)?
            };
        }
        if let Some(tt) = &self.text_time {
            let (Some(text), Some(ids)) = (x.text_embeds, x.time_ids) else {
                return Err(Error::Input(
                    "this UNet has `addition_embed_type` \"text_time\" (SDXL): pass text_embeds and time_ids".into(),
                ));
            };
            let ids = ids.to_device(&self.stages.input)?;
            let flat = ids.reshape_to(&[ids.elem_count()])?;
            let time = tt.add_time_proj.forward(&flat)?.reshape_to(&[
                batch,
                ids.elem_count() / batch * tt.add_time_proj.num_channels,
            ])?;
            let add = Tensor::cat(
                &[
                    &text.to_device(&self.stages.input)?.to_dtype(DType::F32)?,
                    &time,
                ],
                -1,
            )?
            .to_dtype(self.stages.dtype)?;
            emb = emb.add(&tt.add_embedding.forward(&add, None)?)?;
        }
        if let Some(a) = &self.time_embed_act {
            emb = a.apply(&emb)?;
        }
        Ok(emb)
    }

    /// The noise prediction (or v / sample, per the scheduler's `prediction_type`) for
    /// `x.sample` at `x.timestep`: diffusers' `UNet2DConditionModel.forward(...).sample`.
    pub fn forward(&self, x: UNet2DConditionInput<'_>) -> Result<Tensor> {
        let c = &self.config;
        let (sample, (batch, h, w)) =
            self.stages
                .unet_input(x.sample, c.in_channels, c.center_input_sample)?;
        let factor = 1usize << self.up_blocks.len().saturating_sub(1);
        let forward_upsample_size = h % factor != 0 || w % factor != 0;
        let emb = self.time_embedding(&x, batch)?;
        let mut context = x
            .encoder_hidden_states
            .to_device(&self.stages.input)?
            .to_dtype(self.stages.dtype)?;
        if let Some(p) = &self.encoder_hid_proj {
            context = p.forward(&context)?;
        }
        // A split UNet moves the activations, the time embedding and the context to each
        // stage's device as it reaches it (a no-op on one device).
        let on = super::on;
        let mut h_ = self.conv_in.forward(&sample)?;
        let mut skips = vec![h_.clone()];
        for (block, &d) in self.down_blocks.iter().zip(&self.devices.down) {
            let (out, states) =
                block.forward(&on(&h_, d)?, Some(&on(&emb, d)?), Some(&on(&context, d)?))?;
            h_ = out;
            skips.extend(states);
        }
        if let Some(mid) = &self.mid_block {
            let d = self.devices.mid;
            h_ = mid.forward(&on(&h_, d)?, Some(&on(&emb, d)?), Some(&on(&context, d)?))?;
        }
        let last = self.up_blocks.len().saturating_sub(1);
        for (i, (block, &d)) in self.up_blocks.iter().zip(&self.devices.up).enumerate() {
            let these = super::pop_skips(&mut skips, block.len(), d)?;
            let size = if i < last && forward_upsample_size {
                skips.last().map(|s| (s.shape()[2], s.shape()[3]))
            } else {
                None
            };
            h_ = block.forward(
                &on(&h_, d)?,
                &these,
                Some(&on(&emb, d)?),
                Some(&on(&context, d)?),
                size,
            )?;
        }
        let h_ = on(&h_, self.devices.head)?;
        let h_ = self.act.apply(&self.conv_norm_out.forward(&h_)?)?;
        self.conv_out.forward(&h_).map_err(Error::from)
    }
}
