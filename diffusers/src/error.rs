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
    /// A tensor operation failed.
    #[error(transparent)]
    Runtime(#[from] zoo_runtime::Error),
}

/// `Result` with zoo-diffusers' [`Error`].
pub type Result<T> = std::result::Result<T, Error>;
