//! What every causal LM adds to its base decoder, as transformers' `*ForCausalLM` classes do:
//! `lm_head` — its own weight, or the input embeddings' when tied — and the logits of the
//! positions asked for. Llama's, Gemma's and GPT-2's classes (and their derivatives') are
//! [`ForCausalLM`] over their base model; each family only says where its weights are.

use zoo_hub::PretrainedConfig;
use zoo_runtime::nn::{Embedding, Linear, Weights};
use zoo_runtime::{DType, Device, Tensor};

use super::placement::{on_device, Placement};
use crate::cache::KvCache;
use crate::family::Task;
use crate::kinds::{
    CausalLm, DecoderModel, Encoder, EncoderArgs, EncoderHead, EncoderOutput, ForwardArgs,
    LogitsFor, ModelOutput, TextTower, Tower,
};
use crate::{Error, Result};

/// A base decoder and its `lm_head`.
#[derive(Clone, Debug)]
pub struct ForCausalLM<M> {
    model: M,
    lm_head: Linear,
    tied: bool,
    /// Gemma 2's `final_logit_softcapping`: `cap * tanh(logits / cap)`.
    final_softcap: Option<f64>,
}

impl<M> ForCausalLM<M> {
    /// `model` with `lm_head.weight` of the checkpoint root `w` (`[vocab, hidden]`), or
    /// `embeddings` as the head when `tie` is set or the checkpoint has no `lm_head.weight`
    /// (transformers saves none for tied weights).
    pub(crate) fn with_head(
        w: &Weights,
        model: M,
        embeddings: &Embedding,
        tie: bool,
        (hidden, vocab): (usize, usize),
    ) -> Result<ForCausalLM<M>> {
        let tied = tie || !w.contains("lm_head.weight");
        let lm_head = if tied {
            embeddings.as_linear()
        } else {
            Linear::load(&w.pp("lm_head"), hidden, vocab, false)?
        };
        Ok(ForCausalLM {
            model,
            lm_head,
            tied,
            final_softcap: None,
        })
    }

    /// Caps the logits softly at `cap` (Gemma 2's `final_logit_softcapping`).
    pub(crate) fn with_final_softcap(self, cap: Option<f64>) -> ForCausalLM<M> {
        ForCausalLM {
            final_softcap: cap,
            ..self
        }
    }

    /// The base model.
    pub fn base(&self) -> &M {
        &self.model
    }
}

impl<M: DecoderModel> CausalLm for ForCausalLM<M> {
    fn model(&self) -> &dyn DecoderModel {
        &self.model
    }

    fn logits_device(&self) -> Device {
        self.lm_head.device()
    }

    fn tied(&self) -> bool {
        self.tied
    }

    fn forward(
        &self,
        args: ForwardArgs<'_>,
        cache: &mut KvCache,
        which: LogitsFor<'_>,
    ) -> Result<(Tensor, ModelOutput)> {
        let out = self.model.forward(args, cache)?;
        let h = which.select(&out.last_hidden_state)?;
        let h = on_device(&h, &self.lm_head.device())?;
        let logits = self.lm_head.forward(&h)?;
        let logits = match self.final_softcap {
            // As transformers: a true division, tanh, a product, each in the logits' dtype.
            Some(cap) => {
                let c = Tensor::scalar(cap, logits.dtype(), &logits.device())?;
                logits.div(&c)?.tanh()?.mul_scalar(cap)?
            }
            None => logits,
        };
        Ok((logits, out))
    }
}

/// A base decoder run as an encoder: the whole batch at once, positions `0..T` per row
/// (what transformers uses when none are given), the attention mask's padding hidden as
/// keys. What the decoder classifiers ([`ForClassification`]) read their hidden states from.
#[derive(Debug)]
pub struct DecoderTower {
    model: Box<dyn DecoderModel>,
    placement: Placement,
}

impl DecoderTower {
    /// `model` as an encoder.
    pub fn new(model: Box<dyn DecoderModel>) -> DecoderTower {
        let placement = Placement::new(model.dtype(), model.device(), model.devices());
        DecoderTower { model, placement }
    }
}

impl Tower for DecoderTower {
    fn placement(&self) -> &Placement {
        &self.placement
    }
    fn hidden_state_modules(&self) -> Vec<String> {
        self.model.hidden_state_modules()
    }
}

impl TextTower for DecoderTower {
    fn vocab_size(&self) -> usize {
        self.model.vocab_size()
    }
    fn max_position_embeddings(&self) -> usize {
        self.model.max_position_embeddings()
    }
    fn run(&self, args: EncoderArgs<'_>) -> Result<EncoderOutput> {
        let ids = args.input_ids;
        let [batch, seq] = ids.shape()[..] else {
            return Err(Error::invalid(
                "input_ids",
                format!(
                    "a decoder reads [batch, seq] ids, got shape {:?}",
                    ids.shape()
                ),
            ));
        };
        let device = self.model.device();
        let positions = match args.position_ids {
            Some(p) => on_device(p, &device)?,
            None => {
                let row: Vec<i64> = (0..seq as i64).collect();
                Tensor::from_vec(row.repeat(batch), &[batch, seq], &device)?
            }
        };
        let mask: Option<Vec<Vec<bool>>> = match args.attention_mask {
            Some(m) => {
                let v = m.to_dtype(DType::I64)?.to_vec::<i64>()?;
                Some(
                    v.chunks(seq.max(1))
                        .map(|r| r.iter().map(|&x| x != 0).collect())
                        .collect(),
                )
            }
            None => None,
        };
        let mut cache = self.model.new_cache(batch, seq)?;
        let ids = on_device(ids, &device)?;
        let out = self.model.forward(
            ForwardArgs {
                input_ids: &ids,
                position_ids: &positions,
                attention_mask: mask.as_deref(),
                output_hidden_states: args.output_hidden_states,
                inputs_embeds: None,
            },
            &mut cache,
        )?;
        // hidden_states as the decoder lists them, beside `hidden_state_modules`.
        Ok(EncoderOutput {
            last_hidden_state: out.last_hidden_state,
            pooler_output: None,
            hidden_states: out.hidden_states,
            logits: None,
            embeds: None,
        })
    }
}

/// `*ForSequenceClassification`, `*ForTokenClassification` and `*ForQuestionAnswering` over
/// any decoder family, as transformers' `GenericFor*` classes (and GPT-2's own) add them: the
/// base model (under `model.` or `transformer.`), then `score` — bias-free for sequences,
/// read at each row's rightmost token that is not `pad_token_id`; with a bias for tokens
/// (GPT-2's is `classifier`), on every token — or `qa_outputs`, two scores per token.
#[derive(Debug)]
pub struct ForClassification {
    tower: DecoderTower,
    score: Linear,
    head: EncoderHead,
    pad_token_id: Option<i64>,
}

/// Reads a family's base decoder from a checkpoint root (the registry's `Loaders::Decoder`).
pub(crate) type BaseLoader = fn(&Weights, &PretrainedConfig) -> Result<Box<dyn DecoderModel>>;

impl ForClassification {
    /// The head of `task` over the base decoder `base` reads from the checkpoint root `w`.
    pub(crate) fn load(
        base: BaseLoader,
        w: &Weights,
        c: &PretrainedConfig,
        task: Task,
    ) -> Result<ForClassification> {
        let labels = || {
            let id2label = c
                .get("id2label")
                .and_then(|v| serde_json::from_value(v).ok());
            let num_labels = c
                .get("num_labels")
                .and_then(|v| v.as_u64())
                .map(|n| n as usize);
            crate::config::labels(id2label.as_ref(), num_labels, &c.path)
        };
        let head = match task {
            Task::SequenceClassification => EncoderHead::SequenceClassification { labels: labels()? },
            Task::TokenClassification => EncoderHead::TokenClassification { labels: labels()? },
            Task::QuestionAnswering => EncoderHead::QuestionAnswering,
            other => {
                return Err(Error::Config {
                    path: c.path.clone(),
                    reason: format!(
                        "a decoder takes sequence- and token-classification and question-answering heads here; {} is none of them",
                        other.auto_class()
                    ),
                })
            }
        };
        let (width, names): (usize, &[&str]) = match &head {
            EncoderHead::SequenceClassification { labels }
            | EncoderHead::TokenClassification { labels } => {
                (labels.len(), &["score", "classifier"])
            }
            _ => (2, &["qa_outputs"]),
        };
        // Llama's, Qwen2's, Qwen3's and Qwen3-MoE's question-answering classes keep their base
        // model under `transformer.`, the name their first versions saved.
        let model = if w.contains("transformer.embed_tokens.weight") {
            base(&w.pp("transformer"), c)?
        } else {
            base(w, c)?
        };
        let hidden = ["hidden_size", "n_embd"]
            .iter()
            .find_map(|k| c.get(k).and_then(|v| v.as_u64()))
            .map(|v| v as usize)
            .ok_or_else(|| Error::Config {
                path: c.path.clone(),
                reason: "no `hidden_size` (or GPT-2's `n_embd`) to size the head with".into(),
            })?;
        let name = names
            .iter()
            .find(|n| w.contains(&format!("{n}.weight")))
            .ok_or_else(|| Error::Config {
                path: c.path.clone(),
                reason: format!(
                    "{} needs its head's weight `{}`, which the checkpoint does not hold",
                    task.auto_class(),
                    w.full_name(&format!("{}.weight", names[0]))
                ),
            })?;
        let bias = w.contains(&format!("{name}.bias"));
        let pad_token_id = c
            .pad_token_id
            .as_ref()
            .and_then(|p| p.to_vec().first().copied())
            .map(i64::from);
        Ok(ForClassification {
            tower: DecoderTower::new(model),
            score: Linear::load(&w.pp(name), hidden, width, bias)?,
            head,
            pad_token_id,
        })
    }

    /// Each row's rightmost token that is not padding (transformers' `last_non_pad_token`).
    fn last_tokens(&self, ids: &[i64], (batch, seq): (usize, usize)) -> Result<Vec<usize>> {
        let Some(pad) = self.pad_token_id else {
            if batch != 1 {
                return Err(Error::invalid(
                    "input_ids",
                    "classifying a batch of more than one row needs the config's pad_token_id, \
                     which marks where each row ends; the config sets none"
                        .into(),
                ));
            }
            return Ok(vec![seq.saturating_sub(1)]);
        };
        // argmax of index * (id != pad): the last such index, 0 for an all-padding row.
        Ok(ids
            .chunks(seq.max(1))
            .map(|row| row.iter().rposition(|&t| t != pad).unwrap_or(0))
            .collect())
    }
}

impl Encoder for ForClassification {
    fn tower(&self) -> &dyn TextTower {
        &self.tower
    }
    fn head(&self) -> &EncoderHead {
        &self.head
    }
    fn forward(&self, args: EncoderArgs<'_>) -> Result<EncoderOutput> {
        let mut out = self.tower.run(args)?;
        let h = on_device(&out.last_hidden_state, &self.score.device())?;
        out.logits = Some(match self.head {
            EncoderHead::SequenceClassification { .. } => {
                let [batch, seq, width] = h.shape()[..] else {
                    return Err(Error::Internal(format!(
                        "a decoder's hidden states of shape {:?}",
                        h.shape()
                    )));
                };
                let ids = args.input_ids.to_dtype(DType::I64)?.to_vec::<i64>()?;
                let rows: Vec<i64> = self
                    .last_tokens(&ids, (batch, seq))?
                    .into_iter()
                    .enumerate()
                    .map(|(b, t)| (b * seq + t) as i64)
                    .collect();
                let at = Tensor::from_vec(rows, &[batch], &h.device())?;
                let flat = h.reshape(&[(batch * seq) as isize, width as isize])?;
                self.score.forward(&flat.index_select(0, &at)?)?
            }
            _ => self.score.forward(&h)?,
        });
        Ok(out)
    }
}
