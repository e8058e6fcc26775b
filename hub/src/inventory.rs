//! The inventory: every tensor of a checkpoint (name, dtype, shape, bytes, file, offset), built
//! from headers alone. The device-map planner sizes a deployment from it without reading data.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use crate::dtype::Dtype;
use crate::error::{HubError, Result};
use crate::safetensors;

/// How stored values map onto the HF tensor beyond dtype and shape.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Transform {
    /// Stored exactly as the HF tensor.
    #[default]
    None,
    /// llama.cpp stores `q_proj`/`k_proj` rows with each head's two rotary halves interleaved;
    /// reading undoes that permutation for `heads` heads.
    UnpermuteQk { heads: usize },
    /// llama.cpp stores Gemma's RMSNorm weights as `1 + w`; reading subtracts 1 (in f32).
    MinusOne,
}

/// One stored tensor, described from its file's header.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    /// The HF name (`model.layers.0.self_attn.q_proj.weight`).
    pub name: String,
    /// The stored element type.
    pub dtype: Dtype,
    /// The HF shape (row-major, outermost first).
    pub shape: Vec<usize>,
    /// Bytes the stored data takes in the file.
    pub nbytes: u64,
    /// The file holding the data.
    pub file: PathBuf,
    /// Absolute byte offset of the data in `file`.
    pub offset: u64,
    /// What reading must undo (GGUF layouts); `Transform::None` for safetensors.
    pub transform: Transform,
}

impl TensorInfo {
    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Bytes this tensor takes once converted to `dtype` (a plain type).
    pub fn bytes_as(&self, dtype: Dtype) -> u64 {
        self.numel() as u64 * dtype.plain_size()
    }
}

/// Every tensor of a checkpoint across all its files, looked up by HF name.
#[derive(Clone, Debug, Default)]
pub struct Inventory {
    files: Vec<PathBuf>,
    tensors: Vec<TensorInfo>,
    by_name: HashMap<String, usize>,
}

impl Inventory {
    /// Reads the headers of the given safetensors files (e.g. every shard of a checkpoint).
    pub fn from_safetensors(files: &[PathBuf]) -> Result<Inventory> {
        let mut inv = Inventory::default();
        for file in files {
            let header = safetensors::read_header(file)?;
            inv.files.push(file.clone());
            for t in header.tensors {
                inv.push(t)?;
            }
        }
        Ok(inv)
    }

    /// Adds one tensor; a name seen before is an error naming both files.
    pub fn push(&mut self, info: TensorInfo) -> Result<()> {
        if let Some(&i) = self.by_name.get(&info.name) {
            return Err(HubError::DuplicateTensor {
                tensor: info.name,
                first: self.tensors[i].file.clone(),
                second: info.file,
            });
        }
        if !self.files.contains(&info.file) {
            self.files.push(info.file.clone());
        }
        self.by_name.insert(info.name.clone(), self.tensors.len());
        self.tensors.push(info);
        Ok(())
    }

    /// The files the tensors live in, in the order they were read.
    pub fn files(&self) -> &[PathBuf] {
        &self.files
    }

    /// All tensors, file by file in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The tensor called `name`, if present.
    pub fn get(&self, name: &str) -> Option<&TensorInfo> {
        self.by_name.get(name).map(|&i| &self.tensors[i])
    }

    /// The tensor called `name`, or a [`HubError::MissingTensor`] that lists the files searched
    /// and the nearest names present.
    pub fn require(&self, name: &str) -> Result<&TensorInfo> {
        self.get(name).ok_or_else(|| self.missing(name))
    }

    /// Number of tensors.
    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    /// Whether the inventory holds no tensor.
    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    /// Total stored bytes.
    pub fn total_bytes(&self) -> u64 {
        self.tensors.iter().map(|t| t.nbytes).sum()
    }

    /// (tensor count, stored bytes) per stored dtype, sorted by dtype name.
    pub fn totals_by_dtype(&self) -> BTreeMap<&'static str, (usize, u64)> {
        let mut totals = BTreeMap::new();
        for t in &self.tensors {
            let e = totals.entry(t.dtype.name()).or_insert((0, 0));
            e.0 += 1;
            e.1 += t.nbytes;
        }
        totals
    }

    /// The error for a tensor that is not here, naming the files and the closest names present.
    pub fn missing(&self, name: &str) -> HubError {
        let files = self
            .files
            .iter()
            .map(|f| f.display().to_string())
            .collect::<Vec<_>>()
            .join(", ");
        // The names sharing the longest prefix are the likely intended ones (a renamed module, a
        // missing `model.` prefix).
        let best = self
            .tensors
            .iter()
            .map(|t| (common_prefix(&t.name, name), &t.name))
            .max_by_key(|(n, _)| *n);
        let hint = match best {
            Some((_, near)) => format!(
                "the nearest name present is {near:?}; check that the checkpoint matches the architecture in config.json"
            ),
            None => "the checkpoint holds no tensors".to_string(),
        };
        HubError::MissingTensor {
            tensor: name.to_string(),
            files,
            hint,
        }
    }
}

fn common_prefix(a: &str, b: &str) -> usize {
    a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count()
}

/// Convenience for a single file.
pub fn inventory_of(path: &Path) -> Result<Inventory> {
    Inventory::from_safetensors(&[path.to_path_buf()])
}

/// Config fields that count stacked layers, by their names across transformers and diffusers.
const LAYER_COUNTS: &[&str] = &[
    "num_hidden_layers",
    "num_layers",
    "n_layer",
    "num_encoder_layers",
    "encoder_layers",
    "num_single_layers",
    "num_decoder_layers",
    "decoder_layers",
];

impl Inventory {
    /// The longest stack of numbered modules: for every `prefix.N.` in a tensor name, the
    /// prefix and how many indices it holds (the largest index plus one). `None` for a
    /// checkpoint without numbered modules.
    pub fn longest_stack(&self) -> Option<(String, usize)> {
        let mut stacks: BTreeMap<&str, usize> = BTreeMap::new();
        for t in &self.tensors {
            let mut start = 0;
            for part in t.name.split('.') {
                if let Ok(i) = part.parse::<usize>() {
                    let prefix = t.name[..start].trim_end_matches('.');
                    let n = stacks.entry(prefix).or_default();
                    *n = (*n).max(i.saturating_add(1));
                }
                start += part.len() + 1;
            }
        }
        stacks
            .into_iter()
            .max_by_key(|(_, n)| *n)
            .map(|(p, n)| (p.to_string(), n))
    }

    /// Refuses a config (`config`, read from `path`) whose layer counts exceed every stack of
    /// numbered modules the checkpoint holds: every layer of the families zoo runs stores
    /// tensors of its own, so a larger count is a config that does not describe these
    /// weights, caught before a model allocates its per-layer tables. Nested configs
    /// (`text_config`, ...) are read too; a decoder's count is checked only where the
    /// checkpoint holds a decoder (an encoder-only T5 keeps `num_decoder_layers`).
    pub fn check_layer_counts(&self, config: &serde_json::Value, path: &Path) -> Result<()> {
        let Some((stack, most)) = self.longest_stack() else {
            return Ok(());
        };
        let has_decoder = self.tensors.iter().any(|t| t.name.contains("decoder"));
        check_counts(config, "", &|field, n| {
            let leaf = field.rsplit('.').next().unwrap_or(field);
            if n <= most as u64 || (leaf.contains("decoder") && !has_decoder) {
                return Ok(());
            }
            Err(HubError::ConfigField {
                path: path.to_path_buf(),
                field: field.to_string(),
                reason: format!(
                    "{n} layers, but the checkpoint's longest stack of layers holds {most} \
                     (`{stack}.0` to `{stack}.{}`); config.json does not describe these weights",
                    most - 1
                ),
            })
        })
    }
}

impl Inventory {
    /// Refuses a pre-quantized checkpoint, which zoo does not apply yet: a
    /// `quantization_config` in `config` (or in a nested model's config), or tensors that only
    /// quantized formats hold (GPTQ/AWQ `qweight`, compressed-tensors `weight_packed`, an fp8
    /// weight beside its `weight_scale` / `weight_scale_inv`). Read as plain tensors, such
    /// weights give numbers off by their scales without a word.
    pub fn check_unquantized(&self, config: &serde_json::Value, path: &Path) -> Result<()> {
        let nested = config
            .as_object()
            .into_iter()
            .flat_map(|m| m.iter())
            .filter(|(_, v)| v.is_object())
            .map(|(k, v)| (format!("{k}."), v));
        for (at, cfg) in std::iter::once((String::new(), config)).chain(nested) {
            let Some(q) = cfg.get("quantization_config").filter(|q| !q.is_null()) else {
                continue;
            };
            let method = q
                .get("quant_method")
                .and_then(|m| m.as_str())
                .or_else(|| q.get("format").and_then(|m| m.as_str()))
                .unwrap_or("unnamed");
            return Err(HubError::ConfigField {
                path: path.to_path_buf(),
                field: format!("{at}quantization_config"),
                reason: format!(
                    "a pre-quantized checkpoint (quant_method {method:?}), which zoo does not apply \
                     yet: its weights read without their scales would give wrong numbers; load \
                     the unquantized checkpoint, or a GGUF file of it"
                ),
            });
        }
        let names: std::collections::HashSet<&str> =
            self.tensors.iter().map(|t| t.name.as_str()).collect();
        for t in &self.tensors {
            let leaf = t.name.rsplit('.').next().unwrap_or(&t.name);
            let scaled_fp8 = matches!(t.dtype, Dtype::F8E4M3 | Dtype::F8E5M2)
                && ["_scale", "_scale_inv"]
                    .iter()
                    .any(|s| names.contains(format!("{}{s}", t.name).as_str()));
            if matches!(leaf, "qweight" | "weight_packed") || scaled_fp8 {
                return Err(HubError::BadTensor {
                    path: t.file.clone(),
                    tensor: t.name.clone(),
                    reason: "a quantized weight (GPTQ/AWQ packing, compressed-tensors packing or fp8 with \
                             scales) in a checkpoint whose config names no quantization zoo applies; \
                             load the unquantized checkpoint, or a GGUF file of it"
                        .into(),
                });
            }
        }
        Ok(())
    }
}

fn check_counts(
    value: &serde_json::Value,
    at: &str,
    check: &dyn Fn(&str, u64) -> Result<()>,
) -> Result<()> {
    let serde_json::Value::Object(map) = value else {
        return Ok(());
    };
    for (k, v) in map {
        let field = if at.is_empty() {
            k.clone()
        } else {
            format!("{at}.{k}")
        };
        match v {
            serde_json::Value::Number(n) if LAYER_COUNTS.contains(&k.as_str()) => {
                if let Some(n) = n.as_u64() {
                    check(&field, n)?;
                }
            }
            serde_json::Value::Object(_) => check_counts(v, &field, check)?,
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tensor(name: &str, dtype: Dtype) -> TensorInfo {
        TensorInfo {
            name: name.into(),
            dtype,
            shape: vec![4, 4],
            nbytes: 16,
            file: "model.safetensors".into(),
            offset: 0,
            transform: Transform::None,
        }
    }

    fn inventory(tensors: &[(&str, Dtype)]) -> Inventory {
        let mut inv = Inventory::default();
        for (n, d) in tensors {
            inv.push(tensor(n, *d)).unwrap();
        }
        inv
    }

    #[test]
    fn pre_quantized_checkpoints_are_refused_by_name() {
        let path = Path::new("config.json");
        let plain = inventory(&[("model.layers.0.mlp.up_proj.weight", Dtype::BF16)]);
        assert!(plain
            .check_unquantized(&serde_json::json!({"model_type": "llama"}), path)
            .is_ok());
        // A null quantization_config is none.
        let none = serde_json::json!({"quantization_config": null});
        assert!(plain.check_unquantized(&none, path).is_ok());
        let fp8 = serde_json::json!({"quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}});
        let e = plain.check_unquantized(&fp8, path).unwrap_err().to_string();
        assert!(
            e.contains("quantization_config") && e.contains("\"fp8\""),
            "{e}"
        );
        let nested = serde_json::json!({"text_config": {"quantization_config": {"format": "pack-quantized"}}});
        let e = plain
            .check_unquantized(&nested, path)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("text_config.quantization_config") && e.contains("pack-quantized"),
            "{e}"
        );
        // Weights that only a quantized format holds, with no config saying so.
        for bad in [
            inventory(&[("model.layers.0.mlp.up_proj.qweight", Dtype::I32)]),
            inventory(&[("model.layers.0.mlp.up_proj.weight_packed", Dtype::I32)]),
            inventory(&[
                ("model.layers.0.mlp.up_proj.weight", Dtype::F8E4M3),
                ("model.layers.0.mlp.up_proj.weight_scale_inv", Dtype::F32),
            ]),
        ] {
            let e = bad
                .check_unquantized(&serde_json::json!({}), path)
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("model.layers.0.mlp.up_proj") && e.contains("quantized"),
                "{e}"
            );
        }
        // An fp8 weight with no scale is plain fp8 values.
        let unscaled = inventory(&[("w.weight", Dtype::F8E4M3)]);
        assert!(unscaled
            .check_unquantized(&serde_json::json!({}), path)
            .is_ok());
    }
}
