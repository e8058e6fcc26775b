//! Device meshes and tensor shardings: the layout an SPMD program's parameters and results
//! take over several devices.
//!
//! A [`Mesh`] names axes over device ordinals (`data` × `model`, row-major, as
//! `jax.sharding.Mesh` lays its device array out). A [`Sharding`] says, per tensor
//! dimension, which mesh axis splits it (or none); the mesh axes no dimension uses replicate
//! the tensor. Each device holds one tile, the tensor's shape divided along the split
//! dimensions. [`Sharding::gspmd`] writes the layout as the `mhlo.sharding` attribute XLA's
//! SPMD partitioner reads; [`Sharding::split`] cuts a host tensor into each device's tile,
//! and [`Sharding::assemble`] puts the tiles of a result back together.

use super::DeviceMapError;

/// Named axes over device ordinals: the devices in row-major order of the axes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mesh {
    axes: Vec<(String, usize)>,
    devices: Vec<usize>,
}

impl Mesh {
    /// A mesh of `axes` (name, size) over `devices`, which must number the product of the
    /// sizes, each once.
    pub fn new(axes: &[(&str, usize)], devices: &[usize]) -> Result<Mesh, DeviceMapError> {
        let refuse = |why: String| bad(format!("mesh: {why}"));
        let size = axes.iter().try_fold(1usize, |n, (_, s)| n.checked_mul(*s));
        if axes.is_empty() || axes.iter().any(|(_, s)| *s == 0) {
            return Err(refuse(
                "give at least one axis, each of at least one device".into(),
            ));
        }
        if size != Some(devices.len()) {
            return Err(refuse(format!(
                "axes {} hold {} devices, but {} were given",
                axes.iter()
                    .map(|(n, s)| format!("{n}={s}"))
                    .collect::<Vec<_>>()
                    .join(" x "),
                size.map_or("more than 2^64".into(), |s| s.to_string()),
                devices.len()
            )));
        }
        for (i, (name, _)) in axes.iter().enumerate() {
            if name.is_empty() || axes[..i].iter().any(|(n, _)| n == name) {
                return Err(refuse(format!(
                    "axis names must be distinct and not empty ({name:?})"
                )));
            }
        }
        let mut seen = devices.to_vec();
        seen.sort_unstable();
        if seen.windows(2).any(|w| w[0] == w[1]) {
            return Err(refuse("a device appears twice".into()));
        }
        Ok(Mesh {
            axes: axes.iter().map(|(n, s)| (n.to_string(), *s)).collect(),
            devices: devices.to_vec(),
        })
    }

    /// Devices in the mesh.
    pub fn len(&self) -> usize {
        self.devices.len()
    }

    /// Whether the mesh has no device (never: [`Mesh::new`] refuses that).
    pub fn is_empty(&self) -> bool {
        self.devices.is_empty()
    }

    /// The device ordinals in row-major order of the axes: partition `i` of an SPMD
    /// program runs on `devices()[i]`.
    pub fn devices(&self) -> &[usize] {
        &self.devices
    }

    /// The axes, (name, size).
    pub fn axes(&self) -> impl Iterator<Item = (&str, usize)> {
        self.axes.iter().map(|(n, s)| (n.as_str(), *s))
    }

    fn axis(&self, name: &str) -> Result<usize, DeviceMapError> {
        self.axes
            .iter()
            .position(|(n, _)| n == name)
            .ok_or_else(|| {
                bad(format!(
                    "sharding: the mesh has no axis {name:?} (it has {})",
                    self.axes
                        .iter()
                        .map(|(n, _)| n.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ))
            })
    }

    /// The mesh as Shardy declares it (`sdy.mesh @m = <["data"=2, "model"=2]>`): its axes in
    /// order, logical devices `0..len` in row-major order, so logical device `i` is
    /// partition `i`, [`Mesh::devices`]`()[i]`.
    pub fn shardy(&self) -> String {
        let axes: Vec<String> = self
            .axes
            .iter()
            .map(|(n, s)| format!("{}={s}", quoted(n)))
            .collect();
        format!("<[{}]>", axes.join(", "))
    }

    /// Mesh coordinates of the `i`-th device (row-major).
    fn coords(&self, mut i: usize) -> Vec<usize> {
        let mut c = vec![0; self.axes.len()];
        for (a, (_, size)) in self.axes.iter().enumerate().rev() {
            c[a] = i % size;
            i /= size;
        }
        c
    }
}

/// Per tensor dimension, the mesh axis that splits it (`None`: whole on every device).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sharding {
    dims: Vec<Option<usize>>,
}

impl Sharding {
    /// Dimension `i` split along mesh axis `dims[i]` (by name; `None` keeps it whole). An
    /// axis splits at most one dimension.
    pub fn new(mesh: &Mesh, dims: &[Option<&str>]) -> Result<Sharding, DeviceMapError> {
        let dims: Vec<Option<usize>> = dims
            .iter()
            .map(|d| d.map(|name| mesh.axis(name)).transpose())
            .collect::<Result<_, _>>()?;
        let used: Vec<usize> = dims.iter().flatten().copied().collect();
        if used.iter().enumerate().any(|(i, a)| used[..i].contains(a)) {
            return Err(bad(
                "sharding: a mesh axis splits at most one dimension".into()
            ));
        }
        Ok(Sharding { dims })
    }

    /// Whole on every device.
    pub fn replicated(rank: usize) -> Sharding {
        Sharding {
            dims: vec![None; rank],
        }
    }

    /// Dimension `dim` of a rank-`rank` tensor split along mesh axis `axis`, the others
    /// whole.
    pub fn split_dim(
        mesh: &Mesh,
        rank: usize,
        dim: usize,
        axis: &str,
    ) -> Result<Sharding, DeviceMapError> {
        if dim >= rank {
            return Err(bad(format!(
                "sharding: dimension {dim} of a rank-{rank} tensor"
            )));
        }
        let mut dims = vec![None; rank];
        dims[dim] = Some(axis);
        Sharding::new(mesh, &dims)
    }

    /// Whether no dimension is split (every device holds the whole tensor).
    pub fn is_replicated(&self) -> bool {
        self.dims.iter().all(Option::is_none)
    }

    /// The tensor rank the sharding is for.
    pub fn rank(&self) -> usize {
        self.dims.len()
    }

    /// The mesh axis (its index) splitting each dimension.
    pub fn dims(&self) -> &[Option<usize>] {
        &self.dims
    }

    /// The shape of each device's tile of a tensor of `shape`, refused when a split
    /// dimension does not divide by its axis.
    pub fn tile_shape(&self, mesh: &Mesh, shape: &[usize]) -> Result<Vec<usize>, DeviceMapError> {
        if shape.len() != self.dims.len() {
            return Err(bad(format!(
                "sharding: {} dimensions named for a tensor of shape {shape:?}",
                self.dims.len()
            )));
        }
        shape
            .iter()
            .zip(&self.dims)
            .enumerate()
            .map(|(i, (&n, axis))| match axis {
                None => Ok(n),
                Some(a) => {
                    let Some((name, parts)) = mesh.axes.get(*a) else {
                        return Err(bad(format!(
                            "sharding: made for a mesh of more axes than this one's {}",
                            mesh.axes.len()
                        )));
                    };
                    if n % parts == 0 {
                        Ok(n / parts)
                    } else {
                        Err(bad(format!(
                            "sharding: dimension {i} of shape {shape:?} ({n}) does not divide into the {parts} devices of mesh axis {name:?}"
                        )))
                    }
                }
            })
            .collect()
    }

    /// The `mhlo.sharding` attribute XLA's SPMD partitioner reads:
    /// `{devices=[tiles…]ids}`, with `last_tile_dim_replicate` when a mesh axis splits no
    /// dimension, `{replicated}` when none splits any. The ids are partitions: partition `i`
    /// is the mesh's `i`-th device (the device assignment a program over the mesh is
    /// compiled with). A sharding made for another mesh is refused by
    /// [`Sharding::tile_shape`]; check it there first.
    pub fn gspmd(&self, mesh: &Mesh) -> String {
        if self.dims.iter().all(Option::is_none) {
            return "{replicated}".into();
        }
        // The tile array: one entry per tensor dimension (its axis' size, or 1), then the
        // unused axes together; its devices, the mesh transposed into that order.
        let unused: Vec<usize> = (0..mesh.axes.len())
            .filter(|a| !self.dims.contains(&Some(*a)))
            .collect();
        let mut tiles: Vec<usize> = self
            .dims
            .iter()
            .map(|d| d.and_then(|a| mesh.axes.get(a)).map_or(1, |(_, n)| *n))
            .collect();
        let replicate: usize = unused.iter().map(|&a| mesh.axes[a].1).product();
        if !unused.is_empty() {
            tiles.push(replicate);
        }
        let order: Vec<usize> = self
            .dims
            .iter()
            .flatten()
            .copied()
            .chain(unused.iter().copied())
            .collect();
        // Devices sorted by their coordinates along `order` (row-major).
        let mut ids: Vec<(Vec<usize>, usize)> = (0..mesh.len())
            .map(|i| {
                let c = mesh.coords(i);
                (
                    order
                        .iter()
                        .map(|&a| c.get(a).copied().unwrap_or(0))
                        .collect(),
                    i,
                )
            })
            .collect();
        ids.sort();
        let list = |v: &[usize]| {
            v.iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(",")
        };
        let devices: Vec<usize> = ids.into_iter().map(|(_, d)| d).collect();
        format!(
            "{{devices=[{}]{}{}}}",
            list(&tiles),
            list(&devices),
            if unused.is_empty() {
                ""
            } else {
                " last_tile_dim_replicate"
            }
        )
    }

    /// The dimension list of Shardy's `#sdy.sharding` over `mesh`: per dimension the axis
    /// that splits it (`{"model"}`) or none (`{}`); an axis that splits no dimension
    /// replicates over it, as Shardy reads an unnamed axis.
    pub fn shardy(&self, mesh: &Mesh) -> String {
        let dims: Vec<String> = self
            .dims
            .iter()
            .map(|d| match d.and_then(|a| mesh.axes.get(a)) {
                Some((name, _)) => format!("{{{}}}", quoted(name)),
                None => "{}".into(),
            })
            .collect();
        format!("[{}]", dims.join(", "))
    }

    /// The first element of each dimension of the `i`-th mesh device's tile.
    pub(crate) fn tile_origin(&self, mesh: &Mesh, i: usize, tile: &[usize]) -> Vec<usize> {
        let c = mesh.coords(i);
        self.dims
            .iter()
            .zip(tile)
            .map(|(axis, &t)| axis.map_or(0, |a| c[a] * t))
            .collect()
    }

    /// Each mesh device's tile of the row-major `data` of `shape`, in the mesh's device order.
    pub fn split<T: Copy>(
        &self,
        mesh: &Mesh,
        data: &[T],
        shape: &[usize],
    ) -> Result<Vec<Vec<T>>, DeviceMapError> {
        let tile = self.tile_shape(mesh, shape)?;
        if data.len() != shape.iter().product::<usize>() {
            return Err(bad(format!(
                "sharding: {} values for a tensor of shape {shape:?}",
                data.len()
            )));
        }
        Ok((0..mesh.len())
            .map(|i| {
                let origin = self.tile_origin(mesh, i, &tile);
                let mut out = Vec::with_capacity(tile.iter().product());
                for_each_index(&tile, |at| out.push(data[offset(shape, &origin, at)]));
                out
            })
            .collect())
    }

    /// The row-major tensor of `shape` whose tiles (in the mesh's device order) are
    /// `tiles`; a replicated part is read from the first device holding it.
    pub fn assemble<T: Copy + Default>(
        &self,
        mesh: &Mesh,
        tiles: &[Vec<T>],
        shape: &[usize],
    ) -> Result<Vec<T>, DeviceMapError> {
        let tile = self.tile_shape(mesh, shape)?;
        let per = tile.iter().product::<usize>();
        if tiles.len() != mesh.len() || tiles.iter().any(|t| t.len() != per) {
            return Err(bad(format!(
                "sharding: {} tiles for {} devices, each of shape {tile:?}",
                tiles.len(),
                mesh.len()
            )));
        }
        let mut out = vec![T::default(); shape.iter().product()];
        for (i, t) in tiles.iter().enumerate() {
            let origin = self.tile_origin(mesh, i, &tile);
            let mut k = 0;
            for_each_index(&tile, |at| {
                out[offset(shape, &origin, at)] = t[k];
                k += 1;
            });
        }
        Ok(out)
    }
}

fn bad(reason: String) -> DeviceMapError {
    DeviceMapError::BadSharding { reason }
}

/// Calls `f` with every index of `shape`, row-major.
fn for_each_index(shape: &[usize], mut f: impl FnMut(&[usize])) {
    if shape.contains(&0) {
        return;
    }
    let mut at = vec![0; shape.len()];
    loop {
        f(&at);
        let mut d = shape.len();
        loop {
            if d == 0 {
                return;
            }
            d -= 1;
            at[d] += 1;
            if at[d] < shape[d] {
                break;
            }
            at[d] = 0;
        }
    }
}

/// The row-major offset in `shape` of `origin + at`.
fn offset(shape: &[usize], origin: &[usize], at: &[usize]) -> usize {
    shape
        .iter()
        .zip(origin.iter().zip(at))
        .fold(0, |o, (&n, (&a, &b))| o * n + a + b)
}

/// `name` as an MLIR string literal (an axis name may hold any character).
fn quoted(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 2);
    out.push('"');
    for c in name.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            c if c.is_control() => {
                let mut utf8 = [0; 4];
                for b in c.encode_utf8(&mut utf8).bytes() {
                    out.push_str(&format!("\\{b:02X}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gspmd_attributes_follow_the_mesh() {
        let mesh = Mesh::new(&[("data", 2), ("model", 2)], &[0, 1, 2, 3]).unwrap();
        let s = |dims: &[Option<&str>]| Sharding::new(&mesh, dims).unwrap().gspmd(&mesh);
        assert_eq!(s(&[None, None]), "{replicated}");
        assert_eq!(s(&[Some("data"), Some("model")]), "{devices=[2,2]0,1,2,3}");
        assert_eq!(s(&[Some("model"), Some("data")]), "{devices=[2,2]0,2,1,3}");
        assert_eq!(
            s(&[None, Some("model")]),
            "{devices=[1,2,2]0,2,1,3 last_tile_dim_replicate}"
        );
        assert_eq!(
            s(&[Some("data"), None]),
            "{devices=[2,1,2]0,1,2,3 last_tile_dim_replicate}"
        );
        // Partitions, not device ordinals: partition i runs on the mesh's i-th device.
        let line = Mesh::new(&[("model", 4)], &[3, 2, 1, 0]).unwrap();
        let rows = Sharding::new(&line, &[Some("model"), None]).unwrap();
        assert_eq!(rows.gspmd(&line), "{devices=[4,1]0,1,2,3}");
    }

    #[test]
    fn shardy_names_the_axis_of_each_dimension() {
        let mesh = Mesh::new(&[("data", 2), ("model", 2)], &[3, 2, 1, 0]).unwrap();
        assert_eq!(mesh.shardy(), r#"<["data"=2, "model"=2]>"#);
        let s = |dims: &[Option<&str>]| Sharding::new(&mesh, dims).unwrap().shardy(&mesh);
        assert_eq!(s(&[None, None]), "[{}, {}]");
        assert_eq!(
            s(&[Some("model"), Some("data")]),
            r#"[{"model"}, {"data"}]"#
        );
        assert_eq!(s(&[None, Some("model"), None]), r#"[{}, {"model"}, {}]"#);
        // Any axis name survives as an MLIR string.
        let odd = Mesh::new(&[("a\"b\\c\n", 2)], &[0, 1]).unwrap();
        assert_eq!(odd.shardy(), r#"<["a\"b\\c\0A"=2]>"#);
    }

    #[test]
    fn tiles_split_and_assemble_back() {
        let mesh = Mesh::new(&[("data", 2), ("model", 2)], &[0, 1, 2, 3]).unwrap();
        let data: Vec<i32> = (0..24).collect();
        let shape = [4, 6];
        let cols = Sharding::new(&mesh, &[None, Some("model")]).unwrap();
        let tiles = cols.split(&mesh, &data, &shape).unwrap();
        // Device 1 (data 0, model 1): the right half of every row.
        assert_eq!(tiles[1], [3, 4, 5, 9, 10, 11, 15, 16, 17, 21, 22, 23]);
        assert_eq!(tiles[3], tiles[1], "replicated along data");
        assert_eq!(cols.assemble(&mesh, &tiles, &shape).unwrap(), data);
        let both = Sharding::new(&mesh, &[Some("data"), Some("model")]).unwrap();
        let tiles = both.split(&mesh, &data, &shape).unwrap();
        assert_eq!(tiles[2], [12, 13, 14, 18, 19, 20]);
        assert_eq!(both.assemble(&mesh, &tiles, &shape).unwrap(), data);
    }

    #[test]
    fn what_does_not_fit_is_refused_by_name() {
        assert!(Mesh::new(&[("model", 4)], &[0, 1, 2]).is_err());
        assert!(Mesh::new(&[("a", 2), ("a", 2)], &[0, 1, 2, 3]).is_err());
        assert!(Mesh::new(&[("a", 2)], &[1, 1]).is_err());
        let mesh = Mesh::new(&[("model", 4)], &[0, 1, 2, 3]).unwrap();
        assert!(Sharding::new(&mesh, &[Some("data")])
            .unwrap_err()
            .to_string()
            .contains("no axis \"data\""));
        assert!(Sharding::new(&mesh, &[Some("model"), Some("model")]).is_err());
        let rows = Sharding::new(&mesh, &[Some("model"), None]).unwrap();
        let err = rows.tile_shape(&mesh, &[6, 2]).unwrap_err().to_string();
        assert!(err.contains("does not divide into the 4 devices"), "{err}");
    }
}
