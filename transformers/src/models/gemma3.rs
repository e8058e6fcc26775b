//! Gemma 3 (text): mirrors transformers' `models/gemma3/modeling_gemma3.py`
//! (`Gemma3ForCausalLM`, `Gemma3TextModel`, `model_type` `gemma3_text`; `modular_gemma3.py`
//! derives it from Gemma 2).
//!
//! What differs from Gemma 2: a Gemma RMSNorm over each head of q and k before rope; logits
//! soft-capped only when `final_logit_softcapping` is set (default null), scores never
//! (`attn_logit_softcapping` is read by transformers but not applied); one global layer every `sliding_window_pattern` (6) layers unless
//! `layer_types` lists them; two ropes: the global layers' from `rope_theta` (default 1e6)
//! with `rope_scaling`, the sliding layers' from `rope_local_base_freq` (default 1e4),
//! unscaled (v5 configs key both by layer type in `rope_parameters`).

use zoo_hub::{PretrainedConfig, Rope, RopeParameters};

use super::gemma::{self, GemmaFeatures};
use crate::config::DecoderConfig;
use crate::family::derived_decoder;
use crate::{Error, Result};

derived_decoder! {
    gemma::{GemmaModel, GemmaForCausalLM} as Gemma3 { Gemma3TextModel, Gemma3ForCausalLM },
    model_type "gemma3_text", folder "gemma3", gguf ["gemma3"],
    heads [Gemma3TextForSequenceClassification: SequenceClassification],
}

fn default_rope(theta: f64) -> RopeParameters {
    RopeParameters {
        rope_type: "default".into(),
        rope_theta: Some(theta),
        extra: Default::default(),
    }
}

/// Gemma 3's switches.
pub fn features(cfg: &PretrainedConfig, c: &DecoderConfig) -> Result<GemmaFeatures> {
    let bad = |reason: String| Error::Config {
        path: cfg.path.clone(),
        reason,
    };
    if cfg
        .get("use_bidirectional_attention")
        .and_then(|v| v.as_bool())
        == Some(true)
    {
        return Err(bad(
            "`use_bidirectional_attention` is true (an EmbeddingGemma encoder); zoo runs Gemma 3 as a causal LM only".into(),
        ));
    }
    let rope = cfg.rope()?;
    let per_layer_type = matches!(rope, Some(Rope::PerLayerType(_)));
    let (global, local) = match rope {
        Some(Rope::PerLayerType(m)) => (
            m.get("full_attention")
                .cloned()
                .unwrap_or_else(|| default_rope(1e6)),
            m.get("sliding_attention")
                .cloned()
                .unwrap_or_else(|| default_rope(1e4)),
        ),
        // v4: rope_theta and rope_scaling are the global layers'.
        Some(Rope::Single(p)) => (p, default_rope(1e4)),
        None => (default_rope(1e6), default_rope(1e4)),
    };
    let local = match gemma::nullable_f64(cfg, "rope_local_base_freq")? {
        Some(Some(theta)) if !per_layer_type => default_rope(theta),
        _ => local,
    };
    let global = match global.rope_theta {
        Some(_) => global,
        None => RopeParameters {
            rope_theta: Some(1e6),
            ..global
        },
    };
    // transformers 5 saves the pattern as `_sliding_window_pattern`.
    let field = cfg
        .get("sliding_window_pattern")
        .or_else(|| cfg.get("_sliding_window_pattern"));
    let pattern = match field {
        None | Some(serde_json::Value::Null) => 6,
        Some(v) => v.as_u64().filter(|&p| p > 0).ok_or_else(|| {
            bad(format!(
                "`sliding_window_pattern` is {v}; expected a positive integer"
            ))
        })? as usize,
    };
    let base = super::gemma2::features(cfg, c)?;
    Ok(GemmaFeatures {
        qk_norm: true,
        // transformers' Gemma 3 reads `attn_logit_softcapping` but never hands it to its
        // attention, so the scores are never capped.
        attn_softcap: None,
        final_softcap: gemma::nullable_f64(cfg, "final_logit_softcapping")?.flatten(),
        windows: c.windows(|i| (i + 1) % pattern != 0),
        rope: gemma::rope_from(c, &global)?,
        local_rope: Some(gemma::rope_from(c, &local)?),
        ..base
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn config(extra: serde_json::Value) -> PretrainedConfig {
        let mut v = json!({
            "model_type": "gemma3_text", "vocab_size": 16, "hidden_size": 8,
            "intermediate_size": 16, "num_hidden_layers": 12, "num_attention_heads": 2,
            "num_key_value_heads": 1, "head_dim": 4, "sliding_window": 3,
        });
        v.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        PretrainedConfig::from_value(v, std::path::Path::new("config.json")).unwrap()
    }

    fn features_of(cfg: &PretrainedConfig) -> Result<GemmaFeatures> {
        features(cfg, &DecoderConfig::from_pretrained(cfg)?)
    }

    #[test]
    fn a_v4_config_reads_its_two_ropes_and_the_sliding_pattern() {
        // How the Hub's Gemma 3 checkpoints ship: no layer_types, no rope_parameters.
        let f = features_of(&config(json!({
            "rope_theta": 1e6, "rope_local_base_freq": 1e4, "sliding_window_pattern": 6,
            "rope_scaling": {"rope_type": "linear", "factor": 8.0},
            "final_logit_softcapping": null, "attn_logit_softcapping": 50.0,
        })))
        .unwrap();
        let global: Vec<usize> = (0..12).filter(|&i| f.windows[i].is_none()).collect();
        assert_eq!(global, [5, 11]);
        assert!(f.windows.iter().flatten().all(|&w| w == 3));
        assert_eq!(f.rope.theta, 1e6);
        assert!(matches!(
            f.rope.scaling,
            zoo_runtime::nn::RopeScaling::Linear { .. }
        ));
        let local = f.local_rope.unwrap();
        assert_eq!(local.theta, 1e4);
        assert!(matches!(
            local.scaling,
            zoo_runtime::nn::RopeScaling::Default
        ));
        assert!(f.qk_norm && f.sandwich_norms);
        assert_eq!(
            f.attn_softcap, None,
            "transformers never applies it in Gemma 3"
        );
        assert_eq!(f.final_softcap, None);
        assert!(f.tie_word_embeddings);
        assert_eq!(f.scale, 0.0625, "query_pre_attn_scalar defaults to 256");
    }

    #[test]
    fn defaults_when_the_config_names_no_rope() {
        let f = features_of(&config(json!({}))).unwrap();
        assert_eq!(f.rope.theta, 1e6);
        assert_eq!(f.local_rope.unwrap().theta, 1e4);
    }

    #[test]
    fn an_embedding_gemma_config_is_refused_by_name() {
        let e = features_of(&config(json!({"use_bidirectional_attention": true}))).unwrap_err();
        assert!(e.to_string().contains("use_bidirectional_attention"), "{e}");
    }

    #[test]
    fn a_bad_pattern_or_cap_names_its_field() {
        let e = features_of(&config(json!({"sliding_window_pattern": 0}))).unwrap_err();
        assert!(e.to_string().contains("sliding_window_pattern"), "{e}");
        let e = features_of(&config(json!({"final_logit_softcapping": "big"}))).unwrap_err();
        assert!(e.to_string().contains("final_logit_softcapping"), "{e}");
    }
}
