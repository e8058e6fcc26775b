//! `Tensor`: an n-dimensional array on a device, and the run-time dispatch to its backend.

use std::fmt;

use crate::dims::Dims;
use crate::error::BackendContext;
use crate::op::Op;
use crate::{eager, DType, Device, Element, Error, Result};

/// An n-dimensional array with a dtype, living on a [`Device`].
///
/// Cloning is cheap (the storage is shared); every op returns a new tensor. The backend is
/// chosen at run time from the device, so model code is written once against this type.
#[derive(Clone)]
pub struct Tensor {
    repr: Repr,
    /// The API-level dtype; differs from the backend's only for `Bool` (stored as u8 0/1).
    dtype: DType,
}

/// The backend representation. Every op goes through [`Tensor::apply`], the single place
/// that matches on it. The PJRT backend adds a variant holding a node of a recorded graph
/// (leaves hold device buffers) and records the same [`Op`] values there instead of running
/// them.
#[derive(Clone)]
enum Repr {
    /// A value computed by candle on a CPU or CUDA device.
    Eager(candle_core::Tensor),
    /// A node of a recorded graph on a PJRT device (see [`crate::lazy`]).
    Lazy(crate::lazy::LazyTensor),
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Tensor[{:?}, {}, {}]",
            self.shape(),
            self.dtype,
            self.device()
        )
    }
}

impl Tensor {
    // ----- backend plumbing -----

    pub(crate) fn from_candle_with(t: candle_core::Tensor, dtype: DType) -> Tensor {
        Tensor {
            repr: Repr::Eager(t),
            dtype,
        }
    }

    pub(crate) fn from_lazy(t: crate::lazy::LazyTensor, dtype: DType) -> Tensor {
        Tensor {
            repr: Repr::Lazy(t),
            dtype,
        }
    }

    /// The graph node of a PJRT tensor.
    pub(crate) fn lazy(&self) -> Option<&crate::lazy::LazyTensor> {
        match &self.repr {
            Repr::Lazy(l) => Some(l),
            Repr::Eager(_) => None,
        }
    }

    /// The values of an integer tensor when the host has them without a device round trip:
    /// an eager tensor's values, or those a PJRT tensor was uploaded from (positions, token
    /// ids, indices). `None` for floats and for PJRT values computed on the device, whose
    /// reading would run the pending graph.
    pub fn host_known_i64(&self) -> Option<Vec<i64>> {
        if !self.dtype.is_int() {
            return None;
        }
        match &self.repr {
            Repr::Eager(_) => self.to_dtype(DType::I64).ok()?.to_vec::<i64>().ok(),
            Repr::Lazy(l) => l.node.host_ints.as_ref().map(|v| v.to_vec()),
        }
    }

    /// Wraps a candle tensor (interop escape hatch). Fails for dtypes zoo does not model.
    pub fn from_candle(t: candle_core::Tensor) -> Result<Tensor> {
        let dtype = DType::from_candle(t.dtype()).ok_or_else(|| Error::InvalidArgument {
            op: "from_candle",
            msg: format!("candle dtype {:?} has no zoo equivalent", t.dtype()),
        })?;
        Ok(Tensor::from_candle_with(t, dtype))
    }

    /// The underlying candle tensor of an eager tensor (interop escape hatch). A bool tensor
    /// is a u8 tensor of 0/1 there.
    pub fn as_candle(&self) -> Option<&candle_core::Tensor> {
        match &self.repr {
            Repr::Eager(t) => Some(t),
            Repr::Lazy(_) => None,
        }
    }

    /// Checks that all inputs share a device, then runs (eager) or records (lazy) `op`.
    pub(crate) fn apply(op: Op, inputs: &[&Tensor], dtype: DType) -> Result<Tensor> {
        let name = op.name();
        let first = inputs[0];
        for t in &inputs[1..] {
            check_same_device(name, first, t)?;
        }
        if let Repr::Lazy(l0) = &first.repr {
            // Recording is the per-op cost of a traced step: up to four operands (all but
            // `cat`) go without a heap allocation.
            if inputs.len() <= 4 {
                let mut ls = [l0; 4];
                for (slot, t) in ls.iter_mut().zip(inputs) {
                    *slot = t.lazy().unwrap_or(l0);
                }
                return Ok(Tensor::from_lazy(
                    crate::lazy::record(op, &ls[..inputs.len()], dtype)?,
                    dtype,
                ));
            }
            let ls: Vec<&crate::lazy::LazyTensor> =
                inputs.iter().filter_map(|t| t.lazy()).collect();
            return Ok(Tensor::from_lazy(
                crate::lazy::record(op, &ls, dtype)?,
                dtype,
            ));
        }
        let xs: Vec<&candle_core::Tensor> = inputs.iter().filter_map(|t| t.as_candle()).collect();
        Ok(Tensor::from_candle_with(eager::run(&op, &xs)?, dtype))
    }

    pub(crate) fn apply1(&self, op: Op, dtype: DType) -> Result<Tensor> {
        Tensor::apply(op, &[self], dtype)
    }

    // ----- metadata -----

    /// The dims, outermost first.
    pub fn shape(&self) -> &[usize] {
        match &self.repr {
            Repr::Eager(t) => t.dims(),
            Repr::Lazy(l) => l.shape(),
        }
    }

    /// The size of dim `d` (negative counts from the end).
    pub fn dim(&self, d: isize) -> Result<usize> {
        Ok(self.shape()[self.axis("dim", d)?])
    }

    /// Number of dims.
    pub fn rank(&self) -> usize {
        self.shape().len()
    }

    /// Number of elements.
    pub fn elem_count(&self) -> usize {
        self.shape().iter().product()
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The device holding the data.
    pub fn device(&self) -> Device {
        match &self.repr {
            Repr::Eager(t) => Device::from_candle(t.device()),
            Repr::Lazy(l) => Device::Pjrt(l.device()),
        }
    }

    /// Resolves a possibly negative dim index against this tensor's rank.
    pub(crate) fn axis(&self, op: &'static str, d: isize) -> Result<usize> {
        axis_for(op, d, self.shape())
    }

    // ----- creation -----

    /// A tensor from row-major data. `data.len()` must equal the product of `shape`.
    pub fn from_vec<T: Element>(data: Vec<T>, shape: &[usize], device: &Device) -> Result<Tensor> {
        let op = "from_vec";
        let n = shape
            .iter()
            .try_fold(1usize, |acc, &d| acc.checked_mul(d))
            .unwrap_or(usize::MAX);
        if n != data.len() {
            return Err(Error::InvalidArgument {
                op,
                msg: format!(
                    "{} values given for shape {shape:?}, which holds {n}",
                    data.len()
                ),
            });
        }
        if let Device::Pjrt(d) = device {
            let t = T::into_candle(data, shape, &candle_core::Device::Cpu).op(op)?;
            return Ok(Tensor::from_lazy(
                crate::lazy::from_candle(&t, T::DTYPE, *d)?,
                T::DTYPE,
            ));
        }
        let dev = device.candle(op)?;
        let t = T::into_candle(data, shape, &dev).op(op)?;
        Ok(Tensor::from_candle_with(t, T::DTYPE))
    }

    /// A tensor from a row-major slice (copied).
    pub fn from_slice<T: Element>(data: &[T], shape: &[usize], device: &Device) -> Result<Tensor> {
        Tensor::from_vec(data.to_vec(), shape, device)
    }

    /// A tensor from f64 values, rounded to `dtype` (PyTorch's `torch.tensor(data, dtype=...)`).
    pub fn from_f64s(
        data: &[f64],
        shape: &[usize],
        dtype: DType,
        device: &Device,
    ) -> Result<Tensor> {
        // Repeated scalars (a mask fill in every layer) share the buffer of an equal upload:
        // find it without building a host tensor first.
        if let (Device::Pjrt(d), &[v]) = (device, data) {
            if let Some(t) = crate::lazy::shared_scalar(v, shape, dtype, *d) {
                return Ok(Tensor::from_lazy(t, dtype));
            }
        }
        fn conv<T: Element>(d: &[f64], s: &[usize], dev: &Device) -> Result<Tensor> {
            Tensor::from_vec(d.iter().map(|&v| T::from_f64(v)).collect(), s, dev)
        }
        match dtype {
            DType::F32 => conv::<f32>(data, shape, device),
            DType::F16 => conv::<half::f16>(data, shape, device),
            DType::BF16 => conv::<half::bf16>(data, shape, device),
            DType::F64 => conv::<f64>(data, shape, device),
            DType::I64 => conv::<i64>(data, shape, device),
            DType::I32 => conv::<i32>(data, shape, device),
            DType::U8 => conv::<u8>(data, shape, device),
            DType::Bool => conv::<bool>(data, shape, device),
        }
    }

    /// A 0-d tensor holding `v` rounded to `dtype`.
    pub fn scalar(v: f64, dtype: DType, device: &Device) -> Result<Tensor> {
        Tensor::from_f64s(&[v], &[], dtype, device)
    }

    /// A tensor of `shape` filled with `value` (rounded to `dtype`).
    pub fn full(shape: &[usize], value: f64, dtype: DType, device: &Device) -> Result<Tensor> {
        let op = "full";
        if let Device::Pjrt(d) = device {
            return Ok(Tensor::from_lazy(
                crate::lazy::full(shape, value, dtype, *d)?,
                dtype,
            ));
        }
        let dev = device.candle(op)?;
        let base = candle_core::Tensor::zeros(shape, dtype.to_candle(), &dev).op(op)?;
        let t = if value == 0.0 {
            base
        } else {
            let v = if dtype == DType::Bool { 1.0 } else { value };
            base.affine(0.0, v).op(op)?
        };
        Ok(Tensor::from_candle_with(t, dtype))
    }

    /// Zeros.
    pub fn zeros(shape: &[usize], dtype: DType, device: &Device) -> Result<Tensor> {
        Tensor::full(shape, 0.0, dtype, device)
    }

    /// Ones.
    pub fn ones(shape: &[usize], dtype: DType, device: &Device) -> Result<Tensor> {
        Tensor::full(shape, 1.0, dtype, device)
    }

    /// Zeros shaped, typed and placed like `self`.
    pub fn zeros_like(&self) -> Result<Tensor> {
        Tensor::zeros(self.shape(), self.dtype, &self.device())
    }

    /// Ones shaped, typed and placed like `self`.
    pub fn ones_like(&self) -> Result<Tensor> {
        Tensor::ones(self.shape(), self.dtype, &self.device())
    }

    /// `value` shaped, typed and placed like `self`.
    pub fn full_like(&self, value: f64) -> Result<Tensor> {
        Tensor::full(self.shape(), value, self.dtype, &self.device())
    }

    /// `start, start + step, ...` below `end` (above it for a negative step), as `torch.arange`.
    pub fn arange(
        start: f64,
        end: f64,
        step: f64,
        dtype: DType,
        device: &Device,
    ) -> Result<Tensor> {
        let op = "arange";
        if step == 0.0 || !step.is_finite() || !start.is_finite() || !end.is_finite() {
            return Err(Error::InvalidArgument {
                op,
                msg: format!(
                    "arange({start}, {end}, {step}) needs finite bounds and a nonzero step"
                ),
            });
        }
        let n = ((end - start) / step).ceil().max(0.0) as usize;
        if let Device::Pjrt(d) = device {
            return Ok(Tensor::from_lazy(
                crate::lazy::arange(n, start, step, dtype, *d)?,
                dtype,
            ));
        }
        let data: Vec<f64> = (0..n).map(|i| start + i as f64 * step).collect();
        Tensor::from_f64s(&data, &[n], dtype, device)
    }

    // ----- reading back -----

    /// All elements, row-major. `T` must be the tensor's element type.
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        let op = "to_vec";
        if T::DTYPE != self.dtype {
            return Err(Error::ElementType {
                op,
                requested: T::DTYPE,
                actual: self.dtype,
            });
        }
        match &self.repr {
            Repr::Eager(t) => T::from_candle(t).op(op),
            Repr::Lazy(l) => T::from_candle(&crate::lazy::to_candle(l, op)?).op(op),
        }
    }

    /// All elements as f64, row-major, whatever the dtype.
    pub fn to_vec_f64(&self) -> Result<Vec<f64>> {
        Ok(match self.dtype {
            DType::F32 => self.to_vec::<f32>()?.into_iter().map(f64::from).collect(),
            DType::F16 => self
                .to_vec::<half::f16>()?
                .into_iter()
                .map(|v| v.to_f64())
                .collect(),
            DType::BF16 => self
                .to_vec::<half::bf16>()?
                .into_iter()
                .map(|v| v.to_f64())
                .collect(),
            DType::F64 => self.to_vec::<f64>()?,
            DType::I64 => self
                .to_vec::<i64>()?
                .into_iter()
                .map(|v| v as f64)
                .collect(),
            DType::I32 => self.to_vec::<i32>()?.into_iter().map(f64::from).collect(),
            DType::U8 => self.to_vec::<u8>()?.into_iter().map(f64::from).collect(),
            DType::Bool => self
                .to_vec::<bool>()?
                .into_iter()
                .map(|b| b as u8 as f64)
                .collect(),
        })
    }

    /// The single element of a one-element tensor.
    pub fn to_scalar<T: Element>(&self) -> Result<T> {
        if self.elem_count() != 1 {
            return Err(Error::InvalidArgument {
                op: "to_scalar",
                msg: format!(
                    "tensor of shape {:?} has {} elements, not 1",
                    self.shape(),
                    self.elem_count()
                ),
            });
        }
        Ok(self.to_vec::<T>()?[0])
    }

    // ----- dtype and device -----

    /// Converts to `dtype` (a no-op when already there). Floats to ints truncate toward zero;
    /// anything to bool is `!= 0`.
    pub fn to_dtype(&self, dtype: DType) -> Result<Tensor> {
        if dtype == self.dtype {
            return Ok(self.clone());
        }
        self.apply1(Op::Cast(dtype), dtype)
    }

    /// [`Tensor::to_dtype`] for operands inside ops: borrows `self` when the dtype already
    /// matches, so a no-op cast costs no handle (on a PJRT device each clone and drop of a
    /// handle is a pair of atomic updates, a noticeable share of recording a step).
    pub(crate) fn cast(&self, dtype: DType) -> Result<std::borrow::Cow<'_, Tensor>> {
        if dtype == self.dtype {
            return Ok(std::borrow::Cow::Borrowed(self));
        }
        self.apply1(Op::Cast(dtype), dtype)
            .map(std::borrow::Cow::Owned)
    }

    /// [`Tensor::to_dtype`] consuming `self`: returns it as it is when the dtype matches.
    pub(crate) fn into_dtype(self, dtype: DType) -> Result<Tensor> {
        if dtype == self.dtype {
            return Ok(self);
        }
        self.apply1(Op::Cast(dtype), dtype)
    }

    /// Copies to `device` (a no-op when already there).
    pub fn to_device(&self, device: &Device) -> Result<Tensor> {
        let op = "to_device";
        if *device == self.device() {
            return Ok(self.clone());
        }
        match (&self.repr, device) {
            (Repr::Eager(t), Device::Pjrt(d)) => Ok(Tensor::from_lazy(
                crate::lazy::from_candle(t, self.dtype, *d)?,
                self.dtype,
            )),
            (Repr::Lazy(l), Device::Pjrt(d)) => {
                Ok(Tensor::from_lazy(crate::lazy::to_pjrt(l, *d)?, self.dtype))
            }
            (Repr::Lazy(l), _) => {
                let dev = device.candle(op)?;
                let t = crate::lazy::to_candle(l, op)?;
                Ok(Tensor::from_candle_with(
                    t.to_device(&dev).op(op)?,
                    self.dtype,
                ))
            }
            (Repr::Eager(t), _) => {
                let dev = device.candle(op)?;
                Ok(Tensor::from_candle_with(
                    t.to_device(&dev).op(op)?,
                    self.dtype,
                ))
            }
        }
    }

    /// A densely laid-out copy with storage of its own, even of a contiguous view (what an
    /// in-place write from one part of a buffer into another needs); a lazy tensor is a value
    /// already.
    pub fn copy(&self) -> Result<Tensor> {
        match &self.repr {
            Repr::Eager(t) => Ok(Tensor::from_candle_with(
                t.force_contiguous().op("copy")?,
                self.dtype,
            )),
            Repr::Lazy(_) => Ok(self.clone()),
        }
    }

    /// A densely laid-out copy when the tensor is a strided view; otherwise `self`.
    pub fn contiguous(&self) -> Result<Tensor> {
        match &self.repr {
            Repr::Eager(t) if t.is_contiguous() => Ok(self.clone()),
            Repr::Eager(_) => self.apply1(Op::Contiguous, self.dtype),
            // XLA picks layouts itself; a lazy tensor is never a strided view.
            Repr::Lazy(_) => Ok(self.clone()),
        }
    }
}

pub(crate) fn axis_for(op: &'static str, d: isize, shape: &[usize]) -> Result<usize> {
    let r = shape.len() as isize;
    let i = if d < 0 { d + r } else { d };
    if i < 0 || i >= r {
        return Err(Error::DimOutOfRange {
            op,
            dim: d,
            shape: shape.to_vec(),
        });
    }
    Ok(i as usize)
}

pub(crate) fn check_same_device(op: &'static str, a: &Tensor, b: &Tensor) -> Result<()> {
    let (da, db) = (a.device(), b.device());
    if da != db {
        return Err(Error::DeviceMismatch {
            op,
            lhs: da,
            rhs: db,
        });
    }
    Ok(())
}

/// PyTorch's broadcast of two shapes: align trailing dims; each pair must be equal or 1.
pub(crate) fn broadcast_shape(op: &'static str, a: &[usize], b: &[usize]) -> Result<Dims> {
    if a == b {
        return Ok(Dims::from(a));
    }
    let r = a.len().max(b.len());
    let mut out = Dims::new();
    for i in 0..r {
        let da = if i < r - a.len() {
            1
        } else {
            a[i - (r - a.len())]
        };
        let db = if i < r - b.len() {
            1
        } else {
            b[i - (r - b.len())]
        };
        out.push(match (da, db) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => {
                return Err(Error::ShapeMismatch {
                    op,
                    lhs: a.to_vec(),
                    rhs: b.to_vec(),
                    hint: format!(
                        "; dim {i} of the broadcast differs ({da} vs {db}) and neither is 1"
                    ),
                })
            }
        });
    }
    Ok(out)
}
