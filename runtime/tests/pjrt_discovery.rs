//! Plugin discovery, the libtpu guard and the `zoo devices` report.
//!
//! One test: discovery reads process-wide environment variables, which parallel tests
//! would race on.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use zoo_runtime::pjrt::discovery::{self, Source};
use zoo_runtime::pjrt::{PjrtError, Plugin};

fn var(name: &str) -> PathBuf {
    PathBuf::from(std::env::var(name).unwrap_or_else(|_| {
        panic!("{name} is not set: run the tests through scripts/run-tests.sh, which downloads the PJRT CPU plugins and exports {name}")
    }))
}

fn clear_env() {
    for v in [
        "PJRT_NAMES_AND_LIBRARY_PATHS",
        "TPU_LIBRARY_PATH",
        "ZOO_FORCE_TPU",
        "PYTHONPATH",
    ] {
        std::env::remove_var(v);
    }
}

#[test]
fn discovery_order_errors_guard_and_report() {
    let main = var("ZOO_PJRT_CPU_PLUGIN");
    let skew = var("ZOO_PJRT_CPU_PLUGIN_SKEW");
    let scratch = std::env::temp_dir().join(format!("zoo-pjrt-discovery-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    std::fs::create_dir_all(&scratch).expect("scratch dir");
    clear_env();

    // Nothing for a platform no plugin serves: the error names every place searched.
    match discovery::find_plugin(Some("zz-none"), Some(Path::new("/nonexistent/zoo.so"))) {
        Err(e @ PjrtError::NotFound { .. }) => {
            let msg = e.to_string();
            for place in [
                "explicit path /nonexistent/zoo.so: no such file",
                "PJRT_NAMES_AND_LIBRARY_PATHS: unset",
                "TPU_LIBRARY_PATH: unset",
                "xla_plugins/xla_cpu*/*.so",
                "libtpu/libtpu.so",
            ] {
                assert!(msg.contains(place), "`{place}` missing from:\n{msg}");
            }
        }
        other => panic!("expected NotFound, got {other:?}"),
    }

    // JAX's variable, with a malformed entry that is reported and skipped.
    std::env::set_var(
        "PJRT_NAMES_AND_LIBRARY_PATHS",
        format!("garbage,cpu:{},gpu:/nonexistent/cuda.so", main.display()),
    );
    let s = discovery::search(Some("cpu"), None);
    assert_eq!(s.candidates[0].path, main);
    assert_eq!(s.candidates[0].source, Source::JaxEnv);
    assert!(
        s.searched
            .iter()
            .any(|l| l.contains("\"garbage\": not `name:path`")),
        "{:?}",
        s.searched
    );
    assert!(s
        .searched
        .iter()
        .any(|l| l.contains("gpu:/nonexistent/cuda.so: no such file")));
    // An explicit path comes first.
    let c = discovery::find_plugin(Some("cpu"), Some(&skew)).expect("explicit");
    assert_eq!(
        (c.path.as_path(), &c.source),
        (skew.as_path(), &Source::Explicit)
    );

    // The report `zoo devices --platform cpu` prints.
    let report = discovery::devices_report(Some("cpu")).expect("report");
    assert!(
        report.contains(&format!("plugin {}", main.display())),
        "{report}"
    );
    assert!(report.contains("PJRT API 0.81"), "{report}");
    assert!(report.contains("platform: cpu"), "{report}");
    assert!(report.contains("[0] cpu:"), "{report}");
    std::env::remove_var("PJRT_NAMES_AND_LIBRARY_PATHS");

    // python3's site-packages, laid out as the lammps-jax-pjrt-cpu wheel installs it.
    let site = scratch.join("site-packages");
    let pkg = site.join("lammps_jax_pjrt_cpu");
    std::fs::create_dir_all(&pkg).expect("site dir");
    std::os::unix::fs::symlink(&skew, pkg.join("pjrt_c_api_cpu_plugin.so")).expect("symlink");
    std::env::set_var("PYTHONPATH", &site);
    let s = discovery::search(Some("cpu"), None);
    let found = s
        .candidates
        .iter()
        .find(|c| c.source == Source::SitePackages(site.clone()))
        .unwrap_or_else(|| panic!("site-packages plugin not found: {:?}", s.searched));
    assert_eq!(found.platform, "cpu");
    let p = Plugin::load(&found.path).expect("load from site-packages");
    assert_eq!(p.api_version(), (0, 115));
    std::env::remove_var("PYTHONPATH");

    // libtpu: refused at once off Google Compute Engine, loaded when forced.
    let tpu_dir = scratch.join("libtpu");
    std::fs::create_dir_all(&tpu_dir).expect("tpu dir");
    let fake_tpu = tpu_dir.join("libtpu.so");
    std::fs::write(&fake_tpu, b"not really libtpu").expect("fake libtpu");
    std::env::set_var("TPU_LIBRARY_PATH", &fake_tpu);
    let s = discovery::search(Some("tpu"), None);
    assert_eq!(s.candidates[0].source, Source::TpuLibraryPath);
    let t = Instant::now();
    let r = Plugin::load(&fake_tpu);
    let on_gce = discovery::tpu_allowed().is_ok();
    if on_gce {
        // The guard lets libtpu through here; the fake file then fails to load.
        assert!(matches!(r, Err(PjrtError::Load { .. })), "{r:?}");
    } else {
        match r {
            Err(e @ PjrtError::NoTpu { .. }) => {
                assert!(e.to_string().contains("no TPU on this host"), "{e}");
                assert!(e.to_string().contains("ZOO_FORCE_TPU=1"), "{e}");
            }
            other => panic!("expected NoTpu, got {other:?}"),
        }
        assert!(
            t.elapsed() < Duration::from_secs(1),
            "the guard must answer at once"
        );
        let report = discovery::devices_report(Some("tpu")).expect("tpu report");
        assert!(report.contains("skipped: no TPU on this host"), "{report}");
    }
    std::env::set_var("ZOO_FORCE_TPU", "1");
    assert!(discovery::tpu_allowed().is_ok());
    assert!(matches!(
        Plugin::load(&fake_tpu),
        Err(PjrtError::Load { .. })
    ));

    clear_env();
    let _ = std::fs::remove_dir_all(&scratch);
}
