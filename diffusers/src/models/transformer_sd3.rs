//! `SD3Transformer2DModel` (diffusers' `transformers/transformer_sd3.py`): the MMDiT of
//! Stable Diffusion 3 / 3.5. Latent patches and text tokens each get adaLN-Zero-modulated
//! joint attention and feed-forwards (`JointTransformerBlock`); SD 3.5 adds per-head q/k
//! norms (`qk_norm`) and, in `dual_attention_layers`, a second image-only attention.

use std::path::PathBuf;

use zoo_runtime::nn::{LayerNorm, Linear, Weights};
use zoo_runtime::Tensor;

use super::attention::FeedForward;
use super::embeddings::{CombinedTimestepTextProj, PatchEmbed};
use super::joint_attention::{JointAttention, JointAttentionSpec};
use super::modeling::{config_mixin, model_mixin, Blocks, Stages};
use super::normalization::{gated, modulate, AdaLayerNormContinuous, AdaLayerNormZero};
use super::{ensure, on};
use crate::configuration::register_to_config;
use crate::{Error, Result};

register_to_config! {
    /// `config.json` of an `SD3Transformer2DModel`, with the defaults of diffusers' `__init__`
    /// (SD 3 Medium's MMDiT).
    #[allow(missing_docs)]
    pub struct SD3Transformer2DConfig {
        pub sample_size: usize = 128,
        pub patch_size: usize = 2,
        pub in_channels: usize = 16,
        pub num_layers: usize = 18,
        pub attention_head_dim: usize = 64,
        pub num_attention_heads: usize = 18,
        pub joint_attention_dim: usize = 4096,
        pub caption_projection_dim: usize = 1152,
        pub pooled_projection_dim: usize = 2048,
        // diffusers' 16 is `in_channels`' default, which `out_channels()` falls back to.
        pub out_channels: Option<usize> = None,
        pub pos_embed_max_size: Option<usize> = Some(96),
        pub dual_attention_layers: Vec<usize> = Vec::new(),
        pub qk_norm: Option<String> = None,
        /// Where the config was read from, for errors.
        #[serde(skip)]
        pub path: PathBuf = PathBuf::new(),
    }
}

config_mixin!(
    SD3Transformer2DConfig,
    ["SD3Transformer2DModel"],
    transformer
);

impl SD3Transformer2DConfig {
    /// The checks diffusers' constructor would fail on, as typed errors naming the field.
    pub fn check(&self) -> Result<()> {
        let p = &self.path;
        super::check_patch_transformer(
            p,
            self.patch_size,
            self.num_attention_heads,
            self.attention_head_dim,
            self.in_channels,
            self.num_layers,
        )?;
        ensure(self.caption_projection_dim == self.inner_dim(), p, || {
            format!(
                "`caption_projection_dim` = {} must equal num_attention_heads * attention_head_dim = {}: the text tokens join the image tokens' attention",
                self.caption_projection_dim,
                self.inner_dim()
            )
        })?;
        if let Some(&bad) = self
            .dual_attention_layers
            .iter()
            .find(|&&i| i >= self.num_layers)
        {
            return Err(Error::Config {
                path: p.clone(),
                reason: format!(
                    "`dual_attention_layers` names layer {bad}, but there are {} (`num_layers`)",
                    self.num_layers
                ),
            });
        }
        if let Some(k) = &self.qk_norm {
            ensure(matches!(k.as_str(), "rms_norm" | "layer_norm"), p, || {
                format!("`qk_norm` {k:?} is not one zoo runs (rms_norm, layer_norm)")
            })?;
        }
        Ok(())
    }
}

/// `JointTransformerBlock`: joint attention of image and text tokens, each stream with its
/// own adaLN-Zero and feed-forward; the last block (`context_pre_only`) keeps only the image
/// stream's output.
#[derive(Clone, Debug)]
pub struct JointTransformerBlock {
    norm1: AdaLayerNormZero,
    norm1_context: ContextNorm,
    attn: JointAttention,
    attn2: Option<JointAttention>,
    ff: FeedForward,
    ff_context: Option<FeedForward>,
    norm2: LayerNorm,
}

/// The text stream's input norm: adaLN-Zero, or the last block's continuous norm.
#[derive(Clone, Debug)]
enum ContextNorm {
    Zero(AdaLayerNormZero),
    Continuous(AdaLayerNormContinuous),
}

impl JointTransformerBlock {
    /// Loads block weights for `dim`-wide tokens.
    pub fn load(
        w: &Weights,
        c: &SD3Transformer2DConfig,
        context_pre_only: bool,
        dual: bool,
    ) -> Result<JointTransformerBlock> {
        let dim = c.inner_dim();
        let spec = JointAttentionSpec {
            dim,
            heads: c.num_attention_heads,
            head_dim: c.attention_head_dim,
            qk_norm: c.qk_norm.as_deref(),
            eps: 1e-6,
            added: true,
            added_out: !context_pre_only,
            out: true,
            text_first: false,
        };
        let norm1_context = if context_pre_only {
            ContextNorm::Continuous(AdaLayerNormContinuous::load(
                &w.pp("norm1_context"),
                dim,
                dim,
                false,
                1e-6,
            )?)
        } else {
            ContextNorm::Zero(AdaLayerNormZero::load(&w.pp("norm1_context"), dim, 6)?)
        };
        Ok(JointTransformerBlock {
            norm1: AdaLayerNormZero::load(&w.pp("norm1"), dim, if dual { 9 } else { 6 })?,
            norm1_context,
            attn: JointAttention::load(&w.pp("attn"), spec)?,
            attn2: if dual {
                let solo = JointAttentionSpec {
                    added: false,
                    added_out: false,
                    ..spec
                };
                Some(JointAttention::load(&w.pp("attn2"), solo)?)
            } else {
                None
            },
            ff: FeedForward::load(&w.pp("ff"), dim, 4 * dim, "gelu-approximate")?,
            ff_context: if context_pre_only {
                None
            } else {
                Some(FeedForward::load(
                    &w.pp("ff_context"),
                    dim,
                    4 * dim,
                    "gelu-approximate",
                )?)
            },
            norm2: LayerNorm::no_affine(1e-6),
        })
    }

    /// One block on image tokens `x [B, L, dim]` and text tokens `context [B, S, dim]`
    /// conditioned on `temb [B, dim]`: the new image tokens and (but for the last block) text
    /// tokens.
    pub fn forward(
        &self,
        x: &Tensor,
        context: &Tensor,
        temb: &Tensor,
    ) -> Result<(Tensor, Option<Tensor>)> {
        let n = self.norm1.forward(x, temb)?;
        // rest: gate_msa, shift_mlp, scale_mlp, gate_mlp[, shift_msa2, scale_msa2, gate_msa2]
        let r = &n.rest;
        let (ctx_in, ctx_mod) = match &self.norm1_context {
            ContextNorm::Zero(norm) => {
                let m = norm.forward(context, temb)?;
                (m.x, Some(m.rest))
            }
            ContextNorm::Continuous(norm) => (norm.forward(context, temb)?, None),
        };
        let (attn, ctx_attn) = self.attn.forward(&n.x, Some(&ctx_in), None)?;
        let mut x = x.add(&gated(&r[0], &attn)?)?;
        if let Some(attn2) = &self.attn2 {
            let x2 = modulate(&n.normed, &r[4], &r[5])?;
            let (a2, _) = attn2.forward(&x2, None, None)?;
            x = x.add(&gated(&r[6], &a2)?)?;
        }
        let h = modulate(&self.norm2.forward(&x)?, &r[1], &r[2])?;
        let x = x.add(&gated(&r[3], &self.ff.forward(&h)?)?)?;
        let context = match (ctx_mod, ctx_attn, &self.ff_context) {
            (Some(m), Some(ca), Some(ff)) => {
                let c = context.add(&gated(&m[0], &ca)?)?;
                let h = modulate(&self.norm2.forward(&c)?, &m[1], &m[2])?;
                Some(c.add(&gated(&m[3], &ff.forward(&h)?)?)?)
            }
            _ => None,
        };
        Ok((x, context))
    }
}

/// `SD3Transformer2DModel`.
#[derive(Clone, Debug)]
pub struct SD3Transformer2DModel {
    pos_embed: PatchEmbed,
    time_text_embed: CombinedTimestepTextProj,
    context_embedder: Linear,
    transformer_blocks: Blocks<JointTransformerBlock>,
    norm_out: AdaLayerNormContinuous,
    proj_out: Linear,
    stages: Stages,
    config: SD3Transformer2DConfig,
}

model_mixin!(SD3Transformer2DModel, SD3Transformer2DConfig, split);

/// The inputs of one [`SD3Transformer2DModel::forward`].
#[derive(Clone, Copy, Debug)]
pub struct SD3TransformerInput<'a> {
    /// Latents `[B, in_channels, H, W]`.
    pub hidden_states: &'a Tensor,
    /// Text tokens `[B, S, joint_attention_dim]`.
    pub encoder_hidden_states: &'a Tensor,
    /// Pooled text `[B, pooled_projection_dim]`.
    pub pooled_projections: &'a Tensor,
    /// Timesteps `[B]` (or one for the batch), on the training scale (0..1000).
    pub timestep: &'a Tensor,
    /// Blocks to skip (skip-layer guidance's `skip_layers`).
    pub skip_layers: &'a [usize],
}

impl SD3Transformer2DModel {
    /// Builds the model of `config` from the weights under `w` (diffusers' names).
    pub fn load(w: &Weights, config: &SD3Transformer2DConfig) -> Result<SD3Transformer2DModel> {
        let c = config;
        c.check()?;
        let dim = c.inner_dim();
        let p = c.patch_size;
        let blocks = Blocks::load(w, "transformer_blocks", c.num_layers, |i, bw| {
            JointTransformerBlock::load(
                bw,
                c,
                i + 1 == c.num_layers,
                c.dual_attention_layers.contains(&i),
            )
        })?;
        let stages = Stages::of(w, blocks.devices(), "proj_out");
        Ok(SD3Transformer2DModel {
            pos_embed: PatchEmbed::load(
                &w.pp("pos_embed"),
                c.in_channels,
                dim,
                p,
                c.sample_size,
                c.pos_embed_max_size,
                1.0,
            )?,
            time_text_embed: CombinedTimestepTextProj::load(
                &w.pp("time_text_embed"),
                dim,
                c.pooled_projection_dim,
                false,
            )?,
            context_embedder: Linear::load(
                &w.pp("context_embedder"),
                c.joint_attention_dim,
                c.caption_projection_dim,
                true,
            )?,
            transformer_blocks: blocks,
            norm_out: AdaLayerNormContinuous::load(&w.pp("norm_out"), dim, dim, false, 1e-6)?,
            proj_out: Linear::load(&w.pp("proj_out"), dim, p * p * c.out_channels(), true)?,
            stages,
            config: c.clone(),
        })
    }

    /// The velocity prediction `[B, out_channels, H, W]`.
    pub fn forward(&self, x: SD3TransformerInput<'_>) -> Result<Tensor> {
        let c = &self.config;
        let st = &self.stages;
        let p = c.patch_size;
        let (latents, t, (b, height, width)) =
            st.patch_input(x.hidden_states, x.timestep, c.in_channels, p)?;
        let pooled = st.input(x.pooled_projections)?;
        let mut h = self.pos_embed.forward(&latents)?;
        let temb = self.time_text_embed.forward(&t, None, &pooled)?;
        let mut ctx = self
            .context_embedder
            .forward(&st.input(x.encoder_hidden_states)?)?;
        for (i, (block, d)) in self.transformer_blocks.iter().enumerate() {
            if x.skip_layers.contains(&i) {
                continue;
            }
            let (nh, nc) = block.forward(&on(&h, d)?, &on(&ctx, d)?, &on(&temb, d)?)?;
            h = nh;
            if let Some(nc) = nc {
                ctx = nc;
            }
        }
        let d = st.head;
        let h = self.norm_out.forward(&on(&h, d)?, &on(&temb, d)?)?;
        let h = self.proj_out.forward(&h)?;
        super::unpatchify(&h, b, height, width, p, c.out_channels())
    }
}
