//! Mistral: mirrors transformers' `models/mistral/modeling_mistral.py` (`modular_mistral.py`
//! derives it from Llama).
//!
//! What differs from Llama: sliding-window attention (`sliding_window`: a query sees only the
//! last `sliding_window` positions, itself included) on every layer, no biases, and a
//! `head_dim` that may differ from `hidden_size / num_attention_heads`.

use super::llama::{self, DecoderFeatures, LlamaForCausalLM, LlamaModel};
use crate::config::DecoderConfig;
use crate::family::{Architecture, Family, Loaders, Task};

/// The registry entry of `mistral`: the Llama decoder with Mistral's switches.
pub(crate) const FAMILY: Family = Family {
    model_type: "mistral",
    modeling_file: "models/mistral/modeling_mistral.py",
    architectures: &[
        Architecture {
            name: "MistralForCausalLM",
            task: Task::CausalLm,
        },
        Architecture {
            name: "MistralModel",
            task: Task::Base,
        },
    ],
    // llama.cpp writes Mistral models as `llama` files, which load as Llama.
    gguf_architectures: &[],
    no_split_modules: &["MistralDecoderLayer"],
    validate: llama::validate,
    layout: llama::layout,
    loaders: Loaders::Decoder {
        base: |w, c| llama::load_base_with(w, c, features),
        causal_lm: |w, c| llama::load_causal_lm_with(w, c, features),
    },
};

/// `MistralModel`: the Llama decoder with Mistral's switches.
pub type MistralModel = LlamaModel;
/// `MistralForCausalLM`: the Llama causal LM with Mistral's switches.
pub type MistralForCausalLM = LlamaForCausalLM;

/// Mistral's switches: no biases, the window on every layer (or as `layer_types` says).
pub fn features(config: &DecoderConfig) -> DecoderFeatures {
    DecoderFeatures {
        qkv_bias: false,
        o_bias: false,
        mlp_bias: false,
        qk_norm: false,
        windows: config.windows(|_| true),
        fused_qkv: false,
        fused_gate_up: false,
        moe: None,
        longrope_recompute: false,
    }
}
