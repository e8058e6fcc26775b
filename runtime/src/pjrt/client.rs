//! `Client` (one per plugin and configuration) and its `Device`s.

use std::ffi::c_char;
use std::fmt;
use std::sync::Arc;

use super::api::{pjrt_call, string_from, Plugin, PluginInner};
use super::error::{PjrtError, Result};
use super::ffi::{self, Args};
use super::kv;
use super::leak::{self, ObjectKind};

/// A value of a client create option.
#[derive(Debug, Clone, PartialEq)]
pub enum OptionValue {
    /// `PJRT_NamedValue_kString`
    String(String),
    /// `PJRT_NamedValue_kInt64`
    Int64(i64),
    /// `PJRT_NamedValue_kInt64List`
    Int64List(Vec<i64>),
    /// `PJRT_NamedValue_kFloat`
    Float(f32),
    /// `PJRT_NamedValue_kBool`
    Bool(bool),
}

/// Named options for `PJRT_Client_Create`, e.g. `cpu_device_count` for the XLA CPU plugin.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ClientOptions {
    /// The options, in order.
    pub options: Vec<(String, OptionValue)>,
}

impl ClientOptions {
    /// No options: the plugin's defaults.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds an option.
    pub fn with(mut self, name: impl Into<String>, value: OptionValue) -> Self {
        self.options.push((name.into(), value));
        self
    }

    /// Adds an integer option.
    pub fn int64(self, name: impl Into<String>, value: i64) -> Self {
        self.with(name, OptionValue::Int64(value))
    }

    /// The XLA CPU plugin's `cpu_device_count`: how many CPU devices the client exposes.
    pub fn cpu_device_count(self, n: i64) -> Self {
        self.int64("cpu_device_count", n)
    }
}

/// The owner of a `PJRT_Client`; destroyed when the last `Client`, `Device`, `Buffer` or
/// executable that refers to it is dropped.
pub(crate) struct ClientInner {
    pub(crate) plugin: Plugin,
    pub(crate) raw: *mut ffi::PJRT_Client,
    /// The store behind the key-value callbacks, which the plugin may call until the client
    /// is destroyed (dropped after it).
    _store: Option<kv::UserArg>,
}

// SAFETY: PJRT clients are thread-safe: the C API allows calls on one client from any
// thread, and zoo never mutates the handle after creation.
unsafe impl Send for ClientInner {}
// SAFETY: as above.
unsafe impl Sync for ClientInner {}

impl ClientInner {
    pub(crate) fn api(&self) -> &PluginInner {
        &self.plugin.inner
    }
}

impl Drop for ClientInner {
    fn drop(&mut self) {
        let mut args = ffi::PJRT_Client_Destroy_Args::new();
        args.client = self.raw;
        // A failure to destroy cannot be reported from `drop`; the error object itself is
        // still freed by `pjrt_call!`.
        let _ = pjrt_call!(self.api(), PJRT_Client_Destroy, &mut args);
        leak::destroyed(ObjectKind::Client, self.raw as *const ());
    }
}

/// A PJRT client: the entry point to a plugin's devices, transfers and compiler.
#[derive(Clone)]
pub struct Client {
    pub(crate) inner: Arc<ClientInner>,
}

impl Plugin {
    /// Creates a client with the given options (`PJRT_Client_Create`).
    pub fn client(&self, options: &ClientOptions) -> Result<Client> {
        self.create_client(options, None)
    }

    /// Creates a client of a multi-process job: `store` serves the key-value callbacks the
    /// plugin exchanges its topology through (the GPU plugin also wants `node_id` and
    /// `num_nodes` in `options`).
    pub fn client_with_store(
        &self,
        options: &ClientOptions,
        store: Arc<dyn kv::KeyValueStore>,
    ) -> Result<Client> {
        self.create_client(options, Some(Box::new(store)))
    }

    fn create_client(&self, options: &ClientOptions, store: Option<kv::UserArg>) -> Result<Client> {
        // Owned storage the `PJRT_NamedValue`s point into; it outlives the call.
        let mut ints: Vec<Vec<i64>> = Vec::new();
        for (_, v) in &options.options {
            if let OptionValue::Int64List(l) = v {
                ints.push(l.clone());
            }
        }
        let mut named = Vec::with_capacity(options.options.len());
        let mut list_idx = 0;
        for (name, value) in &options.options {
            let mut nv = ffi::PJRT_NamedValue::new();
            nv.name = name.as_ptr() as *const c_char;
            nv.name_size = name.len();
            match value {
                OptionValue::String(s) => {
                    nv.type_ = ffi::PJRT_NamedValue_kString;
                    nv.value.string_value = s.as_ptr() as *const c_char;
                    nv.value_size = s.len();
                }
                OptionValue::Int64(v) => {
                    nv.type_ = ffi::PJRT_NamedValue_kInt64;
                    nv.value.int64_value = *v;
                    nv.value_size = 1;
                }
                OptionValue::Int64List(_) => {
                    nv.type_ = ffi::PJRT_NamedValue_kInt64List;
                    nv.value.int64_array_value = ints[list_idx].as_ptr();
                    nv.value_size = ints[list_idx].len();
                    list_idx += 1;
                }
                OptionValue::Float(v) => {
                    nv.type_ = ffi::PJRT_NamedValue_kFloat;
                    nv.value.float_value = *v;
                    nv.value_size = 1;
                }
                OptionValue::Bool(v) => {
                    nv.type_ = ffi::PJRT_NamedValue_kBool;
                    nv.value.bool_value = *v;
                    nv.value_size = 1;
                }
            }
            named.push(nv);
        }
        let mut args = ffi::PJRT_Client_Create_Args::new();
        args.create_options = named.as_ptr();
        args.num_options = named.len();
        if let Some(store) = &store {
            kv::install(&mut args, store);
        }
        pjrt_call!(&self.inner, PJRT_Client_Create, &mut args)?;
        if args.client.is_null() {
            return Err(PjrtError::Plugin {
                function: "PJRT_Client_Create",
                code: super::ErrorCode::Internal,
                message: "the plugin returned no client and no error".into(),
            });
        }
        leak::created(ObjectKind::Client, args.client as *const ());
        Ok(Client {
            inner: Arc::new(ClientInner {
                plugin: self.clone(),
                raw: args.client,
                _store: store,
            }),
        })
    }
}

impl Client {
    /// The plugin behind this client.
    pub fn plugin(&self) -> &Plugin {
        &self.inner.plugin
    }

    /// The platform name, e.g. `cpu`, `cuda`, `tpu`.
    pub fn platform_name(&self) -> Result<String> {
        let mut args = ffi::PJRT_Client_PlatformName_Args::new();
        args.client = self.inner.raw;
        pjrt_call!(self.inner.api(), PJRT_Client_PlatformName, &mut args)?;
        // SAFETY: the name is owned by the client, which `self` keeps alive.
        Ok(unsafe { string_from(args.platform_name, args.platform_name_size) })
    }

    /// The platform version string (e.g. the libtpu or CUDA version; `cpu` may be empty).
    pub fn platform_version(&self) -> Result<String> {
        let mut args = ffi::PJRT_Client_PlatformVersion_Args::new();
        args.client = self.inner.raw;
        pjrt_call!(self.inner.api(), PJRT_Client_PlatformVersion, &mut args)?;
        // SAFETY: the string is owned by the client, which `self` keeps alive.
        Ok(unsafe { string_from(args.platform_version, args.platform_version_size) })
    }

    /// This process's index (0 on a single host).
    pub fn process_index(&self) -> Result<i32> {
        let mut args = ffi::PJRT_Client_ProcessIndex_Args::new();
        args.client = self.inner.raw;
        pjrt_call!(self.inner.api(), PJRT_Client_ProcessIndex, &mut args)?;
        Ok(args.process_index)
    }

    /// Every device the runtime sees, addressable or not.
    pub fn devices(&self) -> Result<Vec<Device>> {
        let mut args = ffi::PJRT_Client_Devices_Args::new();
        args.client = self.inner.raw;
        pjrt_call!(self.inner.api(), PJRT_Client_Devices, &mut args)?;
        // SAFETY: the array is owned by the client and holds `num_devices` handles.
        Ok(unsafe { self.wrap_devices(args.devices, args.num_devices) })
    }

    /// The devices this process can put buffers on and run on.
    pub fn addressable_devices(&self) -> Result<Vec<Device>> {
        let mut args = ffi::PJRT_Client_AddressableDevices_Args::new();
        args.client = self.inner.raw;
        pjrt_call!(self.inner.api(), PJRT_Client_AddressableDevices, &mut args)?;
        // SAFETY: the array is owned by the client and holds the given number of handles.
        Ok(unsafe { self.wrap_devices(args.addressable_devices, args.num_addressable_devices) })
    }

    /// The addressable device whose id is `id`.
    pub fn device(&self, id: i32) -> Result<Device> {
        let devices = self.addressable_devices()?;
        let ids: Vec<String> = devices
            .iter()
            .map(|d| d.id().map(|i| i.to_string()).unwrap_or_else(|_| "?".into()))
            .collect();
        for d in devices {
            if d.id()? == id {
                return Ok(d);
            }
        }
        Err(PjrtError::InvalidArgument(format!(
            "no addressable device with id {id}; this client has ids [{}]",
            ids.join(", ")
        )))
    }

    /// # Safety
    /// `ptr` must be null or point at `n` device handles owned by this client.
    pub(crate) unsafe fn wrap_devices(
        &self,
        ptr: *const *mut ffi::PJRT_Device,
        n: usize,
    ) -> Vec<Device> {
        if ptr.is_null() || n == 0 {
            return Vec::new();
        }
        // SAFETY: guaranteed by the caller.
        let raw = unsafe { std::slice::from_raw_parts(ptr, n) };
        raw.iter()
            .map(|&d| Device {
                client: self.inner.clone(),
                raw: d,
            })
            .collect()
    }
}

/// Two `Client` values are equal when they share one `PJRT_Client`.
impl PartialEq for Client {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}
impl Eq for Client {}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("plugin", &self.inner.plugin)
            .finish()
    }
}

/// A device of a client. Devices are owned by the client; this handle keeps it alive.
#[derive(Clone)]
pub struct Device {
    pub(crate) client: Arc<ClientInner>,
    pub(crate) raw: *mut ffi::PJRT_Device,
}

// SAFETY: a device handle is an immutable pointer into a thread-safe client.
unsafe impl Send for Device {}
// SAFETY: as above.
unsafe impl Sync for Device {}

impl PartialEq for Device {
    fn eq(&self, other: &Self) -> bool {
        self.raw == other.raw
    }
}
impl Eq for Device {}

/// Memory statistics of a device (`PJRT_Device_MemoryStats`). Fields a plugin does not
/// report are `None`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MemoryStats {
    /// Bytes allocated now.
    pub bytes_in_use: i64,
    /// Most bytes ever allocated at once.
    pub peak_bytes_in_use: Option<i64>,
    /// Number of allocations.
    pub num_allocs: Option<i64>,
    /// Largest single allocation.
    pub largest_alloc_size: Option<i64>,
    /// Memory the device may use: its budget.
    pub bytes_limit: Option<i64>,
    /// Bytes reserved.
    pub bytes_reserved: Option<i64>,
    /// Peak bytes reserved.
    pub peak_bytes_reserved: Option<i64>,
    /// Largest free block.
    pub largest_free_block_bytes: Option<i64>,
    /// Peak allocated bytes (plugins at PJRT 0.113 and newer).
    pub peak_allocated_bytes: Option<i64>,
}

impl Device {
    fn description(&self) -> Result<*mut ffi::PJRT_DeviceDescription> {
        let mut args = ffi::PJRT_Device_GetDescription_Args::new();
        args.device = self.raw;
        pjrt_call!(self.client.api(), PJRT_Device_GetDescription, &mut args)?;
        Ok(args.device_description)
    }

    /// The device id, unique across the client.
    pub fn id(&self) -> Result<i32> {
        let mut args = ffi::PJRT_DeviceDescription_Id_Args::new();
        args.device_description = self.description()?;
        pjrt_call!(self.client.api(), PJRT_DeviceDescription_Id, &mut args)?;
        Ok(args.id)
    }

    /// The id of the process that owns the device.
    pub fn process_index(&self) -> Result<i32> {
        let mut args = ffi::PJRT_DeviceDescription_ProcessIndex_Args::new();
        args.device_description = self.description()?;
        pjrt_call!(
            self.client.api(),
            PJRT_DeviceDescription_ProcessIndex,
            &mut args
        )?;
        Ok(args.process_index)
    }

    /// The device kind, e.g. `cpu` or `TPU v5 lite`.
    pub fn kind(&self) -> Result<String> {
        let mut args = ffi::PJRT_DeviceDescription_Kind_Args::new();
        args.device_description = self.description()?;
        pjrt_call!(self.client.api(), PJRT_DeviceDescription_Kind, &mut args)?;
        // SAFETY: the string is owned by the description, which the client keeps alive.
        Ok(unsafe { string_from(args.value, args.value_size) })
    }

    /// A short human-readable name, e.g. `CpuDevice(id=0)`.
    pub fn description_string(&self) -> Result<String> {
        let mut args = ffi::PJRT_DeviceDescription_ToString_Args::new();
        args.device_description = self.description()?;
        pjrt_call!(
            self.client.api(),
            PJRT_DeviceDescription_ToString,
            &mut args
        )?;
        // SAFETY: the string is owned by the description, which the client keeps alive.
        Ok(unsafe { string_from(args.value, args.value_size) })
    }

    /// A verbose description for debugging.
    pub fn debug_string(&self) -> Result<String> {
        let mut args = ffi::PJRT_DeviceDescription_DebugString_Args::new();
        args.device_description = self.description()?;
        pjrt_call!(
            self.client.api(),
            PJRT_DeviceDescription_DebugString,
            &mut args
        )?;
        // SAFETY: the string is owned by the description, which the client keeps alive.
        Ok(unsafe { string_from(args.value, args.value_size) })
    }

    /// Whether this process can address the device.
    pub fn is_addressable(&self) -> Result<bool> {
        let mut args = ffi::PJRT_Device_IsAddressable_Args::new();
        args.device = self.raw;
        pjrt_call!(self.client.api(), PJRT_Device_IsAddressable, &mut args)?;
        Ok(args.is_addressable)
    }

    /// The hardware id local to this host (-1 when the plugin has none).
    pub fn local_hardware_id(&self) -> Result<i32> {
        let mut args = ffi::PJRT_Device_LocalHardwareId_Args::new();
        args.device = self.raw;
        pjrt_call!(self.client.api(), PJRT_Device_LocalHardwareId, &mut args)?;
        Ok(args.local_hardware_id)
    }

    /// The kind of the device's default memory space (e.g. `device`, `unpinned_host`).
    pub fn default_memory_kind(&self) -> Result<String> {
        let mut args = ffi::PJRT_Device_DefaultMemory_Args::new();
        args.device = self.raw;
        pjrt_call!(self.client.api(), PJRT_Device_DefaultMemory, &mut args)?;
        let mut kargs = ffi::PJRT_Memory_Kind_Args::new();
        kargs.memory = args.memory;
        pjrt_call!(self.client.api(), PJRT_Memory_Kind, &mut kargs)?;
        // SAFETY: the string is owned by the memory, which the client keeps alive.
        Ok(unsafe { string_from(kargs.kind, kargs.kind_size) })
    }

    /// The device's memory statistics. Plugins that keep none (the XLA CPU plugin) answer
    /// an error with code `Unimplemented`.
    pub fn memory_stats(&self) -> Result<MemoryStats> {
        let mut a = ffi::PJRT_Device_MemoryStats_Args::new();
        a.device = self.raw;
        pjrt_call!(self.client.api(), PJRT_Device_MemoryStats, &mut a)?;
        let opt = |v: i64, set: bool| set.then_some(v);
        // `peak_allocated_bytes` was appended in 0.113: an older plugin never writes it.
        let newer = self.client.api().minor >= 113;
        Ok(MemoryStats {
            bytes_in_use: a.bytes_in_use,
            peak_bytes_in_use: opt(a.peak_bytes_in_use, a.peak_bytes_in_use_is_set),
            num_allocs: opt(a.num_allocs, a.num_allocs_is_set),
            largest_alloc_size: opt(a.largest_alloc_size, a.largest_alloc_size_is_set),
            bytes_limit: opt(a.bytes_limit, a.bytes_limit_is_set),
            bytes_reserved: opt(a.bytes_reserved, a.bytes_reserved_is_set),
            peak_bytes_reserved: opt(a.peak_bytes_reserved, a.peak_bytes_reserved_is_set),
            largest_free_block_bytes: opt(
                a.largest_free_block_bytes,
                a.largest_free_block_bytes_is_set,
            ),
            peak_allocated_bytes: if newer {
                opt(a.peak_allocated_bytes, a.peak_allocated_bytes_is_set)
            } else {
                None
            },
        })
    }

    /// The client this device belongs to.
    pub fn client(&self) -> Client {
        Client {
            inner: self.client.clone(),
        }
    }
}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.description_string() {
            Ok(s) => write!(f, "{s}"),
            Err(_) => write!(f, "Device({:p})", self.raw),
        }
    }
}
