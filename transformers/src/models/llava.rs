//! LLaVA: mirrors transformers' `models/llava/modeling_llava.py`
//! (`LlavaForConditionalGeneration`).
//!
//! A CLIP or SigLIP vision tower, a two-layer projector (`multi_modal_projector`: `linear_1`, the
//! `projector_hidden_act`, `linear_2`) and any decoder family zoo runs as the language model
//! (`text_config.model_type`, Llama by default). An image's features are the hidden states
//! of `vision_feature_layer` (one index, or several concatenated along the width), without
//! the class token under the `default` strategy, through the projector; they replace the
//! prompt's image tokens ([`crate::vision_language`]). Without images the model is its
//! language model.
//!
//! Weight names are the checkpoint's: transformers 5 saves `model.vision_tower.*`,
//! `model.multi_modal_projector.*`, `model.language_model.*` and `lm_head.*`; checkpoints
//! saved before it (most of the Hub's) `vision_tower.*`, `multi_modal_projector.*` and
//! `language_model.{model,lm_head}.*`. Both load.

use serde_json::Value;
use zoo_hub::PretrainedConfig;
use zoo_runtime::nn::{Linear, Weights};
use zoo_runtime::{Activation, Device, Tensor};

use super::clip::{CLIPVisionConfig, CLIPVisionModel};
use super::siglip::{SiglipVisionConfig, SiglipVisionModel};
use crate::cache::KvCache;
use crate::config::config_error;
use crate::family::{family, Family, Layout, Loaders};
use crate::kinds::{
    CausalLm, DecoderModel, ForwardArgs, ImageArgs, ImageTower, LogitsFor, ModelOutput,
    VisionLanguage,
};
use crate::{Error, Result};

/// The registry entry of `llava`.
pub(crate) const FAMILY: Family = family! {
    "llava" in "llava",
    classes [LlavaForConditionalGeneration: ImageTextToText],
    no_split ["LlavaVisionAttention"],
    tp &[], config LlavaConfig,
    loaders Loaders::Decoder { base: load_base, causal_lm: load },
};

/// Which vision hidden states become features (`vision_feature_select_strategy`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FeatureSelect {
    /// Every patch, the class token dropped.
    Default,
    /// Every token, the class token included.
    Full,
}

/// `config.json` of a LLaVA checkpoint, as transformers' `LlavaConfig` reads it.
#[derive(Clone, Debug)]
pub struct LlavaConfig {
    /// The language model's config (`text_config`, `model_type` Llama when absent).
    pub text_config: PretrainedConfig,
    /// The vision tower's config (`vision_config`).
    pub vision_config: TowerConfig,
    /// The image placeholder's id (`image_token_index`, or `image_token_id`).
    pub image_token_index: u32,
    /// The projector's activation.
    pub projector_hidden_act: String,
    /// Which tokens of the chosen hidden states are features.
    pub vision_feature_select_strategy: FeatureSelect,
    /// The vision hidden states read (Python indices into `hidden_states`, negative from
    /// the end), concatenated along the width when several.
    pub vision_feature_layer: Vec<i64>,
    /// Biases on the projector's layers.
    pub multimodal_projector_bias: bool,
    /// `lm_head` shares the input embeddings (`tie_word_embeddings`, or the text config's).
    pub tie_word_embeddings: bool,
    text_family: &'static Family,
}

impl LlavaConfig {
    /// Reads and checks the config and its two sub-configs.
    pub fn from_pretrained(cfg: &PretrainedConfig) -> Result<LlavaConfig> {
        let bad = |reason: String| config_error(cfg, reason);
        let sub = |key: &str, default_type: &str| -> Result<PretrainedConfig> {
            let mut v = cfg
                .get(key)
                .unwrap_or_else(|| Value::Object(Default::default()));
            let Some(obj) = v.as_object_mut() else {
                return Err(bad(format!("`{key}` is not an object")));
            };
            obj.entry("model_type")
                .or_insert_with(|| Value::String(default_type.into()));
            PretrainedConfig::from_value(v, &cfg.path).map_err(|e| bad(format!("`{key}`: {e}")))
        };
        let text_config = sub("text_config", "llama")?;
        let text_type = text_config.model_type.clone().unwrap_or_default();
        let text_family = crate::registry::by_model_type(&text_type)
            .filter(|f| f.is_decoder() && f.model_type != "llava")
            .ok_or_else(|| {
                bad(format!(
                    "`text_config.model_type` is {text_type:?}, which is no decoder family zoo runs; {}",
                    crate::registry::families_help(true)
                ))
            })?;
        (text_family.validate)(&text_config)?;
        let vision = sub("vision_config", "clip_vision_model")?;
        let vision_config = match vision.model_type.as_deref() {
            Some("clip_vision_model") => TowerConfig::Clip(CLIPVisionConfig::from_pretrained(&vision)?),
            Some("siglip_vision_model") => {
                TowerConfig::Siglip(SiglipVisionConfig::from_pretrained(&vision)?)
            }
            other => {
                return Err(bad(format!(
                    "`vision_config.model_type` is {other:?}; zoo's LLaVA reads a CLIP or SigLIP vision tower (clip_vision_model, siglip_vision_model)"
                )))
            }
        };
        let image_token_index = ["image_token_index", "image_token_id"]
            .iter()
            .find_map(|k| cfg.get(k).and_then(|v| v.as_u64()))
            .unwrap_or(32000);
        let image_token_index = u32::try_from(image_token_index).map_err(|_| {
            bad(format!(
                "`image_token_index` {image_token_index} is too large"
            ))
        })?;
        let projector_hidden_act = match cfg.get("projector_hidden_act") {
            None => "gelu".to_string(),
            Some(Value::String(s)) => s,
            Some(other) => return Err(bad(format!("`projector_hidden_act` is {other}"))),
        };
        Activation::from_hf(&projector_hidden_act)
            .map_err(|e| bad(format!("`projector_hidden_act`: {e}")))?;
        let vision_feature_select_strategy =
            match cfg.get("vision_feature_select_strategy").as_ref().and_then(Value::as_str) {
                None | Some("default") => FeatureSelect::Default,
                Some("full") => FeatureSelect::Full,
                Some(other) => {
                    return Err(bad(format!(
                        "`vision_feature_select_strategy` is {other:?}; transformers takes \"default\" or \"full\""
                    )))
                }
            };
        let layers = vision_config.layers() as i64;
        let vision_feature_layer = match cfg.get("vision_feature_layer") {
            None => vec![-2],
            Some(Value::Number(n)) => vec![n.as_i64().unwrap_or(i64::MAX)],
            Some(Value::Array(a)) if !a.is_empty() => {
                a.iter().map(|v| v.as_i64().unwrap_or(i64::MAX)).collect()
            }
            Some(other) => {
                return Err(bad(format!(
                    "`vision_feature_layer` is {other}; expected a layer index or a list of them"
                )))
            }
        };
        if let Some(l) = vision_feature_layer
            .iter()
            .find(|&&l| l < -(layers + 1) || l > layers)
        {
            return Err(bad(format!(
                "`vision_feature_layer` {l} is outside the vision tower's {} hidden states",
                layers + 1
            )));
        }
        let multimodal_projector_bias = match cfg.get("multimodal_projector_bias") {
            None => true,
            Some(Value::Bool(b)) => b,
            Some(other) => {
                return Err(bad(format!(
                    "`multimodal_projector_bias` is {other}, not true or false"
                )))
            }
        };
        let tie = |c: &PretrainedConfig| c.tie_word_embeddings.unwrap_or(false);
        let tie_word_embeddings = tie(cfg) || tie(&text_config);
        Ok(LlavaConfig {
            tie_word_embeddings,
            text_config,
            vision_config,
            image_token_index,
            projector_hidden_act,
            vision_feature_select_strategy,
            vision_feature_layer,
            multimodal_projector_bias,
            text_family,
        })
    }

    /// Image tokens one image fills: the tower's tokens (CLIP's class token and patches,
    /// SigLIP's patches), the first dropped under `default`.
    pub fn tokens_per_image(&self) -> usize {
        let tokens = self.vision_config.tokens();
        match self.vision_feature_select_strategy {
            FeatureSelect::Default => tokens - 1,
            FeatureSelect::Full => tokens,
        }
    }

    fn text_hidden(&self) -> Result<usize> {
        Ok(self.text_config.require_usize("hidden_size")?)
    }
}

/// The vision tower's config: CLIP's or SigLIP's.
#[derive(Clone, Debug)]
pub enum TowerConfig {
    /// `clip_vision_model`.
    Clip(CLIPVisionConfig),
    /// `siglip_vision_model`.
    Siglip(SiglipVisionConfig),
}

impl TowerConfig {
    fn layers(&self) -> usize {
        match self {
            TowerConfig::Clip(c) => c.num_hidden_layers,
            TowerConfig::Siglip(c) => c.num_hidden_layers,
        }
    }

    fn hidden(&self) -> usize {
        match self {
            TowerConfig::Clip(c) => c.hidden_size,
            TowerConfig::Siglip(c) => c.hidden_size,
        }
    }

    /// The tokens the tower outputs for an image of its size.
    fn tokens(&self) -> usize {
        match self {
            TowerConfig::Clip(c) => c.grid_side() * c.grid_side() + 1,
            TowerConfig::Siglip(c) => c.grid_side() * c.grid_side(),
        }
    }

    fn layout(&self) -> Layout {
        match self {
            TowerConfig::Clip(c) => super::clip::vision_layout(c),
            TowerConfig::Siglip(c) => super::siglip::vision_layout_of(c),
        }
    }
}

impl TowerConfig {
    /// The tower under `w` (at its root or under `vision_model.`).
    fn load(&self, w: &Weights) -> Result<Box<dyn ImageTower>> {
        Ok(match self {
            TowerConfig::Clip(c) => Box::new(CLIPVisionModel::load_either(w, c)?),
            TowerConfig::Siglip(c) => Box::new(SiglipVisionModel::load_either(w, c)?),
        })
    }
}

/// Where a checkpoint keeps the three parts: transformers 5's names, or the earlier ones.
struct Parts {
    tower: Weights,
    projector: Weights,
    /// The language model's base model.
    base: Weights,
    /// Where `lm_head` sits.
    head: Weights,
}

fn parts(w: &Weights) -> Parts {
    if w.contains("model.multi_modal_projector.linear_1.weight") {
        Parts {
            tower: w.pp("model.vision_tower"),
            projector: w.pp("model.multi_modal_projector"),
            base: w.pp("model.language_model"),
            head: w.clone(),
        }
    } else {
        Parts {
            tower: w.pp("vision_tower"),
            projector: w.pp("multi_modal_projector"),
            base: w.pp("language_model"),
            head: w.pp("language_model"),
        }
    }
}

/// The planner's view: the vision tower's layers, then the language model's, under either
/// naming; the KV cache is the language model's.
fn layout(config: &PretrainedConfig) -> Result<Layout> {
    let c = LlavaConfig::from_pretrained(config)?;
    let vision = c.vision_config.layout();
    let text = (c.text_family.layout)(&c.text_config)?;
    let under_tower = |names: &[String]| -> Vec<String> {
        names
            .iter()
            .flat_map(|n| {
                [
                    format!("model.vision_tower.{n}"),
                    format!("vision_tower.{n}"),
                ]
            })
            .collect()
    };
    let under_lm = |names: &[String]| -> Vec<String> {
        let mut out: Vec<String> = names
            .iter()
            .flat_map(|n| {
                let inner = n.strip_prefix("model.").unwrap_or(n);
                [
                    format!("model.language_model.{inner}"),
                    format!("language_model.{n}"),
                ]
            })
            .collect();
        out.dedup();
        out
    };
    let mut inputs = under_tower(&vision.inputs);
    inputs.extend([
        "model.multi_modal_projector".to_string(),
        "multi_modal_projector".to_string(),
    ]);
    inputs.extend(under_lm(&text.inputs));
    let mut containers = under_tower(&vision.layer_containers);
    containers.extend(under_lm(&text.layer_containers));
    Ok(Layout {
        layer_containers: containers,
        inputs,
        tied: text
            .tied
            .iter()
            .map(|g| {
                g.iter()
                    .map(|n| match n.strip_prefix("model.") {
                        Some(inner) => format!("model.language_model.{inner}"),
                        None => n.clone(),
                    })
                    .collect()
            })
            .collect(),
        shape: text.shape,
        context: text.context,
    })
}

/// `LlavaModel` as a decoder: the language model's base (what `AutoModel` returns for text).
fn load_base(w: &Weights, config: &PretrainedConfig) -> Result<Box<dyn DecoderModel>> {
    let c = LlavaConfig::from_pretrained(config)?;
    c.load_language_model(&parts(w).base)
}

impl LlavaConfig {
    /// The text family's base decoder from `w`.
    fn load_language_model(&self, w: &Weights) -> Result<Box<dyn DecoderModel>> {
        let Loaders::Decoder { base, .. } = self.text_family.loaders else {
            return Err(Error::Config {
                path: self.text_config.path.clone(),
                reason: "the text family is no decoder".into(),
            });
        };
        base(w, &self.text_config)
    }
}

fn load(w: &Weights, config: &PretrainedConfig) -> Result<Box<dyn CausalLm>> {
    Ok(Box::new(LlavaForConditionalGeneration::load(w, config)?))
}

/// `LlavaForConditionalGeneration`: the vision tower and projector beside a language model
/// under LLaVA's own `lm_head` (a plain product: the text family's head extras, such as
/// Gemma 2's logit soft-capping, are not LLaVA's).
#[derive(Debug)]
pub struct LlavaForConditionalGeneration {
    vision_tower: Box<dyn ImageTower>,
    linear_1: Linear,
    act: Activation,
    linear_2: Linear,
    language_model: Box<dyn DecoderModel>,
    lm_head: Linear,
    tied: bool,
    config: LlavaConfig,
}

impl LlavaForConditionalGeneration {
    /// Loads from the checkpoint root.
    pub fn load(w: &Weights, config: &PretrainedConfig) -> Result<LlavaForConditionalGeneration> {
        let c = LlavaConfig::from_pretrained(config)?;
        let p = parts(w);
        let language_model = c.load_language_model(&p.base)?;
        let vocab = language_model.vocab_size();
        let tied = c.tie_word_embeddings || !p.head.contains("lm_head.weight");
        let lm_head = match tied {
            true => language_model.input_embeddings().as_linear(),
            false => Linear::load(&p.head.pp("lm_head"), c.text_hidden()?, vocab, false)?,
        };
        let vision_tower = c.vision_config.load(&p.tower)?;
        let width = c.vision_config.hidden() * c.vision_feature_layer.len();
        let hidden = c.text_hidden()?;
        let bias = c.multimodal_projector_bias;
        Ok(LlavaForConditionalGeneration {
            vision_tower,
            linear_1: Linear::load(&p.projector.pp("linear_1"), width, hidden, bias)?,
            act: Activation::from_hf(&c.projector_hidden_act)?,
            linear_2: Linear::load(&p.projector.pp("linear_2"), hidden, hidden, bias)?,
            language_model,
            lm_head,
            tied,
            config: c,
        })
    }

    /// The config the model was built from.
    pub fn config(&self) -> &LlavaConfig {
        &self.config
    }
}

impl CausalLm for LlavaForConditionalGeneration {
    fn model(&self) -> &dyn DecoderModel {
        &*self.language_model
    }
    fn logits_device(&self) -> Device {
        self.lm_head.device()
    }
    fn tied(&self) -> bool {
        self.tied
    }
    fn forward(
        &self,
        args: ForwardArgs<'_>,
        cache: &mut KvCache,
        which: LogitsFor<'_>,
    ) -> Result<(Tensor, ModelOutput)> {
        let out = self.language_model.forward(args, cache)?;
        let h = which.select(&out.last_hidden_state)?;
        let logits = self
            .lm_head
            .forward(&h.to_device(&self.lm_head.device())?)?;
        Ok((logits, out))
    }
    fn vision(&self) -> Option<&dyn VisionLanguage> {
        Some(self)
    }
}

impl VisionLanguage for LlavaForConditionalGeneration {
    fn image_token_id(&self) -> u32 {
        self.config.image_token_index
    }
    fn image_size(&self) -> (usize, usize) {
        self.vision_tower.image_size()
    }
    fn tokens_per_image(&self) -> usize {
        self.config.tokens_per_image()
    }
    fn image_features(&self, pixel_values: &Tensor) -> Result<Tensor> {
        let out = self.vision_tower.run(ImageArgs {
            output_hidden_states: true,
            ..ImageArgs::new(pixel_values)
        })?;
        let states = &out.hidden_states;
        let n = states.len() as i64;
        let device = self.linear_1.device();
        let selected = self
            .config
            .vision_feature_layer
            .iter()
            .map(|&l| {
                let h = &states[if l < 0 { n + l } else { l } as usize];
                let h = match self.config.vision_feature_select_strategy {
                    FeatureSelect::Default => h.narrow(1, 1, h.dim(1)? - 1)?,
                    FeatureSelect::Full => h.clone(),
                };
                Ok(h.to_device(&device)?)
            })
            .collect::<Result<Vec<Tensor>>>()?;
        let refs: Vec<&Tensor> = selected.iter().collect();
        let x = Tensor::cat(&refs, 2)?;
        let x = self
            .linear_2
            .forward(&self.act.apply(&self.linear_1.forward(&x)?)?)?;
        Ok(x.to_device(&self.language_model.device())?)
    }
}
