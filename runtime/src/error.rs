//! Typed errors for every tensor operation: each names the operation and both operands.

use crate::{DType, Device};

/// Errors returned by zoo-runtime. Every fallible public function returns [`Result`].
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Two operands whose shapes cannot be combined (broadcasting, matmul, concat, ...).
    #[error("{op}: incompatible shapes {lhs:?} and {rhs:?}{hint}")]
    ShapeMismatch {
        op: &'static str,
        lhs: Vec<usize>,
        rhs: Vec<usize>,
        /// Extra detail, starting with "; " when present.
        hint: String,
    },
    /// Two operands whose dtypes must agree and do not.
    #[error("{op}: dtype mismatch between {lhs} and {rhs}{hint}")]
    DTypeMismatch {
        op: &'static str,
        lhs: DType,
        rhs: DType,
        hint: String,
    },
    /// Operands on different devices; move one with `Tensor::to_device` first.
    #[error("{op}: operands live on different devices ({lhs} and {rhs}); move one with `to_device` first")]
    DeviceMismatch {
        op: &'static str,
        lhs: Device,
        rhs: Device,
    },
    /// A dimension index outside `-rank..rank`.
    #[error("{op}: dimension {dim} out of range for a tensor of shape {shape:?}")]
    DimOutOfRange {
        op: &'static str,
        dim: isize,
        shape: Vec<usize>,
    },
    /// An index (in an index tensor or an argument) outside the indexed dimension.
    #[error("{op}: index out of range: indices of shape {index_shape:?} into a tensor of shape {shape:?} along dim {dim}{hint}")]
    IndexOutOfRange {
        op: &'static str,
        index_shape: Vec<usize>,
        shape: Vec<usize>,
        dim: usize,
        hint: String,
    },
    /// The operation does not accept this dtype.
    #[error("{op}: dtype {dtype} is not supported{hint}")]
    UnsupportedDType {
        op: &'static str,
        dtype: DType,
        hint: String,
    },
    /// An argument that is invalid whatever the operands (negative size, zero groups, ...).
    #[error("{op}: {msg}")]
    InvalidArgument { op: &'static str, msg: String },
    /// `to_vec`/`to_scalar` asked for an element type other than the tensor's dtype.
    #[error(
        "{op}: the tensor holds {actual} but {requested} was requested; cast with `to_dtype` first"
    )]
    ElementType {
        op: &'static str,
        requested: DType,
        actual: DType,
    },
    /// A PJRT device was used where only an eager (candle) device can serve, e.g. as the
    /// target of a candle interop call.
    #[error("{op}: device {device} is a PJRT device, which has no candle counterpart; use Tensor::to_device to move the data")]
    PjrtUnavailable { op: &'static str, device: Device },
    /// A PJRT plugin call failed: loading the plugin, a transfer, compiling or running a
    /// graph. A compile error carries the offending StableHLO line.
    #[error("{op} on {device}: {source}")]
    Pjrt {
        op: &'static str,
        device: Device,
        #[source]
        source: crate::pjrt::PjrtError,
    },
    /// A PJRT device ran out of memory.
    #[error("{op} on {device}: out of device memory ({message}); drop tensors you no longer need, shrink the batch or KV cache, or spread the model over more devices")]
    OutOfMemory {
        op: &'static str,
        device: Device,
        message: String,
    },
    /// `Device::Cuda` was requested from a build without the `cuda` feature.
    #[error("CUDA device {0} requested but zoo-runtime was built without the `cuda` feature; rebuild with `--features zoo-runtime/cuda`")]
    CudaNotCompiled(usize),
    /// A weight the model needs is absent from the checkpoint.
    #[error("weight `{name}` not found in the checkpoint{hint}")]
    MissingWeight { name: String, hint: String },
    /// A weight exists but its shape is not what the model config implies.
    #[error("weight `{name}`: expected shape {expected:?}, found {found:?} in the checkpoint; does config.json match these weights?")]
    WeightShape {
        name: String,
        expected: Vec<usize>,
        found: Vec<usize>,
    },
    /// A weight whose stored dtype cannot be read as a tensor here.
    #[error("weight `{name}`: stored dtype {stored} cannot be loaded{hint}")]
    WeightDType {
        name: String,
        stored: String,
        hint: String,
    },
    /// The hub failed to produce the bytes of a weight.
    #[error("weight `{name}`: {source}")]
    Hub {
        name: String,
        #[source]
        source: Box<zoo_hub::HubError>,
    },
    /// A rotary-embedding configuration that cannot be used.
    #[error("rope config: {0}")]
    RopeConfig(String),
    /// A device map that cannot be planned or resolved (no budget, does not fit, ...).
    #[error(transparent)]
    DeviceMap(#[from] crate::device_map::DeviceMapError),
    /// `ZOO_CPU` names no CPU tier.
    #[error(transparent)]
    CpuTier(#[from] crate::cpu::features::TierError),
    /// An error raised by the candle eager backend, with the zoo operation that called it.
    #[error("{op}: candle backend error: {source}")]
    Backend {
        op: &'static str,
        #[source]
        source: Box<candle_core::Error>,
    },
}

impl Error {
    /// Whether what the caller gave is at fault: a checkpoint whose weights do not match its
    /// config, a device map or setting that cannot be served, files that cannot be read as
    /// they should. Operand errors inside a model, device failures and out-of-memory are not.
    pub fn is_caller_error(&self) -> bool {
        match self {
            Error::CudaNotCompiled(_)
            | Error::MissingWeight { .. }
            | Error::WeightShape { .. }
            | Error::WeightDType { .. }
            | Error::RopeConfig(_)
            | Error::DeviceMap(_)
            | Error::CpuTier(_) => true,
            Error::Hub { source, .. } => source.is_caller_error(),
            _ => false,
        }
    }
}

/// `Result` with zoo-runtime's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Attaches the zoo operation name to a candle error.
pub(crate) trait BackendContext<T> {
    fn op(self, op: &'static str) -> Result<T>;
}

impl<T> BackendContext<T> for candle_core::Result<T> {
    fn op(self, op: &'static str) -> Result<T> {
        self.map_err(|source| Error::Backend {
            op,
            source: Box::new(source),
        })
    }
}
