//! The safetensors header: an 8-byte little-endian length, then a JSON object mapping tensor
//! names to `{dtype, shape, data_offsets}`. Parsed and validated here from the header alone, so
//! that no later read can go out of bounds.

use std::fs::File;
use std::io::Read;
use std::path::Path;

use serde_json::Value;

use crate::dtype::Dtype;
use crate::error::{io_err, HubError, Result};
use crate::inventory::{TensorInfo, Transform};

/// Headers larger than this are refused rather than allocated (the safetensors format caps them too).
pub const MAX_HEADER_BYTES: u64 = 100 * 1024 * 1024;

/// What one safetensors file holds, from its header.
#[derive(Clone, Debug)]
pub struct SafetensorsHeader {
    /// The tensors, in file order, with absolute byte offsets into the file.
    pub tensors: Vec<TensorInfo>,
    /// The free-form `__metadata__` map (e.g. `{"format": "pt"}`).
    pub metadata: serde_json::Map<String, Value>,
    /// Size of the whole file in bytes.
    pub file_len: u64,
}

/// Reads and validates the header of the safetensors file at `path`, touching no tensor data.
pub fn read_header(path: &Path) -> Result<SafetensorsHeader> {
    let mut file = File::open(path).map_err(io_err(path))?;
    let file_len = file.metadata().map_err(io_err(path))?.len();
    let bad = |reason: String| HubError::Safetensors {
        path: path.to_path_buf(),
        reason,
    };
    if file_len < 8 {
        return Err(bad(format!(
            "the file is {file_len} bytes, shorter than the 8-byte header length; it is truncated or not a safetensors file"
        )));
    }
    let mut len_bytes = [0u8; 8];
    file.read_exact(&mut len_bytes).map_err(io_err(path))?;
    let header_len = u64::from_le_bytes(len_bytes);
    if header_len > file_len - 8 {
        return Err(bad(format!(
            "the header length {header_len} runs past the end of the file ({file_len} bytes); the file is truncated or not a safetensors file"
        )));
    }
    if header_len > MAX_HEADER_BYTES {
        return Err(bad(format!(
            "the header length {header_len} exceeds the {MAX_HEADER_BYTES}-byte limit"
        )));
    }
    let mut header = vec![0u8; header_len as usize];
    file.read_exact(&mut header).map_err(io_err(path))?;
    parse_header(path, &header, file_len)
}

/// Validates header JSON bytes of a file of `file_len` bytes. Split out so the fuzzer reaches it
/// without a file system.
pub fn parse_header(path: &Path, header: &[u8], file_len: u64) -> Result<SafetensorsHeader> {
    let bad = |reason: String| HubError::Safetensors {
        path: path.to_path_buf(),
        reason,
    };
    let data_start = 8 + header.len() as u64;
    let data_len = file_len
        .checked_sub(data_start)
        .ok_or_else(|| bad("the header runs past the end of the file".into()))?;
    let json: Value = serde_json::from_slice(header)
        .map_err(|e| bad(format!("the header is not valid JSON: {e}")))?;
    let Value::Object(entries) = json else {
        return Err(bad("the header is not a JSON object".into()));
    };

    let mut metadata = serde_json::Map::new();
    let mut tensors = Vec::with_capacity(entries.len());
    for (name, entry) in entries {
        if name == "__metadata__" {
            match entry {
                Value::Object(m) => metadata = m,
                _ => return Err(bad("`__metadata__` is not a JSON object".into())),
            }
            continue;
        }
        let info = parse_entry(path, &name, &entry, data_start, data_len)?;
        tensors.push(info);
    }

    // Overlapping byte ranges would let two tensors alias each other's data.
    let mut by_offset: Vec<&TensorInfo> = tensors.iter().filter(|t| t.nbytes > 0).collect();
    by_offset.sort_by_key(|t| t.offset);
    for pair in by_offset.windows(2) {
        if pair[0].offset + pair[0].nbytes > pair[1].offset {
            return Err(HubError::BadTensor {
                path: path.to_path_buf(),
                tensor: pair[1].name.clone(),
                reason: format!(
                    "its data (bytes {}..{} of the data section) overlaps that of {:?} (bytes {}..{})",
                    pair[1].offset - data_start,
                    pair[1].offset - data_start + pair[1].nbytes,
                    pair[0].name,
                    pair[0].offset - data_start,
                    pair[0].offset - data_start + pair[0].nbytes,
                ),
            });
        }
    }
    tensors.sort_by_key(|t| t.offset);
    Ok(SafetensorsHeader {
        tensors,
        metadata,
        file_len,
    })
}

fn parse_entry(
    path: &Path,
    name: &str,
    entry: &Value,
    data_start: u64,
    data_len: u64,
) -> Result<TensorInfo> {
    let bad = |reason: String| HubError::BadTensor {
        path: path.to_path_buf(),
        tensor: name.to_string(),
        reason,
    };
    let obj = entry
        .as_object()
        .ok_or_else(|| bad("its entry is not a JSON object".into()))?;
    let dtype_str = obj
        .get("dtype")
        .and_then(Value::as_str)
        .ok_or_else(|| bad("`dtype` is missing or not a string".into()))?;
    let dtype = Dtype::from_safetensors(dtype_str).ok_or_else(|| {
        bad(format!(
            "unknown dtype {dtype_str:?} (known: BOOL U8 I8 I16 I32 I64 F16 BF16 F32 F64 F8_E4M3 F8_E5M2)"
        ))
    })?;
    let shape = obj
        .get("shape")
        .and_then(Value::as_array)
        .ok_or_else(|| bad("`shape` is missing or not an array".into()))?
        .iter()
        .map(|d| {
            d.as_u64()
                .and_then(|d| usize::try_from(d).ok())
                .ok_or_else(|| bad(format!("shape dimension {d} is not a non-negative integer")))
        })
        .collect::<Result<Vec<usize>>>()?;
    let offsets = obj
        .get("data_offsets")
        .and_then(Value::as_array)
        .filter(|a| a.len() == 2)
        .ok_or_else(|| bad("`data_offsets` is missing or not a [begin, end] pair".into()))?;
    let (begin, end) = match (offsets[0].as_u64(), offsets[1].as_u64()) {
        (Some(b), Some(e)) => (b, e),
        _ => return Err(bad("`data_offsets` are not non-negative integers".into())),
    };
    if end < begin {
        return Err(bad(format!(
            "data_offsets [{begin}, {end}] end before they begin"
        )));
    }
    if end > data_len {
        return Err(bad(format!(
            "data_offsets [{begin}, {end}] run past the end of the data section ({data_len} bytes); the file is truncated"
        )));
    }
    let n_elements = shape
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d as u64))
        .ok_or_else(|| bad(format!("shape {shape:?} overflows")))?;
    let expected = dtype
        .storage_bytes(n_elements)
        .ok_or_else(|| bad(format!("shape {shape:?} overflows")))?;
    if expected != end - begin {
        return Err(bad(format!(
            "holds {} bytes, but {dtype} × {shape:?} needs {expected}",
            end - begin
        )));
    }
    Ok(TensorInfo {
        name: name.to_string(),
        dtype,
        shape,
        nbytes: expected,
        file: path.to_path_buf(),
        offset: data_start + begin,
        transform: Transform::None,
    })
}
