//! Phi-3 (Phi-3, Phi-3.5, Phi-4-mini): mirrors transformers' `models/phi3/modeling_phi3.py`.
//!
//! What differs from Llama: q, k and v live in one `qkv_proj` and gate and up in one
//! `gate_up_proj`, read as stored and split by output columns (q, k, v; gate, up);
//! `longrope` with short and long factors, switched past `original_max_position_embeddings`
//! (a top-level field here), and legacy `su` / `yarn` rope types read as longrope;
//! `partial_rotary_factor` (Phi-4-mini rotates 3/4 of each head); when `sliding_window` is
//! set every layer slides. No biases.

use super::llama::{self, DecoderFeatures};
use crate::config::DecoderConfig;
use crate::family::derived_decoder;

derived_decoder! {
    llama::{LlamaModel, LlamaForCausalLM} as Phi3 { Phi3Model, Phi3ForCausalLM },
    model_type "phi3", folder "phi3", gguf ["phi3"],
    heads [
        Phi3ForSequenceClassification: SequenceClassification,
        Phi3ForTokenClassification: TokenClassification,
    ],
}

/// Phi-3's switches: fused projections, no biases, every layer in the window when one is set,
/// the whole sequence recomputed when generation passes the longrope switch.
pub fn features(config: &DecoderConfig) -> DecoderFeatures {
    DecoderFeatures {
        windows: config.windows(|_| true),
        fused_qkv: true,
        fused_gate_up: true,
        longrope_recompute: true,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use zoo_hub::PretrainedConfig;
    use zoo_runtime::nn::RopeScaling;

    fn config(extra: serde_json::Value) -> crate::Result<DecoderConfig> {
        let mut v = json!({
            "model_type": "phi3", "vocab_size": 16, "hidden_size": 32, "intermediate_size": 16,
            "num_hidden_layers": 2, "num_attention_heads": 4, "max_position_embeddings": 128,
        });
        v.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        DecoderConfig::from_pretrained(
            &PretrainedConfig::from_value(v, std::path::Path::new("config.json")).unwrap(),
        )
    }

    #[test]
    fn legacy_su_rope_is_longrope_switched_at_the_top_level_original_context() {
        // Phi-3-mini-128k's v4 form: `rope_scaling.type = "su"`, the original context outside.
        let c = config(json!({
            "original_max_position_embeddings": 32,
            "rope_scaling": {"type": "su", "short_factor": [1, 1, 1, 1], "long_factor": [2, 2, 2, 2]},
        }))
        .unwrap();
        match c.rope().unwrap().scaling {
            RopeScaling::LongRope {
                factor,
                original_max_position_embeddings,
                ..
            } => {
                assert_eq!(original_max_position_embeddings, 32);
                assert_eq!(factor, 4.0);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn partial_rotary_factor_is_read_from_rope_parameters_too() {
        let c = config(json!({
            "rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.75}
        }))
        .unwrap();
        assert_eq!(c.rope().unwrap().rotary_dim, 6);
        let e = config(json!({"partial_rotary_factor": 1.5})).unwrap_err();
        assert!(e.to_string().contains("partial_rotary_factor"), "{e}");
    }

    #[test]
    fn every_layer_slides_when_a_window_is_set() {
        let c = config(json!({"sliding_window": 5})).unwrap();
        assert_eq!(features(&c).windows, [Some(5), Some(5)]);
        assert!(features(&c).fused_qkv && features(&c).fused_gate_up);
    }
}
