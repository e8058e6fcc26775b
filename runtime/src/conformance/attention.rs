//! Scaled dot-product attention (masks, GQA, windows, soft-capping) and rotary embeddings.

#[allow(unused_imports)]
use super::*;

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

pub(super) fn attention(c: &mut Ctx) {
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
