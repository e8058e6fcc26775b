//! From a device map to where each pipeline component runs, as accelerate's `device_map`
//! strategies place diffusers pipelines: every text encoder and the VAE is one unit, the
//! denoiser splits at its blocks, and the planner fills the devices' budgets
//! (`max_memory`, else the devices' own memory statistics) before any weight is read.
//!
//! `cpu`, `cuda:N`, `tpu` and `pjrt:PLATFORM[:N,...]` name their devices ([`devices_of`]):
//! the denoiser is split over several in balanced stages by weight. The strategies `auto`,
//! `balanced`, `balanced_low_0` and `sequential` plan the whole pipeline over the host's
//! accelerator ([`plan_devices`]), so a denoiser that fits on one device stays whole under
//! `sequential` and splits only when it does not; without an accelerator everything runs
//! on the CPU.

use std::collections::BTreeMap;

use zoo_hub::Dtype;
use zoo_runtime::device_map::{
    accelerator, pjrt_budgets, plan, Accelerator, DeviceMap, MaxMemory, Placement, Plan,
    PlanRequest, Workload,
};
use zoo_runtime::nn::DevicePlacement;
use zoo_runtime::{DType, Device, PjrtDevice, PjrtPlatform};

use super::{devices_of, LoadOptions};
use crate::{Error, Result};

/// The image a placement is planned for: its activations size the budgets.
#[derive(Clone, Copy, Debug)]
pub struct PlanShape {
    /// Dtype of the weights (`None`: float32, the pipelines' default).
    pub dtype: Option<DType>,
    /// `(height, width)`; `None`: the denoiser's sample size.
    pub size: Option<(usize, usize)>,
    /// Images per call.
    pub images: usize,
    /// Classifier-free guidance (doubles the denoiser's batch).
    pub guidance: bool,
}

impl Default for PlanShape {
    fn default() -> Self {
        PlanShape {
            dtype: None,
            size: None,
            images: 1,
            guidance: true,
        }
    }
}

/// Where a pipeline's components go.
#[derive(Clone, Debug)]
pub struct Resolved {
    /// The load options' placement fields (`device`, `unet_devices`,
    /// `component_devices`, `denoiser_placement`); every other field is the default.
    pub options: LoadOptions,
    /// The plan a strategy map was resolved with.
    pub plan: Option<Plan>,
    /// What a strategy picked when the host has no accelerator, for the user.
    pub note: Option<String>,
}

/// Resolves `map` for the pipeline at `repo_or_path`.
pub fn resolve(
    repo_or_path: &str,
    map: &DeviceMap,
    max_memory: Option<&MaxMemory>,
    shape: &PlanShape,
) -> Result<Resolved> {
    let strategy = match map {
        DeviceMap::Auto | DeviceMap::Balanced => "balanced",
        DeviceMap::BalancedLow0 => "balanced_low_0",
        DeviceMap::Sequential => "sequential",
        _ => {
            let devices = devices_of(map)?;
            if devices.iter().all(|d| *d == Device::Cpu) {
                check_host_fits(repo_or_path, shape)?;
            }
            return Ok(Resolved {
                options: LoadOptions::on_devices(&devices),
                plan: None,
                note: None,
            });
        }
    };
    match accelerator()? {
        Some(Accelerator::Pjrt(platform, n)) => {
            let ordinals: Vec<usize> = (0..n).collect();
            let (options, plan) = plan_devices(
                repo_or_path,
                platform,
                &ordinals,
                strategy,
                max_memory,
                shape,
            )?;
            Ok(Resolved {
                options,
                plan: Some(plan),
                note: None,
            })
        }
        Some(Accelerator::CandleCuda) => Ok(Resolved {
            options: LoadOptions::on_devices(&[Device::Cuda(0)]),
            plan: None,
            note: Some(format!(
                "device_map {strategy}: splitting over candle CUDA devices is not built; everything on cuda:0"
            )),
        }),
        None => {
            check_host_fits(repo_or_path, shape)?;
            let note = format!(
                "device_map {strategy}: no TPU or CUDA device found; everything on cpu (candle)"
            );
            Ok(Resolved {
                options: LoadOptions::on_devices(&[Device::Cpu]),
                plan: None,
                note: Some(note),
            })
        }
    }
}

/// Refuses a call on the host that would not fit the memory this process may still take
/// (weights, the largest component's activations, latents and images at the asked size and
/// count), before anything is loaded: an absurd `--size` or image count is an error naming
/// them, not an aborted process.
fn check_host_fits(repo_or_path: &str, shape: &PlanShape) -> Result<()> {
    let Some(available) = zoo_runtime::device_map::host_available() else {
        return Ok(());
    };
    let dtype = shape.dtype.map(hub_dtype);
    // A pipeline the planner cannot read fails its load with the reason; nothing to size.
    let Ok(plan) = super::plan::plan_units(
        repo_or_path,
        dtype,
        shape.size,
        shape.images,
        shape.guidance,
    ) else {
        return Ok(());
    };
    // Eager execution keeps an op's inputs beside its output, so the host holds a few times
    // the activations a compiled program's plan counts.
    let needs = plan.host_bytes(shape.images, EAGER_ACTIVATIONS);
    if needs <= available {
        return Ok(());
    }
    let (h, w) = plan.size;
    let human = zoo_runtime::device_map::human;
    Err(Error::Input(format!(
        "{} image(s) of {w}x{h} need about {} of host memory (weights, activations, latents and \
         pixels), and {} is available; ask for a smaller size or fewer images",
        shape.images,
        if needs == u64::MAX {
            "more than 2^64 bytes".into()
        } else {
            human(needs)
        },
        human(available)
    )))
}

/// How many times the planned activations an eager host call holds at its peak.
const EAGER_ACTIVATIONS: u64 = 3;

fn hub_dtype(d: DType) -> Dtype {
    match d {
        DType::BF16 => Dtype::BF16,
        DType::F16 => Dtype::F16,
        _ => Dtype::F32,
    }
}

/// Plans the pipeline at `repo_or_path` over devices `ordinals` of `platform` with the
/// planner's `strategy` (`balanced`, `balanced_low_0`, `sequential`) and applies the plan:
/// each text encoder and the VAE on its unit's device, the denoiser's blocks on theirs.
/// A pipeline the budgets cannot hold is an error naming the shortfall.
pub fn plan_devices(
    repo_or_path: &str,
    platform: PjrtPlatform,
    ordinals: &[usize],
    strategy: &str,
    max_memory: Option<&MaxMemory>,
    shape: &PlanShape,
) -> Result<(LoadOptions, Plan)> {
    let dtype = shape.dtype.map(hub_dtype);
    let units = super::plan::plan_units(
        repo_or_path,
        dtype,
        shape.size,
        shape.images,
        shape.guidance,
    )?;
    let request = PlanRequest {
        strategy: strategy.to_string(),
        devices: pjrt_budgets(platform, ordinals, max_memory)?,
        units: units.units.clone(),
        shape: None,
        workload: Workload {
            batch: shape.images,
            seq: 1,
            elem_bytes: dtype.map_or(4, |d| d.plain_size() as usize),
        },
        activations: Some(units.activations),
        reserve_fraction: 0.05,
    };
    let plan = plan(&request).map_err(zoo_runtime::Error::from)?;
    let device = |p: Placement| match p {
        Placement::Device(ordinal) => Ok(Device::Pjrt(PjrtDevice::new(platform, ordinal))),
        other => Err(Error::Unsupported(format!(
            "the plan puts a pipeline unit on {other:?}; pipelines run on {platform:?} devices only"
        ))),
    };
    let mut components = BTreeMap::new();
    let mut denoiser = DevicePlacement::new();
    let mut stem = None;
    let mut order: Vec<Device> = Vec::new();
    for stage in &plan.stages {
        let d = device(stage.device.place)?;
        for unit in &stage.units {
            let (component, block) = unit.split_once('.').unwrap_or((unit.as_str(), ""));
            let is_denoiser = component == "unet" || component == "transformer";
            if !is_denoiser {
                components.insert(component.to_string(), d);
                continue;
            }
            if !order.contains(&d) {
                order.push(d);
            }
            match block {
                "" => stem = Some(d),
                "conv_out" => {
                    denoiser.insert("conv_norm_out", d);
                    denoiser.insert("conv_out", d);
                }
                "proj_out" => {
                    denoiser.insert("norm_out", d);
                    denoiser.insert("proj_out", d);
                }
                block => denoiser.insert(block, d),
            }
        }
    }
    // The stem runs first; the denoising loop keeps its latents there.
    let first = stem.or(order.first().copied()).ok_or_else(|| {
        Error::Unsupported("the pipeline has no UNet or transformer to place".into())
    })?;
    order.retain(|d| *d != first);
    order.insert(0, first);
    let text = components.get("text_encoder").copied().unwrap_or(first);
    let options = LoadOptions {
        device: text,
        denoiser_placement: (order.len() > 1).then_some(denoiser),
        unet_devices: if order.len() > 1 { order } else { vec![first] },
        component_devices: components,
        ..LoadOptions::default()
    };
    Ok((options, plan))
}
