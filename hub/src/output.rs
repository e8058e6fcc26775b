//! Writing a command's output file so that it never lies: the bytes go to a temporary file
//! beside the target, every write, flush and `fsync` error is returned, and the file is
//! renamed into place only when all of them succeeded; on any failure the temporary file is
//! removed and the target is left as it was.

use std::io::Write;
use std::path::{Path, PathBuf};

/// An output file that could not be written, and why.
#[derive(Debug, thiserror::Error)]
#[error("cannot write {path}: {reason}")]
pub struct OutputError {
    /// The target.
    pub path: PathBuf,
    /// What went wrong, and what to do.
    pub reason: String,
}

/// Writes `bytes` to `target` atomically (see the module docs).
///
/// A target that exists and is not a regular file is refused: a symbolic link (renaming
/// over it would replace the link, never writing its target; name the target itself), a
/// folder, a FIFO, a socket or a device file.
pub fn write_atomically(target: &Path, bytes: &[u8]) -> Result<(), OutputError> {
    let fail = |reason: String| OutputError {
        path: target.to_path_buf(),
        reason,
    };
    check_target(target).map_err(fail)?;
    let name = target
        .file_name()
        .ok_or_else(|| fail("it names no file".into()))?;
    let dir = match target.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    if !dir.is_dir() {
        return Err(fail(format!("the folder {} does not exist", dir.display())));
    }
    // Dropped (and so removed) on every early return below.
    let mut tmp = tempfile::Builder::new()
        .prefix(&format!(".{}.", name.to_string_lossy()))
        .suffix(".partial")
        .tempfile_in(dir)
        .map_err(|e| fail(format!("cannot create a file in {}: {e}", dir.display())))?;
    tmp.write_all(bytes)
        .and_then(|()| tmp.flush())
        .and_then(|()| tmp.as_file().sync_all())
        .map_err(|e| fail(e.to_string()))?;
    tmp.persist(target)
        .map_err(|e| fail(format!("cannot move the file into place: {}", e.error)))?;
    // The rename itself reaches the disk with the folder's entry.
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// Why `target` cannot be replaced, if it exists and is not a regular file.
fn check_target(target: &Path) -> Result<(), String> {
    let Ok(meta) = std::fs::symlink_metadata(target) else {
        return Ok(());
    };
    let ft = meta.file_type();
    let what = if ft.is_file() {
        return Ok(());
    } else if ft.is_symlink() {
        let to = std::fs::read_link(target)
            .map(|t| format!(" (to {})", t.display()))
            .unwrap_or_default();
        format!("it is a symbolic link{to}; zoo replaces only regular files, so name the file the link points to")
    } else if ft.is_dir() {
        "it is a folder; name a file inside it".into()
    } else {
        "it is not a regular file (a FIFO, socket or device); name a regular file".into()
    };
    Err(what)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_replace_regular_files_and_leave_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("a.json");
        write_atomically(&out, b"one").unwrap();
        write_atomically(&out, b"two").unwrap();
        assert_eq!(std::fs::read(&out).unwrap(), b"two");
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(names.len(), 1, "only the target remains");
    }

    #[cfg(unix)]
    #[test]
    fn links_folders_and_missing_folders_are_refused_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("target.png");
        let link = dir.path().join("link.png");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let e = write_atomically(&link, b"x").unwrap_err();
        assert!(e.reason.contains("symbolic link"), "{e}");
        assert!(std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
        assert!(!target.exists());
        let e = write_atomically(dir.path(), b"x").unwrap_err();
        assert!(e.reason.contains("folder"), "{e}");
        let e = write_atomically(&dir.path().join("no/such/x.png"), b"x").unwrap_err();
        assert!(e.reason.contains("does not exist"), "{e}");
        let e = write_atomically(Path::new("/dev/null"), b"x").unwrap_err();
        assert!(e.reason.contains("not a regular file"), "{e}");
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            1,
            "only the link"
        );
    }
}
