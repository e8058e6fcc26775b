//! Load a causal LM and stream a greedy continuation of a prompt that repeats no trigram.
//!
//! cargo run --release -p zoo-examples --example generate -- MODEL "Once upon a time"
//!
//! MODEL is a folder (config.json + safetensors + tokenizer.json), a .gguf file such as
//! SmolLM2-135M-Instruct.Q4_1.gguf, or a Hub repo id.

use std::io::Write;

use anyhow::{Context, Result};
use zoo_runtime::device_map::DeviceMap;
use zoo_transformers::{AutoModelForCausalLM, GenerationOptions};

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let model_path = args.next().context("usage: generate MODEL [PROMPT]")?;
    let prompt = args
        .next()
        .unwrap_or_else(|| "Once upon a time".to_string());

    let model = AutoModelForCausalLM::load_pretrained(&model_path, DeviceMap::Cpu)?;
    // Greedy, and no three-token sequence said twice (transformers' `no_repeat_ngram_size`;
    // `bad_words_ids`, `suppress_tokens` and the sampling cutoffs are fields beside it).
    let opts = GenerationOptions {
        no_repeat_ngram_size: 3,
        ..GenerationOptions::greedy(64)
    };

    print!("{prompt}");
    let (out, stats) = model.generate_stream(&prompt, false, &opts, |piece| {
        print!("{piece}");
        let _ = std::io::stdout().flush();
    })?;
    println!();
    eprintln!(
        "{} tokens, first after {:.2}s, then {:.1} tok/s ({:?})",
        out.token_ids.len(),
        stats.time_to_first_token,
        stats.decode_tokens_per_second(),
        out.stop_reason
    );
    Ok(())
}
