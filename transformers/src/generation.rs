//! Token generation: greedy and sampled decoding over a fixed-capacity KV cache, for a batch
//! of left-padded prompts, with transformers' logits processors (repetition penalty, no-repeat
//! n-grams, bad words, min new tokens, suppressed tokens; then, when sampling, temperature,
//! top-k, top-p, min-p, typical, epsilon and eta cutoffs), eos and stop-string stopping, and a
//! callback that receives each new token.

use zoo_runtime::{DType, Generator, Tensor};

use crate::cache::KvCache;
use crate::kinds::{CausalLm, EncoderArgs, ForwardArgs, LogitsFor, Seq2SeqLm};
use crate::sampling::DeviceSampler;
use crate::{Error, Result};

/// How to generate, as transformers' `GenerationConfig` spells it.
#[derive(Clone, Debug, PartialEq)]
pub struct GenerationOptions {
    /// Tokens to generate at most per prompt.
    pub max_new_tokens: usize,
    /// Eos is suppressed until this many tokens were generated.
    pub min_new_tokens: usize,
    /// Sample from the processed distribution; greedy (argmax) when false.
    pub do_sample: bool,
    /// Divides the logits before sampling (> 0).
    pub temperature: f64,
    /// Keep only the `k` most likely tokens when sampling (transformers' default is 50;
    /// `None` keeps all).
    pub top_k: Option<usize>,
    /// Keep the smallest set of most likely tokens whose probability reaches `p`, in (0, 1].
    pub top_p: Option<f64>,
    /// Drop tokens less likely than `min_p` times the most likely one, in [0, 1].
    pub min_p: Option<f64>,
    /// Divides positive (multiplies negative) logits of tokens already present (> 0; 1 = off).
    pub repetition_penalty: Option<f64>,
    /// Bans the token that would repeat an n-gram of this size already in the sequence
    /// (prompt included; 0 = off).
    pub no_repeat_ngram_size: usize,
    /// Token sequences never generated: a one-token sequence bans its token (unless it is an
    /// eos token), a longer one bans its last token right after the rest.
    pub bad_words_ids: Vec<Vec<u32>>,
    /// Tokens never generated.
    pub suppress_tokens: Vec<u32>,
    /// Tokens not generated as the first new token.
    pub begin_suppress_tokens: Vec<u32>,
    /// Typical decoding: keep the tokens whose information is closest to the distribution's
    /// entropy, up to this probability mass, in (0, 1] (sampling; 1 = off).
    pub typical_p: Option<f64>,
    /// Drop tokens less likely than this, in (0, 1) (sampling; the most likely is kept).
    pub epsilon_cutoff: Option<f64>,
    /// Eta sampling: drop tokens less likely than `min(eta, sqrt(eta) * exp(-entropy))`, in
    /// (0, 1) (sampling; the most likely is kept).
    pub eta_cutoff: Option<f64>,
    /// Seed of the sampler.
    pub seed: u64,
    /// Token ids that end a sequence; `None` takes the model's (generation_config.json, then
    /// config.json).
    pub eos_token_ids: Option<Vec<u32>>,
    /// Strings that end a sequence once its generated text contains them (kept in the output,
    /// as transformers keeps them). One that never comes lets the sequence run to
    /// `max_new_tokens`.
    pub stop_strings: Vec<String>,
}

impl Default for GenerationOptions {
    fn default() -> Self {
        GenerationOptions {
            max_new_tokens: 20,
            min_new_tokens: 0,
            do_sample: false,
            temperature: 1.0,
            top_k: Some(50),
            top_p: None,
            min_p: None,
            repetition_penalty: None,
            no_repeat_ngram_size: 0,
            bad_words_ids: Vec::new(),
            suppress_tokens: Vec::new(),
            begin_suppress_tokens: Vec::new(),
            typical_p: None,
            epsilon_cutoff: None,
            eta_cutoff: None,
            seed: 0,
            eos_token_ids: None,
            stop_strings: Vec::new(),
        }
    }
}

impl GenerationOptions {
    /// Greedy decoding of up to `max_new_tokens`.
    pub fn greedy(max_new_tokens: usize) -> GenerationOptions {
        GenerationOptions {
            max_new_tokens,
            ..Default::default()
        }
    }

    /// Starts from a model's `generation_config.json` (its sampling defaults and limits),
    /// with transformers' defaults for what it leaves out (top-k 50; `top_k: 0` turns it off).
    pub fn from_generation_config(g: &zoo_hub::GenerationConfig) -> GenerationOptions {
        let d = GenerationOptions::default();
        let cutoff = |v: Option<f64>| v.filter(|&e| e > 0.0 && e < 1.0);
        GenerationOptions {
            max_new_tokens: g.max_new_tokens.unwrap_or(d.max_new_tokens),
            min_new_tokens: g.min_new_tokens.unwrap_or(0),
            do_sample: g.do_sample.unwrap_or(false),
            temperature: g.temperature.unwrap_or(1.0),
            top_k: g.top_k.map_or(d.top_k, |k| (k > 0).then_some(k)),
            top_p: g.top_p.filter(|&p| p < 1.0),
            min_p: g.min_p,
            repetition_penalty: g.repetition_penalty.filter(|&r| r != 1.0),
            no_repeat_ngram_size: g.no_repeat_ngram_size.unwrap_or(0),
            bad_words_ids: g.bad_words_ids.clone().unwrap_or_default(),
            suppress_tokens: g.suppress_tokens.clone().unwrap_or_default(),
            begin_suppress_tokens: g.begin_suppress_tokens.clone().unwrap_or_default(),
            typical_p: g.typical_p.filter(|&p| p < 1.0),
            epsilon_cutoff: cutoff(g.epsilon_cutoff),
            eta_cutoff: cutoff(g.eta_cutoff),
            ..d
        }
    }

    /// Whether a processor that only the host implements is on (the device sampler of a
    /// compiled model then hands the logits to the host each step).
    pub(crate) fn needs_host_processors(&self) -> bool {
        self.no_repeat_ngram_size > 0
            || !self.bad_words_ids.is_empty()
            || !self.suppress_tokens.is_empty()
            || !self.begin_suppress_tokens.is_empty()
            || (self.do_sample
                && (self.typical_p.is_some_and(|p| p < 1.0)
                    || self.epsilon_cutoff.is_some()
                    || self.eta_cutoff.is_some()))
    }

    /// Whether a processor reads the row's tokens (the others need only the step).
    fn reads_sequence(&self) -> bool {
        self.repetition_penalty.is_some()
            || self.no_repeat_ngram_size > 0
            || !self.bad_words_ids.is_empty()
    }

    /// Refuses values transformers refuses.
    pub fn validate(&self) -> Result<()> {
        let bad = |field: &'static str, m: String| Err(Error::invalid(field, m));
        if self.max_new_tokens == 0 {
            return bad("max_new_tokens", "max_new_tokens must be at least 1".into());
        }
        if self.min_new_tokens > self.max_new_tokens {
            return bad(
                "min_new_tokens",
                format!(
                    "min_new_tokens ({}) exceeds max_new_tokens ({})",
                    self.min_new_tokens, self.max_new_tokens
                ),
            );
        }
        if !(self.temperature.is_finite() && self.temperature > 0.0) {
            return bad(
                "temperature",
                format!(
                    "temperature must be a positive number, got {}",
                    self.temperature
                ),
            );
        }
        if self.top_k == Some(0) {
            return bad("top_k", "top_k must be at least 1".into());
        }
        if let Some(p) = self.top_p {
            if !(p > 0.0 && p <= 1.0) {
                return bad("top_p", format!("top_p must be in (0, 1], got {p}"));
            }
        }
        if let Some(p) = self.min_p {
            if !(0.0..=1.0).contains(&p) {
                return bad("min_p", format!("min_p must be in [0, 1], got {p}"));
            }
        }
        if let Some(r) = self.repetition_penalty {
            if !(r.is_finite() && r > 0.0) {
                return bad(
                    "repetition_penalty",
                    format!("repetition_penalty must be a positive number, got {r}"),
                );
            }
        }
        if let Some(p) = self.typical_p {
            if !(p > 0.0 && p <= 1.0) {
                return bad("typical_p", format!("typical_p must be in (0, 1], got {p}"));
            }
        }
        for (name, v) in [
            ("epsilon_cutoff", self.epsilon_cutoff),
            ("eta_cutoff", self.eta_cutoff),
        ] {
            if let Some(e) = v {
                if !(e > 0.0 && e < 1.0) {
                    return bad(name, format!("{name} must be in (0, 1), got {e}"));
                }
            }
        }
        if let Some(i) = self.bad_words_ids.iter().position(Vec::is_empty) {
            return bad(
                "bad_words_ids",
                format!(
                    "bad_words_ids[{i}] is empty; give each banned sequence at least one token id"
                ),
            );
        }
        if self.stop_strings.iter().any(String::is_empty) {
            return bad("stop_strings", "stop strings must not be empty".into());
        }
        Ok(())
    }
}

/// Why a sequence ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// An eos token was generated (it is included in `token_ids`).
    Eos,
    /// A stop string appeared in the generated text.
    StopString,
    /// `max_new_tokens` were generated.
    Length,
    /// The callback asked to stop.
    Cancelled,
}

/// The result for one prompt.
#[derive(Clone, Debug, PartialEq)]
pub struct GenerationOutput {
    /// The prompt's ids.
    pub prompt_ids: Vec<u32>,
    /// The generated ids (prompt excluded).
    pub token_ids: Vec<u32>,
    /// The generated text (special tokens skipped), when a tokenizer was available; cut
    /// right after the stop string that ended it.
    pub text: Option<String>,
    /// Why the row ended.
    pub stop_reason: StopReason,
}

/// Timings of one generate call.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct GenerationStats {
    /// Tokens in the (padded) prompt batch.
    pub prompt_tokens: usize,
    /// Seconds from the call to the first sampled token (the prefill).
    pub time_to_first_token: f64,
    /// Decode steps after the first token.
    pub decode_steps: usize,
    /// Seconds spent in those steps.
    pub decode_seconds: f64,
}

impl GenerationStats {
    /// Decode steps per second (batched rows count once).
    pub fn decode_tokens_per_second(&self) -> f64 {
        if self.decode_seconds > 0.0 {
            self.decode_steps as f64 / self.decode_seconds
        } else {
            0.0
        }
    }
}

/// A new token handed to the streaming callback.
#[derive(Clone, Copy, Debug)]
pub struct TokenEvent<'a> {
    /// Which prompt of the batch.
    pub row: usize,
    /// The token.
    pub token_id: u32,
    /// Newly complete text (empty while a multi-byte character is incomplete, or without a
    /// tokenizer).
    pub text: &'a str,
}

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
    let base = model.model();
    let vocab = base.vocab_size();
    check_request(tokenizer, prompts, opts, vocab)?;
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
    // A model built to stretch its context (dynamic NTK rope) runs past it, as in
    // transformers; other models would silently degrade, or index past learned positions.
    let context = base.max_position_embeddings();
    if longest > context && !base.stretches_context() {
        return Err(Error::invalid("prompt", format!(
            "the prompt has {longest} tokens but the model's context (max_position_embeddings) is {context}; \
             shorten it (generation itself may run past the context, as in transformers)"
        )));
    }
    let eos: Vec<u32> = opts
        .eos_token_ids
        .clone()
        .unwrap_or_else(|| eos_ids.to_vec());
    let started = std::time::Instant::now();
    let batch = prompts.len();
    let device = base.device();
    // On compiled devices every distinct shape is a compile: prompts are padded to a few
    // lengths and the cache to a few capacities, and the processors run on the device.
    let compiled = !model.logits_device().is_eager();
    let (padded, capacity) = if compiled {
        let padded = prompt_bucket(longest);
        (padded, cache_bucket(padded + opts.max_new_tokens))
    } else {
        (longest, longest + opts.max_new_tokens)
    };

    // Left padding: every row ends at the same slot, so one decode step serves all rows.
    let mut ids = Vec::with_capacity(batch * padded);
    let mut pos = Vec::with_capacity(batch * padded);
    let mut mask = Vec::with_capacity(batch);
    for p in prompts {
        let pad = padded - p.len();
        ids.extend(std::iter::repeat_n(pad_id as i64, pad).chain(p.iter().map(|&t| t as i64)));
        pos.extend(std::iter::repeat_n(0i64, pad).chain(0..p.len() as i64));
        mask.push((0..padded).map(|i| i >= pad).collect::<Vec<bool>>());
    }
    let mut cache = base.new_cache(batch, capacity)?;
    let mut history = DecodeHistory::new(&ids, &pos, &mask, padded, padded - longest);
    let input = Tensor::from_vec(ids, &[batch, padded], &device)?;
    let positions = Tensor::from_vec(pos, &[batch, padded], &device)?;
    // Processors only the host has read the logits back each step.
    let sampler = if compiled && !opts.needs_host_processors() {
        Some(DeviceSampler::new(
            opts,
            prompts,
            &eos,
            vocab,
            &model.logits_device(),
        )?)
    } else {
        None
    };
    let args = ForwardArgs {
        input_ids: &input,
        position_ids: &positions,
        attention_mask: Some(&mask),
        output_hidden_states: false,
    };
    let (logits, _) = model.forward(args, &mut cache, LogitsFor::Last)?;

    let decoding = Decoding {
        opts,
        tokenizer,
        prompts,
        context: prompts,
        eos: &eos,
        pad_id,
        vocab,
        started,
        prompt_tokens: batch * longest,
    };
    // Feeding the device's own picks lets step N+1 be recorded while step N runs, unless
    // the model may have to rerun the whole sequence (which needs every token on the host).
    let ahead = base.recompute_cache_at().is_none();
    decode_loop(decoding, logits, sampler, ahead, on_token, |next, step| {
        let p: Vec<i64> = prompts.iter().map(|p| (p.len() + step) as i64).collect();
        match next {
            Feed::Host(next) => {
                history.push(next, &p);
                decode_step(model, &mut cache, &history)
            }
            Feed::Device(ids) => {
                let input = ids.reshape_to(&[batch, 1])?.to_device(&device)?;
                let positions = Tensor::from_vec(p, &[batch, 1], &device)?;
                let args = ForwardArgs {
                    input_ids: &input,
                    position_ids: &positions,
                    attention_mask: None,
                    output_hidden_states: false,
                };
                Ok(model.forward(args, &mut cache, LogitsFor::Last)?.0)
            }
        }
    })
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
    let eos: Vec<u32> = opts
        .eos_token_ids
        .clone()
        .unwrap_or_else(|| eos_ids.to_vec());
    let started = std::time::Instant::now();
    let batch = prompts.len();
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
    // On compiled devices the encoder's input is padded to a few lengths and the decoder's
    // cache to a few capacities, so that few programs compile (see `generate`).
    let compiled = !model.logits_device().is_eager();
    let (padded, capacity) = if compiled {
        (
            prompt_bucket(longest),
            cache_bucket(1 + opts.max_new_tokens),
        )
    } else {
        (longest, 1 + opts.max_new_tokens)
    };
    let mut ids = Vec::with_capacity(batch * padded);
    let mut real = Vec::with_capacity(batch * padded);
    for p in prompts {
        let pad = padded - p.len();
        ids.extend(
            p.iter()
                .map(|&t| t as i64)
                .chain(std::iter::repeat_n(pad_id as i64, pad)),
        );
        real.extend(std::iter::repeat_n(1i64, p.len()).chain(std::iter::repeat_n(0, pad)));
    }
    // The mask stays on the host: the model reads it back to build its additive form.
    let host = zoo_runtime::Device::Cpu;
    let input = Tensor::from_vec(ids, &[batch, padded], &model.device())?;
    let mask = Tensor::from_vec(real, &[batch, padded], &host)?;
    let encoded = model.encode(EncoderArgs {
        input_ids: &input,
        attention_mask: Some(&mask),
        token_type_ids: None,
        position_ids: None,
        output_hidden_states: false,
    })?;
    let hidden = encoded.last_hidden_state;
    let mut cache = model.new_cache(batch, capacity)?;
    // Every row's decoder input has the same length, so no decoder padding is needed.
    let mut step = |tokens: Feed<'_>, position: usize| -> Result<Tensor> {
        let ids = match tokens {
            Feed::Host(t) => Tensor::from_vec(t.to_vec(), &[batch, 1], &host)?,
            Feed::Device(t) => t.reshape_to(&[batch, 1])?.to_device(&host)?,
        };
        let pos = Tensor::from_vec(vec![position as i64; batch], &[batch, 1], &host)?;
        let args = ForwardArgs {
            input_ids: &ids,
            position_ids: &pos,
            attention_mask: None,
            output_hidden_states: false,
        };
        model.decode(args, &hidden, Some(&mask), &mut cache, LogitsFor::Last)
    };
    let context = vec![vec![decoder_start_token_id]; batch];
    let logits = step(Feed::Host(&vec![decoder_start_token_id as i64; batch]), 0)?;
    // Processors only the host has read the logits back each step.
    let sampler = if compiled && !opts.needs_host_processors() {
        Some(DeviceSampler::new(
            opts,
            &context,
            &eos,
            vocab,
            &model.logits_device(),
        )?)
    } else {
        None
    };
    let decoding = Decoding {
        opts,
        tokenizer,
        prompts,
        context: &context,
        eos: &eos,
        pad_id,
        vocab,
        started,
        prompt_tokens: batch * longest,
    };
    // T5's decoder reads its ids back to the host (to check them and build its lookups), so
    // a step recorded ahead would wait for them anyway: this loop stays in lockstep.
    decode_loop(decoding, logits, sampler, false, on_token, |next, i| {
        step(next, i + 1)
    })
}

/// What the token loop shared by decoders and encoder-decoders needs to know.
struct Decoding<'a> {
    opts: &'a GenerationOptions,
    tokenizer: Option<&'a crate::Tokenizer>,
    /// The prompts the outputs report.
    prompts: &'a [Vec<u32>],
    /// Per row, the ids the logits processors see before the generated ones: the prompt of
    /// a decoder, the decoder start token of an encoder-decoder (its `input_ids` in
    /// transformers).
    context: &'a [Vec<u32>],
    eos: &'a [u32],
    pad_id: u32,
    vocab: usize,
    started: std::time::Instant,
    prompt_tokens: usize,
}

/// The tokens a decode step feeds, one per row.
enum Feed<'a> {
    /// Read back to the host (pads for finished rows).
    Host(&'a [i64]),
    /// The `[batch]` ids the device sampler picked, still on the device.
    Device(&'a Tensor),
}

/// Picks a token per row from `logits` (the prompt's last), streams it, stops rows on eos
/// or a stop string, and asks `next_logits(tokens, step)` for the logits after feeding
/// `tokens` as generated token `step`.
///
/// With a device sampler and `ahead`, the loop runs one step ahead of the host, as a
/// compiled decode loop should: it records step N+1 from the device's picks of step N and
/// dispatches it before reading those picks back, so the device never waits for the host's
/// recording. Finished rows then keep feeding their own picks instead of pads (their
/// outputs are cut at the stop either way; no row reads another's), and a stop before
/// `max_new_tokens` leaves one step computed for nothing. Sampled batches of several rows
/// stay in lockstep instead: a row that stops draws no more numbers from the seeded stream,
/// which the step ahead would already have drawn.
fn decode_loop(
    d: Decoding<'_>,
    mut logits: Tensor,
    mut sampler: Option<DeviceSampler>,
    ahead: bool,
    mut on_token: impl FnMut(TokenEvent<'_>) -> bool,
    mut next_logits: impl FnMut(Feed<'_>, usize) -> Result<Tensor>,
) -> Result<(Vec<GenerationOutput>, GenerationStats)> {
    let Decoding {
        opts,
        tokenizer,
        prompts,
        context,
        eos,
        pad_id,
        vocab,
        started,
        prompt_tokens,
    } = d;
    let batch = prompts.len();
    let longest_context = context.iter().map(Vec::len).max().unwrap_or(0);
    let mut rng = Generator::new(opts.seed);
    let mut streams: Vec<Option<crate::tokenizer::TextStream<'_>>> = (0..batch)
        .map(|_| tokenizer.map(|t| t.stream(true)))
        .collect();
    let mut texts = vec![String::new(); batch];
    let mut generated: Vec<Vec<u32>> = vec![Vec::new(); batch];
    let mut done: Vec<Option<StopReason>> = vec![None; batch];
    let mut stats = GenerationStats {
        prompt_tokens,
        ..Default::default()
    };
    let mut decode_started = None;
    let mut cancelled = false;
    let ahead = ahead && sampler.is_some() && (!opts.do_sample || batch == 1);
    // One number per row still generating, when sampling, from the seeded stream.
    let uniforms = |rng: &mut Generator, done: &[Option<StopReason>]| -> Vec<f64> {
        done.iter()
            .map(|d| {
                if opts.do_sample && d.is_none() {
                    rng.next_f64()
                } else {
                    0.0
                }
            })
            .collect()
    };
    // Running ahead: the device picks of the current step, dispatched.
    let mut queued: Option<Tensor> = None;
    if let (true, Some(sampler)) = (ahead, &mut sampler) {
        let ids = sampler.pick(&logits, 0, &uniforms(&mut rng, &done))?;
        sampler.observe(&ids)?;
        ids.dispatch()?;
        queued = Some(ids);
    }
    for step in 0..opts.max_new_tokens {
        let picked: Vec<u32> = match (&mut sampler, queued.take()) {
            (Some(sampler), Some(ids)) => {
                // Step N+1 is recorded from these ids and queued behind step N before the
                // host waits for N's.
                if step + 1 < opts.max_new_tokens {
                    // The logits go before the dispatch: only the ids are the program's.
                    let next = sampler.pick(
                        &next_logits(Feed::Device(&ids), step)?,
                        step + 1,
                        &uniforms(&mut rng, &done),
                    )?;
                    sampler.observe(&next)?;
                    next.dispatch()?;
                    queued = Some(next);
                }
                let host = ids.to_vec::<i64>()?;
                host.into_iter().map(|t| t as u32).collect()
            }
            (Some(sampler), None) => {
                // The step's program ends in the sampler: only token ids come back.
                let ids = sampler.pick(&logits, step, &uniforms(&mut rng, &done))?;
                let host = ids.to_vec::<i64>()?;
                sampler.observe(&ids)?;
                host.into_iter().map(|t| t as u32).collect()
            }
            (None, _) => {
                let rows = logits.to_dtype(DType::F32)?.to_vec::<f32>()?;
                if rows.len() != batch * vocab {
                    return Err(Error::Internal(format!(
                        "the model returned {} logits for {batch} rows of {vocab}",
                        rows.len()
                    )));
                }
                rows.chunks(vocab)
                    .enumerate()
                    .map(|(b, row)| {
                        if done[b].is_some() {
                            return pad_id;
                        }
                        let mut scores = row.to_vec();
                        // The row as transformers' processors see it: left pads, then its
                        // context and what it generated (built only when one reads it).
                        let (seq, pads) = if opts.reads_sequence() {
                            let pads = longest_context - context[b].len();
                            let seq: Vec<u32> = std::iter::repeat_n(pad_id, pads)
                                .chain(context[b].iter().copied())
                                .chain(generated[b].iter().copied())
                                .collect();
                            (seq, pads)
                        } else {
                            (Vec::new(), 0)
                        };
                        let row = Row { seq: &seq, pads };
                        pick(&mut scores, row, step, eos, opts, &mut rng)
                    })
                    .collect()
            }
        };
        let mut next = Vec::with_capacity(batch);
        for (b, &id) in picked.iter().enumerate() {
            if done[b].is_some() {
                next.push(pad_id);
                continue;
            }
            generated[b].push(id);
            next.push(id);
            let mut piece = String::new();
            if let Some(s) = streams[b].as_mut() {
                piece = s.push(id)?;
                texts[b].push_str(&piece);
            }
            if !on_token(TokenEvent {
                row: b,
                token_id: id,
                text: &piece,
            }) {
                cancelled = true;
            }
            if eos.contains(&id) && step + 1 >= opts.min_new_tokens {
                done[b] = Some(StopReason::Eos);
            } else if let Some(cut) = stop_string_end(&texts[b], &opts.stop_strings) {
                texts[b].truncate(cut);
                done[b] = Some(StopReason::StopString);
            }
        }
        if step == 0 {
            stats.time_to_first_token = started.elapsed().as_secs_f64();
            decode_started = Some(std::time::Instant::now());
        }
        if cancelled || done.iter().all(Option::is_some) || step + 1 == opts.max_new_tokens {
            break;
        }
        stats.decode_steps += 1;
        if queued.is_some() {
            continue;
        }
        // Finished rows keep receiving pad tokens so the batch stays rectangular, as in
        // transformers.
        let next: Vec<i64> = next.iter().map(|&t| t as i64).collect();
        logits = next_logits(Feed::Host(&next), step)?;
    }
    if let Some(t) = decode_started {
        stats.decode_seconds = t.elapsed().as_secs_f64();
    }
    let mut outs = Vec::with_capacity(batch);
    for b in 0..batch {
        let text = match streams[b].as_mut() {
            Some(s) if done[b] != Some(StopReason::StopString) => {
                let rest = s.finish()?;
                texts[b].push_str(&rest);
                Some(std::mem::take(&mut texts[b]))
            }
            Some(_) => Some(std::mem::take(&mut texts[b])),
            None => None,
        };
        let stop_reason = done[b].unwrap_or(if cancelled {
            StopReason::Cancelled
        } else {
            StopReason::Length
        });
        outs.push(GenerationOutput {
            prompt_ids: prompts[b].clone(),
            token_ids: std::mem::take(&mut generated[b]),
            text,
            stop_reason,
        });
    }
    Ok((outs, stats))
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
    slots.div_ceil(256).max(1) * 256
}

/// The byte offset right after the first stop string found in `text`.
fn stop_string_end(text: &str, stops: &[String]) -> Option<usize> {
    stops
        .iter()
        .filter_map(|s| text.find(s.as_str()).map(|i| i + s.len()))
        .min()
}

/// One row's sequence as the logits processors read it: `seq` holds `pads` left pads, then
/// the row's context (the prompt, or an encoder-decoder's start token) and its generated ids.
#[derive(Clone, Copy)]
pub(crate) struct Row<'a> {
    pub seq: &'a [u32],
    pub pads: usize,
}

/// Applies the logits processors in transformers' order and picks the next token.
fn pick(
    scores: &mut [f32],
    row: Row<'_>,
    step: usize,
    eos: &[u32],
    o: &GenerationOptions,
    rng: &mut Generator,
) -> u32 {
    pick_with(scores, row, step, eos, o, &mut || rng.next_f64())
}

/// [`pick`] with the uniform number of a sampled pick drawn from `draw`.
pub(crate) fn pick_with(
    scores: &mut [f32],
    row: Row<'_>,
    step: usize,
    eos: &[u32],
    o: &GenerationOptions,
    draw: &mut dyn FnMut() -> f64,
) -> u32 {
    process(scores, row, step, eos, o);
    if !o.do_sample {
        return argmax(scores);
    }
    let Some((order, probs)) = warp(scores, o) else {
        return argmax(scores);
    };
    let total: f64 = probs.iter().sum();
    let mut u = draw() * total;
    for (i, p) in probs.iter().enumerate() {
        if u < *p {
            return order[i] as u32;
        }
        u -= p;
    }
    order[order.len() - 1] as u32
}

/// The processors that apply to greedy and sampled decoding alike, in transformers' order:
/// repetition penalty, no-repeat n-grams, bad words, min new tokens, suppressed tokens.
/// Banned tokens get -inf.
pub(crate) fn process(
    scores: &mut [f32],
    row: Row<'_>,
    step: usize,
    eos: &[u32],
    o: &GenerationOptions,
) {
    if let Some(r) = o.repetition_penalty {
        // Left pads are not the row's tokens.
        let mut uniq: Vec<u32> = row.seq[row.pads..].to_vec();
        uniq.sort_unstable();
        uniq.dedup();
        let r = r as f32;
        for id in uniq {
            if let Some(s) = scores.get_mut(id as usize) {
                *s = if *s < 0.0 { *s * r } else { *s / r };
            }
        }
    }
    let mut ban = |id: u32| {
        if let Some(s) = scores.get_mut(id as usize) {
            *s = f32::NEG_INFINITY;
        }
    };
    let n = o.no_repeat_ngram_size;
    if n > 0 && row.seq.len() >= n {
        // Every earlier window that starts with the sequence's last n - 1 ids would be
        // repeated by its own last id.
        let tail = &row.seq[row.seq.len() + 1 - n..];
        for w in row.seq.windows(n) {
            if w[..n - 1] == *tail {
                ban(w[n - 1]);
            }
        }
    }
    for word in &o.bad_words_ids {
        let Some((&last, prefix)) = word.split_last() else {
            continue;
        };
        // An eos token alone stays allowed, as transformers filters it out.
        if prefix.is_empty() && eos.contains(&last) {
            continue;
        }
        if row.seq.ends_with(prefix) {
            ban(last);
        }
    }
    if step < o.min_new_tokens {
        eos.iter().for_each(|&e| ban(e));
    }
    o.suppress_tokens.iter().for_each(|&t| ban(t));
    if step == 0 {
        o.begin_suppress_tokens.iter().for_each(|&t| ban(t));
    }
}

/// The sampling warpers over processed `scores`, in transformers' order (temperature, top-k,
/// top-p, min-p, typical, epsilon, eta): the candidates left, best first, and their
/// probabilities (not normalised). `None` when every token is banned.
pub(crate) fn warp(scores: &mut [f32], o: &GenerationOptions) -> Option<(Vec<usize>, Vec<f64>)> {
    if o.temperature != 1.0 {
        let t = o.temperature as f32;
        scores.iter_mut().for_each(|s| *s /= t);
    }
    // Candidates sorted by score, best first (ties keep the lower id first).
    let mut order: Vec<usize> = (0..scores.len())
        .filter(|&i| scores[i] > f32::NEG_INFINITY)
        .collect();
    if order.is_empty() {
        return None;
    }
    order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
    if let Some(k) = o.top_k {
        order.truncate(k.max(1));
    }
    let max = scores[order[0]];
    let mut probs: Vec<f64> = order
        .iter()
        .map(|&i| ((scores[i] - max) as f64).exp())
        .collect();
    normalise(&mut probs);
    if let Some(top_p) = o.top_p {
        // Keep tokens until the mass reaches top_p (the token that crosses it included).
        let mut acc = 0.0;
        let mut keep = probs.len();
        for (i, p) in probs.iter().enumerate() {
            acc += p;
            if acc >= top_p {
                keep = i + 1;
                break;
            }
        }
        order.truncate(keep);
        probs.truncate(keep);
    }
    if let Some(min_p) = o.min_p {
        let floor = probs[0] * min_p;
        let keep = probs.iter().take_while(|&&p| p >= floor).count().max(1);
        order.truncate(keep);
        probs.truncate(keep);
    }
    if let Some(mass) = o.typical_p.filter(|&m| m < 1.0) {
        normalise(&mut probs);
        let entropy = entropy(&probs);
        // How far each token's information is from the entropy; the closest first.
        let surprise: Vec<f64> = probs.iter().map(|&p| (-p.ln() - entropy).abs()).collect();
        let mut by: Vec<usize> = (0..probs.len()).collect();
        by.sort_by(|&a, &b| surprise[a].total_cmp(&surprise[b]));
        let mut acc = 0.0;
        let below = by
            .iter()
            .take_while(|&&i| {
                acc += probs[i];
                acc < mass
            })
            .count();
        let limit = surprise[by[below.min(by.len() - 1)]];
        let first = by[0];
        retain(&mut order, &mut probs, |i, _| {
            surprise[i] <= limit || i == first
        });
    }
    if let Some(eps) = o.epsilon_cutoff {
        normalise(&mut probs);
        let top = probs[0];
        retain(&mut order, &mut probs, |_, p| p >= eps || p == top);
    }
    if let Some(eps) = o.eta_cutoff {
        normalise(&mut probs);
        let entropy = entropy(&probs);
        let eta = eps.min(eps.sqrt() * (-entropy).exp());
        let top = probs[0];
        retain(&mut order, &mut probs, |_, p| p >= eta || p == top);
    }
    Some((order, probs))
}

/// The entropy (nats) of normalised `probs`.
fn entropy(probs: &[f64]) -> f64 {
    -probs
        .iter()
        .filter(|&&p| p > 0.0)
        .map(|&p| p * p.ln())
        .sum::<f64>()
}

fn normalise(probs: &mut [f64]) {
    let total: f64 = probs.iter().sum();
    probs.iter_mut().for_each(|p| *p /= total);
}

/// Keeps the candidates for which `keep(index, probability)` holds, in order.
fn retain(order: &mut Vec<usize>, probs: &mut Vec<f64>, keep: impl Fn(usize, f64) -> bool) {
    let kept: Vec<(usize, f64)> = order
        .iter()
        .zip(probs.iter())
        .enumerate()
        .filter(|&(i, (_, &p))| keep(i, p))
        .map(|(_, (&o, &p))| (o, p))
        .collect();
    (*order, *probs) = kept.into_iter().unzip();
}

/// Index of the largest score, the first on ties (as `torch.argmax`).
fn argmax(scores: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &s) in scores.iter().enumerate() {
        if s > scores[best] {
            best = i;
        }
    }
    best as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(seq: &[u32]) -> Row<'_> {
        Row { seq, pads: 0 }
    }

    fn opts() -> GenerationOptions {
        GenerationOptions {
            do_sample: true,
            ..Default::default()
        }
    }

    #[test]
    fn greedy_picks_first_max_and_min_new_tokens_blocks_eos() {
        let mut rng = Generator::new(0);
        let o = GenerationOptions {
            min_new_tokens: 2,
            ..GenerationOptions::greedy(4)
        };
        let mut s = vec![1.0, 5.0, 5.0, 0.0];
        assert_eq!(pick(&mut s, row(&[]), 0, &[3], &o, &mut rng), 1);
        let mut s = vec![1.0, 2.0, 0.0, 9.0];
        assert_eq!(
            pick(&mut s, row(&[]), 1, &[3], &o, &mut rng),
            1,
            "eos blocked before min_new_tokens"
        );
        let mut s = vec![1.0, 2.0, 0.0, 9.0];
        assert_eq!(pick(&mut s, row(&[]), 2, &[3], &o, &mut rng), 3);
    }

    #[test]
    fn repetition_penalty_divides_positive_and_multiplies_negative() {
        let mut rng = Generator::new(0);
        let o = GenerationOptions {
            repetition_penalty: Some(2.0),
            ..GenerationOptions::greedy(1)
        };
        let mut s = vec![3.0, 2.0, -1.0];
        assert_eq!(pick(&mut s, row(&[0, 0, 2]), 0, &[], &o, &mut rng), 1);
        assert_eq!(s, vec![1.5, 2.0, -2.0]);
    }

    #[test]
    fn top_k_one_and_tiny_top_p_and_full_min_p_are_greedy() {
        for o in [
            GenerationOptions {
                top_k: Some(1),
                ..opts()
            },
            GenerationOptions {
                top_p: Some(1e-6),
                ..opts()
            },
            GenerationOptions {
                min_p: Some(1.0),
                ..opts()
            },
        ] {
            let mut rng = Generator::new(7);
            for _ in 0..50 {
                let mut s = vec![0.5, 0.1, 0.9, 0.3];
                assert_eq!(pick(&mut s, row(&[]), 0, &[], &o, &mut rng), 2, "{o:?}");
            }
        }
    }

    #[test]
    fn sampling_follows_the_distribution_and_the_seed() {
        let o = GenerationOptions {
            temperature: 0.5,
            ..opts()
        };
        let draw = |seed| {
            let mut rng = Generator::new(seed);
            (0..2000)
                .map(|_| {
                    let mut s = vec![0.0f32, (2.0f32).ln() / 2.0, f32::NEG_INFINITY];
                    pick(&mut s, row(&[]), 0, &[], &o, &mut rng)
                })
                .collect::<Vec<_>>()
        };
        let a = draw(1);
        assert_eq!(a, draw(1), "same seed, same tokens");
        assert_ne!(a, draw(2));
        assert!(!a.contains(&2), "a -inf token is never drawn");
        // With temperature 0.5 the odds of token 1 over token 0 are e^(ln 2) = 2.
        let ones = a.iter().filter(|&&t| t == 1).count() as f64 / a.len() as f64;
        assert!((ones - 2.0 / 3.0).abs() < 0.04, "{ones}");
    }

    #[test]
    fn bad_options_are_refused() {
        let cases: [fn(&mut GenerationOptions); 12] = [
            |o| o.max_new_tokens = 0,
            |o| o.min_new_tokens = 30,
            |o| o.temperature = 0.0,
            |o| o.top_p = Some(1.5),
            |o| o.min_p = Some(-0.1),
            |o| o.top_k = Some(0),
            |o| o.repetition_penalty = Some(f64::NAN),
            |o| o.stop_strings = vec![String::new()],
            |o| o.typical_p = Some(0.0),
            |o| o.epsilon_cutoff = Some(1.0),
            |o| o.eta_cutoff = Some(-0.5),
            |o| o.bad_words_ids = vec![vec![3], vec![]],
        ];
        for set in cases {
            let mut o = GenerationOptions::default();
            set(&mut o);
            assert!(
                matches!(o.validate(), Err(Error::InvalidInput { .. })),
                "{o:?}"
            );
        }
    }

    /// What transformers' own processors (the list `generate()` builds, with its defaults) make
    /// of fixed scores: the same bans and values greedy, the same candidates when sampling
    /// (written by nightly/reference/logits_processors.py).
    #[test]
    fn processors_match_transformers() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/data/logits_processors.json"
        );
        let data: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let ids = |v: &serde_json::Value| -> Vec<u32> {
            v.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap() as u32)
                .collect()
        };
        let cases = data["cases"].as_array().unwrap();
        assert!(cases.len() >= 15);
        for case in cases {
            let name = case["name"].as_str().unwrap();
            let g: zoo_hub::GenerationConfig =
                serde_json::from_value(case["options"].clone()).unwrap();
            let o = GenerationOptions::from_generation_config(&g);
            o.validate().unwrap();
            let seq = ids(&case["seq"]);
            let row = Row {
                seq: &seq,
                pads: case["pads"].as_u64().unwrap() as usize,
            };
            let step = case["step"].as_u64().unwrap() as usize;
            let mut scores: Vec<f32> = case["scores"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap() as f32)
                .collect();
            let want: Vec<Option<f64>> = case["processed"]
                .as_array()
                .unwrap()
                .iter()
                .map(serde_json::Value::as_f64)
                .collect();
            process(&mut scores, row, step, &ids(&case["eos"]), &o);
            if !o.do_sample {
                for (i, (&got, want)) in scores.iter().zip(&want).enumerate() {
                    match want {
                        None => assert_eq!(got, f32::NEG_INFINITY, "{name}: token {i}"),
                        Some(w) => assert_eq!(got, *w as f32, "{name}: token {i}"),
                    }
                }
                continue;
            }
            let (mut kept, _) = warp(&mut scores, &o).unwrap();
            kept.sort_unstable();
            let expected: Vec<usize> = (0..want.len()).filter(|&i| want[i].is_some()).collect();
            assert_eq!(kept, expected, "{name}: candidates");
        }
    }

    #[test]
    fn generation_config_defaults_are_transformers() {
        let g: zoo_hub::GenerationConfig =
            serde_json::from_str(r#"{"do_sample": true, "epsilon_cutoff": 0.0, "typical_p": 1.0}"#)
                .unwrap();
        let o = GenerationOptions::from_generation_config(&g);
        assert_eq!(o.top_k, Some(50));
        assert_eq!((o.epsilon_cutoff, o.typical_p), (None, None));
        assert!(!o.needs_host_processors());
        let g: zoo_hub::GenerationConfig =
            serde_json::from_str(r#"{"top_k": 0, "no_repeat_ngram_size": 3}"#).unwrap();
        let o = GenerationOptions::from_generation_config(&g);
        assert_eq!(o.top_k, None);
        assert!(o.needs_host_processors());
    }

    #[test]
    fn stop_string_cut_is_right_after_the_first_match() {
        let stops = vec!["END".to_string(), "\n\n".to_string()];
        assert_eq!(stop_string_end("abc\n\nxEND", &stops), Some(5));
        assert_eq!(stop_string_end("no stop here", &stops), None);
    }
}
