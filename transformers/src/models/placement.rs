//! What decoder files share about where their tensors live when a model is split.

use zoo_runtime::{Device, Tensor};

use crate::Result;

/// `t` on `device`: re-uploaded from the host when its values are known there (positions,
/// ids), since copying a lazily computed value would first run the graph pending on its device.
pub(crate) fn on_device(t: &Tensor, device: &Device) -> Result<Tensor> {
    if t.device() == *device {
        return Ok(t.clone());
    }
    match t.host_known_i64() {
        Some(v) => Ok(Tensor::from_vec(v, t.shape(), device)?.to_dtype(t.dtype())?),
        None => Ok(t.to_device(device)?),
    }
}

/// Every device a split decoder runs on, in execution order, each once: the embeddings',
/// then each layer's, then the final norm's.
pub(crate) fn execution_order(first: Device, layers: &[Device], last: Device) -> Vec<Device> {
    let mut out = vec![first];
    for d in layers.iter().chain([&last]) {
        if !out.contains(d) {
            out.push(*d);
        }
    }
    out
}
