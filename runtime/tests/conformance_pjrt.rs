//! The op conformance suite on the lazy PJRT backend, on the XLA CPU plugin of
//! `xla-cpu-pjrt==0.0.1` (PJRT API 0.81), one test per group, on device 0 and device 3 of a
//! four-device client. `scripts/run-tests.sh` downloads the plugin and exports
//! `ZOO_PJRT_CPU_PLUGIN`; without it every test fails (never skips).

#[path = "pjrt_common/mod.rs"]
mod common;

const VAR: &str = "ZOO_PJRT_CPU_PLUGIN";

conformance_groups!(VAR);

#[test]
fn attention_on_device_3() {
    common::run_group(VAR, "attention", 3);
}

#[test]
fn shape_on_device_2() {
    common::run_group(VAR, "shape", 2);
}
