//! Qwen3: mirrors transformers' `models/qwen3/modeling_qwen3.py` (`modular_qwen3.py` derives
//! it from Qwen2 and Llama).
//!
//! What differs from Llama: an RMSNorm over each head of q and of k (`q_norm`, `k_norm`,
//! weights `[head_dim]`) before rope; `attention_bias` on all four projections as in Llama;
//! no MLP bias; windows as in Qwen2.

use super::llama::{self, DecoderFeatures, LlamaForCausalLM, LlamaModel};
use crate::config::DecoderConfig;
use crate::family::{Architecture, Family, Names, Task};

/// The registry entry of `qwen3`: the Llama decoder with Qwen3's switches.
pub(crate) const FAMILY: Family = llama::family::<Qwen3>(Names {
    model_type: "qwen3",
    modeling_file: "models/qwen3/modeling_qwen3.py",
    architectures: &[
        Architecture::new("Qwen3ForCausalLM", Task::CausalLm),
        Architecture::new("Qwen3Model", Task::Base),
    ],
    gguf_architectures: &["qwen3"],
    no_split_modules: &["Qwen3DecoderLayer"],
});

/// Qwen3's switches ([`features`]).
pub(crate) struct Qwen3;
impl llama::Switches for Qwen3 {
    const FEATURES: fn(&DecoderConfig) -> DecoderFeatures = features;
}

/// `Qwen3Model`: the Llama decoder with Qwen3's switches.
pub type Qwen3Model = LlamaModel;
/// `Qwen3ForCausalLM`: the Llama causal LM with Qwen3's switches.
pub type Qwen3ForCausalLM = LlamaForCausalLM;

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
