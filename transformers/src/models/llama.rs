//! Llama: mirrors transformers' `models/llama/modeling_llama.py` (`LlamaModel`,
//! `LlamaForCausalLM`, eager attention).
//!
//! The decoder here is the Llama block that Mistral, Qwen2 and Qwen3 reuse — each is Llama
//! with a few switches, exactly as transformers' `modular_*.py` files derive them — so the
//! switches live in [`DecoderFeatures`] and each derivative's file says which ones it turns
//! on and loads through `load_base_with` / `load_causal_lm_with`. Weight names are the
//! checkpoint's (`model.layers.3.self_attn.q_proj.weight`).

use std::collections::HashMap;

use zoo_hub::PretrainedConfig;
use zoo_runtime::device_map::{CacheLayout, ModelShape, TpPlan, TpStyle};
use zoo_runtime::nn::{Embedding, Linear, RmsNorm, RotaryEmbedding, SharedInput, Weights};
use zoo_runtime::{Activation, DType, Device, RopeStyle, SdpaOptions, Tensor};

use super::decoder::ForCausalLM;
use super::moe::{self, MoeFeatures, SparseMoeBlock};
use super::placement::{execution_order, on_device};
use crate::cache::{CacheSpec, KvCache};
use crate::config::DecoderConfig;
use crate::family::{Architecture, Family, Layout, Loaders, Names, Task};
use crate::kinds::{checked_ids, CausalLm, DecoderModel, ForwardArgs, ModelOutput};
use crate::Result;

/// The registry entry of `llama`.
pub(crate) const FAMILY: Family = family::<Llama>(Names {
    model_type: "llama",
    modeling_file: "models/llama/modeling_llama.py",
    architectures: &[
        Architecture::new("LlamaForCausalLM", Task::CausalLm),
        Architecture::new("LlamaModel", Task::Base),
        Architecture::new(
            "LlamaForSequenceClassification",
            Task::SequenceClassification,
        ),
        Architecture::new("LlamaForTokenClassification", Task::TokenClassification),
        Architecture::new("LlamaForQuestionAnswering", Task::QuestionAnswering),
    ],
    gguf_architectures: &["llama"],
    no_split_modules: &["LlamaDecoderLayer"],
    tp_plan: TP_PLAN,
});

/// The tensor-parallel plan of Llama and the families on its decoder, as their
/// `base_model_tp_plan`s and `_tp_plan`s name it: attention heads and MLP columns split
/// (q/k/v, gate/up and their fused forms colwise; o and down rowwise, so each layer ends in
/// one all-reduce), experts' projections the same, embeddings and LM head by vocabulary.
pub(crate) const TP_PLAN: TpPlan = &[
    ("layers.*.self_attn.q_proj", TpStyle::Colwise),
    ("layers.*.self_attn.k_proj", TpStyle::Colwise),
    ("layers.*.self_attn.v_proj", TpStyle::Colwise),
    ("layers.*.self_attn.qkv_proj", TpStyle::Colwise),
    ("layers.*.self_attn.o_proj", TpStyle::Rowwise),
    ("layers.*.mlp.gate_proj", TpStyle::Colwise),
    ("layers.*.mlp.up_proj", TpStyle::Colwise),
    ("layers.*.mlp.gate_up_proj", TpStyle::Colwise),
    ("layers.*.mlp.down_proj", TpStyle::Rowwise),
    ("experts.*.gate_proj", TpStyle::Colwise),
    ("experts.*.up_proj", TpStyle::Colwise),
    ("experts.*.down_proj", TpStyle::Rowwise),
    ("experts.*.w1", TpStyle::Colwise),
    ("experts.*.w3", TpStyle::Colwise),
    ("experts.*.w2", TpStyle::Rowwise),
    ("shared_expert.gate_proj", TpStyle::Colwise),
    ("shared_expert.up_proj", TpStyle::Colwise),
    ("shared_expert.down_proj", TpStyle::Rowwise),
    ("embed_tokens", TpStyle::Vocab),
    ("lm_head", TpStyle::Vocab),
];

/// Llama's own switches ([`features`]).
pub(crate) struct Llama;
impl Switches for Llama {
    const FEATURES: FeaturesFn = features;
}

/// How a family on this decoder reads its switches from the config.
pub(crate) type FeaturesFn = fn(&DecoderConfig) -> DecoderFeatures;

/// A family on this decoder: its switches, as transformers' `modular_*.py` derive it.
pub(crate) trait Switches {
    /// The family's [`DecoderFeatures`] for a config.
    const FEATURES: FeaturesFn;
}

/// The registry entry of a family on this decoder with `F`'s switches: its config read and
/// checked (experts included), planned and loaded as Llama's.
pub(crate) const fn family<F: Switches>(names: Names) -> Family {
    names.family(
        |c| moe::validate_with(c, F::FEATURES),
        |c| moe::layout_with(c, F::FEATURES),
        Loaders::Decoder {
            base: |w, c| load_base_with(w, c, F::FEATURES),
            causal_lm: |w, c| load_causal_lm_with(w, c, F::FEATURES),
        },
    )
}

/// The planner's view of a Llama-shaped decoder from its config: `model.layers.N` (or a base
/// checkpoint's `layers.N`, or a question-answering class's `transformer.layers.N`) are the
/// no-split units, each with its KV cache; `lm_head` goes with the embeddings when `tied`
/// (Gemma ties by default; its families decide).
pub(crate) fn decoder_layout(c: &DecoderConfig, tied: bool) -> Layout {
    Layout {
        // A base model's checkpoint (`Qwen3Model`, a decoder embedder) holds them at the root;
        // Llama's, Qwen2's, Qwen3's and Qwen3-MoE's question-answering classes under
        // `transformer.`.
        layer_containers: vec![
            "model.layers".into(),
            "layers".into(),
            "transformer.layers".into(),
        ],
        inputs: vec![
            "model.embed_tokens".into(),
            "embed_tokens".into(),
            "transformer.embed_tokens".into(),
        ],
        tied: if tied {
            vec![vec![
                "model.embed_tokens.weight".into(),
                "lm_head.weight".into(),
            ]]
        } else {
            Vec::new()
        },
        shape: ModelShape {
            layers: c.num_hidden_layers,
            hidden: c.hidden_size,
            intermediate: c.intermediate_size,
            heads: c.num_attention_heads,
            kv_heads: c.num_kv_heads(),
            head_dim: c.head_dim(),
            vocab: c.vocab_size,
            kv_cache: CacheLayout::SelfAttention,
        },
        context: c.max_position_embeddings,
    }
}

/// The base decoder of a family built on this one, with its `features`.
pub(crate) fn load_base_with(
    w: &Weights,
    config: &PretrainedConfig,
    features: fn(&DecoderConfig) -> DecoderFeatures,
) -> Result<Box<dyn DecoderModel>> {
    let c = DecoderConfig::from_pretrained(config)?;
    // A causal-LM checkpoint holds the base model under `model.`.
    let w = if w.contains("model.embed_tokens.weight") {
        w.pp("model")
    } else {
        w.clone()
    };
    Ok(Box::new(LlamaModel::load(&w, &c, features(&c))?))
}

/// The causal LM of a family built on this one, with its `features`.
pub(crate) fn load_causal_lm_with(
    w: &Weights,
    config: &PretrainedConfig,
    features: fn(&DecoderConfig) -> DecoderFeatures,
) -> Result<Box<dyn CausalLm>> {
    let c = DecoderConfig::from_pretrained(config)?;
    Ok(Box::new(LlamaForCausalLM::load(w, &c, features(&c))?))
}

/// The per-family switches of the Llama block. The default is the plain block: no biases,
/// norms, windows, fused projections or experts; a family sets what differs
/// (`..Default::default()`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DecoderFeatures {
    /// Bias on q/k/v projections (Llama/Qwen3 `attention_bias`; always on in Qwen2).
    pub qkv_bias: bool,
    /// Bias on o_proj (Llama/Qwen3 `attention_bias`; never in Qwen2).
    pub o_bias: bool,
    /// Bias on gate/up/down (Llama `mlp_bias`).
    pub mlp_bias: bool,
    /// RMSNorm over each head of q and k before rope (Qwen3).
    pub qk_norm: bool,
    /// Sliding window per layer (`None` = full attention).
    pub windows: Vec<Option<usize>>,
    /// q, k and v in one `qkv_proj` (rows: q, then k, then v), as Phi-3 stores them.
    pub fused_qkv: bool,
    /// gate and up in one `gate_up_proj` (rows: gate, then up), as Phi-3 stores them.
    pub fused_gate_up: bool,
    /// Mixture-of-experts layers in place of some or all MLPs (Mixtral, Qwen2-MoE, Qwen3-MoE).
    pub moe: Option<MoeFeatures>,
    /// Generation recomputes the whole sequence when it first passes a longrope switch
    /// (`original_max_position_embeddings`), as transformers' Phi-3 does.
    pub longrope_recompute: bool,
}

/// Llama's own switches: `attention_bias` on all four projections, `mlp_bias`, a window
/// only where v5 `layer_types` asks for one.
pub fn features(config: &DecoderConfig) -> DecoderFeatures {
    DecoderFeatures {
        qkv_bias: config.attention_bias,
        o_bias: config.attention_bias,
        mlp_bias: config.mlp_bias,
        windows: config.windows(|_| false),
        ..Default::default()
    }
}

/// Where the tokens of a forward pass sit: their rope tables (`[B, 1, T, r/2]`) and the first
/// cache slot they are written to.
pub(crate) struct Positions<'a> {
    pub(crate) cos: &'a Tensor,
    pub(crate) sin: &'a Tensor,
    pub(crate) start: usize,
}

/// How a family's attention differs from Llama's, beyond the projections' biases.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct AttentionKind {
    /// Score scale; `head_dim ** -0.5` when `None`.
    pub(crate) scale: Option<f64>,
    /// Scores become `cap * tanh(scores / cap)` before the mask (Gemma 2).
    pub(crate) softcap: Option<f64>,
    /// The per-head q/k norms are Gemma's (`1 + weight`, in f32) rather than Llama's.
    pub(crate) gemma_qk_norm: bool,
}

/// `LlamaAttention` (which Gemma's derives from): projections, optional q/k norms, rope,
/// cache write, grouped attention.
#[derive(Clone, Debug)]
pub(crate) struct Attention {
    /// q, k and v: separate, stored fused (`qkv_proj`), or stacked at load on PJRT devices.
    qkv: SharedInput<3>,
    o_proj: Linear,
    q_norm: Option<RmsNorm>,
    k_norm: Option<RmsNorm>,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    pub(crate) window: Option<usize>,
    kind: AttentionKind,
}

impl Attention {
    /// Layer `layer`'s attention under `w` with the family's `f` and `kind`.
    pub(crate) fn load(
        w: &Weights,
        c: &DecoderConfig,
        f: &DecoderFeatures,
        kind: AttentionKind,
        layer: usize,
    ) -> Result<Attention> {
        let (h, kv, d) = (c.num_attention_heads, c.num_kv_heads(), c.head_dim());
        let norm = |name: &str| -> Result<Option<RmsNorm>> {
            let w = w.pp(name);
            Ok(match (f.qk_norm, kind.gemma_qk_norm) {
                (false, _) => None,
                (true, false) => Some(RmsNorm::load(&w, d, c.rms_norm_eps)?),
                (true, true) => Some(RmsNorm::load_gemma(&w, d, c.rms_norm_eps)?),
            })
        };
        let hd = c.hidden_size;
        let sizes = [h * d, kv * d, kv * d];
        let qkv = if f.fused_qkv {
            let rows = sizes.iter().sum();
            let qkv_proj = Linear::load(&w.pp("qkv_proj"), hd, rows, f.qkv_bias)?;
            SharedInput::stacked(qkv_proj, sizes)?
        } else {
            let [q, k, v] = [
                ("q_proj", sizes[0]),
                ("k_proj", sizes[1]),
                ("v_proj", sizes[2]),
            ]
            .map(|(name, rows)| Linear::load(&w.pp(name), hd, rows, f.qkv_bias));
            SharedInput::new([q?, k?, v?])?
        };
        Ok(Attention {
            qkv,
            o_proj: Linear::load(&w.pp("o_proj"), h * d, c.hidden_size, f.o_bias)?,
            q_norm: norm("q_norm")?,
            k_norm: norm("k_norm")?,
            heads: h,
            kv_heads: kv,
            head_dim: d,
            window: f.windows.get(layer).copied().flatten(),
            kind,
        })
    }

    /// `x [B, T, hidden]` → `[B, T, hidden]` at positions `at`; `bias` is the
    /// additive mask `[B, 1, T, len]` for this layer's window.
    pub(crate) fn forward(
        &self,
        x: &Tensor,
        at: &Positions<'_>,
        bias: &Tensor,
        cache: &mut KvCache,
        layer: usize,
    ) -> Result<Tensor> {
        let (cos, sin, start) = (at.cos, at.sin, at.start);
        let (b, t) = (x.shape()[0], x.shape()[1]);
        let d = self.head_dim;
        let split = |y: Tensor, heads: usize, norm: &Option<RmsNorm>| -> Result<Tensor> {
            let y = y.reshape_to(&[b, t, heads, d])?;
            let y = match norm {
                Some(n) => n.forward(&y)?,
                None => y,
            };
            Ok(y.transpose(1, 2)?)
        };
        let [q, k, v] = self.qkv.forward(x)?;
        let q = split(q, self.heads, &self.q_norm)?;
        let k = split(k, self.kv_heads, &self.k_norm)?;
        let v = split(v, self.kv_heads, &None)?;
        let q = q.apply_rotary(cos, sin, RopeStyle::RotateHalf)?;
        let k = k.apply_rotary(cos, sin, RopeStyle::RotateHalf)?;
        let (k, v) = cache.update(layer, &k, &v, start)?;
        let opts = SdpaOptions {
            mask: Some(bias),
            scale: self.kind.scale,
            softcap: self.kind.softcap,
            round_scores: true,
            ..Default::default()
        };
        let out = Tensor::scaled_dot_product_attention(&q, &k, &v, &opts)?;
        let out = out.transpose(1, 2)?.reshape_to(&[b, t, self.heads * d])?;
        Ok(self.o_proj.forward(&out)?)
    }
}

/// `LlamaMLP` (and Gemma's GeGLU): `down(act(gate(x)) * up(x))`.
#[derive(Clone, Debug)]
pub(crate) struct Mlp {
    /// gate and up: separate, stored fused (`gate_up_proj`), or stacked at load on PJRT
    /// devices.
    gate_up: SharedInput<2>,
    down_proj: Linear,
    act: Activation,
}

impl Mlp {
    /// The MLP under `w` with the family's switches and activation `act`.
    pub(crate) fn load(
        w: &Weights,
        c: &DecoderConfig,
        f: &DecoderFeatures,
        act: Activation,
    ) -> Result<Mlp> {
        Mlp::load_sized(w, c.hidden_size, c.intermediate_size, f, act)
    }

    /// The MLP under `w` of width `i` (a shared expert's, which has a size of its own).
    pub(crate) fn load_sized(
        w: &Weights,
        h: usize,
        i: usize,
        f: &DecoderFeatures,
        act: Activation,
    ) -> Result<Mlp> {
        let gate_up = if f.fused_gate_up {
            let fused = Linear::load(&w.pp("gate_up_proj"), h, 2 * i, f.mlp_bias)?;
            SharedInput::stacked(fused, [i, i])?
        } else {
            SharedInput::new([
                Linear::load(&w.pp("gate_proj"), h, i, f.mlp_bias)?,
                Linear::load(&w.pp("up_proj"), h, i, f.mlp_bias)?,
            ])?
        };
        Ok(Mlp {
            gate_up,
            down_proj: Linear::load(&w.pp("down_proj"), i, h, f.mlp_bias)?,
            act,
        })
    }

    pub(crate) fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let [g, u] = self.gate_up.forward(x)?;
        Ok(self.down_proj.forward(&self.act.apply_gated(&g, &u)?)?)
    }
}

/// What follows a layer's attention: one MLP, or a mixture of experts.
#[derive(Clone, Debug)]
enum FeedForward {
    Dense(Mlp),
    Sparse(SparseMoeBlock),
}

impl FeedForward {
    /// Layer `layer`'s feed-forward under `lw` (the layer's weights).
    fn load(
        lw: &Weights,
        c: &DecoderConfig,
        f: &DecoderFeatures,
        act: Activation,
        layer: usize,
    ) -> Result<FeedForward> {
        match &f.moe {
            Some(moe) if moe.sparse_layers.get(layer) == Some(&true) => Ok(FeedForward::Sparse(
                SparseMoeBlock::load(lw, c, f, moe, act)?,
            )),
            _ => Ok(FeedForward::Dense(Mlp::load(&lw.pp("mlp"), c, f, act)?)),
        }
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            FeedForward::Dense(m) => m.forward(x),
            FeedForward::Sparse(m) => m.forward(x),
        }
    }
}

/// `LlamaDecoderLayer`: pre-norm attention and MLP (or experts), each added to the residual
/// stream.
#[derive(Clone, Debug)]
struct DecoderLayer {
    input_layernorm: RmsNorm,
    self_attn: Attention,
    post_attention_layernorm: RmsNorm,
    mlp: FeedForward,
}

/// `LlamaModel` (and `MistralModel`, `Qwen2Model`, `Qwen3Model`): embeddings, decoder layers,
/// final norm; returns hidden states.
#[derive(Clone, Debug)]
pub struct LlamaModel {
    embed_tokens: Embedding,
    layers: Vec<DecoderLayer>,
    norm: RmsNorm,
    rotary: RotaryEmbedding,
    config: DecoderConfig,
    features: DecoderFeatures,
    dtype: DType,
    /// Where each decoder layer runs; activations move between devices at the cuts.
    layer_devices: Vec<Device>,
    /// The module path the weights sit under (`model.` in a causal LM's checkpoint, nothing
    /// in a base model's), which the hidden states' module names start with.
    prefix: String,
}

impl LlamaModel {
    /// Loads the weights under `w` (the `model.` prefix of a causal-LM checkpoint, or the root
    /// of a base-model checkpoint).
    pub fn load(
        w: &Weights,
        config: &DecoderConfig,
        features: DecoderFeatures,
    ) -> Result<LlamaModel> {
        let c = config;
        let embed_tokens = Embedding::load(&w.pp("embed_tokens"), c.vocab_size, c.hidden_size)?;
        let mut layers = Vec::with_capacity(c.num_hidden_layers);
        let mut layer_devices = Vec::with_capacity(c.num_hidden_layers);
        let act = Activation::from_hf(&c.hidden_act)?;
        for i in 0..c.num_hidden_layers {
            let lw = w.pp(format!("layers.{i}"));
            layer_devices.push(lw.device());
            layers.push(DecoderLayer {
                input_layernorm: RmsNorm::load(
                    &lw.pp("input_layernorm"),
                    c.hidden_size,
                    c.rms_norm_eps,
                )?,
                self_attn: Attention::load(
                    &lw.pp("self_attn"),
                    c,
                    &features,
                    AttentionKind::default(),
                    i,
                )?,
                post_attention_layernorm: RmsNorm::load(
                    &lw.pp("post_attention_layernorm"),
                    c.hidden_size,
                    c.rms_norm_eps,
                )?,
                mlp: FeedForward::load(&lw, c, &features, act, i)?,
            });
        }
        let norm = RmsNorm::load(&w.pp("norm"), c.hidden_size, c.rms_norm_eps)?;
        Ok(LlamaModel {
            embed_tokens,
            layers,
            norm,
            rotary: RotaryEmbedding::new(c.rope()?, RopeStyle::RotateHalf),
            config: c.clone(),
            features,
            dtype: w.dtype(),
            layer_devices,
            prefix: w.full_name(""),
        })
    }

    /// The config the model was built from.
    pub fn config(&self) -> &DecoderConfig {
        &self.config
    }

    /// The switches in use.
    pub fn features(&self) -> &DecoderFeatures {
        &self.features
    }

    /// The input embedding table `[vocab, hidden]`, as a tensor (GGUF blocks kept as stored
    /// are widened to f32 for the call).
    pub fn embed_weight(&self) -> Result<Tensor> {
        Ok(self.embed_tokens.weight()?)
    }
}

impl DecoderModel for LlamaModel {
    fn dtype(&self) -> DType {
        self.dtype
    }

    fn device(&self) -> Device {
        self.embed_tokens.device()
    }

    fn vocab_size(&self) -> usize {
        self.config.vocab_size
    }

    fn max_position_embeddings(&self) -> usize {
        self.config.max_position_embeddings
    }

    fn hidden_size(&self) -> usize {
        self.config.hidden_size
    }

    fn input_embeddings(&self) -> &Embedding {
        &self.embed_tokens
    }

    fn embed(&self, ids: &Tensor) -> Result<Tensor> {
        let ids = checked_ids(ids, &self.device(), self.config.vocab_size)?;
        Ok(self.embed_tokens.forward(&ids)?)
    }

    fn stretches_context(&self) -> bool {
        // Dynamic NTK rope exists to stretch the context (transformers runs either way).
        matches!(
            self.rotary.config.scaling,
            zoo_runtime::nn::RopeScaling::Dynamic { .. }
        )
    }

    fn recompute_cache_at(&self) -> Option<usize> {
        match self.rotary.config.scaling {
            zoo_runtime::nn::RopeScaling::LongRope {
                original_max_position_embeddings,
                ..
            } if self.features.longrope_recompute => Some(original_max_position_embeddings),
            _ => None,
        }
    }

    fn hidden_state_modules(&self) -> Vec<String> {
        let p = &self.prefix;
        std::iter::once(format!("{p}embed_tokens"))
            .chain((0..self.layers.len()).map(|i| format!("{p}layers.{i}")))
            .collect()
    }

    fn devices(&self) -> Vec<Device> {
        execution_order(
            self.device(),
            &self.layer_devices,
            self.norm.weight.device(),
        )
    }

    fn cache_specs(&self) -> Vec<CacheSpec> {
        let c = &self.config;
        self.layers
            .iter()
            .zip(&self.layer_devices)
            .map(|(l, d)| {
                CacheSpec::self_attention(c.num_kv_heads(), c.head_dim(), l.self_attn.window, *d)
            })
            .collect()
    }

    fn forward(&self, args: ForwardArgs<'_>, cache: &mut KvCache) -> Result<ModelOutput> {
        let (_, t) = args.check(cache)?;
        let c = &self.config;
        let mut x = args.embeddings(
            &self.device(),
            (c.vocab_size, c.hidden_size),
            self.dtype,
            |ids| Ok(self.embed_tokens.forward(ids)?),
        )?;
        let start = cache.begin(t, args.attention_mask)?;
        // Rope tables and masks are made once per device the layers run on.
        let mut tables: HashMap<Device, (Tensor, Tensor)> = HashMap::new();
        let mut biases: HashMap<(Option<usize>, Device), Tensor> = HashMap::new();
        let mut hidden_states = Vec::new();
        for (i, layer) in self.layers.iter().enumerate() {
            let dev = self.layer_devices[i];
            if x.device() != dev {
                // A cut: the stage so far runs on its device and the activations move.
                x = x.to_device(&dev)?;
            }
            if args.output_hidden_states {
                hidden_states.push(x.clone());
            }
            if let std::collections::hash_map::Entry::Vacant(e) = tables.entry(dev) {
                let pos = on_device(args.position_ids, &dev)?;
                let (cos, sin) = self.rotary.cos_sin(&pos, self.dtype)?;
                e.insert((cos.unsqueeze(1)?, sin.unsqueeze(1)?));
            }
            let window = layer.self_attn.window;
            if let std::collections::hash_map::Entry::Vacant(e) = biases.entry((window, dev)) {
                e.insert(cache.attention_bias(start, t, window, self.dtype, &dev)?);
            }
            let bias = &biases[&(window, dev)];
            let (cos, sin) = &tables[&dev];
            let h = layer.input_layernorm.forward(&x)?;
            let at = Positions { cos, sin, start };
            let h = layer.self_attn.forward(&h, &at, bias, cache, i)?;
            x = x.add(&h)?;
            let h = layer
                .mlp
                .forward(&layer.post_attention_layernorm.forward(&x)?)?;
            x = x.add(&h)?;
        }
        let x = on_device(&x, &self.norm.weight.device())?;
        if args.output_hidden_states {
            hidden_states.push(x.clone());
        }
        Ok(ModelOutput {
            last_hidden_state: self.norm.forward(&x)?,
            hidden_states,
            module_outputs: Vec::new(),
        })
    }
}

/// `LlamaForCausalLM` (and the Mistral, Qwen2 and Qwen3 ones): the base model plus `lm_head`,
/// tied to `model.embed_tokens` when `tie_word_embeddings` is set or `lm_head.weight` is absent.
pub type LlamaForCausalLM = ForCausalLM<LlamaModel>;

impl LlamaForCausalLM {
    /// Loads from the checkpoint root (`model.*` and `lm_head.weight`).
    pub fn load(
        w: &Weights,
        config: &DecoderConfig,
        features: DecoderFeatures,
    ) -> Result<LlamaForCausalLM> {
        let model = LlamaModel::load(&w.pp("model"), config, features)?;
        let embed = model.embed_tokens.clone();
        let shape = (config.hidden_size, config.vocab_size);
        ForCausalLM::with_head(w, model, &embed, config.tie_word_embeddings, shape)
    }
}
