//! Helpers shared by zoo-hub's integration tests: real safetensors files written with the
//! safetensors crate, and HF-cache trees with refs and snapshots.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use safetensors::tensor::{Dtype as StDtype, TensorView};

/// Writes a safetensors file holding `tensors` (name, dtype, shape, raw little-endian bytes).
pub fn write_safetensors(path: &Path, tensors: &[(&str, StDtype, Vec<usize>, Vec<u8>)]) {
    let views: Vec<(String, TensorView<'_>)> = tensors
        .iter()
        .map(|(n, d, s, b)| (n.to_string(), TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    let meta: Option<std::collections::HashMap<String, String>> =
        Some([("format".to_string(), "pt".to_string())].into());
    safetensors::tensor::serialize_to_file(views, meta, path).unwrap();
}

/// f32 values as little-endian bytes.
pub fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// A sharded checkpoint in `dir`: tensors `w{i}` of shape [2, 3] spread over `shards` files
/// and an index naming them.
pub fn write_sharded(dir: &Path, n_tensors: usize, shards: usize) -> Vec<String> {
    let mut weight_map = BTreeMap::new();
    let mut names = Vec::new();
    for s in 0..shards {
        let file = format!("model-{:05}-of-{:05}.safetensors", s + 1, shards);
        let mine: Vec<(String, Vec<u8>)> = (0..n_tensors)
            .filter(|i| i % shards == s)
            .map(|i| {
                let vals: Vec<f32> = (0..6).map(|k| (i * 10 + k) as f32).collect();
                (format!("model.layers.{i}.w"), f32_bytes(&vals))
            })
            .collect();
        let specs: Vec<(&str, StDtype, Vec<usize>, Vec<u8>)> = mine
            .iter()
            .map(|(n, b)| (n.as_str(), StDtype::F32, vec![2, 3], b.clone()))
            .collect();
        write_safetensors(&dir.join(&file), &specs);
        for (n, _) in mine {
            weight_map.insert(n.clone(), file.clone());
            names.push(n);
        }
    }
    let index =
        serde_json::json!({"metadata": {"total_size": n_tensors * 24}, "weight_map": weight_map});
    std::fs::write(
        dir.join("model.safetensors.index.json"),
        serde_json::to_vec_pretty(&index).unwrap(),
    )
    .unwrap();
    names
}

/// Lays out `files` (relative name → content) as a snapshot of `repo` at `commit` in an HF
/// cache at `cache`, with blobs, symlinked snapshot entries and `refs/<revision>`.
pub fn write_cache_repo(
    cache: &Path,
    repo: &str,
    revision: &str,
    commit: &str,
    files: &[(&str, Vec<u8>)],
) -> PathBuf {
    let dir = cache.join(format!("models--{}", repo.replace('/', "--")));
    std::fs::create_dir_all(dir.join("refs")).unwrap();
    std::fs::create_dir_all(dir.join("blobs")).unwrap();
    std::fs::write(dir.join("refs").join(revision), commit).unwrap();
    let snap = dir.join("snapshots").join(commit);
    for (i, (name, content)) in files.iter().enumerate() {
        let blob = dir.join("blobs").join(format!("blob{i:04}"));
        std::fs::write(&blob, content).unwrap();
        let target = snap.join(name);
        std::fs::create_dir_all(target.parent().unwrap()).unwrap();
        #[cfg(unix)]
        std::os::unix::fs::symlink(&blob, &target).unwrap();
        #[cfg(not(unix))]
        std::fs::copy(&blob, &target).unwrap();
    }
    snap
}

/// Checks one tensor entry of a transformers-written GGUF reference (`hf_name`, `hf_shape`,
/// `type`) against `inventory`, including the Q/K row transform for `heads` query and
/// `kv_heads` key heads, and returns the tensor's info.
pub fn check_gguf_reference_tensor<'a>(
    inventory: &'a zoo_hub::Inventory,
    t: &serde_json::Value,
    heads: usize,
    kv_heads: usize,
) -> &'a zoo_hub::TensorInfo {
    let hf = t["hf_name"].as_str().unwrap();
    let info = inventory.require(hf).unwrap();
    let shape: Vec<usize> = t["hf_shape"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_u64().unwrap() as usize)
        .collect();
    assert_eq!(info.shape, shape, "{hf}");
    assert_eq!(info.dtype.name(), t["type"].as_str().unwrap(), "{hf}");
    let want = if hf.ends_with("q_proj.weight") {
        zoo_hub::Transform::UnpermuteQk { heads }
    } else if hf.ends_with("k_proj.weight") {
        zoo_hub::Transform::UnpermuteQk { heads: kv_heads }
    } else {
        zoo_hub::Transform::None
    };
    assert_eq!(info.transform, want, "{hf}");
    info
}

pub mod assets;
