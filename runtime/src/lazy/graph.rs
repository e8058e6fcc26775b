//! The recorded graph: nodes, their shapes, and the structural hash that keys compiled
//! executables.
//!
//! A [`Node`] is one value on one PJRT device. It starts `Pending` (an [`Op`] over input
//! nodes, or a constant) and becomes `Ready` (a device buffer) once a graph that computes it
//! has run; a ready node drops its inputs, so the history behind a materialised value is
//! freed and never recomputed. Leaves (uploads, copies, results) are ready from birth.

use std::hash::{Hash, Hasher};
use std::ops::Deref;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

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

/// The structure of one node on its own (op, attributes, shape, dtype; not its operands):
/// computed once when the node is recorded, while it is hot, so the walk that keys a graph
/// feeds one word per node instead of re-hashing every op.
fn local_hash(op: &NodeOp, shape: &[usize], dtype: DType) -> u64 {
    let mut h = StructHasher::new();
    hash_op(op, &mut h);
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

/// The evaluation state of a node.
pub(crate) enum State {
    /// Not computed yet; holds the input nodes in the order the op documents.
    Pending(Inputs),
    /// Computed: the device buffer holding the value.
    Ready(Arc<Buffer>),
}

/// One value of a lazy graph on one device.
pub(crate) struct Node {
    pub op: NodeOp,
    pub shape: Dims,
    /// [`local_hash`] of `op`, `shape` and `dtype`.
    pub local: u64,
    /// The API dtype (`Bool` is stored as PJRT `pred`).
    pub dtype: DType,
    pub device: PjrtDevice,
    /// The values of a small integer tensor whose data passed through the host (uploads and
    /// reshapes of them): index ops check their range at record time, as eager ops do,
    /// instead of letting XLA clamp silently.
    pub host_ints: Option<Arc<[i64]>>,
    state: Mutex<State>,
    /// How many `Tensor` handles refer to this node; a pending node with handles is live
    /// and is materialised together with whatever graph of its device runs next.
    handles: AtomicUsize,
    /// The trace that last numbered this node (see `exec::trace`) and the number it got
    /// there: marks replace a hash map from node to number during a walk.
    pub(crate) mark: AtomicU64,
    pub(crate) slot: AtomicU64,
}

impl Node {
    pub(crate) fn new(
        op: NodeOp,
        shape: Dims,
        dtype: DType,
        device: PjrtDevice,
        state: State,
        host_ints: Option<Arc<[i64]>>,
    ) -> Node {
        Node {
            local: local_hash(&op, &shape, dtype),
            op,
            shape,
            dtype,
            device,
            host_ints,
            state: Mutex::new(state),
            handles: AtomicUsize::new(0),
            mark: AtomicU64::new(0),
            slot: AtomicU64::new(0),
        }
    }

    pub(crate) fn state(&self) -> MutexGuard<'_, State> {
        // A poisoned lock only means another thread panicked mid-update of this node's
        // state, which is always left consistent (one assignment).
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The buffer if computed.
    pub(crate) fn buffer(&self) -> Option<Arc<Buffer>> {
        match &*self.state() {
            State::Ready(b) => Some(b.clone()),
            State::Pending(_) => None,
        }
    }

    /// Whether the node is computed (no buffer clone, unlike [`Node::buffer`]).
    pub(crate) fn is_ready(&self) -> bool {
        matches!(&*self.state(), State::Ready(_))
    }

    /// Marks the node computed, dropping its inputs (kept when it already was).
    pub(crate) fn set_ready(&self, b: Arc<Buffer>) {
        let old = {
            let mut s = self.state();
            if matches!(*s, State::Ready(_)) {
                return;
            }
            std::mem::replace(&mut *s, State::Ready(b))
        };
        // Drop the history outside the lock (it may release long chains).
        drop(old);
    }

    pub(crate) fn is_live(&self) -> bool {
        self.handles.load(Ordering::Relaxed) > 0
    }

    pub(crate) fn acquire(&self) {
        self.handles.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn release(&self) {
        self.handles.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Nodes of executed graphs kept for reuse: recording a node then takes a spare allocation
/// instead of going through the allocator, which, with graphs freed on another thread (see
/// `exec::reap`), took the slow path of `malloc` for every node of every step.
static SPARE: Mutex<Vec<Arc<Node>>> = Mutex::new(Vec::new());
/// Whether [`SPARE`] may hold nodes: recording skips the lock while it is empty.
static SPARE_FILLED: AtomicBool = AtomicBool::new(false);

/// At most this many spare nodes (about 4 MiB) are kept: a decode step records a few
/// thousand; the rest of a large graph is freed.
const SPARE_MAX: usize = 1 << 14;

thread_local! {
    /// This thread's share of [`SPARE`], taken whole when it runs out (one lock per batch).
    static LOCAL_SPARE: std::cell::RefCell<Vec<Arc<Node>>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

fn spare() -> MutexGuard<'static, Vec<Arc<Node>>> {
    // The vector is only pushed to and popped from: a poisoned lock still holds spare nodes.
    SPARE.lock().unwrap_or_else(|p| p.into_inner())
}

/// `node` in an `Arc`, reusing a spare allocation when there is one.
pub(crate) fn new_node(node: Node) -> Arc<Node> {
    let reused = LOCAL_SPARE.with(|local| {
        let mut local = local.borrow_mut();
        if local.is_empty() && SPARE_FILLED.load(Ordering::Relaxed) {
            let mut shared = spare();
            std::mem::swap(&mut *local, &mut *shared);
            SPARE_FILLED.store(false, Ordering::Relaxed);
        }
        local.pop()
    });
    if let Some(mut a) = reused {
        // Spare nodes have no other owner and no weak reference (see `recycle`).
        if let Some(slot) = Arc::get_mut(&mut a) {
            *slot = node;
            return a;
        }
    }
    Arc::new(node)
}

/// Frees the nodes of an executed graph, keeping those only `nodes` owns as spares for
/// [`new_node`]. `nodes` is in dependency order (operands first): going backwards, each node's
/// consumers in the graph have released it before it is reached.
pub(crate) fn recycle(nodes: Vec<Arc<Node>>) {
    let mut kept = Vec::with_capacity(nodes.len().min(SPARE_MAX));
    for mut a in nodes.into_iter().rev() {
        // Held elsewhere (a tensor handle, a registry entry, a node recorded since): freed
        // by its last owner as usual.
        let Some(n) = Arc::get_mut(&mut a) else {
            continue;
        };
        let state = std::mem::replace(
            n.state.get_mut().unwrap_or_else(|p| p.into_inner()),
            State::Pending(Inputs::Zero),
        );
        n.host_ints = None;
        drop(state);
        kept.push(a);
    }
    let mut spare = spare();
    kept.truncate(SPARE_MAX.saturating_sub(spare.len()));
    spare.append(&mut kept);
    SPARE_FILLED.store(!spare.is_empty(), Ordering::Relaxed);
}

impl Drop for Node {
    fn drop(&mut self) {
        // Release input chains iteratively: a long unmaterialised history would otherwise
        // recurse once per node and could overflow the stack.
        let inputs = match std::mem::replace(
            self.state.get_mut().unwrap_or_else(|p| p.into_inner()),
            State::Pending(Inputs::Zero),
        ) {
            State::Pending(v) => v,
            State::Ready(_) => return,
        };
        // Most nodes hold no chain of their own: only operands whose last reference this
        // is need the explicit stack.
        if inputs.iter().all(|n| Arc::strong_count(n) > 1) {
            return;
        }
        let mut stack = Vec::new();
        inputs.drain_into(&mut stack);
        while let Some(n) = stack.pop() {
            if let Ok(mut inner) = Arc::try_unwrap(n) {
                if let State::Pending(v) = std::mem::replace(
                    inner.state.get_mut().unwrap_or_else(|p| p.into_inner()),
                    State::Pending(Inputs::Zero),
                ) {
                    v.drain_into(&mut stack);
                }
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
        Op::Where | Op::DynamicUpdateSlice => 3,
        Op::Concat { .. } => ins.len().max(1),
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
        | Op::ArgSortLastDim { .. } => Dims::from(x),
        Op::Binary(_) | Op::Compare(_) => broadcast_shape(name, x, ins[1])?,
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
                Op::IndexSelect { dim } | Op::Gather { dim } | Op::Concat { dim } => dim.hash(h),
                Op::DynamicSlice { sizes } => sizes.hash(h),
                Op::Conv2d(g) | Op::ConvTranspose2d(g) => hash_geom(g, h),
                Op::UpsampleNearest2d { h: oh, w } => {
                    oh.hash(h);
                    w.hash(h);
                }
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
        let dev = PjrtDevice {
            platform: crate::PjrtPlatform::Cpu,
            ordinal: 0,
        };
        let node = |inputs| {
            let shape = Dims::from([2]);
            Node::new(
                NodeOp::Full(1.0),
                shape,
                DType::F32,
                dev,
                State::Pending(inputs),
                None,
            )
        };
        let a = new_node(node(Inputs::Zero));
        let b = new_node(node(Inputs::One([a.clone()])));
        let held = new_node(node(Inputs::Zero));
        let (pa, pb) = (Arc::as_ptr(&a), Arc::as_ptr(&b));
        // `a` is owned by the list and `b`'s operands; `held` also by this test.
        recycle(vec![a, b, held.clone()]);
        let reused: Vec<Arc<Node>> = (0..3).map(|_| new_node(node(Inputs::Zero))).collect();
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
        let base = local_hash(&add(), &[2, 3], DType::F32);
        assert_eq!(base, local_hash(&add(), &[2, 3], DType::F32));
        assert_ne!(base, local_hash(&add(), &[3, 2], DType::F32));
        assert_ne!(base, local_hash(&add(), &[2, 3, 1], DType::F32));
        assert_ne!(base, local_hash(&add(), &[2, 3], DType::BF16));
        assert_ne!(
            base,
            local_hash(&NodeOp::Op(Op::Binary(BinaryOp::Mul)), &[2, 3], DType::F32)
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
