//! The zoo-runtime Tensor API in a few lines: creation, broadcasting, attention with a
//! KV cache written by `dynamic_update_slice`, rotary embeddings and typed errors.
//!
//! Run: `cargo run -p zoo-examples --example tensor_ops`

use zoo_runtime::nn::{RopeConfig, RotaryEmbedding};
use zoo_runtime::{DType, Device, Generator, RopeStyle, SdpaOptions, Tensor};

fn main() -> anyhow::Result<()> {
    let dev = Device::Cpu;
    let mut rng = Generator::new(0);

    // Broadcasting and dtype promotion follow PyTorch: [2, 1, 3] + [4, 3] -> [2, 4, 3].
    let a = rng.randn(&[2, 1, 3], DType::F32, &dev)?;
    let b = Tensor::arange(0.0, 12.0, 1.0, DType::I64, &dev)?.reshape(&[4, 3])?;
    let c = a.add(&b)?;
    println!("{:?} + {:?} = {:?}", a, b, c);

    // A fixed-size KV cache for one layer: [batch, kv_heads, max_len, head_dim].
    let (heads, kv_heads, head_dim, max_len) = (4, 2, 16, 32);
    let mut k_cache = Tensor::zeros(&[1, kv_heads, max_len, head_dim], DType::F32, &dev)?;
    let mut v_cache = k_cache.clone();
    let rope = RotaryEmbedding::new(
        RopeConfig::default_rope(10_000.0, head_dim, max_len)?,
        RopeStyle::RotateHalf,
    );

    for step in 0..3 {
        let pos = Tensor::from_vec(vec![step as i64], &[1], &dev)?;
        let q = rng.randn(&[1, heads, 1, head_dim], DType::F32, &dev)?;
        let k = rng.randn(&[1, kv_heads, 1, head_dim], DType::F32, &dev)?;
        let v = rng.randn(&[1, kv_heads, 1, head_dim], DType::F32, &dev)?;
        let (q, k) = rope.apply(&q, &k, &pos)?;
        // Write at the position tensor: shapes stay static, as compiled backends need.
        let start = Tensor::from_vec(vec![0i64, 0, step as i64, 0], &[4], &dev)?;
        k_cache = k_cache.dynamic_update_slice(&k, &start)?;
        v_cache = v_cache.dynamic_update_slice(&v, &start)?;
        let keys = k_cache.narrow(2, 0, step + 1)?;
        let values = v_cache.narrow(2, 0, step + 1)?;
        let opts = SdpaOptions {
            causal: true,
            ..Default::default()
        };
        let out = Tensor::scaled_dot_product_attention(&q, &keys, &values, &opts)?;
        println!(
            "step {step}: attention output {:?}, first value {:.4}",
            out,
            out.flatten(0, -1)?.to_vec::<f32>()?[0]
        );
    }

    // Bad input is a typed error naming both operands, never a panic.
    let err = a
        .matmul(&b.to_dtype(DType::F32)?.t()?.reshape(&[2, 6])?)
        .unwrap_err();
    println!("typed error: {err}");
    Ok(())
}
