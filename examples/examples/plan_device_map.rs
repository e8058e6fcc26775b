//! Plan how a model splits over two accelerators of 2 GiB each, from its headers alone, and print
//! the plan and its `hf_device_map`.
//!
//! cargo run -p zoo-examples --example plan_device_map -- path/to/model

use zoo_hub::{Dtype, Pretrained};
use zoo_runtime::device_map::{plan, DeviceBudget, Placement, PlanRequest, Workload};

fn main() -> anyhow::Result<()> {
    let input = std::env::args()
        .nth(1)
        .ok_or_else(|| anyhow::anyhow!("usage: plan_device_map <folder | file | org/name>"))?;
    let model = Pretrained::open(&input)?;
    let checkpoint = model.checkpoint()?;
    // The family names its no-split units (each `model.layers.N` of a Llama stays whole on
    // one device) and what each costs beyond its weights; weights are counted as bf16.
    let layout = zoo_transformers::registry::layout(&model.config()?)
        .ok_or_else(|| anyhow::anyhow!("no zoo family describes {input}"))??;
    let units = layout.units(&checkpoint.inventory, Some(Dtype::BF16));
    let devices = (0..2)
        .map(|i| DeviceBudget {
            place: Placement::Device(i),
            name: format!("tpu:{i}"),
            bytes: 2 << 30,
        })
        .collect();
    let request = PlanRequest {
        strategy: "balanced".into(),
        devices,
        units,
        shape: Some(layout.shape), // KV cache (decoders) and activations
        workload: Workload {
            batch: 1,
            seq: 2048,
            elem_bytes: 2,
        },
        activations: None,
        reserve_fraction: 0.05,
    };
    let plan = plan(&request)?;
    print!("{plan}");
    println!("{}", serde_json::to_string_pretty(&plan.map.to_json())?);
    Ok(())
}
