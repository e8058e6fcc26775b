//! Materialisation: trace → hash → cache lookup → (lower, compile) → execute → results
//! become device-resident leaves; the backend's counters and the reaper thread.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::cache::{self, Miss};
use super::graph::{Node, Running};
use super::lower::{lower, LowerNode, MeshLayout, Ref};
use super::matmul_precision;
use super::plugins::{backend, device, devices, lock, pjrt_err, Backend, BACKENDS};
use super::trace::{key, trace, PtrMap, Trace};
use super::transfer::SCALARS;
use crate::pjrt::{
    self, Buffer, CompileOptions, ExecuteOptions, Execution, LoadedExecutable, PjrtError,
};
use crate::{DType, Device, Error, PjrtDevice, PjrtPlatform, Result};

// ----- statistics -----

static LAST_REJECT: Mutex<Option<String>> = Mutex::new(None);

pub(crate) fn last_reject() -> Option<String> {
    lock(&LAST_REJECT).clone()
}

/// Waits until the reaper has freed everything sent to it so far.
fn reap_flush() {
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    reap(Box::new(tx));
    // The reaper drops the sender in order, which disconnects the channel.
    let _ = rx.recv();
}

pub(crate) fn clear_memory_cache() {
    super::registry::prune();
    reap_flush();
    *lock(&SCALARS) = None;
    let backends: Vec<Arc<Backend>> = lock(&BACKENDS)
        .as_ref()
        .map(|m| m.values().cloned().collect())
        .unwrap_or_default();
    for b in backends {
        lock(&b.exes).clear();
    }
}

/// Counters of the lazy backend since the process started (see [`super::stats`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LazyStats {
    /// Graphs executed.
    pub executions: u64,
    /// Graphs compiled by the plugin (in-memory and disk misses).
    pub compiles: u64,
    /// Executables found in the in-memory cache.
    pub memory_hits: u64,
    /// Executables loaded from the disk cache.
    pub disk_hits: u64,
    /// Executables written to the disk cache.
    pub disk_writes: u64,
    /// Disk entries rejected (corrupt, foreign, unloadable) and removed.
    pub disk_rejects: u64,
    /// Nanoseconds spent inside the plugin's compile.
    pub compile_nanos: u64,
    /// Nanoseconds spent inside the plugin's execute (until the outputs are ready).
    pub execute_nanos: u64,
    /// Nanoseconds spent materialising in total (trace, hash, lookup, compile, execute).
    pub materialize_nanos: u64,
    /// Nanoseconds spent inside the plugin's host/device transfers (uploads, reads, copies;
    /// a read also waits for the computation behind it).
    pub transfer_nanos: u64,
    /// Pending nodes traced into executed graphs.
    pub traced_nodes: u64,
    /// Leaf buffers donated to an output of the graph that read them last (a KV cache
    /// updated in place) and consumed by the plugin.
    pub donated_buffers: u64,
    /// Nanoseconds a device sat without a program between one finishing and the host
    /// dispatching the next: the host's share of a loop of programs (a decode loop's
    /// recording, tracing and token reads), measured from the plugin's completion callbacks.
    pub idle_nanos: u64,
    /// Graphs dispatched without waiting for them ([`Tensor::dispatch`](crate::Tensor::dispatch)).
    pub dispatched: u64,
}

static STATS: [AtomicU64; 14] = [const { AtomicU64::new(0) }; 14];

pub(super) fn bump(i: usize, v: u64) {
    STATS[i].fetch_add(v, Ordering::Relaxed);
}

pub(crate) fn stats() -> LazyStats {
    let g = |i: usize| STATS[i].load(Ordering::Relaxed);
    LazyStats {
        executions: g(0),
        compiles: g(1),
        memory_hits: g(2),
        disk_hits: g(3),
        disk_writes: g(4),
        disk_rejects: g(5),
        compile_nanos: g(6),
        execute_nanos: g(7),
        materialize_nanos: g(8),
        transfer_nanos: g(9),
        traced_nodes: g(10),
        donated_buffers: g(11),
        idle_nanos: g(12),
        dispatched: g(13),
    }
}

/// Frees off the caller's thread what a decode step should not wait for: buffers its graph
/// released (destroying one costs the plugin a few microseconds) and registry entries of
/// dead tensors (which may free whole unmaterialised subgraphs).
pub(crate) fn reap(garbage: Box<dyn Send>) {
    type Sender = std::sync::mpsc::Sender<Box<dyn Send>>;
    static REAPER: Mutex<Option<Sender>> = Mutex::new(None);
    let mut guard = lock(&REAPER);
    if guard.is_none() {
        let (tx, rx) = std::sync::mpsc::channel::<Box<dyn Send>>();
        let spawned = std::thread::Builder::new()
            .name("zoo-pjrt-reaper".into())
            .spawn(move || {
                for g in rx {
                    drop(g);
                }
            });
        if spawned.is_ok() {
            *guard = Some(tx);
        }
    }
    match guard.as_ref() {
        Some(tx) => {
            if let Err(std::sync::mpsc::SendError(g)) = tx.send(garbage) {
                drop(g);
            }
        }
        None => drop(garbage),
    }
}

/// Computes every node of `roots` that is not computed yet, together with every other live
/// pending tensor of the same device, in one compiled graph per device.
/// One lock per device, held from tracing a device's pending graph until its results are
/// set: two threads must never run the same pending nodes, since the first run may donate a
/// leaf the second still reads.
static DEVICE_LOCKS: Mutex<Option<HashMap<PjrtDevice, Arc<Mutex<()>>>>> = Mutex::new(None);

fn device_lock(d: PjrtDevice) -> Arc<Mutex<()>> {
    lock(&DEVICE_LOCKS)
        .get_or_insert_with(HashMap::new)
        .entry(d)
        .or_default()
        .clone()
}

pub(crate) fn materialize(roots: &[Arc<Node>], op: &'static str) -> Result<()> {
    materialize_then(roots, op, Wait::Yes)
}

/// Whether materialising waits for the programs it dispatches.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wait {
    /// Until they finish; their errors are this call's.
    Yes,
    /// Not at all: reads of their outputs wait, and fail with the program's error.
    No,
}

pub(crate) fn materialize_then(roots: &[Arc<Node>], op: &'static str, wait: Wait) -> Result<()> {
    let mut devices: Vec<PjrtDevice> = Vec::new();
    for r in roots {
        if !r.is_ready() && !devices.contains(&r.device) {
            devices.push(r.device);
        }
    }
    for d in devices {
        let device_lock = device_lock(d);
        // Whatever another thread computed while this one waited is ready now and skipped.
        let running = Running {
            device: d,
            _guard: lock(&device_lock),
        };
        let start = Instant::now();
        let mut outs: Vec<Arc<Node>> = Vec::new();
        let mut seen = PtrMap::default();
        for n in roots.iter().filter(|n| n.device == d).cloned() {
            if !n.is_ready() && seen.insert(key(&n), Ref::Param(0)).is_none() {
                outs.push(n);
            }
        }
        let asked = outs.len();
        let (live, mut held) = super::registry::live_pending(d);
        for n in live {
            if seen.insert(key(&n), Ref::Param(0)).is_none() {
                outs.push(n);
            }
        }
        if outs.is_empty() {
            reap(Box::new(held));
            continue;
        }
        // Every live pending tensor of the device the registry knows of is in this graph,
        // so leaves only it can read may be donated (`trace` counts references for the
        // nodes other threads are recording meanwhile).
        let mut r = run(&outs, &running, op, true, wait, &mut held);
        if r.is_err() {
            if outs.len() > asked && asked > 0 {
                // Another live tensor may be what fails (one too large for the device,
                // say): what was asked for must not fail because of it, so run that alone,
                // donating nothing (the live tensors left out may still read any leaf).
                r = run(&outs[..asked], &running, op, false, wait, &mut held);
            }
            // What the failed graph left pending joins the next one again.
            super::registry::restore(&outs);
        }
        if !held.is_empty() {
            reap(Box::new(held));
        }
        bump(8, start.elapsed().as_nanos() as u64);
        r?;
    }
    Ok(())
}

/// What each device is running, as the plugin's completion callbacks report it: how long
/// the device waited for the host between programs. (A program dispatched without waiting
/// reports its error through its outputs: every read of them fails with it.)
#[derive(Default)]
struct Timeline {
    state: Mutex<TimelineState>,
}

#[derive(Default)]
struct TimelineState {
    /// Programs dispatched whose completion has not been reported yet.
    running: usize,
    /// When the last of them finished.
    done_at: Option<Instant>,
    /// The completion events of programs nobody waited for (destroyed once ready).
    unwaited: Vec<pjrt::Event>,
}

static TIMELINES: Mutex<Option<HashMap<PjrtDevice, Arc<Timeline>>>> = Mutex::new(None);

fn timeline(d: PjrtDevice) -> Arc<Timeline> {
    lock(&TIMELINES)
        .get_or_insert_with(HashMap::new)
        .entry(d)
        .or_default()
        .clone()
}

impl Timeline {
    /// The dispatch instant of a program; counts the device's wait for it.
    fn dispatching(&self) -> Instant {
        let mut s = lock(&self.state);
        let now = Instant::now();
        if s.running == 0 {
            if let Some(done) = s.done_at {
                bump(12, now.saturating_duration_since(done).as_nanos() as u64);
            }
        }
        s.running += 1;
        now
    }

    fn dispatch_failed(&self) {
        let mut s = lock(&self.state);
        s.running = s.running.saturating_sub(1);
    }

    /// Asks the plugin to report when `events` (one program's) are ready.
    fn watch(self: &Arc<Self>, events: &[pjrt::Event]) {
        let left = Arc::new(AtomicU64::new(events.len() as u64));
        let mut unwatched = events.is_empty();
        for e in events {
            let (me, left) = (self.clone(), left.clone());
            let ready = Box::new(move |_: pjrt::Result<()>| {
                let mut s = lock(&me.state);
                if left.fetch_sub(1, Ordering::AcqRel) == 1 {
                    s.running = s.running.saturating_sub(1);
                    s.done_at = Some(Instant::now());
                }
            });
            unwatched |= e.on_ready(ready).is_err();
        }
        if unwatched {
            // No report will come (no events, or a plugin without callbacks): the device's
            // idle time is unknown from here on.
            let mut s = lock(&self.state);
            s.running = s.running.saturating_sub(1);
            s.done_at = None;
        }
    }

    /// Keeps the events of a program nobody waits for; drops those of finished ones.
    fn keep(&self, events: Vec<pjrt::Event>) {
        let mut s = lock(&self.state);
        s.unwaited.retain(|e| !e.is_ready().unwrap_or(true));
        s.unwaited.extend(events);
    }
}

fn run(
    outs: &[Arc<Node>],
    running: &Running<'_>,
    op: &'static str,
    donate: bool,
    wait: Wait,
    held: &mut Vec<Arc<Node>>,
) -> Result<()> {
    let d = running.device;
    let (b, devs) = devices(op, d)?;
    let precision = matmul_precision();
    let t = trace(outs, running, precision, donate.then_some(&held[..]));
    bump(10, t.nodes.len() as u64);
    let exe = executable(&b, &devs, &t, d, precision, op)?;
    // One argument list per device: each parameter's buffer there.
    let args: Vec<Vec<&Buffer>> = (0..devs.len())
        .map(|p| t.param_bufs.iter().map(|v| &v[p]).collect())
        .collect();
    let arg_lists: Vec<&[&Buffer]> = args.iter().map(Vec::as_slice).collect();
    let timeline = timeline(d);
    let start = timeline.dispatching();
    let dispatched = exe.execute_async(&arg_lists, &ExecuteOptions::new());
    // From here until the wait, zoo's bookkeeping overlaps the running program.
    let dispatched_at = Instant::now();
    drop(arg_lists);
    drop(args);
    let Execution {
        outputs: lists,
        events,
    } = match dispatched {
        Ok(e) => e,
        Err(e) => {
            timeline.dispatch_failed();
            bump(7, start.elapsed().as_nanos() as u64);
            bump(0, 1);
            return Err(pjrt_err(op, d, e));
        }
    };
    timeline.watch(&events);
    if lists.len() != devs.len() || lists.iter().any(|l| l.len() != t.outputs.len()) {
        for e in &events {
            let _ = e.wait();
        }
        return Err(Error::Pjrt {
            op,
            device: Device::Pjrt(d),
            source: PjrtError::InvalidArgument(format!(
                "the executable returned {:?} buffers per device for {} outputs on {} device(s)",
                lists.iter().map(Vec::len).collect::<Vec<_>>(),
                t.outputs.len(),
                devs.len()
            )),
        });
    }
    // Output j's buffers, one per device in order.
    let bufs: Vec<super::graph::Value> = if devs.len() == 1 {
        lists
            .into_iter()
            .flatten()
            .map(|b| Arc::from([b]))
            .collect()
    } else {
        let mut per_output: Vec<Vec<Buffer>> = (0..t.outputs.len())
            .map(|_| Vec::with_capacity(devs.len()))
            .collect();
        for list in lists {
            for (j, b) in list.into_iter().enumerate() {
                per_output[j].push(b);
            }
        }
        per_output.into_iter().map(Arc::from).collect()
    };
    if !t.aliases.is_empty() {
        // Count what the plugin really consumed (a plugin may copy instead of aliasing).
        let consumed = t
            .aliases
            .iter()
            .filter(|&&(p, _)| t.param_bufs[p][0].is_deleted().unwrap_or(false))
            .count();
        bump(11, consumed as u64);
    }
    // The outputs are usable at once (reads and later graphs wait for them inside the
    // plugin); an error of the running program reaches `materialize`'s caller below, and
    // every later read of these outputs.
    let mut history = Vec::with_capacity(bufs.len());
    for (buf, &i) in bufs.into_iter().zip(&t.outputs) {
        history.push(t.nodes[i].set_ready(buf, running));
    }
    // While the device computes, release the graph on this thread: its nodes become spares
    // for recording the next one.
    drop(t);
    // First the registry's references: the graph's nodes are reusable once only the
    // released history holds them.
    drop(std::mem::take(held));
    let mut released = Vec::new();
    super::graph::recycle(history, &mut released);
    if wait == Wait::No {
        bump(0, 1);
        bump(13, 1);
        timeline.keep(events);
        if !released.is_empty() {
            reap(Box::new(released));
        }
        return Ok(());
    }
    let bookkeeping = dispatched_at.elapsed();
    // Time spent here counts as the plugin's only while the program was still running
    // (it overlapped): when it is done already, all of it was zoo's.
    let overran = events.iter().all(|e| e.is_ready().unwrap_or(true));
    let done = events.iter().try_for_each(|e| e.wait());
    let elapsed = start.elapsed();
    let plugin = if overran {
        elapsed.saturating_sub(bookkeeping)
    } else {
        elapsed
    };
    bump(7, plugin.as_nanos() as u64);
    bump(0, 1);
    // Destroying buffers costs a few microseconds each in the plugin: not on this thread.
    if !released.is_empty() {
        reap(Box::new(released));
    }
    done.map_err(|e| pjrt_err(op, d, e))
}

/// The StableHLO text of a trace on device `d` (partitioned over its mesh, if it is one).
fn lower_trace(
    t: &Trace<'_>,
    d: PjrtDevice,
    precision: super::Precision,
    shardy: bool,
) -> Result<String> {
    let params: Vec<(&[usize], DType)> = t.params.iter().map(|p| (&*p.shape, p.dtype)).collect();
    let nodes: Vec<LowerNode<'_>> = t
        .nodes
        .iter()
        .zip(&t.spans)
        .map(|(n, &(a, b))| LowerNode {
            op: &n.op,
            shape: &n.shape,
            dtype: n.dtype,
            inputs: &t.edges[a..b],
        })
        .collect();
    let mut aliases = vec![None; t.params.len()];
    for &(p, o) in &t.aliases {
        aliases[p] = Some(o);
    }
    let param_shardings: Vec<u32> = t.params.iter().map(|p| p.sharding).collect();
    let out_shardings: Vec<u32> = t.outputs.iter().map(|&i| t.nodes[i].sharding).collect();
    let layout = d.mesh().map(|mesh| MeshLayout {
        mesh,
        params: &param_shardings,
        outputs: &out_shardings,
        shardy,
    });
    lower(
        &params,
        &aliases,
        &nodes,
        &t.outputs,
        precision,
        layout.as_ref(),
    )
}

#[allow(clippy::too_many_arguments)]
fn load_or_compile(
    b: &Backend,
    devs: &[pjrt::Device],
    t: &Trace<'_>,
    d: PjrtDevice,
    h: u64,
    precision: super::Precision,
    op: &'static str,
) -> Result<LoadedExecutable> {
    // The disk entry is keyed by the program text too: the graph hash says what was traced,
    // not how this build of zoo lowers it, and a newer lowering must not load an older one's
    // executable.
    let text = lower_trace(t, d, precision, b.shardy)?;
    let h = h ^ cache::fnv1a(text.as_bytes()).rotate_left(1);
    let dir = cache::cache_dir();
    let header = cache::header(&b.identity, h);
    let path = dir
        .as_deref()
        .map(|dir| cache::entry_path(dir, h, b.plugin_key));
    if let Some(p) = &path {
        match cache::read(p, &header) {
            Ok(bytes) => match b.client.deserialize_executable(&bytes) {
                Ok(e) => {
                    bump(3, 1);
                    return Ok(e);
                }
                Err(e) => {
                    *lock(&LAST_REJECT) =
                        Some(format!("{}: the plugin cannot load it: {e}", p.display()));
                    // The plugin refuses its own bytes (e.g. a build with the same version
                    // string but another layout): drop the entry and recompile.
                    let _ = std::fs::remove_file(p);
                    bump(5, 1);
                }
            },
            Err(Miss::Rejected(why)) => {
                *lock(&LAST_REJECT) = Some(format!("{}: {why}", p.display()));
                bump(5, 1)
            }
            Err(Miss::Absent) => {}
        }
    }
    let options = match devs {
        [one] => CompileOptions::on(one),
        all => CompileOptions::partitioned(all),
    }
    .map_err(|e| pjrt_err(op, d, e))?
    .strict_rounding(super::matmul_precision() == super::Precision::Highest)
    .shardy(b.shardy);
    let start = Instant::now();
    let exe = b
        .client
        .compile(&text, &options)
        .map_err(|e| pjrt_err(op, d, e))?;
    bump(6, start.elapsed().as_nanos() as u64);
    bump(1, 1);
    if let Some(p) = &path {
        // A plugin that cannot serialize keeps the executable in memory only.
        if let Ok(bytes) = exe.serialize() {
            if !bytes.is_empty() && cache::write(p, &header, &bytes).is_ok() {
                bump(4, 1);
            }
        }
    }
    Ok(exe)
}

/// The StableHLO text that materialising `roots` would compile (for inspection and tests).
pub(crate) fn stablehlo_of(roots: &[Arc<Node>]) -> Result<String> {
    let precision = matmul_precision();
    let d = roots
        .first()
        .map_or(PjrtDevice::new(PjrtPlatform::Cpu, 0), |n| n.device);
    let device_lock = device_lock(d);
    let running = Running {
        device: d,
        _guard: lock(&device_lock),
    };
    let t = trace(roots, &running, precision, None);
    // The partitioner of the plugin that would compile it (Shardy where none is loaded).
    let shardy = super::plugins::devices("stablehlo", d).map_or(true, |(b, _)| b.shardy);
    lower_trace(&t, d, precision, shardy)
}

/// The executable that materialising `roots` (all on one device) would run: found in the
/// caches or compiled, not run.
pub(crate) fn executable_of(roots: &[Arc<Node>]) -> Result<Arc<LoadedExecutable>> {
    let op = "compiled_program";
    let Some(d) = roots.first().map(|n| n.device) else {
        return Err(Error::InvalidArgument {
            op,
            msg: "no PJRT tensor given".into(),
        });
    };
    let precision = matmul_precision();
    let device_lock = device_lock(d);
    let running = Running {
        device: d,
        _guard: lock(&device_lock),
    };
    let (b, devs) = devices(op, d)?;
    let t = trace(roots, &running, precision, None);
    executable(&b, &devs, &t, d, precision, op)
}

/// The executable of trace `t`: from the memory cache, else loaded from disk or compiled
/// (and kept in memory).
fn executable(
    b: &Backend,
    devs: &[pjrt::Device],
    t: &Trace<'_>,
    d: PjrtDevice,
    precision: super::Precision,
    op: &'static str,
) -> Result<Arc<LoadedExecutable>> {
    let h = t.hash;
    let cached = lock(&b.exes).get(&h).cloned();
    if let Some(e) = cached {
        bump(2, 1);
        return Ok(e);
    }
    let e = Arc::new(load_or_compile(b, devs, t, d, h, precision, op)?);
    lock(&b.exes).insert(h, e.clone());
    Ok(e)
}

/// Compiles `text` on the device of `d` (the raw path, for tests of compile errors).
pub(crate) fn compile_text(d: PjrtDevice, text: &str) -> Result<()> {
    let op = "compile";
    let (b, dev) = device(op, d)?;
    let options = CompileOptions::on(&dev)
        .map_err(|e| pjrt_err(op, d, e))?
        .strict_rounding(super::matmul_precision() == super::Precision::Highest);
    b.client
        .compile(text, &options)
        .map(|_| ())
        .map_err(|e| pjrt_err(op, d, e))
}

/// The identity string of the plugin behind `platform` (what disk-cache entries record).
pub(crate) fn identity(platform: PjrtPlatform) -> Result<String> {
    let d = PjrtDevice::new(platform, 0);
    backend(platform)
        .map(|b| b.identity.clone())
        .map_err(|e| pjrt_err("identity", d, e))
}
