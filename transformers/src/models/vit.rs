//! ViT: mirrors transformers' `models/vit/modeling_vit.py` (`ViTModel`,
//! `ViTForImageClassification`, eager attention).
//!
//! Patches embedded by a strided convolution (with bias), a learned `cls_token` in front,
//! learned position embeddings (interpolated bicubically to other grids on request); per
//! layer, LayerNorm, bidirectional self-attention, a residual, LayerNorm, an MLP (`gelu`) and
//! a residual; a final LayerNorm. `ViTModel`'s pooler is tanh(dense(class token)) when the
//! checkpoint has one; the classifier reads the final class token. Both weight layouts load:
//! the original (`encoder.layer.N.attention.attention.query`, `intermediate.dense`,
//! `output.dense`) and transformers 5's (`layers.N.attention.q_proj`, `mlp.fc1`), under `vit.`
//! for the classifier.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;
use zoo_hub::PretrainedConfig;
use zoo_runtime::device_map::{ModelShape, TpPlan, TpStyle};
use zoo_runtime::nn::{LayerNorm, Linear, SharedInput, Weights};
use zoo_runtime::{Activation, Device, SdpaOptions, Tensor};

use crate::config::{config_error, defaults, positive_fields};
use crate::family::{family, Family, Layout, Loaders, Task};
use crate::kinds::{self, EncoderHead, EncoderOutput, ImageArgs, ImageTower, Tower};
use crate::models::patches::{interpolate_positions, PatchEmbedding};
use crate::models::Placement;
use crate::{Error, Result};

/// The registry entry of `vit`.
pub(crate) const FAMILY: Family = family! {
    "vit" in "vit",
    classes [ViTModel: Base, ViTForImageClassification: ImageClassification],
    no_split ["ViTEmbeddings", "ViTLayer"], tp TP_PLAN, config ViTConfig,
    loaders Loaders::Image(load),
};

/// ViT's tensor-parallel plan: heads (query/key/value colwise, the attention output
/// rowwise) and MLP columns (intermediate colwise, output rowwise) split.
const TP_PLAN: TpPlan = &[
    ("layer.*.attention.attention.query", TpStyle::Colwise),
    ("layer.*.attention.attention.key", TpStyle::Colwise),
    ("layer.*.attention.attention.value", TpStyle::Colwise),
    ("layer.*.attention.output.dense", TpStyle::Rowwise),
    ("layer.*.intermediate.dense", TpStyle::Colwise),
    ("layer.*.output.dense", TpStyle::Rowwise),
];

/// `config.json` of a ViT, as transformers' `ViTConfig` reads it.
#[derive(Clone, Debug, Deserialize)]
pub struct ViTConfig {
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
    /// Epsilon of every LayerNorm.
    #[serde(default = "defaults::eps_1e12")]
    pub layer_norm_eps: f64,
    /// The image the position embeddings cover: one side, or `[height, width]`.
    #[serde(rename = "image_size")]
    image_size_raw: Value,
    /// A patch: one side, or `[height, width]`.
    #[serde(rename = "patch_size")]
    patch_size_raw: Value,
    /// Channels of the pixel values.
    #[serde(default = "defaults::usize::<3>")]
    pub num_channels: usize,
    /// Biases on the query, key and value projections.
    #[serde(default = "defaults::yes")]
    pub qkv_bias: bool,
    /// Width of a head, when not `hidden_size / num_attention_heads`.
    #[serde(default)]
    pub head_dim: Option<usize>,
    /// Width of `ViTModel`'s pooler (default `hidden_size`).
    #[serde(default)]
    pub pooler_output_size: Option<usize>,
    /// Activation of the pooler.
    #[serde(default = "defaults::tanh")]
    pub pooler_act: String,
    /// Label names by index.
    #[serde(default)]
    pub id2label: Option<BTreeMap<String, String>>,
    /// Labels when `id2label` is absent.
    #[serde(default)]
    pub num_labels: Option<usize>,
    /// `(height, width)` of `image_size`.
    #[serde(skip)]
    pub image_size: (usize, usize),
    /// `(height, width)` of `patch_size`.
    #[serde(skip)]
    pub patch_size: (usize, usize),
    /// The config file, for errors.
    #[serde(skip)]
    pub path: std::path::PathBuf,
}

impl ViTConfig {
    /// Reads and checks the typed config.
    pub fn from_pretrained(cfg: &PretrainedConfig) -> Result<ViTConfig> {
        let mut c: ViTConfig = cfg.parse_as()?;
        c.path = cfg.path.clone();
        let bad = |reason: String| config_error(cfg, reason);
        let pair = |v: &Value, field: &str| -> Result<(usize, usize)> {
            let n = |x: &Value| x.as_u64().filter(|&n| n > 0).map(|n| n as usize);
            match v {
                Value::Array(a) if a.len() == 2 => n(&a[0]).zip(n(&a[1])),
                x => n(x).map(|s| (s, s)),
            }
            .ok_or_else(|| {
                bad(format!(
                    "`{field}` is {v}; give a positive size or [height, width]"
                ))
            })
        };
        c.image_size = pair(&c.image_size_raw, "image_size")?;
        c.patch_size = pair(&c.patch_size_raw, "patch_size")?;
        positive_fields!(cfg; c.hidden_size, c.num_hidden_layers, c.num_attention_heads,
            c.intermediate_size, c.num_channels)?;
        if c.head_dim.is_none() && !c.hidden_size.is_multiple_of(c.num_attention_heads) {
            return Err(bad(format!(
                "`hidden_size` ({}) is not divisible by `num_attention_heads` ({})",
                c.hidden_size, c.num_attention_heads
            )));
        }
        if c.head_dim == Some(0) || c.pooler_output_size == Some(0) {
            return Err(bad(
                "`head_dim` and `pooler_output_size` must be positive".into()
            ));
        }
        if c.patch_size.0 > c.image_size.0 || c.patch_size.1 > c.image_size.1 {
            return Err(bad(format!(
                "`patch_size` {:?} is larger than `image_size` {:?}",
                c.patch_size, c.image_size
            )));
        }
        for (field, act) in [("hidden_act", &c.hidden_act), ("pooler_act", &c.pooler_act)] {
            Activation::from_hf(act).map_err(|e| bad(format!("`{field}`: {e}")))?;
        }
        Ok(c)
    }

    fn head_dim(&self) -> usize {
        self.head_dim
            .unwrap_or(self.hidden_size / self.num_attention_heads)
    }

    fn grid(&self) -> (usize, usize) {
        (
            self.image_size.0 / self.patch_size.0,
            self.image_size.1 / self.patch_size.1,
        )
    }

    /// Label names by index: `id2label`, else `LABEL_i` for `num_labels`.
    pub fn labels(&self) -> Result<Vec<String>> {
        crate::config::labels(self.id2label.as_ref(), self.num_labels, &self.path)
    }
}

/// The planner's view: embeddings, then the layers (`encoder.layer.N` or `layers.N`, under
/// `vit.` for the classifier), no KV cache.
fn layout(config: &PretrainedConfig) -> Result<Layout> {
    let c = ViTConfig::from_pretrained(config)?;
    let (rows, cols) = c.grid();
    Ok(Layout {
        layer_containers: ["encoder.layer", "layers", "vit.encoder.layer", "vit.layers"]
            .map(String::from)
            .to_vec(),
        inputs: vec!["embeddings".into(), "vit.embeddings".into()],
        tied: Vec::new(),
        shape: ModelShape::encoder(
            c.num_hidden_layers,
            c.hidden_size,
            c.intermediate_size,
            c.num_attention_heads,
            c.head_dim(),
        ),
        context: rows * cols + 1,
    })
}

fn load(
    w: &Weights,
    config: &PretrainedConfig,
    task: Task,
) -> Result<Box<dyn kinds::ImageEncoder>> {
    let c = ViTConfig::from_pretrained(config)?;
    let prefixed = w.contains("vit.embeddings.cls_token");
    let base = if prefixed { w.pp("vit") } else { w.clone() };
    let prefix = if prefixed { "vit." } else { "" };
    match task {
        Task::Base => Ok(Box::new(ViTModel::load(&base, &c, prefix)?)),
        Task::ImageClassification => {
            let labels = c.labels()?;
            let classifier = Linear::load(&w.pp("classifier"), c.hidden_size, labels.len(), true)?;
            Ok(Box::new(ViTForImageClassification {
                vit: ViTModel::load(&base, &c, prefix)?,
                classifier,
                head: EncoderHead::ImageClassification { labels },
            }))
        }
        other => Err(Error::Config {
            path: c.path.clone(),
            reason: format!("ViT has no {} head", other.auto_class()),
        }),
    }
}

/// `ViTAttention` (or the original `ViTSelfAttention` + `ViTSelfOutput`).
#[derive(Clone, Debug)]
struct Attention {
    /// query, key and value (stacked on PJRT devices).
    qkv: SharedInput<3>,
    o: Linear,
    heads: usize,
    head_dim: usize,
}

/// `ViTLayer`.
#[derive(Clone, Debug)]
struct Layer {
    layernorm_before: LayerNorm,
    attention: Attention,
    layernorm_after: LayerNorm,
    fc1: Linear,
    fc2: Linear,
    act: Activation,
}

impl Layer {
    fn load(w: &Weights, c: &ViTConfig, original: bool) -> Result<Layer> {
        let (h, i) = (c.hidden_size, c.intermediate_size);
        let inner = c.num_attention_heads * c.head_dim();
        let a = w.pp("attention");
        let (q, k, v, o, fc1, fc2) = if original {
            let s = a.pp("attention");
            (
                s.pp("query"),
                s.pp("key"),
                s.pp("value"),
                a.pp("output.dense"),
                w.pp("intermediate.dense"),
                w.pp("output.dense"),
            )
        } else {
            (
                a.pp("q_proj"),
                a.pp("k_proj"),
                a.pp("v_proj"),
                a.pp("o_proj"),
                w.pp("mlp.fc1"),
                w.pp("mlp.fc2"),
            )
        };
        Ok(Layer {
            layernorm_before: LayerNorm::load(&w.pp("layernorm_before"), h, c.layer_norm_eps)?,
            attention: Attention {
                qkv: SharedInput::new([
                    Linear::load(&q, h, inner, c.qkv_bias)?,
                    Linear::load(&k, h, inner, c.qkv_bias)?,
                    Linear::load(&v, h, inner, c.qkv_bias)?,
                ])?,
                o: Linear::load(&o, inner, h, true)?,
                heads: c.num_attention_heads,
                head_dim: c.head_dim(),
            },
            layernorm_after: LayerNorm::load(&w.pp("layernorm_after"), h, c.layer_norm_eps)?,
            fc1: Linear::load(&fc1, h, i, true)?,
            fc2: Linear::load(&fc2, i, h, true)?,
            act: Activation::from_hf(&c.hidden_act)?,
        })
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let a = &self.attention;
        let (b, t) = (x.shape()[0], x.shape()[1]);
        let h = self.layernorm_before.forward(x)?;
        let split = |y: Tensor| -> Result<Tensor> {
            Ok(y.reshape_to(&[b, t, a.heads, a.head_dim])?
                .transpose(1, 2)?)
        };
        let [q, k, v] = a.qkv.forward(&h)?;
        let opts = SdpaOptions {
            round_scores: true,
            ..Default::default()
        };
        let ctx = Tensor::scaled_dot_product_attention(&split(q)?, &split(k)?, &split(v)?, &opts)?;
        let ctx = ctx
            .transpose(1, 2)?
            .reshape_to(&[b, t, a.heads * a.head_dim])?;
        let x = x.add(&a.o.forward(&ctx)?)?;
        let m = self
            .act
            .apply(&self.fc1.forward(&self.layernorm_after.forward(&x)?)?)?;
        Ok(x.add(&self.fc2.forward(&m)?)?)
    }
}

/// `ViTModel`: embeddings, layers, the final LayerNorm and (when stored) the pooler.
#[derive(Clone, Debug)]
pub struct ViTModel {
    patch_embeddings: PatchEmbedding,
    cls_token: Tensor,
    position_embeddings: Tensor,
    layers: Vec<Layer>,
    layer_devices: Vec<Device>,
    layernorm: LayerNorm,
    pooler: Option<(Linear, Activation)>,
    config: ViTConfig,
    placement: Placement,
    prefix: &'static str,
    original_names: bool,
}

impl ViTModel {
    /// Loads the model under `w`; `prefix` is its module path in the checkpoint (`vit.`).
    pub fn load(w: &Weights, c: &ViTConfig, prefix: &'static str) -> Result<ViTModel> {
        let e = w.pp("embeddings");
        let h = c.hidden_size;
        let (rows, cols) = c.grid();
        let original = !w.contains("layers.0.layernorm_before.weight");
        let mut layers = Vec::with_capacity(c.num_hidden_layers);
        let mut layer_devices = Vec::with_capacity(c.num_hidden_layers);
        for i in 0..c.num_hidden_layers {
            let lw = if original {
                w.pp(format!("encoder.layer.{i}"))
            } else {
                w.pp(format!("layers.{i}"))
            };
            layer_devices.push(lw.device());
            layers.push(Layer::load(&lw, c, original)?);
        }
        let pooler = if w.contains("pooler.dense.weight") {
            let size = c.pooler_output_size.unwrap_or(h);
            Some((
                Linear::load(&w.pp("pooler.dense"), h, size, true)?,
                Activation::from_hf(&c.pooler_act)?,
            ))
        } else {
            None
        };
        let cls_token = e.get("cls_token", &[1, 1, h])?;
        let layernorm = LayerNorm::load(&w.pp("layernorm"), h, c.layer_norm_eps)?;
        let first = cls_token.device();
        let last = layernorm.device_or(first);
        Ok(ViTModel {
            placement: Placement::new(
                w.dtype(),
                first,
                layer_devices.iter().copied().chain([last]),
            ),
            patch_embeddings: PatchEmbedding::load(
                &e.pp("patch_embeddings.projection"),
                c.num_channels,
                h,
                c.patch_size,
                true,
            )?,
            cls_token,
            position_embeddings: e.get("position_embeddings", &[1, rows * cols + 1, h])?,
            layers,
            layer_devices,
            layernorm,
            pooler,
            config: c.clone(),
            prefix,
            original_names: original,
        })
    }

    fn layernorm_device(&self) -> Device {
        self.layernorm.device_or(self.device())
    }

    /// Position embeddings for a `rows x cols` grid (transformers keeps the table when the
    /// grid has as many patches and the image is square).
    fn positions(&self, rows: usize, cols: usize, h: usize, w: usize) -> Result<Tensor> {
        let (r0, c0) = self.config.grid();
        let table = self.position_embeddings.squeeze(0)?;
        if rows * cols == r0 * c0 && h == w {
            return Ok(table);
        }
        if r0 != c0 {
            return Err(Error::invalid("interpolate_pos_encoding", format!(
                "interpolating position embeddings needs a square trained grid; this model's is {r0}x{c0}"
            )));
        }
        let class = table.narrow(0, 0, 1)?;
        let grid = interpolate_positions(&table.narrow(0, 1, r0 * c0)?, r0, (rows, cols))?;
        Ok(Tensor::cat(&[&class, &grid], 0)?)
    }
}

impl Tower for ViTModel {
    fn placement(&self) -> &Placement {
        &self.placement
    }
    fn hidden_state_modules(&self) -> Vec<String> {
        let p = self.prefix;
        let layer = if self.original_names {
            "encoder.layer"
        } else {
            "layers"
        };
        std::iter::once(format!("{p}embeddings"))
            .chain((0..self.layers.len()).map(|i| format!("{p}{layer}.{i}")))
            .collect()
    }
}

impl ImageTower for ViTModel {
    fn image_size(&self) -> (usize, usize) {
        self.config.image_size
    }
    fn run(&self, args: ImageArgs<'_>) -> Result<EncoderOutput> {
        let c = &self.config;
        let px = args.pixel_values;
        let (b, h, w) = args.check(c.image_size)?;
        let device = self.device();
        let patches = self
            .patch_embeddings
            .forward(&px.to_device(&device)?, self.placement.dtype())?;
        let (rows, cols) = self.patch_embeddings.grid(h, w);
        let cls = self.cls_token.broadcast_as(&[b, 1, c.hidden_size])?;
        let positions = if args.interpolate_pos_encoding {
            self.positions(rows, cols, h, w)?
        } else {
            self.position_embeddings.squeeze(0)?
        };
        let mut x = Tensor::cat(&[&cls, &patches], 1)?.add(&positions.unsqueeze(0)?)?;
        let mut hidden_states = Vec::new();
        for (layer, dev) in self.layers.iter().zip(&self.layer_devices) {
            if x.device() != *dev {
                x = x.to_device(dev)?;
            }
            if args.output_hidden_states {
                hidden_states.push(x.clone());
            }
            x = layer.forward(&x)?;
        }
        if args.output_hidden_states {
            hidden_states.push(x.clone());
        }
        let last = self
            .layernorm
            .forward(&x.to_device(&self.layernorm_device())?)?;
        let pooler_output = match &self.pooler {
            Some((dense, act)) => {
                let first = last.narrow(1, 0, 1)?.squeeze(1)?;
                Some(act.apply(&dense.forward(&first.to_device(&dense.device())?)?)?)
            }
            None => None,
        };
        Ok(EncoderOutput {
            last_hidden_state: last,
            pooler_output,
            hidden_states,
            logits: None,
            embeds: None,
        })
    }
}

/// `ViTForImageClassification`: a linear classifier over the final class token (labels
/// from `id2label`).
#[derive(Clone, Debug)]
pub struct ViTForImageClassification {
    vit: ViTModel,
    classifier: Linear,
    head: EncoderHead,
}

impl kinds::ImageEncoder for ViTForImageClassification {
    fn tower(&self) -> &dyn ImageTower {
        &self.vit
    }
    fn head(&self) -> &EncoderHead {
        &self.head
    }
    fn devices(&self) -> Vec<Device> {
        let mut d = Tower::devices(&self.vit);
        let c = self.classifier.device();
        if !d.contains(&c) {
            d.push(c);
        }
        d
    }
    fn forward(&self, args: ImageArgs<'_>) -> Result<EncoderOutput> {
        let mut out = self.vit.run(args)?;
        let first = out.last_hidden_state.narrow(1, 0, 1)?.squeeze(1)?;
        out.logits = Some(
            self.classifier
                .forward(&first.to_device(&self.classifier.device())?)?,
        );
        Ok(out)
    }
}
