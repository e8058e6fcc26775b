//! Tensor parallelism: every layer of a causal LM split over a mesh of PJRT devices, as
//! TPUs and GPUs are used. The family's plan (transformers' `base_model_tp_plan`) splits
//! the attention heads and MLP columns, each device is sent only its tile of each weight,
//! the KV cache splits by head, and XLA's SPMD partitioner inserts the collectives.
//!
//! cargo run --release -p zoo-examples --example tensor_parallel -- MODEL [MAP] [PROMPT]
//!
//! MAP: `tp:pjrt:cpu` (one mesh of every device of the XLA CPU plugin; 4 by default, set by
//! `ZOO_PJRT_CPU_DEVICES`), `tp:pjrt:cpu:0,1`, `tp2:pjrt:cpu` (stages of two-device meshes),
//! `tp:pjrt:tpu` on a TPU host. The plugin comes from `ZOO_PJRT_CPU_PLUGIN` or from the
//! site-packages of `python3` (pip install xla-cpu-pjrt). On one host's CPU the devices
//! share the same cores: the split shows the layout, not a speed-up.

use std::io::Write;

use anyhow::{Context, Result};
use zoo_runtime::device_map::{DeviceMap, Mesh, Sharding, TP_AXIS};
use zoo_runtime::{lazy, DType, Device, PjrtDevice, PjrtPlatform, Tensor};
use zoo_transformers::{AutoModelForCausalLM, ForwardArgs, GenerationOptions, LogitsFor};

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let model_path = args
        .next()
        .context("usage: tensor_parallel MODEL [MAP] [PROMPT]")?;
    let map: DeviceMap = args.next().as_deref().unwrap_or("tp:pjrt:cpu").parse()?;
    let prompt = args
        .next()
        .unwrap_or_else(|| "The three primary colours are".to_string());

    // The layout by hand: a weight split by rows over a mesh of two devices, each holding
    // half; the product is summed across them by XLA (an all-reduce).
    let mesh = Mesh::new(&[(TP_AXIS, 2)], &[0, 1])?;
    let on_mesh = Device::Pjrt(PjrtDevice::on_mesh(PjrtPlatform::Cpu, &mesh));
    let w = Tensor::arange(0.0, 32.0, 1.0, DType::F32, &Device::Cpu)?.reshape(&[8, 4])?;
    let rows = Sharding::split_dim(&mesh, 2, 0, TP_AXIS)?;
    let w = w.to_device_sharded(&on_mesh, &rows)?;
    let x = Tensor::ones(&[1, 8], DType::F32, &on_mesh)?;
    let y = x.matmul(&w)?;
    println!(
        "x @ w on {on_mesh}: w's tiles {:?}, collectives {:?}, y = {:?}",
        w.device_shapes().expect("a PJRT tensor")?,
        lazy::collectives(&[&y])?,
        y.to_vec::<f32>()?
    );

    let model = AutoModelForCausalLM::builder(&model_path)
        .device_map(map)
        .progress(true)
        .load()?;
    let report = model.load_report();
    if let Some(plan) = &report.plan {
        eprint!("{plan}");
    }
    // What one forward of three tokens compiles to: the collectives per step.
    let device = report.device;
    let ids = Tensor::from_vec(vec![1i64, 2, 3], &[1, 3], &device)?;
    let positions = Tensor::from_vec(vec![0i64, 1, 2], &[1, 3], &device)?;
    let mut cache = model.model().model().new_cache(1, 3)?;
    let forward = ForwardArgs {
        input_ids: &ids,
        position_ids: &positions,
        attention_mask: None,
        output_hidden_states: false,
        inputs_embeds: None,
    };
    let (logits, _) = model
        .model()
        .forward(forward, &mut cache, LogitsFor::Last)?;
    println!(
        "a forward on {device}: collectives {:?}",
        lazy::collectives(&[&logits])?
    );
    drop((logits, cache));

    print!("{prompt}");
    let (out, stats) =
        model.generate_stream(&prompt, false, &GenerationOptions::greedy(32), |piece| {
            print!("{piece}");
            let _ = std::io::stdout().flush();
        })?;
    println!();
    eprintln!(
        "{} tokens on {device}: first after {:.2}s (compiles included), then {:.1} tok/s",
        out.token_ids.len(),
        stats.time_to_first_token,
        stats.decode_tokens_per_second(),
    );
    Ok(())
}
