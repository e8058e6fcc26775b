//! One file per transformers family, each mirroring its `modeling_*.py`.

pub mod llama;
pub mod mistral;
pub mod qwen2;
pub mod qwen3;
