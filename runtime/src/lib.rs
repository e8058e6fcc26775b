//! zoo-runtime: the `Tensor` API that every zoo model is written against, its backends and `nn` blocks.
//!
//! Model code uses [`Tensor`] and [`nn`] only; the backend is picked at run time by the
//! tensor's [`Device`]: candle runs CPU and CUDA tensors eagerly, PJRT devices record a lazy
//! graph. Every op validates its operands and returns a typed [`Error`] instead of panicking.

mod composite;
#[cfg(feature = "conformance")]
pub mod conformance;
pub mod cpu;
mod device;
mod dims;
mod dtype;
mod eager;
mod error;
pub mod lazy;
pub mod nn;
mod op;
mod ops;
mod random;
mod tensor;

pub mod device_map;
pub mod distributed;
pub mod pjrt;

pub use device::{Device, MeshId, PjrtDevice, PjrtPlatform};
pub use dtype::{DType, Element};
pub use error::{Error, Result};
pub use lazy::{set_matmul_precision, Precision};
pub use ops::{Activation, ConvParams, RopeStyle, SdpaOptions};
pub use random::Generator;
pub use tensor::Tensor;
