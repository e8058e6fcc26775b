//! Typed errors of zoo-hub. Each names the file, tensor or field at fault and says what to do.

use std::path::PathBuf;

/// Everything that can go wrong while finding, opening or parsing model files.
#[derive(Debug, thiserror::Error)]
pub enum HubError {
    /// Reading a file failed at the OS level.
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// A file the model needs is in none of the places searched.
    #[error(
        "{file} of {repo} (revision {revision}) was not found; searched:\n{}\n{hint}",
        searched.iter().map(|p| format!("  - {}", p.display())).collect::<Vec<_>>().join("\n")
    )]
    NotFound {
        repo: String,
        revision: String,
        file: String,
        searched: Vec<PathBuf>,
        hint: String,
    },

    /// Downloading from the Hub failed (network, authentication, missing repo).
    #[error("downloading {file} of {repo} (revision {revision}) failed: {message}\n{hint}")]
    Download {
        repo: String,
        revision: String,
        file: String,
        message: String,
        hint: String,
    },

    /// A string that is neither an existing path nor a repo id `org/name[@revision]`.
    #[error("{input:?} is neither an existing folder or file nor a repo id of the form org/name[@revision]")]
    BadSource { input: String },

    /// A safetensors file whose header or layout is broken.
    #[error("{path}: invalid safetensors file: {reason}")]
    Safetensors { path: PathBuf, reason: String },

    /// One tensor of a safetensors file is described inconsistently.
    #[error("{path}: tensor {tensor:?}: {reason}")]
    BadTensor {
        path: PathBuf,
        tensor: String,
        reason: String,
    },

    /// `model.safetensors.index.json` is unreadable or names a shard that is absent.
    #[error("{path}: invalid checkpoint index: {reason}")]
    Index { path: PathBuf, reason: String },

    /// A JSON file (config.json, tokenizer_config.json, ...) does not parse or has a field of the wrong type.
    #[error("{path}: invalid JSON: {reason}")]
    Json { path: PathBuf, reason: String },

    /// A path that exists but cannot be read as a file or folder (a symbolic link loop).
    #[error("{path}: {reason}")]
    BadPath { path: PathBuf, reason: String },

    /// A revision, variant, component or subfolder name that could name a path out of the
    /// model's folder or the cache, or a revision given for a local path.
    #[error("{what} {name:?}: {reason}")]
    BadName {
        what: &'static str,
        name: String,
        reason: String,
    },

    /// A config field that a model needs is absent or has the wrong form.
    #[error("{path}: field `{field}`: {reason}")]
    ConfigField {
        path: PathBuf,
        field: String,
        reason: String,
    },

    /// The same tensor name appears in two files.
    #[error("tensor {tensor:?} is defined twice: in {first} and in {second}")]
    DuplicateTensor {
        tensor: String,
        first: PathBuf,
        second: PathBuf,
    },

    /// A tensor that is not in the checkpoint was asked for.
    #[error("tensor {tensor:?} is not in the checkpoint ({files}); {hint}")]
    MissingTensor {
        tensor: String,
        files: String,
        hint: String,
    },

    /// A dtype conversion that makes no sense (e.g. quantized bytes read as bool).
    #[error("tensor {tensor:?}: cannot convert {from} to {to}")]
    Conversion {
        tensor: String,
        from: String,
        to: String,
    },

    /// A folder holds no weights zoo knows how to read.
    #[error("{path}: no weights found (looked for {looked_for}); {hint}")]
    NoWeights {
        path: PathBuf,
        looked_for: String,
        hint: String,
    },

    /// A GGUF file that is malformed or uses something zoo does not read.
    #[error("{path}: invalid GGUF file: {reason}")]
    Gguf { path: PathBuf, reason: String },
}

impl HubError {
    /// Whether the files or names the caller gave are at fault (not found, malformed, not
    /// what zoo reads), rather than the system (a failed read or download).
    pub fn is_caller_error(&self) -> bool {
        !matches!(self, HubError::Io { .. } | HubError::Download { .. })
    }
}

/// Result alias of zoo-hub.
pub type Result<T, E = HubError> = std::result::Result<T, E>;

pub(crate) fn io_err(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> HubError {
    let path = path.into();
    move |source| HubError::Io { path, source }
}
