//! Tensor creation: zeros, ones, full, arange, random draws, host round trips.

#[allow(unused_imports)]
use super::*;

pub(super) fn creation(c: &mut Ctx) {
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
