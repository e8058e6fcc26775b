//! Arbitrary bytes as a whole safetensors file: the header parser must return a typed error or a
//! header whose every tensor lies inside the file, never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::path::Path;

fuzz_target!(|data: &[u8]| {
    if data.len() < 8 {
        return;
    }
    let header_len = u64::from_le_bytes(data[..8].try_into().unwrap());
    let rest = &data[8..];
    if header_len > rest.len() as u64 {
        return;
    }
    let header = &rest[..header_len as usize];
    let file_len = data.len() as u64;
    if let Ok(h) =
        zoo_hub::safetensors::parse_header(Path::new("fuzz.safetensors"), header, file_len)
    {
        for t in &h.tensors {
            assert!(
                t.offset + t.nbytes <= file_len,
                "tensor {} out of bounds",
                t.name
            );
            assert_eq!(Some(t.nbytes), t.dtype.storage_bytes(t.numel() as u64));
        }
    }
});
