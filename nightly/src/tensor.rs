//! Host-side tensors read from a case's safetensors files.
//!
//! The harness compares numbers, so it keeps only two element kinds: floats widened to
//! `f32` (bf16/f16 upcasts are exact) and integers widened to `i64`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use safetensors::{Dtype, SafeTensors};

/// Why a safetensors file could not be read into [`HostTensor`]s.
#[derive(Debug, thiserror::Error)]
pub enum TensorFileError {
    /// The file could not be read from disk.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The bytes are not a valid safetensors file.
    #[error("{path} is not a valid safetensors file: {source}")]
    Format {
        /// The file.
        path: PathBuf,
        /// What the safetensors crate found wrong.
        #[source]
        source: safetensors::SafeTensorError,
    },
    /// A tensor has an element type the harness does not compare.
    #[error(
        "{path}: tensor `{name}` has dtype {dtype:?}; cases may use F32, BF16, F16, I64 or I32"
    )]
    UnsupportedDtype {
        /// The file.
        path: PathBuf,
        /// The tensor.
        name: String,
        /// Its dtype in the header.
        dtype: Dtype,
    },
}

/// The elements of a [`HostTensor`].
#[derive(Debug, Clone, PartialEq)]
pub enum TensorData {
    /// Float elements (stored as F32, BF16 or F16), widened to f32.
    F32(Vec<f32>),
    /// Integer elements (stored as I64 or I32), widened to i64.
    I64(Vec<i64>),
}

/// A dense row-major tensor in host memory.
#[derive(Debug, Clone, PartialEq)]
pub struct HostTensor {
    /// Dimensions, outermost first.
    pub shape: Vec<usize>,
    /// The safetensors dtype it was stored as (`"F32"`, `"BF16"`, `"I64"`, ...).
    pub stored_dtype: String,
    /// The elements.
    pub data: TensorData,
}

impl HostTensor {
    /// A float tensor; `data.len()` must equal the product of `shape`.
    pub fn f32(shape: Vec<usize>, data: Vec<f32>) -> Self {
        debug_assert_eq!(shape.iter().product::<usize>(), data.len());
        Self {
            shape,
            stored_dtype: "F32".into(),
            data: TensorData::F32(data),
        }
    }

    /// An integer tensor; `data.len()` must equal the product of `shape`.
    pub fn i64(shape: Vec<usize>, data: Vec<i64>) -> Self {
        debug_assert_eq!(shape.iter().product::<usize>(), data.len());
        Self {
            shape,
            stored_dtype: "I64".into(),
            data: TensorData::I64(data),
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match &self.data {
            TensorData::F32(v) => v.len(),
            TensorData::I64(v) => v.len(),
        }
    }

    /// True when the tensor has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The float elements, or `None` for an integer tensor.
    pub fn as_f32(&self) -> Option<&[f32]> {
        match &self.data {
            TensorData::F32(v) => Some(v),
            TensorData::I64(_) => None,
        }
    }

    /// The integer elements, or `None` for a float tensor.
    pub fn as_i64(&self) -> Option<&[i64]> {
        match &self.data {
            TensorData::I64(v) => Some(v),
            TensorData::F32(_) => None,
        }
    }
}

/// All tensors of one safetensors file, by name.
pub type TensorSet = BTreeMap<String, HostTensor>;

/// Reads every tensor of a safetensors file, widening floats to f32 and ints to i64.
pub fn read_safetensors(path: &Path) -> Result<TensorSet, TensorFileError> {
    let bytes = std::fs::read(path).map_err(|source| TensorFileError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let file = SafeTensors::deserialize(&bytes).map_err(|source| TensorFileError::Format {
        path: path.to_path_buf(),
        source,
    })?;
    let mut set = TensorSet::new();
    for (name, view) in file.tensors() {
        let raw = view.data();
        let data = match view.dtype() {
            Dtype::F32 => TensorData::F32(le_chunks(raw, f32::from_le_bytes)),
            Dtype::BF16 => TensorData::F32(le_chunks(raw, |b: [u8; 2]| {
                half::bf16::from_le_bytes(b).to_f32()
            })),
            Dtype::F16 => TensorData::F32(le_chunks(raw, |b: [u8; 2]| {
                half::f16::from_le_bytes(b).to_f32()
            })),
            Dtype::I64 => TensorData::I64(le_chunks(raw, i64::from_le_bytes)),
            Dtype::I32 => TensorData::I64(le_chunks(raw, |b| i64::from(i32::from_le_bytes(b)))),
            other => {
                return Err(TensorFileError::UnsupportedDtype {
                    path: path.to_path_buf(),
                    name,
                    dtype: other,
                })
            }
        };
        let tensor = HostTensor {
            shape: view.shape().to_vec(),
            stored_dtype: format!("{:?}", view.dtype()),
            data,
        };
        set.insert(name, tensor);
    }
    Ok(set)
}

/// Decodes little-endian elements of N bytes; safetensors already checked the length.
fn le_chunks<const N: usize, T>(raw: &[u8], decode: impl Fn([u8; N]) -> T) -> Vec<T> {
    raw.chunks_exact(N)
        .map(|c| {
            let mut b = [0u8; N];
            b.copy_from_slice(c);
            decode(b)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use safetensors::tensor::TensorView;

    fn write(path: &Path, tensors: &[(&str, Dtype, Vec<usize>, Vec<u8>)]) {
        let views: Vec<(String, TensorView<'_>)> = tensors
            .iter()
            .map(|(n, d, s, b)| (n.to_string(), TensorView::new(*d, s.clone(), b).unwrap()))
            .collect();
        safetensors::serialize_to_file(views, None, path).unwrap();
    }

    #[test]
    fn widens_every_supported_dtype() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.safetensors");
        let bf16: Vec<u8> = [1.5f32, -2.0]
            .iter()
            .flat_map(|v| half::bf16::from_f32(*v).to_le_bytes())
            .collect();
        let f16: Vec<u8> = [0.25f32]
            .iter()
            .flat_map(|v| half::f16::from_f32(*v).to_le_bytes())
            .collect();
        let i32s: Vec<u8> = [-7i32, 9].iter().flat_map(|v| v.to_le_bytes()).collect();
        let f32s: Vec<u8> = [3.25f32].iter().flat_map(|v| v.to_le_bytes()).collect();
        write(
            &path,
            &[
                ("b", Dtype::BF16, vec![2], bf16),
                ("h", Dtype::F16, vec![1, 1], f16),
                ("i", Dtype::I32, vec![2], i32s),
                ("f", Dtype::F32, vec![1], f32s),
            ],
        );
        let set = read_safetensors(&path).unwrap();
        assert_eq!(set["b"].as_f32().unwrap(), &[1.5, -2.0]);
        assert_eq!(set["b"].stored_dtype, "BF16");
        assert_eq!(set["h"].shape, vec![1, 1]);
        assert_eq!(set["h"].as_f32().unwrap(), &[0.25]);
        assert_eq!(set["i"].as_i64().unwrap(), &[-7, 9]);
        assert_eq!(set["f"].as_f32().unwrap(), &[3.25]);
    }

    #[test]
    fn rejects_unsupported_dtype_and_garbage() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("u8.safetensors");
        write(&path, &[("bytes", Dtype::U8, vec![2], vec![1, 2])]);
        let err = read_safetensors(&path).unwrap_err();
        assert!(
            matches!(err, TensorFileError::UnsupportedDtype { ref name, .. } if name == "bytes")
        );

        let junk = dir.path().join("junk.safetensors");
        std::fs::write(&junk, b"not a safetensors file").unwrap();
        let err = read_safetensors(&junk).unwrap_err();
        assert!(matches!(err, TensorFileError::Format { .. }));
        assert!(err.to_string().contains("junk.safetensors"));

        let err = read_safetensors(&dir.path().join("missing.safetensors")).unwrap_err();
        assert!(matches!(err, TensorFileError::Io { .. }));
    }
}
