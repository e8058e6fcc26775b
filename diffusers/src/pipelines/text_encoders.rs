//! The text encoders the pipelines condition on: a tokenizer and its encoder from the
//! pipeline's `tokenizer*` / `text_encoder*` components (CLIP for Stable Diffusion, SDXL,
//! SD3 and Flux's pooled text; T5 for SD3, Flux and PixArt), loaded through
//! zoo-transformers, with the padding and truncation diffusers' `encode_prompt` asks of the
//! tokenizer. One module for every pipeline, so no pipeline reaches into another for them.

use zoo_runtime::{DType, Device, Tensor};
use zoo_transformers::kinds::{Encoder, EncoderArgs};
use zoo_transformers::registry::Task;
use zoo_transformers::Tokenizer;

use super::{LoadOptions, PipelineFiles};
use crate::{Error, Result};

/// A tokenizer and its text encoder (CLIP or T5), as the pipelines pair them.
#[derive(Debug)]
pub struct TextEncoder {
    pub(crate) tokenizer: Tokenizer,
    pub(crate) encoder: Box<dyn Encoder>,
    pub(crate) max_length: usize,
    pub(crate) pad_id: u32,
}

/// The tokenizer and encoder classes of a text-encoder pair.
#[derive(Clone, Copy, Debug)]
pub(crate) struct TextKind {
    tokenizers: &'static [&'static str],
    encoders: &'static [&'static str],
    /// The pad token when `tokenizer_config.json` names none.
    pad: &'static str,
}

/// CLIP (`CLIPTextModel`, `CLIPTextModelWithProjection`).
pub(crate) const CLIP: TextKind = TextKind {
    tokenizers: &["CLIPTokenizer", "CLIPTokenizerFast"],
    encoders: &["CLIPTextModel", "CLIPTextModelWithProjection"],
    pad: "<|endoftext|>",
};

/// T5's encoder (`T5EncoderModel`), as SD3, Flux and PixArt read it.
pub(crate) const T5: TextKind = TextKind {
    tokenizers: &["T5Tokenizer", "T5TokenizerFast"],
    encoders: &["T5EncoderModel"],
    pad: "<pad>",
};

impl TextEncoder {
    pub(crate) fn load(
        files: &PipelineFiles,
        tokenizer: &str,
        encoder: &str,
        dtype: DType,
        opts: &LoadOptions,
    ) -> Result<TextEncoder> {
        let device = opts.text_encoder(encoder, false);
        TextEncoder::load_kind(files, tokenizer, encoder, CLIP, dtype, device, opts)
    }

    /// A tokenizer and encoder of `kind`, the encoder on `device`.
    pub(crate) fn load_kind(
        files: &PipelineFiles,
        tokenizer: &str,
        encoder: &str,
        kind: TextKind,
        dtype: DType,
        device: Device,
        opts: &LoadOptions,
    ) -> Result<TextEncoder> {
        let tok_files = files.component(tokenizer, kind.tokenizers)?;
        let tok = Tokenizer::from_pretrained(&tok_files).map_err(Box::new)?;
        let tcfg = tok_files.tokenizer_config()?.unwrap_or_default();
        let max_length = tcfg.model_max_length.unwrap_or(77.0) as usize;
        let pad = tcfg
            .pad_token
            .as_ref()
            .map(|t| t.content().to_string())
            .unwrap_or_else(|| kind.pad.into());
        let pad_id = tok.token_to_id(&pad).ok_or_else(|| Error::Config {
            path: files.index.path.with_file_name(tokenizer),
            reason: format!("the pad token {pad:?} is not in the vocabulary"),
        })?;
        files.component(encoder, kind.encoders)?;
        let dir = files.dir(encoder)?;
        let device_map = match device {
            Device::Cpu => zoo_runtime::device_map::DeviceMap::Cpu,
            Device::Cuda(i) => zoo_runtime::device_map::DeviceMap::Cuda(i),
            // A mesh: the encoder split over it by its family's plan.
            Device::Pjrt(d) if d.mesh.is_some() => {
                zoo_runtime::device_map::DeviceMap::TensorParallel {
                    platform: zoo_runtime::device_map::platform_name(d.platform).into(),
                    devices: Some(d.ordinals()),
                    tp: None,
                }
            }
            Device::Pjrt(d) => zoo_runtime::device_map::DeviceMap::Pjrt {
                platform: zoo_runtime::device_map::platform_name(d.platform).into(),
                devices: Some(vec![d.ordinal]),
            },
        };
        let encoder = zoo_transformers::auto::load_encoder_with(
            &dir.to_string_lossy(),
            zoo_transformers::LoadOptions {
                dtype: Some(dtype),
                progress: opts.progress,
                device_map,
                ..Default::default()
            },
            Task::Base,
        )
        .map_err(Box::new)?;
        let max_length = max_length.min(encoder.max_position_embeddings());
        Ok(TextEncoder {
            tokenizer: tok,
            encoder,
            max_length,
            pad_id,
        })
    }

    /// Ids of `texts`, each truncated and padded to `len` (`padding="max_length"`).
    pub(crate) fn ids(&self, texts: &[String], len: usize) -> Result<Tensor> {
        Ok(self.ids_and_mask(texts, len)?.0)
    }

    /// [`TextEncoder::ids`] and the attention mask `[B, len]` (1 = token, 0 = padding).
    pub(crate) fn ids_and_mask(&self, texts: &[String], len: usize) -> Result<(Tensor, Tensor)> {
        let (mut ids, mut mask) = (Vec::with_capacity(texts.len() * len), Vec::new());
        for t in texts {
            let mut row = self.tokenizer.encode_truncated(t, len).map_err(Box::new)?;
            mask.extend((0..len).map(|i| i64::from(i < row.len())));
            row.resize(len, self.pad_id);
            ids.extend(row.into_iter().map(i64::from));
        }
        let device = self.encoder.device();
        Ok((
            Tensor::from_vec(ids, &[texts.len(), len], &device)?,
            Tensor::from_vec(mask, &[texts.len(), len], &device)?,
        ))
    }

    /// The encoder's output for `texts` padded to the tokenizer's `model_max_length`, with
    /// every layer's hidden states when `hidden_states`.
    pub(crate) fn encode(
        &self,
        texts: &[String],
        hidden_states: bool,
    ) -> Result<zoo_transformers::kinds::EncoderOutput> {
        self.encode_len(texts, self.max_length, hidden_states)
    }

    /// [`TextEncoder::encode`] padded to `len` tokens (T5's `max_sequence_length`).
    pub(crate) fn encode_len(
        &self,
        texts: &[String],
        len: usize,
        hidden_states: bool,
    ) -> Result<zoo_transformers::kinds::EncoderOutput> {
        let ids = self.ids(texts, len)?;
        self.encoder
            .forward(EncoderArgs {
                input_ids: &ids,
                attention_mask: None,
                token_type_ids: None,
                position_ids: None,
                output_hidden_states: hidden_states,
            })
            .map_err(|e| Box::new(e).into())
    }

    /// The last hidden state of `texts` padded to `len` tokens with the padding masked in
    /// the encoder, and that mask `[B, len]` (1 = token, 0 = padding), as PixArt encodes.
    pub(crate) fn encode_masked(&self, texts: &[String], len: usize) -> Result<(Tensor, Tensor)> {
        let (ids, mask) = self.ids_and_mask(texts, len)?;
        let out = self
            .encoder
            .forward(EncoderArgs {
                input_ids: &ids,
                attention_mask: Some(&mask),
                token_type_ids: None,
                position_ids: None,
                output_hidden_states: false,
            })
            .map_err(Box::new)?;
        Ok((out.last_hidden_state, mask))
    }
}
