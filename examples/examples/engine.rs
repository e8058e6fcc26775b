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
    // Two sequences at once, each up to 512 tokens (prompt and generation). On the CPU they
    // share a paged KV cache: 40 blocks of 16 tokens here, fewer than two full sequences
    // need, so the later one is preempted (and resumed) if both grow that long. Prompts that
    // start alike share their cached blocks. A step feeds at most 64 tokens: a longer prompt
    // joins in chunks while the running sequence keeps getting a token per step.
    let mut config = EngineConfig::new(2, 512);
    config.kv_blocks = Some(40);
    config.max_step_tokens = Some(64);
    let mut engine = model.engine(config)?;
    engine.set_prefix_caching(true)?;

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
    if let Some((_, total)) = engine.kv_blocks() {
        let (hits, tokens) = engine.prefix_hits();
        println!(
            "{total} KV blocks; {} preemption(s); {hits} prompt(s) reused {tokens} cached tokens",
            engine.preemptions()
        );
    }
    Ok(())
}
