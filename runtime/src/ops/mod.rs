//! `Tensor` operations, grouped by kind. All are inherent methods of [`crate::Tensor`].

mod math;
mod nnf;
mod shape;

pub use nnf::{Activation, ConvParams, RopeStyle, SdpaOptions};
