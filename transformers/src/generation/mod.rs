//! Token generation, as transformers' `generate` does it: greedy and sampled decoding with its
//! logits processors, eos and stop-string stopping, streaming.
//!
//! - `options`: what a generation is asked (`GenerationConfig`'s fields) and returns.
//! - `processors`: the logits-processor chain on the host; `device_sampler`: the same chain
//!   as tensor ops, so a compiled decode step returns token ids.
//! - `engine`: the running set of sequences every client drives; sequences join and leave
//!   between steps, each with its own options, processors, stop strings and cache row;
//!   `blocks`: the block pool of its paged cache (free, shared and cached blocks).
//!
//! [`generate`] and [`generate_seq2seq`] run one batch through an engine sized to it.

mod blocks;
mod device_sampler;
pub mod engine;
mod options;
mod processors;

use zoo_runtime::{Device, Tensor};

pub use engine::{Engine, EngineConfig, EngineEvent, SequenceId, BLOCK_SIZE};
pub use options::{GenerationOptions, GenerationOutput, GenerationStats, StopReason, TokenEvent};

use crate::cache::KvCache;
use crate::kinds::{CausalLm, EncoderArgs, ForwardArgs, LogitsFor, Seq2SeqLm};
use crate::{Error, Result};

/// Generates for a batch of prompts (ids), left-padding them to one length with `pad_id`.
/// `eos_ids` are used when `opts.eos_token_ids` is `None`. `on_token` sees every token as it
/// comes and returns `false` to stop all rows.
pub fn generate(
    model: &dyn CausalLm,
    tokenizer: Option<&crate::Tokenizer>,
    prompts: &[Vec<u32>],
    opts: &GenerationOptions,
    eos_ids: &[u32],
    pad_id: u32,
    on_token: impl FnMut(TokenEvent<'_>) -> bool,
) -> Result<(Vec<GenerationOutput>, GenerationStats)> {
    let embeds = vec![None; prompts.len()];
    generate_embedded(
        model,
        tokenizer,
        prompts,
        embeds,
        opts,
        (eos_ids, pad_id),
        on_token,
    )
}

/// [`generate`] where a prompt's positions may take the first layer's input from its
/// `embeds` (`[prompt, hidden]`; a vision-language prompt's image features in place).
pub fn generate_embedded(
    model: &dyn CausalLm,
    tokenizer: Option<&crate::Tokenizer>,
    prompts: &[Vec<u32>],
    embeds: Vec<Option<Tensor>>,
    opts: &GenerationOptions,
    (eos_ids, pad_id): (&[u32], u32),
    on_token: impl FnMut(TokenEvent<'_>) -> bool,
) -> Result<(Vec<GenerationOutput>, GenerationStats)> {
    let started = std::time::Instant::now();
    check_request(tokenizer, prompts, opts, model.model().vocab_size())?;
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
    // On compiled devices every distinct shape is a compile: prompts are padded to a few
    // lengths and the cache to a few capacities.
    let capacity = if model.logits_device().is_eager() {
        longest.saturating_add(opts.max_new_tokens)
    } else {
        cache_bucket(prompt_bucket(longest).saturating_add(opts.max_new_tokens))
    };
    let config = EngineConfig::new(prompts.len(), capacity);
    let mut engine = Engine::new(model, tokenizer, eos_ids, pad_id, config)?;
    let ids = engine.add_batch_with_embeds(prompts.to_vec(), embeds, opts.clone())?;
    run(
        &mut engine,
        &ids,
        started,
        prompts.len() * longest,
        on_token,
    )
}

/// Steps `engine` until the sequences `ids` (its every sequence) end, handing each token to
/// `on_token` (its `row` the index in `ids`); a `false` cancels every sequence after the
/// step.
fn run(
    engine: &mut Engine<'_>,
    ids: &[SequenceId],
    started: std::time::Instant,
    prompt_tokens: usize,
    mut on_token: impl FnMut(TokenEvent<'_>) -> bool,
) -> Result<(Vec<GenerationOutput>, GenerationStats)> {
    let mut outputs: Vec<Option<GenerationOutput>> = vec![None; ids.len()];
    let row = |id: SequenceId| ids.iter().position(|&i| i == id);
    let mut stats = GenerationStats {
        prompt_tokens,
        ..Default::default()
    };
    let mut steps = 0usize;
    let mut decode_started = None;
    while !engine.is_idle() {
        let mut cancelled = false;
        for event in engine.step()? {
            match event {
                EngineEvent::Token { id, token_id, text } => {
                    let Some(row) = row(id) else { continue };
                    if !on_token(TokenEvent {
                        row,
                        token_id,
                        text: &text,
                    }) {
                        cancelled = true;
                    }
                }
                EngineEvent::Finished { id, output } => {
                    if let Some(row) = row(id) {
                        outputs[row] = Some(output);
                    }
                }
            }
        }
        steps += 1;
        if steps == 1 {
            stats.time_to_first_token = started.elapsed().as_secs_f64();
            decode_started = Some(std::time::Instant::now());
        }
        if cancelled {
            for (i, &id) in ids.iter().enumerate() {
                if let Some(output) = engine.cancel(id)? {
                    outputs[i] = Some(output);
                }
            }
            break;
        }
    }
    if let Some(t) = decode_started {
        stats.decode_seconds = t.elapsed().as_secs_f64();
    }
    stats.decode_steps = steps.saturating_sub(1);
    outputs
        .into_iter()
        .map(|o| o.ok_or_else(|| Error::Internal("a sequence ended without its output".into())))
        .collect::<Result<Vec<_>>>()
        .map(|o| (o, stats))
}

/// Refuses what no model can generate from: bad options, no or empty prompts, ids outside
/// the vocabulary, stop strings without a tokenizer.
fn check_request(
    tokenizer: Option<&crate::Tokenizer>,
    prompts: &[Vec<u32>],
    opts: &GenerationOptions,
    vocab: usize,
) -> Result<()> {
    opts.validate()?;
    if prompts.is_empty() {
        return Err(Error::invalid("prompts", "no prompts given".into()));
    }
    if let Some(i) = prompts.iter().position(Vec::is_empty) {
        return Err(Error::invalid("prompt", format!(
            "prompt {i} is empty; give at least one token (a plain text prompt gets a BOS token when the tokenizer adds one)"
        )));
    }
    if !opts.stop_strings.is_empty() && tokenizer.is_none() {
        return Err(Error::invalid(
            "stop_strings",
            "stop strings need a tokenizer to read the generated text".into(),
        ));
    }
    if let Some(&bad) = prompts.iter().flatten().find(|&&id| id as usize >= vocab) {
        return Err(Error::invalid(
            "prompt",
            format!("prompt token id {bad} is outside the vocabulary of {vocab} ids"),
        ));
    }
    if let Some(&bad) = opts
        .bad_words_ids
        .iter()
        .flatten()
        .find(|&&id| id as usize >= vocab)
    {
        return Err(Error::invalid(
            "bad_words_ids",
            format!("bad_words_ids holds token id {bad}, outside the vocabulary of {vocab} ids"),
        ));
    }
    Ok(())
}

/// Generates with an encoder-decoder (T5) for a batch of prompts: the encoder reads each
/// prompt once (right-padded with `pad_id` to one length, masked), then the decoder
/// generates from `decoder_start_token_id` with its self-attention cache and the encoder's
/// keys and values, as transformers' `generate` does for `AutoModelForSeq2SeqLM`. The
/// options, eos ids and callback are those of [`generate`]; `token_ids` excludes the start
/// token.
#[allow(clippy::too_many_arguments)]
pub fn generate_seq2seq(
    model: &dyn Seq2SeqLm,
    tokenizer: Option<&crate::Tokenizer>,
    prompts: &[Vec<u32>],
    opts: &GenerationOptions,
    eos_ids: &[u32],
    pad_id: u32,
    decoder_start_token_id: u32,
    on_token: impl FnMut(TokenEvent<'_>) -> bool,
) -> Result<(Vec<GenerationOutput>, GenerationStats)> {
    let vocab = model.vocab_size();
    check_request(tokenizer, prompts, opts, vocab)?;
    if decoder_start_token_id as usize >= vocab {
        return Err(Error::invalid("decoder_start_token_id", format!(
            "decoder_start_token_id {decoder_start_token_id} is outside the vocabulary of {vocab} ids"
        )));
    }
    let started = std::time::Instant::now();
    let batch = prompts.len();
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
    // On compiled devices the encoder's input is padded to a few lengths and the decoder's
    // cache to a few capacities, so that few programs compile (see `generate`).
    let compiled = !model.logits_device().is_eager();
    let (padded, capacity) = if compiled {
        (
            prompt_bucket(longest),
            cache_bucket(opts.max_new_tokens.saturating_add(1)),
        )
    } else {
        (longest, opts.max_new_tokens.saturating_add(1))
    };
    let mut ids = Vec::with_capacity(batch * padded);
    let mut real = Vec::with_capacity(batch * padded);
    for p in prompts {
        let pad = padded - p.len();
        ids.extend(
            p.iter()
                .map(|&t| t as i64)
                // Masked out: any id in the vocabulary serves (see `Engine`).
                .chain(std::iter::repeat_n(
                    if (pad_id as usize) < vocab {
                        pad_id as i64
                    } else {
                        0
                    },
                    pad,
                )),
        );
        real.extend(std::iter::repeat_n(1i64, p.len()).chain(std::iter::repeat_n(0, pad)));
    }
    // The mask stays on the host: the model reads it back to build its additive form.
    let host = Device::Cpu;
    let input = Tensor::from_vec(ids, &[batch, padded], &model.device())?;
    let mask = Tensor::from_vec(real, &[batch, padded], &host)?;
    let encoded = model.encode(EncoderArgs {
        input_ids: &input,
        attention_mask: Some(&mask),
        token_type_ids: None,
        position_ids: None,
        output_hidden_states: false,
    })?;
    let config = EngineConfig::new(batch, capacity);
    let hidden = encoded.last_hidden_state;
    let mut engine = Engine::seq2seq(model, tokenizer, eos_ids, pad_id, config, hidden, mask)?;
    // Every row's decoder starts from the start token; its processors see it as the context.
    let contexts = vec![vec![decoder_start_token_id]; batch];
    let ids = engine.add_with_contexts(
        prompts.to_vec(),
        contexts,
        vec![None; prompts.len()],
        opts.clone(),
    )?;
    run(&mut engine, &ids, started, batch * longest, on_token)
}

/// Every token a batch has fed a decoder so far, per row: ids, positions and which are real
/// (left padding is not), for a step that must run the whole sequence again.
#[derive(Clone, Debug)]
pub struct DecodeHistory {
    ids: Vec<Vec<i64>>,
    positions: Vec<Vec<i64>>,
    real: Vec<Vec<bool>>,
    /// Padding columns beyond the longest prompt (compiled devices pad prompts to a bucket),
    /// which transformers' sequence length does not count.
    bucket_padding: usize,
}

impl DecodeHistory {
    /// The prompt batch: row-major `ids` and `positions` of `len` columns, `real` per row,
    /// of which `bucket_padding` leading columns pad past the longest prompt.
    pub fn new(
        ids: &[i64],
        positions: &[i64],
        real: &[Vec<bool>],
        len: usize,
        bucket_padding: usize,
    ) -> DecodeHistory {
        DecodeHistory {
            ids: ids.chunks(len.max(1)).map(<[i64]>::to_vec).collect(),
            positions: positions.chunks(len.max(1)).map(<[i64]>::to_vec).collect(),
            real: real.to_vec(),
            bucket_padding,
        }
    }

    /// Appends one token per row at `positions`.
    pub fn push(&mut self, ids: &[i64], positions: &[i64]) {
        for (b, (&id, &p)) in ids.iter().zip(positions).enumerate() {
            self.ids[b].push(id);
            self.positions[b].push(p);
            self.real[b].push(true);
        }
    }

    fn tensors(&self, last: bool, device: &zoo_runtime::Device) -> Result<(Tensor, Tensor)> {
        let b = self.ids.len();
        let pick = |rows: &[Vec<i64>]| -> Vec<i64> {
            if last {
                rows.iter().map(|r| *r.last().unwrap_or(&0)).collect()
            } else {
                rows.concat()
            }
        };
        let t = if last { 1 } else { self.ids[0].len() };
        Ok((
            Tensor::from_vec(pick(&self.ids), &[b, t], device)?,
            Tensor::from_vec(pick(&self.positions), &[b, t], device)?,
        ))
    }
}

/// The logits of the next decode step, whose tokens [`DecodeHistory::push`] added last: one
/// token per row through `cache`, or, when the model asks for it at this cache length
/// (Phi-3 passing its longrope switch), the whole sequence again from an emptied cache, as
/// transformers' `generate` does there.
pub fn decode_step(
    model: &dyn CausalLm,
    cache: &mut KvCache,
    history: &DecodeHistory,
) -> Result<Tensor> {
    let device = model.model().device();
    let seen = cache.len().saturating_sub(history.bucket_padding);
    let again = model.model().recompute_cache_at() == Some(seen);
    if again {
        cache.reset();
    }
    let (input, positions) = history.tensors(!again, &device)?;
    let args = ForwardArgs {
        input_ids: &input,
        position_ids: &positions,
        attention_mask: again.then_some(history.real.as_slice()),
        output_hidden_states: false,
        inputs_embeds: None,
    };
    Ok(model.forward(args, cache, LogitsFor::Last)?.0)
}

/// The padded prompt length on compiled devices: powers of two from 16 to 512, then
/// multiples of 512, so a handful of prefill programs serve every prompt.
pub fn prompt_bucket(len: usize) -> usize {
    if len <= 512 {
        len.next_power_of_two().max(16)
    } else {
        len.div_ceil(512) * 512
    }
}

/// The KV-cache capacity on compiled devices: a multiple of 256 slots, so decode programs are
/// shared by calls whose prompt and `max_new_tokens` differ a little.
pub fn cache_bucket(slots: usize) -> usize {
    slots.div_ceil(256).max(1).saturating_mul(256)
}
