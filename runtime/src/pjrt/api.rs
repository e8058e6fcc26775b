//! Loading a plugin: `dlopen`, `GetPjrtApi`, the version check, `PJRT_Plugin_Initialize`, and
//! the checked call path every wrapper goes through.

use std::collections::HashMap;
use std::ffi::c_char;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use super::error::{ErrorCode, PjrtError, Result};
use super::ffi::{self, Args};
use super::leak::{self, ObjectKind};

/// Calls the PJRT function `$f` of `$plugin` (a `&PluginInner`) with `$args` (a
/// `&mut <Args>`), after checking that the plugin's table holds the entry, and turns a
/// returned `PJRT_Error` into [`PjrtError::Plugin`].
macro_rules! pjrt_call {
    ($plugin:expr, $f:ident, $args:expr) => {{
        let plugin: &$crate::pjrt::api::PluginInner = $plugin;
        match plugin.entry_present(
            ::std::mem::offset_of!($crate::pjrt::ffi::PJRT_Api, $f),
            stringify!($f),
        ) {
            Err(e) => Err(e),
            Ok(()) => {
                // SAFETY: `entry_present` checked that the entry lies inside the table the
                // plugin returned (its `struct_size`), so the read stays in bounds; the read
                // goes through a raw place, never a reference to our longer struct.
                let f = unsafe { ::std::ptr::addr_of!((*plugin.api).$f).read() };
                match f {
                    None => Err($crate::pjrt::error::PjrtError::MissingFunction {
                        function: stringify!($f),
                        plugin_minor: plugin.minor,
                    }),
                    Some(f) => {
                        let args = $args;
                        // SAFETY: `args` is a header-accurate struct whose `struct_size` is
                        // the header's; every pointer in it is valid for the call, as each
                        // call site guarantees.
                        let err = unsafe { f(args) };
                        plugin.take_error(err, stringify!($f))
                    }
                }
            }
        }
    }};
}
pub(crate) use pjrt_call;

/// The shared state of one loaded plugin.
pub struct PluginInner {
    pub(crate) path: PathBuf,
    pub(crate) api: *const ffi::PJRT_Api,
    /// Byte size of the plugin's function table (`PJRT_Api.struct_size`).
    pub(crate) table_size: usize,
    pub(crate) major: i32,
    pub(crate) minor: i32,
    // Kept so the code behind `api` stays mapped; plugins are never unloaded (PJRT has no
    // shutdown call, and `PJRT_Plugin_Initialize` may run only once per process).
    _library: libloading::Library,
}

// SAFETY: the function table is immutable after `GetPjrtApi` returns and the PJRT C API
// requires its functions to be callable from any thread.
unsafe impl Send for PluginInner {}
// SAFETY: as above; `PluginInner` has no interior mutability of its own.
unsafe impl Sync for PluginInner {}

impl PluginInner {
    /// Ok when the table entry at `offset` exists in this plugin's table.
    pub(crate) fn entry_present(&self, offset: usize, name: &'static str) -> Result<()> {
        if offset + std::mem::size_of::<ffi::RawFn>() <= self.table_size {
            Ok(())
        } else {
            Err(PjrtError::MissingFunction {
                function: name,
                plugin_minor: self.minor,
            })
        }
    }

    /// Converts an owned `PJRT_Error*` into a result, reading its message and code and
    /// destroying it exactly once.
    pub(crate) fn take_error(
        &self,
        err: *mut ffi::PJRT_Error,
        function: &'static str,
    ) -> Result<()> {
        if err.is_null() {
            return Ok(());
        }
        leak::created(ObjectKind::Error, err as *const ());
        let (code, message) = self.error_details(err);
        self.destroy_error(err);
        Err(PjrtError::Plugin {
            function,
            code,
            message,
        })
    }

    fn error_details(&self, err: *mut ffi::PJRT_Error) -> (ErrorCode, String) {
        let mut margs = ffi::PJRT_Error_Message_Args::new();
        margs.error = err;
        let message = match self.error_message_fn() {
            Some(f) => {
                // SAFETY: `err` is a live error returned by this plugin; the message it
                // points to lives as long as `err`, and we copy it before destroying `err`.
                unsafe {
                    f(&mut margs);
                    string_from(margs.message, margs.message_size)
                }
            }
            None => "(the plugin provides no PJRT_Error_Message)".to_string(),
        };
        let mut cargs = ffi::PJRT_Error_GetCode_Args::new();
        cargs.error = err;
        let code = if self
            .entry_present(
                std::mem::offset_of!(ffi::PJRT_Api, PJRT_Error_GetCode),
                "PJRT_Error_GetCode",
            )
            .is_ok()
        {
            // SAFETY: the entry is inside the table (checked above).
            match unsafe { std::ptr::addr_of!((*self.api).PJRT_Error_GetCode).read() } {
                Some(f) => {
                    // SAFETY: `err` is live; `cargs` is header-accurate.
                    let e2 = unsafe { f(&mut cargs) };
                    if e2.is_null() {
                        ErrorCode::from_raw(cargs.code)
                    } else {
                        // Getting the code failed: free that error too and report Unknown.
                        leak::created(ObjectKind::Error, e2 as *const ());
                        self.destroy_error(e2);
                        ErrorCode::Unknown
                    }
                }
                None => ErrorCode::Unknown,
            }
        } else {
            ErrorCode::Unknown
        };
        (code, message)
    }

    fn error_message_fn(&self) -> Option<unsafe extern "C" fn(*mut ffi::PJRT_Error_Message_Args)> {
        self.entry_present(
            std::mem::offset_of!(ffi::PJRT_Api, PJRT_Error_Message),
            "PJRT_Error_Message",
        )
        .ok()?;
        // SAFETY: the entry is inside the table (checked above).
        unsafe { std::ptr::addr_of!((*self.api).PJRT_Error_Message).read() }
    }

    pub(crate) fn destroy_error(&self, err: *mut ffi::PJRT_Error) {
        if self
            .entry_present(
                std::mem::offset_of!(ffi::PJRT_Api, PJRT_Error_Destroy),
                "PJRT_Error_Destroy",
            )
            .is_err()
        {
            return;
        }
        // SAFETY: the entry is inside the table (checked above).
        if let Some(f) = unsafe { std::ptr::addr_of!((*self.api).PJRT_Error_Destroy).read() } {
            let mut args = ffi::PJRT_Error_Destroy_Args::new();
            args.error = err;
            // SAFETY: `err` is an error this plugin returned and nobody destroyed yet.
            unsafe { f(&mut args) };
            leak::destroyed(ObjectKind::Error, err as *const ());
        }
    }
}

/// A loaded PJRT plugin. Cheap to clone; loading the same file twice returns the same plugin.
#[derive(Clone)]
pub struct Plugin {
    pub(crate) inner: Arc<PluginInner>,
}

static LOADED: Mutex<Option<HashMap<PathBuf, Plugin>>> = Mutex::new(None);

/// A value of a plugin attribute (`PJRT_Plugin_Attributes`).
#[derive(Debug, Clone, PartialEq)]
pub enum AttributeValue {
    /// A string.
    String(String),
    /// An integer.
    Int64(i64),
    /// A list of integers (e.g. a StableHLO version `[1, 9, 3]`).
    Int64List(Vec<i64>),
    /// A float.
    Float(f32),
    /// A boolean.
    Bool(bool),
}

impl fmt::Display for AttributeValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AttributeValue::String(s) => write!(f, "{s}"),
            AttributeValue::Int64(v) => write!(f, "{v}"),
            AttributeValue::Int64List(v) => {
                let parts: Vec<String> = v.iter().map(|x| x.to_string()).collect();
                write!(f, "{}", parts.join("."))
            }
            AttributeValue::Float(v) => write!(f, "{v}"),
            AttributeValue::Bool(v) => write!(f, "{v}"),
        }
    }
}

impl Plugin {
    /// Loads the plugin at `path`, checks its PJRT API version and initializes it.
    ///
    /// A libtpu file is only loaded on a Google Compute Engine host or when
    /// `ZOO_FORCE_TPU=1` (see [`super::discovery::tpu_allowed`]); otherwise this answers
    /// [`PjrtError::NoTpu`] at once.
    pub fn load(path: impl AsRef<Path>) -> Result<Plugin> {
        let path = path.as_ref();
        if super::discovery::is_libtpu(path) {
            super::discovery::tpu_allowed()?;
        }
        let key = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
        let mut loaded = LOADED.lock().unwrap_or_else(|e| e.into_inner());
        let map = loaded.get_or_insert_with(HashMap::new);
        if let Some(p) = map.get(&key) {
            return Ok(p.clone());
        }
        let plugin = Self::open(path)?;
        map.insert(key, plugin.clone());
        Ok(plugin)
    }

    fn open(path: &Path) -> Result<Plugin> {
        // SAFETY: loading a shared library runs its initializers. That is the point of a
        // plugin; zoo only loads files the user named or that discovery found in plugin
        // package locations.
        let library = unsafe { libloading::Library::new(path) }.map_err(|e| PjrtError::Load {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
        // SAFETY: `GetPjrtApi` has this signature in every PJRT plugin; a library that
        // exports no such symbol is rejected before anything is called.
        let get: libloading::Symbol<ffi::GetPjrtApiFn> = unsafe {
            library.get(ffi::GET_PJRT_API_SYMBOL)
        }
        .map_err(|_| PjrtError::NotAPlugin {
            path: path.to_path_buf(),
        })?;
        // SAFETY: see above; the function takes no arguments and returns a static table.
        let api = unsafe { get() };
        if api.is_null() {
            return Err(PjrtError::BadApiTable {
                path: path.to_path_buf(),
                what: "a null table".into(),
            });
        }
        // SAFETY: `api` is non-null and points at the plugin's static `PJRT_Api`, whose
        // first fields (struct_size, extension_start, pjrt_api_version) exist in every
        // version of the header.
        let (table_size, version) = unsafe {
            (
                std::ptr::addr_of!((*api).struct_size).read(),
                std::ptr::addr_of!((*api).pjrt_api_version).read(),
            )
        };
        let min = std::mem::offset_of!(ffi::PJRT_Api, PJRT_Error_Destroy);
        if table_size < min {
            return Err(PjrtError::BadApiTable {
                path: path.to_path_buf(),
                what: format!("a table of {table_size} bytes, smaller than its header ({min})"),
            });
        }
        check_version(path, version.major_version, version.minor_version)?;
        let inner = PluginInner {
            path: path.to_path_buf(),
            api,
            table_size,
            major: version.major_version,
            minor: version.minor_version,
            _library: library,
        };
        let mut args = ffi::PJRT_Plugin_Initialize_Args::new();
        pjrt_call!(&inner, PJRT_Plugin_Initialize, &mut args)?;
        Ok(Plugin {
            inner: Arc::new(inner),
        })
    }

    /// The file this plugin was loaded from.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// The plugin's PJRT C API version `(major, minor)`.
    pub fn api_version(&self) -> (i32, i32) {
        (self.inner.major, self.inner.minor)
    }

    /// Number of entries in the plugin's function table.
    pub fn function_count(&self) -> usize {
        (self.inner.table_size - std::mem::offset_of!(ffi::PJRT_Api, PJRT_Error_Destroy))
            / std::mem::size_of::<ffi::RawFn>()
    }

    /// The plugin's attributes (`xla_version`, `stablehlo_current_version`, ...).
    pub fn attributes(&self) -> Result<Vec<(String, AttributeValue)>> {
        let mut args = ffi::PJRT_Plugin_Attributes_Args::new();
        pjrt_call!(&self.inner, PJRT_Plugin_Attributes, &mut args)?;
        // SAFETY: the plugin returned `num_attributes` values that live for the process.
        unsafe { named_values(args.attributes, args.num_attributes) }
    }
}

impl fmt::Debug for Plugin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Plugin")
            .field("path", &self.inner.path)
            .field("api_version", &(self.inner.major, self.inner.minor))
            .finish()
    }
}

/// Accepts any minor of the major zoo speaks: older minors lack only appended fields and
/// table entries (which every call checks), newer ones accept zoo's smaller structs where
/// they kept backward compatibility and answer a typed error where they did not.
fn check_version(path: &Path, major: i32, minor: i32) -> Result<()> {
    if major != ffi::PJRT_API_MAJOR {
        return Err(PjrtError::UnsupportedVersion {
            path: path.to_path_buf(),
            major,
            minor,
            supported: ffi::PJRT_API_MAJOR,
        });
    }
    Ok(())
}

/// Copies `len` bytes at `ptr` into a `String` (lossy UTF-8); null gives "".
///
/// # Safety
/// `ptr` must be null or valid for reads of `len` bytes.
pub(crate) unsafe fn string_from(ptr: *const c_char, len: usize) -> String {
    if ptr.is_null() || len == 0 {
        return String::new();
    }
    // SAFETY: the caller guarantees `len` readable bytes at `ptr`.
    let bytes = unsafe { std::slice::from_raw_parts(ptr as *const u8, len) };
    String::from_utf8_lossy(bytes).into_owned()
}

/// Copies an array of `PJRT_NamedValue`s.
///
/// # Safety
/// `values` must be null or point at `n` valid named values.
pub(crate) unsafe fn named_values(
    values: *const ffi::PJRT_NamedValue,
    n: usize,
) -> Result<Vec<(String, AttributeValue)>> {
    if values.is_null() || n == 0 {
        return Ok(Vec::new());
    }
    // SAFETY: the caller guarantees `n` values at `values`.
    let values = unsafe { std::slice::from_raw_parts(values, n) };
    let mut out = Vec::with_capacity(n);
    for v in values {
        // SAFETY: name/value pointers come from the plugin with their sizes; the union
        // member read is the one `type_` names.
        let (name, value) = unsafe {
            let name = string_from(v.name, v.name_size);
            let value = match v.type_ {
                ffi::PJRT_NamedValue_kString => {
                    AttributeValue::String(string_from(v.value.string_value, v.value_size))
                }
                ffi::PJRT_NamedValue_kInt64 => AttributeValue::Int64(v.value.int64_value),
                ffi::PJRT_NamedValue_kInt64List => {
                    let p = v.value.int64_array_value;
                    AttributeValue::Int64List(if p.is_null() {
                        Vec::new()
                    } else {
                        std::slice::from_raw_parts(p, v.value_size).to_vec()
                    })
                }
                ffi::PJRT_NamedValue_kFloat => AttributeValue::Float(v.value.float_value),
                ffi::PJRT_NamedValue_kBool => AttributeValue::Bool(v.value.bool_value),
                other => AttributeValue::String(format!("(unknown value type {other})")),
            };
            (name, value)
        };
        out.push((name, value));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_major_zero_is_spoken() {
        let p = Path::new("/x/plugin.so");
        assert!(check_version(p, 0, 81).is_ok());
        assert!(check_version(p, 0, 200).is_ok());
        let e = check_version(p, 1, 0).expect_err("major 1");
        assert!(matches!(e, PjrtError::UnsupportedVersion { major: 1, .. }));
        assert!(e.to_string().contains("PJRT C API 1.0"), "{e}");
    }
}
