//! Qwen2: mirrors transformers' `models/qwen2/modeling_qwen2.py` (`modular_qwen2.py` derives
//! it from Llama).
//!
//! What differs from Llama: q/k/v projections always carry a bias (o_proj never does), and
//! sliding windows apply only with `use_sliding_window`, on layers from `max_window_layers` on
//! (or where v5's `layer_types` says `sliding_attention`).

use super::llama::{self, DecoderFeatures};
use crate::config::DecoderConfig;
use crate::family::derived_decoder;

derived_decoder! {
    llama::{LlamaModel, LlamaForCausalLM} as Qwen2 { Qwen2Model, Qwen2ForCausalLM },
    model_type "qwen2", folder "qwen2", gguf ["qwen2"],
    heads [
        Qwen2ForSequenceClassification: SequenceClassification,
        Qwen2ForTokenClassification: TokenClassification,
        Qwen2ForQuestionAnswering: QuestionAnswering,
    ],
}

/// Qwen2's switches: q/k/v bias, no o/mlp bias, windows per layer type.
pub fn features(config: &DecoderConfig) -> DecoderFeatures {
    DecoderFeatures {
        qkv_bias: true,
        windows: config.windows(|i| slides(config, i)),
        ..Default::default()
    }
}

/// Qwen2's window rule without `layer_types`: only with `use_sliding_window`, on the layers
/// from `max_window_layers` on (transformers' default 28).
pub(super) fn slides(config: &DecoderConfig, layer: usize) -> bool {
    config.use_sliding_window.unwrap_or(false) && layer >= config.max_window_layers.unwrap_or(28)
}
