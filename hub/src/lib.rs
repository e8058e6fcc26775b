//! zoo-hub: where a model's files come from and what they hold, read from headers alone.

pub mod checkpoint;
pub mod config;
pub mod dtype;
pub mod error;
pub mod gguf;
pub mod inventory;
pub mod output;
pub mod prequantized;
pub mod pretrained;
pub mod safetensors;
pub mod slow_tokenizer;
pub mod source;
pub mod weights;

pub use checkpoint::{find_checkpoint, Checkpoint, Format, ModelIndex, ShardIndex};
pub use config::{
    GenerationConfig, PretrainedConfig, Rope, RopeParameters, TokenIds, TokenizerConfig,
};
pub use dtype::{Dtype, GgmlType};
pub use error::{HubError, Result};
pub use inventory::{Inventory, TensorInfo, Transform};
pub use output::{write_atomically, OutputError};
pub use prequantized::PreQuantized;
pub use pretrained::Pretrained;
pub use source::{hub_cache_dir, CachedRepo, ModelFiles, Source};
pub use weights::{TensorView, Tile, Weights};
