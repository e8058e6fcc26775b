//! Seeded random tensors.
//!
//! Values are drawn on the host from a SplitMix64 stream and then placed on the device, so a
//! seed yields the same numbers on every backend (what parity runs across backends need).

use crate::{DType, Device, Error, Result, Tensor};

/// A seeded random stream. Each draw advances it.
#[derive(Clone, Debug)]
pub struct Generator {
    state: u64,
}

impl Generator {
    /// A stream starting from `seed`.
    pub fn new(seed: u64) -> Generator {
        Generator { state: seed }
    }

    fn next_u64(&mut self) -> u64 {
        // SplitMix64 (Steele, Lea, Flood 2014): full 2^64 period, good equidistribution.
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A uniform f64 in `[0, 1)` with 53 random bits.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// A standard normal f64 (Box-Muller).
    pub fn next_normal(&mut self) -> f64 {
        // 1 - u keeps the log argument in (0, 1].
        let u1 = 1.0 - self.next_f64();
        let u2 = self.next_f64();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }

    /// A uniform integer in `[lo, hi)`.
    pub fn next_range(&mut self, lo: i64, hi: i64) -> i64 {
        let span = (hi - lo).max(1) as u64;
        lo + (self.next_u64() % span) as i64
    }

    fn float_dtype(op: &'static str, dtype: DType) -> Result<()> {
        if !dtype.is_float() {
            return Err(Error::UnsupportedDType {
                op,
                dtype,
                hint: "; random floats need a float dtype (use `randint` for integers)".into(),
            });
        }
        Ok(())
    }

    /// Standard-normal values of `shape`.
    pub fn randn(&mut self, shape: &[usize], dtype: DType, device: &Device) -> Result<Tensor> {
        Generator::float_dtype("randn", dtype)?;
        let n = shape.iter().product();
        let v: Vec<f64> = (0..n).map(|_| self.next_normal()).collect();
        Tensor::from_f64s(&v, shape, dtype, device)
    }

    /// Uniform values in `[0, 1)` of `shape`.
    pub fn rand(&mut self, shape: &[usize], dtype: DType, device: &Device) -> Result<Tensor> {
        Generator::float_dtype("rand", dtype)?;
        let n = shape.iter().product();
        let v: Vec<f64> = (0..n).map(|_| self.next_f64()).collect();
        Tensor::from_f64s(&v, shape, dtype, device)
    }

    /// Uniform integers in `[lo, hi)` of `shape`.
    pub fn randint(
        &mut self,
        lo: i64,
        hi: i64,
        shape: &[usize],
        dtype: DType,
        device: &Device,
    ) -> Result<Tensor> {
        if hi <= lo {
            return Err(Error::InvalidArgument {
                op: "randint",
                msg: format!("empty range [{lo}, {hi})"),
            });
        }
        let n = shape.iter().product();
        let v: Vec<f64> = (0..n).map(|_| self.next_range(lo, hi) as f64).collect();
        Tensor::from_f64s(&v, shape, dtype, device)
    }
}

impl Tensor {
    /// Standard-normal values from a fresh stream seeded with `seed`.
    pub fn randn(shape: &[usize], dtype: DType, device: &Device, seed: u64) -> Result<Tensor> {
        Generator::new(seed).randn(shape, dtype, device)
    }

    /// Uniform `[0, 1)` values from a fresh stream seeded with `seed`.
    pub fn rand(shape: &[usize], dtype: DType, device: &Device, seed: u64) -> Result<Tensor> {
        Generator::new(seed).rand(shape, dtype, device)
    }
}
