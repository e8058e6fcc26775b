//! DistilBERT: mirrors transformers' `models/distilbert/modeling_distilbert.py`
//! (`DistilBertModel` and its masked-LM, sequence-, token-classification and
//! question-answering heads).
//!
//! DistilBERT is BERT's post-norm encoder ([`BertModel`](super::bert::BertModel)) under other
//! names, with what differs here: its config (`dim`, `n_layers`, `n_heads`, `hidden_dim`,
//! `activation`), no token types, every LayerNorm's epsilon 1e-12, the layers under
//! `transformer.layer.N` (`attention.q_lin`, `sa_layer_norm`, `ffn.lin1`, ...), the
//! masked-LM head's `vocab_transform`, `vocab_layer_norm` and `vocab_projector` at the root,
//! and a sequence classifier on the first token through `pre_classifier`, ReLU and
//! `classifier`. Sinusoidal position tables (`sinusoidal_pos_embds`) are stored in the
//! checkpoint like learned ones.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Deserialize;
use zoo_hub::PretrainedConfig;
use zoo_runtime::device_map::{TpPlan, TpStyle};
use zoo_runtime::nn::Weights;
use zoo_runtime::Activation;

use super::bert::{
    encoder_layout, Base, BertConfig, BertForMaskedLM, BertForQuestionAnswering,
    BertForTokenClassification, FirstTokenClassifier, LmHead, ModuleNames, Positions,
};
use crate::config::{config_error, defaults, heads_divide, positive_fields};
use crate::family::{family, Family, Layout, Loaders, Task};
use crate::kinds;
use crate::{Error, Result};

/// The registry entry of `distilbert`.
pub(crate) const FAMILY: Family = family! {
    "distilbert" in "distilbert",
    classes [DistilBertModel: Base, DistilBertForMaskedLM: MaskedLm,
        DistilBertForSequenceClassification: SequenceClassification,
        DistilBertForTokenClassification: TokenClassification,
        DistilBertForQuestionAnswering: QuestionAnswering],
    no_split ["TransformerBlock"], tp TP_PLAN, config DistilBertConfig,
    loaders Loaders::Encoder(load),
};

/// DistilBERT's tensor-parallel plan: heads (q/k/v colwise, `out_lin` rowwise), MLP columns
/// (`lin1` colwise, `lin2` rowwise), word embeddings by vocabulary.
const TP_PLAN: TpPlan = &[
    ("layer.*.attention.q_lin", TpStyle::Colwise),
    ("layer.*.attention.k_lin", TpStyle::Colwise),
    ("layer.*.attention.v_lin", TpStyle::Colwise),
    ("layer.*.attention.out_lin", TpStyle::Rowwise),
    ("layer.*.ffn.lin1", TpStyle::Colwise),
    ("layer.*.ffn.lin2", TpStyle::Rowwise),
    ("embeddings.word_embeddings", TpStyle::Vocab),
];

/// Where DistilBERT's modules are.
const BASE: Base = Base {
    name: "distilbert",
    dotted: "distilbert.",
    modules: ModuleNames {
        layers: "transformer.layer",
        token_types: false,
        attention: [
            "attention.q_lin",
            "attention.k_lin",
            "attention.v_lin",
            "attention.out_lin",
            "sa_layer_norm",
        ],
        mlp: ["ffn.lin1", "ffn.lin2", "output_layer_norm"],
        relative_bias: None,
    },
    positions: Positions::FromZero,
    lm_head: LmHead {
        dense: "vocab_transform",
        act: None,
        norm: "vocab_layer_norm",
        decoder: "vocab_projector",
        bias: "vocab_projector.bias",
    },
};

/// `config.json` of a DistilBERT checkpoint, as transformers' `DistilBertConfig` reads it.
#[derive(Clone, Debug, Deserialize)]
pub struct DistilBertConfig {
    /// Rows of the word embedding table.
    #[serde(default = "defaults::usize::<30522>")]
    pub vocab_size: usize,
    /// Width of the residual stream.
    #[serde(default = "defaults::usize::<768>")]
    pub dim: usize,
    /// Encoder layers.
    #[serde(default = "defaults::usize::<6>")]
    pub n_layers: usize,
    /// Attention heads.
    #[serde(default = "defaults::usize::<12>")]
    pub n_heads: usize,
    /// Width of the MLP.
    #[serde(default = "defaults::usize::<3072>")]
    pub hidden_dim: usize,
    /// MLP (and masked-LM transform) activation.
    #[serde(default = "defaults::gelu")]
    pub activation: String,
    /// Rows of the position table.
    #[serde(default = "defaults::usize::<512>")]
    pub max_position_embeddings: usize,
    /// The padding token.
    #[serde(default)]
    pub pad_token_id: Option<i64>,
    /// Label names of a classification head, by index.
    #[serde(default)]
    pub id2label: Option<BTreeMap<String, String>>,
    /// Labels of a classification head when `id2label` is absent.
    #[serde(default)]
    pub num_labels: Option<usize>,
    /// The `config.json` it came from, for errors.
    #[serde(skip)]
    pub path: PathBuf,
}

impl DistilBertConfig {
    /// Reads the typed config; a missing or mistyped field names the file and the field.
    pub fn from_pretrained(cfg: &PretrainedConfig) -> Result<DistilBertConfig> {
        let mut c: DistilBertConfig = cfg.parse_as()?;
        c.path = cfg.path.clone();
        positive_fields!(cfg; c.vocab_size, c.dim, c.n_layers, c.n_heads, c.hidden_dim,
            c.max_position_embeddings)?;
        heads_divide!(cfg; c.dim, c.n_heads)?;
        Activation::from_hf(&c.activation)
            .map_err(|e| config_error(cfg, format!("`activation`: {e}")))?;
        Ok(c)
    }

    /// The same encoder in BERT's terms (every LayerNorm's epsilon is 1e-12).
    pub(crate) fn to_bert(&self) -> BertConfig {
        BertConfig {
            vocab_size: self.vocab_size,
            hidden_size: self.dim,
            num_hidden_layers: self.n_layers,
            num_attention_heads: self.n_heads,
            intermediate_size: self.hidden_dim,
            hidden_act: self.activation.clone(),
            max_position_embeddings: self.max_position_embeddings,
            type_vocab_size: 1,
            layer_norm_eps: 1e-12,
            position_embedding_type: "absolute".into(),
            pad_token_id: self.pad_token_id,
            relative_attention_num_buckets: None,
            id2label: self.id2label.clone(),
            num_labels: self.num_labels,
            path: self.path.clone(),
        }
    }
}

/// The planner's view: BERT's, under `distilbert.` with DistilBERT's layer list.
fn layout(config: &PretrainedConfig) -> Result<Layout> {
    encoder_layout(&DistilBertConfig::from_pretrained(config)?.to_bert(), BASE)
}

/// The family's loader: the base model for [`Task::Base`], else the head's class.
fn load(w: &Weights, config: &PretrainedConfig, task: Task) -> Result<Box<dyn kinds::Encoder>> {
    let c = DistilBertConfig::from_pretrained(config)?.to_bert();
    Ok(match task {
        Task::Base => Box::new(BASE.load_base(w, &c)?),
        Task::MaskedLm => Box::new(BertForMaskedLM::load_with(w, &c, BASE)?),
        Task::SequenceClassification => Box::new(FirstTokenClassifier::load(
            w,
            &c,
            BASE,
            ("pre_classifier", Activation::Relu, "classifier"),
        )?),
        Task::TokenClassification => Box::new(BertForTokenClassification::load_with(w, &c, BASE)?),
        Task::QuestionAnswering => Box::new(BertForQuestionAnswering::load_with(w, &c, BASE)?),
        Task::MultipleChoice
        | Task::CausalLm
        | Task::ImageClassification
        | Task::Seq2SeqLm
        | Task::ImageTextToText => {
            return Err(Error::Config {
                path: c.path.clone(),
                reason: format!(
                    "zoo runs DistilBERT's base model and its masked-LM, sequence-, token-classification and question-answering heads; not {}",
                    task.auto_class()
                ),
            })
        }
    })
}
