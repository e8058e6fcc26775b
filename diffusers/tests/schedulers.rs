//! Every scheduler case of `tests/data/schedulers` (written by
//! `nightly/reference/schedulers.py` from diffusers itself): the timesteps, sigmas and
//! `init_noise_sigma` zoo derives from the case's `scheduler_config.json`, then a 10-step
//! trace on the case's fixed model outputs and noise — each scaled model input and each
//! sample — on candle's CPU and on the XLA CPU plugin, against diffusers' numbers. Cases with a
//! `timesteps.json` pass its `mu` / `sigmas` to `set_timesteps`, as flow pipelines do.

use std::path::{Path, PathBuf};

use safetensors::SafeTensors;
use zoo_diffusers::schedulers::TimestepOptions;
use zoo_diffusers::{Scheduler, SchedulerConfig};
use zoo_runtime::{lazy, Device, PjrtDevice, PjrtPlatform, Tensor};

fn data() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/schedulers")
}

fn cases() -> Vec<PathBuf> {
    let v = cases_in(&data());
    assert!(v.len() >= 30, "scheduler cases missing: {v:?}");
    v
}

/// The case folders under `dir`, sorted.
fn cases_in(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("scheduler_config.json").exists())
        .collect();
    v.sort();
    v
}

/// A tensor of the trace as (shape, f64 values).
fn read(st: &SafeTensors<'_>, name: &str) -> (Vec<usize>, Vec<f64>) {
    let t = st.tensor(name).unwrap_or_else(|_| panic!("{name} missing"));
    let b = t.data();
    let values = match t.dtype() {
        safetensors::Dtype::F32 => b
            .chunks(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()) as f64)
            .collect(),
        safetensors::Dtype::F64 => b
            .chunks(8)
            .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
            .collect(),
        other => panic!("{name}: {other:?}"),
    };
    (t.shape().to_vec(), values)
}

fn tensor(shape: &[usize], values: &[f64], device: &Device) -> Tensor {
    let v: Vec<f32> = values.iter().map(|&x| x as f32).collect();
    Tensor::from_vec(v, shape, device).unwrap()
}

/// Row `i` of a stacked `[n, ...]` trace tensor.
fn row<'a>(shape: &[usize], values: &'a [f64], i: usize) -> (Vec<usize>, &'a [f64]) {
    let per: usize = shape[1..].iter().product();
    (shape[1..].to_vec(), &values[i * per..(i + 1) * per])
}

/// Within 1e-4 relative, plus the f32 rounding of values as large as `scale` (a step from a
/// sigma in the thousands, as zero-SNR schedules start, cancels numbers that large: a few
/// of their ulps are the floor of any f32 port's agreement).
fn assert_close(got: &Tensor, want: &[f64], scale: f64, what: &str) {
    let g = got
        .to_dtype(zoo_runtime::DType::F32)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    assert_eq!(g.len(), want.len(), "{what}: length");
    let floor = 16.0 * f32::EPSILON as f64 * scale;
    let worst = g
        .iter()
        .zip(want)
        .map(|(&a, &b)| ((a as f64 - b).abs() - floor).max(0.0) / (1.0 + b.abs()))
        .fold(0.0, f64::max);
    assert!(
        worst <= 1e-4,
        "{what}: max relative difference {worst:e} beyond the f32 floor {floor:e}"
    );
}

/// The largest magnitude in `t`.
fn max_abs(t: &Tensor) -> f64 {
    let v = t
        .to_dtype(zoo_runtime::DType::F32)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    v.iter().fold(0.0f64, |m, x| m.max(x.abs() as f64))
}

fn run_case(dir: &Path, device: &Device) {
    let name = dir.file_name().unwrap().to_string_lossy().to_string();
    // A config zoo refuses on purpose (`refused.json`: the field, its value and why): the
    // refusal must name the value.
    if let Ok(text) = std::fs::read_to_string(dir.join("refused.json")) {
        let refused: serde_json::Value = serde_json::from_str(&text).unwrap();
        let value = refused["value"].as_str().unwrap();
        let err = SchedulerConfig::from_file(dir).and_then(|c| c.build());
        let err = err
            .err()
            .unwrap_or_else(|| panic!("{name}: zoo runs what it should refuse"));
        assert!(err.to_string().contains(value), "{name}: {err}");
        return;
    }
    let config = SchedulerConfig::from_file(dir).unwrap_or_else(|e| panic!("{name}: {e}"));
    let step_kwargs: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("step.json")).unwrap()).unwrap();
    let mut scheduler: Box<dyn Scheduler> =
        config.build().unwrap_or_else(|e| panic!("{name}: {e}"));
    let bytes = std::fs::read(dir.join("trace.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let (_, timesteps) = read(&st, "timesteps");
    // The `set_timesteps` arguments beyond the step count (flow pipelines' `mu` and `sigmas`,
    // custom timesteps or sigmas), and the step count where it is not 10, as the case has them.
    let (options, steps) = match std::fs::read_to_string(dir.join("timesteps.json")) {
        Ok(text) => {
            let v: serde_json::Value = serde_json::from_str(&text).unwrap();
            let options = TimestepOptions {
                sigmas: v["sigmas"]
                    .as_array()
                    .map(|a| a.iter().map(|x| x.as_f64().unwrap()).collect()),
                mu: v["mu"].as_f64(),
                timesteps: v["timesteps"]
                    .as_array()
                    .map(|a| a.iter().map(|x| x.as_f64().unwrap()).collect()),
            };
            (options, v["num_inference_steps"].as_u64().unwrap_or(10))
        }
        Err(_) => (TimestepOptions::default(), 10),
    };
    scheduler
        .set_timesteps_with(steps as usize, &options)
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    if let Some(eta) = step_kwargs.get("eta").and_then(|v| v.as_f64()) {
        assert!(scheduler.set_eta(eta as f32), "{name}: eta");
    }
    assert_eq!(
        scheduler.timesteps().len(),
        timesteps.len(),
        "{name}: timesteps {:?}",
        scheduler.timesteps()
    );
    for (g, w) in scheduler.timesteps().iter().zip(&timesteps) {
        assert!(
            (g - w).abs() <= 1e-4 * (1.0 + w.abs()),
            "{name}: timesteps {:?} vs {timesteps:?}",
            scheduler.timesteps()
        );
    }
    if st.names().contains(&"sigmas") {
        let (_, sigmas) = read(&st, "sigmas");
        let got = scheduler.sigmas().expect("sigmas");
        assert_eq!(got.len(), sigmas.len(), "{name}: sigmas");
        for (g, w) in got.iter().zip(&sigmas) {
            assert!(
                (*g as f64 - w).abs() <= 1e-6 * (1.0 + w.abs()),
                "{name}: sigmas {got:?} vs {sigmas:?}"
            );
        }
    }
    let (_, init) = read(&st, "init_noise_sigma");
    let got = scheduler.init_noise_sigma();
    assert!(
        (got - init[0]).abs() <= 1e-6 * (1.0 + init[0]),
        "{name}: init_noise_sigma {got} vs {}",
        init[0]
    );

    let (sshape, sample) = read(&st, "sample");
    let (oshape, outputs) = read(&st, "model_outputs");
    let (nshape, noise) = read(&st, "noise");
    let (ishape, inputs) = read(&st, "model_inputs");
    let (xshape, samples) = read(&st, "samples");
    let mut x = tensor(&sshape, &sample, device)
        .mul(&Tensor::from_f64s(&[got], &[1], zoo_runtime::DType::F32, device).unwrap())
        .unwrap();
    for i in 0..timesteps.len() {
        let scale = max_abs(&x);
        let input = scheduler.scale_model_input(&x, i).unwrap();
        assert_close(
            &input,
            row(&ishape, &inputs, i).1,
            scale,
            &format!("{name} on {device}: model input {i}"),
        );
        let (s, o) = row(&oshape, &outputs, i);
        let out = tensor(&s, o, device);
        let noise_i = scheduler.needs_noise(i).then(|| {
            let (s, n) = row(&nshape, &noise, i);
            tensor(&s, n, device)
        });
        x = scheduler
            .step(&out, i, &x, noise_i.as_ref())
            .unwrap_or_else(|e| panic!("{name}: step {i}: {e}"));
        assert_close(
            &x,
            row(&xshape, &samples, i).1,
            scale,
            &format!("{name} on {device}: sample {i}"),
        );
    }
}

#[test]
fn schedulers_match_diffusers_on_candle_cpu() {
    for dir in cases() {
        run_case(&dir, &Device::Cpu);
    }
}

#[test]
fn schedulers_match_diffusers_on_the_xla_cpu_plugin() {
    let plugin = std::env::var_os("ZOO_PJRT_CPU_PLUGIN")
        .filter(|v| !v.is_empty())
        .expect("ZOO_PJRT_CPU_PLUGIN is not set: run the tests through scripts/run-tests.sh, which downloads the PJRT CPU plugins");
    lazy::configure(PjrtPlatform::Cpu, Some(PathBuf::from(plugin)), Some(4)).unwrap();
    let cache = tempfile::tempdir().unwrap();
    lazy::set_cache_dir(Some(cache.path().to_path_buf()));
    let device = Device::Pjrt(PjrtDevice::new(PjrtPlatform::Cpu, 0));
    let before = lazy::stats().compiles;
    let cases = cases();
    for dir in &cases {
        run_case(dir, &device);
    }
    // Coefficients are inputs, not constants: a case's steps share their programs, so the
    // cases of (mostly) 10 steps compile far fewer programs than they run steps.
    let compiles = lazy::stats().compiles - before;
    assert!(
        compiles < 4 * cases.len() as u64,
        "{compiles} compiles for {} cases",
        cases.len()
    );
}

/// The scheduler tests' own configs (`schedulers.py --tester DIR`, hundreds of cases; run by
/// `scripts/tester-sweep.sh`, which generates them and sets `ZOO_SCHEDULER_CASES`): every
/// case on candle's CPU and on the XLA CPU plugin, each failure named, the count printed.
#[test]
#[ignore = "the scheduler tester sweep: scripts/tester-sweep.sh generates its cases and runs it"]
fn scheduler_tester_configs_match_diffusers() {
    let dir = std::env::var_os("ZOO_SCHEDULER_CASES")
        .map(PathBuf::from)
        .expect("ZOO_SCHEDULER_CASES names the folder of `schedulers.py --tester` cases");
    let plugin = std::env::var_os("ZOO_PJRT_CPU_PLUGIN")
        .filter(|v| !v.is_empty())
        .expect("ZOO_PJRT_CPU_PLUGIN is not set: run scripts/fetch-test-assets.sh");
    lazy::configure(PjrtPlatform::Cpu, Some(PathBuf::from(plugin)), Some(4)).unwrap();
    let pjrt = Device::Pjrt(PjrtDevice::new(PjrtPlatform::Cpu, 0));
    let cases = cases_in(&dir);
    assert!(!cases.is_empty(), "no scheduler cases in {}", dir.display());
    let mut failed = Vec::new();
    for case in &cases {
        for device in [&Device::Cpu, &pjrt] {
            let run = std::panic::catch_unwind(|| run_case(case, device));
            if let Err(e) = run {
                let msg = e
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                failed.push(format!("{} on {device}: {msg}", case.display()));
            }
        }
    }
    println!(
        "scheduler tester configs: {} of {} cases passed on candle-cpu and pjrt-cpu",
        cases.len()
            - failed
                .iter()
                .map(|f| f.split(" on ").next())
                .collect::<std::collections::BTreeSet<_>>()
                .len(),
        cases.len()
    );
    assert!(
        failed.is_empty(),
        "{} failures:\n{}",
        failed.len(),
        failed.join("\n")
    );
}

#[test]
fn bad_configs_are_refused_naming_the_class_or_field() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("scheduler_config.json");
    std::fs::write(&path, r#"{"_class_name": "HeunDiscreteScheduler"}"#).unwrap();
    let err = SchedulerConfig::from_file(&path)
        .unwrap()
        .build()
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("HeunDiscreteScheduler") && err.contains("DDIMScheduler"),
        "{err}"
    );
    std::fs::write(&path, r#"{"beta_schedule": "linear"}"#).unwrap();
    let err = SchedulerConfig::from_file(&path).unwrap_err().to_string();
    assert!(err.contains("_class_name"), "{err}");
    std::fs::write(
        &path,
        r#"{"_class_name": "DDIMScheduler", "beta_schedule": "quadratic"}"#,
    )
    .unwrap();
    let err = SchedulerConfig::from_file(&path)
        .unwrap()
        .build()
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("quadratic") && err.contains("scheduler_config.json"),
        "{err}"
    );
    let mut s =
        SchedulerConfig::from_json(serde_json::json!({"_class_name": "DDIMScheduler"}), &path)
            .unwrap()
            .build()
            .unwrap();
    assert!(s.set_timesteps(0).is_err());
    assert!(s.set_timesteps(1001).is_err());
    let x = Tensor::zeros(&[1, 4, 2, 2], zoo_runtime::DType::F32, &Device::Cpu).unwrap();
    let err = s.step(&x, 0, &x, None).unwrap_err().to_string();
    assert!(err.contains("set_timesteps"), "{err}");
    // Swapping the class keeps the fields, as Scheduler.from_config does.
    let euler = SchedulerConfig::from_file(&data().join("ddim-sd15"))
        .unwrap()
        .with_class("EulerDiscreteScheduler");
    assert_eq!(
        euler.build().unwrap().class_name(),
        "EulerDiscreteScheduler"
    );
    // Flow matching: dynamic shifting needs the pipeline's `mu`; other schedulers refuse
    // `mu` and custom sigmas; sigmas outside (0, 1] and a terminal of 1 are refused.
    let flow = |json: serde_json::Value| SchedulerConfig::from_json(json, &path).unwrap().build();
    let mut s = flow(serde_json::json!({
        "_class_name": "FlowMatchEulerDiscreteScheduler", "use_dynamic_shifting": true
    }))
    .unwrap();
    let err = s.set_timesteps(10).unwrap_err().to_string();
    assert!(err.contains("mu"), "{err}");
    let bad_sigmas = TimestepOptions {
        sigmas: Some(vec![1.0, 1.5]),
        mu: Some(1.0),
        ..Default::default()
    };
    let err = s
        .set_timesteps_with(2, &bad_sigmas)
        .unwrap_err()
        .to_string();
    assert!(err.contains("(0, 1]"), "{err}");
    let short = TimestepOptions {
        sigmas: Some(vec![1.0, 0.5]),
        mu: Some(1.0),
        ..Default::default()
    };
    let err = s.set_timesteps_with(3, &short).unwrap_err().to_string();
    assert!(err.contains("2 sigmas given for 3"), "{err}");
    let err = flow(serde_json::json!({
        "_class_name": "FlowMatchEulerDiscreteScheduler", "shift_terminal": 1.0
    }))
    .unwrap_err()
    .to_string();
    assert!(err.contains("shift_terminal"), "{err}");
    let mut ddim = flow(serde_json::json!({"_class_name": "DDIMScheduler"})).unwrap();
    let err = ddim
        .set_timesteps_with(
            10,
            &TimestepOptions {
                mu: Some(0.5),
                ..Default::default()
            },
        )
        .unwrap_err()
        .to_string();
    assert!(err.contains("DDIMScheduler") && err.contains("mu"), "{err}");
    // Custom timesteps: Euler and DPM-Solver take them (their count is the step count), not
    // with Karras sigmas; flow matching asks for sigmas instead.
    let custom = TimestepOptions {
        timesteps: Some(vec![999.0, 500.0, 1.0]),
        ..Default::default()
    };
    let mut euler = flow(serde_json::json!({"_class_name": "EulerDiscreteScheduler"})).unwrap();
    euler.set_timesteps_with(0, &custom).unwrap();
    assert_eq!(euler.timesteps(), [999.0, 500.0, 1.0]);
    let err = euler
        .set_timesteps_with(4, &custom)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("3 steps") && err.contains("4 inference steps"),
        "{err}"
    );
    let mut karras = flow(serde_json::json!({
        "_class_name": "DPMSolverMultistepScheduler", "use_karras_sigmas": true
    }))
    .unwrap();
    let err = karras
        .set_timesteps_with(3, &custom)
        .unwrap_err()
        .to_string();
    assert!(err.contains("Karras"), "{err}");
    let mut s =
        flow(serde_json::json!({"_class_name": "FlowMatchEulerDiscreteScheduler"})).unwrap();
    let err = s.set_timesteps_with(3, &custom).unwrap_err().to_string();
    assert!(err.contains("sigmas"), "{err}");
    let err = ddim.set_timesteps_with(3, &custom).unwrap_err().to_string();
    assert!(err.contains("custom timesteps"), "{err}");
}
