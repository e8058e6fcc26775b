//! The one list of families zoo-transformers runs.
//!
//! Each entry says how transformers names the family (`model_type`, architecture classes
//! and the task each serves, GGUF architecture names), how a checkpoint of it splits over
//! devices (its no-split units and what each costs), and how to load it. `AutoConfig`,
//! `AutoModel`, `AutoModelFor*`, the CLI's help, the parity harness and the "unsupported"
//! error all read this table; adding a family is one model file plus one entry here
//! (`docs/ARCHITECTURE.md` has the recipe).

use zoo_hub::{Dtype, Inventory, PretrainedConfig};
use zoo_runtime::device_map::{units_from_inventory, ModelShape, Unit, UnitRules};
use zoo_runtime::nn::Weights;

use crate::kinds::{CausalLm, DecoderModel, Encoder, ImageEncoder, ImageTextModel, Seq2SeqLm};
use crate::models::{
    bert, clip, gemma, gemma2, gemma3, gpt2, llama, mistral, mixtral, phi3, qwen2, qwen2_moe,
    qwen3, qwen3_moe, t5, vit,
};
use crate::Result;

/// What an architecture class computes, as transformers' `AutoModelFor*` classes group them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Task {
    /// The base model: hidden states (`AutoModel`).
    Base,
    /// Next-token logits (`AutoModelForCausalLM`).
    CausalLm,
    /// Masked-token logits (`AutoModelForMaskedLM`).
    MaskedLm,
    /// One label per sequence (`AutoModelForSequenceClassification`).
    SequenceClassification,
    /// One label per token (`AutoModelForTokenClassification`).
    TokenClassification,
    /// One label per image (`AutoModelForImageClassification`).
    ImageClassification,
    /// Encoder-decoder generation (`AutoModelForSeq2SeqLM`).
    Seq2SeqLm,
}

impl Task {
    /// The `AutoModelFor*` class of the task.
    pub fn auto_class(self) -> &'static str {
        match self {
            Task::Base => "AutoModel",
            Task::CausalLm => "AutoModelForCausalLM",
            Task::MaskedLm => "AutoModelForMaskedLM",
            Task::SequenceClassification => "AutoModelForSequenceClassification",
            Task::TokenClassification => "AutoModelForTokenClassification",
            Task::ImageClassification => "AutoModelForImageClassification",
            Task::Seq2SeqLm => "AutoModelForSeq2SeqLM",
        }
    }
}

/// One architecture class of a family (`config.json`'s `architectures` entry).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Architecture {
    /// The class name, e.g. `LlamaForCausalLM`.
    pub name: &'static str,
    /// What it computes.
    pub task: Task,
}

/// How a family's checkpoints are built: a decoder with a cache, or a bidirectional encoder.
#[derive(Clone, Copy, Debug)]
pub enum Loaders {
    /// Decoder families: the base model and the causal LM.
    Decoder {
        /// The base decoder from the weights under its prefix.
        base: fn(&Weights, &PretrainedConfig) -> Result<Box<dyn DecoderModel>>,
        /// The causal LM from the checkpoint root.
        causal_lm: fn(&Weights, &PretrainedConfig) -> Result<Box<dyn CausalLm>>,
    },
    /// Encoder families: one loader for every head (the task picks it), from the
    /// checkpoint root.
    Encoder(fn(&Weights, &PretrainedConfig, Task) -> Result<Box<dyn Encoder>>),
    /// Vision encoders (pixel values in): one loader for every head, from the checkpoint
    /// root.
    Image(fn(&Weights, &PretrainedConfig, Task) -> Result<Box<dyn ImageEncoder>>),
    /// Contrastive image-text models (`CLIPModel`), from the checkpoint root.
    ImageText(fn(&Weights, &PretrainedConfig) -> Result<Box<dyn ImageTextModel>>),
    /// Encoder-decoder families (T5): the encoder alone (`T5EncoderModel`, what diffusion
    /// pipelines read) and the whole model with its language-model head, from the checkpoint
    /// root.
    Seq2Seq {
        /// The encoder stack, for the `Base` task.
        encoder: fn(&Weights, &PretrainedConfig, Task) -> Result<Box<dyn Encoder>>,
        /// Encoder, decoder and head (`T5ForConditionalGeneration`).
        seq2seq: fn(&Weights, &PretrainedConfig) -> Result<Box<dyn Seq2SeqLm>>,
    },
}

/// How a checkpoint of the family splits over devices, from its config: the device-map
/// planner's view of the model (it names no module path itself).
#[derive(Clone, Debug, PartialEq)]
pub struct Layout {
    /// Containers whose numbered children are no-split units (`model.layers`), HF's
    /// `_no_split_modules` as module paths.
    pub layer_containers: Vec<String>,
    /// Modules that run before the layers (the embeddings).
    pub inputs: Vec<String>,
    /// Tensors that share storage (HF's `_tied_weights_keys`), each group placed together.
    pub tied: Vec<Vec<String>>,
    /// What each layer costs beyond its weights: KV cache (decoders) and activations.
    pub shape: ModelShape,
    /// The longest sequence the model takes (`max_position_embeddings`): what an encoder's
    /// plan is sized for by default, and a decoder's load at most.
    pub context: usize,
}

impl Layout {
    /// The checkpoint's no-split units in execution order, weights counted in `dtype` (as
    /// stored when `None`); a tied group counts only where all its tensors are stored.
    pub fn units(&self, inventory: &Inventory, dtype: Option<Dtype>) -> Vec<Unit> {
        let containers: Vec<&str> = self.layer_containers.iter().map(String::as_str).collect();
        let inputs: Vec<&str> = self.inputs.iter().map(String::as_str).collect();
        let tied: Vec<Vec<String>> = self
            .tied
            .iter()
            .filter(|g| g.iter().all(|t| inventory.get(t).is_some()))
            .cloned()
            .collect();
        let rules = UnitRules {
            layer_containers: &containers,
            inputs: &inputs,
            tied: &tied,
        };
        units_from_inventory(inventory, &rules, dtype)
    }
}

/// One family: how transformers names it and how zoo loads it.
#[derive(Debug)]
pub struct Family {
    /// `config.json`'s `model_type`.
    pub model_type: &'static str,
    /// The transformers file the model file mirrors.
    pub modeling_file: &'static str,
    /// Every architecture class, the family's default for its kind first.
    pub architectures: &'static [Architecture],
    /// llama.cpp's `general.architecture` names whose GGUF files load as this family.
    pub gguf_architectures: &'static [&'static str],
    /// HF's `_no_split_modules`: the classes a device map never cuts through.
    pub no_split_modules: &'static [&'static str],
    /// Checks the config for impossible values before any weight is read.
    pub validate: fn(&PretrainedConfig) -> Result<()>,
    /// The planner's view of a checkpoint.
    pub layout: fn(&PretrainedConfig) -> Result<Layout>,
    /// How to build its models.
    pub loaders: Loaders,
}

impl Family {
    /// The architecture class `name`, if the family has it.
    pub fn architecture(&self, name: &str) -> Option<&'static Architecture> {
        self.architectures.iter().find(|a| a.name == name)
    }

    /// The family's class for `task`, if any.
    pub fn architecture_for(&self, task: Task) -> Option<&'static Architecture> {
        self.architectures.iter().find(|a| a.task == task)
    }

    /// Whether the family's models are decoders (generate text) rather than encoders.
    pub fn is_decoder(&self) -> bool {
        matches!(self.loaders, Loaders::Decoder { .. })
    }

    /// Whether the family generates text: a decoder, or an encoder-decoder.
    pub fn generates(&self) -> bool {
        matches!(
            self.loaders,
            Loaders::Decoder { .. } | Loaders::Seq2Seq { .. }
        )
    }
}

/// Every family zoo-transformers loads, in the order help texts and errors list them.
pub static FAMILIES: &[Family] = &[
    llama::FAMILY,
    mistral::FAMILY,
    qwen2::FAMILY,
    qwen3::FAMILY,
    mixtral::FAMILY,
    qwen2_moe::FAMILY,
    qwen3_moe::FAMILY,
    phi3::FAMILY,
    gemma::FAMILY,
    gemma2::FAMILY,
    gemma3::FAMILY,
    gpt2::FAMILY,
    bert::FAMILY,
    clip::FAMILY,
    clip::VISION_FAMILY,
    clip::CLIP_FAMILY,
    vit::FAMILY,
    t5::FAMILY,
    t5::UMT5_FAMILY,
];

/// The family of a `model_type`.
pub fn by_model_type(model_type: &str) -> Option<&'static Family> {
    FAMILIES.iter().find(|f| f.model_type == model_type)
}

/// The family and class of an architecture name.
pub fn by_architecture(name: &str) -> Option<(&'static Family, &'static Architecture)> {
    FAMILIES
        .iter()
        .find_map(|f| f.architecture(name).map(|a| (f, a)))
}

/// The family of a GGUF `general.architecture`.
pub fn by_gguf_architecture(name: &str) -> Option<&'static Family> {
    FAMILIES
        .iter()
        .find(|f| f.gguf_architectures.contains(&name))
}

/// Every architecture class, in registry order.
pub fn architectures() -> impl Iterator<Item = &'static Architecture> {
    FAMILIES.iter().flat_map(|f| f.architectures.iter())
}

/// Every architecture class serving `task`, in registry order.
pub fn architectures_for(task: Task) -> Vec<&'static str> {
    architectures()
        .filter(|a| a.task == task)
        .map(|a| a.name)
        .collect()
}

/// Every `model_type`, in registry order.
pub fn model_types() -> Vec<&'static str> {
    FAMILIES.iter().map(|f| f.model_type).collect()
}

/// The families of one kind (those that generate when `decoder`: decoders and
/// encoder-decoders; else those with an encoder) with their classes, for help texts: `Families: llama (LlamaForCausalLM, LlamaModel), ...`.
pub fn families_help(decoder: bool) -> String {
    let list: Vec<String> = FAMILIES
        .iter()
        .filter(|f| {
            if decoder {
                f.generates()
            } else {
                !f.is_decoder()
            }
        })
        .map(|f| {
            let classes: Vec<&str> = f.architectures.iter().map(|a| a.name).collect();
            format!("  {} ({})", f.model_type, classes.join(", "))
        })
        .collect();
    format!("Families (config.json model_type):\n{}", list.join("\n"))
}

/// The planner's view of any checkpoint whose config names a registered family.
pub fn layout(config: &PretrainedConfig) -> Option<Result<Layout>> {
    let family = config
        .architectures
        .iter()
        .find_map(|a| by_architecture(a).map(|(f, _)| f))
        .or_else(|| by_model_type(config.model_type.as_deref()?))?;
    Some((family.layout)(config))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_every_family_has_its_default_class_first() {
        let mut names: Vec<&str> = architectures().map(|a| a.name).collect();
        let n = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), n, "an architecture is listed twice");
        let mut types = model_types();
        types.sort_unstable();
        types.dedup();
        assert_eq!(types.len(), FAMILIES.len());
        for f in FAMILIES {
            let first = f.architectures[0].task;
            let want = if f.is_decoder() {
                Task::CausalLm
            } else {
                Task::Base
            };
            assert_eq!(first, want, "{}", f.model_type);
            assert!(!f.no_split_modules.is_empty(), "{}", f.model_type);
        }
        assert_eq!(by_gguf_architecture("llama").unwrap().model_type, "llama");
        assert_eq!(
            by_architecture("BertForMaskedLM").unwrap().1.task,
            Task::MaskedLm
        );
    }
}
