//! Unary, binary, comparison, affine, clamp, where, cast and activation ops.

#[allow(unused_imports)]
use super::*;

pub(super) fn elementwise(c: &mut Ctx) {
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
        // A gated MLP's `silu(gate) * up` (one fused pass on the CPU in f32 and bf16).
        let Some((up, uph)) = c.input(&[3, 40], dt, Dist::Normal) else {
            return;
        };
        c.check(
            "apply_gated silu",
            Activation::Silu.apply_gated(&x, &up),
            &xh.zip(&uph, |g, u| g * sigmoid(g) * u),
            dt,
            None,
        );
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
