//! The sparse mixture-of-experts block of Mixtral (`MixtralSparseMoeBlock` in transformers'
//! `modeling_mixtral.py`), Qwen2-MoE (`Qwen2MoeSparseMoeBlock`) and Qwen3-MoE
//! (`Qwen3MoeSparseMoeBlock`): a linear router over the experts, softmax in f32, the top
//! `num_experts_per_tok`, each family's switches ([`MoeFeatures`]): renormalisation, a shared
//! expert behind a sigmoid gate, weights rounded to the model dtype, some layers left dense.
//! The experts themselves, and how each backend computes only the chosen ones, are
//! [`zoo_runtime::nn::Experts`]'. The decoder (`llama`) builds a layer's feed-forward from
//! here when its family's features ask for experts; the families only set the switches.

use zoo_hub::PretrainedConfig;
use zoo_runtime::nn::{ExpertNames, Experts, Linear, Weights};
use zoo_runtime::{Activation, DType, Tensor};

use super::llama::{self, DecoderFeatures, Mlp};
use crate::config::DecoderConfig;
use crate::family::Layout;
use crate::{Error, Result};

/// A family's config check: the decoder's, then its experts'.
pub(crate) fn validate_with(
    config: &PretrainedConfig,
    features: fn(&DecoderConfig) -> DecoderFeatures,
) -> Result<()> {
    let c = DecoderConfig::from_pretrained(config)?;
    match &features(&c).moe {
        Some(moe) => moe.check(&c),
        None => Ok(()),
    }
}

/// The planner's view of a MoE decoder: Llama's, with the activation width of the widest
/// formulation a backend may run. On PJRT a prefill runs every expert over every token
/// (`[E, T, 2I]`, then `[E, T, I]` and `[E, T, H]`), so that is what a layer must leave room
/// for; the expert weights themselves are counted from the checkpoint per layer.
pub(crate) fn layout_with(
    config: &PretrainedConfig,
    features: fn(&DecoderConfig) -> DecoderFeatures,
) -> Result<Layout> {
    let c = DecoderConfig::from_pretrained(config)?;
    let mut layout = llama::decoder_layout(&c, c.tie_word_embeddings);
    if let Some(m) = features(&c).moe {
        // The planner counts `2 * intermediate` activation values per token.
        let routed = m.experts * (3 * m.intermediate + c.hidden_size) / 2;
        let width = routed + m.shared_expert.unwrap_or(0);
        layout.shape.intermediate = layout.shape.intermediate.max(width);
    }
    Ok(layout)
}

/// How a family's mixture-of-experts layers route, from its config with transformers'
/// defaults filled in.
#[derive(Clone, Debug, PartialEq)]
pub struct MoeFeatures {
    /// Experts per MoE layer.
    pub experts: usize,
    /// The config field the count comes from, for errors.
    pub experts_field: &'static str,
    /// Experts each token runs through (`num_experts_per_tok`).
    pub top_k: usize,
    /// Width of each routed expert.
    pub intermediate: usize,
    /// Renormalise the top-k weights to sum to 1 (always in Mixtral; `norm_topk_prob` in Qwen).
    pub norm_topk_prob: bool,
    /// Round the routing weights to the model dtype before the weighted sum (Qwen); Mixtral
    /// keeps them in f32.
    pub weights_in_model_dtype: bool,
    /// Width of a shared expert every token also runs through, behind a sigmoid gate
    /// (Qwen2-MoE's `shared_expert_intermediate_size`).
    pub shared_expert: Option<usize>,
    /// Which layers route (the others keep a plain MLP of `intermediate_size`).
    pub sparse_layers: Vec<bool>,
    /// The per-expert tensor names of the checkpoint's original layout.
    pub names: ExpertNames,
}

impl MoeFeatures {
    /// Refuses routings transformers cannot run: no experts in a routed layer, or a top-k
    /// of zero or above the expert count.
    pub fn check(&self, c: &DecoderConfig) -> Result<()> {
        let bad = |reason: String| Error::Config {
            path: c.path.clone(),
            reason,
        };
        if !self.sparse_layers.contains(&true) {
            return Ok(());
        }
        if self.experts == 0 {
            return Err(bad(format!(
                "`{}` is 0 but layers are routed; it must be positive",
                self.experts_field
            )));
        }
        if self.top_k == 0 || self.top_k > self.experts {
            return Err(bad(format!(
                "`num_experts_per_tok` is {}; it must be between 1 and `{}` ({})",
                self.top_k, self.experts_field, self.experts
            )));
        }
        if self.intermediate == 0 || self.shared_expert == Some(0) {
            return Err(bad(
                "an expert width (`moe_intermediate_size`, `intermediate_size` or `shared_expert_intermediate_size`) is 0; it must be positive".into(),
            ));
        }
        Ok(())
    }

    /// Qwen MoE's rule for which layers route: `mlp_only_layers` stay dense, otherwise layer
    /// `i` routes when `(i + 1) % decoder_sparse_step == 0` and there are experts.
    /// (`DecoderConfig` has refused a step of 0.)
    pub fn qwen_sparse_layers(c: &DecoderConfig, experts: usize) -> Vec<bool> {
        let step = c.decoder_sparse_step.unwrap_or(1).max(1);
        let dense = c.mlp_only_layers.clone().unwrap_or_default();
        (0..c.num_hidden_layers)
            .map(|i| !dense.contains(&i) && experts > 0 && (i + 1) % step == 0)
            .collect()
    }
}

/// A shared expert and its gate (Qwen2-MoE).
#[derive(Clone, Debug)]
struct SharedExpert {
    mlp: Mlp,
    gate: Linear,
}

/// `MixtralSparseMoeBlock` (and Qwen2-MoE's and Qwen3-MoE's): route, run the chosen experts,
/// add the gated shared expert where there is one.
#[derive(Clone, Debug)]
pub(crate) struct SparseMoeBlock {
    gate: Linear,
    experts: Experts,
    shared: Option<SharedExpert>,
    top_k: usize,
    norm_topk_prob: bool,
    weights_in_model_dtype: bool,
}

impl SparseMoeBlock {
    /// The block of the layer under `lw`: Mixtral's original checkpoints call it
    /// `block_sparse_moe`, transformers and Qwen `mlp`.
    pub(crate) fn load(
        lw: &Weights,
        c: &DecoderConfig,
        f: &DecoderFeatures,
        moe: &MoeFeatures,
        act: Activation,
    ) -> Result<SparseMoeBlock> {
        moe.check(c)?;
        let w = if lw.contains("block_sparse_moe.gate.weight") {
            lw.pp("block_sparse_moe")
        } else {
            lw.pp("mlp")
        };
        let h = c.hidden_size;
        let shared = match moe.shared_expert {
            Some(width) => Some(SharedExpert {
                mlp: Mlp::load_sized(&w.pp("shared_expert"), h, width, f, act)?,
                gate: Linear::load(&w.pp("shared_expert_gate"), h, 1, false)?,
            }),
            None => None,
        };
        Ok(SparseMoeBlock {
            gate: Linear::load(&w.pp("gate"), h, moe.experts, false)?,
            experts: Experts::load(
                &w.pp("experts"),
                moe.experts,
                h,
                moe.intermediate,
                moe.names,
                act,
            )?,
            shared,
            top_k: moe.top_k,
            norm_topk_prob: moe.norm_topk_prob,
            weights_in_model_dtype: moe.weights_in_model_dtype,
        })
    }

    /// `x [B, T, H]` → `[B, T, H]`.
    pub(crate) fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let shape = x.shape().to_vec();
        let h = shape[shape.len() - 1];
        let flat = x.reshape_to(&[x.elem_count() / h, h])?;
        // The router's logits are a model-dtype product; the softmax and top-k run in f32.
        let probs = self
            .gate
            .forward(&flat)?
            .to_dtype(DType::F32)?
            .softmax(-1)?;
        let (mut weights, index) = probs.topk(self.top_k, -1)?;
        if self.norm_topk_prob {
            weights = weights.div(&weights.sum(&[-1], true)?)?;
        }
        if self.weights_in_model_dtype {
            weights = weights.to_dtype(x.dtype())?;
        }
        let mut y = self.experts.forward(&flat, &index, &weights)?;
        if let Some(s) = &self.shared {
            let gate = s.gate.forward(&flat)?.sigmoid()?;
            y = y.add(&gate.mul(&s.mlp.forward(&flat)?)?)?;
        }
        Ok(y.reshape_to(&shape)?)
    }
}
