//! Clients, transfers and materialisation: trace → hash → cache lookup → (lower, compile)
//! → execute → results become device-resident leaves.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hash, Hasher};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::cache::{self, Miss};
use super::graph::{Dims, Node, NodeOp, Running, State, StructHasher};
use super::lower::{lower, LowerNode, Ref};
use super::{matmul_precision, LazyTensor};
use crate::error::BackendContext;
use crate::op::Op;
use crate::pjrt::{
    self, Buffer, Client, ClientOptions, CompileOptions, ElementType, ErrorCode, ExecuteOptions,
    Execution, LoadedExecutable, PjrtError, Plugin,
};
use crate::{DType, Device, Error, PjrtDevice, PjrtPlatform, Result};

/// How a platform's plugin is chosen; see [`super::configure`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct PluginConfig {
    pub path: Option<PathBuf>,
    pub cpu_devices: Option<usize>,
}

/// One client of one plugin, shared by every tensor on its devices.
pub(crate) struct Backend {
    pub client: Client,
    pub devices: Vec<pjrt::Device>,
    /// Plugin file, API version and platform version: what a disk-cache entry must match.
    pub identity: String,
    pub plugin_key: u64,
    pub config: PluginConfig,
    exes: Mutex<HashMap<u64, Arc<LoadedExecutable>>>,
}

static CONFIGS: Mutex<Option<HashMap<PjrtPlatform, PluginConfig>>> = Mutex::new(None);
static BACKENDS: Mutex<Option<HashMap<PjrtPlatform, Arc<Backend>>>> = Mutex::new(None);

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Every guarded value is updated by single assignments, so a poisoned lock still holds
    // a consistent value.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

pub(crate) fn pjrt_err(op: &'static str, device: PjrtDevice, source: PjrtError) -> Error {
    match source {
        PjrtError::Plugin {
            code: ErrorCode::ResourceExhausted,
            message,
            ..
        }
        | PjrtError::Compile {
            code: ErrorCode::ResourceExhausted,
            message,
            ..
        } => Error::OutOfMemory {
            op,
            device: Device::Pjrt(device),
            message,
        },
        PjrtError::Plugin { ref message, .. }
            if message.contains("Out of memory") || message.contains("out of memory") =>
        {
            Error::OutOfMemory {
                op,
                device: Device::Pjrt(device),
                message: message.clone(),
            }
        }
        source => Error::Pjrt {
            op,
            device: Device::Pjrt(device),
            source,
        },
    }
}

pub(crate) fn configure(platform: PjrtPlatform, config: PluginConfig) -> Result<()> {
    if let Some(b) = lock(&BACKENDS).as_ref().and_then(|m| m.get(&platform)) {
        if b.config != config {
            return Err(Error::InvalidArgument {
                op: "lazy::configure",
                msg: format!("the {platform:?} PJRT client already runs with {:?}; configure before the first PJRT tensor is created", b.config),
            });
        }
        return Ok(());
    }
    lock(&CONFIGS)
        .get_or_insert_with(HashMap::new)
        .insert(platform, config);
    Ok(())
}

fn platform_name(p: PjrtPlatform) -> &'static str {
    match p {
        PjrtPlatform::Cpu => "cpu",
        PjrtPlatform::Cuda => "cuda",
        PjrtPlatform::Tpu => "tpu",
    }
}

/// The process-wide client of `platform`, created on first use.
pub(crate) fn backend(platform: PjrtPlatform) -> std::result::Result<Arc<Backend>, PjrtError> {
    let mut guard = lock(&BACKENDS);
    let map = guard.get_or_insert_with(HashMap::new);
    if let Some(b) = map.get(&platform) {
        return Ok(b.clone());
    }
    let config = lock(&CONFIGS)
        .as_ref()
        .and_then(|m| m.get(&platform).cloned())
        .unwrap_or_default();
    let name = platform_name(platform);
    let env_path = match platform {
        PjrtPlatform::Cpu => std::env::var_os("ZOO_PJRT_CPU_PLUGIN")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from),
        _ => None,
    };
    let path = config.path.clone().or(env_path);
    let plugin = match &path {
        Some(p) => Plugin::load(p)?,
        None => pjrt::discovery::load_plugin(Some(name), None)?,
    };
    let mut options = ClientOptions::new();
    if platform == PjrtPlatform::Cpu {
        let n = match config.cpu_devices {
            Some(n) => n,
            None => match std::env::var("ZOO_PJRT_CPU_DEVICES") {
                Ok(v) => v
                    .trim()
                    .parse::<usize>()
                    .ok()
                    .filter(|&n| n > 0)
                    .ok_or_else(|| {
                        PjrtError::InvalidArgument(format!(
                            "ZOO_PJRT_CPU_DEVICES={v:?} is not a positive device count"
                        ))
                    })?,
                Err(_) => 4,
            },
        };
        options = options.cpu_device_count(n as i64);
    }
    let client = plugin.client(&options)?;
    let devices = client.addressable_devices()?;
    let (major, minor) = plugin.api_version();
    let identity = format!(
        "{} api={major}.{minor} platform={} {} devices={}",
        std::fs::canonicalize(plugin.path())
            .unwrap_or_else(|_| plugin.path().to_path_buf())
            .display(),
        client.platform_name().unwrap_or_default(),
        client.platform_version().unwrap_or_default(),
        devices.len()
    );
    let plugin_key = cache::fnv1a(identity.as_bytes());
    let b = Arc::new(Backend {
        client,
        devices,
        identity,
        plugin_key,
        config,
        exes: Mutex::new(HashMap::new()),
    });
    map.insert(platform, b.clone());
    Ok(b)
}

/// The backend and PJRT device behind `d`, or a typed error naming the device.
pub(crate) fn device(op: &'static str, d: PjrtDevice) -> Result<(Arc<Backend>, pjrt::Device)> {
    let b = backend(d.platform).map_err(|e| pjrt_err(op, d, e))?;
    let dev = b
        .devices
        .get(d.ordinal)
        .cloned()
        .ok_or_else(|| Error::Pjrt {
            op,
            device: Device::Pjrt(d),
            source: PjrtError::InvalidArgument(format!(
            "the {} plugin has {} device(s) (0..{}); for more CPU devices set ZOO_PJRT_CPU_DEVICES",
            platform_name(d.platform),
            b.devices.len(),
            b.devices.len()
        )),
        })?;
    Ok((b, dev))
}

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
}

static STATS: [AtomicU64; 12] = [const { AtomicU64::new(0) }; 12];

fn bump(i: usize, v: u64) {
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
    }
}

// ----- transfers -----

/// Index tensors up to this many elements keep a host copy for range checks.
const HOST_INTS_MAX: usize = 4096;

/// Uploads a candle tensor (any candle device) to `d` as a leaf of API dtype `dtype`.
pub(crate) fn upload(t: &candle_core::Tensor, dtype: DType, d: PjrtDevice) -> Result<LazyTensor> {
    let op = "to_device";
    let (b, dev) = device(op, d)?;
    let shape: Vec<usize> = t.dims().to_vec();
    let t = t
        .to_device(&candle_core::Device::Cpu)
        .and_then(|t| t.flatten_all())
        .op(op)?;
    let dims: Vec<i64> = shape.iter().map(|&v| v as i64).collect();
    let host_ints = if dtype.is_int() && t.elem_count() <= HOST_INTS_MAX {
        let v = t
            .to_dtype(candle_core::DType::I64)
            .and_then(|t| t.to_vec1::<i64>())
            .op(op)?;
        Some(Arc::<[i64]>::from(v))
    } else {
        None
    };
    // One-element uploads (the -inf of a mask fill, a position) repeat every step of a
    // decode loop; buffers are immutable, so equal ones share one device buffer.
    let memo_key = if t.elem_count() == 1 {
        Some((
            d,
            dtype,
            Dims::from(shape.as_slice()),
            scalar_bits(&t, dtype, op)?,
        ))
    } else {
        None
    };
    if let Some(k) = &memo_key {
        let hit = lock(&SCALARS).as_ref().and_then(|m| m.get(k).cloned());
        if let Some(buf) = hit {
            return Ok(leaf(buf, Dims::from(shape), dtype, d, host_ints));
        }
    }
    let c = &b.client;
    let started = Instant::now();
    let buf = match dtype {
        DType::F32 => c.buffer_from_slice(&t.to_vec1::<f32>().op(op)?, &dims, &dev),
        DType::F16 => c.buffer_from_slice(&t.to_vec1::<half::f16>().op(op)?, &dims, &dev),
        DType::BF16 => c.buffer_from_slice(&t.to_vec1::<half::bf16>().op(op)?, &dims, &dev),
        DType::F64 => c.buffer_from_slice(&t.to_vec1::<f64>().op(op)?, &dims, &dev),
        DType::I64 => c.buffer_from_slice(&t.to_vec1::<i64>().op(op)?, &dims, &dev),
        DType::I32 => c.buffer_from_slice(&t.to_vec1::<i32>().op(op)?, &dims, &dev),
        DType::U8 => c.buffer_from_slice(&t.to_vec1::<u8>().op(op)?, &dims, &dev),
        DType::Bool => {
            c.buffer_from_bytes(&t.to_vec1::<u8>().op(op)?, ElementType::Pred, &dims, &dev)
        }
    }
    .map_err(|e| pjrt_err(op, d, e))?;
    bump(9, started.elapsed().as_nanos() as u64);
    let buf = Arc::new(buf);
    if let Some(k) = memo_key {
        let mut guard = lock(&SCALARS);
        let m = guard.get_or_insert_with(HashMap::new);
        if m.len() >= SCALARS_MAX {
            m.clear();
        }
        m.insert(k, buf.clone());
    }
    Ok(leaf(buf, Dims::from(shape), dtype, d, host_ints))
}

type ScalarKey = (PjrtDevice, DType, Dims, u64);
static SCALARS: Mutex<Option<HashMap<ScalarKey, Arc<Buffer>>>> = Mutex::new(None);
const SCALARS_MAX: usize = 4096;

/// The shared buffer of a one-element float upload of `value` (rounded to `dtype`) already
/// made, as a new leaf; `None` when there is none yet (then the caller uploads, which shares
/// it). Mask fills repeat such scalars for every layer of every step: this finds them
/// without building and reading back a host tensor first.
pub(crate) fn shared_scalar(
    value: f64,
    shape: &[usize],
    dtype: DType,
    d: PjrtDevice,
) -> Option<LazyTensor> {
    use crate::Element;
    // A NaN's payload may not survive the f64 round trip: those take the upload path.
    if value.is_nan() {
        return None;
    }
    let bits = match dtype {
        DType::F32 => u64::from(f32::from_f64(value).to_bits()),
        DType::F16 => u64::from(half::f16::from_f64(value).to_bits()),
        DType::BF16 => u64::from(half::bf16::from_f64(value).to_bits()),
        DType::F64 => value.to_bits(),
        _ => return None,
    };
    let key = (d, dtype, Dims::from(shape), bits);
    let buf = lock(&SCALARS).as_ref()?.get(&key).cloned()?;
    Some(leaf(buf, key.2, dtype, d, None))
}

/// The bit pattern of the single element of `t` (exact for every dtype, unlike an f64).
fn scalar_bits(t: &candle_core::Tensor, dtype: DType, op: &'static str) -> Result<u64> {
    let first = |t: &candle_core::Tensor| t.flatten_all().and_then(|t| t.get(0));
    let e = first(t).op(op)?;
    Ok(match dtype {
        DType::F32 => u64::from(e.to_scalar::<f32>().op(op)?.to_bits()),
        DType::F16 => u64::from(e.to_scalar::<half::f16>().op(op)?.to_bits()),
        DType::BF16 => u64::from(e.to_scalar::<half::bf16>().op(op)?.to_bits()),
        DType::F64 => e.to_scalar::<f64>().op(op)?.to_bits(),
        DType::I64 => e.to_scalar::<i64>().op(op)? as u64,
        DType::I32 => e.to_scalar::<i32>().op(op)? as u32 as u64,
        DType::U8 | DType::Bool => u64::from(e.to_scalar::<u8>().op(op)?),
    })
}

fn leaf(
    buf: Arc<Buffer>,
    shape: Dims,
    dtype: DType,
    d: PjrtDevice,
    host_ints: Option<Arc<[i64]>>,
) -> LazyTensor {
    LazyTensor::new(super::graph::new_node(
        NodeOp::Leaf,
        shape,
        dtype,
        d,
        State::Ready(buf),
        host_ints,
    ))
}

/// The value of `t` as a CPU candle tensor (bool as u8 0/1), materialising it first.
pub(crate) fn download(t: &LazyTensor, op: &'static str) -> Result<candle_core::Tensor> {
    let n = &t.node;
    let buf = ready_buffer(n, op)?;
    let d = n.device;
    let pe = |e: PjrtError| pjrt_err(op, d, e);
    let cpu = candle_core::Device::Cpu;
    let s: &[usize] = &n.shape;
    let started = Instant::now();
    let ct = match n.dtype {
        DType::F32 => candle_core::Tensor::from_vec(buf.to_vec::<f32>().map_err(pe)?, s, &cpu),
        DType::F16 => {
            candle_core::Tensor::from_vec(buf.to_vec::<half::f16>().map_err(pe)?, s, &cpu)
        }
        DType::BF16 => {
            candle_core::Tensor::from_vec(buf.to_vec::<half::bf16>().map_err(pe)?, s, &cpu)
        }
        DType::F64 => candle_core::Tensor::from_vec(buf.to_vec::<f64>().map_err(pe)?, s, &cpu),
        DType::I64 => candle_core::Tensor::from_vec(buf.to_vec::<i64>().map_err(pe)?, s, &cpu),
        DType::I32 => candle_core::Tensor::from_vec(buf.to_vec::<i32>().map_err(pe)?, s, &cpu),
        DType::U8 => candle_core::Tensor::from_vec(buf.to_vec::<u8>().map_err(pe)?, s, &cpu),
        DType::Bool => {
            let bytes: Vec<u8> = buf
                .to_host_bytes()
                .map_err(pe)?
                .into_iter()
                .map(|b| u8::from(b != 0))
                .collect();
            candle_core::Tensor::from_vec(bytes, s, &cpu)
        }
    };
    bump(9, started.elapsed().as_nanos() as u64);
    ct.op(op)
}

/// Copies `t` to another device of the same plugin (device to device), or through the
/// host to another plugin.
pub(crate) fn copy_to(t: &LazyTensor, to: PjrtDevice) -> Result<LazyTensor> {
    let op = "to_device";
    let n = &t.node;
    if n.device.platform != to.platform {
        let host = download(t, op)?;
        return upload(&host, n.dtype, to);
    }
    let buf = ready_buffer(n, op)?;
    let (_, dev) = device(op, to)?;
    let started = Instant::now();
    let copied = buf.copy_to_device(&dev).map_err(|e| pjrt_err(op, to, e))?;
    bump(9, started.elapsed().as_nanos() as u64);
    Ok(leaf(
        Arc::new(copied),
        n.shape.clone(),
        n.dtype,
        to,
        n.host_ints.clone(),
    ))
}

fn ready_buffer(n: &Arc<Node>, op: &'static str) -> Result<Arc<Buffer>> {
    if let Some(b) = n.buffer() {
        return Ok(b.clone());
    }
    materialize(std::slice::from_ref(n), op)?;
    n.buffer().cloned().ok_or_else(|| Error::InvalidArgument {
        op,
        msg: "the graph ran but did not produce this tensor (internal error)".into(),
    })
}

// ----- materialisation -----

/// Pointers are unique per live node and already well mixed in their middle bits.
#[derive(Default)]
struct PtrHasher(u64);
impl Hasher for PtrHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) | u64::from(b);
        }
    }
    fn write_usize(&mut self, i: usize) {
        self.0 = (i as u64 >> 4).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

type PtrMap = HashMap<usize, Ref, BuildHasherDefault<PtrHasher>>;

fn key(n: &Arc<Node>) -> usize {
    Arc::as_ptr(n) as usize
}

/// A traced graph: what runs, in dependency order, and its structural hash.
struct Trace<'g> {
    /// Borrowed: the run lock and the caller's roots keep every traced node alive and its
    /// operands unchanged until the results are set (see `run`).
    params: Vec<&'g Node>,
    param_bufs: Vec<&'g Arc<Buffer>>,
    nodes: Vec<&'g Node>,
    /// The operands of every node, flattened; node `i` owns `edges[spans[i].0..spans[i].1]`.
    edges: Vec<Ref>,
    spans: Vec<(usize, usize)>,
    outputs: Vec<usize>,
    /// Parameters donated to an output, as (parameter, position in `outputs`): the program
    /// aliases them (`tf.aliasing_output`) and the plugin consumes their buffers.
    aliases: Vec<(usize, usize)>,
    hash: u64,
}

/// Capacities of the last trace, so the next one (a decode step is the same graph again)
/// does not grow its vectors step by step.
static TRACE_SIZES: [AtomicUsize; 3] = [const { AtomicUsize::new(0) }; 3];

/// Words that separate the kinds of entries fed to the structural hash.
const TAG_PARAM: u64 = 0x5041_5241_4d00_0001;
const TAG_NODE: u64 = 0x4e4f_4445_0000_0002;
const TAG_OUTPUTS: u64 = 0x4f55_5450_5554_0003;
const TAG_ALIASES: u64 = 0x414c_4941_5300_0004;

/// Walks the pending graph behind `outs` once (iterative post-order, so deep graphs cannot
/// overflow the stack): numbers the ready nodes it meets as parameters, orders the pending
/// ones, and hashes the structure on the way (ops, attributes, shapes, dtypes, operand
/// wiring, device, precision, donation; never values). Each node's own structure was hashed
/// when it was recorded (`Node::local`), so the walk feeds a few words per node.
///
/// With `donate`, every parameter whose buffer nothing else can read any more (no tensor
/// handle on its node, and no other owner of the buffer) is donated to an output of the same
/// shape and dtype, preferring the `dynamic_update_slice` that writes into it (a KV cache
/// update then happens in place). Only pass `donate` when `outs` holds every live pending
/// tensor of the device: a pending tensor outside the graph could still read the leaf.
fn trace<'g>(
    outs: &'g [Arc<Node>],
    running: &'g Running<'_>,
    precision: super::Precision,
    donate: bool,
) -> Trace<'g> {
    // Marks are per walk (a fresh epoch each) and a node is only walked under its device's
    // run lock, so two walks never touch the same node.
    static EPOCH: AtomicU64 = AtomicU64::new(0);
    let epoch = EPOCH.fetch_add(1, Ordering::Relaxed) + 1;
    let numbered = |n: &Node| n.mark.load(Ordering::Relaxed) == epoch;
    let number = |n: &Node, r: Ref| {
        n.slot.store(encode(r), Ordering::Relaxed);
        n.mark.store(epoch, Ordering::Relaxed);
    };
    let slot = |n: &Node| n.slot.load(Ordering::Relaxed);
    let mut h = StructHasher::new();
    running.device.hash(&mut h);
    h.word(precision as u64);
    let cap = |i: usize| TRACE_SIZES[i].load(Ordering::Relaxed);
    let mut t = Trace {
        params: Vec::with_capacity(cap(0)),
        param_bufs: Vec::with_capacity(cap(0)),
        nodes: Vec::with_capacity(cap(1)),
        edges: Vec::with_capacity(cap(2)),
        spans: Vec::with_capacity(cap(1)),
        outputs: Vec::with_capacity(outs.len()),
        aliases: Vec::new(),
        hash: 0,
    };
    // The walk borrows: under the run lock no operand list changes, so everything reachable
    // from `outs` stays alive and in place while the trace exists.
    let mut operands: Vec<&'g Node> = Vec::with_capacity(64);
    let mut stack: Vec<Frame<'g>> = Vec::with_capacity(64);
    stack.extend(outs.iter().rev().map(Frame::Visit));
    while let Some(frame) = stack.pop() {
        match frame {
            Frame::Visit(n) => {
                if numbered(n) {
                    continue;
                }
                if let Some(b) = n.buffer() {
                    // Ready (possibly computed by another thread since it was pushed).
                    t.param_bufs.push(b);
                    // A parameter is its shape and dtype, whatever computed it.
                    h.word(TAG_PARAM);
                    h.word(n.shape.len() as u64);
                    for &d in n.shape.iter() {
                        h.word(d as u64);
                    }
                    n.dtype.hash(&mut h);
                    number(n, Ref::Param(t.params.len()));
                    t.params.push(n);
                    continue;
                }
                let inputs = n.inputs(running);
                if inputs.iter().all(|c| numbered(c)) {
                    // Every operand is numbered: finish now.
                    finish(
                        &mut t,
                        &mut h,
                        n,
                        inputs.len(),
                        inputs.iter().map(|c| slot(c)),
                    );
                    number(n, Ref::Node(t.nodes.len()));
                    t.nodes.push(n);
                } else {
                    let start = operands.len();
                    operands.extend(inputs.iter().map(|c| &**c));
                    // Below its operands: finished once they are.
                    stack.push(Frame::Finish(n, start));
                    for c in inputs.iter().rev() {
                        if !numbered(c) {
                            stack.push(Frame::Visit(c));
                        }
                    }
                }
            }
            Frame::Finish(n, start) => {
                let ops = &operands[start..];
                finish(&mut t, &mut h, n, ops.len(), ops.iter().map(|c| slot(c)));
                operands.truncate(start);
                number(n, Ref::Node(t.nodes.len()));
                t.nodes.push(n);
            }
        }
    }
    for n in outs {
        if numbered(n) {
            if let Ref::Node(i) = decode(slot(n)) {
                t.outputs.push(i);
            }
        }
    }
    h.word(TAG_OUTPUTS);
    h.word(t.outputs.len() as u64);
    for &o in &t.outputs {
        h.word(o as u64);
    }
    if donate {
        t.aliases = choose_aliases(&t);
    }
    h.word(TAG_ALIASES);
    h.word(t.aliases.len() as u64);
    for &(p, o) in &t.aliases {
        h.word(p as u64);
        h.word(o as u64);
    }
    t.hash = h.finish();
    TRACE_SIZES[0].store(t.params.len(), Ordering::Relaxed);
    TRACE_SIZES[1].store(t.nodes.len(), Ordering::Relaxed);
    TRACE_SIZES[2].store(t.edges.len(), Ordering::Relaxed);
    t
}

/// A step of the walk in [`trace`].
enum Frame<'g> {
    /// Number this node (a parameter), or finish it now, or queue its operands first.
    Visit(&'g Arc<Node>),
    /// Finish this node: its operands (from the given index of the operand stack on) are
    /// all numbered.
    Finish(&'g Arc<Node>, usize),
}

/// Appends a pending node with operand numbers `slots` to `t` and the hash.
fn finish(
    t: &mut Trace,
    h: &mut StructHasher,
    n: &Node,
    count: usize,
    slots: impl Iterator<Item = u64>,
) {
    let start = t.edges.len();
    h.word(TAG_NODE);
    h.word(n.local);
    h.word(count as u64);
    for s in slots {
        h.word(s);
        t.edges.push(decode(s));
    }
    t.spans.push((start, t.edges.len()));
}

/// A node's number in a walk as one word: parameters odd, nodes even.
fn encode(r: Ref) -> u64 {
    match r {
        Ref::Param(i) => ((i as u64) << 1) | 1,
        Ref::Node(i) => (i as u64) << 1,
    }
}

fn decode(v: u64) -> Ref {
    if v & 1 == 1 {
        Ref::Param((v >> 1) as usize)
    } else {
        Ref::Node((v >> 1) as usize)
    }
}

/// Which parameters of `t` to donate, and to which output (see [`trace`]). A parameter is
/// donatable when no tensor handle refers to its node and the trace and the node are the
/// only owners of its buffer (a shared one-element upload, or a buffer being read on
/// another thread, is not). Decided from the handles before the hash, so a graph whose leaf
/// is still held compiles (and is cached) without the alias.
fn choose_aliases(t: &Trace<'_>) -> Vec<(usize, usize)> {
    let donatable =
        |p: usize| -> bool { !t.params[p].is_live() && Arc::strong_count(t.param_bufs[p]) == 1 };
    let mut aliases = Vec::new();
    let mut param_taken: Vec<bool> = Vec::new();
    // In-place updates: an output `dynamic_update_slice` of a donatable leaf.
    for (o, &i) in t.outputs.iter().enumerate() {
        let n = &t.nodes[i];
        if !matches!(n.op, NodeOp::Op(Op::DynamicUpdateSlice)) {
            continue;
        }
        let (a, _) = t.spans[i];
        if let Ref::Param(p) = t.edges[a] {
            if param_taken.len() <= p {
                param_taken.resize(t.params.len(), false);
            }
            if !param_taken[p] && donatable(p) {
                param_taken[p] = true;
                aliases.push((p, o));
            }
        }
    }
    // Only those: donating any other unheld leaf to a free output of its shape and dtype
    // let a split model running beside another model on the same devices read a donated
    // buffer (cause not found; tests/pjrt.rs in zoo-transformers caught it), so the
    // allocator keeps that memory.
    aliases.sort_unstable();
    aliases
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
        // Every live pending tensor of the device is in this graph, so leaves only it reads
        // may be donated.
        let mut r = run(&outs, &running, op, true, &mut held);
        if r.is_err() {
            if outs.len() > asked && asked > 0 {
                // Another live tensor may be what fails (one too large for the device,
                // say): what was asked for must not fail because of it, so run that alone,
                // donating nothing (the live tensors left out may still read any leaf).
                r = run(&outs[..asked], &running, op, false, &mut held);
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

fn run(
    outs: &[Arc<Node>],
    running: &Running<'_>,
    op: &'static str,
    donate: bool,
    held: &mut Vec<Arc<Node>>,
) -> Result<()> {
    let d = running.device;
    let (b, dev) = device(op, d)?;
    let precision = matmul_precision();
    let t = trace(outs, running, precision, donate);
    let h = t.hash;
    bump(10, t.nodes.len() as u64);
    let cached = lock(&b.exes).get(&h).cloned();
    let exe = match cached {
        Some(e) => {
            bump(2, 1);
            e
        }
        None => {
            let e = Arc::new(load_or_compile(&b, &dev, &t, d, h, precision, op)?);
            lock(&b.exes).insert(h, e.clone());
            e
        }
    };
    let args: Vec<&Buffer> = t.param_bufs.iter().map(|b| &***b).collect();
    let start = Instant::now();
    let dispatched = exe.execute_async(&[&args], &ExecuteOptions::new());
    // From here until the wait, zoo's bookkeeping overlaps the running program.
    let dispatched_at = Instant::now();
    drop(args);
    let Execution {
        outputs: mut lists,
        events,
    } = match dispatched {
        Ok(e) => e,
        Err(e) => {
            bump(7, start.elapsed().as_nanos() as u64);
            bump(0, 1);
            return Err(pjrt_err(op, d, e));
        }
    };
    let bufs = lists.pop().unwrap_or_default();
    if bufs.len() != t.outputs.len() {
        for e in &events {
            let _ = e.wait();
        }
        return Err(Error::Pjrt {
            op,
            device: Device::Pjrt(d),
            source: PjrtError::InvalidArgument(format!(
                "the executable returned {} buffers for {} outputs",
                bufs.len(),
                t.outputs.len()
            )),
        });
    }
    if !t.aliases.is_empty() {
        // Count what the plugin really consumed (a plugin may copy instead of aliasing).
        let consumed = t
            .aliases
            .iter()
            .filter(|&&(p, _)| t.param_bufs[p].is_deleted().unwrap_or(false))
            .count();
        bump(11, consumed as u64);
    }
    // The outputs are usable at once (reads and later graphs wait for them inside the
    // plugin); an error of the running program reaches `materialize`'s caller below, and
    // every later read of these outputs.
    let mut history = Vec::with_capacity(bufs.len());
    for (buf, &i) in bufs.into_iter().zip(&t.outputs) {
        history.push(t.nodes[i].set_ready(Arc::new(buf), running));
    }
    // While the device computes, release the graph on this thread: its nodes become spares
    // for recording the next one.
    drop(t);
    // First the registry's references: the graph's nodes are reusable once only the
    // released history holds them.
    drop(std::mem::take(held));
    let mut released = Vec::new();
    super::graph::recycle(history, &mut released);
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

/// The StableHLO text of a trace.
fn lower_trace(t: &Trace<'_>, precision: super::Precision) -> Result<String> {
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
    lower(&params, &aliases, &nodes, &t.outputs, precision)
}

#[allow(clippy::too_many_arguments)]
fn load_or_compile(
    b: &Backend,
    dev: &pjrt::Device,
    t: &Trace<'_>,
    d: PjrtDevice,
    h: u64,
    precision: super::Precision,
    op: &'static str,
) -> Result<LoadedExecutable> {
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
    let text = lower_trace(t, precision)?;
    let options = CompileOptions::on(dev)
        .map_err(|e| pjrt_err(op, d, e))?
        .strict_rounding(super::matmul_precision() == super::Precision::Highest);
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
    let d = roots.first().map_or(
        PjrtDevice {
            platform: PjrtPlatform::Cpu,
            ordinal: 0,
        },
        |n| n.device,
    );
    let device_lock = device_lock(d);
    let running = Running {
        device: d,
        _guard: lock(&device_lock),
    };
    let t = trace(roots, &running, precision, false);
    lower_trace(&t, precision)
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
    let d = PjrtDevice {
        platform,
        ordinal: 0,
    };
    backend(platform)
        .map(|b| b.identity.clone())
        .map_err(|e| pjrt_err("identity", d, e))
}
