//! Create/destroy counters for every PJRT object zoo owns: the leak check.
//!
//! Each owning wrapper reports its creation and its destruction here. Besides the counts, the
//! live set of raw handles is kept, so a second destroy of the same handle (a double free) is
//! counted instead of passing unnoticed. Tests compare [`object_counts`] before and after a
//! workload: every kind must show as many destroys as creates and no double free.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// The kinds of plugin-owned objects zoo frees.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ObjectKind {
    /// `PJRT_Client`
    Client,
    /// `PJRT_Buffer`
    Buffer,
    /// `PJRT_LoadedExecutable`
    LoadedExecutable,
    /// `PJRT_Executable`
    Executable,
    /// `PJRT_Event`
    Event,
    /// `PJRT_Error`
    Error,
    /// `PJRT_SerializedExecutable`
    SerializedExecutable,
}

impl ObjectKind {
    /// Every kind, in report order.
    pub const ALL: [ObjectKind; 7] = [
        ObjectKind::Client,
        ObjectKind::Buffer,
        ObjectKind::LoadedExecutable,
        ObjectKind::Executable,
        ObjectKind::Event,
        ObjectKind::Error,
        ObjectKind::SerializedExecutable,
    ];

    fn index(self) -> usize {
        self as usize
    }
}

const KINDS: usize = ObjectKind::ALL.len();
static CREATED: [AtomicU64; KINDS] = [const { AtomicU64::new(0) }; KINDS];
static DESTROYED: [AtomicU64; KINDS] = [const { AtomicU64::new(0) }; KINDS];
static DOUBLE_FREES: AtomicU64 = AtomicU64::new(0);
static LIVE: Mutex<Option<HashMap<usize, ObjectKind>>> = Mutex::new(None);

pub(crate) fn created(kind: ObjectKind, handle: *const ()) {
    CREATED[kind.index()].fetch_add(1, Ordering::SeqCst);
    // A poisoned lock only means another thread panicked while holding it; the map is
    // still consistent (inserts and removes are single operations).
    let mut live = LIVE.lock().unwrap_or_else(|e| e.into_inner());
    live.get_or_insert_with(HashMap::new)
        .insert(handle as usize, kind);
}

pub(crate) fn destroyed(kind: ObjectKind, handle: *const ()) {
    DESTROYED[kind.index()].fetch_add(1, Ordering::SeqCst);
    let mut live = LIVE.lock().unwrap_or_else(|e| e.into_inner());
    let map = live.get_or_insert_with(HashMap::new);
    if map.remove(&(handle as usize)) != Some(kind) {
        DOUBLE_FREES.fetch_add(1, Ordering::SeqCst);
    }
}

/// A snapshot of the counters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectCounts {
    /// Creations per kind, indexed like [`ObjectKind::ALL`].
    pub created: [u64; KINDS],
    /// Destructions per kind, indexed like [`ObjectKind::ALL`].
    pub destroyed: [u64; KINDS],
    /// Destroys of a handle that was not live (never created, or already destroyed).
    pub double_frees: u64,
}

impl ObjectCounts {
    /// Objects of `kind` created so far.
    pub fn created(&self, kind: ObjectKind) -> u64 {
        self.created[kind.index()]
    }

    /// Objects of `kind` destroyed so far.
    pub fn destroyed(&self, kind: ObjectKind) -> u64 {
        self.destroyed[kind.index()]
    }

    /// Objects of `kind` created and not yet destroyed.
    pub fn live(&self, kind: ObjectKind) -> i64 {
        self.created(kind) as i64 - self.destroyed(kind) as i64
    }

    /// The counts accumulated since `earlier`.
    pub fn since(&self, earlier: &ObjectCounts) -> ObjectCounts {
        let mut d = self.clone();
        for i in 0..KINDS {
            d.created[i] -= earlier.created[i];
            d.destroyed[i] -= earlier.destroyed[i];
        }
        d.double_frees -= earlier.double_frees;
        d
    }

    /// True when every kind was destroyed exactly as often as created, with no double free.
    pub fn balanced(&self) -> bool {
        self.double_frees == 0 && self.created == self.destroyed
    }
}

impl fmt::Display for ObjectCounts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for kind in ObjectKind::ALL {
            writeln!(
                f,
                "{kind:?}: created {} destroyed {}",
                self.created(kind),
                self.destroyed(kind)
            )?;
        }
        write!(f, "double frees: {}", self.double_frees)
    }
}

/// The current counters, process-wide.
pub fn object_counts() -> ObjectCounts {
    ObjectCounts {
        created: std::array::from_fn(|i| CREATED[i].load(Ordering::SeqCst)),
        destroyed: std::array::from_fn(|i| DESTROYED[i].load(Ordering::SeqCst)),
        double_frees: DOUBLE_FREES.load(Ordering::SeqCst),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn imbalance_and_double_free_are_detected() {
        let mut c = ObjectCounts {
            created: [1; KINDS],
            destroyed: [1; KINDS],
            double_frees: 0,
        };
        assert!(c.balanced());
        c.destroyed[ObjectKind::Buffer.index()] = 0;
        assert!(!c.balanced());
        assert_eq!(c.live(ObjectKind::Buffer), 1);
        c.destroyed[ObjectKind::Buffer.index()] = 1;
        c.double_frees = 1;
        assert!(!c.balanced());
    }
}
