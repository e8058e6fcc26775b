//! Jobs of several `zoo` processes on loopback: process 0 serves the coordinator, every
//! process joins, its PJRT client learns its place in the job, and all leave together.
//!
//! The XLA CPU plugins have no collectives across processes, so each process here runs its
//! own mesh; what is checked is the job (join, the plugin's process index and global device
//! ids, leave) and that a tensor-parallel program over a process's devices with ids that are
//! not 0.. (process 1's start at 2048 on API 0.115) computes what one process does.

use std::process::{Command, Output};

mod common;
use common::fixture_dir;

#[path = "../../hub/tests/common/assets.rs"]
mod assets;

/// A free loopback port for a coordinator.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Runs `args` as each of `n` processes of one job at once; their outputs in process order.
fn job(n: usize, args: &[&str], env: &[(&str, &std::ffi::OsStr)]) -> Vec<Output> {
    let coordinator = format!("127.0.0.1:{}", free_port());
    let children: Vec<_> = (0..n)
        .map(|id| {
            let mut c = Command::new(env!("CARGO_BIN_EXE_zoo"));
            c.args(args)
                .args([
                    "--num-processes",
                    &n.to_string(),
                    "--process-id",
                    &id.to_string(),
                ])
                .args(["--coordinator", &coordinator, "--join-timeout", "120"])
                .env_remove("ZOO_COORDINATOR")
                .env_remove("ZOO_NUM_PROCESSES")
                .env_remove("ZOO_PROCESS_ID");
            for (k, v) in env {
                c.env(k, v);
            }
            c.spawn_output()
        })
        .collect();
    children.into_iter().map(|c| c.join().unwrap()).collect()
}

trait SpawnOutput {
    fn spawn_output(&mut self) -> std::thread::JoinHandle<Output>;
}

impl SpawnOutput for Command {
    fn spawn_output(&mut self) -> std::thread::JoinHandle<Output> {
        let child = self
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::spawn(move || child.wait_with_output().unwrap())
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn three_processes_join_and_each_plugin_knows_its_place() {
    let plugin = assets::asset("ZOO_PJRT_CPU_PLUGIN_SKEW");
    let outs = job(
        3,
        &[
            "devices",
            "--platform",
            "cpu",
            "--plugin",
            plugin.to_str().unwrap(),
        ],
        &[("ZOO_PJRT_CPU_DEVICES", "2".as_ref())],
    );
    for (id, o) in outs.iter().enumerate() {
        let (out, err) = (text(&o.stdout), text(&o.stderr));
        assert!(o.status.success(), "process {id}: {err}");
        assert!(
            out.contains(&format!("process {id} of 3 (coordinator 127.0.0.1:"))
                && out.contains(&format!("the plugin says process {id}")),
            "process {id}: {out}"
        );
        // API 0.115's CPU devices are numbered from process_id << 11.
        assert!(
            out.contains(&format!("[{}] cpu", id << 11)),
            "process {id}: {out}"
        );
    }
}

#[test]
fn a_process_that_never_comes_is_named_and_bad_flags_are_refused() {
    let coordinator = format!("127.0.0.1:{}", free_port());
    let zoo = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_zoo"))
            .args(args)
            .env_remove("ZOO_COORDINATOR")
            .env_remove("ZOO_NUM_PROCESSES")
            .env_remove("ZOO_PROCESS_ID")
            .output()
            .unwrap()
    };
    let o = zoo(&[
        "devices",
        "--num-processes",
        "3",
        "--process-id",
        "0",
        "--coordinator",
        &coordinator,
        "--join-timeout",
        "1",
    ]);
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("process(es) 1, 2 did not join"), "{err}");

    for (args, needle) in [
        (vec!["devices", "--join-timeout", "0"], "--join-timeout"),
        (
            vec!["devices", "--join-timeout", "18446744073709551615"],
            "--join-timeout",
        ),
        (
            vec!["devices", "--process-id", "1"],
            "--num-processes, --coordinator",
        ),
        (
            vec![
                "devices",
                "--num-processes",
                "2",
                "--process-id",
                "2",
                "--coordinator",
                "h:1",
            ],
            "--process-id: 2 is not below --num-processes 2",
        ),
        (
            vec![
                "devices",
                "--num-processes",
                "2",
                "--process-id",
                "0",
                "--coordinator",
                "nohost",
            ],
            "--coordinator: \"nohost\" is not HOST:PORT",
        ),
    ] {
        let o = zoo(&args);
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
    let o = Command::new(env!("CARGO_BIN_EXE_zoo"))
        .args(["devices", "--help"])
        .output()
        .unwrap();
    let help = text(&o.stdout);
    assert!(
        help.contains("--coordinator <HOST:PORT>") && help.contains("--join-timeout"),
        "{help}"
    );
}

#[test]
fn tensor_parallel_generation_in_a_job_equals_one_process() {
    let dir = fixture_dir("llama-gqa-f32");
    let p = dir.path().to_str().unwrap();
    let plugin = assets::asset("ZOO_PJRT_CPU_PLUGIN_SKEW");
    let cache = tempfile::tempdir().unwrap();
    let env = [
        ("ZOO_PJRT_CPU_PLUGIN", plugin.as_os_str()),
        ("ZOO_PJRT_CPU_DEVICES", "2".as_ref()),
        ("ZOO_PJRT_CACHE", cache.path().as_os_str()),
    ];
    let args = [
        "generate",
        p,
        "hello",
        "--max-new-tokens",
        "5",
        "--min-new-tokens",
        "5",
        "--device-map",
        "tp:pjrt:cpu",
    ];
    let mut alone = Command::new(env!("CARGO_BIN_EXE_zoo"));
    alone.args(args);
    for (k, v) in env {
        alone.env(k, v);
    }
    let alone = alone.output().unwrap();
    assert!(alone.status.success(), "{}", text(&alone.stderr));
    let outs = job(2, &args, &env);
    for (id, o) in outs.iter().enumerate() {
        assert!(o.status.success(), "process {id}: {}", text(&o.stderr));
        assert_eq!(text(&o.stdout), text(&alone.stdout), "process {id}");
    }
}
