//! The GGUF container reader: every metadata value type on a file written by gguf-py's
//! `GGUFWriter` (nightly/reference/gguf_blocks.py), versions 2 and 3, and typed errors for
//! malformed files.

use std::path::{Path, PathBuf};

use zoo_hub::gguf::{self, Array, Value};
use zoo_hub::{Dtype, GgmlType, HubError, Weights};

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/gguf")
        .join(name)
}

fn parse(bytes: &[u8]) -> Result<gguf::GgufFile, Box<HubError>> {
    gguf::parse(bytes, Path::new("/x/test.gguf")).map_err(Box::new)
}

/// The reason of a `HubError::Gguf`, after checking that it names the file.
fn reason(r: Result<gguf::GgufFile, Box<HubError>>) -> String {
    match r.map_err(|e| *e) {
        Err(HubError::Gguf { path, reason }) => {
            assert_eq!(path, Path::new("/x/test.gguf"));
            reason
        }
        Err(other) => panic!("expected HubError::Gguf, got {other:?}"),
        Ok(f) => panic!("expected an error, parsed {} tensors", f.tensors.len()),
    }
}

fn assert_err(bytes: &[u8], want: &str) {
    let r = reason(parse(bytes));
    assert!(r.contains(want), "error {r:?} does not mention {want:?}");
}

#[test]
fn reads_every_metadata_type_written_by_gguf_py() {
    let f = gguf::read(&data("metadata.gguf")).unwrap();
    assert_eq!(f.version, 3);
    assert_eq!(f.alignment, 64);
    assert_eq!(f.data_offset % 64, 0);
    let md = &f.metadata;
    assert_eq!(md.get("t.u8"), Some(&Value::U8(200)));
    assert_eq!(md.get("t.i8"), Some(&Value::I8(-100)));
    assert_eq!(md.get("t.u16"), Some(&Value::U16(60000)));
    assert_eq!(md.get("t.i16"), Some(&Value::I16(-30000)));
    assert_eq!(md.get("t.u32"), Some(&Value::U32(4_000_000_000)));
    assert_eq!(md.get("t.i32"), Some(&Value::I32(-2_000_000_000)));
    assert_eq!(
        md.get("t.u64"),
        Some(&Value::U64(18_000_000_000_000_000_000))
    );
    assert_eq!(
        md.get("t.i64"),
        Some(&Value::I64(-9_000_000_000_000_000_000))
    );
    assert_eq!(md.get("t.f32"), Some(&Value::F32(1e-5)));
    // The f32 reads back as the decimal the writer was given, not its binary expansion.
    assert_eq!(md.get_f64("t.f32"), Some(1e-5));
    assert_eq!(md.get("t.f64"), Some(&Value::F64(-2.5e300)));
    assert_eq!(md.get("t.bool"), Some(&Value::Bool(true)));
    assert_eq!(
        md.get_str("t.string"),
        Some("h\u{e9}llo \u{1F600} <|im_start|>")
    );
    assert_eq!(md.get_array("t.arr_i32"), Some(&Array::I32(vec![1, -2, 3])));
    assert_eq!(
        md.get_array("t.arr_f32"),
        Some(&Array::F32(vec![0.5, -1.25]))
    );
    assert_eq!(
        md.get_array("t.arr_str"),
        Some(&Array::String(vec!["a".into(), "".into(), "\u{fc}".into()]))
    );
    assert_eq!(
        md.get_array("t.arr_bool"),
        Some(&Array::Bool(vec![true, false]))
    );
    assert_eq!(md.get_array("t.arr_u8"), Some(&Array::U8(vec![0, 255])));
    assert_eq!(
        md.get_array("t.nested"),
        Some(&Array::Array(vec![
            Array::String(vec!["x".into(), "y".into()]),
            Array::String(vec!["z".into()]),
        ]))
    );
    assert_eq!(md.get("general.alignment"), Some(&Value::U32(64)));
    assert_eq!(md.get_str("general.architecture"), Some("zoo-test"));
    // File order is kept.
    let keys: Vec<&str> = md.iter().map(|(k, _)| k).collect();
    assert_eq!(keys.first(), Some(&"general.architecture"));
    assert_eq!(keys.last(), Some(&"general.alignment"));
    assert_eq!(md.len(), 20);
    assert_eq!(
        md.get("t.nested").unwrap().to_json(),
        serde_json::json!([["x", "y"], ["z"]])
    );
    assert_eq!(
        md.get("t.arr_str").unwrap().to_string(),
        r#"["a", "", "ü"]"#
    );

    assert_eq!(f.tensors.len(), 1);
    let t = &f.tensors[0];
    assert_eq!(
        (t.name.as_str(), t.dtype, t.dims.as_slice()),
        ("t", Dtype::F32, &[8u64][..])
    );
    assert_eq!(t.offset, f.data_offset);
    assert_eq!(t.nbytes, 32);
}

#[test]
fn version_2_files_read_like_version_3() {
    let mut bytes = std::fs::read(data("metadata.gguf")).unwrap();
    bytes[4..8].copy_from_slice(&2u32.to_le_bytes());
    let f = parse(&bytes).unwrap();
    assert_eq!(f.version, 2);
    assert_eq!(f.metadata.len(), 20);
    assert_eq!(f.tensors.len(), 1);
}

#[test]
fn every_truncation_is_a_typed_error() {
    let bytes = std::fs::read(data("metadata.gguf")).unwrap();
    let t = &parse(&bytes).unwrap().tensors[0];
    // gguf-py pads the file after the last tensor; only that padding may go.
    let end = (t.offset + t.nbytes) as usize;
    assert!(parse(&bytes[..end]).is_ok());
    for len in 0..end {
        let r = reason(parse(&bytes[..len]));
        assert!(
            r.contains("truncated") || r.contains("cannot fit") || r.contains("magic"),
            "truncated to {len} bytes: {r}"
        );
    }
    assert!(parse(&bytes).is_ok());
}

#[test]
fn corrupted_bytes_never_panic() {
    // Every header byte set to values that stress counts, lengths and types; each parse must
    // end in Ok or a typed error.
    let bytes = std::fs::read(data("metadata.gguf")).unwrap();
    let header_end = parse(&bytes).unwrap().data_offset as usize;
    for i in 0..header_end {
        for v in [0x00, 0x01, 0x09, 0x0d, 0x7f, 0x80, 0xff] {
            let mut b = bytes.clone();
            b[i] = v;
            if let Err(e) = parse(&b) {
                assert!(matches!(*e, HubError::Gguf { .. }), "{e:?}");
            }
        }
    }
}

// A minimal GGUF writer for files gguf-py refuses to write.

fn s(x: &str) -> Vec<u8> {
    let mut v = (x.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(x.as_bytes());
    v
}

fn kv(key: &str, ty: u32, payload: &[u8]) -> Vec<u8> {
    let mut v = s(key);
    v.extend_from_slice(&ty.to_le_bytes());
    v.extend_from_slice(payload);
    v
}

fn tensor(name: &str, dims: &[u64], ty: u32, offset: u64) -> Vec<u8> {
    let mut v = s(name);
    v.extend_from_slice(&(dims.len() as u32).to_le_bytes());
    for d in dims {
        v.extend_from_slice(&d.to_le_bytes());
    }
    v.extend_from_slice(&ty.to_le_bytes());
    v.extend_from_slice(&offset.to_le_bytes());
    v
}

fn file(kvs: &[Vec<u8>], tensors: &[Vec<u8>], data: &[u8]) -> Vec<u8> {
    let mut v = b"GGUF".to_vec();
    v.extend_from_slice(&3u32.to_le_bytes());
    v.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    v.extend_from_slice(&(kvs.len() as u64).to_le_bytes());
    for x in kvs.iter().chain(tensors) {
        v.extend_from_slice(x);
    }
    while !v.len().is_multiple_of(32) {
        v.push(0);
    }
    v.extend_from_slice(data);
    v
}

#[test]
fn hand_built_file_reads_with_quantized_tensors() {
    // Q8_0 [2 rows x 32]: two blocks of 34 bytes, then an F32 [3] at offset 96.
    let mut d = vec![0u8; 128];
    d[0..2].copy_from_slice(&0x3c00u16.to_le_bytes()); // d = 1.0
    d[2] = 5;
    d[96..100].copy_from_slice(&1.5f32.to_le_bytes());
    let b = file(
        &[kv("general.architecture", 8, &s("x"))],
        &[tensor("q", &[32, 2], 8, 0), tensor("f", &[3], 0, 96)],
        &d,
    );
    let f = parse(&b).unwrap();
    assert_eq!(f.tensors[0].dtype, Dtype::Quantized(GgmlType::Q8_0));
    assert_eq!(f.tensors[0].hf_shape(), vec![2, 32]);
    assert_eq!(f.tensors[0].nbytes, 68);
    assert_eq!(f.tensors[1].offset, f.data_offset + 96);
}

#[test]
fn malformed_headers_are_typed_errors() {
    let arch = || kv("general.architecture", 8, &s("x"));
    let ok_tensor = || tensor("t", &[4], 0, 0);

    let mut b = file(&[arch()], &[], &[]);
    b[0] = b'X';
    assert_err(&b, "not a GGUF file");

    for (version, want) in [
        (1u32, "version 1"),
        (4, "unsupported GGUF version 4"),
        (3u32.swap_bytes(), "big-endian"),
    ] {
        let mut b = file(&[arch()], &[], &[]);
        b[4..8].copy_from_slice(&version.to_le_bytes());
        assert_err(&b, want);
    }

    // Counts far beyond the file: refused before any allocation.
    let mut b = file(&[arch()], &[], &[]);
    b[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
    assert_err(&b, "tensor count");
    let mut b = file(&[arch()], &[], &[]);
    b[16..24].copy_from_slice(&(1u64 << 40).to_le_bytes());
    assert_err(&b, "metadata count");
    // A key length far past the end.
    let mut bad_key = kv("k", 4, &7u32.to_le_bytes());
    bad_key[0..8].copy_from_slice(&(u64::MAX - 3).to_le_bytes());
    assert_err(&file(&[bad_key], &[], &[]), "string length");
    // An array count far past the end.
    let mut arr = 4u32.to_le_bytes().to_vec();
    arr.extend_from_slice(&(1u64 << 60).to_le_bytes());
    assert_err(
        &file(&[kv("a", 9, &arr)], &[], &[]),
        "array of 1152921504606846976 items",
    );

    assert_err(
        &file(&[kv("k", 13, &[0; 8])], &[], &[]),
        "unknown metadata value type 13",
    );
    let mut arr = 99u32.to_le_bytes().to_vec();
    arr.extend_from_slice(&1u64.to_le_bytes());
    assert_err(
        &file(&[kv("k", 9, &arr)], &[], &[]),
        "unknown metadata value type 99",
    );
    assert_err(&file(&[kv("k", 7, &[2])], &[], &[]), "not 0 or 1");
    assert_err(
        &file(&[kv("k", 8, &[1, 0, 0, 0, 0, 0, 0, 0, 0xff])], &[], &[]),
        "UTF-8",
    );
    assert_err(
        &file(&[kv("k", 4, &[0; 4]), kv("k", 4, &[0; 4])], &[], &[]),
        "\"k\" appears twice",
    );

    // Arrays nested past the depth limit.
    let mut nested = Vec::new();
    for _ in 0..20 {
        nested.extend_from_slice(&9u32.to_le_bytes());
        nested.extend_from_slice(&1u64.to_le_bytes());
    }
    nested.extend_from_slice(&0u32.to_le_bytes());
    nested.extend_from_slice(&0u64.to_le_bytes());
    assert_err(&file(&[kv("k", 9, &nested)], &[], &[]), "nested deeper");

    for (alignment, want) in [
        (
            kv("general.alignment", 4, &0u32.to_le_bytes()),
            "power of two",
        ),
        (
            kv("general.alignment", 4, &48u32.to_le_bytes()),
            "power of two",
        ),
        (
            kv("general.alignment", 10, &64u64.to_le_bytes()),
            "u32 power of two",
        ),
    ] {
        assert_err(&file(&[alignment], &[ok_tensor()], &[0; 16]), want);
    }

    let d = [0u8; 64];
    assert_err(
        &file(&[], &[tensor("t", &[4], 16, 0)], &d),
        "IQ2_XXS (id 16) is not supported",
    );
    assert_err(
        &file(&[], &[tensor("t", &[4], 77, 0)], &d),
        "unknown type 77",
    );
    assert_err(
        &file(&[], &[tensor("t", &[4], 0, 8)], &d),
        "not a multiple of the alignment 32",
    );
    assert_err(
        &file(&[], &[tensor("t", &[4], 0, 64)], &d),
        "past the end of the file",
    );
    assert_err(
        &file(&[], &[tensor("t", &[100], 0, 0)], &d),
        "past the end of the file",
    );
    assert_err(
        &file(&[], &[tensor("t", &[4], 0, u64::MAX - 31)], &d),
        "past the end of the file",
    );
    assert_err(
        &file(&[], &[tensor("t", &[1, 1, 1, 1, 1], 0, 0)], &d),
        "rank 5",
    );
    assert_err(
        &file(&[], &[tensor("t", &[1 << 32, 1 << 32, 16], 0, 0)], &d),
        "overflow",
    );
    assert_err(
        &file(&[], &[tensor("t", &[16, 2], 8, 0)], &d),
        "not a multiple of the Q8_0 block size 32",
    );
    assert_err(
        &file(
            &[],
            &[tensor("t", &[4], 0, 0), tensor("t", &[4], 0, 32)],
            &d,
        ),
        "appears twice",
    );
    // A data section that would start past the end.
    let b = file(&[], &[ok_tensor()], &[]);
    assert_err(&b[..b.len() - 4], "truncated");
}

#[test]
fn read_names_the_file_on_io_errors() {
    let missing = data("no-such-file.gguf");
    match gguf::read(&missing) {
        Err(HubError::Io { path, .. }) => assert_eq!(path, missing),
        other => panic!("{other:?}"),
    }
}

#[test]
fn tensors_read_through_weights() {
    let f = gguf::read(&data("metadata.gguf")).unwrap();
    let mut inv = zoo_hub::Inventory::default();
    let t = &f.tensors[0];
    inv.push(zoo_hub::TensorInfo {
        name: t.name.clone(),
        dtype: t.dtype,
        shape: t.hf_shape(),
        nbytes: t.nbytes,
        file: f.path.clone(),
        offset: t.offset,
        transform: zoo_hub::Transform::None,
    })
    .unwrap();
    let w = Weights::open(inv).unwrap();
    assert_eq!(
        w.tensor("t").unwrap().to_f32().unwrap(),
        (0..8).map(|x| x as f32).collect::<Vec<_>>()
    );
}

#[test]
fn an_empty_file_is_a_gguf_error() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("empty.gguf");
    std::fs::write(&p, b"").unwrap();
    match gguf::read(&p) {
        Err(HubError::Gguf { path, reason }) => {
            assert_eq!(path, p);
            assert!(reason.contains("truncated"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
}
