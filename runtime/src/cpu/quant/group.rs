//! The GGUF block types kept as blocks, read 32 weights at a time.
//!
//! Every kept type stores a row as blocks of 32 weights (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) or as
//! super-blocks of 256 (the K-quants) whose weights still come in runs of 32 sharing their
//! scales: a *group*. A group is read as 32 small integers `q` and, per half of 16, a scale
//! `a` and (for types with a minimum) an offset `m`; each weight is `a * q`, plus `m` as a
//! second rounding where the type has one. That is the arithmetic of
//! [`zoo_hub::gguf::dequantize`] term for term (a K-quant's `(d * sc) * q - dmin * mn` is
//! `a * q + m` with `a = d * sc` and `m = -(dmin * mn)`, negation being exact), so every
//! kernel built on groups sees the hub's f32 weights bit for bit.

use zoo_hub::GgmlType;

/// The block types kept as blocks (ggml's names).
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum QKind {
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
}

/// Weights per group.
pub(crate) const GROUP: usize = 32;

/// Runs `$body` with `$k` a `const u8` naming `$kind` (`QKind::from_id` turns it back), so
/// that a kernel generic over it compiles once per block type with the type's decoding
/// folded in: matched per group at run time, the decoding's branches and spills cost more
/// than its arithmetic.
#[cfg_attr(not(target_arch = "x86_64"), allow(unused_macros))]
macro_rules! monomorphic {
    ($kind:expr, |$k:ident| $body:expr) => {
        monomorphic!(@each $kind, $k, $body, Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q2_K Q3_K Q4_K Q5_K Q6_K)
    };
    (@each $kind:expr, $k:ident, $body:expr, $($v:ident)*) => {{
        use $crate::cpu::quant::QKind as Q;
        match $kind {
            $(Q::$v => {
                const $k: u8 = Q::$v as u8;
                $body
            })*
        }
    }};
}
#[cfg(target_arch = "x86_64")]
pub(crate) use monomorphic;

impl QKind {
    /// Every kind, in discriminant order.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(crate) const ALL: [QKind; 10] = [
        QKind::Q4_0,
        QKind::Q4_1,
        QKind::Q5_0,
        QKind::Q5_1,
        QKind::Q8_0,
        QKind::Q2_K,
        QKind::Q3_K,
        QKind::Q4_K,
        QKind::Q5_K,
        QKind::Q6_K,
    ];

    /// The kind whose discriminant is `id` (see [`monomorphic`]).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(crate) const fn from_id(id: u8) -> QKind {
        QKind::ALL[id as usize]
    }

    pub(crate) fn of(g: GgmlType) -> Option<QKind> {
        Some(match g {
            GgmlType::Q4_0 => QKind::Q4_0,
            GgmlType::Q4_1 => QKind::Q4_1,
            GgmlType::Q5_0 => QKind::Q5_0,
            GgmlType::Q5_1 => QKind::Q5_1,
            GgmlType::Q8_0 => QKind::Q8_0,
            GgmlType::Q2_K => QKind::Q2_K,
            GgmlType::Q3_K => QKind::Q3_K,
            GgmlType::Q4_K => QKind::Q4_K,
            GgmlType::Q5_K => QKind::Q5_K,
            GgmlType::Q6_K => QKind::Q6_K,
            // Q8_1 and Q8_K are activation formats ggml does not store weights in.
            GgmlType::Q8_1 | GgmlType::Q8_K => return None,
        })
    }

    pub(crate) fn ggml(self) -> GgmlType {
        match self {
            QKind::Q4_0 => GgmlType::Q4_0,
            QKind::Q4_1 => GgmlType::Q4_1,
            QKind::Q5_0 => GgmlType::Q5_0,
            QKind::Q5_1 => GgmlType::Q5_1,
            QKind::Q8_0 => GgmlType::Q8_0,
            QKind::Q2_K => GgmlType::Q2_K,
            QKind::Q3_K => GgmlType::Q3_K,
            QKind::Q4_K => GgmlType::Q4_K,
            QKind::Q5_K => GgmlType::Q5_K,
            QKind::Q6_K => GgmlType::Q6_K,
        }
    }

    /// Weights per block (32, or 256 for a K-quant super-block).
    pub(crate) fn block_len(self) -> usize {
        self.ggml().block().0 as usize
    }

    /// Bytes per block.
    pub(crate) fn block_bytes(self) -> usize {
        self.ggml().block().1 as usize
    }

    /// Whether weights carry an offset `m` after the scaled value.
    #[inline]
    pub(crate) fn has_min(self) -> bool {
        matches!(
            self,
            QKind::Q4_1 | QKind::Q5_1 | QKind::Q2_K | QKind::Q4_K | QKind::Q5_K
        )
    }

    /// Whether the two halves of a group have scales of their own (16-weight sub-blocks).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    #[inline]
    pub(crate) fn split_scales(self) -> bool {
        matches!(self, QKind::Q2_K | QKind::Q3_K | QKind::Q6_K)
    }

    /// Whether the AMX tiles of `x86/amx.rs` take this type (one scale and minimum per block of
    /// 32, values a bf16 lookup can hold).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(crate) fn on_tiles(self) -> bool {
        matches!(self, QKind::Q4_0 | QKind::Q4_1 | QKind::Q8_0)
    }
}
