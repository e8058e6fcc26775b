//! What every causal LM adds to its base decoder, as transformers' `*ForCausalLM` classes do:
//! `lm_head` — its own weight, or the input embeddings' when tied — and the logits of the
//! positions asked for. Llama's, Gemma's and GPT-2's classes (and their derivatives') are
//! [`ForCausalLM`] over their base model; each family only says where its weights are.

use zoo_runtime::nn::{Embedding, Linear, Weights};
use zoo_runtime::{Device, Tensor};

use super::placement::on_device;
use crate::cache::KvCache;
use crate::kinds::{CausalLm, DecoderModel, ForwardArgs, LogitsFor, ModelOutput};
use crate::Result;

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
