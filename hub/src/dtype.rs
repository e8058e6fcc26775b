//! Element types found in checkpoints: every safetensors dtype HF uses, and llama.cpp's block-quantized types.

use std::fmt;

/// The element type of a stored tensor.
///
/// Plain types are stored one element after another, little-endian. [`Dtype::Quantized`] covers
/// GGUF's block formats, where a fixed number of elements share one block of bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dtype {
    Bool,
    U8,
    I8,
    I16,
    I32,
    I64,
    F16,
    BF16,
    F32,
    F64,
    F8E4M3,
    F8E5M2,
    Quantized(GgmlType),
}

impl Dtype {
    /// Parses a safetensors header dtype (`"F32"`, `"BF16"`, `"F8_E4M3"`, ...).
    pub fn from_safetensors(s: &str) -> Option<Dtype> {
        Some(match s {
            "BOOL" => Dtype::Bool,
            "U8" => Dtype::U8,
            "I8" => Dtype::I8,
            "I16" => Dtype::I16,
            "I32" => Dtype::I32,
            "I64" => Dtype::I64,
            "F16" => Dtype::F16,
            "BF16" => Dtype::BF16,
            "F32" => Dtype::F32,
            "F64" => Dtype::F64,
            "F8_E4M3" => Dtype::F8E4M3,
            "F8_E5M2" => Dtype::F8E5M2,
            _ => return None,
        })
    }

    /// The safetensors spelling of this dtype, or the GGML type name for quantized types.
    pub fn name(self) -> &'static str {
        match self {
            Dtype::Bool => "BOOL",
            Dtype::U8 => "U8",
            Dtype::I8 => "I8",
            Dtype::I16 => "I16",
            Dtype::I32 => "I32",
            Dtype::I64 => "I64",
            Dtype::F16 => "F16",
            Dtype::BF16 => "BF16",
            Dtype::F32 => "F32",
            Dtype::F64 => "F64",
            Dtype::F8E4M3 => "F8_E4M3",
            Dtype::F8E5M2 => "F8_E5M2",
            Dtype::Quantized(q) => q.name(),
        }
    }

    /// Whether values of this type are floating point (quantized types dequantize to floats).
    pub fn is_float(self) -> bool {
        matches!(
            self,
            Dtype::F16
                | Dtype::BF16
                | Dtype::F32
                | Dtype::F64
                | Dtype::F8E4M3
                | Dtype::F8E5M2
                | Dtype::Quantized(_)
        )
    }

    /// Bytes taken by `n_elements` values, or `None` when the count is not a whole number of
    /// blocks of a quantized type or overflows.
    pub fn storage_bytes(self, n_elements: u64) -> Option<u64> {
        match self {
            Dtype::Quantized(q) => {
                let (block, bytes) = q.block();
                if !n_elements.is_multiple_of(block) {
                    return None;
                }
                (n_elements / block).checked_mul(bytes)
            }
            plain => n_elements.checked_mul(plain.plain_size()),
        }
    }

    /// Bytes of one element of a plain type (0 for quantized types, whose size is per block).
    pub fn plain_size(self) -> u64 {
        match self {
            Dtype::Bool | Dtype::U8 | Dtype::I8 | Dtype::F8E4M3 | Dtype::F8E5M2 => 1,
            Dtype::I16 | Dtype::F16 | Dtype::BF16 => 2,
            Dtype::I32 | Dtype::F32 => 4,
            Dtype::I64 | Dtype::F64 => 8,
            Dtype::Quantized(_) => 0,
        }
    }
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// llama.cpp's block-quantized tensor types, with the numeric ids GGUF files store.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GgmlType {
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
    Q8_K,
}

impl GgmlType {
    /// (elements per block, bytes per block), as laid out by ggml.
    pub fn block(self) -> (u64, u64) {
        match self {
            GgmlType::Q4_0 => (32, 18),
            GgmlType::Q4_1 => (32, 20),
            GgmlType::Q5_0 => (32, 22),
            GgmlType::Q5_1 => (32, 24),
            GgmlType::Q8_0 => (32, 34),
            GgmlType::Q8_1 => (32, 36),
            GgmlType::Q2_K => (256, 84),
            GgmlType::Q3_K => (256, 110),
            GgmlType::Q4_K => (256, 144),
            GgmlType::Q5_K => (256, 176),
            GgmlType::Q6_K => (256, 210),
            GgmlType::Q8_K => (256, 292),
        }
    }

    /// The ggml name (`"Q4_K"`).
    pub fn name(self) -> &'static str {
        match self {
            GgmlType::Q4_0 => "Q4_0",
            GgmlType::Q4_1 => "Q4_1",
            GgmlType::Q5_0 => "Q5_0",
            GgmlType::Q5_1 => "Q5_1",
            GgmlType::Q8_0 => "Q8_0",
            GgmlType::Q8_1 => "Q8_1",
            GgmlType::Q2_K => "Q2_K",
            GgmlType::Q3_K => "Q3_K",
            GgmlType::Q4_K => "Q4_K",
            GgmlType::Q5_K => "Q5_K",
            GgmlType::Q6_K => "Q6_K",
            GgmlType::Q8_K => "Q8_K",
        }
    }
}

/// GGUF's numeric tensor type id mapped to a [`Dtype`], or `None` for types zoo does not read.
pub fn dtype_from_ggml_id(id: u32) -> Option<Dtype> {
    Some(match id {
        0 => Dtype::F32,
        1 => Dtype::F16,
        2 => Dtype::Quantized(GgmlType::Q4_0),
        3 => Dtype::Quantized(GgmlType::Q4_1),
        6 => Dtype::Quantized(GgmlType::Q5_0),
        7 => Dtype::Quantized(GgmlType::Q5_1),
        8 => Dtype::Quantized(GgmlType::Q8_0),
        9 => Dtype::Quantized(GgmlType::Q8_1),
        10 => Dtype::Quantized(GgmlType::Q2_K),
        11 => Dtype::Quantized(GgmlType::Q3_K),
        12 => Dtype::Quantized(GgmlType::Q4_K),
        13 => Dtype::Quantized(GgmlType::Q5_K),
        14 => Dtype::Quantized(GgmlType::Q6_K),
        15 => Dtype::Quantized(GgmlType::Q8_K),
        24 => Dtype::I8,
        25 => Dtype::I16,
        26 => Dtype::I32,
        27 => Dtype::I64,
        28 => Dtype::F64,
        30 => Dtype::BF16,
        _ => return None,
    })
}
