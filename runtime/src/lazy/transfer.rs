//! Moving values: uploads from the host (with shared one-element scalars), downloads, and
//! copies between devices and plugins.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::exec::{bump, materialize};
use super::graph::{Dims, Node, NodeOp, State, Value};
use super::plugins::{device, devices, lock, pjrt_err};
use super::shard;
use super::LazyTensor;
use crate::error::BackendContext;
use crate::pjrt::{self, Buffer, Client, ElementType, PjrtError};
use crate::{DType, Error, PjrtDevice, Result};

// ----- transfers -----

/// Index tensors up to this many elements keep a host copy for range checks.
const HOST_INTS_MAX: usize = 4096;

/// Uploads a candle tensor (any candle device) to `d` as a leaf of API dtype `dtype` (on a
/// mesh, whole on every device).
pub(crate) fn upload(t: &candle_core::Tensor, dtype: DType, d: PjrtDevice) -> Result<LazyTensor> {
    upload_sharded(t, dtype, d, 0)
}

/// Uploads a candle tensor to mesh device `d`, each device receiving its tile of `sharding`
/// (a `super::shard` id; 0 replicates).
pub(crate) fn upload_sharded(
    t: &candle_core::Tensor,
    dtype: DType,
    d: PjrtDevice,
    sharding: u32,
) -> Result<LazyTensor> {
    let op = "to_device";
    let (b, devs) = devices(op, d)?;
    let shape: Vec<usize> = t.dims().to_vec();
    if sharding != 0 {
        return upload_tiles(t, dtype, d, &devs, sharding, &b.client);
    }
    let t = t
        .to_device(&candle_core::Device::Cpu)
        .and_then(|t| t.flatten_all())
        .op(op)?;
    let dims: Vec<i64> = shape.iter().map(|&v| v as i64).collect();
    let host_ints = if dtype.is_int() && t.elem_count() <= HOST_INTS_MAX {
        let v = t
            .to_dtype(candle_core::DType::I64)
            .and_then(|t| t.to_vec1::<i64>())
            .op(op)?;
        Some(Arc::<[i64]>::from(v))
    } else {
        None
    };
    // One-element uploads (the -inf of a mask fill, a position) repeat every step of a
    // decode loop; buffers are immutable, so equal ones share one device buffer.
    let memo_key = if t.elem_count() == 1 {
        Some((
            d,
            dtype,
            Dims::from(shape.as_slice()),
            scalar_bits(&t, dtype, op)?,
        ))
    } else {
        None
    };
    if let Some(k) = &memo_key {
        let hit = lock(&SCALARS).as_ref().and_then(|m| m.get(k).cloned());
        if let Some(buf) = hit {
            return Ok(leaf(buf, Dims::from(shape), dtype, d, 0, host_ints));
        }
    }
    let started = Instant::now();
    // Converted on the host once; a mesh's other devices get device copies of the first.
    let first = put(&b.client, &t, dtype, &dims, &devs[0]).map_err(|e| pjrt_err(op, d, e))?;
    let mut bufs = vec![first];
    for dev in &devs[1..] {
        let copy = bufs[0]
            .copy_to_device(dev)
            .map_err(|e| pjrt_err(op, d, e))?;
        bufs.push(copy);
    }
    bump(9, started.elapsed().as_nanos() as u64);
    let buf: Value = Arc::from(bufs);
    if let Some(k) = memo_key {
        let mut guard = lock(&SCALARS);
        let m = guard.get_or_insert_with(HashMap::new);
        if m.len() >= SCALARS_MAX {
            m.clear();
        }
        m.insert(k, buf.clone());
    }
    Ok(leaf(buf, Dims::from(shape), dtype, d, 0, host_ints))
}

/// One buffer on `dev` holding the flat host tensor `t` as `dims`.
fn put(
    c: &Client,
    t: &candle_core::Tensor,
    dtype: DType,
    dims: &[i64],
    dev: &pjrt::Device,
) -> std::result::Result<Buffer, PjrtError> {
    let op = "to_device";
    let host = |e: candle_core::Error| PjrtError::InvalidArgument(format!("{op}: {e}"));
    match dtype {
        DType::F32 => c.buffer_from_slice(&t.to_vec1::<f32>().map_err(host)?, dims, dev),
        DType::F16 => c.buffer_from_slice(&t.to_vec1::<half::f16>().map_err(host)?, dims, dev),
        DType::BF16 => c.buffer_from_slice(&t.to_vec1::<half::bf16>().map_err(host)?, dims, dev),
        DType::F64 => c.buffer_from_slice(&t.to_vec1::<f64>().map_err(host)?, dims, dev),
        DType::I64 => c.buffer_from_slice(&t.to_vec1::<i64>().map_err(host)?, dims, dev),
        DType::I32 => c.buffer_from_slice(&t.to_vec1::<i32>().map_err(host)?, dims, dev),
        DType::U8 => c.buffer_from_slice(&t.to_vec1::<u8>().map_err(host)?, dims, dev),
        DType::Bool => c.buffer_from_bytes(
            &t.to_vec1::<u8>().map_err(host)?,
            ElementType::Pred,
            dims,
            dev,
        ),
    }
}

/// Uploads each mesh device's tile of `t` (cut on the host, one tile at a time).
fn upload_tiles(
    t: &candle_core::Tensor,
    dtype: DType,
    d: PjrtDevice,
    devs: &[pjrt::Device],
    sharding: u32,
    c: &Client,
) -> Result<LazyTensor> {
    let op = "to_device";
    let shape: Vec<usize> = t.dims().to_vec();
    let t = t.to_device(&candle_core::Device::Cpu).op(op)?;
    upload_tiles_with(&shape, dtype, d, devs, sharding, c, |origin, tile| {
        let mut part = t.clone();
        for (dim, (&o, &n)) in origin.iter().zip(tile).enumerate() {
            if n != shape[dim] {
                part = part.narrow(dim, o, n).op(op)?;
            }
        }
        Ok(part)
    })
}

/// Uploads to mesh device `d` the tensor of `shape` whose tile at `origin` of `tile` shape
/// `read` gives as a host tensor: each device is sent its tile as soon as it is read, a tile
/// two devices share is read once and copied between them.
pub(crate) fn upload_tiles_with(
    shape: &[usize],
    dtype: DType,
    d: PjrtDevice,
    devs: &[pjrt::Device],
    sharding: u32,
    c: &Client,
    mut read: impl FnMut(&[usize], &[usize]) -> Result<candle_core::Tensor>,
) -> Result<LazyTensor> {
    let op = "to_device";
    let mesh = shard::mesh_of(op, d)?;
    let s = shard::get(sharding).ok_or_else(|| Error::InvalidArgument {
        op,
        msg: format!("unknown sharding {sharding} (internal error)"),
    })?;
    let tile = s
        .tile_shape(&mesh, shape)
        .map_err(|e| Error::InvalidArgument {
            op,
            msg: e.to_string(),
        })?;
    let dims: Vec<i64> = tile.iter().map(|&v| v as i64).collect();
    let started = Instant::now();
    let mut bufs: Vec<Buffer> = Vec::with_capacity(devs.len());
    let mut read_at: HashMap<Vec<usize>, usize> = HashMap::new();
    for (i, dev) in devs.iter().enumerate() {
        let origin = s.tile_origin(&mesh, i, &tile);
        let buf = match read_at.get(&origin) {
            Some(&first) => bufs[first].copy_to_device(dev),
            None => {
                let part = read(&origin, &tile)?;
                if part.dims() != tile.as_slice() {
                    return Err(Error::InvalidArgument {
                        op,
                        msg: format!(
                            "a tile of shape {:?} was read where {tile:?} was asked (internal error)",
                            part.dims()
                        ),
                    });
                }
                let flat = part.flatten_all().op(op)?;
                read_at.insert(origin, i);
                put(c, &flat, dtype, &dims, dev)
            }
        }
        .map_err(|e| pjrt_err(op, d, e))?;
        bufs.push(buf);
    }
    bump(9, started.elapsed().as_nanos() as u64);
    Ok(leaf(
        Arc::from(bufs),
        Dims::from(shape.to_vec()),
        dtype,
        d,
        sharding,
        None,
    ))
}

type ScalarKey = (PjrtDevice, DType, Dims, u64);
pub(super) static SCALARS: Mutex<Option<HashMap<ScalarKey, Value>>> = Mutex::new(None);
const SCALARS_MAX: usize = 4096;

/// The shared buffer of a one-element float upload of `value` (rounded to `dtype`) already
/// made, as a new leaf; `None` when there is none yet (then the caller uploads, which shares
/// it). Mask fills repeat such scalars for every layer of every step: this finds them
/// without building and reading back a host tensor first.
pub(crate) fn shared_scalar(
    value: f64,
    shape: &[usize],
    dtype: DType,
    d: PjrtDevice,
) -> Option<LazyTensor> {
    use crate::Element;
    // A NaN's payload may not survive the f64 round trip: those take the upload path.
    if value.is_nan() {
        return None;
    }
    let bits = match dtype {
        DType::F32 => u64::from(f32::from_f64(value).to_bits()),
        DType::F16 => u64::from(half::f16::from_f64(value).to_bits()),
        DType::BF16 => u64::from(half::bf16::from_f64(value).to_bits()),
        DType::F64 => value.to_bits(),
        _ => return None,
    };
    let key = (d, dtype, Dims::from(shape), bits);
    let buf = lock(&SCALARS).as_ref()?.get(&key).cloned()?;
    Some(leaf(buf, key.2, dtype, d, 0, None))
}

/// The bit pattern of the single element of `t` (exact for every dtype, unlike an f64).
fn scalar_bits(t: &candle_core::Tensor, dtype: DType, op: &'static str) -> Result<u64> {
    let first = |t: &candle_core::Tensor| t.flatten_all().and_then(|t| t.get(0));
    let e = first(t).op(op)?;
    Ok(match dtype {
        DType::F32 => u64::from(e.to_scalar::<f32>().op(op)?.to_bits()),
        DType::F16 => u64::from(e.to_scalar::<half::f16>().op(op)?.to_bits()),
        DType::BF16 => u64::from(e.to_scalar::<half::bf16>().op(op)?.to_bits()),
        DType::F64 => e.to_scalar::<f64>().op(op)?.to_bits(),
        DType::I64 => e.to_scalar::<i64>().op(op)? as u64,
        DType::I32 => e.to_scalar::<i32>().op(op)? as u32 as u64,
        DType::U8 | DType::Bool => u64::from(e.to_scalar::<u8>().op(op)?),
    })
}

pub(super) fn leaf(
    buf: Value,
    shape: Dims,
    dtype: DType,
    d: PjrtDevice,
    sharding: u32,
    host_ints: Option<Arc<[i64]>>,
) -> LazyTensor {
    LazyTensor::new(super::graph::new_node(
        NodeOp::Leaf,
        shape,
        dtype,
        d,
        sharding,
        State::Ready(buf),
        host_ints,
    ))
}

/// The value of `t` as a CPU candle tensor (bool as u8 0/1), materialising it first.
pub(crate) fn download(t: &LazyTensor, op: &'static str) -> Result<candle_core::Tensor> {
    let n = &t.node;
    let bufs = ready_buffer(n, op)?;
    let cpu = candle_core::Device::Cpu;
    let s: &[usize] = &n.shape;
    let started = Instant::now();
    let read = Read { n, bufs: &bufs, op };
    let ct = match n.dtype {
        DType::F32 => candle_core::Tensor::from_vec(read.values::<f32>()?, s, &cpu),
        DType::F16 => candle_core::Tensor::from_vec(read.values::<half::f16>()?, s, &cpu),
        DType::BF16 => candle_core::Tensor::from_vec(read.values::<half::bf16>()?, s, &cpu),
        DType::F64 => candle_core::Tensor::from_vec(read.values::<f64>()?, s, &cpu),
        DType::I64 => candle_core::Tensor::from_vec(read.values::<i64>()?, s, &cpu),
        DType::I32 => candle_core::Tensor::from_vec(read.values::<i32>()?, s, &cpu),
        DType::U8 => candle_core::Tensor::from_vec(read.values::<u8>()?, s, &cpu),
        DType::Bool => {
            let bytes: Vec<u8> = read.bools()?;
            candle_core::Tensor::from_vec(bytes, s, &cpu)
        }
    };
    bump(9, started.elapsed().as_nanos() as u64);
    ct.op(op)
}

/// Reads a computed value to the host: a tile per device, put back together.
struct Read<'a> {
    n: &'a Node,
    bufs: &'a Value,
    op: &'static str,
}

impl Read<'_> {
    fn err(&self, e: PjrtError) -> Error {
        pjrt_err(self.op, self.n.device, e)
    }

    /// The values of every tile, in the mesh's device order (one when replicated).
    fn tiles<T>(
        &self,
        read: impl Fn(&Buffer) -> std::result::Result<Vec<T>, PjrtError>,
    ) -> Result<Vec<Vec<T>>> {
        let wanted = if self.n.sharding == 0 {
            1
        } else {
            self.bufs.len()
        };
        self.bufs[..wanted]
            .iter()
            .map(|b| read(b).map_err(|e| self.err(e)))
            .collect()
    }

    fn assemble<T: Copy + Default>(&self, mut tiles: Vec<Vec<T>>) -> Result<Vec<T>> {
        let Some(s) = shard::get(self.n.sharding) else {
            return Ok(tiles.pop().unwrap_or_default());
        };
        let mesh = shard::mesh_of(self.op, self.n.device)?;
        s.assemble(&mesh, &tiles, &self.n.shape)
            .map_err(|e| Error::InvalidArgument {
                op: self.op,
                msg: e.to_string(),
            })
    }

    fn values<T: crate::pjrt::NativeType + Copy + Default>(&self) -> Result<Vec<T>> {
        self.assemble(self.tiles(|b| b.to_vec::<T>())?)
    }

    /// A bool value as 0/1 bytes.
    fn bools(&self) -> Result<Vec<u8>> {
        let tiles = self.tiles(|b| {
            b.to_host_bytes()
                .map(|v| v.into_iter().map(|b| u8::from(b != 0)).collect())
        })?;
        self.assemble(tiles)
    }
}

/// Copies `t` to another device of the same plugin (device to device), or through the
/// host to another plugin or onto or off a mesh (laid out whole on every device there).
pub(crate) fn copy_to(t: &LazyTensor, to: PjrtDevice) -> Result<LazyTensor> {
    let op = "to_device";
    let n = &t.node;
    if n.device.platform != to.platform || n.device.mesh.is_some() || to.mesh.is_some() {
        let host = download(t, op)?;
        return upload(&host, n.dtype, to);
    }
    let buf = ready_buffer(n, op)?;
    let (_, dev) = device(op, to)?;
    let started = Instant::now();
    let copied = buf[0]
        .copy_to_device(&dev)
        .map_err(|e| pjrt_err(op, to, e))?;
    bump(9, started.elapsed().as_nanos() as u64);
    Ok(leaf(
        Arc::from([copied]),
        n.shape.clone(),
        n.dtype,
        to,
        0,
        n.host_ints.clone(),
    ))
}

pub(super) fn ready_buffer(n: &Arc<Node>, op: &'static str) -> Result<Value> {
    if let Some(b) = n.buffer() {
        return Ok(b.clone());
    }
    materialize(std::slice::from_ref(n), op)?;
    n.buffer().cloned().ok_or_else(|| Error::InvalidArgument {
        op,
        msg: "the graph ran but did not produce this tensor (internal error)".into(),
    })
}
