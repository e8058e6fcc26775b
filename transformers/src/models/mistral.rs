//! Mistral: mirrors transformers' `models/mistral/modeling_mistral.py` (`modular_mistral.py`
//! derives it from Llama).
//!
//! What differs from Llama: sliding-window attention (`sliding_window`: a query sees only the
//! last `sliding_window` positions, itself included) on every layer, no biases, and a
//! `head_dim` that may differ from `hidden_size / num_attention_heads`.

use super::llama::{self, DecoderFeatures};
use crate::config::DecoderConfig;
use crate::family::derived_decoder;

// llama.cpp writes Mistral models as `llama` files, which load as Llama.
derived_decoder! {
    llama::{LlamaModel, LlamaForCausalLM} as Mistral { MistralModel, MistralForCausalLM },
    model_type "mistral", folder "mistral", gguf [],
    heads [
        MistralForSequenceClassification: SequenceClassification,
        MistralForTokenClassification: TokenClassification,
        MistralForQuestionAnswering: QuestionAnswering,
    ],
}

/// Mistral's switches: no biases, the window on every layer (or as `layer_types` says).
pub fn features(config: &DecoderConfig) -> DecoderFeatures {
    DecoderFeatures {
        windows: config.windows(|_| true),
        ..Default::default()
    }
}
