//! Memory-mapped access to a checkpoint's tensor bytes, and conversion to the asked dtype on load.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use half::{bf16, f16};
use memmap2::Mmap;

use crate::dtype::Dtype;
use crate::error::{io_err, HubError, Result};
use crate::inventory::{Inventory, TensorInfo, Transform};

/// A checkpoint opened for reading: its inventory plus one read-only memory map per file.
///
/// Opening maps the files and reads nothing; each [`Weights::tensor`] is a zero-copy view.
pub struct Weights {
    inventory: Inventory,
    maps: HashMap<PathBuf, Mmap>,
}

impl std::fmt::Debug for Weights {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Weights")
            .field("files", &self.inventory.files())
            .field("tensors", &self.inventory.len())
            .finish()
    }
}

impl Weights {
    /// Maps every file of `inventory`. A file that shrank since its header was read is refused.
    pub fn open(inventory: Inventory) -> Result<Weights> {
        let mut maps = HashMap::new();
        for path in inventory.files() {
            let file = File::open(path).map_err(io_err(path))?;
            // SAFETY: the map is read-only; zoo never writes checkpoint files while they are
            // open, and every read below is bounds-checked against the map's length.
            let map = unsafe { Mmap::map(&file) }.map_err(io_err(path))?;
            maps.insert(path.clone(), map);
        }
        for t in inventory.tensors() {
            let len = maps.get(&t.file).map_or(0, |m| m.len() as u64);
            if t.offset.checked_add(t.nbytes).is_none_or(|end| end > len) {
                return Err(HubError::BadTensor {
                    path: t.file.clone(),
                    tensor: t.name.clone(),
                    reason: format!(
                        "its data (offset {}, {} bytes) lies past the end of the file ({len} bytes); the file was truncated",
                        t.offset, t.nbytes
                    ),
                });
            }
        }
        Ok(Weights { inventory, maps })
    }

    /// Opens safetensors files (every shard of a checkpoint) in one step.
    pub fn from_safetensors(files: &[PathBuf]) -> Result<Weights> {
        Weights::open(Inventory::from_safetensors(files)?)
    }

    /// The inventory.
    pub fn inventory(&self) -> &Inventory {
        &self.inventory
    }

    /// A zero-copy view of the tensor called `name`.
    pub fn tensor(&self, name: &str) -> Result<TensorView<'_>> {
        let info = self.inventory.require(name)?;
        Ok(self.view(info))
    }

    /// A view of a tensor taken from this checkpoint's inventory.
    pub fn view<'a>(&'a self, info: &'a TensorInfo) -> TensorView<'a> {
        // `open` checked every range, and the inventory is immutable since.
        let map = &self.maps[&info.file];
        let start = info.offset as usize;
        TensorView {
            info,
            data: &map[start..start + info.nbytes as usize],
        }
    }

    /// Tells the OS that the pages of `name` are no longer needed, so that a model that copies
    /// its weights into its own buffers does not keep the mapped file resident as well.
    pub fn release(&self, name: &str) {
        if let Some(info) = self.inventory.get(name) {
            self.release_range(info, info.nbytes);
        }
    }

    /// Reads `name` as f32 and drops its mapped pages as it goes, so that loading a model keeps
    /// about one copy of the weights resident (the converted one) rather than two.
    pub fn load_f32(&self, name: &str) -> Result<Vec<f32>> {
        let info = self.inventory.require(name)?;
        let view = self.view(info);
        if matches!(info.dtype, Dtype::Quantized(_)) || info.transform != Transform::None {
            let v = view.to_f32();
            self.release(name);
            return v;
        }
        let size = info.dtype.plain_size() as usize;
        // Chunks of whole elements, about 4 MiB, released behind the conversion.
        let chunk = (4 << 20) / size * size;
        let mut out = Vec::with_capacity(info.numel());
        let mut done = 0usize;
        for piece in view.data.chunks(chunk) {
            extend_f32(info.dtype, piece, &mut out);
            done += piece.len();
            self.release_range(info, done as u64);
        }
        self.release(name);
        Ok(out)
    }

    /// Reads `name` as f16, dropping its mapped pages afterwards (see [`Weights::load_f32`]).
    pub fn load_f16(&self, name: &str) -> Result<Vec<f16>> {
        let v = self.tensor(name)?.to_f16();
        self.release(name);
        v
    }

    /// Reads `name` as bf16, dropping its mapped pages afterwards (see [`Weights::load_f32`]).
    pub fn load_bf16(&self, name: &str) -> Result<Vec<bf16>> {
        let v = self.tensor(name)?.to_bf16();
        self.release(name);
        v
    }

    /// Drops the whole pages of the first `upto` bytes of `info`'s data.
    fn release_range(&self, info: &TensorInfo, upto: u64) {
        let Some(map) = self.maps.get(&info.file) else {
            return;
        };
        let page = 4096u64;
        let start = info.offset.div_ceil(page) * page;
        let end = (info.offset + upto) / page * page;
        if end > start {
            // SAFETY: as in `release`: a read-only shared file mapping re-reads dropped pages.
            #[cfg(unix)]
            let _ = unsafe {
                map.unchecked_advise_range(
                    memmap2::UncheckedAdvice::DontNeed,
                    start as usize,
                    (end - start) as usize,
                )
            };
        }
    }

    /// The files behind this checkpoint.
    pub fn files(&self) -> Vec<&Path> {
        self.inventory
            .files()
            .iter()
            .map(PathBuf::as_path)
            .collect()
    }
}

/// The stored bytes of one tensor, with conversions to the common host element types.
#[derive(Clone, Copy, Debug)]
pub struct TensorView<'a> {
    pub info: &'a TensorInfo,
    pub data: &'a [u8],
}

macro_rules! le_chunks {
    ($data:expr, $n:literal, $t:ty) => {
        $data
            .chunks_exact($n)
            .map(|c| <$t>::from_le_bytes(c.try_into().expect("chunks_exact yields $n bytes")))
    };
}

impl TensorView<'_> {
    /// The values as f32, dequantizing or widening as needed.
    pub fn to_f32(&self) -> Result<Vec<f32>> {
        let v = match self.info.dtype {
            Dtype::Quantized(q) => crate::gguf::dequantize(q, self.data, self.info.numel())
                .map_err(|reason| HubError::BadTensor {
                    path: self.info.file.clone(),
                    tensor: self.info.name.clone(),
                    reason,
                })?,
            plain => {
                let mut v = Vec::with_capacity(self.info.numel());
                extend_f32(plain, self.data, &mut v);
                v
            }
        };
        if self.info.transform == Transform::MinusOne {
            return Ok(v.into_iter().map(|x| x - 1.0).collect());
        }
        Ok(self.untransform(v))
    }

    /// Whether the stored values need arithmetic on read, which only the f32 path does.
    fn shifted(&self) -> bool {
        self.info.transform == Transform::MinusOne
    }

    /// The values as f16 (a copy when stored as f16, a rounding conversion otherwise).
    pub fn to_f16(&self) -> Result<Vec<f16>> {
        if self.info.dtype == Dtype::F16 && !self.shifted() {
            let v = le_chunks!(self.data, 2, u16).map(f16::from_bits).collect();
            return Ok(self.untransform(v));
        }
        Ok(self.to_f32()?.into_iter().map(f16::from_f32).collect())
    }

    /// The values as bf16 (a copy when stored as bf16, a rounding conversion otherwise).
    pub fn to_bf16(&self) -> Result<Vec<bf16>> {
        if self.info.dtype == Dtype::BF16 && !self.shifted() {
            let v = le_chunks!(self.data, 2, u16).map(bf16::from_bits).collect();
            return Ok(self.untransform(v));
        }
        Ok(self.to_f32()?.into_iter().map(bf16::from_f32).collect())
    }

    /// The values as f64 (exact for every stored float and integer type up to 2^53).
    pub fn to_f64(&self) -> Result<Vec<f64>> {
        match self.info.dtype {
            Dtype::F64 if !self.shifted() => {
                Ok(self.untransform(le_chunks!(self.data, 8, f64).collect()))
            }
            Dtype::I64 => Ok(le_chunks!(self.data, 8, i64).map(|x| x as f64).collect()),
            _ => Ok(self.to_f32()?.into_iter().map(f64::from).collect()),
        }
    }

    /// The values as i64; floats are refused rather than truncated.
    pub fn to_i64(&self) -> Result<Vec<i64>> {
        let d = self.data;
        Ok(match self.info.dtype {
            Dtype::I64 => le_chunks!(d, 8, i64).collect(),
            Dtype::I32 => le_chunks!(d, 4, i32).map(i64::from).collect(),
            Dtype::I16 => le_chunks!(d, 2, i16).map(i64::from).collect(),
            Dtype::I8 => d.iter().map(|&b| b as i8 as i64).collect(),
            Dtype::U8 | Dtype::Bool => d.iter().map(|&b| b as i64).collect(),
            other => {
                return Err(HubError::Conversion {
                    tensor: self.info.name.clone(),
                    from: other.to_string(),
                    to: "I64".into(),
                })
            }
        })
    }

    /// The stored bytes with rows in HF order (the layout transform undone row by row, no
    /// conversion): the blocks of a quantized tensor as they are, for kernels that compute
    /// from them. Rows never share a block, since quantized rows hold whole blocks.
    pub fn row_bytes(&self) -> Vec<u8> {
        let rows = self.info.shape.first().copied().unwrap_or(1).max(1);
        match self.info.transform {
            Transform::None => self.data.to_vec(),
            Transform::UnpermuteQk { heads } if self.data.len().is_multiple_of(rows) => {
                let row_len = self.data.len() / rows;
                let chunks: Vec<&[u8]> = self.data.chunks_exact(row_len).collect();
                unpermute_qk(chunks, &[rows], heads).concat()
            }
            Transform::UnpermuteQk { .. } | Transform::MinusOne => self.data.to_vec(),
        }
    }

    /// The tile of `shape` at `origin` (HF indices) read from the stored bytes alone, as a
    /// tensor of its own: what one device of a mesh holds, without the whole tensor ever
    /// converted. `None` where the stored layout cannot be cut there (a quantized block or a
    /// permuted head split, a tile outside the tensor); the caller then reads it whole.
    pub fn tile(&self, origin: &[usize], shape: &[usize]) -> Option<Tile> {
        let full = &self.info.shape;
        let nd = full.len();
        if nd == 0
            || origin.len() != nd
            || shape.len() != nd
            || (0..nd).any(|d| origin[d].checked_add(shape[d]).is_none_or(|e| e > full[d]))
        {
            return None;
        }
        // Units: elements of a plain type, blocks of a quantized one (along the last dim).
        let (per, unit) = match self.info.dtype {
            Dtype::Quantized(q) => {
                let (e, b) = q.block();
                (e as usize, b as usize)
            }
            plain => (1, plain.plain_size() as usize),
        };
        let last = nd - 1;
        if [full[last], origin[last], shape[last]]
            .iter()
            .any(|v| v % per != 0)
        {
            return None;
        }
        let transform = match self.info.transform {
            Transform::UnpermuteQk { heads } if shape[0] != full[0] => {
                // Rows are permuted within each head: a cut between heads keeps whole ones.
                let rows = full[0]
                    .checked_div(heads)
                    .filter(|_| full[0].is_multiple_of(heads))?;
                if !origin[0].is_multiple_of(rows) || !shape[0].is_multiple_of(rows) {
                    return None;
                }
                Transform::UnpermuteQk {
                    heads: shape[0] / rows,
                }
            }
            t => t,
        };
        let units = |v: &[usize]| -> Vec<usize> {
            let mut u = v.to_vec();
            u[last] /= per;
            u
        };
        let (ufull, uorigin, ushape) = (units(full), units(origin), units(shape));
        if self.data.len() != ufull.iter().product::<usize>() * unit {
            return None;
        }
        let mut strides = vec![1usize; nd];
        for d in (0..last).rev() {
            strides[d] = strides[d + 1] * ufull[d + 1];
        }
        let run = ushape[last] * unit;
        let outer: usize = ushape[..last].iter().product();
        let mut data = Vec::with_capacity(outer * run);
        let mut at = vec![0usize; last];
        for _ in 0..outer {
            let start: usize = (0..nd)
                .map(|d| (uorigin[d] + at.get(d).copied().unwrap_or(0)) * strides[d])
                .sum::<usize>()
                * unit;
            data.extend_from_slice(&self.data[start..start + run]);
            // The next outer index, last of the outer dims fastest.
            for d in (0..last).rev() {
                at[d] += 1;
                if at[d] < ushape[d] {
                    break;
                }
                at[d] = 0;
            }
        }
        let info = TensorInfo {
            shape: shape.to_vec(),
            nbytes: data.len() as u64,
            transform,
            ..self.info.clone()
        };
        Some(Tile { info, data })
    }

    fn untransform<T: Copy>(&self, v: Vec<T>) -> Vec<T> {
        match self.info.transform {
            Transform::None | Transform::MinusOne => v,
            Transform::UnpermuteQk { heads } => unpermute_qk(v, &self.info.shape, heads),
        }
    }
}

/// A tile of a stored tensor with its own bytes (see [`TensorView::tile`]).
#[derive(Clone, Debug)]
pub struct Tile {
    info: TensorInfo,
    data: Vec<u8>,
}

impl Tile {
    /// The tile as a tensor view, with the same conversions as a whole tensor's.
    pub fn view(&self) -> TensorView<'_> {
        TensorView {
            info: &self.info,
            data: &self.data,
        }
    }
}

/// Appends the values of plain-typed little-endian `d` to `out` as f32.
fn extend_f32(dtype: Dtype, d: &[u8], out: &mut Vec<f32>) {
    match dtype {
        Dtype::F32 => out.extend(le_chunks!(d, 4, f32)),
        Dtype::F16 => out.extend(le_chunks!(d, 2, u16).map(|b| f16::from_bits(b).to_f32())),
        Dtype::BF16 => out.extend(le_chunks!(d, 2, u16).map(|b| bf16::from_bits(b).to_f32())),
        Dtype::F64 => out.extend(le_chunks!(d, 8, f64).map(|x| x as f32)),
        Dtype::F8E4M3 => out.extend(d.iter().map(|&b| f8e4m3_to_f32(b))),
        Dtype::F8E5M2 => out.extend(d.iter().map(|&b| f16::from_bits((b as u16) << 8).to_f32())),
        Dtype::Bool | Dtype::U8 => out.extend(d.iter().map(|&b| b as f32)),
        Dtype::I8 => out.extend(d.iter().map(|&b| b as i8 as f32)),
        Dtype::I16 => out.extend(le_chunks!(d, 2, i16).map(|x| x as f32)),
        Dtype::I32 => out.extend(le_chunks!(d, 4, i32).map(|x| x as f32)),
        Dtype::I64 => out.extend(le_chunks!(d, 8, i64).map(|x| x as f32)),
        // Quantized data is never split into plain chunks (see TensorView::to_f32).
        Dtype::Quantized(_) => {}
    }
}

/// Undoes llama.cpp's Q/K row order: within each head, GGUF stores the rows of the two rotary
/// halves interleaved (row 2i of the half-pair block is HF row i, row 2i+1 is HF row i + d/2).
fn unpermute_qk<T: Copy>(v: Vec<T>, shape: &[usize], heads: usize) -> Vec<T> {
    let rows = shape.first().copied().unwrap_or(0);
    if heads == 0 || rows == 0 || !rows.is_multiple_of(heads) || !(rows / heads).is_multiple_of(2) {
        return v;
    }
    let cols = v.len() / rows;
    let head_dim = rows / heads;
    let half = head_dim / 2;
    let mut out = Vec::with_capacity(v.len());
    for h in 0..heads {
        for r in 0..head_dim {
            // HF row r of head h sits at GGUF row 2*(r % half) + r / half.
            let src = h * head_dim + 2 * (r % half) + r / half;
            out.extend_from_slice(&v[src * cols..(src + 1) * cols]);
        }
    }
    out
}

/// Decodes one float8 e4m3fn byte (bias 7, no infinities, S.1111.111 is NaN).
fn f8e4m3_to_f32(b: u8) -> f32 {
    let sign = if b & 0x80 != 0 { -1.0 } else { 1.0 };
    let exp = ((b >> 3) & 0x0f) as i32;
    let man = (b & 0x07) as f32;
    if exp == 0x0f && b & 0x07 == 0x07 {
        return f32::NAN;
    }
    if exp == 0 {
        sign * man / 8.0 * 2f32.powi(-6)
    } else {
        sign * (1.0 + man / 8.0) * 2f32.powi(exp - 7)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::GgmlType;

    #[test]
    fn f8e4m3_known_values() {
        assert_eq!(f8e4m3_to_f32(0x00), 0.0);
        assert_eq!(f8e4m3_to_f32(0x38), 1.0); // exp 7, man 0
        assert_eq!(f8e4m3_to_f32(0x7e), 448.0); // the largest finite value
        assert_eq!(f8e4m3_to_f32(0xb8), -1.0);
        assert_eq!(f8e4m3_to_f32(0x01), 2f32.powi(-9)); // smallest subnormal
        assert!(f8e4m3_to_f32(0x7f).is_nan());
    }

    fn info(dtype: Dtype, shape: &[usize], transform: Transform, nbytes: usize) -> TensorInfo {
        TensorInfo {
            name: "w".into(),
            dtype,
            shape: shape.to_vec(),
            nbytes: nbytes as u64,
            file: "w.bin".into(),
            offset: 0,
            transform,
        }
    }

    /// The tile of the whole tensor's f32 values, cut on the host.
    fn cut(whole: &[f32], shape: &[usize], origin: &[usize], tile: &[usize]) -> Vec<f32> {
        let mut out = Vec::new();
        let n: usize = tile.iter().product();
        for flat in 0..n {
            let (mut rest, mut off, mut stride) = (flat, 0, 1);
            let mut idx = vec![0; shape.len()];
            for d in (0..shape.len()).rev() {
                idx[d] = rest % tile[d];
                rest /= tile[d];
            }
            for d in (0..shape.len()).rev() {
                off += (origin[d] + idx[d]) * stride;
                stride *= shape[d];
            }
            out.push(whole[off]);
        }
        out
    }

    #[test]
    fn tiles_read_from_the_stored_bytes_equal_the_whole_cut() {
        // Plain f32, a 3-D tile and one cut along the last dim.
        let shape = [3, 4, 5];
        let values: Vec<f32> = (0..60).map(|i| i as f32 * 0.5).collect();
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let i = info(Dtype::F32, &shape, Transform::None, bytes.len());
        let view = TensorView {
            info: &i,
            data: &bytes,
        };
        for (o, t) in [
            ([1, 2, 0], [2, 2, 5]),
            ([0, 0, 1], [3, 4, 3]),
            ([2, 3, 4], [1, 1, 1]),
        ] {
            let tile = view.tile(&o, &t).unwrap();
            assert_eq!(tile.view().to_f32().unwrap(), cut(&values, &shape, &o, &t));
            assert_eq!(tile.view().info.shape, t);
        }
        assert!(view.tile(&[2, 0, 0], &[2, 4, 5]).is_none());

        // Q8_0 (32 values a block): rows, and columns at block bounds; a cut inside a block
        // is refused.
        let shape = [4, 64];
        let mut q = Vec::new();
        for b in 0..8u8 {
            q.extend_from_slice(&half::f16::from_f32(0.25 + b as f32).to_bits().to_le_bytes());
            q.extend((0..32).map(|k| (k as i8 - 16 + b as i8) as u8));
        }
        let i = info(
            Dtype::Quantized(GgmlType::Q8_0),
            &shape,
            Transform::None,
            q.len(),
        );
        let view = TensorView { info: &i, data: &q };
        let whole = view.to_f32().unwrap();
        for (o, t) in [([2, 0], [2, 64]), ([0, 32], [4, 32])] {
            let tile = view.tile(&o, &t).unwrap();
            assert_eq!(tile.view().to_f32().unwrap(), cut(&whole, &shape, &o, &t));
        }
        assert!(view.tile(&[0, 16], &[4, 32]).is_none());

        // Llama.cpp's permuted Q rows (2 heads of 4 rows): a cut between heads undoes the
        // permutation of its own head; a cut inside a head is refused.
        let shape = [8, 3];
        let values: Vec<f32> = (0..24).map(|i| i as f32).collect();
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let i = info(
            Dtype::F32,
            &shape,
            Transform::UnpermuteQk { heads: 2 },
            bytes.len(),
        );
        let view = TensorView {
            info: &i,
            data: &bytes,
        };
        let whole = view.to_f32().unwrap();
        let tile = view.tile(&[4, 0], &[4, 3]).unwrap();
        assert_eq!(
            tile.view().to_f32().unwrap(),
            cut(&whole, &shape, &[4, 0], &[4, 3])
        );
        let tile = view.tile(&[0, 1], &[8, 2]).unwrap();
        assert_eq!(
            tile.view().to_f32().unwrap(),
            cut(&whole, &shape, &[0, 1], &[8, 2])
        );
        assert!(view.tile(&[2, 0], &[4, 3]).is_none());
    }

    #[test]
    fn unpermute_qk_restores_hf_row_order() {
        // One head of dim 4, 1 column: HF rows [a0, a1, b0, b1] are stored as [a0, b0, a1, b1].
        let stored = vec![10, 20, 11, 21];
        assert_eq!(unpermute_qk(stored, &[4, 1], 1), vec![10, 11, 20, 21]);
    }
}
