//! Model kinds: what generation, pooling, the parity harness and the planner work against.
//!
//! A family implements the kinds its architectures are (Llama's `LlamaModel` is a
//! [`DecoderModel`], `LlamaForCausalLM` a [`CausalLm`]; BERT's four classes are
//! [`Encoder`]s), and everything above the model files — `generate`, `zoo embed`, the
//! harness, the `Auto*` classes — takes a kind, never a concrete model.

use std::fmt::Debug;

use zoo_runtime::{DType, Device, Tensor};

use crate::cache::{CacheSpec, KvCache};
use crate::models::Placement;
use crate::{Error, Result};

/// Which positions of the last hidden state get logits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogitsFor<'a> {
    /// Every position (`[B, T, vocab]`), for scoring and parity.
    All,
    /// The last position only (`[B, 1, vocab]`), all generation needs.
    Last,
    /// These positions (`[B, n, vocab]`): in a packed batch, each sequence's last token.
    Columns(&'a [usize]),
}

impl LogitsFor<'_> {
    /// The positions of the hidden states `h [B, T, hidden]` that get logits.
    pub fn select(self, h: &Tensor) -> Result<Tensor> {
        Ok(match self {
            LogitsFor::All => h.clone(),
            LogitsFor::Last => h.narrow(1, h.dim(1)?.saturating_sub(1), 1)?,
            LogitsFor::Columns(cols) => {
                let ids: Vec<i64> = cols.iter().map(|&c| c as i64).collect();
                let ids = Tensor::from_vec(ids, &[cols.len()], &h.device())?;
                h.index_select(1, &ids)?
            }
        })
    }
}

/// One decoder forward call's inputs.
#[derive(Clone, Copy, Debug)]
pub struct ForwardArgs<'a> {
    /// Token ids `[B, T]`, integer.
    pub input_ids: &'a Tensor,
    /// Positions `[B, T]`, integer (with left padding: `cumsum(mask) - 1`).
    pub position_ids: &'a Tensor,
    /// Which of the `T` tokens of each row are real (left padding is false); all when `None`.
    pub attention_mask: Option<&'a [Vec<bool>]>,
    /// Also return the input of each layer and the output of the last (HF's `hidden_states`).
    pub output_hidden_states: bool,
    /// The first layer's input `[B, T, hidden]` in place of the ids' embeddings
    /// (transformers' `inputs_embeds`, what a vision-language model passes with its image
    /// features written over the image tokens' rows); `input_ids` still give the shape.
    pub inputs_embeds: Option<&'a Tensor>,
}

/// What a base decoder returns.
#[derive(Clone, Debug)]
pub struct ModelOutput {
    /// Output of the final norm, `[B, T, hidden]`.
    pub last_hidden_state: Tensor,
    /// With `output_hidden_states`: the embeddings, then each layer's output (before the
    /// final norm), as transformers lists them (`num_hidden_layers + 1` entries; transformers
    /// replaces the last with the normed one, which is `last_hidden_state` here).
    pub hidden_states: Vec<Tensor>,
    /// With `output_hidden_states`: outputs of modules that are no hidden state, by HF
    /// module path (GPT-2's `transformer.wte` and `transformer.wpe`, summed into the first).
    pub module_outputs: Vec<(String, Tensor)>,
}

impl ForwardArgs<'_> {
    /// Checks the inputs against each other and against `cache` (what every decoder's
    /// forward refuses) and returns `(batch, seq)`.
    pub fn check(&self, cache: &KvCache) -> Result<(usize, usize)> {
        let ids = self.input_ids;
        if ids.rank() != 2 || self.position_ids.shape() != ids.shape() {
            return Err(Error::invalid(
                "input_ids",
                format!(
                    "input_ids {:?} and position_ids {:?} must both be [batch, seq]",
                    ids.shape(),
                    self.position_ids.shape()
                ),
            ));
        }
        let (b, t) = (ids.shape()[0], ids.shape()[1]);
        if t == 0 {
            return Err(Error::invalid(
                "input_ids",
                "empty input: at least one token is needed".into(),
            ));
        }
        if b != cache.rows() {
            return Err(Error::invalid(
                "input_ids",
                format!(
                    "input batch {b} differs from the KV cache's {} rows in use",
                    cache.rows()
                ),
            ));
        }
        Ok((b, t))
    }

    /// The first layer's input on `device`: `inputs_embeds` when given (checked to be
    /// `[batch, seq, hidden]`), else `embed` of the ids ([`checked_ids`] first).
    pub(crate) fn embeddings(
        &self,
        device: &Device,
        (vocab, hidden): (usize, usize),
        dtype: DType,
        embed: impl FnOnce(&Tensor) -> Result<Tensor>,
    ) -> Result<Tensor> {
        let Some(e) = self.inputs_embeds else {
            return embed(&checked_ids(self.input_ids, device, vocab)?);
        };
        let want = [self.input_ids.shape()[0], self.input_ids.shape()[1], hidden];
        if e.shape() != want {
            return Err(Error::invalid(
                "inputs_embeds",
                format!("inputs_embeds has shape {:?}; expected {want:?}", e.shape()),
            ));
        }
        Ok(crate::models::on_device(e, device)?.to_dtype(dtype)?)
    }
}

/// `ids` as i64 on `device`, refusing an id outside a vocabulary of `vocab`. Ids uploaded
/// from the host are checked there; ids computed on a device (sampled tokens) come from
/// `argmax` over the vocabulary and cannot be out of range.
pub(crate) fn checked_ids(ids: &Tensor, device: &Device, vocab: usize) -> Result<Tensor> {
    let ids = crate::models::on_device(ids, device)?.to_dtype(DType::I64)?;
    if let Some(&bad) = ids
        .host_known_i64()
        .iter()
        .flatten()
        .find(|&&id| id < 0 || id as usize >= vocab)
    {
        return Err(Error::invalid(
            "input_ids",
            format!("token id {bad} is outside the vocabulary of {vocab} ids"),
        ));
    }
    Ok(ids)
}

/// A base decoder (`LlamaModel`, `GPT2Model`): token ids in, hidden states out, keys and
/// values appended to a [`KvCache`].
pub trait DecoderModel: Send + Sync + Debug {
    /// The dtype of weights and activations.
    fn dtype(&self) -> DType;
    /// The device inputs go to (the one holding the embeddings).
    fn device(&self) -> Device;
    /// Every device the model runs on, in execution order, each once.
    fn devices(&self) -> Vec<Device>;
    /// Tokens in the vocabulary.
    fn vocab_size(&self) -> usize;
    /// The context the model was trained for (`max_position_embeddings`, `n_positions`).
    fn max_position_embeddings(&self) -> usize;
    /// Whether positions past that context are meant to work (dynamic NTK rope); otherwise
    /// generation refuses longer prompts.
    fn stretches_context(&self) -> bool {
        false
    }
    /// A cache length at which transformers' `generate` drops the cache and runs the whole
    /// sequence again ([`crate::decode_step`]): Phi-3's longrope switch, past which every
    /// key's rotation changes. `None` for most models.
    fn recompute_cache_at(&self) -> Option<usize> {
        None
    }
    /// One spec per attention layer: what the cache holds for it and where.
    fn cache_specs(&self) -> Vec<CacheSpec>;
    /// An empty cache for `batch` rows of up to `capacity` tokens.
    fn new_cache(&self, batch: usize, capacity: usize) -> Result<KvCache> {
        KvCache::from_specs(&self.cache_specs(), batch, capacity, self.dtype())
    }
    /// HF module paths of the `hidden_states` entries but the last (`model.embed_tokens`,
    /// `model.layers.0`, ...), which name per-module outputs in parity cases.
    fn hidden_state_modules(&self) -> Vec<String>;
    /// The first layer's input for `ids` `[B, T]` (`[B, T, hidden]`): the embeddings as the
    /// model's forward computes them from ids (Gemma's scaled by `sqrt(hidden)`; GPT-2's
    /// token embeddings, its positions added in the forward), what `inputs_embeds` replaces.
    fn embed(&self, ids: &Tensor) -> Result<Tensor>;
    /// The width of the residual stream.
    fn hidden_size(&self) -> usize;
    /// The input embedding table (what a tied head multiplies by).
    fn input_embeddings(&self) -> &zoo_runtime::nn::Embedding;
    /// Runs the decoder over `args.input_ids`, appending their keys and values to `cache`.
    fn forward(&self, args: ForwardArgs<'_>, cache: &mut KvCache) -> Result<ModelOutput>;
}

/// A causal language model (`*ForCausalLM`, `GPT2LMHeadModel`): a [`DecoderModel`] and a
/// head that turns its last hidden state into next-token logits. Generation works on this.
pub trait CausalLm: Send + Sync + Debug {
    /// The base decoder.
    fn model(&self) -> &dyn DecoderModel;
    /// The device logits are computed on (the one holding the head).
    fn logits_device(&self) -> Device;
    /// Whether the head shares the embedding table.
    fn tied(&self) -> bool;
    /// Logits (`[B, T, vocab]` or `[B, 1, vocab]`, model dtype) and the base model's output.
    fn forward(
        &self,
        args: ForwardArgs<'_>,
        cache: &mut KvCache,
        which: LogitsFor<'_>,
    ) -> Result<(Tensor, ModelOutput)>;
    /// What reads images, for a vision-language model (`LlavaForConditionalGeneration`):
    /// its prompts' image tokens take image features ([`VisionLanguage`]). `None` for a
    /// text-only model.
    fn vision(&self) -> Option<&dyn VisionLanguage> {
        None
    }
}

/// The image side of a vision-language model: pixel values in, one row of the language
/// model's embeddings per image token out. The prompt holds `tokens_per_image` copies of
/// `image_token_id` per image (its processor expands each image's placeholder), and their
/// embeddings are replaced by the image's features in order (transformers'
/// `masked_scatter` in `get_placeholder_mask`'s positions).
pub trait VisionLanguage: Send + Sync + Debug {
    /// The placeholder token the features replace (`image_token_id`/`image_token_index`).
    fn image_token_id(&self) -> u32;
    /// The `(height, width)` pixel values the vision tower takes.
    fn image_size(&self) -> (usize, usize);
    /// Placeholder tokens one image fills.
    fn tokens_per_image(&self) -> usize;
    /// `pixel_values [images, channels, height, width]` to features
    /// `[images, tokens_per_image, hidden]` on the language model's input device, in its
    /// dtype.
    fn image_features(&self, pixel_values: &Tensor) -> Result<Tensor>;
}

/// What an encoder's head computes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EncoderHead {
    /// None: hidden states and (where the family has one) the pooled output (`BertModel`).
    Base,
    /// Token logits over the vocabulary (`BertForMaskedLM`).
    MaskedLm,
    /// One row of logits per sequence (`BertForSequenceClassification`).
    SequenceClassification {
        /// Label names by index (`id2label`).
        labels: Vec<String>,
    },
    /// One row of logits per token (`BertForTokenClassification`).
    TokenClassification {
        /// Label names by index (`id2label`).
        labels: Vec<String>,
    },
    /// Two scores per token, logits `[B, T, 2]`: where the answer span starts and where it
    /// ends (`BertForQuestionAnswering`, `LlamaForQuestionAnswering`; transformers'
    /// `start_logits` and `end_logits` are its two columns, see
    /// [`EncoderOutput::span_logits`]).
    QuestionAnswering,
    /// One score per choice, logits `[B, choices]`, of an input `[B, choices, T]` whose
    /// choices run as `B * choices` rows (`BertForMultipleChoice`).
    MultipleChoice,
    /// One row of logits per image (`ViTForImageClassification`).
    ImageClassification {
        /// Label names by index (`id2label`).
        labels: Vec<String>,
    },
}

/// One encoder forward call's inputs.
#[derive(Clone, Copy, Debug)]
pub struct EncoderArgs<'a> {
    /// Token ids `[B, T]`, integer.
    pub input_ids: &'a Tensor,
    /// `[B, T]`, 1 for a real token and 0 for padding (any integer or bool dtype); all real
    /// when `None`.
    pub attention_mask: Option<&'a Tensor>,
    /// Segment ids `[B, T]`; all 0 when `None`.
    pub token_type_ids: Option<&'a Tensor>,
    /// Positions `[B, T]`; `0..T` per row when `None` (as transformers does for encoders).
    pub position_ids: Option<&'a Tensor>,
    /// Also return the embeddings and each layer's output.
    pub output_hidden_states: bool,
}

/// What an encoder returns.
#[derive(Clone, Debug)]
pub struct EncoderOutput {
    /// Output of the last layer, `[B, T, hidden]`.
    pub last_hidden_state: Tensor,
    /// The family's pooled output (`BertPooler`: tanh(dense(first token))), `[B, hidden]`.
    pub pooler_output: Option<Tensor>,
    /// With `output_hidden_states`: the embeddings, then each layer's output.
    pub hidden_states: Vec<Tensor>,
    /// The head's logits (`[B, T, vocab]`, `[B, labels]` or `[B, T, labels]`).
    pub logits: Option<Tensor>,
    /// Projected embeddings `[B, projection_dim]` (CLIP's `text_embeds`).
    pub embeds: Option<Tensor>,
}

impl EncoderOutput {
    /// A question-answering head's `(start_logits, end_logits)`, each `[B, T]`: the two
    /// columns of its logits, as transformers splits them.
    pub fn span_logits(&self) -> Result<(Tensor, Tensor)> {
        let logits = self.logits.as_ref().ok_or_else(|| {
            Error::invalid(
                "logits",
                "this output has no logits: span scores come from a question-answering head".into(),
            )
        })?;
        let &[.., 2] = logits.shape() else {
            return Err(Error::invalid(
                "logits",
                format!(
                    "span scores are the two columns of [batch, seq, 2] logits, got shape {:?}",
                    logits.shape()
                ),
            ));
        };
        let column = |i: usize| -> Result<Tensor> { Ok(logits.narrow(-1, i, 1)?.squeeze(-1)?) };
        Ok((column(0)?, column(1)?))
    }
}

/// The base model under an encoder's head (`BertModel`, `CLIPTextModel`, `ViTModel`, ...):
/// what [`Encoder`] and [`ImageEncoder`] answer from it, once for every head over it.
pub trait Tower: Send + Sync + Debug {
    /// Where the tower runs.
    fn placement(&self) -> &Placement;
    /// HF module paths of the `hidden_states` entries (`embeddings`, `encoder.layer.0`, ...,
    /// under the base model's prefix), which name per-module outputs in parity cases.
    fn hidden_state_modules(&self) -> Vec<String>;
    /// The dtype of weights and activations.
    fn dtype(&self) -> DType {
        self.placement().dtype()
    }
    /// The device inputs go to.
    fn device(&self) -> Device {
        self.placement().device()
    }
    /// Every device the tower runs on, in execution order, each once.
    fn devices(&self) -> Vec<Device> {
        self.placement().devices().to_vec()
    }
}

/// A tower over token ids; itself the [`Encoder`] without a head.
pub trait TextTower: Tower {
    /// Tokens in the vocabulary.
    fn vocab_size(&self) -> usize;
    /// The longest input the position embeddings cover.
    fn max_position_embeddings(&self) -> usize;
    /// Runs the tower: hidden states and, where the family has one, the pooled output.
    fn run(&self, args: EncoderArgs<'_>) -> Result<EncoderOutput>;
}

/// A tower over pixel values; itself the [`ImageEncoder`] without a head.
pub trait ImageTower: Tower {
    /// `(height, width)` the position embeddings were trained for (`image_size`).
    fn image_size(&self) -> (usize, usize);
    /// Runs the tower: hidden states and, where the family has one, the pooled output.
    fn run(&self, args: ImageArgs<'_>) -> Result<EncoderOutput>;
}

impl<T: TextTower> Encoder for T {
    fn tower(&self) -> &dyn TextTower {
        self
    }
    fn forward(&self, args: EncoderArgs<'_>) -> Result<EncoderOutput> {
        self.run(args)
    }
}

impl<T: ImageTower> ImageEncoder for T {
    fn tower(&self) -> &dyn ImageTower {
        self
    }
    fn forward(&self, args: ImageArgs<'_>) -> Result<EncoderOutput> {
        self.run(args)
    }
}

/// The head of a base model: none.
const BASE: EncoderHead = EncoderHead::Base;

/// A bidirectional encoder with an optional head (`BertModel`, `BertFor*`): a [`TextTower`]
/// and what the head computes over it.
pub trait Encoder: Send + Sync + Debug {
    /// The base model.
    fn tower(&self) -> &dyn TextTower;
    /// Runs the encoder (and its head).
    fn forward(&self, args: EncoderArgs<'_>) -> Result<EncoderOutput>;
    /// What the head computes.
    fn head(&self) -> &EncoderHead {
        &BASE
    }
    /// Whether the output carries projected embeddings (`EncoderOutput::embeds`).
    fn projects(&self) -> bool {
        false
    }
    /// The dtype of weights and activations.
    fn dtype(&self) -> DType {
        self.tower().dtype()
    }
    /// The device inputs go to.
    fn device(&self) -> Device {
        self.tower().device()
    }
    /// Every device the model runs on, in execution order, each once.
    fn devices(&self) -> Vec<Device> {
        self.tower().devices()
    }
    /// Tokens in the vocabulary.
    fn vocab_size(&self) -> usize {
        self.tower().vocab_size()
    }
    /// The longest input the position embeddings cover.
    fn max_position_embeddings(&self) -> usize {
        self.tower().max_position_embeddings()
    }
    /// HF module paths of the `hidden_states` entries ([`Tower::hidden_state_modules`]).
    fn hidden_state_modules(&self) -> Vec<String> {
        self.tower().hidden_state_modules()
    }
}

/// One image encoder forward call's inputs.
#[derive(Clone, Copy, Debug)]
pub struct ImageArgs<'a> {
    /// `[B, channels, H, W]` float pixel values, as an image processor makes them (cast to
    /// the model's dtype, as transformers does).
    pub pixel_values: &'a Tensor,
    /// Interpolate the position embeddings to the image's patch grid (transformers'
    /// `interpolate_pos_encoding`); without it the image must be `image_size`.
    pub interpolate_pos_encoding: bool,
    /// Also return the embeddings and each layer's output.
    pub output_hidden_states: bool,
}

impl<'a> ImageArgs<'a> {
    /// `pixel_values` at the trained size, without hidden states.
    pub fn new(pixel_values: &'a Tensor) -> ImageArgs<'a> {
        ImageArgs {
            pixel_values,
            interpolate_pos_encoding: false,
            output_hidden_states: false,
        }
    }

    /// Checks the pixel values against a tower trained on `image_size` (`(height, width)`)
    /// and returns `(batch, height, width)`.
    pub fn check(&self, image_size: (usize, usize)) -> Result<(usize, usize, usize)> {
        let px = self.pixel_values;
        let [b, _, h, w] = px.shape()[..] else {
            return Err(Error::invalid(
                "pixel_values",
                format!(
                    "pixel_values {:?} must be [batch, channels, height, width]",
                    px.shape()
                ),
            ));
        };
        if !self.interpolate_pos_encoding && (h, w) != image_size {
            return Err(Error::invalid("pixel_values", format!(
                "the image is {w}x{h} but the model takes {}x{} (image_size); resize it with the model's image processor, or interpolate the position embeddings",
                image_size.1, image_size.0
            )));
        }
        Ok((b, h, w))
    }
}

/// A vision transformer over pixel values (`ViTModel`, `ViTForImageClassification`,
/// `CLIPVisionModel`, `CLIPVisionModelWithProjection`): an [`ImageTower`] and what the head
/// computes over it (hidden states, the pooled output, logits or projected embeddings).
pub trait ImageEncoder: Send + Sync + Debug {
    /// The base model.
    fn tower(&self) -> &dyn ImageTower;
    /// Runs the encoder (and its head).
    fn forward(&self, args: ImageArgs<'_>) -> Result<EncoderOutput>;
    /// What the head computes (`Base` or `ImageClassification`).
    fn head(&self) -> &EncoderHead {
        &BASE
    }
    /// Whether the output carries projected embeddings (`image_embeds`).
    fn projects(&self) -> bool {
        false
    }
    /// The dtype of weights and activations.
    fn dtype(&self) -> DType {
        self.tower().dtype()
    }
    /// The device inputs go to.
    fn device(&self) -> Device {
        self.tower().device()
    }
    /// Every device the model runs on, in execution order, each once.
    fn devices(&self) -> Vec<Device> {
        self.tower().devices()
    }
    /// `(height, width)` the position embeddings were trained for (`image_size`).
    fn image_size(&self) -> (usize, usize) {
        self.tower().image_size()
    }
    /// HF module paths of the `hidden_states` entries ([`Tower::hidden_state_modules`]).
    fn hidden_state_modules(&self) -> Vec<String> {
        self.tower().hidden_state_modules()
    }
}

/// What a contrastive image-text model returns for a batch of texts and one of images.
#[derive(Clone, Debug)]
pub struct ImageTextOutput {
    /// `[images, texts]`: scaled cosine similarities (`logits_per_image`).
    pub logits_per_image: Tensor,
    /// `[texts, images]`, the transpose (`logits_per_text`).
    pub logits_per_text: Tensor,
    /// `[texts, projection_dim]`, L2-normalized.
    pub text_embeds: Tensor,
    /// `[images, projection_dim]`, L2-normalized.
    pub image_embeds: Tensor,
    /// The text tower's output (`text_model_output`).
    pub text_model_output: EncoderOutput,
    /// The vision tower's output (`vision_model_output`).
    pub vision_model_output: EncoderOutput,
}

/// A contrastive image-text model (`CLIPModel`): a projected text tower and a projected
/// vision tower whose embeddings are compared by a learned temperature.
pub trait ImageTextModel: Send + Sync + Debug {
    /// The projected text tower (`get_text_features` in its `embeds`).
    fn text(&self) -> &dyn Encoder;
    /// The projected vision tower (`get_image_features` in its `embeds`).
    fn vision(&self) -> &dyn ImageEncoder;
    /// Both towers and their similarity logits.
    fn forward(&self, text: EncoderArgs<'_>, image: ImageArgs<'_>) -> Result<ImageTextOutput>;
    /// The projected text tower alone, the vision tower dropped (what text embedding keeps of
    /// a `CLIPModel` checkpoint).
    fn into_text(self: Box<Self>) -> Box<dyn Encoder>;
    /// The projected vision tower alone, the text tower dropped.
    fn into_vision(self: Box<Self>) -> Box<dyn ImageEncoder>;
    /// How zero-shot classification scores this model's logits, as transformers' pipeline
    /// does for its model type.
    fn zero_shot(&self) -> ZeroShotScores {
        ZeroShotScores::Softmax
    }
}

/// How zero-shot image classification turns `logits_per_image` into scores and pads its
/// prompts (transformers' `ZeroShotImageClassificationPipeline`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ZeroShotScores {
    /// A softmax over the labels; prompts padded to the longest (CLIP).
    Softmax,
    /// Each label's sigmoid on its own; prompts padded to `max_length` (SigLIP, trained so).
    Sigmoid {
        /// The padded length (64).
        max_length: usize,
    },
}

/// An encoder-decoder language model (T5): the encoder runs once over the prompt, the
/// decoder generates with a self-attention cache and attends to the encoder's output
/// through cross-attention layers of the same [`KvCache`] (see [`CacheSpec::cross`]), whose
/// keys and values it computes on its first call and reads after.
pub trait Seq2SeqLm: Send + Sync + Debug {
    /// The encoder's output for the prompt.
    fn encode(&self, args: EncoderArgs<'_>) -> Result<EncoderOutput>;
    /// The token the decoder starts from (`decoder_start_token_id`).
    fn decoder_start_token_id(&self) -> u32;
    /// One spec per decoder attention layer (self and cross).
    fn cache_specs(&self) -> Vec<CacheSpec>;
    /// An empty cache for `batch` rows of up to `capacity` decoder tokens.
    fn new_cache(&self, batch: usize, capacity: usize) -> Result<KvCache> {
        KvCache::from_specs(&self.cache_specs(), batch, capacity, self.dtype())
    }
    /// The dtype of weights and activations.
    fn dtype(&self) -> DType;
    /// The device encoder inputs go to (the one holding the embeddings).
    fn device(&self) -> Device;
    /// The device logits are computed on (the one holding the head).
    fn logits_device(&self) -> Device;
    /// Every device the model runs on, in execution order, each once.
    fn devices(&self) -> Vec<Device>;
    /// Tokens in the vocabulary.
    fn vocab_size(&self) -> usize;
    /// Decoder logits (`[B, T, vocab]` or `[B, 1, vocab]`) for `args` given the encoder's
    /// hidden states `[B, S, d_model]` and its mask `[B, S]` (1 for a real token).
    fn decode(
        &self,
        args: ForwardArgs<'_>,
        encoder_hidden_states: &Tensor,
        encoder_attention_mask: Option<&Tensor>,
        cache: &mut KvCache,
        which: LogitsFor<'_>,
    ) -> Result<Tensor>;
}
