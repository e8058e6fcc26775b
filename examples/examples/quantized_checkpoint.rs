//! Load a pre-quantized checkpoint (compressed-tensors, as llm-compressor saves W4A16, W8A16
//! or FP8 models) and greedily continue a prompt, reporting how its weights are held.
//!
//! cargo run --release -p zoo-examples --example quantized_checkpoint -- MODEL "Once upon a time"
//!
//! Without a dtype, int4/int8 weights whose scales are exact in f16 stay quantized as GGUF
//! blocks and products compute in f32 from them (as for a GGUF file); other schemes are
//! dequantized at load. Pass a dtype (`.dtype(DType::BF16)`) to dequantize everything.

use anyhow::{Context, Result};
use zoo_runtime::device_map::DeviceMap;
use zoo_transformers::{AutoModelForCausalLM, GenerationOptions};

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let model_path = args
        .next()
        .context("usage: quantized_checkpoint MODEL [PROMPT]")?;
    let prompt = args
        .next()
        .unwrap_or_else(|| "Once upon a time".to_string());

    let model = AutoModelForCausalLM::builder(&model_path)
        .device_map(DeviceMap::Cpu)
        .progress(true)
        .load()?;
    let report = model.load_report();
    eprintln!(
        "{:.1} MiB of weights resident{}",
        report.weight_bytes as f64 / (1 << 20) as f64,
        if report.blocks_kept {
            ", quantized weights kept as blocks"
        } else {
            ", dequantized"
        }
    );
    let text = model.generate_text(&prompt, &GenerationOptions::greedy(32))?;
    println!("{prompt}{text}");
    Ok(())
}
