//! Device maps: where each module of a model lives, chosen by a strategy or given explicitly, and
//! the exact planner that turns a checkpoint's inventory and device budgets into a validated
//! [`Plan`] before a single weight is read.

mod budgets;
mod memory;
mod mesh;
mod plan;
mod tp;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub use budgets::{accelerator, host_available, pjrt_budgets, platform_name, Accelerator};
pub use memory::{human, parse_max_memory, parse_size, MaxMemory};
pub use mesh::{Mesh, Sharding};
pub use plan::{
    plan, units_from_inventory, CacheLayout, DeviceBudget, ModelShape, Plan, PlanRequest, Stage,
    Unit, UnitRules, Workload,
};
pub use tp::{
    footprint, group_device, split_if_divisible, style_of, tp_groups, weight_sharding, TpFootprint,
    TpPlan, TpStyle, TP_AXIS,
};

/// Why a device map or plan was refused.
#[derive(Debug, thiserror::Error)]
pub enum DeviceMapError {
    #[error("{input:?} is not a memory size; use forms like 10GiB, 500MB, 1.5GB or a byte count")]
    BadSize { input: String },
    #[error("{input:?} is not a device; use an accelerator index (0, 1, ...), cuda:N, tpu:N, cpu or disk")]
    BadPlacement { input: String },
    #[error("{input:?} is not a device map; use auto, balanced, balanced_low_0, sequential, tpu, cpu, cuda[:N], pjrt:PLATFORM[:N,...], tp[N]:pjrt:PLATFORM[:N,...] (tensor parallel over meshes of N devices) or a .json file")]
    BadDeviceMap { input: String },
    #[error("{path}: {reason}")]
    BadMapFile { path: PathBuf, reason: String },
    #[error("device {device} reports no memory limit and none was given; pass --max-memory {device}=SIZE")]
    NoBudget { device: String },
    #[error("offloading to disk is not supported; give more device or cpu memory (max_memory)")]
    DiskUnsupported,
    #[error("the model does not fit: {shortfall}")]
    DoesNotFit { shortfall: String },
    #[error("invalid plan: {reason}")]
    Invalid { reason: String },
    #[error("{reason}")]
    BadSharding { reason: String },
}

/// Where a module is placed: an accelerator by index, host memory, or disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Placement {
    Device(usize),
    Cpu,
    Disk,
}

impl Placement {
    /// Reads `0`, `cuda:1`, `tpu:3`, `xpu:0`, `cpu` or `disk`.
    pub fn parse(s: &str) -> Result<Placement, DeviceMapError> {
        let bad = || DeviceMapError::BadPlacement { input: s.into() };
        match s {
            "cpu" => return Ok(Placement::Cpu),
            "disk" => return Ok(Placement::Disk),
            _ => {}
        }
        let idx = match s.split_once(':') {
            Some(("cuda" | "tpu" | "xpu" | "npu" | "pjrt", i)) => i,
            Some(_) => return Err(bad()),
            None => s,
        };
        idx.parse().map(Placement::Device).map_err(|_| bad())
    }

    fn to_json(self) -> serde_json::Value {
        match self {
            Placement::Device(i) => i.into(),
            Placement::Cpu => "cpu".into(),
            Placement::Disk => "disk".into(),
        }
    }
}

impl std::fmt::Display for Placement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Placement::Device(i) => write!(f, "{i}"),
            Placement::Cpu => f.write_str("cpu"),
            Placement::Disk => f.write_str("disk"),
        }
    }
}

/// An explicit map from module prefixes to placements: transformers' `hf_device_map`
/// (`{"model.layers.3": 0, "lm_head": "cpu"}`). A tensor goes where its longest matching prefix
/// says; the empty prefix `""` matches everything.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExplicitMap {
    pub entries: BTreeMap<String, Placement>,
}

/// The value of the longest module prefix of `name` in `entries` (`model.layers.1` never
/// covers `model.layers.10`): the name itself, then each parent module, then `""`; one map
/// lookup per level, so a whole checkpoint resolves in O(tensors × depth).
pub(crate) fn longest_prefix<'m, V>(entries: &'m BTreeMap<String, V>, name: &str) -> Option<&'m V> {
    let mut key = name;
    loop {
        if let Some(v) = entries.get(key) {
            return Some(v);
        }
        if key.is_empty() {
            return None;
        }
        key = key.rsplit_once('.').map_or("", |(parent, _)| parent);
    }
}

impl ExplicitMap {
    /// The placement of `tensor` (`model.layers.3.mlp.up_proj.weight`), if any prefix covers it.
    pub fn placement_of(&self, tensor: &str) -> Option<Placement> {
        longest_prefix(&self.entries, tensor).copied()
    }

    /// Reads `hf_device_map` JSON: a map of prefixes to an index, `"cpu"`, `"disk"` or
    /// `"cuda:N"`; a zoo plan file (whose `hf_device_map` field is read) works too.
    pub fn from_json(
        value: &serde_json::Value,
        path: &Path,
    ) -> Result<ExplicitMap, DeviceMapError> {
        let bad = |reason: String| DeviceMapError::BadMapFile {
            path: path.to_path_buf(),
            reason,
        };
        // A plan file wraps the map in `hf_device_map`; a bare map may itself name a module
        // `hf_device_map` (its value a device, not an object).
        let map = value
            .get("hf_device_map")
            .filter(|inner| inner.is_object())
            .unwrap_or(value)
            .as_object()
            .ok_or_else(|| bad("expected a JSON object of module prefix → device".into()))?;
        let mut entries = BTreeMap::new();
        for (prefix, v) in map {
            let place = match v {
                serde_json::Value::Number(n) => {
                    n.as_u64()
                        .map(|i| Placement::Device(i as usize))
                        .ok_or_else(|| bad(format!("{prefix:?}: {n} is not a device index")))?
                }
                serde_json::Value::String(s) => {
                    Placement::parse(s).map_err(|e| bad(format!("{prefix:?}: {e}")))?
                }
                other => return Err(bad(format!("{prefix:?}: {other} is not a device"))),
            };
            entries.insert(prefix.clone(), place);
        }
        Ok(ExplicitMap { entries })
    }

    /// Reads a JSON file (see [`ExplicitMap::from_json`]).
    pub fn from_file(path: &Path) -> Result<ExplicitMap, DeviceMapError> {
        let text = std::fs::read_to_string(path).map_err(|e| DeviceMapError::BadMapFile {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
        let value: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| DeviceMapError::BadMapFile {
                path: path.to_path_buf(),
                reason: format!("invalid JSON: {e}"),
            })?;
        ExplicitMap::from_json(&value, path)
    }

    /// The map as `hf_device_map` JSON.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::Value::Object(
            self.entries
                .iter()
                .map(|(k, v)| (k.clone(), v.to_json()))
                .collect(),
        )
    }
}

/// How a model is spread over devices.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeviceMap {
    /// TPU if this host has one, else CUDA, else CPU; what was picked is reported. Several
    /// devices are used as [`DeviceMap::Tpu`] uses a host's chips.
    Auto,
    /// Contiguous stages over every accelerator, minimising the largest stage.
    Balanced,
    /// Like `Balanced`, but keeps device 0 as empty as the budgets allow (room for outputs).
    BalancedLow0,
    /// Fill device 0, then 1, and so on.
    Sequential,
    /// Every TPU chip of this host, as TPUs are used: one tensor-parallel mesh over all of
    /// them when the model fits their memory together (the family's plan), else stages of
    /// the largest meshes that fit, single-chip stages for a family without a plan.
    Tpu,
    /// Host memory, candle's CPU backend.
    Cpu,
    /// One CUDA device.
    Cuda(usize),
    /// Devices of a PJRT platform (`cpu`, `cuda`, `tpu`), all of them when `devices` is `None`.
    Pjrt {
        platform: String,
        devices: Option<Vec<usize>>,
    },
    /// Tensor parallelism over devices of a PJRT platform (all of them when `devices` is
    /// `None`): `tp` devices form a mesh that every layer is split over (the family's
    /// tensor-parallel plan), and the layers are cut into `devices / tp` stages of such
    /// meshes. `tp: None` puts all the devices in one mesh.
    TensorParallel {
        platform: String,
        devices: Option<Vec<usize>>,
        tp: Option<usize>,
    },
    /// A module prefix → device map, as transformers' `hf_device_map`.
    Explicit(ExplicitMap),
}

/// The map in the form `--device-map` takes (an explicit map as the modules it names).
impl std::fmt::Display for DeviceMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeviceMap::Auto => f.write_str("auto"),
            DeviceMap::Balanced => f.write_str("balanced"),
            DeviceMap::BalancedLow0 => f.write_str("balanced_low_0"),
            DeviceMap::Sequential => f.write_str("sequential"),
            DeviceMap::Tpu => f.write_str("tpu"),
            DeviceMap::Cpu => f.write_str("cpu"),
            DeviceMap::Cuda(i) => write!(f, "cuda:{i}"),
            DeviceMap::Pjrt { platform, devices } => {
                write!(f, "pjrt:{platform}")?;
                if let Some(d) = devices {
                    let ids: Vec<String> = d.iter().map(usize::to_string).collect();
                    write!(f, ":{}", ids.join(","))?;
                }
                Ok(())
            }
            DeviceMap::TensorParallel {
                platform,
                devices,
                tp,
            } => {
                match tp {
                    Some(tp) => write!(f, "tp{tp}:pjrt:{platform}")?,
                    None => write!(f, "tp:pjrt:{platform}")?,
                }
                if let Some(d) = devices {
                    let ids: Vec<String> = d.iter().map(usize::to_string).collect();
                    write!(f, ":{}", ids.join(","))?;
                }
                Ok(())
            }
            DeviceMap::Explicit(m) => {
                let entries: Vec<String> = m
                    .entries
                    .iter()
                    .map(|(k, p)| format!("{k:?}: {p}"))
                    .collect();
                write!(f, "{{{}}}", entries.join(", "))
            }
        }
    }
}

impl std::str::FromStr for DeviceMap {
    type Err = DeviceMapError;

    /// Reads the CLI forms: `auto`, `balanced`, `balanced_low_0`, `sequential`, `tpu`, `cpu`,
    /// `cuda`, `cuda:N`, `pjrt:PLATFORM`, `pjrt:PLATFORM:0,1`, tensor parallelism as
    /// `tp:pjrt:PLATFORM[:0,1,..]` (one mesh of all the devices) or `tpN:pjrt:..` (meshes of
    /// N devices, one stage each), or a path to a `.json` map.
    fn from_str(s: &str) -> Result<DeviceMap, DeviceMapError> {
        let bad = || DeviceMapError::BadDeviceMap { input: s.into() };
        Ok(match s {
            "auto" => DeviceMap::Auto,
            "balanced" => DeviceMap::Balanced,
            "balanced_low_0" => DeviceMap::BalancedLow0,
            "sequential" => DeviceMap::Sequential,
            "tpu" => DeviceMap::Tpu,
            "cpu" => DeviceMap::Cpu,
            "cuda" => DeviceMap::Cuda(0),
            _ if s.ends_with(".json") => DeviceMap::Explicit(ExplicitMap::from_file(Path::new(s))?),
            _ => {
                if let Some((head, rest)) =
                    s.split_once(":pjrt:").filter(|(h, _)| h.starts_with("tp"))
                {
                    let tp = match &head[2..] {
                        "" => None,
                        n => Some(n.parse::<usize>().ok().filter(|&n| n > 0).ok_or_else(bad)?),
                    };
                    let DeviceMap::Pjrt { platform, devices } = format!("pjrt:{rest}").parse()?
                    else {
                        return Err(bad());
                    };
                    if let (Some(tp), Some(d)) = (tp, &devices) {
                        if d.len() % tp != 0 {
                            return Err(bad());
                        }
                    }
                    return Ok(DeviceMap::TensorParallel {
                        platform,
                        devices,
                        tp,
                    });
                }
                if let Some(i) = s.strip_prefix("cuda:") {
                    DeviceMap::Cuda(i.parse().map_err(|_| bad())?)
                } else if let Some(rest) = s.strip_prefix("pjrt:") {
                    let (platform, devices) = match rest.split_once(':') {
                        Some((p, list)) => {
                            let ids = list
                                .split(',')
                                .map(|d| d.trim().parse::<usize>().map_err(|_| bad()))
                                .collect::<Result<Vec<_>, _>>()?;
                            (p, Some(ids))
                        }
                        None => (rest, None),
                    };
                    if platform.is_empty() {
                        return Err(bad());
                    }
                    DeviceMap::Pjrt {
                        platform: platform.to_string(),
                        devices,
                    }
                } else {
                    return Err(bad());
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_map_forms() {
        assert_eq!("auto".parse::<DeviceMap>().unwrap(), DeviceMap::Auto);
        assert_eq!("cuda:1".parse::<DeviceMap>().unwrap(), DeviceMap::Cuda(1));
        assert_eq!(
            "pjrt:cpu:0,3".parse::<DeviceMap>().unwrap(),
            DeviceMap::Pjrt {
                platform: "cpu".into(),
                devices: Some(vec![0, 3])
            }
        );
        let tp = |s: &str| s.parse::<DeviceMap>().map(|m| m.to_string());
        assert_eq!(tp("tp:pjrt:cpu:0,1,2,3").unwrap(), "tp:pjrt:cpu:0,1,2,3");
        assert_eq!(
            "tp2:pjrt:cpu".parse::<DeviceMap>().unwrap(),
            DeviceMap::TensorParallel {
                platform: "cpu".into(),
                devices: None,
                tp: Some(2)
            }
        );
        for bad in [
            "gpu",
            "cuda:x",
            "pjrt:",
            "pjrt:cpu:a",
            "tp0:pjrt:cpu",
            "tp2:pjrt:cpu:0,1,2",
            "tpx:pjrt:cpu",
        ] {
            assert!(bad.parse::<DeviceMap>().is_err(), "{bad}");
        }
    }

    #[test]
    fn hf_device_map_round_trip_and_longest_prefix() {
        let json = serde_json::json!({
            "model.embed_tokens": 0, "model.layers.0": 0, "model.layers.1": "cuda:1",
            "model.norm": 1, "lm_head": "cpu"
        });
        let m = ExplicitMap::from_json(&json, Path::new("map.json")).unwrap();
        assert_eq!(
            m.placement_of("model.layers.1.mlp.up_proj.weight"),
            Some(Placement::Device(1))
        );
        // `model.layers.1` must not capture `model.layers.10`.
        assert_eq!(m.placement_of("model.layers.10.mlp.up_proj.weight"), None);
        assert_eq!(m.placement_of("lm_head.weight"), Some(Placement::Cpu));
        assert_eq!(m.to_json()["model.layers.1"], 1);
        assert_eq!(
            ExplicitMap::from_json(&m.to_json(), Path::new("x")).unwrap(),
            m
        );
        let bad = serde_json::json!({"lm_head": [1]});
        let err = ExplicitMap::from_json(&bad, Path::new("map.json"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("map.json") && err.contains("lm_head"), "{err}");
        // A module named `hf_device_map` is a module, not a plan file's wrapper: its map
        // reads back from its own JSON.
        let wrapped = serde_json::json!({"hf_device_map": {"hf_device_map": "cpu"}});
        let m = ExplicitMap::from_json(&wrapped, Path::new("plan.json")).unwrap();
        assert_eq!(m.placement_of("hf_device_map.weight"), Some(Placement::Cpu));
        assert_eq!(
            ExplicitMap::from_json(&m.to_json(), Path::new("x")).unwrap(),
            m
        );
    }
}
