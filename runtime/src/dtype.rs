//! Element types and PyTorch's type-promotion rules.

use std::fmt;

use half::{bf16, f16};

/// The element type of a [`crate::Tensor`].
///
/// `Bool` is a real dtype at the API level (comparisons return it, `where_cond` takes it);
/// the candle backend stores it as `u8` holding 0 or 1.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    F16,
    BF16,
    F64,
    I64,
    I32,
    U8,
    Bool,
}

/// Coarse kind of a dtype, ordered as PyTorch orders categories in promotion.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Category {
    Bool,
    Int,
    Float,
}

impl DType {
    /// Every dtype, in a fixed order (used by the conformance suite).
    pub const ALL: [DType; 8] = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::F64,
        DType::I64,
        DType::I32,
        DType::U8,
        DType::Bool,
    ];

    /// PyTorch's spelling without the `torch.` prefix (`float32`, `bfloat16`, ...).
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "float32",
            DType::F16 => "float16",
            DType::BF16 => "bfloat16",
            DType::F64 => "float64",
            DType::I64 => "int64",
            DType::I32 => "int32",
            DType::U8 => "uint8",
            DType::Bool => "bool",
        }
    }

    /// Parses PyTorch / HF `torch_dtype` spellings (`"float32"`, `"bfloat16"`, `"fp16"`, `"bf16"`, ...).
    pub fn parse(s: &str) -> Option<DType> {
        Some(match s.trim_start_matches("torch.") {
            "float32" | "float" | "f32" | "fp32" => DType::F32,
            "float16" | "half" | "f16" | "fp16" => DType::F16,
            "bfloat16" | "bf16" => DType::BF16,
            "float64" | "double" | "f64" | "fp64" => DType::F64,
            "int64" | "long" | "i64" => DType::I64,
            "int32" | "int" | "i32" => DType::I32,
            "uint8" | "u8" => DType::U8,
            "bool" => DType::Bool,
            _ => return None,
        })
    }

    /// Bytes per element as stored.
    pub fn size_in_bytes(self) -> usize {
        match self {
            DType::F64 | DType::I64 => 8,
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::U8 | DType::Bool => 1,
        }
    }

    /// Floating-point dtypes.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::BF16 | DType::F64)
    }

    /// Integer dtypes (bool excluded).
    pub fn is_int(self) -> bool {
        matches!(self, DType::I64 | DType::I32 | DType::U8)
    }

    fn category(self) -> Category {
        if self.is_float() {
            Category::Float
        } else if self == DType::Bool {
            Category::Bool
        } else {
            Category::Int
        }
    }

    /// The result dtype of a binary op between tensors of dtypes `a` and `b`
    /// (PyTorch's `torch.promote_types`): the higher category wins (bool < int < float);
    /// within a category the wider type wins, and f16 with bf16 gives f32.
    pub fn promote(a: DType, b: DType) -> DType {
        if a == b {
            return a;
        }
        let (ca, cb) = (a.category(), b.category());
        if ca != cb {
            return if ca > cb { a } else { b };
        }
        match (a, b) {
            (DType::F16, DType::BF16) | (DType::BF16, DType::F16) => DType::F32,
            _ => {
                if a.size_in_bytes() >= b.size_in_bytes() {
                    a
                } else {
                    b
                }
            }
        }
    }

    /// The result dtype of an op between a tensor of this dtype and a host scalar `v`.
    ///
    /// Mirrors PyTorch's rule for Python numbers, which never widen a tensor within its
    /// category: a float tensor keeps its dtype; an integer tensor keeps its dtype when `v`
    /// is integral and becomes f32 (the default float) otherwise; a bool tensor becomes i64
    /// for an integral `v` and f32 otherwise.
    pub fn promote_scalar(self, v: f64) -> DType {
        let integral = v.fract() == 0.0 && v.is_finite();
        match self.category() {
            Category::Float => self,
            Category::Int if integral => self,
            Category::Bool if integral => DType::I64,
            _ => DType::F32,
        }
    }

    /// The dtype float-only ops (exp, softmax, mean, ...) compute in: self for floats, f32
    /// (PyTorch's default float) for integers and bool.
    pub fn float_or_default(self) -> DType {
        if self.is_float() {
            self
        } else {
            DType::F32
        }
    }

    /// The lowest finite value of a float dtype (`torch.finfo(dtype).min`), what
    /// transformers' additive masks put where attention is not allowed: finite, so a row
    /// with nothing visible stays free of NaN. Integer dtypes give their minimum.
    pub fn finite_min(self) -> f64 {
        match self {
            DType::F64 => f64::MIN,
            DType::F32 => f64::from(f32::MIN),
            DType::BF16 => f64::from(half::bf16::MIN),
            DType::F16 => f64::from(half::f16::MIN),
            DType::I64 => i64::MIN as f64,
            DType::I32 => f64::from(i32::MIN),
            DType::U8 | DType::Bool => 0.0,
        }
    }

    /// `v` as a value of this dtype holds it (rounded to nearest even for the float dtypes,
    /// truncated toward zero for the integer ones): what a 0-d PyTorch tensor of this dtype
    /// made from the Python number `v` contains.
    pub fn round_value(self, v: f64) -> f64 {
        match self {
            DType::F64 => v,
            DType::F32 => f64::from(v as f32),
            DType::BF16 => f64::from(half::bf16::from_f64(v)),
            DType::F16 => f64::from(half::f16::from_f64(v)),
            DType::Bool => f64::from(u8::from(v != 0.0)),
            DType::U8 => f64::from(v as u8),
            DType::I32 => f64::from(v as i32),
            DType::I64 => (v as i64) as f64,
        }
    }

    /// The dtype reductions and normalisations accumulate in: f32 for the 16-bit floats (as
    /// PyTorch's CPU/CUDA kernels do), the dtype itself otherwise.
    pub fn accumulation(self) -> DType {
        match self {
            DType::F16 | DType::BF16 => DType::F32,
            d => d,
        }
    }

    /// The matching checkpoint dtype, if this runtime can hold it.
    pub fn from_hub(d: zoo_hub::Dtype) -> Option<DType> {
        Some(match d {
            zoo_hub::Dtype::Bool => DType::Bool,
            zoo_hub::Dtype::U8 => DType::U8,
            zoo_hub::Dtype::I32 => DType::I32,
            zoo_hub::Dtype::I64 => DType::I64,
            zoo_hub::Dtype::F16 => DType::F16,
            zoo_hub::Dtype::BF16 => DType::BF16,
            zoo_hub::Dtype::F32 => DType::F32,
            zoo_hub::Dtype::F64 => DType::F64,
            _ => return None,
        })
    }

    pub(crate) fn to_candle(self) -> candle_core::DType {
        match self {
            DType::F32 => candle_core::DType::F32,
            DType::F16 => candle_core::DType::F16,
            DType::BF16 => candle_core::DType::BF16,
            DType::F64 => candle_core::DType::F64,
            DType::I64 => candle_core::DType::I64,
            DType::I32 => candle_core::DType::I32,
            // Bool is stored as u8 0/1.
            DType::U8 | DType::Bool => candle_core::DType::U8,
        }
    }

    pub(crate) fn from_candle(d: candle_core::DType) -> Option<DType> {
        Some(match d {
            candle_core::DType::F32 => DType::F32,
            candle_core::DType::F16 => DType::F16,
            candle_core::DType::BF16 => DType::BF16,
            candle_core::DType::F64 => DType::F64,
            candle_core::DType::I64 => DType::I64,
            candle_core::DType::I32 => DType::I32,
            candle_core::DType::U8 => DType::U8,
            _ => return None,
        })
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

mod sealed {
    pub trait Sealed {}
}

/// A Rust type that is the element type of one [`DType`]: `f32`, `f64`, `half::f16`,
/// `half::bf16`, `i64`, `i32`, `u8` and `bool`.
pub trait Element: Copy + Send + Sync + 'static + sealed::Sealed {
    /// The dtype whose elements are `Self`.
    const DTYPE: DType;
    /// Lossy conversion to f64 (exact for every type except i64 beyond 2^53).
    fn to_f64(self) -> f64;
    /// Conversion from f64 with the dtype's rounding (round-to-nearest for floats,
    /// truncation toward zero with saturation for integers, `!= 0` for bool).
    fn from_f64(v: f64) -> Self;
    #[doc(hidden)]
    fn into_candle(
        data: Vec<Self>,
        shape: &[usize],
        dev: &candle_core::Device,
    ) -> candle_core::Result<candle_core::Tensor>;
    #[doc(hidden)]
    fn from_candle(t: &candle_core::Tensor) -> candle_core::Result<Vec<Self>>;
}

macro_rules! element {
    ($t:ty, $dt:expr, $to:expr, $from:expr) => {
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DType = $dt;
            fn to_f64(self) -> f64 {
                ($to)(self)
            }
            fn from_f64(v: f64) -> Self {
                ($from)(v)
            }
            fn into_candle(
                data: Vec<Self>,
                shape: &[usize],
                dev: &candle_core::Device,
            ) -> candle_core::Result<candle_core::Tensor> {
                candle_core::Tensor::from_vec(data, shape, dev)
            }
            fn from_candle(t: &candle_core::Tensor) -> candle_core::Result<Vec<Self>> {
                t.flatten_all()?.to_vec1::<$t>()
            }
        }
    };
}

element!(f32, DType::F32, |v: f32| v as f64, |v: f64| v as f32);
element!(f64, DType::F64, |v: f64| v, |v: f64| v);
element!(f16, DType::F16, |v: f16| v.to_f64(), f16::from_f64);
element!(bf16, DType::BF16, |v: bf16| v.to_f64(), bf16::from_f64);
element!(i64, DType::I64, |v: i64| v as f64, |v: f64| v as i64);
element!(i32, DType::I32, |v: i32| v as f64, |v: f64| v as i32);
element!(u8, DType::U8, |v: u8| v as f64, |v: f64| v as u8);

impl sealed::Sealed for bool {}
impl Element for bool {
    const DTYPE: DType = DType::Bool;
    fn to_f64(self) -> f64 {
        if self {
            1.0
        } else {
            0.0
        }
    }
    fn from_f64(v: f64) -> Self {
        v != 0.0
    }
    fn into_candle(
        data: Vec<Self>,
        shape: &[usize],
        dev: &candle_core::Device,
    ) -> candle_core::Result<candle_core::Tensor> {
        let bytes: Vec<u8> = data.into_iter().map(u8::from).collect();
        candle_core::Tensor::from_vec(bytes, shape, dev)
    }
    fn from_candle(t: &candle_core::Tensor) -> candle_core::Result<Vec<Self>> {
        Ok(t.flatten_all()?
            .to_vec1::<u8>()?
            .into_iter()
            .map(|b| b != 0)
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::DType::*;
    use super::*;

    #[test]
    fn promotion_follows_pytorch() {
        assert_eq!(DType::promote(F16, BF16), F32);
        assert_eq!(DType::promote(I64, F16), F16);
        assert_eq!(DType::promote(U8, I32), I32);
        assert_eq!(DType::promote(Bool, U8), U8);
        assert_eq!(DType::promote(F32, F64), F64);
        assert_eq!(DType::promote(I32, I64), I64);
        assert_eq!(I64.promote_scalar(2.0), I64);
        assert_eq!(I64.promote_scalar(0.5), F32);
        assert_eq!(BF16.promote_scalar(0.5), BF16);
        assert_eq!(Bool.promote_scalar(3.0), I64);
    }

    #[test]
    fn parse_names() {
        for d in DType::ALL {
            assert_eq!(DType::parse(d.name()), Some(d));
        }
        assert_eq!(DType::parse("torch.bfloat16"), Some(BF16));
        assert_eq!(DType::parse("complex64"), None);
    }
}
