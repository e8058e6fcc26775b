//! `DiTTransformer2DModel` (diffusers' `transformers/dit_transformer_2d.py`): the
//! class-conditional Diffusion Transformer. Latent patches pass through
//! `BasicTransformerBlock`s with adaLN-Zero (each block embeds the timestep and the class
//! label itself), then a modulated LayerNorm and a projection back to patches. The Hub's DiT
//! checkpoints name the class `Transformer2DModel` (with `norm_type = "ada_norm_zero"`),
//! which diffusers remaps to this one; zoo reads either.

use std::path::PathBuf;

use zoo_runtime::nn::{LayerNorm, Linear, Weights};
use zoo_runtime::{DType, Tensor};

use super::attention::{Attention, AttentionSpec, FeedForward};
use super::embeddings::{CombinedTimestepLabelEmbeddings, PatchEmbed};
use super::modeling::{config_mixin, model_mixin, Blocks, Stages};
use super::normalization::{gated, modulate, AdaLayerNormZero};
use super::{check_patch_transformer, ensure, on, unpatchify};
use crate::configuration::register_to_config;
use crate::{Error, Result};

register_to_config! {
    /// `config.json` of a `DiTTransformer2DModel`, with the defaults of diffusers' `__init__`
    /// (DiT-XL/2 at 256 px).
    #[allow(missing_docs)]
    pub struct DiTTransformer2DConfig {
        pub num_attention_heads: usize = 16,
        pub attention_head_dim: usize = 72,
        pub in_channels: usize = 4,
        pub out_channels: Option<usize> = None,
        pub num_layers: usize = 28,
        pub attention_bias: bool = true,
        pub sample_size: usize = 32,
        pub patch_size: usize = 2,
        pub activation_fn: String = "gelu-approximate".into(),
        pub num_embeds_ada_norm: Option<usize> = Some(1000),
        pub norm_type: String = "ada_norm_zero".into(),
        pub norm_elementwise_affine: bool = false,
        pub norm_eps: f64 = 1e-5,
        /// Where the config was read from, for errors.
        #[serde(skip)]
        pub path: PathBuf = PathBuf::new(),
    }
}

config_mixin!(
    DiTTransformer2DConfig,
    ["DiTTransformer2DModel", "Transformer2DModel"],
    transformer
);

impl DiTTransformer2DConfig {
    /// The number of class labels (`num_embeds_ada_norm`); label `num_classes` is the null
    /// label of classifier-free guidance.
    pub fn num_classes(&self) -> usize {
        self.num_embeds_ada_norm.unwrap_or(1000)
    }

    /// The checks diffusers' constructor would fail on, as typed errors naming the field.
    pub fn check(&self) -> Result<()> {
        let p = &self.path;
        ensure(self.norm_type == "ada_norm_zero", p, || {
            format!(
                "`norm_type` is {:?}: a DiT transformer uses \"ada_norm_zero\" (\"ada_norm_single\" is PixArt's)",
                self.norm_type
            )
        })?;
        ensure(self.num_embeds_ada_norm.is_some(), p, || {
            "`num_embeds_ada_norm` (the number of class labels) must be set for a DiT".into()
        })?;
        check_patch_transformer(
            p,
            self.patch_size,
            self.num_attention_heads,
            self.attention_head_dim,
            self.in_channels,
            self.num_layers,
        )
    }
}

/// `BasicTransformerBlock` with `norm_type = "ada_norm_zero"` and no cross-attention.
#[derive(Clone, Debug)]
pub struct DiTBlock {
    emb: CombinedTimestepLabelEmbeddings,
    norm1: AdaLayerNormZero,
    attn1: Attention,
    norm3: LayerNorm,
    ff: FeedForward,
}

impl DiTBlock {
    /// Loads one block of `config`.
    pub fn load(w: &Weights, c: &DiTTransformer2DConfig) -> Result<DiTBlock> {
        let dim = c.inner_dim();
        Ok(DiTBlock {
            emb: CombinedTimestepLabelEmbeddings::load(
                &w.pp("norm1.emb"),
                c.num_classes(),
                dim,
                true,
            )?,
            norm1: AdaLayerNormZero::load(&w.pp("norm1"), dim, 6)?,
            attn1: Attention::load(
                &w.pp("attn1"),
                AttentionSpec {
                    query_dim: dim,
                    cross_attention_dim: dim,
                    heads: c.num_attention_heads,
                    dim_head: c.attention_head_dim,
                    bias: c.attention_bias,
                    group_norm: None,
                    residual_connection: false,
                    rescale_output_factor: 1.0,
                },
            )?,
            norm3: if c.norm_elementwise_affine {
                LayerNorm::load(&w.pp("norm3"), dim, c.norm_eps)?
            } else {
                LayerNorm::no_affine(c.norm_eps)
            },
            ff: FeedForward::load(&w.pp("ff"), dim, 4 * dim, &c.activation_fn)?,
        })
    }

    /// The block's own conditioning `[B, dim]` of `timestep [B]` and `class_labels [B]`.
    pub fn conditioning(&self, timestep: &Tensor, labels: &Tensor, dtype: DType) -> Result<Tensor> {
        self.emb.forward(timestep, labels, dtype)
    }

    /// One block on tokens `x [B, L, dim]` conditioned on `cond` (from
    /// [`DiTBlock::conditioning`]).
    pub fn forward(&self, x: &Tensor, cond: &Tensor) -> Result<Tensor> {
        let n = self.norm1.forward(x, cond)?;
        // rest: gate_msa, shift_mlp, scale_mlp, gate_mlp
        let r = &n.rest;
        let x = x.add(&gated(&r[0], &self.attn1.forward(&n.x, None)?)?)?;
        let h = modulate(&self.norm3.forward(&x)?, &r[1], &r[2])?;
        Ok(x.add(&gated(&r[3], &self.ff.forward(&h)?)?)?)
    }
}

/// `DiTTransformer2DModel`.
#[derive(Clone, Debug)]
pub struct DiTTransformer2DModel {
    pos_embed: PatchEmbed,
    transformer_blocks: Blocks<DiTBlock>,
    norm_out: LayerNorm,
    proj_out_1: Linear,
    proj_out_2: Linear,
    stages: Stages,
    config: DiTTransformer2DConfig,
}

model_mixin!(DiTTransformer2DModel, DiTTransformer2DConfig, split);

impl DiTTransformer2DModel {
    /// Builds the model of `config` from the weights under `w` (diffusers' names).
    pub fn load(w: &Weights, config: &DiTTransformer2DConfig) -> Result<DiTTransformer2DModel> {
        let c = config;
        c.check()?;
        let dim = c.inner_dim();
        let p = c.patch_size;
        let blocks = Blocks::load(w, "transformer_blocks", c.num_layers, |_, bw| {
            DiTBlock::load(bw, c)
        })?;
        let stages = Stages::of(w, blocks.devices(), "proj_out_2");
        Ok(DiTTransformer2DModel {
            pos_embed: PatchEmbed::load(
                &w.pp("pos_embed"),
                c.in_channels,
                dim,
                p,
                c.sample_size,
                None,
                1.0,
            )?,
            transformer_blocks: blocks,
            norm_out: LayerNorm::no_affine(1e-6),
            proj_out_1: Linear::load(&w.pp("proj_out_1"), dim, 2 * dim, true)?,
            proj_out_2: Linear::load(&w.pp("proj_out_2"), dim, p * p * c.out_channels(), true)?,
            stages,
            config: c.clone(),
        })
    }

    /// The prediction `[B, out_channels, H, W]` for latents `[B, in_channels, H, W]`,
    /// timesteps `[B]` (or one for all) on the 0..1000 scale and class labels `[B]`
    /// (`num_classes` = the null label).
    pub fn forward(
        &self,
        hidden_states: &Tensor,
        timestep: &Tensor,
        class_labels: &Tensor,
    ) -> Result<Tensor> {
        let c = &self.config;
        let st = &self.stages;
        let (latents, t, (b, height, width)) =
            st.patch_input(hidden_states, timestep, c.in_channels, c.patch_size)?;
        let labels = super::per_sample(&class_labels.to_device(&st.input)?, b, "class labels")?;
        if let Some(first) = self.transformer_blocks.first() {
            first.emb.check_labels(&labels)?;
        }
        let mut h = self.pos_embed.forward(&latents)?;
        let mut first_cond = None;
        for (block, d) in self.transformer_blocks.iter() {
            let (t, labels) = (on(&t, d)?, on(&labels, d)?);
            let cond = block.conditioning(&t, &labels, st.dtype)?;
            h = block.forward(&on(&h, d)?, &cond)?;
            first_cond.get_or_insert(cond);
        }
        let d = st.head;
        // diffusers conditions the output on the first block's embedding.
        let cond = first_cond.ok_or_else(|| Error::Shape("the model has no blocks".into()))?;
        let mods = self
            .proj_out_1
            .forward(&on(&cond, d)?.silu()?)?
            .chunk(2, 1)?;
        let h = modulate(&self.norm_out.forward(&on(&h, d)?)?, &mods[0], &mods[1])?;
        unpatchify(
            &self.proj_out_2.forward(&h)?,
            b,
            height,
            width,
            c.patch_size,
            c.out_channels(),
        )
    }
}
