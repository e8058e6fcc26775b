//! `zoo devices`: the CPU tier zoo's kernels run at, the PJRT plugins this host can load and
//! their devices.

use std::path::PathBuf;

use anyhow::Result;

/// Print the CPU tier zoo's own kernels run at (generic, avx2, avx512 or amx: what this CPU has,
/// capped by ZOO_CPU), then list every PJRT plugin found (explicit path,
/// PJRT_NAMES_AND_LIBRARY_PATHS, TPU_LIBRARY_PATH, then python3's site-packages), with its path,
/// PJRT API version, platform and devices with memory. libtpu is only loaded on Google Cloud
/// hosts (or with ZOO_FORCE_TPU=1).
///
/// Examples:
///   zoo devices
///   ZOO_CPU=avx2 zoo devices          # the tier an AVX2-only CPU would run
///   zoo devices --platform cpu
///   zoo devices --plugin /path/to/xla_cpu_pjrt.so
///   PJRT_NAMES_AND_LIBRARY_PATHS=cpu:/path/to/plugin.so zoo devices
#[derive(clap::Args)]
#[command(verbatim_doc_comment)]
pub struct Args {
    /// Only plugins of this platform: cpu, cuda or tpu.
    #[arg(long)]
    platform: Option<String>,
    /// Load this plugin file first.
    #[arg(long)]
    plugin: Option<PathBuf>,
}

pub fn run(args: Args) -> Result<()> {
    use zoo_runtime::cpu::features;
    let (tier, hardware) = (features::tier()?, features::hardware_tier());
    let capped = if tier < hardware {
        format!(" (capped by ZOO_CPU; this CPU runs {hardware})")
    } else {
        String::new()
    };
    outln!("CPU kernels: {tier}{capped}");
    let report = zoo_runtime::pjrt::discovery::devices_report_with(
        args.platform.as_deref(),
        args.plugin.as_deref(),
    )?;
    out!("{report}");
    Ok(())
}
