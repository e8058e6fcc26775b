//! The device-map planner on a synthetic 1,000-layer, 100,000-tensor checkpoint (release:
//! `cargo bench -p zoo-runtime --bench plan`): grouping the inventory into no-split units,
//! then a balanced plan over 8 devices of unequal budgets and a sequential one with a cpu
//! spill, each validated. Target: under 100 ms per plan, inventory grouping included.

use std::path::PathBuf;
use std::time::Instant;

use zoo_hub::{Dtype, Inventory, TensorInfo, Transform};
use zoo_runtime::device_map::{
    plan, units_from_inventory, CacheLayout, DeviceBudget, ModelShape, Placement, PlanRequest,
    UnitRules, Workload,
};

const LAYERS: usize = 1000;
/// Tensors per layer; with the embeddings, the final norm and the head the checkpoint holds
/// `LAYERS * (PER_LAYER - 1) + 3` ≈ 100,000 tensors.
const PER_LAYER: usize = 101;

fn inventory() -> Inventory {
    let file = PathBuf::from("synthetic.safetensors");
    let mut inv = Inventory::default();
    let mut offset = 0u64;
    let mut push = |inv: &mut Inventory, name: String, shape: Vec<usize>| {
        let nbytes = shape.iter().product::<usize>() as u64 * 2;
        inv.push(TensorInfo {
            name,
            dtype: Dtype::BF16,
            shape,
            nbytes,
            file: file.clone(),
            offset,
            transform: Transform::None,
        })
        .expect("unique names");
        offset += nbytes;
    };
    push(
        &mut inv,
        "model.embed_tokens.weight".into(),
        vec![32000, 1024],
    );
    // Uneven layers: every tenth is twice as wide, as in interleaved dense/MoE stacks.
    for l in 0..LAYERS {
        let wide = if l % 10 == 0 { 2 } else { 1 };
        for t in 0..PER_LAYER - 1 {
            let name = format!("model.layers.{l}.block.{t}.weight");
            push(&mut inv, name, vec![64 * wide, 1024]);
        }
    }
    push(&mut inv, "model.norm.weight".into(), vec![1024]);
    push(&mut inv, "lm_head.weight".into(), vec![32000, 1024]);
    inv
}

fn main() {
    let inv = inventory();
    let n = inv.len();
    let shape = ModelShape {
        layers: LAYERS,
        hidden: 1024,
        intermediate: 4096,
        heads: 16,
        kv_heads: 4,
        head_dim: 64,
        vocab: 32000,
        kv_cache: CacheLayout::SelfAttention,
    };
    let workload = Workload {
        batch: 1,
        seq: 2048,
        elem_bytes: 2,
    };
    let gib = 1u64 << 30;
    let budgets: Vec<DeviceBudget> = (0..8)
        .map(|i| DeviceBudget {
            place: Placement::Device(i),
            name: format!("tpu:{i}"),
            bytes: if i % 2 == 0 { 16 * gib } else { 8 * gib },
        })
        .collect();
    println!("synthetic checkpoint: {LAYERS} layers, {n} tensors");
    for (strategy, devices) in [
        ("balanced", budgets.clone()),
        ("sequential", {
            let mut d = budgets[..2].to_vec();
            d.push(DeviceBudget {
                place: Placement::Cpu,
                name: "cpu".into(),
                bytes: 64 * gib,
            });
            d
        }),
    ] {
        let mut best = f64::INFINITY;
        let mut stages = 0;
        for _ in 0..5 {
            let t = Instant::now();
            let units = units_from_inventory(
                &inv,
                &UnitRules {
                    layer_containers: &["model.layers"],
                    inputs: &["model.embed_tokens"],
                    tied: &[],
                },
                None,
            );
            let request = PlanRequest {
                strategy: strategy.into(),
                devices: devices.clone(),
                units,
                shape: Some(shape),
                workload,
                activations: None,
                reserve_fraction: 0.05,
            };
            let p = plan(&request).expect("the synthetic model fits");
            p.check_covers(&inv).expect("every tensor placed");
            best = best.min(t.elapsed().as_secs_f64() * 1e3);
            stages = p.stages.iter().filter(|s| !s.units.is_empty()).count();
        }
        println!(
            "  {strategy:<10} over {} devices: {best:.1} ms (best of 5; target < 100 ms), {stages} stages used",
            devices.len()
        );
    }
}
