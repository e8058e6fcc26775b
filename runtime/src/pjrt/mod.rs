//! PJRT: zoo's own bindings to the PJRT C API, plugin discovery and clients.
//!
//! - `ffi` (private): `#[repr(C)]` structs and the function table, written against PJRT API 0.114.
//! - [`Plugin`]: `dlopen` + `GetPjrtApi` + version check + `PJRT_Plugin_Initialize`.
//! - [`Client`], [`Device`], [`Buffer`], [`Event`], [`LoadedExecutable`]: safe owners of
//!   the plugin's objects, each freed exactly once on drop ([`leak`] counts them).
//! - [`discovery`]: where plugins are looked for, the libtpu guard, `zoo devices`.
//! - [`kv`]: the key-value store a multi-process client shares, behind the create callbacks.
//!
//! ```no_run
//! use zoo_runtime::pjrt::{ClientOptions, CompileOptions, Plugin};
//! # fn main() -> zoo_runtime::pjrt::Result<()> {
//! let plugin = Plugin::load("/path/to/xla_cpu_pjrt.so")?;
//! let client = plugin.client(&ClientOptions::new().cpu_device_count(4))?;
//! let dev = client.device(0)?;
//! let x = client.buffer_from_slice(&[1.0f32, 2.0], &[2], &dev)?;
//! let exe = client.compile(
//!     "func.func @main(%a: tensor<2xf32>) -> tensor<2xf32> {\n\
//!        %0 = stablehlo.add %a, %a : tensor<2xf32>\n\
//!        return %0 : tensor<2xf32>\n}",
//!     &CompileOptions::on(&dev)?,
//! )?;
//! let y = exe.execute_one(&[&x])?;
//! assert_eq!(y[0].to_vec::<f32>()?, vec![2.0, 4.0]);
//! # Ok(()) }
//! ```

pub(crate) mod api;
mod buffer;
mod client;
pub mod discovery;
mod error;
mod executable;
pub(crate) mod ffi;
pub mod kv;
pub mod leak;

pub use api::{AttributeValue, Plugin};
pub use buffer::{Buffer, ElementType, Event, NativeType};
pub use client::{Client, ClientOptions, Device, MemoryStats, OptionValue};
pub use discovery::{devices_report, Candidate, Search, Source};
pub use error::{ErrorCode, PjrtError, Result, SourceLine};
pub use executable::{CompileOptions, ExecuteOptions, Execution, LoadedExecutable};
pub use kv::{KeyValueStore, KvError};
