//! Lists the PJRT plugins on this machine and their devices, then runs a small StableHLO
//! program on the first CPU plugin's devices.
//!
//! ```sh
//! eval "$(scripts/fetch-pjrt-plugins.sh .cache/pjrt)"
//! PJRT_NAMES_AND_LIBRARY_PATHS=cpu:$ZOO_PJRT_CPU_PLUGIN \
//!   cargo run -p zoo-examples --example pjrt_devices -- [PLATFORM]
//! ```

use zoo_runtime::pjrt::{discovery, ClientOptions, CompileOptions};

const SCALE: &str = r#"func.func @main(%x: tensor<4xf32>, %s: tensor<f32>) -> tensor<4xf32> {
  %b = stablehlo.broadcast_in_dim %s, dims = [] : (tensor<f32>) -> tensor<4xf32>
  %0 = stablehlo.multiply %x, %b : tensor<4xf32>
  return %0 : tensor<4xf32>
}
"#;

fn main() -> anyhow::Result<()> {
    let platform = std::env::args().nth(1);
    // What `zoo devices [--platform P]` prints.
    print!("{}", discovery::devices_report(platform.as_deref())?);

    if platform.as_deref().is_none_or(|p| p == "cpu") {
        let plugin = discovery::load_plugin(Some("cpu"), None)?;
        let client = plugin.client(&ClientOptions::new().cpu_device_count(2))?;
        let devices = client.addressable_devices()?;
        let t = std::time::Instant::now();
        let exe = client.compile(SCALE, &CompileOptions::replicated(&devices)?)?;
        println!(
            "compiled for {} devices in {:?}",
            devices.len(),
            t.elapsed()
        );
        let x = [1.0f32, 2.0, 3.0, 4.0];
        let inputs: Vec<_> = devices
            .iter()
            .enumerate()
            .map(|(i, d)| {
                Ok([
                    client.buffer_from_slice(&x, &[4], d)?,
                    client.buffer_from_slice(&[i as f32 + 1.0], &[], d)?,
                ])
            })
            .collect::<zoo_runtime::pjrt::Result<_>>()?;
        let lists: Vec<Vec<_>> = inputs.iter().map(|l| l.iter().collect()).collect();
        let lists: Vec<&[_]> = lists.iter().map(|l| l.as_slice()).collect();
        let outputs = exe.execute(&lists, &Default::default())?;
        let runs = 200;
        let t = std::time::Instant::now();
        for _ in 0..runs {
            exe.execute(&lists, &Default::default())?;
        }
        println!("execute + wait: {:?} per call", t.elapsed() / runs);
        for (d, out) in devices.iter().zip(&outputs) {
            println!("{d:?}: {:?}", out[0].to_vec::<f32>()?);
        }
    }
    Ok(())
}
