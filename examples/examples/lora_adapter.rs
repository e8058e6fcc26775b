//! Load a causal LM with PEFT LoRA adapters merged into its weights, and greedily continue
//! a prompt.
//!
//! cargo run --release -p zoo-examples --example lora_adapter -- MODEL ADAPTER[:SCALE]... \
//!     --prompt "Once upon a time"
//!
//! MODEL is the base model the adapters were trained on (a folder, a .gguf file or a Hub repo
//! id); each ADAPTER is a folder with adapter_config.json and adapter_model.safetensors (as
//! PEFT's `save_pretrained` writes them) or a Hub repo id, optionally followed by `:SCALE`,
//! its weight (1 as trained). Adapters merge in the order given.

use anyhow::{Context, Result};
use zoo_runtime::device_map::DeviceMap;
use zoo_transformers::{Adapter, AutoModelForCausalLM, GenerationOptions};

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let usage = "usage: lora_adapter MODEL ADAPTER[:SCALE]... [--prompt TEXT]";
    let model_path = args.next().context(usage)?;
    let mut prompt = "Once upon a time".to_string();
    let mut builder = AutoModelForCausalLM::builder(&model_path).device_map(DeviceMap::Cpu);
    while let Some(arg) = args.next() {
        if arg == "--prompt" {
            prompt = args.next().context(usage)?;
        } else {
            // `PATH:0.5` merges the adapter at half its trained weight.
            let adapter: Adapter = arg.parse()?;
            builder = builder.adapter(adapter);
        }
    }
    let model = builder.progress(true).load()?;
    let text = model.generate_text(&prompt, &GenerationOptions::greedy(32))?;
    println!("{prompt}{text}");
    Ok(())
}
