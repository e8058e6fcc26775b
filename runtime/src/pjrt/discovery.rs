//! Finding PJRT plugins on this machine, the libtpu guard, and the `zoo devices` report.
//!
//! Search order: an explicit path; `PJRT_NAMES_AND_LIBRARY_PATHS` (JAX's
//! `name:path,name:path`); `TPU_LIBRARY_PATH`; then the site-packages directories of
//! `python3` for the plugin wheels' layouts (`libtpu/libtpu.so`,
//! `xla_plugins/xla_cpu_pjrt/*.so`, `jax_plugins/xla_cuda*/*.so`, ...).

use std::collections::HashSet;
use std::fmt::{self, Write as _};
use std::path::{Path, PathBuf};
use std::process::Command;

use super::api::Plugin;
use super::client::ClientOptions;
use super::error::{PjrtError, Result};

/// Where a candidate plugin was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// The caller named the file.
    Explicit,
    /// `PJRT_NAMES_AND_LIBRARY_PATHS`.
    JaxEnv,
    /// `TPU_LIBRARY_PATH`.
    TpuLibraryPath,
    /// A Python site-packages directory.
    SitePackages(PathBuf),
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Explicit => write!(f, "explicit path"),
            Source::JaxEnv => write!(f, "PJRT_NAMES_AND_LIBRARY_PATHS"),
            Source::TpuLibraryPath => write!(f, "TPU_LIBRARY_PATH"),
            Source::SitePackages(d) => write!(f, "site-packages {}", d.display()),
        }
    }
}

/// A plugin file found on disk (not yet loaded).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// The platform the location implies: `cpu`, `cuda`, `rocm`, `tpu`, or the name given
    /// in `PJRT_NAMES_AND_LIBRARY_PATHS`.
    pub platform: String,
    /// The plugin file.
    pub path: PathBuf,
    /// Where it was found.
    pub source: Source,
}

/// The outcome of a search: the candidates, in search order, and every place looked at.
#[derive(Debug, Clone, Default)]
pub struct Search {
    /// Plugin files found, first match first, without duplicates.
    pub candidates: Vec<Candidate>,
    /// Every place searched, with what was found there.
    pub searched: Vec<String>,
}

/// Patterns inside a site-packages directory: (directory glob, file glob, platform).
/// Layouts taken from the published wheels: `xla-cpu-pjrt` puts `xla_cpu_pjrt.so` in
/// `xla_plugins/xla_cpu_pjrt/`, `lammps-jax-pjrt-cpu` ships
/// `lammps_jax_pjrt_cpu/pjrt_c_api_cpu_plugin.so`, `fastatomstruct-xla-cpu` ships
/// `fastatomstruct_xla_cpu/libpjrt_cpu.so`, JAX's CUDA plugins `jax_plugins/xla_cuda12/*.so`.
const SITE_LAYOUTS: &[(&str, &str, &str)] = &[
    ("libtpu", "libtpu.so", "tpu"),
    ("xla_plugins/xla_cpu*", "*.so", "cpu"),
    ("lammps_jax_pjrt_cpu", "*.so", "cpu"),
    ("fastatomstruct_xla_cpu", "*.so", "cpu"),
    ("xla_plugins/xla_cuda*", "*.so", "cuda"),
    ("jax_plugins/xla_cuda*", "*.so", "cuda"),
    ("jax_plugins/xla_rocm*", "*.so", "rocm"),
];

/// Normalizes platform names: `gpu` means `cuda`.
fn normalize(platform: &str) -> String {
    match platform.to_ascii_lowercase().as_str() {
        "gpu" => "cuda".into(),
        p => p.to_string(),
    }
}

/// Whether `path` names libtpu (which must pass the GCE guard before it is loaded).
pub fn is_libtpu(path: &Path) -> bool {
    path.file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with("libtpu"))
}

/// Whether libtpu may be loaded here: `ZOO_FORCE_TPU=1`, or the DMI data says this is a
/// Google Compute Engine machine. Answers at once, never touches the network.
pub fn tpu_allowed() -> Result<()> {
    if std::env::var("ZOO_FORCE_TPU").is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true")) {
        return Ok(());
    }
    let mut seen = Vec::new();
    for f in ["product_name", "bios_vendor", "sys_vendor"] {
        let p = Path::new("/sys/class/dmi/id").join(f);
        match std::fs::read_to_string(&p) {
            Ok(s) => {
                if s.contains("Google") {
                    return Ok(());
                }
                seen.push(format!("{f}={:?}", s.trim()));
            }
            Err(_) => seen.push(format!("{} unreadable", p.display())),
        }
    }
    Err(PjrtError::NoTpu {
        reason: format!("not a Google Compute Engine machine: {}", seen.join(", ")),
    })
}

/// Minimal glob: `*` matches any run of characters (no `/`).
fn glob_match(pattern: &str, name: &str) -> bool {
    fn rec(p: &[u8], n: &[u8]) -> bool {
        match p.first() {
            None => n.is_empty(),
            Some(b'*') => (0..=n.len()).any(|i| rec(&p[1..], &n[i..])),
            Some(&c) => n.first() == Some(&c) && rec(&p[1..], &n[1..]),
        }
    }
    rec(pattern.as_bytes(), name.as_bytes())
}

/// Expands a relative path whose components may hold `*` under `root`, sorted.
fn expand(root: &Path, pattern: &str) -> Vec<PathBuf> {
    let mut current = vec![root.to_path_buf()];
    for comp in pattern.split('/') {
        let mut next = Vec::new();
        for dir in &current {
            if !comp.contains('*') {
                let p = dir.join(comp);
                if p.exists() {
                    next.push(p);
                }
                continue;
            }
            if let Ok(entries) = std::fs::read_dir(dir) {
                for e in entries.flatten() {
                    if let Some(name) = e.file_name().to_str() {
                        if glob_match(comp, name) {
                            next.push(e.path());
                        }
                    }
                }
            }
        }
        next.sort();
        current = next;
    }
    current
}

/// The site-packages directories of `python3`, or why there are none.
fn python_site_dirs() -> std::result::Result<Vec<PathBuf>, String> {
    let script = "import site, sys\n\
                  dirs = []\n\
                  try: dirs += site.getsitepackages()\n\
                  except Exception: pass\n\
                  try: dirs.append(site.getusersitepackages())\n\
                  except Exception: pass\n\
                  dirs += [p for p in sys.path if p.endswith(('site-packages', 'dist-packages'))]\n\
                  print('\\n'.join(dirs))";
    let out = Command::new("python3")
        .arg("-c")
        .arg(script)
        .output()
        .map_err(|e| format!("python3 could not be run: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "python3 failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let mut seen = HashSet::new();
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(PathBuf::from)
        .filter(|p| seen.insert(p.clone()))
        .collect())
}

/// Searches every place in order and returns all candidates for `platform` (all platforms
/// when `None`). `explicit` is a file the caller named.
pub fn search(platform: Option<&str>, explicit: Option<&Path>) -> Search {
    let want = platform.map(normalize);
    let matches = |p: &str| want.as_deref().is_none_or(|w| w == normalize(p));
    let mut s = Search::default();
    let push = |s: &mut Search, c: Candidate| {
        if !s.candidates.iter().any(|x| x.path == c.path) {
            s.candidates.push(c);
        }
    };

    if let Some(p) = explicit {
        if p.is_file() {
            s.searched
                .push(format!("explicit path {}: found", p.display()));
            let platform = want.clone().unwrap_or_else(|| "unknown".into());
            push(
                &mut s,
                Candidate {
                    platform,
                    path: p.to_path_buf(),
                    source: Source::Explicit,
                },
            );
        } else {
            s.searched
                .push(format!("explicit path {}: no such file", p.display()));
        }
    }

    match std::env::var("PJRT_NAMES_AND_LIBRARY_PATHS") {
        Ok(v) if !v.trim().is_empty() => {
            for entry in v.split(',').map(str::trim).filter(|e| !e.is_empty()) {
                let Some((name, path)) = entry.split_once(':') else {
                    s.searched.push(format!(
                        "PJRT_NAMES_AND_LIBRARY_PATHS entry {entry:?}: not `name:path`, ignored"
                    ));
                    continue;
                };
                let path = PathBuf::from(path);
                let found = path.is_file();
                s.searched.push(format!(
                    "PJRT_NAMES_AND_LIBRARY_PATHS {name}:{}: {}",
                    path.display(),
                    if found { "found" } else { "no such file" }
                ));
                if found && matches(name) {
                    push(
                        &mut s,
                        Candidate {
                            platform: normalize(name),
                            path,
                            source: Source::JaxEnv,
                        },
                    );
                }
            }
        }
        _ => s
            .searched
            .push("PJRT_NAMES_AND_LIBRARY_PATHS: unset".into()),
    }

    match std::env::var("TPU_LIBRARY_PATH") {
        Ok(v) if !v.trim().is_empty() => {
            let path = PathBuf::from(v.trim());
            let found = path.is_file();
            s.searched.push(format!(
                "TPU_LIBRARY_PATH {}: {}",
                path.display(),
                if found { "found" } else { "no such file" }
            ));
            if found && matches("tpu") {
                push(
                    &mut s,
                    Candidate {
                        platform: "tpu".into(),
                        path,
                        source: Source::TpuLibraryPath,
                    },
                );
            }
        }
        _ => s.searched.push("TPU_LIBRARY_PATH: unset".into()),
    }

    match python_site_dirs() {
        Err(why) => s.searched.push(format!("python3 site-packages: {why}")),
        Ok(dirs) if dirs.is_empty() => s
            .searched
            .push("python3 site-packages: python3 reports none".into()),
        Ok(dirs) => {
            for dir in dirs {
                let mut found = Vec::new();
                for (sub, file, plat) in SITE_LAYOUTS {
                    for path in expand(&dir, &format!("{sub}/{file}")) {
                        if path.is_file() {
                            found.push(path.display().to_string());
                            if matches(plat) {
                                push(
                                    &mut s,
                                    Candidate {
                                        platform: plat.to_string(),
                                        path,
                                        source: Source::SitePackages(dir.clone()),
                                    },
                                );
                            }
                        }
                    }
                }
                let layouts: Vec<String> = SITE_LAYOUTS
                    .iter()
                    .map(|(sub, file, _)| format!("{sub}/{file}"))
                    .collect();
                s.searched.push(format!(
                    "{} ({}): {}",
                    dir.display(),
                    layouts.join(", "),
                    if found.is_empty() {
                        "nothing".to_string()
                    } else {
                        found.join(", ")
                    }
                ));
            }
        }
    }
    s
}

/// The first plugin for `platform` in search order, or [`PjrtError::NotFound`] naming every
/// place searched.
pub fn find_plugin(platform: Option<&str>, explicit: Option<&Path>) -> Result<Candidate> {
    let s = search(platform, explicit);
    s.candidates
        .into_iter()
        .next()
        .ok_or_else(|| PjrtError::NotFound {
            platform: platform.map(normalize),
            searched: s.searched,
        })
}

/// Finds and loads the first plugin for `platform` (libtpu only where [`tpu_allowed`]).
pub fn load_plugin(platform: Option<&str>, explicit: Option<&Path>) -> Result<Plugin> {
    let c = find_plugin(platform, explicit)?;
    Plugin::load(&c.path)
}

/// Bytes in binary units; PJRT reports byte counts as `i64`.
fn human_bytes(b: i64) -> String {
    crate::device_map::human(u64::try_from(b).unwrap_or(0))
}

/// Writes one plugin's section of the devices report. Errors are written, not returned, so
/// one broken plugin does not hide the others.
fn describe(out: &mut String, c: &Candidate) {
    let _ = writeln!(out, "plugin {} ({})", c.path.display(), c.source);
    if is_libtpu(&c.path) {
        if let Err(e) = tpu_allowed() {
            let _ = writeln!(out, "  skipped: {e}");
            return;
        }
    }
    let plugin = match Plugin::load(&c.path) {
        Ok(p) => p,
        Err(e) => {
            let _ = writeln!(out, "  error: {e}");
            return;
        }
    };
    let (major, minor) = plugin.api_version();
    let _ = writeln!(
        out,
        "  PJRT API {major}.{minor} ({} functions)",
        plugin.function_count()
    );
    if let Ok(attrs) = plugin.attributes() {
        for (k, v) in attrs.iter().filter(|(k, _)| k.contains("version")) {
            let _ = writeln!(out, "  {k}: {v}");
        }
    }
    let client = match crate::distributed::create_client(&plugin, &c.platform, ClientOptions::new())
    {
        Ok(c) => c,
        Err(e) => {
            let _ = writeln!(out, "  error creating a client: {e}");
            return;
        }
    };
    let name = client
        .platform_name()
        .unwrap_or_else(|e| format!("? ({e})"));
    let version = client.platform_version().unwrap_or_default();
    let _ = writeln!(
        out,
        "  platform: {name}{}",
        if version.is_empty() {
            String::new()
        } else {
            format!(" (version {version})")
        }
    );
    match client.addressable_devices() {
        Err(e) => {
            let _ = writeln!(out, "  error listing devices: {e}");
        }
        Ok(devices) => {
            match (crate::distributed::current(), client.devices()) {
                (Some(group), Ok(all)) => {
                    let _ = writeln!(
                        out,
                        "  {}: the plugin says process {}, {} of the job's {} device(s) here",
                        group.processes(),
                        client.process_index().unwrap_or(0),
                        devices.len(),
                        all.len()
                    );
                }
                _ => {
                    let _ = writeln!(out, "  devices: {}", devices.len());
                }
            }
            for d in devices {
                let id = d.id().map(|i| i.to_string()).unwrap_or_else(|_| "?".into());
                let kind = d.kind().unwrap_or_else(|_| "?".into());
                let memory = match d.memory_stats() {
                    Ok(m) => match m.bytes_limit {
                        Some(limit) => format!(
                            "{} in use of {}",
                            human_bytes(m.bytes_in_use),
                            human_bytes(limit)
                        ),
                        None => {
                            format!("{} in use, no limit reported", human_bytes(m.bytes_in_use))
                        }
                    },
                    Err(PjrtError::Plugin { code, .. }) => {
                        format!("memory stats not reported by the plugin ({code})")
                    }
                    Err(e) => format!("memory stats unavailable: {e}"),
                };
                let _ = writeln!(out, "    [{id}] {kind}: {memory}");
            }
        }
    }
}

/// The report `zoo devices [--platform P]` prints: each plugin found, its path, PJRT API
/// version, platform and devices with memory. Fails only when no plugin is found at all
/// (the error names every place searched).
pub fn devices_report(platform: Option<&str>) -> Result<String> {
    devices_report_with(platform, None)
}

/// [`devices_report`] with an explicit plugin file searched first.
pub fn devices_report_with(platform: Option<&str>, explicit: Option<&Path>) -> Result<String> {
    let s = search(platform, explicit);
    if s.candidates.is_empty() {
        return Err(PjrtError::NotFound {
            platform: platform.map(normalize),
            searched: s.searched,
        });
    }
    let mut out = String::new();
    for c in &s.candidates {
        describe(&mut out, c);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glob() {
        assert!(glob_match("xla_cuda*", "xla_cuda12"));
        assert!(glob_match("*.so", "xla_cpu_pjrt.so"));
        assert!(!glob_match("*.so", "xla_cpu_pjrt.py"));
        assert!(!glob_match("libtpu.so", "libtpu.so.1"));
    }

    #[test]
    fn libtpu_names() {
        assert!(is_libtpu(Path::new("/x/libtpu/libtpu.so")));
        assert!(!is_libtpu(Path::new(
            "/x/xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so"
        )));
    }

    #[test]
    fn site_layouts_match_the_wheels() {
        let root = std::env::temp_dir().join(format!("zoo-pjrt-layout-{}", std::process::id()));
        let files = [
            "xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so",
            "lammps_jax_pjrt_cpu/pjrt_c_api_cpu_plugin.so",
            "fastatomstruct_xla_cpu/libpjrt_cpu.so",
            "jax_plugins/xla_cuda12/xla_cuda_plugin.so",
            "libtpu/libtpu.so",
        ];
        for f in files {
            let p = root.join(f);
            std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
            std::fs::write(&p, b"").expect("write");
        }
        let mut found = Vec::new();
        for (sub, file, plat) in SITE_LAYOUTS {
            for p in expand(&root, &format!("{sub}/{file}")) {
                found.push((
                    plat.to_string(),
                    p.strip_prefix(&root).expect("prefix").to_path_buf(),
                ));
            }
        }
        let _ = std::fs::remove_dir_all(&root);
        assert_eq!(found.len(), files.len(), "{found:?}");
        assert!(found.contains(&("cuda".into(), PathBuf::from(files[3]))));
        assert!(found.contains(&("tpu".into(), PathBuf::from(files[4]))));
    }
}
