//! zoo-transformers: transformer families read from Hugging Face checkpoints as they are —
//! decoders (Llama, Mistral, Qwen2, Qwen3, Mixtral, Qwen-MoE, Phi-3, Gemma 1/2/3, GPT-2),
//! text encoders (BERT, CLIP's text tower), vision encoders (ViT, CLIP's vision tower) and
//! CLIPModel — one registry that `Auto*` dispatch reads, model kinds that generation,
//! embedding and classification work over, tokenizers with chat templates, image processors.
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

#![forbid(unsafe_code)]

pub mod adapters;
pub mod auto;
pub mod cache;
pub mod chat;
pub mod config;
mod error;
pub mod family;
pub mod generation;
pub mod image_processing;
pub mod kinds;
mod loading;
pub mod models;
mod placement;
pub mod registry;

pub mod sentence;
pub mod text_classification;
pub mod tokenizer;
pub mod vision;
pub mod vision_language;

pub use adapters::Adapter;
pub use auto::{
    AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForImageClassification,
    AutoModelForImageTextToText, AutoModelForMaskedLM, AutoModelForMultipleChoice,
    AutoModelForQuestionAnswering, AutoModelForSeq2SeqLM, AutoModelForSequenceClassification,
    AutoModelForTokenClassification, AutoModelForZeroShotImageClassification, BaseModel,
    LoadOptions, Text2TextGenerator, TextGenerator,
};
pub use cache::{CacheSpec, KvCache};
pub use chat::{ChatTemplate, Message};
pub use config::DecoderConfig;
pub use error::{Error, Result};
pub use generation::{
    decode_step, generate_seq2seq, DecodeHistory, Engine, EngineConfig, EngineEvent,
    GenerationOptions, GenerationOutput, SequenceId, StopReason,
};
pub use kinds::{
    CausalLm, DecoderModel, Encoder, EncoderArgs, EncoderHead, EncoderOutput, ForwardArgs,
    ImageArgs, ImageEncoder, ImageTextModel, ImageTextOutput, ImageTower, LogitsFor, ModelOutput,
    Seq2SeqLm, TextTower, Tower, VisionLanguage, ZeroShotScores,
};
pub use models::bert::{
    BertForMaskedLM, BertForMultipleChoice, BertForQuestionAnswering,
    BertForSequenceClassification, BertForTokenClassification, BertModel,
};
pub use models::clip::{
    CLIPConfig, CLIPModel, CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection,
    CLIPVisionConfig, CLIPVisionModel, CLIPVisionModelWithProjection, WithProjection,
};
pub use models::gemma::{GemmaFeatures, GemmaForCausalLM, GemmaModel};
pub use models::gemma2::{Gemma2ForCausalLM, Gemma2Model};
pub use models::gemma3::{Gemma3ForCausalLM, Gemma3TextModel};
pub use models::gpt2::{GPT2LMHeadModel, GPT2Model};
pub use models::llama::{LlamaForCausalLM, LlamaModel};
pub use models::mistral::{MistralForCausalLM, MistralModel};
pub use models::mixtral::{MixtralForCausalLM, MixtralModel};
pub use models::moe::MoeFeatures;
pub use models::phi3::{Phi3ForCausalLM, Phi3Model};
pub use models::qwen2::{Qwen2ForCausalLM, Qwen2Model};
pub use models::qwen2_moe::{Qwen2MoeForCausalLM, Qwen2MoeModel};
pub use models::qwen3::{Qwen3ForCausalLM, Qwen3Model};
pub use models::qwen3_moe::{Qwen3MoeForCausalLM, Qwen3MoeModel};
pub use models::t5::{T5Config, T5EncoderModel, T5ForConditionalGeneration};
pub use models::vit::{ViTConfig, ViTForImageClassification, ViTModel};
pub use models::Placement;
pub use tokenizer::{PairEncoding, PairTruncation, Tokenizer};
pub use vision::{ImageClassifier, ImageEmbedder, Scored, ZeroShotImageClassifier};
