//! Errors of zoo-diffusers.

use std::path::PathBuf;

/// What went wrong, naming the file or field involved.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A config file that cannot be used as it is.
    #[error("{path}: {reason}")]
    Config {
        /// The file.
        path: PathBuf,
        /// What is wrong and what to do.
        reason: String,
    },
    /// A scheduler asked to do what its state does not allow.
    #[error("scheduler: {0}")]
    Scheduler(String),
    /// A tensor of the wrong shape for the model.
    #[error("shape: {0}")]
    Shape(String),
    /// A config or input zoo does not run yet, saying what it does run.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// A pipeline argument that cannot be used (a size, a guidance scale, an image).
    #[error("invalid argument: {0}")]
    Input(String),
    /// Reading a checkpoint failed.
    #[error(transparent)]
    Hub(Box<zoo_hub::HubError>),
    /// A text encoder or tokenizer from zoo-transformers failed.
    #[error(transparent)]
    Transformers(#[from] Box<zoo_transformers::Error>),
    /// Writing an output failed.
    #[error("{path}: {reason}")]
    Output {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// A tensor operation failed.
    #[error(transparent)]
    Runtime(#[from] zoo_runtime::Error),
}

impl Error {
    /// Whether the caller can fix this by changing its arguments, inputs or files (a server
    /// answers 400, `zoo` exits with 2), rather than a failure inside zoo, on the device or
    /// while writing.
    pub fn is_caller_error(&self) -> bool {
        match self {
            Error::Config { .. }
            | Error::Scheduler(_)
            | Error::Shape(_)
            | Error::Unsupported(_)
            | Error::Input(_) => true,
            Error::Hub(e) => e.is_caller_error(),
            Error::Transformers(e) => e.is_caller_error(),
            Error::Runtime(e) => e.is_caller_error(),
            Error::Output { .. } => false,
        }
    }
}

/// `Result` with zoo-diffusers' [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

impl From<zoo_hub::HubError> for Error {
    fn from(e: zoo_hub::HubError) -> Error {
        Error::Hub(Box::new(e))
    }
}
