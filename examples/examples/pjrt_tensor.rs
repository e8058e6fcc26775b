//! The same Tensor code on the XLA CPU plugin through PJRT: ops record a graph, reading a
//! value compiles it to StableHLO once and runs it; the next call with other values but the
//! same shapes is a cache hit. A loop of steps can run ahead of its reads: `dispatch` hands a
//! step to the device and returns, so the host records the next step while it runs.
//!
//! Run (the plugin comes from `pip install xla-cpu-pjrt`, found by discovery, or name it):
//! `ZOO_PJRT_CPU_PLUGIN=/path/to/xla_cpu_pjrt.so cargo run -p zoo-examples --example pjrt_tensor`

use zoo_runtime::{lazy, DType, Device, PjrtDevice, PjrtPlatform, SdpaOptions, Tensor};

fn attention_block(x: &Tensor, w: &Tensor) -> zoo_runtime::Result<Tensor> {
    // [1, 4, 8] @ [8, 8] -> heads [1, 2, 4, 4] -> causal attention -> [1, 4, 8]
    let h = x.matmul(w)?.reshape(&[1, 4, 2, 4])?.transpose(1, 2)?;
    let opts = SdpaOptions {
        causal: true,
        ..Default::default()
    };
    let a = Tensor::scaled_dot_product_attention(&h, &h, &h, &opts)?;
    a.transpose(1, 2)?.reshape(&[1, 4, 8])?.rms_norm(None, 1e-6)
}

fn main() -> anyhow::Result<()> {
    let dev = Device::Pjrt(PjrtDevice::new(PjrtPlatform::Cpu, 0));
    let w: Vec<f32> = (0..64)
        .map(|i| ((i * 7 % 11) as f32 - 5.0) / 10.0)
        .collect();
    let w = Tensor::from_vec(w, &[8, 8], &dev)?;

    for call in 0..2 {
        let x: Vec<f32> = (0..32).map(|i| ((i + call) as f32 * 0.37).sin()).collect();
        let x = Tensor::from_vec(x, &[1, 4, 8], &dev)?;
        let y = attention_block(&x, &w)?;
        println!("call {call}: {y:?} pending = {}", y.is_pending());
        if call == 0 {
            let text = y.stablehlo().expect("a PJRT tensor")?;
            println!(
                "  lowers to {} lines of StableHLO, starting:",
                text.lines().count()
            );
            for line in text.lines().take(4) {
                println!("    {line}");
            }
        }
        let before = lazy::stats();
        let first_row = y.narrow(1, 0, 1)?.to_vec::<f32>()?;
        let after = lazy::stats();
        println!(
            "  first row {:?}; compiled {} graph(s), cache hits {}",
            &first_row[..4],
            after.compiles - before.compiles,
            after.memory_hits - before.memory_hits
        );
        // The same computation eagerly on the CPU gives the same numbers.
        let eager = attention_block(&x.to_device(&Device::Cpu)?, &w.to_device(&Device::Cpu)?)?;
        let e = eager.narrow(1, 0, 1)?.to_vec::<f32>()?;
        let diff = first_row
            .iter()
            .zip(&e)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        println!("  max |pjrt - eager| = {diff:.2e}");
    }

    // A loop whose step N+1 starts from step N's result: dispatch each step and wait only for
    // the one before, so the device never waits for the host's recording.
    let mut state = Tensor::from_vec(vec![0.1f32; 32], &[1, 4, 8], &dev)?;
    // The first step compiles (the device idles meanwhile); the rest reuse its program.
    state = attention_block(&state, &w)?;
    state.block_until_ready()?;
    let before = lazy::stats();
    for _ in 0..8 {
        let next = attention_block(&state, &w)?;
        next.dispatch()?;
        state.block_until_ready()?;
        state = next;
    }
    let after = lazy::stats();
    println!(
        "8 steps run ahead: {} dispatched, the device idle {:.3} ms between them; last {:?}",
        after.dispatched - before.dispatched,
        (after.idle_nanos - before.idle_nanos) as f64 / 1e6,
        &state.to_vec::<f32>()?[..4]
    );

    // Tensors move between the plugin's devices (ZOO_PJRT_CPU_DEVICES, default 4).
    let n = lazy::device_count(PjrtPlatform::Cpu)?;
    let on_last = Device::Pjrt(PjrtDevice::new(PjrtPlatform::Cpu, n - 1));
    let t = Tensor::arange(0.0, 6.0, 1.0, DType::F32, &dev)?.to_device(&on_last)?;
    println!(
        "on {}: {:?}",
        t.device(),
        t.mul_scalar(2.0)?.to_vec::<f32>()?
    );
    Ok(())
}
