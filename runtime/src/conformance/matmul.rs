//! Matrix products: batched, broadcast, every float dtype.

#[allow(unused_imports)]
use super::*;

pub(super) fn matmul(c: &mut Ctx) {
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
        // nn::Linear over enough rows for the CPU tile kernels, with and without a bias (a
        // 16-bit bias joins the f32 sum before the one rounding).
        let Some((x, xh)) = c.input(&[2, 20, 48], dt, Dist::Normal) else {
            return;
        };
        let Some((w, wh)) = c.input(&[64, 48], dt, Dist::Normal) else {
            return;
        };
        let Some((b, bh)) = c.input(&[64], dt, Dist::Normal) else {
            return;
        };
        let dot = |i: &[usize], f: fn(f64) -> f64| -> f64 {
            (0..48)
                .map(|k| f(xh.at(&[i[0], i[1], k]) * wh.at(&[i[2], k])))
                .sum()
        };
        let shape = [2, 20, 64];
        let want = Host::from_fn(&shape, |i| dot(i, |v| v));
        let mag = Host::from_fn(&shape, |i| dot(i, f64::abs));
        let plain = crate::nn::Linear::new(w.clone(), None).forward(&x);
        c.check("Linear 40 rows", plain, &want, dt, Some(&mag));
        let want = Host::from_fn(&shape, |i| dot(i, |v| v) + bh.at(&[i[2]]));
        let mag = Host::from_fn(&shape, |i| dot(i, f64::abs) + bh.at(&[i[2]]).abs());
        let biased = crate::nn::Linear::new(w, Some(b)).forward(&x);
        c.check("Linear 40 rows + bias", biased, &want, dt, Some(&mag));
    }
}
