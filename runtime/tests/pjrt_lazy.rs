//! The lazy PJRT backend beyond op semantics (which the conformance suite covers): four
//! devices, the executable caches (memory and disk, corrupt and foreign entries), compile
//! errors, out-of-memory, leaks, and the StableHLO it emits. Runs on the XLA CPU plugin of
//! `ZOO_PJRT_CPU_PLUGIN` (exported by scripts/run-tests.sh; unset fails).
//!
//! The tests share process-wide counters and caches, so they take turns on one lock.

#[path = "pjrt_common/mod.rs"]
mod common;

use std::sync::{Mutex, MutexGuard};

use common::device;
use zoo_runtime::nn::Linear;
use zoo_runtime::pjrt::{leak, PjrtError};
use zoo_runtime::{lazy, DType, Device, Error, PjrtPlatform, Precision, Tensor};

const VAR: &str = "ZOO_PJRT_CPU_PLUGIN";

fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

fn f32s(n: usize, seed: u64) -> Vec<f32> {
    let mut g = zoo_runtime::Generator::new(seed);
    (0..n).map(|_| g.next_normal() as f32).collect()
}

fn close(a: &[f32], b: &[f32], tol: f32) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| (x - y).abs() <= tol * (1.0 + y.abs()))
}

#[test]
fn four_devices_compute_and_copy() {
    let _g = serial();
    common::setup(VAR);
    assert_eq!(
        lazy::device_count(PjrtPlatform::Cpu).expect("device count"),
        4
    );
    let a = f32s(12, 1);
    let b = f32s(12, 2);
    let ea = Tensor::from_slice(&a, &[3, 4], &Device::Cpu).expect("a");
    let eb = Tensor::from_slice(&b, &[4, 3], &Device::Cpu).expect("b");
    let want = ea
        .matmul(&eb)
        .and_then(|y| y.tanh())
        .and_then(|y| y.add_scalar(1.0))
        .and_then(|y| y.to_vec::<f32>())
        .expect("eager");
    for i in 0..4 {
        let x = Tensor::from_slice(&a, &[3, 4], &device(i)).expect("upload");
        let w = eb.to_device(&device(i)).expect("to_device");
        let y = x
            .matmul(&w)
            .and_then(|y| y.tanh())
            .and_then(|y| y.add_scalar(1.0))
            .expect("record");
        assert_eq!(y.device(), device(i));
        assert!(y.is_pending());
        assert!(
            close(&y.to_vec::<f32>().expect("read"), &want, 1e-5),
            "device {i}"
        );
        // Device to device: 0 -> i -> (i + 1) % 4, computing on each.
        let z = y.to_device(&device((i + 1) % 4)).expect("copy");
        assert_eq!(z.device(), device((i + 1) % 4));
        let back = z
            .mul_scalar(2.0)
            .and_then(|t| t.to_device(&Device::Cpu))
            .and_then(|t| t.to_vec::<f32>())
            .expect("compute after copy");
        let want2: Vec<f32> = want.iter().map(|v| v * 2.0).collect();
        assert!(close(&back, &want2, 1e-5));
    }
    // Operands on two devices are refused, naming both.
    let x0 = Tensor::ones(&[2], DType::F32, &device(0)).expect("x0");
    let x1 = Tensor::ones(&[2], DType::F32, &device(1)).expect("x1");
    match x0.add(&x1) {
        Err(e @ Error::DeviceMismatch { .. }) => {
            assert!(e.to_string().contains("pjrt:cpu:0") && e.to_string().contains("pjrt:cpu:1"))
        }
        other => panic!("expected a device mismatch, got {other:?}"),
    }
    // A device the client does not have.
    match Tensor::zeros(&[2], DType::F32, &device(4)) {
        Err(e @ Error::Pjrt { .. }) => assert!(
            e.to_string().contains("pjrt:cpu:4") && e.to_string().contains("4 device"),
            "{e}"
        ),
        other => panic!("expected a typed error for device 4, got {other:?}"),
    }
}

/// One step of a toy decoder: project the token state, write it into a fixed-size cache at
/// `pos`, attend over the cache, pick the next state.
fn step(
    cache: &Tensor,
    x: &Tensor,
    pos: &Tensor,
    w: &Tensor,
) -> zoo_runtime::Result<(Tensor, Tensor)> {
    let h = x.matmul(w)?.tanh()?; // [1, 8]
    let cache = cache.dynamic_update_slice(&h.unsqueeze(0)?, pos)?; // [1, 16, 8]
    let scores = cache
        .matmul(&h.unsqueeze(0)?.transpose(1, 2)?)?
        .squeeze(-1)?; // [1, 16]
    let p = scores.softmax(-1)?;
    let next = p.unsqueeze(1)?.matmul(&cache)?.squeeze(1)?; // [1, 8]
    Ok((cache, next))
}

/// The toy decoder on `d`: an empty cache, the first state and the weight (seeded: the same
/// values on every device).
struct Toy {
    cache: Tensor,
    x: Tensor,
    w: Tensor,
}

impl Toy {
    fn new(d: &Device, seed: u64) -> Toy {
        Toy {
            cache: Tensor::zeros(&[1, 16, 8], DType::F32, d).expect("cache"),
            x: Tensor::from_slice(&f32s(8, seed + 1), &[1, 8], d).expect("x"),
            w: Tensor::from_slice(&f32s(64, seed), &[8, 8], d).expect("w"),
        }
    }

    /// Step `t` (writing cache slot `t`): the new cache and state, not yet taken in.
    fn step(&self, t: i64) -> (Tensor, Tensor) {
        let pos = Tensor::from_slice(&[0i64, t, 0], &[3], &self.cache.device()).expect("pos");
        step(&self.cache, &self.x, &pos, &self.w).expect("step")
    }
}

#[test]
fn decode_steps_after_the_first_compile_nothing() {
    let _g = serial();
    common::setup(VAR);
    let (mut lazy_toy, mut eager) = (Toy::new(&device(1), 3), Toy::new(&Device::Cpu, 3));
    lazy_toy.cache.sync().expect("the initial cache");
    let mut compiles_after_first = 0;
    for t in 0..6 {
        let before = lazy::stats();
        let (c, x) = lazy_toy.step(t);
        let got = x.to_vec::<f32>().expect("read");
        let after = lazy::stats();
        // The cache written this step was live, so it ran in the same graph.
        assert!(
            !c.is_pending(),
            "step {t}: the live cache was not materialised with the output"
        );
        assert_eq!(
            after.executions - before.executions,
            1,
            "step {t}: one graph per step"
        );
        if t > 0 {
            compiles_after_first += after.compiles - before.compiles;
            assert!(after.memory_hits > before.memory_hits);
        }
        let (c2, x2) = eager.step(t);
        assert!(
            close(&got, &x2.to_vec::<f32>().expect("eager"), 1e-5),
            "step {t}"
        );
        (lazy_toy.cache, lazy_toy.x, eager.cache, eager.x) = (c, x, c2, x2);
    }
    assert_eq!(compiles_after_first, 0, "steps 2..6 compiled");
    let cache_l = lazy_toy.cache.to_vec::<f32>().expect("cache");
    assert!(close(
        &cache_l,
        &eager.cache.to_vec::<f32>().expect("cache"),
        1e-5
    ));
}

/// `dispatch` hands a step's graph to the device and returns: the next step is recorded from
/// the results of one still being computed (a decode loop running ahead of its reads), the
/// values are the eager ones, and the device's waits for the host are counted.
#[test]
fn dispatched_steps_run_ahead_of_their_reads() {
    let _g = serial();
    common::setup(VAR);
    let (mut lazy_toy, mut eager) = (Toy::new(&device(2), 5), Toy::new(&Device::Cpu, 5));
    let before = lazy::stats();
    let mut outputs = Vec::new();
    for t in 0..6 {
        let (c, x) = lazy_toy.step(t);
        x.dispatch().expect("dispatch");
        assert!(
            !x.is_pending() && !c.is_pending(),
            "step {t} was not dispatched"
        );
        // Waiting for the step before keeps one step queued (the diffusion loop's pattern).
        lazy_toy.x.block_until_ready().expect("the step before");
        let (c2, x2) = eager.step(t);
        outputs.push((x.clone(), x2.clone()));
        (lazy_toy.cache, lazy_toy.x, eager.cache, eager.x) = (c, x, c2, x2);
    }
    let after = lazy::stats();
    assert_eq!(after.dispatched - before.dispatched, 6);
    assert_eq!(after.executions - before.executions, 6);
    // Read only now, in order: every step's value is the eager one.
    for (t, (l, e)) in outputs.iter().enumerate() {
        let got = l.to_vec::<f32>().expect("read");
        assert!(
            close(&got, &e.to_vec::<f32>().expect("eager"), 1e-5),
            "step {t}"
        );
    }
    // The device waits while the host sleeps between two programs, and that wait is counted.
    let idle = lazy::stats().idle_nanos;
    std::thread::sleep(std::time::Duration::from_millis(30));
    lazy_toy
        .x
        .add_scalar(1.0)
        .and_then(|y| y.to_vec::<f32>())
        .expect("one more program");
    let waited = lazy::stats().idle_nanos - idle;
    assert!(waited >= 30_000_000, "idle {waited} ns after a 30 ms sleep");
}

/// Norms, softmax, rotary embedding and attention are one recorded node each (a decoder
/// step records a few nodes per layer, not dozens) and agree with the eager backend.
#[test]
fn composites_record_one_node_each() {
    let _g = serial();
    common::setup(VAR);
    let d = device(0);
    let both = |data: &[f32], shape: &[usize]| {
        (
            Tensor::from_slice(data, shape, &d).expect("lazy"),
            Tensor::from_slice(data, shape, &Device::Cpu).expect("eager"),
        )
    };
    let (x, ex) = both(&f32s(64, 5), &[1, 2, 4, 8]);
    let (k, ek) = both(&f32s(48, 6), &[1, 1, 6, 8]);
    let (c, ec) = both(&f32s(12, 7), &[4, 3]);
    let (s, es) = both(&f32s(12, 8), &[4, 3]);
    let keep: Vec<u8> = (0..24).map(|i| (i % 5 != 3) as u8).collect();
    let mask = Tensor::from_slice(&keep, &[4, 6], &d)
        .and_then(|m| m.to_dtype(DType::Bool))
        .expect("mask");
    let emask = Tensor::from_slice(&keep, &[4, 6], &Device::Cpu)
        .and_then(|m| m.to_dtype(DType::Bool))
        .expect("mask");
    mask.sync().expect("mask");
    // Operands: x, k, cos, sin, mask.
    type Case = fn(&[&Tensor; 5]) -> zoo_runtime::Result<Tensor>;
    let cases: [(&str, Case); 6] = [
        ("rms_norm", |t| t[0].rms_norm(None, 1e-6)),
        ("layer_norm", |t| t[0].layer_norm(None, None, 1e-5)),
        ("softmax", |t| t[0].softmax(2)),
        ("apply_rotary rotate-half, partial", |t| {
            t[0].apply_rotary(t[2], t[3], zoo_runtime::RopeStyle::RotateHalf)
        }),
        ("apply_rotary interleaved, partial", |t| {
            t[0].apply_rotary(t[2], t[3], zoo_runtime::RopeStyle::Interleaved)
        }),
        ("attention: GQA, bool mask, causal", |t| {
            let opts = zoo_runtime::SdpaOptions {
                mask: Some(t[4]),
                causal: true,
                ..Default::default()
            };
            Tensor::scaled_dot_product_attention(t[0], t[1], t[1], &opts)
        }),
    ];
    for (name, f) in cases {
        let before = lazy::stats();
        let got = f(&[&x, &k, &c, &s, &mask])
            .and_then(|y| y.to_vec::<f32>())
            .expect(name);
        let after = lazy::stats();
        assert_eq!(after.traced_nodes - before.traced_nodes, 1, "{name}");
        let want = f(&[&ex, &ek, &ec, &es, &emask])
            .and_then(|y| y.to_vec::<f32>())
            .expect(name);
        assert!(close(&got, &want, 1e-5), "{name}: {got:?} vs {want:?}");
    }
}

/// Attention whose scores pass 16M elements lowers to a loop over query chunks (the last
/// one clamped, since 1501 rows do not divide 3001 evenly twice) and agrees with the eager
/// backend: grouped heads, a bool mask that varies along the queries, causal positions.
#[test]
fn long_attention_runs_in_query_chunks() {
    let _g = serial();
    common::setup(VAR);
    let d = device(0);
    let n = 3001;
    let keep: Vec<u8> = (0..n * n).map(|i| (i % 7 != 3) as u8).collect();
    let run = |dev: &Device| {
        let t = |data: Vec<f32>, shape: &[usize]| Tensor::from_slice(&data, shape, dev);
        let q = t(f32s(2 * n * 8, 11), &[1, 2, n, 8])?;
        let k = t(f32s(n * 8, 12), &[1, 1, n, 8])?;
        let v = t(f32s(n * 8, 13), &[1, 1, n, 8])?;
        let mask = Tensor::from_slice(&keep, &[n, n], dev)?.to_dtype(DType::Bool)?;
        let opts = zoo_runtime::SdpaOptions {
            mask: Some(&mask),
            causal: true,
            ..Default::default()
        };
        Tensor::scaled_dot_product_attention(&q, &k, &v, &opts)
    };
    let lazy_out = run(&d).expect("lazy attention");
    let text = lazy_out.stablehlo().expect("lazy").expect("lowers");
    assert!(
        text.contains("stablehlo.while"),
        "no query loop in the program"
    );
    let got = lazy_out.to_vec::<f32>().expect("runs");
    let want = run(&Device::Cpu)
        .and_then(|y| y.to_vec::<f32>())
        .expect("eager attention");
    assert!(
        close(&got, &want, 1e-5),
        "chunked attention differs from eager"
    );
}

#[test]
fn disk_cache_is_reused_and_bad_entries_are_recompiled() {
    let _g = serial();
    let dir = common::setup(VAR);
    let d = device(0);
    // A graph no other test builds: its own shape.
    let run = |seed: u64| -> Vec<f32> {
        let x = Tensor::from_slice(&f32s(7 * 13, seed), &[7, 13], &d).expect("x");
        x.exp()
            .and_then(|e| e.sum(&[1], false))
            .and_then(|s| s.to_vec::<f32>())
            .expect("run")
    };
    let entries = || -> Vec<std::path::PathBuf> {
        let mut v: Vec<_> = std::fs::read_dir(&dir)
            .expect("ls")
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "zpx"))
            .collect();
        v.sort();
        v
    };
    let before_files = entries();
    let s0 = lazy::stats();
    let want = run(5);
    let s1 = lazy::stats();
    assert_eq!(s1.compiles - s0.compiles, 1);
    assert_eq!(s1.disk_writes - s0.disk_writes, 1);
    let new: Vec<_> = entries()
        .into_iter()
        .filter(|p| !before_files.contains(p))
        .collect();
    assert_eq!(new.len(), 1, "one new cache entry");
    let entry = new[0].clone();

    // Memory miss, disk hit: no compile, same values.
    lazy::clear_memory_cache();
    assert_eq!(run(5), want);
    let s2 = lazy::stats();
    assert_eq!(
        (s2.compiles - s1.compiles, s2.disk_hits - s1.disk_hits),
        (0, 1)
    );

    // Corrupt payload: detected, removed, recompiled, rewritten.
    let mut bytes = std::fs::read(&entry).expect("read entry");
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x5a;
    std::fs::write(&entry, &bytes).expect("corrupt");
    lazy::clear_memory_cache();
    assert_eq!(run(5), want);
    let s3 = lazy::stats();
    assert_eq!(
        (s3.compiles - s2.compiles, s3.disk_rejects - s2.disk_rejects),
        (1, 1)
    );
    assert!(lazy::last_disk_reject()
        .unwrap_or_default()
        .contains("checksum"));
    assert!(std::fs::read(&entry).expect("rewritten") != bytes);

    // An entry written by another plugin version (same length header, other version).
    let good = std::fs::read(&entry).expect("entry");
    let identity = lazy::plugin_identity(PjrtPlatform::Cpu).expect("identity");
    let at = good
        .windows(identity.len())
        .position(|w| w == identity.as_bytes())
        .expect("the header names the plugin");
    let mut foreign = good.clone();
    let api = identity.find("api=").expect("api field") + 4;
    foreign[at + api] = if foreign[at + api] == b'9' {
        b'8'
    } else {
        b'9'
    };
    std::fs::write(&entry, &foreign).expect("foreign");
    lazy::clear_memory_cache();
    assert_eq!(run(5), want);
    let s4 = lazy::stats();
    assert_eq!(
        (s4.compiles - s3.compiles, s4.disk_rejects - s3.disk_rejects),
        (1, 1)
    );
    assert!(lazy::last_disk_reject()
        .unwrap_or_default()
        .contains("another plugin"));

    // Not a cache file at all, and a truncated one.
    for bad in [
        b"definitely not an executable".to_vec(),
        good[..good.len() / 3].to_vec(),
    ] {
        std::fs::write(&entry, &bad).expect("garbage");
        lazy::clear_memory_cache();
        let s = lazy::stats();
        assert_eq!(run(5), want);
        let t = lazy::stats();
        assert_eq!(
            (t.compiles - s.compiles, t.disk_rejects - s.disk_rejects),
            (1, 1)
        );
    }
    // Other leaf values, same structure: a memory hit.
    let s5 = lazy::stats();
    assert_ne!(run(6), want);
    assert_eq!(lazy::stats().compiles, s5.compiles);
    // No temporary files remain.
    assert!(std::fs::read_dir(&dir)
        .expect("ls")
        .filter_map(|e| e.ok())
        .all(|e| !e.file_name().to_string_lossy().ends_with(".tmp")));
}

#[test]
fn compile_errors_show_the_offending_line() {
    let _g = serial();
    common::setup(VAR);
    let text = "module {\n  func.func public @main(%arg0: tensor<4xf32>) -> (tensor<4xf32>) {\n    %1 = \"stablehlo.add\"(%arg0, %arg0) : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>\n    %2 = \"stablehlo.frobnicate\"(%1) : (tensor<4xf32>) -> tensor<4xf32>\n    \"func.return\"(%2) : (tensor<4xf32>) -> ()\n  }\n}\n";
    match lazy::compile_stablehlo(zoo_runtime::PjrtDevice::new(PjrtPlatform::Cpu, 0), text) {
        Err(
            e @ Error::Pjrt {
                source: PjrtError::Compile { line: Some(_), .. },
                ..
            },
        ) => {
            let Error::Pjrt {
                source: PjrtError::Compile { line: Some(l), .. },
                ..
            } = &e
            else {
                unreachable!()
            };
            assert_eq!(l.line, 4, "{e}");
            assert!(l.text.contains("frobnicate"));
            assert!(
                e.to_string().contains("frobnicate") && e.to_string().contains("pjrt:cpu:0"),
                "{e}"
            );
        }
        other => panic!("expected a compile error with a line, got {other:?}"),
    }
}

#[test]
fn out_of_memory_is_a_typed_error() {
    let _g = serial();
    common::setup(VAR);
    let d = device(2);
    lazy::device_count(PjrtPlatform::Cpu).expect("client");
    lazy::clear_memory_cache();
    let before = leak::object_counts();
    // 2^42 f32 (16 TiB): no allocator on this machine grants it.
    let one = Tensor::from_slice(&[1.0f32], &[1], &d).expect("one");
    let huge = Tensor::zeros(&[1 << 42], DType::F32, &d)
        .and_then(|z| z.add(&one))
        .expect("recorded lazily");
    match huge.sync() {
        Err(e @ Error::OutOfMemory { .. }) => assert!(e.to_string().contains("pjrt:cpu:2"), "{e}"),
        other => panic!("expected an out-of-memory error, got {other:?}"),
    }
    // The device still works afterwards, even while the failing tensor is alive (pending
    // tensors normally join every graph of their device).
    assert_eq!(
        one.mul_scalar(3.0)
            .and_then(|t| t.to_vec::<f32>())
            .expect("with the failing tensor alive"),
        vec![3.0]
    );
    drop(huge);
    assert_eq!(
        one.add_scalar(1.0)
            .and_then(|t| t.to_vec::<f32>())
            .expect("after OOM"),
        vec![2.0]
    );
    drop(one);
    lazy::clear_memory_cache();
    let delta = leak::object_counts().since(&before);
    assert!(delta.balanced(), "the failed execution leaked:\n{delta}");
}

#[test]
fn nothing_leaks() {
    let _g = serial();
    common::setup(VAR);
    lazy::device_count(PjrtPlatform::Cpu).expect("client");
    lazy::clear_memory_cache();
    let before = leak::object_counts();
    {
        let d = device(3);
        let x = Tensor::from_slice(&f32s(24, 9), &[2, 3, 4], &d).expect("x");
        let y = x
            .softmax(-1)
            .and_then(|s| s.matmul(&x.transpose(1, 2)?))
            .expect("y");
        let z = y
            .to_device(&device(0))
            .and_then(|t| t.sum_all())
            .expect("z");
        z.to_vec::<f32>().expect("read");
        let pending = x.exp().expect("never materialised");
        drop(pending);
        let err = x.add(&Tensor::ones(&[5], DType::F32, &d).expect("ones"));
        assert!(err.is_err());
    }
    lazy::clear_memory_cache();
    let delta = leak::object_counts().since(&before);
    assert!(delta.balanced(), "unbalanced PJRT objects:\n{delta}");
    assert!(
        delta.created(leak::ObjectKind::Buffer) > 0
            && delta.created(leak::ObjectKind::LoadedExecutable) > 0
    );
}

#[test]
fn emitted_stablehlo_and_precision() {
    let _g = serial();
    common::setup(VAR);
    let d = device(0);
    let a = Tensor::from_slice(&f32s(6, 1), &[2, 3], &d).expect("a");
    let b = Tensor::from_slice(&f32s(6, 2), &[3, 2], &d).expect("b");
    let y = a.matmul(&b).and_then(|y| y.erf()).expect("y");
    let text = y.stablehlo().expect("a lazy tensor").expect("lowers");
    assert!(text.contains("func.func public @main(%arg0: tensor<2x3xf32>, %arg1: tensor<3x2xf32>) -> (tensor<2x2xf32>)"), "{text}");
    assert!(
        text.contains("stablehlo.dot_general")
            && text.contains("precision DEFAULT")
            && text.contains("chlo.erf"),
        "{text}"
    );
    lazy::set_matmul_precision(Precision::Highest);
    let text_hi = y.stablehlo().expect("lazy").expect("lowers");
    let hi = y.to_vec::<f32>();
    lazy::set_matmul_precision(Precision::Default);
    assert!(text_hi.contains("precision HIGHEST"), "{text_hi}");
    hi.expect("HIGHEST runs");
    // Once computed, the tensor is a leaf: nothing left to lower, and eager tensors have none.
    assert!(!y.is_pending());
    assert!(Tensor::zeros(&[1], DType::F32, &Device::Cpu)
        .expect("eager")
        .stablehlo()
        .is_none());
}

/// q/k/v-shaped layers stacked into one (`Linear::concat_rows`) give each layer's output
/// where it was, with and without biases; eager layers, and mixed biases, stay separate.
#[test]
fn stacked_projections_equal_the_separate_layers() {
    let _g = serial();
    common::setup(VAR);
    let d = device(1);
    let rows = [6usize, 2, 2];
    for bias in [false, true] {
        let layers: Vec<Linear> = rows
            .iter()
            .enumerate()
            .map(|(i, &r)| {
                let w = Tensor::from_slice(&f32s(r * 5, 20 + i as u64), &[r, 5], &d).expect("w");
                let b = bias
                    .then(|| Tensor::from_slice(&f32s(r, 30 + i as u64), &[r], &d).expect("bias"));
                Linear::new(w, b)
            })
            .collect();
        let refs: Vec<&Linear> = layers.iter().collect();
        let stacked = Linear::concat_rows(&refs)
            .expect("stacks")
            .expect("PJRT layers stack");
        assert!(
            !stacked.weight().expect("weight").is_pending(),
            "materialised once"
        );
        let x = Tensor::from_slice(&f32s(15, 40), &[1, 3, 5], &d).expect("x");
        let y = stacked
            .forward(&x)
            .expect("stacked")
            .to_vec::<f32>()
            .expect("read");
        let mut start = 0;
        for (l, &r) in layers.iter().zip(&rows) {
            let want = l.forward(&x).expect("one").to_vec::<f32>().expect("read");
            let got: Vec<f32> = (0..3)
                .flat_map(|t| y[t * 10 + start..t * 10 + start + r].to_vec())
                .collect();
            assert!(close(&got, &want, 1e-6), "bias {bias}: {got:?} vs {want:?}");
            start += r;
        }
    }
    let eager = |r: usize, b: bool| {
        let w = Tensor::from_slice(&f32s(r * 5, 50), &[r, 5], &Device::Cpu).expect("w");
        Linear::new(
            w,
            b.then(|| Tensor::zeros(&[r], DType::F32, &Device::Cpu).expect("b")),
        )
    };
    let (e1, e2) = (eager(3, false), eager(4, false));
    assert!(Linear::concat_rows(&[&e1, &e2]).expect("eager").is_none());
    let on = |l: &Linear| {
        Linear::new(
            l.weight().expect("w").to_device(&d).expect("up"),
            l.bias.as_ref().map(|b| b.to_device(&d).expect("up")),
        )
    };
    let (p1, p2) = (on(&eager(3, true)), on(&eager(4, false)));
    assert!(Linear::concat_rows(&[&p1, &p2]).expect("mixed").is_none());
}

/// A bf16 `Linear` with a bias: one `dot_general` from the bf16 operands into f32 sums (the
/// accelerators' native form; no widened weight in the graph), the bias added to the sums and
/// one rounding, as the eager layer (and PyTorch's `addmm`) computes it.
#[test]
fn bf16_linear_with_bias_contracts_into_f32_sums() {
    let _g = serial();
    common::setup(VAR);
    let d = device(2);
    let (n, k) = (6usize, 40usize);
    let bf = |v: &[f32], shape: &[usize], dev: &Device| {
        Tensor::from_slice(v, shape, dev)
            .and_then(|t| t.to_dtype(DType::BF16))
            .expect("bf16")
    };
    let (w, b) = (f32s(n * k, 60), f32s(n, 61));
    let layer = |dev: &Device| Linear::new(bf(&w, &[n, k], dev), Some(bf(&b, &[n], dev)));
    for rows in [1usize, 3] {
        let x = f32s(rows * k, 62);
        let y = layer(&d).forward(&bf(&x, &[rows, k], &d)).expect("device");
        assert_eq!(y.dtype(), DType::BF16);
        let text = y.stablehlo().expect("a lazy tensor").expect("lowers");
        let dots: Vec<&str> = text
            .lines()
            .filter(|l| l.contains("stablehlo.dot_general"))
            .collect();
        assert!(
            dots.len() == 1 && dots[0].contains("xbf16>) -> tensor<") && dots[0].ends_with("xf32>"),
            "rows {rows}: {text}"
        );
        assert!(
            !text.contains(&format!("(tensor<{n}x{k}xbf16>) -> tensor<{n}x{k}xf32>")),
            "rows {rows}: the weight is widened in the graph: {text}"
        );
        let got = y.to_vec_f64().expect("read");
        let want = layer(&Device::Cpu)
            .forward(&bf(&x, &[rows, k], &Device::Cpu))
            .and_then(|t| t.to_vec_f64())
            .expect("eager");
        let (got, want): (Vec<f32>, Vec<f32>) = (
            got.iter().map(|&v| v as f32).collect(),
            want.iter().map(|&v| v as f32).collect(),
        );
        // Both sum exact products in f32, in their own orders, and round once: at most a
        // bf16 step apart.
        assert!(
            close(&got, &want, 1.0 / 128.0),
            "rows {rows}: {got:?} vs {want:?}"
        );
    }
}

/// `cache` `[2, 8, 4]` with `update` `[2, 1, 4]` written at row `row`, on the host.
fn write_row(cache: &[f32], update: &[f32], row: usize) -> Vec<f32> {
    let mut out = cache.to_vec();
    for b in 0..2 {
        for c in 0..4 {
            out[b * 32 + row * 4 + c] = update[b * 4 + c];
        }
    }
    out
}

#[test]
fn cache_updates_donate_leaves_no_tensor_holds() {
    let _g = serial();
    common::setup(VAR);
    let d = device(2);
    let init = f32s(64, 11);
    let upd = f32s(8, 12);
    let u = Tensor::from_slice(&upd, &[2, 1, 4], &d).expect("update");
    let at = |row: i64| Tensor::from_slice(&[0i64, row, 0], &[3], &d).expect("start");

    // The decode pattern: the old cache handle is replaced, so only the pending update reads
    // the old buffer, which is donated to it (consumed by the plugin: it reads as deleted).
    let mut cache = Tensor::from_slice(&init, &[2, 8, 4], &d).expect("cache");
    // Readers see an update through a barrier, so XLA neither duplicates it into each
    // reader nor copies the donated buffer for the duplicates.
    let text = Tensor::from_slice(&init, &[2, 8, 4], &d)
        .and_then(|c| c.dynamic_update_slice(&u, &at(0)))
        .and_then(|c| c.stablehlo().expect("lazy"))
        .expect("lowers");
    assert!(text.contains("stablehlo.optimization_barrier"), "{text}");
    let mut want = init.clone();
    let s0 = lazy::stats();
    for row in [3usize, 5, 0] {
        let before = lazy::stats();
        cache = cache
            .dynamic_update_slice(&u, &at(row as i64))
            .expect("update");
        want = write_row(&want, &upd, row);
        assert_eq!(cache.to_vec::<f32>().expect("read"), want, "row {row}");
        let after = lazy::stats();
        assert_eq!(
            after.donated_buffers - before.donated_buffers,
            1,
            "row {row}: the unheld cache leaf was not donated"
        );
    }
    let s1 = lazy::stats();
    assert_eq!(s1.compiles - s0.compiles, 1, "steps 2 and 3 compiled");

    // The same structure with the old cache still held: nothing is donated, the held value
    // stays readable and unchanged, and the aliasing executable is not reused for it.
    let held = Tensor::from_slice(&init, &[2, 8, 4], &d).expect("held");
    let next = held.dynamic_update_slice(&u, &at(3)).expect("update");
    assert_eq!(
        next.to_vec::<f32>().expect("read"),
        write_row(&init, &upd, 3)
    );
    let s2 = lazy::stats();
    assert_eq!(
        s2.donated_buffers, s1.donated_buffers,
        "a held leaf was donated"
    );
    assert_eq!(
        s2.compiles - s1.compiles,
        1,
        "the graph without donation must be its own executable"
    );
    assert_eq!(held.to_vec::<f32>().expect("the held cache"), init);
    // And it is cached under its own key: again, no compile and still no donation.
    let again = held.dynamic_update_slice(&u, &at(4)).expect("update");
    assert_eq!(
        again.to_vec::<f32>().expect("read"),
        write_row(&init, &upd, 4)
    );
    let s3 = lazy::stats();
    assert_eq!(
        (s3.compiles, s3.donated_buffers),
        (s2.compiles, s2.donated_buffers)
    );
    assert_eq!(held.to_vec::<f32>().expect("the held cache"), init);

    // A donated leaf that another live tensor of the same graph also reads: both values are
    // right (XLA orders the read before the in-place write).
    let old = Tensor::from_slice(&init, &[2, 8, 4], &d).expect("old");
    let doubled = old.mul_scalar(2.0).expect("doubled");
    let updated = old.dynamic_update_slice(&u, &at(7)).expect("update");
    drop(old);
    let before = lazy::stats();
    Tensor::sync_all(&[&doubled, &updated]).expect("one graph");
    assert_eq!(lazy::stats().donated_buffers - before.donated_buffers, 1);
    assert_eq!(
        updated.to_vec::<f32>().expect("read"),
        write_row(&init, &upd, 7)
    );
    let twice: Vec<f32> = init.iter().map(|v| v * 2.0).collect();
    assert_eq!(doubled.to_vec::<f32>().expect("read"), twice);

    // A one-element upload shares its buffer with every equal upload: never donated, even
    // when its own handle is gone.
    let five = Tensor::from_slice(&[5.0f32], &[1], &d).expect("five");
    let six = five.add_scalar(1.0).expect("six");
    drop(five);
    let before = lazy::stats();
    assert_eq!(six.to_vec::<f32>().expect("read"), vec![6.0]);
    assert_eq!(lazy::stats().donated_buffers, before.donated_buffers);
    let five_again = Tensor::from_slice(&[5.0f32], &[1], &d).expect("five");
    assert_eq!(five_again.to_vec::<f32>().expect("shared"), vec![5.0]);
}

/// Threads sharing a device each run the decode pattern (unheld cache leaves donated to their
/// updates) at once, and every value stays right. A thread's materialisation takes the other
/// threads' pending nodes along; before materialisation held one lock per device, two threads
/// could run the same nodes and one read a leaf the other had donated ("buffer has been
/// deleted or donated"), which split models generating on shared devices in parallel
/// (transformers/tests/pjrt.rs) hit.
#[test]
fn threads_sharing_a_device_never_read_a_donated_buffer() {
    let _g = serial();
    common::setup(VAR);
    let d = device(3);
    let handles: Vec<_> = (0..4u64)
        .map(|t| {
            std::thread::spawn(move || {
                // Big enough that runs take a while and overlap.
                let (rows, width) = (64usize, 4096usize);
                let init = f32s(rows * width, 20 + t);
                let upd = f32s(width, 30 + t);
                let u = Tensor::from_slice(&upd, &[1, width], &d).expect("update");
                let mut cache = Tensor::from_slice(&init, &[rows, width], &d).expect("cache");
                let mut want = init.clone();
                for i in 0..20usize {
                    let row = (i * 7 + t as usize) % rows;
                    let at = Tensor::from_slice(&[row as i64, 0], &[2], &d).expect("at");
                    cache = cache.dynamic_update_slice(&u, &at).expect("update");
                    want[row * width..(row + 1) * width].copy_from_slice(&upd);
                    // A reduction over the whole cache: work for the plugin each step.
                    let total = cache.sum(&[0, 1], false).expect("sum");
                    let got = total.to_vec::<f32>().expect("read")[0];
                    let exp: f32 = want.iter().sum();
                    assert!(
                        (got - exp).abs() <= 1e-2 * (1.0 + exp.abs()),
                        "thread {t} step {i}"
                    );
                }
                assert_eq!(cache.to_vec::<f32>().expect("read"), want, "thread {t}");
            })
        })
        .collect();
    for h in handles {
        h.join().expect("a thread failed");
    }
}

#[test]
fn tensors_on_a_mesh_compute_what_one_device_does() {
    let _g = serial();
    common::mesh_checks(VAR);
}
