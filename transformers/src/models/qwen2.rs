//! Qwen2: mirrors transformers' `models/qwen2/modeling_qwen2.py` (`modular_qwen2.py` derives
//! it from Llama).
//!
//! What differs from Llama: q/k/v projections always carry a bias (o_proj never does), and
//! sliding windows apply only with `use_sliding_window`, on layers from `max_window_layers` on
//! (or where v5's `layer_types` says `sliding_attention`).

use super::llama::{self, DecoderFeatures, LlamaForCausalLM, LlamaModel};
use crate::config::DecoderConfig;
use crate::family::{Architecture, Family, Names, Task};

/// The registry entry of `qwen2`: the Llama decoder with Qwen2's switches.
pub(crate) const FAMILY: Family = llama::family::<Qwen2>(Names {
    model_type: "qwen2",
    modeling_file: "models/qwen2/modeling_qwen2.py",
    architectures: &[
        Architecture::new("Qwen2ForCausalLM", Task::CausalLm),
        Architecture::new("Qwen2Model", Task::Base),
    ],
    gguf_architectures: &["qwen2"],
    no_split_modules: &["Qwen2DecoderLayer"],
});

/// Qwen2's switches ([`features`]).
pub(crate) struct Qwen2;
impl llama::Switches for Qwen2 {
    const FEATURES: fn(&DecoderConfig) -> DecoderFeatures = features;
}

/// `Qwen2Model`: the Llama decoder with Qwen2's switches.
pub type Qwen2Model = LlamaModel;
/// `Qwen2ForCausalLM`: the Llama causal LM with Qwen2's switches.
pub type Qwen2ForCausalLM = LlamaForCausalLM;

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
