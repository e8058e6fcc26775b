//! Compiling StableHLO, executing on one or several devices, donation, serialization.

use std::ffi::c_char;
use std::fmt;
use std::sync::Arc;

use super::api::{pjrt_call, string_from};
use super::buffer::{Buffer, Event};
use super::client::{Client, ClientInner, Device};
use super::error::{PjrtError, Result, SourceLine};
use super::ffi::{self, Args};
use super::leak::{self, ObjectKind};

/// How to compile: how many replicas or SPMD partitions, and on which devices.
///
/// Encoded as the `xla.CompileOptionsProto` that `PJRT_Client_Compile` takes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CompileOptions {
    /// Device ids, one per replica (or per partition when `partitioned`); empty means one
    /// replica on the plugin's default device.
    pub device_ids: Vec<i32>,
    /// One program partitioned over the devices by XLA's SPMD partitioner (GSPMD): each
    /// device runs its partition on its shards of the arguments, as the module's
    /// `mhlo.sharding` attributes lay them out, with the collectives XLA inserts between
    /// them. Otherwise every device runs a replica of the whole program.
    pub partitioned: bool,
    /// Round 16-bit values after every op, as PyTorch does, instead of letting XLA keep
    /// fused intermediates in f32 (`xla_allow_excess_precision = false`).
    pub strict_rounding: bool,
    /// Partition with Shardy (`use_shardy_partitioner`): the module lays its values out
    /// with `sdy.mesh` and `sdy.sharding` instead of `mhlo.sharding`.
    pub shardy: bool,
}

impl CompileOptions {
    /// One replica on the plugin's default device.
    pub fn new() -> Self {
        Self::default()
    }

    /// One replica on `device`.
    pub fn on(device: &Device) -> Result<Self> {
        Ok(Self {
            device_ids: vec![device.id()?],
            ..Self::default()
        })
    }

    /// One replica per device, in order: `execute` then takes one argument list per device.
    pub fn replicated(devices: &[Device]) -> Result<Self> {
        Ok(Self {
            device_ids: devices.iter().map(|d| d.id()).collect::<Result<_>>()?,
            ..Self::default()
        })
    }

    /// One SPMD program partitioned over `devices`, partition `i` on `devices[i]`: `execute`
    /// then takes each device's shards of the arguments. The module says how its
    /// parameters and results are sharded (`mhlo.sharding`) and that it has
    /// `mhlo.num_partitions` of them.
    pub fn partitioned(devices: &[Device]) -> Result<Self> {
        Ok(Self {
            device_ids: devices.iter().map(|d| d.id()).collect::<Result<_>>()?,
            partitioned: true,
            ..Self::default()
        })
    }

    /// With [`CompileOptions::shardy`] set to `on`.
    pub fn shardy(mut self, on: bool) -> Self {
        self.shardy = on;
        self
    }

    /// With [`CompileOptions::strict_rounding`] set to `on`.
    pub fn strict_rounding(mut self, on: bool) -> Self {
        self.strict_rounding = on;
        self
    }

    /// The serialized `CompileOptionsProto`.
    pub fn to_proto(&self) -> Vec<u8> {
        let devices = self.device_ids.len().max(1) as u64;
        let (replicas, partitions) = match self.partitioned {
            true => (1, devices),
            false => (devices, 1),
        };
        let mut build = Vec::new();
        // device_ordinal = -1: let the device assignment (or the default) decide.
        proto::varint_field(&mut build, 1, -1i64 as u64);
        proto::varint_field(&mut build, 4, replicas); // num_replicas
        proto::varint_field(&mut build, 5, partitions); // num_partitions
        if self.partitioned {
            proto::varint_field(&mut build, 6, 1); // use_spmd_partitioning
            if self.shardy {
                proto::varint_field(&mut build, 19, 1); // use_shardy_partitioner
            }
        }
        if !self.device_ids.is_empty() {
            // DeviceAssignmentProto { replica_count, computation_count,
            //   computation_devices: [{ replica_device_ids }] }: one computation (partition)
            // per entry, each listing its device per replica.
            let computations: Vec<Vec<i32>> = match self.partitioned {
                true => self.device_ids.iter().map(|&id| vec![id]).collect(),
                false => vec![self.device_ids.clone()],
            };
            let mut assignment = Vec::new();
            proto::varint_field(&mut assignment, 1, replicas);
            proto::varint_field(&mut assignment, 2, partitions);
            for ids in computations {
                let mut packed = Vec::new();
                for id in ids {
                    proto::varint(&mut packed, id as i64 as u64);
                }
                let mut computation = Vec::new();
                proto::bytes_field(&mut computation, 1, &packed); // packed replica_device_ids
                proto::bytes_field(&mut assignment, 3, &computation);
            }
            proto::bytes_field(&mut build, 9, &assignment);
        }
        let mut out = Vec::new();
        proto::bytes_field(&mut out, 3, &build); // executable_build_options
        if self.strict_rounding {
            // env_option_overrides (field 7, map<string, OptionOverrideProto>): the
            // DebugOptions flag `xla_allow_excess_precision` = false (bool_field = 2).
            let mut value = Vec::new();
            proto::varint_field(&mut value, 2, 0);
            let mut entry = Vec::new();
            proto::bytes_field(&mut entry, 1, b"xla_allow_excess_precision");
            proto::bytes_field(&mut entry, 2, &value);
            proto::bytes_field(&mut out, 7, &entry);
        }
        out
    }
}

/// The few protobuf wire-format writers the compile options need.
mod proto {
    pub fn varint(out: &mut Vec<u8>, mut v: u64) {
        while v >= 0x80 {
            out.push((v as u8) | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    }
    pub fn varint_field(out: &mut Vec<u8>, field: u32, v: u64) {
        // Wire type 0 (varint) in the low three bits.
        varint(out, u64::from(field) << 3);
        varint(out, v);
    }
    pub fn bytes_field(out: &mut Vec<u8>, field: u32, bytes: &[u8]) {
        varint(out, (u64::from(field) << 3) | 2);
        varint(out, bytes.len() as u64);
        out.extend_from_slice(bytes);
    }
}

/// Options of one execution.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExecuteOptions {
    /// Inputs that must survive the call even where the program aliases them to an output
    /// (`tf.aliasing_output` / `jax.buffer_donor`). Every other aliased input is donated:
    /// its buffer is consumed and reads as deleted afterwards.
    pub non_donatable_input_indices: Vec<i64>,
    /// Identifies the launch among collective-communicating executions (0 is fine alone).
    pub launch_id: i32,
}

impl ExecuteOptions {
    /// Donate every input the program aliases.
    pub fn new() -> Self {
        Self::default()
    }

    /// Keeps the inputs at `indices` alive even where the program aliases them.
    pub fn keep_inputs(mut self, indices: &[i64]) -> Self {
        self.non_donatable_input_indices.extend_from_slice(indices);
        self
    }
}

/// The outputs of an execution and the events that signal each device's completion.
pub struct Execution {
    /// One list of output buffers per device, in the order the arguments were given.
    pub outputs: Vec<Vec<Buffer>>,
    /// One completion event per device.
    pub events: Vec<Event>,
}

impl Execution {
    /// Waits for every device; returns the outputs.
    pub fn wait(self) -> Result<Vec<Vec<Buffer>>> {
        for e in &self.events {
            e.wait()?;
        }
        Ok(self.outputs)
    }
}

/// A compiled program loaded on its devices (`PJRT_LoadedExecutable`), freed on drop.
pub struct LoadedExecutable {
    client: Arc<ClientInner>,
    raw: *mut ffi::PJRT_LoadedExecutable,
    num_outputs: usize,
    /// Devices it runs on (one argument list each), asked once so `execute` makes no extra
    /// plugin call.
    num_devices: usize,
}

// SAFETY: PJRT executables may be executed concurrently from any thread.
unsafe impl Send for LoadedExecutable {}
// SAFETY: as above; all methods take `&self`.
unsafe impl Sync for LoadedExecutable {}

/// An owned `PJRT_Executable` (the compiled, not loaded, view), freed on drop.
struct ExecutableView<'a> {
    client: &'a ClientInner,
    raw: *mut ffi::PJRT_Executable,
}

impl Drop for ExecutableView<'_> {
    fn drop(&mut self) {
        let mut args = ffi::PJRT_Executable_Destroy_Args::new();
        args.executable = self.raw;
        let _ = pjrt_call!(self.client.api(), PJRT_Executable_Destroy, &mut args);
        leak::destroyed(ObjectKind::Executable, self.raw as *const ());
    }
}

impl Client {
    /// Compiles a StableHLO module given as MLIR text (format `mlir`).
    ///
    /// A program the plugin rejects gives [`PjrtError::Compile`] with the plugin's message
    /// and, when the message names a line, that line of `stablehlo`.
    pub fn compile(&self, stablehlo: &str, options: &CompileOptions) -> Result<LoadedExecutable> {
        let mut code = stablehlo.as_bytes().to_vec();
        let format = "mlir";
        let mut program = ffi::PJRT_Program::new();
        program.code = code.as_mut_ptr() as *mut c_char;
        program.code_size = code.len();
        program.format = format.as_ptr() as *const c_char;
        program.format_size = format.len();
        let opts = options.to_proto();
        let mut args = ffi::PJRT_Client_Compile_Args::new();
        args.client = self.inner.raw;
        args.program = &program;
        args.compile_options = opts.as_ptr() as *const c_char;
        args.compile_options_size = opts.len();
        match pjrt_call!(self.inner.api(), PJRT_Client_Compile, &mut args) {
            Ok(()) => {}
            Err(PjrtError::Plugin { code, message, .. }) => {
                let line = offending_line(&message, stablehlo);
                return Err(PjrtError::Compile {
                    code,
                    message,
                    line,
                });
            }
            Err(e) => return Err(e),
        }
        LoadedExecutable::wrap(&self.inner, args.executable)
    }

    /// Loads an executable produced by [`LoadedExecutable::serialize`] with the same plugin
    /// version.
    pub fn deserialize_executable(&self, bytes: &[u8]) -> Result<LoadedExecutable> {
        let mut args = ffi::PJRT_Executable_DeserializeAndLoad_Args::new();
        args.client = self.inner.raw;
        args.serialized_executable = bytes.as_ptr() as *const c_char;
        args.serialized_executable_size = bytes.len();
        pjrt_call!(
            self.inner.api(),
            PJRT_Executable_DeserializeAndLoad,
            &mut args
        )?;
        LoadedExecutable::wrap(&self.inner, args.loaded_executable)
    }
}

/// Finds the program line a compiler diagnostic points at. MLIR diagnostics name a
/// location as `<source>:LINE:COL`; the first such location inside the program wins.
fn offending_line(message: &str, program: &str) -> Option<SourceLine> {
    let lines: Vec<&str> = program.lines().collect();
    let bytes = message.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b':' {
            let start = i + 1;
            let mut j = start;
            while j < bytes.len() && bytes[j].is_ascii_digit() {
                j += 1;
            }
            if j > start && j < bytes.len() && bytes[j] == b':' {
                let k = j + 1;
                let mut m = k;
                while m < bytes.len() && bytes[m].is_ascii_digit() {
                    m += 1;
                }
                if m > k {
                    if let Ok(line) = message[start..j].parse::<usize>() {
                        if line >= 1 && line <= lines.len() {
                            return Some(SourceLine {
                                line,
                                text: lines[line - 1].to_string(),
                            });
                        }
                    }
                }
            }
        }
        i += 1;
    }
    None
}

impl LoadedExecutable {
    fn wrap(client: &Arc<ClientInner>, raw: *mut ffi::PJRT_LoadedExecutable) -> Result<Self> {
        if raw.is_null() {
            return Err(PjrtError::Plugin {
                function: "PJRT_Client_Compile",
                code: super::ErrorCode::Internal,
                message: "the plugin returned no executable and no error".into(),
            });
        }
        leak::created(ObjectKind::LoadedExecutable, raw as *const ());
        let mut exe = LoadedExecutable {
            client: client.clone(),
            raw,
            num_outputs: 0,
            num_devices: 0,
        };
        let count = {
            let view = exe.view()?;
            let mut args = ffi::PJRT_Executable_NumOutputs_Args::new();
            args.executable = view.raw;
            pjrt_call!(client.api(), PJRT_Executable_NumOutputs, &mut args)?;
            args.count
        };
        exe.num_outputs = count;
        exe.num_devices = exe.addressable_devices()?.len();
        Ok(exe)
    }

    fn view(&self) -> Result<ExecutableView<'_>> {
        let mut args = ffi::PJRT_LoadedExecutable_GetExecutable_Args::new();
        args.loaded_executable = self.raw;
        pjrt_call!(
            self.client.api(),
            PJRT_LoadedExecutable_GetExecutable,
            &mut args
        )?;
        leak::created(ObjectKind::Executable, args.executable as *const ());
        Ok(ExecutableView {
            client: &self.client,
            raw: args.executable,
        })
    }

    /// Number of outputs per device.
    pub fn num_outputs(&self) -> usize {
        self.num_outputs
    }

    /// Number of replicas the program was compiled for.
    pub fn num_replicas(&self) -> Result<usize> {
        let view = self.view()?;
        let mut args = ffi::PJRT_Executable_NumReplicas_Args::new();
        args.executable = view.raw;
        pjrt_call!(self.client.api(), PJRT_Executable_NumReplicas, &mut args)?;
        Ok(args.count)
    }

    /// Number of SPMD partitions the program was compiled for.
    pub fn num_partitions(&self) -> Result<usize> {
        let view = self.view()?;
        let mut args = ffi::PJRT_Executable_NumPartitions_Args::new();
        args.executable = view.raw;
        pjrt_call!(self.client.api(), PJRT_Executable_NumPartitions, &mut args)?;
        Ok(args.count)
    }

    /// The executable's name (the module's name).
    pub fn name(&self) -> Result<String> {
        let view = self.view()?;
        let mut args = ffi::PJRT_Executable_Name_Args::new();
        args.executable = view.raw;
        pjrt_call!(self.client.api(), PJRT_Executable_Name, &mut args)?;
        // SAFETY: the name is owned by the executable view, alive until `view` drops.
        Ok(unsafe { string_from(args.executable_name, args.executable_name_size) })
    }

    /// The program as the compiler left it (after SPMD partitioning and every pass): its
    /// format (`hlo_with_config`: a serialized `HloModuleProtoWithConfig`) and bytes.
    pub fn optimized_program(&self) -> Result<(String, Vec<u8>)> {
        let view = self.view()?;
        let mut program = ffi::PJRT_Program::new();
        let mut args = ffi::PJRT_Executable_OptimizedProgram_Args::new();
        args.executable = view.raw;
        args.program = &mut program;
        // First with no buffer: the plugin reports the size it needs.
        pjrt_call!(
            self.client.api(),
            PJRT_Executable_OptimizedProgram,
            &mut args
        )?;
        let mut code = vec![0u8; program.code_size];
        program.code = code.as_mut_ptr().cast();
        args.program = &mut program;
        pjrt_call!(
            self.client.api(),
            PJRT_Executable_OptimizedProgram,
            &mut args
        )?;
        code.truncate(program.code_size);
        // SAFETY: the format string is owned by the plugin, alive with the executable view.
        let format = unsafe { string_from(program.format, program.format_size) };
        Ok((format, code))
    }

    /// The plugin's fingerprint of the compiled program, when it computes one.
    pub fn fingerprint(&self) -> Result<String> {
        let view = self.view()?;
        let mut args = ffi::PJRT_Executable_Fingerprint_Args::new();
        args.executable = view.raw;
        pjrt_call!(self.client.api(), PJRT_Executable_Fingerprint, &mut args)?;
        // SAFETY: owned by the executable view, alive until `view` drops.
        Ok(unsafe {
            string_from(
                args.executable_fingerprint,
                args.executable_fingerprint_size,
            )
        })
    }

    /// The devices the executable runs on, one per replica, in argument-list order.
    pub fn addressable_devices(&self) -> Result<Vec<Device>> {
        let mut args = ffi::PJRT_LoadedExecutable_AddressableDevices_Args::new();
        args.executable = self.raw;
        pjrt_call!(
            self.client.api(),
            PJRT_LoadedExecutable_AddressableDevices,
            &mut args
        )?;
        let client = Client {
            inner: self.client.clone(),
        };
        // SAFETY: the array is owned by the executable and holds the given count.
        Ok(unsafe { client.wrap_devices(args.addressable_devices, args.num_addressable_devices) })
    }

    /// Serializes the compiled program (`PJRT_Executable_Serialize`); load it back with
    /// [`Client::deserialize_executable`]. Plugins that cannot answer `Unimplemented`.
    pub fn serialize(&self) -> Result<Vec<u8>> {
        let view = self.view()?;
        let mut args = ffi::PJRT_Executable_Serialize_Args::new();
        args.executable = view.raw;
        pjrt_call!(self.client.api(), PJRT_Executable_Serialize, &mut args)?;
        if !args.serialized_executable.is_null() {
            leak::created(
                ObjectKind::SerializedExecutable,
                args.serialized_executable as *const (),
            );
        }
        // SAFETY: the bytes live until the deleter runs below.
        let bytes = if args.serialized_bytes.is_null() {
            Vec::new()
        } else {
            unsafe {
                std::slice::from_raw_parts(
                    args.serialized_bytes as *const u8,
                    args.serialized_bytes_size,
                )
            }
            .to_vec()
        };
        if let Some(deleter) = args.serialized_executable_deleter {
            if !args.serialized_executable.is_null() {
                // SAFETY: the deleter the plugin gave for exactly this object, called once.
                unsafe { deleter(args.serialized_executable) };
                leak::destroyed(
                    ObjectKind::SerializedExecutable,
                    args.serialized_executable as *const (),
                );
            }
        }
        Ok(bytes)
    }

    /// Executes asynchronously: `arguments[d]` are the inputs for the executable's `d`-th
    /// device. Returns the outputs (device-resident, possibly still being computed) and one
    /// completion event per device.
    pub fn execute_async(
        &self,
        arguments: &[&[&Buffer]],
        options: &ExecuteOptions,
    ) -> Result<Execution> {
        let devices = self.num_devices;
        if arguments.len() != devices {
            return Err(PjrtError::InvalidArgument(format!(
                "the executable runs on {devices} device(s) but {} argument list(s) were given; pass one list per device",
                arguments.len()
            )));
        }
        let num_args = arguments.first().map_or(0, |a| a.len());
        for (d, list) in arguments.iter().enumerate() {
            if list.len() != num_args {
                return Err(PjrtError::InvalidArgument(format!(
                    "argument list {d} has {} buffers but list 0 has {num_args}; every device takes the same parameters",
                    list.len()
                )));
            }
            for b in list.iter() {
                if !Arc::ptr_eq(&b.client, &self.client) {
                    return Err(PjrtError::InvalidArgument(format!(
                        "argument list {d} holds a buffer of another client; copy it through the host first"
                    )));
                }
            }
        }
        let raw_args: Vec<Vec<*mut ffi::PJRT_Buffer>> = arguments
            .iter()
            .map(|l| l.iter().map(|b| b.raw).collect())
            .collect();
        let arg_ptrs: Vec<*const *mut ffi::PJRT_Buffer> =
            raw_args.iter().map(|l| l.as_ptr()).collect();
        let mut outputs: Vec<Vec<*mut ffi::PJRT_Buffer>> = (0..devices)
            .map(|_| vec![std::ptr::null_mut(); self.num_outputs])
            .collect();
        let out_ptrs: Vec<*mut *mut ffi::PJRT_Buffer> =
            outputs.iter_mut().map(|l| l.as_mut_ptr()).collect();
        let mut events: Vec<*mut ffi::PJRT_Event> = vec![std::ptr::null_mut(); devices];

        let mut opts = ffi::PJRT_ExecuteOptions::new();
        opts.launch_id = options.launch_id;
        opts.non_donatable_input_indices = options.non_donatable_input_indices.as_ptr();
        opts.num_non_donatable_input_indices = options.non_donatable_input_indices.len();

        let mut args = ffi::PJRT_LoadedExecutable_Execute_Args::new();
        args.executable = self.raw;
        args.options = &mut opts;
        args.argument_lists = arg_ptrs.as_ptr();
        args.num_devices = devices;
        args.num_args = num_args;
        args.output_lists = out_ptrs.as_ptr();
        args.device_complete_events = events.as_mut_ptr();
        let result = pjrt_call!(self.client.api(), PJRT_LoadedExecutable_Execute, &mut args);
        // Take ownership of whatever the plugin returned, even on error, so nothing leaks.
        let outputs: Vec<Vec<Buffer>> = outputs
            .into_iter()
            .map(|l| {
                l.into_iter()
                    .filter(|b| !b.is_null())
                    .map(|b| Buffer::wrap(&self.client, b))
                    .collect()
            })
            .collect();
        let events: Vec<Event> = events
            .into_iter()
            .filter_map(|e| Event::wrap(&self.client, e))
            .collect();
        result?;
        Ok(Execution { outputs, events })
    }

    /// Executes and waits: `arguments[d]` are the inputs for the `d`-th device; returns one
    /// list of outputs per device.
    pub fn execute(
        &self,
        arguments: &[&[&Buffer]],
        options: &ExecuteOptions,
    ) -> Result<Vec<Vec<Buffer>>> {
        self.execute_async(arguments, options)?.wait()
    }

    /// Executes a single-device executable on `arguments` and waits for its outputs.
    pub fn execute_one(&self, arguments: &[&Buffer]) -> Result<Vec<Buffer>> {
        let mut out = self.execute(&[arguments], &ExecuteOptions::default())?;
        Ok(out.pop().unwrap_or_default())
    }
}

impl Drop for LoadedExecutable {
    fn drop(&mut self) {
        let mut args = ffi::PJRT_LoadedExecutable_Destroy_Args::new();
        args.executable = self.raw;
        let _ = pjrt_call!(self.client.api(), PJRT_LoadedExecutable_Destroy, &mut args);
        leak::destroyed(ObjectKind::LoadedExecutable, self.raw as *const ());
    }
}

impl fmt::Debug for LoadedExecutable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LoadedExecutable({} outputs)", self.num_outputs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compile_options_encode_replicas_and_assignment() {
        let o = CompileOptions {
            device_ids: vec![0, 3],
            ..CompileOptions::default()
        };
        let p = o.to_proto();
        // field 3 (executable_build_options), length-delimited
        assert_eq!(p[0], (3 << 3) | 2);
        let inner = &p[2..];
        assert_eq!(inner.len(), p[1] as usize);
        // device_ordinal = -1 is a 10-byte varint
        assert_eq!(inner[0], 1 << 3);
        assert_eq!(
            &inner[1..11],
            &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]
        );
        // num_replicas = 2, num_partitions = 1
        assert_eq!(&inner[11..15], &[4 << 3, 2, 5 << 3, 1]);
        // device_assignment: {1:2, 2:1, 3:{1:[0,3]}}
        assert_eq!(
            &inner[15..],
            &[(9 << 3) | 2, 10, 8, 2, 16, 1, 26, 4, 10, 2, 0, 3]
        );
    }

    #[test]
    fn compile_options_encode_spmd_partitions() {
        let o = CompileOptions {
            device_ids: vec![0, 3],
            partitioned: true,
            ..CompileOptions::default()
        };
        let p = o.to_proto();
        let inner = &p[2..];
        assert_eq!(inner.len(), p[1] as usize);
        // num_replicas = 1, num_partitions = 2, use_spmd_partitioning = true
        assert_eq!(&inner[11..17], &[4 << 3, 1, 5 << 3, 2, 6 << 3, 1]);
        // device_assignment: {1:1, 2:2, 3:{1:[0]}, 3:{1:[3]}}
        assert_eq!(
            &inner[17..],
            &[
                (9 << 3) | 2,
                14,
                8,
                1,
                16,
                2,
                26,
                3,
                10,
                1,
                0,
                26,
                3,
                10,
                1,
                3
            ]
        );
    }

    #[test]
    fn offending_line_is_found() {
        let program = "module {\n  func.func @main() {\n    bogus.op\n  }\n}\n";
        let l = offending_line("<unknown>:3:5: error: unknown op", program).expect("a line");
        assert_eq!(l.line, 3);
        assert_eq!(l.text.trim(), "bogus.op");
        assert!(offending_line("no location here", program).is_none());
        assert!(offending_line("x:99:1: out of range", program).is_none());
    }
}
