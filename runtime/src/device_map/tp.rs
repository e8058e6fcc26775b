//! Tensor-parallel plans: which weights split over the `model` axis of a mesh, and how, in
//! the shape of transformers' `base_model_tp_plan` (module patterns to styles).
//!
//! XLA's SPMD partitioner keeps any layout correct (it inserts the all-reduce a row-wise
//! product needs, or gathers what an op needs whole), so a plan decides only what each
//! device holds and computes; a weight whose split dimension does not divide stays whole on
//! every device.

use super::mesh::{Mesh, Sharding};
use super::DeviceMapError;
use crate::{PjrtDevice, PjrtPlatform};

/// The mesh axis tensor parallelism splits along (jax's and zml's name for it).
pub const TP_AXIS: &str = "model";

/// How a module's weights split, as transformers names the styles.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TpStyle {
    /// `colwise`: a linear's output features (`weight [out, in]` by rows, its bias too);
    /// each device computes its share of the outputs (attention heads, MLP columns).
    Colwise,
    /// `rowwise`: a linear's input features (`weight [out, in]` by columns; the bias
    /// whole): each device's partial product is summed across the devices.
    Rowwise,
    /// `embedding_rowwise` / vocabulary-parallel: an embedding table or LM head by
    /// vocabulary rows.
    Vocab,
    /// Stacked experts (`[experts, ..]`) by expert.
    Experts,
}

impl TpStyle {
    /// The style's name in a transformers tp plan.
    pub fn name(self) -> &'static str {
        match self {
            TpStyle::Colwise => "colwise",
            TpStyle::Rowwise => "rowwise",
            TpStyle::Vocab => "embedding_rowwise",
            TpStyle::Experts => "grouped_gemm",
        }
    }
}

/// A family's plan: module name patterns (dot-separated, `*` for one segment such as a
/// layer index, matched against the end of a module's name) and their styles.
pub type TpPlan = &'static [(&'static str, TpStyle)];

/// The style `plan` gives module `module` (a weight's name without `.weight`/`.bias`).
pub fn style_of(plan: TpPlan, module: &str) -> Option<TpStyle> {
    let segs: Vec<&str> = module.split('.').collect();
    plan.iter().find_map(|(pattern, style)| {
        let pat: Vec<&str> = pattern.split('.').collect();
        let tail = segs.len().checked_sub(pat.len())?;
        let hit = pat
            .iter()
            .zip(&segs[tail..])
            .all(|(p, s)| *p == "*" || p == s);
        hit.then_some(*style)
    })
}

/// The layout of weight `name` (of `shape`) on `mesh` under `plan`: split along
/// [`TP_AXIS`] as its module's style says, or whole (`None`) when the plan names no style
/// for it, the mesh has no such axis, or the split dimension does not divide.
pub fn weight_sharding(plan: TpPlan, mesh: &Mesh, name: &str, shape: &[usize]) -> Option<Sharding> {
    let (module, kind) = name.rsplit_once('.')?;
    let style = style_of(plan, module)?;
    let dim = match (style, kind, shape.len()) {
        (TpStyle::Colwise, "weight" | "bias", 1..) => 0,
        (TpStyle::Rowwise, "weight", 2) => 1,
        (TpStyle::Vocab, "weight", 2) => 0,
        (TpStyle::Experts, _, 2..) => 0,
        _ => return None,
    };
    let s = Sharding::split_dim(mesh, shape.len(), dim, TP_AXIS).ok()?;
    s.tile_shape(mesh, shape).ok()?;
    Some(s)
}

/// `dim` of a rank-`rank` tensor of `shape` split along [`TP_AXIS`] when `mesh` has that
/// axis and the size divides by it (a KV cache by head); `None` keeps it whole.
pub fn split_if_divisible(mesh: &Mesh, shape: &[usize], dim: usize) -> Option<Sharding> {
    let s = Sharding::split_dim(mesh, shape.len(), dim, TP_AXIS).ok()?;
    s.tile_shape(mesh, shape).ok()?;
    Some(s)
}

/// `ordinals` cut into meshes of `tp` devices in order (one mesh of all of them when `tp` is
/// `None`), refused when they do not divide.
pub fn tp_groups(ordinals: &[usize], tp: Option<usize>) -> Result<Vec<Vec<usize>>, DeviceMapError> {
    let tp = tp.unwrap_or(ordinals.len());
    if tp == 0 || ordinals.is_empty() || !ordinals.len().is_multiple_of(tp) {
        return Err(DeviceMapError::BadSharding {
            reason: format!(
                "{} devices do not form meshes of {tp}; give a multiple of {tp} devices",
                ordinals.len()
            ),
        });
    }
    Ok(ordinals.chunks(tp).map(<[usize]>::to_vec).collect())
}

/// The device a group of `platform`'s devices stands for: the device itself, or a mesh of
/// them along [`TP_AXIS`].
pub fn group_device(platform: PjrtPlatform, group: &[usize]) -> Result<PjrtDevice, DeviceMapError> {
    match group {
        [one] => Ok(PjrtDevice::new(platform, *one)),
        _ => Ok(PjrtDevice::on_mesh(
            platform,
            &Mesh::new(&[(TP_AXIS, group.len())], group)?,
        )),
    }
}

/// What tensor parallelism over `tp` devices makes of a model's weights: the bytes each
/// device holds, and the all-reduces a forward pass needs (each row-wise layer sums its
/// partial outputs across the mesh once).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct TpFootprint {
    /// Devices per mesh.
    pub tp: usize,
    /// Weight bytes each device holds (its tiles, and every whole tensor).
    pub bytes_per_device: u64,
    /// Tensors split over the mesh.
    pub split: usize,
    /// Tensors whole on every device (not in the plan, or not dividing).
    pub whole: usize,
    /// Row-wise layers: one all-reduce each per forward pass.
    pub all_reduces: usize,
    /// Bytes those all-reduces carry per token (each its layer's output width).
    pub all_reduce_bytes_per_token: u64,
}

/// The [`TpFootprint`] of `tensors` (name, shape) stored as `elem_bytes` per element, on a
/// mesh of `tp` devices under `plan`.
pub fn footprint<'a>(
    plan: TpPlan,
    tp: usize,
    tensors: impl IntoIterator<Item = (&'a str, &'a [usize])>,
    elem_bytes: u64,
) -> TpFootprint {
    let mut f = TpFootprint {
        tp,
        ..TpFootprint::default()
    };
    let devices: Vec<usize> = (0..tp.max(1)).collect();
    let Ok(mesh) = Mesh::new(&[(TP_AXIS, devices.len())], &devices) else {
        return f;
    };
    for (name, shape) in tensors {
        let numel: u64 = shape.iter().map(|&d| d as u64).product();
        let bytes = numel.saturating_mul(elem_bytes);
        match weight_sharding(plan, &mesh, name, shape).filter(|_| tp > 1) {
            Some(s) => {
                f.split += 1;
                f.bytes_per_device += bytes / tp as u64;
                if s.dims().get(1).copied().flatten().is_some() && shape.len() == 2 {
                    f.all_reduces += 1;
                    f.all_reduce_bytes_per_token += shape[0] as u64 * elem_bytes;
                }
            }
            None => {
                f.whole += 1;
                f.bytes_per_device += bytes;
            }
        }
    }
    f
}

#[cfg(test)]
mod tests {
    use super::*;

    const PLAN: TpPlan = &[
        ("layers.*.self_attn.q_proj", TpStyle::Colwise),
        ("layers.*.self_attn.o_proj", TpStyle::Rowwise),
        ("embed_tokens", TpStyle::Vocab),
    ];

    #[test]
    fn patterns_match_whole_segments_from_the_end() {
        assert_eq!(
            style_of(PLAN, "model.layers.12.self_attn.q_proj"),
            Some(TpStyle::Colwise)
        );
        assert_eq!(style_of(PLAN, "model.layers.x.y.self_attn.q_proj"), None);
        assert_eq!(style_of(PLAN, "model.layers.1.self_attn.q_proj_x"), None);
        assert_eq!(style_of(PLAN, "model.embed_tokens"), Some(TpStyle::Vocab));
        assert_eq!(style_of(PLAN, "model.norm"), None);
    }

    #[test]
    fn weights_split_by_style_and_stay_whole_where_they_do_not_divide() {
        let mesh = Mesh::new(&[(TP_AXIS, 4)], &[0, 1, 2, 3]).unwrap();
        let dims = |name: &str, shape: &[usize]| {
            weight_sharding(PLAN, &mesh, name, shape).map(|s| s.dims().to_vec())
        };
        let q = "model.layers.0.self_attn.q_proj";
        assert_eq!(
            dims(&format!("{q}.weight"), &[8, 4]),
            Some(vec![Some(0), None])
        );
        assert_eq!(dims(&format!("{q}.bias"), &[8]), Some(vec![Some(0)]));
        let o = "model.layers.0.self_attn.o_proj";
        assert_eq!(
            dims(&format!("{o}.weight"), &[4, 8]),
            Some(vec![None, Some(0)])
        );
        assert_eq!(dims(&format!("{o}.bias"), &[4]), None);
        assert_eq!(dims(&format!("{q}.weight"), &[6, 4]), None, "6 rows over 4");
        assert_eq!(dims("model.norm.weight", &[8]), None);
        let f = footprint(
            PLAN,
            4,
            [
                (format!("{q}.weight"), vec![8usize, 4]),
                (format!("{o}.weight"), vec![4, 8]),
                ("model.norm.weight".to_string(), vec![8]),
            ]
            .iter()
            .map(|(n, s)| (n.as_str(), s.as_slice())),
            2,
        );
        assert_eq!((f.split, f.whole, f.all_reduces), (2, 1, 1));
        assert_eq!(f.bytes_per_device, 16 + 16 + 16);
        assert_eq!(f.all_reduce_bytes_per_token, 8);
        let other = Mesh::new(&[("data", 4)], &[0, 1, 2, 3]).unwrap();
        assert!(weight_sharding(PLAN, &other, &format!("{q}.weight"), &[8, 4]).is_none());
    }
}
