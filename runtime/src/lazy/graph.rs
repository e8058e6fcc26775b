//! The recorded graph: nodes, their shapes, and the structural hash that keys compiled
//! executables.
//!
//! A [`Node`] is one value on one PJRT device. It starts `Pending` (an [`Op`] over input
//! nodes, or a constant) and becomes `Ready` (a device buffer) once a graph that computes it
//! has run; a ready node drops its inputs, so the history behind a materialised value is
//! freed and never recomputed. Leaves (uploads, copies, results) are ready from birth.

use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::op::{ConvGeom, Op};
use crate::pjrt::Buffer;
use crate::tensor::broadcast_shape;
use crate::{DType, Error, PjrtDevice, Result};

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
    Pending(Vec<Arc<Node>>),
    /// Computed: the device buffer holding the value.
    Ready(Arc<Buffer>),
}

/// One value of a lazy graph on one device.
pub(crate) struct Node {
    pub op: NodeOp,
    pub shape: Vec<usize>,
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
        shape: Vec<usize>,
        dtype: DType,
        device: PjrtDevice,
        state: State,
        host_ints: Option<Arc<[i64]>>,
    ) -> Node {
        Node {
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

impl Drop for Node {
    fn drop(&mut self) {
        // Release input chains iteratively: a long unmaterialised history would otherwise
        // recurse once per node and could overflow the stack.
        let mut stack = match std::mem::replace(
            self.state.get_mut().unwrap_or_else(|p| p.into_inner()),
            State::Pending(Vec::new()),
        ) {
            State::Pending(v) => v,
            State::Ready(_) => return,
        };
        while let Some(n) = stack.pop() {
            if let Ok(mut inner) = Arc::try_unwrap(n) {
                if let State::Pending(v) = std::mem::replace(
                    inner.state.get_mut().unwrap_or_else(|p| p.into_inner()),
                    State::Pending(Vec::new()),
                ) {
                    stack.extend(v);
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
pub(crate) fn infer_shape(op: &Op, ins: &[&[usize]]) -> Result<Vec<usize>> {
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
        | Op::ArgSortLastDim { .. } => x.to_vec(),
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
            out.extend([a[a.len() - 2], b[b.len() - 1]]);
            out
        }
        Op::Reduce { dims, keepdim, .. } => {
            for &d in dims {
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
            let mut seen = vec![false; x.len()];
            if p.len() != x.len()
                || p.iter()
                    .any(|&d| d >= x.len() || std::mem::replace(&mut seen[d], true))
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
            let mut s = x.to_vec();
            s[*dim] = *len;
            s
        }
        Op::IndexSelect { dim } => {
            dim_ok(*dim)?;
            if ins[1].len() != 1 {
                return Err(shape_err(name, x, ins[1], "; indices must be 1-D".into()));
            }
            let mut s = x.to_vec();
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
            idx.to_vec()
        }
        Op::Concat { dim } => {
            dim_ok(*dim)?;
            let mut s = x.to_vec();
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
            x.to_vec()
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
                (Some(h), Some(wd)) => vec![x[0], w[0], h, wd],
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
                (Some(h), Some(wd)) => vec![x[0], w[1] * g.groups, h, wd],
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
            vec![x[0], x[1], *h, *w]
        }
    })
}

fn reduced(x: &[usize], dims: &[usize], keepdim: bool) -> Vec<usize> {
    let mut s = Vec::with_capacity(x.len());
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
        let s = |op: Op, ins: &[&[usize]]| infer_shape(&op, ins).expect("shape");
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
                    dims: vec![0, 2],
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
                    dims: vec![1],
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
        assert!(infer_shape(&Op::Reshape(vec![7]), &[&[2, 3]]).is_err());
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
            hash(NodeOp::Op(Op::Reshape(vec![2, 3]))),
            hash(NodeOp::Op(Op::Permute(vec![2, 3])))
        );
        assert_eq!(hash(NodeOp::Op(Op::Matmul)), hash(NodeOp::Op(Op::Matmul)));
    }
}
