//! The exact planner: contiguous stages over devices with different budgets, minimising the
//! largest stage, sized from the inventory (exact bytes in the target dtype), the KV cache and
//! peak activations of the asked workload. Unlike a greedy fill with fixed safety margins, every
//! byte it counts is named in the plan's table.

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use serde_json::json;
use zoo_hub::{Dtype, Inventory};

use super::memory::human;
use super::{DeviceMapError, ExplicitMap, Placement};

/// The shape facts of a model's layers that size its KV cache and activations; the model
/// family gives them (the planner knows no architecture).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModelShape {
    pub layers: usize,
    pub hidden: usize,
    pub intermediate: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Logits per token of the last unit (0 for a model without a vocabulary head).
    pub vocab: usize,
    /// What each layer caches while generating.
    pub kv_cache: CacheLayout,
}

impl ModelShape {
    /// An encoder's shape: `layers` layers of multi-head attention (`heads` of `head_dim`)
    /// over `hidden`, an MLP of `intermediate`, no vocabulary head and no cache.
    pub fn encoder(
        layers: usize,
        hidden: usize,
        intermediate: usize,
        heads: usize,
        head_dim: usize,
    ) -> ModelShape {
        ModelShape {
            layers,
            hidden,
            intermediate,
            heads,
            kv_heads: heads,
            head_dim,
            vocab: 0,
            kv_cache: CacheLayout::None,
        }
    }
}

/// What the layers of a model keep while it generates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheLayout {
    /// Nothing: an encoder runs once per input.
    None,
    /// Every layer caches the keys and values of the whole sequence (decoders).
    SelfAttention,
    /// An encoder-decoder (T5): each layer under the `decoder` container (`decoder.block`)
    /// caches the generated tokens' keys and values and, for cross-attention, those of the
    /// encoder's output; encoder layers cache nothing. The workload's `seq` sizes both the
    /// encoder's input and the decoder's output.
    EncoderDecoder {
        /// The container of the decoder's numbered layers.
        decoder: &'static str,
    },
}

impl CacheLayout {
    /// Whether the model keeps any cache.
    pub fn caches(self) -> bool {
        self != CacheLayout::None
    }

    /// Key/value caches (each `batch x seq x kv_heads x head_dim`) the unit `name` of layer
    /// `layer` keeps: 1 per decoder layer, 2 per layer of an encoder-decoder's decoder.
    fn caches_of(self, name: &str, layer: Option<usize>) -> u64 {
        match (self, layer) {
            (_, None) | (CacheLayout::None, _) => 0,
            (CacheLayout::SelfAttention, Some(_)) => 1,
            (CacheLayout::EncoderDecoder { decoder }, Some(_)) => {
                let under = name
                    .strip_prefix(decoder)
                    .is_some_and(|r| r.starts_with('.'));
                if under {
                    2
                } else {
                    0
                }
            }
        }
    }
}

/// The work the plan must leave room for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Workload {
    pub batch: usize,
    /// Prompt plus generated tokens: the KV cache capacity.
    pub seq: usize,
    /// Bytes per element of the KV cache and of activations.
    pub elem_bytes: usize,
}

/// One device and how much of it the plan may use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceBudget {
    pub place: Placement,
    /// A name for tables (`tpu:0`, `cpu`).
    pub name: String,
    /// Usable bytes (from `max_memory` or the device's memory stats).
    pub bytes: u64,
}

/// A unit that is never split across devices: a decoder layer, or a top-level module.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unit {
    /// Module prefix (`model.layers.3`, `model.embed_tokens`, `lm_head`).
    pub name: String,
    /// Weight bytes in the target dtype (tied tensors counted once, with the first unit).
    pub weight_bytes: u64,
    /// The decoder layer index, for units that hold one (their KV cache lives with them).
    pub layer: Option<usize>,
    /// Units that must share this unit's device because they share tensors.
    pub tied_with: Option<String>,
}

/// What to plan.
#[derive(Clone, Debug)]
pub struct PlanRequest {
    /// `balanced`, `balanced_low_0` or `sequential`.
    pub strategy: String,
    /// Accelerators in pipeline order, then optionally `cpu` for what does not fit.
    pub devices: Vec<DeviceBudget>,
    pub units: Vec<Unit>,
    pub shape: Option<ModelShape>,
    pub workload: Workload,
    /// Peak activation bytes per device when the caller sizes them itself (a UNet's skip
    /// connections at the image size); `None` derives them from `shape` and `workload`.
    pub activations: Option<u64>,
    /// Fraction of each budget held back for the runtime (executables, allocator slack).
    pub reserve_fraction: f64,
}

/// One device's share of the model.
#[derive(Clone, Debug, PartialEq)]
pub struct Stage {
    pub device: DeviceBudget,
    pub units: Vec<String>,
    pub weights: u64,
    pub kv: u64,
    pub activations: u64,
    pub reserve: u64,
}

impl Stage {
    /// Bytes this stage uses in all.
    pub fn used(&self) -> u64 {
        total(&[self.weights, self.kv, self.activations, self.reserve])
    }

    /// Bytes left on the device (negative never happens in a valid plan).
    pub fn free(&self) -> i128 {
        self.device.bytes as i128 - self.used() as i128
    }
}

/// A validated placement of every unit, with its accounting.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    pub strategy: String,
    pub stages: Vec<Stage>,
    /// Bytes that cross from each stage to the next, per token.
    pub cut_bytes_per_token: u64,
    pub workload: Workload,
    pub map: ExplicitMap,
}

/// How a model's tensors group into no-split units, as its family declares them (the
/// planner itself names no module).
#[derive(Clone, Copy, Debug, Default)]
pub struct UnitRules<'a> {
    /// Containers whose numbered children are units (`model.layers` for `model.layers.N`).
    pub layer_containers: &'a [&'a str],
    /// Modules that run before the layers (`model.embed_tokens`, BERT's `embeddings`), each
    /// one unit however many submodules it has.
    pub inputs: &'a [&'a str],
    /// Groups of tensors that share storage (HF `_tied_weights_keys`).
    pub tied: &'a [Vec<String>],
}

/// Groups an inventory into no-split units: every tensor under `container.N` (e.g.
/// `model.layers.N`) is unit `container.N`; any other tensor belongs to its module (its name less
/// the last component). Units come in execution order: the `inputs` modules, then layers by
/// index, then the rest in inventory order. Each `tied` group is counted once and its later
/// units follow the first.
pub fn units_from_inventory(
    inventory: &Inventory,
    rules: &UnitRules<'_>,
    dtype: Option<Dtype>,
) -> Vec<Unit> {
    let tied = rules.tied;
    let mut units: Vec<Unit> = Vec::new();
    let mut index: HashMap<String, usize> = HashMap::new();
    let tied_first: HashMap<&str, &str> = tied
        .iter()
        .filter(|g| !g.is_empty())
        .flat_map(|g| g[1..].iter().map(move |n| (n.as_str(), g[0].as_str())))
        .collect();
    for t in inventory.tensors() {
        let (name, layer) = unit_of(&t.name, rules);
        let bytes = match dtype {
            Some(d) if t.dtype.is_float() => t.bytes_as(d),
            _ => t.nbytes,
        };
        let bytes = if tied_first.contains_key(t.name.as_str()) {
            0
        } else {
            bytes
        };
        let i = *index.entry(name.clone()).or_insert_with(|| {
            units.push(Unit {
                name: name.clone(),
                weight_bytes: 0,
                layer,
                tied_with: None,
            });
            units.len() - 1
        });
        units[i].weight_bytes += bytes;
        if let Some(first) = tied_first.get(t.name.as_str()) {
            units[i].tied_with = Some(unit_of(first, rules).0);
        }
    }
    // Execution order: inputs (embeddings) first, then each container's layers by index in
    // the order the family lists them (an encoder's before a decoder's), each followed by
    // the modules beside it (`encoder.final_layer_norm` after `encoder.block.*`), then heads
    // and the rest.
    let container = |name: &str| rules.layer_containers.iter().position(|c| under(name, c));
    let beside = |name: &str| {
        rules.layer_containers.iter().position(|c| {
            c.rsplit_once('.')
                .is_some_and(|(parent, _)| under(name, parent))
        })
    };
    let mut keyed: Vec<((u8, usize, usize, usize), Unit)> = units
        .into_iter()
        .enumerate()
        .map(|(i, u)| {
            let key = match (u.layer, container(&u.name)) {
                (Some(l), Some(c)) => (1, c, l, i),
                _ if rules.inputs.iter().any(|p| under(&u.name, p)) => (0, 0, 0, i),
                _ => match beside(&u.name) {
                    Some(c) => (1, c, usize::MAX, i),
                    None => (2, 0, 0, i),
                },
            };
            (key, u)
        })
        .collect();
    keyed.sort_by_key(|(k, _)| *k);
    keyed.into_iter().map(|(_, u)| u).collect()
}

/// Whether `name` is the module `prefix` or inside it (`a.b` is under `a`, `ab` is not).
fn under(name: &str, prefix: &str) -> bool {
    name.strip_prefix(prefix)
        .is_some_and(|r| r.is_empty() || r.starts_with('.'))
}

/// The unit of `tensor`: its numbered layer, the input module it is under (kept whole), or
/// else its own module.
fn unit_of(tensor: &str, rules: &UnitRules<'_>) -> (String, Option<usize>) {
    for c in rules.layer_containers {
        if let Some(rest) = tensor.strip_prefix(c).and_then(|r| r.strip_prefix('.')) {
            if let Some(idx) = rest.split('.').next().and_then(|s| s.parse::<usize>().ok()) {
                return (format!("{c}.{idx}"), Some(idx));
            }
        }
    }
    if let Some(input) = rules.inputs.iter().find(|p| under(tensor, p)) {
        return (input.to_string(), None);
    }
    let module = tensor.rsplit_once('.').map_or(tensor, |(m, _)| m);
    (module.to_string(), None)
}

/// Per-unit bytes that live with the unit: its weights plus, for a layer, its KV cache; for the
/// unit that computes logits (the last), the logits of one decode step in f32.
fn unit_costs(req: &PlanRequest) -> Vec<u64> {
    let w = req.workload;
    req.units
        .iter()
        .enumerate()
        .map(|(i, u)| {
            let mut c = u.weight_bytes;
            if let Some(s) = req.shape {
                let caches = s.kv_cache.caches_of(&u.name, u.layer);
                // Keys and values of each cache.
                let kv = product(&[2, w.batch, w.seq, s.kv_heads, s.head_dim, w.elem_bytes]);
                c = c.saturating_add(caches.saturating_mul(kv));
            }
            if i + 1 == req.units.len() {
                if let Some(s) = req.shape {
                    c = c.saturating_add(product(&[w.batch, s.vocab, 4]));
                }
            }
            c
        })
        .collect()
}

/// Peak activation bytes of one layer running the whole prompt: the residual stream and its
/// normed copy, q/k/v/o, the MLP's two intermediate tensors and the f32 attention scores a
/// compiled program holds at once (one query chunk's when they are long).
fn activation_peak(shape: Option<ModelShape>, w: Workload) -> u64 {
    let Some(s) = shape else { return 0 };
    let width = (s.heads.saturating_add(s.kv_heads.saturating_mul(2)))
        .saturating_mul(s.head_dim)
        .saturating_add(s.hidden.saturating_mul(3));
    let streams = product(&[w.batch, w.seq, w.elem_bytes, width]);
    let mlp = product(&[w.batch, w.seq, w.elem_bytes, 2, s.intermediate]);
    let scores = crate::lazy::attention_scores_bytes(w.batch.saturating_mul(s.heads), w.seq, w.seq);
    streams.saturating_add(mlp).saturating_add(scores)
}

/// The sum of byte counts, saturating (see [`product`]).
fn total(bytes: &[u64]) -> u64 {
    bytes.iter().fold(0u64, |n, &b| n.saturating_add(b))
}

/// The product of sizes in bytes, saturating: sizes from configs and arguments can be
/// anything, and a saturated cost fits no device, so the plan fails naming the shortfall.
fn product(sizes: &[usize]) -> u64 {
    sizes.iter().fold(1u64, |n, &d| n.saturating_mul(d as u64))
}

/// Plans `req`: places every unit on one device, contiguously, validates the result, and fails
/// before anything is loaded when the model does not fit, naming the shortfall per device.
pub fn plan(req: &PlanRequest) -> Result<Plan, DeviceMapError> {
    if req.devices.iter().any(|d| d.place == Placement::Disk) {
        return Err(DeviceMapError::DiskUnsupported);
    }
    if req.devices.is_empty() {
        return Err(DeviceMapError::Invalid {
            reason: "no devices to place the model on".into(),
        });
    }
    if !(0.0..1.0).contains(&req.reserve_fraction) {
        return Err(DeviceMapError::Invalid {
            reason: format!(
                "the reserve is a fraction of each budget in [0, 1), got {}",
                req.reserve_fraction
            ),
        });
    }
    if req.workload.batch == 0 || req.workload.seq == 0 {
        return Err(DeviceMapError::Invalid {
            reason: format!(
                "a plan needs a batch and a sequence length of at least 1 (batch {}, seq {})",
                req.workload.batch, req.workload.seq
            ),
        });
    }
    let costs = unit_costs(req);
    let act = req
        .activations
        .unwrap_or_else(|| activation_peak(req.shape, req.workload));
    let fixed: Vec<u64> = req
        .devices
        .iter()
        .map(|d| ((d.bytes as f64 * req.reserve_fraction) as u64).saturating_add(act))
        .collect();
    let caps: Vec<u64> = req
        .devices
        .iter()
        .zip(&fixed)
        .map(|(d, f)| d.bytes.saturating_sub(*f))
        .collect();

    let order: Vec<usize> = (0..req.devices.len()).collect();
    let assign = match req.strategy.as_str() {
        "sequential" => fill(&costs, &caps, &order, u64::MAX),
        "balanced" => balanced(&costs, &caps, &order),
        "balanced_low_0" if req.devices.len() > 1 => {
            // Keep device 0 out when the others can hold everything; else give it the least.
            balanced(&costs, &caps, &order[1..]).or_else(|| balanced(&costs, &caps, &order))
        }
        "balanced_low_0" => balanced(&costs, &caps, &order),
        other => {
            return Err(DeviceMapError::Invalid {
                reason: format!(
                    "unknown strategy {other:?}; use balanced, balanced_low_0 or sequential"
                ),
            })
        }
    };
    let Some(assign) = assign else {
        return Err(shortfall(req, &costs, &caps, &fixed));
    };
    let assign = keep_tied_together(req, assign);
    build(req, &costs, act, &assign)
}

/// Greedy contiguous fill of `devices` in order, each up to `min(limit, cap)`; `None` when units
/// remain. For a fixed device order this fills as much as any contiguous split could, so it
/// decides feasibility exactly.
fn fill(costs: &[u64], caps: &[u64], devices: &[usize], limit: u64) -> Option<Vec<usize>> {
    let mut assign = Vec::with_capacity(costs.len());
    let mut d = 0;
    let mut load = 0u64;
    for &c in costs {
        loop {
            let dev = *devices.get(d)?;
            if load.saturating_add(c) <= caps[dev].min(limit) {
                load += c;
                assign.push(dev);
                break;
            }
            d += 1;
            load = 0;
        }
    }
    Some(assign)
}

/// The smallest largest-stage load over contiguous splits, by binary search on the limit with
/// [`fill`] as the exact feasibility test: O(units × log(total bytes)).
fn balanced(costs: &[u64], caps: &[u64], devices: &[usize]) -> Option<Vec<usize>> {
    let mut best = fill(costs, caps, devices, u64::MAX)?;
    let (mut lo, mut hi) = (costs.iter().copied().max().unwrap_or(0), total(costs));
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        match fill(costs, caps, devices, mid) {
            Some(a) => {
                best = a;
                hi = mid;
            }
            None => lo = mid + 1,
        }
    }
    if let Some(a) = fill(costs, caps, devices, lo) {
        best = a;
    }
    Some(best)
}

/// A unit tied to an earlier one (an untied-in-name `lm_head` sharing the embedding) runs where
/// the first lives; its bytes were already counted there.
fn keep_tied_together(req: &PlanRequest, mut assign: Vec<usize>) -> Vec<usize> {
    let pos: HashMap<&str, usize> = req
        .units
        .iter()
        .enumerate()
        .map(|(i, u)| (u.name.as_str(), i))
        .collect();
    for (i, u) in req.units.iter().enumerate() {
        if let Some(j) = u.tied_with.as_deref().and_then(|t| pos.get(t)) {
            assign[i] = assign[*j];
        }
    }
    assign
}

fn shortfall(req: &PlanRequest, costs: &[u64], caps: &[u64], fixed: &[u64]) -> DeviceMapError {
    let need = total(costs);
    let have = total(caps);
    let biggest = req
        .units
        .iter()
        .zip(costs)
        .max_by_key(|(_, c)| **c)
        .map(|(u, c)| format!("{} ({})", u.name, human(*c)))
        .unwrap_or_default();
    let per_device = req
        .devices
        .iter()
        .zip(caps.iter().zip(fixed))
        .map(|(d, (cap, f))| {
            format!(
                "{}: budget {}, activations+reserve {}, room for weights+KV {}",
                d.name,
                human(d.bytes),
                human(*f),
                human(*cap)
            )
        })
        .collect::<Vec<_>>()
        .join("; ");
    let gap = need.saturating_sub(have);
    let detail = if gap > 0 {
        format!("{} more is needed", human(gap))
    } else {
        format!("no contiguous split fits the largest unit {biggest}")
    };
    DeviceMapError::DoesNotFit {
        shortfall: format!(
            "weights+KV need {} in all, devices hold {}: {detail}. Per device: {per_device}. Add devices, raise --max-memory, lower --batch/--seq, or allow cpu offload",
            human(need),
            human(have)
        ),
    }
}

fn build(
    req: &PlanRequest,
    costs: &[u64],
    act: u64,
    assign: &[usize],
) -> Result<Plan, DeviceMapError> {
    let w = req.workload;
    let mut stages: Vec<Stage> = Vec::new();
    let mut by_device: BTreeMap<usize, usize> = BTreeMap::new();
    let mut map = ExplicitMap::default();
    for (i, (u, &dev)) in req.units.iter().zip(assign).enumerate() {
        let s = *by_device.entry(dev).or_insert_with(|| {
            let d = &req.devices[dev];
            stages.push(Stage {
                device: d.clone(),
                units: Vec::new(),
                weights: 0,
                kv: 0,
                activations: act,
                reserve: (d.bytes as f64 * req.reserve_fraction) as u64,
            });
            stages.len() - 1
        });
        let stage = &mut stages[s];
        stage.units.push(u.name.clone());
        stage.weights = stage.weights.saturating_add(u.weight_bytes);
        stage.kv = stage.kv.saturating_add(costs[i] - u.weight_bytes);
        map.entries.insert(u.name.clone(), req.devices[dev].place);
    }
    let plan = Plan {
        strategy: req.strategy.clone(),
        stages,
        cut_bytes_per_token: req
            .shape
            .map_or(0, |s| product(&[w.batch, s.hidden, w.elem_bytes])),
        workload: w,
        map,
    };
    plan.validate(&req.units)?;
    Ok(plan)
}

impl Plan {
    /// Checks the invariants every plan must hold: each unit placed exactly once, tied units
    /// together, no device over budget.
    pub fn validate(&self, units: &[Unit]) -> Result<(), DeviceMapError> {
        let invalid = |reason: String| DeviceMapError::Invalid { reason };
        let mut seen: HashMap<&str, usize> = HashMap::new();
        for s in &self.stages {
            for u in &s.units {
                *seen.entry(u.as_str()).or_default() += 1;
            }
            if s.free() < 0 {
                return Err(invalid(format!(
                    "{} is over budget by {}",
                    s.device.name,
                    human((-s.free()) as u64)
                )));
            }
        }
        for u in units {
            match seen.get(u.name.as_str()) {
                Some(1) => {}
                Some(n) => return Err(invalid(format!("{} is placed {n} times", u.name))),
                None => return Err(invalid(format!("{} is not placed", u.name))),
            }
            if let Some(t) = &u.tied_with {
                if self.map.entries.get(t) != self.map.entries.get(&u.name) {
                    return Err(invalid(format!(
                        "{} is tied to {t} but placed apart",
                        u.name
                    )));
                }
            }
        }
        Ok(())
    }

    /// Places every tensor of `inventory` by this plan; a tensor no unit covers is an error.
    pub fn check_covers(&self, inventory: &Inventory) -> Result<(), DeviceMapError> {
        for t in inventory.tensors() {
            if self.map.placement_of(&t.name).is_none() {
                return Err(DeviceMapError::Invalid {
                    reason: format!("tensor {} is covered by no entry of the plan", t.name),
                });
            }
        }
        Ok(())
    }

    /// The plan as JSON; its `hf_device_map` field loads back as an explicit map.
    pub fn to_json(&self) -> serde_json::Value {
        json!({
            "strategy": self.strategy,
            "workload": {"batch": self.workload.batch, "seq": self.workload.seq, "elem_bytes": self.workload.elem_bytes},
            "stages": self.stages.iter().map(|s| json!({
                "device": s.device.name,
                "placement": s.device.place.to_string(),
                "budget": s.device.bytes,
                "weights": s.weights,
                "kv": s.kv,
                "activations": s.activations,
                "reserve": s.reserve,
                "free": s.free() as i64,
                "units": s.units,
            })).collect::<Vec<_>>(),
            "cut_bytes_per_token": self.cut_bytes_per_token,
            "hf_device_map": self.map.to_json(),
        })
    }
}

impl Plan {
    /// The plan's table (a header, one row per stage) without the cut lines, for callers
    /// that account for the cuts themselves (a pipeline's per-step crossings).
    pub fn table(&self) -> String {
        let mut s = String::new();
        let _ = self.write_table(&mut s);
        s
    }

    fn write_table(&self, f: &mut impl fmt::Write) -> fmt::Result {
        writeln!(
            f,
            "plan: {} (batch {}, seq {})",
            self.strategy, self.workload.batch, self.workload.seq
        )?;
        writeln!(
            f,
            "{:<10} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12}  units",
            "device", "budget", "weights", "kv", "activations", "reserve", "free"
        )?;
        for s in &self.stages {
            let first = s.units.first().map(String::as_str).unwrap_or("-");
            let last = s.units.last().map(String::as_str).unwrap_or("-");
            writeln!(
                f,
                "{:<10} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12}  {} ({first} .. {last})",
                s.device.name,
                human(s.device.bytes),
                human(s.weights),
                human(s.kv),
                human(s.activations),
                human(s.reserve),
                human(s.free().max(0) as u64),
                s.units.len()
            )?;
        }
        Ok(())
    }
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.write_table(f)?;
        for pair in self.stages.windows(2) {
            writeln!(
                f,
                "cut {} -> {}: after {}, {} per token",
                pair[0].device.name,
                pair[1].device.name,
                pair[0].units.last().map(String::as_str).unwrap_or("-"),
                human(self.cut_bytes_per_token)
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev(i: usize, gib: u64) -> DeviceBudget {
        DeviceBudget {
            place: Placement::Device(i),
            name: format!("tpu:{i}"),
            bytes: gib,
        }
    }

    fn units(costs: &[u64]) -> Vec<Unit> {
        costs
            .iter()
            .enumerate()
            .map(|(i, &c)| Unit {
                name: format!("model.layers.{i}"),
                weight_bytes: c,
                layer: Some(i),
                tied_with: None,
            })
            .collect()
    }

    fn request(strategy: &str, devices: Vec<DeviceBudget>, costs: &[u64]) -> PlanRequest {
        PlanRequest {
            strategy: strategy.into(),
            devices,
            units: units(costs),
            shape: None,
            workload: Workload {
                batch: 1,
                seq: 1,
                elem_bytes: 2,
            },
            activations: None,
            reserve_fraction: 0.0,
        }
    }

    /// The best largest stage over every contiguous split, by exhaustive search.
    fn brute_force(costs: &[u64], caps: &[u64]) -> Option<u64> {
        fn go(costs: &[u64], caps: &[u64]) -> Option<u64> {
            if costs.is_empty() {
                return Some(0);
            }
            let (&cap, rest) = caps.split_first()?;
            let mut best = None;
            for k in 0..=costs.len() {
                let load: u64 = costs[..k].iter().sum();
                if load > cap {
                    break;
                }
                if let Some(r) = go(&costs[k..], rest) {
                    let m = load.max(r);
                    best = Some(best.map_or(m, |b: u64| b.min(m)));
                }
            }
            best
        }
        go(costs, caps)
    }

    #[test]
    fn balanced_is_optimal_on_random_cases() {
        let mut seed = 0x9e3779b97f4a7c15u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for _ in 0..300 {
            let n = 1 + (next() % 9) as usize;
            let d = 1 + (next() % 4) as usize;
            let costs: Vec<u64> = (0..n).map(|_| 1 + next() % 50).collect();
            let caps: Vec<u64> = (0..d).map(|_| 20 + next() % 120).collect();
            let devices = caps.iter().enumerate().map(|(i, &c)| dev(i, c)).collect();
            let got = plan(&request("balanced", devices, &costs));
            match (brute_force(&costs, &caps), got) {
                (Some(best), Ok(p)) => {
                    let largest = p.stages.iter().map(|s| s.weights).max().unwrap();
                    assert_eq!(largest, best, "costs {costs:?} caps {caps:?}");
                }
                (None, Err(DeviceMapError::DoesNotFit { .. })) => {}
                (b, g) => panic!("costs {costs:?} caps {caps:?}: best {b:?}, planner {g:?}"),
            }
        }
    }

    #[test]
    fn sequential_fills_in_order_and_low0_spares_device_0() {
        let p = plan(&request(
            "sequential",
            vec![dev(0, 10), dev(1, 10)],
            &[4, 4, 4],
        ))
        .unwrap();
        assert_eq!(p.stages[0].units.len(), 2);
        let p = plan(&request(
            "balanced_low_0",
            vec![dev(0, 10), dev(1, 10), dev(2, 10)],
            &[4, 4, 4],
        ))
        .unwrap();
        assert!(p
            .stages
            .iter()
            .all(|s| s.device.place != Placement::Device(0)));
    }

    #[test]
    fn infeasible_names_the_shortfall_per_device() {
        let err = plan(&request(
            "balanced",
            vec![dev(0, 10), dev(1, 10)],
            &[8, 8, 8],
        ))
        .unwrap_err()
        .to_string();
        assert!(err.contains("4 B more is needed"), "{err}");
        assert!(err.contains("tpu:0") && err.contains("tpu:1"), "{err}");
        let disk = DeviceBudget {
            place: Placement::Disk,
            name: "disk".into(),
            bytes: 1,
        };
        assert!(matches!(
            plan(&request("balanced", vec![disk], &[1])),
            Err(DeviceMapError::DiskUnsupported)
        ));
    }

    #[test]
    fn kv_cache_and_activations_are_reserved() {
        let shape = ModelShape {
            layers: 2,
            hidden: 8,
            intermediate: 16,
            heads: 2,
            kv_heads: 1,
            head_dim: 4,
            vocab: 10,
            kv_cache: CacheLayout::SelfAttention,
        };
        let mut req = request("balanced", vec![dev(0, 1 << 20)], &[100, 100]);
        req.shape = Some(shape);
        req.workload = Workload {
            batch: 2,
            seq: 16,
            elem_bytes: 2,
        };
        let p = plan(&req).unwrap();
        let s = &p.stages[0];
        // KV: 2 (k, v) × batch 2 × seq 16 × 1 kv head × dim 4 × 2 bytes per layer, 2 layers;
        // plus one step of f32 logits (2 × 10 × 4) with the last unit.
        assert_eq!(s.kv, 2 * (2 * 2 * 16 * 4 * 2) + 80);
        assert!(s.activations > 0);
        assert_eq!(p.cut_bytes_per_token, 2 * 8 * 2);
        let json = p.to_json();
        assert_eq!(json["hf_device_map"]["model.layers.1"], 0);
        assert!(p.to_string().contains("tpu:0"));
    }
}
