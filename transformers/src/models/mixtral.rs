//! Mixtral: mirrors transformers' `models/mixtral/modeling_mixtral.py` (`modular_mixtral.py`
//! derives it from Mistral).
//!
//! What differs from Mistral: every layer's MLP is a sparse mixture of experts
//! (`MixtralSparseMoeBlock`): a linear router over `num_local_experts`, softmax in f32, the
//! top `num_experts_per_tok` renormalised to sum to 1 and kept in f32 for the weighted sum.
//! The block lives here because Qwen2-MoE and Qwen3-MoE are the same block with their own
//! switches ([`MoeFeatures`]): a shared expert behind a sigmoid gate, optional
//! renormalisation, weights rounded to the model dtype, some layers left dense. The experts
//! themselves, and how each backend computes only the chosen ones, are
//! [`zoo_runtime::nn::Experts`]'.
//!
//! Checkpoints store the experts per expert (`block_sparse_moe.experts.N.w1/w3/w2`, Mixtral's
//! original names) or fused as transformers holds them in memory
//! (`mlp.experts.gate_up_proj [E, 2I, H]`, `mlp.experts.down_proj [E, H, I]`); both load.

use zoo_hub::PretrainedConfig;
use zoo_runtime::nn::{ExpertNames, Experts, Linear, Weights};
use zoo_runtime::{Activation, DType, Tensor};

use super::llama::{self, DecoderFeatures, LlamaForCausalLM, LlamaModel, Mlp};
use crate::config::DecoderConfig;
use crate::registry::{Architecture, Family, Layout, Loaders, Task};
use crate::{Error, Result};

/// The registry entry of `mixtral`: the Llama decoder with Mistral's attention and a
/// mixture of experts in every layer.
pub(crate) const FAMILY: Family = Family {
    model_type: "mixtral",
    modeling_file: "models/mixtral/modeling_mixtral.py",
    architectures: &[
        Architecture {
            name: "MixtralForCausalLM",
            task: Task::CausalLm,
        },
        Architecture {
            name: "MixtralModel",
            task: Task::Base,
        },
    ],
    // llama.cpp writes Mixtral as `llama` files with stacked experts (`ffn_*_exps`); zoo-hub
    // reads those as `MixtralForCausalLM`, so the llama entry lists the name.
    gguf_architectures: &[],
    no_split_modules: &["MixtralDecoderLayer"],
    validate: |c| validate_with(c, features),
    layout: |c| layout_with(c, features),
    loaders: Loaders::Decoder {
        base: |w, c| llama::load_base_with(w, c, features),
        causal_lm: |w, c| llama::load_causal_lm_with(w, c, features),
    },
};

/// `MixtralModel`: the Llama decoder with Mixtral's switches.
pub type MixtralModel = LlamaModel;
/// `MixtralForCausalLM`: the Llama causal LM with Mixtral's switches.
pub type MixtralForCausalLM = LlamaForCausalLM;

/// Mixtral's switches: Mistral's attention (no biases, the window on every layer) and
/// experts in every layer (transformers' defaults: 8 experts, top 2).
pub fn features(config: &DecoderConfig) -> DecoderFeatures {
    let c = config;
    DecoderFeatures {
        qkv_bias: false,
        o_bias: false,
        mlp_bias: false,
        qk_norm: false,
        windows: c.windows(|_| true),
        fused_qkv: false,
        fused_gate_up: false,
        moe: Some(MoeFeatures {
            experts: c.local_experts().unwrap_or(8),
            experts_field: "num_local_experts",
            top_k: c.num_experts_per_tok.unwrap_or(2),
            intermediate: c.intermediate_size,
            norm_topk_prob: true,
            weights_in_model_dtype: false,
            shared_expert: None,
            sparse_layers: vec![true; c.num_hidden_layers],
            names: ExpertNames {
                gate: "w1",
                up: "w3",
                down: "w2",
            },
        }),
        longrope_recompute: false,
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn config(extra: serde_json::Value) -> Result<DecoderConfig> {
        let mut v = json!({
            "model_type": "mixtral", "vocab_size": 16, "hidden_size": 8, "intermediate_size": 16,
            "num_hidden_layers": 2, "num_attention_heads": 2,
        });
        v.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        let cfg = PretrainedConfig::from_value(v, std::path::Path::new("config.json")).unwrap();
        DecoderConfig::from_pretrained(&cfg)
    }

    #[test]
    fn mixtral_defaults_are_transformers() {
        let c = config(json!({})).unwrap();
        let moe = features(&c).moe.unwrap();
        assert_eq!((moe.experts, moe.top_k), (8, 2));
        assert!(moe.norm_topk_prob && !moe.weights_in_model_dtype);
        assert_eq!(moe.sparse_layers, vec![true, true]);
        // `num_experts` is an alias of `num_local_experts` (transformers' attribute_map).
        let c = config(json!({"num_experts": 4})).unwrap();
        assert_eq!(features(&c).moe.unwrap().experts, 4);
    }

    #[test]
    fn impossible_routings_are_refused_naming_the_field() {
        let c = config(json!({"num_local_experts": 2, "num_experts_per_tok": 3})).unwrap();
        let e = features(&c).moe.unwrap().check(&c).unwrap_err().to_string();
        assert!(
            e.contains("num_experts_per_tok") && e.contains("num_local_experts"),
            "{e}"
        );
        let c = config(json!({"num_local_experts": 0})).unwrap();
        let e = features(&c).moe.unwrap().check(&c).unwrap_err().to_string();
        assert!(e.contains("`num_local_experts` is 0"), "{e}");
        let e = config(json!({"decoder_sparse_step": 0}))
            .unwrap_err()
            .to_string();
        assert!(e.contains("decoder_sparse_step"), "{e}");
    }

    #[test]
    fn qwen_layer_rule_follows_step_and_dense_list() {
        let c = config(
            json!({"num_hidden_layers": 4, "decoder_sparse_step": 2, "mlp_only_layers": [3]}),
        )
        .unwrap();
        assert_eq!(
            MoeFeatures::qwen_sparse_layers(&c, 4),
            vec![false, true, false, false]
        );
        let c = config(json!({})).unwrap();
        assert_eq!(MoeFeatures::qwen_sparse_layers(&c, 0), vec![false, false]);
    }
}
