//! Parity with diffusers on every committed pipeline case, through the harness, as the
//! nightly run and `zoo parity run` take them: each case (Stable Diffusion 1.x / 2.x / XL,
//! DDPM, DiT, PixArt, SD3, Flux) passes on candle-cpu, and a case of each denoiser kind
//! also on pjrt-cpu and split over four devices of the XLA CPU plugin (pjrt-cpu-x4); the
//! transformer denoisers also tensor parallel (pjrt-cpu-tp4, pjrt-cpu-tp2pp2). A
//! copy held to a zero image tolerance fails, a copy naming a class zoo lacks errors, and
//! the dashboard draws the pipelines beside the language models. A missing PJRT plugin
//! fails the PJRT results.

use std::path::{Path, PathBuf};

use zoo_nightly::harness::{self, Backend};
use zoo_nightly::Status;

#[path = "../../hub/tests/common/assets.rs"]
mod assets;

fn pipelines() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../diffusers/tests/data/pipelines")
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let path = entry.unwrap().path();
        let dest = to.join(path.file_name().unwrap());
        if path.is_dir() {
            copy_dir(&path, &dest);
        } else {
            std::fs::copy(&path, &dest).unwrap();
        }
    }
}

/// A copy of the committed case `name` under `root/new_name`, its JSON files edited.
fn edited_copy(
    root: &Path,
    name: &str,
    new_name: &str,
    edit: impl Fn(&str, &mut serde_json::Value),
) -> PathBuf {
    let dir = root.join(new_name);
    copy_dir(&pipelines().join(name), &dir);
    for file in ["case.json", "model_index.json"] {
        let path = dir.join(file);
        let mut v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        edit(file, &mut v);
        std::fs::write(&path, serde_json::to_string_pretty(&v).unwrap()).unwrap();
    }
    dir
}

fn describe(r: &zoo_nightly::results::CaseResult) -> String {
    let bad: Vec<&str> = r
        .outputs
        .iter()
        .filter(|o| !o.passed)
        .map(|o| o.name.as_str())
        .collect();
    format!(
        "{} on {}: {}, failing outputs {bad:?}, worst {:?}, {}",
        r.case,
        r.backend,
        r.status.as_str(),
        r.worst.max_abs_diff,
        r.message.as_deref().unwrap_or("")
    )
}

#[test]
fn every_pipeline_case_matches_diffusers_through_the_harness() {
    let plugin = assets::asset("ZOO_PJRT_CPU_PLUGIN");
    zoo_runtime::lazy::configure(zoo_runtime::PjrtPlatform::Cpu, Some(plugin), Some(4)).unwrap();
    let root = pipelines();
    let cases = zoo_nightly::case::discover(&root).unwrap();
    assert!(cases.len() >= 10, "{cases:?}");
    let out = tempfile::tempdir().unwrap();
    let opts = |backends: &[Backend], history: &str| harness::RunOptions {
        backends: backends.to_vec(),
        history: Some(out.path().join(history)),
        ..Default::default()
    };
    let cpu = harness::run_with(
        std::slice::from_ref(&root),
        out.path(),
        &opts(&[Backend::CandleCpu], "history"),
    )
    .unwrap();
    assert_eq!(cpu.run.results.len(), cases.len());
    // One case per denoiser kind: a UNet2DModel, a UNet2DConditionModel (with img2img
    // and tiled VAE decoding), an MMDiT, a Flux transformer and a DiT.
    let kinds: Vec<PathBuf> = ["ddpm", "sd15", "sd3", "flux-dev", "dit"]
        .iter()
        .map(|n| root.join(n))
        .collect();
    let pjrt = harness::run_with(
        &kinds,
        out.path(),
        &opts(&[Backend::PjrtCpu, Backend::PjrtCpuX4], "history-pjrt"),
    )
    .unwrap();
    assert_eq!(pjrt.run.results.len(), 2 * kinds.len());
    // Tensor parallel: every transformer block's attention and feed-forward split over a
    // mesh of four devices, and two stages of two-device meshes.
    let tp_kinds: Vec<PathBuf> = ["sd3", "flux-dev", "dit"]
        .iter()
        .map(|n| root.join(n))
        .collect();
    let tp = harness::run_with(
        &tp_kinds,
        out.path(),
        &opts(&[Backend::PjrtCpuTp4, Backend::PjrtCpuTp2Pp2], "history-tp"),
    )
    .unwrap();
    assert_eq!(tp.run.results.len(), 2 * tp_kinds.len());

    let mut failures = Vec::new();
    for r in cpu
        .run
        .results
        .iter()
        .chain(&pjrt.run.results)
        .chain(&tp.run.results)
    {
        if r.status != Status::Passed {
            failures.push(describe(r));
        }
        assert_eq!(r.dtype, "f32");
        assert!(r.architecture.ends_with("Pipeline"), "{}", r.architecture);
        let names: Vec<&str> = r.outputs.iter().map(|o| o.name.as_str()).collect();
        assert!(names.contains(&"pipe.image"), "{}: {names:?}", r.case);
        assert!(
            names
                .iter()
                .any(|n| n.starts_with("unet.") || n.starts_with("transformer.")),
            "{}: no denoiser output in {names:?}",
            r.case
        );
    }
    assert!(
        failures.is_empty(),
        "{} results off:\n{}",
        failures.len(),
        failures.join("\n")
    );
    let sd15 = cpu.run.results.iter().find(|r| r.case == "sd15").unwrap();
    for want in ["img2img.image", "vae.decoded", "vae.tiled.decoded"] {
        assert!(
            sd15.outputs.iter().any(|o| o.name == want),
            "sd15 does not compare `{want}`: {:?}",
            sd15.outputs.iter().map(|o| &o.name).collect::<Vec<_>>()
        );
    }

    // The dashboard draws every pipeline of the run over all cases.
    let site = out.path().join("site");
    zoo_nightly::dashboard::write_dashboard(&cpu.history_dir, &site).unwrap();
    let html = std::fs::read_to_string(site.join("index.html")).unwrap();
    for class in [
        "StableDiffusionPipeline",
        "StableDiffusionXLPipeline",
        "DDPMPipeline",
        "FluxPipeline",
        "StableDiffusion3Pipeline",
        "DiTPipeline",
        "PixArtAlphaPipeline",
    ] {
        assert!(html.contains(class), "the dashboard does not show {class}");
    }
}

#[test]
fn a_tightened_pipeline_case_fails_and_a_broken_one_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let tight = edited_copy(tmp.path(), "ddpm", "ddpm-tight", |file, v| {
        if file == "case.json" {
            v["name"] = "ddpm-tight".into();
            v["tolerances"]["image"] = 0.0.into();
        }
    });
    let broken = edited_copy(tmp.path(), "ddpm", "ddpm-broken", |file, v| {
        if file == "case.json" {
            v["name"] = "ddpm-broken".into();
        } else {
            v["unet"] = serde_json::json!(["diffusers", "UNet3DConditionModel"]);
        }
    });
    let out = tempfile::tempdir().unwrap();
    let summary = harness::run(&[tight, broken], &[Backend::CandleCpu], &[], out.path()).unwrap();
    let by_case = |name: &str| {
        summary
            .run
            .results
            .iter()
            .find(|r| r.case == name)
            .unwrap_or_else(|| panic!("no result for {name}"))
    };
    let tight = by_case("ddpm-tight");
    assert_eq!(tight.status, Status::Failed, "{}", describe(tight));
    let image = tight
        .outputs
        .iter()
        .find(|o| o.name == "pipe.image")
        .unwrap();
    assert!(!image.passed);
    assert!(tight
        .outputs
        .iter()
        .any(|o| o.name.starts_with("unet.") && o.passed));
    let broken = by_case("ddpm-broken");
    assert_eq!(broken.status, Status::Error, "{}", describe(broken));
    let m = broken.message.as_deref().unwrap_or("");
    assert!(m.contains("UNet3DConditionModel"), "{m}");
    assert!(summary.has_failures());
}
