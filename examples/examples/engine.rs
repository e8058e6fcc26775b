//! Run several prompts through one generation engine: each joins while the others are
//! generating, with its own options, and the engine advances them together one step at a time
//! (what a server does with requests that arrive at different times).
//!
//! cargo run --release -p zoo-examples --example engine -- MODEL "Once upon a time" "The sea" "Rust is"
//!
//! MODEL is a folder (config.json + safetensors + tokenizer.json), a .gguf file such as
//! SmolLM2-135M-Instruct.Q4_1.gguf, or a Hub repo id.

use std::collections::HashMap;

use anyhow::{Context, Result};
use zoo_runtime::device_map::DeviceMap;
use zoo_transformers::{AutoModelForCausalLM, EngineConfig, EngineEvent, GenerationOptions};

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let model_path = args.next().context("usage: engine MODEL PROMPT...")?;
    let mut prompts: Vec<String> = args.collect();
    if prompts.is_empty() {
        prompts = vec!["Once upon a time".into(), "The sea".into()];
    }
    let model = AutoModelForCausalLM::load_pretrained(&model_path, DeviceMap::Cpu)?;
    // Two rows at once; 512 slots on the shared timeline (prompts and what they generate).
    let mut engine = model.engine(EngineConfig {
        max_sequences: 2,
        capacity: 512,
    })?;

    let mut texts = HashMap::new();
    let mut pending = prompts.iter().enumerate();
    let mut step = 0;
    loop {
        // A new prompt every fourth step: it waits for a free row, then joins the batch.
        if step % 4 == 0 {
            if let Some((i, prompt)) = pending.next() {
                let opts = GenerationOptions {
                    seed: i as u64,
                    do_sample: i % 2 == 1,
                    ..GenerationOptions::greedy(32)
                };
                let id = engine.add(model.encode(prompt, false)?, opts)?;
                texts.insert(id, prompt.clone());
            }
        }
        if engine.is_idle() && pending.len() == 0 {
            break;
        }
        for event in engine.step()? {
            match event {
                EngineEvent::Token { id, text, .. } => {
                    texts.entry(id).or_default().push_str(&text);
                }
                EngineEvent::Finished { id, output } => {
                    println!("[{:?}] {:?}: {}", id, output.stop_reason, texts[&id]);
                }
            }
        }
        step += 1;
    }
    Ok(())
}
