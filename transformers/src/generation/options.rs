//! What a generation is asked to do and what it returns: transformers' `GenerationConfig`
//! fields, validated as transformers validates them, and the outputs, stop reasons and
//! figures of a run. A leaf: the processors, the device sampler and the engine read it.

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
    /// Subtracted once from the logit of every token the row has generated (OpenAI's and
    /// vLLM's `presence_penalty`; the prompt does not count; 0 = off).
    pub presence_penalty: f64,
    /// Subtracted from a token's logit once per time the row generated it (OpenAI's
    /// `frequency_penalty`; 0 = off).
    pub frequency_penalty: f64,
    /// Added to the logits of these tokens before any processor (OpenAI's `logit_bias`,
    /// each in [-100, 100]).
    pub logit_bias: Vec<(u32, f32)>,
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
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            logit_bias: Vec::new(),
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
        self.penalizes_output()
            || !self.logit_bias.is_empty()
            || self.no_repeat_ngram_size > 0
            || !self.bad_words_ids.is_empty()
            || !self.suppress_tokens.is_empty()
            || !self.begin_suppress_tokens.is_empty()
            || (self.do_sample
                && (self.typical_p.is_some_and(|p| p < 1.0)
                    || self.epsilon_cutoff.is_some()
                    || self.eta_cutoff.is_some()))
    }

    /// Whether a processor reads the row's tokens (the others need only the step).
    pub(crate) fn reads_sequence(&self) -> bool {
        self.penalizes_output()
            || self.repetition_penalty.is_some()
            || self.no_repeat_ngram_size > 0
            || !self.bad_words_ids.is_empty()
    }

    /// Whether the presence or frequency penalty is on.
    pub(crate) fn penalizes_output(&self) -> bool {
        self.presence_penalty != 0.0 || self.frequency_penalty != 0.0
    }

    /// Refuses values transformers refuses (and OpenAI's for its own fields).
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
        for (name, v) in [
            ("presence_penalty", self.presence_penalty),
            ("frequency_penalty", self.frequency_penalty),
        ] {
            if !(-2.0..=2.0).contains(&v) {
                return bad(name, format!("{name} must be in [-2, 2], got {v}"));
            }
        }
        if let Some((id, b)) = self
            .logit_bias
            .iter()
            .find(|(_, b)| !(-100.0..=100.0).contains(b))
        {
            return bad(
                "logit_bias",
                format!("logit_bias of token {id} is {b}; each bias must be in [-100, 100]"),
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
