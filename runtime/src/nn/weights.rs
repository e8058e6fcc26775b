//! Loading tensors by HF weight name.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use crate::{DType, Device, Error, Result, Tensor};

/// Something that holds named tensors: a checkpoint ([`zoo_hub::Weights`]) or an in-memory
/// map ([`MemWeights`], for tests and for weights built at run time).
pub trait WeightSource: Send + Sync {
    /// The stored shape of `name`, or `None` when absent.
    fn shape(&self, name: &str) -> Option<Vec<usize>>;
    /// Loads `name` as `dtype` onto `device`.
    fn load(&self, name: &str, dtype: DType, device: &Device) -> Result<Tensor>;
    /// Every stored name (used to suggest near misses in errors).
    fn names(&self) -> Vec<String>;
    /// The blocks of a GGUF block-quantized tensor, rows in HF order, for kernels that compute
    /// from them without widening the weights; `None` for plain tensors (the default).
    fn quantized(&self, _name: &str) -> Option<Result<QuantizedWeight>> {
        None
    }
    /// The tile of `shape` at `origin` of `name` as `dtype` in host memory, read from
    /// storage alone (a mesh device's part of a weight); `None` where the source cannot cut
    /// it there (the default), and the whole tensor is read instead.
    fn load_tile(
        &self,
        _name: &str,
        _dtype: DType,
        _origin: &[usize],
        _shape: &[usize],
    ) -> Option<Result<Tensor>> {
        None
    }
}

/// A block-quantized weight as stored (`ggml` blocks, rows in HF order).
#[derive(Clone, Debug)]
pub struct QuantizedWeight {
    /// The full tensor name.
    pub name: String,
    /// The block type.
    pub ggml: zoo_hub::GgmlType,
    /// The HF shape, `[rows, cols]` for a matrix.
    pub shape: Vec<usize>,
    /// `rows` rows of `cols / block` blocks each.
    pub data: Vec<u8>,
}

impl WeightSource for zoo_hub::Weights {
    fn shape(&self, name: &str) -> Option<Vec<usize>> {
        self.inventory().get(name).map(|i| i.shape.clone())
    }

    fn load(&self, name: &str, dtype: DType, device: &Device) -> Result<Tensor> {
        let view = self.tensor(name).map_err(|e| hub_error(name, e))?;
        from_view(name, view, dtype, device)
    }

    fn load_tile(
        &self,
        name: &str,
        dtype: DType,
        origin: &[usize],
        shape: &[usize],
    ) -> Option<Result<Tensor>> {
        let view = match self.tensor(name) {
            Ok(v) => v,
            Err(e) => return Some(Err(hub_error(name, e))),
        };
        let tile = view.tile(origin, shape)?;
        Some(from_view(name, tile.view(), dtype, &Device::Cpu))
    }

    fn names(&self) -> Vec<String> {
        self.inventory()
            .tensors()
            .iter()
            .map(|i| i.name.clone())
            .collect()
    }
}

fn hub_error(name: &str, source: zoo_hub::HubError) -> Error {
    Error::Hub {
        name: name.to_string(),
        source: Box::new(source),
    }
}

/// The stored values of `view` as a tensor of `dtype` on `device`.
fn from_view(
    name: &str,
    view: zoo_hub::TensorView,
    dtype: DType,
    device: &Device,
) -> Result<Tensor> {
    let hub = |source| hub_error(name, source);
    let shape = view.info.shape.clone();
    if DType::from_hub(view.info.dtype).is_none() && !view.info.dtype.is_float() {
        return Err(Error::WeightDType {
            name: name.to_string(),
            stored: view.info.dtype.name().to_string(),
            hint: "; zoo-runtime holds bool, u8, i32, i64 and float tensors".into(),
        });
    }
    // Convert on the host straight to the asked dtype when the hub can, so bf16/f16
    // checkpoints load without an f32 round trip.
    match dtype {
        DType::F16 => Tensor::from_vec(view.to_f16().map_err(hub)?, &shape, device),
        DType::BF16 => Tensor::from_vec(view.to_bf16().map_err(hub)?, &shape, device),
        DType::F64 => Tensor::from_vec(view.to_f64().map_err(hub)?, &shape, device),
        DType::F32 => Tensor::from_vec(view.to_f32().map_err(hub)?, &shape, device),
        DType::I64 | DType::I32 | DType::U8 | DType::Bool => {
            Tensor::from_vec(view.to_i64().map_err(hub)?, &shape, device)?.to_dtype(dtype)
        }
    }
}

/// Named tensors held in memory.
#[derive(Clone, Debug, Default)]
pub struct MemWeights {
    tensors: HashMap<String, Tensor>,
}

impl MemWeights {
    /// An empty map.
    pub fn new() -> MemWeights {
        MemWeights::default()
    }

    /// Adds (or replaces) `name`.
    pub fn insert(&mut self, name: impl Into<String>, t: Tensor) {
        self.tensors.insert(name.into(), t);
    }
}

impl FromIterator<(String, Tensor)> for MemWeights {
    fn from_iter<I: IntoIterator<Item = (String, Tensor)>>(iter: I) -> Self {
        MemWeights {
            tensors: iter.into_iter().collect(),
        }
    }
}

impl WeightSource for MemWeights {
    fn shape(&self, name: &str) -> Option<Vec<usize>> {
        self.tensors.get(name).map(|t| t.shape().to_vec())
    }

    fn load(&self, name: &str, dtype: DType, device: &Device) -> Result<Tensor> {
        let t = self.tensors.get(name).ok_or_else(|| Error::MissingWeight {
            name: name.to_string(),
            hint: String::new(),
        })?;
        t.to_dtype(dtype)?.to_device(device)
    }

    fn names(&self) -> Vec<String> {
        self.tensors.keys().cloned().collect()
    }
}

/// Which device each module's tensors load onto, for a model split over several devices:
/// the longest module prefix covering a name wins (`model.layers.1` never covers
/// `model.layers.10`), as in transformers' `hf_device_map`; names no prefix covers load onto
/// the default device of the [`Weights`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DevicePlacement {
    entries: BTreeMap<String, Device>,
}

impl DevicePlacement {
    /// No entries: everything on the default device.
    pub fn new() -> DevicePlacement {
        DevicePlacement::default()
    }

    /// Places the module `prefix` (and everything under it) on `device`.
    pub fn insert(&mut self, prefix: impl Into<String>, device: Device) {
        self.entries.insert(prefix.into(), device);
    }

    /// The device of `name` (a module or tensor name), if a prefix covers it.
    pub fn device_of(&self, name: &str) -> Option<Device> {
        crate::device_map::longest_prefix(&self.entries, name).copied()
    }

    /// The module prefixes and their devices.
    pub fn entries(&self) -> impl Iterator<Item = (&str, Device)> {
        self.entries.iter().map(|(k, v)| (k.as_str(), *v))
    }
}

/// A view of a [`WeightSource`] under a name prefix, with the dtype and device tensors load
/// as: `weights.pp("model.layers.0").pp("self_attn")` then `.get("q_proj.weight", &[o, i])`.
#[derive(Clone)]
pub struct Weights {
    source: Arc<dyn WeightSource>,
    prefix: String,
    dtype: DType,
    device: Device,
    placement: Option<Arc<DevicePlacement>>,
    keep_blocks: bool,
    tp_plan: Option<crate::device_map::TpPlan>,
}

impl std::fmt::Debug for Weights {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Weights({:?}, {}, {})",
            self.prefix, self.dtype, self.device
        )
    }
}

impl Weights {
    /// Loads from `source` as `dtype` onto `device`.
    pub fn new(source: Arc<dyn WeightSource>, dtype: DType, device: Device) -> Weights {
        Weights {
            source,
            prefix: String::new(),
            dtype,
            device,
            placement: None,
            keep_blocks: true,
            tp_plan: None,
        }
    }

    /// The same source with GGUF blocks kept (`true`, the default: products read the
    /// blocks, as llama.cpp does) or dequantized at load (`false`: plain tensors in the
    /// asked dtype, as transformers' `gguf_file=` load gives).
    pub fn keeping_blocks(&self, keep: bool) -> Weights {
        Weights {
            keep_blocks: keep,
            ..self.clone()
        }
    }

    /// The same source with each module loading onto the device `placement` gives it (the
    /// default device for the rest).
    pub fn with_placement(&self, placement: DevicePlacement) -> Weights {
        Weights {
            placement: Some(Arc::new(placement)),
            ..self.clone()
        }
    }

    /// The same source with the weights that go to a mesh device split over its `model`
    /// axis as `plan` says (a family's tensor-parallel plan): each device is sent its tile
    /// alone. Weights the plan does not name, or whose split does not divide, are whole on
    /// every device of the mesh.
    pub fn with_tp_plan(&self, plan: crate::device_map::TpPlan) -> Weights {
        Weights {
            tp_plan: Some(plan),
            ..self.clone()
        }
    }

    /// Loads the full name `full` (stored as `shape`) onto its device, split there when it
    /// is a mesh and the tensor-parallel plan splits it.
    fn load(&self, full: &str, shape: &[usize]) -> Result<Tensor> {
        let device = self.device_for(full);
        let mesh = match device {
            Device::Pjrt(d) => d.mesh(),
            _ => None,
        };
        if let (Some(mesh), Some(plan)) = (mesh, self.tp_plan) {
            if let Some(s) = crate::device_map::weight_sharding(plan, &mesh, full, shape) {
                // Each device's tile straight from storage where the source can cut it
                // (tiles are alike, so the first says for all); else the whole tensor is
                // read once and cut.
                let mut uncut = false;
                let tiles = Tensor::from_tiles(&device, &s, shape, self.dtype, |o, t| {
                    self.source
                        .load_tile(full, self.dtype, o, t)
                        .unwrap_or_else(|| {
                            uncut = true;
                            Err(Error::InvalidArgument {
                                op: "load",
                                msg: format!("{full}: the tile at {o:?} cannot be read alone"),
                            })
                        })
                });
                if !uncut {
                    return tiles;
                }
                let host = self.source.load(full, self.dtype, &Device::Cpu)?;
                return host.to_device_sharded(&device, &s);
            }
        }
        self.source.load(full, self.dtype, &device)
    }

    /// The device `name` (a full tensor or module name) loads onto.
    fn device_for(&self, name: &str) -> Device {
        self.placement
            .as_ref()
            .and_then(|p| p.device_of(name))
            .unwrap_or(self.device)
    }

    /// The same source under `prefix.name`.
    pub fn pp(&self, name: impl AsRef<str>) -> Weights {
        let name = name.as_ref();
        let prefix = if self.prefix.is_empty() {
            name.to_string()
        } else if name.is_empty() {
            self.prefix.clone()
        } else {
            format!("{}.{}", self.prefix, name)
        };
        Weights {
            prefix,
            ..self.clone()
        }
    }

    /// The same source loading as `dtype` (norm weights kept in f32, for instance).
    pub fn with_dtype(&self, dtype: DType) -> Weights {
        Weights {
            dtype,
            ..self.clone()
        }
    }

    /// The full name of `name` under this prefix.
    pub fn full_name(&self, name: &str) -> String {
        if self.prefix.is_empty() {
            name.to_string()
        } else {
            format!("{}.{}", self.prefix, name)
        }
    }

    /// The dtype tensors load as.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The device the module under this prefix loads onto (its placement's, else the
    /// default device).
    pub fn device(&self) -> Device {
        self.device_for(&self.prefix)
    }

    /// Whether `name` exists under this prefix.
    pub fn contains(&self, name: &str) -> bool {
        self.source.shape(&self.full_name(name)).is_some()
    }

    /// Loads `name`, checking that its shape is `shape`.
    pub fn get(&self, name: &str, shape: &[usize]) -> Result<Tensor> {
        let full = self.full_name(name);
        let found = self.stored_shape(&full)?;
        if found != shape {
            return Err(Error::WeightShape {
                name: full,
                expected: shape.to_vec(),
                found,
            });
        }
        self.load(&full, &found)
    }

    /// The stored blocks of `name` when it is block-quantized, blocks are kept and it loads
    /// as f32 onto the CPU (checking its shape is `shape`); `None` otherwise, and the caller
    /// loads it as a tensor.
    pub fn get_quantized(&self, name: &str, shape: &[usize]) -> Result<Option<QuantizedWeight>> {
        let full = self.full_name(name);
        if !self.keep_blocks || self.dtype != DType::F32 || self.device_for(&full) != Device::Cpu {
            return Ok(None);
        }
        let found = self.stored_shape(&full)?;
        if found != shape {
            return Err(Error::WeightShape {
                name: full,
                expected: shape.to_vec(),
                found,
            });
        }
        self.source.quantized(&full).transpose()
    }

    /// Loads `name` whatever its shape.
    pub fn get_unchecked(&self, name: &str) -> Result<Tensor> {
        let full = self.full_name(name);
        let shape = self.stored_shape(&full)?;
        self.load(&full, &shape)
    }

    /// Loads `name` if present (an optional bias), checking its shape.
    pub fn get_opt(&self, name: &str, shape: &[usize]) -> Result<Option<Tensor>> {
        if self.contains(name) {
            self.get(name, shape).map(Some)
        } else {
            Ok(None)
        }
    }

    fn stored_shape(&self, full: &str) -> Result<Vec<usize>> {
        // Every load passes here: a `ZOO_CPU` that names no tier is refused before a weight
        // is read, not run silently at another tier.
        crate::cpu::features::tier()?;
        self.source.shape(full).ok_or_else(|| Error::MissingWeight {
            name: full.to_string(),
            hint: self.near_misses(full),
        })
    }

    /// Names under the same parent, to point at a renamed or differently nested weight.
    fn near_misses(&self, full: &str) -> String {
        let parent = full.rsplit_once('.').map(|(p, _)| p).unwrap_or("");
        let leaf = full.rsplit('.').next().unwrap_or(full);
        let mut near: Vec<String> = self
            .source
            .names()
            .into_iter()
            .filter(|n| (!parent.is_empty() && n.starts_with(parent)) || n.ends_with(leaf))
            .collect();
        near.sort();
        near.truncate(5);
        if near.is_empty() {
            String::new()
        } else {
            format!("; similar names present: {}", near.join(", "))
        }
    }
}
