//! Leak check: every PJRT object zoo creates is destroyed exactly once.
//!
//! One test only, in its own binary, because the counters are process-wide. It runs a
//! workload touching every kind of object (clients, buffers, executables, events,
//! serialized executables, and errors from failed calls) on the three CPU plugins, drops
//! everything, and compares the create/destroy counters.

use zoo_runtime::pjrt::leak::{object_counts, ObjectKind};
use zoo_runtime::pjrt::{ClientOptions, CompileOptions, ExecuteOptions, Plugin};

const PROGRAM: &str = r#"func.func @main(%x: tensor<4xf32> {tf.aliasing_output = 0 : i32}, %y: tensor<4xf32>) -> (tensor<4xf32>, tensor<f32>) {
  %0 = stablehlo.add %x, %y : tensor<4xf32>
  %1 = stablehlo.dot_general %x, %y, contracting_dims = [0] x [0] : (tensor<4xf32>, tensor<4xf32>) -> tensor<f32>
  return %0, %1 : tensor<4xf32>, tensor<f32>
}
"#;

/// A 4 TiB output: execution fails with ResourceExhausted.
const HUGE: &str = r#"func.func @main() -> tensor<1099511627776xf32> {
  %0 = stablehlo.constant dense<1.0> : tensor<f32>
  %1 = stablehlo.broadcast_in_dim %0, dims = [] : (tensor<f32>) -> tensor<1099511627776xf32>
  return %1 : tensor<1099511627776xf32>
}
"#;

fn workload(var: &str) {
    let path = std::env::var(var).unwrap_or_else(|_| {
        panic!("{var} is not set: run the tests through scripts/run-tests.sh, which downloads the PJRT CPU plugins and exports {var}")
    });
    let plugin = Plugin::load(&path).unwrap_or_else(|e| panic!("{e}"));
    for _round in 0..3 {
        let client = plugin
            .client(&ClientOptions::new().cpu_device_count(4))
            .unwrap_or_else(|e| panic!("{e}"));
        let devices = client
            .addressable_devices()
            .unwrap_or_else(|e| panic!("{e}"));
        let exe = client
            .compile(
                PROGRAM,
                &CompileOptions::replicated(&devices).unwrap_or_else(|e| panic!("{e}")),
            )
            .unwrap_or_else(|e| panic!("{e}"));
        let mut kept = Vec::new();
        for step in 0..2 {
            let inputs: Vec<_> = devices
                .iter()
                .map(|d| {
                    let x = client
                        .buffer_from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[4], d)
                        .unwrap_or_else(|e| panic!("{e}"));
                    let y = client
                        .buffer_from_slice(&[0.5f32; 4], &[4], d)
                        .unwrap_or_else(|e| panic!("{e}"));
                    [x, y]
                })
                .collect();
            let lists: Vec<Vec<_>> = inputs.iter().map(|l| l.iter().collect()).collect();
            let lists: Vec<&[_]> = lists.iter().map(|l| l.as_slice()).collect();
            // Step 0 donates x; step 1 keeps it.
            let options = if step == 0 {
                ExecuteOptions::new()
            } else {
                ExecuteOptions::new().keep_inputs(&[0])
            };
            let outs = exe
                .execute(&lists, &options)
                .unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(
                outs[3][1].to_vec::<f32>().unwrap_or_else(|e| panic!("{e}")),
                vec![5.0]
            );
            // Reading a donated buffer fails: a PJRT_Error is created and must be freed.
            if step == 0 {
                assert!(inputs[0][0].to_vec::<f32>().is_err());
            }
            let copied = outs[0][0]
                .copy_to_device(&devices[3])
                .unwrap_or_else(|e| panic!("{e}"));
            copied
                .ready_event()
                .and_then(|e| e.wait())
                .unwrap_or_else(|e| panic!("{e}"));
            kept.push(copied);
        }
        let bytes = exe.serialize().unwrap_or_else(|e| panic!("{e}"));
        let again = client
            .deserialize_executable(&bytes)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(again.num_outputs(), 2);
        assert!(client
            .compile("func.func @main() { bogus }", &CompileOptions::new())
            .is_err());
        assert!(client.deserialize_executable(b"garbage").is_err());
        // Out of memory during execute: the error and anything half-made are freed too.
        let huge = client
            .compile(HUGE, &CompileOptions::new())
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(huge.execute(&[&[]], &ExecuteOptions::new()).is_err());
        // Buffers outliving their executable, and the client handle dropped before them:
        // the client is destroyed last, once nothing refers to it.
        drop(exe);
        drop(client);
        drop(kept);
    }
}

#[test]
fn every_pjrt_object_is_freed_exactly_once() {
    let before = object_counts();
    workload("ZOO_PJRT_CPU_PLUGIN");
    workload("ZOO_PJRT_CPU_PLUGIN_0_106");
    workload("ZOO_PJRT_CPU_PLUGIN_SKEW");
    let d = object_counts().since(&before);
    eprintln!("{d}");
    for kind in ObjectKind::ALL {
        assert!(
            d.created(kind) > 0,
            "the workload created no {kind:?}; it must exercise every kind\n{d}"
        );
    }
    assert_eq!(d.created(ObjectKind::Client), 9);
    assert!(d.balanced(), "leaked or double-freed PJRT objects:\n{d}");
}
