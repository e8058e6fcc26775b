//! Tracing a pending graph: one post-order walk that numbers parameters, orders nodes,
//! hashes the structure and chooses which parameters to donate.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hash, Hasher};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use super::graph::Value;
use super::graph::{Node, NodeOp, Running, StructHasher};
use super::lower::Ref;
use crate::op::Op;

// ----- materialisation -----

/// Pointers are unique per live node and already well mixed in their middle bits.
#[derive(Default)]
pub(super) struct PtrHasher(u64);
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

pub(super) type PtrMap = HashMap<usize, Ref, BuildHasherDefault<PtrHasher>>;

pub(super) fn key(n: &Arc<Node>) -> usize {
    Arc::as_ptr(n) as usize
}

/// A traced graph: what runs, in dependency order, and its structural hash.
pub(super) struct Trace<'g> {
    /// Borrowed: the run lock and the caller's roots keep every traced node alive and its
    /// operands unchanged until the results are set (see `run`).
    pub(super) params: Vec<&'g Arc<Node>>,
    pub(super) param_bufs: Vec<&'g Value>,
    pub(super) nodes: Vec<&'g Arc<Node>>,
    /// The operands of every node, flattened; node `i` owns `edges[spans[i].0..spans[i].1]`.
    pub(super) edges: Vec<Ref>,
    pub(super) spans: Vec<(usize, usize)>,
    pub(super) outputs: Vec<usize>,
    /// Parameters donated to an output, as (parameter, position in `outputs`): the program
    /// aliases them (`tf.aliasing_output`) and the plugin consumes their buffers.
    pub(super) aliases: Vec<(usize, usize)>,
    pub(super) hash: u64,
}

/// Feeds what a program is compiled for: the platform and device, or the mesh's axes and
/// devices (never its per-process id, so a disk-cache entry of one mesh cannot be taken
/// for another's).
fn hash_device(d: crate::PjrtDevice, h: &mut StructHasher) {
    d.platform.hash(h);
    h.word(d.ordinal as u64);
    if let Some(mesh) = d.mesh() {
        for (name, size) in mesh.axes() {
            name.hash(h);
            h.word(size as u64);
        }
        for &i in mesh.devices() {
            h.word(i as u64);
        }
    }
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
/// With `donate` (the registry's references to dead nodes, which the caller holds), a
/// parameter that nothing outside this graph can read any more is donated to the
/// `dynamic_update_slice` or `index_copy` output that writes into it (a KV cache update
/// then happens in place); see [`choose_aliases`]. Only donate when `outs` holds every live pending tensor
/// of the device that the registry knows of.
pub(super) fn trace<'g>(
    outs: &'g [Arc<Node>],
    running: &'g Running<'_>,
    precision: super::Precision,
    donate: Option<&[Arc<Node>]>,
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
    hash_device(running.device, &mut h);
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
                    h.word(u64::from(n.sharding));
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
    if let Some(held) = donate {
        // The dead nodes' references to nodes of this graph, by number.
        let held = held.iter().filter(|n| numbered(n)).map(|n| decode(slot(n)));
        t.aliases = choose_aliases(&t, held);
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
/// donatable when no tensor handle refers to its node, the trace and the node are the only
/// owners of its buffer (a shared one-element upload, or a buffer being read on another
/// thread, is not), and nothing that may run again can reach it: every reference to its
/// node, and to each pending node between it and the outputs, is an operand edge of this
/// graph or one of `held` (the registry's references to dead nodes, which never run).
/// Outputs are computed here, so what they reference is never read again through them.
///
/// Counting references is what makes donation safe while other threads record: a node
/// recorded on another thread joins the registry only after it exists, so a graph that
/// drained the registry before cannot see it, and it may read a leaf, or a pending node of
/// this graph that is not an output, whose handle was dropped since. That happened: a
/// batched decode step's ring-buffer caches were donated by a graph another test ran on the
/// same device, and the step that recorded them then read deleted buffers. Such a consumer
/// holds a reference, which the counts catch; so do harmless ones (a dead node not yet
/// freed), which only cost the in-place update.
///
/// Decided before the hash, so a graph whose leaf may still be read compiles (and is
/// cached) without the alias.
fn choose_aliases(t: &Trace<'_>, held: impl Iterator<Item = Ref>) -> Vec<(usize, usize)> {
    // Candidates: unheld, unshared leaves that an output `dynamic_update_slice` or
    // `index_copy` writes into.
    // Most graphs have none, and then nothing below is counted.
    let candidates: Vec<(usize, usize)> = t
        .outputs
        .iter()
        .enumerate()
        .filter(|&(_, &i)| {
            matches!(
                t.nodes[i].op,
                NodeOp::Op(Op::DynamicUpdateSlice | Op::IndexCopy { .. })
            )
        })
        .filter_map(|(o, &i)| match t.edges[t.spans[i].0] {
            // Acquire (`is_live`): pairs with the release of the last handle, so the
            // references its thread took before dropping it (a consumer recorded there) are
            // counted below.
            Ref::Param(p) if !t.params[p].is_live() && Arc::strong_count(t.param_bufs[p]) == 1 => {
                Some((p, o))
            }
            _ => None,
        })
        .collect();
    if candidates.is_empty() {
        return Vec::new();
    }
    // References accounted for: operand edges of this graph and the dead nodes' entries.
    let mut param_refs = vec![0usize; t.params.len()];
    let mut node_refs = vec![0usize; t.nodes.len()];
    let mut count = |r: Ref| match r {
        Ref::Param(p) => param_refs[p] += 1,
        Ref::Node(i) => node_refs[i] += 1,
    };
    t.edges.iter().copied().for_each(&mut count);
    held.for_each(count);
    let mut output = vec![false; t.nodes.len()];
    for &i in &t.outputs {
        output[i] = true;
    }
    // Pending nodes that may run again (referenced from outside, or by one that is), in
    // reverse dependency order so each consumer is decided before its operands; and the
    // parameters they read.
    let mut escapes = vec![false; t.nodes.len()];
    let mut param_escapes = vec![false; t.params.len()];
    for i in (0..t.nodes.len()).rev() {
        if output[i] || !(escapes[i] || Arc::strong_count(t.nodes[i]) > node_refs[i]) {
            continue;
        }
        let (a, b) = t.spans[i];
        for e in &t.edges[a..b] {
            match *e {
                Ref::Param(p) => param_escapes[p] = true,
                Ref::Node(j) => escapes[j] = true,
            }
        }
    }
    // One alias per parameter (an output list may hold two updates of one leaf).
    let mut aliases: Vec<(usize, usize)> = Vec::new();
    for (p, o) in candidates {
        let sole = Arc::strong_count(t.params[p]) == param_refs[p] && !param_escapes[p];
        if sole && !aliases.iter().any(|&(q, _)| q == p) {
            aliases.push((p, o));
        }
    }
    // Only those: donating any other unheld leaf to a free output of its shape and dtype
    // let a split model running beside another model on the same devices read a donated
    // buffer (tests/pjrt.rs in zoo-transformers caught it; likely the recording race that
    // the reference count above now guards against), so the allocator keeps that memory.
    aliases.sort_unstable();
    aliases
}
