//! `PixArtTransformer2DModel` (diffusers' `transformers/pixart_transformer_2d.py`): the
//! text-conditioned DiT of PixArt-α and PixArt-Σ. One adaLN-single embedding of the timestep
//! (and, for PixArt-α at 1024 px, the resolution and aspect ratio) modulates every block
//! through the block's own `scale_shift_table`; each block has self-attention, unnormalised
//! cross-attention to the T5 tokens (projected by `caption_projection`, padding masked) and
//! a feed-forward. Hub checkpoints may name the class `Transformer2DModel` (with
//! `norm_type = "ada_norm_single"`), which diffusers remaps to this one; zoo reads either.

use std::path::PathBuf;

use zoo_runtime::nn::{LayerNorm, Linear, Weights};
use zoo_runtime::{Activation, Tensor};

use super::attention::{Attention, AttentionSpec, FeedForward};
use super::embeddings::{PatchEmbed, TextProjection, TimestepSizeEmbeddings};
use super::modeling::{config_mixin, model_mixin, Blocks, Stages};
use super::normalization::{gated, modulate};
use super::{check_patch_transformer, ensure, on, unpatchify, Act};
use crate::configuration::register_to_config;
use crate::{Error, Result};

register_to_config! {
    /// `config.json` of a `PixArtTransformer2DModel`, with the defaults of diffusers' `__init__`
    /// (PixArt-α at 1024 px).
    #[allow(missing_docs)]
    pub struct PixArtTransformer2DConfig {
        pub num_attention_heads: usize = 16,
        pub attention_head_dim: usize = 72,
        pub in_channels: usize = 4,
        pub out_channels: Option<usize> = Some(8),
        pub num_layers: usize = 28,
        pub cross_attention_dim: Option<usize> = Some(1152),
        pub attention_bias: bool = true,
        pub sample_size: usize = 128,
        pub patch_size: usize = 2,
        pub activation_fn: String = "gelu-approximate".into(),
        pub norm_type: String = "ada_norm_single".into(),
        pub norm_elementwise_affine: bool = false,
        pub norm_eps: f64 = 1e-6,
        pub interpolation_scale: Option<f64> = None,
        pub use_additional_conditions: Option<bool> = None,
        pub caption_channels: Option<usize> = None,
        pub attention_type: String = "default".into(),
        /// Where the config was read from, for errors.
        #[serde(skip)]
        pub path: PathBuf = PathBuf::new(),
    }
}

config_mixin!(
    PixArtTransformer2DConfig,
    ["PixArtTransformer2DModel", "Transformer2DModel"],
    transformer
);

impl PixArtTransformer2DConfig {
    /// `interpolation_scale`, by default `max(sample_size / 64, 1)`.
    pub fn interpolation_scale(&self) -> f64 {
        self.interpolation_scale
            .unwrap_or((self.sample_size / 64).max(1) as f64)
    }

    /// Whether the resolution and aspect ratio condition the model (by default only at
    /// `sample_size` 128, PixArt-α's 1024 px models).
    pub fn use_additional_conditions(&self) -> bool {
        self.use_additional_conditions
            .unwrap_or(self.sample_size == 128)
    }

    /// The width of the text tokens the model takes: `caption_channels` (projected to the
    /// token width), else `cross_attention_dim`.
    pub fn text_dim(&self) -> Option<usize> {
        self.caption_channels.or(self.cross_attention_dim)
    }

    /// The checks diffusers' constructor (or its first call) would fail on, as typed errors
    /// naming the field.
    pub fn check(&self) -> Result<()> {
        let p = &self.path;
        let dim = self.inner_dim();
        ensure(self.norm_type == "ada_norm_single", p, || {
            format!(
                "`norm_type` is {:?}: a PixArt transformer uses \"ada_norm_single\" (\"ada_norm_zero\" is DiT's)",
                self.norm_type
            )
        })?;
        ensure(self.attention_type == "default", p, || {
            format!(
                "`attention_type` {:?} is not one zoo runs (default)",
                self.attention_type
            )
        })?;
        check_patch_transformer(
            p,
            self.patch_size,
            self.num_attention_heads,
            self.attention_head_dim,
            self.in_channels,
            self.num_layers,
        )?;
        ensure(
            !self.use_additional_conditions() || dim.is_multiple_of(3),
            p,
            || {
                format!(
                    "with `use_additional_conditions` the token width {dim} must be divisible by 3 (resolution and aspect-ratio embeddings of dim / 3 each)"
                )
            },
        )?;
        if let (Some(_), Some(cross)) = (self.caption_channels, self.cross_attention_dim) {
            ensure(cross == dim, p, || {
                format!(
                    "`cross_attention_dim` = {cross} must equal num_attention_heads * attention_head_dim = {dim}: `caption_projection` maps the captions to the token width"
                )
            })?;
        }
        ensure(self.interpolation_scale() > 0.0, p, || {
            "`interpolation_scale` must be positive".into()
        })
    }
}

/// `BasicTransformerBlock` with `norm_type = "ada_norm_single"`.
#[derive(Clone, Debug)]
pub struct PixArtBlock {
    scale_shift_table: Tensor,
    norm1: LayerNorm,
    attn1: Attention,
    attn2: Option<Attention>,
    norm2: LayerNorm,
    ff: FeedForward,
    dim: usize,
}

impl PixArtBlock {
    /// Loads one block of `config`.
    pub fn load(w: &Weights, c: &PixArtTransformer2DConfig) -> Result<PixArtBlock> {
        let dim = c.inner_dim();
        let spec = |cross: usize| AttentionSpec {
            query_dim: dim,
            cross_attention_dim: cross,
            heads: c.num_attention_heads,
            dim_head: c.attention_head_dim,
            bias: c.attention_bias,
            group_norm: None,
            residual_connection: false,
            rescale_output_factor: 1.0,
        };
        let norm = |name: &str| -> Result<LayerNorm> {
            Ok(if c.norm_elementwise_affine {
                LayerNorm::load(&w.pp(name), dim, c.norm_eps)?
            } else {
                LayerNorm::no_affine(c.norm_eps)
            })
        };
        Ok(PixArtBlock {
            scale_shift_table: w.get("scale_shift_table", &[6, dim])?,
            norm1: norm("norm1")?,
            attn1: Attention::load(&w.pp("attn1"), spec(dim))?,
            attn2: match c.cross_attention_dim {
                Some(cross) => Some(Attention::load(&w.pp("attn2"), spec(cross))?),
                None => None,
            },
            norm2: norm("norm2")?,
            ff: FeedForward::load(&w.pp("ff"), dim, 4 * dim, &c.activation_fn)?,
            dim,
        })
    }

    /// One block on tokens `x [B, L, dim]`: `timestep [B, 6 * dim]` is adaLN-single's
    /// modulation, `context [B, S, dim]` the text tokens and `mask` their `[B, 1, 1, S]`
    /// additive bias.
    pub fn forward(
        &self,
        x: &Tensor,
        timestep: &Tensor,
        context: Option<&Tensor>,
        mask: Option<&Tensor>,
    ) -> Result<Tensor> {
        let b = x.shape()[0];
        let table = on(&self.scale_shift_table, x.device())?;
        // shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp
        let m: Vec<Tensor> = table
            .unsqueeze(0)?
            .add(&timestep.reshape_to(&[b, 6, self.dim])?)?
            .chunk(6, 1)?
            .into_iter()
            .map(|t| t.reshape_to(&[b, self.dim]))
            .collect::<zoo_runtime::Result<_>>()?;
        let h = modulate(&self.norm1.forward(x)?, &m[0], &m[1])?;
        let mut x = x.add(&gated(&m[2], &self.attn1.forward(&h, None)?)?)?;
        if let (Some(attn2), Some(ctx)) = (&self.attn2, context) {
            // PixArt's cross-attention reads the stream without a norm.
            x = x.add(&attn2.forward_masked(&x, Some(ctx), mask)?)?;
        }
        let h = modulate(&self.norm2.forward(&x)?, &m[3], &m[4])?;
        Ok(x.add(&gated(&m[5], &self.ff.forward(&h)?)?)?)
    }
}

/// `PixArtTransformer2DModel`.
#[derive(Clone, Debug)]
pub struct PixArtTransformer2DModel {
    pos_embed: PatchEmbed,
    adaln_emb: TimestepSizeEmbeddings,
    adaln_linear: Linear,
    caption_projection: Option<TextProjection>,
    transformer_blocks: Blocks<PixArtBlock>,
    norm_out: LayerNorm,
    scale_shift_table: Tensor,
    proj_out: Linear,
    stages: Stages,
    config: PixArtTransformer2DConfig,
}

model_mixin!(PixArtTransformer2DModel, PixArtTransformer2DConfig, split);

/// The inputs of one [`PixArtTransformer2DModel::forward`].
#[derive(Clone, Copy, Debug)]
pub struct PixArtTransformerInput<'a> {
    /// Latents `[B, in_channels, H, W]`.
    pub hidden_states: &'a Tensor,
    /// Text tokens `[B, S, caption_channels]` (T5's last hidden state).
    pub encoder_hidden_states: &'a Tensor,
    /// `[B, S]`: 1 for a token, 0 for padding (none: every token attends).
    pub encoder_attention_mask: Option<&'a Tensor>,
    /// Timesteps `[B]` (or one for the batch) on the 0..1000 scale.
    pub timestep: &'a Tensor,
    /// `(resolution [B, 2] as (height, width) in pixels, aspect_ratio [B, 1] = height /
    /// width)`, for models that use additional conditions.
    pub added_cond: Option<(&'a Tensor, &'a Tensor)>,
}

impl PixArtTransformer2DModel {
    /// Builds the model of `config` from the weights under `w` (diffusers' names).
    pub fn load(
        w: &Weights,
        config: &PixArtTransformer2DConfig,
    ) -> Result<PixArtTransformer2DModel> {
        let c = config;
        c.check()?;
        let dim = c.inner_dim();
        let p = c.patch_size;
        let blocks = Blocks::load(w, "transformer_blocks", c.num_layers, |_, bw| {
            PixArtBlock::load(bw, c)
        })?;
        let stages = Stages::of(w, blocks.devices(), "proj_out");
        let caption_projection = match c.caption_channels {
            Some(ch) => Some(TextProjection::load(
                &w.pp("caption_projection"),
                ch,
                dim,
                dim,
                Act::Runtime(Activation::GeluTanh),
            )?),
            None => None,
        };
        Ok(PixArtTransformer2DModel {
            pos_embed: PatchEmbed::load(
                &w.pp("pos_embed"),
                c.in_channels,
                dim,
                p,
                c.sample_size,
                None,
                c.interpolation_scale(),
            )?,
            adaln_emb: TimestepSizeEmbeddings::load(
                &w.pp("adaln_single.emb"),
                dim,
                c.use_additional_conditions(),
            )?,
            adaln_linear: Linear::load(&w.pp("adaln_single.linear"), dim, 6 * dim, true)?,
            caption_projection,
            transformer_blocks: blocks,
            norm_out: LayerNorm::no_affine(1e-6),
            scale_shift_table: w.get("scale_shift_table", &[2, dim])?,
            proj_out: Linear::load(&w.pp("proj_out"), dim, p * p * c.out_channels(), true)?,
            stages,
            config: c.clone(),
        })
    }

    /// The prediction `[B, out_channels, H, W]`.
    pub fn forward(&self, x: PixArtTransformerInput<'_>) -> Result<Tensor> {
        let c = &self.config;
        let st = &self.stages;
        let (latents, t, (b, height, width)) =
            st.patch_input(x.hidden_states, x.timestep, c.in_channels, c.patch_size)?;
        let added = match x.added_cond {
            Some((r, a)) => Some((st.input(r)?, st.input(a)?)),
            None => None,
        };
        let mut h = self.pos_embed.forward(&latents)?;
        let embedded = self
            .adaln_emb
            .forward(&t, added.as_ref().map(|(r, a)| (r, a)), st.dtype)?;
        let timestep = self.adaln_linear.forward(&embedded.silu()?)?;
        let ctx = st.input(x.encoder_hidden_states)?;
        let [cb, s, width_in] = ctx.shape()[..] else {
            return Err(Error::Shape(format!(
                "the text tokens must be [batch, length, width], got {:?}",
                ctx.shape()
            )));
        };
        if cb != b || Some(width_in) != c.text_dim() {
            return Err(Error::Shape(format!(
                "the text tokens are {:?}; this model takes [{b}, length, {}]",
                ctx.shape(),
                c.text_dim().unwrap_or(0)
            )));
        }
        let ctx = match &self.caption_projection {
            Some(p) => p.forward(&ctx)?,
            None => ctx,
        };
        let mask = match x.encoder_attention_mask {
            Some(m) if m.shape() == [b, s] => Some(
                st.input(m)?
                    .affine(10000.0, -10000.0)?
                    .reshape_to(&[b, 1, 1, s])?,
            ),
            Some(m) => {
                return Err(Error::Shape(format!(
                "the text attention mask is {:?}; it must be [{b}, {s}] (1 = token, 0 = padding)",
                m.shape()
            )))
            }
            None => None,
        };
        for (block, d) in self.transformer_blocks.iter() {
            let ctx = on(&ctx, d)?;
            let mask = mask.as_ref().map(|m| on(m, d)).transpose()?;
            h = block.forward(&on(&h, d)?, &on(&timestep, d)?, Some(&ctx), mask.as_ref())?;
        }
        let d = st.head;
        let dim = c.inner_dim();
        let mods = on(&self.scale_shift_table, d)?
            .unsqueeze(0)?
            .add(&on(&embedded, d)?.unsqueeze(1)?)?
            .chunk(2, 1)?;
        let (shift, scale) = (
            mods[0].reshape_to(&[b, dim])?,
            mods[1].reshape_to(&[b, dim])?,
        );
        let h = modulate(&self.norm_out.forward(&on(&h, d)?)?, &shift, &scale)?;
        unpatchify(
            &self.proj_out.forward(&h)?,
            b,
            height,
            width,
            c.patch_size,
            c.out_channels(),
        )
    }
}
