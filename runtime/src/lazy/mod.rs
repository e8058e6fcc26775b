//! The lazy PJRT backend: tensors on [`crate::Device::Pjrt`] record a graph that is lowered
//! to StableHLO, compiled once per structure, cached, and run on the plugin.
//!
//! - Ops on PJRT tensors go through the same `Tensor::apply` as eager ones and
//!   record a node holding the same `Op` value (`graph.rs`).
//! - Reading a value (`to_vec`, `to_scalar`), [`crate::Tensor::sync`], or a transfer to
//!   another device materialises: the pending nodes reachable from the requested tensors
//!   (and every other live pending tensor of that device, as torch_xla's `mark_step` does;
//!   `registry.rs` finds them) are traced into one graph, hashed by structure (ops,
//!   attributes, shapes, dtypes, device; never leaf values), looked up in memory and on
//!   disk (`cache.rs`), lowered to a
//!   StableHLO `func.func @main` and compiled on a miss (`lower.rs`), and executed; the
//!   results become device-resident leaves (`exec.rs`). A leaf no tensor handle refers to
//!   any more (the old KV cache after `*ck = ck.dynamic_update_slice(..)`) is donated to an
//!   output of its shape, so the update is written in place; donation is part of the hash.
//! - One client per platform and process, created from `ZOO_PJRT_CPU_PLUGIN` (or plugin
//!   discovery) with `ZOO_PJRT_CPU_DEVICES` CPU devices (default 4), unless [`configure`]
//!   said otherwise first.

pub(crate) mod cache;
pub(crate) mod exec;
pub(crate) mod graph;
pub(crate) mod lower;
pub(crate) mod plugins;
pub(crate) mod registry;
pub(crate) mod shard;
mod trace;
mod transfer;

use std::path::PathBuf;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

use graph::{infer_shape, Dims, Inputs, Node, NodeOp, State};

use crate::op::Op;
use crate::{DType, Error, PjrtDevice, PjrtPlatform, Result, Tensor};

pub use cache::{cache_dir, set_cache_dir};
pub use exec::LazyStats;

/// Matmul and convolution precision of f32 programs (`precision_config` of
/// `stablehlo.dot_general` / `stablehlo.convolution`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[repr(u8)]
pub enum Precision {
    /// The plugin's default: fastest (on TPUs, bf16 passes for f32 operands).
    #[default]
    Default = 0,
    /// Full f32 precision, and 16-bit values rounded after every op as PyTorch rounds them
    /// (XLA otherwise keeps fused intermediates in f32): what parity runs against PyTorch
    /// use. With it, bf16 decoders match transformers bit for bit on the XLA CPU plugin.
    Highest = 1,
}

static PRECISION: AtomicU8 = AtomicU8::new(0);

/// Sets the matmul/convolution precision of graphs compiled from now on, process-wide. It
/// is part of the graph hash, so switching never reuses an executable of the other one.
pub fn set_matmul_precision(p: Precision) {
    PRECISION.store(p as u8, Ordering::Relaxed);
}

/// The current matmul/convolution precision.
pub fn matmul_precision() -> Precision {
    if PRECISION.load(Ordering::Relaxed) == 1 {
        Precision::Highest
    } else {
        Precision::Default
    }
}

/// Chooses the plugin file and (for the CPU plugin) the device count of `platform` before
/// its client is created. Without it the client comes from `ZOO_PJRT_CPU_PLUGIN` /
/// `ZOO_PJRT_CPU_DEVICES` or plugin discovery. Calling it again with the same values is
/// fine; other values once the client exists are an error.
pub fn configure(
    platform: PjrtPlatform,
    plugin: Option<PathBuf>,
    cpu_devices: Option<usize>,
) -> Result<()> {
    plugins::configure(
        platform,
        plugins::PluginConfig {
            path: plugin,
            cpu_devices,
        },
    )
}

/// Counters of the lazy backend (compiles, cache hits, time inside the plugin).
pub fn stats() -> LazyStats {
    exec::stats()
}

/// Drops every executable held in memory and the shared one-element uploads (the disk cache
/// stays), after waiting for graphs queued for freeing to be freed: the next materialisation
/// of each graph loads it from disk or compiles it again.
pub fn clear_memory_cache() {
    exec::clear_memory_cache()
}

/// Why the disk cache last rejected an entry (bad magic, another plugin, checksum, ...).
pub fn last_disk_reject() -> Option<String> {
    exec::last_reject()
}

/// How many devices the client of `platform` has (creating it if needed).
pub fn device_count(platform: PjrtPlatform) -> Result<usize> {
    let d = PjrtDevice::new(platform, 0);
    plugins::backend(platform)
        .map(|b| b.devices.len())
        .map_err(|e| plugins::pjrt_err("device_count", d, e))
}

/// The bytes of f32 attention scores one `scaled_dot_product_attention` holds at once in a
/// compiled program, over `batch_heads` (batch x query heads) rows of `lq` queries by `lk`
/// keys: all of them, or one query chunk's once they pass the lowering's chunk budget
/// (64 MiB), which is what a memory plan for a PJRT device must reserve.
pub fn attention_scores_bytes(batch_heads: usize, lq: usize, lk: usize) -> u64 {
    let (_, rows) = lower::query_chunks(lq, batch_heads.saturating_mul(lk));
    [batch_heads, rows, lk, 4]
        .iter()
        .fold(1u64, |n, &d| n.saturating_mul(d as u64))
}

/// The plugin identity (file, API and platform version, device count) of `platform`'s
/// client: what disk-cache entries are keyed by.
pub fn plugin_identity(platform: PjrtPlatform) -> Result<String> {
    exec::identity(platform)
}

/// Compiles StableHLO text on `device` without running it; a rejected program is
/// [`Error::Pjrt`] holding [`crate::pjrt::PjrtError::Compile`] with the offending line.
pub fn compile_stablehlo(device: PjrtDevice, text: &str) -> Result<()> {
    exec::compile_text(device, text)
}

/// The collective operations (HLO opcode, count) in the program that computing `tensors`
/// (PJRT tensors of one device or mesh) would run, as the compiler left it: on a mesh, the
/// all-reduces, all-gathers and the like XLA's SPMD partitioner inserted. The program is
/// compiled (or found in the caches), not run. Empty for a program on one device, and when
/// no PJRT tensor is given.
pub fn collectives(tensors: &[&Tensor]) -> Result<Vec<(&'static str, usize)>> {
    let nodes: Vec<Arc<Node>> = tensors
        .iter()
        .filter_map(|t| t.lazy().map(|l| l.node.clone()))
        .collect();
    let Some(d) = nodes.first().map(|n| n.device) else {
        return Ok(Vec::new());
    };
    if let Some(other) = nodes.iter().find(|n| n.device != d) {
        return Err(Error::InvalidArgument {
            op: "collectives",
            msg: format!(
                "tensors on {d} and {}: one program runs on one device (or mesh)",
                other.device
            ),
        });
    }
    let exe = exec::executable_of(&nodes)?;
    let (_, program) = exe
        .optimized_program()
        .map_err(|e| plugins::pjrt_err("collectives", d, e))?;
    Ok(count_collectives(&program))
}

/// Counts the instructions of each collective opcode in a serialized HLO module: an
/// instruction's opcode is field 2 of `HloInstructionProto`, a length-delimited string
/// (tag byte `0x12`), so each is found exactly (instruction names, field 1, hold the same
/// words and are not counted).
fn count_collectives(program: &[u8]) -> Vec<(&'static str, usize)> {
    const OPCODES: [&str; 8] = [
        "all-reduce",
        "all-reduce-start",
        "all-gather",
        "all-gather-start",
        "reduce-scatter",
        "all-to-all",
        "collective-permute",
        "collective-permute-start",
    ];
    OPCODES
        .iter()
        .filter_map(|op| {
            let mut needle = vec![0x12u8, op.len() as u8];
            needle.extend_from_slice(op.as_bytes());
            let n = program
                .windows(needle.len())
                .filter(|w| *w == needle.as_slice())
                .count();
            (n > 0).then_some((*op, n))
        })
        .collect()
}

/// A handle on a graph node; counts as a live tensor while it exists.
pub(crate) struct LazyTensor {
    pub(crate) node: Arc<Node>,
}

impl LazyTensor {
    fn new(node: Arc<Node>) -> LazyTensor {
        node.acquire();
        LazyTensor { node }
    }

    pub(crate) fn shape(&self) -> &[usize] {
        &self.node.shape
    }

    pub(crate) fn device(&self) -> PjrtDevice {
        self.node.device
    }
}

impl Clone for LazyTensor {
    fn clone(&self) -> Self {
        LazyTensor::new(self.node.clone())
    }
}

impl Drop for LazyTensor {
    fn drop(&mut self) {
        self.node.release();
    }
}

fn pending(
    op: NodeOp,
    shape: Dims,
    dtype: DType,
    device: PjrtDevice,
    sharding: u32,
    inputs: Inputs,
    host_ints: Option<Arc<[i64]>>,
) -> LazyTensor {
    let t = LazyTensor::new(graph::new_node(
        op,
        shape,
        dtype,
        device,
        sharding,
        State::Pending(inputs),
        host_ints,
    ));
    // Registered once it has its handle: a materialisation on another thread never sees it
    // handle-less (which would read as dead).
    registry::register(&t.node);
    t
}

/// Records `op` over `inputs` (validated, same device) with result dtype `dtype`. Graph
/// walks rely on the shared device (`Tensor::apply` checks it) to read a node's operands
/// under that device's run lock only.
pub(crate) fn record(op: Op, inputs: &[&LazyTensor], dtype: DType) -> Result<LazyTensor> {
    debug_assert!(
        inputs.iter().all(|t| t.device() == inputs[0].device()),
        "operands recorded across devices"
    );
    // Up to four operands (all but `cat`) need no allocation for their shapes.
    let mut small: [&[usize]; 4] = [&[]; 4];
    let many: Vec<&[usize]>;
    let shapes: &[&[usize]] = if inputs.len() <= small.len() {
        for (s, t) in small.iter_mut().zip(inputs) {
            *s = t.shape();
        }
        &small[..inputs.len()]
    } else {
        many = inputs.iter().map(|t| t.shape()).collect();
        &many
    };
    let shape = infer_shape(&op, shapes)?;
    let device = inputs[0].device();
    // Index values that passed through the host are range-checked now, as the eager
    // backend checks them; device-computed indices are clamped by XLA's gather (and an
    // index_copy's out-of-range index writes nothing).
    if let Op::IndexSelect { dim } | Op::Gather { dim } | Op::IndexCopy { dim } = op {
        if let Some(vals) = &inputs[1].node.host_ints {
            let size = shapes[0][dim] as i64;
            if let Some(bad) = vals.iter().find(|&&v| v < 0 || v >= size) {
                return Err(Error::IndexOutOfRange {
                    op: op.name(),
                    index_shape: shapes[1].to_vec(),
                    shape: shapes[0].to_vec(),
                    dim,
                    hint: format!("; index {bad} is outside 0..{size}"),
                });
            }
        }
    }
    let host_ints = match op {
        Op::Reshape(_) | Op::Contiguous => inputs[0].node.host_ints.clone(),
        Op::Cast(DType::I64) if inputs[0].node.dtype.is_int() => inputs[0].node.host_ints.clone(),
        _ => None,
    };
    let sharding = if device.mesh.is_some() {
        result_sharding(&op, inputs, &shape)
    } else {
        0
    };
    let ins = Inputs::from_fn(inputs.len(), |i| inputs[i].node.clone());
    Ok(pending(
        NodeOp::Op(op),
        shape,
        dtype,
        device,
        sharding,
        ins,
        host_ints,
    ))
}

/// The layout a result on a mesh keeps once computed (`shard` ids): a sharding constraint's
/// own; an in-place update's target's (a KV cache stays split by head); an elementwise op's
/// when all its operands have its shape and one layout. Anything else is whole on every
/// device once it is a result (inside a program, XLA's partitioner lays values out).
fn result_sharding(op: &Op, inputs: &[&LazyTensor], shape: &[usize]) -> u32 {
    match op {
        Op::Shard(id) => *id,
        Op::DynamicUpdateSlice | Op::IndexCopy { .. } => inputs[0].node.sharding,
        Op::Unary(_)
        | Op::Binary(_)
        | Op::Compare(_)
        | Op::Affine { .. }
        | Op::PowScalar(_)
        | Op::Clamp { .. }
        | Op::Where
        | Op::Cast(_)
        | Op::Contiguous => {
            let first = inputs[0].node.sharding;
            let same = inputs
                .iter()
                .all(|t| t.node.sharding == first && t.shape() == shape);
            if same {
                first
            } else {
                0
            }
        }
        _ => 0,
    }
}

/// A tensor of `shape` filled with `value`, as a constant of the graph.
pub(crate) fn full(
    shape: &[usize],
    value: f64,
    dtype: DType,
    device: PjrtDevice,
) -> Result<LazyTensor> {
    plugins::device("full", device)?;
    let v = if dtype == DType::Bool {
        f64::from(u8::from(value != 0.0))
    } else {
        value
    };
    Ok(pending(
        NodeOp::Full(v),
        Dims::from(shape),
        dtype,
        device,
        0,
        Inputs::Zero,
        None,
    ))
}

/// `start + i * step` for `i` in `0..n`, as `stablehlo.iota`.
pub(crate) fn arange(
    n: usize,
    start: f64,
    step: f64,
    dtype: DType,
    device: PjrtDevice,
) -> Result<LazyTensor> {
    plugins::device("arange", device)?;
    Ok(pending(
        NodeOp::Iota { start, step },
        Dims::from(&[n][..]),
        dtype,
        device,
        0,
        Inputs::Zero,
        None,
    ))
}

/// Uploads a candle tensor to a PJRT device.
pub(crate) fn from_candle(
    t: &candle_core::Tensor,
    dtype: DType,
    device: PjrtDevice,
) -> Result<LazyTensor> {
    transfer::upload(t, dtype, device)
}

/// The shared buffer of an earlier one-element float upload of `value` to `device`, if any
/// (see `transfer::shared_scalar`).
pub(crate) fn shared_scalar(
    value: f64,
    shape: &[usize],
    dtype: DType,
    device: PjrtDevice,
) -> Option<LazyTensor> {
    transfer::shared_scalar(value, shape, dtype, device)
}

/// Materialises and downloads to a CPU candle tensor (bool as u8 0/1).
pub(crate) fn to_candle(t: &LazyTensor, op: &'static str) -> Result<candle_core::Tensor> {
    transfer::download(t, op)
}

/// Materialises and copies to another PJRT device.
pub(crate) fn to_pjrt(t: &LazyTensor, device: PjrtDevice) -> Result<LazyTensor> {
    transfer::copy_to(t, device)
}

/// The PJRT tensors of `tensors` computed in one graph per device, waiting or not.
fn materialize_all(tensors: &[&Tensor], op: &'static str, wait: exec::Wait) -> Result<()> {
    let nodes: Vec<Arc<Node>> = tensors
        .iter()
        .filter_map(|t| t.lazy().map(|l| l.node.clone()))
        .collect();
    if nodes.is_empty() {
        return Ok(());
    }
    exec::materialize_then(&nodes, op, wait)
}

impl Tensor {
    /// Computes this tensor now if it is a pending PJRT value (a no-op for eager tensors and
    /// computed ones); the value then lives on the device. Other live pending tensors of the
    /// device are computed in the same graph.
    pub fn sync(&self) -> Result<()> {
        Tensor::sync_all(&[self])
    }

    /// Computes all of `tensors` in one graph per device (see [`Tensor::sync`]).
    pub fn sync_all(tensors: &[&Tensor]) -> Result<()> {
        materialize_all(tensors, "sync", exec::Wait::Yes)
    }

    /// Starts computing this tensor if it is a pending PJRT value, without waiting for the
    /// device (see [`Tensor::dispatch_all`]).
    pub fn dispatch(&self) -> Result<()> {
        Tensor::dispatch_all(&[self])
    }

    /// [`Tensor::sync_all`] without the wait: the graph is traced, compiled or found, and
    /// handed to the device, and the call returns while the device computes. The host can
    /// record the next graph meanwhile (a decode loop records step N+1 while step N runs);
    /// reads of the results wait for them, and fail with the program's error if it failed.
    pub fn dispatch_all(tensors: &[&Tensor]) -> Result<()> {
        materialize_all(tensors, "dispatch", exec::Wait::No)
    }

    /// Waits until this tensor's value exists on its device: computes it if pending, then
    /// waits for the program that writes it (a [`Tensor::dispatch`]ed one may still run).
    /// Returns that program's error, if it failed. A no-op for eager tensors.
    pub fn block_until_ready(&self) -> Result<()> {
        let Some(l) = self.lazy() else {
            return Ok(());
        };
        let op = "block_until_ready";
        let bufs = transfer::ready_buffer(&l.node, op)?;
        bufs.iter()
            .try_for_each(|b| b.ready_event().and_then(|e| e.wait()))
            .map_err(|e| plugins::pjrt_err(op, l.node.device, e))
    }

    /// This tensor laid out over its mesh device by `sharding` (each device then holds its
    /// tile, and a program reading it sees that layout): recorded as a sharding constraint,
    /// which XLA's SPMD partitioner honours, and kept once computed. A tensor on one device
    /// (eager or PJRT) is returned as it is: a layout over a mesh means nothing there.
    ///
    /// Refused when the sharding is for another rank or a split dimension does not divide by
    /// its mesh axis.
    pub fn shard(&self, sharding: &crate::device_map::Sharding) -> Result<Tensor> {
        let op = "shard";
        let Some(l) = self.lazy().filter(|l| l.device().mesh.is_some()) else {
            return Ok(self.clone());
        };
        let id = shard::intern(sharding);
        shard::tile_shape(op, l.device(), id, l.shape())?;
        if l.node.sharding == id {
            return Ok(self.clone());
        }
        let t = record(Op::Shard(id), &[l], self.dtype())?;
        Ok(Tensor::from_lazy(t, self.dtype()))
    }

    /// This tensor on mesh device `device`, each of its devices holding its tile of
    /// `sharding`: a host tensor is cut on the host and each tile uploaded to its device
    /// alone (no device holds the whole tensor); a PJRT tensor is moved, then laid out.
    /// On a single device it is [`Tensor::to_device`].
    pub fn to_device_sharded(
        &self,
        device: &crate::Device,
        sharding: &crate::device_map::Sharding,
    ) -> Result<Tensor> {
        let crate::Device::Pjrt(d) = device else {
            return self.to_device(device);
        };
        if d.mesh.is_none() {
            return self.to_device(device);
        }
        match self.as_candle() {
            Some(t) => {
                let id = shard::intern(sharding);
                let l = transfer::upload_sharded(t, self.dtype(), *d, id)?;
                Ok(Tensor::from_lazy(l, self.dtype()))
            }
            None => self.to_device(device)?.shard(sharding),
        }
    }

    /// The tensor of `shape` laid out on mesh `device` as `sharding` says, each device's
    /// tile read by `read(origin, tile_shape)` (a host tensor of `dtype`) and sent as soon
    /// as it is read: a checkpoint's weight loads this way without ever being whole on the
    /// host. A tile that several devices hold is read once.
    pub fn from_tiles(
        device: &crate::Device,
        sharding: &crate::device_map::Sharding,
        shape: &[usize],
        dtype: DType,
        mut read: impl FnMut(&[usize], &[usize]) -> Result<Tensor>,
    ) -> Result<Tensor> {
        let op = "from_tiles";
        let d = match device {
            crate::Device::Pjrt(d) if d.mesh.is_some() => *d,
            other => {
                return Err(Error::InvalidArgument {
                    op,
                    msg: format!("{other} is not a mesh device; load the tensor whole"),
                })
            }
        };
        let (b, devs) = plugins::devices(op, d)?;
        let id = shard::intern(sharding);
        let l = transfer::upload_tiles_with(shape, dtype, d, &devs, id, &b.client, |o, t| {
            let part = read(o, t)?.to_dtype(dtype)?;
            match part.as_candle() {
                Some(c) => Ok(c.clone()),
                None => Err(Error::InvalidArgument {
                    op,
                    msg: "a tile must be read into host memory".into(),
                }),
            }
        })?;
        Ok(Tensor::from_lazy(l, dtype))
    }

    /// The layout of this tensor over its mesh device: `None` on a single device and for a
    /// value whole on every device of the mesh (a pending one that keeps no layout is laid
    /// out by XLA inside its program, and whole once computed).
    pub fn sharding(&self) -> Option<std::sync::Arc<crate::device_map::Sharding>> {
        self.lazy()
            .filter(|l| l.device().mesh.is_some())
            .and_then(|l| shard::get(l.node.sharding))
    }

    /// The shape each device holds of this PJRT tensor (computing it first): one entry, or
    /// one per device of its mesh in order (a tile, or the whole tensor where replicated).
    /// `None` for eager tensors.
    pub fn device_shapes(&self) -> Option<Result<Vec<Vec<usize>>>> {
        let l = self.lazy()?;
        let op = "device_shapes";
        Some(transfer::ready_buffer(&l.node, op).and_then(|bufs| {
            bufs.iter()
                .map(|b| {
                    b.dims()
                        .map(|d| d.iter().map(|&n| n as usize).collect())
                        .map_err(|e| plugins::pjrt_err(op, l.node.device, e))
                })
                .collect()
        }))
    }

    /// Whether this is a PJRT tensor whose value is not computed yet.
    pub fn is_pending(&self) -> bool {
        self.lazy().is_some_and(|l| !l.node.is_ready())
    }

    /// The StableHLO module that materialising this tensor alone would compile (for
    /// inspection); `None` for eager tensors.
    pub fn stablehlo(&self) -> Option<Result<String>> {
        self.lazy()
            .map(|l| exec::stablehlo_of(std::slice::from_ref(&l.node)))
    }
}

#[cfg(test)]
mod tests {
    use super::count_collectives;

    /// An `HloInstructionProto` fragment: field 1 (name) and field 2 (opcode), both strings.
    fn instruction(name: &str, opcode: &str) -> Vec<u8> {
        let mut v = vec![0x0a, name.len() as u8];
        v.extend_from_slice(name.as_bytes());
        v.extend_from_slice(&[0x12, opcode.len() as u8]);
        v.extend_from_slice(opcode.as_bytes());
        v
    }

    #[test]
    fn collectives_are_counted_by_opcode_not_by_name() {
        let mut program = Vec::new();
        for (name, op) in [
            ("all-reduce.1", "all-reduce"),
            ("all-reduce.2", "all-reduce"),
            ("all-gather", "all-gather"),
            ("all-reduce-start.3", "all-reduce-start"),
            ("dot.4", "dot"),
            // An instruction named like a collective is not one.
            ("all-to-all", "add"),
        ] {
            program.extend(instruction(name, op));
        }
        assert_eq!(
            count_collectives(&program),
            vec![
                ("all-reduce", 2),
                ("all-reduce-start", 1),
                ("all-gather", 1)
            ]
        );
        assert!(count_collectives(&instruction("x", "dot")).is_empty());
    }
}
