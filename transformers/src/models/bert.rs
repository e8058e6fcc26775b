//! BERT: mirrors transformers' `models/bert/modeling_bert.py` (`BertModel`,
//! `BertForMaskedLM`, `BertForSequenceClassification`, `BertForTokenClassification`,
//! `BertForQuestionAnswering`, `BertForMultipleChoice`, eager attention).
//!
//! A post-norm bidirectional encoder: word + absolute position + token-type embeddings,
//! LayerNorm; per layer, self-attention over every real token (padding masked by the
//! attention mask), a residual LayerNorm, a GELU (any `hidden_act`) MLP and another residual
//! LayerNorm. The pooler is tanh(dense(first token)). Weight names are the checkpoint's
//! (`encoder.layer.3.attention.self.query.weight`), under `bert.` when a head is present; the
//! TF-era `LayerNorm.gamma`/`beta` names load as `weight`/`bias`, as transformers renames them.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Deserialize;
use zoo_hub::PretrainedConfig;
use zoo_runtime::device_map::{ModelShape, TpPlan, TpStyle};
use zoo_runtime::nn::{Embedding, LayerNorm, Linear, SharedInput, Weights};
use zoo_runtime::{Activation, DType, Device, SdpaOptions, Tensor};

use crate::config::{config_error, defaults, heads_divide, positive_fields};
use crate::family::{family, Family, Layout, Loaders, Task};
use crate::kinds::{self, EncoderArgs, EncoderHead, EncoderOutput, TextTower, Tower};
use crate::models::packed::Packed;
use crate::models::Placement;
use crate::{Error, Result};

/// The registry entry of `bert`.
pub(crate) const FAMILY: Family = family! {
    "bert" in "bert",
    classes [BertModel: Base, BertForMaskedLM: MaskedLm,
        BertForSequenceClassification: SequenceClassification,
        BertForTokenClassification: TokenClassification,
        BertForQuestionAnswering: QuestionAnswering, BertForMultipleChoice: MultipleChoice],
    no_split ["BertEmbeddings", "BertLayer"], tp TP_PLAN, config BertConfig,
    loaders Loaders::Encoder(load),
};

/// BERT's tensor-parallel plan: heads (query/key/value colwise, the attention output
/// rowwise), MLP columns (intermediate colwise, output rowwise), word embeddings by
/// vocabulary.
const TP_PLAN: TpPlan = &[
    ("layer.*.attention.self.query", TpStyle::Colwise),
    ("layer.*.attention.self.key", TpStyle::Colwise),
    ("layer.*.attention.self.value", TpStyle::Colwise),
    ("layer.*.attention.output.dense", TpStyle::Rowwise),
    ("layer.*.intermediate.dense", TpStyle::Colwise),
    ("layer.*.output.dense", TpStyle::Rowwise),
    ("embeddings.word_embeddings", TpStyle::Vocab),
];

/// `config.json` of a BERT checkpoint, as transformers' `BertConfig` reads it.
#[derive(Clone, Debug, Deserialize)]
pub struct BertConfig {
    /// Rows of the word embedding table.
    pub vocab_size: usize,
    /// Width of the residual stream.
    pub hidden_size: usize,
    /// Encoder layers.
    pub num_hidden_layers: usize,
    /// Attention heads.
    pub num_attention_heads: usize,
    /// Width of the MLP.
    pub intermediate_size: usize,
    /// MLP activation.
    #[serde(default = "defaults::gelu")]
    pub hidden_act: String,
    /// Rows of the position embedding table.
    #[serde(default = "defaults::usize::<512>")]
    pub max_position_embeddings: usize,
    /// Rows of the token-type (segment) table.
    #[serde(default = "defaults::usize::<2>")]
    pub type_vocab_size: usize,
    /// Epsilon of every LayerNorm.
    #[serde(default = "defaults::eps_1e12")]
    pub layer_norm_eps: f64,
    /// Only `absolute` positions are defined by current transformers.
    #[serde(default = "defaults::absolute")]
    pub position_embedding_type: String,
    /// The padding token (RoBERTa's position ids count from after it).
    #[serde(default)]
    pub pad_token_id: Option<i64>,
    /// Rows of MPNet's relative position bias table.
    #[serde(default)]
    pub relative_attention_num_buckets: Option<usize>,
    /// Label names of a classification head, by index.
    #[serde(default)]
    pub id2label: Option<BTreeMap<String, String>>,
    /// Labels of a classification head when `id2label` is absent (transformers' default 2).
    #[serde(default)]
    pub num_labels: Option<usize>,
    /// The `config.json` it came from, for errors.
    #[serde(skip)]
    pub path: PathBuf,
}

impl BertConfig {
    /// Reads the typed config; a missing or mistyped field names the file and the field.
    pub fn from_pretrained(cfg: &PretrainedConfig) -> Result<BertConfig> {
        let mut c: BertConfig = cfg.parse_as()?;
        c.path = cfg.path.clone();
        let bad = |reason: String| config_error(cfg, reason);
        positive_fields!(cfg; c.vocab_size, c.hidden_size, c.num_hidden_layers,
            c.num_attention_heads, c.intermediate_size, c.max_position_embeddings)?;
        heads_divide!(cfg; c.hidden_size, c.num_attention_heads)?;
        if c.position_embedding_type != "absolute" {
            return Err(bad(format!(
                "`position_embedding_type` is {:?}; transformers' BERT defines only \"absolute\"",
                c.position_embedding_type
            )));
        }
        Activation::from_hf(&c.hidden_act).map_err(|e| bad(format!("`hidden_act`: {e}")))?;
        Ok(c)
    }

    /// Label names by index: `id2label` in index order, else `LABEL_i` for `num_labels`.
    pub fn labels(&self) -> Result<Vec<String>> {
        crate::config::labels(self.id2label.as_ref(), self.num_labels, &self.path)
    }

    fn head_dim(&self) -> usize {
        self.hidden_size / self.num_attention_heads
    }
}

/// The planner's view: embeddings, then `encoder.layer.N` (under `bert.` when a head is
/// present), no KV cache; planned for the full `max_position_embeddings`.
fn layout(config: &PretrainedConfig) -> Result<Layout> {
    encoder_layout(&BertConfig::from_pretrained(config)?, Base::BERT)
}

/// The planner's view of a BERT-shaped encoder whose heads hold it under `base`.
pub(crate) fn encoder_layout(c: &BertConfig, base: Base) -> Result<Layout> {
    let (p, layers) = (base.dotted, base.modules.layers);
    Ok(Layout {
        layer_containers: vec![layers.into(), format!("{p}{layers}")],
        inputs: vec!["embeddings".into(), format!("{p}embeddings")],
        tied: vec![vec![
            format!("{p}embeddings.word_embeddings.weight"),
            format!("{}.weight", base.lm_head.decoder),
        ]],
        shape: ModelShape::encoder(
            c.num_hidden_layers,
            c.hidden_size,
            c.intermediate_size,
            c.num_attention_heads,
            c.head_dim(),
        ),
        context: c.max_position_embeddings,
    })
}

/// How a BERT-shaped model numbers positions when the caller gives none.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Positions {
    /// `0..T` per row (BERT).
    FromZero,
    /// Real tokens counted from `padding_idx + 1`, padding at `padding_idx` (RoBERTa's
    /// `create_position_ids_from_input_ids`).
    AfterPadding(i64),
}

/// The module names of a BERT-shaped encoder in its checkpoint, each layer's relative to
/// `layers.N`: BERT's, or those of a family that renamed them (DistilBERT's
/// `transformer.layer.N.attention.q_lin`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct ModuleNames {
    /// The layer list (`encoder.layer`).
    pub layers: &'static str,
    /// Whether the embeddings add token types.
    pub token_types: bool,
    /// Query, key, value, the attention's output projection and its residual norm.
    pub attention: [&'static str; 5],
    /// The MLP's two projections and its residual norm.
    pub mlp: [&'static str; 3],
    /// The relative position bias table every layer adds to its scores (MPNet's
    /// `encoder.relative_attention_bias`), if the family has one.
    pub relative_bias: Option<&'static str>,
}

impl ModuleNames {
    /// BERT's (and RoBERTa's).
    pub(crate) const BERT: ModuleNames = ModuleNames {
        layers: "encoder.layer",
        token_types: true,
        attention: [
            "attention.self.query",
            "attention.self.key",
            "attention.self.value",
            "attention.output.dense",
            "attention.output.LayerNorm",
        ],
        mlp: ["intermediate.dense", "output.dense", "output.LayerNorm"],
        relative_bias: None,
    };
}

/// A masked-LM head over the encoder, its modules named from the checkpoint root: a dense
/// transform, its activation (`None`: the config's `hidden_act`) and norm, then the decoder
/// tied to the word embeddings with a bias of its own.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LmHead {
    pub dense: &'static str,
    pub act: Option<&'static str>,
    pub norm: &'static str,
    pub decoder: &'static str,
    /// The bias's name (transformers ties `decoder.bias` to it).
    pub bias: &'static str,
}

/// Where a head's base model sits in its checkpoint, what its modules are called and how it
/// numbers positions: BERT's `bert.` from 0, a derived family's (RoBERTa's `roberta.`,
/// DistilBERT's `distilbert.`) its own way.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Base {
    /// The base model's attribute in the head classes (`bert`).
    pub name: &'static str,
    /// The same with its dot (`bert.`), the prefix of its module paths.
    pub dotted: &'static str,
    /// Its modules' names.
    pub modules: ModuleNames,
    /// Position ids when none are given.
    pub positions: Positions,
    /// The masked-LM head.
    pub lm_head: LmHead,
}

impl Base {
    /// BERT's.
    pub(crate) const BERT: Base = Base {
        name: "bert",
        dotted: "bert.",
        modules: ModuleNames::BERT,
        positions: Positions::FromZero,
        lm_head: LmHead {
            dense: "cls.predictions.transform.dense",
            act: None,
            norm: "cls.predictions.transform.LayerNorm",
            decoder: "cls.predictions.decoder",
            bias: "cls.predictions.bias",
        },
    };

    /// The base model under a head, with or without its pooler.
    pub(crate) fn load(self, w: &Weights, c: &BertConfig, pooler: bool) -> Result<BertModel> {
        Ok(
            BertModel::load_named(&w.pp(self.name), c, pooler, self.modules)?
                .under(self.dotted)
                .numbering(self.positions),
        )
    }

    /// The base model of a base checkpoint (at the root) or of a head's (under `name.`).
    pub(crate) fn load_base(self, w: &Weights, c: &BertConfig) -> Result<BertModel> {
        let w = if w.contains(&format!("{}embeddings.word_embeddings.weight", self.dotted)) {
            w.pp(self.name)
        } else {
            w.clone()
        };
        Ok(BertModel::load_named(&w, c, true, self.modules)?.numbering(self.positions))
    }
}

/// The family's loader: the base model for [`Task::Base`], else the head's class.
fn load(w: &Weights, config: &PretrainedConfig, task: Task) -> Result<Box<dyn kinds::Encoder>> {
    let c = BertConfig::from_pretrained(config)?;
    Ok(match task {
        Task::Base => Box::new(Base::BERT.load_base(w, &c)?),
        Task::MaskedLm => Box::new(BertForMaskedLM::load(w, &c)?),
        Task::SequenceClassification => Box::new(BertForSequenceClassification::load(w, &c)?),
        Task::TokenClassification => Box::new(BertForTokenClassification::load(w, &c)?),
        Task::QuestionAnswering => Box::new(BertForQuestionAnswering::load(w, &c)?),
        Task::MultipleChoice => Box::new(BertForMultipleChoice::load(w, &c)?),
        Task::CausalLm | Task::ImageClassification | Task::Seq2SeqLm | Task::ImageTextToText => {
            return Err(Error::Config {
                path: c.path.clone(),
                reason: format!(
                    "BERT is a text encoder; it has no {} head",
                    task.auto_class()
                ),
            })
        }
    })
}

/// A LayerNorm stored as `weight`/`bias`, or as TF's `gamma`/`beta`.
fn layer_norm(w: &Weights, dim: usize, eps: f64) -> Result<LayerNorm> {
    if !w.contains("weight") && w.contains("gamma") {
        return Ok(LayerNorm {
            weight: Some(w.get("gamma", &[dim])?),
            bias: Some(w.get("beta", &[dim])?),
            eps,
        });
    }
    Ok(LayerNorm::load(w, dim, eps)?)
}

/// `BertEmbeddings`: word + token type + absolute position, then LayerNorm.
#[derive(Clone, Debug)]
struct Embeddings {
    word_embeddings: Embedding,
    position_embeddings: Embedding,
    /// None where the family has no token types (DistilBERT).
    token_type_embeddings: Option<Embedding>,
    layer_norm: LayerNorm,
}

impl Embeddings {
    fn load(w: &Weights, c: &BertConfig, token_types: bool) -> Result<Embeddings> {
        let h = c.hidden_size;
        Ok(Embeddings {
            word_embeddings: Embedding::load(&w.pp("word_embeddings"), c.vocab_size, h)?,
            position_embeddings: Embedding::load(
                &w.pp("position_embeddings"),
                c.max_position_embeddings,
                h,
            )?,
            token_type_embeddings: if token_types {
                Some(Embedding::load(
                    &w.pp("token_type_embeddings"),
                    c.type_vocab_size,
                    h,
                )?)
            } else {
                None
            },
            layer_norm: layer_norm(&w.pp("LayerNorm"), h, c.layer_norm_eps)?,
        })
    }

    fn forward(&self, ids: &Tensor, types: &Tensor, positions: &Tensor) -> Result<Tensor> {
        // transformers adds in this order, each a rounded op in 16-bit.
        let mut x = self.word_embeddings.forward(ids)?;
        if let Some(t) = &self.token_type_embeddings {
            x = x.add(&t.forward(types)?)?;
        }
        let x = x.add(&self.position_embeddings.forward(positions)?)?;
        Ok(self.layer_norm.forward(&x)?)
    }
}

/// `BertAttention`: `BertSelfAttention` (query/key/value) and `BertSelfOutput` (dense,
/// residual LayerNorm).
#[derive(Clone, Debug)]
struct Attention {
    /// query, key and value (stacked on PJRT devices).
    qkv: SharedInput<3>,
    dense: Linear,
    layer_norm: LayerNorm,
    heads: usize,
}

impl Attention {
    /// From the layer's weights `w`, its modules named by `names`.
    fn load(w: &Weights, c: &BertConfig, names: &ModuleNames) -> Result<Attention> {
        let h = c.hidden_size;
        let [q, k, v, o, norm] = names.attention;
        Ok(Attention {
            qkv: SharedInput::new([
                Linear::load(&w.pp(q), h, h, true)?,
                Linear::load(&w.pp(k), h, h, true)?,
                Linear::load(&w.pp(v), h, h, true)?,
            ])?,
            dense: Linear::load(&w.pp(o), h, h, true)?,
            layer_norm: layer_norm(&w.pp(norm), h, c.layer_norm_eps)?,
            heads: c.num_attention_heads,
        })
    }

    /// `x [B, T, hidden]`, or the real tokens `[1, N, hidden]` of `packed`; `bias` is the
    /// additive padding mask `[B, 1, 1, T]` (or `[B, heads, T, T]` with MPNet's positions).
    fn forward(&self, x: &Tensor, bias: &Tensor, packed: Option<&Packed>) -> Result<Tensor> {
        let h = x.shape()[2];
        let (b, t) = packed.map_or((x.shape()[0], x.shape()[1]), |p| (p.batch, p.seq));
        let d = h / self.heads;
        let split = |y: Tensor| -> Result<Tensor> {
            let y = match packed {
                Some(p) => p.unpack(&y)?,
                None => y,
            };
            Ok(y.reshape_to(&[b, t, self.heads, d])?.transpose(1, 2)?)
        };
        let [q, k, v] = self.qkv.forward(x)?;
        let (q, k, v) = (split(q)?, split(k)?, split(v)?);
        let opts = SdpaOptions {
            mask: Some(bias),
            round_scores: true,
            ..Default::default()
        };
        let ctx = Tensor::scaled_dot_product_attention(&q, &k, &v, &opts)?;
        let ctx = ctx.transpose(1, 2)?.reshape_to(&[b, t, h])?;
        let ctx = match packed {
            Some(p) => p.pack(&ctx)?,
            None => ctx,
        };
        let y = self.dense.forward(&ctx)?;
        Ok(self.layer_norm.forward(&y.add(x)?)?)
    }
}

/// `BertLayer`: attention, then `BertIntermediate` (dense, act) and `BertOutput` (dense,
/// residual LayerNorm).
#[derive(Clone, Debug)]
struct Layer {
    attention: Attention,
    intermediate: Linear,
    output: Linear,
    output_norm: LayerNorm,
    act: Activation,
}

impl Layer {
    fn load(w: &Weights, c: &BertConfig, names: &ModuleNames) -> Result<Layer> {
        let (h, i) = (c.hidden_size, c.intermediate_size);
        let [up, down, norm] = names.mlp;
        Ok(Layer {
            attention: Attention::load(w, c, names)?,
            intermediate: Linear::load(&w.pp(up), h, i, true)?,
            output: Linear::load(&w.pp(down), i, h, true)?,
            output_norm: layer_norm(&w.pp(norm), h, c.layer_norm_eps)?,
            act: Activation::from_hf(&c.hidden_act)?,
        })
    }

    fn forward(&self, x: &Tensor, bias: &Tensor, packed: Option<&Packed>) -> Result<Tensor> {
        let a = self.attention.forward(x, bias, packed)?;
        let m = self.act.apply(&self.intermediate.forward(&a)?)?;
        let y = self.output.forward(&m)?;
        Ok(self.output_norm.forward(&y.add(&a)?)?)
    }
}

/// `BertModel`: embeddings, encoder layers and (unless a head drops it) the pooler.
#[derive(Clone, Debug)]
pub struct BertModel {
    embeddings: Embeddings,
    layers: Vec<Layer>,
    pooler: Option<Linear>,
    config: BertConfig,
    placement: Placement,
    /// Where each layer runs; activations move between devices at the cuts.
    layer_devices: Vec<Device>,
    /// The module prefix of the base model in its checkpoint (`bert.` under a head).
    prefix: &'static str,
    /// How positions are numbered when the caller gives none.
    positions: Positions,
    /// The layer list's name (`encoder.layer`), for the per-layer outputs.
    layers_name: &'static str,
    /// MPNet's relative position bias table (`[buckets, heads]`).
    relative_bias: Option<Embedding>,
}

impl BertModel {
    /// Loads the base model from the weights under `w` (its root: `embeddings.*`,
    /// `encoder.*`, `pooler.*`); `pooler` as `add_pooling_layer`.
    pub fn load(w: &Weights, config: &BertConfig, pooler: bool) -> Result<BertModel> {
        BertModel::load_named(w, config, pooler, ModuleNames::BERT)
    }

    /// [`BertModel::load`] with a family's module names.
    pub(crate) fn load_named(
        w: &Weights,
        config: &BertConfig,
        pooler: bool,
        names: ModuleNames,
    ) -> Result<BertModel> {
        let c = config;
        let embeddings = Embeddings::load(&w.pp("embeddings"), c, names.token_types)?;
        let relative_bias = match names.relative_bias {
            Some(name) => {
                let rows = c.relative_attention_num_buckets.unwrap_or(32);
                Some(Embedding::load(&w.pp(name), rows, c.num_attention_heads)?)
            }
            None => None,
        };
        let mut layers = Vec::with_capacity(c.num_hidden_layers);
        let mut layer_devices = Vec::with_capacity(c.num_hidden_layers);
        for i in 0..c.num_hidden_layers {
            let lw = w.pp(format!("{}.{i}", names.layers));
            layer_devices.push(lw.device());
            layers.push(Layer::load(&lw, c, &names)?);
        }
        // A checkpoint saved without a pooler (a head that drops it) has none to load.
        let pooler = if pooler && w.contains("pooler.dense.weight") {
            Some(Linear::load(
                &w.pp("pooler.dense"),
                c.hidden_size,
                c.hidden_size,
                true,
            )?)
        } else {
            None
        };
        let placement = Placement::new(
            w.dtype(),
            embeddings.word_embeddings.device(),
            layer_devices.iter().copied(),
        );
        Ok(BertModel {
            embeddings,
            layers,
            pooler,
            config: c.clone(),
            placement,
            layer_devices,
            prefix: "",
            positions: Positions::FromZero,
            layers_name: names.layers,
            relative_bias,
        })
    }

    /// The config the model was built from.
    pub fn config(&self) -> &BertConfig {
        &self.config
    }

    fn under(mut self, prefix: &'static str) -> BertModel {
        self.prefix = prefix;
        self
    }

    fn numbering(mut self, positions: Positions) -> BertModel {
        self.positions = positions;
        self
    }

    /// The longest input: every position up to `max_position_embeddings`, less the ones
    /// RoBERTa's numbering skips (the padding index and those below it).
    fn max_tokens(&self) -> usize {
        let n = self.config.max_position_embeddings;
        match self.positions {
            Positions::FromZero => n,
            Positions::AfterPadding(pad) => n.saturating_sub(pad.max(0) as usize + 1),
        }
    }
}

/// Ids the host knows must index their table; ids computed on a device are left to it.
pub(crate) fn check_ids(ids: &Tensor, rows: usize, name: &'static str) -> Result<()> {
    if let Some(&bad) = ids
        .host_known_i64()
        .iter()
        .flatten()
        .find(|&&i| i < 0 || i as usize >= rows)
    {
        return Err(Error::invalid(
            name,
            format!("{name} holds {bad}, outside 0..{rows}"),
        ));
    }
    Ok(())
}

/// An input beside `input_ids` (`attention_mask`, `token_type_ids`, `position_ids`) as i64 on
/// `device`, refused by `name` unless it has the ids' shape.
pub(crate) fn like_ids(
    name: &'static str,
    x: Option<&Tensor>,
    ids: &Tensor,
    device: &Device,
) -> Result<Option<Tensor>> {
    match x {
        Some(x) if x.shape() != ids.shape() => Err(Error::invalid(
            name,
            format!(
                "{name} {:?} must have the shape of input_ids {:?}",
                x.shape(),
                ids.shape()
            ),
        )),
        Some(x) => Ok(Some(x.to_device(device)?.to_dtype(DType::I64)?)),
        None => Ok(None),
    }
}

/// A multiple-choice input `[batch, choices, seq]` as the `batch * choices` rows an encoder
/// runs, as transformers views every input of it.
pub(crate) struct ChoiceRows {
    batch: usize,
    choices: usize,
    ids: Tensor,
    /// The rows' attention mask, if given.
    pub mask: Option<Tensor>,
    types: Option<Tensor>,
    positions: Option<Tensor>,
}

impl ChoiceRows {
    /// The rows of `args`, each input refused by name unless `[batch, choices, seq]`.
    pub(crate) fn of(args: &EncoderArgs<'_>) -> Result<ChoiceRows> {
        let &[batch, choices, seq] = args.input_ids.shape() else {
            return Err(Error::invalid(
                "input_ids",
                format!(
                    "multiple choice reads [batch, choices, seq] ids, got shape {:?}",
                    args.input_ids.shape()
                ),
            ));
        };
        let rows = |t: &Tensor, name: &'static str| -> Result<Tensor> {
            if t.shape() != [batch, choices, seq] {
                return Err(Error::invalid(
                    name,
                    format!(
                        "shape {:?} differs from input_ids' [{batch}, {choices}, {seq}]",
                        t.shape()
                    ),
                ));
            }
            Ok(t.reshape(&[(batch * choices) as isize, seq as isize])?)
        };
        Ok(ChoiceRows {
            batch,
            choices,
            ids: rows(args.input_ids, "input_ids")?,
            mask: args
                .attention_mask
                .map(|t| rows(t, "attention_mask"))
                .transpose()?,
            types: args
                .token_type_ids
                .map(|t| rows(t, "token_type_ids"))
                .transpose()?,
            positions: args
                .position_ids
                .map(|t| rows(t, "position_ids"))
                .transpose()?,
        })
    }

    /// The encoder's arguments over the rows.
    pub(crate) fn args(&self, output_hidden_states: bool) -> EncoderArgs<'_> {
        EncoderArgs {
            input_ids: &self.ids,
            attention_mask: self.mask.as_ref(),
            token_type_ids: self.types.as_ref(),
            position_ids: self.positions.as_ref(),
            output_hidden_states,
        }
    }

    /// One score per row (`[batch * choices, 1]`) as `[batch, choices]`.
    pub(crate) fn scores(&self, per_row: &Tensor) -> Result<Tensor> {
        Ok(per_row.reshape(&[self.batch as isize, self.choices as isize])?)
    }
}

/// MPNet's position bias `[1, heads, T, T]` (`compute_position_bias`): the table's row for
/// the bucket of each `key - query`, 32 buckets over distances up to 128 (the defaults
/// transformers calls it with, whatever the table's size).
fn relative_position_bias(table: &Embedding, t: usize) -> Result<Tensor> {
    let buckets: Vec<i64> = (0..t)
        .flat_map(|q| {
            (0..t).map(move |k| {
                crate::models::t5::relative_bucket(k as i64 - q as i64, true, 32, 128) as i64
            })
        })
        .collect();
    let idx = Tensor::from_vec(buckets, &[t * t], &table.device())?;
    let values = table.forward(&idx)?;
    let heads = values.shape()[1];
    Ok(values
        .reshape_to(&[t, t, heads])?
        .permute(&[2, 0, 1])?
        .unsqueeze(0)?)
}

/// `keep [B, 1, 1, T]` (bool) as transformers' additive mask in `dtype`: 0 to attend, the
/// dtype's lowest finite value to ignore.
fn additive_mask(keep: &Tensor, dtype: DType) -> Result<Tensor> {
    let low = dtype.finite_min();
    let zeros = Tensor::zeros(keep.shape(), dtype, &keep.device())?;
    let lows = Tensor::full(keep.shape(), low, dtype, &keep.device())?;
    Ok(keep.where_cond(&zeros, &lows)?)
}

impl Tower for BertModel {
    fn placement(&self) -> &Placement {
        &self.placement
    }
    fn hidden_state_modules(&self) -> Vec<String> {
        let p = self.prefix;
        std::iter::once(format!("{p}embeddings"))
            .chain((0..self.layers.len()).map(|i| format!("{p}{}.{i}", self.layers_name)))
            .collect()
    }
}

impl TextTower for BertModel {
    fn vocab_size(&self) -> usize {
        self.config.vocab_size
    }
    fn max_position_embeddings(&self) -> usize {
        self.max_tokens()
    }
    fn run(&self, args: EncoderArgs<'_>) -> Result<EncoderOutput> {
        let ids = args.input_ids;
        if ids.rank() != 2 {
            return Err(Error::invalid(
                "input_ids",
                format!("input_ids {:?} must be [batch, seq]", ids.shape()),
            ));
        }
        let (b, t) = (ids.shape()[0], ids.shape()[1]);
        let c = &self.config;
        if t == 0 || t > self.max_tokens() {
            return Err(Error::invalid("input_ids", format!(
                "the input has {t} tokens; the model takes 1 to {} (max_position_embeddings {}); truncate it",
                self.max_tokens(),
                c.max_position_embeddings
            )));
        }
        let device = self.device();
        let same = |name, x| like_ids(name, x, ids, &device);
        let ids = ids.to_device(&device)?.to_dtype(DType::I64)?;
        check_ids(&ids, c.vocab_size, "input_ids")?;
        let types = match same("token_type_ids", args.token_type_ids)? {
            Some(t) => t,
            None => Tensor::from_vec(vec![0i64; b * t], &[b, t], &device)?,
        };
        // A family without token types (DistilBERT) reads none: a tokenizer's pair segments
        // are left out, as its tokenizer leaves them out.
        if self.embeddings.token_type_embeddings.is_some() {
            check_ids(&types, c.type_vocab_size, "token_type_ids")?;
        }
        let positions = match (same("position_ids", args.position_ids)?, self.positions) {
            (Some(p), _) => p,
            (None, Positions::FromZero) => {
                let rows: Vec<i64> = (0..b).flat_map(|_| 0..t as i64).collect();
                Tensor::from_vec(rows, &[b, t], &device)?
            }
            (None, Positions::AfterPadding(pad)) => {
                // cumsum(ids != pad) * (ids != pad) + pad, per row.
                let ids = ids.to_vec::<i64>()?;
                let mut rows = Vec::with_capacity(b * t);
                for row in ids.chunks(t) {
                    let mut count = 0;
                    rows.extend(row.iter().map(|&id| {
                        count += i64::from(id != pad);
                        if id != pad {
                            count + pad
                        } else {
                            pad
                        }
                    }));
                }
                Tensor::from_vec(rows, &[b, t], &device)?
            }
        };
        check_ids(&positions, c.max_position_embeddings, "position_ids")?;
        let mask = same("attention_mask", args.attention_mask)?;
        let mut x = self.embeddings.forward(&ids, &types, &positions)?;
        // transformers' extended mask: 0 where a key is a real token, the dtype's lowest
        // value where it is padding, `[B, 1, 1, T]`.
        let keep = match &mask {
            Some(m) => m.cmp_scalar("!=", 0.0)?,
            None => Tensor::ones(&[b, t], DType::Bool, &device)?,
        };
        let keep = keep.reshape_to(&[b, 1, 1, t])?;
        let position_bias = match &self.relative_bias {
            Some(table) => Some(relative_position_bias(table, t)?),
            None => None,
        };
        let mut biases: Vec<(Device, Tensor)> = Vec::new();
        // A padded batch's real tokens run packed through the layers (see `Packed`).
        let flags: Vec<bool> = match &mask {
            Some(m) => m.to_vec::<i64>()?.iter().map(|&v| v != 0).collect(),
            None => Vec::new(),
        };
        let packing = Packed::new(&flags, (b, t), &x.device())?;
        if let Some(p) = &packing {
            x = p.pack(&x)?;
        }
        let mut packings: Vec<(Device, Packed)> = Vec::new();
        let mut hidden_states = Vec::new();
        for (layer, dev) in self.layers.iter().zip(&self.layer_devices) {
            if x.device() != *dev {
                x = x.to_device(dev)?;
            }
            let packed = match &packing {
                Some(p) => Some(p.on(dev, &mut packings)?),
                None => None,
            };
            if args.output_hidden_states {
                hidden_states.push(match &packed {
                    Some(p) => p.unpack(&x)?,
                    None => x.clone(),
                });
            }
            let bias = match biases.iter().find(|(d, _)| d == dev) {
                Some((_, m)) => m.clone(),
                None => {
                    let m = additive_mask(&keep.to_device(dev)?, self.placement.dtype())?;
                    // MPNet adds its position bias to the scores before the mask.
                    let m = match &position_bias {
                        Some(p) => p.to_device(dev)?.add(&m)?,
                        None => m,
                    };
                    biases.push((*dev, m.clone()));
                    m
                }
            };
            x = layer.forward(&x, &bias, packed.as_ref())?;
        }
        if let Some(p) = &packing {
            x = p.on(&x.device(), &mut packings)?.unpack(&x)?;
        }
        if args.output_hidden_states {
            hidden_states.push(x.clone());
        }
        let pooler_output = match &self.pooler {
            Some(p) => {
                let first = x.narrow(1, 0, 1)?.squeeze(1)?.to_device(&p.device())?;
                Some(p.forward(&first)?.tanh()?)
            }
            None => None,
        };
        Ok(EncoderOutput {
            last_hidden_state: x,
            pooler_output,
            hidden_states,
            logits: None,
            embeds: None,
        })
    }
}

/// `BertForMaskedLM`: the base model without pooler, then `cls.predictions`: a dense +
/// activation + LayerNorm transform and a decoder tied to the word embeddings, with its
/// own bias.
#[derive(Clone, Debug)]
pub struct BertForMaskedLM {
    bert: BertModel,
    transform: Linear,
    transform_norm: LayerNorm,
    act: Activation,
    decoder: Linear,
    head: EncoderHead,
}

impl BertForMaskedLM {
    /// Loads from the checkpoint root (`bert.*`, `cls.predictions.*`).
    pub fn load(w: &Weights, c: &BertConfig) -> Result<BertForMaskedLM> {
        BertForMaskedLM::load_with(w, c, Base::BERT)
    }

    /// The same head over a derived family's base and names (RoBERTa's `roberta.*` and
    /// `lm_head.*`).
    pub(crate) fn load_with(w: &Weights, c: &BertConfig, base: Base) -> Result<BertForMaskedLM> {
        let bert = base.load(w, c, false)?;
        let head = base.lm_head;
        let h = c.hidden_size;
        let decoder = |name: &str| format!("{}.{name}", head.decoder);
        // The decoder's weight is the word-embedding table (tied), stored or not.
        let weight = if w.contains(&decoder("weight")) {
            w.get(&decoder("weight"), &[c.vocab_size, h])?
        } else {
            bert.embeddings.word_embeddings.weight()?
        };
        let bias = match w.get_opt(head.bias, &[c.vocab_size])? {
            Some(b) => b,
            None => w.get(&decoder("bias"), &[c.vocab_size])?,
        };
        Ok(BertForMaskedLM {
            transform: Linear::load(&w.pp(head.dense), h, h, true)?,
            transform_norm: layer_norm(&w.pp(head.norm), h, c.layer_norm_eps)?,
            act: Activation::from_hf(head.act.unwrap_or(&c.hidden_act))?,
            // The bias is the head's own tensor, placed with it; the product runs with the
            // (tied) weight.
            decoder: {
                let on = weight.device();
                Linear::new(weight, Some(bias.to_device(&on)?))
            },
            bert,
            head: EncoderHead::MaskedLm,
        })
    }
}

impl kinds::Encoder for BertForMaskedLM {
    fn tower(&self) -> &dyn TextTower {
        &self.bert
    }
    fn head(&self) -> &EncoderHead {
        &self.head
    }
    fn forward(&self, args: EncoderArgs<'_>) -> Result<EncoderOutput> {
        let mut out = self.bert.run(args)?;
        // The transform runs where it was placed; the tied decoder lives with the word
        // embeddings, possibly on another device.
        let x = out.last_hidden_state.to_device(&self.transform.device())?;
        let x = self.act.apply(&self.transform.forward(&x)?)?;
        let x = self.transform_norm.forward(&x)?;
        let x = x.to_device(&self.decoder.device())?;
        out.logits = Some(self.decoder.forward(&x)?);
        Ok(out)
    }
}

/// `BertForSequenceClassification`: the pooled output through `classifier`.
#[derive(Clone, Debug)]
pub struct BertForSequenceClassification {
    bert: BertModel,
    classifier: Linear,
    head: EncoderHead,
}

impl BertForSequenceClassification {
    /// Loads from the checkpoint root (`bert.*` with its pooler, `classifier.*`).
    pub fn load(w: &Weights, c: &BertConfig) -> Result<BertForSequenceClassification> {
        let bert = BertModel::load(&w.pp("bert"), c, true)?.under("bert.");
        if bert.pooler.is_none() {
            return Err(Error::Config {
                path: c.path.clone(),
                reason: format!(
                    "BertForSequenceClassification classifies the pooled output, but the checkpoint has no `{}`",
                    w.full_name("bert.pooler.dense.weight")
                ),
            });
        }
        let labels = c.labels()?;
        Ok(BertForSequenceClassification {
            classifier: Linear::load(&w.pp("classifier"), c.hidden_size, labels.len(), true)?,
            bert,
            head: EncoderHead::SequenceClassification { labels },
        })
    }
}

impl kinds::Encoder for BertForSequenceClassification {
    fn tower(&self) -> &dyn TextTower {
        &self.bert
    }
    fn head(&self) -> &EncoderHead {
        &self.head
    }
    fn forward(&self, args: EncoderArgs<'_>) -> Result<EncoderOutput> {
        let mut out = self.bert.run(args)?;
        if let Some(pooled) = &out.pooler_output {
            let pooled = pooled.to_device(&self.classifier.device())?;
            out.logits = Some(self.classifier.forward(&pooled)?);
        }
        Ok(out)
    }
}

/// `BertForTokenClassification`: every token's hidden state through `classifier`.
#[derive(Clone, Debug)]
pub struct BertForTokenClassification {
    bert: BertModel,
    classifier: Linear,
    head: EncoderHead,
}

impl BertForTokenClassification {
    /// Loads from the checkpoint root (`bert.*` without pooler, `classifier.*`).
    pub fn load(w: &Weights, c: &BertConfig) -> Result<BertForTokenClassification> {
        BertForTokenClassification::load_with(w, c, Base::BERT)
    }

    /// The same head over a derived family's base (RoBERTa's `roberta.*`).
    pub(crate) fn load_with(
        w: &Weights,
        c: &BertConfig,
        base: Base,
    ) -> Result<BertForTokenClassification> {
        let bert = base.load(w, c, false)?;
        let labels = c.labels()?;
        Ok(BertForTokenClassification {
            classifier: Linear::load(&w.pp("classifier"), c.hidden_size, labels.len(), true)?,
            bert,
            head: EncoderHead::TokenClassification { labels },
        })
    }
}

impl kinds::Encoder for BertForTokenClassification {
    fn tower(&self) -> &dyn TextTower {
        &self.bert
    }
    fn head(&self) -> &EncoderHead {
        &self.head
    }
    fn forward(&self, args: EncoderArgs<'_>) -> Result<EncoderOutput> {
        let mut out = self.bert.run(args)?;
        let x = out.last_hidden_state.to_device(&self.classifier.device())?;
        out.logits = Some(self.classifier.forward(&x)?);
        Ok(out)
    }
}

/// `BertForQuestionAnswering`: every token's hidden state through `qa_outputs`, two scores
/// per token (where the answer starts, where it ends).
#[derive(Clone, Debug)]
pub struct BertForQuestionAnswering {
    bert: BertModel,
    qa_outputs: Linear,
}

impl BertForQuestionAnswering {
    /// Loads from the checkpoint root (`bert.*` without pooler, `qa_outputs.*`).
    pub fn load(w: &Weights, c: &BertConfig) -> Result<BertForQuestionAnswering> {
        BertForQuestionAnswering::load_with(w, c, Base::BERT)
    }

    /// The same head over a derived family's base (RoBERTa's `roberta.*`).
    pub(crate) fn load_with(
        w: &Weights,
        c: &BertConfig,
        base: Base,
    ) -> Result<BertForQuestionAnswering> {
        // transformers sizes `qa_outputs` by `num_labels` and splits it into exactly two.
        if let Some(n) = c.num_labels.filter(|&n| n != 2) {
            return Err(Error::Config {
                path: c.path.clone(),
                reason: format!(
                    "the question-answering head scores a span's start and end: `num_labels` must be 2, not {n}"
                ),
            });
        }
        let bert = base.load(w, c, false)?;
        Ok(BertForQuestionAnswering {
            qa_outputs: Linear::load(&w.pp("qa_outputs"), c.hidden_size, 2, true)?,
            bert,
        })
    }
}

impl kinds::Encoder for BertForQuestionAnswering {
    fn tower(&self) -> &dyn TextTower {
        &self.bert
    }
    fn head(&self) -> &EncoderHead {
        &EncoderHead::QuestionAnswering
    }
    fn forward(&self, args: EncoderArgs<'_>) -> Result<EncoderOutput> {
        let mut out = self.bert.run(args)?;
        let x = out.last_hidden_state.to_device(&self.qa_outputs.device())?;
        out.logits = Some(self.qa_outputs.forward(&x)?);
        Ok(out)
    }
}

/// `BertForMultipleChoice`: inputs `[batch, choices, seq]` run as `batch * choices` rows, each
/// row's pooled output through `classifier` (one score), the scores `[batch, choices]`.
#[derive(Clone, Debug)]
pub struct BertForMultipleChoice {
    bert: BertModel,
    classifier: Linear,
}

impl BertForMultipleChoice {
    /// Loads from the checkpoint root (`bert.*` with its pooler, `classifier.*`).
    pub fn load(w: &Weights, c: &BertConfig) -> Result<BertForMultipleChoice> {
        BertForMultipleChoice::load_with(w, c, Base::BERT)
    }

    /// The same head over a derived family's base (RoBERTa's `roberta.*`).
    pub(crate) fn load_with(
        w: &Weights,
        c: &BertConfig,
        base: Base,
    ) -> Result<BertForMultipleChoice> {
        let bert = base.load(w, c, true)?;
        if bert.pooler.is_none() {
            return Err(Error::Config {
                path: c.path.clone(),
                reason: format!(
                    "the multiple-choice head scores the pooled output, but the checkpoint has no `{}`",
                    w.full_name(&format!("{}pooler.dense.weight", base.dotted))
                ),
            });
        }
        Ok(BertForMultipleChoice {
            classifier: Linear::load(&w.pp("classifier"), c.hidden_size, 1, true)?,
            bert,
        })
    }
}

impl kinds::Encoder for BertForMultipleChoice {
    fn tower(&self) -> &dyn TextTower {
        &self.bert
    }
    fn head(&self) -> &EncoderHead {
        &EncoderHead::MultipleChoice
    }
    fn forward(&self, args: EncoderArgs<'_>) -> Result<EncoderOutput> {
        let rows = ChoiceRows::of(&args)?;
        let mut out = self.bert.run(rows.args(args.output_hidden_states))?;
        if let Some(pooled) = &out.pooler_output {
            let pooled = pooled.to_device(&self.classifier.device())?;
            out.logits = Some(rows.scores(&self.classifier.forward(&pooled)?)?);
        }
        Ok(out)
    }
}

/// A sequence classifier on the first token through a dense layer and an activation, then
/// the classifier: RoBERTa's `classifier.dense`, tanh, `classifier.out_proj`
/// (`RobertaClassificationHead`), DistilBERT's `pre_classifier`, ReLU, `classifier`.
#[derive(Clone, Debug)]
pub struct FirstTokenClassifier {
    model: BertModel,
    dense: Linear,
    act: Activation,
    out: Linear,
    head: EncoderHead,
}

impl FirstTokenClassifier {
    /// Loads the base model `base` (without pooler) and the head's dense layer, activation
    /// and classifier named in `names`.
    pub(crate) fn load(
        w: &Weights,
        c: &BertConfig,
        base: Base,
        (dense, act, out): (&str, Activation, &str),
    ) -> Result<FirstTokenClassifier> {
        let labels = c.labels()?;
        let h = c.hidden_size;
        Ok(FirstTokenClassifier {
            model: base.load(w, c, false)?,
            dense: Linear::load(&w.pp(dense), h, h, true)?,
            act,
            out: Linear::load(&w.pp(out), h, labels.len(), true)?,
            head: EncoderHead::SequenceClassification { labels },
        })
    }
}

impl kinds::Encoder for FirstTokenClassifier {
    fn tower(&self) -> &dyn TextTower {
        &self.model
    }
    fn head(&self) -> &EncoderHead {
        &self.head
    }
    fn forward(&self, args: EncoderArgs<'_>) -> Result<EncoderOutput> {
        let mut out = self.model.run(args)?;
        let first = out.last_hidden_state.narrow(1, 0, 1)?.squeeze(1)?;
        let first = first.to_device(&self.dense.device())?;
        let x = self.act.apply(&self.dense.forward(&first)?)?;
        out.logits = Some(self.out.forward(&x)?);
        Ok(out)
    }
}
