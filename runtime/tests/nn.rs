//! `nn` blocks: loading by HF name (from memory and from a safetensors checkpoint through
//! zoo-hub), typed errors for missing and mis-shaped weights, and rope tables per type.

use std::sync::Arc;

use half::bf16;
use zoo_runtime::nn::{
    Embedding, LayerNorm, Linear, MemWeights, RopeConfig, RopeScaling, RotaryEmbedding, Weights,
};
use zoo_runtime::{DType, Device, Error, RopeStyle, Tensor};

fn mem(entries: &[(&str, &[usize])]) -> MemWeights {
    let mut m = MemWeights::new();
    for (i, (name, shape)) in entries.iter().enumerate() {
        m.insert(
            *name,
            Tensor::randn(shape, DType::F32, &Device::Cpu, i as u64).unwrap(),
        );
    }
    m
}

#[test]
fn linear_loads_by_hf_name_and_matches_matmul() {
    let m = mem(&[
        ("model.layers.0.mlp.up_proj.weight", &[8, 4]),
        ("model.layers.0.mlp.up_proj.bias", &[8]),
    ]);
    let w = Weights::new(Arc::new(m), DType::F32, Device::Cpu);
    let lin = Linear::load(&w.pp("model.layers.0").pp("mlp.up_proj"), 4, 8, true).unwrap();
    let x = Tensor::randn(&[2, 3, 4], DType::F32, &Device::Cpu, 9).unwrap();
    let y = lin.forward(&x).unwrap();
    assert_eq!(y.shape(), &[2, 3, 8]);
    let (xv, wv, bv, yv) = (
        x.to_vec::<f32>().unwrap(),
        lin.weight().unwrap().to_vec::<f32>().unwrap(),
        lin.bias.as_ref().unwrap().to_vec::<f32>().unwrap(),
        y.to_vec::<f32>().unwrap(),
    );
    for r in 0..6 {
        for o in 0..8 {
            let want: f32 = (0..4).map(|i| xv[r * 4 + i] * wv[o * 4 + i]).sum::<f32>() + bv[o];
            assert!((yv[r * 8 + o] - want).abs() < 1e-5, "row {r} out {o}");
        }
    }
}

#[test]
fn missing_and_misshaped_weights_are_typed_errors() {
    let m = mem(&[
        ("model.embed_tokens.weight", &[10, 4]),
        ("model.norm.weight", &[4]),
    ]);
    let w = Weights::new(Arc::new(m), DType::F32, Device::Cpu);
    match Embedding::load(&w.pp("model.embed_tokens"), 12, 4) {
        Err(Error::WeightShape {
            name,
            expected,
            found,
        }) => {
            assert_eq!(name, "model.embed_tokens.weight");
            assert_eq!((expected, found), (vec![12, 4], vec![10, 4]));
        }
        other => panic!("{other:?}"),
    }
    match Linear::load(&w.pp("lm_head"), 4, 10, false) {
        Err(e @ Error::MissingWeight { .. }) => {
            assert!(e.to_string().contains("lm_head.weight"), "{e}")
        }
        other => panic!("{other:?}"),
    }
    // A missing bias names the tensor and points at what is there.
    match LayerNorm::load(&w.pp("model.embed"), 4, 1e-5) {
        Err(e @ Error::MissingWeight { .. }) => {
            assert!(e.to_string().contains("model.embed.weight"))
        }
        other => panic!("{other:?}"),
    }
    match w.pp("model.norm").get("bias", &[4]) {
        Err(e) => assert!(
            e.to_string().contains("model.norm.weight"),
            "hint lists neighbours: {e}"
        ),
        Ok(t) => panic!("{t:?}"),
    }
    let ln = LayerNorm::load(&w.pp("model.norm"), 4, 1e-5).unwrap();
    assert!(ln.bias.is_none());
}

/// Writes a safetensors file by hand: u64 header length, JSON header, raw data.
fn write_safetensors(path: &std::path::Path, tensors: &[(&str, &str, &[usize], Vec<u8>)]) {
    let mut header = serde_json::Map::new();
    let mut data = Vec::new();
    for (name, dtype, shape, bytes) in tensors {
        let start = data.len();
        data.extend_from_slice(bytes);
        header.insert(
            name.to_string(),
            serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": [start, data.len()]}),
        );
    }
    let h = serde_json::to_vec(&serde_json::Value::Object(header)).unwrap();
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&h);
    out.extend_from_slice(&data);
    std::fs::write(path, out).unwrap();
}

#[test]
fn loads_from_a_hub_checkpoint_in_any_dtype() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.safetensors");
    let w: Vec<f32> = (0..6).map(|i| i as f32 * 0.5 - 1.0).collect();
    let wb: Vec<u8> = w
        .iter()
        .flat_map(|v| bf16::from_f32(*v).to_le_bytes())
        .collect();
    let ids: Vec<u8> = [3i64, 1].iter().flat_map(|v| v.to_le_bytes()).collect();
    write_safetensors(
        &path,
        &[
            ("proj.weight", "BF16", &[3, 2], wb),
            ("ids", "I64", &[2], ids),
        ],
    );
    let hub = zoo_hub::Weights::from_safetensors(&[path]).unwrap();
    let weights = Weights::new(Arc::new(hub), DType::F32, Device::Cpu);
    let lin = Linear::load(&weights.pp("proj"), 2, 3, false).unwrap();
    assert_eq!(lin.weight().unwrap().dtype(), DType::F32);
    assert_eq!(lin.weight().unwrap().to_vec::<f32>().unwrap(), w);
    let as_bf16 = weights
        .with_dtype(DType::BF16)
        .get("proj.weight", &[3, 2])
        .unwrap();
    assert_eq!(
        as_bf16.to_vec_f64().unwrap(),
        w.iter().map(|&v| v as f64).collect::<Vec<_>>()
    );
    let ids = weights.with_dtype(DType::I64).get("ids", &[2]).unwrap();
    assert_eq!(ids.to_vec::<i64>().unwrap(), vec![3, 1]);
    match weights.get("proj.weight", &[2, 3]) {
        Err(Error::WeightShape {
            expected, found, ..
        }) => assert_eq!((expected, found), (vec![2, 3], vec![3, 2])),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        weights.get("nope", &[1]),
        Err(Error::MissingWeight { .. })
    ));
}

fn params(json: serde_json::Value) -> zoo_hub::RopeParameters {
    let obj = json.as_object().unwrap();
    zoo_hub::RopeParameters {
        rope_type: obj["rope_type"].as_str().unwrap().to_string(),
        rope_theta: obj.get("rope_theta").and_then(|v| v.as_f64()),
        extra: obj.clone(),
    }
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-6 * b.abs().max(1e-30)
}

#[test]
fn rope_default_linear_dynamic() {
    let d = RopeConfig::from_hub(
        &params(serde_json::json!({"rope_type": "default", "rope_theta": 10000.0})),
        4,
        1.0,
        2048,
        None,
    )
    .unwrap();
    let (f, s) = d.inv_freq(10);
    assert!(close(f[0], 1.0) && close(f[1], 0.01) && s == 1.0, "{f:?}");
    let l = RopeConfig::from_hub(
        &params(serde_json::json!({"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0})),
        4,
        1.0,
        2048,
        None,
    )
    .unwrap();
    let (f, _) = l.inv_freq(10);
    assert!(close(f[0], 0.25) && close(f[1], 0.0025));
    let dy = RopeConfig::from_hub(
        &params(serde_json::json!({"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0})),
        8,
        1.0,
        100,
        None,
    )
    .unwrap();
    assert_eq!(dy.inv_freq(50).0, d_default(8, 10000.0));
    // At twice the trained length the base becomes theta * 3^(r / (r - 2)).
    let base = 10000.0 * 3f64.powf(8.0 / 6.0);
    let (f, _) = dy.inv_freq(200);
    assert!(close(f[1], 1.0 / base.powf(2.0 / 8.0)), "{f:?}");
    // Partial rotary: half of head_dim 8 rotates.
    let p = RopeConfig::from_hub(
        &params(serde_json::json!({"rope_type": "default"})),
        8,
        0.5,
        2048,
        None,
    )
    .unwrap();
    assert_eq!(p.rotary_dim, 4);
}

fn d_default(r: usize, theta: f64) -> Vec<f64> {
    (0..r / 2)
        .map(|i| (1.0 / theta.powf(2.0 * i as f64 / r as f64)) as f32 as f64)
        .collect()
}

#[test]
fn rope_llama3_keeps_high_and_divides_low_frequencies() {
    let cfg = RopeConfig::from_hub(
        &params(serde_json::json!({"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})),
        128,
        1.0,
        131072,
        None,
    )
    .unwrap();
    let (f, s) = cfg.inv_freq(1);
    let base = d_default(128, 500000.0);
    assert_eq!(s, 1.0);
    let mut blended = 0;
    for (i, (&g, &b)) in f.iter().zip(&base).enumerate() {
        let wavelen = 2.0 * std::f64::consts::PI / b;
        if wavelen < 2048.0 {
            assert!(close(g, b), "dim {i} high frequency kept");
        } else if wavelen > 8192.0 {
            assert!(close(g, b / 8.0), "dim {i} low frequency divided");
        } else {
            blended += 1;
            assert!(
                g > b / 8.0 * (1.0 - 1e-6) && g < b * (1.0 + 1e-6),
                "dim {i} blended in between"
            );
        }
    }
    assert!(blended > 0);
}

#[test]
fn rope_yarn_ramp_and_attention_factor() {
    // Without a factor, the original context in rope_parameters makes it 16384 / 4096 = 4.
    let cfg = RopeConfig::from_hub(
        &params(serde_json::json!({"rope_type": "yarn", "rope_theta": 10000.0, "factor": null, "original_max_position_embeddings": 4096})),
        64,
        1.0,
        16384,
        None,
    )
    .unwrap();
    assert!(matches!(cfg.scaling, RopeScaling::Yarn { factor, .. } if factor == 4.0));
    // A written factor is kept whatever the contexts (transformers 5; its tester's rope test
    // sets factor 10 over an original 16384 on a 512-position model).
    let written = RopeConfig::from_hub(
        &params(serde_json::json!({"rope_type": "yarn", "factor": 10.0, "original_max_position_embeddings": 16384})),
        16,
        1.0,
        512,
        None,
    )
    .unwrap();
    assert!(matches!(
        written.scaling,
        RopeScaling::Yarn { factor, original_max_position_embeddings: 16384, .. } if factor == 10.0
    ));
    let (f, s) = cfg.inv_freq(1);
    assert!(close(s, 0.1 * 4f64.ln() + 1.0), "{s}");
    let base = d_default(64, 10000.0);
    // Ramp bounds for beta 32/1 over 4096 positions are dims 10 and 23.
    for i in 0..=10 {
        assert!(close(f[i], base[i]), "dim {i} extrapolated");
    }
    for i in 23..32 {
        assert!(
            close(f[i], (base[i] / 4.0) as f32 as f64),
            "dim {i} interpolated"
        );
    }
    let mscaled = RopeConfig::from_hub(
        &params(serde_json::json!({"rope_type": "yarn", "factor": 40.0, "mscale": 1.0, "mscale_all_dim": 1.0})),
        64,
        1.0,
        4096,
        None,
    )
    .unwrap();
    assert!(close(mscaled.inv_freq(1).1, 1.0));
}

#[test]
fn rope_longrope_switches_factor_sets() {
    let short: Vec<f64> = (0..4).map(|i| 1.0 + i as f64 * 0.1).collect();
    let long: Vec<f64> = (0..4).map(|i| 2.0 + i as f64).collect();
    let cfg = RopeConfig::from_hub(
        &params(serde_json::json!({"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": short, "long_factor": long})),
        8,
        1.0,
        131072,
        Some(4096),
    )
    .unwrap();
    let base = d_default(8, 10000.0);
    let (fs, s) = cfg.inv_freq(100);
    let (fl, _) = cfg.inv_freq(5000);
    assert!(close(s, (1.0 + 32f64.ln() / 4096f64.ln()).sqrt()), "{s}");
    for i in 0..4 {
        assert!(close(fs[i], (base[i] / short[i]) as f32 as f64));
        assert!(close(fl[i], (base[i] / long[i]) as f32 as f64));
    }
    let bad = RopeConfig::from_hub(
        &params(
            serde_json::json!({"rope_type": "longrope", "short_factor": [1.0], "long_factor": [1.0], "factor": 2.0}),
        ),
        8,
        1.0,
        100,
        None,
    );
    assert!(matches!(bad, Err(Error::RopeConfig(_))));
    let unknown = RopeConfig::from_hub(
        &params(serde_json::json!({"rope_type": "spiral"})),
        8,
        1.0,
        100,
        None,
    );
    assert!(matches!(unknown, Err(Error::RopeConfig(m)) if m.contains("spiral")));
}

#[test]
fn rotary_embedding_rotates_pairs_by_position() {
    let cfg = RopeConfig::default_rope(10000.0, 8, 128).unwrap();
    for style in [RopeStyle::RotateHalf, RopeStyle::Interleaved] {
        let rope = RotaryEmbedding::new(cfg.clone(), style);
        let dev = Device::Cpu;
        let q = Tensor::randn(&[1, 2, 5, 8], DType::F32, &dev, 3).unwrap();
        let pos = Tensor::arange(0.0, 5.0, 1.0, DType::I64, &dev).unwrap();
        let (qr, kr) = rope.apply(&q, &q, &pos).unwrap();
        let (a, b, k) = (
            q.to_vec::<f32>().unwrap(),
            qr.to_vec::<f32>().unwrap(),
            kr.to_vec::<f32>().unwrap(),
        );
        assert_eq!(b, k);
        // Position 0 is the identity; rotations preserve each pair's norm.
        let pair = |i: usize| {
            if style == RopeStyle::RotateHalf {
                (i, i + 4)
            } else {
                (2 * i, 2 * i + 1)
            }
        };
        for h in 0..2 {
            for t in 0..5 {
                let row = (h * 5 + t) * 8;
                for p in 0..4 {
                    let (x, y) = pair(p);
                    let n0 = a[row + x].hypot(a[row + y]);
                    let n1 = b[row + x].hypot(b[row + y]);
                    assert!((n0 - n1).abs() < 1e-5);
                    if t == 0 {
                        assert!((a[row + x] - b[row + x]).abs() < 1e-6);
                    }
                }
            }
        }
        // The angle of pair 0 at position t is t radians (inv_freq[0] = 1).
        let (cos, sin) = rope.cos_sin(&pos, DType::F64).unwrap();
        let (c, s) = (cos.to_vec::<f64>().unwrap(), sin.to_vec::<f64>().unwrap());
        assert_eq!(cos.shape(), &[5, 4]);
        assert!(
            ((c[3 * 4]) - 3f32.cos() as f64).abs() < 1e-6
                && (s[3 * 4] - 3f32.sin() as f64).abs() < 1e-6
        );
    }
}
