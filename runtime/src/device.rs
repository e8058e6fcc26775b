//! Where a tensor lives, and therefore which backend runs its ops.

use std::fmt;

use crate::{Error, Result};

/// A device a [`crate::Tensor`] lives on. Its variant picks the backend at run time:
/// `Cpu` and `Cuda` run eagerly on candle; `Pjrt` records ops lazily for a PJRT plugin.
///
/// `Cuda` exists in every build so that device maps and configs name it uniformly; using it
/// without the `cuda` feature is [`Error::CudaNotCompiled`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Device {
    /// Host CPU, eager (candle).
    Cpu,
    /// NVIDIA GPU by ordinal, eager (candle's CUDA backend, `cuda` feature).
    Cuda(usize),
    /// A device of a PJRT plugin; lazy, compiled through StableHLO.
    Pjrt(PjrtDevice),
}

/// A device of a PJRT plugin: which plugin, and which of its devices.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PjrtDevice {
    pub platform: PjrtPlatform,
    pub ordinal: usize,
}

/// The PJRT plugins zoo knows how to load.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PjrtPlatform {
    /// The XLA CPU plugin.
    Cpu,
    /// The XLA CUDA plugin.
    Cuda,
    /// libtpu.
    Tpu,
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(i) => write!(f, "cuda:{i}"),
            Device::Pjrt(d) => write!(f, "{d}"),
        }
    }
}

impl fmt::Display for PjrtDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let p = match self.platform {
            PjrtPlatform::Cpu => "cpu",
            PjrtPlatform::Cuda => "cuda",
            PjrtPlatform::Tpu => "tpu",
        };
        write!(f, "pjrt:{p}:{}", self.ordinal)
    }
}

impl Device {
    /// Whether candle can open a CUDA device here: a `cuda` build on a host with a driver.
    pub fn cuda_is_available() -> bool {
        #[cfg(feature = "cuda")]
        {
            candle_core::utils::cuda_is_available()
        }
        #[cfg(not(feature = "cuda"))]
        {
            false
        }
    }

    /// Whether ops on this device run at once (candle) rather than being recorded (PJRT).
    pub fn is_eager(&self) -> bool {
        !matches!(self, Device::Pjrt(_))
    }

    /// The candle device backing an eager device. Candle identifies CUDA devices by the
    /// instance, not the ordinal, so each ordinal is opened once and reused.
    pub(crate) fn candle(&self, op: &'static str) -> Result<candle_core::Device> {
        match *self {
            Device::Cpu => Ok(candle_core::Device::Cpu),
            Device::Cuda(i) => cuda_device(i),
            Device::Pjrt(_) => Err(Error::PjrtUnavailable { op, device: *self }),
        }
    }

    pub(crate) fn from_candle(d: &candle_core::Device) -> Device {
        match d.location() {
            candle_core::DeviceLocation::Cuda { gpu_id } => Device::Cuda(gpu_id),
            _ => Device::Cpu,
        }
    }
}

#[cfg(feature = "cuda")]
fn cuda_device(i: usize) -> Result<candle_core::Device> {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    static OPEN: OnceLock<Mutex<HashMap<usize, candle_core::Device>>> = OnceLock::new();
    let mut open = OPEN
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    if let Some(d) = open.get(&i) {
        return Ok(d.clone());
    }
    let d = candle_core::Device::new_cuda(i).map_err(|source| Error::Backend {
        op: "Device::Cuda",
        source: Box::new(source),
    })?;
    open.insert(i, d.clone());
    Ok(d)
}

#[cfg(not(feature = "cuda"))]
fn cuda_device(i: usize) -> Result<candle_core::Device> {
    Err(Error::CudaNotCompiled(i))
}
