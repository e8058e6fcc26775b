//! MPNet: mirrors transformers' `models/mpnet/modeling_mpnet.py` (`MPNetModel` and its
//! masked-LM, sequence-, token-classification, question-answering and multiple-choice heads;
//! all-mpnet-base-v2 is one).
//!
//! MPNet is BERT's post-norm encoder ([`BertModel`](super::bert::BertModel)) with what
//! differs here: no token types; position ids counted over the real tokens from 2 (its
//! padding index is 1, whatever the config says), as RoBERTa's; every layer adds a relative
//! position bias (`encoder.relative_attention_bias`, T5's buckets) to its scores; the
//! attention's modules are `attention.attn.q/k/v/o` and `attention.LayerNorm`; RoBERTa's
//! `lm_head` and first-token classifier.

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

/// The registry entry of `mpnet`.
pub(crate) const FAMILY: Family = family! {
    "mpnet" in "mpnet",
    classes [MPNetModel: Base, MPNetForMaskedLM: MaskedLm,
        MPNetForSequenceClassification: SequenceClassification,
        MPNetForTokenClassification: TokenClassification,
        MPNetForQuestionAnswering: QuestionAnswering, MPNetForMultipleChoice: MultipleChoice],
    no_split ["MPNetLayer"], tp TP_PLAN, config BertConfig,
    loaders Loaders::Encoder(load),
};

/// MPNet's tensor-parallel plan: heads (q/k/v colwise, o rowwise), MLP columns, word
/// embeddings by vocabulary.
const TP_PLAN: TpPlan = &[
    ("layer.*.attention.attn.q", TpStyle::Colwise),
    ("layer.*.attention.attn.k", TpStyle::Colwise),
    ("layer.*.attention.attn.v", TpStyle::Colwise),
    ("layer.*.attention.attn.o", TpStyle::Rowwise),
    ("layer.*.intermediate.dense", TpStyle::Colwise),
    ("layer.*.output.dense", TpStyle::Rowwise),
    ("embeddings.word_embeddings", TpStyle::Vocab),
];

/// Where MPNet's modules are.
const BASE: Base = Base {
    name: "mpnet",
    dotted: "mpnet.",
    modules: ModuleNames {
        layers: "encoder.layer",
        token_types: false,
        attention: [
            "attention.attn.q",
            "attention.attn.k",
            "attention.attn.v",
            "attention.attn.o",
            "attention.LayerNorm",
        ],
        mlp: ["intermediate.dense", "output.dense", "output.LayerNorm"],
        relative_bias: Some("encoder.relative_attention_bias"),
    },
    // `MPNetEmbeddings.padding_idx` is 1 in transformers, not the config's pad_token_id.
    positions: Positions::AfterPadding(1),
    lm_head: LmHead {
        dense: "lm_head.dense",
        act: Some("gelu"),
        norm: "lm_head.layer_norm",
        decoder: "lm_head.decoder",
        bias: "lm_head.bias",
    },
};

/// The planner's view: BERT's, under `mpnet.`.
fn layout(config: &PretrainedConfig) -> Result<Layout> {
    encoder_layout(&BertConfig::from_pretrained(config)?, BASE)
}

/// The family's loader: the base model for [`Task::Base`], else the head's class.
fn load(w: &Weights, config: &PretrainedConfig, task: Task) -> Result<Box<dyn kinds::Encoder>> {
    let c = BertConfig::from_pretrained(config)?;
    Ok(match task {
        Task::Base => Box::new(BASE.load_base(w, &c)?),
        Task::MaskedLm => Box::new(BertForMaskedLM::load_with(w, &c, BASE)?),
        // `MPNetClassificationHead`: RoBERTa's.
        Task::SequenceClassification => Box::new(FirstTokenClassifier::load(
            w,
            &c,
            BASE,
            ("classifier.dense", Activation::Tanh, "classifier.out_proj"),
        )?),
        Task::TokenClassification => Box::new(BertForTokenClassification::load_with(w, &c, BASE)?),
        Task::QuestionAnswering => Box::new(BertForQuestionAnswering::load_with(w, &c, BASE)?),
        Task::MultipleChoice => Box::new(BertForMultipleChoice::load_with(w, &c, BASE)?),
        Task::CausalLm | Task::ImageClassification | Task::Seq2SeqLm | Task::ImageTextToText => {
            return Err(Error::Config {
                path: c.path.clone(),
                reason: format!(
                    "MPNet is a text encoder; it has no {} head",
                    task.auto_class()
                ),
            })
        }
    })
}
