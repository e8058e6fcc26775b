//! Safetensors headers, inventories and conversions, on files written by the safetensors crate.

mod common;

use common::{f32_bytes, write_safetensors, write_sharded};
use half::{bf16, f16};
use safetensors::tensor::Dtype as StDtype;
use zoo_hub::{Dtype, HubError, Inventory, Pretrained, Weights};

#[test]
fn every_hf_dtype_is_recognised_with_exact_byte_sizes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("all.safetensors");
    let cases = [
        ("f64", StDtype::F64, Dtype::F64, 8),
        ("f32", StDtype::F32, Dtype::F32, 4),
        ("f16", StDtype::F16, Dtype::F16, 2),
        ("bf16", StDtype::BF16, Dtype::BF16, 2),
        ("i64", StDtype::I64, Dtype::I64, 8),
        ("i32", StDtype::I32, Dtype::I32, 4),
        ("i16", StDtype::I16, Dtype::I16, 2),
        ("i8", StDtype::I8, Dtype::I8, 1),
        ("u8", StDtype::U8, Dtype::U8, 1),
        ("bool", StDtype::BOOL, Dtype::Bool, 1),
        ("f8e4m3", StDtype::F8_E4M3, Dtype::F8E4M3, 1),
        ("f8e5m2", StDtype::F8_E5M2, Dtype::F8E5M2, 1),
    ];
    let specs: Vec<_> = cases
        .iter()
        .map(|(n, st, _, size)| (*n, *st, vec![3, 5], vec![0u8; 15 * size]))
        .collect();
    write_safetensors(&path, &specs);
    let inv = Inventory::from_safetensors(std::slice::from_ref(&path)).unwrap();
    assert_eq!(inv.len(), cases.len());
    for (name, _, dtype, size) in cases {
        let t = inv.get(name).unwrap();
        assert_eq!(t.dtype, dtype, "{name}");
        assert_eq!(t.shape, vec![3, 5]);
        assert_eq!(t.nbytes, 15 * size as u64);
        assert_eq!(t.file, path);
    }
    // Offsets point at each tensor's own bytes, and they tile the data section.
    let mut spans: Vec<(u64, u64)> = inv.tensors().iter().map(|t| (t.offset, t.nbytes)).collect();
    spans.sort();
    for w in spans.windows(2) {
        assert_eq!(w[0].0 + w[0].1, w[1].0);
    }
}

#[test]
fn conversion_on_load_matches_the_stored_values() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.safetensors");
    let vals = [1.5f32, -2.25, 3.0e-3, 65504.0, -0.0, 7.0];
    let f16s: Vec<u8> = vals
        .iter()
        .flat_map(|v| f16::from_f32(*v).to_le_bytes())
        .collect();
    let bf16s: Vec<u8> = vals
        .iter()
        .flat_map(|v| bf16::from_f32(*v).to_le_bytes())
        .collect();
    let i64s: Vec<u8> = [3i64, -4, 5].iter().flat_map(|v| v.to_le_bytes()).collect();
    write_safetensors(
        &path,
        &[
            ("a", StDtype::F32, vec![2, 3], f32_bytes(&vals)),
            ("b", StDtype::F16, vec![6], f16s),
            ("c", StDtype::BF16, vec![3, 2], bf16s),
            ("ids", StDtype::I64, vec![3], i64s),
        ],
    );
    let w = Weights::from_safetensors(&[path]).unwrap();
    assert_eq!(w.tensor("a").unwrap().to_f32().unwrap(), vals);
    let b = w.tensor("b").unwrap();
    let expect_f16: Vec<f32> = vals.iter().map(|v| f16::from_f32(*v).to_f32()).collect();
    assert_eq!(b.to_f32().unwrap(), expect_f16);
    assert_eq!(
        b.to_f16().unwrap(),
        vals.iter().map(|v| f16::from_f32(*v)).collect::<Vec<_>>()
    );
    let c = w.tensor("c").unwrap();
    let expect_bf16: Vec<f32> = vals.iter().map(|v| bf16::from_f32(*v).to_f32()).collect();
    assert_eq!(c.to_f32().unwrap(), expect_bf16);
    assert_eq!(
        c.to_f64().unwrap(),
        expect_bf16.iter().map(|&v| v as f64).collect::<Vec<_>>()
    );
    // f32 → bf16 on load rounds to nearest even, as torch's .to(torch.bfloat16) does.
    let a_bf16 = w.tensor("a").unwrap().to_bf16().unwrap();
    assert_eq!(
        a_bf16,
        vals.iter().map(|v| bf16::from_f32(*v)).collect::<Vec<_>>()
    );
    assert_eq!(w.tensor("ids").unwrap().to_i64().unwrap(), vec![3, -4, 5]);
    assert!(matches!(
        w.tensor("a").unwrap().to_i64(),
        Err(HubError::Conversion { .. })
    ));
    // Releasing pages never changes what a later read sees.
    w.release("a");
    assert_eq!(w.tensor("a").unwrap().to_f32().unwrap(), vals);
}

#[test]
fn missing_tensor_error_names_it_and_the_nearest_name() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.safetensors");
    write_safetensors(
        &path,
        &[(
            "model.embed_tokens.weight",
            StDtype::F32,
            vec![1],
            f32_bytes(&[1.0]),
        )],
    );
    let w = Weights::from_safetensors(&[path]).unwrap();
    let err = w.tensor("model.embed_tokens.bias").unwrap_err().to_string();
    assert!(err.contains("model.embed_tokens.bias"), "{err}");
    assert!(err.contains("\"model.embed_tokens.weight\""), "{err}");
    assert!(err.contains("m.safetensors"), "{err}");
}

#[test]
fn sharded_checkpoint_reads_every_shard() {
    let dir = tempfile::tempdir().unwrap();
    let names = write_sharded(dir.path(), 10, 3);
    let model = Pretrained::open(dir.path().to_str().unwrap()).unwrap();
    let ck = model.checkpoint().unwrap();
    assert_eq!(ck.files.len(), 3);
    assert!(ck.index.is_some());
    assert_eq!(ck.inventory.len(), 10);
    let w = Weights::open(ck.inventory).unwrap();
    for n in &names {
        let i: usize = n.split('.').nth(2).unwrap().parse().unwrap();
        let expect: Vec<f32> = (0..6).map(|k| (i * 10 + k) as f32).collect();
        assert_eq!(w.tensor(n).unwrap().to_f32().unwrap(), expect, "{n}");
    }
}

#[test]
fn shard_named_in_index_but_absent_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    write_sharded(dir.path(), 6, 3);
    std::fs::remove_file(dir.path().join("model-00002-of-00003.safetensors")).unwrap();
    let err = Pretrained::open(dir.path().to_str().unwrap())
        .unwrap()
        .checkpoint()
        .unwrap_err();
    assert!(matches!(err, HubError::Index { .. }), "{err}");
    let msg = err.to_string();
    assert!(msg.contains("model-00002-of-00003.safetensors"), "{msg}");
    assert!(msg.contains("model.safetensors.index.json"), "{msg}");
}

#[test]
fn index_placing_a_tensor_in_the_wrong_shard_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    write_sharded(dir.path(), 4, 2);
    let index_path = dir.path().join("model.safetensors.index.json");
    let mut index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&index_path).unwrap()).unwrap();
    index["weight_map"]["model.layers.0.w"] = "model-00002-of-00002.safetensors".into();
    std::fs::write(&index_path, serde_json::to_vec(&index).unwrap()).unwrap();
    let err = Pretrained::open(dir.path().to_str().unwrap())
        .unwrap()
        .checkpoint()
        .unwrap_err()
        .to_string();
    assert!(err.contains("model.layers.0.w"), "{err}");
}

#[test]
fn index_shard_outside_the_folder_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let index = serde_json::json!({"weight_map": {"w": "../secret.safetensors"}});
    let p = dir.path().join("model.safetensors.index.json");
    std::fs::write(&p, serde_json::to_vec(&index).unwrap()).unwrap();
    let err = zoo_hub::ShardIndex::from_file(&p).unwrap_err().to_string();
    assert!(err.contains("../secret.safetensors"), "{err}");
}

#[test]
fn duplicate_tensor_across_shards_is_an_error_naming_both_files() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.safetensors");
    let b = dir.path().join("b.safetensors");
    write_safetensors(&a, &[("w", StDtype::F32, vec![1], f32_bytes(&[1.0]))]);
    write_safetensors(&b, &[("w", StDtype::F32, vec![1], f32_bytes(&[2.0]))]);
    let err = Inventory::from_safetensors(&[a, b])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("a.safetensors") && err.contains("b.safetensors"),
        "{err}"
    );
}

#[test]
fn single_file_source_uses_sibling_config() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.safetensors");
    write_safetensors(
        &path,
        &[("w", StDtype::F32, vec![2], f32_bytes(&[1.0, 2.0]))],
    );
    std::fs::write(
        dir.path().join("config.json"),
        r#"{"architectures": ["BertModel"], "model_type": "bert", "hidden_size": 8}"#,
    )
    .unwrap();
    let model = Pretrained::open(path.to_str().unwrap()).unwrap();
    assert_eq!(model.checkpoint().unwrap().inventory.len(), 1);
    assert_eq!(model.config().unwrap().hidden_size, Some(8));
}

#[test]
fn folder_without_weights_says_what_was_looked_for() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("pytorch_model.bin"), b"x").unwrap();
    let err = Pretrained::open(dir.path().to_str().unwrap())
        .unwrap()
        .checkpoint()
        .unwrap_err()
        .to_string();
    assert!(err.contains("model.safetensors"), "{err}");
    assert!(err.contains("convert"), "{err}");
}

#[test]
fn streaming_load_equals_whole_conversion_across_chunks() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big.safetensors");
    // 3M bf16 values: several 4 MiB conversion chunks, not page aligned at the start.
    let n = 3_000_001usize;
    let vals: Vec<u8> = (0..n)
        .flat_map(|i| bf16::from_f32((i % 977) as f32 * 0.5 - 100.0).to_le_bytes())
        .collect();
    write_safetensors(
        &path,
        &[
            ("pad", StDtype::U8, vec![3], vec![1, 2, 3]),
            ("big", StDtype::BF16, vec![n], vals),
        ],
    );
    let w = Weights::from_safetensors(&[path]).unwrap();
    let whole = w.tensor("big").unwrap().to_f32().unwrap();
    let streamed = w.load_f32("big").unwrap();
    assert_eq!(whole.len(), n);
    assert_eq!(whole, streamed);
    assert_eq!(streamed[977 * 3 + 5], 5.0 * 0.5 - 100.0);
    assert_eq!(w.load_f32("pad").unwrap(), vec![1.0, 2.0, 3.0]);
    assert_eq!(w.load_bf16("big").unwrap().len(), n);
}
