//! Typed errors of zoo-transformers. Each names the file, field, tensor or argument at fault
//! and says what to do.

use std::path::PathBuf;

/// Everything that can go wrong while loading a model, tokenizing or generating.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Finding or reading the model's files failed.
    #[error(transparent)]
    Hub(Box<zoo_hub::HubError>),

    /// A tensor operation or a weight load failed (wrong weight shape, missing weight, ...).
    #[error(transparent)]
    Runtime(Box<zoo_runtime::Error>),

    /// `config.json` asks for something this family cannot do.
    #[error("{path}: {reason}")]
    Config {
        /// The config file.
        path: PathBuf,
        /// What is wrong and what to do.
        reason: String,
    },

    /// No zoo class implements the checkpoint's architecture.
    #[error(
        "{path}: architecture {found} is not supported by zoo-transformers{hint}; supported architectures: {}; model types: {}",
        supported_architectures.join(", "),
        supported_model_types.join(", ")
    )]
    UnsupportedArchitecture {
        /// The config file.
        path: PathBuf,
        /// The architectures and model type it names.
        found: String,
        /// What the checkpoint is instead, when the config tells (e.g. a vision-language
        /// model around a supported text model); empty otherwise.
        hint: String,
        /// Class names zoo-transformers loads.
        supported_architectures: Vec<&'static str>,
        /// `model_type` values zoo-transformers loads.
        supported_model_types: Vec<&'static str>,
    },

    /// The checkpoint's family is not what the asked class or command loads (an encoder
    /// given to generation, a causal LM given to embedding).
    #[error("{path}: {architecture} cannot be loaded by {asked}: {hint}")]
    WrongKind {
        /// The config file.
        path: PathBuf,
        /// The architecture it names.
        architecture: String,
        /// The class or command asked.
        asked: &'static str,
        /// What fits instead.
        hint: String,
    },

    /// The device map cannot be served by this build yet.
    #[error("device map `{map}` is not supported yet: {reason}")]
    UnsupportedDeviceMap {
        /// The map asked for.
        map: String,
        /// Why it cannot be served, and what to use instead.
        reason: String,
    },

    /// The devices the map names are not on this host (no TPU, no plugin, too few devices).
    #[error("device map `{map}`: {reason}")]
    DeviceUnavailable {
        /// The map asked for.
        map: String,
        /// What is missing, with every place searched.
        reason: String,
    },

    /// The requested dtype cannot hold model weights.
    #[error("dtype {0} cannot hold model weights; use f32, bf16 or f16")]
    UnsupportedDType(zoo_runtime::DType),

    /// The model has no `tokenizer.json` (or GGUF vocabulary) to build a tokenizer from.
    #[error("{source_name}: no tokenizer found (tokenizer.json, or the vocabulary of a .gguf file); pass token ids directly or add tokenizer.json next to config.json")]
    NoTokenizer {
        /// Where the model came from.
        source_name: String,
    },

    /// `tokenizer.json` could not be read by the `tokenizers` crate, or encoding failed.
    #[error("tokenizer: {0}")]
    Tokenizer(String),

    /// The model has no chat template, or rendering it failed.
    #[error("chat template: {0}")]
    ChatTemplate(String),

    /// A generation argument or input that cannot be used (empty prompt, bad sampling values,
    /// prompt longer than the context, ...).
    #[error("generate: {0}")]
    Generation(String),
}

impl From<zoo_runtime::device_map::DeviceMapError> for Error {
    fn from(e: zoo_runtime::device_map::DeviceMapError) -> Error {
        Error::Runtime(Box::new(zoo_runtime::Error::DeviceMap(e)))
    }
}

impl From<zoo_hub::HubError> for Error {
    fn from(e: zoo_hub::HubError) -> Error {
        Error::Hub(Box::new(e))
    }
}

impl From<Box<zoo_hub::HubError>> for Error {
    fn from(e: Box<zoo_hub::HubError>) -> Error {
        Error::Hub(e)
    }
}

impl From<zoo_runtime::Error> for Error {
    fn from(e: zoo_runtime::Error) -> Error {
        Error::Runtime(Box::new(e))
    }
}

/// `Result` with zoo-transformers' [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
