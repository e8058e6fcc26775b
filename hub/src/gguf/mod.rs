//! GGUF: llama.cpp checkpoints read as HF architectures.
//!
//! [`open`] reads a `.gguf` file's header and presents it the way an HF checkpoint folder
//! looks: an [`Inventory`] under HF tensor names and shapes (with what llama.cpp's converter
//! changed marked for undoing on read: llama's Q/K row order, Gemma's `1 + w` norms), a
//! `config.json`, a `tokenizer.json` and a `tokenizer_config.json`, each built from the
//! file's metadata. [`SUPPORTED_ARCHITECTURES`] lists the architectures mapped. Tensor data stays in the file
//! and is dequantized by [`Weights`](crate::Weights) when a tensor is read.

mod config;
mod dequant;
mod names;
pub mod reader;
mod tokenizer;

use std::path::{Path, PathBuf};

use crate::error::{HubError, Result};
use crate::inventory::{Inventory, TensorInfo, Transform};

pub use dequant::{dequantize, dequantize_into};
pub use reader::{parse, read, Array, GgufFile, GgufTensor, Metadata, Value};

/// The architectures whose tensors and config zoo maps to HF (`general.architecture`;
/// `llama` files with experts read as Mixtral).
pub const SUPPORTED_ARCHITECTURES: &[&str] = &[
    "llama", "qwen2", "qwen3", "qwen2moe", "qwen3moe", "phi3", "gemma", "gemma2", "gemma3",
];

/// A GGUF file seen as an HF checkpoint.
#[derive(Clone, Debug)]
pub struct GgufCheckpoint {
    /// The file.
    pub path: PathBuf,
    /// Every tensor under its HF name and shape, pointing into the GGUF file.
    pub inventory: Inventory,
    /// The file's metadata, as stored.
    pub metadata: Metadata,
    /// The `config.json` equivalent.
    pub config: serde_json::Value,
    /// The `tokenizer_config.json` equivalent, when the file holds a tokenizer (its
    /// `tokenizer.json` comes from [`GgufCheckpoint::tokenizer_json`]).
    pub tokenizer_config: Option<serde_json::Value>,
    /// GGUF format version (2 or 3).
    pub version: u32,
    /// `general.architecture` (`"llama"`).
    pub architecture: String,
}

impl GgufCheckpoint {
    /// The `tokenizer.json` equivalent (HF tokenizers' format), when the file holds a
    /// tokenizer, built from the metadata.
    pub fn tokenizer_json(&self) -> Result<Option<serde_json::Value>> {
        tokenizer::build(&self.metadata)
            .map(|built| built.map(|(tok, _)| tok))
            .map_err(|reason| HubError::Gguf {
                path: self.path.clone(),
                reason,
            })
    }
}

/// Opens the GGUF file at `path` as an HF checkpoint, reading its header only.
///
/// Errors are [`HubError::Gguf`] naming the file and what is wrong: a malformed file, an
/// architecture other than those in [`SUPPORTED_ARCHITECTURES`], a tensor name that has no HF
/// counterpart, a missing metadata key.
pub fn open(path: &Path) -> Result<GgufCheckpoint> {
    let file = read(path)?;
    from_file(file)
}

/// Builds the HF view of an already parsed GGUF file.
pub fn from_file(file: GgufFile) -> Result<GgufCheckpoint> {
    let err = |reason: String| HubError::Gguf {
        path: file.path.clone(),
        reason,
    };
    let arch = file
        .metadata
        .get_str("general.architecture")
        .ok_or_else(|| {
            err("metadata key general.architecture is missing or not a string; the file was not written by a llama.cpp converter".into())
        })?
        .to_string();
    let Some(spec) = names::arch(&arch) else {
        return Err(err(format!(
            "architecture {arch:?} is not supported; zoo maps GGUF files of these architectures to HF: {}",
            SUPPORTED_ARCHITECTURES.join(", ")
        )));
    };

    let config = config::hf_config(&file, spec).map_err(err)?;
    let heads = config["num_attention_heads"].as_u64().unwrap_or(0) as usize;
    let kv_heads = config["num_key_value_heads"].as_u64().unwrap_or(0) as usize;

    let mut inventory = Inventory::default();
    for t in &file.tensors {
        let Some(mapped) = spec.hf_name(&t.name).map_err(err)? else {
            continue;
        };
        let transform = match mapped.undo {
            names::Undo::Permutation(names::Qk::Q) => Transform::UnpermuteQk { heads },
            names::Undo::Permutation(names::Qk::K) => Transform::UnpermuteQk { heads: kv_heads },
            names::Undo::PlusOne => Transform::MinusOne,
            names::Undo::None => Transform::None,
        };
        if let Transform::UnpermuteQk { heads } = transform {
            let rows = t.dims.last().copied().unwrap_or(0);
            let pairs = (heads as u64).checked_mul(2).filter(|&p| p != 0);
            if !pairs.is_some_and(|p| rows.is_multiple_of(p)) {
                return Err(err(format!(
                    "tensor {:?} has {rows} rows, which do not split into {heads} heads of even size; the head counts in the metadata do not match the tensors",
                    t.name
                )));
            }
        }
        let mut shape = t.hf_shape();
        // llama.cpp stores Qwen2-MoE's shared-expert gate `[1, H]` as a vector.
        if mapped.name.ends_with("shared_expert_gate.weight") && shape.len() == 1 {
            shape.insert(0, 1);
        }
        inventory.push(TensorInfo {
            name: mapped.name,
            dtype: t.dtype,
            shape,
            nbytes: t.nbytes,
            file: file.path.clone(),
            offset: t.offset,
            transform,
        })?;
    }

    // Built here to refuse a broken vocabulary at open; the tokenizer.json itself is
    // rebuilt when asked for rather than kept, so it is not resident beside the weights.
    let tokenizer_config = tokenizer::build(&file.metadata)
        .map_err(err)?
        .map(|(_, cfg)| cfg);

    Ok(GgufCheckpoint {
        path: file.path.clone(),
        inventory,
        config,
        tokenizer_config,
        version: file.version,
        architecture: arch,
        metadata: file.metadata,
    })
}
