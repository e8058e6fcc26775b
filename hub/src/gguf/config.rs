//! The `config.json` of the HF class a GGUF file reads as, rebuilt from its metadata.
//!
//! Metadata keys are `{arch}.*` (llama.cpp's names); fields the file does not carry are left
//! out, so the family's loader applies transformers' defaults, as transformers' own GGUF
//! loader does.

use serde_json::{json, Map, Value as J};

use super::names::Arch;
use super::reader::GgufFile;

/// Builds the HF config of `arch` from the file's `{arch}.*` and `tokenizer.ggml.*` metadata.
pub(crate) fn hf_config(file: &GgufFile, arch: &Arch) -> Result<J, String> {
    let md = &file.metadata;
    let a = arch.gguf;
    let key = |k: &str| format!("{a}.{k}");
    let need = |k: &str, field: &str| {
        let k = key(k);
        md.get_u64(&k).ok_or_else(|| match md.get(&k) {
            Some(v) => format!(
                "metadata key {k} (config.json {field}) is {v} ({}), not a non-negative integer",
                v.type_name()
            ),
            None => format!(
                "metadata key {k} (config.json {field}) is missing; the file cannot be read as a {a} model"
            ),
        })
    };
    let opt_u64 = |k: &str| md.get_u64(&key(k));
    let opt_f64 = |k: &str| md.get_f64(&key(k));
    let hidden = need("embedding_length", "hidden_size")?;
    let layers = need("block_count", "num_hidden_layers")?;
    let intermediate = need("feed_forward_length", "intermediate_size")?;
    let heads = need("attention.head_count", "num_attention_heads")?;
    if heads == 0 {
        return Err(format!("metadata key {} is 0", key("attention.head_count")));
    }
    let kv_heads = match md.get(&key("attention.head_count_kv")) {
        None => heads,
        Some(_) => need("attention.head_count_kv", "num_key_value_heads")?,
    };
    if kv_heads == 0 || !heads.is_multiple_of(kv_heads) {
        return Err(format!(
            "{} is {kv_heads}, which does not divide head_count {heads}",
            key("attention.head_count_kv")
        ));
    }
    let eps = opt_f64("attention.layer_norm_rms_epsilon").ok_or_else(|| {
        format!(
            "metadata key {} (config.json rms_norm_eps) is missing or not a number",
            key("attention.layer_norm_rms_epsilon")
        )
    })?;
    // llama.cpp writes key_length when it differs from hidden / heads; in llama files the
    // rotary dimension is the head size too.
    let head_dim = opt_u64("attention.key_length")
        .or_else(|| {
            (a == "llama")
                .then(|| opt_u64("rope.dimension_count"))
                .flatten()
        })
        .unwrap_or(hidden / heads);
    let tensor = |name: &str| file.tensors.iter().find(|t| t.name == name);
    let vocab = opt_u64("vocab_size")
        .or_else(|| md.get_array("tokenizer.ggml.tokens").map(|a| a.len() as u64))
        .or_else(|| tensor("token_embd.weight").and_then(|t| t.dims.last().copied()))
        .ok_or("the vocabulary size is unknown: no vocab_size, tokenizer.ggml.tokens or token_embd.weight")?;
    let has = |suffix: &str| file.tensors.iter().any(|t| t.name.ends_with(suffix));

    let experts = opt_u64("expert_count").filter(|&e| e > 0);
    // llama.cpp writes Mixtral as a llama file with experts.
    let (model_type, class) = match (a, experts) {
        ("llama", Some(_)) => ("mixtral", "MixtralForCausalLM"),
        _ => (arch.model_type, arch.class),
    };

    let mut c = Map::new();
    let mut set = |k: &str, v: J| {
        c.insert(k.into(), v);
    };
    set("architectures", json!([class]));
    set("model_type", json!(model_type));
    set("hidden_size", json!(hidden));
    set("intermediate_size", json!(intermediate));
    set("num_hidden_layers", json!(layers));
    set("num_attention_heads", json!(heads));
    set("num_key_value_heads", json!(kv_heads));
    set("head_dim", json!(head_dim));
    set("rms_norm_eps", json!(eps));
    set("vocab_size", json!(vocab));
    set(
        "tie_word_embeddings",
        json!(tensor("output.weight").is_none()),
    );
    if let Some(n) = opt_u64("context_length") {
        set("max_position_embeddings", json!(n));
    }
    if let Some(theta) = opt_f64("rope.freq_base") {
        set("rope_theta", json!(theta));
    }
    set("rope_scaling", rope_scaling(file, a));
    if let Some(w) = opt_u64("attention.sliding_window").filter(|&w| w > 0) {
        set("sliding_window", json!(w));
    }
    match model_type {
        "llama" => {
            set("hidden_act", json!("silu"));
            set("attention_bias", json!(has(".attn_q.bias")));
            set("mlp_bias", json!(false));
        }
        "qwen3" | "qwen3_moe" => set("attention_bias", json!(has(".attn_q.bias"))),
        "qwen2_moe" => set("qkv_bias", json!(has(".attn_q.bias"))),
        // Phi-4-mini rotates part of each head; llama.cpp writes the rotated width.
        "phi3" => {
            if let Some(r) = opt_u64("rope.dimension_count").filter(|&r| r > 0 && r < head_dim) {
                set("partial_rotary_factor", json!(r as f64 / head_dim as f64));
            }
        }
        "gemma2" => {
            for cap in ["attn_logit_softcapping", "final_logit_softcapping"] {
                if let Some(v) = opt_f64(cap) {
                    set(cap, json!(v));
                }
            }
        }
        _ => {}
    }
    if let Some(e) = experts {
        let field = if model_type == "qwen2_moe" {
            "num_experts"
        } else {
            "num_local_experts"
        };
        set(field, json!(e));
        if let Some(k) = opt_u64("expert_used_count") {
            set("num_experts_per_tok", json!(k));
        }
        if let Some(i) = opt_u64("expert_feed_forward_length") {
            set("moe_intermediate_size", json!(i));
        }
        if let Some(i) = opt_u64("expert_shared_feed_forward_length") {
            set("shared_expert_intermediate_size", json!(i));
        }
        // llama.cpp renormalises Qwen3-MoE's top-k weights (transformers' GGUF loader sets
        // the same default).
        if model_type == "qwen3_moe" {
            set("norm_topk_prob", json!(true));
        }
    }
    for (k, field) in [
        ("tokenizer.ggml.bos_token_id", "bos_token_id"),
        ("tokenizer.ggml.eos_token_id", "eos_token_id"),
        ("tokenizer.ggml.padding_token_id", "pad_token_id"),
    ] {
        if let Some(id) = md.get_u64(k) {
            set(field, json!(id));
        }
    }
    Ok(J::Object(c))
}

/// HF's `rope_scaling` from `{arch}.rope.scaling.*` (or llama's older `rope.scale_linear`);
/// `null` when the file has none.
fn rope_scaling(file: &GgufFile, a: &str) -> J {
    let md = &file.metadata;
    let kind = md.get_str(&format!("{a}.rope.scaling.type"));
    let factor = md.get_f64(&format!("{a}.rope.scaling.factor"));
    let (kind, factor) = match (kind, factor) {
        (Some("none"), _) => return J::Null,
        (Some(k), Some(f)) => (k, f),
        (None, _) => match md.get_f64(&format!("{a}.rope.scale_linear")) {
            Some(f) if f != 1.0 => ("linear", f),
            _ => return J::Null,
        },
        (Some(_), None) => return J::Null,
    };
    let mut s = Map::new();
    s.insert("rope_type".into(), json!(kind));
    s.insert("factor".into(), json!(factor));
    if let Some(n) = md.get_u64(&format!("{a}.rope.scaling.original_context_length")) {
        s.insert("original_max_position_embeddings".into(), json!(n));
    }
    J::Object(s)
}
