//! Reshape, permute, broadcast, narrow, cat, index_select, gather and the dynamic slices.

#[allow(unused_imports)]
use super::*;

pub(super) fn shape(c: &mut Ctx) {
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
        let Some((src, srch)) = c.input(&[2, 3, 2], dt, dist) else {
            return;
        };
        let Some((slots, _)) = c.tensor(&[3.0, 0.0], &[2], DType::I64) else {
            return;
        };
        c.check(
            "index_copy (paged KV-cache write)",
            x.index_copy(2, &slots, &src),
            &Host::from_fn(&[2, 3, 4], |i| match i[2] {
                3 => srch.at(&[i[0], i[1], 0]),
                0 => srch.at(&[i[0], i[1], 1]),
                _ => xh.at(i),
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
