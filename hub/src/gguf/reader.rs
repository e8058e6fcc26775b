//! The GGUF container (versions 2 and 3, little-endian): header, metadata, tensor infos and the
//! data section's place, read from a memory map without touching tensor data.
//!
//! Layout: magic `GGUF`, u32 version, u64 tensor count, u64 metadata count, the metadata
//! key/value pairs, the tensor infos (name, u32 rank, u64 dims innermost first, u32 ggml type,
//! u64 offset relative to the data section), padding to `general.alignment`, then the data.
//! Every count and length comes from the file, so each is checked against the bytes that remain
//! before anything is allocated from it.

use std::collections::HashMap;
use std::fmt;
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use crate::dtype::{dtype_from_ggml_id, Dtype};
use crate::error::{io_err, HubError, Result};

/// The alignment of tensor data when the file does not set `general.alignment`.
pub const DEFAULT_ALIGNMENT: u64 = 32;

/// ggml's limit on tensor rank; llama.cpp refuses files with more dimensions.
const MAX_DIMS: u32 = 4;

/// Nested metadata arrays deeper than this are refused: nothing real nests more than twice, and
/// an unbounded depth would let a small file exhaust the stack.
const MAX_ARRAY_DEPTH: usize = 8;

/// One metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    String(String),
    Array(Array),
}

/// A metadata array: all items share one type. Items of type array may differ in their own
/// item type, hence `Array(Vec<Array>)`.
#[derive(Clone, Debug, PartialEq)]
pub enum Array {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F32(Vec<f32>),
    F64(Vec<f64>),
    Bool(Vec<bool>),
    String(Vec<String>),
    Array(Vec<Array>),
}

impl Array {
    /// Number of items.
    pub fn len(&self) -> usize {
        match self {
            Array::U8(v) => v.len(),
            Array::I8(v) => v.len(),
            Array::U16(v) => v.len(),
            Array::I16(v) => v.len(),
            Array::U32(v) => v.len(),
            Array::I32(v) => v.len(),
            Array::U64(v) => v.len(),
            Array::I64(v) => v.len(),
            Array::F32(v) => v.len(),
            Array::F64(v) => v.len(),
            Array::Bool(v) => v.len(),
            Array::String(v) => v.len(),
            Array::Array(v) => v.len(),
        }
    }

    /// Whether the array has no item.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The GGUF name of the item type (`"u32"`, `"string"`, ...).
    pub fn item_type(&self) -> &'static str {
        match self {
            Array::U8(_) => "u8",
            Array::I8(_) => "i8",
            Array::U16(_) => "u16",
            Array::I16(_) => "i16",
            Array::U32(_) => "u32",
            Array::I32(_) => "i32",
            Array::U64(_) => "u64",
            Array::I64(_) => "i64",
            Array::F32(_) => "f32",
            Array::F64(_) => "f64",
            Array::Bool(_) => "bool",
            Array::String(_) => "string",
            Array::Array(_) => "array",
        }
    }

    /// Item `i` as a [`Value`].
    pub fn get(&self, i: usize) -> Option<Value> {
        Some(match self {
            Array::U8(v) => Value::U8(*v.get(i)?),
            Array::I8(v) => Value::I8(*v.get(i)?),
            Array::U16(v) => Value::U16(*v.get(i)?),
            Array::I16(v) => Value::I16(*v.get(i)?),
            Array::U32(v) => Value::U32(*v.get(i)?),
            Array::I32(v) => Value::I32(*v.get(i)?),
            Array::U64(v) => Value::U64(*v.get(i)?),
            Array::I64(v) => Value::I64(*v.get(i)?),
            Array::F32(v) => Value::F32(*v.get(i)?),
            Array::F64(v) => Value::F64(*v.get(i)?),
            Array::Bool(v) => Value::Bool(*v.get(i)?),
            Array::String(v) => Value::String(v.get(i)?.clone()),
            Array::Array(v) => Value::Array(v.get(i)?.clone()),
        })
    }

    /// The items as JSON.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::Value::Array(
            (0..self.len())
                .filter_map(|i| self.get(i))
                .map(|v| v.to_json())
                .collect(),
        )
    }
}

impl Value {
    /// The GGUF name of the value type.
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::U8(_) => "u8",
            Value::I8(_) => "i8",
            Value::U16(_) => "u16",
            Value::I16(_) => "i16",
            Value::U32(_) => "u32",
            Value::I32(_) => "i32",
            Value::U64(_) => "u64",
            Value::I64(_) => "i64",
            Value::F32(_) => "f32",
            Value::F64(_) => "f64",
            Value::Bool(_) => "bool",
            Value::String(_) => "string",
            Value::Array(_) => "array",
        }
    }

    /// The value as an unsigned integer, if it is a non-negative integer of any width.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(x) => Some(x.into()),
            Value::U16(x) => Some(x.into()),
            Value::U32(x) => Some(x.into()),
            Value::U64(x) => Some(x),
            Value::I8(x) => u64::try_from(x).ok(),
            Value::I16(x) => u64::try_from(x).ok(),
            Value::I32(x) => u64::try_from(x).ok(),
            Value::I64(x) => u64::try_from(x).ok(),
            _ => None,
        }
    }

    /// The value as a signed integer, if it is an integer of any width that fits.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            Value::I8(x) => Some(x.into()),
            Value::I16(x) => Some(x.into()),
            Value::I32(x) => Some(x.into()),
            Value::I64(x) => Some(x),
            Value::U8(x) => Some(x.into()),
            Value::U16(x) => Some(x.into()),
            Value::U32(x) => Some(x.into()),
            Value::U64(x) => i64::try_from(x).ok(),
            _ => None,
        }
    }

    /// The value as a float, if it is a float or an integer.
    ///
    /// An f32 is widened through its shortest decimal form (`1e-5f32` gives `1e-5`, not
    /// `9.999999747378752e-6`): converters store the config's decimal value as f32, and the
    /// shortest decimal that rounds to the same f32 is that value.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(x) => Some(f32_to_f64_shortest(x)),
            Value::F64(x) => Some(x),
            _ => self.as_i64().map(|x| x as f64),
        }
    }

    /// The value as a string slice, if it is a string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    /// The value as a bool, if it is one.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }

    /// The value as an array, if it is one.
    pub fn as_array(&self) -> Option<&Array> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }

    /// The value as JSON (non-finite floats become `null`).
    pub fn to_json(&self) -> serde_json::Value {
        use serde_json::Value as J;
        match self {
            Value::Bool(b) => J::Bool(*b),
            Value::String(s) => J::String(s.clone()),
            Value::Array(a) => a.to_json(),
            Value::F32(_) | Value::F64(_) => self
                .as_f64()
                .and_then(serde_json::Number::from_f64)
                .map_or(J::Null, J::Number),
            Value::U64(x) => J::from(*x),
            other => other.as_i64().map_or(J::Null, J::from),
        }
    }
}

/// Widens an f32 through its shortest round-tripping decimal representation.
pub(crate) fn f32_to_f64_shortest(x: f32) -> f64 {
    if !x.is_finite() {
        return x as f64;
    }
    x.to_string().parse::<f64>().unwrap_or(x as f64)
}

impl fmt::Display for Value {
    /// Scalars as themselves, strings quoted, arrays shortened to their first items.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::String(s) => write!(f, "{s:?}"),
            Value::Array(a) => {
                const SHOWN: usize = 8;
                f.write_str("[")?;
                for i in 0..a.len().min(SHOWN) {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    if let Some(v) = a.get(i) {
                        write!(f, "{v}")?;
                    }
                }
                if a.len() > SHOWN {
                    write!(f, ", ... ({} {} items)", a.len(), a.item_type())?;
                }
                f.write_str("]")
            }
            other => match other.to_json() {
                serde_json::Value::Null => write!(f, "{other:?}"),
                j => write!(f, "{j}"),
            },
        }
    }
}

/// The metadata of a GGUF file: key/value pairs in file order, looked up by key.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Metadata {
    entries: Vec<(String, Value)>,
    index: HashMap<String, usize>,
}

impl Metadata {
    /// The value stored under `key`.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.index.get(key).map(|&i| &self.entries[i].1)
    }

    /// All pairs in file order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Value)> {
        self.entries.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// Number of pairs.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there is no pair.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// `key` as a string, if present and a string.
    pub fn get_str(&self, key: &str) -> Option<&str> {
        self.get(key).and_then(Value::as_str)
    }

    /// `key` as an unsigned integer, if present and one.
    pub fn get_u64(&self, key: &str) -> Option<u64> {
        self.get(key).and_then(Value::as_u64)
    }

    /// `key` as a float, if present and numeric.
    pub fn get_f64(&self, key: &str) -> Option<f64> {
        self.get(key).and_then(Value::as_f64)
    }

    /// `key` as a bool, if present and one.
    pub fn get_bool(&self, key: &str) -> Option<bool> {
        self.get(key).and_then(Value::as_bool)
    }

    /// `key` as an array, if present and one.
    pub fn get_array(&self, key: &str) -> Option<&Array> {
        self.get(key).and_then(Value::as_array)
    }

    fn insert(&mut self, key: String, value: Value) -> std::result::Result<(), String> {
        if self.index.contains_key(&key) {
            return Err(format!("metadata key {key:?} appears twice"));
        }
        self.index.insert(key.clone(), self.entries.len());
        self.entries.push((key, value));
        Ok(())
    }
}

/// One tensor as the file describes it (GGUF names and dimension order).
#[derive(Clone, Debug, PartialEq)]
pub struct GgufTensor {
    /// The name in the file (`blk.0.attn_q.weight`).
    pub name: String,
    /// The dimensions as GGUF stores them: innermost (contiguous) first, the reverse of HF.
    pub dims: Vec<u64>,
    /// The stored element type.
    pub dtype: Dtype,
    /// Absolute byte offset of the data in the file.
    pub offset: u64,
    /// Bytes of stored data.
    pub nbytes: u64,
}

impl GgufTensor {
    /// The shape in HF order (outermost first).
    pub fn hf_shape(&self) -> Vec<usize> {
        // `parse` checked that the element count fits in usize, so each dimension does too.
        self.dims.iter().rev().map(|&d| d as usize).collect()
    }

    /// Number of elements.
    pub fn numel(&self) -> u64 {
        self.dims.iter().product()
    }
}

/// A parsed GGUF header.
#[derive(Clone, Debug)]
pub struct GgufFile {
    /// The file read.
    pub path: PathBuf,
    /// Format version (2 or 3).
    pub version: u32,
    /// Alignment of tensor data in bytes.
    pub alignment: u64,
    /// Every metadata pair.
    pub metadata: Metadata,
    /// Every tensor, in file order.
    pub tensors: Vec<GgufTensor>,
    /// Absolute offset where the data section starts.
    pub data_offset: u64,
    /// Size of the file in bytes.
    pub file_size: u64,
}

/// Reads the header of the GGUF file at `path` through a memory map; tensor data is not read.
pub fn read(path: &Path) -> Result<GgufFile> {
    let file = File::open(path).map_err(io_err(path))?;
    // SAFETY: read-only map of a checkpoint zoo does not write; every access below is
    // bounds-checked against the map's length.
    let map = unsafe { Mmap::map(&file) }.map_err(io_err(path))?;
    parse(&map, path)
}

/// Parses a GGUF file held in `bytes` (the whole file); `path` names it in errors.
pub fn parse(bytes: &[u8], path: &Path) -> Result<GgufFile> {
    let err = |reason: String| HubError::Gguf {
        path: path.to_path_buf(),
        reason,
    };
    let mut r = Reader { bytes, pos: 0 };
    let magic = r
        .take(4)
        .map_err(|e| err(format!("{e} (reading the magic)")))?;
    if magic != b"GGUF" {
        return Err(err(format!(
            "the file starts with {magic:02x?}, not the GGUF magic \"GGUF\"; it is not a GGUF file"
        )));
    }
    let version = r
        .u32()
        .map_err(|e| err(format!("{e} (reading the version)")))?;
    match version {
        2 | 3 => {}
        1 => {
            return Err(err(
                "GGUF version 1 (32-bit counts) is obsolete; convert the model again with a current llama.cpp".into(),
            ))
        }
        v if v.swap_bytes() == 2 || v.swap_bytes() == 3 => {
            return Err(err(
                "the file is big-endian GGUF; zoo reads little-endian files only".into(),
            ))
        }
        v => return Err(err(format!("unsupported GGUF version {v} (zoo reads versions 2 and 3)"))),
    }
    let n_tensors = r
        .u64()
        .map_err(|e| err(format!("{e} (reading the tensor count)")))?;
    let n_kv = r
        .u64()
        .map_err(|e| err(format!("{e} (reading the metadata count)")))?;
    // A pair takes at least 8 (key length) + 4 (type) + 1 bytes; a tensor info at least 8 + 4 + 4 + 8.
    r.check_count(n_kv, 13)
        .map_err(|e| err(format!("metadata count {n_kv}: {e}")))?;
    r.check_count(n_tensors, 24)
        .map_err(|e| err(format!("tensor count {n_tensors}: {e}")))?;

    let mut metadata = Metadata::default();
    for i in 0..n_kv {
        let key = r
            .string()
            .map_err(|e| err(format!("metadata pair {i}: key: {e}")))?;
        let value = r
            .value(0)
            .map_err(|e| err(format!("metadata {key:?}: {e}")))?;
        metadata.insert(key, value).map_err(err)?;
    }

    let alignment = match metadata.get("general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some(Value::U32(a)) if *a != 0 && a.is_power_of_two() => u64::from(*a),
        Some(v) => {
            return Err(err(format!(
                "general.alignment is {v} ({}); it must be a u32 power of two",
                v.type_name()
            )))
        }
    };

    struct Raw {
        name: String,
        dims: Vec<u64>,
        type_id: u32,
        rel_offset: u64,
    }
    let mut raw = Vec::new();
    for i in 0..n_tensors {
        let name = r
            .string()
            .map_err(|e| err(format!("tensor info {i}: name: {e}")))?;
        let ctx = |e: String| err(format!("tensor {name:?}: {e}"));
        let n_dims = r
            .u32()
            .map_err(|e| ctx(format!("{e} (reading the rank)")))?;
        if n_dims > MAX_DIMS {
            return Err(ctx(format!(
                "rank {n_dims} exceeds ggml's maximum of {MAX_DIMS}"
            )));
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            dims.push(
                r.u64()
                    .map_err(|e| ctx(format!("{e} (reading the dimensions)")))?,
            );
        }
        let type_id = r
            .u32()
            .map_err(|e| ctx(format!("{e} (reading the type)")))?;
        let rel_offset = r
            .u64()
            .map_err(|e| ctx(format!("{e} (reading the offset)")))?;
        raw.push(Raw {
            name,
            dims,
            type_id,
            rel_offset,
        });
    }

    let file_size = bytes.len() as u64;
    let data_offset = (r.pos as u64).div_ceil(alignment) * alignment;
    if data_offset > file_size && !raw.is_empty() {
        return Err(err(format!(
            "the data section would start at byte {data_offset}, past the end of the file ({file_size} bytes); the file is truncated"
        )));
    }

    let mut tensors = Vec::with_capacity(raw.len());
    let mut seen = HashMap::new();
    for t in raw {
        let ctx = |e: String| err(format!("tensor {:?}: {e}", t.name));
        if seen.insert(t.name.clone(), ()).is_some() {
            return Err(ctx("the name appears twice".into()));
        }
        let dtype = dtype_from_ggml_id(t.type_id).ok_or_else(|| {
            ctx(format!(
                "type {} (id {}) is not supported; zoo reads F32, F16, BF16, F64, I8-I64, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1 and Q2_K-Q8_K; requantize the file to one of those (llama-quantize)",
                ggml_type_name(t.type_id),
                t.type_id
            ))
        })?;
        let numel = t
            .dims
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
            .filter(|&n| usize::try_from(n).is_ok())
            .ok_or_else(|| {
                ctx(format!(
                    "dimensions {:?} overflow the element count",
                    t.dims
                ))
            })?;
        if let Dtype::Quantized(q) = dtype {
            // Blocks run along the innermost dimension and never straddle two rows.
            let (block, _) = q.block();
            let inner = t.dims.first().copied().unwrap_or(1);
            if !inner.is_multiple_of(block) {
                return Err(ctx(format!(
                    "its innermost dimension {inner} is not a multiple of the {} block size {block}",
                    q.name()
                )));
            }
        }
        let nbytes = dtype.storage_bytes(numel).ok_or_else(|| {
            ctx(format!(
                "{numel} elements of {dtype} overflow the byte count"
            ))
        })?;
        if !t.rel_offset.is_multiple_of(alignment) {
            return Err(ctx(format!(
                "data offset {} is not a multiple of the alignment {alignment}",
                t.rel_offset
            )));
        }
        let offset = data_offset
            .checked_add(t.rel_offset)
            .filter(|o| o.checked_add(nbytes).is_some_and(|end| end <= file_size))
            .ok_or_else(|| {
                ctx(format!(
                    "its data ({nbytes} bytes at offset {} of the data section, which starts at byte {data_offset}) lies past the end of the file ({file_size} bytes); the file is truncated or corrupt",
                    t.rel_offset
                ))
            })?;
        tensors.push(GgufTensor {
            name: t.name,
            dims: t.dims,
            dtype,
            offset,
            nbytes,
        });
    }

    Ok(GgufFile {
        path: path.to_path_buf(),
        version,
        alignment,
        metadata,
        tensors,
        data_offset,
        file_size,
    })
}

/// The ggml name of a tensor type id, including the types zoo does not read.
pub fn ggml_type_name(id: u32) -> String {
    let name = match id {
        0 => "F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        4 => "Q4_2 (removed from ggml)",
        5 => "Q4_3 (removed from ggml)",
        6 => "Q5_0",
        7 => "Q5_1",
        8 => "Q8_0",
        9 => "Q8_1",
        10 => "Q2_K",
        11 => "Q3_K",
        12 => "Q4_K",
        13 => "Q5_K",
        14 => "Q6_K",
        15 => "Q8_K",
        16 => "IQ2_XXS",
        17 => "IQ2_XS",
        18 => "IQ3_XXS",
        19 => "IQ1_S",
        20 => "IQ4_NL",
        21 => "IQ3_S",
        22 => "IQ2_S",
        23 => "IQ4_XS",
        24 => "I8",
        25 => "I16",
        26 => "I32",
        27 => "I64",
        28 => "F64",
        29 => "IQ1_M",
        30 => "BF16",
        34 => "TQ1_0",
        35 => "TQ2_0",
        39 => "MXFP4",
        _ => return format!("unknown type {id}"),
    };
    name.to_string()
}

/// A bounds-checked little-endian cursor; every failure is a message for `HubError::Gguf`.
struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

type R<T> = std::result::Result<T, String>;

impl<'a> Reader<'a> {
    fn remaining(&self) -> usize {
        self.bytes.len() - self.pos
    }

    fn take(&mut self, n: usize) -> R<&'a [u8]> {
        if n > self.remaining() {
            return Err(format!(
                "the file ends at byte {} but {n} more bytes are needed at byte {}; the file is truncated",
                self.bytes.len(),
                self.pos
            ));
        }
        let s = &self.bytes[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self) -> R<[u8; N]> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }

    fn u32(&mut self) -> R<u32> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    fn u64(&mut self) -> R<u64> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    /// Refuses a count whose items, at `min_size` bytes each, cannot fit in what remains.
    fn check_count(&self, count: u64, min_size: u64) -> R<usize> {
        match count.checked_mul(min_size) {
            Some(need) if need <= self.remaining() as u64 => Ok(count as usize),
            _ => Err(format!(
                "{count} items of at least {min_size} bytes cannot fit in the {} bytes left after byte {}; the file is corrupt",
                self.remaining(),
                self.pos
            )),
        }
    }

    fn string(&mut self) -> R<String> {
        let len = self.u64()?;
        let len = self
            .check_count(len, 1)
            .map_err(|e| format!("string length {len}: {e}"))?;
        let raw = self.take(len)?;
        String::from_utf8(raw.to_vec())
            .map_err(|e| format!("string at byte {} is not valid UTF-8 ({e})", self.pos - len))
    }

    fn value(&mut self, depth: usize) -> R<Value> {
        let ty = self.u32()?;
        self.value_of(ty, depth)
    }

    fn value_of(&mut self, ty: u32, depth: usize) -> R<Value> {
        Ok(match ty {
            0 => Value::U8(u8::from_le_bytes(self.array()?)),
            1 => Value::I8(i8::from_le_bytes(self.array()?)),
            2 => Value::U16(u16::from_le_bytes(self.array()?)),
            3 => Value::I16(i16::from_le_bytes(self.array()?)),
            4 => Value::U32(self.u32()?),
            5 => Value::I32(i32::from_le_bytes(self.array()?)),
            6 => Value::F32(f32::from_le_bytes(self.array()?)),
            7 => Value::Bool(self.bool()?),
            8 => Value::String(self.string()?),
            9 => Value::Array(self.array_value(depth)?),
            10 => Value::U64(self.u64()?),
            11 => Value::I64(i64::from_le_bytes(self.array()?)),
            12 => Value::F64(f64::from_le_bytes(self.array()?)),
            other => return Err(unknown_value_type(other, self.pos)),
        })
    }

    fn bool(&mut self) -> R<bool> {
        match self.array::<1>()?[0] {
            0 => Ok(false),
            1 => Ok(true),
            b => Err(format!("bool at byte {} is {b}, not 0 or 1", self.pos - 1)),
        }
    }

    fn array_value(&mut self, depth: usize) -> R<Array> {
        if depth >= MAX_ARRAY_DEPTH {
            return Err(format!(
                "arrays nested deeper than {MAX_ARRAY_DEPTH} levels at byte {}",
                self.pos
            ));
        }
        let ty = self.u32()?;
        let count = self.u64()?;
        let min_size = match ty {
            0 | 1 | 7 => 1,
            2 | 3 => 2,
            4..=6 => 4,
            8 | 10..=12 => 8,
            9 => 12,
            other => return Err(unknown_value_type(other, self.pos - 12)),
        };
        let n = self
            .check_count(count, min_size)
            .map_err(|e| format!("array of {count} items: {e}"))?;
        macro_rules! items {
            ($variant:ident, $read:expr) => {{
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push($read);
                }
                Array::$variant(v)
            }};
        }
        Ok(match ty {
            0 => Array::U8(self.take(n)?.to_vec()),
            1 => Array::I8(self.take(n)?.iter().map(|&b| b as i8).collect()),
            2 => items!(U16, u16::from_le_bytes(self.array()?)),
            3 => items!(I16, i16::from_le_bytes(self.array()?)),
            4 => items!(U32, self.u32()?),
            5 => items!(I32, i32::from_le_bytes(self.array()?)),
            6 => items!(F32, f32::from_le_bytes(self.array()?)),
            7 => items!(Bool, self.bool()?),
            8 => items!(String, self.string()?),
            9 => items!(Array, self.array_value(depth + 1)?),
            10 => items!(U64, self.u64()?),
            11 => items!(I64, i64::from_le_bytes(self.array()?)),
            _ => items!(F64, f64::from_le_bytes(self.array()?)),
        })
    }
}

fn unknown_value_type(ty: u32, pos: usize) -> String {
    format!(
        "unknown metadata value type {ty} before byte {pos} (GGUF defines 0-12); the file is corrupt or from a newer GGUF version"
    )
}
