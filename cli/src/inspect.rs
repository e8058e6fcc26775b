//! `zoo inspect`: what a model is made of, from headers alone.

use std::fmt::Write as _;

use anyhow::Result;
use zoo_hub::{Pretrained, Source};
use zoo_runtime::device_map::human;

/// Show a model's resolved files, its config's architecture and key fields, and every tensor
/// (name, dtype, shape, bytes) with totals per dtype. Reads headers only: inspecting a 100 GB
/// checkpoint takes milliseconds.
///
/// Examples:
///   zoo inspect ./all-MiniLM-L6-v2
///   zoo inspect SmolLM2-135M-Instruct.Q4_1.gguf
///   zoo inspect Qwen/Qwen3-0.6B@main
///   zoo inspect stabilityai/sd-turbo --component unet --variant fp16
#[derive(clap::Args)]
#[command(verbatim_doc_comment)]
pub struct Args {
    /// Folder, .safetensors/.gguf file, or Hub repo id `org/name[@revision]`.
    model: String,
    /// Revision (branch, tag or commit) of a Hub repo; overrides `@revision`.
    #[arg(long)]
    revision: Option<String>,
    /// A diffusers pipeline component (subfolder), e.g. `unet`, `vae`, `text_encoder`.
    #[arg(long)]
    component: Option<String>,
    /// A weights variant, e.g. `fp16` for `model.fp16.safetensors`.
    #[arg(long)]
    variant: Option<String>,
    /// Print at most this many tensors (totals always cover all of them).
    #[arg(long)]
    limit: Option<usize>,
}

pub fn run(args: Args) -> Result<()> {
    let mut source = Source::parse(&args.model)?;
    if let Some(rev) = &args.revision {
        source = source.with_revision(rev)?;
    }
    let root = Pretrained::from_files(zoo_hub::ModelFiles::new(source.clone()))
        .with_variant(args.variant.as_deref())?;
    let model = match &args.component {
        Some(c) => root.component(c)?,
        None => root.clone(),
    };
    let mut out = String::new();
    writeln!(out, "model: {source}")?;

    if args.component.is_none() {
        if let Some(index) = root.model_index()? {
            writeln!(
                out,
                "pipeline: {} (diffusers {})",
                index.class_name,
                index.diffusers_version.as_deref().unwrap_or("?")
            )?;
            for (name, (lib, class)) in &index.components {
                writeln!(out, "  {name:<20} {lib}.{class}")?;
            }
            writeln!(out, "inspect a component with --component NAME")?;
            out!("{out}");
            return Ok(());
        }
    }

    let checkpoint = model.checkpoint()?;
    writeln!(out, "format: {:?}", checkpoint.format)?;
    writeln!(out, "files:")?;
    if let Some(index) = &checkpoint.index {
        writeln!(out, "  {}", index.display())?;
    }
    for f in &checkpoint.files {
        let len = std::fs::metadata(f).map(|m| m.len()).unwrap_or(0);
        writeln!(out, "  {} ({})", f.display(), human(len))?;
    }

    match model.config() {
        Ok(config) => {
            writeln!(out, "config: {}", config.path.display())?;
            writeln!(out, "  architectures: {}", config.architectures.join(", "))?;
            writeln!(
                out,
                "  model_type: {}",
                config.model_type.as_deref().unwrap_or("-")
            )?;
            let v = config.to_value();
            for key in [
                "torch_dtype",
                "vocab_size",
                "hidden_size",
                "intermediate_size",
                "num_hidden_layers",
                "num_attention_heads",
                "num_key_value_heads",
                "head_dim",
                "max_position_embeddings",
                "hidden_act",
                "tie_word_embeddings",
                "_class_name",
                "in_channels",
                "out_channels",
                "sample_size",
            ] {
                match v.get(key) {
                    None | Some(serde_json::Value::Null) => {}
                    Some(serde_json::Value::String(s)) => writeln!(out, "  {key}: {s}")?,
                    Some(val) => writeln!(out, "  {key}: {val}")?,
                }
            }
            if let Some(rope) = config.rope()? {
                writeln!(out, "  rope: {rope:?}")?;
            }
            if let Some(q) = v.get("quantization_config").filter(|q| !q.is_null()) {
                writeln!(out, "  quantization: {}", quantization(q))?;
            }
        }
        Err(zoo_hub::HubError::NotFound { .. }) => writeln!(out, "config: none found")?,
        Err(e) => return Err(e.into()),
    }

    let inv = &checkpoint.inventory;
    writeln!(out, "tensors: {}", inv.len())?;
    let name_w = inv
        .tensors()
        .iter()
        .map(|t| t.name.len())
        .max()
        .unwrap_or(4)
        .min(72);
    writeln!(
        out,
        "  {:<name_w$}  {:<7} {:<20} {:>12}",
        "name", "dtype", "shape", "bytes"
    )?;
    for t in inv.tensors().iter().take(args.limit.unwrap_or(usize::MAX)) {
        writeln!(
            out,
            "  {:<name_w$}  {:<7} {:<20} {:>12}",
            t.name,
            t.dtype.name(),
            format!("{:?}", t.shape),
            t.nbytes
        )?;
    }
    if let Some(limit) = args.limit.filter(|&l| l < inv.len()) {
        writeln!(
            out,
            "  ... {} more (drop --limit to see all)",
            inv.len() - limit
        )?;
    }
    writeln!(out, "totals:")?;
    for (dtype, (count, bytes)) in inv.totals_by_dtype() {
        writeln!(out, "  {dtype:<7} {count:>6} tensors {:>12}", human(bytes))?;
    }
    let params: usize = inv.tensors().iter().map(|t| t.numel()).sum();
    writeln!(
        out,
        "  all     {:>6} tensors {:>12}  ({} parameters)",
        inv.len(),
        human(inv.total_bytes()),
        params
    )?;
    out!("{out}");
    Ok(())
}

/// One line on a `quantization_config`: the method, then each compressed-tensors group's
/// weight scheme (`int4 group 128 symmetric`), or whatever else the method names.
fn quantization(q: &serde_json::Value) -> String {
    use serde_json::Value;
    let text = |v: Option<&Value>| v.and_then(Value::as_str).unwrap_or("?").to_string();
    let method = text(q.get("quant_method"));
    if method == "fp8" {
        let blocks = match q.get("weight_block_size") {
            Some(b) if !b.is_null() => format!("a scale per {b} block"),
            _ => "one scale per tensor".into(),
        };
        return format!(
            "fp8 {} weights, {blocks}; activations {} (zoo runs them unquantized, as \
             transformers does on the CPU)",
            q.get("fmt").and_then(Value::as_str).unwrap_or("e4m3"),
            text(q.get("activation_scheme")),
        );
    }
    let Some(groups) = q.get("config_groups").and_then(Value::as_object) else {
        let bits = q.get("bits").and_then(Value::as_u64);
        let group = q.get("group_size").and_then(Value::as_i64);
        return match (bits, group) {
            (Some(b), Some(g)) => format!("{method}, {b}-bit, groups of {g} (not applied by zoo)"),
            _ => format!("{method} (not applied by zoo)"),
        };
    };
    let schemes: Vec<String> = groups
        .values()
        .map(|g| {
            let w = g.get("weights").cloned().unwrap_or(Value::Null);
            let bits = w.get("num_bits").and_then(Value::as_u64).unwrap_or(0);
            let kind = text(w.get("type"));
            let strategy = text(w.get("strategy"));
            let span = match w.get("group_size").and_then(Value::as_u64) {
                Some(n) if strategy == "group" => format!(" of {n}"),
                _ => String::new(),
            };
            let sym = if w.get("symmetric").and_then(Value::as_bool) == Some(false) {
                "asymmetric"
            } else {
                "symmetric"
            };
            let acts = if g.get("input_activations").is_some_and(|a| !a.is_null()) {
                ", activations quantized"
            } else {
                ""
            };
            format!("{kind}{bits} {strategy}{span} {sym}{acts}")
        })
        .collect();
    let format = q
        .get("format")
        .and_then(Value::as_str)
        .map(|f| format!(" {f}"))
        .unwrap_or_default();
    format!("{method}{format}: {}", schemes.join("; "))
}
