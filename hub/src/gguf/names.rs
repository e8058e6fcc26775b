//! llama.cpp's architectures and tensor names mapped to HF's.
//!
//! Each [`Arch`] says what a `general.architecture` reads as in transformers (its
//! `model_type` and class), how llama.cpp's converter changed the tensors (the Q/K row
//! permutation of `llama` files, the `1 + w` norms of Gemma files) and which HF module each
//! per-layer GGUF module is.

/// Which rotary projection a tensor is, for undoing llama.cpp's row permutation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Qk {
    Q,
    K,
}

/// What reading a tensor must undo.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Undo {
    None,
    /// llama.cpp's rotary row order (llama files).
    Permutation(Qk),
    /// llama.cpp stores Gemma's RMSNorm weights as `1 + w` (its kernels multiply by the weight).
    PlusOne,
}

/// A GGUF tensor's HF counterpart.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Mapped {
    pub name: String,
    pub undo: Undo,
}

/// One llama.cpp architecture zoo reads.
#[derive(Debug)]
pub(crate) struct Arch {
    /// `general.architecture`, also the prefix of its metadata keys.
    pub gguf: &'static str,
    /// transformers' `model_type` and class for the file.
    pub model_type: &'static str,
    pub class: &'static str,
    /// Whether llama.cpp permuted `attn_q`/`attn_k` rows (its `llama` converter only).
    pub permuted_qk: bool,
    /// Whether norm weights are stored as `1 + w` (Gemma).
    pub norms_plus_one: bool,
    /// Per-layer modules beyond [`COMMON`], overriding it where a name repeats.
    pub layer: &'static [(&'static str, &'static str)],
}

/// Per-layer modules every architecture shares, under `model.layers.N.`.
const COMMON: &[(&str, &str)] = &[
    ("attn_q", "self_attn.q_proj"),
    ("attn_k", "self_attn.k_proj"),
    ("attn_v", "self_attn.v_proj"),
    ("attn_output", "self_attn.o_proj"),
    ("attn_q_norm", "self_attn.q_norm"),
    ("attn_k_norm", "self_attn.k_norm"),
    ("attn_norm", "input_layernorm"),
    ("ffn_gate", "mlp.gate_proj"),
    ("ffn_up", "mlp.up_proj"),
    ("ffn_down", "mlp.down_proj"),
    ("ffn_norm", "post_attention_layernorm"),
];

/// Mixture-of-experts modules (llama's Mixtral files, qwen2moe, qwen3moe): experts stacked
/// `[E, I, H]` / `[E, H, I]`, a router, Qwen2-MoE's shared expert and its gate.
const MOE: &[(&str, &str)] = &[
    ("ffn_gate_inp", "mlp.gate"),
    ("ffn_gate_exps", "mlp.experts.gate_proj"),
    ("ffn_up_exps", "mlp.experts.up_proj"),
    ("ffn_down_exps", "mlp.experts.down_proj"),
    ("ffn_gate_shexp", "mlp.shared_expert.gate_proj"),
    ("ffn_up_shexp", "mlp.shared_expert.up_proj"),
    ("ffn_down_shexp", "mlp.shared_expert.down_proj"),
    ("ffn_gate_inp_shexp", "mlp.shared_expert_gate"),
];

/// Gemma 2 and 3: four norms per layer, `ffn_norm` being the one before the MLP.
const SANDWICH: &[(&str, &str)] = &[
    ("post_attention_norm", "post_attention_layernorm"),
    ("ffn_norm", "pre_feedforward_layernorm"),
    ("post_ffw_norm", "post_feedforward_layernorm"),
];

/// Phi-3: q/k/v fused, and gate/up fused in `ffn_up` (`[2I, H]`).
const PHI3: &[(&str, &str)] = &[
    ("attn_qkv", "self_attn.qkv_proj"),
    ("ffn_up", "mlp.gate_up_proj"),
];

/// Every architecture zoo maps, by `general.architecture`.
pub(crate) const ARCHS: &[Arch] = &[
    Arch {
        gguf: "llama",
        model_type: "llama",
        class: "LlamaForCausalLM",
        permuted_qk: true,
        norms_plus_one: false,
        layer: MOE,
    },
    Arch {
        gguf: "qwen2",
        model_type: "qwen2",
        class: "Qwen2ForCausalLM",
        permuted_qk: false,
        norms_plus_one: false,
        layer: &[],
    },
    Arch {
        gguf: "qwen3",
        model_type: "qwen3",
        class: "Qwen3ForCausalLM",
        permuted_qk: false,
        norms_plus_one: false,
        layer: &[],
    },
    Arch {
        gguf: "qwen2moe",
        model_type: "qwen2_moe",
        class: "Qwen2MoeForCausalLM",
        permuted_qk: false,
        norms_plus_one: false,
        layer: MOE,
    },
    Arch {
        gguf: "qwen3moe",
        model_type: "qwen3_moe",
        class: "Qwen3MoeForCausalLM",
        permuted_qk: false,
        norms_plus_one: false,
        layer: MOE,
    },
    Arch {
        gguf: "phi3",
        model_type: "phi3",
        class: "Phi3ForCausalLM",
        permuted_qk: false,
        norms_plus_one: false,
        layer: PHI3,
    },
    Arch {
        gguf: "gemma",
        model_type: "gemma",
        class: "GemmaForCausalLM",
        permuted_qk: false,
        norms_plus_one: true,
        layer: &[],
    },
    Arch {
        gguf: "gemma2",
        model_type: "gemma2",
        class: "Gemma2ForCausalLM",
        permuted_qk: false,
        norms_plus_one: true,
        layer: SANDWICH,
    },
    Arch {
        gguf: "gemma3",
        model_type: "gemma3_text",
        class: "Gemma3ForCausalLM",
        permuted_qk: false,
        norms_plus_one: true,
        layer: SANDWICH,
    },
];

/// The architecture named `gguf`, if zoo maps it.
pub(crate) fn arch(gguf: &str) -> Option<&'static Arch> {
    ARCHS.iter().find(|a| a.gguf == gguf)
}

impl Arch {
    fn module(&self, gguf: &str) -> Option<&'static str> {
        self.layer
            .iter()
            .chain(COMMON)
            .find(|(g, _)| *g == gguf)
            .map(|(_, hf)| *hf)
    }

    /// The HF name of a GGUF tensor; `Ok(None)` for tensors HF does not store (`rope_freqs`:
    /// llama 3's rope factors, and Phi-3's `rope_factors_long/short`, which HF derives from
    /// `rope_scaling` in the config); an error for names with no HF counterpart.
    pub(crate) fn hf_name(&self, gguf: &str) -> Result<Option<Mapped>, String> {
        let plus_one = |name: &str| {
            if self.norms_plus_one && name.ends_with("norm.weight") {
                Undo::PlusOne
            } else {
                Undo::None
            }
        };
        let top = |name: &str| {
            Ok(Some(Mapped {
                name: name.to_string(),
                undo: plus_one(name),
            }))
        };
        match gguf {
            "token_embd.weight" => return top("model.embed_tokens.weight"),
            "output_norm.weight" => return top("model.norm.weight"),
            "output.weight" => return top("lm_head.weight"),
            "rope_freqs.weight" | "rope_factors_long.weight" | "rope_factors_short.weight" => {
                return Ok(None)
            }
            _ => {}
        }
        let unknown = || {
            let mut names: Vec<&str> = COMMON.iter().chain(self.layer).map(|(g, _)| *g).collect();
            names.dedup();
            format!(
                "tensor {gguf:?} has no counterpart in HF's {} (expected token_embd, output_norm, output or blk.N.{{{}}}.weight/bias); the file may be a variant zoo does not map yet",
                self.class,
                names.join(",")
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
        let hf = self.module(module).ok_or_else(unknown)?;
        // Stacked experts are parameters of the experts module in transformers, not layers.
        let name = if module.ends_with("_exps") {
            format!("model.layers.{layer}.{hf}")
        } else {
            format!("model.layers.{layer}.{hf}.{suffix}")
        };
        let undo = match module {
            "attn_q" if self.permuted_qk => Undo::Permutation(Qk::Q),
            "attn_k" if self.permuted_qk => Undo::Permutation(Qk::K),
            _ => plus_one(&name),
        };
        Ok(Some(Mapped { name, undo }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hf(a: &str, n: &str) -> Mapped {
        arch(a).unwrap().hf_name(n).unwrap().unwrap()
    }

    #[test]
    fn maps_every_llama_tensor() {
        let l = |n: &str| hf("llama", n).name;
        assert_eq!(l("token_embd.weight"), "model.embed_tokens.weight");
        assert_eq!(l("output_norm.weight"), "model.norm.weight");
        assert_eq!(l("output.weight"), "lm_head.weight");
        assert_eq!(
            l("blk.0.attn_q.weight"),
            "model.layers.0.self_attn.q_proj.weight"
        );
        assert_eq!(
            l("blk.12.attn_k.bias"),
            "model.layers.12.self_attn.k_proj.bias"
        );
        assert_eq!(
            l("blk.3.attn_output.weight"),
            "model.layers.3.self_attn.o_proj.weight"
        );
        assert_eq!(
            l("blk.3.ffn_down.weight"),
            "model.layers.3.mlp.down_proj.weight"
        );
        assert_eq!(
            l("blk.3.ffn_norm.weight"),
            "model.layers.3.post_attention_layernorm.weight"
        );
        assert_eq!(
            hf("llama", "blk.0.attn_q.weight").undo,
            Undo::Permutation(Qk::Q)
        );
        assert_eq!(
            hf("llama", "blk.0.attn_k.weight").undo,
            Undo::Permutation(Qk::K)
        );
        assert_eq!(
            arch("llama").unwrap().hf_name("rope_freqs.weight").unwrap(),
            None
        );
        // Mixtral's experts in a llama file.
        assert_eq!(
            l("blk.1.ffn_gate_exps.weight"),
            "model.layers.1.mlp.experts.gate_proj"
        );
        assert_eq!(
            l("blk.1.ffn_gate_inp.weight"),
            "model.layers.1.mlp.gate.weight"
        );
    }

    #[test]
    fn gemma_norms_phi3_fusions_and_qwen_experts() {
        let g = hf("gemma3", "blk.2.ffn_norm.weight");
        assert_eq!(g.name, "model.layers.2.pre_feedforward_layernorm.weight");
        assert_eq!(g.undo, Undo::PlusOne);
        assert_eq!(hf("gemma3", "blk.2.attn_q_norm.weight").undo, Undo::PlusOne);
        assert_eq!(hf("gemma3", "output_norm.weight").undo, Undo::PlusOne);
        assert_eq!(hf("gemma3", "blk.2.attn_q.weight").undo, Undo::None);
        assert_eq!(
            hf("gemma2", "blk.0.post_ffw_norm.weight").name,
            "model.layers.0.post_feedforward_layernorm.weight"
        );
        assert_eq!(
            hf("gemma", "blk.0.ffn_norm.weight").name,
            "model.layers.0.post_attention_layernorm.weight"
        );
        assert_eq!(
            hf("phi3", "blk.0.ffn_up.weight").name,
            "model.layers.0.mlp.gate_up_proj.weight"
        );
        assert_eq!(
            hf("phi3", "blk.0.attn_qkv.weight").name,
            "model.layers.0.self_attn.qkv_proj.weight"
        );
        assert_eq!(
            hf("qwen2moe", "blk.0.ffn_gate_inp_shexp.weight").name,
            "model.layers.0.mlp.shared_expert_gate.weight"
        );
        assert_eq!(hf("qwen2", "blk.0.attn_q.bias").undo, Undo::None);
    }

    #[test]
    fn refuses_names_without_hf_counterpart() {
        for n in [
            "blk.0.ffn_gate_chexps.weight",
            "blk.x.attn_q.weight",
            "blk.01.attn_q.weight",
            "blk.0.attn_q.scale",
            "foo",
            "blk..attn_q.weight",
        ] {
            let e = arch("llama").unwrap().hf_name(n).unwrap_err();
            assert!(e.contains(n), "{e}");
        }
        // Phi-3's fused names mean nothing in a llama file.
        assert!(arch("llama")
            .unwrap()
            .hf_name("blk.0.attn_qkv.weight")
            .is_err());
    }
}
