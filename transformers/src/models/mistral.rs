//! Mistral: mirrors transformers' `models/mistral/modeling_mistral.py` (`modular_mistral.py`
//! derives it from Llama).
//!
//! What differs from Llama: sliding-window attention (`sliding_window`: a query sees only the
//! last `sliding_window` positions, itself included) on every layer, no biases, and a
//! `head_dim` that may differ from `hidden_size / num_attention_heads`.

use super::llama::{self, DecoderFeatures, LlamaForCausalLM, LlamaModel};
use crate::config::DecoderConfig;
use crate::family::{Architecture, Family, Names, Task};

/// The registry entry of `mistral`: the Llama decoder with Mistral's switches.
pub(crate) const FAMILY: Family = llama::family::<Mistral>(Names {
    model_type: "mistral",
    modeling_file: "models/mistral/modeling_mistral.py",
    architectures: &[
        Architecture::new("MistralForCausalLM", Task::CausalLm),
        Architecture::new("MistralModel", Task::Base),
    ],
    // llama.cpp writes Mistral models as `llama` files, which load as Llama.
    gguf_architectures: &[],
    no_split_modules: &["MistralDecoderLayer"],
});

/// Mistral's switches ([`features`]).
pub(crate) struct Mistral;
impl llama::Switches for Mistral {
    const FEATURES: fn(&DecoderConfig) -> DecoderFeatures = features;
}

/// `MistralModel`: the Llama decoder with Mistral's switches.
pub type MistralModel = LlamaModel;
/// `MistralForCausalLM`: the Llama causal LM with Mistral's switches.
pub type MistralForCausalLM = LlamaForCausalLM;

/// Mistral's switches: no biases, the window on every layer (or as `layer_types` says).
pub fn features(config: &DecoderConfig) -> DecoderFeatures {
    DecoderFeatures {
        windows: config.windows(|_| true),
        ..Default::default()
    }
}
