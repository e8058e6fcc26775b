//! Moving values: uploads from the host (with shared one-element scalars), downloads, and
//! copies between devices and plugins.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::exec::{bump, materialize};
use super::graph::{Dims, Node, NodeOp, State};
use super::plugins::{device, lock, pjrt_err};
use super::LazyTensor;
use crate::error::BackendContext;
use crate::pjrt::{Buffer, ElementType, PjrtError};
use crate::{DType, Error, PjrtDevice, Result};

// ----- transfers -----

/// Index tensors up to this many elements keep a host copy for range checks.
const HOST_INTS_MAX: usize = 4096;

/// Uploads a candle tensor (any candle device) to `d` as a leaf of API dtype `dtype`.
pub(crate) fn upload(t: &candle_core::Tensor, dtype: DType, d: PjrtDevice) -> Result<LazyTensor> {
    let op = "to_device";
    let (b, dev) = device(op, d)?;
    let shape: Vec<usize> = t.dims().to_vec();
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
            return Ok(leaf(buf, Dims::from(shape), dtype, d, host_ints));
        }
    }
    let c = &b.client;
    let started = Instant::now();
    let buf = match dtype {
        DType::F32 => c.buffer_from_slice(&t.to_vec1::<f32>().op(op)?, &dims, &dev),
        DType::F16 => c.buffer_from_slice(&t.to_vec1::<half::f16>().op(op)?, &dims, &dev),
        DType::BF16 => c.buffer_from_slice(&t.to_vec1::<half::bf16>().op(op)?, &dims, &dev),
        DType::F64 => c.buffer_from_slice(&t.to_vec1::<f64>().op(op)?, &dims, &dev),
        DType::I64 => c.buffer_from_slice(&t.to_vec1::<i64>().op(op)?, &dims, &dev),
        DType::I32 => c.buffer_from_slice(&t.to_vec1::<i32>().op(op)?, &dims, &dev),
        DType::U8 => c.buffer_from_slice(&t.to_vec1::<u8>().op(op)?, &dims, &dev),
        DType::Bool => {
            c.buffer_from_bytes(&t.to_vec1::<u8>().op(op)?, ElementType::Pred, &dims, &dev)
        }
    }
    .map_err(|e| pjrt_err(op, d, e))?;
    bump(9, started.elapsed().as_nanos() as u64);
    let buf = Arc::new(buf);
    if let Some(k) = memo_key {
        let mut guard = lock(&SCALARS);
        let m = guard.get_or_insert_with(HashMap::new);
        if m.len() >= SCALARS_MAX {
            m.clear();
        }
        m.insert(k, buf.clone());
    }
    Ok(leaf(buf, Dims::from(shape), dtype, d, host_ints))
}

type ScalarKey = (PjrtDevice, DType, Dims, u64);
pub(super) static SCALARS: Mutex<Option<HashMap<ScalarKey, Arc<Buffer>>>> = Mutex::new(None);
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
    Some(leaf(buf, key.2, dtype, d, None))
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
    buf: Arc<Buffer>,
    shape: Dims,
    dtype: DType,
    d: PjrtDevice,
    host_ints: Option<Arc<[i64]>>,
) -> LazyTensor {
    LazyTensor::new(super::graph::new_node(
        NodeOp::Leaf,
        shape,
        dtype,
        d,
        State::Ready(buf),
        host_ints,
    ))
}

/// The value of `t` as a CPU candle tensor (bool as u8 0/1), materialising it first.
pub(crate) fn download(t: &LazyTensor, op: &'static str) -> Result<candle_core::Tensor> {
    let n = &t.node;
    let buf = ready_buffer(n, op)?;
    let d = n.device;
    let pe = |e: PjrtError| pjrt_err(op, d, e);
    let cpu = candle_core::Device::Cpu;
    let s: &[usize] = &n.shape;
    let started = Instant::now();
    let ct = match n.dtype {
        DType::F32 => candle_core::Tensor::from_vec(buf.to_vec::<f32>().map_err(pe)?, s, &cpu),
        DType::F16 => {
            candle_core::Tensor::from_vec(buf.to_vec::<half::f16>().map_err(pe)?, s, &cpu)
        }
        DType::BF16 => {
            candle_core::Tensor::from_vec(buf.to_vec::<half::bf16>().map_err(pe)?, s, &cpu)
        }
        DType::F64 => candle_core::Tensor::from_vec(buf.to_vec::<f64>().map_err(pe)?, s, &cpu),
        DType::I64 => candle_core::Tensor::from_vec(buf.to_vec::<i64>().map_err(pe)?, s, &cpu),
        DType::I32 => candle_core::Tensor::from_vec(buf.to_vec::<i32>().map_err(pe)?, s, &cpu),
        DType::U8 => candle_core::Tensor::from_vec(buf.to_vec::<u8>().map_err(pe)?, s, &cpu),
        DType::Bool => {
            let bytes: Vec<u8> = buf
                .to_host_bytes()
                .map_err(pe)?
                .into_iter()
                .map(|b| u8::from(b != 0))
                .collect();
            candle_core::Tensor::from_vec(bytes, s, &cpu)
        }
    };
    bump(9, started.elapsed().as_nanos() as u64);
    ct.op(op)
}

/// Copies `t` to another device of the same plugin (device to device), or through the
/// host to another plugin.
pub(crate) fn copy_to(t: &LazyTensor, to: PjrtDevice) -> Result<LazyTensor> {
    let op = "to_device";
    let n = &t.node;
    if n.device.platform != to.platform {
        let host = download(t, op)?;
        return upload(&host, n.dtype, to);
    }
    let buf = ready_buffer(n, op)?;
    let (_, dev) = device(op, to)?;
    let started = Instant::now();
    let copied = buf.copy_to_device(&dev).map_err(|e| pjrt_err(op, to, e))?;
    bump(9, started.elapsed().as_nanos() as u64);
    Ok(leaf(
        Arc::new(copied),
        n.shape.clone(),
        n.dtype,
        to,
        n.host_ints.clone(),
    ))
}

pub(super) fn ready_buffer(n: &Arc<Node>, op: &'static str) -> Result<Arc<Buffer>> {
    if let Some(b) = n.buffer() {
        return Ok(b.clone());
    }
    materialize(std::slice::from_ref(n), op)?;
    n.buffer().cloned().ok_or_else(|| Error::InvalidArgument {
        op,
        msg: "the graph ran but did not produce this tensor (internal error)".into(),
    })
}
