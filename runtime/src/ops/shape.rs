//! Shape, indexing and joining ops.

use crate::dims::Dims;
use crate::error::BackendContext;
use crate::op::Op;
use crate::tensor::check_same_device;
use crate::{DType, Error, Result, Tensor};

impl Tensor {
    /// Reshapes to `shape`; one entry may be -1 and is inferred (`torch.reshape`).
    pub fn reshape(&self, shape: &[isize]) -> Result<Tensor> {
        let name = "reshape";
        let n = self.elem_count();
        let mut holes = shape
            .iter()
            .enumerate()
            .filter(|(_, &d)| d == -1)
            .map(|(i, _)| i);
        let hole = holes.next();
        let bad = |msg: String| Error::InvalidArgument { op: name, msg };
        if holes.next().is_some() || shape.iter().any(|&d| d < -1) {
            return Err(bad(format!(
                "shape {shape:?} has more than one -1 or a negative size"
            )));
        }
        let known = shape
            .iter()
            .filter(|&&d| d >= 0)
            .try_fold(1usize, |acc, &d| acc.checked_mul(d as usize))
            .ok_or_else(|| bad(format!("shape {shape:?} overflows usize")))?;
        let mut dims: Dims = shape.iter().map(|&d| d.max(0) as usize).collect();
        if let Some(h) = hole {
            if known == 0 || !n.is_multiple_of(known) {
                return Err(bad(format!(
                    "cannot reshape {:?} ({n} elements) into {shape:?}",
                    self.shape()
                )));
            }
            dims[h] = n / known;
        } else if known != n {
            return Err(bad(format!(
                "cannot reshape {:?} ({n} elements) into {shape:?} ({known} elements)",
                self.shape()
            )));
        }
        if dims == *self.shape() {
            return Ok(self.clone());
        }
        self.apply1(Op::Reshape(dims), self.dtype())
    }

    /// Reshapes to an exact shape given in `usize`.
    pub fn reshape_to(&self, shape: &[usize]) -> Result<Tensor> {
        // The common case (sizes that fit an isize and hold the same element count) is
        // `reshape`'s answer without converting the shape; anything else gets its checks
        // and errors.
        let fits = shape.iter().all(|&d| d <= isize::MAX as usize)
            && shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d))
                == Some(self.elem_count());
        if !fits {
            return with_isize(shape, |s| self.reshape(s));
        }
        if shape == self.shape() {
            return Ok(self.clone());
        }
        self.apply1(Op::Reshape(Dims::from(shape)), self.dtype())
    }

    /// Merges dims `start..=end` into one.
    pub fn flatten(&self, start: isize, end: isize) -> Result<Tensor> {
        if self.rank() == 0 {
            return self.reshape(&[1]);
        }
        let (s, e) = (self.axis("flatten", start)?, self.axis("flatten", end)?);
        if s > e {
            return Err(Error::InvalidArgument {
                op: "flatten",
                msg: format!("start dim {start} is after end dim {end}"),
            });
        }
        let sh = self.shape();
        let mut dims = Dims::from(&sh[..s]);
        dims.push(sh[s..=e].iter().product());
        dims.extend(sh[e + 1..].iter().copied());
        self.reshape_to(&dims)
    }

    /// Reorders dims: result dim `i` is input dim `perm[i]`. A view where the backend allows.
    pub fn permute(&self, perm: &[isize]) -> Result<Tensor> {
        let name = "permute";
        if perm.len() != self.rank() {
            return Err(Error::InvalidArgument {
                op: name,
                msg: format!(
                    "permutation {perm:?} does not cover the {} dims of {:?}",
                    self.rank(),
                    self.shape()
                ),
            });
        }
        let mut p = Dims::new();
        for &d in perm {
            let a = self.axis(name, d)?;
            if p.contains(&a) {
                return Err(Error::InvalidArgument {
                    op: name,
                    msg: format!("permutation {perm:?} repeats dim {d}"),
                });
            }
            p.push(a);
        }
        if p.iter().enumerate().all(|(i, &d)| i == d) {
            return Ok(self.clone());
        }
        self.apply1(Op::Permute(p), self.dtype())
    }

    /// Swaps two dims.
    pub fn transpose(&self, d0: isize, d1: isize) -> Result<Tensor> {
        let (a, b) = (self.axis("transpose", d0)?, self.axis("transpose", d1)?);
        if a == b {
            return Ok(self.clone());
        }
        // A valid permutation by construction: `permute`'s checks have nothing to find.
        let mut p: Dims = (0..self.rank()).collect();
        p.swap(a, b);
        self.apply1(Op::Permute(p), self.dtype())
    }

    /// Swaps the last two dims (a matrix transpose).
    pub fn t(&self) -> Result<Tensor> {
        self.transpose(-2, -1)
    }

    /// Broadcasts to `shape` (`torch.expand`): new leading dims may be added, size-1 dims
    /// stretched, and -1 keeps a dim. No data is copied on the eager backend.
    pub fn expand(&self, shape: &[isize]) -> Result<Tensor> {
        let name = "expand";
        let r = self.rank();
        if shape.len() < r {
            return Err(Error::ShapeMismatch {
                op: name,
                lhs: self.shape().to_vec(),
                rhs: shape.iter().map(|&d| d.max(0) as usize).collect(),
                hint: "; the target has fewer dims".into(),
            });
        }
        let lead = shape.len() - r;
        let mut out = Dims::new();
        for (i, &d) in shape.iter().enumerate() {
            let cur = if i >= lead {
                Some(self.shape()[i - lead])
            } else {
                None
            };
            let v = match (d, cur) {
                (-1, Some(c)) => c,
                (d, Some(c)) if d >= 0 && (c == d as usize || c == 1) => d as usize,
                (d, None) if d >= 0 => d as usize,
                _ => {
                    return Err(Error::ShapeMismatch {
                        op: name,
                        lhs: self.shape().to_vec(),
                        rhs: shape.iter().map(|&d| d.max(0) as usize).collect(),
                        hint: format!("; dim {i} cannot expand to {d}"),
                    })
                }
            };
            out.push(v);
        }
        if out == *self.shape() {
            return Ok(self.clone());
        }
        self.apply1(Op::Broadcast(out), self.dtype())
    }

    /// Broadcasts to an exact `shape`.
    pub fn broadcast_as(&self, shape: &[usize]) -> Result<Tensor> {
        with_isize(shape, |s| self.expand(s))
    }

    /// Removes dim `d` if it has size 1 (otherwise returns `self`, as `torch.squeeze(d)`).
    pub fn squeeze(&self, d: isize) -> Result<Tensor> {
        let a = self.axis("squeeze", d)?;
        if self.shape()[a] != 1 {
            return Ok(self.clone());
        }
        let mut dims = Dims::from(self.shape());
        dims.remove(a);
        self.reshape_to(&dims)
    }

    /// Inserts a size-1 dim at `d` (`-1` appends).
    pub fn unsqueeze(&self, d: isize) -> Result<Tensor> {
        let r = self.rank() as isize;
        let i = if d < 0 { d + r + 1 } else { d };
        if i < 0 || i > r {
            return Err(Error::DimOutOfRange {
                op: "unsqueeze",
                dim: d,
                shape: self.shape().to_vec(),
            });
        }
        let mut dims = Dims::from(self.shape());
        dims.insert(i as usize, 1);
        self.reshape_to(&dims)
    }

    /// `len` entries of dim `d` starting at `start` (a view on the eager backend).
    pub fn narrow(&self, d: isize, start: usize, len: usize) -> Result<Tensor> {
        let name = "narrow";
        let a = self.axis(name, d)?;
        let size = self.shape()[a];
        if start.checked_add(len).is_none_or(|end| end > size) {
            return Err(Error::IndexOutOfRange {
                op: name,
                index_shape: vec![],
                shape: self.shape().to_vec(),
                dim: a,
                hint: format!(
                    "; range {start}..{} exceeds size {size}",
                    start.saturating_add(len)
                ),
            });
        }
        if start == 0 && len == size {
            return Ok(self.clone());
        }
        self.apply1(Op::Narrow { dim: a, start, len }, self.dtype())
    }

    /// Python-style `x[.., start:end]` along `d`; negative bounds count from the end and
    /// bounds are clamped, as Python slicing does.
    pub fn slice(&self, d: isize, start: isize, end: isize) -> Result<Tensor> {
        let a = self.axis("slice", d)?;
        let n = self.shape()[a] as isize;
        let fix = |v: isize| (if v < 0 { v + n } else { v }).clamp(0, n) as usize;
        let (s, e) = (fix(start), fix(end));
        self.narrow(a as isize, s, e.saturating_sub(s))
    }

    /// Rows of dim `d` picked by a 1-D integer `indices` tensor (`torch.index_select`).
    pub fn index_select(&self, d: isize, indices: &Tensor) -> Result<Tensor> {
        let name = "index_select";
        check_same_device(name, self, indices)?;
        let a = self.axis(name, d)?;
        check_index_dtype(name, indices)?;
        if indices.rank() != 1 {
            return Err(Error::ShapeMismatch {
                op: name,
                lhs: self.shape().to_vec(),
                rhs: indices.shape().to_vec(),
                hint: "; indices must be 1-D (use `embedding` for any shape)".into(),
            });
        }
        Tensor::apply(Op::IndexSelect { dim: a }, &[self, indices], self.dtype())
            .map_err(|e| index_error(e, name, self, indices, a))
    }

    /// `out[i][j][k] = self[index[i][j][k]][j][k]` along `d` (`torch.gather`): `index` has the
    /// same rank, and no dim other than `d` larger than `self`'s.
    pub fn gather(&self, d: isize, index: &Tensor) -> Result<Tensor> {
        let name = "gather";
        check_same_device(name, self, index)?;
        let a = self.axis(name, d)?;
        check_index_dtype(name, index)?;
        let fits = index.rank() == self.rank()
            && index
                .shape()
                .iter()
                .zip(self.shape())
                .enumerate()
                .all(|(i, (&x, &s))| i == a || x <= s);
        if !fits {
            return Err(Error::ShapeMismatch {
                op: name,
                lhs: self.shape().to_vec(),
                rhs: index.shape().to_vec(),
                hint: format!(
                    "; index must have rank {} and no dim other than {a} larger than the input's",
                    self.rank()
                ),
            });
        }
        Tensor::apply(Op::Gather { dim: a }, &[self, index], self.dtype())
            .map_err(|e| index_error(e, name, self, index, a))
    }

    /// Embedding lookup: rows of the 2-D `table` for every id in `self` (any shape, integer);
    /// the result has shape `ids.shape + [table.dim(1)]`.
    pub fn embedding(&self, table: &Tensor) -> Result<Tensor> {
        let name = "embedding";
        if table.rank() != 2 {
            return Err(Error::ShapeMismatch {
                op: name,
                lhs: self.shape().to_vec(),
                rhs: table.shape().to_vec(),
                hint: "; the table must be [vocab, hidden]".into(),
            });
        }
        let flat = self.flatten(0, -1)?;
        let rows = table.index_select(0, &flat)?;
        let mut dims = Dims::from(self.shape());
        dims.push(table.shape()[1]);
        rows.reshape_to(&dims)
    }

    /// Joins tensors along `d`; all other dims must agree, dtypes promote.
    pub fn cat(tensors: &[&Tensor], d: isize) -> Result<Tensor> {
        let name = "cat";
        let Some(first) = tensors.first() else {
            return Err(Error::InvalidArgument {
                op: name,
                msg: "no tensors given".into(),
            });
        };
        let a = first.axis(name, d)?;
        let mut dt = first.dtype();
        for t in &tensors[1..] {
            check_same_device(name, first, t)?;
            let ok = t.rank() == first.rank()
                && t.shape()
                    .iter()
                    .zip(first.shape())
                    .enumerate()
                    .all(|(i, (x, y))| i == a || x == y);
            if !ok {
                return Err(Error::ShapeMismatch {
                    op: name,
                    lhs: first.shape().to_vec(),
                    rhs: t.shape().to_vec(),
                    hint: format!("; all dims but {a} must match"),
                });
            }
            dt = DType::promote(dt, t.dtype());
        }
        if tensors.len() == 1 {
            return first.to_dtype(dt);
        }
        if tensors.iter().all(|t| t.dtype() == dt) {
            if let Some(y) = crate::cpu::cat::cat(tensors, a) {
                return y;
            }
            return Tensor::apply(Op::Concat { dim: a }, tensors, dt);
        }
        let cast: Vec<Tensor> = tensors
            .iter()
            .map(|t| t.to_dtype(dt))
            .collect::<Result<_>>()?;
        let refs: Vec<&Tensor> = cast.iter().collect();
        Tensor::apply(Op::Concat { dim: a }, &refs, dt)
    }

    /// Stacks equally shaped tensors along a new dim `d`.
    pub fn stack(tensors: &[&Tensor], d: isize) -> Result<Tensor> {
        let Some(first) = tensors.first() else {
            return Err(Error::InvalidArgument {
                op: "stack",
                msg: "no tensors given".into(),
            });
        };
        for t in &tensors[1..] {
            if t.shape() != first.shape() {
                return Err(Error::ShapeMismatch {
                    op: "stack",
                    lhs: first.shape().to_vec(),
                    rhs: t.shape().to_vec(),
                    hint: "; stacked tensors must have equal shapes".into(),
                });
            }
        }
        let u: Vec<Tensor> = tensors
            .iter()
            .map(|t| t.unsqueeze(d))
            .collect::<Result<_>>()?;
        let refs: Vec<&Tensor> = u.iter().collect();
        Tensor::cat(&refs, d)
    }

    /// Splits dim `d` into consecutive pieces of the given sizes, which must sum to its size.
    pub fn split(&self, sizes: &[usize], d: isize) -> Result<Vec<Tensor>> {
        let a = self.axis("split", d)?;
        let total: usize = sizes.iter().sum();
        if total != self.shape()[a] {
            return Err(Error::InvalidArgument {
                op: "split",
                msg: format!(
                    "sizes {sizes:?} sum to {total}, not the size {} of dim {d} in {:?}",
                    self.shape()[a],
                    self.shape()
                ),
            });
        }
        let mut start = 0;
        let mut out = Vec::with_capacity(sizes.len());
        for &s in sizes {
            out.push(self.narrow(a as isize, start, s)?);
            start += s;
        }
        Ok(out)
    }

    /// Splits dim `d` into `n` chunks of `ceil(size / n)` (the last may be smaller, and fewer
    /// than `n` chunks come back when the size is small), as `torch.chunk`.
    pub fn chunk(&self, n: usize, d: isize) -> Result<Vec<Tensor>> {
        let a = self.axis("chunk", d)?;
        if n == 0 {
            return Err(Error::InvalidArgument {
                op: "chunk",
                msg: "chunk count must be positive".into(),
            });
        }
        let size = self.shape()[a];
        let step = size.div_ceil(n).max(1);
        let mut sizes = vec![];
        let mut left = size;
        while left > 0 {
            sizes.push(step.min(left));
            left -= step.min(left);
        }
        if sizes.is_empty() {
            sizes.push(0);
        }
        self.split(&sizes, a as isize)
    }

    /// Pads dim `d` with `before` and `after` entries of `value` (constant mode of `F.pad`).
    pub fn pad(&self, d: isize, before: usize, after: usize, value: f64) -> Result<Tensor> {
        let a = self.axis("pad", d)?;
        if before == 0 && after == 0 {
            return Ok(self.clone());
        }
        let mut parts = Vec::with_capacity(3);
        let mut shape = self.shape().to_vec();
        if before > 0 {
            shape[a] = before;
            parts.push(Tensor::full(&shape, value, self.dtype(), &self.device())?);
        }
        parts.push(self.clone());
        if after > 0 {
            shape[a] = after;
            parts.push(Tensor::full(&shape, value, self.dtype(), &self.device())?);
        }
        let refs: Vec<&Tensor> = parts.iter().collect();
        Tensor::cat(&refs, a as isize)
    }

    /// Repeats each entry of dim `d` `repeats` times in place (`torch.repeat_interleave`);
    /// this is how GQA/MQA key/value heads are shared across query heads.
    pub fn repeat_interleave(&self, repeats: usize, d: isize) -> Result<Tensor> {
        let a = self.axis("repeat_interleave", d)?;
        if repeats == 1 {
            return Ok(self.clone());
        }
        let mut target = Dims::from(self.shape());
        target.insert(a + 1, repeats);
        let mut merged = Dims::from(self.shape());
        merged[a] *= repeats;
        self.unsqueeze(a as isize + 1)?
            .broadcast_as(&target)?
            .reshape_to(&merged)
    }

    /// Tiles the tensor `reps[i]` times along dim `i` (`torch.Tensor.repeat`, same rank).
    pub fn repeat(&self, reps: &[usize]) -> Result<Tensor> {
        if reps.len() != self.rank() {
            return Err(Error::InvalidArgument {
                op: "repeat",
                msg: format!("{} repeat counts for shape {:?}", reps.len(), self.shape()),
            });
        }
        let mut x = self.clone();
        for (d, &r) in reps.iter().enumerate() {
            if r != 1 {
                let copies: Vec<&Tensor> = std::iter::repeat_n(&x, r).collect();
                x = Tensor::cat(&copies, d as isize)?;
            }
        }
        Ok(x)
    }

    /// XLA's `dynamic_slice`: a block of `sizes` starting at `start` (a 1-D integer tensor with
    /// one entry per dim, which may live on the device). Starts are clamped so the block fits.
    pub fn dynamic_slice(&self, start: &Tensor, sizes: &[usize]) -> Result<Tensor> {
        let name = "dynamic_slice";
        check_same_device(name, self, start)?;
        check_start(name, self.shape(), sizes, start)?;
        Tensor::apply(
            Op::DynamicSlice {
                sizes: Dims::from(sizes),
            },
            &[self, start],
            self.dtype(),
        )
    }

    /// Writes `src` into `self` along `dim` from index `start`, in place: the storage every
    /// clone of `self` shares changes, nothing is copied (an eager KV-cache write, where the
    /// functional [`Tensor::dynamic_update_slice`] would copy the whole cache per token).
    /// Eager tensors only; lazy (PJRT) tensors are written with `dynamic_update_slice`,
    /// whose donated buffer XLA updates in place.
    pub fn write_slice_in_place(&self, dim: usize, start: usize, src: &Tensor) -> Result<()> {
        let op = "write_slice_in_place";
        if src.dtype() != self.dtype() || src.rank() != self.rank() || dim >= self.rank() {
            return Err(Error::ShapeMismatch {
                op,
                lhs: self.shape().to_vec(),
                rhs: src.shape().to_vec(),
                hint: format!(
                    "; src must match the destination's rank and dtype ({})",
                    self.dtype()
                ),
            });
        }
        let fits = (0..self.rank()).all(|i| {
            if i == dim {
                start + src.shape()[i] <= self.shape()[i]
            } else {
                src.shape()[i] == self.shape()[i]
            }
        });
        if !fits {
            return Err(Error::ShapeMismatch {
                op,
                lhs: self.shape().to_vec(),
                rhs: src.shape().to_vec(),
                hint: format!("; src must fit at index {start} of dim {dim}"),
            });
        }
        match (self.as_candle(), src.as_candle()) {
            (Some(d), Some(s)) => d.slice_set(s, dim, start).op(op),
            _ => Err(Error::InvalidArgument {
                op,
                msg: "in-place writes need eager tensors; use dynamic_update_slice on PJRT devices"
                    .into(),
            }),
        }
    }

    /// XLA's `dynamic_update_slice`: `self` with `update` written at `start` (a 1-D integer
    /// tensor, one entry per dim; clamped so the block fits). This is the KV-cache write: a
    /// fixed-size cache updated at a position tensor keeps shapes static for compilation.
    pub fn dynamic_update_slice(&self, update: &Tensor, start: &Tensor) -> Result<Tensor> {
        let name = "dynamic_update_slice";
        check_same_device(name, self, update)?;
        check_same_device(name, self, start)?;
        if update.dtype() != self.dtype() {
            return Err(Error::DTypeMismatch {
                op: name,
                lhs: self.dtype(),
                rhs: update.dtype(),
                hint: "; the update must have the operand's dtype".into(),
            });
        }
        check_start(name, self.shape(), update.shape(), start)?;
        Tensor::apply(Op::DynamicUpdateSlice, &[self, update, start], self.dtype())
    }

    /// `self` with slice `i` of `source` along `d` written at `index[i]` (`torch.index_copy`):
    /// `index` is 1-D, `source` has `self`'s shape but `index.len()` slices along `d`. Where
    /// an index repeats, one of its slices is written (which one is unspecified, as in
    /// PyTorch). This is a paged KV-cache write on compiled devices: tokens go to the slots of
    /// their blocks, wherever those lie, in one op of fixed shape.
    pub fn index_copy(&self, d: isize, index: &Tensor, source: &Tensor) -> Result<Tensor> {
        let name = "index_copy";
        check_same_device(name, self, index)?;
        check_same_device(name, self, source)?;
        let a = self.axis(name, d)?;
        check_index_dtype(name, index)?;
        if source.dtype() != self.dtype() {
            return Err(Error::DTypeMismatch {
                op: name,
                lhs: self.dtype(),
                rhs: source.dtype(),
                hint: "; the source must have the operand's dtype".into(),
            });
        }
        let fits = index.rank() == 1
            && source.rank() == self.rank()
            && source
                .shape()
                .iter()
                .zip(self.shape())
                .enumerate()
                .all(|(i, (&x, &s))| x == if i == a { index.shape()[0] } else { s });
        if !fits {
            return Err(Error::ShapeMismatch {
                op: name,
                lhs: self.shape().to_vec(),
                rhs: source.shape().to_vec(),
                hint: format!(
                    "; index must be 1-D and source have the input's shape but {} slices along dim {a}",
                    index.shape().first().copied().unwrap_or(0)
                ),
            });
        }
        Tensor::apply(
            Op::IndexCopy { dim: a },
            &[self, index, source],
            self.dtype(),
        )
        .map_err(|e| index_error(e, name, self, index, a))
    }
}

/// Calls `f` with `shape` as `isize` dims, without allocating for the ranks zoo uses.
fn with_isize<R>(shape: &[usize], f: impl FnOnce(&[isize]) -> R) -> R {
    const INLINE: usize = 8;
    if shape.len() <= INLINE {
        let mut s = [0isize; INLINE];
        for (o, &d) in s.iter_mut().zip(shape) {
            *o = d as isize;
        }
        f(&s[..shape.len()])
    } else {
        f(&shape.iter().map(|&d| d as isize).collect::<Vec<_>>())
    }
}

fn check_index_dtype(op: &'static str, idx: &Tensor) -> Result<()> {
    if !idx.dtype().is_int() {
        return Err(Error::UnsupportedDType {
            op,
            dtype: idx.dtype(),
            hint: "; indices must be an integer tensor".into(),
        });
    }
    Ok(())
}

fn check_start(op: &'static str, shape: &[usize], sizes: &[usize], start: &Tensor) -> Result<()> {
    check_index_dtype(op, start)?;
    if start.shape() != [shape.len()] {
        return Err(Error::ShapeMismatch {
            op,
            lhs: shape.to_vec(),
            rhs: start.shape().to_vec(),
            hint: format!("; start must be a 1-D tensor of {} indices", shape.len()),
        });
    }
    if sizes.len() != shape.len() || sizes.iter().zip(shape).any(|(s, d)| s > d) {
        return Err(Error::ShapeMismatch {
            op,
            lhs: shape.to_vec(),
            rhs: sizes.to_vec(),
            hint: "; the block must have the operand's rank and fit inside it".into(),
        });
    }
    Ok(())
}

/// Backend index errors become a typed error naming both shapes.
fn index_error(e: Error, op: &'static str, x: &Tensor, idx: &Tensor, dim: usize) -> Error {
    match e {
        Error::Backend { source, .. } => Error::IndexOutOfRange {
            op,
            index_shape: idx.shape().to_vec(),
            shape: x.shape().to_vec(),
            dim,
            hint: format!("; {source}"),
        },
        e => e,
    }
}
