//! Hand-written `#[repr(C)]` mirror of the PJRT C API header (`xla/pjrt/c/pjrt_c_api.h`).
//!
//! Written against PJRT API **0.114** (`PJRT_API_MAJOR 0`, `PJRT_API_MINOR 114`). Every
//! `*_Args` struct begins with `struct_size`, which a plugin compares with the size it was
//! compiled with: a caller whose struct is smaller is refused. Minor versions only append
//! fields (checked field by field against the 0.81 header shipped in `xla-cpu-pjrt`), so
//! structs laid out as in 0.114 satisfy every plugin from 0.81 to 0.114 (and 0.115, tested);
//! fields appended after a plugin's own minor are simply not read by it, and zoo never reads
//! an output field newer than the plugin (see `MemoryStats`). A newer plugin whose struct
//! grew refuses zoo's smaller one with an error (which zoo surfaces) instead of writing past it.
//!
//! Only the structs zoo calls are declared; the function table (`PJRT_Api`) is complete so
//! its layout is exact, with unused entries typed as [`RawFn`]. C enums are plain
//! integers so that an all-zero struct is a valid value.
// The whole header is mirrored so the layout is exact: not every entry is used.
#![allow(
    dead_code,
    non_camel_case_types,
    non_snake_case,
    non_upper_case_globals,
    missing_docs
)]

use std::ffi::{c_char, c_int, c_void};
use std::mem::{offset_of, size_of};

/// The `PJRT_API_MAJOR` zoo speaks.
pub const PJRT_API_MAJOR: i32 = 0;
/// The `PJRT_API_MINOR` of the header these structs mirror.
pub const PJRT_API_MINOR: i32 = 114;

// Opaque handles owned by the plugin.
#[repr(C)]
pub struct PJRT_Error {
    _p: [u8; 0],
}
#[repr(C)]
pub struct PJRT_Client {
    _p: [u8; 0],
}
#[repr(C)]
pub struct PJRT_Device {
    _p: [u8; 0],
}
#[repr(C)]
pub struct PJRT_DeviceDescription {
    _p: [u8; 0],
}
#[repr(C)]
pub struct PJRT_Memory {
    _p: [u8; 0],
}
#[repr(C)]
pub struct PJRT_Event {
    _p: [u8; 0],
}
#[repr(C)]
pub struct PJRT_Buffer {
    _p: [u8; 0],
}
#[repr(C)]
pub struct PJRT_Executable {
    _p: [u8; 0],
}
#[repr(C)]
pub struct PJRT_LoadedExecutable {
    _p: [u8; 0],
}
#[repr(C)]
pub struct PJRT_SerializedExecutable {
    _p: [u8; 0],
}

/// `PJRT_Error_Code` (abseil status codes).
pub type PJRT_Error_Code = c_int;
/// `PJRT_NamedValue_Type`.
pub type PJRT_NamedValue_Type = c_int;
pub const PJRT_NamedValue_kString: PJRT_NamedValue_Type = 0;
pub const PJRT_NamedValue_kInt64: PJRT_NamedValue_Type = 1;
pub const PJRT_NamedValue_kInt64List: PJRT_NamedValue_Type = 2;
pub const PJRT_NamedValue_kFloat: PJRT_NamedValue_Type = 3;
pub const PJRT_NamedValue_kBool: PJRT_NamedValue_Type = 4;
/// `PJRT_Buffer_Type`; values are listed in [`crate::pjrt::ElementType`].
pub type PJRT_Buffer_Type = c_int;
/// `PJRT_HostBufferSemantics`.
pub type PJRT_HostBufferSemantics = c_int;
pub const PJRT_HostBufferSemantics_kImmutableOnlyDuringCall: PJRT_HostBufferSemantics = 0;
pub const PJRT_HostBufferSemantics_kImmutableUntilTransferCompletes: PJRT_HostBufferSemantics = 1;

/// Every args struct: `struct_size` is `offsetof(last) + sizeof(last)`, as the header's
/// `PJRT_STRUCT_SIZE` macro computes it (not `sizeof`, which adds tail padding).
pub trait Args: Sized {
    /// `<Name>_STRUCT_SIZE` of the header.
    const STRUCT_SIZE: usize;
    /// An all-zero struct with `struct_size` set: null pointers, zero counts, `false`.
    fn new() -> Self;
}

macro_rules! args {
    ($name:ident, $last:ident : $lt:ty) => {
        impl Args for $name {
            const STRUCT_SIZE: usize = offset_of!($name, $last) + size_of::<$lt>();
            fn new() -> Self {
                // SAFETY: every field of these structs is a raw pointer, an integer, a
                // `bool`, an `Option` of a function pointer or a union of those; all-zero
                // bytes are a valid value of each (null, 0, false, None).
                let mut s: Self = unsafe { std::mem::zeroed() };
                s.struct_size = Self::STRUCT_SIZE;
                s
            }
        }
    };
}

#[repr(C)]
pub struct PJRT_Extension_Base {
    pub struct_size: usize,
    pub type_: c_int,
    pub next: *mut PJRT_Extension_Base,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct PJRT_Api_Version {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub major_version: c_int,
    pub minor_version: c_int,
}

#[repr(C)]
pub struct PJRT_Error_Destroy_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub error: *mut PJRT_Error,
}
args!(PJRT_Error_Destroy_Args, error: *mut PJRT_Error);

#[repr(C)]
pub struct PJRT_Error_Message_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub error: *const PJRT_Error,
    pub message: *const c_char,
    pub message_size: usize,
}
args!(PJRT_Error_Message_Args, message_size: usize);

#[repr(C)]
pub struct PJRT_Error_GetCode_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub error: *const PJRT_Error,
    pub code: PJRT_Error_Code,
}
args!(PJRT_Error_GetCode_Args, code: PJRT_Error_Code);

#[repr(C)]
#[derive(Clone, Copy)]
pub union PJRT_NamedValue_Value {
    pub string_value: *const c_char,
    pub int64_value: i64,
    pub int64_array_value: *const i64,
    pub float_value: f32,
    pub bool_value: bool,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct PJRT_NamedValue {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub name: *const c_char,
    pub name_size: usize,
    pub type_: PJRT_NamedValue_Type,
    pub value: PJRT_NamedValue_Value,
    pub value_size: usize,
}
args!(PJRT_NamedValue, value_size: usize);

#[repr(C)]
pub struct PJRT_Plugin_Initialize_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
}
args!(PJRT_Plugin_Initialize_Args, extension_start: *mut PJRT_Extension_Base);

#[repr(C)]
pub struct PJRT_Plugin_Attributes_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub attributes: *const PJRT_NamedValue,
    pub num_attributes: usize,
}
args!(PJRT_Plugin_Attributes_Args, num_attributes: usize);

#[repr(C)]
pub struct PJRT_Event_Destroy_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub event: *mut PJRT_Event,
}
args!(PJRT_Event_Destroy_Args, event: *mut PJRT_Event);

#[repr(C)]
pub struct PJRT_Event_IsReady_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub event: *mut PJRT_Event,
    pub is_ready: bool,
}
args!(PJRT_Event_IsReady_Args, is_ready: bool);

#[repr(C)]
pub struct PJRT_Event_Error_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub event: *mut PJRT_Event,
}
args!(PJRT_Event_Error_Args, event: *mut PJRT_Event);

#[repr(C)]
pub struct PJRT_Event_Await_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub event: *mut PJRT_Event,
}
args!(PJRT_Event_Await_Args, event: *mut PJRT_Event);

/// `void (*)(PJRT_Error* error, void* user_arg)`: called once when the event is ready; the
/// callee owns `error` (null on success).
pub type PJRT_Event_OnReadyCallback = Option<unsafe extern "C" fn(*mut PJRT_Error, *mut c_void)>;

#[repr(C)]
pub struct PJRT_Event_OnReady_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub event: *mut PJRT_Event,
    pub callback: PJRT_Event_OnReadyCallback,
    pub user_arg: *mut c_void,
}
args!(PJRT_Event_OnReady_Args, user_arg: *mut c_void);

/// `PJRT_Error* (*)(PJRT_Error_Code, const char* message, size_t message_size)`: how a
/// caller's callback builds the error it returns; the plugin copies the message.
pub type PJRT_CallbackError =
    Option<unsafe extern "C" fn(PJRT_Error_Code, *const c_char, usize) -> *mut PJRT_Error>;

/// `void (*)(char* value)`: frees a value a key-value callback returned.
pub type PJRT_KeyValueGetCallback_ValueDeleter = Option<unsafe extern "C" fn(*mut c_char)>;

#[repr(C)]
pub struct PJRT_KeyValueGetCallback_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub key: *const c_char,
    pub key_size: usize,
    pub timeout_in_ms: c_int,
    pub callback_error: *mut PJRT_CallbackError,
    pub user_arg: *mut c_void,
    pub value: *mut c_char,
    pub value_size: usize,
    pub value_deleter_callback: PJRT_KeyValueGetCallback_ValueDeleter,
}
args!(
    PJRT_KeyValueGetCallback_Args,
    value_deleter_callback: PJRT_KeyValueGetCallback_ValueDeleter
);
pub type PJRT_KeyValueGetCallback =
    unsafe extern "C" fn(*mut PJRT_KeyValueGetCallback_Args) -> *mut PJRT_Error;

#[repr(C)]
pub struct PJRT_KeyValueTryGetCallback_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub key: *const c_char,
    pub key_size: usize,
    pub callback_error: *mut PJRT_CallbackError,
    pub user_arg: *mut c_void,
    pub value: *mut c_char,
    pub value_size: usize,
    pub value_deleter_callback: PJRT_KeyValueGetCallback_ValueDeleter,
}
args!(
    PJRT_KeyValueTryGetCallback_Args,
    value_deleter_callback: PJRT_KeyValueGetCallback_ValueDeleter
);
pub type PJRT_KeyValueTryGetCallback =
    unsafe extern "C" fn(*mut PJRT_KeyValueTryGetCallback_Args) -> *mut PJRT_Error;

#[repr(C)]
pub struct PJRT_KeyValuePutCallback_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub key: *const c_char,
    pub key_size: usize,
    pub value: *const c_char,
    pub value_size: usize,
    pub callback_error: *mut PJRT_CallbackError,
    pub user_arg: *mut c_void,
}
args!(PJRT_KeyValuePutCallback_Args, user_arg: *mut c_void);
pub type PJRT_KeyValuePutCallback =
    unsafe extern "C" fn(*mut PJRT_KeyValuePutCallback_Args) -> *mut PJRT_Error;

#[repr(C)]
pub struct PJRT_Client_Create_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub create_options: *const PJRT_NamedValue,
    pub num_options: usize,
    pub kv_get_callback: *mut c_void,
    pub kv_get_user_arg: *mut c_void,
    pub kv_put_callback: *mut c_void,
    pub kv_put_user_arg: *mut c_void,
    pub client: *mut PJRT_Client,
    pub kv_try_get_callback: *mut c_void,
    pub kv_try_get_user_arg: *mut c_void,
}
args!(PJRT_Client_Create_Args, kv_try_get_user_arg: *mut c_void);

#[repr(C)]
pub struct PJRT_Client_Destroy_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub client: *mut PJRT_Client,
}
args!(PJRT_Client_Destroy_Args, client: *mut PJRT_Client);

#[repr(C)]
pub struct PJRT_Client_PlatformName_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub client: *mut PJRT_Client,
    pub platform_name: *const c_char,
    pub platform_name_size: usize,
}
args!(PJRT_Client_PlatformName_Args, platform_name_size: usize);

#[repr(C)]
pub struct PJRT_Client_ProcessIndex_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub client: *mut PJRT_Client,
    pub process_index: c_int,
}
args!(PJRT_Client_ProcessIndex_Args, process_index: c_int);

#[repr(C)]
pub struct PJRT_Client_PlatformVersion_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub client: *mut PJRT_Client,
    pub platform_version: *const c_char,
    pub platform_version_size: usize,
}
args!(PJRT_Client_PlatformVersion_Args, platform_version_size: usize);

#[repr(C)]
pub struct PJRT_Client_Devices_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub client: *mut PJRT_Client,
    pub devices: *const *mut PJRT_Device,
    pub num_devices: usize,
}
args!(PJRT_Client_Devices_Args, num_devices: usize);

#[repr(C)]
pub struct PJRT_Client_AddressableDevices_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub client: *mut PJRT_Client,
    pub addressable_devices: *const *mut PJRT_Device,
    pub num_addressable_devices: usize,
}
args!(PJRT_Client_AddressableDevices_Args, num_addressable_devices: usize);

#[repr(C)]
pub struct PJRT_Program {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub code: *mut c_char,
    pub code_size: usize,
    pub format: *const c_char,
    pub format_size: usize,
}
args!(PJRT_Program, format_size: usize);

#[repr(C)]
pub struct PJRT_Client_Compile_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub client: *mut PJRT_Client,
    pub program: *const PJRT_Program,
    pub compile_options: *const c_char,
    pub compile_options_size: usize,
    pub executable: *mut PJRT_LoadedExecutable,
}
args!(PJRT_Client_Compile_Args, executable: *mut PJRT_LoadedExecutable);

#[repr(C)]
pub struct PJRT_Client_BufferFromHostBuffer_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub client: *mut PJRT_Client,
    pub data: *const c_void,
    pub type_: PJRT_Buffer_Type,
    pub dims: *const i64,
    pub num_dims: usize,
    pub byte_strides: *const i64,
    pub num_byte_strides: usize,
    pub host_buffer_semantics: PJRT_HostBufferSemantics,
    pub device: *mut PJRT_Device,
    pub memory: *mut PJRT_Memory,
    /// `PJRT_Buffer_MemoryLayout*`; zoo passes null (the device's default layout).
    pub device_layout: *mut c_void,
    pub done_with_host_buffer: *mut PJRT_Event,
    pub buffer: *mut PJRT_Buffer,
}
args!(PJRT_Client_BufferFromHostBuffer_Args, buffer: *mut PJRT_Buffer);

#[repr(C)]
pub struct PJRT_DeviceDescription_Id_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub device_description: *mut PJRT_DeviceDescription,
    pub id: c_int,
}
args!(PJRT_DeviceDescription_Id_Args, id: c_int);

#[repr(C)]
pub struct PJRT_DeviceDescription_ProcessIndex_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub device_description: *mut PJRT_DeviceDescription,
    pub process_index: c_int,
}
args!(PJRT_DeviceDescription_ProcessIndex_Args, process_index: c_int);

/// Shared shape of `PJRT_DeviceDescription_{Kind,DebugString,ToString}_Args`.
#[repr(C)]
pub struct PJRT_DeviceDescription_String_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub device_description: *mut PJRT_DeviceDescription,
    pub value: *const c_char,
    pub value_size: usize,
}
args!(PJRT_DeviceDescription_String_Args, value_size: usize);
pub type PJRT_DeviceDescription_Kind_Args = PJRT_DeviceDescription_String_Args;
pub type PJRT_DeviceDescription_DebugString_Args = PJRT_DeviceDescription_String_Args;
pub type PJRT_DeviceDescription_ToString_Args = PJRT_DeviceDescription_String_Args;

#[repr(C)]
pub struct PJRT_Device_GetDescription_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub device: *mut PJRT_Device,
    pub device_description: *mut PJRT_DeviceDescription,
}
args!(PJRT_Device_GetDescription_Args, device_description: *mut PJRT_DeviceDescription);

#[repr(C)]
pub struct PJRT_Device_IsAddressable_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub device: *mut PJRT_Device,
    pub is_addressable: bool,
}
args!(PJRT_Device_IsAddressable_Args, is_addressable: bool);

#[repr(C)]
pub struct PJRT_Device_LocalHardwareId_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub device: *mut PJRT_Device,
    pub local_hardware_id: c_int,
}
args!(PJRT_Device_LocalHardwareId_Args, local_hardware_id: c_int);

#[repr(C)]
pub struct PJRT_Device_DefaultMemory_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub device: *mut PJRT_Device,
    pub memory: *mut PJRT_Memory,
}
args!(PJRT_Device_DefaultMemory_Args, memory: *mut PJRT_Memory);

#[repr(C)]
pub struct PJRT_Device_MemoryStats_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub device: *mut PJRT_Device,
    pub bytes_in_use: i64,
    pub peak_bytes_in_use: i64,
    pub peak_bytes_in_use_is_set: bool,
    pub num_allocs: i64,
    pub num_allocs_is_set: bool,
    pub largest_alloc_size: i64,
    pub largest_alloc_size_is_set: bool,
    pub bytes_limit: i64,
    pub bytes_limit_is_set: bool,
    pub bytes_reserved: i64,
    pub bytes_reserved_is_set: bool,
    pub peak_bytes_reserved: i64,
    pub peak_bytes_reserved_is_set: bool,
    pub bytes_reservable_limit: i64,
    pub bytes_reservable_limit_is_set: bool,
    pub largest_free_block_bytes: i64,
    pub largest_free_block_bytes_is_set: bool,
    pub pool_bytes: i64,
    pub pool_bytes_is_set: bool,
    pub peak_pool_bytes: i64,
    pub peak_pool_bytes_is_set: bool,
    /// Appended in 0.113: read only when the plugin's minor is at least 113.
    pub peak_allocated_bytes: i64,
    pub peak_allocated_bytes_is_set: bool,
}
args!(PJRT_Device_MemoryStats_Args, peak_allocated_bytes_is_set: bool);

#[repr(C)]
pub struct PJRT_Memory_Kind_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub memory: *mut PJRT_Memory,
    pub kind: *const c_char,
    pub kind_size: usize,
}
args!(PJRT_Memory_Kind_Args, kind_size: usize);

#[repr(C)]
pub struct PJRT_Executable_Destroy_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub executable: *mut PJRT_Executable,
}
args!(PJRT_Executable_Destroy_Args, executable: *mut PJRT_Executable);

#[repr(C)]
pub struct PJRT_Executable_Name_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub executable: *mut PJRT_Executable,
    pub executable_name: *const c_char,
    pub executable_name_size: usize,
}
args!(PJRT_Executable_Name_Args, executable_name_size: usize);

/// Shared shape of `PJRT_Executable_{NumReplicas,NumPartitions,NumOutputs}_Args`.
#[repr(C)]
pub struct PJRT_Executable_Count_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub executable: *mut PJRT_Executable,
    pub count: usize,
}
args!(PJRT_Executable_Count_Args, count: usize);
pub type PJRT_Executable_NumReplicas_Args = PJRT_Executable_Count_Args;
pub type PJRT_Executable_NumPartitions_Args = PJRT_Executable_Count_Args;
pub type PJRT_Executable_NumOutputs_Args = PJRT_Executable_Count_Args;

#[repr(C)]
pub struct PJRT_Executable_Serialize_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub executable: *const PJRT_Executable,
    pub serialized_bytes: *const c_char,
    pub serialized_bytes_size: usize,
    pub serialized_executable: *mut PJRT_SerializedExecutable,
    pub serialized_executable_deleter:
        Option<unsafe extern "C" fn(exec: *mut PJRT_SerializedExecutable)>,
}
args!(
    PJRT_Executable_Serialize_Args,
    serialized_executable_deleter: Option<unsafe extern "C" fn(*mut PJRT_SerializedExecutable)>
);

#[repr(C)]
pub struct PJRT_Executable_OptimizedProgram_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub executable: *mut PJRT_Executable,
    pub program: *mut PJRT_Program,
}
args!(PJRT_Executable_OptimizedProgram_Args, program: *mut PJRT_Program);

#[repr(C)]
pub struct PJRT_Executable_Fingerprint_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub executable: *mut PJRT_Executable,
    pub executable_fingerprint: *const c_char,
    pub executable_fingerprint_size: usize,
}
args!(PJRT_Executable_Fingerprint_Args, executable_fingerprint_size: usize);

#[repr(C)]
pub struct PJRT_LoadedExecutable_Destroy_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub executable: *mut PJRT_LoadedExecutable,
}
args!(PJRT_LoadedExecutable_Destroy_Args, executable: *mut PJRT_LoadedExecutable);

#[repr(C)]
pub struct PJRT_LoadedExecutable_GetExecutable_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub loaded_executable: *mut PJRT_LoadedExecutable,
    pub executable: *mut PJRT_Executable,
}
args!(PJRT_LoadedExecutable_GetExecutable_Args, executable: *mut PJRT_Executable);

#[repr(C)]
pub struct PJRT_LoadedExecutable_AddressableDevices_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub executable: *mut PJRT_LoadedExecutable,
    pub addressable_devices: *const *mut PJRT_Device,
    pub num_addressable_devices: usize,
}
args!(PJRT_LoadedExecutable_AddressableDevices_Args, num_addressable_devices: usize);

#[repr(C)]
pub struct PJRT_ExecuteOptions {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub send_callbacks: *mut *mut c_void,
    pub recv_callbacks: *mut *mut c_void,
    pub num_send_ops: usize,
    pub num_recv_ops: usize,
    pub launch_id: c_int,
    pub non_donatable_input_indices: *const i64,
    pub num_non_donatable_input_indices: usize,
    pub context: *mut c_void,
    pub call_location: *const c_char,
    pub num_tasks: usize,
    pub task_ids: *mut c_int,
    pub incarnation_ids: *mut i64,
    pub multi_slice_config: *mut c_void,
    pub use_major_to_minor_data_layout_for_callbacks: bool,
    pub hlo_output_callbacks: *mut c_void,
    pub num_hlo_output_callbacks: usize,
}
args!(PJRT_ExecuteOptions, num_hlo_output_callbacks: usize);

#[repr(C)]
pub struct PJRT_LoadedExecutable_Execute_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub executable: *mut PJRT_LoadedExecutable,
    pub options: *mut PJRT_ExecuteOptions,
    pub argument_lists: *const *const *mut PJRT_Buffer,
    pub num_devices: usize,
    pub num_args: usize,
    pub output_lists: *const *mut *mut PJRT_Buffer,
    pub device_complete_events: *mut *mut PJRT_Event,
    pub execute_device: *mut PJRT_Device,
}
args!(PJRT_LoadedExecutable_Execute_Args, execute_device: *mut PJRT_Device);

#[repr(C)]
pub struct PJRT_Executable_DeserializeAndLoad_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub client: *mut PJRT_Client,
    pub serialized_executable: *const c_char,
    pub serialized_executable_size: usize,
    pub loaded_executable: *mut PJRT_LoadedExecutable,
    pub overridden_serialized_compile_options: *const c_char,
    pub overridden_serialized_compile_options_size: usize,
    pub load_options: *mut c_void,
}
args!(PJRT_Executable_DeserializeAndLoad_Args, load_options: *mut c_void);

#[repr(C)]
pub struct PJRT_Buffer_Destroy_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub buffer: *mut PJRT_Buffer,
}
args!(PJRT_Buffer_Destroy_Args, buffer: *mut PJRT_Buffer);
pub type PJRT_Buffer_Delete_Args = PJRT_Buffer_Destroy_Args;

#[repr(C)]
pub struct PJRT_Buffer_ElementType_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub buffer: *mut PJRT_Buffer,
    pub type_: PJRT_Buffer_Type,
}
args!(PJRT_Buffer_ElementType_Args, type_: PJRT_Buffer_Type);

#[repr(C)]
pub struct PJRT_Buffer_Dimensions_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub buffer: *mut PJRT_Buffer,
    pub dims: *const i64,
    pub num_dims: usize,
}
args!(PJRT_Buffer_Dimensions_Args, num_dims: usize);

#[repr(C)]
pub struct PJRT_Buffer_OnDeviceSizeInBytes_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub buffer: *mut PJRT_Buffer,
    pub on_device_size_in_bytes: usize,
}
args!(PJRT_Buffer_OnDeviceSizeInBytes_Args, on_device_size_in_bytes: usize);

#[repr(C)]
pub struct PJRT_Buffer_Device_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub buffer: *mut PJRT_Buffer,
    pub device: *mut PJRT_Device,
}
args!(PJRT_Buffer_Device_Args, device: *mut PJRT_Device);

#[repr(C)]
pub struct PJRT_Buffer_IsDeleted_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub buffer: *mut PJRT_Buffer,
    pub is_deleted: bool,
}
args!(PJRT_Buffer_IsDeleted_Args, is_deleted: bool);

#[repr(C)]
pub struct PJRT_Buffer_CopyToDevice_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub buffer: *mut PJRT_Buffer,
    pub dst_device: *mut PJRT_Device,
    pub dst_buffer: *mut PJRT_Buffer,
}
args!(PJRT_Buffer_CopyToDevice_Args, dst_buffer: *mut PJRT_Buffer);

#[repr(C)]
pub struct PJRT_Buffer_ToHostBuffer_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub src: *mut PJRT_Buffer,
    /// `PJRT_Buffer_MemoryLayout*`; null asks for the dense row-major layout.
    pub host_layout: *mut c_void,
    pub dst: *mut c_void,
    pub dst_size: usize,
    pub event: *mut PJRT_Event,
}
args!(PJRT_Buffer_ToHostBuffer_Args, event: *mut PJRT_Event);

#[repr(C)]
pub struct PJRT_Buffer_ReadyEvent_Args {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub buffer: *mut PJRT_Buffer,
    pub event: *mut PJRT_Event,
}
args!(PJRT_Buffer_ReadyEvent_Args, event: *mut PJRT_Event);

/// A table entry zoo calls: every PJRT function but two takes its args struct and returns
/// an owned `PJRT_Error*` (null on success).
pub type Fn<A> = Option<unsafe extern "C" fn(*mut A) -> *mut PJRT_Error>;
/// A table entry zoo does not call; typed only so the table's layout is exact.
pub type RawFn = Option<unsafe extern "C" fn()>;

/// `PJRT_Api`: the function table a plugin's `GetPjrtApi` returns. Entries are in header
/// order; a plugin's `struct_size` says how many it has (older minors have fewer).
#[repr(C)]
pub struct PJRT_Api {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub pjrt_api_version: PJRT_Api_Version,
    pub PJRT_Error_Destroy: Option<unsafe extern "C" fn(*mut PJRT_Error_Destroy_Args)>,
    pub PJRT_Error_Message: Option<unsafe extern "C" fn(*mut PJRT_Error_Message_Args)>,
    pub PJRT_Error_GetCode: Fn<PJRT_Error_GetCode_Args>,
    pub PJRT_Plugin_Initialize: Fn<PJRT_Plugin_Initialize_Args>,
    pub PJRT_Plugin_Attributes: Fn<PJRT_Plugin_Attributes_Args>,
    pub PJRT_Event_Destroy: Fn<PJRT_Event_Destroy_Args>,
    pub PJRT_Event_IsReady: Fn<PJRT_Event_IsReady_Args>,
    pub PJRT_Event_Error: Fn<PJRT_Event_Error_Args>,
    pub PJRT_Event_Await: Fn<PJRT_Event_Await_Args>,
    pub PJRT_Event_OnReady: Fn<PJRT_Event_OnReady_Args>,
    pub PJRT_Client_Create: Fn<PJRT_Client_Create_Args>,
    pub PJRT_Client_Destroy: Fn<PJRT_Client_Destroy_Args>,
    pub PJRT_Client_PlatformName: Fn<PJRT_Client_PlatformName_Args>,
    pub PJRT_Client_ProcessIndex: Fn<PJRT_Client_ProcessIndex_Args>,
    pub PJRT_Client_PlatformVersion: Fn<PJRT_Client_PlatformVersion_Args>,
    pub PJRT_Client_Devices: Fn<PJRT_Client_Devices_Args>,
    pub PJRT_Client_AddressableDevices: Fn<PJRT_Client_AddressableDevices_Args>,
    pub PJRT_Client_LookupDevice: RawFn,
    pub PJRT_Client_LookupAddressableDevice: RawFn,
    pub PJRT_Client_AddressableMemories: RawFn,
    pub PJRT_Client_Compile: Fn<PJRT_Client_Compile_Args>,
    pub PJRT_Client_DefaultDeviceAssignment: RawFn,
    pub PJRT_Client_BufferFromHostBuffer: Fn<PJRT_Client_BufferFromHostBuffer_Args>,
    pub PJRT_DeviceDescription_Id: Fn<PJRT_DeviceDescription_Id_Args>,
    pub PJRT_DeviceDescription_ProcessIndex: Fn<PJRT_DeviceDescription_ProcessIndex_Args>,
    pub PJRT_DeviceDescription_Attributes: RawFn,
    pub PJRT_DeviceDescription_Kind: Fn<PJRT_DeviceDescription_Kind_Args>,
    pub PJRT_DeviceDescription_DebugString: Fn<PJRT_DeviceDescription_DebugString_Args>,
    pub PJRT_DeviceDescription_ToString: Fn<PJRT_DeviceDescription_ToString_Args>,
    pub PJRT_Device_GetDescription: Fn<PJRT_Device_GetDescription_Args>,
    pub PJRT_Device_IsAddressable: Fn<PJRT_Device_IsAddressable_Args>,
    pub PJRT_Device_LocalHardwareId: Fn<PJRT_Device_LocalHardwareId_Args>,
    pub PJRT_Device_AddressableMemories: RawFn,
    pub PJRT_Device_DefaultMemory: Fn<PJRT_Device_DefaultMemory_Args>,
    pub PJRT_Device_MemoryStats: Fn<PJRT_Device_MemoryStats_Args>,
    pub PJRT_Memory_Id: RawFn,
    pub PJRT_Memory_Kind: Fn<PJRT_Memory_Kind_Args>,
    pub PJRT_Memory_DebugString: RawFn,
    pub PJRT_Memory_ToString: RawFn,
    pub PJRT_Memory_AddressableByDevices: RawFn,
    pub PJRT_Executable_Destroy: Fn<PJRT_Executable_Destroy_Args>,
    pub PJRT_Executable_Name: Fn<PJRT_Executable_Name_Args>,
    pub PJRT_Executable_NumReplicas: Fn<PJRT_Executable_NumReplicas_Args>,
    pub PJRT_Executable_NumPartitions: Fn<PJRT_Executable_NumPartitions_Args>,
    pub PJRT_Executable_NumOutputs: Fn<PJRT_Executable_NumOutputs_Args>,
    pub PJRT_Executable_SizeOfGeneratedCodeInBytes: RawFn,
    pub PJRT_Executable_GetCostAnalysis: RawFn,
    pub PJRT_Executable_OutputMemoryKinds: RawFn,
    pub PJRT_Executable_OptimizedProgram: Fn<PJRT_Executable_OptimizedProgram_Args>,
    pub PJRT_Executable_Serialize: Fn<PJRT_Executable_Serialize_Args>,
    pub PJRT_LoadedExecutable_Destroy: Fn<PJRT_LoadedExecutable_Destroy_Args>,
    pub PJRT_LoadedExecutable_GetExecutable: Fn<PJRT_LoadedExecutable_GetExecutable_Args>,
    pub PJRT_LoadedExecutable_AddressableDevices: Fn<PJRT_LoadedExecutable_AddressableDevices_Args>,
    pub PJRT_LoadedExecutable_Delete: RawFn,
    pub PJRT_LoadedExecutable_IsDeleted: RawFn,
    pub PJRT_LoadedExecutable_Execute: Fn<PJRT_LoadedExecutable_Execute_Args>,
    pub PJRT_Executable_DeserializeAndLoad: Fn<PJRT_Executable_DeserializeAndLoad_Args>,
    pub PJRT_LoadedExecutable_Fingerprint: RawFn,
    pub PJRT_Buffer_Destroy: Fn<PJRT_Buffer_Destroy_Args>,
    pub PJRT_Buffer_ElementType: Fn<PJRT_Buffer_ElementType_Args>,
    pub PJRT_Buffer_Dimensions: Fn<PJRT_Buffer_Dimensions_Args>,
    pub PJRT_Buffer_UnpaddedDimensions: RawFn,
    pub PJRT_Buffer_DynamicDimensionIndices: RawFn,
    pub PJRT_Buffer_GetMemoryLayout: RawFn,
    pub PJRT_Buffer_OnDeviceSizeInBytes: Fn<PJRT_Buffer_OnDeviceSizeInBytes_Args>,
    pub PJRT_Buffer_Device: Fn<PJRT_Buffer_Device_Args>,
    pub PJRT_Buffer_Memory: RawFn,
    pub PJRT_Buffer_Delete: Fn<PJRT_Buffer_Delete_Args>,
    pub PJRT_Buffer_IsDeleted: Fn<PJRT_Buffer_IsDeleted_Args>,
    pub PJRT_Buffer_CopyToDevice: Fn<PJRT_Buffer_CopyToDevice_Args>,
    pub PJRT_Buffer_ToHostBuffer: Fn<PJRT_Buffer_ToHostBuffer_Args>,
    pub PJRT_Buffer_IsOnCpu: RawFn,
    pub PJRT_Buffer_ReadyEvent: Fn<PJRT_Buffer_ReadyEvent_Args>,
    pub PJRT_Buffer_UnsafePointer: RawFn,
    pub PJRT_Buffer_IncreaseExternalReferenceCount: RawFn,
    pub PJRT_Buffer_DecreaseExternalReferenceCount: RawFn,
    pub PJRT_Buffer_OpaqueDeviceMemoryDataPointer: RawFn,
    pub PJRT_CopyToDeviceStream_Destroy: RawFn,
    pub PJRT_CopyToDeviceStream_AddChunk: RawFn,
    pub PJRT_CopyToDeviceStream_TotalBytes: RawFn,
    pub PJRT_CopyToDeviceStream_GranuleSize: RawFn,
    pub PJRT_CopyToDeviceStream_CurrentBytes: RawFn,
    pub PJRT_TopologyDescription_Create: RawFn,
    pub PJRT_TopologyDescription_Destroy: RawFn,
    pub PJRT_TopologyDescription_PlatformName: RawFn,
    pub PJRT_TopologyDescription_PlatformVersion: RawFn,
    pub PJRT_TopologyDescription_GetDeviceDescriptions: RawFn,
    pub PJRT_TopologyDescription_Serialize: RawFn,
    pub PJRT_TopologyDescription_Attributes: RawFn,
    pub PJRT_Compile: RawFn,
    pub PJRT_Executable_OutputElementTypes: RawFn,
    pub PJRT_Executable_OutputDimensions: RawFn,
    pub PJRT_Buffer_CopyToMemory: RawFn,
    pub PJRT_Client_CreateViewOfDeviceBuffer: RawFn,
    pub PJRT_Executable_Fingerprint: Fn<PJRT_Executable_Fingerprint_Args>,
    pub PJRT_Client_TopologyDescription: RawFn,
    pub PJRT_Executable_GetCompiledMemoryStats: RawFn,
    pub PJRT_Memory_Kind_Id: RawFn,
    pub PJRT_ExecuteContext_Create: RawFn,
    pub PJRT_ExecuteContext_Destroy: RawFn,
    pub PJRT_Buffer_CopyRawToHost: RawFn,
    pub PJRT_AsyncHostToDeviceTransferManager_Destroy: RawFn,
    pub PJRT_AsyncHostToDeviceTransferManager_TransferData: RawFn,
    pub PJRT_Client_CreateBuffersForAsyncHostToDevice: RawFn,
    pub PJRT_AsyncHostToDeviceTransferManager_RetrieveBuffer: RawFn,
    pub PJRT_AsyncHostToDeviceTransferManager_Device: RawFn,
    pub PJRT_AsyncHostToDeviceTransferManager_BufferCount: RawFn,
    pub PJRT_AsyncHostToDeviceTransferManager_BufferSize: RawFn,
    pub PJRT_AsyncHostToDeviceTransferManager_SetBufferError: RawFn,
    pub PJRT_AsyncHostToDeviceTransferManager_AddMetadata: RawFn,
    pub PJRT_Client_DmaMap: RawFn,
    pub PJRT_Client_DmaUnmap: RawFn,
    pub PJRT_Client_CreateUninitializedBuffer: RawFn,
    pub PJRT_Client_UpdateGlobalProcessInfo: RawFn,
    pub PJRT_TopologyDescription_Deserialize: RawFn,
    pub PJRT_Client_CreateAliasBuffer: RawFn,
    pub PJRT_Client_FulfillAliasBuffer: RawFn,
    pub PJRT_LoadedExecutable_GetDeviceAssignment: RawFn,
    pub PJRT_Client_CreateErrorBuffer: RawFn,
    pub PJRT_AsyncHostToDeviceTransferManager_TransferLiteral: RawFn,
    pub PJRT_Buffer_CopyRawToHostFuture: RawFn,
    pub PJRT_Device_PoisonExecution: RawFn,
    pub PJRT_Device_CreateAsyncTrackingEvent: RawFn,
    pub PJRT_AsyncTrackingEvent_Destroy: RawFn,
    pub PJRT_Executable_GetCompileOptions: RawFn,
    pub PJRT_Buffer_DonateWithControlDependency: RawFn,
    pub PJRT_Event_Create: RawFn,
    pub PJRT_Event_Set: RawFn,
    pub PJRT_Device_GetAttributes: RawFn,
    pub PJRT_Client_Load: RawFn,
    pub PJRT_LoadedExecutable_AddressableDeviceLogicalIds: RawFn,
    pub PJRT_Buffer_Bitcast: RawFn,
    pub PJRT_Error_ForEachPayload: RawFn,
    pub PJRT_TopologyDescription_Fingerprint: RawFn,
    pub PJRT_Executable_ParameterMemoryKinds: RawFn,
    pub PJRT_Device_ClearMemoryStats: RawFn,
    pub PJRT_TopologyDescription_MakeCanonicalShapeForMemorySpace: RawFn,
    pub PJRT_TopologyDescription_GetMemorySpaceKindIds: RawFn,
}

/// Size of the `PJRT_Api` of header 0.114 (138 function entries).
pub const PJRT_API_STRUCT_SIZE: usize =
    offset_of!(PJRT_Api, PJRT_TopologyDescription_GetMemorySpaceKindIds) + size_of::<RawFn>();

/// The symbol every PJRT plugin exports.
pub const GET_PJRT_API_SYMBOL: &[u8] = b"GetPjrtApi\0";
/// `const PJRT_Api* GetPjrtApi(void)`.
pub type GetPjrtApiFn = unsafe extern "C" fn() -> *const PJRT_Api;

// Every args struct's `STRUCT_SIZE` equals the header's `<Name>_STRUCT_SIZE`, as printed by a
// C program compiled against header 0.114 on x86_64 (LP64).
#[cfg(target_pointer_width = "64")]
const _: () = {
    assert!(<PJRT_Error_Destroy_Args as Args>::STRUCT_SIZE == 24);
    assert!(<PJRT_Error_Message_Args as Args>::STRUCT_SIZE == 40);
    assert!(<PJRT_Error_GetCode_Args as Args>::STRUCT_SIZE == 28);
    assert!(<PJRT_NamedValue as Args>::STRUCT_SIZE == 56);
    assert!(<PJRT_Plugin_Initialize_Args as Args>::STRUCT_SIZE == 16);
    assert!(<PJRT_Plugin_Attributes_Args as Args>::STRUCT_SIZE == 32);
    assert!(<PJRT_Event_Destroy_Args as Args>::STRUCT_SIZE == 24);
    assert!(<PJRT_Event_IsReady_Args as Args>::STRUCT_SIZE == 25);
    assert!(<PJRT_Event_Error_Args as Args>::STRUCT_SIZE == 24);
    assert!(<PJRT_Event_Await_Args as Args>::STRUCT_SIZE == 24);
    assert!(<PJRT_Client_Create_Args as Args>::STRUCT_SIZE == 88);
    assert!(<PJRT_Client_Destroy_Args as Args>::STRUCT_SIZE == 24);
    assert!(<PJRT_Client_PlatformName_Args as Args>::STRUCT_SIZE == 40);
    assert!(<PJRT_Client_ProcessIndex_Args as Args>::STRUCT_SIZE == 28);
    assert!(<PJRT_Client_PlatformVersion_Args as Args>::STRUCT_SIZE == 40);
    assert!(<PJRT_Client_Devices_Args as Args>::STRUCT_SIZE == 40);
    assert!(<PJRT_Client_AddressableDevices_Args as Args>::STRUCT_SIZE == 40);
    assert!(<PJRT_Program as Args>::STRUCT_SIZE == 48);
    assert!(<PJRT_Client_Compile_Args as Args>::STRUCT_SIZE == 56);
    assert!(<PJRT_Client_BufferFromHostBuffer_Args as Args>::STRUCT_SIZE == 120);
    assert!(<PJRT_DeviceDescription_Id_Args as Args>::STRUCT_SIZE == 28);
    assert!(<PJRT_DeviceDescription_ProcessIndex_Args as Args>::STRUCT_SIZE == 28);
    assert!(<PJRT_DeviceDescription_String_Args as Args>::STRUCT_SIZE == 40);
    assert!(<PJRT_Device_GetDescription_Args as Args>::STRUCT_SIZE == 32);
    assert!(<PJRT_Device_IsAddressable_Args as Args>::STRUCT_SIZE == 25);
    assert!(<PJRT_Device_LocalHardwareId_Args as Args>::STRUCT_SIZE == 28);
    assert!(<PJRT_Device_DefaultMemory_Args as Args>::STRUCT_SIZE == 32);
    assert!(<PJRT_Device_MemoryStats_Args as Args>::STRUCT_SIZE == 201);
    assert!(<PJRT_Memory_Kind_Args as Args>::STRUCT_SIZE == 40);
    assert!(<PJRT_Executable_Destroy_Args as Args>::STRUCT_SIZE == 24);
    assert!(<PJRT_Executable_Name_Args as Args>::STRUCT_SIZE == 40);
    assert!(<PJRT_Executable_Count_Args as Args>::STRUCT_SIZE == 32);
    assert!(<PJRT_Executable_Fingerprint_Args as Args>::STRUCT_SIZE == 40);
    assert!(<PJRT_LoadedExecutable_Destroy_Args as Args>::STRUCT_SIZE == 24);
    assert!(<PJRT_LoadedExecutable_GetExecutable_Args as Args>::STRUCT_SIZE == 32);
    assert!(<PJRT_LoadedExecutable_AddressableDevices_Args as Args>::STRUCT_SIZE == 40);
    assert!(<PJRT_ExecuteOptions as Args>::STRUCT_SIZE == 144);
    assert!(<PJRT_LoadedExecutable_Execute_Args as Args>::STRUCT_SIZE == 80);
    assert!(<PJRT_Executable_DeserializeAndLoad_Args as Args>::STRUCT_SIZE == 72);
    assert!(<PJRT_Buffer_Destroy_Args as Args>::STRUCT_SIZE == 24);
    assert!(<PJRT_Buffer_ElementType_Args as Args>::STRUCT_SIZE == 28);
    assert!(<PJRT_Buffer_Dimensions_Args as Args>::STRUCT_SIZE == 40);
    assert!(<PJRT_Buffer_OnDeviceSizeInBytes_Args as Args>::STRUCT_SIZE == 32);
    assert!(<PJRT_Buffer_Device_Args as Args>::STRUCT_SIZE == 32);
    assert!(<PJRT_Buffer_IsDeleted_Args as Args>::STRUCT_SIZE == 25);
    assert!(<PJRT_Buffer_CopyToDevice_Args as Args>::STRUCT_SIZE == 40);
    assert!(<PJRT_Buffer_ToHostBuffer_Args as Args>::STRUCT_SIZE == 56);
    assert!(<PJRT_Buffer_ReadyEvent_Args as Args>::STRUCT_SIZE == 32);
    assert!(PJRT_API_STRUCT_SIZE == 1144);
    assert!(<PJRT_Executable_Serialize_Args as Args>::STRUCT_SIZE == 56);
    assert!(offset_of!(PJRT_Api, PJRT_Error_Destroy) == 40);
    assert!(offset_of!(PJRT_Api, PJRT_Client_Create) == 40 + 10 * 8);
    assert!(offset_of!(PJRT_Api, PJRT_LoadedExecutable_Execute) == 40 + 55 * 8);
    assert!(offset_of!(PJRT_Api, PJRT_Executable_Fingerprint) == 40 + 94 * 8);
};
