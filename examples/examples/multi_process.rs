//! A job of several processes, as the hosts of a TPU slice or the nodes of a GPU job run
//! one model together: process 0 serves the coordinator, every process joins, and the PJRT
//! clients created after that share the job's key-value store (their topology exchange).
//!
//! On one machine, three processes on loopback (each its own XLA CPU devices):
//!
//! ```sh
//! for i in 0 1 2; do
//!   cargo run -p zoo-examples --example multi_process -- $i 3 127.0.0.1:8476 &
//! done; wait
//! ```
//!
//! On a Cloud TPU slice the arguments can be left out: `TPU_WORKER_HOSTNAMES` and
//! `TPU_WORKER_ID` say the job (or set `ZOO_COORDINATOR`, `ZOO_NUM_PROCESSES`,
//! `ZOO_PROCESS_ID`). The plugin is `ZOO_PJRT_CPU_PLUGIN`'s or python3's xla-cpu-pjrt;
//! pass `cuda` or `tpu` as a fourth argument on such hosts.

use std::time::Duration;

use anyhow::{Context, Result};
use zoo_runtime::distributed::{self, Processes};
use zoo_runtime::{DType, Device, PjrtDevice, PjrtPlatform, Tensor};

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let job = match args.as_slice() {
        [id, n, coordinator, ..] => Processes::new(id.parse()?, n.parse()?, coordinator.clone())?,
        _ => Processes::from_env()?
            .context("usage: multi_process PROCESS_ID NUM_PROCESSES HOST:PORT [PLATFORM]")?,
    };
    let platform = match args.get(3).map(String::as_str) {
        None | Some("cpu") => PjrtPlatform::Cpu,
        Some("cuda") => PjrtPlatform::Cuda,
        Some("tpu") => PjrtPlatform::Tpu,
        Some(p) => anyhow::bail!("{p:?} is not a platform; use cpu, cuda or tpu"),
    };
    let timeout = Duration::from_secs(120);
    let me = job.process_id;
    // Blocks until every process of the job has joined.
    distributed::initialize(job, timeout)?;

    // The PJRT client is created on first use, as a member of the job.
    let device = Device::Pjrt(PjrtDevice::new(platform, 0));
    let x = Tensor::arange(0.0, 4.0, 1.0, DType::F32, &device)?;
    let y: f32 = x.mul_scalar(me as f64 + 1.0)?.sum_all()?.to_scalar()?;

    // The job's store is there for small exchanges of the program's own, too.
    let group = distributed::current().context("joined above")?;
    let store = group.store();
    store.put(&format!("example/result/{me}"), y.to_string().as_bytes())?;
    if me == 0 {
        let n = group.processes().num_processes;
        for id in 0..n {
            let v = store.get(&format!("example/result/{id}"), timeout)?;
            println!("process {id}: sum = {}", String::from_utf8_lossy(&v));
        }
    }
    // Waits until every process is done with the store, then leaves.
    distributed::shutdown(timeout)?;
    Ok(())
}
