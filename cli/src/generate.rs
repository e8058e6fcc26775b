//! `zoo generate`: load a causal LM (or an encoder-decoder such as T5) and stream what it
//! generates from a prompt.

use std::io::Write;

use anyhow::{bail, Context, Result};
use zoo_transformers::auto::LoadReport;
use zoo_transformers::generation::{GenerationOptions, GenerationOutput, GenerationStats};
use zoo_transformers::registry::Loaders;
use zoo_transformers::{AutoConfig, AutoModelForCausalLM, AutoModelForSeq2SeqLM, Message};

use crate::load::{with_load_options, LoadArgs};

/// Generate text with a causal language model (the families below, and GGUF files of the
/// llama architecture such as SmolLM2), streaming it as it is produced, then print the load
/// time, the time to first token and the decode speed.
///
/// Encoder-decoders (T5ForConditionalGeneration, UMT5ForConditionalGeneration, e.g.
/// flan-t5) run too: the prompt goes to the encoder, and the decoder generates from
/// decoder_start_token_id, as transformers' text2text pipeline does.
///
/// Decoding is greedy unless a sampling option (--temperature, --top-k, --top-p, --min-p,
/// --typical-p, --epsilon-cutoff, --eta-cutoff) is given; defaults not given on the command
/// line come from the model's generation_config.json (its no_repeat_ngram_size, bad_words_ids
/// and suppress_tokens included), then transformers' defaults (top-k 50 when sampling).
/// Generation stops at the model's eos token(s), at a --stop string, or after --max-new-tokens.
///
/// Vision-language models (LlavaForConditionalGeneration) read images: --image PATH
/// (repeatable) with --chat puts the images before the message, as the chat template writes
/// them; without --chat the prompt holds one image placeholder (e.g. `<image>`) per image.
///
/// Examples:
///   zoo generate ./SmolLM2-135M-Instruct.Q4_1.gguf "What is the capital of France?" --chat
///   zoo generate HuggingFaceTB/SmolLM2-135M-Instruct "Once upon a time" --max-new-tokens 64
///   zoo generate ./qwen3-folder "Write a haiku about Rust" --chat --system "You are terse." \
///       --temperature 0.7 --top-p 0.9 --seed 42
///   zoo generate model.safetensors "def fib(n):" --dtype bf16 --stop "\n\n"
///   zoo generate google/flan-t5-small "translate English to German: How old are you?"
///   zoo generate llava-hf/llava-1.5-7b-hf "What is shown here?" --chat --image cat.png
#[derive(clap::Args)]
#[command(verbatim_doc_comment, after_help = zoo_transformers::registry::families_help(true))]
pub struct Args {
    /// Folder (config.json + safetensors), .safetensors/.gguf file, or Hub repo id `org/name[@revision]`.
    model: String,
    /// The prompt. With --chat it is the user's message.
    prompt: String,
    /// Wrap the prompt in the model's chat template (as a user message) before generating.
    #[arg(long)]
    chat: bool,
    /// A system message for --chat.
    #[arg(long, requires = "chat")]
    system: Option<String>,
    /// An image for a vision-language model (repeatable; PNG, JPEG, ...), in the order the
    /// prompt's image placeholders take them.
    #[arg(long = "image", value_name = "PATH")]
    images: Vec<std::path::PathBuf>,
    #[command(flatten)]
    load: LoadArgs,
    /// Most tokens to generate (default: generation_config.json's); capped at what the
    /// model's context leaves after the prompt, with a note.
    #[arg(long)]
    max_new_tokens: Option<usize>,
    /// Fewest tokens to generate (eos is suppressed until then).
    #[arg(long)]
    min_new_tokens: Option<usize>,
    /// Sampling temperature (> 0); turns sampling on.
    #[arg(long)]
    temperature: Option<f64>,
    /// Sample among the k most likely tokens (0 keeps all; default 50); turns sampling on.
    #[arg(long)]
    top_k: Option<usize>,
    /// Nucleus sampling mass in (0, 1]; turns sampling on.
    #[arg(long)]
    top_p: Option<f64>,
    /// Drop tokens below this fraction of the top probability; turns sampling on.
    #[arg(long)]
    min_p: Option<f64>,
    /// Typical decoding mass in (0, 1]: keep the tokens closest to the expected information;
    /// turns sampling on.
    #[arg(long)]
    typical_p: Option<f64>,
    /// Drop tokens less likely than this probability, in (0, 1); turns sampling on.
    #[arg(long)]
    epsilon_cutoff: Option<f64>,
    /// Eta sampling cutoff in (0, 1) (scaled down for flat distributions); turns sampling on.
    #[arg(long)]
    eta_cutoff: Option<f64>,
    /// Penalise tokens already present (> 1 discourages repeats).
    #[arg(long)]
    repetition_penalty: Option<f64>,
    /// Never repeat an n-gram of this many tokens (prompt included; 0 = off).
    #[arg(long)]
    no_repeat_ngram_size: Option<usize>,
    /// Seed of the sampler.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Stop once the generated text contains this string (repeatable).
    #[arg(long)]
    stop: Vec<String>,
    /// Force greedy decoding even if generation_config.json asks for sampling.
    #[arg(long)]
    greedy: bool,
}

pub fn run(args: Args) -> Result<()> {
    let load = args.load.parsed()?;
    // An encoder-decoder's config names its family; anything else goes to the causal path,
    // whose errors say what the checkpoint is.
    let seq2seq = AutoConfig::from_pretrained(&args.model)
        .map(|c| matches!(c.family.loaders, Loaders::Seq2Seq { .. }))
        .unwrap_or(false);
    if seq2seq {
        if !args.images.is_empty() {
            bail!(
                "--image: {} is an encoder-decoder that reads text only",
                args.model
            );
        }
        if args.chat {
            bail!(
                "--chat: {} is an encoder-decoder with no chat template; give the prompt as it is",
                args.model
            );
        }
        let builder = AutoModelForSeq2SeqLM::builder(&args.model);
        let model = with_load_options!(builder, load)
            .load()
            .with_context(|| format!("loading {}", args.model))?;
        let report = model.load_report().clone();
        print_plan(&report);
        note_beams(model.generation_config());
        let opts = options(&args, model.default_options());
        let mut sink = Sink::default();
        let (out, stats) = model.generate_stream(&args.prompt, &opts, |piece| sink.write(piece))?;
        sink.finish()?;
        outln!();
        print_summary(&model.config().architecture, &report, &out, &stats);
        return Ok(());
    }
    let builder = AutoModelForCausalLM::builder(&args.model);
    let model = with_load_options!(builder, load)
        .load()
        .with_context(|| format!("loading {}", args.model))?;
    let report = model.load_report().clone();
    print_plan(&report);
    note_beams(model.generation_config());
    let mut opts = options(&args, model.default_options());
    let prompt = if args.chat {
        let mut messages = Vec::new();
        if let Some(s) = &args.system {
            messages.push(Message::new("system", s));
        }
        messages.push(Message::new("user", &args.prompt).with_images(args.images.len()));
        model.apply_chat_template(&messages)?
    } else {
        args.prompt.clone()
    };

    let mut sink = Sink::default();
    let (out, stats) = if args.images.is_empty() {
        cap_to_context(&model, &prompt, args.chat, &mut opts)?;
        model.generate_stream(&prompt, args.chat, &opts, |piece| sink.write(piece))?
    } else {
        let images = zoo_transformers::vision::open_images(&args.images)?;
        model
            .generate_with_images(&prompt, &images, &opts, |piece| sink.write(piece))
            .with_context(|| format!("generating from {} image(s)", images.len()))?
    };
    sink.finish()?;
    outln!();
    print_summary(&model.config().architecture, &report, &out, &stats);
    Ok(())
}

/// Streams text to stdout as it comes, keeping the first failed write (a full disk, a closed
/// pipe) for [`Sink::finish`] to return: the command then fails instead of claiming success.
#[derive(Default)]
struct Sink {
    failed: Option<std::io::Error>,
}

impl Sink {
    fn write(&mut self, piece: &str) {
        if self.failed.is_some() {
            return;
        }
        let mut stdout = std::io::stdout().lock();
        if let Err(e) = stdout
            .write_all(piece.as_bytes())
            .and_then(|()| stdout.flush())
        {
            self.failed = Some(e);
        }
    }

    fn finish(self) -> Result<()> {
        match self.failed {
            Some(e) => Err(crate::stdout_failed(e)),
            None => Ok(()),
        }
    }
}

/// Caps the new tokens at what the model's context leaves after the prompt (a model built to
/// stretch its context is left alone), saying so: the KV cache is sized from prompt and new
/// tokens, so an absurd `--max-new-tokens` would otherwise ask memory for them all.
fn cap_to_context(
    model: &zoo_transformers::TextGenerator,
    prompt: &str,
    chat: bool,
    opts: &mut GenerationOptions,
) -> Result<()> {
    let decoder = model.model().model();
    let context = decoder.max_position_embeddings();
    if decoder.stretches_context() {
        return Ok(());
    }
    let prompt_len = model.encode(prompt, chat)?.len();
    let room = context.saturating_sub(prompt_len).max(1);
    if opts.max_new_tokens > room {
        eprintln!(
            "note: --max-new-tokens {} capped at {room}: the prompt's {prompt_len} tokens and the model's context of {context} (max_position_embeddings)",
            opts.max_new_tokens
        );
        opts.max_new_tokens = room;
        opts.min_new_tokens = opts.min_new_tokens.min(room);
    }
    Ok(())
}

/// The load's note and device plan, when it has them.
fn print_plan(report: &LoadReport) {
    if let Some(note) = &report.note {
        eprintln!("{note}");
    }
    if let Some(plan) = &report.plan {
        eprint!("{plan}");
    }
}

/// Says so when the model's generation_config.json asks for beam search, which zoo does not
/// run: it decodes one sequence per prompt.
fn note_beams(config: Option<&zoo_hub::GenerationConfig>) {
    if let Some(n) = config.and_then(|g| g.num_beams).filter(|&n| n > 1) {
        eprintln!(
            "note: generation_config.json asks for beam search (num_beams = {n}); zoo decodes one sequence per prompt (greedy or sampled), as transformers does with num_beams=1"
        );
    }
}

/// The model's defaults with the command line's options over them.
fn options(args: &Args, mut opts: GenerationOptions) -> GenerationOptions {
    if let Some(n) = args.max_new_tokens {
        opts.max_new_tokens = n;
    }
    if let Some(n) = args.min_new_tokens {
        opts.min_new_tokens = n;
    }
    let sampling = args.temperature.is_some()
        || args.top_k.is_some()
        || args.top_p.is_some()
        || args.min_p.is_some()
        || args.typical_p.is_some()
        || args.epsilon_cutoff.is_some()
        || args.eta_cutoff.is_some();
    if sampling {
        opts.do_sample = true;
    }
    if args.greedy {
        opts.do_sample = false;
    }
    if let Some(t) = args.temperature {
        opts.temperature = t;
    }
    if let Some(k) = args.top_k {
        // As in transformers, top-k 0 keeps every token.
        opts.top_k = (k > 0).then_some(k);
    }
    opts.top_p = args.top_p.or(opts.top_p);
    opts.min_p = args.min_p.or(opts.min_p);
    opts.typical_p = args.typical_p.or(opts.typical_p);
    opts.epsilon_cutoff = args.epsilon_cutoff.or(opts.epsilon_cutoff);
    opts.eta_cutoff = args.eta_cutoff.or(opts.eta_cutoff);
    opts.repetition_penalty = args.repetition_penalty.or(opts.repetition_penalty);
    if let Some(n) = args.no_repeat_ngram_size {
        opts.no_repeat_ngram_size = n;
    }
    opts.seed = args.seed;
    opts.stop_strings = args.stop.iter().map(|s| s.replace("\\n", "\n")).collect();
    opts
}

/// Devices, dtype, load time, prompt length, time to first token and decode speed.
fn print_summary(
    architecture: &str,
    report: &LoadReport,
    out: &GenerationOutput,
    stats: &GenerationStats,
) {
    eprintln!(
        "\n{} on {} in {}: load {:.2}s, prompt {} tokens, time to first token {:.3}s, {} tokens, decode {:.1} tok/s ({:?})",
        architecture,
        report
            .devices
            .iter()
            .map(|d| d.to_string())
            .collect::<Vec<_>>()
            .join(" → "),
        if report.blocks_kept {
            format!("{} (quantized blocks kept)", report.dtype)
        } else {
            report.dtype.to_string()
        },
        report.seconds,
        stats.prompt_tokens,
        stats.time_to_first_token,
        out.token_ids.len(),
        stats.decode_tokens_per_second(),
        out.stop_reason,
    );
}
