//! Shared set-up of the PJRT test binaries: the plugin from an environment variable (a
//! missing one fails the test with instructions), a four-device CPU client, and a private
//! executable cache folder per test process.

#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::OnceLock;

use zoo_runtime::conformance;
use zoo_runtime::{lazy, Device, PjrtDevice, PjrtPlatform};

/// The plugin file named by `var`; unset fails the test.
pub fn plugin_path(var: &str) -> PathBuf {
    let p = std::env::var_os(var)
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| {
            panic!(
            "{var} is not set: run the tests through scripts/run-tests.sh, which downloads the \
             PJRT CPU plugins (scripts/fetch-pjrt-plugins.sh) and exports {var}"
        )
        });
    PathBuf::from(p)
}

/// Configures the CPU platform once per process with the plugin of `var` and 4 devices,
/// and a fresh disk-cache folder.
pub fn setup(var: &str) -> PathBuf {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    let path = plugin_path(var);
    lazy::configure(PjrtPlatform::Cpu, Some(path), Some(4))
        .unwrap_or_else(|e| panic!("configuring the CPU plugin: {e}"));
    let dir = DIR.get_or_init(|| tempfile::tempdir().expect("a temporary cache folder"));
    lazy::set_cache_dir(Some(dir.path().to_path_buf()));
    dir.path().to_path_buf()
}

/// PJRT CPU device `ordinal`.
pub fn device(ordinal: usize) -> Device {
    Device::Pjrt(PjrtDevice::new(PjrtPlatform::Cpu, ordinal))
}

/// Runs one conformance group on device `ordinal` of the plugin of `var`.
pub fn run_group(var: &str, group: &str, ordinal: usize) {
    setup(var);
    match conformance::run_group(group, &device(ordinal)).into_result() {
        Ok(n) => assert!(n > 0, "group {group} ran no checks"),
        Err(report) => panic!("{report}"),
    }
}

/// One `#[test]` per conformance group on device 0 of the plugin named by the environment
/// variable `$var`. Each plugin needs its own test binary: a process holds one client per
/// platform.
#[macro_export]
macro_rules! conformance_groups {
    ($var:expr) => {
        $crate::conformance_groups!(
            $var;
            elementwise, matmul, reduce, shape, creation, conv, norm, attention, errors
        );
    };
    ($var:expr; $($g:ident),*) => {
        $(
            #[test]
            fn $g() {
                common::run_group($var, stringify!($g), 0);
            }
        )*
    };
}

/// Tensors laid out over meshes of the plugin's four devices compute what one device does:
/// row- and column-parallel products (XLA's partitioner adds the all-reduce), a cache split
/// by head updated in place and kept split, a 2 x 2 mesh, each device holding its tile.
pub fn mesh_checks(var: &str) {
    use zoo_runtime::device_map::{Mesh, Sharding};
    use zoo_runtime::{DType, Tensor};
    setup(var);
    let values = |n: usize, seed: u64| -> Vec<f32> {
        // Small integers: sums are exact whatever order the partitions add in.
        (0..n)
            .map(|k| ((k as u64 * 7 + seed) % 9) as f32 - 4.0)
            .collect()
    };
    let line = Mesh::new(&[("model", 4)], &[0, 1, 2, 3]).expect("mesh");
    let mesh = Device::Pjrt(PjrtDevice::on_mesh(PjrtPlatform::Cpu, &line));
    assert_eq!(mesh.to_string(), "pjrt:cpu:0,1,2,3[model=4]");
    let x = Tensor::from_vec(values(16, 1), &[2, 8], &Device::Cpu).expect("x");
    let w = Tensor::from_vec(values(32, 2), &[8, 4], &Device::Cpu).expect("w");
    let want = x.matmul(&w).expect("cpu").to_vec::<f32>().expect("cpu");
    let rows = Sharding::split_dim(&line, 2, 0, "model").expect("rows");
    let cols = Sharding::split_dim(&line, 2, 1, "model").expect("cols");
    let xm = x.to_device(&mesh).expect("x on the mesh");
    for s in [&rows, &cols] {
        let wm = w.to_device_sharded(&mesh, s).expect("w split");
        assert_eq!(wm.sharding().as_deref(), Some(s));
        let tiles = wm.device_shapes().expect("lazy").expect("tiles");
        let tile = s.tile_shape(&line, &[8, 4]).expect("tile");
        assert_eq!(tiles, vec![tile; 4], "each device holds a quarter of w");
        let y = xm.matmul(&wm).expect("matmul");
        let text = y.stablehlo().expect("lazy").expect("text");
        assert!(text.contains("mhlo.num_partitions = 4"), "{text}");
        // Laid out for Shardy, which every plugin here partitions with.
        assert!(text.contains(r#"sdy.mesh @mesh = <["model"=4]>"#), "{text}");
        assert!(text.contains(&s.shardy(&line)), "{text}");
        // XLA's partitioner sums the row-parallel partial products (an all-reduce) and
        // gathers the column-parallel tiles into the whole result.
        let collectives = zoo_runtime::lazy::collectives(&[&y]).expect("collectives");
        let has = |op: &str| collectives.iter().any(|(o, n)| o.starts_with(op) && *n > 0);
        let want_op = if s == &rows {
            "all-reduce"
        } else {
            "all-gather"
        };
        assert!(has(want_op), "{s:?}: {collectives:?}");
        assert_eq!(y.to_vec::<f32>().expect("read"), want, "{s:?}");
        // A result is whole on every device.
        assert_eq!(
            y.device_shapes().expect("lazy").expect("shapes"),
            vec![vec![2, 4]; 4]
        );
    }
    // A cache of 4 heads split by head, a row written in place: it stays split.
    let heads = Sharding::split_dim(&line, 3, 0, "model").expect("heads");
    let cache = Tensor::zeros(&[4, 3, 2], DType::F32, &mesh)
        .and_then(|t| t.shard(&heads))
        .expect("cache");
    cache.sync().expect("cache");
    assert_eq!(
        cache.device_shapes().expect("lazy").expect("tiles"),
        vec![vec![1, 3, 2]; 4]
    );
    let row = Tensor::from_vec(values(8, 3), &[4, 1, 2], &Device::Cpu).expect("row");
    let start = Tensor::from_vec(vec![0i64, 1, 0], &[3], &Device::Cpu).expect("start");
    let updated = cache
        .dynamic_update_slice(
            &row.to_device(&mesh).expect("row"),
            &start.to_device(&mesh).expect("start"),
        )
        .expect("update");
    drop(cache);
    assert_eq!(updated.sharding().as_deref(), Some(&heads));
    let read = updated.to_vec::<f32>().expect("read");
    let mut expect = vec![0f32; 24];
    for h in 0..4 {
        expect[h * 6 + 2..h * 6 + 4].copy_from_slice(&values(8, 3)[h * 2..h * 2 + 2]);
    }
    assert_eq!(read, expect);
    assert_eq!(
        updated.device_shapes().expect("lazy").expect("tiles"),
        vec![vec![1, 3, 2]; 4]
    );
    // A 2 x 2 mesh: rows of x over `data`, w split by columns over `model`; back on one device.
    let square = Mesh::new(&[("data", 2), ("model", 2)], &[3, 2, 1, 0]).expect("mesh");
    let sq = Device::Pjrt(PjrtDevice::on_mesh(PjrtPlatform::Cpu, &square));
    let xs = Sharding::new(&square, &[Some("data"), None]).expect("x");
    let ws = Sharding::new(&square, &[None, Some("model")]).expect("w");
    let y = x
        .to_device_sharded(&sq, &xs)
        .and_then(|x| x.matmul(&w.to_device_sharded(&sq, &ws)?))
        .expect("matmul");
    let on_one = y.to_device(&device(1)).expect("to one device");
    assert_eq!(on_one.to_vec::<f32>().expect("read"), want);
    // Weights load split as a plan says: each device is sent its quarter.
    let mut mem = zoo_runtime::nn::MemWeights::new();
    mem.insert("layers.0.q.weight", w.clone());
    mem.insert("layers.0.o.weight", w.clone());
    mem.insert(
        "norm.weight",
        Tensor::ones(&[8], DType::F32, &Device::Cpu).expect("norm"),
    );
    const PLAN: zoo_runtime::device_map::TpPlan = &[
        ("layers.*.q", zoo_runtime::device_map::TpStyle::Colwise),
        ("layers.*.o", zoo_runtime::device_map::TpStyle::Rowwise),
    ];
    // Each device holds its tile of a split weight (the norm whole), and each reads back.
    let check_split = |weights: &zoo_runtime::nn::Weights| {
        for (name, tile) in [
            ("layers.0.q.weight", vec![2, 4]),
            ("layers.0.o.weight", vec![8, 1]),
            ("norm.weight", vec![8]),
        ] {
            let t = weights.get_unchecked(name).expect("weight");
            assert_eq!(
                t.device_shapes().expect("lazy").expect("tiles"),
                vec![tile; 4],
                "{name}"
            );
            assert_eq!(
                t.to_vec::<f32>().expect("read"),
                mem_value(name, &w),
                "{name}"
            );
        }
    };
    check_split(
        &zoo_runtime::nn::Weights::new(std::sync::Arc::new(mem), DType::F32, mesh)
            .with_tp_plan(PLAN),
    );
    // From a checkpoint each device's tile is read from the file alone: the whole tensor
    // is never read for a split weight (only the replicated norm is), in f32 and in bf16.
    let dir = std::env::temp_dir().join(format!("zoo-tp-tiles-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let file = dir.join("model.safetensors");
    let wv = w.to_vec::<f32>().expect("w");
    let f32_bytes: Vec<u8> = wv.iter().flat_map(|v| v.to_le_bytes()).collect();
    let bf16_bytes: Vec<u8> = wv
        .iter()
        .flat_map(|v| half::bf16::from_f32(*v).to_bits().to_le_bytes())
        .collect();
    let norm: Vec<u8> = [1f32; 8].iter().flat_map(|v| v.to_le_bytes()).collect();
    let mut header = serde_json::Map::new();
    let mut data = Vec::new();
    for (name, dtype, shape, bytes) in [
        ("layers.0.q.weight", "BF16", vec![8, 4], &bf16_bytes),
        ("layers.0.o.weight", "F32", vec![8, 4], &f32_bytes),
        ("norm.weight", "F32", vec![8], &norm),
    ] {
        let at = data.len();
        data.extend_from_slice(bytes);
        header.insert(
            name.into(),
            serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": [at, data.len()]}),
        );
    }
    let header = serde_json::Value::Object(header).to_string();
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(&data);
    std::fs::write(&file, out).expect("write");
    let hub = zoo_hub::Weights::from_safetensors(&[file]).expect("open");
    let counted = std::sync::Arc::new(Counted {
        inner: hub,
        whole: std::sync::Mutex::new(Vec::new()),
    });
    check_split(
        &zoo_runtime::nn::Weights::new(counted.clone(), DType::F32, mesh).with_tp_plan(PLAN),
    );
    let read_whole = counted.whole.lock().unwrap().clone();
    assert_eq!(read_whole, ["norm.weight"]);
    let _ = std::fs::remove_dir_all(&dir);
    // What does not divide is refused, naming the dimension.
    let err = Tensor::zeros(&[3, 2], DType::F32, &mesh)
        .and_then(|t| t.shard(&Sharding::split_dim(&line, 2, 0, "model").expect("s")))
        .expect_err("3 rows over 4 devices");
    assert!(err.to_string().contains("does not divide"), "{err}");
}

fn mem_value(name: &str, w: &zoo_runtime::Tensor) -> Vec<f32> {
    if name == "norm.weight" {
        vec![1.0; 8]
    } else {
        w.to_vec::<f32>().expect("w")
    }
}

/// A checkpoint that records which tensors were read whole.
struct Counted {
    inner: zoo_hub::Weights,
    whole: std::sync::Mutex<Vec<String>>,
}

impl zoo_runtime::nn::WeightSource for Counted {
    fn shape(&self, name: &str) -> Option<Vec<usize>> {
        zoo_runtime::nn::WeightSource::shape(&self.inner, name)
    }
    fn load(
        &self,
        name: &str,
        dtype: zoo_runtime::DType,
        device: &Device,
    ) -> zoo_runtime::Result<zoo_runtime::Tensor> {
        self.whole.lock().unwrap().push(name.into());
        zoo_runtime::nn::WeightSource::load(&self.inner, name, dtype, device)
    }
    fn names(&self) -> Vec<String> {
        zoo_runtime::nn::WeightSource::names(&self.inner)
    }
    fn load_tile(
        &self,
        name: &str,
        dtype: zoo_runtime::DType,
        origin: &[usize],
        shape: &[usize],
    ) -> Option<zoo_runtime::Result<zoo_runtime::Tensor>> {
        zoo_runtime::nn::WeightSource::load_tile(&self.inner, name, dtype, origin, shape)
    }
}
