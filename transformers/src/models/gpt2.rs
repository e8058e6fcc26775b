//! GPT-2: mirrors transformers' `models/gpt2/modeling_gpt2.py` (`GPT2Model`,
//! `GPT2LMHeadModel`, eager attention).
//!
//! A pre-norm decoder with learned absolute positions (`wpe`) added to the token embeddings
//! (`wte`); each block is LayerNorm → causal self-attention → residual, LayerNorm → MLP →
//! residual, and `ln_f` closes the stack. Projections are `Conv1D`s, stored `[in, out]`
//! (the transpose of `nn.Linear`) and read as stored. `c_attn` holds q, k and v side by side.
//! The head is tied to `wte`. Weight names are the checkpoint's (`transformer.h.3.attn.c_attn.weight`).

use std::collections::HashMap;
use std::path::PathBuf;

use serde::Deserialize;
use zoo_hub::PretrainedConfig;
use zoo_runtime::device_map::{CacheLayout, ModelShape};
use zoo_runtime::nn::{Embedding, LayerNorm, Linear, Weights};
use zoo_runtime::{Activation, DType, Device, SdpaOptions, Tensor};

use super::decoder::ForCausalLM;
use super::placement::{execution_order, on_device};
use crate::cache::{CacheSpec, KvCache};
use crate::config::{config_error, defaults, heads_divide, positive_fields};
use crate::family::{family, Family, Layout, Loaders};
use crate::kinds::{checked_ids, CausalLm, DecoderModel, ForwardArgs, ModelOutput};
use crate::{Error, Result};

/// The registry entry of `gpt2` (llama.cpp's `gpt2` files are not read by zoo-hub yet).
pub(crate) const FAMILY: Family = Family {
    conv1d_modules: &["c_attn", "c_proj", "c_fc"],
    ..family! {
    "gpt2" in "gpt2", classes [
        GPT2LMHeadModel: CausalLm,
        GPT2Model: Base,
        GPT2ForSequenceClassification: SequenceClassification,
        GPT2ForTokenClassification: TokenClassification,
        GPT2ForQuestionAnswering: QuestionAnswering,
    ],
    no_split ["GPT2Block"],
    // GPT-2's Conv1D layers store `[in, out]` and transformers gives GPT-2 no plan: on a
    // mesh its weights are whole on every device.
    tp &[], config GPT2Config,
    loaders Loaders::Decoder { base: load_base, causal_lm: load_causal_lm },
    }
};

/// `GPT2Model` from a base or an LM-head checkpoint (which holds it under `transformer.`).
fn load_base(w: &Weights, c: &PretrainedConfig) -> Result<Box<dyn DecoderModel>> {
    let c = GPT2Config::from_pretrained(c)?;
    // Under `transformer.` in a head's checkpoint, whose module paths then start with it.
    let (w, prefix) = if w.contains("transformer.wte.weight") {
        (w.pp("transformer"), "transformer.")
    } else {
        (w.clone(), "")
    };
    Ok(Box::new(GPT2Model::load(&w, &c)?.under(prefix)))
}

/// `GPT2LMHeadModel` from the checkpoint root.
fn load_causal_lm(w: &Weights, c: &PretrainedConfig) -> Result<Box<dyn CausalLm>> {
    Ok(Box::new(GPT2LMHeadModel::load(
        w,
        &GPT2Config::from_pretrained(c)?,
    )?))
}

fn yes() -> bool {
    true
}

/// `config.json` of a GPT-2 checkpoint, as transformers' `GPT2Config` reads it (its own
/// field names: `n_embd`, `n_layer`, `n_head`, `n_positions`, `n_inner`).
#[derive(Clone, Debug, Deserialize)]
pub struct GPT2Config {
    /// Rows of `wte`.
    pub vocab_size: usize,
    /// Rows of `wpe`: the longest context.
    #[serde(default = "defaults::usize::<1024>")]
    pub n_positions: usize,
    /// Width of the residual stream.
    pub n_embd: usize,
    /// Blocks.
    pub n_layer: usize,
    /// Attention heads.
    pub n_head: usize,
    /// Width of the MLP (`4 * n_embd` when absent).
    #[serde(default)]
    pub n_inner: Option<usize>,
    /// MLP activation.
    #[serde(default = "defaults::gelu_new")]
    pub activation_function: String,
    /// Epsilon of every LayerNorm.
    #[serde(default = "defaults::eps_1e5")]
    pub layer_norm_epsilon: f64,
    /// Divide the scores by `sqrt(head_dim)`.
    #[serde(default = "yes")]
    pub scale_attn_weights: bool,
    /// Also divide the scores of layer `i` by `i + 1`.
    #[serde(default)]
    pub scale_attn_by_inverse_layer_idx: bool,
    /// Scores from f32 copies of q and k, softmax in f32 (the Mistral-style stability fix).
    #[serde(default)]
    pub reorder_and_upcast_attn: bool,
    /// Cross-attention blocks (GPT-2 as the decoder of an encoder-decoder model).
    #[serde(default)]
    pub add_cross_attention: bool,
    /// The `config.json` it came from, for errors.
    #[serde(skip)]
    pub path: PathBuf,
}

impl GPT2Config {
    /// Reads the typed config; a missing or mistyped field names the file and the field.
    pub fn from_pretrained(cfg: &PretrainedConfig) -> Result<GPT2Config> {
        let mut c: GPT2Config = cfg.parse_as()?;
        c.path = cfg.path.clone();
        let bad = |reason: String| config_error(cfg, reason);
        positive_fields!(cfg; c.vocab_size, c.n_positions, c.n_embd, c.n_layer, c.n_head)?;
        heads_divide!(cfg; c.n_embd, c.n_head)?;
        if c.add_cross_attention {
            return Err(bad(
                "`add_cross_attention` makes GPT-2 the decoder of an encoder-decoder model, which zoo does not load"
                    .into(),
            ));
        }
        Activation::from_hf(&c.activation_function)
            .map_err(|e| bad(format!("`activation_function`: {e}")))?;
        Ok(c)
    }

    /// Width of the MLP.
    pub fn inner(&self) -> usize {
        self.n_inner.unwrap_or(4 * self.n_embd)
    }

    fn head_dim(&self) -> usize {
        self.n_embd / self.n_head
    }
}

/// The planner's view: `transformer.h.N` blocks with their KV cache, `lm_head` with `wte`.
fn layout(config: &PretrainedConfig) -> Result<Layout> {
    let c = GPT2Config::from_pretrained(config)?;
    Ok(Layout {
        layer_containers: vec!["transformer.h".into(), "h".into()],
        inputs: vec![
            "transformer.wte".into(),
            "transformer.wpe".into(),
            "wte".into(),
            "wpe".into(),
        ],
        tied: vec![vec![
            "transformer.wte.weight".into(),
            "lm_head.weight".into(),
        ]],
        shape: ModelShape {
            layers: c.n_layer,
            hidden: c.n_embd,
            intermediate: c.inner(),
            heads: c.n_head,
            kv_heads: c.n_head,
            head_dim: c.head_dim(),
            vocab: c.vocab_size,
            kv_cache: CacheLayout::SelfAttention,
        },
        context: c.n_positions,
    })
}

/// A `Conv1D` (`y = x W + b`, `W` stored `[in, out]`) as the `[out, in]` view `nn::Linear`
/// multiplies with: the transposed view of the stored tensor, no copy.
fn conv1d(w: &Weights, in_dim: usize, out_dim: usize) -> Result<Linear> {
    Ok(Linear::new(
        w.get("weight", &[in_dim, out_dim])?.t()?,
        Some(w.get("bias", &[out_dim])?),
    ))
}

/// The device a norm's parameters live on (`fallback` for one without).
fn norm_device(n: &LayerNorm, fallback: Device) -> Device {
    n.weight.as_ref().map_or(fallback, Tensor::device)
}

/// `GPT2Attention`: `c_attn` (q, k, v side by side), causal attention over the cache,
/// `c_proj`.
#[derive(Clone, Debug)]
struct Attention {
    c_attn: Linear,
    c_proj: Linear,
    heads: usize,
    scale: f64,
    upcast: bool,
}

impl Attention {
    fn load(w: &Weights, c: &GPT2Config, layer: usize, dtype: DType) -> Result<Attention> {
        let h = c.n_embd;
        // transformers divides by `sqrt(head_dim)` held in the scores' dtype (with upcasting,
        // a Python float), then by `layer + 1`.
        let mut scale = 1.0;
        if c.scale_attn_weights {
            let root = (c.head_dim() as f64).sqrt();
            let root = if c.reorder_and_upcast_attn {
                root
            } else {
                dtype.round_value(root)
            };
            scale /= root;
        }
        if c.scale_attn_by_inverse_layer_idx {
            scale /= (layer + 1) as f64;
        }
        Ok(Attention {
            c_attn: conv1d(&w.pp("c_attn"), h, 3 * h)?,
            c_proj: conv1d(&w.pp("c_proj"), h, h)?,
            heads: c.n_head,
            scale,
            upcast: c.reorder_and_upcast_attn,
        })
    }

    fn forward(
        &self,
        x: &Tensor,
        bias: &Tensor,
        cache: &mut KvCache,
        layer: usize,
        start: usize,
    ) -> Result<Tensor> {
        let (b, t, h) = (x.shape()[0], x.shape()[1], x.shape()[2]);
        let d = h / self.heads;
        let qkv = self.c_attn.forward(x)?;
        let split = |i: usize| -> Result<Tensor> {
            Ok(qkv
                .narrow(2, i * h, h)?
                .reshape_to(&[b, t, self.heads, d])?
                .transpose(1, 2)?
                .contiguous()?)
        };
        let (q, k, v) = (split(0)?, split(1)?, split(2)?);
        let (k, v) = cache.update(layer, &k, &v, start)?;
        let opts = SdpaOptions {
            mask: Some(bias),
            scale: Some(self.scale),
            round_scores: !self.upcast,
            upcast_scores: self.upcast,
            ..Default::default()
        };
        let out = Tensor::scaled_dot_product_attention(&q, &k, &v, &opts)?;
        let out = out.transpose(1, 2)?.reshape_to(&[b, t, h])?;
        Ok(self.c_proj.forward(&out)?)
    }
}

/// `GPT2MLP`: `c_proj(act(c_fc(x)))`.
#[derive(Clone, Debug)]
struct Mlp {
    c_fc: Linear,
    c_proj: Linear,
    act: Activation,
}

impl Mlp {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let h = self.c_fc.forward(x)?;
        // PyTorch runs activations of 16-bit tensors in f32 and rounds once.
        let dt = h.dtype();
        let h = self
            .act
            .apply(&h.to_dtype(dt.accumulation())?)?
            .to_dtype(dt)?;
        Ok(self.c_proj.forward(&h)?)
    }
}

/// `GPT2Block`.
#[derive(Clone, Debug)]
struct Block {
    ln_1: LayerNorm,
    attn: Attention,
    ln_2: LayerNorm,
    mlp: Mlp,
}

/// `GPT2Model`: token and position embeddings, blocks, `ln_f`.
#[derive(Clone, Debug)]
pub struct GPT2Model {
    wte: Embedding,
    wpe: Embedding,
    h: Vec<Block>,
    ln_f: LayerNorm,
    config: GPT2Config,
    dtype: DType,
    layer_devices: Vec<Device>,
    /// The module prefix of the base model in its checkpoint (`transformer.` under the head).
    prefix: &'static str,
}

impl GPT2Model {
    /// Loads the base model from the weights under `w` (its root: `wte`, `wpe`, `h.N`, `ln_f`).
    pub fn load(w: &Weights, config: &GPT2Config) -> Result<GPT2Model> {
        let c = config;
        let (e, eps) = (c.n_embd, c.layer_norm_epsilon);
        let mut h = Vec::with_capacity(c.n_layer);
        let mut layer_devices = Vec::with_capacity(c.n_layer);
        for i in 0..c.n_layer {
            let bw = w.pp(format!("h.{i}"));
            layer_devices.push(bw.device());
            h.push(Block {
                ln_1: LayerNorm::load(&bw.pp("ln_1"), e, eps)?,
                attn: Attention::load(&bw.pp("attn"), c, i, w.dtype())?,
                ln_2: LayerNorm::load(&bw.pp("ln_2"), e, eps)?,
                mlp: Mlp {
                    c_fc: conv1d(&bw.pp("mlp.c_fc"), e, c.inner())?,
                    c_proj: conv1d(&bw.pp("mlp.c_proj"), c.inner(), e)?,
                    act: Activation::from_hf(&c.activation_function)?,
                },
            });
        }
        Ok(GPT2Model {
            wte: Embedding::load(&w.pp("wte"), c.vocab_size, e)?,
            wpe: Embedding::load(&w.pp("wpe"), c.n_positions, e)?,
            h,
            ln_f: LayerNorm::load(&w.pp("ln_f"), e, eps)?,
            config: c.clone(),
            dtype: w.dtype(),
            layer_devices,
            prefix: "transformer.",
        })
    }

    /// The config the model was built from.
    pub fn config(&self) -> &GPT2Config {
        &self.config
    }

    fn under(mut self, prefix: &'static str) -> GPT2Model {
        self.prefix = prefix;
        self
    }
}

impl DecoderModel for GPT2Model {
    fn dtype(&self) -> DType {
        self.dtype
    }

    fn device(&self) -> Device {
        self.wte.device()
    }

    fn devices(&self) -> Vec<Device> {
        let last = norm_device(&self.ln_f, self.device());
        execution_order(self.device(), &self.layer_devices, last)
    }

    fn vocab_size(&self) -> usize {
        self.config.vocab_size
    }

    fn max_position_embeddings(&self) -> usize {
        self.config.n_positions
    }

    fn hidden_size(&self) -> usize {
        self.config.n_embd
    }

    fn input_embeddings(&self) -> &Embedding {
        &self.wte
    }

    fn embed(&self, ids: &Tensor) -> Result<Tensor> {
        let ids = checked_ids(ids, &self.device(), self.config.vocab_size)?;
        Ok(self.wte.forward(&ids)?)
    }

    fn cache_specs(&self) -> Vec<CacheSpec> {
        let c = &self.config;
        self.layer_devices
            .iter()
            .map(|d| CacheSpec::self_attention(c.n_head, c.head_dim(), None, *d))
            .collect()
    }

    fn hidden_state_modules(&self) -> Vec<String> {
        // hidden_states[0] is the embeddings' sum as it leaves the dropout module.
        let p = self.prefix;
        std::iter::once(format!("{p}drop"))
            .chain((0..self.h.len()).map(|i| format!("{p}h.{i}")))
            .collect()
    }

    fn forward(&self, args: ForwardArgs<'_>, cache: &mut KvCache) -> Result<ModelOutput> {
        let (_, t) = args.check(cache)?;
        let c = &self.config;
        let device = self.device();
        let pos = on_device(args.position_ids, &device)?.to_dtype(DType::I64)?;
        // Positions index a learned table: host-known ones are checked as ids are.
        if let Some(&bad) = pos
            .host_known_i64()
            .iter()
            .flatten()
            .find(|&&v| v < 0 || v as usize >= c.n_positions)
        {
            return Err(Error::invalid(
                "position_ids",
                format!(
                    "position_ids holds {bad}, outside 0..{} (GPT-2's learned positions end at n_positions; shorten the prompt or max_new_tokens)",
                    c.n_positions
                ),
            ));
        }
        let tokens = args.embeddings(&device, (c.vocab_size, c.n_embd), self.dtype, |ids| {
            Ok(self.wte.forward(ids)?)
        })?;
        let start = cache.begin(t, args.attention_mask)?;
        let positions = self.wpe.forward(&pos)?;
        let mut x = tokens.add(&positions)?;
        let p = self.prefix;
        let module_outputs = if args.output_hidden_states {
            vec![(format!("{p}wte"), tokens), (format!("{p}wpe"), positions)]
        } else {
            Vec::new()
        };
        let mut biases: HashMap<Device, Tensor> = HashMap::new();
        let mut hidden_states = Vec::new();
        for (i, block) in self.h.iter().enumerate() {
            let dev = self.layer_devices[i];
            if x.device() != dev {
                x = x.to_device(&dev)?;
            }
            if args.output_hidden_states {
                hidden_states.push(x.clone());
            }
            if let std::collections::hash_map::Entry::Vacant(e) = biases.entry(dev) {
                e.insert(cache.attention_bias(start, t, None, self.dtype, &dev)?);
            }
            let a = block
                .attn
                .forward(&block.ln_1.forward(&x)?, &biases[&dev], cache, i, start)?;
            x = x.add(&a)?;
            let m = block.mlp.forward(&block.ln_2.forward(&x)?)?;
            x = x.add(&m)?;
        }
        let x = x.to_device(&norm_device(&self.ln_f, self.device()))?;
        if args.output_hidden_states {
            hidden_states.push(x.clone());
        }
        Ok(ModelOutput {
            last_hidden_state: self.ln_f.forward(&x)?,
            hidden_states,
            module_outputs,
        })
    }
}

/// `GPT2LMHeadModel`: the base model and `lm_head`, tied to `transformer.wte` (transformers
/// saves no `lm_head.weight` then); an untied checkpoint's own `lm_head.weight` is used.
pub type GPT2LMHeadModel = ForCausalLM<GPT2Model>;

impl GPT2LMHeadModel {
    /// Loads from the checkpoint root (`transformer.*`, optional `lm_head.weight`).
    pub fn load(w: &Weights, config: &GPT2Config) -> Result<GPT2LMHeadModel> {
        let transformer = GPT2Model::load(&w.pp("transformer"), config)?;
        let wte = transformer.wte.clone();
        let shape = (config.n_embd, config.vocab_size);
        ForCausalLM::with_head(w, transformer, &wte, false, shape)
    }
}
