//! zoo-transformers: the Llama family (Llama, Mistral, Qwen2, Qwen3) read from Hugging Face
//! checkpoints as they are, `Auto*` dispatch, tokenizers with chat templates, and generation.
//!
//! ```no_run
//! use zoo_runtime::device_map::DeviceMap;
//! use zoo_transformers::{AutoModelForCausalLM, GenerationOptions};
//!
//! let model = AutoModelForCausalLM::load_pretrained("HuggingFaceTB/SmolLM2-135M-Instruct", DeviceMap::Cpu)?;
//! let out = model.generate_text("The capital of France is", &GenerationOptions::greedy(20))?;
//! println!("{out}");
//! # Ok::<(), zoo_transformers::Error>(())
//! ```

#[cfg(target_arch = "x86_64")]
mod amx;
pub mod auto;
pub mod cache;
pub mod chat;
pub mod config;
mod error;
pub mod generation;
mod kernels;
mod loading;
pub mod models;
mod placement;
mod quant;
mod sampling;
pub mod tokenizer;

pub use auto::{AutoConfig, AutoModel, AutoModelForCausalLM, CausalLM, LoadOptions};
pub use cache::KvCache;
pub use chat::{ChatTemplate, Message};
pub use config::{DecoderConfig, Family};
pub use error::{Error, Result};
pub use generation::{GenerationOptions, GenerationOutput, StopReason};
pub use models::llama::{ForwardArgs, LlamaForCausalLM, LlamaModel, LogitsFor, ModelOutput};
pub use models::mistral::{MistralForCausalLM, MistralModel};
pub use models::qwen2::{Qwen2ForCausalLM, Qwen2Model};
pub use models::qwen3::{Qwen3ForCausalLM, Qwen3Model};
pub use tokenizer::Tokenizer;
