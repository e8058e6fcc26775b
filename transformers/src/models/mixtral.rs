//! Mixtral: mirrors transformers' `models/mixtral/modeling_mixtral.py` (`modular_mixtral.py`
//! derives it from Mistral).
//!
//! What differs from Mistral: every layer's MLP is a sparse mixture of experts
//! (`MixtralSparseMoeBlock`, in [`super::moe`], which Qwen2-MoE and Qwen3-MoE share): a
//! linear router over `num_local_experts`, softmax in f32, the top `num_experts_per_tok`
//! renormalised to sum to 1 and kept in f32 for the weighted sum.
//!
//! Checkpoints store the experts per expert (`block_sparse_moe.experts.N.w1/w3/w2`, Mixtral's
//! original names) or fused as transformers holds them in memory
//! (`mlp.experts.gate_up_proj [E, 2I, H]`, `mlp.experts.down_proj [E, H, I]`); both load.

use zoo_runtime::nn::ExpertNames;

use super::llama::{self, DecoderFeatures};
use super::moe::MoeFeatures;
use crate::config::DecoderConfig;
use crate::family::derived_decoder;

// llama.cpp writes Mixtral as `llama` files with stacked experts (`ffn_*_exps`); zoo-hub
// reads those as `MixtralForCausalLM`, so the llama entry lists the name.
derived_decoder! {
    llama::{LlamaModel, LlamaForCausalLM} as Mixtral { MixtralModel, MixtralForCausalLM },
    model_type "mixtral", folder "mixtral", gguf [],
    heads [
        MixtralForSequenceClassification: SequenceClassification,
        MixtralForTokenClassification: TokenClassification,
        MixtralForQuestionAnswering: QuestionAnswering,
    ],
}

/// Mixtral's switches: Mistral's attention (no biases, the window on every layer) and
/// experts in every layer (transformers' defaults: 8 experts, top 2).
pub fn features(config: &DecoderConfig) -> DecoderFeatures {
    let c = config;
    DecoderFeatures {
        windows: c.windows(|_| true),
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
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Result;
    use serde_json::json;
    use zoo_hub::PretrainedConfig;

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
