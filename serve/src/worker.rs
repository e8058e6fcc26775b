//! The engine's thread: admits the requests that arrived, cancels those whose client left,
//! runs one engine step and hands each sequence's tokens to its request, then again. It
//! blocks only while nothing runs or waits.

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, TryRecvError};
use std::time::Instant;

use tokio::sync::mpsc::UnboundedSender;
use zoo_runtime::Tensor;
use zoo_transformers::generation::BLOCK_SIZE;
use zoo_transformers::generation::{GenerationOptions, GenerationOutput};
use zoo_transformers::{Engine, EngineConfig, EngineEvent, SequenceId, TextGenerator};

use crate::metrics::Metrics;
use crate::{ApiError, ServeOptions};

/// The largest default context: longer ones are asked for with `--context`.
const DEFAULT_CONTEXT: usize = 4096;

/// Tokens a step feeds at most unless told (vLLM's server default).
const DEFAULT_STEP_TOKENS: usize = 2048;

/// One request's sequences: each prompt's `n` choices, choice `i` sampled from its own
/// stream seeded `seed + i`, as vLLM seeds the children of a request (one seed serves every
/// prompt of a list, each of which vLLM runs as a request of its own).
pub(crate) struct Job {
    /// One entry per sequence: each prompt repeated `n` times.
    pub prompts: Vec<Vec<u32>>,
    /// A vision-language prompt's images as pixel values on the host (all prompts share
    /// them: a chat request is one prompt).
    pub pixels: Option<Tensor>,
    /// Choices per prompt.
    pub n: usize,
    pub opts: GenerationOptions,
    pub updates: UnboundedSender<Update>,
    pub arrived: Instant,
}

/// What a request hears from the engine, per sequence (`index` into its `prompts`).
#[derive(Debug)]
pub(crate) enum Update {
    Token {
        index: usize,
        text: String,
    },
    Finished {
        index: usize,
        output: GenerationOutput,
    },
    /// The request ends without its sequences: refused at admission, or the engine failed.
    Failed(ApiError),
}

/// A sequence that runs or waits, and where its tokens go.
struct Live {
    updates: UnboundedSender<Update>,
    index: usize,
    arrived: Instant,
    last_token: Option<Instant>,
}

/// The engine's shape for `model` under `options`, refused when it cannot serve.
pub(crate) fn engine_config(
    model: &TextGenerator,
    options: &ServeOptions,
) -> Result<EngineConfig, ApiError> {
    if model.tokenizer().is_none() {
        return Err(ApiError::invalid(
            "model",
            "the checkpoint has no tokenizer; the server needs one to read prompts and write text",
        ));
    }
    if options.max_batch == 0 {
        return Err(ApiError::invalid(
            "max_batch",
            "--max-batch must be at least 1",
        ));
    }
    let capacity = context_of(model, options.context)?;
    if model.pages_cache() {
        // Blocks for every sequence at the whole context, or as many as memory (and a
        // `--max-memory` cpu limit) holds: sequences share them, the one that arrived last
        // preempted when they run out.
        let per_sequence = capacity.div_ceil(BLOCK_SIZE);
        let wanted = options.max_batch.saturating_mul(per_sequence);
        let fit = model.cache_rows_that_fit(BLOCK_SIZE).unwrap_or(wanted);
        if fit < per_sequence {
            return Err(ApiError::invalid(
                "context",
                format!(
                    "one sequence of {capacity} tokens needs {per_sequence} KV blocks of {BLOCK_SIZE} tokens, and the memory left for the KV cache (the host's, or what --max-memory leaves beside the weights) holds {fit}; ask for a shorter --context or raise --max-memory"
                ),
            ));
        }
        let config = EngineConfig {
            max_sequences: options.max_batch,
            capacity,
            kv_blocks: Some(wanted.min(fit)),
            max_step_tokens: Some(
                options
                    .max_step_tokens
                    .unwrap_or(DEFAULT_STEP_TOKENS.max(options.max_batch)),
            ),
        };
        if let Some(b) = options.max_step_tokens.filter(|&b| b < options.max_batch) {
            return Err(ApiError::invalid(
                "max_step_tokens",
                format!(
                    "--max-step-tokens {b} cannot feed --max-batch {} running sequences a token each; ask for at least {}",
                    options.max_batch, options.max_batch
                ),
            ));
        }
        config.check_pool(wanted.min(fit)).map_err(|e| {
            ApiError::invalid(
                "max_batch",
                format!("--max-batch {}: {e}", options.max_batch),
            )
        })?;
        return Ok(config);
    }
    if let Some(b) = options.max_step_tokens {
        return Err(ApiError::invalid(
            "max_step_tokens",
            format!(
                "--max-step-tokens {b}: prompts are fed in chunks over a paged KV cache, and this model's keeps a row of the whole context per sequence (a cache split over CPU and PJRT devices, or a model that reruns its history); leave it out"
            ),
        ));
    }
    let decoder = model.model().model();
    // Every row of a timeline holds the whole context: refuse at start what memory (and a
    // `--max-memory` cpu limit) cannot hold, rather than at the first request.
    zoo_transformers::KvCache::check_fits(
        &decoder.cache_specs(),
        options.max_batch,
        capacity,
        decoder.dtype(),
        false,
    )
    .and_then(|()| model.check_cache_room(options.max_batch, capacity))
    .map_err(|e| {
        ApiError::invalid(
            "max_batch",
            format!(
                "--max-batch {} with --context {capacity}: {e}",
                options.max_batch
            ),
        )
    })?;
    Ok(EngineConfig::new(options.max_batch, capacity))
}

/// The tokens one sequence may hold: `context`, or the model's context at most
/// [`DEFAULT_CONTEXT`].
fn context_of(model: &TextGenerator, context: Option<usize>) -> Result<usize, ApiError> {
    let decoder = model.model().model();
    let trained = decoder.max_position_embeddings();
    match context {
        Some(0) => Err(ApiError::invalid("context", "--context must be at least 1")),
        Some(c) if c > trained && !decoder.stretches_context() => Err(ApiError::invalid(
            "context",
            format!(
                "--context {c} is past the model's context ({trained}, max_position_embeddings)"
            ),
        )),
        Some(c) => Ok(c),
        None => Ok(trained.min(DEFAULT_CONTEXT)),
    }
}

/// The most sequences, up to `most`, a server runs at once over what the host's memory and
/// a `max_memory` cpu limit leave beside the weights for the KV cache at the server's
/// context (`context`, as [`ServeOptions::context`]): on a paged cache as many as there are
/// blocks (sequences share them, each holding at least one), on a timeline (a cache split
/// over eager and compiled devices, a model that reruns its history) the rows that fit at
/// the whole context. Refused when not even one sequence at
/// the context fits (a shorter one would).
pub fn batch_that_fits(
    model: &TextGenerator,
    context: Option<usize>,
    most: usize,
) -> Result<usize, ApiError> {
    let capacity = context_of(model, context)?;
    let rows = match model.pages_cache() {
        true => {
            let blocks = model.cache_rows_that_fit(BLOCK_SIZE).unwrap_or(most);
            if blocks >= capacity.div_ceil(BLOCK_SIZE) {
                blocks
            } else {
                0
            }
        }
        false => model.cache_rows_that_fit(capacity).unwrap_or(most),
    };
    if rows == 0 {
        return Err(ApiError::invalid(
            "context",
            format!(
                "one sequence of {capacity} tokens does not fit the memory left for the KV cache; ask for a shorter --context or raise --max-memory"
            ),
        ));
    }
    Ok(rows.min(most))
}

/// Drives the engine until every sender of `jobs` is gone and nothing runs.
pub(crate) fn run(
    model: &TextGenerator,
    config: EngineConfig,
    jobs: Receiver<Job>,
    metrics: &Metrics,
) {
    // Prefix caching where the engine supports it (a paged cache, on eager or compiled
    // devices); a timeline runs without it.
    let fresh = || {
        let mut engine = model.engine(config)?;
        if let Err(e) = engine.set_prefix_caching(true) {
            eprintln!("zoo serve: prefix caching off: {e}");
        }
        Ok::<_, zoo_transformers::Error>(engine)
    };
    let mut engine = match fresh() {
        Ok(e) => e,
        Err(e) => {
            return fail_all(
                jobs,
                ApiError::internal(format!("starting the engine: {e}")),
            )
        }
    };
    let mut live: HashMap<SequenceId, Live> = HashMap::new();
    let mut senders_gone = false;
    loop {
        if engine.is_idle() {
            if senders_gone {
                return;
            }
            match jobs.recv() {
                Ok(job) => admit(&mut engine, job, &mut live, metrics),
                Err(_) => return,
            }
        }
        loop {
            match jobs.try_recv() {
                Ok(job) => admit(&mut engine, job, &mut live, metrics),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    senders_gone = true;
                    break;
                }
            }
        }
        // A client that left frees its rows before the next step.
        let gone: Vec<SequenceId> = live
            .iter()
            .filter(|(_, l)| l.updates.is_closed())
            .map(|(id, _)| *id)
            .collect();
        for id in gone {
            let _ = engine.cancel(id);
            live.remove(&id);
        }
        match catch_unwind(AssertUnwindSafe(|| engine.step())) {
            Ok(Ok(events)) => {
                // The gauges first: a client that reads them after its answer sees this step.
                gauges(&engine, metrics);
                deliver(events, &mut live, metrics);
            }
            failed => {
                let why = match failed {
                    Ok(Err(e)) => e.to_string(),
                    _ => "the engine panicked".to_string(),
                };
                // Every running request ends with the failure; the engine starts over empty
                // and the server keeps serving.
                for (_, l) in live.drain() {
                    let _ = l
                        .updates
                        .send(Update::Failed(ApiError::internal(why.clone())));
                }
                engine = match fresh() {
                    Ok(e) => e,
                    Err(e) => {
                        return fail_all(
                            jobs,
                            ApiError::internal(format!("restarting the engine: {e}")),
                        )
                    }
                };
            }
        }
        gauges(&engine, metrics);
    }
}

fn gauges(engine: &Engine<'_>, metrics: &Metrics) {
    let (running, waiting) = engine.counts();
    metrics.running.store(running as u64, Ordering::Relaxed);
    metrics.waiting.store(waiting as u64, Ordering::Relaxed);
    metrics.engine_counts(engine.prefix_hits(), engine.preemptions());
    if let Some((used, total)) = engine.kv_blocks() {
        metrics.kv_blocks_used.store(used as u64, Ordering::Relaxed);
        metrics
            .kv_blocks_total
            .store(total as u64, Ordering::Relaxed);
    }
}

fn admit(
    engine: &mut Engine<'_>,
    job: Job,
    live: &mut HashMap<SequenceId, Live>,
    metrics: &Metrics,
) {
    if job.updates.is_closed() {
        return;
    }
    let tokens: usize = job.prompts.iter().map(Vec::len).sum();
    // Each sequence on its own, so that a choice's sample depends on its seed alone (not on
    // when its siblings stop or whether it was preempted); all or none are added.
    let mut added = Vec::with_capacity(job.prompts.len());
    let mut failed = None;
    for (i, prompt) in job.prompts.into_iter().enumerate() {
        let opts = GenerationOptions {
            seed: job.opts.seed.wrapping_add((i % job.n.max(1)) as u64),
            ..job.opts.clone()
        };
        let joined = match &job.pixels {
            Some(px) => engine.add_with_images(prompt, px, opts),
            None => engine.add(prompt, opts),
        };
        match joined {
            Ok(id) => added.push(id),
            Err(e) => {
                failed = Some(e);
                break;
            }
        }
    }
    let added = match failed {
        None => Ok(added),
        Some(e) => {
            for id in added {
                let _ = engine.cancel(id);
            }
            Err(e)
        }
    };
    match added {
        Ok(ids) => {
            metrics
                .prompt_tokens
                .fetch_add(tokens as u64, Ordering::Relaxed);
            for (index, id) in ids.into_iter().enumerate() {
                live.insert(
                    id,
                    Live {
                        updates: job.updates.clone(),
                        index,
                        arrived: job.arrived,
                        last_token: None,
                    },
                );
            }
        }
        Err(e) => {
            let _ = job.updates.send(Update::Failed(ApiError::from_model(&e)));
        }
    }
}

fn deliver(events: Vec<EngineEvent>, live: &mut HashMap<SequenceId, Live>, metrics: &Metrics) {
    let now = Instant::now();
    for event in events {
        match event {
            EngineEvent::Token { id, text, .. } => {
                let Some(l) = live.get_mut(&id) else { continue };
                match l.last_token {
                    None => metrics.time_to_first_token((now - l.arrived).as_secs_f64()),
                    Some(t) => metrics.inter_token((now - t).as_secs_f64()),
                }
                l.last_token = Some(now);
                metrics.generated_tokens.fetch_add(1, Ordering::Relaxed);
                let _ = l.updates.send(Update::Token {
                    index: l.index,
                    text,
                });
            }
            EngineEvent::Finished { id, output } => {
                if let Some(l) = live.remove(&id) {
                    let _ = l.updates.send(Update::Finished {
                        index: l.index,
                        output,
                    });
                }
            }
        }
    }
}

/// Answers every job still queued with `error` (the engine cannot start).
fn fail_all(jobs: Receiver<Job>, error: ApiError) {
    for job in jobs {
        let _ = job.updates.send(Update::Failed(error.clone()));
    }
}
