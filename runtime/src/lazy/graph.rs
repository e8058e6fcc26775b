//! The recorded graph: nodes, their shapes, and the structural hash that keys compiled
//! executables.
//!
//! A [`Node`] is one value on one PJRT device. It starts `Pending` (an [`Op`] over input
//! nodes, or a constant) and becomes `Ready` (a device buffer) once a graph that computes it
//! has run; a ready node drops its inputs, so the history behind a materialised value is
//! freed and never recomputed. Leaves (uploads, copies, results) are ready from birth.

use std::cell::UnsafeCell;
use std::hash::{Hash, Hasher};
use std::ops::Deref;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, MutexGuard, OnceLock};

pub(crate) use crate::dims::Dims;
use crate::op::{ConvGeom, Op};
use crate::pjrt::Buffer;
use crate::tensor::broadcast_shape;
use crate::{DType, Error, PjrtDevice, Result};

/// The operands of a pending node: inline up to three (every op but `cat`), so recording
/// allocates no operand vector.
pub(crate) enum Inputs {
    Zero,
    One([Arc<Node>; 1]),
    Two([Arc<Node>; 2]),
    Three([Arc<Node>; 3]),
    Many(Vec<Arc<Node>>),
}

impl Inputs {
    /// The operands, in order.
    pub(crate) fn from_fn(n: usize, mut f: impl FnMut(usize) -> Arc<Node>) -> Inputs {
        match n {
            0 => Inputs::Zero,
            1 => Inputs::One([f(0)]),
            2 => Inputs::Two([f(0), f(1)]),
            3 => Inputs::Three([f(0), f(1), f(2)]),
            _ => Inputs::Many((0..n).map(f).collect()),
        }
    }

    /// Moves the operands onto `out` (to release chains without recursion).
    fn drain_into(self, out: &mut Vec<Arc<Node>>) {
        match self {
            Inputs::Zero => {}
            Inputs::One(a) => out.extend(a),
            Inputs::Two(a) => out.extend(a),
            Inputs::Three(a) => out.extend(a),
            Inputs::Many(v) => out.extend(v),
        }
    }
}

impl Deref for Inputs {
    type Target = [Arc<Node>];
    fn deref(&self) -> &[Arc<Node>] {
        match self {
            Inputs::Zero => &[],
            Inputs::One(a) => a,
            Inputs::Two(a) => a,
            Inputs::Three(a) => a,
            Inputs::Many(v) => v,
        }
    }
}

/// The structural hash of graphs (what keys compiled executables, in memory and on disk):
/// two independent 64-bit multiply-rotate lanes (128 bits of state) over 64-bit words,
/// folded with murmur3's finaliser. A few cycles per word, where SipHash costs a few per
/// byte; not meant to resist adversaries (graph structures are not secret or hostile), only
/// to make an accidental collision between two structures as unlikely as a 64-bit key can.
#[derive(Clone, Copy)]
pub(crate) struct StructHasher {
    a: u64,
    b: u64,
}

impl Default for StructHasher {
    fn default() -> Self {
        StructHasher::new()
    }
}

fn fmix64(mut k: u64) -> u64 {
    k ^= k >> 33;
    k = k.wrapping_mul(0xff51_afd7_ed55_8ccd);
    k ^= k >> 33;
    k = k.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    k ^ (k >> 33)
}

impl StructHasher {
    pub(crate) const fn new() -> StructHasher {
        StructHasher {
            a: 0x243f_6a88_85a3_08d3,
            b: 0x1319_8a2e_0370_7344,
        }
    }

    /// Feeds one 64-bit word.
    #[inline]
    pub(crate) fn word(&mut self, v: u64) {
        self.a = (self.a ^ v)
            .wrapping_mul(0x9e37_79b9_7f4a_7c15)
            .rotate_left(29);
        self.b = (self.b.rotate_left(23) ^ v)
            .wrapping_mul(0xd6e8_feb8_6659_fd93)
            .wrapping_add(0x2545_f491_4f6c_dd1d);
    }
}

impl Hasher for StructHasher {
    fn finish(&self) -> u64 {
        fmix64(self.a ^ fmix64(self.b).rotate_left(17))
    }
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            self.word(u64::from_le_bytes(w));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut w = [0u8; 8];
            w[..rest.len()].copy_from_slice(rest);
            self.word(u64::from_le_bytes(w) ^ ((rest.len() as u64) << 59));
        }
    }
    fn write_u8(&mut self, v: u8) {
        self.word(u64::from(v));
    }
    fn write_u16(&mut self, v: u16) {
        self.word(u64::from(v));
    }
    fn write_u32(&mut self, v: u32) {
        self.word(u64::from(v));
    }
    fn write_u64(&mut self, v: u64) {
        self.word(v);
    }
    fn write_usize(&mut self, v: usize) {
        self.word(v as u64);
    }
    fn write_i8(&mut self, v: i8) {
        self.word(v as u64);
    }
    fn write_i16(&mut self, v: i16) {
        self.word(v as u64);
    }
    fn write_i32(&mut self, v: i32) {
        self.word(v as u64);
    }
    fn write_i64(&mut self, v: i64) {
        self.word(v as u64);
    }
    fn write_isize(&mut self, v: isize) {
        self.word(v as u64);
    }
}

/// The structure of one node on its own (op, attributes, shape, dtype, sharding; not its
/// operands):
/// computed once when the node is recorded, while it is hot, so the walk that keys a graph
/// feeds one word per node instead of re-hashing every op.
fn local_hash(op: &NodeOp, shape: &[usize], dtype: DType, sharding: u32) -> u64 {
    let mut h = StructHasher::new();
    hash_op(op, &mut h);
    h.word(u64::from(sharding));
    h.word(shape.len() as u64);
    for &d in shape {
        h.word(d as u64);
    }
    dtype.hash(&mut h);
    h.finish()
}

/// What a node computes.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum NodeOp {
    /// A device buffer: ready from creation.
    Leaf,
    /// `value` (rounded to the node's dtype) at every position.
    Full(f64),
    /// `start + i * step` for `i` in `0..n` (a 1-D node): `arange` as `stablehlo.iota`.
    Iota { start: f64, step: f64 },
    /// A primitive over the pending inputs.
    Op(Op),
}

/// How a node starts out (see [`new_node`]).
pub(crate) enum State {
    /// Not computed yet; holds the input nodes in the order the op documents.
    Pending(Inputs),
    /// Computed: the device buffers holding the value.
    Ready(Value),
}

/// Proof that the caller holds the run lock of `device` (see `exec::materialize`): the
/// operands of that device's pending nodes are read and released only under it.
pub(crate) struct Running<'a> {
    pub(crate) device: PjrtDevice,
    pub(crate) _guard: MutexGuard<'a, ()>,
}

/// A computed value: its buffer on each device the node's device spans (one, or a mesh's in
/// the mesh's order; each holds the tile the node's sharding gives it).
pub(crate) type Value = Arc<[Buffer]>;

/// One value of a lazy graph on one device.
///
/// `repr(C)` keeps the fields a graph walk reads (marks, value, operands, structure hash,
/// handles) together at the front, next to the reference counts: a walk then touches about
/// two cache lines per node instead of one per field.
#[repr(C)]
pub(crate) struct Node {
    /// The trace that last numbered this node (see `exec::trace`) and the number it got
    /// there: marks replace a hash map from node to number during a walk.
    pub(crate) mark: AtomicU64,
    pub(crate) slot: AtomicU64,
    /// How many `Tensor` handles refer to this node; a pending node with handles is live
    /// and is materialised together with whatever graph of its device runs next.
    handles: AtomicUsize,
    /// The device buffers once computed (set once; readable from any thread without a lock).
    value: OnceLock<Value>,
    /// The operands while pending, emptied when the value is set (so the history behind a
    /// computed value is freed). Read and written only under the run lock of `device` (see
    /// [`Node::inputs`]) or through `&mut Node`: a graph walk then takes no lock per node.
    inputs: UnsafeCell<Inputs>,
    /// [`local_hash`] of `op`, `shape`, `dtype` and `sharding`.
    pub local: u64,
    pub device: PjrtDevice,
    /// On a mesh device, how the value is laid out over the mesh (`super::shard`; 0:
    /// replicated, which for a pending node means whatever XLA chooses inside the program
    /// and whole on every device once it is a result).
    pub sharding: u32,
    /// The API dtype (`Bool` is stored as PJRT `pred`).
    pub dtype: DType,
    pub shape: Dims,
    pub op: NodeOp,
    /// The values of a small integer tensor whose data passed through the host (uploads and
    /// reshapes of them): index ops check their range at record time, as eager ops do,
    /// instead of letting XLA clamp silently.
    pub host_ints: Option<Arc<[i64]>>,
}

// SAFETY: every field but `inputs` is `Sync`. `inputs` is only read through
// `Node::inputs`, which takes the proof that the run lock of the node's device is held,
// and only written by `Node::set_ready` (same proof) or through `&mut Node`; so no write
// ever races with another access.
unsafe impl Sync for Node {}

impl Node {
    /// The operands of a pending node (empty once computed), under its device's run lock.
    pub(crate) fn inputs<'a>(&'a self, running: &'a Running<'_>) -> &'a Inputs {
        // Operands share their consumer's device (`Tensor::apply` checks), so a walk from
        // nodes of the locked device only meets nodes of that device.
        debug_assert_eq!(
            running.device, self.device,
            "a node's operands read under another device's lock"
        );
        // SAFETY: writers hold the same lock (`set_ready`) or `&mut self`; see `Sync`.
        unsafe { &*self.inputs.get() }
    }

    /// The buffers if computed.
    pub(crate) fn buffer(&self) -> Option<&Value> {
        self.value.get()
    }

    /// Whether the node is computed.
    pub(crate) fn is_ready(&self) -> bool {
        self.value.get().is_some()
    }

    /// Marks the node computed (kept when it already was) and hands back its operands: the
    /// history behind the value, for the caller to release (see [`recycle`]).
    #[must_use = "the released operands should go to `recycle`"]
    pub(crate) fn set_ready(&self, b: Value, running: &Running<'_>) -> Inputs {
        assert_eq!(
            running.device, self.device,
            "a node computed under another device's lock"
        );
        if self.value.set(b).is_err() {
            return Inputs::Zero;
        }
        // SAFETY: the run lock of this node's device is held, so no reader of `inputs`
        // runs (see `Sync`).
        unsafe { std::mem::replace(&mut *self.inputs.get(), Inputs::Zero) }
    }

    /// Clears the node for reuse through `&mut` (no other owner), handing back its
    /// operands and its value.
    fn clear(&mut self) -> (Inputs, Option<Value>) {
        // Owning nothing afterwards is what lets `new_node` overwrite fields unread.
        self.host_ints = None;
        self.op = NodeOp::Leaf;
        self.shape = Dims::new();
        (
            std::mem::replace(self.inputs.get_mut(), Inputs::Zero),
            self.value.take(),
        )
    }

    /// Whether a tensor handle refers to the node. Acquire, with the release in
    /// [`Node::release`]: a thread that finds no handle also sees what the thread that
    /// dropped the last one did before (such as recording a consumer of the node, which
    /// the donation check in `trace` counts).
    pub(crate) fn is_live(&self) -> bool {
        self.handles.load(Ordering::Acquire) > 0
    }

    pub(crate) fn acquire(&self) {
        self.handles.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn release(&self) {
        self.handles.fetch_sub(1, Ordering::Release);
    }
}

/// At most this many spare nodes (about 4 MiB) are kept per thread: a decode step records a
/// few thousand; the rest of a large graph is freed.
const SPARE_MAX: usize = 1 << 14;

thread_local! {
    /// Nodes of graphs this thread ran, kept for reuse: recording a node then takes a spare
    /// allocation instead of going through the allocator. A graph is released by the thread
    /// that ran it, while the device computes, so the next recording on that thread (a decode
    /// loop) finds its nodes here.
    static SPARE: std::cell::RefCell<Vec<Arc<Node>>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// Spare nodes are fetched into the cache this many pops ahead: they were last touched
/// before the previous graph ran, which evicted them, and recording writes all of each.
const PREFETCH_AHEAD: usize = 4;

/// Starts loading the cache lines of `n`'s allocation (a hint; no effect on values).
#[inline]
fn prefetch(n: &Arc<Node>) {
    prefetch_bytes(n, std::mem::size_of::<Node>());
}

/// Starts loading the lines holding what a graph walk reads of `n` (its reference counts and
/// the fields `repr(C)` puts first).
#[inline]
pub(crate) fn prefetch_walked(n: &Arc<Node>) {
    prefetch_bytes(n, std::mem::offset_of!(Node, device));
}

/// Starts loading the reference counts and the first `len` bytes of `n`.
#[inline]
fn prefetch_bytes(n: &Arc<Node>, len: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        // The allocation (two reference counts, then the node): every cache line it
        // touches, since it rarely starts on a line boundary.
        let start = (Arc::as_ptr(n) as *const i8).wrapping_sub(16);
        let skew = start as usize & 63;
        let first = start.wrapping_sub(skew);
        for off in (0..skew + len + 16).step_by(64) {
            // SAFETY: prefetching has no architectural effect and never faults.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(first.wrapping_add(off)) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (n, len);
}

/// A node in an `Arc`, reusing a spare allocation of this thread when there is one (its
/// fields overwritten in place).
pub(crate) fn new_node(
    op: NodeOp,
    shape: Dims,
    dtype: DType,
    device: PjrtDevice,
    sharding: u32,
    state: State,
    host_ints: Option<Arc<[i64]>>,
) -> Arc<Node> {
    let reused = SPARE.with(|spare| {
        let mut spare = spare.borrow_mut();
        let a = spare.pop()?;
        if let Some(ahead) = spare.len().checked_sub(PREFETCH_AHEAD) {
            prefetch(&spare[ahead]);
        }
        Some(a)
    });
    let local = local_hash(&op, &shape, dtype, sharding);
    if let Some(a) = reused {
        // SAFETY: a spare has no other owner and no weak reference: `recycle` checked that
        // with `Arc::get_mut` before keeping it, zoo never makes weak references to nodes,
        // and nothing clones a spare before it is handed out here. So this is the only
        // access to the node, through the allocation's own pointer (as `get_mut` would
        // give; its check would only cost an atomic operation per recorded node).
        let n = unsafe { &mut *Arc::as_ptr(&a).cast_mut() };
        n.local = local;
        n.dtype = dtype;
        n.device = device;
        n.sharding = sharding;
        // SAFETY: `clear` left these fields owning nothing (a leaf op, inline empty dims,
        // no ints, no operands, no value), so overwriting them without a drop leaks
        // nothing, and skips reading memory the previous graph's run evicted.
        unsafe {
            std::ptr::write(&mut n.op, op);
            std::ptr::write(&mut n.shape, shape);
            std::ptr::write(&mut n.host_ints, host_ints);
            match state {
                State::Pending(inputs) => std::ptr::write(n.inputs.get_mut(), inputs),
                State::Ready(b) => std::ptr::write(&mut n.value, OnceLock::from(b)),
            }
        }
        return a;
    }
    let (value, inputs) = match state {
        State::Pending(inputs) => (OnceLock::new(), inputs),
        State::Ready(b) => (OnceLock::from(b), Inputs::Zero),
    };
    Arc::new(Node {
        mark: AtomicU64::new(0),
        slot: AtomicU64::new(0),
        handles: AtomicUsize::new(0),
        value,
        inputs: UnsafeCell::new(inputs),
        local,
        device,
        sharding,
        dtype,
        shape,
        op,
        host_ints,
    })
}

/// Releases the history of computed values (the operands `Node::set_ready` handed back):
/// every node only that history owns is cleared and kept as a spare of this thread for
/// [`new_node`]; the others (held by a tensor, a weight, a node recorded since) lose one
/// reference. Iterative, so a long history cannot overflow the stack.
///
/// The buffers of cleared nodes (leaves only the graph read, such as a donated KV cache)
/// go to `released`: destroying a buffer waits for the programs using it, so the caller
/// drops them once the graph has run.
pub(crate) fn recycle(history: Vec<Inputs>, released: &mut Vec<Value>) {
    let mut stack: Vec<Arc<Node>> = Vec::new();
    for inputs in history {
        inputs.drain_into(&mut stack);
    }
    let mut release = |mut a: Arc<Node>, stack: &mut Vec<Arc<Node>>| -> Option<Arc<Node>> {
        // A node with several consumers is reached once per consumer: the last one finds
        // it unique.
        let n = Arc::get_mut(&mut a)?;
        let (inputs, value) = n.clear();
        inputs.drain_into(stack);
        released.extend(value);
        Some(a)
    };
    // A thread that is exiting has no spares any more: the nodes are cleared and freed.
    let recycled = SPARE.try_with(|spare| {
        let mut spare = spare.borrow_mut();
        while let Some(a) = stack.pop() {
            if let Some(a) = release(a, &mut stack) {
                if spare.len() < SPARE_MAX {
                    spare.push(a);
                }
            }
        }
    });
    if recycled.is_err() {
        while let Some(a) = stack.pop() {
            drop(release(a, &mut stack));
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        // Release input chains iteratively: a long unmaterialised history would otherwise
        // recurse once per node and could overflow the stack.
        let inputs = std::mem::replace(self.inputs.get_mut(), Inputs::Zero);
        // Most nodes hold no chain of their own: only operands whose last reference this
        // is need the explicit stack.
        if inputs.iter().all(|n| Arc::strong_count(n) > 1) {
            return;
        }
        let mut stack = Vec::new();
        inputs.drain_into(&mut stack);
        while let Some(n) = stack.pop() {
            if let Ok(mut inner) = Arc::try_unwrap(n) {
                std::mem::replace(inner.inputs.get_mut(), Inputs::Zero).drain_into(&mut stack);
            }
        }
    }
}

fn shape_err(op: &'static str, lhs: &[usize], rhs: &[usize], hint: String) -> Error {
    Error::ShapeMismatch {
        op,
        lhs: lhs.to_vec(),
        rhs: rhs.to_vec(),
        hint,
    }
}

/// The output shape of `op` over inputs of shapes `ins`. `Tensor` validated the operands
/// already; this re-derives the shape the eager backend would produce, and refuses what
/// it cannot (with the operands named) instead of panicking.
pub(crate) fn infer_shape(op: &Op, ins: &[&[usize]]) -> Result<Dims> {
    let name = op.name();
    let arity = match op {
        Op::Binary(_)
        | Op::Compare(_)
        | Op::Matmul
        | Op::IndexSelect { .. }
        | Op::Gather { .. }
        | Op::DynamicSlice { .. }
        | Op::Conv2d(_)
        | Op::ConvTranspose2d(_) => 2,
        Op::Where | Op::DynamicUpdateSlice | Op::IndexCopy { .. } => 3,
        Op::Concat { .. } => ins.len().max(1),
        // `Composite::shape` checks its arity (the eager backend asks it too).
        Op::Composite(_) => ins.len().max(1),
        _ => 1,
    };
    if ins.len() != arity {
        return Err(Error::InvalidArgument {
            op: name,
            msg: format!("{} operands given, {arity} expected", ins.len()),
        });
    }
    let x = ins[0];
    let dim_ok = |d: usize| {
        if d < x.len() {
            Ok(())
        } else {
            Err(Error::DimOutOfRange {
                op: name,
                dim: d as isize,
                shape: x.to_vec(),
            })
        }
    };
    Ok(match op {
        Op::Unary(_)
        | Op::Affine { .. }
        | Op::PowScalar(_)
        | Op::Clamp { .. }
        | Op::Cast(_)
        | Op::Contiguous
        | Op::Shard(_)
        | Op::ArgSortLastDim { .. } => Dims::from(x),
        Op::Binary(_) | Op::Compare(_) => broadcast_shape(name, x, ins[1])?,
        Op::Composite(c) => c.shape(ins)?,
        Op::Where => broadcast_shape(name, &broadcast_shape(name, x, ins[1])?, ins[2])?,
        Op::Matmul => {
            let (a, b) = (x, ins[1]);
            if a.len() < 2 || b.len() < 2 || a[a.len() - 1] != b[b.len() - 2] {
                return Err(shape_err(
                    name,
                    a,
                    b,
                    "; matmul needs [.., m, k] x [.., k, n]".into(),
                ));
            }
            let mut out = broadcast_shape(name, &a[..a.len() - 2], &b[..b.len() - 2])?;
            out.push(a[a.len() - 2]);
            out.push(b[b.len() - 1]);
            out
        }
        Op::Reduce { dims, keepdim, .. } => {
            for &d in dims.iter() {
                dim_ok(d)?;
            }
            reduced(x, dims, *keepdim)
        }
        Op::ArgReduce { dim, keepdim, .. } => {
            dim_ok(*dim)?;
            reduced(x, &[*dim], *keepdim)
        }
        Op::Reshape(s) => {
            if s.iter().product::<usize>() != x.iter().product::<usize>() {
                return Err(shape_err(name, x, s, "; element counts differ".into()));
            }
            s.clone()
        }
        Op::Permute(p) => {
            // Quadratic, but ranks are small and it allocates nothing.
            if p.len() != x.len()
                || p.iter()
                    .enumerate()
                    .any(|(i, &d)| d >= x.len() || p[..i].contains(&d))
            {
                return Err(shape_err(
                    name,
                    x,
                    p,
                    "; not a permutation of the dims".into(),
                ));
            }
            p.iter().map(|&d| x[d]).collect()
        }
        Op::Broadcast(s) => {
            let lead = s
                .len()
                .checked_sub(x.len())
                .ok_or_else(|| shape_err(name, x, s, "; the target has fewer dims".into()))?;
            if x.iter().zip(&s[lead..]).any(|(&a, &b)| a != b && a != 1) {
                return Err(shape_err(name, x, s, "; only size-1 dims stretch".into()));
            }
            s.clone()
        }
        Op::Narrow { dim, start, len } => {
            dim_ok(*dim)?;
            if start.checked_add(*len).is_none_or(|e| e > x[*dim]) {
                return Err(Error::IndexOutOfRange {
                    op: name,
                    index_shape: vec![],
                    shape: x.to_vec(),
                    dim: *dim,
                    hint: format!(
                        "; range {start}..{} exceeds the dim",
                        start.saturating_add(*len)
                    ),
                });
            }
            let mut s = Dims::from(x);
            s[*dim] = *len;
            s
        }
        Op::IndexSelect { dim } => {
            dim_ok(*dim)?;
            if ins[1].len() != 1 {
                return Err(shape_err(name, x, ins[1], "; indices must be 1-D".into()));
            }
            let mut s = Dims::from(x);
            s[*dim] = ins[1][0];
            s
        }
        Op::Gather { dim } => {
            dim_ok(*dim)?;
            let idx = ins[1];
            if idx.len() != x.len()
                || idx
                    .iter()
                    .zip(x)
                    .enumerate()
                    .any(|(i, (&a, &b))| i != *dim && a > b)
            {
                return Err(shape_err(
                    name,
                    x,
                    idx,
                    "; index must have the input's rank and fit in it".into(),
                ));
            }
            Dims::from(idx)
        }
        Op::Concat { dim } => {
            dim_ok(*dim)?;
            let mut s = Dims::from(x);
            for other in &ins[1..] {
                if other.len() != x.len()
                    || other
                        .iter()
                        .zip(x)
                        .enumerate()
                        .any(|(i, (a, b))| i != *dim && a != b)
                {
                    return Err(shape_err(
                        name,
                        x,
                        other,
                        format!("; all dims but {dim} must match"),
                    ));
                }
                s[*dim] += other[*dim];
            }
            s
        }
        Op::DynamicSlice { sizes } => {
            if sizes.len() != x.len()
                || sizes.iter().zip(x).any(|(a, b)| a > b)
                || ins[1] != [x.len()]
            {
                return Err(shape_err(
                    name,
                    x,
                    sizes,
                    "; the block must fit and start must hold one index per dim".into(),
                ));
            }
            sizes.clone()
        }
        Op::DynamicUpdateSlice => {
            let u = ins[1];
            if u.len() != x.len() || u.iter().zip(x).any(|(a, b)| a > b) || ins[2] != [x.len()] {
                return Err(shape_err(
                    name,
                    x,
                    u,
                    "; the update must fit and start must hold one index per dim".into(),
                ));
            }
            Dims::from(x)
        }
        Op::IndexCopy { dim } => {
            dim_ok(*dim)?;
            let (idx, src) = (ins[1], ins[2]);
            let fits = idx.len() == 1
                && src.len() == x.len()
                && src
                    .iter()
                    .zip(x)
                    .enumerate()
                    .all(|(i, (&a, &b))| if i == *dim { a == idx[0] } else { a == b });
            if !fits {
                return Err(shape_err(
                    name,
                    x,
                    src,
                    format!("; index must be 1-D and source match the input but in dim {dim}, where it has one slice per index"),
                ));
            }
            Dims::from(x)
        }
        Op::Conv2d(g) => {
            let w = ins[1];
            if x.len() != 4 || w.len() != 4 || g.groups == 0 || g.stride == 0 {
                return Err(shape_err(
                    name,
                    x,
                    w,
                    "; conv2d needs NCHW input and OIHW weight".into(),
                ));
            }
            let out = |n: usize, k: usize| -> Option<usize> {
                let ek = g.dilation * (k.checked_sub(1)?) + 1;
                Some((n + 2 * g.padding).checked_sub(ek)? / g.stride + 1)
            };
            match (out(x[2], w[2]), out(x[3], w[3])) {
                (Some(h), Some(wd)) => Dims::from(&[x[0], w[0], h, wd][..]),
                _ => {
                    return Err(shape_err(
                        name,
                        x,
                        w,
                        "; the kernel is larger than the padded input".into(),
                    ))
                }
            }
        }
        Op::ConvTranspose2d(g) => {
            let w = ins[1];
            if x.len() != 4 || w.len() != 4 || g.groups == 0 {
                return Err(shape_err(
                    name,
                    x,
                    w,
                    "; conv_transpose2d needs NCHW input and IOHW weight".into(),
                ));
            }
            let out = |n: usize, k: usize| -> Option<usize> {
                ((n.checked_sub(1)?) * g.stride
                    + g.dilation * (k.checked_sub(1)?)
                    + g.output_padding
                    + 1)
                .checked_sub(2 * g.padding)
                .filter(|&v| v > 0)
            };
            match (out(x[2], w[2]), out(x[3], w[3])) {
                (Some(h), Some(wd)) => Dims::from(&[x[0], w[1] * g.groups, h, wd][..]),
                _ => {
                    return Err(shape_err(
                        name,
                        x,
                        w,
                        "; the padding leaves no output".into(),
                    ))
                }
            }
        }
        Op::UpsampleNearest2d { h, w } => {
            if x.len() != 4 {
                return Err(Error::InvalidArgument {
                    op: name,
                    msg: format!("input {x:?} must be [N, C, H, W]"),
                });
            }
            Dims::from(&[x[0], x[1], *h, *w][..])
        }
    })
}

fn reduced(x: &[usize], dims: &[usize], keepdim: bool) -> Dims {
    let mut s = Dims::new();
    for (i, &d) in x.iter().enumerate() {
        if dims.contains(&i) {
            if keepdim {
                s.push(1);
            }
        } else {
            s.push(d);
        }
    }
    s
}

/// Feeds everything about `op` that changes the program it lowers to into `h`. `Op` holds
/// f64 attributes, so it cannot derive `Hash`; floats hash by their bits.
pub(crate) fn hash_op<H: Hasher>(op: &NodeOp, h: &mut H) {
    match op {
        NodeOp::Leaf => 0u8.hash(h),
        NodeOp::Full(v) => {
            1u8.hash(h);
            v.to_bits().hash(h);
        }
        NodeOp::Iota { start, step } => {
            2u8.hash(h);
            start.to_bits().hash(h);
            step.to_bits().hash(h);
        }
        NodeOp::Op(op) => {
            3u8.hash(h);
            std::mem::discriminant(op).hash(h);
            match op {
                Op::Unary(u) => u.hash(h),
                Op::Binary(b) => b.hash(h),
                Op::Compare(c) => c.hash(h),
                Op::Affine { mul, add } => {
                    mul.to_bits().hash(h);
                    add.to_bits().hash(h);
                }
                Op::PowScalar(e) => e.to_bits().hash(h),
                Op::Clamp { min, max } => {
                    min.to_bits().hash(h);
                    max.to_bits().hash(h);
                }
                Op::Cast(d) => d.hash(h),
                Op::Reduce { op, dims, keepdim } => {
                    op.hash(h);
                    dims.hash(h);
                    keepdim.hash(h);
                }
                Op::ArgReduce { max, dim, keepdim } => {
                    max.hash(h);
                    dim.hash(h);
                    keepdim.hash(h);
                }
                Op::ArgSortLastDim { descending } => descending.hash(h),
                Op::Reshape(s) | Op::Permute(s) | Op::Broadcast(s) => s.hash(h),
                Op::Narrow { dim, start, len } => {
                    dim.hash(h);
                    start.hash(h);
                    len.hash(h);
                }
                Op::IndexSelect { dim }
                | Op::Gather { dim }
                | Op::Concat { dim }
                | Op::IndexCopy { dim } => dim.hash(h),
                Op::DynamicSlice { sizes } => sizes.hash(h),
                Op::Conv2d(g) | Op::ConvTranspose2d(g) => hash_geom(g, h),
                Op::UpsampleNearest2d { h: oh, w } => {
                    oh.hash(h);
                    w.hash(h);
                }
                Op::Composite(c) => c.hash(h),
                Op::Shard(id) => id.hash(h),
                Op::Where | Op::Matmul | Op::DynamicUpdateSlice | Op::Contiguous => {}
            }
        }
    }
}

fn hash_geom<H: Hasher>(g: &ConvGeom, h: &mut H) {
    g.hash(h);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::op::{BinaryOp, ReduceOp};

    #[test]
    fn shapes_follow_the_eager_backend() {
        let s = |op: Op, ins: &[&[usize]]| infer_shape(&op, ins).expect("shape").to_vec();
        assert_eq!(
            s(Op::Binary(BinaryOp::Add), &[&[3, 1, 5], &[4, 5]]),
            vec![3, 4, 5]
        );
        assert_eq!(
            s(Op::Matmul, &[&[2, 1, 4, 8], &[3, 8, 6]]),
            vec![2, 3, 4, 6]
        );
        assert_eq!(
            s(
                Op::Reduce {
                    op: ReduceOp::Sum,
                    dims: Dims::from([0, 2]),
                    keepdim: false
                },
                &[&[3, 4, 5]]
            ),
            vec![4]
        );
        assert_eq!(
            s(
                Op::Reduce {
                    op: ReduceOp::Sum,
                    dims: Dims::from([1]),
                    keepdim: true
                },
                &[&[3, 4, 5]]
            ),
            vec![3, 1, 5]
        );
        let g = ConvGeom {
            stride: 2,
            padding: 1,
            dilation: 1,
            groups: 1,
            output_padding: 1,
        };
        assert_eq!(
            s(Op::ConvTranspose2d(g), &[&[2, 4, 5, 6], &[4, 3, 3, 3]]),
            vec![2, 3, 10, 12]
        );
        assert_eq!(
            s(Op::Conv2d(g), &[&[2, 4, 9, 8], &[6, 4, 3, 3]]),
            vec![2, 6, 5, 4]
        );
        assert!(infer_shape(&Op::Matmul, &[&[2, 3], &[4, 5]]).is_err());
        assert!(infer_shape(&Op::Reshape(Dims::from([7])), &[&[2, 3]]).is_err());
        assert!(infer_shape(&Op::Permute(Dims::from([1, 1])), &[&[2, 2]]).is_err());
        assert_eq!(
            s(Op::Permute(Dims::from([2, 0, 1])), &[&[2, 3, 4]]),
            vec![4, 2, 3]
        );
    }

    #[test]
    fn recycling_reuses_only_nodes_nothing_else_holds() {
        let dev = PjrtDevice::new(crate::PjrtPlatform::Cpu, 0);
        let node = |inputs| {
            new_node(
                NodeOp::Full(1.0),
                Dims::from([2]),
                DType::F32,
                dev,
                0,
                State::Pending(inputs),
                None,
            )
        };
        let a = node(Inputs::Zero);
        let b = node(Inputs::One([a.clone()]));
        let held = node(Inputs::Zero);
        let (pa, pb) = (Arc::as_ptr(&a), Arc::as_ptr(&b));
        // `a` is owned by `b`'s operands, `b` by the history; `held` also by this test.
        drop(a);
        let mut released = Vec::new();
        recycle(vec![Inputs::Two([b, held.clone()])], &mut released);
        assert!(released.is_empty());
        let reused: Vec<Arc<Node>> = (0..3).map(|_| node(Inputs::Zero)).collect();
        let ptrs: Vec<*const Node> = reused.iter().map(Arc::as_ptr).collect();
        assert!(ptrs.contains(&pa) && ptrs.contains(&pb));
        assert!(!ptrs.contains(&Arc::as_ptr(&held)));
        assert!(reused.iter().all(|n| n.shape[..] == [2] && !n.is_ready()));
    }

    #[test]
    fn op_hash_sees_attributes() {
        let hash = |op: NodeOp| {
            let mut h = std::collections::hash_map::DefaultHasher::new();
            hash_op(&op, &mut h);
            h.finish()
        };
        assert_ne!(hash(NodeOp::Full(1.0)), hash(NodeOp::Full(2.0)));
        assert_ne!(
            hash(NodeOp::Op(Op::Affine { mul: 1.0, add: 0.5 })),
            hash(NodeOp::Op(Op::Affine {
                mul: 1.0,
                add: 0.25
            }))
        );
        assert_ne!(
            hash(NodeOp::Op(Op::Reshape(Dims::from([2, 3])))),
            hash(NodeOp::Op(Op::Permute(Dims::from([2, 3]))))
        );
        assert_eq!(hash(NodeOp::Op(Op::Matmul)), hash(NodeOp::Op(Op::Matmul)));
    }

    #[test]
    fn node_hash_sees_shape_dtype_and_op() {
        let add = || NodeOp::Op(Op::Binary(BinaryOp::Add));
        let base = local_hash(&add(), &[2, 3], DType::F32, 0);
        assert_eq!(base, local_hash(&add(), &[2, 3], DType::F32, 0));
        assert_ne!(base, local_hash(&add(), &[3, 2], DType::F32, 0));
        assert_ne!(base, local_hash(&add(), &[2, 3, 1], DType::F32, 0));
        assert_ne!(base, local_hash(&add(), &[2, 3], DType::BF16, 0));
        assert_ne!(
            base,
            local_hash(
                &NodeOp::Op(Op::Binary(BinaryOp::Mul)),
                &[2, 3],
                DType::F32,
                0
            )
        );
        // Word order matters: [a, b] and [b, a] differ.
        let words = |ws: &[u64]| {
            let mut h = StructHasher::new();
            for &w in ws {
                h.word(w);
            }
            h.finish()
        };
        assert_ne!(words(&[1, 2]), words(&[2, 1]));
        assert_ne!(words(&[0]), words(&[0, 0]));
    }
}
