//! The `config.json` of an HF `LlamaForCausalLM`, rebuilt from GGUF metadata.

use serde_json::{json, Map, Value as J};

use super::reader::GgufFile;

/// Builds the HF llama config from `llama.*` and `tokenizer.ggml.*` metadata.
pub(crate) fn llama_config(file: &GgufFile) -> Result<J, String> {
    let md = &file.metadata;
    let need = |key: &str, field: &str| {
        md.get_u64(key).ok_or_else(|| match md.get(key) {
            Some(v) => format!(
                "metadata key {key} (config.json {field}) is {v} ({}), not a non-negative integer",
                v.type_name()
            ),
            None => format!("metadata key {key} (config.json {field}) is missing; the file cannot be read as a llama model"),
        })
    };
    let hidden = need("llama.embedding_length", "hidden_size")?;
    let layers = need("llama.block_count", "num_hidden_layers")?;
    let intermediate = need("llama.feed_forward_length", "intermediate_size")?;
    let heads = need("llama.attention.head_count", "num_attention_heads")?;
    if heads == 0 {
        return Err("metadata key llama.attention.head_count is 0".into());
    }
    let kv_heads = match md.get("llama.attention.head_count_kv") {
        None => heads,
        Some(_) => need("llama.attention.head_count_kv", "num_key_value_heads")?,
    };
    if kv_heads == 0 || !heads.is_multiple_of(kv_heads) {
        return Err(format!(
            "llama.attention.head_count_kv is {kv_heads}, which does not divide head_count {heads}"
        ));
    }
    let eps = md
        .get_f64("llama.attention.layer_norm_rms_epsilon")
        .ok_or("metadata key llama.attention.layer_norm_rms_epsilon (config.json rms_norm_eps) is missing or not a number")?;
    // llama.cpp writes key_length only when it differs from hidden / heads; the rotary
    // dimension equals the head size in llama models.
    let head_dim = md
        .get_u64("llama.attention.key_length")
        .or_else(|| md.get_u64("llama.rope.dimension_count"))
        .unwrap_or(hidden / heads);
    let tensor_rows = |name: &str| {
        file.tensors
            .iter()
            .find(|t| t.name == name)
            .and_then(|t| t.dims.last().copied())
    };
    let vocab = md
        .get_u64("llama.vocab_size")
        .or_else(|| md.get_array("tokenizer.ggml.tokens").map(|a| a.len() as u64))
        .or_else(|| tensor_rows("token_embd.weight"))
        .ok_or("the vocabulary size is unknown: no llama.vocab_size, tokenizer.ggml.tokens or token_embd.weight")?;
    let has_output = file.tensors.iter().any(|t| t.name == "output.weight");
    let has_bias = file
        .tensors
        .iter()
        .any(|t| t.name.ends_with(".attn_q.bias"));

    let mut c = Map::new();
    c.insert("architectures".into(), json!(["LlamaForCausalLM"]));
    c.insert("model_type".into(), json!("llama"));
    c.insert("hidden_size".into(), json!(hidden));
    c.insert("intermediate_size".into(), json!(intermediate));
    c.insert("num_hidden_layers".into(), json!(layers));
    c.insert("num_attention_heads".into(), json!(heads));
    c.insert("num_key_value_heads".into(), json!(kv_heads));
    c.insert("head_dim".into(), json!(head_dim));
    c.insert("hidden_act".into(), json!("silu"));
    c.insert("rms_norm_eps".into(), json!(eps));
    c.insert(
        "rope_theta".into(),
        json!(md.get_f64("llama.rope.freq_base").unwrap_or(10000.0)),
    );
    if let Some(n) = md.get_u64("llama.context_length") {
        c.insert("max_position_embeddings".into(), json!(n));
    }
    c.insert("vocab_size".into(), json!(vocab));
    c.insert("tie_word_embeddings".into(), json!(!has_output));
    c.insert("attention_bias".into(), json!(has_bias));
    c.insert("mlp_bias".into(), json!(false));
    for (key, field) in [
        ("tokenizer.ggml.bos_token_id", "bos_token_id"),
        ("tokenizer.ggml.eos_token_id", "eos_token_id"),
        ("tokenizer.ggml.padding_token_id", "pad_token_id"),
    ] {
        if let Some(id) = md.get_u64(key) {
            c.insert(field.into(), json!(id));
        }
    }
    c.insert("rope_scaling".into(), rope_scaling(file));
    Ok(J::Object(c))
}

/// HF's `rope_scaling` from `llama.rope.scaling.*` (or the older `llama.rope.scale_linear`);
/// `null` when the file has none.
fn rope_scaling(file: &GgufFile) -> J {
    let md = &file.metadata;
    let kind = md.get_str("llama.rope.scaling.type");
    let factor = md.get_f64("llama.rope.scaling.factor");
    let (kind, factor) = match (kind, factor) {
        (Some("none"), _) => return J::Null,
        (Some(k), Some(f)) => (k, f),
        (None, _) => match md.get_f64("llama.rope.scale_linear") {
            Some(f) if f != 1.0 => ("linear", f),
            _ => return J::Null,
        },
        (Some(_), None) => return J::Null,
    };
    let mut s = Map::new();
    s.insert("rope_type".into(), json!(kind));
    s.insert("factor".into(), json!(factor));
    if let Some(n) = md.get_u64("llama.rope.scaling.original_context_length") {
        s.insert("original_max_position_embeddings".into(), json!(n));
    }
    J::Object(s)
}
