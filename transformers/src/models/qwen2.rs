//! Qwen2: mirrors transformers' `models/qwen2/modeling_qwen2.py` (`modular_qwen2.py` derives
//! it from Llama).
//!
//! What differs from Llama: q/k/v projections always carry a bias (o_proj never does), and
//! sliding windows apply only with `use_sliding_window`, on layers from `max_window_layers` on
//! (or where v5's `layer_types` says `sliding_attention`).

use super::llama::{DecoderFeatures, LlamaForCausalLM, LlamaModel};
use crate::config::DecoderConfig;

/// `Qwen2Model`: the Llama decoder with Qwen2's switches.
pub type Qwen2Model = LlamaModel;
/// `Qwen2ForCausalLM`: the Llama causal LM with Qwen2's switches.
pub type Qwen2ForCausalLM = LlamaForCausalLM;

/// Qwen2's switches: q/k/v bias, no o/mlp bias, windows per layer type.
pub(super) fn features(config: &DecoderConfig) -> DecoderFeatures {
    DecoderFeatures {
        qkv_bias: true,
        o_bias: false,
        mlp_bias: false,
        qk_norm: false,
        windows: (0..config.num_hidden_layers)
            .map(|i| config.layer_window(i))
            .collect(),
    }
}
