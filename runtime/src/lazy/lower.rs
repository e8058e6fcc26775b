//! Lowering a recorded graph to StableHLO MLIR text.
//!
//! Every op is printed in MLIR's generic form (`"stablehlo.add"(%1, %2) : (..) -> ..`),
//! which every StableHLO version parses the same way, where the pretty forms drift between
//! releases. The module has one `func.func @main` whose parameters are the graph's leaves
//! and whose results are the materialised nodes.
//!
//! Precision choices mirror the eager backend: 16-bit float transcendental functions,
//! `pow`, convolutions and matmuls compute in f32 and round once (candle does the same, and
//! on TPUs a bf16 x bf16 -> f32 `dot_general` is the native MXU form).

use std::fmt::Write as _;
use std::sync::Arc;

use super::graph::{infer_shape, NodeOp};
use super::Precision;
use crate::composite::{Attention, Composite, Prims};
use crate::device_map::Mesh;
use crate::op::{BinaryOp, CmpOp, ConvGeom, Op, ReduceOp, UnaryOp};
use crate::{DType, Error, Result};

/// Where a node's operand comes from: a parameter of `@main` or an earlier node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Ref {
    Param(usize),
    Node(usize),
}

/// The part of a node the lowering needs.
pub(crate) struct LowerNode<'a> {
    pub op: &'a NodeOp,
    pub shape: &'a [usize],
    pub dtype: DType,
    pub inputs: &'a [Ref],
}

/// The StableHLO element type of a zoo dtype.
pub(crate) fn elem(dt: DType) -> &'static str {
    match dt {
        DType::F32 => "f32",
        DType::F16 => "f16",
        DType::BF16 => "bf16",
        DType::F64 => "f64",
        DType::I64 => "i64",
        DType::I32 => "i32",
        DType::U8 => "ui8",
        DType::Bool => "i1",
    }
}

/// `tensor<2x3xf32>`, or `tensor<f32>` for a scalar.
pub(crate) fn ty(shape: &[usize], dt: DType) -> String {
    let mut s = String::from("tensor<");
    for d in shape {
        let _ = write!(s, "{d}x");
    }
    s.push_str(elem(dt));
    s.push('>');
    s
}

fn arr(v: impl IntoIterator<Item = usize>) -> String {
    let items: Vec<String> = v.into_iter().map(|d| d.to_string()).collect();
    if items.is_empty() {
        "array<i64>".into()
    } else {
        format!("array<i64: {}>", items.join(", "))
    }
}

fn list(v: impl IntoIterator<Item = usize>) -> String {
    let items: Vec<String> = v.into_iter().map(|d| d.to_string()).collect();
    format!("[{}]", items.join(", "))
}

/// A scalar literal of `dt` as MLIR prints it: floats as their bit pattern in hex (exact,
/// and the only spelling of inf/nan), integers in decimal (saturated into range).
fn literal(v: f64, dt: DType) -> String {
    match dt {
        DType::F32 => format!("0x{:08X}", (v as f32).to_bits()),
        DType::F64 => format!("0x{:016X}", v.to_bits()),
        DType::F16 => format!("0x{:04X}", half::f16::from_f64(v).to_bits()),
        DType::BF16 => format!("0x{:04X}", half::bf16::from_f64(v).to_bits()),
        DType::I64 => (v as i64).to_string(),
        DType::I32 => (v as i32).to_string(),
        DType::U8 => (v as u8).to_string(),
        DType::Bool => (v != 0.0).to_string(),
    }
}

/// A value in the program being written.
#[derive(Clone, Debug)]
struct V {
    name: String,
    shape: Vec<usize>,
    dt: DType,
}

impl V {
    fn ty(&self) -> String {
        ty(&self.shape, self.dt)
    }
}

struct Emitter {
    body: String,
    next: usize,
    precision: &'static str,
    /// The mesh a partitioned program runs over (what sharding constraints refer to).
    mesh: Option<Arc<Mesh>>,
    /// Lay values out in Shardy's dialect rather than GSPMD's attributes.
    shardy: bool,
}

/// The layout of a program partitioned over a mesh: each parameter's and each output's
/// sharding (`super::shard` ids), and the partitioner that reads them.
pub(crate) struct MeshLayout<'a> {
    pub mesh: Arc<Mesh>,
    pub params: &'a [u32],
    pub outputs: &'a [u32],
    /// Shardy (`sdy.mesh`, `sdy.sharding`, `sdy.sharding_constraint`; compiled with
    /// `use_shardy_partitioner`) rather than GSPMD (`mhlo.sharding`).
    pub shardy: bool,
}

/// A block argument name unique to the op `%N` (MLIR names are digits or start with a
/// letter, so `%N` gets a letter prefix).
fn region_arg(op: &str, suffix: &str) -> String {
    format!("%r{}{suffix}", op.trim_start_matches('%'))
}

fn is16(dt: DType) -> bool {
    matches!(dt, DType::F16 | DType::BF16)
}

fn cmp_type(dt: DType) -> &'static str {
    match dt {
        d if d.is_float() => "FLOAT",
        DType::U8 | DType::Bool => "UNSIGNED",
        _ => "SIGNED",
    }
}

impl Emitter {
    fn fresh(&mut self) -> String {
        self.next += 1;
        format!("%{}", self.next)
    }

    /// Writes `%r = "name"(args) {attrs} : (arg types) -> result type` and returns `%r`.
    fn op(&mut self, name: &str, args: &[&V], attrs: &str, shape: &[usize], dt: DType) -> V {
        let r = self.fresh();
        let names: Vec<&str> = args.iter().map(|a| a.name.as_str()).collect();
        let tys: Vec<String> = args.iter().map(|a| a.ty()).collect();
        let _ = writeln!(
            self.body,
            "    {r} = \"{name}\"({}){}{attrs} : ({}) -> {}",
            names.join(", "),
            if attrs.is_empty() { "" } else { " " },
            tys.join(", "),
            ty(shape, dt)
        );
        V {
            name: r,
            shape: shape.to_vec(),
            dt,
        }
    }

    fn same(&mut self, name: &str, args: &[&V]) -> V {
        let (s, d) = (args[0].shape.clone(), args[0].dt);
        self.op(name, args, "", &s, d)
    }

    fn constant(&mut self, v: f64, dt: DType) -> V {
        let attrs = format!("{{value = dense<{}> : {}}}", literal(v, dt), ty(&[], dt));
        self.op("stablehlo.constant", &[], &attrs, &[], dt)
    }

    fn constant_i64s(&mut self, vals: &[i64]) -> V {
        let items: Vec<String> = vals.iter().map(|v| v.to_string()).collect();
        let t = ty(&[vals.len()], DType::I64);
        let attrs = format!("{{value = dense<[{}]> : {t}}}", items.join(", "));
        self.op("stablehlo.constant", &[], &attrs, &[vals.len()], DType::I64)
    }

    /// `value` broadcast to `shape`.
    fn full(&mut self, v: f64, shape: &[usize], dt: DType) -> V {
        let c = self.constant(v, dt);
        self.bcast(&c, shape)
    }

    /// Broadcasts with PyTorch's trailing alignment.
    fn bcast(&mut self, v: &V, shape: &[usize]) -> V {
        if v.shape == shape {
            return v.clone();
        }
        let lead = shape.len() - v.shape.len();
        let attrs = format!("{{broadcast_dimensions = {}}}", arr(lead..shape.len()));
        self.op("stablehlo.broadcast_in_dim", &[v], &attrs, shape, v.dt)
    }

    fn convert(&mut self, v: &V, dt: DType) -> V {
        if v.dt == dt {
            return v.clone();
        }
        let s = v.shape.clone();
        self.op("stablehlo.convert", &[v], "", &s, dt)
    }

    fn reshape(&mut self, v: &V, shape: &[usize]) -> V {
        if v.shape == shape {
            return v.clone();
        }
        self.op("stablehlo.reshape", &[v], "", shape, v.dt)
    }

    fn compare(&mut self, dir: &str, a: &V, b: &V) -> V {
        let attrs = format!("{{comparison_direction = #stablehlo<comparison_direction {dir}>, compare_type = #stablehlo<comparison_type {}>}}", cmp_type(a.dt));
        let s = a.shape.clone();
        self.op("stablehlo.compare", &[a, b], &attrs, &s, DType::Bool)
    }

    fn select(&mut self, p: &V, a: &V, b: &V) -> V {
        let s = a.shape.clone();
        self.op("stablehlo.select", &[p, a, b], "", &s, a.dt)
    }

    fn transpose(&mut self, v: &V, perm: &[usize]) -> V {
        let shape: Vec<usize> = perm.iter().map(|&p| v.shape[p]).collect();
        let attrs = format!("{{permutation = {}}}", arr(perm.iter().copied()));
        self.op("stablehlo.transpose", &[v], &attrs, &shape, v.dt)
    }

    fn slice(&mut self, v: &V, start: &[usize], limit: &[usize]) -> V {
        let shape: Vec<usize> = start.iter().zip(limit).map(|(s, l)| l - s).collect();
        let attrs = format!(
            "{{start_indices = {}, limit_indices = {}, strides = {}}}",
            arr(start.iter().copied()),
            arr(limit.iter().copied()),
            arr(std::iter::repeat_n(1, start.len()))
        );
        self.op("stablehlo.slice", &[v], &attrs, &shape, v.dt)
    }

    fn iota(&mut self, shape: &[usize], dim: usize, dt: DType) -> V {
        let attrs = format!("{{iota_dimension = {dim} : i64}}");
        self.op("stablehlo.iota", &[], &attrs, shape, dt)
    }

    /// `x` with `updates` written at `indices` (`[n, 1]`) along `dim`: update windows span
    /// the `window` dims of `updates` (all but `dim`), the region keeps the update.
    fn scatter(&mut self, x: &V, indices: &V, updates: &V, window: &[usize], dim: usize) -> V {
        let r = self.fresh();
        let st = ty(&[], x.dt);
        let (a, b) = (region_arg(&r, "a"), region_arg(&r, "b"));
        let _ = writeln!(
            self.body,
            "    {r} = \"stablehlo.scatter\"({}, {}, {}) ({{",
            x.name, indices.name, updates.name
        );
        let _ = writeln!(self.body, "    ^bb0({a}: {st}, {b}: {st}):");
        let _ = writeln!(self.body, "      \"stablehlo.return\"({b}) : ({st}) -> ()");
        let _ = writeln!(
            self.body,
            "    }}) {{scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = {}, inserted_window_dims = [{dim}], scatter_dims_to_operand_dims = [{dim}], index_vector_dim = 1>, indices_are_sorted = false, unique_indices = false}} : ({}, {}, {}) -> {}",
            list(window.iter().copied()),
            x.ty(),
            indices.ty(),
            updates.ty(),
            x.ty()
        );
        V {
            name: r,
            shape: x.shape.clone(),
            dt: x.dt,
        }
    }

    /// A reduction of `x` over `dims` with a two-argument body op (`stablehlo.add`, ...).
    fn reduce(&mut self, x: &V, init: &V, body_op: &str, dims: &[usize]) -> V {
        let r = self.fresh();
        let shape: Vec<usize> = x
            .shape
            .iter()
            .enumerate()
            .filter(|(i, _)| !dims.contains(i))
            .map(|(_, &d)| d)
            .collect();
        let st = ty(&[], x.dt);
        let (a, b) = (region_arg(&r, "a"), region_arg(&r, "b"));
        let _ = writeln!(
            self.body,
            "    {r} = \"stablehlo.reduce\"({}, {}) ({{",
            x.name, init.name
        );
        let _ = writeln!(self.body, "    ^bb0({a}: {st}, {b}: {st}):");
        let s = self.fresh();
        let _ = writeln!(
            self.body,
            "      {s} = \"{body_op}\"({a}, {b}) : ({st}, {st}) -> {st}"
        );
        let _ = writeln!(self.body, "      \"stablehlo.return\"({s}) : ({st}) -> ()");
        let _ = writeln!(
            self.body,
            "    }}) {{dimensions = {}}} : ({}, {st}) -> {}",
            arr(dims.iter().copied()),
            x.ty(),
            ty(&shape, x.dt)
        );
        V {
            name: r,
            shape,
            dt: x.dt,
        }
    }

    fn dot(&mut self, a: &V, b: &V, dims: &str, shape: &[usize], dt: DType) -> V {
        let p = self.precision;
        let attrs = format!("{{dot_dimension_numbers = #stablehlo.dot<{dims}>, precision_config = [#stablehlo<precision {p}>, #stablehlo<precision {p}>]}}");
        self.op("stablehlo.dot_general", &[a, b], &attrs, shape, dt)
    }

    /// One scalar per entry of a 1-D start tensor, as `dynamic_slice` takes them.
    fn starts(&mut self, start: &V) -> Vec<V> {
        (0..start.shape[0])
            .map(|i| {
                let s = self.slice(start, &[i], &[i + 1]);
                self.reshape(&s, &[])
            })
            .collect()
    }

    /// `index_select` along `dim` with 1-D `idx`.
    fn take(&mut self, x: &V, idx: &V, dim: usize) -> V {
        let n = idx.shape[0];
        let idx2 = self.reshape(idx, &[n, 1]);
        let r = x.shape.len();
        let mut sizes = x.shape.clone();
        sizes[dim] = 1;
        let mut out = x.shape.clone();
        out[dim] = n;
        let offset: Vec<usize> = (0..r).filter(|&d| d != dim).collect();
        let mut dn = String::new();
        if !offset.is_empty() {
            let _ = write!(dn, "offset_dims = {}, ", list(offset));
        }
        let _ = write!(
            dn,
            "collapsed_slice_dims = [{dim}], start_index_map = [{dim}], index_vector_dim = 1"
        );
        let attrs = format!("{{dimension_numbers = #stablehlo.gather<{dn}>, indices_are_sorted = false, slice_sizes = {}}}", arr(sizes));
        self.op("stablehlo.gather", &[x, &idx2], &attrs, &out, x.dt)
    }

    /// `stablehlo.convolution` in NCHW/OIHW; `lhs_dil` dilates the input (transposed
    /// convolutions), `pads` are (low, high) per spatial dim.
    fn conv(
        &mut self,
        (x, w): (&V, &V),
        g: &ConvGeom,
        lhs_dil: usize,
        stride: usize,
        pads: [(i64, i64); 2],
        shape: &[usize],
    ) -> V {
        let attrs = format!(
            "{{batch_group_count = 1 : i64, dimension_numbers = #stablehlo.conv<[b, f, 0, 1]x[o, i, 0, 1]->[b, f, 0, 1]>, feature_group_count = {} : i64, lhs_dilation = array<i64: {lhs_dil}, {lhs_dil}>, padding = dense<[[{}, {}], [{}, {}]]> : tensor<2x2xi64>, precision_config = [#stablehlo<precision {p}>, #stablehlo<precision {p}>], rhs_dilation = array<i64: {d}, {d}>, window_strides = array<i64: {stride}, {stride}>}}",
            g.groups,
            pads[0].0,
            pads[0].1,
            pads[1].0,
            pads[1].1,
            p = self.precision,
            d = g.dilation,
        );
        self.op("stablehlo.convolution", &[x, w], &attrs, shape, x.dt)
    }
}

/// Composites lower to their expansion, each primitive as `lower_node` emits it.
impl Prims for Emitter {
    type V = V;
    fn shape(v: &V) -> &[usize] {
        &v.shape
    }
    fn dtype(v: &V) -> DType {
        v.dt
    }
    fn prim(&mut self, op: Op, ins: &[&V], dt: DType) -> Result<V> {
        let shapes: Vec<&[usize]> = ins.iter().map(|v| v.shape.as_slice()).collect();
        let shape = infer_shape(&op, &shapes)?;
        let owned: Vec<V> = ins.iter().map(|&v| v.clone()).collect();
        lower_node(self, &NodeOp::Op(op), &owned, &shape, dt)
    }
    fn scalar(&mut self, v: f64, dt: DType, _like: &V) -> Result<V> {
        Ok(self.constant(v, dt))
    }
}

/// Writes the module for `nodes` (in dependency order) with parameters of the given
/// shapes and dtypes, returning the nodes at `outputs`.
pub(crate) fn lower(
    params: &[(&[usize], DType)],
    aliases: &[Option<usize>],
    nodes: &[LowerNode<'_>],
    outputs: &[usize],
    precision: Precision,
    layout: Option<&MeshLayout<'_>>,
) -> Result<String> {
    let mut e = Emitter {
        body: String::new(),
        next: 0,
        precision: match precision {
            Precision::Highest => "HIGHEST",
            Precision::Default => "DEFAULT",
        },
        mesh: layout.map(|l| l.mesh.clone()),
        shardy: layout.is_some_and(|l| l.shardy),
    };
    let pvals: Vec<V> = params
        .iter()
        .enumerate()
        .map(|(i, (s, d))| V {
            name: format!("%arg{i}"),
            shape: s.to_vec(),
            dt: *d,
        })
        .collect();
    let mut vals: Vec<V> = Vec::with_capacity(nodes.len());
    for n in nodes {
        let ins: Vec<V> = n
            .inputs
            .iter()
            .map(|r| match *r {
                Ref::Param(i) => pvals[i].clone(),
                Ref::Node(i) => vals[i].clone(),
            })
            .collect();
        let v = lower_node(&mut e, n.op, &ins, n.shape, n.dtype)?;
        debug_assert_eq!(v.shape, n.shape, "{:?}", n.op);
        vals.push(v);
    }
    let mut text = String::with_capacity(e.body.len() + 512);
    let _ = writeln!(
        text,
        "module @zoo_graph attributes {{mhlo.num_partitions = {} : i32, mhlo.num_replicas = 1 : i32}} {{",
        layout.map_or(1, |l| l.mesh.len())
    );
    if let Some(l) = layout.filter(|l| l.shardy) {
        let _ = writeln!(text, "  sdy.mesh @mesh = {}", l.mesh.shardy());
    }
    // A donated parameter names the output that reuses its buffer; over a mesh, every
    // parameter and result says how it is laid out (XLA's SPMD partitioner reads them).
    let sharding = |ids: Option<&[u32]>, i: usize, rank: usize| {
        layout.zip(ids).map(|(l, ids)| {
            let id = ids.get(i).copied().unwrap_or(0);
            match l.shardy {
                true => format!("sdy.sharding = {}", super::shard::shardy(&l.mesh, id, rank)),
                false => format!("mhlo.sharding = \"{}\"", super::shard::gspmd(&l.mesh, id)),
            }
        })
    };
    let attrs = |parts: [Option<String>; 2]| {
        let parts: Vec<String> = parts.into_iter().flatten().collect();
        if parts.is_empty() {
            String::new()
        } else {
            format!(" {{{}}}", parts.join(", "))
        }
    };
    let args: Vec<String> = pvals
        .iter()
        .zip(aliases.iter().chain(std::iter::repeat(&None)))
        .enumerate()
        .map(|(i, (p, a))| {
            let alias = a.map(|o| format!("tf.aliasing_output = {o} : i32"));
            let shard = sharding(layout.map(|l| l.params), i, p.shape.len());
            format!("{}: {}{}", p.name, p.ty(), attrs([alias, shard]))
        })
        .collect();
    let outs: Vec<&V> = outputs.iter().map(|&i| &vals[i]).collect();
    let out_tys: Vec<String> = outs.iter().map(|v| v.ty()).collect();
    let results: Vec<String> = out_tys
        .iter()
        .enumerate()
        .map(|(i, t)| {
            format!(
                "{t}{}",
                attrs([
                    sharding(layout.map(|l| l.outputs), i, outs[i].shape.len()),
                    None
                ])
            )
        })
        .collect();
    let _ = writeln!(
        text,
        "  func.func public @main({}) -> ({}) {{",
        args.join(", "),
        results.join(", ")
    );
    text.push_str(&e.body);
    let names: Vec<&str> = outs.iter().map(|v| v.name.as_str()).collect();
    let _ = writeln!(
        text,
        "    \"func.return\"({}) : ({}) -> ()",
        names.join(", "),
        out_tys.join(", ")
    );
    text.push_str("  }\n}\n");
    Ok(text)
}

fn unsupported(op: &'static str, dt: DType, hint: &str) -> Error {
    Error::UnsupportedDType {
        op,
        dtype: dt,
        hint: format!("; {hint}"),
    }
}

fn lower_node(e: &mut Emitter, op: &NodeOp, ins: &[V], shape: &[usize], dt: DType) -> Result<V> {
    let op = match op {
        NodeOp::Leaf => {
            return Err(Error::InvalidArgument {
                op: "lower",
                msg: "a leaf has no computation (internal: leaves are parameters)".into(),
            })
        }
        NodeOp::Full(v) => return Ok(e.full(*v, shape, dt)),
        NodeOp::Iota { start, step } => {
            let ct = match dt {
                DType::F64 => DType::F64,
                d if d.is_float() => DType::F32,
                _ => DType::I64,
            };
            let i = e.iota(shape, 0, ct);
            let st = e.full(*step, shape, ct);
            let scaled = e.same("stablehlo.multiply", &[&i, &st]);
            let s0 = e.full(*start, shape, ct);
            let v = e.same("stablehlo.add", &[&scaled, &s0]);
            return Ok(e.convert(&v, dt));
        }
        NodeOp::Op(op) => op,
    };
    let x = &ins[0];
    Ok(match op {
        Op::Unary(u) => unary(e, *u, x)?,
        Op::Binary(b) => {
            let a = e.bcast(x, shape);
            let c = e.bcast(&ins[1], shape);
            if dt == DType::Bool {
                match b {
                    BinaryOp::Maximum | BinaryOp::Add => e.same("stablehlo.or", &[&a, &c]),
                    BinaryOp::Minimum | BinaryOp::Mul => e.same("stablehlo.and", &[&a, &c]),
                    _ => {
                        return Err(unsupported(
                            "binary",
                            dt,
                            "bool tensors only take logical ops",
                        ))
                    }
                }
            } else if *b == BinaryOp::Pow && is16(dt) {
                let (af, cf) = (e.convert(&a, DType::F32), e.convert(&c, DType::F32));
                let r = e.same("stablehlo.power", &[&af, &cf]);
                e.convert(&r, dt)
            } else {
                let name = match b {
                    BinaryOp::Add => "stablehlo.add",
                    BinaryOp::Sub => "stablehlo.subtract",
                    BinaryOp::Mul => "stablehlo.multiply",
                    BinaryOp::Div => "stablehlo.divide",
                    BinaryOp::Maximum => "stablehlo.maximum",
                    BinaryOp::Minimum => "stablehlo.minimum",
                    BinaryOp::Pow => "stablehlo.power",
                };
                e.same(name, &[&a, &c])
            }
        }
        Op::Compare(c) => {
            let a = e.bcast(x, shape);
            let b = e.bcast(&ins[1], shape);
            let dir = match c {
                CmpOp::Eq => "EQ",
                CmpOp::Ne => "NE",
                CmpOp::Lt => "LT",
                CmpOp::Le => "LE",
                CmpOp::Gt => "GT",
                CmpOp::Ge => "GE",
            };
            e.compare(dir, &a, &b)
        }
        Op::Affine { mul, add } => {
            let mut v = x.clone();
            if *mul != 1.0 {
                let m = e.full(*mul, shape, dt);
                v = e.same("stablehlo.multiply", &[&v, &m]);
            }
            if *add != 0.0 {
                let a = e.full(*add, shape, dt);
                v = e.same("stablehlo.add", &[&v, &a]);
            }
            v
        }
        Op::PowScalar(p) => {
            let ct = if is16(dt) { DType::F32 } else { dt };
            let xf = e.convert(x, ct);
            let c = e.full(*p, shape, ct);
            let r = e.same("stablehlo.power", &[&xf, &c]);
            e.convert(&r, dt)
        }
        Op::Clamp { min, max } => {
            let lo = e.constant(*min, dt);
            let hi = e.constant(*max, dt);
            e.op("stablehlo.clamp", &[&lo, x, &hi], "", shape, dt)
        }
        Op::Where => {
            let c = e.bcast(x, shape);
            let a = e.bcast(&ins[1], shape);
            let b = e.bcast(&ins[2], shape);
            e.select(&c, &a, &b)
        }
        Op::Cast(to) => {
            if x.dt == *to {
                x.clone()
            } else if *to == DType::Bool {
                let z = e.full(0.0, shape, x.dt);
                e.compare("NE", x, &z)
            } else {
                e.convert(x, *to)
            }
        }
        Op::Matmul => matmul(e, x, &ins[1], shape, dt),
        // keepdim only changes the final shape, which the reshape to `shape` applies.
        Op::Reduce { op, dims, .. } => {
            if dims.is_empty() {
                return Ok(x.clone());
            }
            let (init, body) = match (op, dt) {
                (ReduceOp::Sum, DType::Bool) => (0.0, "stablehlo.or"),
                (ReduceOp::Sum, _) => (0.0, "stablehlo.add"),
                (ReduceOp::Max, DType::Bool) => (0.0, "stablehlo.or"),
                (ReduceOp::Min, DType::Bool) => (1.0, "stablehlo.and"),
                (ReduceOp::Max, _) => (lowest(dt), "stablehlo.maximum"),
                (ReduceOp::Min, _) => (highest(dt), "stablehlo.minimum"),
            };
            let i = e.constant(init, dt);
            let mut sorted = dims.clone();
            sorted.sort_unstable();
            let r = e.reduce(x, &i, body, &sorted);
            e.reshape(&r, shape)
        }
        Op::ArgReduce { max, dim, .. } => argreduce(e, x, *max, *dim, shape),
        Op::ArgSortLastDim { descending } => argsort(e, x, *descending),
        Op::Reshape(_) => e.reshape(x, shape),
        Op::Permute(p) => e.transpose(x, p),
        Op::Broadcast(_) => e.bcast(x, shape),
        Op::Narrow { dim, start, len } => {
            let mut s = vec![0; x.shape.len()];
            let mut l = x.shape.clone();
            s[*dim] = *start;
            l[*dim] = start + len;
            e.slice(x, &s, &l)
        }
        Op::IndexSelect { dim } => e.take(x, &ins[1], *dim),
        Op::Gather { dim } => {
            let idx = &ins[1];
            let r = x.shape.len();
            let mut cshape = idx.shape.clone();
            cshape.push(1);
            let mut coords = Vec::with_capacity(r);
            for d in 0..r {
                if d == *dim {
                    let i = e.convert(idx, DType::I64);
                    coords.push(e.reshape(&i, &cshape));
                } else {
                    coords.push(e.iota(&cshape, d, DType::I64));
                }
            }
            let mut full = idx.shape.clone();
            full.push(r);
            let refs: Vec<&V> = coords.iter().collect();
            let cat = e.op(
                "stablehlo.concatenate",
                &refs,
                &format!("{{dimension = {} : i64}}", idx.shape.len()),
                &full,
                DType::I64,
            );
            let all = list(0..r);
            let attrs = format!(
                "{{dimension_numbers = #stablehlo.gather<collapsed_slice_dims = {all}, start_index_map = {all}, index_vector_dim = {}>, indices_are_sorted = false, slice_sizes = {}}}",
                idx.shape.len(),
                arr(std::iter::repeat_n(1, r))
            );
            e.op("stablehlo.gather", &[x, &cat], &attrs, shape, dt)
        }
        Op::Concat { dim } => {
            let refs: Vec<&V> = ins.iter().collect();
            e.op(
                "stablehlo.concatenate",
                &refs,
                &format!("{{dimension = {dim} : i64}}"),
                shape,
                dt,
            )
        }
        Op::DynamicSlice { sizes } => {
            let starts = e.starts(&ins[1]);
            let mut args: Vec<&V> = vec![x];
            args.extend(starts.iter());
            let attrs = format!("{{slice_sizes = {}}}", arr(sizes.iter().copied()));
            e.op("stablehlo.dynamic_slice", &args, &attrs, shape, dt)
        }
        Op::DynamicUpdateSlice => {
            let starts = e.starts(&ins[2]);
            let mut args: Vec<&V> = vec![x, &ins[1]];
            args.extend(starts.iter());
            let u = e.op("stablehlo.dynamic_update_slice", &args, "", shape, dt);
            // Readers see the update through a barrier. Without it XLA fuses the update into
            // every reader (a decode step's score and value products become fusions), and
            // then copies the donated buffer so the duplicates do not write over each other:
            // four copies of each layer's cache per step on the XLA CPU plugin. Behind the
            // barrier the update runs once, in place.
            e.same("stablehlo.optimization_barrier", &[&u])
        }
        Op::IndexCopy { dim } => {
            // A scatter whose update windows are whole slices but along `dim`, one per index;
            // the region keeps the update. Readers see it through a barrier, as after a
            // `dynamic_update_slice` (the paged KV-cache write, updated in place).
            let (idx, src) = (&ins[1], &ins[2]);
            let i = e.convert(idx, DType::I64);
            let i = e.reshape(&i, &[idx.shape[0], 1]);
            let r = x.shape.len();
            let window: Vec<usize> = (0..r).filter(|d| d != dim).collect();
            let u = e.scatter(x, &i, src, &window, *dim);
            e.same("stablehlo.optimization_barrier", &[&u])
        }
        Op::Conv2d(g) => {
            let ct = if is16(dt) { DType::F32 } else { dt };
            let (xf, wf) = (e.convert(x, ct), e.convert(&ins[1], ct));
            let p = g.padding as i64;
            let y = e.conv((&xf, &wf), g, 1, g.stride, [(p, p), (p, p)], shape);
            let y = V { dt: ct, ..y };
            e.convert(&y, dt)
        }
        Op::ConvTranspose2d(g) => {
            // A transposed convolution is a convolution over the input dilated by the
            // stride, with the kernel flipped and its in/out channels swapped per group.
            let ct = if is16(dt) { DType::F32 } else { dt };
            let (xf, wf) = (e.convert(x, ct), e.convert(&ins[1], ct));
            let (c, og, kh, kw) = (wf.shape[0], wf.shape[1], wf.shape[2], wf.shape[3]);
            let gr = g.groups;
            let w5 = e.reshape(&wf, &[gr, c / gr, og, kh, kw]);
            let w5 = e.transpose(&w5, &[0, 2, 1, 3, 4]);
            let w4 = e.reshape(&w5, &[gr * og, c / gr, kh, kw]);
            let wr = e.op(
                "stablehlo.reverse",
                &[&w4],
                "{dimensions = array<i64: 2, 3>}",
                &[gr * og, c / gr, kh, kw],
                ct,
            );
            let pad = |k: usize| {
                let lo = (g.dilation * (k - 1)) as i64 - g.padding as i64;
                (lo, lo + g.output_padding as i64)
            };
            let y = e.conv((&xf, &wr), g, g.stride, 1, [pad(kh), pad(kw)], shape);
            let y = V { dt: ct, ..y };
            e.convert(&y, dt)
        }
        Op::UpsampleNearest2d { h, w } => {
            // Source index floor(dst * in / out), clamped, as candle's CPU kernel computes it.
            let idx = |dst: usize, src: usize| -> Vec<i64> {
                let scale = src as f64 / dst as f64;
                (0..dst)
                    .map(|i| ((i as f64 * scale) as usize).min(src - 1) as i64)
                    .collect()
            };
            let hi = e.constant_i64s(&idx(*h, x.shape[2]));
            let y = e.take(x, &hi, 2);
            let wi = e.constant_i64s(&idx(*w, x.shape[3]));
            e.take(&y, &wi, 3)
        }
        Op::Contiguous => x.clone(),
        Op::Shard(id) => {
            let Some(mesh) = e.mesh.clone() else {
                return Err(Error::InvalidArgument {
                    op: "shard",
                    msg: "a sharding outside a program over a mesh (internal error)".into(),
                });
            };
            if e.shardy {
                let attrs = format!(
                    "{{sharding = {}}}",
                    super::shard::shardy(&mesh, *id, x.shape.len())
                );
                return Ok(e.op(
                    "sdy.sharding_constraint",
                    &[x],
                    &attrs,
                    &x.shape.clone(),
                    x.dt,
                ));
            }
            let attrs = format!(
                "{{call_target_name = \"Sharding\", mhlo.sharding = \"{}\"}}",
                super::shard::gspmd(&mesh, *id)
            );
            e.op(
                "stablehlo.custom_call",
                &[x],
                &attrs,
                &x.shape.clone(),
                x.dt,
            )
        }
        Op::Composite(Composite::Attention(a)) => attention(e, a, ins)?,
        Op::Composite(c) => {
            let refs: Vec<&V> = ins.iter().collect();
            c.expand(e, &refs)?
        }
    })
}

/// The most f32 attention scores one query chunk materialises (64 MiB).
const MAX_CHUNK_SCORES: usize = 16 << 20;

/// How attention over `lq` queries, each with `per_query` scores (batch x heads x keys),
/// splits into query chunks: `(chunks, rows per chunk)`, one chunk when the scores fit.
pub(crate) fn query_chunks(lq: usize, per_query: usize) -> (usize, usize) {
    let rows = (MAX_CHUNK_SCORES / per_query.max(1)).max(1);
    if lq <= rows {
        return (1, lq);
    }
    let chunks = lq.div_ceil(rows);
    (chunks, lq.div_ceil(chunks))
}

/// Attention whose scores would exceed [`MAX_CHUNK_SCORES`] runs as a `while` loop over
/// query chunks: each iteration slices its queries (and masks that vary along them), runs the
/// whole expansion and writes its rows of the output. A query's scores, softmax and output
/// depend on no other query, so the result is the same. Without it a 64x64-latent UNet
/// materialises [2, 8, 4096, 4096] f32 scores (1 GiB, and XLA takes a program's temporaries
/// as fresh pages on every execution), SDXL's 128x128 latents 40 GiB. A loop keeps the
/// program one chunk long at any size; the last chunk's start is clamped (as
/// `dynamic_slice` does), so it recomputes a few rows rather than needing `rows | Lq`.
fn attention(e: &mut Emitter, a: &Attention, ins: &[V]) -> Result<V> {
    let c = Composite::Attention(*a);
    let refs: Vec<&V> = ins.iter().collect();
    let (q, k, v) = (&ins[0].shape, &ins[1].shape, &ins[2].shape);
    if q.len() != 4 || k.len() != 4 || v.len() != 4 {
        return c.expand(e, &refs);
    }
    let lq = q[2];
    let (chunks, rows) = query_chunks(lq, q[0] * q[1] * k[2]);
    if chunks == 1 {
        return c.expand(e, &refs);
    }
    let dt = ins[0].dt;
    let out_shape = [q[0], q[1], lq, v[3]];
    // Carried through the loop: the chunk number, the output, then every input unchanged.
    let counter = e.constant(0.0, DType::I64);
    let acc = e.full(0.0, &out_shape, dt);
    let carried: Vec<&V> = [&counter, &acc].into_iter().chain(ins).collect();
    let tys: Vec<String> = carried.iter().map(|v| v.ty()).collect();
    let tys = tys.join(", ");
    let names: Vec<&str> = carried.iter().map(|v| v.name.as_str()).collect();
    let w = e.fresh();
    let block = |e: &mut Emitter, tag: &str| -> Vec<V> {
        let args: Vec<V> = carried
            .iter()
            .enumerate()
            .map(|(i, v)| V {
                name: region_arg(&w, &format!("{tag}{i}")),
                shape: v.shape.clone(),
                dt: v.dt,
            })
            .collect();
        let decl: Vec<String> = args
            .iter()
            .map(|a| format!("{}: {}", a.name, a.ty()))
            .collect();
        let _ = writeln!(e.body, "    ^bb0({}):", decl.join(", "));
        args
    };
    let _ = writeln!(
        e.body,
        "    {w}:{} = \"stablehlo.while\"({}) ({{",
        carried.len(),
        names.join(", ")
    );
    let args = block(e, "c");
    let limit = e.constant(chunks as f64, DType::I64);
    let go = e.compare("LT", &args[0], &limit);
    let _ = writeln!(
        e.body,
        "      \"stablehlo.return\"({}) : (tensor<i1>) -> ()",
        go.name
    );
    let _ = writeln!(e.body, "    }}, {{");
    let args = block(e, "b");
    let per = e.constant(rows as f64, DType::I64);
    let start = e.same("stablehlo.multiply", &[&args[0], &per]);
    let zero = e.constant(0.0, DType::I64);
    // The chunk's slice of `x` along `dim`, or `x` itself.
    let slice = |e: &mut Emitter, x: &V, dim: usize| {
        let starts: Vec<&V> = (0..x.shape.len())
            .map(|d| if d == dim { &start } else { &zero })
            .collect();
        let mut sizes = x.shape.clone();
        sizes[dim] = rows;
        let mut operands = vec![x];
        operands.extend(starts);
        let attrs = format!("{{slice_sizes = {}}}", arr(sizes.iter().copied()));
        e.op("stablehlo.dynamic_slice", &operands, &attrs, &sizes, x.dt)
    };
    let mut part = Vec::with_capacity(ins.len());
    for (i, x) in args[2..].iter().enumerate() {
        // q's queries are dim 2, a mask's its second-to-last dim unless it broadcasts there.
        let r = x.shape.len();
        part.push(match i {
            0 => slice(e, x, 2),
            3.. if r >= 2 && x.shape[r - 2] == lq => slice(e, x, r - 2),
            _ => x.clone(),
        });
    }
    let refs: Vec<&V> = part.iter().collect();
    let out = c.expand(e, &refs)?;
    let at = [&zero, &zero, &start, &zero];
    let acc = e.op(
        "stablehlo.dynamic_update_slice",
        &[&args[1], &out, at[0], at[1], at[2], at[3]],
        "",
        &out_shape,
        dt,
    );
    let one = e.constant(1.0, DType::I64);
    let next = e.same("stablehlo.add", &[&args[0], &one]);
    let back: Vec<&str> = [next.name.as_str(), acc.name.as_str()]
        .into_iter()
        .chain(args[2..].iter().map(|a| a.name.as_str()))
        .collect();
    let _ = writeln!(
        e.body,
        "      \"stablehlo.return\"({}) : ({tys}) -> ()",
        back.join(", ")
    );
    let _ = writeln!(e.body, "    }}) : ({tys}) -> ({tys})");
    Ok(V {
        name: format!("{w}#1"),
        shape: out_shape.to_vec(),
        dt,
    })
}

fn lowest(dt: DType) -> f64 {
    match dt {
        DType::I64 => i64::MIN as f64,
        DType::I32 => i32::MIN as f64,
        DType::U8 => 0.0,
        _ => f64::NEG_INFINITY,
    }
}

fn highest(dt: DType) -> f64 {
    match dt {
        DType::I64 => i64::MAX as f64,
        DType::I32 => i32::MAX as f64,
        DType::U8 => 255.0,
        _ => f64::INFINITY,
    }
}

fn unary(e: &mut Emitter, u: UnaryOp, x: &V) -> Result<V> {
    let dt = x.dt;
    if !dt.is_float() {
        return match u {
            UnaryOp::Neg => Ok(e.same("stablehlo.negate", &[x])),
            UnaryOp::Abs => Ok(e.same("stablehlo.abs", &[x])),
            UnaryOp::Floor | UnaryOp::Ceil => Ok(x.clone()),
            _ => Err(unsupported(
                "unary",
                dt,
                &format!("{u:?} needs a float input"),
            )),
        };
    }
    let simple = match u {
        UnaryOp::Neg => Some("stablehlo.negate"),
        UnaryOp::Abs => Some("stablehlo.abs"),
        UnaryOp::Floor => Some("stablehlo.floor"),
        UnaryOp::Ceil => Some("stablehlo.ceil"),
        _ => None,
    };
    if let Some(name) = simple {
        return Ok(e.same(name, &[x]));
    }
    // Transcendentals on 16-bit floats run in f32 and round once.
    let ct = if is16(dt) { DType::F32 } else { dt };
    let xf = e.convert(x, ct);
    let s = xf.shape.clone();
    let r = match u {
        UnaryOp::Exp => e.same("stablehlo.exponential", &[&xf]),
        UnaryOp::Log => e.same("stablehlo.log", &[&xf]),
        UnaryOp::Sin => e.same("stablehlo.sine", &[&xf]),
        UnaryOp::Cos => e.same("stablehlo.cosine", &[&xf]),
        UnaryOp::Tanh => e.same("stablehlo.tanh", &[&xf]),
        UnaryOp::Sqrt => e.same("stablehlo.sqrt", &[&xf]),
        UnaryOp::Erf => e.same("chlo.erf", &[&xf]),
        UnaryOp::Recip => {
            let one = e.full(1.0, &s, ct);
            e.same("stablehlo.divide", &[&one, &xf])
        }
        UnaryOp::Silu => {
            let sg = e.same("stablehlo.logistic", &[&xf]);
            e.same("stablehlo.multiply", &[&xf, &sg])
        }
        UnaryOp::GeluErf => {
            let c = e.full(std::f64::consts::FRAC_1_SQRT_2, &s, ct);
            let t = e.same("stablehlo.multiply", &[&xf, &c]);
            let er = e.same("chlo.erf", &[&t]);
            gelu_tail(e, &xf, &er)
        }
        UnaryOp::GeluTanh => {
            let x3 = e.same("stablehlo.multiply", &[&xf, &xf]);
            let x3 = e.same("stablehlo.multiply", &[&x3, &xf]);
            let k = e.full(0.044715, &s, ct);
            let t = e.same("stablehlo.multiply", &[&x3, &k]);
            let t = e.same("stablehlo.add", &[&xf, &t]);
            let c = e.full((2.0 / std::f64::consts::PI).sqrt(), &s, ct);
            let t = e.same("stablehlo.multiply", &[&t, &c]);
            let th = e.same("stablehlo.tanh", &[&t]);
            gelu_tail(e, &xf, &th)
        }
        UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Floor | UnaryOp::Ceil => {
            unreachable!("handled above")
        }
    };
    Ok(e.convert(&r, dt))
}

/// `0.5 x (1 + t)`.
fn gelu_tail(e: &mut Emitter, x: &V, t: &V) -> V {
    let s = x.shape.clone();
    let one = e.full(1.0, &s, x.dt);
    let half = e.full(0.5, &s, x.dt);
    let p = e.same("stablehlo.add", &[t, &one]);
    let hx = e.same("stablehlo.multiply", &[x, &half]);
    e.same("stablehlo.multiply", &[&hx, &p])
}

fn matmul(e: &mut Emitter, a: &V, b: &V, shape: &[usize], dt: DType) -> V {
    // 16-bit operands contract into f32 (bf16 x bf16 -> f32 is the TPU MXU's native form),
    // rounded once at the end as candle's bf16 GEMM does.
    let acc = if is16(dt) { DType::F32 } else { dt };
    let (ra, rb) = (a.shape.len(), b.shape.len());
    let (k, n) = (b.shape[rb - 2], b.shape[rb - 1]);
    let batch_b: usize = b.shape[..rb - 2].iter().product();
    let r = if batch_b == 1 {
        // One right-hand matrix (a Linear weight): contract without batch dims, so the
        // weight is never broadcast over the batch.
        let b2 = e.reshape(b, &[k, n]);
        let mut out: Vec<usize> = a.shape[..ra - 1].to_vec();
        out.push(n);
        let dims = format!(
            "lhs_contracting_dimensions = [{}], rhs_contracting_dimensions = [0]",
            ra - 1
        );
        let y = e.dot(a, &b2, &dims, &out, acc);
        e.reshape(&y, shape)
    } else {
        let nb = shape.len() - 2;
        let batch = &shape[..nb];
        let mut sa = batch.to_vec();
        sa.extend([a.shape[ra - 2], a.shape[ra - 1]]);
        let mut sb = batch.to_vec();
        sb.extend([k, n]);
        let a2 = e.bcast(a, &sa);
        let b2 = e.bcast(b, &sb);
        let bd = list(0..nb);
        let dims = format!("lhs_batching_dimensions = {bd}, rhs_batching_dimensions = {bd}, lhs_contracting_dimensions = [{}], rhs_contracting_dimensions = [{}]", nb + 1, nb);
        e.dot(&a2, &b2, &dims, shape, acc)
    };
    e.convert(&r, dt)
}

fn argreduce(e: &mut Emitter, x: &V, max: bool, dim: usize, shape: &[usize]) -> V {
    let dt = x.dt;
    let idx = e.iota(&x.shape, dim, DType::I64);
    let init_v = e.constant(if max { lowest(dt) } else { highest(dt) }, dt);
    let init_i = e.constant(0.0, DType::I64);
    let r = e.fresh();
    let out: Vec<usize> = x
        .shape
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != dim)
        .map(|(_, &d)| d)
        .collect();
    let (st, it) = (ty(&[], dt), ty(&[], DType::I64));
    let (av, ai, bv, bi) = (
        region_arg(&r, "av"),
        region_arg(&r, "ai"),
        region_arg(&r, "bv"),
        region_arg(&r, "bi"),
    );
    let _ = writeln!(
        e.body,
        "    {r}:2 = \"stablehlo.reduce\"({}, {}, {}, {}) ({{",
        x.name, idx.name, init_v.name, init_i.name
    );
    let _ = writeln!(
        e.body,
        "    ^bb0({av}: {st}, {ai}: {it}, {bv}: {st}, {bi}: {it}):"
    );
    let mk = |name: &str, d: DType| V {
        name: name.to_string(),
        shape: vec![],
        dt: d,
    };
    let (va, ia, vb, ib) = (
        mk(&av, dt),
        mk(&ai, DType::I64),
        mk(&bv, dt),
        mk(&bi, DType::I64),
    );
    // Keep `a` when it is strictly better, or equal with the lower index (first on ties).
    let better = e.compare(if max { "GT" } else { "LT" }, &va, &vb);
    let eq = e.compare("EQ", &va, &vb);
    let lower = e.compare("LT", &ia, &ib);
    let tie = e.same("stablehlo.and", &[&eq, &lower]);
    let pick = e.same("stablehlo.or", &[&better, &tie]);
    let v = e.select(&pick, &va, &vb);
    let i = e.select(&pick, &ia, &ib);
    let _ = writeln!(
        e.body,
        "      \"stablehlo.return\"({}, {}) : ({st}, {it}) -> ()",
        v.name, i.name
    );
    let _ = writeln!(
        e.body,
        "    }}) {{dimensions = array<i64: {dim}>}} : ({}, {}, {st}, {it}) -> ({}, {})",
        x.ty(),
        idx.ty(),
        ty(&out, dt),
        ty(&out, DType::I64)
    );
    let res = V {
        name: format!("{r}#1"),
        shape: out,
        dt: DType::I64,
    };
    e.reshape(&res, shape)
}

fn argsort(e: &mut Emitter, x: &V, descending: bool) -> V {
    let last = x.shape.len() - 1;
    let idx = e.iota(&x.shape, last, DType::I64);
    let r = e.fresh();
    let (st, it) = (ty(&[], x.dt), ty(&[], DType::I64));
    let (a, b, c, d) = (
        region_arg(&r, "a"),
        region_arg(&r, "b"),
        region_arg(&r, "c"),
        region_arg(&r, "d"),
    );
    let _ = writeln!(
        e.body,
        "    {r}:2 = \"stablehlo.sort\"({}, {}) ({{",
        x.name, idx.name
    );
    let _ = writeln!(
        e.body,
        "    ^bb0({a}: {st}, {b}: {st}, {c}: {it}, {d}: {it}):"
    );
    let va = V {
        name: a,
        shape: vec![],
        dt: x.dt,
    };
    let vb = V {
        name: b,
        shape: vec![],
        dt: x.dt,
    };
    let p = e.compare(if descending { "GT" } else { "LT" }, &va, &vb);
    let _ = writeln!(
        e.body,
        "      \"stablehlo.return\"({}) : (tensor<i1>) -> ()",
        p.name
    );
    let _ = writeln!(
        e.body,
        "    }}) {{dimension = {last} : i64, is_stable = true}} : ({}, {}) -> ({}, {})",
        x.ty(),
        idx.ty(),
        x.ty(),
        idx.ty()
    );
    V {
        name: format!("{r}#1"),
        shape: x.shape.clone(),
        dt: DType::I64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literals_are_exact_bit_patterns() {
        assert_eq!(literal(1.0, DType::F32), "0x3F800000");
        assert_eq!(literal(f64::NEG_INFINITY, DType::BF16), "0xFF80");
        assert_eq!(literal(f64::INFINITY, DType::F16), "0x7C00");
        assert_eq!(literal(i64::MIN as f64, DType::I64), i64::MIN.to_string());
        assert_eq!(literal(1.0, DType::Bool), "true");
        assert_eq!(ty(&[], DType::U8), "tensor<ui8>");
        assert_eq!(ty(&[2, 3], DType::Bool), "tensor<2x3xi1>");
    }

    #[test]
    fn a_graph_lowers_to_one_main_function() {
        let add = NodeOp::Op(Op::Binary(BinaryOp::Add));
        let nodes = [LowerNode {
            op: &add,
            shape: &[2, 3],
            dtype: DType::F32,
            inputs: &[Ref::Param(0), Ref::Param(1)],
        }];
        let params: [(&[usize], DType); 2] = [(&[2, 3], DType::F32), (&[3], DType::F32)];
        let text = lower(&params, &[], &nodes, &[0], Precision::Default, None).expect("lowers");
        assert!(text.contains("func.func public @main(%arg0: tensor<2x3xf32>, %arg1: tensor<3xf32>) -> (tensor<2x3xf32>)"), "{text}");
        // A donated parameter carries the output it is aliased to.
        let donated = lower(
            &params,
            &[Some(0), None],
            &nodes,
            &[0],
            Precision::Default,
            None,
        )
        .expect("lowers");
        assert!(donated.contains("func.func public @main(%arg0: tensor<2x3xf32> {tf.aliasing_output = 0 : i32}, %arg1: tensor<3xf32>)"), "{donated}");
        assert!(text.contains("stablehlo.broadcast_in_dim"), "{text}");
        assert!(text.contains("\"func.return\"(%2)"), "{text}");
    }
}
