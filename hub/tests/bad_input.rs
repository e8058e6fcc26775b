//! Broken files give typed errors naming the file (and tensor); nothing panics or reads out of
//! bounds.

mod common;

use std::path::Path;

use common::{f32_bytes, write_safetensors};
use safetensors::tensor::Dtype as StDtype;
use zoo_hub::{HubError, Inventory, PretrainedConfig, Weights};

/// A file made of an 8-byte header length, `header` and `data`.
fn raw_file(dir: &Path, name: &str, header: &str, data: &[u8]) -> std::path::PathBuf {
    let path = dir.join(name);
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend_from_slice(data);
    std::fs::write(&path, bytes).unwrap();
    path
}

fn err_of(path: &Path) -> String {
    let err = Inventory::from_safetensors(&[path.to_path_buf()]).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains(&path.display().to_string()),
        "error does not name the file: {msg}"
    );
    msg
}

#[test]
fn truncated_before_the_header_length() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("t.safetensors");
    std::fs::write(&p, [1u8, 2, 3]).unwrap();
    assert!(err_of(&p).contains("shorter than the 8-byte header length"));
}

#[test]
fn header_length_past_the_end_of_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("t.safetensors");
    let mut bytes = 1_000_000u64.to_le_bytes().to_vec();
    bytes.extend_from_slice(b"{}");
    std::fs::write(&p, bytes).unwrap();
    assert!(err_of(&p).contains("runs past the end of the file"));
}

#[test]
fn header_length_near_u64_max_does_not_overflow() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("t.safetensors");
    let mut bytes = u64::MAX.to_le_bytes().to_vec();
    bytes.extend_from_slice(b"{}");
    std::fs::write(&p, bytes).unwrap();
    assert!(err_of(&p).contains("runs past the end"));
}

#[test]
fn invalid_header_json() {
    let dir = tempfile::tempdir().unwrap();
    let p = raw_file(dir.path(), "t.safetensors", "{\"w\": [1, 2", &[]);
    assert!(err_of(&p).contains("not valid JSON"));
    let p = raw_file(dir.path(), "u.safetensors", "[1, 2]", &[]);
    assert!(err_of(&p).contains("not a JSON object"));
}

#[test]
fn unknown_dtype_names_the_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let h = r#"{"w":{"dtype":"F7","shape":[1],"data_offsets":[0,1]}}"#;
    let p = raw_file(dir.path(), "t.safetensors", h, &[0]);
    let msg = err_of(&p);
    assert!(msg.contains("\"w\"") && msg.contains("F7"), "{msg}");
}

#[test]
fn offsets_out_of_range() {
    let dir = tempfile::tempdir().unwrap();
    let h = r#"{"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}"#;
    let p = raw_file(dir.path(), "t.safetensors", h, &[0u8; 8]);
    let msg = err_of(&p);
    assert!(
        msg.contains("\"w\"") && msg.contains("past the end"),
        "{msg}"
    );
}

#[test]
fn offsets_reversed() {
    let dir = tempfile::tempdir().unwrap();
    let h = r#"{"w":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}}"#;
    let p = raw_file(dir.path(), "t.safetensors", h, &[0u8; 8]);
    assert!(err_of(&p).contains("end before they begin"));
}

#[test]
fn overlapping_offsets_name_both_tensors() {
    let dir = tempfile::tempdir().unwrap();
    let h = r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}"#;
    let p = raw_file(dir.path(), "t.safetensors", h, &[0u8; 12]);
    let msg = err_of(&p);
    assert!(
        msg.contains("overlaps") && msg.contains("\"a\"") && msg.contains("\"b\""),
        "{msg}"
    );
}

#[test]
fn byte_count_not_matching_dtype_times_shape() {
    let dir = tempfile::tempdir().unwrap();
    let h = r#"{"w":{"dtype":"BF16","shape":[3],"data_offsets":[0,8]}}"#;
    let p = raw_file(dir.path(), "t.safetensors", h, &[0u8; 8]);
    let msg = err_of(&p);
    assert!(
        msg.contains("holds 8 bytes") && msg.contains("needs 6"),
        "{msg}"
    );
}

#[test]
fn shape_overflow_is_caught() {
    let dir = tempfile::tempdir().unwrap();
    let h = r#"{"w":{"dtype":"F64","shape":[4294967296,4294967296,16],"data_offsets":[0,8]}}"#;
    let p = raw_file(dir.path(), "t.safetensors", h, &[0u8; 8]);
    assert!(err_of(&p).contains("overflows"));
}

#[test]
fn malformed_entries() {
    let dir = tempfile::tempdir().unwrap();
    for (i, h) in [
        r#"{"w":7}"#,
        r#"{"w":{"shape":[1],"data_offsets":[0,4]}}"#,
        r#"{"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}}"#,
        r#"{"w":{"dtype":"F32","shape":[1],"data_offsets":[0]}}"#,
        r#"{"w":{"dtype":"F32","shape":"1","data_offsets":[0,4]}}"#,
        r#"{"__metadata__": 5}"#,
    ]
    .iter()
    .enumerate()
    {
        let p = raw_file(dir.path(), &format!("m{i}.safetensors"), h, &[0u8; 4]);
        err_of(&p);
    }
}

#[test]
fn file_truncated_after_the_header_was_read() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("t.safetensors");
    write_safetensors(
        &p,
        &[("w", StDtype::F32, vec![4], f32_bytes(&[1.0, 2.0, 3.0, 4.0]))],
    );
    let inv = Inventory::from_safetensors(std::slice::from_ref(&p)).unwrap();
    let len = std::fs::metadata(&p).unwrap().len();
    let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
    f.set_len(len - 4).unwrap();
    let err = Weights::open(inv).unwrap_err();
    assert!(matches!(err, HubError::BadTensor { .. }), "{err}");
    assert!(err.to_string().contains("truncated"));
}

#[test]
fn invalid_config_json_names_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("config.json");
    std::fs::write(&p, "{\"hidden_size\": 12,").unwrap();
    let err = PretrainedConfig::from_file(&p).unwrap_err().to_string();
    assert!(err.contains("config.json"), "{err}");
    std::fs::write(&p, "{\"hidden_size\": \"twelve\"}").unwrap();
    let err = PretrainedConfig::from_file(&p).unwrap_err().to_string();
    assert!(
        err.contains("config.json") && err.contains("invalid type"),
        "{err}"
    );
}
