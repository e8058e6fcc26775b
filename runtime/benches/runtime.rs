//! zoo vs candle-core doing the same work directly, on CPU (release: `cargo bench -p zoo-runtime`).
//!
//! Prints the best-of-N time of each side and the ratio zoo / candle (target <= 1.1: the
//! wrapper adds validation and dispatch, never copies). Runs are interleaved so background
//! load hits both sides alike. With a PyTorch at `.venv/bin/python` the matmul is also timed
//! there with 2 threads.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use candle_core::{DType as CD, Tensor as CT, D};
use zoo_runtime::nn::{Linear, MemWeights, RmsNorm, RopeConfig, RotaryEmbedding, Weights};
use zoo_runtime::{DType, Device, Generator, RopeStyle, SdpaOptions, Tensor};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// Best time of `n` interleaved runs of each closure.
fn race(
    n: usize,
    mut a: impl FnMut() -> Res<()>,
    mut b: impl FnMut() -> Res<()>,
) -> Res<(Duration, Duration)> {
    a()?;
    b()?;
    let (mut ta, mut tb) = (Duration::MAX, Duration::MAX);
    for _ in 0..n {
        let t = Instant::now();
        a()?;
        ta = ta.min(t.elapsed());
        let t = Instant::now();
        b()?;
        tb = tb.min(t.elapsed());
    }
    Ok((ta, tb))
}

fn report(name: &str, zoo: Duration, candle: Duration) {
    println!(
        "{name:<34} zoo {:>9.3} ms   candle {:>9.3} ms   ratio {:.3}",
        zoo.as_secs_f64() * 1e3,
        candle.as_secs_f64() * 1e3,
        zoo.as_secs_f64() / candle.as_secs_f64()
    );
}

// SmolLM-135M's decoder layer: hidden 576, 9 query heads, 3 key/value heads, MLP 1536.
const HIDDEN: usize = 576;
const HEADS: usize = 9;
const KV_HEADS: usize = 3;
const HEAD_DIM: usize = 64;
const MLP: usize = 1536;
const EPS: f64 = 1e-5;

struct ZooLayer {
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    gate: Linear,
    up: Linear,
    down: Linear,
    ln1: RmsNorm,
    ln2: RmsNorm,
    rope: RotaryEmbedding,
}

impl ZooLayer {
    fn load(w: &Weights) -> zoo_runtime::Result<ZooLayer> {
        let a = w.pp("self_attn");
        let m = w.pp("mlp");
        Ok(ZooLayer {
            q: Linear::load(&a.pp("q_proj"), HIDDEN, HEADS * HEAD_DIM, false)?,
            k: Linear::load(&a.pp("k_proj"), HIDDEN, KV_HEADS * HEAD_DIM, false)?,
            v: Linear::load(&a.pp("v_proj"), HIDDEN, KV_HEADS * HEAD_DIM, false)?,
            o: Linear::load(&a.pp("o_proj"), HEADS * HEAD_DIM, HIDDEN, false)?,
            gate: Linear::load(&m.pp("gate_proj"), HIDDEN, MLP, false)?,
            up: Linear::load(&m.pp("up_proj"), HIDDEN, MLP, false)?,
            down: Linear::load(&m.pp("down_proj"), MLP, HIDDEN, false)?,
            ln1: RmsNorm::load(&w.pp("input_layernorm"), HIDDEN, EPS)?,
            ln2: RmsNorm::load(&w.pp("post_attention_layernorm"), HIDDEN, EPS)?,
            rope: RotaryEmbedding::new(
                RopeConfig::default_rope(10000.0, HEAD_DIM, 2048)?,
                RopeStyle::RotateHalf,
            ),
        })
    }

    /// `cos`/`sin` and `mask` are built once per forward pass and shared by all layers.
    fn forward(
        &self,
        x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        mask: &Tensor,
    ) -> zoo_runtime::Result<Tensor> {
        let (b, t) = (x.shape()[0] as isize, x.shape()[1] as isize);
        let n = self.ln1.forward(x)?;
        let heads = |y: Tensor, h: usize| {
            y.reshape(&[b, t, h as isize, HEAD_DIM as isize])?
                .transpose(1, 2)
        };
        let q = heads(self.q.forward(&n)?, HEADS)?;
        let k = heads(self.k.forward(&n)?, KV_HEADS)?;
        let v = heads(self.v.forward(&n)?, KV_HEADS)?;
        let q = q.apply_rotary(cos, sin, RopeStyle::RotateHalf)?;
        let k = k.apply_rotary(cos, sin, RopeStyle::RotateHalf)?;
        let opts = SdpaOptions {
            mask: Some(mask),
            ..Default::default()
        };
        let a = Tensor::scaled_dot_product_attention(&q, &k, &v, &opts)?;
        let a = a.transpose(1, 2)?.reshape(&[b, t, -1])?;
        let x = x.add(&self.o.forward(&a)?)?;
        let n = self.ln2.forward(&x)?;
        let m = self.gate.forward(&n)?.silu()?.mul(&self.up.forward(&n)?)?;
        x.add(&self.down.forward(&m)?)
    }
}

/// The same layer written against candle-core directly, the way a candle-core user would.
struct CandleLayer {
    w: std::collections::HashMap<String, CT>,
    cos: CT,
    sin: CT,
    mask: CT,
}

fn c_linear(x: &CT, w: &CT) -> candle_core::Result<CT> {
    let (b, t, i) = x.dims3()?;
    x.reshape((b * t, i))?
        .matmul(&w.t()?)?
        .reshape((b, t, w.dim(0)?))
}

fn c_rms(x: &CT, w: &CT) -> candle_core::Result<CT> {
    let ms = x.sqr()?.mean_keepdim(D::Minus1)?;
    x.broadcast_mul(&(ms + EPS)?.sqrt()?.recip()?)?
        .broadcast_mul(w)
}

fn c_rope(x: &CT, cos: &CT, sin: &CT) -> candle_core::Result<CT> {
    let h = HEAD_DIM / 2;
    let (x1, x2) = (x.narrow(D::Minus1, 0, h)?, x.narrow(D::Minus1, h, h)?);
    let o1 = (x1.broadcast_mul(cos)? - x2.broadcast_mul(sin)?)?;
    let o2 = (x2.broadcast_mul(cos)? + x1.broadcast_mul(sin)?)?;
    CT::cat(&[&o1, &o2], D::Minus1)
}

fn c_repeat_kv(x: &CT, n: usize) -> candle_core::Result<CT> {
    let (b, h, t, d) = x.dims4()?;
    x.unsqueeze(2)?
        .broadcast_as((b, h, n, t, d))?
        .reshape((b, h * n, t, d))
}

impl CandleLayer {
    fn forward(&self, x: &CT) -> candle_core::Result<CT> {
        let w = |n: &str| &self.w[n];
        let (b, t, _) = x.dims3()?;
        let n = c_rms(x, w("input_layernorm.weight"))?;
        let heads = |y: CT, h: usize| y.reshape((b, t, h, HEAD_DIM))?.transpose(1, 2);
        let q = heads(c_linear(&n, w("self_attn.q_proj.weight"))?, HEADS)?;
        let k = heads(c_linear(&n, w("self_attn.k_proj.weight"))?, KV_HEADS)?;
        let v = heads(c_linear(&n, w("self_attn.v_proj.weight"))?, KV_HEADS)?;
        let q = c_rope(&q, &self.cos, &self.sin)?;
        let k = c_rope(&k, &self.cos, &self.sin)?;
        let k = c_repeat_kv(&k, HEADS / KV_HEADS)?;
        let v = c_repeat_kv(&v, HEADS / KV_HEADS)?;
        let s =
            (q.matmul(&k.t()?)? * (1.0 / (HEAD_DIM as f64).sqrt()))?.broadcast_add(&self.mask)?;
        let m = s.max_keepdim(D::Minus1)?;
        let e = s.broadcast_sub(&m)?.exp()?;
        let p = e.broadcast_div(&e.sum_keepdim(D::Minus1)?)?;
        let a = p
            .matmul(&v)?
            .transpose(1, 2)?
            .reshape((b, t, HEADS * HEAD_DIM))?;
        let x = (x + c_linear(&a, w("self_attn.o_proj.weight"))?)?;
        let n = c_rms(&x, w("post_attention_layernorm.weight"))?;
        let g = c_linear(&n, w("mlp.gate_proj.weight"))?.silu()?;
        let m = (g * c_linear(&n, w("mlp.up_proj.weight"))?)?;
        x + c_linear(&m, w("mlp.down_proj.weight"))?
    }
}

fn torch_matmul_ms(n: usize) -> Option<f64> {
    let py = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/python");
    if !py.exists() {
        return None;
    }
    let script = format!(
        "import torch, time\ntorch.set_num_threads(2)\na=torch.randn({n},{n});b=torch.randn({n},{n})\n\
         [a@b for _ in range(3)]\nbest=1e9\nfor _ in range(10):\n t=time.perf_counter();a@b;best=min(best,time.perf_counter()-t)\nprint(best*1e3)"
    );
    let out = std::process::Command::new(py)
        .arg("-c")
        .arg(script)
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout).trim().parse().ok()
}

fn main() -> Res<()> {
    let dev = Device::Cpu;
    println!("zoo-runtime vs candle-core 0.11 (CPU, best of N, interleaved)");

    // f32 matmul 1024^3 on the very same buffers.
    let n = 1024;
    let a = Tensor::randn(&[n, n], DType::F32, &dev, 1)?;
    let b = Tensor::randn(&[n, n], DType::F32, &dev, 2)?;
    let (ca, cb) = (
        a.as_candle().ok_or("eager")?.clone(),
        b.as_candle().ok_or("eager")?.clone(),
    );
    let (tz, tc) = race(
        10,
        || {
            black_box(a.matmul(&b)?);
            Ok(())
        },
        || {
            black_box(ca.matmul(&cb)?);
            Ok(())
        },
    )?;
    report("matmul f32 1024x1024x1024", tz, tc);
    match torch_matmul_ms(n) {
        Some(ms) => println!(
            "{:<34} torch {ms:>7.3} ms (2 threads)   zoo / torch {:.3}",
            "matmul f32 1024^3 vs PyTorch",
            tz.as_secs_f64() * 1e3 / ms
        ),
        None => println!("matmul vs PyTorch: skipped (no torch at .venv/bin/python)"),
    }

    // One llama decoder layer, 576 wide, over a 128-token prompt.
    let t = 128;
    let mut g = Generator::new(3);
    let shapes: [(&str, [usize; 2]); 7] = [
        ("self_attn.q_proj.weight", [HEADS * HEAD_DIM, HIDDEN]),
        ("self_attn.k_proj.weight", [KV_HEADS * HEAD_DIM, HIDDEN]),
        ("self_attn.v_proj.weight", [KV_HEADS * HEAD_DIM, HIDDEN]),
        ("self_attn.o_proj.weight", [HIDDEN, HEADS * HEAD_DIM]),
        ("mlp.gate_proj.weight", [MLP, HIDDEN]),
        ("mlp.up_proj.weight", [MLP, HIDDEN]),
        ("mlp.down_proj.weight", [HIDDEN, MLP]),
    ];
    let mut mem = MemWeights::new();
    let mut cw = std::collections::HashMap::new();
    for (name, s) in shapes {
        let w = g.randn(&s, DType::F32, &dev)?.affine(0.04, 0.0)?;
        cw.insert(name.to_string(), w.as_candle().ok_or("eager")?.clone());
        mem.insert(format!("model.layers.0.{name}"), w);
    }
    for name in ["input_layernorm.weight", "post_attention_layernorm.weight"] {
        let w = g.rand(&[HIDDEN], DType::F32, &dev)?.add_scalar(0.5)?;
        cw.insert(name.to_string(), w.as_candle().ok_or("eager")?.clone());
        mem.insert(format!("model.layers.0.{name}"), w);
    }
    let weights = Weights::new(Arc::new(mem), DType::F32, dev);
    let layer = ZooLayer::load(&weights.pp("model.layers.0"))?;
    let x = g.randn(&[1, t, HIDDEN], DType::F32, &dev)?;
    let pos = Tensor::arange(0.0, t as f64, 1.0, DType::I64, &dev)?;
    let (cos, sin) = layer.rope.cos_sin(&pos, DType::F32)?;
    let mut maskv = vec![0f32; t * t];
    for i in 0..t {
        for j in i + 1..t {
            maskv[i * t + j] = f32::NEG_INFINITY;
        }
    }
    let clayer = CandleLayer {
        w: cw,
        cos: cos.as_candle().ok_or("eager")?.clone(),
        sin: sin.as_candle().ok_or("eager")?.clone(),
        mask: CT::from_vec(maskv, (t, t), &candle_core::Device::Cpu)?,
    };
    let cx = x.as_candle().ok_or("eager")?.clone();
    // Same numbers from both sides before timing them.
    let zmask = Tensor::from_candle(clayer.mask.clone())?;
    let zy = layer.forward(&x, &cos, &sin, &zmask)?.to_vec::<f32>()?;
    let cy = clayer
        .forward(&cx)?
        .to_dtype(CD::F32)?
        .flatten_all()?
        .to_vec1::<f32>()?;
    let maxdiff = zy
        .iter()
        .zip(&cy)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    println!("decoder layer outputs agree to {maxdiff:.2e}");
    let (tz, tc) = race(
        20,
        || {
            black_box(layer.forward(&x, &cos, &sin, &zmask)?);
            Ok(())
        },
        || {
            black_box(clayer.forward(&cx)?);
            Ok(())
        },
    )?;
    report("llama decoder layer 576, T=128", tz, tc);

    // Decode step shape: one token against the layer.
    let x1 = x.narrow(1, 0, 1)?;
    let p1 = Tensor::arange(0.0, 1.0, 1.0, DType::I64, &dev)?;
    let cx1 = x1.as_candle().ok_or("eager")?.clone();
    let zmask1 = Tensor::zeros(&[1, 1], DType::F32, &dev)?;
    let (c1, s1) = layer.rope.cos_sin(&p1, DType::F32)?;
    let clayer1 = CandleLayer {
        cos: c1.as_candle().ok_or("eager")?.clone(),
        sin: s1.as_candle().ok_or("eager")?.clone(),
        mask: CT::zeros((1, 1), CD::F32, &candle_core::Device::Cpu)?,
        ..clayer
    };
    let (tz, tc) = race(
        50,
        || {
            black_box(layer.forward(&x1, &c1, &s1, &zmask1)?);
            Ok(())
        },
        || {
            black_box(clayer1.forward(&cx1)?);
            Ok(())
        },
    )?;
    report("llama decoder layer 576, T=1", tz, tc);
    Ok(())
}
