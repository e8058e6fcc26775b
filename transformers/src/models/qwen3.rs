//! Qwen3: mirrors transformers' `models/qwen3/modeling_qwen3.py` (`modular_qwen3.py` derives
//! it from Qwen2 and Llama).
//!
//! What differs from Llama: an RMSNorm over each head of q and of k (`q_norm`, `k_norm`,
//! weights `[head_dim]`) before rope; `attention_bias` on all four projections as in Llama;
//! no MLP bias; windows as in Qwen2.

use super::llama::{self, DecoderFeatures, LlamaForCausalLM, LlamaModel};
use crate::config::DecoderConfig;
use crate::family::{Architecture, Family, Loaders, Task};

/// The registry entry of `qwen3`: the Llama decoder with Qwen3's switches.
pub(crate) const FAMILY: Family = Family {
    model_type: "qwen3",
    modeling_file: "models/qwen3/modeling_qwen3.py",
    architectures: &[
        Architecture {
            name: "Qwen3ForCausalLM",
            task: Task::CausalLm,
        },
        Architecture {
            name: "Qwen3Model",
            task: Task::Base,
        },
    ],
    gguf_architectures: &["qwen3"],
    no_split_modules: &["Qwen3DecoderLayer"],
    validate: llama::validate,
    layout: llama::layout,
    loaders: Loaders::Decoder {
        base: |w, c| llama::load_base_with(w, c, features),
        causal_lm: |w, c| llama::load_causal_lm_with(w, c, features),
    },
};

/// `Qwen3Model`: the Llama decoder with Qwen3's switches.
pub type Qwen3Model = LlamaModel;
/// `Qwen3ForCausalLM`: the Llama causal LM with Qwen3's switches.
pub type Qwen3ForCausalLM = LlamaForCausalLM;

/// Qwen3's switches: q/k norms, `attention_bias` on q/k/v/o, windows per layer type.
pub fn features(config: &DecoderConfig) -> DecoderFeatures {
    DecoderFeatures {
        qkv_bias: config.attention_bias,
        o_bias: config.attention_bias,
        mlp_bias: false,
        qk_norm: true,
        windows: config.windows(|i| super::qwen2::slides(config, i)),
        fused_qkv: false,
        fused_gate_up: false,
        moe: None,
        longrope_recompute: false,
    }
}
