//! Component loading, as diffusers' `ModelMixin.from_pretrained` loads: a component folder
//! (`config.json` beside `diffusion_pytorch_model[.variant].safetensors`, sharded or not)
//! opened as runtime weights, and the placement of a denoiser's blocks over several
//! devices (contiguous stages balanced by weight bytes). The models load through it and
//! the pipelines open their components through it; it imports nothing from `pipelines`.

use std::path::PathBuf;
use std::sync::Arc;

use zoo_hub::{Dtype, Inventory, Pretrained};
use zoo_runtime::device_map::{
    plan, DeviceBudget, Placement, PlanRequest, TpPlan, TpStyle, Unit, Workload,
};
use zoo_runtime::nn::{DevicePlacement, Weights};
use zoo_runtime::{DType, Device};

use crate::{Error, Result};

/// The weights of a diffusers component (`diffusion_pytorch_model[.variant].safetensors`,
/// sharded or not) as runtime weights in `dtype` on `device`.
pub(crate) fn component_weights(
    component: &Pretrained,
    dtype: DType,
    device: &Device,
) -> Result<Weights> {
    let ck = component.checkpoint()?;
    // A config declaring more blocks than the weights hold is refused before the model
    // allocates its block list.
    if let Some(path) = component.config_path()? {
        let json = |reason: String| zoo_hub::HubError::Json {
            path: path.clone(),
            reason,
        };
        let bytes = std::fs::read(&path).map_err(|e| json(e.to_string()))?;
        let config: serde_json::Value =
            serde_json::from_slice(&bytes).map_err(|e| json(e.to_string()))?;
        ck.inventory.check_layer_counts(&config, &path)?;
        ck.inventory.check_unquantized(&config, &path)?;
    }
    let source = Arc::new(zoo_hub::Weights::open(ck.inventory)?);
    Ok(Weights::new(source, dtype, *device).with_tp_plan(TP_PLAN))
}

/// How diffusers' models split over a mesh's `model` axis (tensor parallelism): every
/// transformer block's attention by heads (queries, keys and values colwise, outputs
/// rowwise; the joint blocks' context projections too) and its feed-forward by columns, in
/// the UNets', DiT's, PixArt's, SD3's and Flux's blocks alike. Everything else is whole on
/// every device.
const TP_PLAN: TpPlan = &[
    ("attn.to_q", TpStyle::Colwise),
    ("attn.to_k", TpStyle::Colwise),
    ("attn.to_v", TpStyle::Colwise),
    ("attn.to_out.0", TpStyle::Rowwise),
    ("attn1.to_q", TpStyle::Colwise),
    ("attn1.to_k", TpStyle::Colwise),
    ("attn1.to_v", TpStyle::Colwise),
    ("attn1.to_out.0", TpStyle::Rowwise),
    ("attn2.to_q", TpStyle::Colwise),
    ("attn2.to_k", TpStyle::Colwise),
    ("attn2.to_v", TpStyle::Colwise),
    ("attn2.to_out.0", TpStyle::Rowwise),
    ("attn.add_q_proj", TpStyle::Colwise),
    ("attn.add_k_proj", TpStyle::Colwise),
    ("attn.add_v_proj", TpStyle::Colwise),
    ("attn.to_add_out", TpStyle::Rowwise),
    ("ff.net.0.proj", TpStyle::Colwise),
    ("ff.net.2", TpStyle::Rowwise),
    ("ff_context.net.0.proj", TpStyle::Colwise),
    ("ff_context.net.2", TpStyle::Rowwise),
    ("proj_mlp", TpStyle::Colwise),
];

/// A diffusers component (a folder holding `config.json` and
/// `diffusion_pytorch_model[.variant].safetensors`, or a Hub repo's subfolder) opened for a
/// model's `from_pretrained`: its config path and its weights in `dtype` on `device`.
pub(crate) fn open_component(
    repo_or_path: &str,
    dtype: DType,
    device: &Device,
) -> Result<(PathBuf, Weights)> {
    let pretrained = Pretrained::open(repo_or_path)?;
    let config = pretrained
        .files()
        .get_optional("config.json")?
        .ok_or_else(|| Error::Config {
            path: PathBuf::from(repo_or_path).join("config.json"),
            reason: "missing: a diffusers component folder holds config.json beside its weights"
                .into(),
        })?;
    let weights = component_weights(&pretrained, dtype, device)?;
    Ok((config, weights))
}

/// A diffusion transformer's component folder opened with its blocks placed over `devices`
/// (balanced stages; the first device for the rest), as the pipelines split it.
pub(crate) fn open_split(
    repo_or_path: &str,
    dtype: DType,
    devices: &[Device],
) -> Result<(PathBuf, Weights)> {
    let first = *devices.first().ok_or_else(|| {
        Error::Input("give at least one device to load the transformer on".into())
    })?;
    let (config, w) = open_component(repo_or_path, dtype, &first)?;
    if devices.len() < 2 {
        return Ok((config, w));
    }
    let pretrained = Pretrained::open(repo_or_path)?;
    let placement = transformer_placement(&pretrained, devices, dtype)?;
    Ok((config, w.with_placement(placement)))
}

/// The UNet's unit of a tensor name: its block, or the stem before / head after them.
fn unet_unit(name: &str) -> String {
    let mut parts = name.split('.');
    match (parts.next(), parts.next()) {
        (Some(b @ ("down_blocks" | "up_blocks")), Some(i)) => format!("unet.{b}.{i}"),
        (Some("mid_block"), _) => "unet.mid_block".into(),
        // The output head is one unit: conv_norm_out runs just before conv_out.
        (Some("conv_norm_out" | "conv_out"), _) => "unet.conv_out".into(),
        _ => "unet".into(),
    }
}

/// The block index a unit name ends in (`unet.down_blocks.2` → 2), 0 for none.
fn idx(unit: &str) -> usize {
    unit.rsplit('.')
        .next()
        .and_then(|i| i.parse::<usize>().ok())
        .unwrap_or(0)
}

/// A UNet unit's place in execution order, given its count of down blocks.
fn unet_rank(unit: &str, blocks: usize) -> usize {
    if unit == "unet" {
        0
    } else if unit.starts_with("unet.down_blocks.") {
        1 + idx(unit)
    } else if unit == "unet.mid_block" {
        1 + blocks
    } else if unit.starts_with("unet.up_blocks.") {
        2 + blocks + idx(unit)
    } else {
        3 + 2 * blocks
    }
}

/// A diffusion transformer's unit of a tensor name: its block, or the stem / output head.
fn transformer_unit(name: &str) -> String {
    let mut parts = name.split('.');
    match (parts.next(), parts.next()) {
        (Some(b @ ("transformer_blocks" | "single_transformer_blocks")), Some(i)) => {
            format!("transformer.{b}.{i}")
        }
        (Some("norm_out" | "proj_out"), _) => "transformer.proj_out".into(),
        _ => "transformer".into(),
    }
}

/// A transformer unit's place in execution order, given its count of double blocks.
fn transformer_rank(unit: &str, doubles: usize) -> usize {
    if unit == "transformer" {
        0
    } else if let Some(rest) = unit.strip_prefix("transformer.transformer_blocks.") {
        1 + idx(rest)
    } else if let Some(rest) = unit.strip_prefix("transformer.single_transformer_blocks.") {
        1 + doubles + idx(rest)
    } else {
        usize::MAX
    }
}

/// Units of a component from its inventory, grouped by `unit_of` and ordered by `rank`
/// (given the count of the first kind of block).
fn grouped_units(
    inventory: &Inventory,
    dtype: Option<Dtype>,
    unit_of: fn(&str) -> String,
    first_blocks: &str,
    rank: fn(&str, usize) -> usize,
) -> Vec<Unit> {
    let mut units: Vec<Unit> = Vec::new();
    let mut blocks = 0;
    for t in inventory.tensors() {
        let unit = unit_of(&t.name);
        if let Some(i) = unit
            .strip_prefix(first_blocks)
            .and_then(|i| i.parse::<usize>().ok())
        {
            blocks = blocks.max(i + 1);
        }
        let bytes = dtype.map_or(t.nbytes, |d| t.bytes_as(d));
        match units.iter_mut().find(|u| u.name == unit) {
            Some(u) => u.weight_bytes += bytes,
            None => units.push(Unit {
                name: unit,
                weight_bytes: bytes,
                layer: None,
                tied_with: None,
            }),
        }
    }
    units.sort_by_key(|u| rank(&u.name, blocks));
    units
}

/// A diffusion transformer's units (stem, blocks, single blocks, head) from its inventory.
pub(crate) fn transformer_units(inventory: &Inventory, dtype: Option<Dtype>) -> Vec<Unit> {
    grouped_units(
        inventory,
        dtype,
        transformer_unit,
        "transformer.transformer_blocks.",
        transformer_rank,
    )
}

/// The UNet's units (stem, down blocks, mid block, up blocks, head) from its inventory.
pub(crate) fn unet_units(inventory: &Inventory, dtype: Option<Dtype>) -> Vec<Unit> {
    grouped_units(inventory, dtype, unet_unit, "unet.down_blocks.", unet_rank)
}

/// Where a UNet split over `devices` puts each block: contiguous stages in execution order,
/// balanced by weight bytes in `dtype` (the planner's exact min-max split); the stem stays
/// on the first device.
pub(crate) fn unet_placement(
    unet: &Pretrained,
    devices: &[Device],
    dtype: DType,
) -> Result<DevicePlacement> {
    let units = unet_units(&unet.checkpoint()?.inventory, Some(hub_dtype(dtype)));
    balanced_placement(units, devices, "unet.", |unit| match unit {
        "conv_out" => vec!["conv_norm_out", "conv_out"],
        block => vec![block],
    })
}

/// Where a diffusion transformer split over `devices` puts each block, as
/// [`unet_placement`] does for a UNet.
pub(crate) fn transformer_placement(
    transformer: &Pretrained,
    devices: &[Device],
    dtype: DType,
) -> Result<DevicePlacement> {
    let units = transformer_units(&transformer.checkpoint()?.inventory, Some(hub_dtype(dtype)));
    balanced_placement(units, devices, "transformer.", |unit| match unit {
        "proj_out" => vec!["norm_out", "proj_out"],
        block => vec![block],
    })
}

fn hub_dtype(dtype: DType) -> Dtype {
    match dtype {
        DType::BF16 => Dtype::BF16,
        DType::F16 => Dtype::F16,
        _ => Dtype::F32,
    }
}

/// The planner's balanced split of `units` over `devices`, as module prefixes of the
/// component (`prefix` stripped; `modules` maps a unit to the modules it covers). The stem
/// unit (`prefix` without a block) stays on the first device.
fn balanced_placement(
    units: Vec<Unit>,
    devices: &[Device],
    prefix: &str,
    modules: fn(&str) -> Vec<&str>,
) -> Result<DevicePlacement> {
    let total: u64 = units.iter().map(|u| u.weight_bytes).sum();
    let budgets = devices
        .iter()
        .enumerate()
        .map(|(i, d)| DeviceBudget {
            place: Placement::Device(i),
            name: format!("{d:?}"),
            bytes: total.max(1),
        })
        .collect();
    let p = plan(&PlanRequest {
        strategy: "balanced".into(),
        devices: budgets,
        units,
        shape: None,
        workload: Workload {
            batch: 1,
            seq: 1,
            elem_bytes: 4,
        },
        activations: Some(0),
        reserve_fraction: 0.0,
    })
    .map_err(zoo_runtime::Error::from)?;
    let mut placement = DevicePlacement::new();
    for stage in &p.stages {
        let Placement::Device(i) = stage.device.place else {
            continue;
        };
        for unit in &stage.units {
            if let Some(rest) = unit.strip_prefix(prefix) {
                for m in modules(rest) {
                    placement.insert(m, devices[i]);
                }
            }
        }
    }
    Ok(placement)
}
