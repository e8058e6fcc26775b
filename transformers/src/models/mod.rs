//! One file per transformers family, each mirroring its `modeling_*.py`; each exports its
//! registry entry (`FAMILY`), listed in `registry.rs`.

pub mod bert;
pub mod gpt2;
pub mod llama;
pub mod mistral;
pub mod qwen2;
pub mod qwen3;
