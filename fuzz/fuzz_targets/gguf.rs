//! Arbitrary bytes as a whole GGUF file: the reader, the HF mapping (names, config, tokenizer)
//! and dequantization must return typed errors or consistent results, never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::path::Path;
use zoo_hub::Dtype;

fuzz_target!(|data: &[u8]| {
    let Ok(file) = zoo_hub::gguf::parse(data, Path::new("fuzz.gguf")) else {
        return;
    };
    let len = data.len() as u64;
    assert!(file.alignment.is_power_of_two());
    for t in &file.tensors {
        assert!(
            t.offset + t.nbytes <= len,
            "tensor {} out of bounds",
            t.name
        );
        assert_eq!((t.offset - file.data_offset) % file.alignment, 0);
        assert_eq!(Some(t.nbytes), t.dtype.storage_bytes(t.numel()));
        if let Dtype::Quantized(q) = t.dtype {
            let bytes = &data[t.offset as usize..(t.offset + t.nbytes) as usize];
            let v = zoo_hub::gguf::dequantize(q, bytes, t.numel() as usize)
                .expect("a tensor that parsed dequantizes");
            assert_eq!(v.len() as u64, t.numel());
        }
    }
    for (_, v) in file.metadata.iter() {
        let _ = v.to_string();
        let _ = v.to_json();
    }
    if let Ok(ck) = zoo_hub::gguf::from_file(file) {
        for t in ck.inventory.tensors() {
            assert!(t.offset + t.nbytes <= len);
        }
    }
});
