//! The one list of families zoo-transformers runs.
//!
//! Each entry says how transformers names the family (`model_type`, architecture classes
//! and the task each serves, GGUF architecture names), how a checkpoint of it splits over
//! devices (its no-split units and what each costs), and how to load it. `AutoConfig`,
//! `AutoModel`, `AutoModelFor*`, the CLI's help, the parity harness and the "unsupported"
//! error all read this table; adding a family is one model file plus one entry here
//! (`docs/ARCHITECTURE.md` has the recipe). What an entry holds is `family`'s, a leaf the
//! model files import; only this list imports the model files.

use zoo_hub::PretrainedConfig;

pub use crate::family::{Architecture, Family, Layout, Loaders, Task};
use crate::models::{
    bert, clip, distilbert, gemma, gemma2, gemma3, gpt2, llama, llava, mistral, mixtral,
    modernbert, mpnet, phi3, qwen2, qwen2_moe, qwen3, qwen3_moe, roberta, siglip, t5, vit,
    xlm_roberta,
};
use crate::Result;

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
    llava::FAMILY,
    bert::FAMILY,
    roberta::FAMILY,
    xlm_roberta::FAMILY,
    distilbert::FAMILY,
    mpnet::FAMILY,
    modernbert::FAMILY,
    clip::FAMILY,
    clip::VISION_FAMILY,
    clip::CLIP_FAMILY,
    siglip::TEXT_FAMILY,
    siglip::VISION_FAMILY,
    siglip::FAMILY,
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
            // What the command loads: a decoder's generating and base classes, not its
            // classification heads.
            let classes: Vec<&str> = f
                .architectures
                .iter()
                .filter(|a| {
                    !decoder
                        || matches!(
                            a.task,
                            Task::CausalLm | Task::ImageTextToText | Task::Base | Task::Seq2SeqLm
                        )
                })
                .map(|a| a.name)
                .collect();
            format!("  {} ({})", f.model_type, classes.join(", "))
        })
        .collect();
    format!("Families (config.json model_type):\n{}", list.join("\n"))
}

/// The registered family a config names (by architecture, then `model_type`).
pub fn family_of(config: &PretrainedConfig) -> Option<&'static Family> {
    config
        .architectures
        .iter()
        .find_map(|a| by_architecture(a).map(|(f, _)| f))
        .or_else(|| by_model_type(config.model_type.as_deref()?))
}

/// The planner's view of any checkpoint whose config names a registered family.
pub fn layout(config: &PretrainedConfig) -> Option<Result<Layout>> {
    let family = family_of(config)?;
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
            let want: &[Task] = if f.is_decoder() {
                &[Task::CausalLm, Task::ImageTextToText]
            } else {
                &[Task::Base]
            };
            assert!(want.contains(&first), "{}", f.model_type);
            assert!(!f.no_split_modules.is_empty(), "{}", f.model_type);
        }
        assert_eq!(by_gguf_architecture("llama").unwrap().model_type, "llama");
        assert_eq!(
            by_architecture("BertForMaskedLM").unwrap().1.task,
            Task::MaskedLm
        );
    }
}
