//! Qwen3: mirrors transformers' `models/qwen3/modeling_qwen3.py` (`modular_qwen3.py` derives
//! it from Qwen2 and Llama).
//!
//! What differs from Llama: an RMSNorm over each head of q and of k (`q_norm`, `k_norm`,
//! weights `[head_dim]`) before rope; `attention_bias` on all four projections as in Llama;
//! no MLP bias; windows as in Qwen2.

use super::llama::{self, DecoderFeatures};
use crate::config::DecoderConfig;
use crate::family::derived_decoder;

derived_decoder! {
    llama::{LlamaModel, LlamaForCausalLM} as Qwen3 { Qwen3Model, Qwen3ForCausalLM },
    model_type "qwen3", folder "qwen3", gguf ["qwen3"],
    heads [
        Qwen3ForSequenceClassification: SequenceClassification,
        Qwen3ForTokenClassification: TokenClassification,
        Qwen3ForQuestionAnswering: QuestionAnswering,
    ],
}

/// Qwen3's switches: q/k norms, `attention_bias` on q/k/v/o, windows per layer type.
pub fn features(config: &DecoderConfig) -> DecoderFeatures {
    DecoderFeatures {
        qkv_bias: config.attention_bias,
        o_bias: config.attention_bias,
        qk_norm: true,
        windows: config.windows(|i| super::qwen2::slides(config, i)),
        ..Default::default()
    }
}
