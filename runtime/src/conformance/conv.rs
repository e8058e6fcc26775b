//! 2-D convolutions, transposed convolutions and nearest upsampling, against direct host loops.

#[allow(unused_imports)]
use super::*;

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

pub(super) fn conv(c: &mut Ctx) {
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
        // Bilinear, align_corners=False: up on one axis, down on the other.
        let src = |d: usize, inp: usize, out: usize| -> (usize, usize, f64) {
            let s = ((d as f64 + 0.5) * inp as f64 / out as f64 - 0.5).max(0.0);
            let i0 = (s.floor() as usize).min(inp - 1);
            (i0, (i0 + 1).min(inp - 1), s - i0 as f64)
        };
        c.check(
            "upsample_bilinear2d",
            x.upsample_bilinear2d(7, 3),
            &Host::from_fn(&[1, 2, 7, 3], |i| {
                let ((y0, y1, ly), (x0, x1, lx)) = (src(i[2], 3, 7), src(i[3], 4, 3));
                let p = |y: usize, x: usize| xh.at(&[i[0], i[1], y, x]);
                (1.0 - ly) * ((1.0 - lx) * p(y0, x0) + lx * p(y0, x1))
                    + ly * ((1.0 - lx) * p(y1, x0) + lx * p(y1, x1))
            }),
            dt,
            None,
        );
    }
}
