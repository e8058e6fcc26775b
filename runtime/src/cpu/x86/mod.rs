//! x86-64 kernels, one module per instruction-set tier: [`avx2`] (AVX2 + FMA + F16C),
//! [`avx512`] (AVX-512 F/BW/VL, BF16 pairs), [`amx`] and [`amx_gemm`] (AMX tiles). Their
//! callers, the dispatch points in `kernels`, `quant`, `bf16` and `norm`, check the tier
//! ([`super::features`]) before calling any of them.

pub(crate) mod amx;
pub(crate) mod amx_gemm;
pub(crate) mod avx2;
pub(crate) mod avx512;
