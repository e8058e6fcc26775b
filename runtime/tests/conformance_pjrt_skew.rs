//! The op conformance suite on the lazy PJRT backend against the XLA CPU plugin of
//! `lammps-jax-pjrt-cpu==0.11.2` (PJRT API 0.115): the same StableHLO, compiled by a newer
//! XLA, proves version skew is handled. `scripts/run-tests.sh` exports
//! `ZOO_PJRT_CPU_PLUGIN_SKEW`; without it every test fails (never skips).

#[path = "pjrt_common/mod.rs"]
mod common;

const VAR: &str = "ZOO_PJRT_CPU_PLUGIN_SKEW";

conformance_groups!(VAR);

#[test]
fn tensors_on_a_mesh_compute_what_one_device_does() {
    common::mesh_checks(VAR);
}
