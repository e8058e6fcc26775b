//! The error type of the PJRT backend.

use std::fmt;
use std::path::PathBuf;

/// A `PJRT_Error_Code`: the abseil status code a plugin attached to an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    /// 1
    Cancelled,
    /// 2
    Unknown,
    /// 3
    InvalidArgument,
    /// 4
    DeadlineExceeded,
    /// 5
    NotFound,
    /// 6
    AlreadyExists,
    /// 7
    PermissionDenied,
    /// 8: out of memory on device, among others.
    ResourceExhausted,
    /// 9
    FailedPrecondition,
    /// 10
    Aborted,
    /// 11
    OutOfRange,
    /// 12: the plugin does not implement the call.
    Unimplemented,
    /// 13
    Internal,
    /// 14
    Unavailable,
    /// 15
    DataLoss,
    /// 16
    Unauthenticated,
    /// A code this header does not know.
    Other(i32),
}

impl ErrorCode {
    /// Maps the raw C enum value.
    pub fn from_raw(code: i32) -> Self {
        use ErrorCode::*;
        match code {
            1 => Cancelled,
            2 => Unknown,
            3 => InvalidArgument,
            4 => DeadlineExceeded,
            5 => NotFound,
            6 => AlreadyExists,
            7 => PermissionDenied,
            8 => ResourceExhausted,
            9 => FailedPrecondition,
            10 => Aborted,
            11 => OutOfRange,
            12 => Unimplemented,
            13 => Internal,
            14 => Unavailable,
            15 => DataLoss,
            16 => Unauthenticated,
            other => Other(other),
        }
    }
}

impl ErrorCode {
    /// The raw C enum value.
    pub fn raw(self) -> i32 {
        use ErrorCode::*;
        match self {
            Cancelled => 1,
            Unknown => 2,
            InvalidArgument => 3,
            DeadlineExceeded => 4,
            NotFound => 5,
            AlreadyExists => 6,
            PermissionDenied => 7,
            ResourceExhausted => 8,
            FailedPrecondition => 9,
            Aborted => 10,
            OutOfRange => 11,
            Unimplemented => 12,
            Internal => 13,
            Unavailable => 14,
            DataLoss => 15,
            Unauthenticated => 16,
            Other(c) => c,
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ErrorCode::Other(c) => write!(f, "code {c}"),
            c => write!(f, "{c:?}"),
        }
    }
}

/// The offending line of a StableHLO program that failed to compile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceLine {
    /// 1-based line number, as the plugin's diagnostic reports it.
    pub line: usize,
    /// The text of that line of the program.
    pub text: String,
}

impl fmt::Display for SourceLine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "\n  at line {}: {}", self.line, self.text.trim())
    }
}

/// Everything that can go wrong in the PJRT backend. Each message says what to do.
#[derive(Debug, thiserror::Error)]
pub enum PjrtError {
    /// `dlopen` refused the file.
    #[error("cannot load PJRT plugin {path}: {reason}; check that the file exists and is a shared library built for this machine")]
    Load {
        /// The file given.
        path: PathBuf,
        /// The dynamic loader's message.
        reason: String,
    },
    /// The library loads but exports no `GetPjrtApi`.
    #[error("{path} is not a PJRT plugin: it exports no `GetPjrtApi` symbol; point zoo at a PJRT plugin (e.g. the `.so` inside the xla-cpu-pjrt wheel)")]
    NotAPlugin {
        /// The file given.
        path: PathBuf,
    },
    /// `GetPjrtApi` returned null or a table too short to hold the version.
    #[error("{path}: GetPjrtApi returned {what}; the plugin is broken or not a PJRT plugin")]
    BadApiTable {
        /// The file given.
        path: PathBuf,
        /// What was wrong with the table.
        what: String,
    },
    /// The plugin speaks a PJRT major version zoo does not.
    #[error("{path} speaks PJRT C API {major}.{minor}, but zoo speaks major version {supported}; install a plugin built against PJRT {supported}.x")]
    UnsupportedVersion {
        /// The file given.
        path: PathBuf,
        /// The plugin's major version.
        major: i32,
        /// The plugin's minor version.
        minor: i32,
        /// The major version zoo speaks.
        supported: i32,
    },
    /// The plugin's function table stops before (or leaves null) a function zoo needs.
    #[error(
        "the PJRT plugin (API 0.{plugin_minor}) does not provide `{function}`; use a newer plugin"
    )]
    MissingFunction {
        /// The C name of the function.
        function: &'static str,
        /// The plugin's minor version.
        plugin_minor: i32,
    },
    /// A PJRT call returned an error.
    #[error("PJRT {function} failed ({code}): {message}")]
    Plugin {
        /// The C function that failed.
        function: &'static str,
        /// The plugin's status code.
        code: ErrorCode,
        /// The plugin's message.
        message: String,
    },
    /// Compiling a StableHLO program failed.
    #[error("compiling the StableHLO program failed ({code}): {message}{}", line.as_ref().map(|l| l.to_string()).unwrap_or_default())]
    Compile {
        /// The plugin's status code.
        code: ErrorCode,
        /// The plugin's message.
        message: String,
        /// The program line the diagnostic points at, when it names one.
        line: Option<SourceLine>,
    },
    /// libtpu was asked for on a machine that is not a Google Compute Engine VM.
    #[error("no TPU on this host ({reason}); libtpu is only loaded on Google Compute Engine machines, because elsewhere it blocks for minutes polling the GCE metadata server. Set ZOO_FORCE_TPU=1 to load it anyway")]
    NoTpu {
        /// What the host check found.
        reason: String,
    },
    /// Plugin discovery found nothing.
    #[error("no PJRT plugin{} found; searched:\n{}\ninstall one (e.g. `pip install xla-cpu-pjrt`, `pip install libtpu`) or name its file with PJRT_NAMES_AND_LIBRARY_PATHS=name:/path/to/plugin.so", platform.as_ref().map(|p| format!(" for platform `{p}`")).unwrap_or_default(), searched.iter().map(|s| format!("  - {s}")).collect::<Vec<_>>().join("\n"))]
    NotFound {
        /// The platform asked for, if any.
        platform: Option<String>,
        /// Every place searched, in order, with what was found there.
        searched: Vec<String>,
    },
    /// A caller passed arguments that cannot be right (shapes, sizes, devices).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A buffer's element type has no host representation in zoo.
    #[error("buffer element type {0} is not supported by zoo's host transfers")]
    UnsupportedType(String),
}

/// Result of the PJRT backend.
pub type Result<T> = std::result::Result<T, PjrtError>;
