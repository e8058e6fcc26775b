//! The op conformance suite, written once and run against every backend.
//!
//! Each check builds seeded random inputs, rounds them to the dtype under test, runs the op
//! on the device under test, and compares with an f64 reference computed on the host from
//! the same rounded inputs ([`mod@reference`]). A backend passes when [`run_all`] reports no
//! failure; `runtime/tests/conformance.rs` runs each group on `Device::Cpu`, and the PJRT
//! backend runs the same groups on its devices.
//!
//! # Tolerances
//! A value passes when `|got - want| <= atol + rtol * max(|want|, mag)`, where `mag` is the
//! sum of absolute terms for accumulating ops (matmul, conv, reductions) and 0 otherwise,
//! so long sums are judged against the size of what was summed. Per dtype ([`tolerance`]):
//! - f64: rtol 1e-10. Backends compute in f64; only summation order and libm ulps differ.
//! - f32: rtol 1e-5, atol 1e-6. The result is rounded once (6e-8) and composite ops
//!   (softmax, norms, attention) chain a handful of f32 roundings; blocked GEMM sums over
//!   the suite's inner sizes (<= 64) stay far below 1e-5 of the summed magnitude.
//! - f16: rtol 2e-3, atol 2e-3. Half an ulp is 4.9e-4 relative; ops whose intermediates
//!   are f16 (the rounded product of two f16 values feeding a sum, a rounded exp feeding a
//!   division) add up to about three more half-ulps.
//! - bf16: rtol 1.6e-2, atol 1.6e-2. Half an ulp is 3.9e-3 relative (8-bit mantissa), with
//!   the same chain of up to four roundings as f16.
//! - integers and bool: exact.

mod attention;
mod conv;
mod creation;
mod elementwise;
mod errors;
mod matmul;
mod no_panic;
mod norm;
mod reduce;
pub mod reference;
mod shape;

use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::nn::{MemWeights, RmsNorm, Weights};
use crate::{
    Activation, ConvParams, DType, Device, Error, Generator, RopeStyle, SdpaOptions, Tensor,
};
use reference::{erf, for_each_index, gelu, gelu_tanh, sigmoid, softmax, Host};

/// `(rtol, atol)` for comparing a result of `dtype` with the f64 reference.
pub fn tolerance(dtype: DType) -> (f64, f64) {
    match dtype {
        DType::F64 => (1e-10, 1e-12),
        DType::F32 => (1e-5, 1e-6),
        DType::F16 => (2e-3, 2e-3),
        DType::BF16 => (1.6e-2, 1.6e-2),
        _ => (0.0, 0.0),
    }
}

/// Float dtypes the suite covers.
pub const FLOATS: [DType; 4] = [DType::F32, DType::F16, DType::BF16, DType::F64];
/// Integer dtypes the suite covers.
pub const INTS: [DType; 3] = [DType::I64, DType::I32, DType::U8];

/// One failed check.
#[derive(Clone, Debug)]
pub struct Failure {
    pub group: &'static str,
    pub case: String,
    pub detail: String,
}

/// The outcome of running groups on one device.
#[derive(Clone, Debug, Default)]
pub struct Report {
    pub checks: usize,
    pub failures: Vec<Failure>,
}

impl Report {
    /// `Ok(number of checks)` when everything passed, else every failure, one per line.
    pub fn into_result(self) -> Result<usize, String> {
        if self.failures.is_empty() {
            return Ok(self.checks);
        }
        let mut s = format!(
            "{} of {} checks failed:\n",
            self.failures.len(),
            self.checks
        );
        for f in &self.failures {
            s.push_str(&format!("  [{}] {}: {}\n", f.group, f.case, f.detail));
        }
        Err(s)
    }
}

/// A named group of checks.
pub type Group = (&'static str, fn(&mut Ctx));

/// The groups of the suite, by name.
pub const GROUPS: [Group; 10] = [
    ("elementwise", elementwise::elementwise),
    ("matmul", matmul::matmul),
    ("reduce", reduce::reduce),
    ("shape", shape::shape),
    ("creation", creation::creation),
    ("conv", conv::conv),
    ("norm", norm::norm),
    ("attention", attention::attention),
    ("errors", errors::errors),
    ("no_panic", no_panic::no_panic),
];

/// Runs every group on `device`.
pub fn run_all(device: &Device) -> Report {
    let mut total = Report::default();
    for (name, _) in GROUPS {
        let r = run_group(name, device);
        total.checks += r.checks;
        total.failures.extend(r.failures);
    }
    total
}

/// Runs the group called `name` on `device`; a panic inside the group is reported as a failure.
pub fn run_group(name: &str, device: &Device) -> Report {
    let Some(&(gname, f)) = GROUPS.iter().find(|(n, _)| *n == name) else {
        return Report {
            checks: 1,
            failures: vec![Failure {
                group: "suite",
                case: name.to_string(),
                detail: "no such group".into(),
            }],
        };
    };
    let mut ctx = Ctx {
        device: *device,
        rng: Generator::new(0x5EED ^ gname.len() as u64),
        group: gname,
        report: Report::default(),
    };
    let r = catch_unwind(AssertUnwindSafe(|| f(&mut ctx)));
    if let Err(p) = r {
        let msg = p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        ctx.report.failures.push(Failure {
            group: gname,
            case: "group".into(),
            detail: format!("panicked: {msg}"),
        });
    }
    ctx.report
}

/// Value distributions for inputs.
#[derive(Clone, Copy, Debug)]
pub enum Dist {
    /// Standard normal.
    Normal,
    /// Uniform in `[lo, hi)`.
    Uniform(f64, f64),
    /// Uniform integers in `[lo, hi)`.
    Int(i64, i64),
}

/// State of one group run: the device, a seeded stream and the report.
pub struct Ctx {
    pub device: Device,
    pub rng: Generator,
    group: &'static str,
    report: Report,
}

impl Ctx {
    fn fail(&mut self, case: &str, detail: String) {
        self.report.failures.push(Failure {
            group: self.group,
            case: case.to_string(),
            detail,
        });
    }

    /// A random input of `dtype` on the device and its exactly rounded host copy.
    pub fn input(&mut self, shape: &[usize], dtype: DType, dist: Dist) -> Option<(Tensor, Host)> {
        let n: usize = shape.iter().product();
        let v: Vec<f64> = (0..n)
            .map(|_| match dist {
                Dist::Normal => self.rng.next_normal(),
                Dist::Uniform(lo, hi) => lo + (hi - lo) * self.rng.next_f64(),
                Dist::Int(lo, hi) => self.rng.next_range(lo, hi) as f64,
            })
            .collect();
        self.tensor(&v, shape, dtype)
    }

    /// `data` rounded to `dtype`, on the device, and its exact host copy.
    pub fn tensor(
        &mut self,
        data: &[f64],
        shape: &[usize],
        dtype: DType,
    ) -> Option<(Tensor, Host)> {
        let t = match Tensor::from_f64s(data, shape, dtype, &Device::Cpu)
            .and_then(|t| t.to_device(&self.device))
        {
            Ok(t) => t,
            Err(e) => {
                self.fail(
                    "input",
                    format!("cannot create {dtype} {shape:?} input: {e}"),
                );
                return None;
            }
        };
        match t.to_vec_f64() {
            Ok(h) => Some((t, Host::new(shape, h))),
            Err(e) => {
                self.fail("input", format!("cannot read back {dtype} {shape:?}: {e}"));
                None
            }
        }
    }

    /// Compares `got` with `want` (and `mag` for accumulating ops) at `dtype`'s tolerance.
    pub fn check(
        &mut self,
        case: &str,
        got: crate::Result<Tensor>,
        want: &Host,
        dtype: DType,
        mag: Option<&Host>,
    ) {
        self.check_tol(case, got, want, dtype, mag, tolerance(dtype));
    }

    /// Like [`Ctx::check`] with an explicit `(rtol, atol)`.
    pub fn check_tol(
        &mut self,
        case: &str,
        got: crate::Result<Tensor>,
        want: &Host,
        dtype: DType,
        mag: Option<&Host>,
        tol: (f64, f64),
    ) {
        self.report.checks += 1;
        let case = format!("{case} [{dtype}]");
        let t = match got {
            Ok(t) => t,
            Err(e) => return self.fail(&case, format!("error: {e}")),
        };
        if t.dtype() != dtype {
            return self.fail(&case, format!("dtype {} (want {dtype})", t.dtype()));
        }
        if t.shape() != want.shape.as_slice() {
            return self.fail(
                &case,
                format!("shape {:?} (want {:?})", t.shape(), want.shape),
            );
        }
        if t.device() != self.device {
            return self.fail(
                &case,
                format!("device {} (want {})", t.device(), self.device),
            );
        }
        let g = match t.to_vec_f64() {
            Ok(g) => g,
            Err(e) => return self.fail(&case, format!("read back: {e}")),
        };
        let (rtol, atol) = tol;
        for (i, (&g, &w)) in g.iter().zip(&want.data).enumerate() {
            let m = mag.map_or(0.0, |m| m.data[i]);
            let ok = if w.is_nan() {
                g.is_nan()
            } else if w.is_infinite() {
                g == w
            } else {
                (g - w).abs() <= atol + rtol * w.abs().max(m)
            };
            if !ok {
                return self.fail(
                    &case,
                    format!("element {i}: got {g}, want {w} (rtol {rtol}, atol {atol}, mag {m})"),
                );
            }
        }
    }

    /// Expects an error accepted by `pred`; a success or another error is a failure.
    pub fn check_err<T: std::fmt::Debug>(
        &mut self,
        case: &str,
        got: crate::Result<T>,
        pred: impl Fn(&Error) -> bool,
    ) {
        self.report.checks += 1;
        match got {
            Ok(v) => self.fail(case, format!("expected an error, got {v:?}")),
            Err(e) if pred(&e) => {}
            Err(e) => self.fail(case, format!("wrong error: {e}")),
        }
    }
}

/// Rounds each reference value to `dtype` (for ops whose exact result is representable).
fn round_to(h: &Host, dtype: DType) -> Host {
    match Tensor::from_f64s(&h.data, &h.shape, dtype, &Device::Cpu).and_then(|t| t.to_vec_f64()) {
        Ok(v) => Host::new(&h.shape, v),
        Err(_) => h.clone(),
    }
}

// ----- groups -----
