//! Every op over awkward operands: any result or typed error passes, a panic fails.

#[allow(unused_imports)]
use super::*;

/// Every op over a grid of awkward operands (empty dims, rank 0, mismatched ranks, wrong
/// dtypes, out-of-range indices): any result or typed error is fine, a panic is a failure.
pub(super) fn no_panic(c: &mut Ctx) {
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
    let binary: [Binary; 23] = [
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
        ("index_copy", |a, b| {
            let n = b.shape().first().copied().unwrap_or(0);
            let index = Tensor::zeros(&[n], DType::I64, &a.device())?;
            a.index_copy(0, &index, b)
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
