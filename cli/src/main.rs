//! `zoo`: the command line of zoo. Parsing and printing only; the work lives in the libraries.

/// `print!`/`println!` that return a failed write to stdout (a full disk, a closed pipe) as
/// the command's error instead of panicking, so the command exits non-zero with a message.
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        write!(std::io::stdout().lock(), $($arg)*).map_err(crate::stdout_failed)?
    }};
}
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout().lock(), $($arg)*).map_err(crate::stdout_failed)?
    }};
}

mod classify;
mod devices;
mod embed;
mod generate;
mod image;
mod inspect;
mod load;
mod parity;
mod plan;
mod rerank;
mod serve;

use std::time::Duration;

use clap::{Parser, Subcommand};
use zoo_runtime::distributed;

/// zoo runs Hugging Face transformer and diffusion checkpoints from Rust, eagerly on CPU/CUDA
/// and compiled through PJRT plugins (TPU, GPU, XLA CPU).
///
/// A MODEL is a local folder (config.json + safetensors), a single .safetensors or .gguf file,
/// or a Hub repo id `org/name[@revision]` looked up in the Hugging Face cache (HF_HOME,
/// HF_HUB_CACHE) and downloaded unless HF_HUB_OFFLINE=1.
///
/// ZOO_CPU=generic|avx2|avx512|amx caps the CPU instructions zoo's own kernels use (default:
/// everything the CPU has; `zoo devices` prints the tier in force).
///
/// Several processes run one command together (the hosts of a TPU slice, GPU nodes) when
/// each is started with its own --process-id and the same --num-processes and
/// --coordinator (or ZOO_PROCESS_ID, ZOO_NUM_PROCESSES and ZOO_COORDINATOR; on a Cloud TPU
/// slice TPU_WORKER_ID and TPU_WORKER_HOSTNAMES say it): process 0 serves the coordinator,
/// a key-value store the PJRT plugins exchange their topology through, and every process
/// waits for the others to join and to leave.
#[derive(Parser)]
#[command(name = "zoo", version, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    #[command(flatten)]
    job: JobArgs,
}

/// The flags of a multi-process job (see the command's help); without them the environment
/// may name one ([`distributed::Processes::from_env`]).
#[derive(clap::Args)]
#[command(next_help_heading = "Multi-process jobs")]
struct JobArgs {
    /// How many processes run this command together (all started with the same value).
    #[arg(long, global = true, value_name = "N")]
    num_processes: Option<usize>,
    /// This process's index, 0 to N-1; process 0 serves the coordinator.
    #[arg(long, global = true, value_name = "I")]
    process_id: Option<usize>,
    /// HOST:PORT of process 0's coordinator (an address of process 0's host that the
    /// others reach, e.g. 10.0.0.2:8476).
    #[arg(long, global = true, value_name = "HOST:PORT")]
    coordinator: Option<String>,
    /// Seconds each process waits for all the others, to join and to leave (1 to 86400).
    #[arg(long, global = true, value_name = "SECS", default_value_t = 300,
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    join_timeout: u64,
}

impl JobArgs {
    /// The job the flags or the environment describe, if any.
    fn processes(&self) -> Result<Option<distributed::Processes>, distributed::DistributedError> {
        let given = [
            ("--num-processes", self.num_processes.is_some()),
            ("--process-id", self.process_id.is_some()),
            ("--coordinator", self.coordinator.is_some()),
        ];
        match (self.num_processes, self.process_id, &self.coordinator) {
            (Some(n), Some(id), Some(c)) => distributed::Processes::new(id, n, c.clone()).map(Some),
            (None, None, None) => distributed::Processes::from_env(),
            _ => {
                let missing: Vec<&str> =
                    given.iter().filter(|(_, g)| !g).map(|(f, _)| *f).collect();
                Err(distributed::DistributedError::BadProcesses {
                    what: missing.join(", "),
                    reason: "a multi-process job needs --num-processes, --process-id and --coordinator together".into(),
                })
            }
        }
    }
}

#[derive(Subcommand)]
enum Command {
    Devices(devices::Args),
    Inspect(inspect::Args),
    Generate(generate::Args),
    Embed(embed::Args),
    Classify(classify::Args),
    Rerank(rerank::Args),
    Image(image::Args),
    Serve(serve::Args),
    Plan(plan::Args),
    Parity(parity::Args),
}

impl Command {
    /// The subcommand's name, which every error message starts with.
    fn name(&self) -> &'static str {
        match self {
            Command::Devices(_) => "devices",
            Command::Inspect(_) => "inspect",
            Command::Generate(_) => "generate",
            Command::Embed(_) => "embed",
            Command::Classify(_) => "classify",
            Command::Rerank(_) => "rerank",
            Command::Image(_) => "image",
            Command::Serve(_) => "serve",
            Command::Plan(_) => "plan",
            Command::Parity(_) => "parity",
        }
    }
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    if let Err(e) = zoo_runtime::cpu::features::tier() {
        eprintln!("error: {e}");
        return std::process::ExitCode::FAILURE;
    }
    let name = cli.command.name();
    let timeout = Duration::from_secs(cli.job.join_timeout);
    let job = match cli.job.processes() {
        Ok(job) => job,
        Err(e) => {
            eprintln!("error: zoo {name}: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    if let Some(job) = job {
        eprintln!("zoo {name}: {job}: waiting for every process to join");
        if let Err(e) = distributed::initialize(job, timeout) {
            eprintln!("error: zoo {name}: {e}");
            return std::process::ExitCode::from(if e.is_caller_error() { 2 } else { 1 });
        }
    }
    let result = match cli.command {
        Command::Devices(args) => devices::run(args),
        Command::Inspect(args) => inspect::run(args),
        Command::Generate(args) => generate::run(args),
        Command::Embed(args) => embed::run(args),
        Command::Classify(args) => classify::run(args),
        Command::Rerank(args) => rerank::run(args),
        Command::Image(args) => image::run(args),
        Command::Serve(args) => serve::run(args),
        Command::Plan(args) => plan::run(args),
        Command::Parity(args) => parity::run(args),
    };
    // Leaves the job whatever the command's outcome, so the other processes are not left
    // waiting (process 0's coordinator serves until all have left); a failure to leave is
    // the error only of a command that succeeded.
    let left = distributed::shutdown(timeout);
    let result = result.and_then(|()| Ok(left?));
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: zoo {name}: {e:#}");
            std::process::ExitCode::from(exit_code(&e))
        }
    }
}

/// 2 when the first of zoo's typed errors in the chain is the caller's to fix (an input,
/// option, file or setting, as for a bad command line), 1 for anything else.
fn exit_code(e: &anyhow::Error) -> u8 {
    for cause in e.chain() {
        let caller = if let Some(e) = cause.downcast_ref::<zoo_transformers::Error>() {
            e.is_caller_error()
        } else if let Some(e) = cause.downcast_ref::<zoo_diffusers::Error>() {
            e.is_caller_error()
        } else if let Some(e) = cause.downcast_ref::<zoo_runtime::Error>() {
            e.is_caller_error()
        } else if let Some(e) = cause.downcast_ref::<distributed::DistributedError>() {
            e.is_caller_error()
        } else if let Some(e) = cause.downcast_ref::<zoo_hub::HubError>() {
            e.is_caller_error()
        } else {
            continue;
        };
        return if caller { 2 } else { 1 };
    }
    1
}

/// The error of a write to stdout that failed.
fn stdout_failed(e: std::io::Error) -> anyhow::Error {
    anyhow::anyhow!("writing to stdout: {e}")
}

/// `--max-image-pixels` as a decoder's limit: 0 means none.
fn pixel_limit(max_image_pixels: u64) -> Option<u64> {
    (max_image_pixels > 0).then_some(max_image_pixels)
}
