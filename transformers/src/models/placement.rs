//! What model files share about where their tensors live when a model is split.

use zoo_runtime::{DType, Device, Tensor};

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

/// Where a model runs, fixed at load: the dtype of its weights and activations and every
/// device it runs on, in execution order, each once (inputs go to the first).
#[derive(Clone, Debug, PartialEq)]
pub struct Placement {
    dtype: DType,
    /// Never empty: the first is where inputs go.
    devices: Vec<Device>,
}

impl Placement {
    /// Inputs go to `first` (the embeddings' device); `then` lists the devices of the
    /// following parts in execution order (repeats are dropped).
    pub(crate) fn new(dtype: DType, first: Device, then: impl IntoIterator<Item = Device>) -> Self {
        let mut devices = vec![first];
        for d in then {
            if !devices.contains(&d) {
                devices.push(d);
            }
        }
        Placement { dtype, devices }
    }

    /// The dtype of weights and activations.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The device inputs go to.
    pub fn device(&self) -> Device {
        self.devices[0]
    }

    /// Every device, in execution order, each once.
    pub fn devices(&self) -> &[Device] {
        &self.devices
    }
}
