//! Pre-quantized safetensors checkpoints, read as published: compressed-tensors
//! (`quant_method: "compressed-tensors"`, as llm-compressor writes them) — weight-only integer
//! schemes packed into int32 words (`pack-quantized`: `weight_packed`, `weight_scale`, packed
//! `weight_zero_point`, `weight_shape`) or stored one per byte (`int-quantized`,
//! `naive-quantized`), and FP8 weights (`float-quantized`), with tensor, channel, group or
//! block scales — and transformers' FP8 (`quant_method: "fp8"`, DeepSeek's and Qwen's FP8
//! releases: E4M3 weights with a `weight_scale_inv` per block).
//!
//! Each quantized Linear appears under its HF name (`….weight`, `[out, in]`): dequantized
//! (`(q − zero) · scale`, exact in f32) for any dtype and device, or, where the values fit
//! GGUF's blocks exactly (int4 and int8 with f16-exact scales over whole 32-wide blocks), as
//! those blocks for the CPU's quantized kernels. What a scheme computes beyond stored weights
//! (quantized activations, KV-cache scales, sparsity, transforms) is refused by name.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use half::f16;
use serde_json::Value;

use crate::config::is_off;
use crate::dtype::{Dtype, GgmlType};
use crate::error::{HubError, Result};
use crate::inventory::Inventory;
use crate::weights::Weights;

/// A block's `d` and (Q4_1) `m`, in f16.
type BlockScale = (f16, f16);

/// How a quantized weight's values are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Storage {
    /// Signed `bits`-bit integers packed little-endian into int32 words along each row.
    Packed { bits: u32 },
    /// Signed 8-bit integers, one per byte.
    Int8,
    /// FP8 values (E4M3, or E5M2).
    Fp8,
}

/// One quantized weight: where its parts are and what they mean.
#[derive(Clone, Debug)]
pub struct QuantizedLinear {
    /// `[out, in]`, as the dense weight.
    pub shape: [usize; 2],
    /// How the values are stored.
    pub storage: Storage,
    values: String,
    scale: String,
    zero: Option<String>,
    /// Output rows and input columns one scale covers.
    block: [usize; 2],
    /// `[rows, cols]` of the scale (and zero-point) grid.
    grid: [usize; 2],
    /// Every stored tensor of this weight.
    parts: Vec<String>,
}

impl QuantizedLinear {
    /// Every stored tensor of this weight.
    pub fn parts(&self) -> &[String] {
        &self.parts
    }
}

/// The quantized weights of a compressed-tensors checkpoint, by HF weight name.
#[derive(Clone, Debug)]
pub struct PreQuantized {
    weights: BTreeMap<String, QuantizedLinear>,
    parts: HashMap<String, String>,
    /// `config.json`, for messages.
    path: PathBuf,
}

const SUPPORTED_FORMATS: &[&str] = &[
    "pack-quantized",
    "int-quantized",
    "naive-quantized",
    "float-quantized",
];

impl PreQuantized {
    /// Reads the checkpoint's quantization (its headers, and each packed weight's
    /// `weight_shape`): `Some` for a compressed-tensors or FP8 scheme zoo applies, `None` for
    /// a checkpoint without quantization; any other quantization (or quantized tensors no
    /// config explains) is refused, as [`Inventory::check_unquantized`] refuses it.
    pub fn open(config: &Value, weights: &Weights, path: &Path) -> Result<Option<PreQuantized>> {
        let inventory = weights.inventory();
        let q = config.get("quantization_config").filter(|q| !q.is_null());
        let scheme = match q
            .and_then(|q| q.get("quant_method"))
            .and_then(Value::as_str)
        {
            Some("compressed-tensors") => Scheme::compressed_tensors(q.expect("present"), path)?,
            Some("fp8") => Scheme::fp8(q.expect("present"), path)?,
            _ => {
                inventory.check_unquantized(config, path)?;
                return Ok(None);
            }
        };
        let Scheme {
            method,
            scale_suffix,
            bits,
            spans,
            row_spans,
        } = scheme;
        let mut found = PreQuantized {
            weights: BTreeMap::new(),
            parts: HashMap::new(),
            path: path.to_path_buf(),
        };
        for t in inventory.tensors() {
            let (module, storage) = if let Some(m) = t.name.strip_suffix(".weight_packed") {
                (m, None)
            } else if let Some(m) = t.name.strip_suffix(".weight") {
                if inventory.get(&format!("{m}.{scale_suffix}")).is_none() {
                    continue;
                }
                match t.dtype {
                    Dtype::I8 => (m, Some(Storage::Int8)),
                    Dtype::F8E4M3 | Dtype::F8E5M2 => (m, Some(Storage::Fp8)),
                    // A dense weight beside a scale: not stored quantized.
                    _ => continue,
                }
            } else {
                continue;
            };
            let bad = |reason: String| HubError::BadTensor {
                path: t.file.clone(),
                tensor: t.name.clone(),
                reason,
            };
            if inventory.get(&format!("{module}.weight_g_idx")).is_some() {
                return Err(bad(
                    "activation-ordered groups (`weight_g_idx`), which zoo does not apply".into(),
                ));
            }
            let scale = format!("{module}.{scale_suffix}");
            if inventory.get(&scale).is_none() {
                return Err(bad(format!("no `{scale}` beside it")));
            }
            let zero = format!("{module}.weight_zero_point");
            let zero = inventory.get(&zero).map(|_| zero);
            let mut parts = vec![t.name.clone(), scale.clone()];
            parts.extend(zero.clone());
            let (shape, storage) = match storage {
                Some(s) => match t.shape[..] {
                    [o, i] => ([o, i], s),
                    _ => return Err(bad(format!("shape {:?}; expected [out, in]", t.shape))),
                },
                None => {
                    let shape_name = format!("{module}.weight_shape");
                    if inventory.get(&shape_name).is_none() {
                        return Err(bad(format!("no `{shape_name}` beside it")));
                    }
                    let stored = weights.tensor(&shape_name)?.to_i64()?;
                    parts.push(shape_name);
                    let (&[out, inp], &[rows, _]) = (&stored[..], &t.shape[..]) else {
                        return Err(bad(format!(
                            "packed as {:?} with weight_shape {stored:?}; expected [out, words] \
                             and [out, in]",
                            t.shape
                        )));
                    };
                    if out < 1 || inp < 1 || out as usize != rows {
                        return Err(bad(format!(
                            "weight_shape {stored:?} does not match its {rows} packed rows"
                        )));
                    }
                    ([out as usize, inp as usize], Storage::Packed { bits: 0 })
                }
            };
            found.weights.insert(
                format!("{module}.weight"),
                QuantizedLinear {
                    shape,
                    storage,
                    values: t.name.clone(),
                    scale,
                    zero,
                    block: [0, 0],
                    grid: [0, 0],
                    parts,
                },
            );
        }
        // Shapes from headers, then the packed shapes read (`weight_shape` is data).
        let names: Vec<String> = found.weights.keys().cloned().collect();
        for name in names {
            let q = found.weights.get(&name).cloned().expect("listed");
            let q = found.complete(q, inventory, &bits, &spans, &row_spans)?;
            for p in &q.parts {
                found.parts.insert(p.clone(), name.clone());
            }
            found.weights.insert(name, q);
        }
        if found.weights.is_empty() {
            return Err(config_field(
                path,
                "quant_method",
                format!(
                    "{method:?} says the checkpoint is pre-quantized, but no weight is: no \
                     `weight_packed`, and no int8 or fp8 `weight` beside its `{scale_suffix}`"
                ),
            ));
        }
        Ok(Some(found))
    }

    /// Checks one weight's parts against each other and fills in its packing and scale grid.
    fn complete(
        &self,
        mut q: QuantizedLinear,
        inventory: &Inventory,
        bits: &BTreeSet<u32>,
        spans: &BTreeSet<usize>,
        row_spans: &BTreeSet<usize>,
    ) -> Result<QuantizedLinear> {
        let info = inventory.require(&q.values)?;
        let bad = |reason: String| HubError::BadTensor {
            path: info.file.clone(),
            tensor: info.name.clone(),
            reason,
        };
        let [out, inp] = q.shape;
        if out == 0 || inp == 0 || out.checked_mul(inp).is_none_or(|n| n > (1 << 40)) {
            return Err(bad(format!(
                "weight_shape {:?} is not a matrix zoo can hold",
                q.shape
            )));
        }
        if q.storage == (Storage::Packed { bits: 0 }) {
            if info.dtype != Dtype::I32 {
                return Err(bad(format!(
                    "stored as {}; packed words are I32",
                    info.dtype
                )));
            }
            let words = info.shape.get(1).copied().unwrap_or(0);
            let fits: Vec<u32> = bits
                .iter()
                .copied()
                .filter(|b| info.shape[0] == out && words == (inp * *b as usize).div_ceil(32))
                .collect();
            let [b] = fits[..] else {
                return Err(bad(format!(
                    "{:?} words do not hold a {out}x{inp} weight at the configured bits {bits:?}",
                    info.shape
                )));
            };
            q.storage = Storage::Packed { bits: b };
        }
        let scale = inventory.require(&q.scale)?;
        let (sr, sc) = match scale.shape[..] {
            [] | [1] => (1, 1),
            [r] => (r, 1),
            [r, c] => (r, c),
            _ => return Err(bad(format!("weight_scale has shape {:?}", scale.shape))),
        };
        let span = |n: usize, s: usize, options: &BTreeSet<usize>| -> Option<usize> {
            if s == 1 {
                Some(n)
            } else if s == n {
                Some(1)
            } else {
                options
                    .iter()
                    .copied()
                    .find(|o| *o > 0 && n.div_ceil(*o) == s)
            }
        };
        let (Some(br), Some(bc)) = (span(out, sr, row_spans), span(inp, sc, spans)) else {
            return Err(bad(format!(
                "weight_scale {:?} fits no configured group or block size over a {out}x{inp} weight",
                scale.shape
            )));
        };
        q.block = [br, bc];
        q.grid = [sr, sc];
        if let Some(z) = &q.zero {
            let zi = inventory.require(z)?;
            // Packed along the rows; stored one per byte otherwise.
            let (want, fits) = match q.storage {
                Storage::Packed { bits } => {
                    let want = vec![(sr * bits as usize).div_ceil(32), sc];
                    (want.clone(), zi.shape == want && zi.dtype == Dtype::I32)
                }
                _ => (
                    vec![sr, sc],
                    zi.numel() == sr * sc
                        && matches!(zi.dtype, Dtype::I8 | Dtype::I16 | Dtype::I32 | Dtype::I64),
                ),
            };
            if !fits {
                return Err(bad(format!(
                    "weight_zero_point is {} {:?}; {want:?} expected",
                    zi.dtype, zi.shape
                )));
            }
            if q.storage == Storage::Fp8 {
                return Err(bad("FP8 weights with a zero point".into()));
            }
        }
        Ok(q)
    }

    /// The quantized weight called `name` (`….weight`), if any.
    pub fn get(&self, name: &str) -> Option<&QuantizedLinear> {
        self.weights.get(name)
    }

    /// Whether `name` is a stored part of a quantized weight (its packed values, scales,
    /// zero points, shape), which loaders never read directly.
    pub fn is_part(&self, name: &str) -> bool {
        self.parts.contains_key(name)
    }

    /// The quantized weights' names.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.weights.keys().map(String::as_str)
    }

    /// The stored bytes of `name`'s parts.
    pub fn stored_bytes(&self, inventory: &Inventory, name: &str) -> u64 {
        self.weights.get(name).map_or(0, |q| {
            q.parts
                .iter()
                .filter_map(|p| inventory.get(p))
                .map(|t| t.nbytes)
                .sum()
        })
    }

    /// `name` dequantized, row-major `[out, in]`.
    pub fn dequantize(&self, weights: &Weights, name: &str) -> Result<Vec<f32>> {
        let q = self.require(name)?;
        let [out, inp] = q.shape;
        let (scale, zero) = self.grid(weights, q)?;
        let values = self.values(weights, q)?;
        let mut w = Vec::with_capacity(out * inp);
        for r in 0..out {
            let gr = r / q.block[0];
            for (c, &v) in values[r * inp..(r + 1) * inp].iter().enumerate() {
                let g = gr * q.grid[1] + c / q.block[1];
                w.push((v - zero.get(g).copied().unwrap_or(0.0)) * scale[g]);
            }
        }
        Ok(w)
    }

    /// `name` as GGUF blocks (Q4_0 for symmetric int4, Q4_1 for asymmetric int4, Q8_0 for
    /// symmetric int8), rows in order, when they hold its values exactly: every 32-wide
    /// block inside one scale, each scale (and an asymmetric offset) exact in f16. `None`
    /// otherwise, and the weight loads dequantized.
    pub fn blocks(&self, weights: &Weights, name: &str) -> Result<Option<(GgmlType, Vec<u8>)>> {
        let q = self.require(name)?;
        let [out, inp] = q.shape;
        let Some((ggml, params)) = self.block_params(weights, q)? else {
            return Ok(None);
        };
        let values = self.values(weights, q)?;
        let block_bytes = match ggml {
            GgmlType::Q4_0 => 18,
            GgmlType::Q4_1 => 20,
            _ => 34,
        };
        let mut data = Vec::with_capacity(out * inp / 32 * block_bytes);
        for r in 0..out {
            let gr = r / q.block[0];
            for (b, block) in values[r * inp..(r + 1) * inp].chunks_exact(32).enumerate() {
                let (d, m) = params[gr * q.grid[1] + b * 32 / q.block[1]];
                data.extend_from_slice(&d.to_bits().to_le_bytes());
                match ggml {
                    GgmlType::Q8_0 => data.extend(block.iter().map(|&v| v as i8 as u8)),
                    _ => {
                        if ggml == GgmlType::Q4_1 {
                            data.extend_from_slice(&m.to_bits().to_le_bytes());
                        }
                        // Value j in the low nibble of byte j, value j + 16 in its high one.
                        let u = |v: f32| (v as i32 + 8) as u8;
                        data.extend((0..16).map(|j| u(block[j]) | (u(block[j + 16]) << 4)));
                    }
                }
            }
        }
        Ok(Some((ggml, data)))
    }

    /// The block type `name` is kept as ([`PreQuantized::blocks`]) and the bytes its
    /// blocks take, reading only its scales; `None` when it loads dequantized.
    pub fn block_type(&self, weights: &Weights, name: &str) -> Result<Option<(GgmlType, u64)>> {
        let q = self.require(name)?;
        let bytes = |g: GgmlType| {
            let per_block: u64 = match g {
                GgmlType::Q4_0 => 18,
                GgmlType::Q4_1 => 20,
                _ => 34,
            };
            (q.shape[0] * q.shape[1] / 32) as u64 * per_block
        };
        Ok(self.block_params(weights, q)?.map(|(g, _)| (g, bytes(g))))
    }

    /// The block type of `q` and each scale's `(d, m)` in f16, when blocks hold it exactly.
    fn block_params(
        &self,
        weights: &Weights,
        q: &QuantizedLinear,
    ) -> Result<Option<(GgmlType, Vec<BlockScale>)>> {
        let inp = q.shape[1];
        let ggml = match (q.storage, q.zero.is_some()) {
            (Storage::Packed { bits: 4 }, false) => GgmlType::Q4_0,
            (Storage::Packed { bits: 4 }, true) => GgmlType::Q4_1,
            (Storage::Packed { bits: 8 } | Storage::Int8, false) => GgmlType::Q8_0,
            _ => return Ok(None),
        };
        if !inp.is_multiple_of(32) || (q.block[1] < inp && !q.block[1].is_multiple_of(32)) {
            return Ok(None);
        }
        let (scale, zero) = self.grid(weights, q)?;
        let exact = |x: f32| f16::from_f32(x).to_f32() == x;
        // d and, for Q4_1, m = −d·(8 + zero) (values stored as q + 8).
        let mut params = Vec::with_capacity(scale.len());
        for (g, &d) in scale.iter().enumerate() {
            let m = -d * (8.0 + zero.get(g).copied().unwrap_or(0.0));
            if !exact(d) || (ggml == GgmlType::Q4_1 && !exact(m)) {
                return Ok(None);
            }
            params.push((f16::from_f32(d), f16::from_f32(m)));
        }
        Ok(Some((ggml, params)))
    }

    fn require(&self, name: &str) -> Result<&QuantizedLinear> {
        self.weights.get(name).ok_or_else(|| HubError::BadTensor {
            path: self.path.clone(),
            tensor: name.to_string(),
            reason: "not a quantized weight of this checkpoint".into(),
        })
    }

    /// The scale grid and the zero points (empty when symmetric), row-major.
    fn grid(&self, weights: &Weights, q: &QuantizedLinear) -> Result<(Vec<f32>, Vec<f32>)> {
        let scale = weights.tensor(&q.scale)?.to_f32()?;
        let n = q.grid[0] * q.grid[1];
        if scale.len() != n {
            return Err(HubError::BadTensor {
                path: self.path.clone(),
                tensor: q.scale.clone(),
                reason: format!("{} scales for a grid of {n}", scale.len()),
            });
        }
        let zero = match (&q.zero, q.storage) {
            (None, _) => Vec::new(),
            (Some(z), Storage::Packed { bits }) => {
                // Packed along the rows: each column of words holds one grid column.
                let words = weights.tensor(z)?.to_i64()?;
                let [rows, cols] = q.grid;
                let per_col = words.len() / cols.max(1);
                let mut out = vec![0.0; n];
                let mut column = Vec::with_capacity(per_col);
                for c in 0..cols {
                    column.clear();
                    column.extend((0..per_col).map(|w| words[w * cols + c] as u32));
                    for (r, v) in unpack(&column, bits, rows).into_iter().enumerate() {
                        out[r * cols + c] = v as f32;
                    }
                }
                out
            }
            (Some(z), _) => weights
                .tensor(z)?
                .to_i64()?
                .into_iter()
                .map(|v| v as f32)
                .collect(),
        };
        Ok((scale, zero))
    }

    /// The stored values as f32 (integers exact), row-major `[out, in]`.
    fn values(&self, weights: &Weights, q: &QuantizedLinear) -> Result<Vec<f32>> {
        let view = weights.tensor(&q.values)?;
        let [out, inp] = q.shape;
        Ok(match q.storage {
            Storage::Packed { bits } => {
                let words: Vec<u32> = view.to_i64()?.into_iter().map(|w| w as u32).collect();
                let per_row = words.len() / out;
                (0..out)
                    .flat_map(|r| unpack(&words[r * per_row..(r + 1) * per_row], bits, inp))
                    .map(|v| v as f32)
                    .collect()
            }
            Storage::Int8 => view.to_i64()?.into_iter().map(|v| v as f32).collect(),
            Storage::Fp8 => view.to_f32()?,
        })
    }
}

/// What a method's config says about its stored tensors.
struct Scheme {
    /// `quant_method`.
    method: &'static str,
    /// The scale beside each quantized `weight` (`weight_scale`, FP8's `weight_scale_inv`).
    scale_suffix: &'static str,
    /// The integer widths packed weights may have.
    bits: BTreeSet<u32>,
    /// The column and row spans one scale may cover (group and block sizes).
    spans: BTreeSet<usize>,
    row_spans: BTreeSet<usize>,
}

fn config_field(path: &Path, name: &str, reason: String) -> HubError {
    HubError::ConfigField {
        path: path.to_path_buf(),
        field: format!("quantization_config.{name}"),
        reason,
    }
}

fn refused(path: &Path, name: &str, what: &str) -> HubError {
    config_field(
        path,
        name,
        format!(
            "{what}, which zoo does not apply; load the unquantized checkpoint, or a \
             weight-only scheme (W4A16, W8A16, FP8 weights)"
        ),
    )
}

impl Scheme {
    /// A compressed-tensors config, checked for what would change the numbers.
    fn compressed_tensors(q: &Value, path: &Path) -> Result<Scheme> {
        let field = |name: &str, reason: String| HubError::ConfigField {
            path: path.to_path_buf(),
            field: format!("quantization_config.{name}"),
            reason,
        };
        let refuse = |name: &str, what: &str| {
            field(
                name,
                format!(
                    "{what}, which zoo does not apply; load the unquantized checkpoint, or a \
                     weight-only scheme (W4A16, W8A16, FP8 weights)"
                ),
            )
        };
        let status = q.get("quantization_status").and_then(Value::as_str);
        if status.is_some_and(|s| s != "compressed") {
            return Err(field(
                "quantization_status",
                format!(
                    "{status:?}: zoo reads compressed checkpoints (status \"compressed\"), whose \
                     weights are stored quantized"
                ),
            ));
        }
        for (name, what) in [
            ("kv_cache_scheme", "a quantized KV cache"),
            ("sparsity_config", "sparse weights"),
            ("transform_config", "weight transforms (rotations)"),
        ] {
            if q.get(name).is_some_and(|v| !is_off(v)) {
                return Err(refuse(name, what));
            }
        }
        let global = q.get("format").and_then(Value::as_str);
        let groups = q
            .get("config_groups")
            .and_then(Value::as_object)
            .filter(|g| !g.is_empty())
            .ok_or_else(|| field("config_groups", "missing or empty".into()))?;
        let mut bits = BTreeSet::new();
        let mut spans = BTreeSet::new();
        let mut row_spans = BTreeSet::new();
        for (gname, g) in groups {
            let at = |f: &str| format!("config_groups.{gname}.{f}");
            let format = g.get("format").and_then(Value::as_str).or(global);
            match format {
                Some(f) if SUPPORTED_FORMATS.contains(&f) => {}
                other => {
                    return Err(refuse(
                        &at("format"),
                        &format!("the {other:?} format (zoo reads {SUPPORTED_FORMATS:?})"),
                    ))
                }
            }
            for (name, what) in [
                ("input_activations", "quantized activations"),
                ("output_activations", "quantized outputs"),
            ] {
                if g.get(name).is_some_and(|v| !is_off(v)) {
                    return Err(refuse(&at(name), what));
                }
            }
            let w = g
                .get("weights")
                .filter(|w| w.is_object())
                .ok_or_else(|| field(&at("weights"), "missing: no weight scheme".into()))?;
            let kind = w.get("type").and_then(Value::as_str).unwrap_or("int");
            let nbits = w.get("num_bits").and_then(Value::as_u64).unwrap_or(8);
            let strategy = w
                .get("strategy")
                .and_then(Value::as_str)
                .unwrap_or("tensor");
            match (kind, nbits) {
                ("int", 2..=8) | ("float", 8) => {}
                _ => {
                    return Err(refuse(
                        &at("weights"),
                        &format!("{nbits}-bit {kind} weights"),
                    ))
                }
            }
            if !["tensor", "channel", "group", "block"].contains(&strategy) {
                return Err(refuse(
                    &at("weights.strategy"),
                    &format!("the {strategy:?} strategy"),
                ));
            }
            if w.get("dynamic").is_some_and(|d| !is_off(d)) {
                return Err(refuse(
                    &at("weights.dynamic"),
                    "weights quantized at run time",
                ));
            }
            if w.get("actorder").and_then(Value::as_str) == Some("group") {
                return Err(refuse(
                    &at("weights.actorder"),
                    "activation-ordered groups (`weight_g_idx`)",
                ));
            }
            bits.insert(nbits as u32);
            if let Some(gs) = w.get("group_size").and_then(Value::as_u64) {
                spans.insert(gs as usize);
            }
            if let Some(b) = w.get("block_structure").and_then(Value::as_array) {
                let b: Vec<usize> = b
                    .iter()
                    .filter_map(|x| x.as_u64())
                    .map(|x| x as usize)
                    .collect();
                if let [r, c] = b[..] {
                    row_spans.insert(r);
                    spans.insert(c);
                }
            }
        }
        Ok(Scheme {
            method: "compressed-tensors",
            scale_suffix: "weight_scale",
            bits,
            spans,
            row_spans,
        })
    }

    /// transformers' FP8 config (`quant_method: "fp8"`): E4M3 weights with a
    /// `weight_scale_inv` per block of `weight_block_size`, or one per tensor. Dynamic
    /// activation quantization is what transformers itself skips without an FP8 GPU: the
    /// activations stay unquantized, as transformers computes them on the CPU.
    fn fp8(q: &Value, path: &Path) -> Result<Scheme> {
        let obj = q
            .as_object()
            .ok_or_else(|| config_field(path, "", "not an object".into()))?;
        let mut spans = BTreeSet::new();
        let mut row_spans = BTreeSet::new();
        for (key, value) in obj {
            match key.as_str() {
                "quant_method" | "modules_to_not_convert" | "dequantize" => {}
                "activation_scheme" if value.as_str() == Some("dynamic") => {}
                "activation_scheme" => {
                    return Err(refused(path, key, &format!("activation scheme {value}")))
                }
                "fmt" if matches!(value.as_str(), Some("e4m3" | "e5m2")) => {}
                "weight_block_size" if value.is_null() => {}
                "weight_block_size" => {
                    let b: Vec<usize> = value
                        .as_array()
                        .map(|a| {
                            a.iter()
                                .filter_map(Value::as_u64)
                                .map(|x| x as usize)
                                .collect()
                        })
                        .unwrap_or_default();
                    let [r, c] = b[..] else {
                        return Err(config_field(
                            path,
                            key,
                            format!("{value}: expected [rows, columns]"),
                        ));
                    };
                    row_spans.insert(r);
                    spans.insert(c);
                }
                _ => return Err(refused(path, key, &format!("`{key}` = {value}"))),
            }
        }
        Ok(Scheme {
            method: "fp8",
            scale_suffix: "weight_scale_inv",
            bits: BTreeSet::new(),
            spans,
            row_spans,
        })
    }
}

/// `n` signed `bits`-bit values from a little-endian bit stream of words (compressed-tensors'
/// `pack_to_int32`: value `i` at bit `i · bits`, stored offset by `2^(bits-1)`).
fn unpack(words: &[u32], bits: u32, n: usize) -> Vec<i32> {
    let mask = (1u64 << bits) - 1;
    let offset = 1i32 << (bits - 1);
    (0..n)
        .map(|i| {
            let bit = i * bits as usize;
            let (w, shift) = (bit / 32, bit % 32);
            let lo = u64::from(words.get(w).copied().unwrap_or(0));
            let hi = u64::from(words.get(w + 1).copied().unwrap_or(0));
            ((((hi << 32) | lo) >> shift) & mask) as i32 - offset
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// compressed-tensors' `pack_to_int32`, restated: value `i` at bit `i · bits`.
    fn pack(values: &[i32], bits: u32) -> Vec<u32> {
        let mut words = vec![0u32; (values.len() * bits as usize).div_ceil(32)];
        for (i, &v) in values.iter().enumerate() {
            let u = (v + (1 << (bits - 1))) as u64;
            let bit = i * bits as usize;
            let (w, shift) = (bit / 32, bit % 32);
            let both = u << shift;
            words[w] |= both as u32;
            if shift + bits as usize > 32 {
                words[w + 1] |= (both >> 32) as u32;
            }
        }
        words
    }

    #[test]
    fn unpacking_inverts_the_bit_stream_at_every_width() {
        for bits in 2..=8u32 {
            let lo = -(1 << (bits - 1));
            let values: Vec<i32> = (0..77).map(|i| lo + (i * 7 + 3) % (1 << bits)).collect();
            assert_eq!(
                unpack(&pack(&values, bits), bits, values.len()),
                values,
                "{bits} bits"
            );
        }
    }
}
