//! Reductions, arg-reductions, softmax, cumsum and sorting.

#[allow(unused_imports)]
use super::*;

pub(super) fn reduce(c: &mut Ctx) {
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
