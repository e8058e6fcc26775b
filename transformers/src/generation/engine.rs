//! The generation engine: a set of sequences sharing one KV cache, advanced one decode step at
//! a time. A sequence joins between steps ([`Engine::add`]) and leaves when it stops or is
//! cancelled; each has its own options, logits processors, stop strings and cache row.
//! `generate`, `generate_seq2seq`, the CLI and a server are its clients.
//!
//! A step feeds each running row its last token and each joining row its prompt, so that a
//! join costs the running rows no step of their own. Paged, the step packs every row's
//! tokens into one input row (vLLM's flattened batch: no padding), running rows first and
//! prompts in arrival order up to [`EngineConfig::max_step_tokens`], the rest of a prompt
//! fed at the next steps (chunked prefill); the logits of each row's last token are its
//! next. A step where every row feeds one token (a decode) keeps one input row per row
//! instead, so that each query reads its own keys where they lie. On a timeline the rows are left-padded to one width (padding masked out) and the
//! last column is every row's next. Positions come from each row's own count, and a
//! sliding window counts a row's real tokens. A group of
//! sequences added together (a cohort: one options set, one seeded stream) is picked in row
//! order from that stream, as transformers picks a batch. The cache is laid out one of two
//! ways.
//!
//! **Paged** (a decoder whose cache lies all on eager devices, candle CPU or CUDA, or all on
//! compiled ones): the cache is a pool of blocks of [`BLOCK_SIZE`] slots ([`KvCache::paged`])
//! and each sequence holds a table of blocks, as vLLM's paged attention does; padding takes
//! no slot. A cohort joins
//! once its rows are free and the pool has blocks for its prompts; a running sequence takes
//! a block whenever its tokens fill the last one. When none is left, the running sequence
//! that arrived last is preempted: its blocks go back and it waits at the head of the
//! queue, to be fed its prompt and tokens again when blocks free up (vLLM's preemption by
//! recompute; with prefix caching its full blocks are usually still cached then). A
//! preempted sequence of a sampled cohort of several rows draws from the cohort's stream
//! out of row order, so its sample may differ from an uninterrupted run's (greedy picks
//! draw nothing). With prefix caching
//! ([`Engine::set_prefix_caching`]) every full block is kept after its sequence leaves,
//! keyed by a hash chain of its tokens, and a joining prompt that starts with cached blocks
//! holds them instead of computing them (shared, not copied); cached blocks nothing holds
//! are evicted least recently used first. A step computes only the running rows' tokens.
//! On compiled devices a decode step's rows are rounded up to a power of two, a packed
//! step's width to its prompt bucket ([`prompt_bucket`]) and its logits' columns to a power
//! of two, and attention spans a power of two of blocks, so that a steady stream of
//! requests runs a few programs compiled once.
//!
//! **Timeline** (encoder-decoders, models that rerun their history, a cache split over eager
//! and compiled devices): the
//! rows share one timeline of slots, and a step writes every row at the same slot, so one
//! forward pass of fixed shapes serves the batch; slot order is each row's token order, so
//! the causal mask holds in slots. A cohort joins once its rows are free and the timeline
//! leaves room for its prompt and every running row's remaining tokens; it waits otherwise,
//! and the timeline starts over whenever no row is running. Ring layers, which keep the last
//! `window` slots, serve only a cohort that nothing joins.
//!
//! On compiled devices a lone cohort (one that fills every row, as `generate` adds it)
//! samples on the device and runs one step ahead of the host (see [`Engine::step`]); paged,
//! only while the pool holds blocks for all its tokens, so that no preemption interrupts it.

use std::collections::VecDeque;

use zoo_runtime::{DType, Device, Generator, Tensor};

use super::blocks::{BlockId, BlockPool};
use super::device_sampler::DeviceSampler;
use super::options::{GenerationOptions, StopReason};
use super::processors::{pick, Row};
use super::{decode_step, prompt_bucket, DecodeHistory};
use crate::cache::KvCache;
use crate::kinds::{CausalLm, ForwardArgs, LogitsFor, Seq2SeqLm};
use crate::tokenizer::TextStream;
use crate::{Error, GenerationOutput, Result, Tokenizer};

/// A sequence's handle, unique within its engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SequenceId(pub u64);

/// What a step produced, in row order.
#[derive(Clone, Debug, PartialEq)]
pub enum EngineEvent {
    /// A sequence's new token and the text it completes (empty while a multi-byte character
    /// is incomplete, or without a tokenizer).
    Token {
        /// The sequence.
        id: SequenceId,
        /// The token.
        token_id: u32,
        /// Newly complete text.
        text: String,
    },
    /// A sequence ended (after its last token's event); its row is free for the next step.
    Finished {
        /// The sequence.
        id: SequenceId,
        /// Its prompt, tokens, text and why it stopped.
        output: GenerationOutput,
    },
}

/// The shape of an engine's cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EngineConfig {
    /// Sequences that run at once (the cache's rows).
    pub max_sequences: usize,
    /// Tokens one sequence may hold, prompt and generation (paged), or slots of the shared
    /// timeline, where a joining prompt (padded on compiled devices) plus the longest
    /// remaining generation must fit.
    pub capacity: usize,
    /// Blocks of [`BLOCK_SIZE`] slots in a paged cache; `None`: enough for every sequence at
    /// full capacity. Fewer share memory between sequences, preempting one when blocks run
    /// out; at least one sequence's full capacity. Unused by a timeline.
    pub kv_blocks: Option<usize>,
    /// Tokens one step feeds at most (vLLM's `max_num_batched_tokens`): running sequences'
    /// next tokens first, then joining prompts in arrival order, a prompt past what is left
    /// fed in chunks over the next steps (chunked prefill), so that a long prompt does not
    /// stall the sequences running beside it. `None`: every prompt whole. At least
    /// `max_sequences`. Paged caches only (a timeline feeds prompts whole).
    pub max_step_tokens: Option<usize>,
}

impl EngineConfig {
    /// `max_sequences` sequences of up to `capacity` tokens each, all of them at full
    /// capacity held at once.
    pub fn new(max_sequences: usize, capacity: usize) -> EngineConfig {
        EngineConfig {
            max_sequences,
            capacity,
            kv_blocks: None,
            max_step_tokens: None,
        }
    }

    /// Refuses a paged pool of `blocks` blocks that cannot hold one sequence at
    /// [`EngineConfig::capacity`], or fewer blocks than `max_sequences` (each running
    /// sequence holds at least one).
    pub fn check_pool(&self, blocks: usize) -> Result<()> {
        let one = self.capacity.div_ceil(BLOCK_SIZE);
        if blocks < one {
            return Err(Error::invalid(
                "kv_blocks",
                format!(
                    "{blocks} KV blocks of {BLOCK_SIZE} tokens cannot hold one sequence of {} tokens; \
                     ask for at least {one} blocks or a shorter context",
                    self.capacity
                ),
            ));
        }
        if self.max_sequences > blocks {
            return Err(Error::invalid(
                "max_sequences",
                format!(
                    "{} sequences cannot run on {blocks} KV blocks of {BLOCK_SIZE} tokens: each running sequence holds at least one; ask for at most {blocks}",
                    self.max_sequences
                ),
            ));
        }
        Ok(())
    }
}

/// Slots per block of a paged cache (vLLM's default).
pub const BLOCK_SIZE: usize = 16;

/// The model an engine drives: a decoder, or an encoder-decoder whose encoder ran once.
enum Driven<'m> {
    Decoder(&'m dyn CausalLm),
    Seq2Seq {
        model: &'m dyn Seq2SeqLm,
        /// The encoder's output and its mask, one row per cache row.
        hidden: Tensor,
        mask: Tensor,
    },
}

/// Sequences added together: one options set and one seeded stream (picked in row order, as
/// transformers picks a batch), their eos ids, and the left pads its processors see.
struct Cohort {
    opts: GenerationOptions,
    eos: Vec<u32>,
    rng: Generator,
    /// The longest context in the cohort: each row's processors see it left-padded to this.
    longest_context: usize,
    /// Steps the cohort has taken (a lockstep cohort's `step` for its processors).
    steps: usize,
}

/// One sequence in a row.
struct Sequence<'t> {
    id: SequenceId,
    cohort: usize,
    /// The prompt its output reports.
    prompt: Vec<u32>,
    /// What its processors see before its tokens: the prompt of a decoder, the start token of
    /// an encoder-decoder.
    context: Vec<u32>,
    generated: Vec<u32>,
    stream: Option<TextStream<'t>>,
    text: String,
    done: Option<StopReason>,
    /// Tokens to feed at the next step: the prompt before the first, then the last pick.
    feed: Vec<u32>,
    /// Position of `feed[0]`.
    position: usize,
    /// Paged: the blocks holding its tokens, and the chain key of each full one cached.
    table: Vec<BlockId>,
    hashes: Vec<u64>,
    /// The first layer's input for the prompt's positions, `[prompt, hidden]`, where it is
    /// not the tokens' embeddings (a vision-language prompt's image features); such a
    /// sequence neither reuses nor leaves cached prefix blocks.
    embeds: Option<Tensor>,
}

impl Sequence<'_> {
    /// Its tokens so far: the context, then what it generated.
    fn tokens(&self) -> Vec<u32> {
        [self.context.as_slice(), &self.generated].concat()
    }
}

/// A cohort waiting for rows.
struct Waiting {
    cohort: Cohort,
    members: Vec<Member>,
}

/// A sequence waiting for a row.
struct Member {
    id: SequenceId,
    prompt: Vec<u32>,
    context: Vec<u32>,
    embeds: Option<Tensor>,
}

/// Running one step ahead of the host (a lone cohort on a compiled device): the device's
/// picks of the next step, dispatched and not yet read.
struct Ahead {
    sampler: DeviceSampler,
    queued: Option<Tensor>,
}

/// A set of running sequences over one model and one KV cache (see the module docs).
pub struct Engine<'m> {
    driven: Driven<'m>,
    tokenizer: Option<&'m Tokenizer>,
    /// Eos ids of a sequence whose options name none.
    default_eos: Vec<u32>,
    pad_id: u32,
    vocab: usize,
    compiled: bool,
    config: EngineConfig,
    /// Made at the first admission of an idle engine: with ring layers for a cohort that
    /// fills every row (nothing joins it, so its rows stay gapless), full buffers otherwise.
    cache: Option<KvCache>,
    rings: bool,
    rows: Vec<Option<Sequence<'m>>>,
    cohorts: Vec<Option<Cohort>>,
    waiting: VecDeque<Waiting>,
    /// Everything fed since the timeline started, for a model that reruns the whole sequence
    /// at some cache length (`DecoderModel::recompute_cache_at`).
    history: Option<DecodeHistory>,
    /// The device sampler of a lone cohort and its queued picks.
    device: Option<Ahead>,
    /// The rows the last forward's logits belong to, in order (a packed step gives none to
    /// a prompt it fed only part of).
    picking: Vec<usize>,
    next_id: u64,
    /// Whether joining prompts reuse cached prefixes ([`Engine::set_prefix_caching`]).
    prefix_caching: bool,
    /// Sequences that reused a cached prefix, and the tokens they did not compute.
    prefix_hits: (u64, u64),
    /// Paged: the pool's blocks (see the module docs).
    pool: Option<BlockPool>,
    /// Paged: sequences preempted for blocks, to run again before anything else joins.
    preempted: VecDeque<Sequence<'m>>,
    preemptions: u64,
}

impl<'m> Engine<'m> {
    /// An engine over a decoder: `eos_ids` serve sequences whose options name none, `pad_id`
    /// feeds rows with nothing to feed.
    pub fn new(
        model: &'m dyn CausalLm,
        tokenizer: Option<&'m Tokenizer>,
        eos_ids: &[u32],
        pad_id: u32,
        config: EngineConfig,
    ) -> Result<Engine<'m>> {
        check_config(config)?;
        let decoder = model.model();
        let specs = decoder.cache_specs();
        let compiled = !model.logits_device().is_eager();
        let blocks = Engine::blocks(model, config);
        // Refuse what memory cannot hold before anything is allocated: every row at full
        // capacity on a timeline (rings for a full cohort are smaller), the pool when paged.
        match blocks {
            Some(n) => {
                config.check_pool(n)?;
                KvCache::check_pool_fits(&specs, n, BLOCK_SIZE, decoder.dtype())?;
            }
            None => KvCache::check_fits(
                &specs,
                config.max_sequences,
                config.capacity,
                decoder.dtype(),
                false,
            )?,
        }
        if blocks.is_none() && config.max_step_tokens.is_some() {
            return Err(Error::invalid(
                "max_step_tokens",
                "prompts are fed in chunks over a paged KV cache, and this model's keeps a timeline (a cache split over eager and compiled devices, or a model that reruns its history); leave max_step_tokens unset".into(),
            ));
        }
        let mut engine = Engine::with(
            Driven::Decoder(model),
            tokenizer,
            eos_ids,
            pad_id,
            (decoder.vocab_size(), compiled, config),
        );
        engine.pool = blocks.map(|n| BlockPool::new(n, BLOCK_SIZE));
        Ok(engine)
    }

    /// Whether an engine over `model` pages its cache: a decoder whose cache lies all on
    /// eager or all on compiled devices and is never recomputed (see the module docs).
    pub fn pages(model: &dyn CausalLm) -> bool {
        let decoder = model.model();
        let specs = decoder.cache_specs();
        let eager = specs.iter().all(|s| s.device.is_eager());
        let compiled = specs.iter().all(|s| !s.device.is_eager());
        (eager || compiled) && decoder.recompute_cache_at().is_none()
    }

    /// The blocks of the paged cache an engine over `model` makes under `config`, `None`
    /// when it keeps a timeline.
    fn blocks(model: &dyn CausalLm, config: EngineConfig) -> Option<usize> {
        let all = || {
            config
                .max_sequences
                .saturating_mul(config.capacity.div_ceil(BLOCK_SIZE))
        };
        Engine::pages(model).then(|| config.kv_blocks.unwrap_or_else(all))
    }

    /// The rows and the slots per row of the cache an engine over `model` makes under
    /// `config`: one row of the whole pool when paged, a row of `capacity` per sequence on
    /// a timeline.
    pub fn cache_shape(model: &dyn CausalLm, config: EngineConfig) -> (usize, usize) {
        match Engine::blocks(model, config) {
            Some(n) => (1, n.saturating_mul(BLOCK_SIZE)),
            None => (config.max_sequences, config.capacity),
        }
    }

    /// An engine over an encoder-decoder whose encoder already produced `hidden` (`[rows,
    /// seq, d_model]`, masked by `mask`): one cohort, added before the first step, decodes
    /// against it.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn seq2seq(
        model: &'m dyn Seq2SeqLm,
        tokenizer: Option<&'m Tokenizer>,
        eos_ids: &[u32],
        pad_id: u32,
        config: EngineConfig,
        hidden: Tensor,
        mask: Tensor,
    ) -> Result<Engine<'m>> {
        check_config(config)?;
        if config.max_step_tokens.is_some() {
            return Err(Error::invalid(
                "max_step_tokens",
                "an encoder-decoder's decoder starts from one token: there is no prompt to feed in chunks; leave max_step_tokens unset".into(),
            ));
        }
        let compiled = !model.logits_device().is_eager();
        Ok(Engine::with(
            Driven::Seq2Seq {
                model,
                hidden,
                mask,
            },
            tokenizer,
            eos_ids,
            pad_id,
            (model.vocab_size(), compiled, config),
        ))
    }

    fn with(
        driven: Driven<'m>,
        tokenizer: Option<&'m Tokenizer>,
        eos_ids: &[u32],
        pad_id: u32,
        (vocab, compiled, config): (usize, bool, EngineConfig),
    ) -> Engine<'m> {
        Engine {
            driven,
            tokenizer,
            default_eos: eos_ids.to_vec(),
            // Padding is masked out, so any id serves; some configs name a pad id past the
            // vocabulary (a token added to the tokenizer but not to the embeddings), which
            // the embedding lookup cannot take.
            pad_id: if (pad_id as usize) < vocab { pad_id } else { 0 },
            vocab,
            compiled,
            config,
            cache: None,
            rings: false,
            rows: (0..config.max_sequences).map(|_| None).collect(),
            cohorts: Vec::new(),
            waiting: VecDeque::new(),
            history: None,
            device: None,
            picking: Vec::new(),
            next_id: 0,
            prefix_caching: false,
            prefix_hits: (0, 0),
            pool: None,
            preempted: VecDeque::new(),
            preemptions: 0,
        }
    }

    /// Adds one sequence; it joins at the next step that has room (see the module docs).
    pub fn add(&mut self, prompt: Vec<u32>, opts: GenerationOptions) -> Result<SequenceId> {
        Ok(self.add_batch(vec![prompt], opts)?[0])
    }

    /// Adds sequences that share `opts` and one seeded stream, picked in row order (a batch
    /// of prompts as `generate` takes it); they join together.
    pub fn add_batch(
        &mut self,
        prompts: Vec<Vec<u32>>,
        opts: GenerationOptions,
    ) -> Result<Vec<SequenceId>> {
        let embeds = vec![None; prompts.len()];
        self.add_with_contexts(prompts.clone(), prompts, embeds, opts)
    }

    /// Adds one vision-language prompt (its image placeholders expanded, as
    /// [`crate::TextGenerator::image_prompt`] makes it) with its images' `pixel_values`: the
    /// model computes their features and the prompt joins with them in place
    /// ([`Engine::add_batch_with_embeds`]).
    pub fn add_with_images(
        &mut self,
        prompt: Vec<u32>,
        pixel_values: &Tensor,
        opts: GenerationOptions,
    ) -> Result<SequenceId> {
        let Driven::Decoder(m) = &self.driven else {
            return Err(Error::invalid(
                "images",
                "an encoder-decoder engine takes token prompts only".into(),
            ));
        };
        let embeds = crate::vision_language::prompt_embeds(*m, &prompt, pixel_values)?;
        Ok(self.add_batch_with_embeds(vec![prompt], vec![Some(embeds)], opts)?[0])
    }

    /// [`Engine::add_batch`] where a prompt's positions take the first layer's input from its
    /// `embeds` (`[prompt, hidden]`, on any device) instead of its tokens' embeddings: a
    /// vision-language prompt with its image features in place
    /// ([`crate::vision_language::prompt_embeds`]). Such prompts never share cached
    /// prefixes (their placeholder tokens do not say which image they hold).
    pub fn add_batch_with_embeds(
        &mut self,
        prompts: Vec<Vec<u32>>,
        embeds: Vec<Option<Tensor>>,
        opts: GenerationOptions,
    ) -> Result<Vec<SequenceId>> {
        let Driven::Decoder(m) = &self.driven else {
            return Err(Error::invalid(
                "embeds",
                "an encoder-decoder engine takes token prompts only".into(),
            ));
        };
        if embeds.len() != prompts.len() {
            return Err(Error::invalid(
                "embeds",
                format!("{} embeddings for {} prompts", embeds.len(), prompts.len()),
            ));
        }
        let base = m.model();
        if embeds.iter().any(Option::is_some) && base.recompute_cache_at().is_some() {
            return Err(Error::invalid(
                "embeds",
                "this model reruns whole sequences from their tokens at its rope switch, which prompt embeddings cannot join".into(),
            ));
        }
        for (p, e) in prompts.iter().zip(&embeds) {
            if let Some(e) = e
                .as_ref()
                .filter(|e| e.shape() != [p.len(), base.hidden_size()])
            {
                return Err(Error::invalid(
                    "embeds",
                    format!(
                        "prompt embeddings of shape {:?} for a prompt of {} tokens; expected [{}, {}]",
                        e.shape(),
                        p.len(),
                        p.len(),
                        base.hidden_size()
                    ),
                ));
            }
        }
        self.add_with_contexts(prompts.clone(), prompts, embeds, opts)
    }

    /// [`Engine::add_batch`] where each row's processors see `contexts` (an encoder-decoder's
    /// start token) while its output reports `prompts`.
    pub(crate) fn add_with_contexts(
        &mut self,
        prompts: Vec<Vec<u32>>,
        contexts: Vec<Vec<u32>>,
        embeds: Vec<Option<Tensor>>,
        opts: GenerationOptions,
    ) -> Result<Vec<SequenceId>> {
        super::check_request(self.tokenizer, &prompts, &opts, self.vocab)?;
        let (k, longest) = (
            contexts.len(),
            contexts.iter().map(Vec::len).max().unwrap_or(0),
        );
        let width = self.join_width(longest);
        if k > self.config.max_sequences
            || width.saturating_add(opts.max_new_tokens - 1) > self.config.capacity
        {
            return Err(Error::invalid(
                "max_new_tokens",
                format!(
                    "{k} sequence(s) of up to {longest} tokens and {} new ones do not fit an engine of \
                     {} sequences and {} slots; ask for fewer new tokens or a shorter prompt",
                    opts.max_new_tokens, self.config.max_sequences, self.config.capacity
                ),
            ));
        }
        let running = self.rows.iter().any(Option::is_some) || !self.waiting.is_empty();
        if let Driven::Decoder(m) = &self.driven {
            // A model built to stretch its context (dynamic NTK rope) runs past it, as in
            // transformers; other models would silently degrade, or index past learned
            // positions.
            let context = m.model().max_position_embeddings();
            if longest > context && !m.model().stretches_context() {
                return Err(Error::invalid(
                    "prompt",
                    format!(
                        "the prompt has {longest} tokens but the model's context (max_position_embeddings) is {context}; \
                         shorten it (generation itself may run past the context, as in transformers)"
                    ),
                ));
            }
        }
        match &self.driven {
            Driven::Seq2Seq { .. } if running => {
                return Err(Error::invalid(
                    "prompts",
                    "an encoder-decoder engine decodes the one batch its encoder read; start another for more prompts".into(),
                ));
            }
            Driven::Decoder(m) if running && m.model().recompute_cache_at().is_some() => {
                return Err(Error::invalid(
                    "prompts",
                    "this model reruns whole sequences at its rope switch, which sequences that joined at other steps cannot share; wait for the running ones to finish".into(),
                ));
            }
            _ => {}
        }
        let eos = opts
            .eos_token_ids
            .clone()
            .unwrap_or_else(|| self.default_eos.clone());
        let cohort = Cohort {
            rng: Generator::new(opts.seed),
            opts,
            eos,
            longest_context: longest,
            steps: 0,
        };
        let members: Vec<Member> = prompts
            .into_iter()
            .zip(contexts)
            .zip(embeds)
            .map(|((prompt, context), embeds)| {
                self.next_id += 1;
                Member {
                    id: SequenceId(self.next_id),
                    prompt,
                    context,
                    embeds,
                }
            })
            .collect();
        let ids = members.iter().map(|m| m.id).collect();
        self.waiting.push_back(Waiting { cohort, members });
        Ok(ids)
    }

    /// Whether nothing runs or waits.
    pub fn is_idle(&self) -> bool {
        self.waiting.is_empty()
            && self.preempted.is_empty()
            && !self.rows.iter().flatten().any(|s| s.done.is_none())
    }

    /// Sequences running (not yet stopped) and waiting (preempted ones included).
    pub fn counts(&self) -> (usize, usize) {
        let running = self.rows.iter().flatten().filter(|s| s.done.is_none());
        let waiting: usize = self.waiting.iter().map(|w| w.members.len()).sum();
        (running.count(), waiting + self.preempted.len())
    }

    /// A paged engine's KV blocks: held by running sequences, and in all.
    pub fn kv_blocks(&self) -> Option<(usize, usize)> {
        self.pool.as_ref().map(|p| (p.used(), p.total()))
    }

    /// Sequences preempted so far for want of KV blocks (each ran again later).
    pub fn preemptions(&self) -> u64 {
        self.preemptions
    }

    /// Turns prefix caching on or off: a joining prompt whose first full blocks of
    /// [`BLOCK_SIZE`] tokens the cache still holds reuses their keys and values instead of
    /// computing them, as vLLM's automatic prefix caching does; only the rest is fed. Cached
    /// blocks are shared by the sequences that hold them and kept after they leave, until the
    /// pool needs them (least recently used first). Paged engines only: a timeline (an
    /// encoder-decoder, a model that reruns its history, a cache split over eager and
    /// compiled devices) cannot share blocks.
    pub fn set_prefix_caching(&mut self, on: bool) -> Result<()> {
        let supported = self.pool.is_some();
        if !self.is_idle() || self.rows.iter().any(Option::is_some) {
            return Err(Error::invalid(
                "prefix_caching",
                "turn prefix caching on or off before adding sequences".into(),
            ));
        }
        if on && !supported {
            return Err(Error::invalid(
                "prefix_caching",
                "prefix caching runs on decoders whose cache is paged (on eager or on compiled devices, never recomputed); this engine's model is an encoder-decoder, reruns its history or splits its cache over eager and compiled devices".into(),
            ));
        }
        self.prefix_caching = on;
        if let Some(pool) = self.pool.as_mut().filter(|_| !on) {
            pool.forget_cached();
        }
        Ok(())
    }

    /// Sequences that reused a cached prompt prefix so far, and the prompt tokens they did
    /// not compute.
    pub fn prefix_hits(&self) -> (u64, u64) {
        self.prefix_hits
    }

    /// Stops sequence `id` (running or waiting) and returns what it generated, `None` when no
    /// such sequence runs or waits.
    pub fn cancel(&mut self, id: SequenceId) -> Result<Option<GenerationOutput>> {
        for w in &mut self.waiting {
            if let Some(i) = w.members.iter().position(|m| m.id == id) {
                let m = w.members.remove(i);
                self.waiting.retain(|w| !w.members.is_empty());
                return Ok(Some(GenerationOutput {
                    prompt_ids: m.prompt,
                    token_ids: Vec::new(),
                    text: self.tokenizer.map(|_| String::new()),
                    stop_reason: StopReason::Cancelled,
                }));
            }
        }
        let preempted = self.preempted.iter().position(|s| s.id == id);
        if let Some(mut seq) = preempted.and_then(|i| self.preempted.remove(i)) {
            seq.done = Some(StopReason::Cancelled);
            let output = output_of(&mut seq)?;
            self.forget_cohorts();
            return Ok(Some(output));
        }
        let Some(row) = self
            .rows
            .iter()
            .position(|s| s.as_ref().is_some_and(|s| s.id == id && s.done.is_none()))
        else {
            return Ok(None);
        };
        let output = {
            let seq = self.rows[row].as_mut().expect("the row found above");
            seq.done = Some(StopReason::Cancelled);
            output_of(seq)?
        };
        self.release_done();
        Ok(Some(output))
    }

    /// One step: admits waiting sequences that fit, runs one forward pass over every row
    /// (joiners' prompts and running rows' last tokens together) and picks each running
    /// sequence's next token. Events come in row order, each `Finished` after its sequence's
    /// last `Token`. Does nothing when idle.
    ///
    /// A lone cohort on a compiled device samples on the device and runs one step ahead: it
    /// records step N+1 from the device's picks of step N and dispatches it before reading
    /// those picks back, so the device never waits for the host's recording (a stop before
    /// `max_new_tokens` then leaves one step computed for nothing). A sequence that asks to
    /// join ends the running ahead (the host feeds the next step), and the picks move to the
    /// host for the rest of the run. Sampled cohorts of several rows stay in lockstep: a row
    /// that stops draws no more numbers from the seeded stream, which the step ahead would
    /// already have drawn.
    pub fn step(&mut self) -> Result<Vec<EngineEvent>> {
        let mut events = Vec::new();
        if let Some(ids) = self.device.as_mut().and_then(|a| a.queued.take()) {
            self.run_ahead(ids, &mut events)?;
            return Ok(events);
        }
        self.release_done();
        self.admit()?;
        if !self.rows.iter().flatten().any(|s| s.done.is_none()) {
            return Ok(events);
        }
        let logits = self.forward_host()?;
        if self.device.is_some() {
            let ids = self.pick_on_device(&logits, 0)?;
            if self.ahead() {
                ids.dispatch()?;
                self.run_ahead(ids, &mut events)?;
            } else {
                let host = ids.to_vec::<i64>()?;
                let picked: Vec<Option<u32>> = host.into_iter().map(|t| Some(t as u32)).collect();
                self.accept(&picked, &mut events)?;
            }
        } else {
            let picked = self.pick_on_host(&logits)?;
            self.accept(&picked, &mut events)?;
        }
        Ok(events)
    }

    /// Whether the lone cohort runs ahead of the host (see [`Engine::step`]).
    fn ahead(&self) -> bool {
        let Driven::Decoder(model) = &self.driven else {
            return false;
        };
        let lone = self.cohorts.iter().flatten().count() == 1;
        let sampled = self.cohorts.iter().flatten().any(|c| c.opts.do_sample);
        let rows = self.rows.iter().flatten().count();
        self.compiled
            && lone
            && model.model().recompute_cache_at().is_none()
            && (!sampled || rows == 1)
            && self.blocks_to_the_end()
    }

    /// Whether the pool holds blocks for every running sequence's tokens through its last
    /// (always, on a timeline): running ahead must not need a preemption.
    fn blocks_to_the_end(&self) -> bool {
        let Some(pool) = &self.pool else {
            return true;
        };
        let needed: usize = self
            .rows
            .iter()
            .flatten()
            .filter(|s| s.done.is_none())
            .map(|s| {
                let max = self
                    .cohorts
                    .get(s.cohort)
                    .and_then(Option::as_ref)
                    .map_or(0, |c| c.opts.max_new_tokens);
                let end = s.context.len() + max;
                pool.blocks_for(end).saturating_sub(s.table.len())
            })
            .sum();
        needed <= pool.available()
    }

    /// The step of device picks `ids` (dispatched): records the step after from them unless
    /// the cohort is at its last token or a sequence waits to join, then reads them back.
    fn run_ahead(&mut self, ids: Tensor, events: &mut Vec<EngineEvent>) -> Result<()> {
        let steps = self.lone_cohort().map_or(0, |c| c.steps);
        let max = self.lone_cohort().map_or(0, |c| c.opts.max_new_tokens);
        if steps + 1 < max && self.waiting.is_empty() {
            // The logits go before the dispatch: only the ids are the program's.
            let logits = self.forward_device(&ids)?;
            let next = self.pick_on_device(&logits, 1)?;
            next.dispatch()?;
            if let Some(a) = self.device.as_mut() {
                a.queued = Some(next);
            }
        }
        let host = ids.to_vec::<i64>()?;
        let picked: Vec<Option<u32>> = host.into_iter().map(|t| Some(t as u32)).collect();
        self.accept(&picked, events)?;
        if self.rows.iter().flatten().all(|s| s.done.is_some()) {
            // A queued step past every stop is dropped.
            if let Some(a) = self.device.as_mut() {
                a.queued = None;
            }
        }
        Ok(())
    }

    /// The device sampler of a joining cohort that is `lone` (it fills every row of an
    /// idle engine) on a compiled device and needs no host processor; `None` otherwise (the
    /// picks are on the host).
    fn device_sampler(
        &self,
        lone: bool,
        cohort: &Cohort,
        contexts: &[Vec<u32>],
    ) -> Result<Option<Ahead>> {
        if !(self.compiled && lone) || cohort.opts.needs_host_processors() {
            return Ok(None);
        }
        let sampler = DeviceSampler::new(
            &cohort.opts,
            contexts,
            &cohort.eos,
            self.vocab,
            &self.logits_device(),
        )?;
        Ok(Some(Ahead {
            sampler,
            queued: None,
        }))
    }

    /// The device the model's logits come out on.
    fn logits_device(&self) -> Device {
        match &self.driven {
            Driven::Decoder(m) => m.logits_device(),
            Driven::Seq2Seq { model, .. } => model.logits_device(),
        }
    }

    fn lone_cohort(&self) -> Option<&Cohort> {
        self.cohorts.iter().flatten().next()
    }

    /// Picks with the lone cohort's device sampler for its step `ahead` steps from now, one
    /// uniform per row still generating drawn from its stream.
    fn pick_on_device(&mut self, logits: &Tensor, ahead: usize) -> Result<Tensor> {
        let Some(c) = self.cohorts.iter_mut().flatten().next() else {
            return Err(Error::Internal(
                "a device sampler without its cohort".into(),
            ));
        };
        let uniforms: Vec<f64> = self
            .rows
            .iter()
            .map(|s| match s {
                Some(s) if c.opts.do_sample && s.done.is_none() => c.rng.next_f64(),
                _ => 0.0,
            })
            .collect();
        let step = c.steps + ahead;
        let Some(a) = self.device.as_mut() else {
            return Err(Error::Internal("no device sampler".into()));
        };
        let ids = a.sampler.pick(logits, step, &uniforms)?;
        a.sampler.observe(&ids)?;
        Ok(ids)
    }

    /// Each running row's next token through the host processors, per row (`None` for a row
    /// the step gave no logits: free, finished or mid-prompt), each cohort drawing from its
    /// own stream in row order. `logits` holds a row per entry of `picking`, then any rows a
    /// bucket added.
    fn pick_on_host(&mut self, logits: &Tensor) -> Result<Vec<Option<u32>>> {
        let rows = logits.to_dtype(DType::F32)?.to_vec::<f32>()?;
        let vocab = self.vocab;
        if rows.len() % vocab.max(1) != 0 || rows.len() < self.picking.len() * vocab {
            return Err(Error::Internal(format!(
                "the model returned {} logits for {} rows of {vocab}",
                rows.len(),
                self.picking.len()
            )));
        }
        let mut picked = vec![None; self.rows.len()];
        for (&b, scores) in self.picking.iter().zip(rows.chunks(vocab)) {
            let Some(seq) = self.rows[b].as_ref().filter(|s| s.done.is_none()) else {
                continue;
            };
            let Some(c) = self.cohorts.get_mut(seq.cohort).and_then(Option::as_mut) else {
                return Err(Error::Internal("a sequence without its cohort".into()));
            };
            let mut scores = scores.to_vec();
            // The row as transformers' processors see it: left pads, then its context and
            // what it generated (built only when one reads it).
            let (ids, pads) = if c.opts.reads_sequence() {
                let pads = c.longest_context - seq.context.len();
                let ids: Vec<u32> = std::iter::repeat_n(self.pad_id, pads)
                    .chain(seq.context.iter().copied())
                    .chain(seq.generated.iter().copied())
                    .collect();
                (ids, pads)
            } else {
                (Vec::new(), 0)
            };
            let row = Row { seq: &ids, pads };
            let step = seq.generated.len();
            picked[b] = Some(pick(&mut scores, row, step, &c.eos, &c.opts, &mut c.rng));
        }
        Ok(picked)
    }

    /// Takes each running row's pick: streams it, stops the row on eos, a stop string or its
    /// length, and feeds it at the next step. A row without a pick (mid-prompt) waits.
    fn accept(&mut self, picked: &[Option<u32>], events: &mut Vec<EngineEvent>) -> Result<()> {
        let mut stepped = vec![false; self.cohorts.len()];
        for (b, &id) in picked.iter().enumerate() {
            let Some(id) = id else {
                continue;
            };
            let Some(seq) = self.rows[b].as_mut().filter(|s| s.done.is_none()) else {
                continue;
            };
            if let Some(x) = stepped.get_mut(seq.cohort) {
                *x = true;
            }
            let Some(c) = self.cohorts.get(seq.cohort).and_then(Option::as_ref) else {
                return Err(Error::Internal("a sequence without its cohort".into()));
            };
            seq.generated.push(id);
            seq.feed = vec![id];
            let mut piece = String::new();
            if let Some(s) = seq.stream.as_mut() {
                piece = s.push(id)?;
                seq.text.push_str(&piece);
            }
            events.push(EngineEvent::Token {
                id: seq.id,
                token_id: id,
                text: piece,
            });
            let n = seq.generated.len();
            if c.eos.contains(&id) && n >= c.opts.min_new_tokens {
                seq.done = Some(StopReason::Eos);
            } else if let Some(cut) = stop_string_end(&seq.text, &c.opts.stop_strings) {
                seq.text.truncate(cut);
                seq.done = Some(StopReason::StopString);
            } else if n >= c.opts.max_new_tokens {
                seq.done = Some(StopReason::Length);
            }
            if seq.done.is_some() {
                events.push(EngineEvent::Finished {
                    id: seq.id,
                    output: output_of(seq)?,
                });
            }
        }
        for (c, _) in self.cohorts.iter_mut().zip(stepped).filter(|x| x.1) {
            if let Some(c) = c {
                c.steps += 1;
            }
        }
        if self.device.as_ref().is_none_or(|a| a.queued.is_none()) {
            self.release_done();
        }
        Ok(())
    }

    /// Frees the rows of stopped sequences and forgets cohorts without sequences.
    fn release_done(&mut self) {
        if self.device.as_ref().is_some_and(|a| a.queued.is_some()) {
            return;
        }
        for row in &mut self.rows {
            if row.as_ref().is_some_and(|s| s.done.is_some()) {
                if let (Some(pool), Some(seq)) = (self.pool.as_mut(), row.as_ref()) {
                    seq.table.iter().for_each(|&b| pool.release(b));
                }
                *row = None;
            }
        }
        self.forget_cohorts();
    }

    /// Forgets cohorts no running or preempted sequence belongs to.
    fn forget_cohorts(&mut self) {
        for (i, c) in self.cohorts.iter_mut().enumerate() {
            let held = self
                .rows
                .iter()
                .flatten()
                .chain(&self.preempted)
                .any(|s| s.cohort == i);
            if c.is_some() && !held {
                *c = None;
            }
        }
        if self.cohorts.iter().all(Option::is_none) {
            self.cohorts.clear();
            self.device = None;
        }
    }

    /// Moves waiting cohorts, in order, into free rows while they fit: their rows, their
    /// padded prompts on the timeline and every running row's remaining tokens within the
    /// capacity. An idle engine starts the timeline over first.
    fn admit(&mut self) -> Result<()> {
        if self.pool.is_some() {
            return self.admit_paged();
        }
        while let Some(w) = self.waiting.front() {
            let longest = w.members.iter().map(|m| m.context.len()).max().unwrap_or(1);
            if self.rows.iter().all(Option::is_none) {
                let lone = w.members.len() == self.rows.len();
                self.start_over(lone)?;
            } else if self.rings {
                // Ring layers hold a lone cohort's rows gapless: joiners wait for its end.
                break;
            }
            let Some(w) = self.waiting.front() else {
                break;
            };
            let Some(cache) = self.cache.as_ref() else {
                return Err(Error::Internal("an engine without its cache".into()));
            };
            let running: Vec<&Sequence> = self.rows.iter().flatten().collect();
            let free: Vec<usize> = (0..self.rows.len())
                .filter(|&b| self.rows[b].is_none())
                .collect();
            if free.len() < w.members.len() {
                break;
            }
            let remaining = running
                .iter()
                .filter_map(|s| {
                    let c = self.cohorts.get(s.cohort)?.as_ref()?;
                    Some(c.opts.max_new_tokens - s.generated.len())
                })
                .max()
                .unwrap_or(0)
                .max(w.cohort.opts.max_new_tokens);
            if cache.len() + self.join_width(longest) + remaining - 1 > self.config.capacity {
                break;
            }
            let Some(w) = self.waiting.pop_front() else {
                break;
            };
            let lone = running.is_empty() && w.members.len() == self.rows.len();
            let index = self.cohorts.len();
            // A lone cohort samples on the device; beside another, the picks are on the host.
            let contexts: Vec<Vec<u32>> = w.members.iter().map(|m| m.context.clone()).collect();
            self.device = self.device_sampler(lone, &w.cohort, &contexts)?;
            for (m, b) in w.members.into_iter().zip(free) {
                let Some(cache) = self.cache.as_mut() else {
                    return Err(Error::Internal("an engine without its cache".into()));
                };
                cache.clear_row(b);
                self.rows[b] = Some(Sequence {
                    id: m.id,
                    cohort: index,
                    prompt: m.prompt,
                    feed: m.context.clone(),
                    context: m.context,
                    generated: Vec::new(),
                    stream: self.tokenizer.map(|t| t.stream(true)),
                    text: String::new(),
                    done: None,
                    position: 0,
                    table: Vec::new(),
                    hashes: Vec::new(),
                    embeds: m.embeds,
                });
            }
            self.cohorts.push(Some(w.cohort));
        }
        Ok(())
    }

    /// [`Engine::admit`] of a paged engine: preempted sequences first, then waiting cohorts,
    /// in order, each into free rows with blocks for its tokens (cached prefix blocks held,
    /// the rest taken from the pool); the first that does not fit waits, and so does all
    /// behind it.
    fn admit_paged(&mut self) -> Result<()> {
        if self.cache.is_none() {
            let (Driven::Decoder(m), Some(pool)) = (&self.driven, &self.pool) else {
                return Err(Error::Internal("a paged engine without a decoder".into()));
            };
            let base = m.model();
            let (rows, blocks) = (self.config.max_sequences, pool.total());
            let specs = base.cache_specs();
            self.cache = Some(KvCache::paged(
                &specs,
                rows,
                blocks,
                BLOCK_SIZE,
                base.dtype(),
            )?);
        }
        while let Some(seq) = self.preempted.front() {
            let Some(b) = self.rows.iter().position(Option::is_none) else {
                return Ok(());
            };
            let tokens = seq.tokens();
            let cacheable = seq.embeds.is_none();
            let Some((table, hashes, reused)) = self.take_blocks(&tokens, cacheable) else {
                return Ok(());
            };
            let Some(mut seq) = self.preempted.pop_front() else {
                break;
            };
            self.count_hit(reused);
            (seq.table, seq.hashes, seq.position) = (table, hashes, reused);
            seq.feed = tokens[reused..].to_vec();
            self.rows[b] = Some(seq);
        }
        while let Some(w) = self.waiting.front() {
            let free: Vec<usize> = (0..self.rows.len())
                .filter(|&b| self.rows[b].is_none())
                .collect();
            if free.len() < w.members.len() {
                break;
            }
            let contexts: Vec<Vec<u32>> = w.members.iter().map(|m| m.context.clone()).collect();
            let cacheable: Vec<bool> = w.members.iter().map(|m| m.embeds.is_none()).collect();
            let mut taken = Vec::new();
            for (context, &cacheable) in contexts.iter().zip(&cacheable) {
                match self.take_blocks(context, cacheable) {
                    Some(t) => taken.push(t),
                    None => break,
                }
            }
            if taken.len() < contexts.len() {
                // The cohort waits whole: what it took goes back.
                if let Some(pool) = self.pool.as_mut() {
                    taken
                        .iter()
                        .flat_map(|t| &t.0)
                        .for_each(|&b| pool.release(b));
                }
                break;
            }
            let Some(w) = self.waiting.pop_front() else {
                break;
            };
            let lone = self.rows.iter().all(Option::is_none)
                && self.preempted.is_empty()
                && w.members.len() == self.rows.len();
            self.device = self.device_sampler(lone, &w.cohort, &contexts)?;
            let index = self.cohorts.len();
            for ((m, b), (table, hashes, reused)) in w.members.into_iter().zip(free).zip(taken) {
                self.count_hit(reused);
                self.rows[b] = Some(Sequence {
                    id: m.id,
                    cohort: index,
                    prompt: m.prompt,
                    feed: m.context[reused..].to_vec(),
                    context: m.context,
                    generated: Vec::new(),
                    stream: self.tokenizer.map(|t| t.stream(true)),
                    text: String::new(),
                    done: None,
                    position: reused,
                    table,
                    hashes,
                    embeds: m.embeds,
                });
            }
            self.cohorts.push(Some(w.cohort));
        }
        Ok(())
    }

    /// Blocks for a sequence about to be fed `tokens`: the cached blocks its first full
    /// blocks match (with prefix caching; never the last token, whose logits the step needs)
    /// and new ones for the rest. Returns the table, the keys of the cached blocks and the
    /// tokens they hold, or `None` (nothing taken) when the pool has too few blocks. A
    /// sequence that is not `cacheable` takes new blocks only.
    fn take_blocks(
        &mut self,
        tokens: &[u32],
        cacheable: bool,
    ) -> Option<(Vec<BlockId>, Vec<u64>, usize)> {
        let caching = self.prefix_caching && cacheable;
        let pool = self.pool.as_mut()?;
        let reusable = tokens.len().saturating_sub(1) / BLOCK_SIZE;
        let (hits, idle) = if caching {
            pool.cached_prefix(tokens, reusable)
        } else {
            (0, 0)
        };
        let needed = pool.blocks_for(tokens.len().max(1));
        // Cached blocks nothing holds count as available until they are taken.
        if needed - hits > pool.available() - idle {
            return None;
        }
        let (mut table, hashes) = pool.take_prefix(tokens, hits);
        while table.len() < needed {
            table.push(pool.allocate()?);
        }
        // In slot order, so that a causal pass's keys are in position order and each query
        // computes only up to its own.
        table[hits..].sort_unstable();
        let reused = hashes.len() * BLOCK_SIZE;
        Some((table, hashes, reused))
    }

    /// Counts a sequence that joined with `reused` tokens from the prefix cache.
    fn count_hit(&mut self, reused: usize) {
        if reused > 0 {
            self.prefix_hits.0 += 1;
            self.prefix_hits.1 += reused as u64;
        }
    }

    /// Before a paged step: each running sequence holds blocks for what it feeds, the one
    /// that arrived last preempted while the pool has none to give (see the module docs).
    fn grow_tables(&mut self) -> Result<()> {
        loop {
            let short = self.rows.iter().position(|s| {
                s.as_ref().is_some_and(|s| {
                    s.done.is_none() && s.table.len() * BLOCK_SIZE < s.position + s.feed.len()
                })
            });
            let Some(b) = short else {
                return Ok(());
            };
            let Some(pool) = self.pool.as_mut() else {
                return Err(Error::Internal("a paged step without its pool".into()));
            };
            if let Some(block) = pool.allocate() {
                if let Some(seq) = self.rows[b].as_mut() {
                    seq.table.push(block);
                }
                continue;
            }
            let victim = self
                .rows
                .iter()
                .enumerate()
                .filter_map(|(r, s)| Some((r, s.as_ref()?)))
                .filter(|(_, s)| s.done.is_none())
                .max_by_key(|(_, s)| s.id)
                .map(|(r, _)| r);
            let running = self
                .rows
                .iter()
                .flatten()
                .filter(|s| s.done.is_none())
                .count();
            let Some(r) = victim.filter(|_| running > 1) else {
                return Err(Error::Internal(
                    "the KV pool cannot hold one sequence's tokens".into(),
                ));
            };
            self.preempt(r);
        }
    }

    /// Preempts the sequence in row `r`: its blocks go back to the pool (full ones stay
    /// cached with prefix caching) and it waits at the head of the queue to be fed all its
    /// tokens again.
    fn preempt(&mut self, r: usize) {
        let Some(mut seq) = self.rows[r].take() else {
            return;
        };
        if let Some(pool) = self.pool.as_mut() {
            seq.table.drain(..).for_each(|b| pool.release(b));
        }
        seq.hashes.clear();
        seq.position = 0;
        if let Some(cache) = self.cache.as_mut() {
            cache.clear_row(r);
        }
        self.preemptions += 1;
        self.preempted.push_front(seq);
    }

    /// After a paged step: the blocks its sequences filled are cached under their chain keys
    /// (with prefix caching), so that later prompts starting with them hold them.
    fn cache_full_blocks(&mut self) {
        let (Some(pool), true) = (self.pool.as_mut(), self.prefix_caching) else {
            return;
        };
        for seq in self
            .rows
            .iter_mut()
            .flatten()
            .filter(|s| s.embeds.is_none())
        {
            // Running ahead, the last position's token is not known yet.
            let known = seq.position.min(seq.context.len() + seq.generated.len());
            let full = (known / BLOCK_SIZE).min(seq.table.len());
            if seq.hashes.len() >= full {
                continue;
            }
            let tokens = [seq.context.as_slice(), &seq.generated].concat();
            for i in seq.hashes.len()..full {
                let parent = i.checked_sub(1).map(|p| seq.hashes[p]);
                let block = &tokens[i * BLOCK_SIZE..(i + 1) * BLOCK_SIZE];
                seq.hashes.push(pool.register(seq.table[i], parent, block));
            }
        }
    }

    /// Starts the timeline over on an idle engine: forgets every token, and makes the cache
    /// (again) when it has none or the wrong kind of sliding layers for what joins now.
    fn start_over(&mut self, lone: bool) -> Result<()> {
        self.history = None;
        self.device = None;
        let rings = lone;
        if let Some(cache) = self.cache.as_mut().filter(|_| self.rings == rings) {
            cache.reset();
            return Ok(());
        }
        // The old buffers go before the new ones are allocated.
        self.cache = None;
        let (rows, capacity) = (self.config.max_sequences, self.config.capacity);
        self.cache = Some(match &self.driven {
            Driven::Decoder(m) => {
                let base = m.model();
                KvCache::from_specs_with(&base.cache_specs(), rows, capacity, base.dtype(), rings)?
            }
            Driven::Seq2Seq { model, .. } => model.new_cache(rows, capacity)?,
        });
        self.rings = rings;
        Ok(())
    }

    /// The slots a row joining with `longest` tokens takes on a timeline: a prompt bucket on
    /// compiled devices (a handful of prefill programs serve every prompt), the length itself
    /// eagerly and when paged (padding takes no slot); an encoder-decoder's decoder starts
    /// from one token.
    fn join_width(&self, longest: usize) -> usize {
        match self.driven {
            Driven::Seq2Seq { .. } => 1,
            Driven::Decoder(_) if self.compiled && self.pool.is_none() => prompt_bucket(longest),
            Driven::Decoder(_) => longest,
        }
    }

    /// One forward pass feeding every running row its `feed` from the host, left-padded to
    /// one width (packed when paged); the logits of each row's last column.
    fn forward_host(&mut self) -> Result<Tensor> {
        if self.pool.is_some() {
            return self.forward_packed();
        }
        let live = |s: &&Sequence| s.done.is_none();
        let longest = self
            .rows
            .iter()
            .flatten()
            .filter(live)
            .map(|s| s.feed.len())
            .max();
        let longest = longest.unwrap_or(1);
        let t = if longest > 1 || self.rows.iter().flatten().any(|s| s.generated.is_empty()) {
            self.join_width(longest)
        } else {
            1
        };
        let n = self.rows_to_run();
        let (mut ids, mut pos, mut mask) = (
            Vec::with_capacity(n * t),
            Vec::with_capacity(n * t),
            Vec::with_capacity(n),
        );
        let mut spans = Vec::new();
        for (b, row) in self.rows.iter_mut().take(n).enumerate() {
            let paged = self.cache.as_mut().filter(|c| c.is_paged());
            match row.as_mut().filter(|s| s.done.is_none()) {
                Some(s) => {
                    let pad = t - s.feed.len();
                    if let Some(cache) = paged {
                        cache.set_table(b, &s.table, s.position)?;
                    }
                    ids.extend(
                        std::iter::repeat_n(self.pad_id as i64, pad)
                            .chain(s.feed.iter().map(|&t| t as i64)),
                    );
                    let p = s.position as i64;
                    pos.extend(std::iter::repeat_n(0i64, pad).chain(p..p + s.feed.len() as i64));
                    mask.push((0..t).map(|i| i >= pad).collect::<Vec<bool>>());
                    spans.extend(Span::of(s, b, pad, s.feed.len()));
                    s.position += s.feed.len();
                }
                None => {
                    if let Some(cache) = paged {
                        cache.set_table(b, &[], 0)?;
                    }
                    ids.extend(std::iter::repeat_n(self.pad_id as i64, t));
                    pos.extend(std::iter::repeat_n(0i64, t));
                    mask.push(vec![false; t]);
                }
            }
        }
        let Some(cache) = self.cache.as_mut() else {
            return Err(Error::Internal("an engine without its cache".into()));
        };
        cache.set_rows(n)?;
        match &self.driven {
            Driven::Decoder(model) => {
                let device = model.model().device();
                let recomputes = model.model().recompute_cache_at().is_some();
                if recomputes && !cache.is_empty() {
                    let Some(history) = self.history.as_mut() else {
                        return Err(Error::Internal(
                            "a recomputing model without history".into(),
                        ));
                    };
                    history.push(&ids, &pos);
                    return decode_step(*model, cache, history);
                }
                if recomputes {
                    let real = longest;
                    self.history = Some(DecodeHistory::new(&ids, &pos, &mask, t, t - real));
                }
                let input = Tensor::from_vec(ids, &[n, t], &device)?;
                let positions = Tensor::from_vec(pos, &[n, t], &device)?;
                let embeds = splice(*model, &input, &spans)?;
                let args = ForwardArgs {
                    input_ids: &input,
                    position_ids: &positions,
                    attention_mask: Some(&mask),
                    output_hidden_states: false,
                    inputs_embeds: embeds.as_ref(),
                };
                self.picking = (0..n).collect();
                Ok(model.forward(args, cache, LogitsFor::Last)?.0)
            }
            Driven::Seq2Seq { .. } => {
                let host = Device::Cpu;
                let input = Tensor::from_vec(ids, &[n, 1], &host)?;
                self.picking = (0..n).collect();
                self.decode_seq2seq(input, pos)
            }
        }
    }

    /// A paged step: the running rows' tokens packed into one row, `[1, T]`, each column
    /// writing and reading its own sequence's blocks (see [`KvCache::set_packing`]), so that
    /// no row is padded to the longest. Rows feeding one token go first; then prompts in
    /// arrival order, each as much as [`EngineConfig::max_step_tokens`] leaves (the rest at
    /// the next steps). On compiled devices `T` and the logits' columns are rounded up to
    /// buckets. The logits of each row that fed its last token, in row order. A decode (one
    /// token a row) goes to [`Engine::forward_decode`].
    fn forward_packed(&mut self) -> Result<Tensor> {
        self.grow_tables()?;
        // The lone cohort sampled on the device reads every row at every step: whole prompts.
        let mut left = match self.device {
            Some(_) => usize::MAX,
            None => self.config.max_step_tokens.unwrap_or(usize::MAX),
        };
        let live: Vec<usize> = (0..self.rows.len())
            .filter(|&b| self.rows[b].as_ref().is_some_and(|s| s.done.is_none()))
            .collect();
        let mut order = live.clone();
        order.sort_by_key(|&b| {
            let s = self.rows[b].as_ref();
            (s.is_some_and(|s| s.feed.len() > 1), s.map(|s| s.id))
        });
        let mut chunk = vec![0; self.rows.len()];
        for b in order {
            let want = self.rows[b].as_ref().map_or(0, |s| s.feed.len());
            chunk[b] = want.min(left);
            left -= chunk[b];
        }
        let one_each = live.iter().all(|&b| {
            self.rows[b]
                .as_ref()
                .is_some_and(|s| s.feed.len() == 1 && Span::of(s, 0, 0, 1).is_none())
        });
        if one_each {
            return self.forward_decode(&live);
        }
        let (Driven::Decoder(model), Some(cache)) = (&self.driven, self.cache.as_mut()) else {
            return Err(Error::Internal("a paged engine without its cache".into()));
        };
        let (mut ids, mut pos, mut owners, mut last) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let mut spans = Vec::new();
        self.picking.clear();
        for &b in &live {
            let Some(s) = self.rows[b].as_mut().filter(|_| chunk[b] > 0) else {
                continue;
            };
            let k = chunk[b];
            cache.set_table(b, &s.table, s.position)?;
            spans.extend(Span::of(s, 0, ids.len(), k));
            ids.extend(s.feed[..k].iter().map(|&t| t as i64));
            pos.extend((s.position..s.position + k).map(|p| p as i64));
            owners.extend(std::iter::repeat_n(Some(b), k));
            if k == s.feed.len() {
                self.picking.push(b);
                last.push(ids.len() - 1);
            }
            s.position += k;
            s.feed.drain(..k);
        }
        // Compiled: the step's prompt bucket.
        let real = ids.len();
        let width = match self.compiled {
            true => prompt_bucket(real),
            false => real,
        };
        ids.resize(width, self.pad_id as i64);
        pos.resize(width, 0);
        owners.resize(width, None);
        let mask = vec![(0..width).map(|i| i < real).collect::<Vec<bool>>()];
        // A step that completes no prompt still runs (its keys are written); its logits are
        // not read. Compiled, with picks on the host: a power of two of columns, the last
        // repeated (the rows past `picking` are not read).
        let mut columns = if last.is_empty() {
            vec![real - 1]
        } else {
            last
        };
        if self.compiled && self.device.is_none() {
            let n = columns.len().next_power_of_two();
            let end = columns[columns.len() - 1];
            columns.resize(n, end);
        }
        cache.set_rows(1)?;
        cache.set_packing(Some(owners))?;
        let device = model.model().device();
        let input = Tensor::from_vec(ids, &[1, width], &device)?;
        let positions = Tensor::from_vec(pos, &[1, width], &device)?;
        let embeds = splice(*model, &input, &spans)?;
        let args = ForwardArgs {
            input_ids: &input,
            position_ids: &positions,
            attention_mask: Some(&mask),
            output_hidden_states: false,
            inputs_embeds: embeds.as_ref(),
        };
        let logits = model.forward(args, cache, LogitsFor::Columns(&columns))?.0;
        self.cache_full_blocks();
        let vocab = logits.dim(2)?;
        Ok(logits.reshape_to(&[columns.len(), vocab])?)
    }

    /// Rows a host-fed step runs: through the last running one when every layer's cache is
    /// on an eager device, so that free rows at the end cost no compute; all of them where
    /// shapes stay fixed (a compiled device anywhere, a model that reruns its history, an
    /// encoder-decoder's cross-attention).
    fn rows_to_run(&self) -> usize {
        let eager_cache = self
            .cache
            .as_ref()
            .is_some_and(|c| c.devices().iter().all(|d| d.is_eager()));
        let fixed = self.compiled
            || !eager_cache
            || match &self.driven {
                Driven::Decoder(m) => m.model().recompute_cache_at().is_some(),
                Driven::Seq2Seq { .. } => true,
            };
        if fixed {
            return self.rows.len();
        }
        self.rows
            .iter()
            .rposition(|r| r.as_ref().is_some_and(|s| s.done.is_none()))
            .map_or(1, |last| last + 1)
    }

    /// A paged step where every running row (`live`) feeds one token: one input row per
    /// engine row through the last running one (on compiled devices a power of two of them),
    /// each query reading its own table. Unpacked, the fused CPU attention reads each
    /// query's keys where they lie rather than packing the pool for a shared tile.
    fn forward_decode(&mut self, live: &[usize]) -> Result<Tensor> {
        let last = live.last().map_or(1, |&b| b + 1);
        let n = match self.compiled {
            true => last.next_power_of_two().min(self.rows.len()),
            false => last,
        };
        let (Driven::Decoder(model), Some(cache)) = (&self.driven, self.cache.as_mut()) else {
            return Err(Error::Internal("a paged engine without its cache".into()));
        };
        let (mut ids, mut pos, mut mask) = (Vec::new(), Vec::new(), Vec::new());
        for (b, row) in self.rows.iter_mut().enumerate().take(n) {
            match row.as_mut().filter(|s| s.done.is_none()) {
                Some(s) => {
                    cache.set_table(b, &s.table, s.position)?;
                    ids.push(s.feed[0] as i64);
                    pos.push(s.position as i64);
                    mask.push(vec![true]);
                    s.position += 1;
                    s.feed.clear();
                }
                None => {
                    cache.set_table(b, &[], 0)?;
                    ids.push(self.pad_id as i64);
                    pos.push(0);
                    mask.push(vec![false]);
                }
            }
        }
        cache.set_rows(n)?;
        cache.set_packing(None)?;
        let device = model.model().device();
        let input = Tensor::from_vec(ids, &[n, 1], &device)?;
        let positions = Tensor::from_vec(pos, &[n, 1], &device)?;
        let args = ForwardArgs {
            input_ids: &input,
            position_ids: &positions,
            attention_mask: Some(&mask),
            output_hidden_states: false,
            inputs_embeds: None,
        };
        let logits = model.forward(args, cache, LogitsFor::Last)?.0;
        self.picking = (0..n).collect();
        self.cache_full_blocks();
        let vocab = logits.dim(2)?;
        Ok(logits.reshape_to(&[n, vocab])?)
    }

    /// One forward pass feeding the device's picks `ids` (`[rows]`) to every row.
    fn forward_device(&mut self, ids: &Tensor) -> Result<Tensor> {
        let n = self.rows.len();
        let paged = self.pool.is_some();
        if paged {
            // Each running row's next position in its table (`ahead` made sure of the
            // blocks); a stopped row's pick is padding.
            self.rows
                .iter_mut()
                .flatten()
                .filter(|s| s.done.is_none())
                .for_each(|s| s.feed = vec![0]);
            self.grow_tables()?;
        }
        let mut pos = Vec::with_capacity(n);
        let mut mask = Vec::with_capacity(n);
        for (b, row) in self.rows.iter_mut().enumerate() {
            let live = row.as_ref().is_some_and(|s| s.done.is_none());
            if let Some(cache) = self.cache.as_mut().filter(|c| c.is_paged()) {
                match row.as_ref().filter(|_| live) {
                    Some(s) => cache.set_table(b, &s.table, s.position)?,
                    None => cache.set_table(b, &[], 0)?,
                }
            }
            match row.as_mut() {
                Some(s) => {
                    pos.push(s.position as i64);
                    s.position += 1;
                }
                None => pos.push(0),
            }
            mask.push(vec![live]);
        }
        let Some(cache) = self.cache.as_mut() else {
            return Err(Error::Internal("an engine without its cache".into()));
        };
        match &self.driven {
            Driven::Decoder(model) => {
                let device = model.model().device();
                let input = ids.reshape_to(&[n, 1])?.to_device(&device)?;
                let positions = Tensor::from_vec(pos, &[n, 1], &device)?;
                let args = ForwardArgs {
                    input_ids: &input,
                    position_ids: &positions,
                    attention_mask: paged.then_some(mask.as_slice()),
                    output_hidden_states: false,
                    inputs_embeds: None,
                };
                cache.set_rows(n)?;
                if paged {
                    cache.set_packing(None)?;
                }
                self.picking = (0..n).collect();
                let logits = model.forward(args, cache, LogitsFor::Last)?.0;
                self.cache_full_blocks();
                Ok(logits)
            }
            Driven::Seq2Seq { .. } => {
                let input = ids.reshape_to(&[n, 1])?.to_device(&Device::Cpu)?;
                self.picking = (0..n).collect();
                self.decode_seq2seq(input, pos)
            }
        }
    }

    /// An encoder-decoder's decoder step over `input` (`[rows, 1]` on the host).
    fn decode_seq2seq(&mut self, input: Tensor, pos: Vec<i64>) -> Result<Tensor> {
        let Driven::Seq2Seq {
            model,
            hidden,
            mask,
        } = &self.driven
        else {
            return Err(Error::Internal(
                "a decoder driven as an encoder-decoder".into(),
            ));
        };
        let n = self.rows.len();
        let positions = Tensor::from_vec(pos, &[n, 1], &Device::Cpu)?;
        let args = ForwardArgs {
            input_ids: &input,
            position_ids: &positions,
            attention_mask: None,
            output_hidden_states: false,
            inputs_embeds: None,
        };
        let Some(cache) = self.cache.as_mut() else {
            return Err(Error::Internal("an engine without its cache".into()));
        };
        model.decode(args, hidden, Some(mask), cache, LogitsFor::Last)
    }
}

/// What a stopped sequence returns: its prompt, tokens and text (the stream's held-back end
/// added unless a stop string cut it).
/// Where a step feeds a sequence's prompt embeddings: `len` rows of `source` from `from`, at
/// `row`'s columns `column..`.
struct Span {
    row: usize,
    column: usize,
    source: Tensor,
    from: usize,
    len: usize,
}

impl Span {
    /// The span of `seq`'s next `feed` tokens, put at `row`'s `column`, that its prompt
    /// embeddings cover (none without them, or past the prompt).
    fn of(seq: &Sequence<'_>, row: usize, column: usize, feed: usize) -> Option<Span> {
        let source = seq.embeds.as_ref()?;
        let covered = source.shape()[0].checked_sub(seq.position)?.min(feed);
        (covered > 0).then(|| Span {
            row,
            column,
            source: source.clone(),
            from: seq.position,
            len: covered,
        })
    }
}

/// The step's first-layer input when some of its columns take prompt embeddings: the ids'
/// embeddings `[rows, columns, hidden]` with each span written over its columns (`None`
/// when there is no span: the model embeds the ids itself).
fn splice(model: &dyn CausalLm, ids: &Tensor, spans: &[Span]) -> Result<Option<Tensor>> {
    if spans.is_empty() {
        return Ok(None);
    }
    let base = model.model().embed(ids)?;
    let (rows, columns) = (base.dim(0)?, base.dim(1)?);
    let mut out = Vec::with_capacity(rows);
    for r in 0..rows {
        let row = base.narrow(0, r, 1)?.squeeze(0)?;
        let mut pieces = Vec::new();
        let mut at = 0;
        let mut mine: Vec<&Span> = spans.iter().filter(|s| s.row == r).collect();
        mine.sort_by_key(|s| s.column);
        for s in mine {
            if s.column > at {
                pieces.push(row.narrow(0, at, s.column - at)?);
            }
            let e = s.source.narrow(0, s.from, s.len)?;
            pieces.push(e.to_device(&row.device())?.to_dtype(row.dtype())?);
            at = s.column + s.len;
        }
        if at < columns {
            pieces.push(row.narrow(0, at, columns - at)?);
        }
        let refs: Vec<&Tensor> = pieces.iter().collect();
        out.push(Tensor::cat(&refs, 0)?.unsqueeze(0)?);
    }
    let refs: Vec<&Tensor> = out.iter().collect();
    Ok(Some(Tensor::cat(&refs, 0)?))
}

fn output_of(seq: &mut Sequence<'_>) -> Result<GenerationOutput> {
    let stop_reason = seq.done.unwrap_or(StopReason::Cancelled);
    let text = match seq.stream.as_mut() {
        Some(s) if stop_reason != StopReason::StopString => {
            let rest = s.finish()?;
            seq.text.push_str(&rest);
            Some(std::mem::take(&mut seq.text))
        }
        Some(_) => Some(std::mem::take(&mut seq.text)),
        None => None,
    };
    Ok(GenerationOutput {
        prompt_ids: seq.prompt.clone(),
        token_ids: seq.generated.clone(),
        text,
        stop_reason,
    })
}

/// The byte offset right after the first stop string found in `text`.
pub(crate) fn stop_string_end(text: &str, stops: &[String]) -> Option<usize> {
    stops
        .iter()
        .filter_map(|s| text.find(s.as_str()).map(|i| i + s.len()))
        .min()
}

/// Refuses an engine without a row or a slot.
fn check_config(config: EngineConfig) -> Result<()> {
    if config.max_sequences == 0 || config.capacity == 0 {
        return Err(Error::invalid(
            "max_sequences",
            format!(
                "an engine needs at least one sequence and one slot (max_sequences {}, capacity {})",
                config.max_sequences, config.capacity
            ),
        ));
    }
    if let Some(b) = config.max_step_tokens.filter(|&b| b < config.max_sequences) {
        return Err(Error::invalid(
            "max_step_tokens",
            format!(
                "a step of {b} tokens cannot feed {} running sequences a token each; ask for at least {}",
                config.max_sequences, config.max_sequences
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_string_cut_is_right_after_the_first_match() {
        let stops = vec!["END".to_string(), "\n\n".to_string()];
        assert_eq!(stop_string_end("abc\n\nxEND", &stops), Some(5));
        assert_eq!(stop_string_end("no stop here", &stops), None);
    }
}
