//! PEFT LoRA adapters (`adapter_config.json` + `adapter_model.safetensors`, as
//! `PeftModel.save_pretrained` writes them), merged into the base model's weights at load as
//! `merge_and_unload` merges them: `r`, `lora_alpha`, `rank_pattern`/`alpha_pattern`,
//! `use_rslora`, `use_dora`, GPT-2's `Conv1D`s, embedding LoRAs, `modules_to_save` and
//! trained biases. Several adapters merge one after another, each with its weight (PEFT's
//! `set_scale`, diffusers' `set_adapters` weights). A config field that changes what the
//! adapter computes and that zoo does not apply is refused by name.

use std::collections::HashMap;
use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;

use serde_json::Value;
use zoo_hub::config::is_off;
use zoo_hub::{ModelFiles, Source};
use zoo_runtime::nn::{LoraLayout, LoraPair, PatchedWeights, WeightPatch, WeightSource};
use zoo_runtime::{Device, Tensor};

use crate::family::Family;
use crate::{Error, Result};

/// One adapter to merge: a folder, a file in it, or a Hub repo id (`org/name[@revision]`),
/// and the weight its update is multiplied by (1 as trained).
#[derive(Clone, Debug, PartialEq)]
pub struct Adapter {
    /// Where `adapter_config.json` and `adapter_model.safetensors` are.
    pub path: String,
    /// Multiplies `lora_alpha / r` (PEFT's `set_scale`).
    pub scale: f64,
}

impl Adapter {
    /// The adapter at `path` with its trained weight.
    pub fn new(path: impl Into<String>) -> Adapter {
        Adapter {
            path: path.into(),
            scale: 1.0,
        }
    }

    /// The same adapter at weight `scale`.
    pub fn with_scale(mut self, scale: f64) -> Adapter {
        self.scale = scale;
        self
    }
}

impl FromStr for Adapter {
    type Err = Error;

    /// `PATH_OR_REPO[:SCALE]`: a trailing `:number` is the weight.
    fn from_str(s: &str) -> Result<Adapter> {
        let (path, scale) = match s.rsplit_once(':') {
            Some((p, w)) if !p.is_empty() && w.parse::<f64>().is_ok() => (p, w.parse().ok()),
            _ => (s, None),
        };
        let scale: f64 = scale.unwrap_or(1.0);
        if path.is_empty() || !scale.is_finite() {
            return Err(Error::InvalidInput {
                field: "adapter",
                reason: format!(
                    "adapter {s:?}: write PATH_OR_REPO or PATH_OR_REPO:SCALE with a finite scale"
                ),
            });
        }
        Ok(Adapter::new(path).with_scale(scale))
    }
}

/// `base` with `adapters` merged in order. `family` says which of its weights are stored
/// `[in, out]` where a square shape cannot tell.
pub(crate) fn merged(
    base: Arc<dyn WeightSource>,
    adapters: &[Adapter],
    family: &Family,
) -> Result<PatchedWeights> {
    let mut patches: HashMap<String, Vec<WeightPatch>> = HashMap::new();
    for adapter in adapters {
        for (name, patch) in read(adapter, base.as_ref(), family)? {
            patches.entry(name).or_default().push(patch);
        }
    }
    Ok(PatchedWeights::new(base, patches)?)
}

/// Config fields that do not change what a saved adapter computes at inference: where it
/// came from, how it was initialised and trained, and which modules it targets (the file's
/// tensors say that).
const INERT_FIELDS: &[&str] = &[
    "peft_type",
    "peft_version",
    "task_type",
    "base_model_name_or_path",
    "revision",
    "inference_mode",
    "auto_mapping",
    "init_lora_weights",
    "lora_dropout",
    "loftq_config",
    "eva_config",
    "corda_config",
    "lora_ga_config",
    "target_modules",
    "exclude_modules",
    "layers_to_transform",
    "layers_pattern",
    "modules_to_save",
    "ensure_weight_tying",
    "bias",
    "megatron_core",
    "qalora_group_size",
    // Applied below.
    "r",
    "lora_alpha",
    "use_rslora",
    "use_dora",
    "rank_pattern",
    "alpha_pattern",
    "fan_in_fan_out",
];

/// The adapter's parsed `adapter_config.json`.
struct LoraConfig {
    r: usize,
    alpha: f64,
    rslora: bool,
    dora: bool,
    fan_in_fan_out: bool,
    rank_pattern: Vec<(fancy_regex::Regex, String, usize)>,
    alpha_pattern: Vec<(fancy_regex::Regex, String, f64)>,
}

impl LoraConfig {
    fn parse(path: &Path, doc: &Value) -> Result<LoraConfig> {
        let bad = |reason: String| Error::Config {
            path: path.to_path_buf(),
            reason,
        };
        let obj = doc
            .as_object()
            .ok_or_else(|| bad("not a JSON object".into()))?;
        match obj.get("peft_type").and_then(Value::as_str) {
            Some("LORA") => {}
            Some(other) => {
                return Err(bad(format!(
                    "peft_type {other:?}: zoo merges LoRA adapters (peft_type \"LORA\", DoRA \
                     included); merge this adapter into the model with PEFT's \
                     `merge_and_unload()` and load the merged checkpoint"
                )))
            }
            None => return Err(bad("no `peft_type`; is this a PEFT adapter config?".into())),
        }
        for (field, value) in obj {
            if !INERT_FIELDS.contains(&field.as_str()) && !is_off(value) {
                return Err(bad(format!(
                    "`{field}` is {value}, which zoo does not apply to a LoRA adapter; merge the \
                     adapter with PEFT's `merge_and_unload()` and load the merged checkpoint"
                )));
            }
        }
        let number = |field: &str| obj.get(field).and_then(Value::as_f64);
        let r = number("r")
            .filter(|r| *r >= 1.0 && r.fract() == 0.0)
            .ok_or_else(|| bad("`r` must be a positive integer".into()))? as usize;
        let alpha = number("lora_alpha")
            .filter(|a| a.is_finite())
            .ok_or_else(|| bad("`lora_alpha` must be a number".into()))?;
        let flag = |field: &str| obj.get(field).and_then(Value::as_bool).unwrap_or(false);
        let patterns = |field: &str| -> Result<Vec<(fancy_regex::Regex, String, f64)>> {
            let Some(map) = obj.get(field).and_then(Value::as_object) else {
                return Ok(Vec::new());
            };
            map.iter()
                .map(|(key, v)| {
                    // PEFT's `get_pattern_key`: the key matches a module name's tail.
                    let re =
                        fancy_regex::Regex::new(&format!(r"^(.*\.)?({key})$")).map_err(|e| {
                            bad(format!(
                                "`{field}` key {key:?} is not a regular expression: {e}"
                            ))
                        })?;
                    let v = v
                        .as_f64()
                        .filter(|v| v.is_finite())
                        .ok_or_else(|| bad(format!("`{field}`[{key:?}] must be a number")))?;
                    Ok((re, key.clone(), v))
                })
                .collect()
        };
        let rank_pattern = patterns("rank_pattern")?
            .into_iter()
            .map(|(re, k, v)| {
                if v >= 1.0 && v.fract() == 0.0 {
                    Ok((re, k, v as usize))
                } else {
                    Err(bad(format!(
                        "`rank_pattern`[{k:?}] must be a positive integer"
                    )))
                }
            })
            .collect::<Result<_>>()?;
        Ok(LoraConfig {
            r,
            alpha,
            rslora: flag("use_rslora"),
            dora: flag("use_dora"),
            fan_in_fan_out: flag("fan_in_fan_out"),
            rank_pattern,
            alpha_pattern: patterns("alpha_pattern")?,
        })
    }

    /// `module`'s rank and alpha: the first pattern whose key matches its name, else the
    /// config's.
    fn rank_alpha(&self, module: &str) -> (usize, f64) {
        let hit = |re: &fancy_regex::Regex| re.is_match(module).unwrap_or(false);
        let r = self
            .rank_pattern
            .iter()
            .find(|(re, ..)| hit(re))
            .map_or(self.r, |(_, _, r)| *r);
        let alpha = self
            .alpha_pattern
            .iter()
            .find(|(re, ..)| hit(re))
            .map_or(self.alpha, |(_, _, a)| *a);
        (r, alpha)
    }
}

/// The pieces of one module's update as found in the file.
#[derive(Default)]
struct Parts {
    a: Option<Tensor>,
    b: Option<Tensor>,
    magnitude: Option<Tensor>,
    embedding: bool,
}

/// One adapter's patches by base tensor name.
fn read(
    adapter: &Adapter,
    base: &dyn WeightSource,
    family: &Family,
) -> Result<Vec<(String, WeightPatch)>> {
    let not_found = |e: zoo_hub::HubError| Error::InvalidInput {
        field: "adapter",
        reason: format!("adapter {:?}: {e}", adapter.path),
    };
    let files = ModelFiles::new(Source::parse(&adapter.path).map_err(not_found)?);
    let config_path = files.get("adapter_config.json").map_err(not_found)?;
    let text = std::fs::read_to_string(&config_path).map_err(|e| Error::Config {
        path: config_path.clone(),
        reason: format!("cannot read: {e}"),
    })?;
    let doc: Value = serde_json::from_str(&text).map_err(|e| Error::Config {
        path: config_path.clone(),
        reason: format!("not valid JSON: {e}"),
    })?;
    let cfg = LoraConfig::parse(&config_path, &doc)?;
    let weights_path = match files.get_optional("adapter_model.safetensors")? {
        Some(p) => p,
        None => {
            let pickle = files.get_optional("adapter_model.bin")?.is_some();
            return Err(Error::Config {
                path: config_path,
                reason: if pickle {
                    "the adapter's weights are a pickle (adapter_model.bin), which zoo never \
                     executes; save them as adapter_model.safetensors (PEFT's \
                     `save_pretrained(..., safe_serialization=True)`)"
                        .into()
                } else {
                    "no adapter_model.safetensors next to it".into()
                },
            });
        }
    };
    let file = zoo_hub::Weights::from_safetensors(std::slice::from_ref(&weights_path))?;
    let bad = |reason: String| Error::Config {
        path: weights_path.clone(),
        reason,
    };
    let load = |name: &str| -> Result<Tensor> {
        let info = file.inventory().require(name)?;
        let values = file.load_f32(name)?;
        Ok(Tensor::from_vec(values, &info.shape, &Device::Cpu)?)
    };

    let mut modules: Vec<(String, Parts)> = Vec::new();
    let mut patches = Vec::new();
    for info in file.inventory().tensors() {
        let stored = info.name.as_str();
        // PEFT's names sit under `base_model.model.`; transformers' own `save_pretrained` of
        // a model with an adapter writes them without it.
        let name = stored.strip_prefix("base_model.model.").unwrap_or(stored);
        let piece = [
            (".lora_A.weight", 0),
            (".lora_B.weight", 1),
            (".lora_embedding_A", 2),
            (".lora_embedding_B", 3),
            (".lora_magnitude_vector.weight", 4),
            (".lora_magnitude_vector", 4),
        ]
        .into_iter()
        .find_map(|(suffix, k)| name.strip_suffix(suffix).map(|m| (m, k)));
        let Some((module, kind)) = piece else {
            if name.contains(".lora_") {
                return Err(bad(format!(
                    "`{stored}` is a LoRA tensor zoo does not know (bias, convolution or \
                     another variant); merge the adapter with PEFT's `merge_and_unload()`"
                )));
            }
            // `modules_to_save`, trained biases and the embedding tables PEFT saves beside
            // an embedding LoRA: whole tensors that replace the base's (a wrapped layer's
            // own tensors sit under `base_layer.`).
            let target = name.replacen(".base_layer.", ".", 1);
            patches.push((target, WeightPatch::Replace(load(stored)?)));
            continue;
        };
        let t = load(stored)?;
        let at = match modules.iter().position(|(m, _)| m == module) {
            Some(i) => i,
            None => {
                modules.push((module.to_string(), Parts::default()));
                modules.len() - 1
            }
        };
        let parts = &mut modules[at].1;
        match kind {
            0 | 2 => parts.a = Some(t),
            1 | 3 => parts.b = Some(t),
            _ => parts.magnitude = Some(t),
        }
        parts.embedding |= kind == 2 || kind == 3;
    }

    for (module, parts) in modules {
        let (Some(a), Some(b)) = (parts.a, parts.b) else {
            return Err(bad(format!(
                "`{module}` lacks its lora_A or lora_B tensor; is the file complete?"
            )));
        };
        if a.rank() != 2 || b.rank() != 2 {
            return Err(bad(format!(
                "`{module}`: LoRA tensors of shapes {:?} and {:?}; zoo merges LoRA on linear \
                 and embedding layers (2-D)",
                a.shape(),
                b.shape()
            )));
        }
        if parts.magnitude.is_some() && !cfg.dora {
            return Err(bad(format!(
                "`{module}` has a DoRA magnitude but the config's `use_dora` is false"
            )));
        }
        if cfg.dora && parts.magnitude.is_none() {
            return Err(bad(format!(
                "the config sets `use_dora` but `{module}` has no lora_magnitude_vector"
            )));
        }
        let (r, alpha) = cfg.rank_alpha(&module);
        // PEFT stores embedding LoRAs as A [r, vocab] and B [dim, r] too.
        let rank = a.shape()[0];
        if rank != r {
            return Err(bad(format!(
                "`{module}` has rank {rank} but adapter_config.json gives it r = {r}; the \
                 config and the weights disagree"
            )));
        }
        let weight = format!("{module}.weight");
        let stored = base.shape(&weight).ok_or_else(|| {
            bad(format!(
                "`{module}` is not a module of the base model (no `{weight}`); was the adapter \
                 trained on another model?"
            ))
        })?;
        let (out, inp) = (b.shape()[0], a.shape()[1]);
        let layout = if parts.embedding {
            LoraLayout::Transposed
        } else if stored == [out, inp] && stored != [inp, out] {
            LoraLayout::Linear
        } else if stored == [inp, out] && stored != [out, inp] {
            LoraLayout::Transposed
        } else if stored == [out, inp] {
            // Square: the family knows its `Conv1D`s; PEFT's `fan_in_fan_out` says for
            // the rest.
            let leaf = module.rsplit('.').next().unwrap_or(&module);
            if family.conv1d_modules.contains(&leaf) || cfg.fan_in_fan_out {
                LoraLayout::Transposed
            } else {
                LoraLayout::Linear
            }
        } else {
            return Err(bad(format!(
                "`{module}`: lora_B·lora_A is [{out}, {inp}] but the base stores `{weight}` as \
                 {stored:?}; was the adapter trained on another model?"
            )));
        };
        let scale = if cfg.rslora {
            alpha / (r as f64).sqrt()
        } else {
            alpha / r as f64
        } * adapter.scale;
        patches.push((
            weight,
            WeightPatch::Lora(LoraPair {
                a,
                b,
                scale,
                magnitude: parts.magnitude,
                layout,
            }),
        ));
    }
    Ok(patches)
}

/// The base model and revision an adapter repo or folder names, when `input` holds an
/// adapter (`adapter_config.json`) and no model (`config.json`): transformers'
/// `from_pretrained` then loads `base_model_name_or_path` with the adapter merged.
pub(crate) fn base_of(input: &str) -> Result<Option<(String, Option<String>)>> {
    let Ok(source) = Source::parse(input) else {
        return Ok(None);
    };
    let files = ModelFiles::new(source);
    if !matches!(files.get_optional("config.json"), Ok(None)) {
        return Ok(None);
    }
    let Ok(Some(path)) = files.get_optional("adapter_config.json") else {
        return Ok(None);
    };
    let bad = |reason: &str| Error::Config {
        path: path.clone(),
        reason: reason.into(),
    };
    let doc: Value = std::fs::read_to_string(&path)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .ok_or_else(|| bad("not valid JSON"))?;
    let base = doc
        .get("base_model_name_or_path")
        .and_then(Value::as_str)
        .filter(|b| !b.is_empty())
        .ok_or_else(|| {
            bad(
                "an adapter without `base_model_name_or_path`: load its base model and pass \
                 this adapter to it (--adapter, or the builder's `adapter`)",
            )
        })?;
    let revision = doc
        .get("revision")
        .and_then(Value::as_str)
        .map(str::to_string);
    Ok(Some((base.to_string(), revision)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adapter_weights_parse_from_a_trailing_number() {
        assert_eq!(
            "dir/a:0.5".parse::<Adapter>().unwrap(),
            Adapter::new("dir/a").with_scale(0.5)
        );
        assert_eq!(
            "org/name".parse::<Adapter>().unwrap(),
            Adapter::new("org/name")
        );
        assert_eq!(
            "org/name@v1:2".parse::<Adapter>().unwrap(),
            Adapter::new("org/name@v1").with_scale(2.0)
        );
        assert!("dir:inf".parse::<Adapter>().is_err());
        assert!("".parse::<Adapter>().is_err());
    }

    #[test]
    fn patterns_match_module_tails_as_peft_does() {
        let doc = serde_json::json!({
            "peft_type": "LORA", "r": 8, "lora_alpha": 16,
            "rank_pattern": {"q_proj": 4},
            "alpha_pattern": {r"layers\.1\.mlp\.up_proj": 3},
        });
        let cfg = LoraConfig::parse(Path::new("adapter_config.json"), &doc).unwrap();
        assert_eq!(cfg.rank_alpha("model.layers.0.self_attn.q_proj"), (4, 16.0));
        assert_eq!(cfg.rank_alpha("model.layers.0.self_attn.k_proj"), (8, 16.0));
        assert_eq!(cfg.rank_alpha("model.layers.1.mlp.up_proj"), (8, 3.0));
        assert_eq!(cfg.rank_alpha("model.layers.11.mlp.up_proj"), (8, 16.0));
    }

    #[test]
    fn fields_zoo_does_not_apply_are_refused() {
        for (field, value) in [
            ("lora_bias", serde_json::json!(true)),
            ("layer_replication", serde_json::json!([[0, 2]])),
            (
                "target_parameters",
                serde_json::json!(["experts.gate_up_proj"]),
            ),
            ("trainable_token_indices", serde_json::json!([1, 2])),
        ] {
            let mut doc = serde_json::json!({"peft_type": "LORA", "r": 8, "lora_alpha": 16});
            doc[field] = value;
            let e = LoraConfig::parse(Path::new("adapter_config.json"), &doc)
                .err()
                .unwrap();
            assert!(e.to_string().contains(field), "{e}");
        }
        let doc = serde_json::json!({"peft_type": "IA3"});
        let e = LoraConfig::parse(Path::new("a.json"), &doc).err().unwrap();
        assert!(e.to_string().contains("IA3"), "{e}");
    }
}
