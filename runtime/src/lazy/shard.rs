//! Shardings of tensors on mesh devices: interned once per process, so a node carries a
//! small id (hashed with its structure) instead of a layout.

use std::sync::{Arc, Mutex};

use super::plugins::lock;
use crate::device_map::{Mesh, Sharding};
use crate::{Error, PjrtDevice, Result};

/// Every sharding seen, by id minus one (id 0 is "replicated").
static SHARDINGS: Mutex<Vec<Arc<Sharding>>> = Mutex::new(Vec::new());

/// The id of `s` (0 when it splits nothing: replicated).
pub(crate) fn intern(s: &Sharding) -> u32 {
    if s.is_replicated() {
        return 0;
    }
    let mut all = lock(&SHARDINGS);
    let i = match all.iter().position(|x| **x == *s) {
        Some(i) => i,
        None => {
            all.push(Arc::new(s.clone()));
            all.len() - 1
        }
    };
    i as u32 + 1
}

/// The sharding of id `id`; `None` for 0 (replicated).
pub(crate) fn get(id: u32) -> Option<Arc<Sharding>> {
    let i = id.checked_sub(1)? as usize;
    lock(&SHARDINGS).get(i).cloned()
}

/// The mesh of `d`, or an error naming `op` when `d` is a single device.
pub(crate) fn mesh_of(op: &'static str, d: PjrtDevice) -> Result<Arc<Mesh>> {
    d.mesh().ok_or_else(|| Error::InvalidArgument {
        op,
        msg: format!("{d} is one device, not a mesh; a sharding lays a tensor out over the devices of PjrtDevice::on_mesh"),
    })
}

/// The `mhlo.sharding` attribute of sharding `id` over `mesh`.
pub(crate) fn gspmd(mesh: &Mesh, id: u32) -> String {
    match get(id) {
        Some(s) => s.gspmd(mesh),
        None => "{replicated}".into(),
    }
}

/// Shardy's `#sdy.sharding` of sharding `id` for a tensor of rank `rank` over the module's
/// mesh `@mesh`.
pub(crate) fn shardy(mesh: &Mesh, id: u32, rank: usize) -> String {
    let dims = match get(id) {
        Some(s) => s.shardy(mesh),
        None => format!("[{}]", vec!["{}"; rank].join(", ")),
    };
    format!("#sdy.sharding<@mesh, {dims}>")
}

/// Each device's tile shape of a tensor of `shape` under sharding `id` on `d`'s mesh, checked.
pub(crate) fn tile_shape(
    op: &'static str,
    d: PjrtDevice,
    id: u32,
    shape: &[usize],
) -> Result<Vec<usize>> {
    let Some(s) = get(id) else {
        return Ok(shape.to_vec());
    };
    let mesh = mesh_of(op, d)?;
    s.tile_shape(&mesh, shape)
        .map_err(|e| Error::InvalidArgument {
            op,
            msg: e.to_string(),
        })
}
