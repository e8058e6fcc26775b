//! Split a causal LM over several PJRT devices and generate: the device map is planned from
//! the checkpoint's headers before any weight is read, each layer's weights load straight onto
//! their device, and activations move between devices at the cuts.
//!
//! cargo run --release -p zoo-examples --example generate_split -- MODEL [MAP] [PROMPT]
//!
//! MAP is any `--device-map` form: `pjrt:cpu` (every device of the XLA CPU plugin, whose
//! device count `ZOO_PJRT_CPU_DEVICES` sets; 4 by default), `pjrt:cpu:0,1`, `tpu`, `balanced`,
//! `auto`, or a plan file written by `zoo plan --out plan.json`. The plugin comes from
//! `ZOO_PJRT_CPU_PLUGIN` or from the site-packages of `python3` (pip install xla-cpu-pjrt).

use std::io::Write;

use anyhow::{Context, Result};
use zoo_runtime::device_map::DeviceMap;
use zoo_transformers::{AutoModelForCausalLM, GenerationOptions};

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let model_path = args
        .next()
        .context("usage: generate_split MODEL [MAP] [PROMPT]")?;
    let map: DeviceMap = args.next().as_deref().unwrap_or("pjrt:cpu").parse()?;
    let prompt = args
        .next()
        .unwrap_or_else(|| "The three primary colours are".to_string());

    let model = AutoModelForCausalLM::builder(&model_path)
        .device_map(map)
        .progress(true)
        .load()?;
    let report = model.load_report();
    if let Some(note) = &report.note {
        eprintln!("{note}");
    }
    // Per device: weights, KV cache, activations, reserve, free; the cuts.
    if let Some(plan) = &report.plan {
        eprint!("{plan}");
    }

    print!("{prompt}");
    let (out, stats) =
        model.generate_stream(&prompt, false, &GenerationOptions::greedy(32), |piece| {
            print!("{piece}");
            let _ = std::io::stdout().flush();
        })?;
    println!();
    let devices: Vec<String> = report.devices.iter().map(|d| d.to_string()).collect();
    eprintln!(
        "{} tokens on {}: first after {:.2}s (compiles included), then {:.1} tok/s",
        out.token_ids.len(),
        devices.join(" → "),
        stats.time_to_first_token,
        stats.decode_tokens_per_second(),
    );
    Ok(())
}
