//! x86-64 kernels, one module per instruction-set tier: [`avx2`] (AVX2 + FMA + F16C) and
//! [`avx2_quant`] (its products from GGUF blocks), [`avx512`] (AVX-512 F/BW/VL, BF16 pairs)
//! and [`avx512_quant`], [`amx`] and [`amx_gemm`] (AMX tiles); [`blocks`] decodes a GGUF
//! group into the registers both quantized tiers use. Their callers, the dispatch points in
//! `kernels`, `quant`, `bf16` and `norm`, check the tier ([`super::features`]) before
//! calling any of them.

pub(crate) mod amx;
pub(crate) mod amx_gemm;
pub(crate) mod avx2;
pub(crate) mod avx2_quant;
pub(crate) mod avx512;
pub(crate) mod avx512_quant;
pub(crate) mod blocks;
