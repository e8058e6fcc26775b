//! A pipeline's placement units and peak activations, from headers and configs alone, for
//! `zoo plan`: every component is a unit (the text encoders, the VAE), except the denoiser,
//! which splits at its blocks so a denoiser larger than one device runs in stages: the UNet
//! at `down_blocks.N`, `mid_block`, `up_blocks.N`, a diffusion transformer at
//! `transformer_blocks.N` and `single_transformer_blocks.N` (diffusers' `_no_split_modules`).

use zoo_hub::{Dtype, Inventory};
use zoo_runtime::device_map::Unit;

use super::PipelineFiles;
use crate::models::autoencoder_kl::AutoencoderKLConfig;
use crate::models::loading::{transformer_units, unet_units};
use crate::models::unet_2d::UNet2DConfig;
use crate::models::unet_2d_condition::UNet2DConditionConfig;
use crate::models::{per_block, sample_size};
use crate::{Error, Result};

/// What `zoo plan` needs of a pipeline.
#[derive(Clone, Debug)]
pub struct PipelinePlan {
    /// The pipeline class.
    pub class_name: String,
    /// Units in execution order (text encoders, the UNet's stages, the VAE).
    pub units: Vec<Unit>,
    /// Peak activation bytes of the largest component at the asked size and batch.
    pub activations: u64,
    /// Every tensor of every component, prefixed by its component (`unet.conv_in.weight`).
    pub inventory: Inventory,
    /// The image size planned for, `(height, width)`.
    pub size: (usize, usize),
    /// The batch the UNet runs: images, doubled under classifier-free guidance.
    pub unet_batch: usize,
    /// The denoiser's shapes, for what crosses a cut.
    denoiser: Denoiser,
    /// Bytes of the prompt embeddings the denoiser takes (all its rows).
    text_bytes: u64,
    /// Bytes of the final latents handed to the VAE (float32).
    latent_bytes: u64,
    elem: u64,
}

/// What crosses a cut between two units of a pipeline plan.
#[derive(Clone, Debug, PartialEq)]
pub struct Crossing {
    /// Bytes sent over the cut.
    pub bytes: u64,
    /// Sent at every denoising step (else once per call).
    pub per_step: bool,
    /// What the bytes are.
    pub what: String,
}

/// The denoiser's shapes the crossings are computed from.
#[derive(Clone, Debug)]
enum Denoiser {
    None,
    /// Token width, image and text tokens, conditioning width.
    Transformer {
        dim: usize,
        img: usize,
        txt: usize,
        cond: usize,
    },
    /// Levels, latent size, time-embedding width, text tokens x width.
    Unet {
        levels: Vec<Level>,
        h: usize,
        w: usize,
        temb: usize,
        text: usize,
    },
}

impl PipelinePlan {
    /// Bytes a call holds on one host at its peak: every component's weights, the largest
    /// component's activations `activation_copies` times, the latents and the decoded images
    /// (float32), saturating.
    pub fn host_bytes(&self, images: usize, activation_copies: u64) -> u64 {
        let weights = self
            .units
            .iter()
            .fold(0u64, |n, u| n.saturating_add(u.weight_bytes));
        let (h, w) = self.size;
        let pixels = product(&[images as u64, 3, h as u64, w as u64, 4]);
        weights
            .saturating_add(self.activations.saturating_mul(activation_copies))
            .saturating_add(self.latent_bytes)
            .saturating_add(pixels)
    }

    /// What crosses a cut right after unit `after` (`None` after the last unit): inside
    /// the denoiser its streams at every step; into it the prompt embeddings, out of it the
    /// latents, once per call.
    pub fn crossing(&self, after: &str) -> Option<Crossing> {
        let pos = self.units.iter().position(|u| u.name == after)?;
        let next = self.units.get(pos + 1)?;
        let inside = |u: &str| u.starts_with("transformer") || u.starts_with("unet");
        let b = self.unet_batch as u64;
        if inside(after) && inside(&next.name) {
            let (bytes, what) = self.denoiser_crossing(after);
            return Some(Crossing {
                bytes: b * bytes * self.elem,
                per_step: true,
                what,
            });
        }
        if inside(after) {
            return Some(Crossing {
                bytes: self.latent_bytes,
                per_step: false,
                what: "the final latents (float32)".into(),
            });
        }
        if inside(&next.name) {
            return Some(Crossing {
                bytes: self.text_bytes,
                per_step: false,
                what: "the prompt embeddings".into(),
            });
        }
        Some(Crossing {
            bytes: self.text_bytes,
            per_step: false,
            what: "at most the prompt embeddings (components between the text encoders)".into(),
        })
    }

    /// Elements per batch row crossing after denoiser unit `after`, and what they are.
    fn denoiser_crossing(&self, after: &str) -> (u64, String) {
        match &self.denoiser {
            Denoiser::None => (0, "nothing the planner knows".into()),
            Denoiser::Transformer {
                dim,
                img,
                txt,
                cond,
            } => (
                ((img + txt) * dim + cond) as u64,
                format!("{img} image + {txt} text tokens x {dim} and a {cond}-wide conditioning"),
            ),
            Denoiser::Unet {
                levels,
                h,
                w,
                temb,
                text,
            } => {
                let n = levels.len();
                // Skip connections in the order the down path makes them.
                let mut skips = vec![(levels[0].0 * h * w) as u64];
                let mut ends = Vec::with_capacity(n);
                let (mut rh, mut rw) = (*h, *w);
                let mut sizes = Vec::with_capacity(n);
                for (i, &(ch, layers, _)) in levels.iter().enumerate() {
                    sizes.push((rh, rw));
                    skips.extend(std::iter::repeat_n((ch * rh * rw) as u64, layers));
                    if i + 1 < n {
                        (rh, rw) = (rh.div_ceil(2), rw.div_ceil(2));
                        skips.push((ch * rh * rw) as u64);
                    }
                    ends.push(skips.len());
                }
                let idx = |u: &str| u.rsplit('.').next().and_then(|i| i.parse::<usize>().ok());
                let total: u64 = skips.iter().sum();
                let (kept, hidden) = if after == "unet" {
                    (skips[0], 0)
                } else if let Some(i) = after.strip_prefix("unet.down_blocks.").and(idx(after)) {
                    (skips[..ends[i.min(n - 1)]].iter().sum(), 0)
                } else if after == "unet.mid_block" {
                    (total, (levels[n - 1].0 * rh * rw) as u64)
                } else if let Some(j) = after.strip_prefix("unet.up_blocks.").and(idx(after)) {
                    let j = j.min(n - 1);
                    let used: usize = (0..=j).map(|k| levels[n - 1 - k].1 + 1).sum();
                    let left = skips.len().saturating_sub(used);
                    let (oh, ow) = if j + 1 < n {
                        sizes[n - 2 - j]
                    } else {
                        (*h, *w)
                    };
                    (
                        skips[..left].iter().sum(),
                        (levels[n - 1 - j].0 * oh * ow) as u64,
                    )
                } else {
                    (0, 0)
                };
                (
                    kept + hidden + (temb + text) as u64,
                    "the feature map and the skip connections still to be used, the time embedding and the text".into(),
                )
            }
        }
    }
}

/// Components in the order a pipeline call runs them.
const ORDER: &[&str] = &[
    "text_encoder",
    "text_encoder_2",
    "text_encoder_3",
    "unet",
    "transformer",
    "vae",
];

/// A diffusion transformer's token width, heads, image tokens, text tokens, the width of
/// the text it takes and of its conditioning, for latents of `lh x lw`.
type TransformerShape = (usize, usize, usize, usize, usize, usize);

/// The [`TransformerShape`] of the pipeline's transformer, read by the class
/// `model_index.json` names.
fn transformer_shape(files: &PipelineFiles, lh: usize, lw: usize) -> Result<TransformerShape> {
    let path = files.file("transformer", "config.json")?;
    match transformer_class(files)?.as_str() {
        "DiTTransformer2DModel" => {
            let c = crate::models::transformer_dit::DiTTransformer2DConfig::from_file(&path)?;
            let p = c.patch_size;
            Ok((
                c.inner_dim(),
                c.num_attention_heads,
                (lh / p).saturating_mul(lw / p),
                0,
                0,
                c.inner_dim(),
            ))
        }
        "PixArtTransformer2DModel" => {
            let c = crate::models::transformer_pixart::PixArtTransformer2DConfig::from_file(&path)?;
            let p = c.patch_size;
            // T5's default prompt length: PixArt-α 120, PixArt-Σ 300.
            let text = if files.index.class_name == "PixArtSigmaPipeline" {
                300
            } else {
                120
            };
            Ok((
                c.inner_dim(),
                c.num_attention_heads,
                (lh / p).saturating_mul(lw / p),
                text,
                c.text_dim().unwrap_or(0),
                // The blocks' 6 modulations and the output's embedded timestep.
                7 * c.inner_dim(),
            ))
        }
        "SD3Transformer2DModel" => {
            let c = crate::models::transformer_sd3::SD3Transformer2DConfig::from_file(&path)?;
            let p = c.patch_size;
            // 77 CLIP tokens then T5's 256.
            Ok((
                c.inner_dim(),
                c.num_attention_heads,
                (lh / p).saturating_mul(lw / p),
                77 + 256,
                c.joint_attention_dim,
                c.inner_dim(),
            ))
        }
        _ => {
            let c = crate::models::transformer_flux::FluxTransformer2DConfig::from_file(&path)?;
            Ok((
                c.inner_dim(),
                c.num_attention_heads,
                (lh / 2).saturating_mul(lw / 2),
                512,
                c.joint_attention_dim,
                c.inner_dim(),
            ))
        }
    }
}

/// The transformer's class, with `Transformer2DModel` resolved by its `norm_type` as
/// diffusers remaps it (adaLN-Zero: DiT, adaLN-single: PixArt).
fn transformer_class(files: &PipelineFiles) -> Result<String> {
    let class = files.index.components["transformer"].1.clone();
    if class != "Transformer2DModel" {
        return Ok(class);
    }
    let path = files.file("transformer", "config.json")?;
    let (v, _): (serde_json::Value, _) = crate::models::read_config(
        &path,
        &[
            "Transformer2DModel",
            "DiTTransformer2DModel",
            "PixArtTransformer2DModel",
        ],
    )?;
    match v.get("norm_type").and_then(|n| n.as_str()) {
        Some("ada_norm_zero") => Ok("DiTTransformer2DModel".into()),
        Some("ada_norm_single") => Ok("PixArtTransformer2DModel".into()),
        other => Err(Error::Unsupported(format!(
            "{}: a Transformer2DModel with norm_type {other:?} is not a diffusion transformer zoo plans (ada_norm_zero: DiT, ada_norm_single: PixArt)",
            path.display()
        ))),
    }
}

/// The default sample size of a pipeline's transformer, in latent pixels.
fn transformer_sample_size(files: &PipelineFiles) -> Result<usize> {
    let path = files.file("transformer", "config.json")?;
    Ok(match transformer_class(files)?.as_str() {
        "SD3Transformer2DModel" => {
            crate::models::transformer_sd3::SD3Transformer2DConfig::from_file(&path)?.sample_size
        }
        "DiTTransformer2DModel" => {
            crate::models::transformer_dit::DiTTransformer2DConfig::from_file(&path)?.sample_size
        }
        "PixArtTransformer2DModel" => {
            crate::models::transformer_pixart::PixArtTransformer2DConfig::from_file(&path)?
                .sample_size
        }
        // FluxPipeline's default_sample_size.
        _ => 128,
    })
}

/// Peak bytes of a transformer call on `batch` sequences of `tokens` `dim`-wide tokens:
/// the feed-forward's 4x-wide hidden and a few residual streams, plus one layer's
/// attention scores as a compiled program holds them.
fn transformer_activations(
    dim: usize,
    heads: usize,
    tokens: usize,
    batch: usize,
    elem: u64,
) -> u64 {
    let scores =
        zoo_runtime::lazy::attention_scores_bytes(batch.saturating_mul(heads), tokens, tokens);
    product(&[batch as u64, 8, tokens as u64, dim as u64, elem]).saturating_add(scores)
}

/// Plans the pipeline at `repo_or_path` for `images` images of `size` (default: the UNet's
/// sample size), in `dtype` (default: as stored), with guidance doubling the UNet's batch.
pub fn plan_units(
    repo_or_path: &str,
    dtype: Option<Dtype>,
    size: Option<(usize, usize)>,
    images: usize,
    guidance: bool,
) -> Result<PipelinePlan> {
    let files = PipelineFiles::open(repo_or_path, None)?;
    let index = &files.index;
    let mut names: Vec<&String> = index.components.keys().collect();
    names.sort_by_key(|n| ORDER.iter().position(|o| o == n).unwrap_or(ORDER.len()));
    let mut units: Vec<Unit> = Vec::new();
    let mut inventory = Inventory::default();
    let elem = dtype.map_or(4, |d| d.plain_size());
    let mut activations = 0u64;
    let (mut denoiser, mut text_bytes, mut latent_bytes) = (Denoiser::None, 0u64, 0u64);
    let vae_cfg = match index.components.contains_key("vae") {
        true => Some(AutoencoderKLConfig::from_file(
            &files.file("vae", "config.json")?,
        )?),
        false => None,
    };
    let factor = vae_cfg.as_ref().map_or(1, |v| v.scale_factor());
    let mut planned = size;
    let unet_batch = images.saturating_mul(if guidance { 2 } else { 1 });
    for name in names {
        let class = &index.components[name].1;
        let weightless = [
            "Tokenizer",
            "TokenizerFast",
            "Scheduler",
            "FeatureExtractor",
            "ImageProcessor",
        ];
        if weightless.iter().any(|w| class.ends_with(w)) {
            continue;
        }
        let ck = files.pretrained.component(name)?.checkpoint()?;
        if name == "transformer" {
            let side = transformer_sample_size(&files)?;
            let (h, w) =
                *planned.get_or_insert((side.saturating_mul(factor), side.saturating_mul(factor)));
            let (dim, heads, img, txt, text_in, cond) =
                transformer_shape(&files, h / factor, w / factor)?;
            let act =
                transformer_activations(dim, heads, img.saturating_add(txt), unet_batch, elem);
            activations = activations.max(act);
            denoiser = Denoiser::Transformer {
                dim,
                img,
                txt,
                cond,
            };
            text_bytes = product(&[unet_batch as u64, txt as u64, text_in as u64, elem]);
            latent_bytes = product(&[
                latents_of(&files, h / factor, w / factor)?,
                images as u64,
                4,
            ]);
            units.extend(transformer_units(&ck.inventory, dtype));
        } else if name == "unet" {
            let ((sh, sw), levels) = unet_shape(&files)?;
            let (h, w) =
                *planned.get_or_insert((sh.saturating_mul(factor), sw.saturating_mul(factor)));
            let act = unet_activations(&levels, h / factor, w / factor, unet_batch, elem);
            activations = activations.max(act);
            let text = unet_text(&files)?;
            denoiser = Denoiser::Unet {
                temb: levels[0].0.saturating_mul(4),
                levels,
                h: h / factor,
                w: w / factor,
                text,
            };
            text_bytes = product(&[unet_batch as u64, text as u64, elem]);
            latent_bytes = product(&[
                latents_of(&files, h / factor, w / factor)?,
                images as u64,
                4,
            ]);
            units.extend(unet_units(&ck.inventory, dtype));
        } else {
            if let (Some(v), Some((h, w)), "vae") = (&vae_cfg, planned, name.as_str()) {
                activations = activations.max(vae_activations(v, h, w, images, elem));
            }
            units.push(Unit {
                name: name.clone(),
                weight_bytes: ck
                    .inventory
                    .tensors()
                    .iter()
                    .map(|t| dtype.map_or(t.nbytes, |d| t.bytes_as(d)))
                    .sum(),
                layer: None,
                tied_with: None,
            });
        }
        for t in ck.inventory.tensors() {
            let mut info = t.clone();
            info.name = format!("{name}.{}", t.name);
            inventory.push(info)?;
        }
    }
    if units.is_empty() {
        return Err(Error::Config {
            path: index.path.clone(),
            reason: "no component of this pipeline has weights".into(),
        });
    }
    let size = planned.ok_or_else(|| Error::Config {
        path: index.path.clone(),
        reason: "the pipeline has no UNet to size the image from; give a size".into(),
    })?;
    Ok(PipelinePlan {
        class_name: index.class_name.clone(),
        units,
        activations,
        inventory,
        size,
        unet_batch,
        denoiser,
        text_bytes,
        latent_bytes,
        elem,
    })
}

/// Elements of one image's latents of `lh x lw` (the VAE's latent channels; 4 without one).
fn latents_of(files: &PipelineFiles, lh: usize, lw: usize) -> Result<u64> {
    let channels = match files.index.components.contains_key("vae") {
        true => AutoencoderKLConfig::from_file(&files.file("vae", "config.json")?)?.latent_channels,
        false => 4,
    };
    Ok(product(&[channels as u64, lh as u64, lw as u64]))
}

/// Elements of one row of a UNet's text conditioning: CLIP's 77 tokens times
/// `cross_attention_dim` (0 for an unconditional `UNet2DModel`).
fn unet_text(files: &PipelineFiles) -> Result<usize> {
    if files.index.components["unet"].1 == "UNet2DModel" {
        return Ok(0);
    }
    let c = UNet2DConditionConfig::from_file(&files.file("unet", "config.json")?)?;
    let cross = match &c.cross_attention_dim {
        serde_json::Value::Array(a) => a.first().and_then(|v| v.as_u64()),
        v => v.as_u64(),
    };
    Ok(77 * cross.unwrap_or(768) as usize)
}

/// One UNet level: channels, ResNets per down block, attention heads (0 without attention).
type Level = (usize, usize, usize);

/// The UNet's sample size `(height, width)` and its levels, read by the class
/// `model_index.json` names.
fn unet_shape(files: &PipelineFiles) -> Result<((usize, usize), Vec<Level>)> {
    let path = files.file("unet", "config.json")?;
    if files.index.components["unet"].1 == "UNet2DModel" {
        let c = UNet2DConfig::from_file(&path)?;
        let levels = c
            .block_out_channels
            .iter()
            .enumerate()
            .map(|(i, &ch)| {
                let attn = c.down_block_types[i].starts_with("Attn");
                let heads = ch / c.attention_head_dim.unwrap_or(ch).max(1);
                (ch, c.layers_per_block, if attn { heads } else { 0 })
            })
            .collect();
        return Ok((sample_size(c.sample_size.as_ref(), 32), levels));
    }
    let c = UNet2DConditionConfig::from_file(&path)?;
    let n = c.block_out_channels.len();
    let layers: Vec<usize> = per_block(&c.layers_per_block, n, "layers_per_block", &path)?;
    let heads: Vec<usize> = per_block(&c.attention_head_dim, n, "attention_head_dim", &path)?;
    let levels = c
        .block_out_channels
        .iter()
        .enumerate()
        .map(|(i, &ch)| {
            let attn = c.down_block_types[i].starts_with("CrossAttn");
            (ch, layers[i], if attn { heads[i] } else { 0 })
        })
        .collect();
    Ok((sample_size(c.sample_size.as_ref(), 64), levels))
}

/// Peak bytes of a UNet call on `batch` latents of `h x w`: every skip connection the down
/// blocks keep for the up blocks, three feature maps of the widest level in flight, and the
/// attention scores of the largest self-attention as a compiled program holds them (one
/// query chunk's at a time once they pass the lowering's budget).
fn unet_activations(
    levels: &[(usize, usize, usize)],
    h: usize,
    w: usize,
    batch: usize,
    elem: u64,
) -> u64 {
    let mut skips = product(&[levels[0].0 as u64, h as u64, w as u64]);
    let mut widest = 0u64;
    let mut scores = 0u64;
    let (mut rh, mut rw) = (h, w);
    for (i, &(ch, layers, heads)) in levels.iter().enumerate() {
        let map = product(&[ch as u64, rh as u64, rw as u64]);
        widest = widest.max(map);
        skips = skips.saturating_add(map.saturating_mul(layers as u64));
        if heads > 0 {
            let l = rh.saturating_mul(rw);
            let s = zoo_runtime::lazy::attention_scores_bytes(batch.saturating_mul(heads), l, l);
            scores = scores.max(s);
        }
        if i + 1 < levels.len() {
            (rh, rw) = (rh.div_ceil(2), rw.div_ceil(2));
            skips = skips.saturating_add(product(&[ch as u64, rh as u64, rw as u64]));
        }
    }
    product(&[
        batch as u64,
        skips.saturating_add(widest.saturating_mul(3)),
        elem,
    ])
    .saturating_add(scores)
}

/// Peak bytes of a VAE decode of `batch` images of `h x w`: three maps of the first level
/// at full size, and the mid block's one-head attention over the latent positions.
fn vae_activations(c: &AutoencoderKLConfig, h: usize, w: usize, batch: usize, elem: u64) -> u64 {
    let ch = c.block_out_channels.first().copied().unwrap_or(0);
    let l = (h / c.scale_factor()).saturating_mul(w / c.scale_factor());
    let scores = zoo_runtime::lazy::attention_scores_bytes(batch, l, l);
    product(&[batch as u64, 3, ch as u64, h as u64, w as u64, elem]).saturating_add(scores)
}

/// The product of sizes in bytes, saturating: sizes come from arguments and configs, and a
/// saturated estimate fits no memory, so the plan refuses it.
fn product(sizes: &[u64]) -> u64 {
    sizes.iter().fold(1u64, |n, &d| n.saturating_mul(d))
}
