//! Qwen3-MoE: mirrors transformers' `models/qwen3_moe/modeling_qwen3_moe.py`.
//!
//! Qwen3's attention (q/k norms, `attention_bias`) with Qwen2-MoE's routing minus the shared
//! expert: `num_experts` experts of width `moe_intermediate_size` in the layers
//! `decoder_sparse_step` and `mlp_only_layers` pick, top-k renormalised with
//! `norm_topk_prob`. With `use_sliding_window` every layer slides.

use super::llama::{self, DecoderFeatures};
use super::moe::MoeFeatures;
use super::qwen2_moe::QWEN_EXPERT_NAMES;
use crate::config::DecoderConfig;
use crate::family::derived_decoder;

// llama.cpp stores the experts stacked (`ffn_*_exps`), read as `experts.{gate,up,down}_proj`.
derived_decoder! {
    llama::{LlamaModel, LlamaForCausalLM} as Qwen3Moe { Qwen3MoeModel, Qwen3MoeForCausalLM },
    model_type "qwen3_moe", folder "qwen3_moe", gguf ["qwen3moe"],
    heads [
        Qwen3MoeForSequenceClassification: SequenceClassification,
        Qwen3MoeForTokenClassification: TokenClassification,
        Qwen3MoeForQuestionAnswering: QuestionAnswering,
    ],
}

/// Qwen3-MoE's switches, with transformers' defaults (128 experts, top 8, width 768, no
/// renormalisation).
pub fn features(config: &DecoderConfig) -> DecoderFeatures {
    let c = config;
    // `num_local_experts` is what transformers writes (an alias of `num_experts`).
    let experts = c.local_experts().unwrap_or(128);
    DecoderFeatures {
        qkv_bias: c.attention_bias,
        o_bias: c.attention_bias,
        qk_norm: true,
        windows: c.windows(|_| c.use_sliding_window.unwrap_or(false)),
        moe: Some(MoeFeatures {
            experts,
            experts_field: "num_experts",
            top_k: c.num_experts_per_tok.unwrap_or(8),
            intermediate: c.moe_intermediate_size.unwrap_or(768),
            norm_topk_prob: c.norm_topk_prob.unwrap_or(false),
            weights_in_model_dtype: true,
            shared_expert: None,
            sparse_layers: MoeFeatures::qwen_sparse_layers(c, experts),
            names: QWEN_EXPERT_NAMES,
        }),
        ..Default::default()
    }
}
