//! zoo-nightly: zoo's parity harness.
//!
//! - [`case`]: load a parity case folder (format in `nightly/README.md`) and compare a
//!   port's outputs with the PyTorch reference recorded in it.
//! - [`dashboard`]: the self-contained static `index.html` drawn from the history.
//! - [`harness`]: runs case folders on zoo's models per backend and dtype and records
//!   the run.
//! - [`metrics`]: allclose pass/fail, max abs diff, mean relative diff, mismatch
//!   percentage, cosine similarity, top-1 agreement, greedy-token match.
//! - [`pipeline`]: diffusion pipeline cases (a diffusers `save_pretrained` folder with the
//!   call it made and what it computed), run on zoo-diffusers.
//! - [`results`]: one JSON per run, the history folder, new failures and fixes.
//! - [`tensor`]: safetensors files read into host tensors.
//!
//! The Python reference generator that writes the cases lives in `nightly/reference/`.

#![warn(missing_docs)]

pub mod case;
pub mod dashboard;
pub mod harness;
pub mod metrics;
pub mod pipeline;
pub mod results;
pub mod tensor;

pub use case::{Case, CaseError, CaseSpec, CompareError, CompareKind, OutputReport};
pub use metrics::{CloseMetrics, MetricsError, PositionMask, TokenMetrics, Tolerance};
pub use results::{CaseResult, Changes, RunResults, Status};
pub use tensor::{HostTensor, TensorData, TensorSet};
