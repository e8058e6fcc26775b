//! From a [`DeviceMap`] to devices: which device each module of a checkpoint loads onto.
//!
//! One-device maps give that device. Maps over several devices are planned exactly from the
//! checkpoint's inventory before any weight is read (`zoo_runtime::device_map::plan`), with
//! budgets from `max_memory` or the devices' own memory statistics; the plan's module →
//! device map then steers every weight straight onto its device, and the model moves
//! activations at the cuts.

use zoo_hub::{Dtype, Inventory, PretrainedConfig};
use zoo_runtime::device_map::{
    accelerator, pjrt_budgets, plan, platform_name, Accelerator, DeviceBudget, DeviceMap,
    DeviceMapError, ExplicitMap, MaxMemory, Placement, Plan, PlanRequest, Workload,
};
use zoo_runtime::device_map::{group_device, tp_groups};
use zoo_runtime::nn::DevicePlacement;
use zoo_runtime::pjrt::discovery;
use zoo_runtime::{lazy, DType, Device, PjrtDevice, PjrtPlatform};

use crate::{Error, Result};

/// Where a load puts the model.
#[derive(Clone, Debug)]
pub(crate) struct Resolved {
    /// Where inputs go, and modules no placement entry covers.
    pub device: Device,
    /// Per-module devices of a split model.
    pub placement: Option<DevicePlacement>,
    /// The plan a strategy map was resolved with.
    pub plan: Option<Plan>,
    /// What `Auto` (or a strategy without accelerators) picked, for the user.
    pub note: Option<String>,
}

impl Resolved {
    fn one(device: Device, note: Option<String>) -> Resolved {
        Resolved {
            device,
            placement: None,
            plan: None,
            note,
        }
    }
}

/// What a plan needs to know about the checkpoint.
pub(crate) struct ModelFacts<'a> {
    pub inventory: &'a Inventory,
    pub config: &'a PretrainedConfig,
    pub dtype: DType,
    pub max_memory: Option<&'a MaxMemory>,
}

/// The sequence length KV caches are planned for: the model's context, at most this.
const PLANNED_SEQ: usize = 4096;

/// Resolves `map` for the model `facts` describes.
pub(crate) fn resolve(map: &DeviceMap, facts: &ModelFacts<'_>) -> Result<Resolved> {
    let unsupported = |reason: String| Error::UnsupportedDeviceMap {
        map: map.to_string(),
        reason,
    };
    match map {
        DeviceMap::Cpu => Ok(Resolved::one(Device::Cpu, None)),
        DeviceMap::Cuda(i) => Ok(Resolved::one(Device::Cuda(*i), None)),
        DeviceMap::Pjrt { platform, devices } => {
            let p = parse_platform(platform).map_err(unsupported)?;
            let ordinals = pjrt_ordinals(p, devices.as_deref())?;
            spread(p, &singles(&ordinals), "balanced", facts, None, false)
        }
        DeviceMap::TensorParallel {
            platform,
            devices,
            tp,
        } => {
            let p = parse_platform(platform).map_err(unsupported)?;
            let ordinals = pjrt_ordinals(p, devices.as_deref())?;
            let groups = tp_groups(&ordinals, *tp).map_err(|e| unsupported(e.to_string()))?;
            spread(p, &groups, "balanced", facts, None, false)
        }
        DeviceMap::Tpu => {
            require_tpu()?;
            let n = lazy::device_count(PjrtPlatform::Tpu)?;
            across(
                PjrtPlatform::Tpu,
                &(0..n).collect::<Vec<_>>(),
                facts,
                "device_map tpu",
            )
        }
        DeviceMap::Auto => match accelerator()? {
            Some(Accelerator::Pjrt(p, n)) => {
                let what = format!("device_map auto: picked {}", platform_name(p));
                across(p, &(0..n).collect::<Vec<_>>(), facts, &what)
            }
            Some(Accelerator::CandleCuda) => Ok(Resolved::one(
                Device::Cuda(0),
                Some("device_map auto: picked cuda:0 (candle)".into()),
            )),
            None => Ok(Resolved::one(
                Device::Cpu,
                Some("device_map auto: no TPU or CUDA device found; picked cpu (candle)".into()),
            )),
        },
        DeviceMap::Balanced | DeviceMap::BalancedLow0 | DeviceMap::Sequential => {
            let strategy = match map {
                DeviceMap::Balanced => "balanced",
                DeviceMap::BalancedLow0 => "balanced_low_0",
                _ => "sequential",
            };
            match accelerator()? {
                Some(Accelerator::Pjrt(p, n)) => spread(
                    p,
                    &singles(&(0..n).collect::<Vec<_>>()),
                    strategy,
                    facts,
                    None,
                    false,
                ),
                Some(Accelerator::CandleCuda) => Err(unsupported(
                    "splitting over candle CUDA devices is not built; use a PJRT CUDA plugin \
                     (device_map pjrt:cuda) or one device (cuda:N)"
                        .into(),
                )),
                None => Ok(Resolved::one(
                    Device::Cpu,
                    Some(format!(
                        "device_map {strategy}: no TPU or CUDA device found; everything on cpu (candle)"
                    )),
                )),
            }
        }
        DeviceMap::Explicit(m) => {
            check_coverage(m, facts)?;
            explicit(m)
        }
    }
}

/// An explicit map must name modules the model has and give every weight a device, as
/// accelerate checks a `device_map`: a typo or a stale map would otherwise load a module
/// on a device nobody asked for.
fn check_coverage(m: &ExplicitMap, facts: &ModelFacts<'_>) -> Result<()> {
    // A tied head (`lm_head` sharing the embeddings) is a module with no tensor of its own.
    let tied: Vec<String> = crate::registry::layout(facts.config)
        .and_then(|l| l.ok())
        .map(|l| l.tied.into_iter().flatten().collect())
        .unwrap_or_default();
    let names = || {
        facts
            .inventory
            .tensors()
            .iter()
            .map(|t| t.name.as_str())
            .chain(tied.iter().map(String::as_str))
    };
    let within = |name: &str, prefix: &str| {
        prefix.is_empty()
            || name == prefix
            || (name.starts_with(prefix) && name.as_bytes().get(prefix.len()) == Some(&b'.'))
    };
    // accelerate also places modules that hold only non-persistent buffers (a decoder's
    // `rotary_emb`): they have no tensor in the checkpoint, and nothing to place.
    let weightless = |p: &str| p.rsplit('.').next() == Some("rotary_emb");
    let unknown: Vec<&str> = m
        .entries
        .keys()
        .filter(|p| !weightless(p) && !names().any(|n| within(n, p)))
        .map(String::as_str)
        .collect();
    let bad = |reason: String| Error::invalid("device_map", reason);
    if !unknown.is_empty() {
        return Err(bad(format!(
            "the device map names {} that the checkpoint does not have: {}; name modules as \
             `zoo inspect` lists them (e.g. model.layers.0, lm_head)",
            plural(unknown.len(), "module"),
            list(&unknown)
        )));
    }
    let mut uncovered: Vec<&str> = facts
        .inventory
        .tensors()
        .iter()
        .map(|t| t.name.as_str())
        .filter(|n| m.placement_of(n).is_none())
        .map(|n| n.rsplit_once('.').map_or(n, |(module, _)| module))
        .collect();
    let mut seen = std::collections::HashSet::new();
    uncovered.retain(|m| seen.insert(*m));
    if !uncovered.is_empty() {
        return Err(bad(format!(
            "the device map gives no device to {}: {}; add them, or \"\": DEVICE for everything \
             the map does not name",
            plural(uncovered.len(), "module"),
            list(&uncovered)
        )));
    }
    Ok(())
}

fn plural(n: usize, what: &str) -> String {
    if n == 1 {
        format!("1 {what}")
    } else {
        format!("{n} {what}s")
    }
}

/// The first few names of a list, and how many more.
fn list(names: &[&str]) -> String {
    const SHOWN: usize = 6;
    let mut out = names
        .iter()
        .take(SHOWN)
        .copied()
        .collect::<Vec<_>>()
        .join(", ");
    if names.len() > SHOWN {
        out.push_str(&format!(" and {} more", names.len() - SHOWN));
    }
    out
}

/// `cpu`, `cuda`/`gpu` or `tpu`.
fn parse_platform(s: &str) -> std::result::Result<PjrtPlatform, String> {
    match s.to_ascii_lowercase().as_str() {
        "cpu" => Ok(PjrtPlatform::Cpu),
        "cuda" | "gpu" => Ok(PjrtPlatform::Cuda),
        "tpu" => Ok(PjrtPlatform::Tpu),
        other => Err(format!(
            "unknown PJRT platform {other:?}; use pjrt:cpu, pjrt:cuda or pjrt:tpu"
        )),
    }
}

/// Fails at once, with the plugin search report, on a host without TPUs.
fn require_tpu() -> Result<()> {
    discovery::tpu_allowed().map_err(tpu_err)?;
    discovery::find_plugin(Some("tpu"), None).map_err(tpu_err)?;
    Ok(())
}

fn tpu_err(e: zoo_runtime::pjrt::PjrtError) -> Error {
    Error::DeviceUnavailable {
        map: "tpu".into(),
        reason: format!("this host has no usable TPU: {e}"),
    }
}

/// The ordinals `devices` lists, or every device of `p`'s plugin (a TPU only on a host that
/// has one).
fn pjrt_ordinals(p: PjrtPlatform, devices: Option<&[usize]>) -> Result<Vec<usize>> {
    if p == PjrtPlatform::Tpu {
        require_tpu()?;
    }
    Ok(match devices {
        Some(d) if !d.is_empty() => d.to_vec(),
        _ => (0..lazy::device_count(p)?).collect(),
    })
}

/// Each ordinal a group of its own.
fn singles(ordinals: &[usize]) -> Vec<Vec<usize>> {
    ordinals.iter().map(|&i| vec![i]).collect()
}

/// Every device of an accelerator host, as TPUs are used: one mesh over all of them (the
/// family's tensor-parallel plan) when the model fits their memory together; else stages of
/// the largest meshes that fit (a tensor that does not divide a large mesh is whole on each
/// of its devices, so a smaller mesh can fit where a larger does not); stages of single
/// devices for a family without a plan. `what` starts the note saying what was picked.
fn across(
    platform: PjrtPlatform,
    ordinals: &[usize],
    facts: &ModelFacts<'_>,
    what: &str,
) -> Result<Resolved> {
    let n = ordinals.len();
    let has_plan = crate::registry::family_of(facts.config).is_some_and(|f| !f.tp_plan.is_empty());
    if has_plan && n > 1 {
        for tp in (2..=n).rev().filter(|tp| n.is_multiple_of(*tp)) {
            let groups = tp_groups(ordinals, Some(tp)).map_err(Error::from)?;
            let note = match groups.len() {
                1 => format!("{what} ({n} devices, one tensor-parallel mesh)"),
                k => format!("{what} ({n} devices, {k} stages of tensor-parallel meshes of {tp})"),
            };
            match spread(platform, &groups, "balanced", facts, Some(note), true) {
                Err(Error::Runtime(e))
                    if matches!(
                        *e,
                        zoo_runtime::Error::DeviceMap(DeviceMapError::DoesNotFit { .. })
                    ) => {}
                other => return other,
            }
        }
    }
    let note = match n {
        1 => format!("{what} (1 device)"),
        _ => format!("{what} ({n} devices, balanced stages)"),
    };
    spread(
        platform,
        &singles(ordinals),
        "balanced",
        facts,
        Some(note),
        false,
    )
}

/// The model on `groups` of `platform`'s devices: a group of one is that device, a larger
/// one a mesh every layer is split over (tensor parallelism, the family's plan); one group
/// holds the whole model (checked to fit when `check_one`), several are stages planned by
/// `strategy`.
fn spread(
    platform: PjrtPlatform,
    groups: &[Vec<usize>],
    strategy: &str,
    facts: &ModelFacts<'_>,
    note: Option<String>,
    check_one: bool,
) -> Result<Resolved> {
    let all: Vec<usize> = groups.iter().flatten().copied().collect();
    // Still check that the devices exist.
    let budgets = pjrt_budgets(platform, &all, facts.max_memory).map_err(Error::from)?;
    let group_device =
        |g: &[usize]| -> Result<Device> { Ok(Device::Pjrt(group_device(platform, g)?)) };
    if let ([only], false) = (groups, check_one) {
        return Ok(Resolved::one(group_device(only)?, note));
    }
    // A stage's budget: its group's devices together (split weights take 1/N of each).
    let mut devices: Vec<DeviceBudget> = groups
        .iter()
        .map(|g| {
            let of = |i: usize| budgets.iter().find(|b| b.place == Placement::Device(i));
            let first = of(g[0]).cloned().ok_or_else(|| {
                Error::Internal(format!("no budget for device {} (internal error)", g[0]))
            })?;
            let each = g.iter().filter_map(|&i| of(i).map(|b| b.bytes));
            // The XLA CPU plugin's devices all report the host's memory: counted once.
            let bytes = if platform == PjrtPlatform::Cpu {
                each.min().unwrap_or(0)
            } else {
                each.fold(0u64, u64::saturating_add)
            };
            Ok(DeviceBudget {
                bytes,
                name: if g.len() == 1 {
                    first.name
                } else {
                    format!("{}[tp{}]", first.name, g.len())
                },
                ..first
            })
        })
        .collect::<Result<_>>()?;
    if let Some(bytes) = facts.max_memory.and_then(|m| m.get(&Placement::Cpu)) {
        devices.push(DeviceBudget {
            place: Placement::Cpu,
            name: "cpu".into(),
            bytes,
        });
    }
    let dtype = match facts.dtype {
        DType::BF16 => Dtype::BF16,
        DType::F16 => Dtype::F16,
        _ => Dtype::F32,
    };
    let layout = crate::registry::layout(facts.config).ok_or_else(|| Error::Config {
        path: facts.config.path.clone(),
        reason: "no registered family describes this checkpoint's layers, so it cannot be split"
            .into(),
    })??;
    let request = PlanRequest {
        strategy: strategy.to_string(),
        devices,
        units: layout.units(facts.inventory, Some(dtype)),
        shape: Some(layout.shape),
        workload: Workload {
            batch: 1,
            seq: layout.context.min(PLANNED_SEQ),
            elem_bytes: facts.dtype.size_in_bytes(),
        },
        activations: None,
        reserve_fraction: 0.05,
    };
    let plan = plan(&request).map_err(Error::from)?;
    plan.check_covers(facts.inventory).map_err(Error::from)?;
    if let [only] = groups {
        // The model fits the one group only if the plan keeps all of it there.
        if plan
            .map
            .entries
            .values()
            .any(|p| *p != Placement::Device(only[0]))
        {
            return Err(DeviceMapError::DoesNotFit {
                shortfall: format!("the model does not fit devices {only:?} together"),
            }
            .into());
        }
        return Ok(Resolved::one(group_device(only)?, note));
    }
    let placement = placement_of(&plan.map, |i| {
        let g = groups.iter().find(|g| g[0] == i).ok_or_else(|| {
            Error::Internal(format!(
                "the plan placed a stage on device {i}, no group's first"
            ))
        })?;
        group_device(g)
    })?;
    let first = first_device(&plan, &placement);
    Ok(Resolved {
        device: first,
        placement: Some(placement),
        plan: Some(plan),
        note,
    })
}

/// An explicit `hf_device_map`: indices are devices of the best accelerator, or of the PJRT
/// CPU plugin on a host without one; `"cpu"` is candle's CPU.
fn explicit(m: &ExplicitMap) -> Result<Resolved> {
    let needs_devices = m
        .entries
        .values()
        .any(|p| matches!(p, Placement::Device(_)));
    let (platform, note) = if !needs_devices {
        (PjrtPlatform::Cpu, None)
    } else {
        match accelerator()? {
            Some(Accelerator::Pjrt(p, _)) => (p, None),
            Some(Accelerator::CandleCuda) => {
                return Err(Error::UnsupportedDeviceMap {
                    map: "explicit".into(),
                    reason: "device indices need a PJRT plugin; this host only has candle CUDA"
                        .into(),
                })
            }
            None => (
                PjrtPlatform::Cpu,
                Some("device map file: no TPU or CUDA device; indices are PJRT CPU devices".into()),
            ),
        }
    };
    let count = if needs_devices {
        lazy::device_count(platform)?
    } else {
        0
    };
    let placement = placement_of(m, |i| {
        if i < count {
            Ok(Device::Pjrt(PjrtDevice::new(platform, i)))
        } else {
            Err(Error::DeviceUnavailable {
                map: "explicit".into(),
                reason: format!(
                    "the map names device {i} but the {} plugin has {count} devices",
                    platform_name(platform)
                ),
            })
        }
    })?;
    // Inputs go where the embeddings are (else the map's first entry).
    let device = placement
        .device_of("model.embed_tokens.weight")
        .or_else(|| placement.entries().next().map(|(_, d)| d))
        .unwrap_or(Device::Cpu);
    Ok(Resolved {
        device,
        placement: Some(placement),
        plan: None,
        note,
    })
}

fn placement_of(
    m: &ExplicitMap,
    device: impl Fn(usize) -> Result<Device>,
) -> Result<DevicePlacement> {
    let mut out = DevicePlacement::new();
    for (prefix, p) in &m.entries {
        let d = match *p {
            Placement::Device(i) => device(i)?,
            Placement::Cpu => Device::Cpu,
            Placement::Disk => return Err(Error::from(DeviceMapError::DiskUnsupported)),
        };
        out.insert(prefix.clone(), d);
    }
    Ok(out)
}

/// The device of the plan's first stage (where the embeddings are).
fn first_device(plan: &Plan, placement: &DevicePlacement) -> Device {
    plan.stages
        .iter()
        .flat_map(|s| s.units.first())
        .next()
        .and_then(|u| placement.device_of(u))
        .unwrap_or(Device::Cpu)
}

#[cfg(test)]
mod tests {
    use zoo_runtime::device_map::parse_max_memory;

    use super::*;

    /// What `tpu` and `auto` make of a host's devices, shown on the XLA CPU plugin's four
    /// (the plugin from the test command; the budgets given, as the planner would read a
    /// TPU's): one mesh when the model fits, stages of smaller meshes when only they fit,
    /// single-device stages for a family without a tensor-parallel plan.
    #[test]
    fn every_device_is_one_mesh_when_the_model_fits_and_stages_only_where_it_must() {
        std::env::var_os("ZOO_PJRT_CPU_PLUGIN")
            .expect("ZOO_PJRT_CPU_PLUGIN is unset: run the tests through scripts/run-tests.sh");
        let fixture = |name: &str| {
            let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../nightly/fixtures")
                .join(name);
            let config = PretrainedConfig::from_file(&dir.join("config.json")).unwrap();
            let inventory = Inventory::from_safetensors(&[dir.join("model.safetensors")]).unwrap();
            (config, inventory)
        };
        let choose = |name: &str, budget: &str| {
            let (config, inventory) = fixture(name);
            let max_memory = parse_max_memory(budget).unwrap();
            let facts = ModelFacts {
                inventory: &inventory,
                config: &config,
                dtype: DType::F32,
                max_memory: Some(&max_memory),
            };
            across(PjrtPlatform::Cpu, &[0, 1, 2, 3], &facts, "device_map tpu")
        };
        // The model (142 KB in f32) fits: one mesh of the four.
        let r = choose("llama-gqa-f32", "0=1GiB,1=1GiB,2=1GiB,3=1GiB").unwrap();
        assert_eq!(r.device.to_string(), "pjrt:cpu:0,1,2,3[model=4]");
        assert!(r.placement.is_none());
        assert!(r.note.unwrap().contains("one tensor-parallel mesh"));
        // A mesh of the CPU plugin's devices shares one host's memory (its budget counted
        // once): 250 KB holds the activations' reserve (141 KiB) and half the weights and
        // KV cache (154 KiB in all), not all of them, so two stages of two-device meshes.
        let r = choose("llama-gqa-f32", "0=250KB,1=250KB,2=250KB,3=250KB").unwrap();
        let note = r.note.unwrap();
        assert!(
            note.contains("2 stages of tensor-parallel meshes of 2"),
            "{note}"
        );
        let placement = r.placement.unwrap();
        let devices: std::collections::BTreeSet<String> =
            placement.entries().map(|(_, d)| d.to_string()).collect();
        assert!(devices.contains("pjrt:cpu:0,1[model=2]"), "{devices:?}");
        assert!(devices.contains("pjrt:cpu:2,3[model=2]"), "{devices:?}");
        // Nothing fits: the planner's shortfall, named.
        let e = choose("llama-gqa-f32", "0=150KB,1=150KB,2=150KB,3=150KB").unwrap_err();
        assert!(e.to_string().contains("does not fit"), "{e}");
        // GPT-2 has no plan (as in transformers): stages of single devices.
        let r = choose("gpt2-base-f32", "0=1GiB,1=1GiB,2=1GiB,3=1GiB").unwrap();
        assert!(r.note.unwrap().contains("balanced stages"));
        assert_eq!(r.device.to_string(), "pjrt:cpu:0");
    }
}
