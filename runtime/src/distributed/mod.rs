//! Jobs of several processes (TPU hosts of a slice, GPU nodes): which process this is, and
//! the key-value store their PJRT clients share, served by a coordinator that process 0
//! runs (as PyTorch's TCPStore and `jax.distributed.initialize` do).
//!
//! ```no_run
//! use std::time::Duration;
//! use zoo_runtime::distributed::{self, Processes};
//! # fn main() -> Result<(), zoo_runtime::distributed::DistributedError> {
//! // On each of 4 hosts, with its own process id:
//! distributed::initialize(Processes::new(0, 4, "10.0.0.2:8476")?, Duration::from_secs(300))?;
//! // ... PJRT clients created from here on share the job's store ...
//! distributed::shutdown(Duration::from_secs(60))?;
//! # Ok(()) }
//! ```
//!
//! The store carries what the plugins exchange while a client is created (topologies,
//! collective ids); the activations of a sharded program travel over the plugin's own
//! interconnect (ICI, NVLink, the network), never through zoo.

mod store;

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub use store::{Coordinator, TcpStore, HELLO, MAX_KEY, MAX_VALUE};

use crate::pjrt::kv::Prefixed;
use crate::pjrt::{Client, ClientOptions, KeyValueStore, KvError, Plugin};

/// The most processes a job may name.
pub const MAX_PROCESSES: usize = 1 << 16;

/// The coordinator's port on a Cloud TPU slice when only the hosts are known (JAX's).
pub const TPU_COORDINATOR_PORT: u16 = 8476;

/// Why a job could not be joined or left.
#[derive(Debug, thiserror::Error)]
pub enum DistributedError {
    /// A process id, count or address that cannot describe a job.
    #[error("{what}: {reason}")]
    BadProcesses {
        /// The flag or variable, e.g. `--process-id` or `ZOO_NUM_PROCESSES`.
        what: String,
        /// What is wrong and what to give instead.
        reason: String,
    },
    /// Process 0 could not serve the store on the coordinator's address.
    #[error("process 0 cannot serve the coordinator on {addr}: {source}; give an address of this host with a free port (--coordinator HOST:PORT)")]
    Bind {
        /// The address given.
        addr: String,
        /// The system's answer.
        source: std::io::Error,
    },
    /// The coordinator could not be reached.
    #[error("process {process_id} cannot reach the coordinator at {addr} within {waited:.0} s: {source}; start process 0 with the same --coordinator, and check that the port is open between the hosts")]
    Unreachable {
        /// This process.
        process_id: usize,
        /// The address given.
        addr: String,
        /// How long it tried.
        waited: f64,
        /// The last failure.
        source: std::io::Error,
    },
    /// Not every process arrived (at a join or a leave) in time, or they disagree.
    #[error("{0}")]
    Job(String),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] KvError),
    /// [`initialize`] was called twice with different processes.
    #[error("this process already joined {0}; a process belongs to one job")]
    AlreadyJoined(Processes),
}

impl DistributedError {
    /// Whether the caller can fix it (a flag, a variable, an address): a bad command line.
    pub fn is_caller_error(&self) -> bool {
        matches!(
            self,
            Self::BadProcesses { .. } | Self::Bind { .. } | Self::AlreadyJoined(_)
        )
    }
}

/// Which process of how many this is, and where the coordinator listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Processes {
    /// 0 ≤ id < `num_processes`; process 0 serves the coordinator.
    pub process_id: usize,
    /// How many processes the job has.
    pub num_processes: usize,
    /// `HOST:PORT` of process 0's coordinator.
    pub coordinator: String,
}

impl fmt::Display for Processes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "process {} of {} (coordinator {})",
            self.process_id, self.num_processes, self.coordinator
        )
    }
}

impl Processes {
    /// Checks and builds a job's description.
    pub fn new(
        process_id: usize,
        num_processes: usize,
        coordinator: impl Into<String>,
    ) -> Result<Processes, DistributedError> {
        let coordinator = coordinator.into();
        let bad = |what: &str, reason: String| DistributedError::BadProcesses {
            what: what.into(),
            reason,
        };
        if num_processes == 0 || num_processes > MAX_PROCESSES {
            return Err(bad(
                "--num-processes",
                format!("{num_processes} is not a process count; give 1 to {MAX_PROCESSES}"),
            ));
        }
        if process_id >= num_processes {
            return Err(bad(
                "--process-id",
                format!(
                    "{process_id} is not below --num-processes {num_processes}; give 0 to {}",
                    num_processes - 1
                ),
            ));
        }
        match coordinator.rsplit_once(':') {
            Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => {}
            _ => {
                return Err(bad(
                    "--coordinator",
                    format!("{coordinator:?} is not HOST:PORT (e.g. 10.0.0.2:8476)"),
                ))
            }
        }
        Ok(Processes {
            process_id,
            num_processes,
            coordinator,
        })
    }

    /// The job the environment describes, if any: `ZOO_COORDINATOR`, `ZOO_NUM_PROCESSES`
    /// and `ZOO_PROCESS_ID` (all three), else a Cloud TPU slice's `TPU_WORKER_HOSTNAMES`
    /// and `TPU_WORKER_ID` when it has several hosts (the coordinator on the first host,
    /// port [`TPU_COORDINATOR_PORT`]).
    pub fn from_env() -> Result<Option<Processes>, DistributedError> {
        Self::from_vars(|k| std::env::var(k).ok().filter(|v| !v.trim().is_empty()))
    }

    fn from_vars(
        var: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<Processes>, DistributedError> {
        let number = |name: &str, v: &str| {
            v.trim()
                .parse::<usize>()
                .map_err(|_| DistributedError::BadProcesses {
                    what: name.into(),
                    reason: format!("{v:?} is not a number"),
                })
        };
        let zoo = ["ZOO_COORDINATOR", "ZOO_NUM_PROCESSES", "ZOO_PROCESS_ID"];
        let set: Vec<_> = zoo.iter().map(|k| var(k)).collect();
        if set.iter().any(Option::is_some) {
            if let Some(i) = set.iter().position(Option::is_none) {
                return Err(DistributedError::BadProcesses {
                    what: zoo[i].into(),
                    reason: format!(
                        "{} set it apart; set all three or none",
                        zoo.iter()
                            .zip(&set)
                            .filter(|(_, v)| v.is_some())
                            .map(|(k, _)| *k)
                            .collect::<Vec<_>>()
                            .join(" and ")
                    ),
                });
            }
            let [c, n, p] = [&set[0], &set[1], &set[2]].map(|v| v.clone().unwrap_or_default());
            return Processes::new(number(zoo[2], &p)?, number(zoo[1], &n)?, c.trim()).map(Some);
        }
        if let (Some(hosts), Some(id)) = (var("TPU_WORKER_HOSTNAMES"), var("TPU_WORKER_ID")) {
            let hosts: Vec<&str> = hosts
                .split(',')
                .map(str::trim)
                .filter(|h| !h.is_empty())
                .collect();
            if hosts.len() > 1 {
                let coordinator = format!("{}:{TPU_COORDINATOR_PORT}", hosts[0]);
                return Processes::new(number("TPU_WORKER_ID", &id)?, hosts.len(), coordinator)
                    .map(Some);
            }
        }
        Ok(None)
    }
}

/// This process's membership of a job: the store, and the coordinator when it is process 0.
pub struct ProcessGroup {
    processes: Processes,
    store: Arc<TcpStore>,
    // Dropped after `store`'s users: process 0 keeps serving until every process left.
    _coordinator: Option<Coordinator>,
}

impl ProcessGroup {
    /// Joins the job: process 0 starts the coordinator, every process connects, announces
    /// itself and waits until all `num_processes` have (up to `timeout`), naming the ones
    /// that did not come.
    pub fn join(
        processes: &Processes,
        timeout: Duration,
    ) -> Result<ProcessGroup, DistributedError> {
        let coordinator = if processes.process_id == 0 {
            Some(Coordinator::bind(&processes.coordinator).map_err(|source| {
                DistributedError::Bind {
                    addr: processes.coordinator.clone(),
                    source,
                }
            })?)
        } else {
            None
        };
        let store = TcpStore::connect(&processes.coordinator, timeout).map_err(|source| {
            DistributedError::Unreachable {
                process_id: processes.process_id,
                addr: processes.coordinator.clone(),
                waited: timeout.as_secs_f64(),
                source,
            }
        })?;
        let group = ProcessGroup {
            processes: processes.clone(),
            store: Arc::new(store),
            _coordinator: coordinator,
        };
        group.gather("join", timeout)?;
        Ok(group)
    }

    /// The job this process belongs to.
    pub fn processes(&self) -> &Processes {
        &self.processes
    }

    /// The job's store (every process sees the same keys).
    pub fn store(&self) -> Arc<dyn KeyValueStore> {
        self.store.clone()
    }

    /// Every process puts `zoo/{phase}/{id}` (its count and host) and waits for all the
    /// others', refusing a process that counts the job differently.
    fn gather(&self, phase: &str, timeout: Duration) -> Result<(), DistributedError> {
        let p = &self.processes;
        let me = format!("{} {}", p.num_processes, hostname());
        self.store
            .put(&format!("zoo/{phase}/{}", p.process_id), me.as_bytes())?;
        let deadline = store::later(timeout);
        let mut missing = Vec::new();
        for id in 0..p.num_processes {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.store.get(&format!("zoo/{phase}/{id}"), left) {
                Ok(v) => {
                    let v = String::from_utf8_lossy(&v).into_owned();
                    let (n, host) = v.split_once(' ').unwrap_or((&v, "?"));
                    if n != p.num_processes.to_string() {
                        return Err(DistributedError::Job(format!(
                            "process {id} (on {host}) counts {n} processes, this one {}: start every process with the same --num-processes",
                            p.num_processes
                        )));
                    }
                }
                Err(e) if e.code == crate::pjrt::ErrorCode::DeadlineExceeded => missing.push(id),
                Err(e) => return Err(e.into()),
            }
        }
        if !missing.is_empty() {
            let ids: Vec<String> = missing.iter().map(usize::to_string).collect();
            return Err(DistributedError::Job(format!(
                "{}: process(es) {} did not {phase} the job at {} within {:.0} s",
                p,
                ids.join(", "),
                p.coordinator,
                timeout.as_secs_f64()
            )));
        }
        Ok(())
    }

    /// Leaves the job: waits until every process has said it is leaving and closes this
    /// process's connections; process 0's coordinator then serves until the others closed
    /// theirs, so none is cut off mid-answer.
    pub fn leave(&self, timeout: Duration) -> Result<(), DistributedError> {
        let result = self.gather("leave", timeout);
        self.store.close();
        if let Some(c) = &self._coordinator {
            c.wait_closed(timeout);
        }
        result
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "?".into())
}

static GROUP: Mutex<Option<Arc<ProcessGroup>>> = Mutex::new(None);

fn group_lock() -> std::sync::MutexGuard<'static, Option<Arc<ProcessGroup>>> {
    GROUP.lock().unwrap_or_else(|p| p.into_inner())
}

/// Joins the job for this process (see [`ProcessGroup::join`]); PJRT clients created from
/// here on are the job's (with its store, and the platform's process options). Calling it
/// again with the same processes does nothing.
pub fn initialize(processes: Processes, timeout: Duration) -> Result<(), DistributedError> {
    let mut g = group_lock();
    if let Some(current) = g.as_ref() {
        if current.processes == processes {
            return Ok(());
        }
        return Err(DistributedError::AlreadyJoined(current.processes.clone()));
    }
    *g = Some(Arc::new(ProcessGroup::join(&processes, timeout)?));
    Ok(())
}

/// The job this process joined, if any.
pub fn current() -> Option<Arc<ProcessGroup>> {
    group_lock().clone()
}

/// Leaves the job joined by [`initialize`] (every process waits for the others); nothing
/// when none was joined.
pub fn shutdown(timeout: Duration) -> Result<(), DistributedError> {
    let Some(group) = group_lock().take() else {
        return Ok(());
    };
    group.leave(timeout)
}

/// `plugin`'s client of `platform` (`cpu`, `cuda`, `tpu`) with `options`: alone, or, once
/// this process joined a job, with the job's store (under a prefix of the platform's) and
/// what the plugin reads to learn its place: the GPU plugin `node_id`/`num_nodes` (as JAX
/// passes them), the XLA CPU plugin `process_id` (its devices' ids then start at
/// `process_id << 11`); libtpu learns it from the TPU host's own environment. Plugins
/// ignore options they do not know.
pub fn create_client(
    plugin: &Plugin,
    platform: &str,
    options: ClientOptions,
) -> crate::pjrt::Result<Client> {
    let Some(group) = current() else {
        return plugin.client(&options);
    };
    let job = group.processes();
    let (id, n) = (job.process_id as i64, job.num_processes as i64);
    let options = match platform {
        "cuda" | "rocm" => options.int64("node_id", id).int64("num_nodes", n),
        "cpu" => options.int64("process_id", id),
        _ => options,
    };
    let store = Prefixed::new(format!("pjrt/{platform}/"), group.store());
    plugin.client_with_store(&options, Arc::new(store))
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn from(vars: &[(&str, &str)]) -> Result<Option<Processes>, DistributedError> {
        let m: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Processes::from_vars(|k| m.get(k).cloned())
    }

    #[test]
    fn the_environment_names_a_job_or_none() {
        assert_eq!(from(&[]).unwrap(), None);
        let p = from(&[
            ("ZOO_COORDINATOR", "10.0.0.2:1234"),
            ("ZOO_NUM_PROCESSES", "4"),
            ("ZOO_PROCESS_ID", "3"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(p, Processes::new(3, 4, "10.0.0.2:1234").unwrap());
        let e = from(&[("ZOO_COORDINATOR", "h:1"), ("ZOO_PROCESS_ID", "0")]).unwrap_err();
        assert!(e.to_string().starts_with("ZOO_NUM_PROCESSES:"), "{e}");
        // A TPU slice of 4 hosts; one host is no job.
        let p = from(&[
            ("TPU_WORKER_HOSTNAMES", "t-0,t-1,t-2,t-3"),
            ("TPU_WORKER_ID", "2"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(p, Processes::new(2, 4, "t-0:8476").unwrap());
        assert_eq!(
            from(&[("TPU_WORKER_HOSTNAMES", "t-0"), ("TPU_WORKER_ID", "0")]).unwrap(),
            None
        );
    }

    #[test]
    fn bad_jobs_are_refused_by_flag() {
        for (id, n, addr, flag) in [
            (0, 0, "h:1", "--num-processes"),
            (0, MAX_PROCESSES + 1, "h:1", "--num-processes"),
            (4, 4, "h:1", "--process-id"),
            (0, 2, "h", "--coordinator"),
            (0, 2, "h:99999", "--coordinator"),
            (0, 2, ":80", "--coordinator"),
        ] {
            let e = Processes::new(id, n, addr).unwrap_err();
            assert!(e.to_string().starts_with(flag), "{e}");
            assert!(e.is_caller_error());
        }
    }

    /// A loopback address with a port free now.
    fn free_addr() -> String {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("127.0.0.1:{}", l.local_addr().unwrap().port())
    }

    /// Three processes (threads here; `cli/tests/distributed.rs` runs real ones) join, one
    /// that never comes is named, and a count that disagrees is refused.
    #[test]
    fn processes_join_and_the_missing_are_named() {
        let addr = free_addr();
        let joins: Vec<_> = (0..3)
            .map(|id| {
                let p = Processes::new(id, 3, addr.clone()).unwrap();
                std::thread::spawn(move || ProcessGroup::join(&p, Duration::from_secs(20)))
            })
            .collect();
        let groups: Vec<ProcessGroup> = joins
            .into_iter()
            .map(|j| j.join().unwrap().unwrap())
            .collect();
        groups[1].store().put("x", b"from 1").unwrap();
        assert_eq!(
            groups[2].store().get("x", Duration::from_secs(5)).unwrap(),
            b"from 1"
        );
        let leaves: Vec<_> = groups
            .into_iter()
            .map(|g| std::thread::spawn(move || g.leave(Duration::from_secs(20))))
            .collect();
        for l in leaves {
            l.join().unwrap().unwrap();
        }

        let p = Processes::new(0, 2, free_addr()).unwrap();
        let e = ProcessGroup::join(&p, Duration::from_millis(500))
            .err()
            .unwrap();
        assert!(e.to_string().contains("process(es) 1 did not join"), "{e}");

        let addr = free_addr();
        let other = {
            let p = Processes::new(1, 3, addr.clone()).unwrap();
            std::thread::spawn(move || ProcessGroup::join(&p, Duration::from_secs(2)))
        };
        let e = ProcessGroup::join(
            &Processes::new(0, 2, addr).unwrap(),
            Duration::from_secs(10),
        )
        .err()
        .unwrap();
        assert!(
            e.to_string().contains("counts 3 processes, this one 2"),
            "{e}"
        );
        assert!(other.join().unwrap().is_err());
    }
}
