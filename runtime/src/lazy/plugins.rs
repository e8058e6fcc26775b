//! The plugin behind each PJRT platform and its one client per process: configuration,
//! creation on first use, and device lookup with typed errors.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use super::cache::{self};
use crate::pjrt::{self, Client, ClientOptions, ErrorCode, LoadedExecutable, PjrtError, Plugin};
use crate::{Device, Error, PjrtDevice, PjrtPlatform, Result};

/// How a platform's plugin is chosen; see [`super::configure`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct PluginConfig {
    pub path: Option<PathBuf>,
    pub cpu_devices: Option<usize>,
}

/// One client of one plugin, shared by every tensor on its devices.
pub(crate) struct Backend {
    pub client: Client,
    pub devices: Vec<pjrt::Device>,
    /// Plugin file, API version and platform version: what a disk-cache entry must match.
    pub identity: String,
    pub plugin_key: u64,
    pub config: PluginConfig,
    /// Partition programs over a mesh with Shardy (every plugin from PJRT API 0.81 on reads
    /// its dialect), else with GSPMD's `mhlo.sharding`, which XLA is retiring.
    pub shardy: bool,
    /// Executables compiled or loaded in this process, by graph hash.
    pub(super) exes: Mutex<HashMap<u64, Arc<LoadedExecutable>>>,
}

/// The oldest PJRT API whose plugins zoo has seen partition a Shardy module (the XLA CPU
/// plugins of API 0.81, 0.106 and 0.115 do); older ones get GSPMD's attributes.
const SHARDY_SINCE: (i32, i32) = (0, 81);

pub(super) static CONFIGS: Mutex<Option<HashMap<PjrtPlatform, PluginConfig>>> = Mutex::new(None);
pub(super) static BACKENDS: Mutex<Option<HashMap<PjrtPlatform, Arc<Backend>>>> = Mutex::new(None);

pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Every guarded value is updated by single assignments, so a poisoned lock still holds
    // a consistent value.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

pub(crate) fn pjrt_err(op: &'static str, device: PjrtDevice, source: PjrtError) -> Error {
    match source {
        PjrtError::Plugin {
            code: ErrorCode::ResourceExhausted,
            message,
            ..
        }
        | PjrtError::Compile {
            code: ErrorCode::ResourceExhausted,
            message,
            ..
        } => Error::OutOfMemory {
            op,
            device: Device::Pjrt(device),
            message,
        },
        PjrtError::Plugin { ref message, .. }
            if message.contains("Out of memory") || message.contains("out of memory") =>
        {
            Error::OutOfMemory {
                op,
                device: Device::Pjrt(device),
                message: message.clone(),
            }
        }
        source => Error::Pjrt {
            op,
            device: Device::Pjrt(device),
            source,
        },
    }
}

pub(crate) fn configure(platform: PjrtPlatform, config: PluginConfig) -> Result<()> {
    if let Some(b) = lock(&BACKENDS).as_ref().and_then(|m| m.get(&platform)) {
        if b.config != config {
            return Err(Error::InvalidArgument {
                op: "lazy::configure",
                msg: format!("the {platform:?} PJRT client already runs with {:?}; configure before the first PJRT tensor is created", b.config),
            });
        }
        return Ok(());
    }
    lock(&CONFIGS)
        .get_or_insert_with(HashMap::new)
        .insert(platform, config);
    Ok(())
}

fn platform_name(p: PjrtPlatform) -> &'static str {
    match p {
        PjrtPlatform::Cpu => "cpu",
        PjrtPlatform::Cuda => "cuda",
        PjrtPlatform::Tpu => "tpu",
    }
}

/// The process-wide client of `platform`, created on first use.
pub(crate) fn backend(platform: PjrtPlatform) -> std::result::Result<Arc<Backend>, PjrtError> {
    let mut guard = lock(&BACKENDS);
    let map = guard.get_or_insert_with(HashMap::new);
    if let Some(b) = map.get(&platform) {
        return Ok(b.clone());
    }
    let config = lock(&CONFIGS)
        .as_ref()
        .and_then(|m| m.get(&platform).cloned())
        .unwrap_or_default();
    let name = platform_name(platform);
    let env_path = match platform {
        PjrtPlatform::Cpu => std::env::var_os("ZOO_PJRT_CPU_PLUGIN")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from),
        _ => None,
    };
    let path = config.path.clone().or(env_path);
    let plugin = match &path {
        Some(p) => Plugin::load(p)?,
        None => pjrt::discovery::load_plugin(Some(name), None)?,
    };
    let mut options = ClientOptions::new();
    if platform == PjrtPlatform::Cpu {
        let n = match config.cpu_devices {
            Some(n) => n,
            None => match std::env::var("ZOO_PJRT_CPU_DEVICES") {
                Ok(v) => v
                    .trim()
                    .parse::<usize>()
                    .ok()
                    .filter(|&n| n > 0)
                    .ok_or_else(|| {
                        PjrtError::InvalidArgument(format!(
                            "ZOO_PJRT_CPU_DEVICES={v:?} is not a positive device count"
                        ))
                    })?,
                Err(_) => 4,
            },
        };
        options = options.cpu_device_count(n as i64);
    }
    let client = crate::distributed::create_client(&plugin, name, options)?;
    let devices = client.addressable_devices()?;
    let (major, minor) = plugin.api_version();
    // The process index is part of it: a program compiled for one process's device ids is
    // not another's.
    let identity = format!(
        "{} api={major}.{minor} platform={} {} devices={} process={}",
        std::fs::canonicalize(plugin.path())
            .unwrap_or_else(|_| plugin.path().to_path_buf())
            .display(),
        client.platform_name().unwrap_or_default(),
        client.platform_version().unwrap_or_default(),
        devices.len(),
        client.process_index().unwrap_or(0)
    );
    let plugin_key = cache::fnv1a(identity.as_bytes());
    let b = Arc::new(Backend {
        client,
        devices,
        identity,
        plugin_key,
        config,
        shardy: (major, minor) >= SHARDY_SINCE,
        exes: Mutex::new(HashMap::new()),
    });
    map.insert(platform, b.clone());
    Ok(b)
}

/// The backend and the PJRT devices behind `d` (one, or its mesh's in order), or a typed
/// error naming the device.
pub(crate) fn devices(
    op: &'static str,
    d: PjrtDevice,
) -> Result<(Arc<Backend>, Vec<pjrt::Device>)> {
    let ordinals = d.ordinals();
    let mut out = Vec::with_capacity(ordinals.len());
    let mut backend = None;
    for o in ordinals {
        let (b, dev) = device(op, PjrtDevice::new(d.platform, o))?;
        backend = Some(b);
        out.push(dev);
    }
    let b = backend.ok_or_else(|| Error::InvalidArgument {
        op,
        msg: format!("{d} has no device"),
    })?;
    Ok((b, out))
}

/// The backend and PJRT device behind `d` (a mesh's first device), or a typed error naming
/// the device.
pub(crate) fn device(op: &'static str, d: PjrtDevice) -> Result<(Arc<Backend>, pjrt::Device)> {
    let b = backend(d.platform).map_err(|e| pjrt_err(op, d, e))?;
    let dev = b
        .devices
        .get(d.ordinal)
        .cloned()
        .ok_or_else(|| Error::Pjrt {
            op,
            device: Device::Pjrt(d),
            source: PjrtError::InvalidArgument(format!(
            "the {} plugin has {} device(s) (0..{}); for more CPU devices set ZOO_PJRT_CPU_DEVICES",
            platform_name(d.platform),
            b.devices.len(),
            b.devices.len()
        )),
        })?;
    Ok((b, dev))
}
