//! Gemma 2: mirrors transformers' `models/gemma2/modeling_gemma2.py` (`modular_gemma2.py`
//! derives it from Gemma).
//!
//! What differs from Gemma: sandwich norms (`post_attention_layernorm` on the attention
//! output, `pre_/post_feedforward_layernorm` around the MLP); scores scaled by
//! `query_pre_attn_scalar ** -0.5` and soft-capped by `attn_logit_softcapping`, logits by
//! `final_logit_softcapping` (defaults 50 and 30 when the config omits them, null turning
//! them off); sliding-window and global layers alternating (`layer_types`, else even layers
//! slide); the activation from `hidden_activation`.

use zoo_hub::PretrainedConfig;

use super::gemma::{self, GemmaFeatures};
use crate::config::DecoderConfig;
use crate::family::derived_decoder;
use crate::{Error, Result};

derived_decoder! {
    gemma::{GemmaModel, GemmaForCausalLM} as Gemma2 { Gemma2Model, Gemma2ForCausalLM },
    model_type "gemma2", folder "gemma2", gguf ["gemma2"],
    heads [
        Gemma2ForSequenceClassification: SequenceClassification,
        Gemma2ForTokenClassification: TokenClassification,
    ],
}

/// `query_pre_attn_scalar ** -0.5` (transformers' default scalar: 256).
pub(crate) fn query_scale(cfg: &PretrainedConfig) -> Result<f64> {
    match gemma::nullable_f64(cfg, "query_pre_attn_scalar")? {
        None => Ok(256f64.powf(-0.5)),
        Some(Some(s)) => Ok(s.powf(-0.5)),
        Some(None) => Err(Error::Config {
            path: cfg.path.clone(),
            reason: "`query_pre_attn_scalar` is null; it must be a positive number".into(),
        }),
    }
}

/// Gemma 2's switches.
pub fn features(cfg: &PretrainedConfig, c: &DecoderConfig) -> Result<GemmaFeatures> {
    let base = gemma::features(cfg, c)?;
    let cap = |field: &str, default: f64| -> Result<Option<f64>> {
        Ok(gemma::nullable_f64(cfg, field)?.unwrap_or(Some(default)))
    };
    Ok(GemmaFeatures {
        sandwich_norms: true,
        scale: query_scale(cfg)?,
        attn_softcap: cap("attn_logit_softcapping", 50.0)?,
        final_softcap: cap("final_logit_softcapping", 30.0)?,
        activation: gemma::activation(cfg, "hidden_activation", "gelu_pytorch_tanh")?,
        // transformers' default when `layer_types` is absent: even layers slide.
        windows: c.windows(|i| (i + 1) % 2 != 0),
        ..base
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn features_of(extra: serde_json::Value) -> Result<GemmaFeatures> {
        let mut v = json!({
            "model_type": "gemma2", "vocab_size": 16, "hidden_size": 8,
            "intermediate_size": 16, "num_hidden_layers": 4, "num_attention_heads": 2,
            "head_dim": 4, "sliding_window": 3,
        });
        v.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        let cfg = PretrainedConfig::from_value(v, std::path::Path::new("config.json")).unwrap();
        features(&cfg, &DecoderConfig::from_pretrained(&cfg)?)
    }

    #[test]
    fn caps_default_to_transformers_values_and_null_turns_them_off() {
        let f = features_of(json!({})).unwrap();
        assert_eq!((f.attn_softcap, f.final_softcap), (Some(50.0), Some(30.0)));
        assert_eq!(
            f.windows,
            [Some(3), None, Some(3), None],
            "even layers slide"
        );
        let f = features_of(json!({"attn_logit_softcapping": null, "final_logit_softcapping": 5}))
            .unwrap();
        assert_eq!((f.attn_softcap, f.final_softcap), (None, Some(5.0)));
    }

    #[test]
    fn the_activation_comes_from_hidden_activation_and_the_scale_from_the_scalar() {
        let f =
            features_of(json!({"hidden_activation": "gelu", "query_pre_attn_scalar": 64})).unwrap();
        assert_eq!(f.activation, zoo_runtime::Activation::GeluTanh);
        assert_eq!(f.scale, 0.125);
        let e = features_of(json!({"query_pre_attn_scalar": null})).unwrap_err();
        assert!(e.to_string().contains("query_pre_attn_scalar"), "{e}");
    }
}
