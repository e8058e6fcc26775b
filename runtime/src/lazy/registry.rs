//! The registry of pending nodes: at materialisation, the live pending tensors of a device
//! run in the same graph (torch_xla's "sync all live tensors"), so state carried across
//! steps (a KV cache written each step) is materialised with the step's output and graphs
//! never grow.
//!
//! Every recorded node is registered, so registering must cost next to nothing: each thread
//! appends to its own ring (one writer, no lock, no atomic read-modify-write besides the
//! reference count); whichever thread materialises drains every ring under one lock.

use std::cell::UnsafeCell;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::graph::Node;
use crate::PjrtDevice;

/// Slots per thread: more than a decode step of a small model records; a thread that
/// records more between materialisations moves its entries to the shared list when full.
const RING: usize = 4096;

/// How far ahead `live_pending` fetches entries into the cache.
const PREFETCH_AHEAD: usize = 8;

/// The nodes one thread registered, in order. Slots `head..tail` (modulo `RING`) hold
/// entries and belong to the drainer; the others belong to the owning thread.
struct Ring {
    slots: Box<[UnsafeCell<MaybeUninit<Arc<Node>>>]>,
    /// The next slot to drain; advanced only under the registry lock.
    head: AtomicUsize,
    /// The next slot to fill; advanced only by the owning thread.
    tail: AtomicUsize,
}

// SAFETY: a slot is written only by the owning thread while it is outside `head..tail`
// (the drainer published that it is done with it through `head`), and read only by the
// drainer, under the registry lock, while inside (the owner published the write through
// `tail`); so no slot is ever accessed by two threads at once.
unsafe impl Sync for Ring {}

impl Ring {
    fn new() -> Ring {
        Ring {
            slots: (0..RING)
                .map(|_| UnsafeCell::new(MaybeUninit::uninit()))
                .collect(),
            head: AtomicUsize::new(0),
            tail: AtomicUsize::new(0),
        }
    }

    /// Appends a reference to `n` (owning thread only); `false` when the ring is full.
    fn push(&self, n: &Arc<Node>) -> bool {
        let tail = self.tail.load(Ordering::Relaxed);
        if tail - self.head.load(Ordering::Acquire) == RING {
            return false;
        }
        // SAFETY: the slot is outside `head..tail`, so it is the owner's (see `Sync`).
        unsafe { (*self.slots[tail % RING].get()).write(n.clone()) };
        self.tail.store(tail + 1, Ordering::Release);
        true
    }

    /// Moves every entry out (under the registry lock: `Shared` is only reachable through
    /// it, so `_registry` proves it is held).
    fn drain_into(&self, out: &mut Vec<Arc<Node>>, _registry: &Shared) {
        let head = self.head.load(Ordering::Relaxed);
        let tail = self.tail.load(Ordering::Acquire);
        for i in head..tail {
            // SAFETY: inside `head..tail`, written and published by the owner; the lock
            // makes this the only drainer.
            out.push(unsafe { (*self.slots[i % RING].get()).assume_init_read() });
        }
        self.head.store(tail, Ordering::Release);
    }

    fn is_empty(&self) -> bool {
        self.head.load(Ordering::Acquire) == self.tail.load(Ordering::Acquire)
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        let (head, tail) = (*self.head.get_mut(), *self.tail.get_mut());
        for i in head..tail {
            // SAFETY: `&mut self`: the entries left are initialised and owned here.
            unsafe { self.slots[i % RING].get_mut().assume_init_drop() };
        }
    }
}

/// Every thread's ring, and the drained entries that were still pending.
struct Shared {
    rings: Vec<Arc<Ring>>,
    kept: Vec<Arc<Node>>,
}

impl Shared {
    /// Takes every entry out: the kept ones, then those of this thread's ring or of all.
    fn drain(&mut self, only_mine: bool) -> Vec<Arc<Node>> {
        let mut all = std::mem::take(&mut self.kept);
        if only_mine {
            let _ = MINE.try_with(|ring| ring.drain_into(&mut all, self));
        } else {
            for ring in &self.rings {
                ring.drain_into(&mut all, self);
            }
        }
        all
    }

    /// Keeps the entries of `all` that are still pending; returns the others.
    fn keep_pending(&mut self, all: Vec<Arc<Node>>) -> Vec<Arc<Node>> {
        let (keep, dead) = all.into_iter().partition(|n| still_pending(n));
        self.kept = keep;
        dead
    }
}

static SHARED: Mutex<Shared> = Mutex::new(Shared {
    rings: Vec::new(),
    kept: Vec::new(),
});

fn shared() -> MutexGuard<'static, Shared> {
    // Entries are moved by single pushes and swaps: a poisoned lock still holds them.
    SHARED.lock().unwrap_or_else(|p| p.into_inner())
}

thread_local! {
    static MINE: Arc<Ring> = {
        let ring = Arc::new(Ring::new());
        shared().rings.push(ring.clone());
        ring
    };
}

/// Whether a registry entry can still be part of a graph: a pending node without handles
/// is dead for good (handles are only ever added to a node that has one), and a computed
/// one never becomes pending again.
fn still_pending(n: &Node) -> bool {
    n.is_live() && !n.is_ready()
}

/// Registers a freshly recorded pending node (with its handle already taken, so another
/// thread's materialisation never sees it handle-less, which would read as dead).
pub(crate) fn register(n: &Arc<Node>) {
    if MINE.try_with(|ring| ring.push(n)) == Ok(true) {
        return;
    }
    // This thread's ring is full (or the thread is exiting): move its entries to the
    // shared list, dropping the dead ones there.
    let mut shared = shared();
    let mut all = shared.drain(true);
    all.push(n.clone());
    let dead = shared.keep_pending(all);
    drop(shared);
    // Dropping may free whole dead subgraphs: not on this thread.
    super::exec::reap(Box::new(dead));
}

/// Takes the live pending nodes of `device` out of the registry (the caller computes them,
/// or hands them back with [`restore`]), with the registry's references to the dead ones
/// (mostly operands of the graph about to run, so dropping them frees nothing yet): the
/// caller drops those once the graph no longer needs its nodes.
pub(crate) fn live_pending(device: PjrtDevice) -> (Vec<Arc<Node>>, Vec<Arc<Node>>) {
    let mut shared = shared();
    let all = shared.drain(false);
    // Rings of threads that have exited (only this list holds them) and are empty go.
    shared
        .rings
        .retain(|r| Arc::strong_count(r) > 1 || !r.is_empty());
    // The walk that follows reads these nodes again: fetching them a few entries ahead
    // lets their cache misses overlap, here and there.
    let live: Vec<bool> = (0..all.len())
        .map(|i| {
            if let Some(ahead) = all.get(i + PREFETCH_AHEAD) {
                super::graph::prefetch_walked(ahead);
            }
            still_pending(&all[i])
        })
        .collect();
    let mut out = Vec::new();
    let mut dead = Vec::with_capacity(all.len());
    for (n, live) in all.into_iter().zip(live) {
        match (live, n.device == device) {
            // Computed by the caller's graph; it hands them back if that fails.
            (true, true) => out.push(n),
            (true, false) => shared.kept.push(n),
            (false, _) => dead.push(n),
        }
    }
    (out, dead)
}

/// Registers again the nodes a failed graph did not compute: still pending, they join the
/// next graph of their device.
pub(crate) fn restore(nodes: &[Arc<Node>]) {
    let mut shared = shared();
    shared
        .kept
        .extend(nodes.iter().filter(|n| still_pending(n)).cloned());
}

/// Drops the registry's references to nodes that can no longer join a graph (so a node
/// nothing else holds is freed now rather than at the next materialisation).
pub(crate) fn prune() {
    let dead = {
        let mut shared = shared();
        let all = shared.drain(false);
        shared.keep_pending(all)
    };
    drop(dead);
}
