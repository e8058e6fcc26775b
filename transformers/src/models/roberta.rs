//! RoBERTa: mirrors transformers' `models/roberta/modeling_roberta.py` (`RobertaModel` and its
//! masked-LM, sequence-, token-classification, question-answering and multiple-choice heads).
//!
//! RoBERTa is BERT's encoder ([`BertModel`](super::bert::BertModel)) with what differs here: its base model sits
//! under `roberta.`, its position ids count the real tokens from `pad_token_id + 1` (padding
//! keeps `pad_token_id`), its masked-LM head is `lm_head` (dense, exact GELU, `layer_norm`,
//! the decoder tied to the word embeddings), and its sequence classifier reads the first
//! token through `classifier.dense`, tanh and `classifier.out_proj` rather than a pooler.
//! XLM-RoBERTa (`xlm_roberta.rs`) is the same model under other class names.

use zoo_hub::PretrainedConfig;
use zoo_runtime::device_map::{TpPlan, TpStyle};
use zoo_runtime::nn::Weights;
use zoo_runtime::Activation;

use super::bert::{
    encoder_layout, Base, BertConfig, BertForMaskedLM, BertForMultipleChoice,
    BertForQuestionAnswering, BertForTokenClassification, FirstTokenClassifier, LmHead,
    ModuleNames, Positions,
};
use crate::family::{family, Family, Layout, Loaders, Task};
use crate::kinds;
use crate::{Error, Result};

/// The registry entry of `roberta`.
pub(crate) const FAMILY: Family = family! {
    "roberta" in "roberta",
    classes [RobertaModel: Base, RobertaForMaskedLM: MaskedLm,
        RobertaForSequenceClassification: SequenceClassification,
        RobertaForTokenClassification: TokenClassification,
        RobertaForQuestionAnswering: QuestionAnswering, RobertaForMultipleChoice: MultipleChoice],
    no_split ["RobertaEmbeddings", "RobertaLayer"], tp TP_PLAN, config BertConfig,
    loaders Loaders::Encoder(load),
};

/// RoBERTa's tensor-parallel plan: BERT's, the same module names.
pub(crate) const TP_PLAN: TpPlan = &[
    ("layer.*.attention.self.query", TpStyle::Colwise),
    ("layer.*.attention.self.key", TpStyle::Colwise),
    ("layer.*.attention.self.value", TpStyle::Colwise),
    ("layer.*.attention.output.dense", TpStyle::Rowwise),
    ("layer.*.intermediate.dense", TpStyle::Colwise),
    ("layer.*.output.dense", TpStyle::Rowwise),
    ("embeddings.word_embeddings", TpStyle::Vocab),
];

/// RoBERTa's base model: `roberta.`, positions after the padding index (RobertaConfig's
/// `pad_token_id` defaults to 1), the `lm_head` names.
fn base(c: &BertConfig) -> Base {
    Base {
        name: "roberta",
        dotted: "roberta.",
        modules: ModuleNames::BERT,
        positions: Positions::AfterPadding(c.pad_token_id.unwrap_or(1)),
        lm_head: LmHead {
            dense: "lm_head.dense",
            act: Some("gelu"),
            norm: "lm_head.layer_norm",
            decoder: "lm_head.decoder",
            bias: "lm_head.bias",
        },
    }
}

/// The planner's view: BERT's, under `roberta.`.
pub(crate) fn layout(config: &PretrainedConfig) -> Result<Layout> {
    let c = BertConfig::from_pretrained(config)?;
    encoder_layout(&c, base(&c))
}

/// The family's loader (XLM-RoBERTa's too): the base model for [`Task::Base`], else the
/// head's class.
pub(crate) fn load(
    w: &Weights,
    config: &PretrainedConfig,
    task: Task,
) -> Result<Box<dyn kinds::Encoder>> {
    let c = BertConfig::from_pretrained(config)?;
    let b = base(&c);
    Ok(match task {
        Task::Base => Box::new(b.load_base(w, &c)?),
        Task::MaskedLm => Box::new(BertForMaskedLM::load_with(w, &c, b)?),
        // `RobertaClassificationHead`: the first token through `classifier.dense`, tanh and
        // `classifier.out_proj`.
        Task::SequenceClassification => Box::new(FirstTokenClassifier::load(
            w,
            &c,
            b,
            ("classifier.dense", Activation::Tanh, "classifier.out_proj"),
        )?),
        Task::TokenClassification => Box::new(BertForTokenClassification::load_with(w, &c, b)?),
        Task::QuestionAnswering => Box::new(BertForQuestionAnswering::load_with(w, &c, b)?),
        Task::MultipleChoice => Box::new(BertForMultipleChoice::load_with(w, &c, b)?),
        Task::CausalLm | Task::ImageClassification | Task::Seq2SeqLm | Task::ImageTextToText => {
            return Err(Error::Config {
                path: c.path.clone(),
                reason: format!(
                    "RoBERTa is a text encoder here; it has no {} head",
                    task.auto_class()
                ),
            })
        }
    })
}
