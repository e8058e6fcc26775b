//! Qwen2-MoE: mirrors transformers' `models/qwen2_moe/modeling_qwen2_moe.py`.
//!
//! What differs from Qwen2: the MLP of the layers `decoder_sparse_step` and `mlp_only_layers`
//! pick is a mixture of `num_experts` experts of width `moe_intermediate_size` (Mixtral's
//! block: `moe::SparseMoeBlock`) plus a shared expert of width
//! `shared_expert_intermediate_size` behind a sigmoid gate; the top-k weights are
//! renormalised only with `norm_topk_prob` and rounded to the model dtype; the q/k/v bias
//! follows `qkv_bias`; the sliding layers, without `layer_types`, are the even ones below
//! `max_window_layers`.

use zoo_runtime::nn::ExpertNames;

use super::llama::{self, DecoderFeatures};
use super::moe::MoeFeatures;
use crate::config::DecoderConfig;
use crate::family::derived_decoder;

// llama.cpp stores the experts stacked (`ffn_*_exps`), read as `experts.{gate,up,down}_proj`.
derived_decoder! {
    llama::{LlamaModel, LlamaForCausalLM} as Qwen2Moe { Qwen2MoeModel, Qwen2MoeForCausalLM },
    model_type "qwen2_moe", folder "qwen2_moe", gguf ["qwen2moe"],
    heads [
        Qwen2MoeForSequenceClassification: SequenceClassification,
        Qwen2MoeForTokenClassification: TokenClassification,
        Qwen2MoeForQuestionAnswering: QuestionAnswering,
    ],
}

/// The per-expert names of Qwen's MoE checkpoints.
pub(super) const QWEN_EXPERT_NAMES: ExpertNames = ExpertNames {
    gate: "gate_proj",
    up: "up_proj",
    down: "down_proj",
};

/// Qwen2-MoE's switches, with transformers' defaults (60 experts, top 4, widths 1408 and
/// 5632, no renormalisation, q/k/v bias on).
pub fn features(config: &DecoderConfig) -> DecoderFeatures {
    let c = config;
    let experts = c.num_experts.unwrap_or(60);
    DecoderFeatures {
        qkv_bias: c.qkv_bias.unwrap_or(true),
        windows: c.windows(|i| {
            c.use_sliding_window.unwrap_or(false)
                && i % 2 == 0
                && i < c.max_window_layers.unwrap_or(28)
        }),
        moe: Some(MoeFeatures {
            experts,
            experts_field: "num_experts",
            top_k: c.num_experts_per_tok.unwrap_or(4),
            intermediate: c.moe_intermediate_size.unwrap_or(1408),
            norm_topk_prob: c.norm_topk_prob.unwrap_or(false),
            weights_in_model_dtype: true,
            shared_expert: Some(c.shared_expert_intermediate_size.unwrap_or(5632)),
            sparse_layers: MoeFeatures::qwen_sparse_layers(c, experts),
            names: QWEN_EXPERT_NAMES,
        }),
        ..Default::default()
    }
}
