//! The op conformance suite on the eager CPU backend, one test per group.

use zoo_runtime::conformance::run_group;
use zoo_runtime::Device;

fn run(group: &str) {
    match run_group(group, &Device::Cpu).into_result() {
        Ok(n) => {
            assert!(n > 0, "group {group} ran no checks");
            eprintln!("{group}: {n} checks passed");
        }
        Err(report) => panic!("{report}"),
    }
}

#[test]
fn elementwise() {
    run("elementwise");
}
#[test]
fn matmul() {
    run("matmul");
}
#[test]
fn reduce() {
    run("reduce");
}
#[test]
fn shape() {
    run("shape");
}
#[test]
fn creation() {
    run("creation");
}
#[test]
fn conv() {
    run("conv");
}
#[test]
fn norm() {
    run("norm");
}
#[test]
fn attention() {
    run("attention");
}
#[test]
fn errors() {
    run("errors");
}
#[test]
fn no_panic() {
    run("no_panic");
}
#[test]
fn unknown_group_is_reported() {
    assert!(run_group("no-such-group", &Device::Cpu)
        .into_result()
        .is_err());
}
