//! The eager backend's CPU fast paths: what a `Tensor` op on f32 (and bf16) CPU tensors runs
//! when a faster kernel than candle's applies, reached only through the ops they speed up — a
//! `nn::Linear` product (`kernels::matvec`, `kernels::matmul_wt_few` — below AVX2 on
//! `generic`'s plain-Rust dots —, `kernels::matmul_wt`,
//! bf16 pairs in `bf16`, quantized blocks in `quant`, AMX tiles in `x86::amx`), the attention
//! composite (`kernels::attention`; a decode's below AVX2 in `decode`), the softmax
//! composite (`softmax`), `exp` (`kernels::exp`), `Activation::apply_gated` (`kernels::silu_mul`),
//! `Tensor::gelu_tanh` (`kernels::gelu_tanh`), `Tensor::apply_rotary` (`rotary`),
//! `Tensor::rms_norm` and `Tensor::layer_norm` (`norm`), `Tensor::cat` (`cat`), arithmetic
//! with an operand repeated along the other (`binary`; off x86-64 also bf16 `+` and `*`,
//! rounded as PyTorch rounds), 2-D convolutions (`conv`) and
//! f32/bf16 casts (`bf16::cast`). Each returns `None` when it does not apply (another dtype,
//! device or layout, or a CPU without the instructions), and the op then takes the backend's
//! general path, so results never depend on this module. `heap` keeps glibc from returning
//! each step's freed activations to the system (see there).
//!
//! Which instructions a fast path may use is [`features`]' one answer: the CPU's tier, capped
//! by `ZOO_CPU=generic|avx2|avx512|amx` for the process or by [`features::with_tier`] for a
//! thread, which is how the tests run every tier's code on one machine. Each entry point
//! (`kernels`, `quant`, `bf16`, `norm`, ...) dispatches on it: the f32 kernels of each tier
//! live in `x86/` (`avx2.rs`: the GEMM's 6×16 tiles, GEMV, attention, activations, norms;
//! `avx512.rs`: the 14×32 tiles, GEMV and few-row products, attention, activations, the
//! 16-lane f32/bf16 loads and stores (`Lane`), bf16 conversions and arithmetic, norms, the
//! rotary rotation; `avx2_quant.rs`/`avx512_quant.rs`: products from GGUF blocks, on the
//! groups `blocks.rs` decodes; `amx.rs`/`amx_gemm.rs`: the tile unit); below that the op
//! returns `None` (the backend's path) or, for quantized products, the `gemm` crate on
//! rebuilt rows.

// Off x86-64 the x86 kernels are compiled out (the generic tier takes the backend's path,
// or the `gemm` crate for quantized products), so arguments and helpers only they use go
// unused there (`cargo check --target aarch64-unknown-linux-gnu` builds the crates).
#![cfg_attr(not(target_arch = "x86_64"), allow(unused))]

#[cfg(target_arch = "x86_64")]
pub(crate) mod bf16;
pub(crate) mod binary;
pub(crate) mod cat;
#[cfg(target_arch = "x86_64")]
pub(crate) mod conv;
pub(crate) mod decode;
pub mod features;
pub(crate) mod generic;
pub(crate) mod heap;
pub use heap::release_freed_heap;
pub(crate) mod kernels;
pub(crate) mod norm;
pub(crate) mod quant;
pub(crate) mod rotary;
pub(crate) mod softmax;
#[cfg(target_arch = "x86_64")]
pub(crate) mod x86;
