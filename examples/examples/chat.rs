//! Ask an instruct model a question through its chat template, sampling with a seed.
//!
//! cargo run --release -p zoo-examples --example chat -- SmolLM2-135M-Instruct.Q4_1.gguf "What is the capital of France?"

use anyhow::{Context, Result};
use zoo_runtime::device_map::DeviceMap;
use zoo_runtime::DType;
use zoo_transformers::{AutoModelForCausalLM, GenerationOptions, Message};

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let model_path = args.next().context("usage: chat MODEL [QUESTION]")?;
    let question = args
        .next()
        .unwrap_or_else(|| "What is the capital of France?".to_string());

    let model = AutoModelForCausalLM::builder(&model_path)
        .device_map(DeviceMap::Cpu)
        .dtype(DType::F32)
        .progress(true)
        .load()?;
    let prompt = model.apply_chat_template(&[
        Message::new("system", "You are a concise assistant."),
        Message::new("user", question),
    ])?;
    // Start from the model's generation_config.json, then sample with a fixed seed.
    let opts = GenerationOptions {
        do_sample: true,
        temperature: 0.7,
        top_p: Some(0.9),
        seed: 42,
        max_new_tokens: 128,
        stop_strings: vec!["\n\n".into()],
        ..model.default_options()
    };
    let (answer, _) = model.generate_stream(&prompt, true, &opts, |piece| print!("{piece}"))?;
    println!(
        "\n[{:?} after {} tokens]",
        answer.stop_reason,
        answer.token_ids.len()
    );
    Ok(())
}
