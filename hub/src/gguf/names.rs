//! llama.cpp tensor names mapped to the HF checkpoint names of `LlamaForCausalLM`.

/// Which rotary projection a tensor is, for undoing llama.cpp's row permutation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Qk {
    Q,
    K,
}

/// A GGUF tensor's HF counterpart.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Mapped {
    pub name: String,
    pub qk: Option<Qk>,
}

/// Per-layer GGUF module names and their HF paths under `model.layers.N.`.
const LAYER: &[(&str, &str, Option<Qk>)] = &[
    ("attn_q", "self_attn.q_proj", Some(Qk::Q)),
    ("attn_k", "self_attn.k_proj", Some(Qk::K)),
    ("attn_v", "self_attn.v_proj", None),
    ("attn_output", "self_attn.o_proj", None),
    ("ffn_gate", "mlp.gate_proj", None),
    ("ffn_up", "mlp.up_proj", None),
    ("ffn_down", "mlp.down_proj", None),
    ("attn_norm", "input_layernorm", None),
    ("ffn_norm", "post_attention_layernorm", None),
];

/// The HF name of a llama-architecture GGUF tensor; `Ok(None)` for tensors HF does not store
/// (`rope_freqs.weight`: llama 3's rope factors, which HF derives from `rope_scaling` in the
/// config); an error for names with no HF counterpart (e.g. mixture-of-experts tensors).
pub(crate) fn llama_name(gguf: &str) -> Result<Option<Mapped>, String> {
    let plain = |name: &str| {
        Ok(Some(Mapped {
            name: name.to_string(),
            qk: None,
        }))
    };
    match gguf {
        "token_embd.weight" => return plain("model.embed_tokens.weight"),
        "output_norm.weight" => return plain("model.norm.weight"),
        "output.weight" => return plain("lm_head.weight"),
        "rope_freqs.weight" => return Ok(None),
        _ => {}
    }
    let unknown = || {
        format!(
            "tensor {gguf:?} has no counterpart in HF's LlamaForCausalLM (expected token_embd, output_norm, output or blk.N.{{{}}}.weight/bias); the file may be a variant zoo does not map yet",
            LAYER.iter().map(|l| l.0).collect::<Vec<_>>().join(",")
        )
    };
    let rest = gguf.strip_prefix("blk.").ok_or_else(unknown)?;
    let (layer, rest) = rest.split_once('.').ok_or_else(unknown)?;
    if layer.is_empty()
        || !layer.bytes().all(|b| b.is_ascii_digit())
        || (layer.len() > 1 && layer.starts_with('0'))
    {
        return Err(unknown());
    }
    let (module, suffix) = rest.rsplit_once('.').ok_or_else(unknown)?;
    if suffix != "weight" && suffix != "bias" {
        return Err(unknown());
    }
    let (_, hf, qk) = LAYER.iter().find(|l| l.0 == module).ok_or_else(unknown)?;
    Ok(Some(Mapped {
        name: format!("model.layers.{layer}.{hf}.{suffix}"),
        qk: *qk,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hf(n: &str) -> String {
        llama_name(n).unwrap().unwrap().name
    }

    #[test]
    fn maps_every_llama_tensor() {
        assert_eq!(hf("token_embd.weight"), "model.embed_tokens.weight");
        assert_eq!(hf("output_norm.weight"), "model.norm.weight");
        assert_eq!(hf("output.weight"), "lm_head.weight");
        assert_eq!(
            hf("blk.0.attn_q.weight"),
            "model.layers.0.self_attn.q_proj.weight"
        );
        assert_eq!(
            hf("blk.12.attn_k.bias"),
            "model.layers.12.self_attn.k_proj.bias"
        );
        assert_eq!(
            hf("blk.3.attn_v.weight"),
            "model.layers.3.self_attn.v_proj.weight"
        );
        assert_eq!(
            hf("blk.3.attn_output.weight"),
            "model.layers.3.self_attn.o_proj.weight"
        );
        assert_eq!(
            hf("blk.3.ffn_gate.weight"),
            "model.layers.3.mlp.gate_proj.weight"
        );
        assert_eq!(
            hf("blk.3.ffn_up.weight"),
            "model.layers.3.mlp.up_proj.weight"
        );
        assert_eq!(
            hf("blk.3.ffn_down.weight"),
            "model.layers.3.mlp.down_proj.weight"
        );
        assert_eq!(
            hf("blk.3.attn_norm.weight"),
            "model.layers.3.input_layernorm.weight"
        );
        assert_eq!(
            hf("blk.3.ffn_norm.weight"),
            "model.layers.3.post_attention_layernorm.weight"
        );
        assert_eq!(
            llama_name("blk.0.attn_q.weight").unwrap().unwrap().qk,
            Some(Qk::Q)
        );
        assert_eq!(
            llama_name("blk.0.attn_k.weight").unwrap().unwrap().qk,
            Some(Qk::K)
        );
        assert_eq!(llama_name("rope_freqs.weight").unwrap(), None);
    }

    #[test]
    fn refuses_names_without_hf_counterpart() {
        for n in [
            "blk.0.ffn_gate_exps.weight",
            "blk.x.attn_q.weight",
            "blk.01.attn_q.weight",
            "blk.0.attn_q.scale",
            "foo",
            "blk..attn_q.weight",
        ] {
            let e = llama_name(n).unwrap_err();
            assert!(e.contains(n), "{e}");
        }
    }
}
