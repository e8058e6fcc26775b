//! Qwen3: mirrors transformers' `models/qwen3/modeling_qwen3.py` (`modular_qwen3.py` derives
//! it from Qwen2 and Llama).
//!
//! What differs from Llama: an RMSNorm over each head of q and of k (`q_norm`, `k_norm`,
//! weights `[head_dim]`) before rope; `attention_bias` on all four projections as in Llama;
//! no MLP bias; windows as in Qwen2.

use super::llama::{DecoderFeatures, LlamaForCausalLM, LlamaModel};
use crate::config::DecoderConfig;

/// `Qwen3Model`: the Llama decoder with Qwen3's switches.
pub type Qwen3Model = LlamaModel;
/// `Qwen3ForCausalLM`: the Llama causal LM with Qwen3's switches.
pub type Qwen3ForCausalLM = LlamaForCausalLM;

/// Qwen3's switches: q/k norms, `attention_bias` on q/k/v/o, windows per layer type.
pub(super) fn features(config: &DecoderConfig) -> DecoderFeatures {
    DecoderFeatures {
        qkv_bias: config.attention_bias,
        o_bias: config.attention_bias,
        mlp_bias: false,
        qk_norm: true,
        windows: (0..config.num_hidden_layers)
            .map(|i| config.layer_window(i))
            .collect(),
    }
}
