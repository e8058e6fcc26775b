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

    /// An image file could not be read (unreadable, not PNG/JPEG, 16-bit, or declaring more
    /// pixels than the limit); the error names the file.
    #[error(transparent)]
    Image(Box<crate::image_processing::ImageError>),

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

    /// An input or option the caller gave cannot be used: an empty prompt, a sampling value
    /// out of range, a prompt longer than the context, an image of the wrong size. The caller
    /// can fix it (a server answers 400 and names `field`).
    #[error("{reason}")]
    InvalidInput {
        /// The argument, option or input at fault, by its transformers name (`prompt`,
        /// `temperature`, `pixel_values`, ...).
        field: &'static str,
        /// What is wrong, the limit it broke and what to do.
        reason: String,
    },

    /// zoo broke one of its own invariants on a valid request (a model returned fewer values
    /// than it must): a bug, not the caller's doing (a server answers 500).
    #[error("internal error: {0}; this is a bug in zoo, please report it")]
    Internal(String),
}

impl Error {
    /// The caller's input or option `field` is refused for `reason`.
    pub fn invalid(field: &'static str, reason: String) -> Error {
        Error::InvalidInput { field, reason }
    }

    /// Whether the caller can fix this by changing what it asked for or gave (its inputs,
    /// options, files or device map), rather than a failure inside zoo or on the device. A
    /// server answers the first with 400 and the rest with 500; `zoo` exits with 2 and 1.
    pub fn is_caller_error(&self) -> bool {
        match self {
            Error::InvalidInput { .. }
            | Error::Config { .. }
            | Error::UnsupportedArchitecture { .. }
            | Error::WrongKind { .. }
            | Error::UnsupportedDeviceMap { .. }
            | Error::DeviceUnavailable { .. }
            | Error::UnsupportedDType(_)
            | Error::NoTokenizer { .. }
            | Error::ChatTemplate(_)
            | Error::Image(_) => true,
            Error::Hub(e) => e.is_caller_error(),
            Error::Runtime(e) => e.is_caller_error(),
            Error::Tokenizer(_) | Error::Internal(_) => false,
        }
    }
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
