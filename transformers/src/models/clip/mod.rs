//! CLIP: mirrors transformers' `models/clip/modeling_clip.py` (eager attention). Three
//! registry entries, as transformers has three configs: the text tower (`clip_text_model`:
//! `CLIPTextModel`, `CLIPTextModelWithProjection`), the vision tower (`clip_vision_model`:
//! `CLIPVisionModel`, `CLIPVisionModelWithProjection`) and both with their projections and
//! temperature (`clip`: `CLIPModel`). Both towers run the same `CLIPEncoder` (pre-norm
//! `EncoderLayer`s); they differ in their embeddings, mask and pooling.

mod model;
mod projection;
mod text;
mod vision;

pub use model::{CLIPConfig, CLIPModel};
pub use projection::WithProjection;
pub use text::{CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection};
pub use vision::{CLIPVisionConfig, CLIPVisionModel, CLIPVisionModelWithProjection};

pub(crate) use model::{normalized, FAMILY as CLIP_FAMILY};
pub(crate) use text::FAMILY;
pub(crate) use vision::{vision_layout, FAMILY as VISION_FAMILY};

/// CLIP's tensor-parallel plan (both towers): heads (q/k/v colwise, out_proj rowwise) and
/// MLP columns (fc1 colwise, fc2 rowwise); a CLIP text tower's embeddings by vocabulary.
pub(crate) const TP_PLAN: TpPlan = &[
    ("layers.*.self_attn.q_proj", TpStyle::Colwise),
    ("layers.*.self_attn.k_proj", TpStyle::Colwise),
    ("layers.*.self_attn.v_proj", TpStyle::Colwise),
    ("layers.*.self_attn.out_proj", TpStyle::Rowwise),
    ("layers.*.mlp.fc1", TpStyle::Colwise),
    ("layers.*.mlp.fc2", TpStyle::Rowwise),
    ("embeddings.token_embedding", TpStyle::Vocab),
];

use zoo_runtime::device_map::{TpPlan, TpStyle};
use zoo_runtime::nn::{LayerNorm, Linear, SharedInput, Weights};
use zoo_runtime::{Activation, DType, Device, SdpaOptions, Tensor};

use crate::models::Placement;
use crate::Result;

/// The sizes of one encoder layer, shared by both towers' configs.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LayerSpec<'a> {
    pub hidden: usize,
    pub intermediate: usize,
    pub heads: usize,
    pub eps: f64,
    pub act: &'a str,
}

/// `CLIPAttention`: scaled dot-product attention over q/k/v projections with biases.
#[derive(Clone, Debug)]
struct Attention {
    /// `q_proj`, `k_proj`, `v_proj` (stacked on PJRT devices).
    qkv: SharedInput<3>,
    out_proj: Linear,
    heads: usize,
}

impl Attention {
    fn load(w: &Weights, s: &LayerSpec<'_>) -> Result<Attention> {
        let h = s.hidden;
        let [q, k, v] = ["q_proj", "k_proj", "v_proj"].map(|n| Linear::load(&w.pp(n), h, h, true));
        Ok(Attention {
            qkv: SharedInput::new([q?, k?, v?])?,
            out_proj: Linear::load(&w.pp("out_proj"), h, h, true)?,
            heads: s.heads,
        })
    }

    /// `x [B, T, hidden]`; `bias` is an additive mask `[B, 1, T, T]` (the text tower's causal
    /// and padding mask; the vision tower has none).
    fn forward(&self, x: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
        let (b, t, h) = (x.shape()[0], x.shape()[1], x.shape()[2]);
        let d = h / self.heads;
        let split = |y: Tensor| -> Result<Tensor> {
            Ok(y.reshape_to(&[b, t, self.heads, d])?.transpose(1, 2)?)
        };
        let [q, k, v] = self.qkv.forward(x)?;
        let (q, k, v) = (split(q)?, split(k)?, split(v)?);
        let opts = SdpaOptions {
            mask: bias,
            round_scores: true,
            ..Default::default()
        };
        let ctx = Tensor::scaled_dot_product_attention(&q, &k, &v, &opts)?;
        let ctx = ctx.transpose(1, 2)?.reshape_to(&[b, t, h])?;
        Ok(self.out_proj.forward(&ctx)?)
    }
}

/// `CLIPEncoderLayer`: pre-norm attention and MLP, each added to the residual stream.
#[derive(Clone, Debug)]
struct EncoderLayer {
    layer_norm1: LayerNorm,
    self_attn: Attention,
    layer_norm2: LayerNorm,
    fc1: Linear,
    fc2: Linear,
    act: Activation,
}

impl EncoderLayer {
    fn load(w: &Weights, s: &LayerSpec<'_>) -> Result<EncoderLayer> {
        let (h, i, eps) = (s.hidden, s.intermediate, s.eps);
        Ok(EncoderLayer {
            layer_norm1: LayerNorm::load(&w.pp("layer_norm1"), h, eps)?,
            self_attn: Attention::load(&w.pp("self_attn"), s)?,
            layer_norm2: LayerNorm::load(&w.pp("layer_norm2"), h, eps)?,
            fc1: Linear::load(&w.pp("mlp.fc1"), h, i, true)?,
            fc2: Linear::load(&w.pp("mlp.fc2"), i, h, true)?,
            act: Activation::from_hf(s.act)?,
        })
    }

    fn forward(&self, x: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
        let a = self
            .self_attn
            .forward(&self.layer_norm1.forward(x)?, bias)?;
        let x = x.add(&a)?;
        let m = self
            .act
            .apply(&self.fc1.forward(&self.layer_norm2.forward(&x)?)?)?;
        Ok(x.add(&self.fc2.forward(&m)?)?)
    }
}

/// `CLIPEncoder`: the layer stack both towers run, each layer on the device its weights were
/// placed on (the activations move at the cuts).
#[derive(Clone, Debug)]
pub(crate) struct CLIPEncoder {
    layers: Vec<EncoderLayer>,
    devices: Vec<Device>,
}

/// An additive attention bias as host values: `[batch, 1, t, t]` in `dtype`, uploaded once
/// per device the layers run on.
pub(crate) struct HostBias<'a> {
    pub values: &'a [f64],
    pub shape: [usize; 4],
    pub dtype: DType,
}

impl CLIPEncoder {
    /// The `layers` layers `layers.0 ..` under `w` (the checkpoint's `encoder.`).
    pub(crate) fn load(w: &Weights, layers: usize, spec: &LayerSpec<'_>) -> Result<CLIPEncoder> {
        let (mut stack, mut devices) = (Vec::with_capacity(layers), Vec::with_capacity(layers));
        for i in 0..layers {
            let lw = w.pp(format!("layers.{i}"));
            devices.push(lw.device());
            stack.push(EncoderLayer::load(&lw, spec)?);
        }
        Ok(CLIPEncoder {
            layers: stack,
            devices,
        })
    }

    /// Runs every layer over `x` with `bias` (none: every key visible), pushing each layer's
    /// input to `hidden_states` when given (transformers' `hidden_states` but the last).
    pub(crate) fn forward(
        &self,
        mut x: Tensor,
        bias: Option<HostBias<'_>>,
        mut hidden_states: Option<&mut Vec<Tensor>>,
    ) -> Result<Tensor> {
        let mut uploaded: Vec<(Device, Tensor)> = Vec::new();
        for (layer, dev) in self.layers.iter().zip(&self.devices) {
            if x.device() != *dev {
                x = x.to_device(dev)?;
            }
            if let Some(h) = hidden_states.as_mut() {
                h.push(x.clone());
            }
            let bias = match &bias {
                None => None,
                Some(b) => match uploaded.iter().find(|(d, _)| d == dev) {
                    Some((_, t)) => Some(t.clone()),
                    None => {
                        let t = Tensor::from_f64s(b.values, &b.shape, b.dtype, dev)?;
                        uploaded.push((*dev, t.clone()));
                        Some(t)
                    }
                },
            };
            x = layer.forward(&x, bias.as_ref())?;
        }
        Ok(x)
    }

    /// Where a tower around this stack runs: inputs on `first` (its embeddings'), then the
    /// layers' devices, then `last` (its final norm's).
    pub(crate) fn placement(&self, dtype: DType, first: Device, last: Device) -> Placement {
        Placement::new(dtype, first, self.devices.iter().copied().chain([last]))
    }

    /// The HF module paths of a tower's `hidden_states`: `{prefix}{embeddings}`, then each
    /// layer under `prefix` (`text_model.` or none).
    pub(crate) fn modules(&self, prefix: &str, embeddings: &str) -> Vec<String> {
        std::iter::once(format!("{prefix}{embeddings}"))
            .chain((0..self.layers.len()).map(|i| format!("{prefix}encoder.layers.{i}")))
            .collect()
    }
}
