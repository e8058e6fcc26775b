//! `FluxTransformer2DModel` (diffusers' `transformers/transformer_flux.py`): double-stream
//! blocks (image and text tokens with their own weights, attended jointly) followed by
//! single-stream blocks over the concatenated sequence, with 3-axis rotary positions from
//! the token ids. Latents come in packed 2x2 (`[B, (H/2)(W/2), 4C]`).

use std::path::PathBuf;

use zoo_runtime::nn::{LayerNorm, Linear, Weights};
use zoo_runtime::{DType, Device, Tensor};

use super::attention::FeedForward;
use super::embeddings::CombinedTimestepTextProj;
use super::joint_attention::{JointAttention, JointAttentionSpec};
use super::modeling::{config_mixin, model_mixin, Blocks, Stages};
use super::normalization::{gated, modulate, AdaLayerNormContinuous, AdaLayerNormZero};
use super::{ensure, on};
use crate::configuration::register_to_config;
use crate::{Error, Result};

/// The rotary base Flux fixes.
const THETA: f64 = 10000.0;

register_to_config! {
    /// `config.json` of a `FluxTransformer2DModel`, with the defaults of diffusers' `__init__`
    /// (FLUX.1's transformer).
    #[allow(missing_docs)]
    pub struct FluxTransformer2DConfig {
        pub patch_size: usize = 1,
        pub in_channels: usize = 64,
        pub out_channels: Option<usize> = None,
        pub num_layers: usize = 19,
        pub num_single_layers: usize = 38,
        pub attention_head_dim: usize = 128,
        pub num_attention_heads: usize = 24,
        pub joint_attention_dim: usize = 4096,
        pub pooled_projection_dim: usize = 768,
        pub guidance_embeds: bool = false,
        pub axes_dims_rope: Vec<usize> = vec![16, 56, 56],
        /// Where the config was read from, for errors.
        #[serde(skip)]
        pub path: PathBuf = PathBuf::new(),
    }
}

config_mixin!(
    FluxTransformer2DConfig,
    ["FluxTransformer2DModel"],
    transformer
);

impl FluxTransformer2DConfig {
    /// The checks diffusers would fail on at run time, as typed errors naming the field.
    pub fn check(&self) -> Result<()> {
        let p = &self.path;
        ensure(
            self.num_attention_heads > 0 && self.attention_head_dim > 0 && self.in_channels > 0,
            p,
            || {
                "`num_attention_heads`, `attention_head_dim` and `in_channels` must be positive"
                    .into()
            },
        )?;
        let sum: usize = self.axes_dims_rope.iter().sum();
        ensure(sum == self.attention_head_dim, p, || {
            format!(
                "`axes_dims_rope` {:?} sums to {sum}, but the rotary positions cover each head: it must sum to `attention_head_dim` = {}",
                self.axes_dims_rope, self.attention_head_dim
            )
        })?;
        ensure(self.axes_dims_rope.iter().all(|d| d % 2 == 0), p, || {
            format!(
                "`axes_dims_rope` {:?}: every axis rotates channel pairs, so each must be even",
                self.axes_dims_rope
            )
        })?;
        ensure(self.patch_size == 1, p, || {
            format!(
                "`patch_size` = {}: diffusers' FluxTransformer2DModel runs patch_size 1 (the pipeline packs 2x2 latents itself)",
                self.patch_size
            )
        })
    }
}

/// `FluxTransformerBlock`: the double-stream block.
#[derive(Clone, Debug)]
pub struct FluxTransformerBlock {
    norm1: AdaLayerNormZero,
    norm1_context: AdaLayerNormZero,
    attn: JointAttention,
    ff: FeedForward,
    ff_context: FeedForward,
    norm2: LayerNorm,
}

impl FluxTransformerBlock {
    fn load(w: &Weights, c: &FluxTransformer2DConfig) -> Result<FluxTransformerBlock> {
        let dim = c.inner_dim();
        let spec = JointAttentionSpec {
            dim,
            heads: c.num_attention_heads,
            head_dim: c.attention_head_dim,
            qk_norm: Some("rms_norm"),
            eps: 1e-6,
            added: true,
            added_out: true,
            out: true,
            text_first: true,
        };
        let ff = |name: &str| FeedForward::load(&w.pp(name), dim, 4 * dim, "gelu-approximate");
        Ok(FluxTransformerBlock {
            norm1: AdaLayerNormZero::load(&w.pp("norm1"), dim, 6)?,
            norm1_context: AdaLayerNormZero::load(&w.pp("norm1_context"), dim, 6)?,
            attn: JointAttention::load(&w.pp("attn"), spec)?,
            ff: ff("ff")?,
            ff_context: ff("ff_context")?,
            norm2: LayerNorm::no_affine(1e-6),
        })
    }

    fn forward(
        &self,
        x: &Tensor,
        context: &Tensor,
        temb: &Tensor,
        rope: (&Tensor, &Tensor),
    ) -> Result<(Tensor, Tensor)> {
        let n = self.norm1.forward(x, temb)?;
        let m = self.norm1_context.forward(context, temb)?;
        let (attn, ctx_attn) = self.attn.forward(&n.x, Some(&m.x), Some(rope))?;
        let ctx_attn = ctx_attn.ok_or_else(|| Error::Shape("no text output".into()))?;
        let (r, q) = (&n.rest, &m.rest);
        let x = x.add(&gated(&r[0], &attn)?)?;
        let h = modulate(&self.norm2.forward(&x)?, &r[1], &r[2])?;
        let x = x.add(&gated(&r[3], &self.ff.forward(&h)?)?)?;
        let c = context.add(&gated(&q[0], &ctx_attn)?)?;
        let h = modulate(&self.norm2.forward(&c)?, &q[1], &q[2])?;
        let c = c.add(&gated(&q[3], &self.ff_context.forward(&h)?)?)?;
        Ok((clip_f16(x)?, clip_f16(c)?))
    }
}

/// float16 activations are clipped to its range, as diffusers does after each block.
fn clip_f16(x: Tensor) -> Result<Tensor> {
    Ok(if x.dtype() == DType::F16 {
        x.clamp(-65504.0, 65504.0)?
    } else {
        x
    })
}

/// `FluxSingleTransformerBlock`: attention and an MLP side by side on the joint sequence,
/// concatenated into one output projection.
#[derive(Clone, Debug)]
pub struct FluxSingleTransformerBlock {
    norm: AdaLayerNormZero,
    proj_mlp: Linear,
    proj_out: Linear,
    attn: JointAttention,
}

impl FluxSingleTransformerBlock {
    fn load(w: &Weights, c: &FluxTransformer2DConfig) -> Result<FluxSingleTransformerBlock> {
        let dim = c.inner_dim();
        let mlp = 4 * dim;
        let spec = JointAttentionSpec {
            dim,
            heads: c.num_attention_heads,
            head_dim: c.attention_head_dim,
            qk_norm: Some("rms_norm"),
            eps: 1e-6,
            added: false,
            added_out: false,
            out: false,
            text_first: true,
        };
        Ok(FluxSingleTransformerBlock {
            norm: AdaLayerNormZero::load(&w.pp("norm"), dim, 3)?,
            proj_mlp: Linear::load(&w.pp("proj_mlp"), dim, mlp, true)?,
            proj_out: Linear::load(&w.pp("proj_out"), dim + mlp, dim, true)?,
            attn: JointAttention::load(&w.pp("attn"), spec)?,
        })
    }

    /// One block on the joint sequence `x [B, S + L, dim]`.
    fn forward(&self, x: &Tensor, temb: &Tensor, rope: (&Tensor, &Tensor)) -> Result<Tensor> {
        let n = self.norm.forward(x, temb)?;
        let mlp = self.proj_mlp.forward(&n.x)?.gelu_tanh()?;
        let (attn, _) = self.attn.forward(&n.x, None, Some(rope))?;
        let h = self.proj_out.forward(&Tensor::cat(&[&attn, &mlp], 2)?)?;
        clip_f16(x.add(&gated(&n.rest[0], &h)?)?)
    }
}

/// `FluxTransformer2DModel`.
#[derive(Clone, Debug)]
pub struct FluxTransformer2DModel {
    x_embedder: Linear,
    context_embedder: Linear,
    time_text_embed: CombinedTimestepTextProj,
    transformer_blocks: Blocks<FluxTransformerBlock>,
    single_transformer_blocks: Blocks<FluxSingleTransformerBlock>,
    norm_out: AdaLayerNormContinuous,
    proj_out: Linear,
    stages: Stages,
    config: FluxTransformer2DConfig,
}

model_mixin!(FluxTransformer2DModel, FluxTransformer2DConfig, split);

/// The inputs of one [`FluxTransformer2DModel::forward`].
#[derive(Clone, Copy, Debug)]
pub struct FluxTransformerInput<'a> {
    /// Packed latents `[B, L, in_channels]`.
    pub hidden_states: &'a Tensor,
    /// T5 text tokens `[B, S, joint_attention_dim]`.
    pub encoder_hidden_states: &'a Tensor,
    /// Pooled CLIP text `[B, pooled_projection_dim]`.
    pub pooled_projections: &'a Tensor,
    /// Timesteps `[B]` (or one for the batch) as the pipeline passes them: sigma, in [0, 1].
    pub timestep: &'a Tensor,
    /// Image token positions `[L, 3]`.
    pub img_ids: &'a Tensor,
    /// Text token positions `[S, 3]`.
    pub txt_ids: &'a Tensor,
    /// The guidance scale `[B]` of guidance-distilled checkpoints (`guidance_embeds`).
    pub guidance: Option<&'a Tensor>,
}

impl FluxTransformer2DModel {
    /// Builds the model of `config` from the weights under `w` (diffusers' names).
    pub fn load(w: &Weights, config: &FluxTransformer2DConfig) -> Result<FluxTransformer2DModel> {
        let c = config;
        c.check()?;
        let dim = c.inner_dim();
        let transformer_blocks = Blocks::load(w, "transformer_blocks", c.num_layers, |_, bw| {
            FluxTransformerBlock::load(bw, c)
        })?;
        let single_transformer_blocks = Blocks::load(
            w,
            "single_transformer_blocks",
            c.num_single_layers,
            |_, bw| FluxSingleTransformerBlock::load(bw, c),
        )?;
        let blocks = transformer_blocks.devices().iter();
        let stages = Stages::of(
            w,
            blocks.chain(single_transformer_blocks.devices()),
            "proj_out",
        );
        Ok(FluxTransformer2DModel {
            x_embedder: Linear::load(&w.pp("x_embedder"), c.in_channels, dim, true)?,
            context_embedder: Linear::load(
                &w.pp("context_embedder"),
                c.joint_attention_dim,
                dim,
                true,
            )?,
            time_text_embed: CombinedTimestepTextProj::load(
                &w.pp("time_text_embed"),
                dim,
                c.pooled_projection_dim,
                c.guidance_embeds,
            )?,
            transformer_blocks,
            single_transformer_blocks,
            norm_out: AdaLayerNormContinuous::load(&w.pp("norm_out"), dim, dim, false, 1e-6)?,
            proj_out: Linear::load(
                &w.pp("proj_out"),
                dim,
                c.patch_size * c.patch_size * c.out_channels(),
                true,
            )?,
            stages,
            config: c.clone(),
        })
    }

    /// The rotary tables (cos, sin `[S + L, head_dim / 2]`) of the joint sequence's ids,
    /// as `FluxPosEmbed` computes them: per axis, `pos * theta^(-2i / dim)` in float64.
    pub fn rotary_tables(&self, ids: &[f32], device: &Device) -> Result<(Tensor, Tensor)> {
        let axes = &self.config.axes_dims_rope;
        let n = ids.len() / axes.len();
        let half: usize = axes.iter().sum::<usize>() / 2;
        // Per axis, its frequencies; the exponent in float64, as `torch.arange(0, dim, 2,
        // float64) / dim`.
        let freqs: Vec<Vec<f64>> = axes
            .iter()
            .map(|&dim| {
                (0..dim / 2)
                    .map(|i| 1.0 / THETA.powf((2 * i) as f64 / dim as f64))
                    .collect()
            })
            .collect();
        let (mut cos, mut sin) = (Vec::with_capacity(n * half), Vec::with_capacity(n * half));
        for row in ids.chunks(axes.len()) {
            for (&pos, freqs) in row.iter().zip(&freqs) {
                for freq in freqs {
                    let (s, c) = (pos as f64 * freq).sin_cos();
                    cos.push(c as f32);
                    sin.push(s as f32);
                }
            }
        }
        Ok((
            Tensor::from_vec(cos, &[n, half], device)?,
            Tensor::from_vec(sin, &[n, half], device)?,
        ))
    }

    /// The velocity prediction `[B, L, out_channels]` (packed, like the input).
    pub fn forward(&self, x: FluxTransformerInput<'_>) -> Result<Tensor> {
        let c = &self.config;
        let st = &self.stages;
        let latents = st.input(x.hidden_states)?;
        let [b, l, chans] = latents.shape()[..] else {
            return Err(Error::Shape(format!(
                "the packed latents must be [batch, tokens, {}], got {:?}",
                c.in_channels,
                x.hidden_states.shape()
            )));
        };
        if chans != c.in_channels {
            return Err(Error::Shape(format!(
                "the packed latents have {chans} channels per token, the transformer's in_channels is {}",
                c.in_channels
            )));
        }
        let ids = |t: &Tensor, what: &str, len: usize| -> Result<Vec<f32>> {
            let t = if t.rank() == 3 {
                t.narrow(0, 0, 1)?.squeeze(0)?
            } else {
                t.clone()
            };
            if t.shape() != [len, c.axes_dims_rope.len()] {
                return Err(Error::Shape(format!(
                    "{what} must be [{len}, {}] (one row of positions per token), got {:?}",
                    c.axes_dims_rope.len(),
                    t.shape()
                )));
            }
            Ok(t.to_dtype(DType::F32)?.to_vec::<f32>()?)
        };
        let context = st.input(x.encoder_hidden_states)?;
        let s = context.shape()[1];
        let mut joint_ids = ids(x.txt_ids, "txt_ids", s)?;
        joint_ids.extend(ids(x.img_ids, "img_ids", l)?);

        let batch = |t: &Tensor, what: &str| -> Result<Tensor> {
            super::per_sample(&t.to_device(&st.input)?, b, what)
        };
        // The pipeline passes sigma; the model embeds sigma * 1000, rounded as diffusers does
        // (in the latents' dtype).
        let scaled = |t: Tensor| -> Result<Tensor> {
            Ok(t.to_dtype(st.dtype)?
                .mul_scalar(1000.0)?
                .to_dtype(DType::F32)?)
        };
        let t = scaled(batch(x.timestep, "timestep")?)?;
        let guidance = match (x.guidance, self.time_text_embed.has_guidance()) {
            (Some(g), true) => Some(scaled(batch(g, "guidance")?)?),
            (None, true) => {
                return Err(Error::Input(
                    "this Flux transformer embeds a guidance scale (`guidance_embeds`): pass `guidance`".into(),
                ))
            }
            (_, false) => None,
        };
        let pooled = st.input(x.pooled_projections)?;
        let temb = self
            .time_text_embed
            .forward(&t, guidance.as_ref(), &pooled)?;
        let mut h = self.x_embedder.forward(&latents)?;
        let mut ctx = self.context_embedder.forward(&context)?;
        let (cos, sin) = self.rotary_tables(&joint_ids, &st.input)?;

        for (block, d) in self.transformer_blocks.iter() {
            let (cs, sn) = (on(&cos, d)?, on(&sin, d)?);
            let (nh, nc) = block.forward(&on(&h, d)?, &on(&ctx, d)?, &on(&temb, d)?, (&cs, &sn))?;
            h = nh;
            ctx = nc;
        }
        let mut joint = Tensor::cat(&[&ctx, &on(&h, ctx.device())?], 1)?;
        for (block, d) in self.single_transformer_blocks.iter() {
            let (cs, sn) = (on(&cos, d)?, on(&sin, d)?);
            joint = block.forward(&on(&joint, d)?, &on(&temb, d)?, (&cs, &sn))?;
        }
        let h = joint.narrow(1, s, l)?;
        let d = st.head;
        let h = self.norm_out.forward(&on(&h, d)?, &on(&temb, d)?)?;
        Ok(self.proj_out.forward(&h)?)
    }
}
