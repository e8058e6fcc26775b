//! Building blocks shared by model files, loaded by HF weight name.

mod experts;
mod layers;
mod lora;
mod rope;
mod weights;

pub use crate::cpu::quant::keeps_blocks;
pub use experts::{ExpertNames, Experts};
pub use layers::{
    Conv2d, ConvTranspose2d, Embedding, GroupNorm, LayerNorm, Linear, RmsNorm, SharedInput,
};
pub use lora::{LoraLayout, LoraPair, PatchedWeights, WeightPatch};
pub use rope::{RopeConfig, RopeScaling, RotaryEmbedding};
pub use weights::{DevicePlacement, MemWeights, QuantizedWeight, WeightSource, Weights};
