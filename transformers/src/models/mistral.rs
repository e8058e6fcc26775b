//! Mistral: mirrors transformers' `models/mistral/modeling_mistral.py` (`modular_mistral.py`
//! derives it from Llama).
//!
//! What differs from Llama: sliding-window attention (`sliding_window`: a query sees only the
//! last `sliding_window` positions, itself included) on every layer, no biases, and a
//! `head_dim` that may differ from `hidden_size / num_attention_heads`.

use super::llama::{DecoderFeatures, LlamaForCausalLM, LlamaModel};
use crate::config::DecoderConfig;

/// `MistralModel`: the Llama decoder with Mistral's switches.
pub type MistralModel = LlamaModel;
/// `MistralForCausalLM`: the Llama causal LM with Mistral's switches.
pub type MistralForCausalLM = LlamaForCausalLM;

/// Mistral's switches: no biases, the window on every layer (or as `layer_types` says).
pub(super) fn features(config: &DecoderConfig) -> DecoderFeatures {
    DecoderFeatures {
        qkv_bias: false,
        o_bias: false,
        mlp_bias: false,
        qk_norm: false,
        windows: (0..config.num_hidden_layers)
            .map(|i| config.layer_window(i))
            .collect(),
    }
}
