//! Helpers the pipeline tests share: a fixture case of `tests/data/pipelines` (its
//! `case.json` and `expected.safetensors`) and max-abs comparisons.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use safetensors::SafeTensors;
use serde_json::Value;
use zoo_runtime::{DType, Device, PjrtDevice, PjrtPlatform, Tensor};

pub fn case_dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/pipelines")
        .join(name)
}

pub struct Case {
    pub dir: PathBuf,
    pub spec: Value,
    pub bytes: Vec<u8>,
}

impl Case {
    pub fn open(name: &str) -> Case {
        let dir = case_dir(name);
        let spec =
            serde_json::from_str(&std::fs::read_to_string(dir.join("case.json")).unwrap()).unwrap();
        let bytes = std::fs::read(dir.join("expected.safetensors")).unwrap();
        Case { dir, spec, bytes }
    }

    pub fn has(&self, name: &str) -> bool {
        SafeTensors::deserialize(&self.bytes)
            .unwrap()
            .tensor(name)
            .is_ok()
    }

    pub fn tensor(&self, name: &str, device: &Device) -> Tensor {
        let st = SafeTensors::deserialize(&self.bytes).unwrap();
        let t = st.tensor(name).unwrap_or_else(|_| panic!("{name} missing"));
        let v: Vec<f32> = t
            .data()
            .chunks(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        Tensor::from_vec(v, t.shape(), device).unwrap()
    }

    pub fn path(&self, sub: &str) -> String {
        self.dir.join(sub).to_string_lossy().into_owned()
    }

    pub fn str(&self, field: &str) -> String {
        self.spec[field].as_str().unwrap().to_string()
    }
}

pub fn max_diff(got: &Tensor, want: &Tensor) -> f64 {
    assert_eq!(got.shape(), want.shape());
    let g = got.to_dtype(DType::F32).unwrap().to_vec_f64().unwrap();
    let w = want.to_vec_f64().unwrap();
    g.iter()
        .zip(&w)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f64::max)
}

pub fn check(got: &Tensor, want: &Tensor, tol: f64, what: &str, report: &mut Vec<String>) {
    let d = max_diff(got, want);
    report.push(format!("{what}: max |diff| {d:.2e}"));
    assert!(d <= tol, "{what}: max |diff| {d:e} > {tol:e}");
}

/// The XLA CPU plugin's device `ordinal`, the plugin configured (4 devices, HIGHEST matmul
/// precision) from `ZOO_PJRT_CPU_PLUGIN`.
pub fn xla_cpu(ordinal: usize) -> Device {
    let plugin = std::env::var_os("ZOO_PJRT_CPU_PLUGIN")
        .filter(|v| !v.is_empty())
        .expect("ZOO_PJRT_CPU_PLUGIN is not set: run the tests through scripts/run-tests.sh, which downloads the PJRT CPU plugins");
    zoo_runtime::lazy::configure(PjrtPlatform::Cpu, Some(PathBuf::from(plugin)), Some(4)).unwrap();
    zoo_runtime::lazy::set_matmul_precision(zoo_runtime::lazy::Precision::Highest);
    Device::Pjrt(PjrtDevice::new(PjrtPlatform::Cpu, ordinal))
}

/// A copy of fixture `name` in a temporary folder, with `edit` applied to it.
pub fn edited_copy(name: &str, edit: impl FnOnce(&std::path::Path)) -> tempfile::TempDir {
    fn copy(from: &std::path::Path, to: &std::path::Path) {
        std::fs::create_dir_all(to).unwrap();
        for e in std::fs::read_dir(from).unwrap() {
            let e = e.unwrap();
            let dest = to.join(e.file_name());
            if e.file_type().unwrap().is_dir() {
                copy(&e.path(), &dest);
            } else {
                std::fs::copy(e.path(), dest).unwrap();
            }
        }
    }
    let dir = tempfile::tempdir().unwrap();
    copy(&case_dir(name), dir.path());
    edit(dir.path());
    dir
}
