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

pub mod reference;

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
    ("elementwise", elementwise),
    ("matmul", matmul),
    ("reduce", reduce),
    ("shape", shape),
    ("creation", creation),
    ("conv", conv),
    ("norm", norm),
    ("attention", attention),
    ("errors", errors),
    ("no_panic", no_panic),
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

fn elementwise(c: &mut Ctx) {
    type Bin = (
        &'static str,
        fn(&Tensor, &Tensor) -> crate::Result<Tensor>,
        fn(f64, f64) -> f64,
    );
    let bins: [Bin; 7] = [
        ("add", Tensor::add, |a, b| a + b),
        ("sub", Tensor::sub, |a, b| a - b),
        ("mul", Tensor::mul, |a, b| a * b),
        ("div", Tensor::div, |a, b| a / b),
        ("maximum", Tensor::maximum, f64::max),
        ("minimum", Tensor::minimum, f64::min),
        ("pow", Tensor::pow, f64::powf),
    ];
    for dt in FLOATS {
        for (name, f, r) in bins {
            let (lo, hi) = if name == "pow" {
                (0.5, 2.0)
            } else {
                (-2.0, 2.0)
            };
            let Some((a, ah)) = c.input(&[3, 1, 5], dt, Dist::Uniform(lo, hi)) else {
                return;
            };
            let Some((b, bh)) = c.input(&[4, 5], dt, Dist::Uniform(0.5, 2.0)) else {
                return;
            };
            c.check(
                &format!("{name} broadcast [3,1,5] x [4,5]"),
                f(&a, &b),
                &ah.zip(&bh, r),
                dt,
                None,
            );
        }
        let Some((a, ah)) = c.input(&[2, 3, 4], dt, Dist::Normal) else {
            return;
        };
        let Some((b, bh)) = c.input(&[3, 1], dt, Dist::Normal) else {
            return;
        };
        type Cmp = (
            &'static str,
            fn(&Tensor, &Tensor) -> crate::Result<Tensor>,
            fn(f64, f64) -> bool,
        );
        let cmps: [Cmp; 6] = [
            ("eq", Tensor::eq, |a, b| a == b),
            ("ne", Tensor::ne, |a, b| a != b),
            ("lt", Tensor::lt, |a, b| a < b),
            ("le", Tensor::le, |a, b| a <= b),
            ("gt", Tensor::gt, |a, b| a > b),
            ("ge", Tensor::ge, |a, b| a >= b),
        ];
        for (name, f, r) in cmps {
            c.check(
                name,
                f(&a, &b),
                &ah.zip(&bh, |x, y| r(x, y) as u8 as f64),
                DType::Bool,
                None,
            );
        }
        // Equal elements must compare equal: compare a tensor with itself.
        c.check("eq self", a.eq(&a), &ah.map(|_| 1.0), DType::Bool, None);
        let cond = a.gt(&b);
        let want = ah.zip(&bh, |x, y| if x > y { x } else { y });
        c.check(
            "where_cond",
            cond.and_then(|m| m.where_cond(&a, &b)),
            &want,
            dt,
            None,
        );
        c.check(
            "clamp",
            a.clamp(-0.5, 0.75),
            &ah.map(|v| v.clamp(-0.5, 0.75)),
            dt,
            None,
        );
        c.check(
            "affine",
            a.affine(1.5, -0.25),
            &round_to(&ah.map(|v| v * 1.5 - 0.25), dt),
            dt,
            None,
        );
        c.check(
            "mul_scalar",
            a.mul_scalar(3.0),
            &ah.map(|v| v * 3.0),
            dt,
            None,
        );
        c.check(
            "div_scalar",
            a.div_scalar(4.0),
            &ah.map(|v| v / 4.0),
            dt,
            None,
        );
        c.check(
            "masked_fill",
            a.gt(&b).and_then(|m| a.masked_fill(&m, -7.0)),
            &ah.zip(&bh, |x, y| if x > y { -7.0 } else { x }),
            dt,
            None,
        );

        type Un = (
            &'static str,
            fn(&Tensor) -> crate::Result<Tensor>,
            fn(f64) -> f64,
            Dist,
        );
        let uns: [Un; 17] = [
            ("exp", Tensor::exp, f64::exp, Dist::Uniform(-3.0, 3.0)),
            ("log", Tensor::log, f64::ln, Dist::Uniform(0.1, 5.0)),
            ("sqrt", Tensor::sqrt, f64::sqrt, Dist::Uniform(0.0, 5.0)),
            (
                "rsqrt",
                Tensor::rsqrt,
                |v| 1.0 / v.sqrt(),
                Dist::Uniform(0.1, 5.0),
            ),
            ("tanh", Tensor::tanh, f64::tanh, Dist::Normal),
            (
                "sigmoid",
                Tensor::sigmoid,
                sigmoid,
                Dist::Uniform(-8.0, 8.0),
            ),
            ("erf", Tensor::erf, erf, Dist::Normal),
            ("sin", Tensor::sin, f64::sin, Dist::Uniform(-4.0, 4.0)),
            ("cos", Tensor::cos, f64::cos, Dist::Uniform(-4.0, 4.0)),
            ("abs", Tensor::abs, f64::abs, Dist::Normal),
            ("neg", Tensor::neg, |v| -v, Dist::Normal),
            ("recip", Tensor::recip, |v| 1.0 / v, Dist::Uniform(0.2, 3.0)),
            ("square", Tensor::square, |v| v * v, Dist::Normal),
            ("floor", Tensor::floor, f64::floor, Dist::Uniform(-5.0, 5.0)),
            ("ceil", Tensor::ceil, f64::ceil, Dist::Uniform(-5.0, 5.0)),
            (
                "silu",
                Tensor::silu,
                |v| v * sigmoid(v),
                Dist::Uniform(-6.0, 6.0),
            ),
            ("gelu", Tensor::gelu, gelu, Dist::Uniform(-4.0, 4.0)),
        ];
        for (name, f, r, dist) in uns {
            let Some((x, xh)) = c.input(&[4, 33], dt, dist) else {
                return;
            };
            c.check(name, f(&x), &xh.map(r), dt, None);
        }
        type Act = (&'static str, fn(f64) -> f64);
        let acts: [Act; 8] = [
            ("silu", |v| v * sigmoid(v)),
            ("swish", |v| v * sigmoid(v)),
            ("gelu", gelu),
            ("gelu_new", gelu_tanh),
            ("gelu_pytorch_tanh", gelu_tanh),
            ("relu", |v| v.max(0.0)),
            ("quick_gelu", |v| v * sigmoid(1.702 * v)),
            ("relu6", |v| v.clamp(0.0, 6.0)),
        ];
        let Some((x, xh)) = c.input(&[3, 40], dt, Dist::Uniform(-7.0, 7.0)) else {
            return;
        };
        for (name, r) in acts {
            c.check(
                &format!("activation {name}"),
                x.activation(name),
                &xh.map(r),
                dt,
                None,
            );
        }
        c.check(
            "pow_scalar 0.5",
            x.abs().and_then(|a| a.pow_scalar(0.5)),
            &xh.map(|v| v.abs().sqrt()),
            dt,
            None,
        );
    }
    for dt in INTS {
        let hi = if dt == DType::U8 { 15 } else { 1000 };
        let lo = if dt == DType::U8 { 0 } else { -1000 };
        let Some((a, ah)) = c.input(&[3, 4], dt, Dist::Int(lo, hi)) else {
            return;
        };
        let Some((b, bh)) = c.input(&[4], dt, Dist::Int(lo.max(1), hi)) else {
            return;
        };
        // Operands are drawn so that sums, products and differences stay in range (u8: a >= b
        // is not guaranteed, so u8 checks only add/mul/max/min).
        c.check("add", a.add(&b), &ah.zip(&bh, |x, y| x + y), dt, None);
        c.check("mul", a.mul(&b), &ah.zip(&bh, |x, y| x * y), dt, None);
        c.check("maximum", a.maximum(&b), &ah.zip(&bh, f64::max), dt, None);
        c.check("minimum", a.minimum(&b), &ah.zip(&bh, f64::min), dt, None);
        c.check(
            "lt",
            a.lt(&b),
            &ah.zip(&bh, |x, y| (x < y) as u8 as f64),
            DType::Bool,
            None,
        );
        c.check(
            "div (true division to f32)",
            a.div(&b),
            &ah.zip(&bh, |x, y| x / y),
            DType::F32,
            None,
        );
        c.check(
            "exp (promotes to f32)",
            a.clamp(-5.0, 5.0).and_then(|x| x.exp()),
            &ah.map(|v| v.clamp(-5.0, 5.0).exp()),
            DType::F32,
            None,
        );
        c.check(
            "add_scalar 3",
            a.add_scalar(3.0),
            &ah.map(|v| v + 3.0),
            dt,
            None,
        );
        c.check(
            "mul_scalar 0.5 (promotes to f32)",
            a.mul_scalar(0.5),
            &ah.map(|v| v * 0.5),
            DType::F32,
            None,
        );
        if dt != DType::U8 {
            c.check("sub", a.sub(&b), &ah.zip(&bh, |x, y| x - y), dt, None);
            c.check("neg", a.neg(), &ah.map(|v| -v), dt, None);
            c.check("abs", a.abs(), &ah.map(f64::abs), dt, None);
            c.check(
                "clamp",
                a.clamp(-100.0, 200.0),
                &ah.map(|v| v.clamp(-100.0, 200.0)),
                dt,
                None,
            );
            c.check("relu", a.relu(), &ah.map(|v| v.max(0.0)), dt, None);
        }
    }
    // Narrow integers wrap on overflow, as PyTorch's do (and never abort).
    for (dt, a, b, sum, diff, prod) in [
        (DType::U8, 200.0, 100.0, 44.0, 100.0, 32.0),
        (
            DType::I32,
            2147483647.0,
            -2.0,
            2147483645.0,
            -2147483647.0,
            -4294967294.0 + 4294967296.0,
        ),
    ] {
        let (Some((x, _)), Some((y, _))) = (c.tensor(&[a], &[1], dt), c.tensor(&[b], &[1], dt))
        else {
            return;
        };
        c.check(
            "add wraps",
            x.add(&y),
            &Host::new(&[1], vec![sum]),
            dt,
            None,
        );
        c.check(
            "sub wraps",
            x.sub(&y),
            &Host::new(&[1], vec![diff]),
            dt,
            None,
        );
        c.check(
            "mul wraps",
            x.mul(&y),
            &Host::new(&[1], vec![prod]),
            dt,
            None,
        );
    }
    if let (Some((x, _)), Some((y, _))) = (
        c.tensor(&[3.0], &[1], DType::U8),
        c.tensor(&[5.0], &[1], DType::U8),
    ) {
        c.check(
            "u8 3 - 5 wraps to 254",
            x.sub(&y),
            &Host::new(&[1], vec![254.0]),
            DType::U8,
            None,
        );
        c.check(
            "u8 3 * 100 wraps to 44",
            x.mul_scalar(100.0),
            &Host::new(&[1], vec![44.0]),
            DType::U8,
            None,
        );
    }
    // Promotion across dtypes follows torch.promote_types.
    let pairs = [
        (DType::F32, DType::F16, DType::F32),
        (DType::F16, DType::BF16, DType::F32),
        (DType::I64, DType::F16, DType::F16),
        (DType::U8, DType::I32, DType::I32),
        (DType::I32, DType::F64, DType::F64),
        (DType::Bool, DType::I64, DType::I64),
    ];
    for (da, db, want) in pairs {
        let Some((a, ah)) = c.input(&[2, 3], da, Dist::Int(0, 5)) else {
            return;
        };
        let Some((b, bh)) = c.input(&[2, 3], db, Dist::Int(0, 5)) else {
            return;
        };
        c.check(
            &format!("add {da} + {db}"),
            a.add(&b),
            &ah.zip(&bh, |x, y| x + y),
            want,
            None,
        );
    }
    let Some((a, ah)) = c.input(&[7], DType::Bool, Dist::Int(0, 2)) else {
        return;
    };
    let Some((b, bh)) = c.input(&[7], DType::Bool, Dist::Int(0, 2)) else {
        return;
    };
    c.check(
        "logical_and",
        a.logical_and(&b),
        &ah.zip(&bh, |x, y| (x != 0.0 && y != 0.0) as u8 as f64),
        DType::Bool,
        None,
    );
    c.check(
        "logical_or",
        a.logical_or(&b),
        &ah.zip(&bh, |x, y| (x != 0.0 || y != 0.0) as u8 as f64),
        DType::Bool,
        None,
    );
    c.check(
        "logical_not",
        a.logical_not(),
        &ah.map(|x| (x == 0.0) as u8 as f64),
        DType::Bool,
        None,
    );
}

fn matmul(c: &mut Ctx) {
    let cases: [(&[usize], &[usize]); 5] = [
        (&[7, 16], &[16, 5]),
        (&[2, 3, 8, 64], &[2, 3, 64, 9]),
        (&[2, 1, 4, 8], &[3, 8, 6]),
        (&[5, 12], &[12]),
        (&[12], &[3, 12, 4]),
    ];
    for dt in FLOATS {
        for (sa, sb) in cases {
            let Some((a, ah)) = c.input(sa, dt, Dist::Normal) else {
                return;
            };
            let Some((b, bh)) = c.input(sb, dt, Dist::Normal) else {
                return;
            };
            let a2 = if ah.shape.len() == 1 {
                Host::new(&[1, ah.shape[0]], ah.data.clone())
            } else {
                ah.clone()
            };
            let b2 = if bh.shape.len() == 1 {
                Host::new(&[bh.shape[0], 1], bh.data.clone())
            } else {
                bh.clone()
            };
            let (mut want, mut mag) = a2.matmul(&b2);
            if sa.len() == 1 || sb.len() == 1 {
                let drop = if sa.len() == 1 {
                    want.shape.len() - 2
                } else {
                    want.shape.len() - 1
                };
                want.shape.remove(drop);
                mag.shape.remove(drop);
            }
            c.check(
                &format!("matmul {sa:?} x {sb:?}"),
                a.matmul(&b),
                &want,
                dt,
                Some(&mag),
            );
        }
        // A transposed view on the right, as Linear uses it.
        let Some((x, xh)) = c.input(&[6, 32], dt, Dist::Normal) else {
            return;
        };
        let Some((w, wh)) = c.input(&[10, 32], dt, Dist::Normal) else {
            return;
        };
        let wt = Host::from_fn(&[32, 10], |i| wh.at(&[i[1], i[0]]));
        let (want, mag) = xh.matmul(&wt);
        c.check(
            "matmul x @ w.t()",
            w.t().and_then(|wt| x.matmul(&wt)),
            &want,
            dt,
            Some(&mag),
        );
    }
}

fn reduce(c: &mut Ctx) {
    for dt in FLOATS {
        let Some((x, xh)) = c.input(&[3, 4, 5], dt, Dist::Normal) else {
            return;
        };
        let absx = xh.map(f64::abs);
        for (dims, name) in [
            (vec![2usize], "[-1]"),
            (vec![0, 2], "[0, 2]"),
            (vec![1], "[1]"),
        ] {
            let idims: Vec<isize> = dims
                .iter()
                .map(|&d| if d == 2 { -1 } else { d as isize })
                .collect();
            for keep in [true, false] {
                let mag = absx.reduce(&dims, keep, |v| v.iter().sum());
                let n = dims.iter().map(|&d| xh.shape[d]).product::<usize>() as f64;
                c.check(
                    &format!("sum {name} keepdim={keep}"),
                    x.sum(&idims, keep),
                    &xh.reduce(&dims, keep, |v| v.iter().sum()),
                    dt,
                    Some(&mag),
                );
                c.check(
                    &format!("mean {name} keepdim={keep}"),
                    x.mean(&idims, keep),
                    &xh.reduce(&dims, keep, |v| v.iter().sum::<f64>() / n),
                    dt,
                    Some(&mag.map(|m| m / n)),
                );
                c.check(
                    &format!("max {name} keepdim={keep}"),
                    x.max(&idims, keep),
                    &xh.reduce(&dims, keep, |v| {
                        v.iter().cloned().fold(f64::NEG_INFINITY, f64::max)
                    }),
                    dt,
                    None,
                );
                c.check(
                    &format!("min {name} keepdim={keep}"),
                    x.min(&idims, keep),
                    &xh.reduce(&dims, keep, |v| {
                        v.iter().cloned().fold(f64::INFINITY, f64::min)
                    }),
                    dt,
                    None,
                );
            }
        }
        for corr in [0usize, 1] {
            let want = xh.reduce(&[2], false, |v| {
                let m = v.iter().sum::<f64>() / v.len() as f64;
                v.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / (v.len() - corr) as f64
            });
            let mag = xh.reduce(&[2], false, |v| {
                v.iter().map(|x| x * x).sum::<f64>() / (v.len() - corr) as f64
            });
            c.check(
                &format!("var correction={corr}"),
                x.var(&[-1], false, corr),
                &want,
                dt,
                Some(&mag),
            );
        }
        let argmax = |v: &[f64]| {
            v.iter()
                .enumerate()
                .fold((0, f64::NEG_INFINITY), |(bi, bv), (i, &x)| {
                    if x > bv {
                        (i, x)
                    } else {
                        (bi, bv)
                    }
                })
                .0 as f64
        };
        let argmin = |v: &[f64]| {
            v.iter()
                .enumerate()
                .fold(
                    (0, f64::INFINITY),
                    |(bi, bv), (i, &x)| if x < bv { (i, x) } else { (bi, bv) },
                )
                .0 as f64
        };
        c.check(
            "argmax dim 1",
            x.argmax(1, false),
            &xh.reduce(&[1], false, argmax),
            DType::I64,
            None,
        );
        c.check(
            "argmin dim -1 keepdim",
            x.argmin(-1, true),
            &xh.reduce(&[2], true, argmin),
            DType::I64,
            None,
        );
        // Large logits: a softmax that skips the max subtraction overflows here.
        let big = xh.map(|v| v * 40.0);
        let Some((xb, xbh)) = c.tensor(&big.data, &big.shape, dt) else {
            return;
        };
        for d in [2usize, 0] {
            let id = if d == 2 { -1 } else { 0 };
            c.check(
                &format!("softmax dim {id}"),
                xb.softmax(id),
                &xbh.lanes(d, softmax),
                dt,
                None,
            );
            let lsm = xbh.lanes(d, |l| {
                let m = l.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let lse = m + l.iter().map(|v| (v - m).exp()).sum::<f64>().ln();
                l.iter().map(|v| v - lse).collect()
            });
            // log_softmax values are large (tens); their error scales with the max logit.
            let mag = xbh.lanes(d, |l| {
                vec![l.iter().cloned().fold(0.0, |a: f64, b| a.max(b.abs())); l.len()]
            });
            c.check(
                &format!("log_softmax dim {id}"),
                xb.log_softmax(id),
                &lsm,
                dt,
                Some(&mag),
            );
        }
        let cum = xh.lanes(1, |l| {
            l.iter()
                .scan(0.0, |s, v| {
                    *s += v;
                    Some(*s)
                })
                .collect()
        });
        let cmag = absx.lanes(1, |l| {
            l.iter()
                .scan(0.0, |s, v| {
                    *s += v;
                    Some(*s)
                })
                .collect()
        });
        c.check("cumsum dim 1", x.cumsum(1), &cum, dt, Some(&cmag));
        // topk on distinct values (ties have no defined order).
        let Some((p, ph)) = c.tensor(
            &(0..40)
                .map(|i| ((i * 17) % 40) as f64 - 20.0)
                .collect::<Vec<_>>(),
            &[4, 10],
            dt,
        ) else {
            return;
        };
        let sorted = ph.lanes(1, |l| {
            let mut v = l.to_vec();
            v.sort_by(|a, b| b.total_cmp(a));
            v
        });
        let top3 = Host::from_fn(&[4, 3], |i| sorted.at(i));
        match p.topk(3, -1) {
            Ok((vals, idx)) => {
                c.check("topk values", Ok(vals), &top3, dt, None);
                let gathered = idx.to_dtype(DType::I64).and_then(|i| p.gather(1, &i));
                c.check("topk indices select the values", gathered, &top3, dt, None);
            }
            Err(e) => c.fail("topk", format!("error: {e}")),
        }
        match p.transpose(0, 1).and_then(|pt| pt.topk(2, 0)) {
            Ok((vals, _)) => c.check(
                "topk dim 0",
                Ok(vals),
                &Host::from_fn(&[2, 4], |i| sorted.at(&[i[1], i[0]])),
                dt,
                None,
            ),
            Err(e) => c.fail("topk dim 0", format!("error: {e}")),
        }
    }
    for dt in INTS.into_iter().chain([DType::Bool]) {
        let hi = if dt == DType::Bool { 2 } else { 50 };
        let Some((x, xh)) = c.input(&[4, 6], dt, Dist::Int(0, hi)) else {
            return;
        };
        c.check(
            "sum (ints sum as i64)",
            x.sum(&[1], false),
            &xh.reduce(&[1], false, |v| v.iter().sum()),
            DType::I64,
            None,
        );
        c.check(
            "max",
            x.max(&[0], true),
            &xh.reduce(&[0], true, |v| {
                v.iter().cloned().fold(f64::NEG_INFINITY, f64::max)
            }),
            dt,
            None,
        );
        c.check(
            "cumsum (ints as i64)",
            x.cumsum(-1),
            &xh.lanes(1, |l| {
                l.iter()
                    .scan(0.0, |s, v| {
                        *s += v;
                        Some(*s)
                    })
                    .collect()
            }),
            DType::I64,
            None,
        );
    }
}

fn shape(c: &mut Ctx) {
    for dt in DType::ALL {
        let dist = match dt {
            DType::Bool => Dist::Int(0, 2),
            DType::U8 => Dist::Int(0, 255),
            d if d.is_int() => Dist::Int(-1000, 1000),
            _ => Dist::Normal,
        };
        let Some((x, xh)) = c.input(&[2, 3, 4], dt, dist) else {
            return;
        };
        let exact = |h: &Host| h.clone();
        c.check(
            "reshape [-1, 6]",
            x.reshape(&[-1, 6]),
            &Host::new(&[4, 6], xh.data.clone()),
            dt,
            None,
        );
        c.check(
            "flatten 1..2",
            x.flatten(1, 2),
            &Host::new(&[2, 12], xh.data.clone()),
            dt,
            None,
        );
        c.check(
            "transpose 0 2",
            x.transpose(0, 2),
            &Host::from_fn(&[4, 3, 2], |i| xh.at(&[i[2], i[1], i[0]])),
            dt,
            None,
        );
        c.check(
            "permute [1, 2, 0]",
            x.permute(&[1, 2, 0]),
            &Host::from_fn(&[3, 4, 2], |i| xh.at(&[i[2], i[0], i[1]])),
            dt,
            None,
        );
        c.check(
            "permute then reshape",
            x.permute(&[2, 0, 1]).and_then(|p| p.reshape(&[4, 6])),
            &Host::new(
                &[4, 6],
                Host::from_fn(&[4, 2, 3], |i| xh.at(&[i[1], i[2], i[0]])).data,
            ),
            dt,
            None,
        );
        c.check(
            "expand [2, 2, 3, 4]",
            x.expand(&[2, -1, -1, -1]),
            &Host::from_fn(&[2, 2, 3, 4], |i| xh.at(&i[1..])),
            dt,
            None,
        );
        c.check(
            "unsqueeze 1",
            x.unsqueeze(1),
            &Host::new(&[2, 1, 3, 4], xh.data.clone()),
            dt,
            None,
        );
        c.check(
            "unsqueeze then squeeze",
            x.unsqueeze(-1).and_then(|u| u.squeeze(-1)),
            &exact(&xh),
            dt,
            None,
        );
        c.check(
            "narrow dim 2 [1, 3)",
            x.narrow(2, 1, 2),
            &Host::from_fn(&[2, 3, 2], |i| xh.at(&[i[0], i[1], i[2] + 1])),
            dt,
            None,
        );
        c.check(
            "slice dim 1 [-2:]",
            x.slice(1, -2, 3),
            &Host::from_fn(&[2, 2, 4], |i| xh.at(&[i[0], i[1] + 1, i[2]])),
            dt,
            None,
        );
        let Some((idx, ih)) = c.tensor(&[2.0, 0.0, 2.0, 1.0], &[4], DType::I64) else {
            return;
        };
        c.check(
            "index_select dim 1",
            x.index_select(1, &idx),
            &Host::from_fn(&[2, 4, 4], |i| xh.at(&[i[0], ih.data[i[1]] as usize, i[2]])),
            dt,
            None,
        );
        let Some((gi, gh)) = c.input(&[2, 3, 2], DType::I64, Dist::Int(0, 4)) else {
            return;
        };
        c.check(
            "gather dim -1",
            x.gather(-1, &gi),
            &Host::from_fn(&[2, 3, 2], |i| xh.at(&[i[0], i[1], gh.at(i) as usize])),
            dt,
            None,
        );
        let Some((gi32, gh32)) = c.input(&[1, 3, 4], DType::I32, Dist::Int(0, 2)) else {
            return;
        };
        c.check(
            "gather dim 0 (i32 index)",
            x.gather(0, &gi32),
            &Host::from_fn(&[1, 3, 4], |i| xh.at(&[gh32.at(i) as usize, i[1], i[2]])),
            dt,
            None,
        );
        let Some((y, yh)) = c.input(&[2, 1, 4], dt, dist) else {
            return;
        };
        c.check(
            "cat dim 1",
            Tensor::cat(&[&x, &y], 1),
            &Host::from_fn(&[2, 4, 4], |i| {
                if i[1] < 3 {
                    xh.at(i)
                } else {
                    yh.at(&[i[0], 0, i[2]])
                }
            }),
            dt,
            None,
        );
        c.check(
            "stack dim 0",
            Tensor::stack(&[&x, &x], 0),
            &Host::from_fn(&[2, 2, 3, 4], |i| xh.at(&i[1..])),
            dt,
            None,
        );
        match x.split(&[1, 3], -1) {
            Ok(parts) if parts.len() == 2 => {
                c.check(
                    "split [1, 3] part 1",
                    Ok(parts[1].clone()),
                    &Host::from_fn(&[2, 3, 3], |i| xh.at(&[i[0], i[1], i[2] + 1])),
                    dt,
                    None,
                );
            }
            other => c.fail("split", format!("{other:?}")),
        }
        match x.chunk(2, 1) {
            Ok(parts)
                if parts.len() == 2
                    && parts[0].shape() == [2, 2, 4]
                    && parts[1].shape() == [2, 1, 4] =>
            {
                c.check(
                    "chunk 2 dim 1 last",
                    Ok(parts[1].clone()),
                    &Host::from_fn(&[2, 1, 4], |i| xh.at(&[i[0], 2, i[2]])),
                    dt,
                    None,
                );
            }
            other => c.fail("chunk", format!("{other:?}")),
        }
        let pv = if dt == DType::Bool { 1.0 } else { 3.0 };
        c.check(
            "pad dim 2 (1, 2)",
            x.pad(2, 1, 2, pv),
            &Host::from_fn(&[2, 3, 7], |i| {
                if i[2] == 0 || i[2] > 4 {
                    pv
                } else {
                    xh.at(&[i[0], i[1], i[2] - 1])
                }
            }),
            dt,
            None,
        );
        c.check(
            "repeat_interleave 2 dim 1",
            x.repeat_interleave(2, 1),
            &Host::from_fn(&[2, 6, 4], |i| xh.at(&[i[0], i[1] / 2, i[2]])),
            dt,
            None,
        );
        c.check(
            "repeat [1, 2, 1]",
            x.repeat(&[1, 2, 1]),
            &Host::from_fn(&[2, 6, 4], |i| xh.at(&[i[0], i[1] % 3, i[2]])),
            dt,
            None,
        );
        let Some((ids, idh)) = c.input(&[2, 5], DType::I64, Dist::Int(0, 6)) else {
            return;
        };
        let Some((table, th)) = c.input(&[6, 4], dt, dist) else {
            return;
        };
        c.check(
            "embedding",
            ids.embedding(&table),
            &Host::from_fn(&[2, 5, 4], |i| th.at(&[idh.at(&i[..2]) as usize, i[2]])),
            dt,
            None,
        );
        // dynamic_slice / dynamic_update_slice with device-side starts, clamped like XLA.
        let Some((st, _)) = c.tensor(&[1.0, 1.0, 5.0], &[3], DType::I64) else {
            return;
        };
        c.check(
            "dynamic_slice (start clamped)",
            x.dynamic_slice(&st, &[1, 2, 2]),
            &Host::from_fn(&[1, 2, 2], |i| xh.at(&[1, i[1] + 1, i[2] + 2])),
            dt,
            None,
        );
        let Some((u, uh)) = c.input(&[2, 3, 1], dt, dist) else {
            return;
        };
        let Some((pos, _)) = c.tensor(&[0.0, 0.0, 2.0], &[3], DType::I32) else {
            return;
        };
        c.check(
            "dynamic_update_slice (KV-cache write)",
            x.dynamic_update_slice(&u, &pos),
            &Host::from_fn(&[2, 3, 4], |i| {
                if i[2] == 2 {
                    uh.at(&[i[0], i[1], 0])
                } else {
                    xh.at(i)
                }
            }),
            dt,
            None,
        );
        let Some((u2, u2h)) = c.input(&[1, 2, 2], dt, dist) else {
            return;
        };
        let Some((p2, _)) = c.tensor(&[1.0, -4.0, 9.0], &[3], DType::I64) else {
            return;
        };
        c.check(
            "dynamic_update_slice 3 dims (clamped)",
            x.dynamic_update_slice(&u2, &p2),
            &Host::from_fn(&[2, 3, 4], |i| {
                if i[0] == 1 && i[1] < 2 && i[2] >= 2 {
                    u2h.at(&[0, i[1], i[2] - 2])
                } else {
                    xh.at(i)
                }
            }),
            dt,
            None,
        );
        // Casts: every dtype to every other.
        for to in DType::ALL {
            let want = xh.map(|v| match to {
                DType::Bool => (v != 0.0) as u8 as f64,
                DType::U8 if !dt.is_float() => v.rem_euclid(256.0),
                d if d.is_int() => v.trunc(),
                _ => v,
            });
            if to == DType::U8 && (dt.is_float() || dt == DType::I64 || dt == DType::I32) {
                // Float/negative to u8 is implementation-defined in PyTorch too; skip.
                continue;
            }
            let want = round_to(&want, to);
            c.check(
                &format!("to_dtype {dt} -> {to}"),
                x.to_dtype(to),
                &want,
                to,
                None,
            );
        }
    }
}

fn creation(c: &mut Ctx) {
    let d = c.device;
    for dt in DType::ALL {
        let v = if dt == DType::Bool { 1.0 } else { 3.0 };
        c.check(
            "zeros",
            Tensor::zeros(&[2, 3], dt, &d),
            &Host::new(&[2, 3], vec![0.0; 6]),
            dt,
            None,
        );
        c.check(
            "ones",
            Tensor::ones(&[4], dt, &d),
            &Host::new(&[4], vec![1.0; 4]),
            dt,
            None,
        );
        c.check(
            "full",
            Tensor::full(&[3, 1], v, dt, &d),
            &Host::new(&[3, 1], vec![v; 3]),
            dt,
            None,
        );
        c.check(
            "scalar",
            Tensor::scalar(v, dt, &d),
            &Host::new(&[], vec![v]),
            dt,
            None,
        );
        if dt != DType::Bool {
            c.check(
                "arange 0..5",
                Tensor::arange(0.0, 5.0, 1.0, dt, &d),
                &Host::new(&[5], (0..5).map(f64::from).collect()),
                dt,
                None,
            );
            c.check(
                "arange 10..2 step -3",
                Tensor::arange(10.0, 2.0, -3.0, dt, &d),
                &Host::new(&[3], vec![10.0, 7.0, 4.0]),
                dt,
                None,
            );
        }
    }
    for dt in FLOATS {
        let n = 4000;
        let a = Tensor::randn(&[n], dt, &d, 7);
        let b = Tensor::randn(&[n], dt, &d, 7);
        c.report.checks += 1;
        match (
            a.and_then(|a| a.to_vec_f64()),
            b.and_then(|b| b.to_vec_f64()),
        ) {
            (Ok(a), Ok(b)) => {
                let mean = a.iter().sum::<f64>() / n as f64;
                let var = a.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n as f64;
                // 4000 samples: the mean's standard error is 0.016, the variance's about 0.022.
                if a != b || mean.abs() > 0.08 || (var - 1.0).abs() > 0.11 {
                    c.fail(
                        &format!("randn [{dt}]"),
                        format!("same seed equal: {}, mean {mean}, var {var}", a == b),
                    );
                }
            }
            (a, b) => c.fail(
                &format!("randn [{dt}]"),
                format!("{:?} {:?}", a.err(), b.err()),
            ),
        }
        c.report.checks += 1;
        match Tensor::rand(&[n], dt, &d, 9).and_then(|t| t.to_vec_f64()) {
            Ok(v) => {
                let mean = v.iter().sum::<f64>() / n as f64;
                if v.iter().any(|&x| !(0.0..=1.0).contains(&x)) || (mean - 0.5).abs() > 0.03 {
                    c.fail(
                        &format!("rand [{dt}]"),
                        format!("mean {mean} or a value outside [0, 1]"),
                    );
                }
            }
            Err(e) => c.fail(&format!("rand [{dt}]"), e.to_string()),
        }
    }
}

/// Direct 2-D convolution (`F.conv2d`) on the host; also returns the magnitude.
fn conv2d_ref(x: &Host, w: &Host, p: ConvParams) -> (Host, Host) {
    let (n, h, wd) = (x.shape[0], x.shape[2], x.shape[3]);
    let (o, cg, kh, kw) = (w.shape[0], w.shape[1], w.shape[2], w.shape[3]);
    let oh = (h + 2 * p.padding - p.dilation * (kh - 1) - 1) / p.stride + 1;
    let ow = (wd + 2 * p.padding - p.dilation * (kw - 1) - 1) / p.stride + 1;
    let og = o / p.groups;
    let mut val = Host::from_fn(&[n, o, oh, ow], |_| 0.0);
    let mut mag = val.clone();
    let mut k = 0;
    for_each_index(&[n, o, oh, ow], |i| {
        let g = i[1] / og;
        let (mut s, mut m) = (0.0, 0.0);
        for ci in 0..cg {
            for a in 0..kh {
                for b in 0..kw {
                    let y = (i[2] * p.stride + a * p.dilation) as isize - p.padding as isize;
                    let z = (i[3] * p.stride + b * p.dilation) as isize - p.padding as isize;
                    if y >= 0 && z >= 0 && (y as usize) < h && (z as usize) < wd {
                        let v = x.at(&[i[0], g * cg + ci, y as usize, z as usize])
                            * w.at(&[i[1], ci, a, b]);
                        s += v;
                        m += v.abs();
                    }
                }
            }
        }
        val.data[k] = s;
        mag.data[k] = m;
        k += 1;
    });
    (val, mag)
}

/// Transposed convolution as the scatter it is defined as: each input pixel adds
/// `x * w` at `y*stride - padding + a*dilation`.
fn conv_transpose2d_ref(x: &Host, w: &Host, p: ConvParams, op: usize) -> (Host, Host) {
    let (n, cin, h, wd) = (x.shape[0], x.shape[1], x.shape[2], x.shape[3]);
    let (og, kh, kw) = (w.shape[1], w.shape[2], w.shape[3]);
    let o = og * p.groups;
    let cg = cin / p.groups;
    let oh = (h - 1) * p.stride + p.dilation * (kh - 1) + op + 1 - 2 * p.padding;
    let ow = (wd - 1) * p.stride + p.dilation * (kw - 1) + op + 1 - 2 * p.padding;
    let mut val = Host::from_fn(&[n, o, oh, ow], |_| 0.0);
    let mut mag = val.clone();
    let st = reference::strides(&val.shape);
    for_each_index(&x.shape, |i| {
        let g = i[1] / cg;
        for oc in 0..og {
            for a in 0..kh {
                for b in 0..kw {
                    let y = (i[2] * p.stride + a * p.dilation) as isize - p.padding as isize;
                    let z = (i[3] * p.stride + b * p.dilation) as isize - p.padding as isize;
                    if y >= 0 && z >= 0 && (y as usize) < oh && (z as usize) < ow {
                        let v = x.at(i) * w.at(&[i[1], oc, a, b]);
                        let k = i[0] * st[0]
                            + (g * og + oc) * st[1]
                            + y as usize * st[2]
                            + z as usize * st[3];
                        val.data[k] += v;
                        mag.data[k] += v.abs();
                    }
                }
            }
        }
    });
    (val, mag)
}

fn conv(c: &mut Ctx) {
    for dt in FLOATS {
        let cases = [
            (ConvParams::default(), 4, 6, 3),
            (
                ConvParams {
                    stride: 2,
                    padding: 1,
                    dilation: 1,
                    groups: 1,
                },
                4,
                6,
                3,
            ),
            (
                ConvParams {
                    stride: 1,
                    padding: 2,
                    dilation: 2,
                    groups: 2,
                },
                4,
                6,
                3,
            ),
            (
                ConvParams {
                    stride: 2,
                    padding: 0,
                    dilation: 1,
                    groups: 4,
                },
                4,
                8,
                1,
            ),
        ];
        for (p, cin, cout, k) in cases {
            let Some((x, xh)) = c.input(&[2, cin, 9, 8], dt, Dist::Normal) else {
                return;
            };
            let Some((w, wh)) = c.input(&[cout, cin / p.groups, k, k], dt, Dist::Normal) else {
                return;
            };
            let Some((b, bh)) = c.input(&[cout], dt, Dist::Normal) else {
                return;
            };
            let (want, mag) = conv2d_ref(&xh, &wh, p);
            let want_b = Host::from_fn(&want.shape, |i| want.at(i) + bh.at(&[i[1]]));
            let mag_b = Host::from_fn(&mag.shape, |i| mag.at(i) + bh.at(&[i[1]]).abs());
            c.check(
                &format!("conv2d {p:?} k={k}"),
                x.conv2d(&w, Some(&b), p),
                &want_b,
                dt,
                Some(&mag_b),
            );
        }
        let tcases = [
            (
                ConvParams {
                    stride: 2,
                    padding: 1,
                    dilation: 1,
                    groups: 1,
                },
                1usize,
            ),
            (
                ConvParams {
                    stride: 2,
                    padding: 0,
                    dilation: 1,
                    groups: 2,
                },
                0,
            ),
            (
                ConvParams {
                    stride: 1,
                    padding: 1,
                    dilation: 2,
                    groups: 1,
                },
                1,
            ),
        ];
        for (p, opad) in tcases {
            let Some((x, xh)) = c.input(&[2, 4, 5, 6], dt, Dist::Normal) else {
                return;
            };
            let Some((w, wh)) = c.input(&[4, 3, 3, 3], dt, Dist::Normal) else {
                return;
            };
            let (want, mag) = conv_transpose2d_ref(&xh, &wh, p, opad);
            c.check(
                &format!("conv_transpose2d {p:?} output_padding={opad}"),
                x.conv_transpose2d(&w, None, p, opad),
                &want,
                dt,
                Some(&mag),
            );
        }
        let Some((x, xh)) = c.input(&[1, 2, 3, 4], dt, Dist::Normal) else {
            return;
        };
        c.check(
            "upsample_nearest2x",
            x.upsample_nearest2x(),
            &Host::from_fn(&[1, 2, 6, 8], |i| xh.at(&[i[0], i[1], i[2] / 2, i[3] / 2])),
            dt,
            None,
        );
    }
}

fn norm(c: &mut Ctx) {
    let norm_lane = |l: &[f64], eps: f64| -> Vec<f64> {
        let m = l.iter().sum::<f64>() / l.len() as f64;
        let v = l.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / l.len() as f64;
        l.iter().map(|x| (x - m) / (v + eps).sqrt()).collect()
    };
    for dt in FLOATS {
        let eps = 1e-5;
        let Some((x, xh)) = c.input(&[3, 4, 48], dt, Dist::Normal) else {
            return;
        };
        let Some((w, wh)) = c.input(&[48], dt, Dist::Normal) else {
            return;
        };
        let Some((b, bh)) = c.input(&[48], dt, Dist::Normal) else {
            return;
        };
        let shifted = xh.map(|v| v * 3.0 + 5.0);
        let Some((xs, xsh)) = c.tensor(&shifted.data, &shifted.shape, dt) else {
            return;
        };
        let ln = xsh.lanes(2, |l| norm_lane(l, eps));
        let want = Host::from_fn(&ln.shape, |i| ln.at(i) * wh.at(&[i[2]]) + bh.at(&[i[2]]));
        // Normalised values are O(1) but come from a mean-subtracted input of scale ~5; the
        // error bound follows the input's scale over its spread.
        let mag = Host::from_fn(&ln.shape, |i| {
            (ln.at(i).abs() + 2.0) * wh.at(&[i[2]]).abs() + bh.at(&[i[2]]).abs()
        });
        c.check(
            "layer_norm (shifted input)",
            xs.layer_norm(Some(&w), Some(&b), eps),
            &want,
            dt,
            Some(&mag),
        );
        c.check(
            "layer_norm no affine",
            x.layer_norm(None, None, eps),
            &xh.lanes(2, |l| norm_lane(l, eps)),
            dt,
            Some(&xh.lanes(2, |l| norm_lane(l, eps)).map(|v| v.abs() + 1.0)),
        );
        let rms = |l: &[f64]| -> Vec<f64> {
            let ms = l.iter().map(|x| x * x).sum::<f64>() / l.len() as f64;
            l.iter().map(|x| x / (ms + 1e-6).sqrt()).collect()
        };
        let r = xh.lanes(2, rms);
        // Llama rounds the normalised value to the input dtype before the weight multiply.
        let r_rounded = round_to(&r, dt);
        let want = Host::from_fn(&r.shape, |i| r_rounded.at(i) * wh.at(&[i[2]]));
        let mag = Host::from_fn(&r.shape, |i| r.at(i).abs() * wh.at(&[i[2]]).abs());
        c.check(
            "rms_norm",
            x.rms_norm(Some(&w), 1e-6),
            &want,
            dt,
            Some(&mag),
        );
        // Gemma's (1 + w) in f32, loaded through nn.
        let mut mw = MemWeights::new();
        mw.insert("norm.weight", w.clone());
        let weights = Weights::new(std::sync::Arc::new(mw), dt, c.device);
        let gemma = RmsNorm::load_gemma(&weights.pp("norm"), 48, 1e-6).and_then(|n| n.forward(&x));
        let want = Host::from_fn(&r.shape, |i| r.at(i) * (1.0 + wh.at(&[i[2]])));
        let mag = Host::from_fn(&r.shape, |i| r.at(i).abs() * (1.0 + wh.at(&[i[2]]).abs()));
        c.check("RmsNorm gemma (1 + w)", gemma, &want, dt, Some(&mag));

        let Some((g, gh)) = c.input(&[2, 6, 3, 5], dt, Dist::Normal) else {
            return;
        };
        let Some((gw, gwh)) = c.input(&[6], dt, Dist::Normal) else {
            return;
        };
        let Some((gb, gbh)) = c.input(&[6], dt, Dist::Normal) else {
            return;
        };
        let groups = 3;
        let grouped = Host::new(&[2, groups, 30], gh.data.clone()).lanes(2, |l| norm_lane(l, 1e-6));
        let gn = Host::new(&gh.shape, grouped.data);
        let want = Host::from_fn(&gh.shape, |i| gn.at(i) * gwh.at(&[i[1]]) + gbh.at(&[i[1]]));
        let mag = Host::from_fn(&gh.shape, |i| {
            (gn.at(i).abs() + 1.0) * gwh.at(&[i[1]]).abs() + gbh.at(&[i[1]]).abs()
        });
        c.check(
            "group_norm 3 groups",
            g.group_norm(groups, Some(&gw), Some(&gb), 1e-6),
            &want,
            dt,
            Some(&mag),
        );
    }
}

/// Reference attention for one (batch, head): softmax(q k^T * scale + mask) v.
#[allow(clippy::too_many_arguments)]
fn attention_ref(
    q: &Host,
    k: &Host,
    v: &Host,
    scale: f64,
    causal: bool,
    window: Option<usize>,
    mask: Option<&Host>,
    softcap: Option<f64>,
) -> (Host, Host) {
    let (b, hq, lq, d) = (q.shape[0], q.shape[1], q.shape[2], q.shape[3]);
    let (hkv, lk, dv) = (k.shape[1], k.shape[2], v.shape[3]);
    let rep = hq / hkv;
    let off = lk as isize - lq as isize;
    let mut out = Host::from_fn(&[b, hq, lq, dv], |_| 0.0);
    let mut mag = out.clone();
    let st = reference::strides(&out.shape);
    for bi in 0..b {
        for h in 0..hq {
            for i in 0..lq {
                let p = i as isize + off;
                let mut s = vec![0.0; lk];
                for (j, sj) in s.iter_mut().enumerate() {
                    let mut acc = 0.0;
                    for e in 0..d {
                        acc += q.at(&[bi, h, i, e]) * k.at(&[bi, h / rep, j, e]);
                    }
                    acc *= scale;
                    if let Some(cap) = softcap {
                        acc = cap * (acc / cap).tanh();
                    }
                    if let Some(m) = mask {
                        let mv = m.at_broadcast(&[bi, h, i, j]);
                        acc += mv;
                    }
                    let jj = j as isize;
                    if (causal && jj > p) || window.is_some_and(|w| p - jj >= w as isize) {
                        acc = f64::NEG_INFINITY;
                    }
                    *sj = acc;
                }
                let pr = softmax(&s);
                for e in 0..dv {
                    let (mut o, mut m) = (0.0, 0.0);
                    for (j, pj) in pr.iter().enumerate() {
                        let t = pj * v.at(&[bi, h / rep, j, e]);
                        o += t;
                        m += t.abs();
                    }
                    let k = bi * st[0] + h * st[1] + i * st[2] + e * st[3];
                    out.data[k] = o;
                    mag.data[k] = m;
                }
            }
        }
    }
    (out, mag)
}

fn attention(c: &mut Ctx) {
    for dt in FLOATS {
        // (hq, hkv, lq, lk, causal, window)
        let cases = [
            (4, 4, 6, 6, true, None),
            (4, 2, 6, 6, true, None),
            (4, 1, 1, 9, true, None),
            (4, 2, 3, 9, true, None),
            (2, 2, 8, 8, true, Some(3)),
            (2, 1, 5, 7, false, None),
        ];
        for (hq, hkv, lq, lk, causal, window) in cases {
            let Some((q, qh)) = c.input(&[2, hq, lq, 16], dt, Dist::Normal) else {
                return;
            };
            let Some((k, kh)) = c.input(&[2, hkv, lk, 16], dt, Dist::Normal) else {
                return;
            };
            let Some((v, vh)) = c.input(&[2, hkv, lk, 8], dt, Dist::Normal) else {
                return;
            };
            let opts = SdpaOptions {
                causal,
                sliding_window: window,
                ..Default::default()
            };
            let (want, mag) = attention_ref(&qh, &kh, &vh, 0.25, causal, window, None, None);
            c.check(
                &format!(
                    "sdpa hq={hq} hkv={hkv} lq={lq} lk={lk} causal={causal} window={window:?}"
                ),
                Tensor::scaled_dot_product_attention(&q, &k, &v, &opts),
                &want,
                dt,
                Some(&mag),
            );
        }
        let Some((q, qh)) = c.input(&[1, 2, 4, 8], dt, Dist::Normal) else {
            return;
        };
        let Some((k, kh)) = c.input(&[1, 2, 5, 8], dt, Dist::Normal) else {
            return;
        };
        let Some((v, vh)) = c.input(&[1, 2, 5, 8], dt, Dist::Normal) else {
            return;
        };
        let Some((m, mh)) = c.input(&[1, 1, 4, 5], DType::F32, Dist::Uniform(-3.0, 0.0)) else {
            return;
        };
        let opts = SdpaOptions {
            mask: Some(&m),
            scale: Some(0.3),
            ..Default::default()
        };
        let (want, mag) = attention_ref(&qh, &kh, &vh, 0.3, false, None, Some(&mh), None);
        c.check(
            "sdpa additive mask, scale 0.3",
            Tensor::scaled_dot_product_attention(&q, &k, &v, &opts),
            &want,
            dt,
            Some(&mag),
        );
        let Some((bm, bmh)) = c.input(&[4, 5], DType::Bool, Dist::Int(0, 2)) else {
            return;
        };
        // Keep one visible key per row so no row is fully masked.
        let Some((keep, _)) = c.tensor(&[1.0, 0.0, 0.0, 0.0, 0.0], &[5], DType::Bool) else {
            return;
        };
        let bm = bm.logical_or(&keep);
        let add = Host::from_fn(&[4, 5], |i| {
            if bmh.at(i) != 0.0 || i[1] == 0 {
                0.0
            } else {
                f64::NEG_INFINITY
            }
        });
        match bm {
            Ok(bm) => {
                let opts = SdpaOptions {
                    mask: Some(&bm),
                    ..Default::default()
                };
                let (want, mag) = attention_ref(
                    &qh,
                    &kh,
                    &vh,
                    1.0 / 8f64.sqrt(),
                    false,
                    None,
                    Some(&add),
                    None,
                );
                c.check(
                    "sdpa bool mask",
                    Tensor::scaled_dot_product_attention(&q, &k, &v, &opts),
                    &want,
                    dt,
                    Some(&mag),
                );
            }
            Err(e) => c.fail("sdpa bool mask", e.to_string()),
        }
        let opts = SdpaOptions {
            causal: true,
            softcap: Some(2.0),
            ..Default::default()
        };
        let (want, mag) = attention_ref(
            &qh,
            &kh,
            &vh,
            1.0 / 8f64.sqrt(),
            true,
            None,
            None,
            Some(2.0),
        );
        c.check(
            "sdpa softcap 2",
            Tensor::scaled_dot_product_attention(&q, &k, &v, &opts),
            &want,
            dt,
            Some(&mag),
        );

        // Rotary embedding, both pairings, full and partial.
        for (style, half, d) in [
            (RopeStyle::RotateHalf, 8, 16),
            (RopeStyle::Interleaved, 8, 16),
            (RopeStyle::RotateHalf, 4, 16),
            (RopeStyle::Interleaved, 2, 6),
        ] {
            let Some((x, xh)) = c.input(&[2, 3, 5, d], dt, Dist::Normal) else {
                return;
            };
            let Some((ang, ah)) = c.input(&[5, half], DType::F32, Dist::Uniform(-3.0, 3.0)) else {
                return;
            };
            let (Ok(cos), Ok(sin)) = (ang.cos(), ang.sin()) else {
                return c.fail("rope", "cos/sin".into());
            };
            // The op casts cos/sin to x's dtype first, so the reference uses the rounded tables.
            let (Some((_, ch)), Some((_, sh))) = (
                c.tensor(
                    &ah.data
                        .iter()
                        .map(|a| (*a as f32).cos() as f64)
                        .collect::<Vec<_>>(),
                    &[5, half],
                    dt,
                ),
                c.tensor(
                    &ah.data
                        .iter()
                        .map(|a| (*a as f32).sin() as f64)
                        .collect::<Vec<_>>(),
                    &[5, half],
                    dt,
                ),
            ) else {
                return;
            };
            let want = Host::from_fn(&xh.shape, |i| {
                let (t, e) = (i[2], i[3]);
                if e >= 2 * half {
                    return xh.at(i);
                }
                let at = |e: usize| xh.at(&[i[0], i[1], t, e]);
                match style {
                    RopeStyle::RotateHalf => {
                        let p = e % half;
                        let (cs, sn) = (ch.at(&[t, p]), sh.at(&[t, p]));
                        if e < half {
                            at(e) * cs - at(e + half) * sn
                        } else {
                            at(e) * cs + at(e - half) * sn
                        }
                    }
                    RopeStyle::Interleaved => {
                        let p = e / 2;
                        let (cs, sn) = (ch.at(&[t, p]), sh.at(&[t, p]));
                        if e % 2 == 0 {
                            at(e) * cs - at(e + 1) * sn
                        } else {
                            at(e) * cs + at(e - 1) * sn
                        }
                    }
                }
            });
            let mag = Host::from_fn(&xh.shape, |i| {
                let t = i[2];
                let row: f64 = (0..d)
                    .map(|e| xh.at(&[i[0], i[1], t, e]).abs())
                    .fold(0.0, f64::max);
                row * 2.0
            });
            c.check(
                &format!("apply_rotary {style:?} pairs={half} head_dim={d}"),
                x.apply_rotary(&cos, &sin, style),
                &want,
                dt,
                Some(&mag),
            );
        }
    }
}

fn errors(c: &mut Ctx) {
    let d = c.device;
    let (Some((a, _)), Some((b, _))) = (
        c.input(&[2, 3], DType::F32, Dist::Normal),
        c.input(&[4, 5], DType::F32, Dist::Normal),
    ) else {
        return;
    };
    let names_both = |e: &Error, s1: &str, s2: &str| {
        let m = e.to_string();
        m.contains(s1) && m.contains(s2)
    };
    c.check_err("add [2,3] + [4,5]", a.add(&b), |e| {
        matches!(e, Error::ShapeMismatch { .. }) && names_both(e, "[2, 3]", "[4, 5]")
    });
    c.check_err("matmul [2,3] x [4,5]", a.matmul(&b), |e| {
        matches!(e, Error::ShapeMismatch { .. }) && names_both(e, "[2, 3]", "[4, 5]")
    });
    c.check_err("reshape 6 -> 7", a.reshape(&[7]), |e| {
        matches!(e, Error::InvalidArgument { .. })
    });
    c.check_err("reshape two holes", a.reshape(&[-1, -1]), |e| {
        matches!(e, Error::InvalidArgument { .. })
    });
    c.check_err("transpose dim 2 of rank 2", a.transpose(0, 2), |e| {
        matches!(e, Error::DimOutOfRange { .. })
    });
    c.check_err("sum dim -3", a.sum(&[-3], false), |e| {
        matches!(e, Error::DimOutOfRange { .. })
    });
    c.check_err("narrow past the end", a.narrow(1, 2, 2), |e| {
        matches!(e, Error::IndexOutOfRange { .. })
    });
    c.check_err("narrow overflow", a.narrow(1, usize::MAX, 2), |e| {
        matches!(e, Error::IndexOutOfRange { .. })
    });
    c.check_err("expand [2,3] to [4,3]", a.expand(&[4, 3]), |e| {
        matches!(e, Error::ShapeMismatch { .. })
    });
    c.check_err("cat [2,3] with [4,5]", Tensor::cat(&[&a, &b], 0), |e| {
        matches!(e, Error::ShapeMismatch { .. }) && names_both(e, "[2, 3]", "[4, 5]")
    });
    c.check_err("cat nothing", Tensor::cat(&[], 0), |e| {
        matches!(e, Error::InvalidArgument { .. })
    });
    c.check_err("split sizes", a.split(&[1, 1], 1), |e| {
        matches!(e, Error::InvalidArgument { .. })
    });
    c.check_err("topk k > n", a.topk(4, 1), |e| {
        matches!(e, Error::InvalidArgument { .. })
    });
    if let Some((ids, _)) = c.tensor(&[0.0, 7.0], &[2], DType::I64) {
        c.check_err("index_select index 7 of 3", a.index_select(1, &ids), |e| {
            matches!(e, Error::IndexOutOfRange { .. }) && names_both(e, "[2]", "[2, 3]")
        });
    }
    if let Some((ids, _)) = c.tensor(&[-1.0], &[1], DType::I64) {
        c.check_err("index_select index -1", a.index_select(0, &ids), |e| {
            matches!(e, Error::IndexOutOfRange { .. })
        });
        c.check_err("embedding id -1", ids.embedding(&a), |e| {
            matches!(e, Error::IndexOutOfRange { .. })
        });
    }
    if let Some((ids, _)) = c.tensor(&[0.0, 5.0, 1.0, 0.0, 0.0, 0.0], &[2, 3], DType::I64) {
        c.check_err("gather index 5 of 3", a.gather(1, &ids), |e| {
            matches!(e, Error::IndexOutOfRange { .. })
        });
    }
    if let Some((fids, _)) = c.tensor(&[0.0], &[1], DType::F32) {
        c.check_err(
            "index_select float indices",
            a.index_select(0, &fids),
            |e| matches!(e, Error::UnsupportedDType { .. }),
        );
    }
    if let (Some((cache, _)), Some((upd, _)), Some((pos, _))) = (
        c.input(&[1, 2, 8, 4], DType::F32, Dist::Normal),
        c.input(&[1, 2, 1, 4], DType::F16, Dist::Normal),
        c.tensor(&[0.0, 0.0, 3.0, 0.0], &[4], DType::I64),
    ) {
        c.check_err(
            "dynamic_update_slice f16 into f32",
            cache.dynamic_update_slice(&upd, &pos),
            |e| matches!(e, Error::DTypeMismatch { .. }) && names_both(e, "float32", "float16"),
        );
        c.check_err(
            "dynamic_update_slice start of 2",
            cache.dynamic_update_slice(&cache, &pos.narrow(0, 0, 2).unwrap_or(pos.clone())),
            |e| matches!(e, Error::ShapeMismatch { .. }),
        );
        c.check_err(
            "dynamic_slice too large",
            cache.dynamic_slice(&pos, &[1, 2, 9, 4]),
            |e| matches!(e, Error::ShapeMismatch { .. }),
        );
    }
    c.check_err("to_vec::<f64> of f32", a.to_vec::<f64>(), |e| {
        matches!(e, Error::ElementType { .. }) && names_both(e, "float32", "float64")
    });
    c.check_err("to_scalar of 6 elements", a.to_scalar::<f32>(), |e| {
        matches!(e, Error::InvalidArgument { .. })
    });
    c.check_err(
        "from_vec 5 values for [2,3]",
        Tensor::from_vec(vec![0f32; 5], &[2, 3], &d),
        |e| matches!(e, Error::InvalidArgument { .. }),
    );
    c.check_err(
        "mean of i64",
        Tensor::zeros(&[3], DType::I64, &d).and_then(|t| t.mean(&[0], false)),
        |e| matches!(e, Error::UnsupportedDType { .. }),
    );
    c.check_err(
        "neg of u8",
        Tensor::zeros(&[3], DType::U8, &d).and_then(|t| t.neg()),
        |e| matches!(e, Error::UnsupportedDType { .. }),
    );
    c.check_err(
        "bool subtraction",
        Tensor::zeros(&[3], DType::Bool, &d).and_then(|t| t.sub(&t)),
        |e| matches!(e, Error::UnsupportedDType { .. }),
    );
    c.check_err(
        "matmul of i64",
        Tensor::zeros(&[2, 2], DType::I64, &d).and_then(|t| t.matmul(&t)),
        |e| matches!(e, Error::UnsupportedDType { .. }),
    );
    c.check_err(
        "arange step 0",
        Tensor::arange(0.0, 1.0, 0.0, DType::F32, &d),
        |e| matches!(e, Error::InvalidArgument { .. }),
    );
    c.check_err("unknown activation", a.activation("gelu_magic"), |e| {
        matches!(e, Error::InvalidArgument { .. }) && e.to_string().contains("gelu_magic")
    });
    c.check_err("Activation::from_hf", Activation::from_hf("nope"), |e| {
        matches!(e, Error::InvalidArgument { .. })
    });
    c.check_err("clamp min > max", a.clamp(1.0, 0.0), |e| {
        matches!(e, Error::InvalidArgument { .. })
    });
    if let (Some((x, _)), Some((w, _))) = (
        c.input(&[1, 4, 5, 5], DType::F32, Dist::Normal),
        c.input(&[6, 3, 3, 3], DType::F32, Dist::Normal),
    ) {
        c.check_err(
            "conv2d channel mismatch",
            x.conv2d(&w, None, ConvParams::default()),
            |e| {
                matches!(e, Error::ShapeMismatch { .. })
                    && names_both(e, "[1, 4, 5, 5]", "[6, 3, 3, 3]")
            },
        );
        c.check_err(
            "conv2d groups 0",
            x.conv2d(
                &w,
                None,
                ConvParams {
                    groups: 0,
                    ..Default::default()
                },
            ),
            |e| matches!(e, Error::InvalidArgument { .. }),
        );
        c.check_err(
            "conv2d kernel larger than input",
            x.conv2d(
                &Tensor::zeros(&[2, 4, 7, 7], DType::F32, &d).unwrap_or(w.clone()),
                None,
                ConvParams::default(),
            ),
            |e| matches!(e, Error::ShapeMismatch { .. }),
        );
        c.check_err(
            "group_norm 3 groups of 4 channels",
            x.group_norm(3, None, None, 1e-5),
            |e| matches!(e, Error::InvalidArgument { .. }),
        );
        c.check_err(
            "layer_norm weight [3] for dim 5",
            x.layer_norm(
                Some(&Tensor::ones(&[3], DType::F32, &d).unwrap_or(a.clone())),
                None,
                1e-5,
            ),
            |e| matches!(e, Error::ShapeMismatch { .. }),
        );
    }
    if let (Some((q, _)), Some((k, _))) = (
        c.input(&[1, 3, 2, 8], DType::F32, Dist::Normal),
        c.input(&[1, 2, 2, 8], DType::F32, Dist::Normal),
    ) {
        c.check_err(
            "sdpa 3 query heads over 2 kv heads",
            Tensor::scaled_dot_product_attention(&q, &k, &k, &SdpaOptions::default()),
            |e| {
                matches!(e, Error::ShapeMismatch { .. })
                    && names_both(e, "[1, 3, 2, 8]", "[1, 2, 2, 8]")
            },
        );
        if let Some((cs, _)) = c.input(&[2, 5], DType::F32, Dist::Normal) {
            c.check_err(
                "rope 5 pairs in head_dim 8",
                q.apply_rotary(&cs, &cs, RopeStyle::RotateHalf),
                |e| matches!(e, Error::ShapeMismatch { .. }),
            );
        }
    }
    // Devices: a PJRT device that cannot serve (no plugin here, or no device 99 there) is a
    // typed error naming the device; CUDA without the feature says how to enable it.
    let absent = Device::Pjrt(crate::PjrtDevice {
        platform: crate::PjrtPlatform::Tpu,
        ordinal: 99,
    });
    let names_device = |e: &Error| {
        matches!(e, Error::Pjrt { .. } | Error::PjrtUnavailable { .. })
            && e.to_string().contains("pjrt:tpu:99")
    };
    if d != absent {
        c.check_err(
            "zeros on an absent PJRT device",
            Tensor::zeros(&[2], DType::F32, &absent),
            names_device,
        );
        c.check_err(
            "to_device to an absent PJRT device",
            a.to_device(&absent),
            names_device,
        );
    }
    if !cfg!(feature = "cuda") {
        c.check_err(
            "zeros on cuda:0 without the feature",
            Tensor::zeros(&[2], DType::F32, &Device::Cuda(0)),
            |e| matches!(e, Error::CudaNotCompiled(0)),
        );
    }
    if d != Device::Cpu {
        if let Ok(h) = Tensor::zeros(&[2, 3], DType::F32, &Device::Cpu) {
            c.check_err("add across devices", a.add(&h), |e| {
                matches!(e, Error::DeviceMismatch { .. })
            });
        }
    }
}

/// Every op over a grid of awkward operands (empty dims, rank 0, mismatched ranks, wrong
/// dtypes, out-of-range indices): any result or typed error is fine, a panic is a failure.
fn no_panic(c: &mut Ctx) {
    let shapes: [&[usize]; 10] = [
        &[],
        &[0],
        &[3],
        &[2, 0],
        &[2, 3],
        &[3, 2],
        &[1, 3],
        &[2, 1, 3],
        &[2, 0, 3],
        &[1, 2, 3, 4],
    ];
    let dtypes = [DType::F32, DType::BF16, DType::I64, DType::U8, DType::Bool];
    let mut operands = Vec::new();
    for s in shapes {
        for dt in dtypes {
            let dist = if dt.is_float() {
                Dist::Normal
            } else {
                Dist::Int(-2, 5)
            };
            let dist = if dt == DType::U8 || dt == DType::Bool {
                Dist::Int(0, 2)
            } else {
                dist
            };
            if let Some((t, _)) = c.input(s, dt, dist) {
                operands.push(t);
            }
        }
    }
    type Unary = (&'static str, fn(&Tensor) -> crate::Result<Tensor>);
    let unary: [Unary; 36] = [
        ("sum", |x| x.sum(&[-1], false)),
        ("sum_all", |x| x.sum_all()),
        ("mean", |x| x.mean(&[0], true)),
        ("max", |x| x.max(&[0], false)),
        ("max no dims", |x| x.max(&[], false)),
        ("argmax", |x| x.argmax(-1, false)),
        ("var", |x| x.var(&[-1], false, 1)),
        ("softmax", |x| x.softmax(-1)),
        ("log_softmax", |x| x.log_softmax(0)),
        ("cumsum", |x| x.cumsum(0)),
        ("topk", |x| x.topk(1, -1).map(|r| r.0)),
        ("reshape", |x| x.reshape(&[-1])),
        ("reshape 0 hole", |x| x.reshape(&[0, -1])),
        ("flatten", |x| x.flatten(0, -1)),
        ("t", |x| x.t()),
        ("squeeze", |x| x.squeeze(0)),
        ("unsqueeze", |x| x.unsqueeze(5)),
        ("narrow", |x| x.narrow(0, 1, 1)),
        ("slice", |x| x.slice(-1, -5, 9)),
        ("chunk", |x| x.chunk(2, 0).map(|v| v[0].clone())),
        ("pad", |x| x.pad(0, 1, 2, 0.0)),
        ("repeat_interleave", |x| x.repeat_interleave(2, 0)),
        ("repeat", |x| x.repeat(&[2, 2])),
        ("expand", |x| x.expand(&[2, -1, -1])),
        ("upsample", |x| x.upsample_nearest2x()),
        ("exp", |x| x.exp()),
        ("neg", |x| x.neg()),
        ("relu", |x| x.relu()),
        ("gelu", |x| x.gelu()),
        ("clamp", |x| x.clamp(-1.0, 1.0)),
        ("rms_norm", |x| x.rms_norm(None, 1e-6)),
        ("layer_norm", |x| x.layer_norm(None, None, 1e-5)),
        ("group_norm", |x| x.group_norm(2, None, None, 1e-5)),
        ("to_bool", |x| x.to_dtype(DType::Bool)),
        ("to_u8", |x| x.to_dtype(DType::U8)),
        ("contiguous", |x| x.t()?.contiguous()),
    ];
    type Binary = (&'static str, fn(&Tensor, &Tensor) -> crate::Result<Tensor>);
    let binary: [Binary; 22] = [
        ("add", Tensor::add),
        ("sub", Tensor::sub),
        ("div", Tensor::div),
        ("pow", Tensor::pow),
        ("lt", Tensor::lt),
        ("matmul", Tensor::matmul),
        ("where", |a, b| a.where_cond(a, b)),
        ("cat 0", |a, b| Tensor::cat(&[a, b], 0)),
        ("cat -1", |a, b| Tensor::cat(&[a, b], -1)),
        ("stack", |a, b| Tensor::stack(&[a, b], 0)),
        ("gather", |a, b| a.gather(0, b)),
        ("index_select", |a, b| a.index_select(-1, b)),
        ("embedding", |a, b| b.embedding(a)),
        ("dynamic_slice", |a, b| a.dynamic_slice(b, &[1, 1])),
        ("dynamic_update_slice", |a, b| {
            let start = Tensor::zeros(&[a.rank()], DType::I64, &a.device())?;
            a.dynamic_update_slice(b, &start)
        }),
        ("conv2d", |a, b| a.conv2d(b, None, ConvParams::default())),
        ("conv_transpose2d", |a, b| {
            a.conv_transpose2d(b, None, ConvParams::default(), 0)
        }),
        ("sdpa", |a, b| {
            Tensor::scaled_dot_product_attention(
                a,
                b,
                b,
                &SdpaOptions {
                    causal: true,
                    ..Default::default()
                },
            )
        }),
        ("apply_rotary", |a, b| {
            a.apply_rotary(b, b, RopeStyle::Interleaved)
        }),
        ("layer_norm w", |a, b| a.layer_norm(Some(b), Some(b), 1e-5)),
        ("rms_norm w", |a, b| a.rms_norm(Some(b), 1e-6)),
        ("masked_fill", |a, b| a.masked_fill(b, 1.0)),
    ];
    for a in &operands {
        for (name, f) in unary {
            c.report.checks += 1;
            if catch_unwind(AssertUnwindSafe(|| f(a))).is_err() {
                c.fail(name, format!("panicked on {a:?}"));
            }
        }
        for b in &operands {
            for (name, f) in binary {
                c.report.checks += 1;
                if catch_unwind(AssertUnwindSafe(|| f(a, b))).is_err() {
                    c.fail(name, format!("panicked on {a:?} and {b:?}"));
                }
            }
        }
    }
}
