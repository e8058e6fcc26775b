//! Device buffers, host transfers, device-to-device copies, and events.

use std::ffi::c_void;
use std::fmt;
use std::sync::Arc;

use super::api::pjrt_call;
use super::client::{Client, ClientInner, Device};
use super::error::{PjrtError, Result};
use super::ffi::{self, Args};
use super::leak::{self, ObjectKind};

/// Element types of PJRT buffers (`PJRT_Buffer_Type`), named as in StableHLO.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub enum ElementType {
    Pred,
    I8,
    I16,
    I32,
    I64,
    U8,
    U16,
    U32,
    U64,
    F16,
    F32,
    F64,
    BF16,
    C64,
    C128,
    /// Any other `PJRT_Buffer_Type` (fp8, sub-byte integers, tokens, ...).
    Other(i32),
}

impl ElementType {
    /// The `PJRT_Buffer_Type` value.
    pub fn to_raw(self) -> ffi::PJRT_Buffer_Type {
        match self {
            ElementType::Pred => 1,
            ElementType::I8 => 2,
            ElementType::I16 => 3,
            ElementType::I32 => 4,
            ElementType::I64 => 5,
            ElementType::U8 => 6,
            ElementType::U16 => 7,
            ElementType::U32 => 8,
            ElementType::U64 => 9,
            ElementType::F16 => 10,
            ElementType::F32 => 11,
            ElementType::F64 => 12,
            ElementType::BF16 => 13,
            ElementType::C64 => 14,
            ElementType::C128 => 15,
            ElementType::Other(v) => v,
        }
    }

    /// From a `PJRT_Buffer_Type` value.
    pub fn from_raw(v: ffi::PJRT_Buffer_Type) -> ElementType {
        match v {
            1 => ElementType::Pred,
            2 => ElementType::I8,
            3 => ElementType::I16,
            4 => ElementType::I32,
            5 => ElementType::I64,
            6 => ElementType::U8,
            7 => ElementType::U16,
            8 => ElementType::U32,
            9 => ElementType::U64,
            10 => ElementType::F16,
            11 => ElementType::F32,
            12 => ElementType::F64,
            13 => ElementType::BF16,
            14 => ElementType::C64,
            15 => ElementType::C128,
            other => ElementType::Other(other),
        }
    }

    /// Bytes per element in a dense host array; `None` for types zoo does not transfer.
    pub fn size_in_bytes(self) -> Option<usize> {
        Some(match self {
            ElementType::Pred | ElementType::I8 | ElementType::U8 => 1,
            ElementType::I16 | ElementType::U16 | ElementType::F16 | ElementType::BF16 => 2,
            ElementType::I32 | ElementType::U32 | ElementType::F32 => 4,
            ElementType::I64 | ElementType::U64 | ElementType::F64 | ElementType::C64 => 8,
            ElementType::C128 => 16,
            ElementType::Other(_) => return None,
        })
    }

    /// The StableHLO element type name (`f32`, `bf16`, `i64`, `i1`, ...).
    pub fn stablehlo_name(self) -> String {
        match self {
            ElementType::Pred => "i1".into(),
            ElementType::I8 => "i8".into(),
            ElementType::I16 => "i16".into(),
            ElementType::I32 => "i32".into(),
            ElementType::I64 => "i64".into(),
            ElementType::U8 => "ui8".into(),
            ElementType::U16 => "ui16".into(),
            ElementType::U32 => "ui32".into(),
            ElementType::U64 => "ui64".into(),
            ElementType::F16 => "f16".into(),
            ElementType::F32 => "f32".into(),
            ElementType::F64 => "f64".into(),
            ElementType::BF16 => "bf16".into(),
            ElementType::C64 => "complex<f32>".into(),
            ElementType::C128 => "complex<f64>".into(),
            ElementType::Other(v) => format!("pjrt_type_{v}"),
        }
    }
}

impl fmt::Display for ElementType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.stablehlo_name())
    }
}

/// Host element types that map one to one onto a [`ElementType`].
///
/// # Safety
/// Implementors must be plain old data whose size is `DTYPE.size_in_bytes()` and for which
/// every bit pattern is a valid value.
pub unsafe trait NativeType: Copy + Default + 'static {
    /// The matching buffer element type.
    const DTYPE: ElementType;
}

// SAFETY (all impls): primitive numeric types of the stated sizes; every bit pattern valid.
unsafe impl NativeType for f32 {
    const DTYPE: ElementType = ElementType::F32;
}
unsafe impl NativeType for f64 {
    const DTYPE: ElementType = ElementType::F64;
}
unsafe impl NativeType for i8 {
    const DTYPE: ElementType = ElementType::I8;
}
unsafe impl NativeType for i16 {
    const DTYPE: ElementType = ElementType::I16;
}
unsafe impl NativeType for i32 {
    const DTYPE: ElementType = ElementType::I32;
}
unsafe impl NativeType for i64 {
    const DTYPE: ElementType = ElementType::I64;
}
unsafe impl NativeType for u8 {
    const DTYPE: ElementType = ElementType::U8;
}
unsafe impl NativeType for u16 {
    const DTYPE: ElementType = ElementType::U16;
}
unsafe impl NativeType for u32 {
    const DTYPE: ElementType = ElementType::U32;
}
unsafe impl NativeType for u64 {
    const DTYPE: ElementType = ElementType::U64;
}
unsafe impl NativeType for half::bf16 {
    const DTYPE: ElementType = ElementType::BF16;
}
unsafe impl NativeType for half::f16 {
    const DTYPE: ElementType = ElementType::F16;
}

fn element_count(dims: &[i64]) -> Result<usize> {
    let mut n: usize = 1;
    for &d in dims {
        let d = usize::try_from(d).map_err(|_| {
            PjrtError::InvalidArgument(format!("negative dimension {d} in shape {dims:?}"))
        })?;
        n = n.checked_mul(d).ok_or_else(|| {
            PjrtError::InvalidArgument(format!("shape {dims:?} has too many elements"))
        })?;
    }
    Ok(n)
}

/// A completion event (`PJRT_Event`), freed on drop.
pub struct Event {
    pub(crate) client: Arc<ClientInner>,
    pub(crate) raw: *mut ffi::PJRT_Event,
}

// SAFETY: PJRT events may be awaited and destroyed from any thread.
unsafe impl Send for Event {}
// SAFETY: as above; all methods take `&self` and the plugin synchronizes.
unsafe impl Sync for Event {}

impl Event {
    /// Takes ownership of an event the plugin returned (null gives `None`).
    pub(crate) fn wrap(client: &Arc<ClientInner>, raw: *mut ffi::PJRT_Event) -> Option<Event> {
        if raw.is_null() {
            return None;
        }
        leak::created(ObjectKind::Event, raw as *const ());
        Some(Event {
            client: client.clone(),
            raw,
        })
    }

    /// Blocks until the event is ready; returns the error of the work it tracks, if any.
    pub fn wait(&self) -> Result<()> {
        let mut args = ffi::PJRT_Event_Await_Args::new();
        args.event = self.raw;
        pjrt_call!(self.client.api(), PJRT_Event_Await, &mut args)
    }

    /// Whether the event is ready (without blocking).
    pub fn is_ready(&self) -> Result<bool> {
        let mut args = ffi::PJRT_Event_IsReady_Args::new();
        args.event = self.raw;
        pjrt_call!(self.client.api(), PJRT_Event_IsReady, &mut args)?;
        Ok(args.is_ready)
    }

    /// Calls `f` once the event is ready, with the error of the work it tracks, if any, on a
    /// thread of the plugin (or on this one when the event is ready already). `f` must not
    /// block: the plugin's thread runs it.
    pub fn on_ready(&self, f: Box<dyn FnOnce(Result<()>) + Send>) -> Result<()> {
        struct Ready {
            client: Arc<ClientInner>,
            f: Box<dyn FnOnce(Result<()>) + Send>,
        }
        unsafe extern "C" fn ready(error: *mut ffi::PJRT_Error, arg: *mut c_void) {
            // SAFETY: `arg` is the box `on_ready` leaked for this one call.
            let ready = unsafe { Box::from_raw(arg.cast::<Ready>()) };
            let result = ready.client.api().take_error(error, "PJRT_Event_OnReady");
            // A panic must not unwind into the plugin.
            let _ =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || (ready.f)(result)));
        }
        let arg = Box::into_raw(Box::new(Ready {
            client: self.client.clone(),
            f,
        }));
        let mut args = ffi::PJRT_Event_OnReady_Args::new();
        args.event = self.raw;
        args.callback = Some(ready);
        args.user_arg = arg.cast();
        let r = pjrt_call!(self.client.api(), PJRT_Event_OnReady, &mut args);
        if r.is_err() {
            // Not registered: the callback will never run, so the box is still ours.
            // SAFETY: `arg` came from `Box::into_raw` above and was not handed over.
            drop(unsafe { Box::from_raw(arg) });
        }
        r
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        let mut args = ffi::PJRT_Event_Destroy_Args::new();
        args.event = self.raw;
        let _ = pjrt_call!(self.client.api(), PJRT_Event_Destroy, &mut args);
        leak::destroyed(ObjectKind::Event, self.raw as *const ());
    }
}

/// A buffer in device memory (`PJRT_Buffer`), freed on drop.
pub struct Buffer {
    pub(crate) client: Arc<ClientInner>,
    pub(crate) raw: *mut ffi::PJRT_Buffer,
}

// SAFETY: PJRT buffers may be used from any thread; the plugin synchronizes access.
unsafe impl Send for Buffer {}
// SAFETY: as above; all methods take `&self`.
unsafe impl Sync for Buffer {}

impl Buffer {
    /// Takes ownership of a buffer the plugin returned.
    pub(crate) fn wrap(client: &Arc<ClientInner>, raw: *mut ffi::PJRT_Buffer) -> Buffer {
        leak::created(ObjectKind::Buffer, raw as *const ());
        Buffer {
            client: client.clone(),
            raw,
        }
    }

    /// The element type.
    pub fn dtype(&self) -> Result<ElementType> {
        let mut args = ffi::PJRT_Buffer_ElementType_Args::new();
        args.buffer = self.raw;
        pjrt_call!(self.client.api(), PJRT_Buffer_ElementType, &mut args)?;
        Ok(ElementType::from_raw(args.type_))
    }

    /// The dimensions.
    pub fn dims(&self) -> Result<Vec<i64>> {
        let mut args = ffi::PJRT_Buffer_Dimensions_Args::new();
        args.buffer = self.raw;
        pjrt_call!(self.client.api(), PJRT_Buffer_Dimensions, &mut args)?;
        if args.dims.is_null() || args.num_dims == 0 {
            return Ok(Vec::new());
        }
        // SAFETY: the plugin returned `num_dims` values owned by the live buffer.
        Ok(unsafe { std::slice::from_raw_parts(args.dims, args.num_dims) }.to_vec())
    }

    /// Bytes the buffer occupies on its device.
    pub fn on_device_size_in_bytes(&self) -> Result<usize> {
        let mut args = ffi::PJRT_Buffer_OnDeviceSizeInBytes_Args::new();
        args.buffer = self.raw;
        pjrt_call!(
            self.client.api(),
            PJRT_Buffer_OnDeviceSizeInBytes,
            &mut args
        )?;
        Ok(args.on_device_size_in_bytes)
    }

    /// The device holding the buffer.
    pub fn device(&self) -> Result<Device> {
        let mut args = ffi::PJRT_Buffer_Device_Args::new();
        args.buffer = self.raw;
        pjrt_call!(self.client.api(), PJRT_Buffer_Device, &mut args)?;
        Ok(Device {
            client: self.client.clone(),
            raw: args.device,
        })
    }

    /// Whether the buffer's memory was released (by [`Buffer::delete`] or by donation to an
    /// execution).
    pub fn is_deleted(&self) -> Result<bool> {
        let mut args = ffi::PJRT_Buffer_IsDeleted_Args::new();
        args.buffer = self.raw;
        pjrt_call!(self.client.api(), PJRT_Buffer_IsDeleted, &mut args)?;
        Ok(args.is_deleted)
    }

    /// Releases the device memory now; the handle stays valid (and is freed on drop).
    pub fn delete(&self) -> Result<()> {
        let mut args = ffi::PJRT_Buffer_Delete_Args::new();
        args.buffer = self.raw;
        pjrt_call!(self.client.api(), PJRT_Buffer_Delete, &mut args)
    }

    /// An event that is ready when the buffer's contents are.
    pub fn ready_event(&self) -> Result<Event> {
        let mut args = ffi::PJRT_Buffer_ReadyEvent_Args::new();
        args.buffer = self.raw;
        pjrt_call!(self.client.api(), PJRT_Buffer_ReadyEvent, &mut args)?;
        Event::wrap(&self.client, args.event).ok_or_else(|| PjrtError::Plugin {
            function: "PJRT_Buffer_ReadyEvent",
            code: super::ErrorCode::Internal,
            message: "the plugin returned no event".into(),
        })
    }

    /// Waits until the buffer's contents are computed; returns the error if computing them
    /// failed.
    pub fn block_until_ready(&self) -> Result<()> {
        self.ready_event()?.wait()
    }

    /// Copies the buffer to the host as dense row-major bytes.
    pub fn to_host_bytes(&self) -> Result<Vec<u8>> {
        // First call with no destination: the plugin reports the size it needs.
        let mut args = ffi::PJRT_Buffer_ToHostBuffer_Args::new();
        args.src = self.raw;
        pjrt_call!(self.client.api(), PJRT_Buffer_ToHostBuffer, &mut args)?;
        // Some plugins return an event even for the size query; free it.
        drop(Event::wrap(&self.client, args.event));
        let size = args.dst_size;
        let mut out = vec![0u8; size];
        let mut args = ffi::PJRT_Buffer_ToHostBuffer_Args::new();
        args.src = self.raw;
        args.dst = out.as_mut_ptr() as *mut c_void;
        args.dst_size = size;
        pjrt_call!(self.client.api(), PJRT_Buffer_ToHostBuffer, &mut args)?;
        // The copy is asynchronous: `out` must stay alive and untouched until the event is
        // ready, which `wait` ensures before `out` is returned.
        if let Some(ev) = Event::wrap(&self.client, args.event) {
            ev.wait()?;
        }
        Ok(out)
    }

    /// Copies the buffer to a host `Vec<T>`; `T` must match the buffer's element type.
    pub fn to_vec<T: NativeType>(&self) -> Result<Vec<T>> {
        let dtype = self.dtype()?;
        if dtype != T::DTYPE {
            return Err(PjrtError::InvalidArgument(format!(
                "buffer holds {dtype} but {} was asked for; read it with the matching host type",
                T::DTYPE
            )));
        }
        let bytes = self.to_host_bytes()?;
        let size = std::mem::size_of::<T>();
        if bytes.len() % size != 0 {
            return Err(PjrtError::InvalidArgument(format!(
                "the plugin returned {} bytes, not a multiple of the {size}-byte element size",
                bytes.len()
            )));
        }
        let n = bytes.len() / size;
        let mut out = vec![T::default(); n];
        // SAFETY: `out` holds exactly `bytes.len()` bytes of a type valid for every bit
        // pattern (the `NativeType` contract); the regions do not overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), out.as_mut_ptr() as *mut u8, bytes.len())
        };
        Ok(out)
    }

    /// Copies the buffer to another device of the same client.
    pub fn copy_to_device(&self, device: &Device) -> Result<Buffer> {
        if !Arc::ptr_eq(&self.client, &device.client) {
            return Err(PjrtError::InvalidArgument(
                "the destination device belongs to another client; copy through the host instead"
                    .into(),
            ));
        }
        let mut args = ffi::PJRT_Buffer_CopyToDevice_Args::new();
        args.buffer = self.raw;
        args.dst_device = device.raw;
        pjrt_call!(self.client.api(), PJRT_Buffer_CopyToDevice, &mut args)?;
        Ok(Buffer::wrap(&self.client, args.dst_buffer))
    }

    /// The client that owns the buffer.
    pub fn client(&self) -> Client {
        Client {
            inner: self.client.clone(),
        }
    }

    /// The raw handle, for code that calls the PJRT C API directly. Stays owned by `self`.
    pub fn as_raw(&self) -> *mut ffi::PJRT_Buffer {
        self.raw
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        let mut args = ffi::PJRT_Buffer_Destroy_Args::new();
        args.buffer = self.raw;
        let _ = pjrt_call!(self.client.api(), PJRT_Buffer_Destroy, &mut args);
        leak::destroyed(ObjectKind::Buffer, self.raw as *const ());
    }
}

impl fmt::Debug for Buffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let dtype = self
            .dtype()
            .map(|d| d.to_string())
            .unwrap_or_else(|e| e.to_string());
        let dims = self.dims().map(|d| format!("{d:?}")).unwrap_or_default();
        write!(f, "Buffer({dtype}{dims})")
    }
}

impl Client {
    /// Copies dense row-major host bytes to a new buffer on `device`.
    pub fn buffer_from_bytes(
        &self,
        bytes: &[u8],
        dtype: ElementType,
        dims: &[i64],
        device: &Device,
    ) -> Result<Buffer> {
        let elem = dtype
            .size_in_bytes()
            .ok_or_else(|| PjrtError::UnsupportedType(dtype.to_string()))?;
        let expected = element_count(dims)?
            .checked_mul(elem)
            .ok_or_else(|| PjrtError::InvalidArgument(format!("shape {dims:?} is too large")))?;
        if bytes.len() != expected {
            return Err(PjrtError::InvalidArgument(format!(
                "{} host bytes given for a {dtype}{dims:?} buffer, which needs {expected}",
                bytes.len()
            )));
        }
        if !Arc::ptr_eq(&self.inner, &device.client) {
            return Err(PjrtError::InvalidArgument(
                "the device belongs to another client".into(),
            ));
        }
        let mut args = ffi::PJRT_Client_BufferFromHostBuffer_Args::new();
        args.client = self.inner.raw;
        args.data = bytes.as_ptr() as *const c_void;
        args.type_ = dtype.to_raw();
        args.dims = dims.as_ptr();
        args.num_dims = dims.len();
        // The plugin copies the data before returning, so `bytes` need not outlive the call.
        args.host_buffer_semantics = ffi::PJRT_HostBufferSemantics_kImmutableOnlyDuringCall;
        args.device = device.raw;
        pjrt_call!(
            self.inner.api(),
            PJRT_Client_BufferFromHostBuffer,
            &mut args
        )?;
        let buffer = Buffer::wrap(&self.inner, args.buffer);
        if let Some(done) = Event::wrap(&self.inner, args.done_with_host_buffer) {
            done.wait()?;
        }
        Ok(buffer)
    }

    /// Copies a host slice to a new buffer of shape `dims` on `device`.
    pub fn buffer_from_slice<T: NativeType>(
        &self,
        data: &[T],
        dims: &[i64],
        device: &Device,
    ) -> Result<Buffer> {
        // SAFETY: `T` is plain old data (the `NativeType` contract); the byte view covers
        // exactly the slice's memory and lives no longer than `data`.
        let bytes = unsafe {
            std::slice::from_raw_parts(data.as_ptr() as *const u8, std::mem::size_of_val(data))
        };
        self.buffer_from_bytes(bytes, T::DTYPE, dims, device)
    }
}
