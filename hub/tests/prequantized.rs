//! Pre-quantized checkpoints from the reference generator (compressed-tensors, FP8): the GGUF
//! blocks zoo keeps hold exactly the values it dequantizes; what it does not apply is refused.

use std::path::Path;

use zoo_hub::{PreQuantized, Weights};

fn open(case: &str) -> (Weights, PreQuantized) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../nightly/fixtures")
        .join(case);
    let weights = Weights::from_safetensors(&[dir.join("model.safetensors")]).unwrap();
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    let c = PreQuantized::open(&config, &weights, &dir.join("config.json"))
        .unwrap()
        .expect("a pre-quantized checkpoint");
    (weights, c)
}

#[test]
fn kept_blocks_hold_the_dequantized_values() {
    for (case, ggml) in [
        ("llama-w4a16-f32", zoo_hub::GgmlType::Q4_0),
        ("qwen2-w8a16-f32", zoo_hub::GgmlType::Q8_0),
    ] {
        let (weights, c) = open(case);
        let names: Vec<String> = c.names().map(str::to_string).collect();
        assert_eq!(names.len(), 14, "{case}: {names:?}");
        for name in &names {
            let dense = c.dequantize(&weights, name).unwrap();
            let (kind, blocks) = c.blocks(&weights, name).unwrap().expect("kept as blocks");
            assert_eq!(kind, ggml);
            let (_, bytes) = c.block_type(&weights, name).unwrap().unwrap();
            assert_eq!(bytes, blocks.len() as u64);
            let back = zoo_hub::gguf::dequantize(kind, &blocks, dense.len()).unwrap();
            assert_eq!(back, dense, "{case} {name}");
        }
    }
}

#[test]
fn bf16_scales_and_fp8_values_load_dequantized() {
    // Scales as computed (not f16-exact) and FP8 values have no exact block form.
    for case in ["llama-w4a16-asym-bf16", "llama-fp8-bf16"] {
        let (weights, c) = open(case);
        let name = "model.layers.0.self_attn.q_proj.weight";
        assert_eq!(c.get(name).unwrap().shape, [64, 64]);
        assert!(c.is_part("model.layers.0.self_attn.q_proj.weight_scale"));
        let dense = c.dequantize(&weights, name).unwrap();
        assert_eq!(dense.len(), 64 * 64);
        assert!(dense.iter().all(|x| x.is_finite()) && dense.iter().any(|x| *x != 0.0));
    }
}

#[test]
fn fp8_blocks_dequantize_and_static_activations_are_refused() {
    let (weights, c) = open("llama-fp8-blocks-f32");
    let name = "model.layers.0.mlp.down_proj.weight";
    assert_eq!(c.get(name).unwrap().shape, [64, 96]);
    assert!(c.is_part("model.layers.0.mlp.down_proj.weight_scale_inv"));
    assert!(c.blocks(&weights, name).unwrap().is_none());
    assert_eq!(c.dequantize(&weights, name).unwrap().len(), 64 * 96);

    let dir =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../nightly/fixtures/llama-fp8-blocks-f32");
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    config["quantization_config"]["activation_scheme"] = "static".into();
    let e = PreQuantized::open(&config, &weights, &dir.join("config.json")).unwrap_err();
    assert!(e.to_string().contains("activation_scheme"), "{e}");
}
