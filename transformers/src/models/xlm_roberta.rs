//! XLM-RoBERTa: transformers' `models/xlm_roberta/modeling_xlm_roberta.py` is RoBERTa under
//! other class names (the multilingual e5 and paraphrase embedders, bge-m3 and the bge
//! rerankers ship as it); the model and its heads are `roberta.rs`'s.

use super::bert::BertConfig;
use super::roberta::{layout, load, TP_PLAN};
use crate::family::{family, Family, Loaders};

/// The registry entry of `xlm-roberta`.
pub(crate) const FAMILY: Family = family! {
    "xlm-roberta" in "xlm_roberta",
    classes [XLMRobertaModel: Base, XLMRobertaForMaskedLM: MaskedLm,
        XLMRobertaForSequenceClassification: SequenceClassification,
        XLMRobertaForTokenClassification: TokenClassification,
        XLMRobertaForQuestionAnswering: QuestionAnswering,
        XLMRobertaForMultipleChoice: MultipleChoice],
    no_split ["XLMRobertaEmbeddings", "XLMRobertaLayer"], tp TP_PLAN, config BertConfig,
    loaders Loaders::Encoder(load),
};
