//! Load an encoder-decoder (T5, flan-t5, UMT5) and stream what it generates for a prompt:
//! the prompt goes to the encoder, the decoder writes the answer.
//!
//! cargo run --release -p zoo-examples --example translate -- MODEL "translate English to German: How old are you?"
//!
//! MODEL is a folder (config.json + safetensors + tokenizer.json) of a
//! `T5ForConditionalGeneration` / `UMT5ForConditionalGeneration`, or a Hub repo id such as
//! google/flan-t5-small.

use std::io::Write;

use anyhow::{Context, Result};
use zoo_runtime::device_map::DeviceMap;
use zoo_transformers::{AutoModelForSeq2SeqLM, GenerationOptions};

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let model_path = args.next().context("usage: translate MODEL [PROMPT]")?;
    let prompt = args
        .next()
        .unwrap_or_else(|| "translate English to German: How old are you?".to_string());

    let model = AutoModelForSeq2SeqLM::load_pretrained(&model_path, DeviceMap::Cpu)?;
    let opts = GenerationOptions::greedy(32);

    let (out, stats) = model.generate_stream(&prompt, &opts, |piece| {
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
