//! Where a tensor lives, and therefore which backend runs its ops.

use std::fmt;

use crate::device_map::Mesh;
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

/// A device of a PJRT plugin: which plugin, and which of its devices; or a mesh of its
/// devices, over which one SPMD program runs (tensor parallelism).
///
/// A tensor on a mesh is laid out by its sharding: each device holds one tile (or the whole
/// tensor, replicated). Ops between tensors of one mesh are recorded as on one device, and
/// XLA's SPMD partitioner inserts the collectives the layouts need.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PjrtDevice {
    pub platform: PjrtPlatform,
    /// The device's ordinal; on a mesh, its first device's.
    pub ordinal: usize,
    /// The mesh this device stands for, if it is one ([`PjrtDevice::on_mesh`]).
    pub mesh: Option<MeshId>,
}

/// A mesh of PJRT devices as a device value: meshes are registered once per process
/// ([`PjrtDevice::on_mesh`]), so a device stays a small `Copy` value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MeshId(u32);

static MESHES: std::sync::Mutex<Vec<std::sync::Arc<Mesh>>> = std::sync::Mutex::new(Vec::new());

impl PjrtDevice {
    /// Device `ordinal` of `platform`'s plugin.
    pub const fn new(platform: PjrtPlatform, ordinal: usize) -> PjrtDevice {
        PjrtDevice {
            platform,
            ordinal,
            mesh: None,
        }
    }

    /// The mesh `mesh` of `platform`'s devices as one device: programs on it are partitioned
    /// over its devices. The same mesh gives the same device.
    pub fn on_mesh(platform: PjrtPlatform, mesh: &Mesh) -> PjrtDevice {
        let mut meshes = MESHES.lock().unwrap_or_else(|p| p.into_inner());
        let id = match meshes.iter().position(|m| **m == *mesh) {
            Some(i) => i,
            None => {
                meshes.push(std::sync::Arc::new(mesh.clone()));
                meshes.len() - 1
            }
        };
        PjrtDevice {
            platform,
            ordinal: mesh.devices()[0],
            mesh: Some(MeshId(id as u32)),
        }
    }

    /// The mesh this device stands for (`None` for a single device).
    pub fn mesh(&self) -> Option<std::sync::Arc<Mesh>> {
        let id = self.mesh?.0 as usize;
        MESHES
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(id)
            .cloned()
    }

    /// The plugin's device ordinals this device spans: its own, or its mesh's in order.
    pub fn ordinals(&self) -> Vec<usize> {
        match self.mesh() {
            Some(m) => m.devices().to_vec(),
            None => vec![self.ordinal],
        }
    }
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
        match self.mesh() {
            Some(m) => {
                let axes: Vec<String> = m.axes().map(|(n, s)| format!("{n}={s}")).collect();
                let ids: Vec<String> = m.devices().iter().map(ToString::to_string).collect();
                write!(f, "pjrt:{p}:{}[{}]", ids.join(","), axes.join(","))
            }
            None => write!(f, "pjrt:{p}:{}", self.ordinal),
        }
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
