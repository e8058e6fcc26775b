//! The key-value store a PJRT client shares between processes: the `kv_get_callback`,
//! `kv_put_callback` and `kv_try_get_callback` of `PJRT_Client_Create_Args`, served by any
//! [`KeyValueStore`] (zoo's is [`crate::distributed`]'s coordinator).
//!
//! A multi-process client (GPU nodes, TPU hosts) exchanges its topology and collective
//! identifiers through these callbacks while it is created; activations never pass here.

use std::ffi::{c_char, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::Duration;

use super::error::ErrorCode;
use super::ffi;

/// Why a key-value operation failed, as a PJRT error code and a message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct KvError {
    /// `NotFound` for a missing key, `DeadlineExceeded` for a timeout, `Unavailable` when
    /// the store cannot be reached.
    pub code: ErrorCode,
    /// What happened, naming the key.
    pub message: String,
}

/// A store shared by every process of a job; what a PJRT client's key-value callbacks call.
/// Implementations are called from the plugin's threads, concurrently.
pub trait KeyValueStore: Send + Sync {
    /// The value of `key`, waiting up to `timeout` for another process to put it.
    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>, KvError>;
    /// The value of `key` if it is there now.
    fn try_get(&self, key: &str) -> Result<Option<Vec<u8>>, KvError>;
    /// Sets `key` to `value`.
    fn put(&self, key: &str, value: &[u8]) -> Result<(), KvError>;
}

/// A store whose keys are all under `prefix`: the header leaves avoiding collisions between
/// plugins to the caller, so each platform's client gets its own prefix.
pub struct Prefixed {
    prefix: String,
    inner: Arc<dyn KeyValueStore>,
}

impl Prefixed {
    /// `inner`'s keys under `prefix`.
    pub fn new(prefix: impl Into<String>, inner: Arc<dyn KeyValueStore>) -> Self {
        Self {
            prefix: prefix.into(),
            inner,
        }
    }
}

impl KeyValueStore for Prefixed {
    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>, KvError> {
        self.inner.get(&format!("{}{key}", self.prefix), timeout)
    }
    fn try_get(&self, key: &str) -> Result<Option<Vec<u8>>, KvError> {
        self.inner.try_get(&format!("{}{key}", self.prefix))
    }
    fn put(&self, key: &str, value: &[u8]) -> Result<(), KvError> {
        self.inner.put(&format!("{}{key}", self.prefix), value)
    }
}

/// What `user_arg` points to: a thin pointer to the store, owned by the client.
pub(crate) type UserArg = Box<Arc<dyn KeyValueStore>>;

/// Installs `store` in `args`; `owner` must outlive the client.
pub(crate) fn install(args: &mut ffi::PJRT_Client_Create_Args, owner: &UserArg) {
    let user = owner as &Arc<dyn KeyValueStore> as *const Arc<dyn KeyValueStore> as *mut c_void;
    let get: ffi::PJRT_KeyValueGetCallback = kv_get;
    let put: ffi::PJRT_KeyValuePutCallback = kv_put;
    let try_get: ffi::PJRT_KeyValueTryGetCallback = kv_try_get;
    args.kv_get_callback = get as *mut c_void;
    args.kv_get_user_arg = user;
    args.kv_put_callback = put as *mut c_void;
    args.kv_put_user_arg = user;
    args.kv_try_get_callback = try_get as *mut c_void;
    args.kv_try_get_user_arg = user;
}

/// The value handed to the plugin: its length sits in the 8 bytes before it, because the
/// deleter the plugin calls gets the pointer alone.
fn leak_value(v: &[u8]) -> (*mut c_char, usize) {
    let mut b = vec![0u8; 8 + v.len()].into_boxed_slice();
    b[..8].copy_from_slice(&(v.len() as u64).to_le_bytes());
    b[8..].copy_from_slice(v);
    let base = Box::into_raw(b) as *mut u8;
    // SAFETY: the allocation holds 8 + len bytes.
    (unsafe { base.add(8) } as *mut c_char, v.len())
}

/// `PJRT_KeyValueGetCallback_ValueDeleter`: frees a value from [`leak_value`].
unsafe extern "C" fn free_value(value: *mut c_char) {
    if value.is_null() {
        return;
    }
    // SAFETY: `value` came from `leak_value`, 8 bytes into a boxed slice of 8 + len bytes
    // whose first 8 hold len.
    unsafe {
        let base = (value as *mut u8).sub(8);
        let mut len = [0u8; 8];
        std::ptr::copy_nonoverlapping(base, len.as_mut_ptr(), 8);
        let n = u64::from_le_bytes(len) as usize;
        drop(Box::from_raw(std::ptr::slice_from_raw_parts_mut(
            base,
            8 + n,
        )));
    }
}

/// The store and key of a callback, or the error to return.
///
/// # Safety
/// `user` is what [`install`] set; `key` points to `key_size` bytes.
unsafe fn store_and_key<'a>(
    user: *mut c_void,
    key: *const c_char,
    key_size: usize,
) -> Result<(&'a dyn KeyValueStore, String), KvError> {
    // SAFETY: per the contract above.
    let store = unsafe { &**(user as *const Arc<dyn KeyValueStore>) };
    let bytes: &[u8] = if key_size == 0 {
        &[]
    } else {
        // SAFETY: per the contract above.
        unsafe { std::slice::from_raw_parts(key as *const u8, key_size) }
    };
    let key = String::from_utf8(bytes.to_vec()).map_err(|_| KvError {
        code: ErrorCode::InvalidArgument,
        message: format!("key-value store: the key {bytes:?} is not UTF-8"),
    })?;
    Ok((store, key))
}

/// Runs `f`, turning an error or a panic into the plugin's `PJRT_Error`.
///
/// # Safety
/// `callback_error` is the plugin's `PJRT_CallbackError*`.
unsafe fn answer(
    callback_error: *mut ffi::PJRT_CallbackError,
    f: impl FnOnce() -> Result<(), KvError>,
) -> *mut ffi::PJRT_Error {
    let err = match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => return std::ptr::null_mut(),
        Ok(Err(e)) => e,
        Err(_) => KvError {
            code: ErrorCode::Internal,
            message: "key-value store: the callback panicked".into(),
        },
    };
    // SAFETY: the plugin passes a valid function pointer (null checked).
    match unsafe { callback_error.as_ref() }.and_then(|f| *f) {
        Some(make) => unsafe {
            make(
                err.code.raw(),
                err.message.as_ptr() as *const c_char,
                err.message.len(),
            )
        },
        // A plugin that gives no way to build an error gets none; the value stays unset.
        None => std::ptr::null_mut(),
    }
}

unsafe extern "C" fn kv_get(args: *mut ffi::PJRT_KeyValueGetCallback_Args) -> *mut ffi::PJRT_Error {
    // SAFETY: the plugin passes valid arguments for the duration of the call.
    let a = unsafe { &mut *args };
    unsafe {
        answer(a.callback_error, || {
            let (store, key) = store_and_key(a.user_arg, a.key, a.key_size)?;
            let timeout = Duration::from_millis(a.timeout_in_ms.max(0) as u64);
            let v = store.get(&key, timeout)?;
            (a.value, a.value_size) = leak_value(&v);
            a.value_deleter_callback = Some(free_value);
            Ok(())
        })
    }
}

unsafe extern "C" fn kv_try_get(
    args: *mut ffi::PJRT_KeyValueTryGetCallback_Args,
) -> *mut ffi::PJRT_Error {
    // SAFETY: the plugin passes valid arguments for the duration of the call.
    let a = unsafe { &mut *args };
    unsafe {
        answer(a.callback_error, || {
            let (store, key) = store_and_key(a.user_arg, a.key, a.key_size)?;
            let v = store.try_get(&key)?.ok_or_else(|| KvError {
                code: ErrorCode::NotFound,
                message: format!("key-value store: no value for {key:?}"),
            })?;
            (a.value, a.value_size) = leak_value(&v);
            a.value_deleter_callback = Some(free_value);
            Ok(())
        })
    }
}

unsafe extern "C" fn kv_put(args: *mut ffi::PJRT_KeyValuePutCallback_Args) -> *mut ffi::PJRT_Error {
    // SAFETY: the plugin passes valid arguments for the duration of the call.
    let a = unsafe { &mut *args };
    unsafe {
        answer(a.callback_error, || {
            let (store, key) = store_and_key(a.user_arg, a.key, a.key_size)?;
            let value: &[u8] = if a.value_size == 0 {
                &[]
            } else {
                std::slice::from_raw_parts(a.value as *const u8, a.value_size)
            };
            store.put(&key, value)
        })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::Mutex;

    use super::*;

    /// A one-process store: enough to drive the callbacks as a plugin does.
    #[derive(Default)]
    struct Memory(Mutex<HashMap<String, Vec<u8>>>);

    impl KeyValueStore for Memory {
        fn get(&self, key: &str, _timeout: Duration) -> Result<Vec<u8>, KvError> {
            self.try_get(key)?.ok_or_else(|| KvError {
                code: ErrorCode::DeadlineExceeded,
                message: format!("{key} never came"),
            })
        }
        fn try_get(&self, key: &str) -> Result<Option<Vec<u8>>, KvError> {
            Ok(self.0.lock().unwrap().get(key).cloned())
        }
        fn put(&self, key: &str, value: &[u8]) -> Result<(), KvError> {
            self.0.lock().unwrap().insert(key.into(), value.into());
            Ok(())
        }
    }

    thread_local! {
        static LAST_ERROR: std::cell::RefCell<Option<(i32, String)>> = const { std::cell::RefCell::new(None) };
    }

    /// The plugin's `PJRT_CallbackError`: records the error and returns a non-null token.
    unsafe extern "C" fn make_error(
        code: ffi::PJRT_Error_Code,
        message: *const c_char,
        size: usize,
    ) -> *mut ffi::PJRT_Error {
        let m = unsafe { std::slice::from_raw_parts(message as *const u8, size) };
        LAST_ERROR.with(|e| *e.borrow_mut() = Some((code, String::from_utf8_lossy(m).into())));
        std::ptr::NonNull::dangling().as_ptr()
    }

    fn client_args(owner: &UserArg) -> ffi::PJRT_Client_Create_Args {
        use ffi::Args as _;
        let mut args = ffi::PJRT_Client_Create_Args::new();
        install(&mut args, owner);
        args
    }

    /// The callbacks as a plugin calls them: put, get (value copied, then freed by the
    /// deleter), try_get of a missing key and get past its timeout as coded errors.
    #[test]
    fn callbacks_serve_the_store_as_a_plugin_calls_them() {
        use ffi::Args as _;
        let owner: UserArg = Box::new(Arc::new(Prefixed::new(
            "cuda:",
            Arc::new(Memory::default()),
        )));
        let args = client_args(&owner);
        let mut make: ffi::PJRT_CallbackError = Some(make_error);
        // SAFETY: the pointers were set by `install` to these functions' types.
        let put: ffi::PJRT_KeyValuePutCallback =
            unsafe { std::mem::transmute(args.kv_put_callback) };
        let get: ffi::PJRT_KeyValueGetCallback =
            unsafe { std::mem::transmute(args.kv_get_callback) };
        let try_get: ffi::PJRT_KeyValueTryGetCallback =
            unsafe { std::mem::transmute(args.kv_try_get_callback) };

        let (key, value) = ("topology/0", b"\x00local devices\xff".to_vec());
        let mut p = ffi::PJRT_KeyValuePutCallback_Args::new();
        p.key = key.as_ptr() as *const c_char;
        p.key_size = key.len();
        p.value = value.as_ptr() as *const c_char;
        p.value_size = value.len();
        p.callback_error = &mut make;
        p.user_arg = args.kv_put_user_arg;
        assert!(unsafe { put(&mut p) }.is_null());

        let mut g = ffi::PJRT_KeyValueGetCallback_Args::new();
        g.key = key.as_ptr() as *const c_char;
        g.key_size = key.len();
        g.timeout_in_ms = 1000;
        g.callback_error = &mut make;
        g.user_arg = args.kv_get_user_arg;
        assert!(unsafe { get(&mut g) }.is_null());
        let got =
            unsafe { std::slice::from_raw_parts(g.value as *const u8, g.value_size) }.to_vec();
        assert_eq!(got, value);
        unsafe { (g.value_deleter_callback.expect("a deleter"))(g.value) };
        // The prefix kept the key apart from another platform's.
        assert!(owner.try_get(key).unwrap().is_some());

        let missing = "topology/1";
        let mut t = ffi::PJRT_KeyValueTryGetCallback_Args::new();
        t.key = missing.as_ptr() as *const c_char;
        t.key_size = missing.len();
        t.callback_error = &mut make;
        t.user_arg = args.kv_try_get_user_arg;
        assert!(!unsafe { try_get(&mut t) }.is_null());
        let (code, message) = LAST_ERROR.with(|e| e.borrow_mut().take()).unwrap();
        assert_eq!(ErrorCode::from_raw(code), ErrorCode::NotFound);
        assert!(message.contains("topology/1"), "{message}");

        g.key = missing.as_ptr() as *const c_char;
        g.value = std::ptr::null_mut();
        assert!(!unsafe { get(&mut g) }.is_null());
        let (code, _) = LAST_ERROR.with(|e| e.borrow_mut().take()).unwrap();
        assert_eq!(ErrorCode::from_raw(code), ErrorCode::DeadlineExceeded);
        assert!(g.value.is_null());

        // An empty value round-trips too.
        p.value_size = 0;
        assert!(unsafe { put(&mut p) }.is_null());
        t.key = key.as_ptr() as *const c_char;
        t.key_size = key.len();
        assert!(unsafe { try_get(&mut t) }.is_null());
        assert_eq!(t.value_size, 0);
        unsafe { (t.value_deleter_callback.expect("a deleter"))(t.value) };
    }
}
