//! The disk cache of compiled executables.
//!
//! One file per (plugin, program): `<program hash>-<plugin key>.zpx` in the cache folder, the
//! program hash covering the traced graph and the StableHLO text zoo lowered it to
//! ([`cache_dir`]). A file is a small header naming the plugin (path, API and platform
//! version) and graph, then the plugin's serialized executable and a checksum:
//!
//! ```text
//! b"ZOOPJRT1" | u32 header length | header (UTF-8) | u64 payload length | payload | u64 FNV-1a of payload
//! ```
//!
//! Files are written to a temporary name in the same folder and renamed into place, so a
//! reader never sees half a file. A file with a bad magic, a header for another plugin or
//! graph, a wrong length or checksum, or one the plugin refuses to load is removed and the
//! graph recompiled.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

const MAGIC: &[u8; 8] = b"ZOOPJRT1";

static DIR_OVERRIDE: Mutex<Option<Option<PathBuf>>> = Mutex::new(None);

/// Sets the folder of the executable disk cache for this process (`None` turns the disk
/// cache off), overriding `ZOO_PJRT_CACHE` and the default.
pub fn set_cache_dir(dir: Option<PathBuf>) {
    *DIR_OVERRIDE.lock().unwrap_or_else(|p| p.into_inner()) = Some(dir);
}

/// The folder of the executable disk cache: [`set_cache_dir`]'s, else `ZOO_PJRT_CACHE`
/// (an empty value or `off` turns the disk cache off), else `$XDG_CACHE_HOME/zoo/pjrt`,
/// else `~/.cache/zoo/pjrt`. `None` when off or no home is known.
pub fn cache_dir() -> Option<PathBuf> {
    if let Some(d) = DIR_OVERRIDE
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone()
    {
        return d;
    }
    if let Some(v) = std::env::var_os("ZOO_PJRT_CACHE") {
        if v.is_empty() || v == "off" {
            return None;
        }
        return Some(PathBuf::from(v));
    }
    if let Some(x) = std::env::var_os("XDG_CACHE_HOME").filter(|v| !v.is_empty()) {
        return Some(PathBuf::from(x).join("zoo").join("pjrt"));
    }
    std::env::var_os("HOME")
        .filter(|v| !v.is_empty())
        .map(|h| PathBuf::from(h).join(".cache").join("zoo").join("pjrt"))
}

/// FNV-1a, 64 bit: a checksum for torn or corrupted files (not a defence against tampering;
/// the cache folder is the user's own).
pub(crate) fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// Where the entry for `graph` under plugin identity `plugin` lives.
pub(crate) fn entry_path(dir: &Path, graph: u64, plugin_key: u64) -> PathBuf {
    dir.join(format!("{graph:016x}-{plugin_key:016x}.zpx"))
}

/// The header text that must match for an entry to be used.
pub(crate) fn header(plugin_identity: &str, graph: u64) -> String {
    format!("plugin={plugin_identity}\ngraph={graph:016x}\n")
}

/// Why an entry was not used.
#[derive(Debug)]
pub(crate) enum Miss {
    /// No such file (or no cache folder).
    Absent,
    /// A file that is not a valid entry for this plugin and graph; it has been removed.
    Rejected(String),
}

/// Reads the payload of the entry at `path` if its header is `expected`; a bad entry is
/// removed.
pub(crate) fn read(path: &Path, expected: &str) -> Result<Vec<u8>, Miss> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(Miss::Absent),
        Err(e) => return Err(reject(path, format!("unreadable: {e}"))),
    };
    match parse(&bytes, expected) {
        Ok(p) => Ok(p.to_vec()),
        Err(why) => Err(reject(path, why)),
    }
}

fn reject(path: &Path, why: String) -> Miss {
    // Removal failing (a read-only folder) leaves the bad file; it is rejected again next
    // time, which costs a compile and nothing else.
    let _ = std::fs::remove_file(path);
    Miss::Rejected(why)
}

fn parse<'a>(b: &'a [u8], expected: &str) -> Result<&'a [u8], String> {
    if b.len() < 12 || &b[..8] != MAGIC {
        return Err("bad magic (not a zoo executable cache entry)".into());
    }
    let hl = u32::from_le_bytes(b[8..12].try_into().map_err(|_| "short header")?) as usize;
    let h_end = 12usize
        .checked_add(hl)
        .filter(|&e| e + 8 <= b.len())
        .ok_or("truncated header")?;
    if &b[12..h_end] != expected.as_bytes() {
        return Err(format!(
            "written for another plugin or graph: {:?}",
            String::from_utf8_lossy(&b[12..h_end])
        ));
    }
    let pl =
        u64::from_le_bytes(b[h_end..h_end + 8].try_into().map_err(|_| "short length")?) as usize;
    let p_start = h_end + 8;
    let p_end = p_start
        .checked_add(pl)
        .filter(|&e| e + 8 == b.len())
        .ok_or("truncated or oversized payload")?;
    let sum = u64::from_le_bytes(b[p_end..].try_into().map_err(|_| "short checksum")?);
    if sum != fnv1a(&b[p_start..p_end]) {
        return Err("checksum mismatch".into());
    }
    Ok(&b[p_start..p_end])
}

static TMP_SEQ: AtomicU64 = AtomicU64::new(0);

/// Writes an entry atomically: temporary file in the same folder, then rename.
pub(crate) fn write(path: &Path, header: &str, payload: &[u8]) -> std::io::Result<()> {
    let dir = path
        .parent()
        .ok_or_else(|| std::io::Error::other("cache path has no folder"))?;
    std::fs::create_dir_all(dir)?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(
        ".{name}.{}.{}.tmp",
        std::process::id(),
        TMP_SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        let mut buf = Vec::with_capacity(payload.len() + header.len() + 32);
        buf.extend_from_slice(MAGIC);
        buf.extend_from_slice(&(header.len() as u32).to_le_bytes());
        buf.extend_from_slice(header.as_bytes());
        buf.extend_from_slice(&(payload.len() as u64).to_le_bytes());
        buf.extend_from_slice(payload);
        buf.extend_from_slice(&fnv1a(payload).to_le_bytes());
        f.write_all(&buf)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip_and_bad_ones_are_removed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = entry_path(dir.path(), 7, 9);
        let h = header("/x/plugin.so 0.81", 7);
        assert!(matches!(read(&p, &h), Err(Miss::Absent)));
        write(&p, &h, b"payload").expect("write");
        assert_eq!(read(&p, &h).expect("hit"), b"payload");
        // Another plugin's header: rejected and removed.
        assert!(matches!(
            read(&p, &header("/x/plugin.so 0.115", 7)),
            Err(Miss::Rejected(_))
        ));
        assert!(!p.exists());
        // Corruption of the payload: checksum mismatch.
        write(&p, &h, b"payload").expect("write");
        let mut b = std::fs::read(&p).expect("read");
        let n = b.len();
        b[n - 9] ^= 1;
        std::fs::write(&p, &b).expect("corrupt");
        assert!(matches!(read(&p, &h), Err(Miss::Rejected(m)) if m.contains("checksum")));
        // Garbage: bad magic. Truncation: rejected.
        std::fs::write(&p, b"garbage garbage").expect("garbage");
        assert!(matches!(read(&p, &h), Err(Miss::Rejected(m)) if m.contains("magic")));
        write(&p, &h, b"payload").expect("write");
        let b = std::fs::read(&p).expect("read");
        std::fs::write(&p, &b[..b.len() - 3]).expect("truncate");
        assert!(matches!(read(&p, &h), Err(Miss::Rejected(_))));
        // No temporary files are left behind.
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .expect("ls")
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
            .collect();
        assert!(left.is_empty());
    }
}
