//! Dequantization of every supported element type, block for block, against gguf-py.
//!
//! `blocks.gguf` holds random bytes of each type (random finite scales);
//! `blocks_expected.gguf` holds, as F32 tensors of the same names, what
//! `gguf.quants.dequantize` returns for them (numpy from ggml's layout for Q8_1 and Q8_K, which
//! gguf-py lacks). Both are written by nightly/reference/gguf_blocks.py. zoo performs the same
//! f32 operations in the same order (no fused multiply-add), so the comparison is bit for bit.

use std::path::{Path, PathBuf};

use zoo_hub::gguf::{self, GgufFile};
use zoo_hub::{Dtype, Inventory, TensorInfo, Transform, Weights};

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/gguf")
        .join(name)
}

/// A `Weights` over every tensor of `f`, under its GGUF name.
fn weights(f: &GgufFile) -> Weights {
    let mut inv = Inventory::default();
    for t in &f.tensors {
        inv.push(TensorInfo {
            name: t.name.clone(),
            dtype: t.dtype,
            shape: t.hf_shape(),
            nbytes: t.nbytes,
            file: f.path.clone(),
            offset: t.offset,
            transform: Transform::None,
        })
        .unwrap();
    }
    Weights::open(inv).unwrap()
}

const TYPES: &[&str] = &[
    "F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K",
    "Q6_K", "Q8_K",
];

#[test]
fn every_type_matches_gguf_py_bit_for_bit() {
    let blocks = gguf::read(&data("blocks.gguf")).unwrap();
    let expected = gguf::read(&data("blocks_expected.gguf")).unwrap();
    let names: Vec<&str> = blocks.tensors.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, TYPES, "the fixture covers every type");
    let (w, e) = (weights(&blocks), weights(&expected));
    for t in &blocks.tensors {
        assert_eq!(
            t.dtype.name(),
            t.name,
            "tensor {} is stored as its type",
            t.name
        );
        assert_eq!(t.hf_shape(), vec![4, 512]);
        let got = w.tensor(&t.name).unwrap().to_f32().unwrap();
        let want = e.tensor(&t.name).unwrap().to_f32().unwrap();
        assert_eq!(got.len(), want.len());
        let mismatches: Vec<(usize, f32, f32)> = got
            .iter()
            .zip(&want)
            .enumerate()
            .filter(|(_, (g, w))| g.to_bits() != w.to_bits())
            .map(|(i, (g, w))| (i, *g, *w))
            .collect();
        assert!(
            mismatches.is_empty(),
            "{}: {} of {} values differ from gguf-py; first (index, zoo, gguf-py): {:?}",
            t.name,
            mismatches.len(),
            got.len(),
            &mismatches[..mismatches.len().min(5)]
        );
        // The fixture exercises more than zeros.
        assert!(
            got.iter().filter(|x| **x != 0.0).count() > got.len() / 2,
            "{}",
            t.name
        );
    }
}

#[test]
fn f16_and_bf16_reads_round_the_same_values() {
    // to_f16 / to_bf16 of a quantized tensor round its f32 dequantization.
    let blocks = gguf::read(&data("blocks.gguf")).unwrap();
    let w = weights(&blocks);
    let v = w.tensor("Q4_K").unwrap();
    assert_eq!(v.info.dtype, Dtype::Quantized(zoo_hub::GgmlType::Q4_K));
    let f = v.to_f32().unwrap();
    let h = v.to_f16().unwrap();
    let b = v.to_bf16().unwrap();
    for i in 0..f.len() {
        assert_eq!(h[i], half::f16::from_f32(f[i]));
        assert_eq!(b[i], half::bf16::from_f32(f[i]));
    }
}

#[test]
fn dequantize_refuses_mismatched_lengths() {
    use zoo_hub::GgmlType::*;
    for q in [
        Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K,
    ] {
        let (block, bytes) = q.block();
        let (block, bytes) = (block as usize, bytes as usize);
        assert_eq!(
            gguf::dequantize(q, &vec![0; 2 * bytes], 2 * block)
                .unwrap()
                .len(),
            2 * block
        );
        assert!(gguf::dequantize(q, &vec![0; 2 * bytes - 1], 2 * block).is_err());
        assert!(gguf::dequantize(q, &vec![0; 2 * bytes], 2 * block + 1).is_err());
        assert!(gguf::dequantize(q, &[], 0).unwrap().is_empty());
    }
}
