//! One file per transformers family, each mirroring its `modeling_*.py`; each exports its
//! registry entry (`FAMILY`), listed in `registry.rs`.

pub mod bert;
pub mod clip;
pub mod decoder;
pub mod distilbert;
pub mod gemma;
pub mod gemma2;
pub mod gemma3;
pub mod gpt2;
pub mod llama;
pub mod llava;
pub mod mistral;
pub mod mixtral;
pub mod modernbert;
pub mod moe;
pub mod mpnet;
mod packed;
mod patches;
pub mod phi3;
mod placement;
pub mod qwen2;
pub mod qwen2_moe;
pub mod qwen3;
pub mod qwen3_moe;
pub mod roberta;
pub mod siglip;
pub mod t5;
pub mod vit;
pub mod xlm_roberta;

pub(crate) use placement::on_device;
pub use placement::Placement;
