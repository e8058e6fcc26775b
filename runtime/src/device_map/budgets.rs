//! Device budgets for the planner: `max_memory` when the user gives one, else what the
//! device itself reports through PJRT memory statistics.

use super::memory::MaxMemory;
use super::plan::DeviceBudget;
use super::{DeviceMapError, Placement};
use crate::{Error, PjrtDevice, PjrtPlatform, Result};

/// The budget of each device `ordinals` of `platform`, named `tpu:0`, `cuda:1`, ...
///
/// Per device: its `max_memory` entry; else `bytes_limit - bytes_in_use` from PJRT memory
/// statistics. The XLA CPU plugin keeps no statistics but its devices are host memory: they
/// share the host's available memory (`MemAvailable` of `/proc/meminfo`) in equal parts. A
/// device with no limit from either is [`DeviceMapError::NoBudget`], never a guess.
pub fn pjrt_budgets(
    platform: PjrtPlatform,
    ordinals: &[usize],
    max_memory: Option<&MaxMemory>,
) -> Result<Vec<DeviceBudget>> {
    let backend = crate::lazy::plugins::backend(platform).map_err(|e| {
        crate::lazy::plugins::pjrt_err(
            "memory_stats",
            PjrtDevice::new(platform, ordinals.first().copied().unwrap_or(0)),
            e,
        )
    })?;
    let mut out = Vec::with_capacity(ordinals.len());
    for &i in ordinals {
        let dev = PjrtDevice::new(platform, i);
        let name = format!("{}:{i}", platform_name(platform));
        let given = max_memory.and_then(|m| m.get(&Placement::Device(i)));
        let reported = backend.devices.get(i).and_then(|d| {
            let s = d.memory_stats().ok()?;
            let limit = u64::try_from(s.bytes_limit?).ok()?;
            Some(limit.saturating_sub(u64::try_from(s.bytes_in_use).unwrap_or(0)))
        });
        if backend.devices.get(i).is_none() {
            return Err(Error::InvalidArgument {
                op: "device_map",
                msg: format!(
                    "{dev} does not exist: the {} plugin has {} devices",
                    platform_name(platform),
                    backend.devices.len()
                ),
            });
        }
        let host_share = || {
            (platform == PjrtPlatform::Cpu)
                .then(host_available)
                .flatten()
                .map(|b| b / backend.devices.len().max(1) as u64)
        };
        let bytes = given.or(reported).or_else(host_share).ok_or_else(|| {
            Error::DeviceMap(DeviceMapError::NoBudget {
                device: name.clone(),
            })
        })?;
        out.push(DeviceBudget {
            place: Placement::Device(i),
            name,
            bytes,
        });
    }
    Ok(out)
}

/// `cpu`, `cuda` or `tpu`.
pub fn platform_name(p: PjrtPlatform) -> &'static str {
    match p {
        PjrtPlatform::Cpu => "cpu",
        PjrtPlatform::Cuda => "cuda",
        PjrtPlatform::Tpu => "tpu",
    }
}

/// The host memory this process may still take, in bytes: `MemAvailable` of
/// `/proc/meminfo`, or less under an address-space limit (`ulimit -v`, a container's
/// `setrlimit`), which fails an allocation long before the machine runs out. `None` where
/// neither is readable (not Linux).
pub fn host_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    let available = kib.saturating_mul(1024);
    Some(match address_space_limit() {
        Some(limit) => available.min(limit),
        None => available,
    })
}

/// The soft `Max address space` of `/proc/self/limits` in bytes, when one is set.
fn address_space_limit() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = text.lines().find(|l| l.starts_with("Max address space"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

/// The accelerator a strategy device map (`auto`, `balanced`, `sequential`) spreads over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Accelerator {
    /// A PJRT platform and its device count.
    Pjrt(PjrtPlatform, usize),
    /// candle's CUDA (no PJRT CUDA plugin here).
    CandleCuda,
}

/// The best accelerator on this host: TPU, then CUDA (a PJRT plugin, else candle's), else
/// none (the CPU plugin is never picked: candle's CPU serves the host).
pub fn accelerator() -> Result<Option<Accelerator>> {
    use crate::pjrt::discovery;
    let tpu = discovery::tpu_allowed().is_ok() && discovery::find_plugin(Some("tpu"), None).is_ok();
    if tpu {
        let n = crate::lazy::device_count(PjrtPlatform::Tpu)?;
        return Ok(Some(Accelerator::Pjrt(PjrtPlatform::Tpu, n)));
    }
    if discovery::find_plugin(Some("cuda"), None).is_ok() {
        if let Ok(n) = crate::lazy::device_count(PjrtPlatform::Cuda) {
            return Ok(Some(Accelerator::Pjrt(PjrtPlatform::Cuda, n)));
        }
    }
    if crate::Device::cuda_is_available() {
        return Ok(Some(Accelerator::CandleCuda));
    }
    Ok(None)
}
