//! compressed-tensors checkpoints from the reference generator: the GGUF blocks zoo keeps
//! hold exactly the values it dequantizes.

use std::path::Path;

use zoo_hub::{CompressedTensors, Weights};

fn open(case: &str) -> (Weights, CompressedTensors) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../nightly/fixtures")
        .join(case);
    let weights = Weights::from_safetensors(&[dir.join("model.safetensors")]).unwrap();
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    let c = CompressedTensors::open(&config, &weights, &dir.join("config.json"))
        .unwrap()
        .expect("a compressed-tensors checkpoint");
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
