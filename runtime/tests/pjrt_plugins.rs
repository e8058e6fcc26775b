//! The PJRT bindings against real plugins: the XLA CPU plugin from `xla-cpu-pjrt==0.0.1`
//! (PJRT API 0.81) and, for version skew, the ones in `fastatomstruct-xla-cpu==2026.6.23`
//! (0.106) and `lammps-jax-pjrt-cpu==0.11.2` (0.115). Every test runs on all three. The plugin files come from `scripts/fetch-pjrt-plugins.sh`,
//! which `scripts/run-tests.sh` runs before `cargo test`.

use half::bf16;
use zoo_runtime::pjrt::{
    Client, ClientOptions, CompileOptions, ElementType, ErrorCode, ExecuteOptions, PjrtError,
    Plugin,
};

/// The plugin named by `var`; a missing variable fails the test (never a silent skip).
fn plugin(var: &str) -> Plugin {
    let path = std::env::var(var).unwrap_or_else(|_| {
        panic!(
            "{var} is not set: run the tests through scripts/run-tests.sh, which downloads the \
             PJRT CPU plugins (scripts/fetch-pjrt-plugins.sh) and exports {var}"
        )
    });
    Plugin::load(&path).unwrap_or_else(|e| panic!("loading {path}: {e}"))
}

fn client(var: &str) -> Client {
    plugin(var)
        .client(&ClientOptions::new().cpu_device_count(4))
        .unwrap_or_else(|e| panic!("creating a client: {e}"))
}

const MAIN: &str = "ZOO_PJRT_CPU_PLUGIN";
const SKEW: &str = "ZOO_PJRT_CPU_PLUGIN_SKEW";
const MID: &str = "ZOO_PJRT_CPU_PLUGIN_0_106";

/// Declares `$name` once per plugin: `$name::xla_cpu_0_81`, `$name::mid_0_106` and
/// `$name::skew_0_115`.
macro_rules! on_both_plugins {
    ($name:ident, $body:expr) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;
            #[test]
            fn xla_cpu_0_81() {
                ($body)(super::MAIN, 81)
            }
            #[test]
            fn mid_0_106() {
                ($body)(super::MID, 106)
            }
            #[test]
            fn skew_0_115() {
                ($body)(super::SKEW, 115)
            }
        }
    };
}

on_both_plugins!(load_and_version, |var: &str, minor: i32| {
    let p = super::plugin(var);
    assert_eq!(p.api_version(), (0, minor), "{}", p.path().display());
    assert!(p.function_count() > 100);
    // Loading the same file again gives the same, already initialized, plugin.
    let again = super::plugin(var);
    assert_eq!(again.api_version(), p.api_version());
    let attrs = p.attributes().expect("attributes");
    assert!(
        attrs.iter().any(|(k, _)| k.contains("stablehlo")),
        "{attrs:?}"
    );
});

on_both_plugins!(client_and_devices, |var: &str, _minor: i32| {
    let c = super::client(var);
    assert_eq!(c.platform_name().expect("platform name"), "cpu");
    c.platform_version().expect("platform version");
    assert_eq!(c.process_index().expect("process index"), 0);
    let devices = c.addressable_devices().expect("devices");
    assert_eq!(devices.len(), 4);
    assert_eq!(c.devices().expect("all devices").len(), 4);
    for (i, d) in devices.iter().enumerate() {
        assert_eq!(d.id().expect("id"), i as i32);
        assert!(d.is_addressable().expect("addressable"));
        assert_eq!(d.kind().expect("kind").to_lowercase(), "cpu");
        assert!(!d.description_string().expect("to_string").is_empty());
        d.debug_string().expect("debug string");
        d.local_hardware_id().expect("hardware id");
        assert_eq!(d.process_index().expect("process index"), 0);
        match d.memory_stats() {
            Ok(m) => assert!(m.bytes_in_use >= 0),
            Err(PjrtError::Plugin { code, .. }) => assert_eq!(code, ErrorCode::Unimplemented),
            Err(e) => panic!("memory stats: {e}"),
        }
    }
    assert!(c.device(7).is_err());
});

on_both_plugins!(host_round_trips, |var: &str, _minor: i32| {
    let c = super::client(var);
    let d = c.device(1).expect("device 1");
    let f: Vec<f32> = (0..12).map(|i| i as f32 * 0.5 - 2.0).collect();
    let b = c.buffer_from_slice(&f, &[3, 4], &d).expect("f32 to device");
    assert_eq!(b.dtype().expect("dtype"), ElementType::F32);
    assert_eq!(b.dims().expect("dims"), vec![3, 4]);
    assert_eq!(b.device().expect("device").id().expect("id"), 1);
    assert!(b.on_device_size_in_bytes().expect("size") >= 48);
    b.block_until_ready().expect("ready");
    assert_eq!(b.to_vec::<f32>().expect("f32 back"), f);

    let h: Vec<bf16> = [1.5f32, -0.25, 3.0e3, 0.0]
        .iter()
        .map(|&x| bf16::from_f32(x))
        .collect();
    let b = c
        .buffer_from_slice(&h, &[2, 2], &d)
        .expect("bf16 to device");
    assert_eq!(b.dtype().expect("dtype"), ElementType::BF16);
    assert_eq!(b.to_vec::<bf16>().expect("bf16 back"), h);

    let i: Vec<i64> = vec![i64::MIN, -1, 0, 1, i64::MAX];
    let b = c.buffer_from_slice(&i, &[5], &d).expect("i64 to device");
    assert_eq!(b.dtype().expect("dtype"), ElementType::I64);
    assert_eq!(b.to_vec::<i64>().expect("i64 back"), i);
    // A scalar.
    let s = c.buffer_from_slice(&[7i32], &[], &d).expect("scalar");
    assert_eq!(s.dims().expect("dims"), Vec::<i64>::new());
    assert_eq!(s.to_vec::<i32>().expect("scalar back"), vec![7]);

    // Reading with the wrong host type and passing the wrong byte count are typed errors.
    assert!(matches!(
        b.to_vec::<f64>(),
        Err(PjrtError::InvalidArgument(_))
    ));
    assert!(matches!(
        c.buffer_from_slice(&[1.0f32; 3], &[2, 2], &d),
        Err(PjrtError::InvalidArgument(_))
    ));
});

on_both_plugins!(device_to_device_copy, |var: &str, _minor: i32| {
    let c = super::client(var);
    let d0 = c.device(0).expect("device 0");
    let d3 = c.device(3).expect("device 3");
    let data: Vec<f32> = (0..64).map(|i| (i * i) as f32).collect();
    let b0 = c
        .buffer_from_slice(&data, &[8, 8], &d0)
        .expect("to device 0");
    let b3 = b0.copy_to_device(&d3).expect("copy 0 -> 3");
    assert_eq!(b3.device().expect("device").id().expect("id"), 3);
    assert_eq!(b3.dims().expect("dims"), vec![8, 8]);
    assert_eq!(b3.to_vec::<f32>().expect("read 3"), data);
    let back = b3.copy_to_device(&d0).expect("copy 3 -> 0");
    assert_eq!(back.to_vec::<f32>().expect("read 0"), data);
});

const DOT_ADD: &str = r#"module @dot_add {
  func.func @main(%a: tensor<2x3xf32>, %b: tensor<3x2xf32>, %c: tensor<2x2xf32>) -> (tensor<2x2xf32>, tensor<2x2xf32>) {
    %0 = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : (tensor<2x3xf32>, tensor<3x2xf32>) -> tensor<2x2xf32>
    %1 = stablehlo.add %0, %c : tensor<2x2xf32>
    return %1, %0 : tensor<2x2xf32>, tensor<2x2xf32>
  }
}
"#;

fn dot_add_expected(a: &[f32], b: &[f32], c: &[f32]) -> (Vec<f32>, Vec<f32>) {
    let mut dot = vec![0.0f32; 4];
    for i in 0..2 {
        for j in 0..2 {
            dot[i * 2 + j] = (0..3).map(|k| a[i * 3 + k] * b[k * 2 + j]).sum();
        }
    }
    let sum = dot.iter().zip(c).map(|(x, y)| x + y).collect();
    (sum, dot)
}

on_both_plugins!(compile_and_execute_one_device, |var: &str, _minor: i32| {
    let c = super::client(var);
    let d2 = c.device(2).expect("device 2");
    let exe = c
        .compile(super::DOT_ADD, &CompileOptions::on(&d2).expect("options"))
        .expect("compile");
    assert_eq!(exe.num_outputs(), 2);
    assert_eq!(exe.num_replicas().expect("replicas"), 1);
    let on: Vec<i32> = exe
        .addressable_devices()
        .expect("devices")
        .iter()
        .map(|d| d.id().expect("id"))
        .collect();
    assert_eq!(on, vec![2]);
    assert!(!exe.name().expect("name").is_empty());
    let a = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
    let b = [0.5f32, -1.0, 2.0, 0.0, -3.0, 1.5];
    let cc = [10.0f32, 20.0, 30.0, 40.0];
    let ba = c.buffer_from_slice(&a, &[2, 3], &d2).expect("a");
    let bb = c.buffer_from_slice(&b, &[3, 2], &d2).expect("b");
    let bc = c.buffer_from_slice(&cc, &[2, 2], &d2).expect("c");
    let out = exe.execute_one(&[&ba, &bb, &bc]).expect("execute");
    assert_eq!(out.len(), 2);
    let (sum, dot) = super::dot_add_expected(&a, &b, &cc);
    assert_eq!(out[0].to_vec::<f32>().expect("sum"), sum);
    assert_eq!(out[1].to_vec::<f32>().expect("dot"), dot);
    assert_eq!(out[0].device().expect("device").id().expect("id"), 2);
    // Inputs not aliased by the program survive the call.
    assert!(!ba.is_deleted().expect("is_deleted"));
    // Wrong number of argument lists is a typed error, not a crash.
    assert!(matches!(
        exe.execute(
            &[&[&ba, &bb, &bc], &[&ba, &bb, &bc]],
            &ExecuteOptions::new()
        ),
        Err(PjrtError::InvalidArgument(_))
    ));
});

on_both_plugins!(
    compile_and_execute_four_devices,
    |var: &str, _minor: i32| {
        let c = super::client(var);
        let devices = c.addressable_devices().expect("devices");
        let exe = c
            .compile(
                super::DOT_ADD,
                &CompileOptions::replicated(&devices).expect("options"),
            )
            .expect("compile replicated");
        assert_eq!(exe.num_replicas().expect("replicas"), 4);
        let mut inputs = Vec::new();
        let mut expected = Vec::new();
        for (i, d) in devices.iter().enumerate() {
            let s = i as f32 + 1.0;
            let a: Vec<f32> = (0..6).map(|k| k as f32 * s).collect();
            // Small integers keep every product and sum exact, whatever the summation order.
            let b: Vec<f32> = (0..6).map(|k| k as f32 - 2.0 - s).collect();
            let cc: Vec<f32> = vec![s; 4];
            expected.push(super::dot_add_expected(&a, &b, &cc));
            inputs.push([
                c.buffer_from_slice(&a, &[2, 3], d).expect("a"),
                c.buffer_from_slice(&b, &[3, 2], d).expect("b"),
                c.buffer_from_slice(&cc, &[2, 2], d).expect("c"),
            ]);
        }
        let lists: Vec<Vec<&zoo_runtime::pjrt::Buffer>> =
            inputs.iter().map(|l| l.iter().collect()).collect();
        let lists: Vec<&[&zoo_runtime::pjrt::Buffer]> =
            lists.iter().map(|l| l.as_slice()).collect();
        let run = exe
            .execute_async(&lists, &ExecuteOptions::new())
            .expect("execute");
        assert_eq!(run.events.len(), 4);
        let outs = run.wait().expect("wait");
        assert_eq!(outs.len(), 4);
        for (i, out) in outs.iter().enumerate() {
            assert_eq!(out[0].device().expect("device").id().expect("id"), i as i32);
            assert_eq!(
                out[0].to_vec::<f32>().expect("sum"),
                expected[i].0,
                "device {i}"
            );
            assert_eq!(
                out[1].to_vec::<f32>().expect("dot"),
                expected[i].1,
                "device {i}"
            );
        }
    }
);

/// `x @ w` with `w` split over four partitions along its rows (the contracting dim, as a
/// row-parallel linear), `x` replicated: each partition multiplies its quarter and XLA's
/// SPMD partitioner adds the partial products across the devices (an all-reduce), so every
/// device holds the whole result; and along its columns (column-parallel), each device
/// holding its quarter of the result's columns.
const SPMD: &str = r#"module @spmd attributes {mhlo.num_partitions = 4 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%x: tensor<2x8xf32> {mhlo.sharding = "{replicated}"}, %rows: tensor<8x4xf32> {mhlo.sharding = "{devices=[4,1]0,1,2,3}"}, %cols: tensor<8x4xf32> {mhlo.sharding = "{devices=[1,4]0,1,2,3}"}) -> (tensor<2x4xf32> {mhlo.sharding = "{replicated}"}, tensor<2x4xf32> {mhlo.sharding = "{devices=[1,4]0,1,2,3}"}) {
    %0 = stablehlo.dot_general %x, %rows, contracting_dims = [1] x [0] : (tensor<2x8xf32>, tensor<8x4xf32>) -> tensor<2x4xf32>
    %1 = stablehlo.dot_general %x, %cols, contracting_dims = [1] x [0] : (tensor<2x8xf32>, tensor<8x4xf32>) -> tensor<2x4xf32>
    return %0, %1 : tensor<2x4xf32>, tensor<2x4xf32>
  }
}
"#;

/// Compiles `module` (`SPMD`, or `SPMD_SHARDY` partitioned with Shardy when `shardy`) on the
/// plugin of `var` and checks the row- and column-parallel products on every partition.
fn row_and_column_parallel(var: &str, module: &str, shardy: bool) {
    let c = client(var);
    let devices = c.addressable_devices().expect("devices");
    let exe = c
        .compile(
            module,
            &CompileOptions::partitioned(&devices)
                .expect("options")
                .shardy(shardy),
        )
        .expect("compile partitioned");
    assert_eq!(exe.num_partitions().expect("partitions"), 4);
    assert_eq!(exe.num_replicas().expect("replicas"), 1);
    // Small integers: every product and sum is exact, whatever the order.
    let x: Vec<f32> = (0..16).map(|k| (k % 5) as f32 - 2.0).collect();
    let w: Vec<f32> = (0..32).map(|k| (k % 7) as f32 - 3.0).collect();
    let mut want = vec![0f32; 8];
    for i in 0..2 {
        for j in 0..4 {
            want[i * 4 + j] = (0..8).map(|k| x[i * 8 + k] * w[k * 4 + j]).sum();
        }
    }
    let mut inputs = Vec::new();
    for (p, d) in devices.iter().enumerate() {
        // Partition p's rows 2p..2p+2 of w, and its column p.
        let rows: Vec<f32> = w[p * 8..p * 8 + 8].to_vec();
        let col: Vec<f32> = (0..8).map(|k| w[k * 4 + p]).collect();
        inputs.push([
            c.buffer_from_slice(&x, &[2, 8], d).expect("x"),
            c.buffer_from_slice(&rows, &[2, 4], d).expect("rows"),
            c.buffer_from_slice(&col, &[8, 1], d).expect("cols"),
        ]);
    }
    let lists: Vec<Vec<&zoo_runtime::pjrt::Buffer>> =
        inputs.iter().map(|l| l.iter().collect()).collect();
    let lists: Vec<&[&zoo_runtime::pjrt::Buffer]> = lists.iter().map(|l| l.as_slice()).collect();
    let outs = exe
        .execute(&lists, &ExecuteOptions::new())
        .expect("execute");
    assert_eq!(outs.len(), 4);
    for (p, out) in outs.iter().enumerate() {
        assert_eq!(out[0].dims().expect("dims"), [2, 4], "partition {p}");
        assert_eq!(
            out[0].to_vec::<f32>().expect("row-parallel"),
            want,
            "partition {p}"
        );
        let col: Vec<f32> = (0..2).map(|i| want[i * 4 + p]).collect();
        assert_eq!(out[1].dims().expect("dims"), [2, 1], "partition {p}");
        assert_eq!(
            out[1].to_vec::<f32>().expect("column-parallel"),
            col,
            "partition {p}"
        );
    }
}

on_both_plugins!(
    spmd_partitions_shard_a_product_over_four_devices,
    |var: &str, _minor: i32| super::row_and_column_parallel(var, super::SPMD, false)
);

/// [`SPMD`] laid out with Shardy's dialect: one mesh axis of four, each value's split named
/// by axis per dimension.
const SPMD_SHARDY: &str = r#"module @spmd attributes {mhlo.num_partitions = 4 : i32, mhlo.num_replicas = 1 : i32} {
  sdy.mesh @mesh = <["model"=4]>
  func.func public @main(%x: tensor<2x8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {}]>}, %rows: tensor<8x4xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"model"}, {}]>}, %cols: tensor<8x4xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {"model"}]>}) -> (tensor<2x4xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {}]>}, tensor<2x4xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {"model"}]>}) {
    %0 = stablehlo.dot_general %x, %rows, contracting_dims = [1] x [0] : (tensor<2x8xf32>, tensor<8x4xf32>) -> tensor<2x4xf32>
    %1 = stablehlo.dot_general %x, %cols, contracting_dims = [1] x [0] : (tensor<2x8xf32>, tensor<8x4xf32>) -> tensor<2x4xf32>
    %2 = sdy.sharding_constraint %1 <@mesh, [{}, {"model"}]> : tensor<2x4xf32>
    return %0, %2 : tensor<2x4xf32>, tensor<2x4xf32>
  }
}
"#;

on_both_plugins!(
    shardy_partitions_shard_a_product_over_four_devices,
    |var: &str, _minor: i32| super::row_and_column_parallel(var, super::SPMD_SHARDY, true)
);

// A 2 x 2 mesh (`data` × `model`): `x` split by rows along `data`; `x @ w` with `w` split by
// columns along `model` (each device one tile of the result), and with `w` split by rows
// along `model` (XLA sums the partial products over `model`). Inputs are cut into tiles and
// results put back together by `Sharding`, its `mhlo.sharding` attributes in the module.
on_both_plugins!(a_mesh_lays_out_an_spmd_program, |var: &str, _minor: i32| {
    use zoo_runtime::device_map::{Mesh, Sharding};
    let c = super::client(var);
    let devices = c.addressable_devices().expect("devices");
    let mesh = Mesh::new(&[("data", 2), ("model", 2)], &[0, 1, 2, 3]).expect("mesh");
    let s = |dims: &[Option<&str>]| Sharding::new(&mesh, dims).expect("sharding");
    let (xs, cols, rows) = (
        s(&[Some("data"), None]),
        s(&[None, Some("model")]),
        s(&[Some("model"), None]),
    );
    let (ys, zs) = (s(&[Some("data"), Some("model")]), s(&[Some("data"), None]));
    let program = format!(
        r#"module @mesh attributes {{mhlo.num_partitions = 4 : i32, mhlo.num_replicas = 1 : i32}} {{
  func.func public @main(%x: tensor<4x8xf32> {{mhlo.sharding = "{}"}}, %c: tensor<8x6xf32> {{mhlo.sharding = "{}"}}, %r: tensor<8x6xf32> {{mhlo.sharding = "{}"}}) -> (tensor<4x6xf32> {{mhlo.sharding = "{}"}}, tensor<4x6xf32> {{mhlo.sharding = "{}"}}) {{
    %0 = stablehlo.dot_general %x, %c, contracting_dims = [1] x [0] : (tensor<4x8xf32>, tensor<8x6xf32>) -> tensor<4x6xf32>
    %1 = stablehlo.dot_general %x, %r, contracting_dims = [1] x [0] : (tensor<4x8xf32>, tensor<8x6xf32>) -> tensor<4x6xf32>
    return %0, %1 : tensor<4x6xf32>, tensor<4x6xf32>
  }}
}}
"#,
        xs.gspmd(&mesh),
        cols.gspmd(&mesh),
        rows.gspmd(&mesh),
        ys.gspmd(&mesh),
        zs.gspmd(&mesh)
    );
    let order: Vec<_> = mesh.devices().iter().map(|&i| devices[i].clone()).collect();
    let exe = c
        .compile(
            &program,
            &CompileOptions::partitioned(&order).expect("options"),
        )
        .expect("compile");
    let x: Vec<f32> = (0..32).map(|k| (k % 5) as f32 - 2.0).collect();
    let w: Vec<f32> = (0..48).map(|k| (k % 7) as f32 - 3.0).collect();
    let mut want = vec![0f32; 24];
    for i in 0..4 {
        for j in 0..6 {
            want[i * 6 + j] = (0..8).map(|k| x[i * 8 + k] * w[k * 6 + j]).sum();
        }
    }
    let (xt, ct, rt) = (
        xs.split(&mesh, &x, &[4, 8]).expect("x"),
        cols.split(&mesh, &w, &[8, 6]).expect("c"),
        rows.split(&mesh, &w, &[8, 6]).expect("r"),
    );
    let mut inputs = Vec::new();
    for (i, d) in order.iter().enumerate() {
        inputs.push([
            c.buffer_from_slice(&xt[i], &[2, 8], d).expect("x"),
            c.buffer_from_slice(&ct[i], &[8, 3], d).expect("c"),
            c.buffer_from_slice(&rt[i], &[4, 6], d).expect("r"),
        ]);
    }
    let lists: Vec<Vec<&zoo_runtime::pjrt::Buffer>> =
        inputs.iter().map(|l| l.iter().collect()).collect();
    let lists: Vec<&[&zoo_runtime::pjrt::Buffer]> = lists.iter().map(|l| l.as_slice()).collect();
    let outs = exe
        .execute(&lists, &ExecuteOptions::new())
        .expect("execute");
    let tiles = |k: usize| -> Vec<Vec<f32>> {
        outs.iter()
            .map(|o| o[k].to_vec::<f32>().expect("tile"))
            .collect()
    };
    assert_eq!(ys.assemble(&mesh, &tiles(0), &[4, 6]).expect("y"), want);
    assert_eq!(zs.assemble(&mesh, &tiles(1), &[4, 6]).expect("z"), want);
});

const DONATE: &str = r#"func.func @main(%x: tensor<4xf32> {tf.aliasing_output = 0 : i32}) -> tensor<4xf32> {
  %one = stablehlo.constant dense<1.0> : tensor<4xf32>
  %0 = stablehlo.add %x, %one : tensor<4xf32>
  return %0 : tensor<4xf32>
}
"#;

on_both_plugins!(donation, |var: &str, _minor: i32| {
    let c = super::client(var);
    let d = c.device(0).expect("device 0");
    let exe = c
        .compile(super::DONATE, &CompileOptions::on(&d).expect("options"))
        .expect("compile");
    // Kept: the input is listed as non-donatable and survives.
    let x = c
        .buffer_from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[4], &d)
        .expect("x");
    let out = exe
        .execute(&[&[&x]], &ExecuteOptions::new().keep_inputs(&[0]))
        .expect("execute keeping x");
    assert_eq!(
        out[0][0].to_vec::<f32>().expect("out"),
        vec![2.0, 3.0, 4.0, 5.0]
    );
    assert!(!x.is_deleted().expect("is_deleted"));
    assert_eq!(
        x.to_vec::<f32>().expect("x still readable"),
        vec![1.0, 2.0, 3.0, 4.0]
    );
    // Donated: the input buffer is consumed by the call.
    let out = exe
        .execute(&[&[&x]], &ExecuteOptions::new())
        .expect("execute donating x");
    assert_eq!(
        out[0][0].to_vec::<f32>().expect("out"),
        vec![2.0, 3.0, 4.0, 5.0]
    );
    assert!(
        x.is_deleted().expect("is_deleted"),
        "a donated input must read as deleted"
    );
    assert!(
        x.to_vec::<f32>().is_err(),
        "reading a donated buffer must fail, not crash"
    );
});

on_both_plugins!(serialization, |var: &str, _minor: i32| {
    let c = super::client(var);
    let d = c.device(0).expect("device 0");
    let exe = c
        .compile(super::DOT_ADD, &CompileOptions::on(&d).expect("options"))
        .expect("compile");
    // Both XLA CPU plugins serialize; a plugin that cannot must say Unimplemented.
    match exe.serialize() {
        Ok(bytes) => {
            assert!(!bytes.is_empty());
            let back = c.deserialize_executable(&bytes).expect("deserialize");
            assert_eq!(back.num_outputs(), 2);
            let a = [1.0f32; 6];
            let b = [2.0f32; 6];
            let cc = [0.5f32; 4];
            let ins = [
                c.buffer_from_slice(&a, &[2, 3], &d).expect("a"),
                c.buffer_from_slice(&b, &[3, 2], &d).expect("b"),
                c.buffer_from_slice(&cc, &[2, 2], &d).expect("c"),
            ];
            let out = back
                .execute_one(&[&ins[0], &ins[1], &ins[2]])
                .expect("execute");
            assert_eq!(out[0].to_vec::<f32>().expect("sum"), vec![6.5; 4]);
            // Garbage is refused with the plugin's error.
            assert!(c.deserialize_executable(b"not an executable").is_err());
        }
        Err(e) => panic!("the XLA CPU plugin serializes executables, but: {e}"),
    }
});

on_both_plugins!(compile_error_names_the_line, |var: &str, _minor: i32| {
    let c = super::client(var);
    let bad = "func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {\n  %0 = stablehlo.add %x, %x : tensor<4xf32>\n  %1 = stablehlo.frobnicate %0 : tensor<4xf32>\n  return %1 : tensor<4xf32>\n}\n";
    match c.compile(bad, &CompileOptions::new()) {
        Err(PjrtError::Compile {
            code,
            message,
            line,
        }) => {
            assert_ne!(code, ErrorCode::Other(0));
            assert!(message.contains("frobnicate"), "{message}");
            let line = line.expect("the diagnostic names a line");
            assert_eq!(line.line, 3);
            assert!(line.text.contains("stablehlo.frobnicate"));
            let shown = PjrtError::Compile {
                code,
                message,
                line: Some(line),
            }
            .to_string();
            assert!(shown.contains("at line 3"), "{shown}");
        }
        Err(e) => panic!("expected a compile error, got {e}"),
        Ok(_) => panic!("a bogus op compiled"),
    }
    // A type mismatch is also the plugin's message, not a crash.
    let mismatch =
        "func.func @main(%x: tensor<4xf32>) -> tensor<4xi32> {\n  return %x : tensor<4xf32>\n}\n";
    assert!(matches!(
        c.compile(mismatch, &CompileOptions::new()),
        Err(PjrtError::Compile { .. })
    ));
});

/// 2^40 f32 elements: 4 TiB, more than any test machine has.
const HUGE: &str = r#"func.func @main() -> tensor<1099511627776xf32> {
  %0 = stablehlo.constant dense<1.0> : tensor<f32>
  %1 = stablehlo.broadcast_in_dim %0, dims = [] : (tensor<f32>) -> tensor<1099511627776xf32>
  return %1 : tensor<1099511627776xf32>
}
"#;

on_both_plugins!(out_of_memory_is_a_typed_error, |var: &str, _minor: i32| {
    let c = super::client(var);
    let exe = c
        .compile(super::HUGE, &CompileOptions::new())
        .expect("compile");
    match exe.execute(&[&[]], &ExecuteOptions::new()) {
        Err(PjrtError::Plugin { code, message, .. }) => {
            assert_eq!(code, ErrorCode::ResourceExhausted, "{message}");
            assert!(message.contains("memory"), "{message}");
        }
        Err(e) => panic!("expected ResourceExhausted, got {e}"),
        Ok(_) => panic!("a 4 TiB output was allocated"),
    }
    // The client is still usable afterwards.
    let d = c.device(0).expect("device 0");
    let b = c
        .buffer_from_slice(&[1u8, 2, 3], &[3], &d)
        .expect("small buffer");
    assert_eq!(b.to_vec::<u8>().expect("read"), vec![1, 2, 3]);
});

#[test]
fn a_library_that_is_not_a_plugin_is_refused() {
    let candidates = [
        "/lib/x86_64-linux-gnu/libc.so.6",
        "/usr/lib/x86_64-linux-gnu/libc.so.6",
        "/lib64/libc.so.6",
        "/usr/lib64/libc.so.6",
        "/lib/aarch64-linux-gnu/libc.so.6",
        "/usr/lib/aarch64-linux-gnu/libc.so.6",
    ];
    let libc = candidates
        .iter()
        .find(|p| std::path::Path::new(p).is_file())
        .unwrap_or_else(|| panic!("no libc.so.6 in {candidates:?}"));
    match Plugin::load(libc) {
        Err(PjrtError::NotAPlugin { path }) => assert_eq!(path, std::path::Path::new(libc)),
        other => panic!("expected NotAPlugin, got {other:?}"),
    }
    // A file that is no shared library at all.
    let text = std::env::temp_dir().join(format!("zoo-not-a-plugin-{}.so", std::process::id()));
    std::fs::write(&text, b"plain text").expect("write");
    let r = Plugin::load(&text);
    let _ = std::fs::remove_file(&text);
    assert!(matches!(r, Err(PjrtError::Load { .. })), "{r:?}");
    // A missing file.
    assert!(matches!(
        Plugin::load("/nonexistent/zoo/plugin.so"),
        Err(PjrtError::Load { .. })
    ));
}
