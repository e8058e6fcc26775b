//! Bad input gives typed errors naming the op, the shapes or dtypes.

#[allow(unused_imports)]
use super::*;

pub(super) fn errors(c: &mut Ctx) {
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
    let absent = Device::Pjrt(crate::PjrtDevice::new(crate::PjrtPlatform::Tpu, 99));
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
