//! Finding a model's weights: a single `model.safetensors`, shards listed by
//! `model.safetensors.index.json`, diffusers' `diffusion_pytorch_model*.safetensors`, variants
//! such as `fp16`, and GGUF files. The result is an inventory built from headers alone.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::config::{parse_json, read_json};
use crate::error::{io_err, HubError, Result};
use crate::inventory::Inventory;
use crate::source::{ModelFiles, Source};

/// The on-disk format of a checkpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Safetensors,
    Gguf,
}

/// A checkpoint's weight files and their inventory.
#[derive(Clone, Debug)]
pub struct Checkpoint {
    pub format: Format,
    /// The index file, for sharded checkpoints.
    pub index: Option<PathBuf>,
    /// Every weight file, in shard order.
    pub files: Vec<PathBuf>,
    /// Every tensor across the files, from headers alone.
    pub inventory: Inventory,
}

/// `model.safetensors.index.json`: which shard holds which tensor.
#[derive(Clone, Debug)]
pub struct ShardIndex {
    pub path: PathBuf,
    /// Tensor name → shard file name, as listed.
    pub weight_map: BTreeMap<String, String>,
    /// Shard file names in first-mention order.
    pub shards: Vec<String>,
    pub metadata: serde_json::Map<String, Value>,
}

impl ShardIndex {
    /// Reads an index file.
    pub fn from_file(path: &Path) -> Result<ShardIndex> {
        let bytes = std::fs::read(path).map_err(io_err(path))?;
        ShardIndex::parse(path, &bytes)
    }

    /// Parses index JSON bytes, naming `path` in errors. Split out for the fuzzer.
    pub fn parse(path: &Path, bytes: &[u8]) -> Result<ShardIndex> {
        let bad = |reason: String| HubError::Index {
            path: path.to_path_buf(),
            reason,
        };
        let json: Value = parse_json(path, bytes)?;
        let obj = json
            .as_object()
            .ok_or_else(|| bad("not a JSON object".into()))?;
        let map = obj
            .get("weight_map")
            .and_then(Value::as_object)
            .ok_or_else(|| bad("`weight_map` is missing or not an object".into()))?;
        let mut weight_map = BTreeMap::new();
        let mut shards: Vec<String> = Vec::new();
        for (tensor, shard) in map {
            let shard = shard
                .as_str()
                .ok_or_else(|| bad(format!("the shard of {tensor:?} is not a string")))?;
            // Shards must sit beside the index: no absolute paths, no `..`.
            if shard.is_empty()
                || Path::new(shard).is_absolute()
                || shard.split(['/', '\\']).any(|p| p == ".." || p.is_empty())
            {
                return Err(bad(format!(
                    "the shard {shard:?} of {tensor:?} is not a file name inside the checkpoint folder"
                )));
            }
            if !shards.iter().any(|s| s == shard) {
                shards.push(shard.to_string());
            }
            weight_map.insert(tensor.clone(), shard.to_string());
        }
        let metadata = obj
            .get("metadata")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        Ok(ShardIndex {
            path: path.to_path_buf(),
            weight_map,
            shards,
            metadata,
        })
    }
}

/// The weight file names tried for a model root, in order, for a given variant and file stem
/// (`model` for transformers, `diffusion_pytorch_model` for diffusers).
fn candidates(stem: &str, variant: Option<&str>) -> (String, String) {
    match variant {
        Some(v) => (
            format!("{stem}.safetensors.index.{v}.json"),
            format!("{stem}.{v}.safetensors"),
        ),
        None => (
            format!("{stem}.safetensors.index.json"),
            format!("{stem}.safetensors"),
        ),
    }
}

/// Finds and inventories the weights of `files` (optionally under `subfolder`, a diffusers
/// component), preferring the `variant` (`"fp16"`) when given.
pub fn find_checkpoint(
    files: &ModelFiles,
    subfolder: Option<&str>,
    variant: Option<&str>,
) -> Result<Checkpoint> {
    if let Source::File(path) = files.source() {
        return checkpoint_of_file(path);
    }
    let prefix = subfolder.map(|s| format!("{s}/")).unwrap_or_default();
    let mut looked = Vec::new();
    for stem in ["model", "diffusion_pytorch_model"] {
        // The single file first, as transformers looks: beside a stale index it still loads.
        let (index_name, single_name) = candidates(stem, variant);
        let single_rel = format!("{prefix}{single_name}");
        looked.push(single_rel.clone());
        if let Some(path) = files.get_optional(&single_rel)? {
            return Ok(Checkpoint {
                format: Format::Safetensors,
                index: None,
                inventory: Inventory::from_safetensors(std::slice::from_ref(&path))?,
                files: vec![path],
            });
        }
        let index_rel = format!("{prefix}{index_name}");
        looked.push(index_rel.clone());
        if let Some(index_path) = files.get_optional(&index_rel)? {
            return sharded(files, &prefix, &index_path);
        }
    }
    // A folder holding one GGUF file (and no safetensors) is a GGUF checkpoint.
    if let Some(dir) = files.local_dir() {
        let dir = dir.join(subfolder.unwrap_or(""));
        let mut ggufs: Vec<PathBuf> = std::fs::read_dir(&dir)
            .map_err(io_err(&dir))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "gguf"))
            .collect();
        ggufs.sort();
        match ggufs.len() {
            1 => return checkpoint_of_file(&ggufs[0]),
            0 => looked.push(format!("{prefix}*.gguf")),
            _ => {
                return Err(HubError::NoWeights {
                    path: dir,
                    looked_for: format!(
                        "one GGUF file, found {}",
                        ggufs
                            .iter()
                            .map(|p| p.display().to_string())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                    hint: "name the GGUF file to load instead of its folder".into(),
                })
            }
        }
    }
    let path = files
        .local_dir()
        .map(|d| d.join(subfolder.unwrap_or("")))
        .unwrap_or_else(|| PathBuf::from(files.source().to_string()));
    let hint = match variant {
        Some(v) => format!("no `{v}` variant exists here; try without the variant"),
        None => "zoo reads safetensors and GGUF; convert PyTorch .bin weights to safetensors first"
            .into(),
    };
    Err(HubError::NoWeights {
        path,
        looked_for: looked.join(", "),
        hint,
    })
}

fn sharded(files: &ModelFiles, prefix: &str, index_path: &Path) -> Result<Checkpoint> {
    let index = ShardIndex::from_file(index_path)?;
    let mut shard_paths = Vec::with_capacity(index.shards.len());
    for shard in &index.shards {
        let rel = format!("{prefix}{shard}");
        match files.get_optional(&rel)? {
            Some(p) => shard_paths.push(p),
            None => {
                return Err(HubError::Index {
                    path: index_path.to_path_buf(),
                    reason: format!(
                        "it names the shard {shard:?}, which is absent ({}); re-download the checkpoint",
                        files.not_found(&rel, None)
                    ),
                })
            }
        }
    }
    let inventory = Inventory::from_safetensors(&shard_paths)?;
    // Every tensor the index lists must be in the shard it names.
    for (tensor, shard) in &index.weight_map {
        let found = inventory.get(tensor);
        let in_named_shard =
            found.is_some_and(|t| t.file.file_name() == Path::new(shard).file_name());
        if !in_named_shard {
            return Err(HubError::Index {
                path: index_path.to_path_buf(),
                reason: match found {
                    Some(t) => format!(
                        "it places {tensor:?} in {shard:?}, but it is in {}",
                        t.file.display()
                    ),
                    None => format!("it places {tensor:?} in {shard:?}, which does not hold it"),
                },
            });
        }
    }
    Ok(Checkpoint {
        format: Format::Safetensors,
        index: Some(index_path.to_path_buf()),
        files: shard_paths,
        inventory,
    })
}

fn checkpoint_of_file(path: &Path) -> Result<Checkpoint> {
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    if name.ends_with(".gguf") {
        let ck = crate::gguf::open(path)?;
        return Ok(Checkpoint {
            format: Format::Gguf,
            index: None,
            files: vec![path.to_path_buf()],
            inventory: ck.inventory,
        });
    }
    if name.ends_with(".json") {
        let dir = path.parent().unwrap_or(Path::new("."));
        let files = ModelFiles::new(Source::Folder(dir.to_path_buf()));
        return sharded(&files, "", path);
    }
    Ok(Checkpoint {
        format: Format::Safetensors,
        index: None,
        inventory: Inventory::from_safetensors(&[path.to_path_buf()])?,
        files: vec![path.to_path_buf()],
    })
}

/// `model_index.json` of a diffusers pipeline: its class and components.
#[derive(Clone, Debug)]
pub struct ModelIndex {
    pub path: PathBuf,
    /// `_class_name`, e.g. `StableDiffusionPipeline`.
    pub class_name: String,
    pub diffusers_version: Option<String>,
    /// Component name (= subfolder) → (library, class), e.g. `unet` → (`diffusers`,
    /// `UNet2DConditionModel`). Components set to `null` are left out.
    pub components: BTreeMap<String, (String, String)>,
    /// Other fields (`requires_safety_checker`, ...).
    pub extra: serde_json::Map<String, Value>,
}

impl ModelIndex {
    /// Reads `model_index.json`.
    pub fn from_file(path: &Path) -> Result<ModelIndex> {
        let json: Value = read_json(path)?;
        let bad = |field: &str, reason: &str| HubError::ConfigField {
            path: path.to_path_buf(),
            field: field.to_string(),
            reason: reason.to_string(),
        };
        let obj = json
            .as_object()
            .ok_or_else(|| bad("(root)", "not a JSON object"))?;
        let class_name = obj
            .get("_class_name")
            .and_then(Value::as_str)
            .ok_or_else(|| bad("_class_name", "missing or not a string"))?
            .to_string();
        let mut components = BTreeMap::new();
        let mut extra = serde_json::Map::new();
        for (k, v) in obj {
            if k.starts_with('_') {
                continue;
            }
            match v.as_array().map(Vec::as_slice) {
                Some([Value::String(lib), Value::String(class)]) => {
                    // A component's name is its subfolder: one folder name, no path.
                    crate::source::check_name("component", k)?;
                    components.insert(k.clone(), (lib.clone(), class.clone()));
                }
                Some([Value::Null, Value::Null]) => {}
                _ => {
                    extra.insert(k.clone(), v.clone());
                }
            }
        }
        Ok(ModelIndex {
            path: path.to_path_buf(),
            class_name,
            diffusers_version: obj
                .get("_diffusers_version")
                .and_then(Value::as_str)
                .map(str::to_string),
            components,
            extra,
        })
    }
}
