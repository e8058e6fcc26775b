//! Shared set-up of the PJRT test binaries: the plugin from an environment variable (a
//! missing one fails the test with instructions), a four-device CPU client, and a private
//! executable cache folder per test process.

#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::OnceLock;

use zoo_runtime::conformance;
use zoo_runtime::{lazy, Device, PjrtDevice, PjrtPlatform};

/// The plugin file named by `var`; unset fails the test.
pub fn plugin_path(var: &str) -> PathBuf {
    let p = std::env::var_os(var)
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| {
            panic!(
            "{var} is not set: run the tests through scripts/run-tests.sh, which downloads the \
             PJRT CPU plugins (scripts/fetch-pjrt-plugins.sh) and exports {var}"
        )
        });
    PathBuf::from(p)
}

/// Configures the CPU platform once per process with the plugin of `var` and 4 devices,
/// and a fresh disk-cache folder.
pub fn setup(var: &str) -> PathBuf {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    let path = plugin_path(var);
    lazy::configure(PjrtPlatform::Cpu, Some(path), Some(4))
        .unwrap_or_else(|e| panic!("configuring the CPU plugin: {e}"));
    let dir = DIR.get_or_init(|| tempfile::tempdir().expect("a temporary cache folder"));
    lazy::set_cache_dir(Some(dir.path().to_path_buf()));
    dir.path().to_path_buf()
}

/// PJRT CPU device `ordinal`.
pub fn device(ordinal: usize) -> Device {
    Device::Pjrt(PjrtDevice {
        platform: PjrtPlatform::Cpu,
        ordinal,
    })
}

/// Runs one conformance group on device `ordinal` of the plugin of `var`.
pub fn run_group(var: &str, group: &str, ordinal: usize) {
    setup(var);
    match conformance::run_group(group, &device(ordinal)).into_result() {
        Ok(n) => assert!(n > 0, "group {group} ran no checks"),
        Err(report) => panic!("{report}"),
    }
}

/// One `#[test]` per conformance group on device 0 of the plugin named by the environment
/// variable `$var`. Each plugin needs its own test binary: a process holds one client per
/// platform.
#[macro_export]
macro_rules! conformance_groups {
    ($var:expr) => {
        $crate::conformance_groups!(
            $var;
            elementwise, matmul, reduce, shape, creation, conv, norm, attention, errors
        );
    };
    ($var:expr; $($g:ident),*) => {
        $(
            #[test]
            fn $g() {
                common::run_group($var, stringify!($g), 0);
            }
        )*
    };
}
