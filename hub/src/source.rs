//! Where a model's files come from: a local folder, a single file, or a Hub repo id resolved in
//! the Hugging Face cache layout that Python's `huggingface_hub` shares
//! (`models--org--name/{refs,snapshots,blobs}`), downloading only when allowed.

use std::path::{Path, PathBuf};

use crate::error::{HubError, Result};

/// What the user named: a folder, a file, or a repo id with a revision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// A local folder laid out like a snapshot (`config.json`, `model.safetensors`, ...).
    Folder(PathBuf),
    /// A single weights file (`.safetensors`, `.gguf`); sibling files such as `config.json`
    /// next to it are used when present.
    File(PathBuf),
    /// A Hub repo id (`org/name`) at a revision (branch, tag or commit; `main` by default).
    Repo { id: String, revision: String },
}

impl Source {
    /// Reads `input` the way `from_pretrained` does: an existing path wins; otherwise it must be a
    /// repo id `org/name`, optionally followed by `@revision`.
    pub fn parse(input: &str) -> Result<Source> {
        let path = Path::new(input);
        if path.is_dir() {
            return Ok(Source::Folder(path.to_path_buf()));
        }
        if path.is_file() {
            return Ok(Source::File(path.to_path_buf()));
        }
        check_link(path)?;
        let (id, revision) = match input.split_once('@') {
            Some((id, rev)) if !rev.is_empty() => (id, rev),
            Some(_) => {
                return Err(HubError::BadSource {
                    input: input.into(),
                })
            }
            None => (input, "main"),
        };
        if !is_repo_id(id) {
            return Err(HubError::BadSource {
                input: input.into(),
            });
        }
        check_revision(revision)?;
        Ok(Source::Repo {
            id: id.to_string(),
            revision: revision.to_string(),
        })
    }

    /// The same source at another revision. Paths have none: a revision given for one is
    /// refused rather than ignored, as is a revision outside the Hub's grammar.
    pub fn with_revision(self, revision: &str) -> Result<Source> {
        check_revision(revision)?;
        match self {
            Source::Repo { id, .. } => Ok(Source::Repo {
                id,
                revision: revision.to_string(),
            }),
            Source::Folder(p) | Source::File(p) => Err(HubError::BadName {
                what: "revision",
                name: revision.into(),
                reason: format!(
                    "{} is a local path, which has no revisions; a revision applies to Hub repo ids",
                    p.display()
                ),
            }),
        }
    }
}

/// A symbolic link at `path` that leads nowhere (a loop, or a missing target) is an error
/// saying so, rather than the file being reported absent.
fn check_link(path: &Path) -> Result<()> {
    let is_link = std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink());
    if !is_link {
        return Ok(());
    }
    match std::fs::metadata(path) {
        Ok(_) => Ok(()),
        Err(e) => {
            let reason = if e.kind() == std::io::ErrorKind::NotFound {
                "a symbolic link whose target does not exist".to_string()
            } else if e.raw_os_error() == Some(ELOOP) {
                "a symbolic link loop (it leads back to itself)".to_string()
            } else {
                format!("a symbolic link that cannot be followed: {e}")
            };
            Err(HubError::BadPath {
                path: path.to_path_buf(),
                reason,
            })
        }
    }
}

/// `ELOOP` on Linux and the BSDs' value on macOS.
#[cfg(target_os = "macos")]
const ELOOP: i32 = 62;
#[cfg(not(target_os = "macos"))]
const ELOOP: i32 = 40;

/// Refuses a name that is one path component (a variant, a pipeline component's folder)
/// but could be read as more: empty, `.`, `..`, or holding a separator or control character.
pub fn check_name(what: &'static str, name: &str) -> Result<()> {
    let reason = if name.is_empty() {
        "it is empty"
    } else if name == "." || name == ".." {
        "it names a folder above or the same folder"
    } else if name.contains(['/', '\\']) {
        "it holds a path separator; give a plain name"
    } else if name.chars().any(char::is_control) {
        "it holds a control character"
    } else {
        return Ok(());
    };
    Err(HubError::BadName {
        what,
        name: name.into(),
        reason: reason.into(),
    })
}

/// Refuses a revision the Hub could not hold: git's rules for ref names (no `..`, no empty or
/// dot-led components, no control characters, spaces or `~^:?*[\`), so that a revision is
/// always a name under `refs/` or a commit, never a path out of the cache.
pub fn check_revision(revision: &str) -> Result<()> {
    let bad = |reason: &str| {
        Err(HubError::BadName {
            what: "revision",
            name: revision.into(),
            reason: reason.into(),
        })
    };
    if revision.is_empty() {
        return bad("it is empty; give a branch, tag or commit");
    }
    if revision
        .chars()
        .any(|c| c.is_control() || " ~^:?*[\\".contains(c))
    {
        return bad("it holds a space, a control character or one of ~^:?*[\\");
    }
    if revision.contains("..") || revision.contains("@{") {
        return bad("it holds `..` or `@{`");
    }
    if revision
        .split('/')
        .any(|part| part.is_empty() || part.starts_with('.') || part.ends_with(".lock"))
    {
        return bad("a `/`-separated part of it is empty, starts with `.` or ends with `.lock`");
    }
    Ok(())
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Folder(p) | Source::File(p) => write!(f, "{}", p.display()),
            Source::Repo { id, revision } => write!(f, "{id}@{revision}"),
        }
    }
}

/// Hub repo ids: `name` or `org/name`, of letters, digits, `-`, `_` and `.`, not starting with
/// `.` or `-` and holding no `..` (so an id can never walk out of the cache).
fn is_repo_id(id: &str) -> bool {
    let parts: Vec<&str> = id.split('/').collect();
    !parts.is_empty()
        && parts.len() <= 2
        && parts.iter().all(|p| {
            !p.is_empty()
                && p.len() <= 96
                && !p.starts_with(['.', '-'])
                && !p.contains("..")
                && p.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        })
}

/// The Hub cache folder, found as `huggingface_hub` finds it: `HF_HUB_CACHE`, then
/// `HUGGINGFACE_HUB_CACHE`, then `HF_HOME/hub`, then `$XDG_CACHE_HOME/huggingface/hub`, then
/// `~/.cache/huggingface/hub`.
pub fn hub_cache_dir() -> PathBuf {
    let var = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    if let Some(p) = var("HF_HUB_CACHE").or_else(|| var("HUGGINGFACE_HUB_CACHE")) {
        return p;
    }
    if let Some(home) = var("HF_HOME") {
        return home.join("hub");
    }
    let cache = var("XDG_CACHE_HOME")
        .or_else(|| var("HOME").map(|h| h.join(".cache")))
        .unwrap_or_else(|| PathBuf::from(".cache"));
    cache.join("huggingface").join("hub")
}

/// Whether downloads are forbidden (`HF_HUB_OFFLINE` set to a true value).
pub fn offline() -> bool {
    std::env::var("HF_HUB_OFFLINE")
        .map(|v| {
            matches!(
                v.trim().to_ascii_lowercase().as_str(),
                "1" | "true" | "yes" | "on"
            )
        })
        .unwrap_or(false)
}

/// The Hub token: `HF_TOKEN`, else the file at `HF_TOKEN_PATH`, else `HF_HOME/token`
/// (`~/.cache/huggingface/token`).
pub fn hub_token() -> Option<String> {
    if let Some(t) = std::env::var("HF_TOKEN")
        .ok()
        .filter(|t| !t.trim().is_empty())
    {
        return Some(t.trim().to_string());
    }
    let path = std::env::var_os("HF_TOKEN_PATH")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HF_HOME").map(|h| PathBuf::from(h).join("token")))
        .or_else(|| {
            std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/huggingface/token"))
        })?;
    std::fs::read_to_string(path)
        .ok()
        .map(|t| t.trim().to_string())
        .filter(|t| !t.is_empty())
}

/// One repo in the Hub cache, pinned to a revision.
#[derive(Clone, Debug)]
pub struct CachedRepo {
    pub id: String,
    pub revision: String,
    /// `<cache>/models--org--name`.
    pub dir: PathBuf,
}

impl CachedRepo {
    /// The repo `id` at `revision` in the cache at `cache`.
    pub fn new(cache: &Path, id: &str, revision: &str) -> CachedRepo {
        CachedRepo {
            id: id.to_string(),
            revision: revision.to_string(),
            dir: cache.join(format!("models--{}", id.replace('/', "--"))),
        }
    }

    /// The commit the revision points at: the revision itself when it is a commit hash with a
    /// snapshot, else the content of `refs/<revision>`.
    pub fn commit(&self) -> Option<String> {
        let rev = &self.revision;
        if rev.len() == 40 && rev.chars().all(|c| c.is_ascii_hexdigit()) {
            return Some(rev.clone());
        }
        // A revision naming `..` must not read outside refs/.
        if rev.split('/').any(|p| p == ".." || p.is_empty()) {
            return None;
        }
        std::fs::read_to_string(self.dir.join("refs").join(rev))
            .ok()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty() && !s.contains(['/', '\\']) && s != "..")
    }

    /// The places a file is looked for, in order (for error messages).
    pub fn candidates(&self, file: &str) -> Vec<PathBuf> {
        let mut out = vec![self.dir.join("refs").join(&self.revision)];
        if let Some(commit) = self.commit() {
            out.push(self.dir.join("snapshots").join(commit).join(file));
        } else {
            out.push(
                self.dir
                    .join("snapshots")
                    .join("<commit of refs>")
                    .join(file),
            );
        }
        out
    }

    /// The cached copy of `file`, if the snapshot holds it.
    pub fn get(&self, file: &str) -> Option<PathBuf> {
        let commit = self.commit()?;
        let p = self.dir.join("snapshots").join(commit).join(file);
        p.is_file().then_some(p)
    }

    /// Whether a previous lookup recorded that `file` does not exist at this commit
    /// (`.no_exist/<commit>/<file>`, written by `huggingface_hub`).
    pub fn known_absent(&self, file: &str) -> bool {
        self.commit()
            .is_some_and(|c| self.dir.join(".no_exist").join(c).join(file).exists())
    }
}

/// A resolved source from which named files can be fetched.
#[derive(Clone, Debug)]
pub struct ModelFiles {
    source: Source,
    cache: PathBuf,
    allow_download: bool,
}

impl ModelFiles {
    /// Files of `source`, looked up in the default Hub cache; downloads happen only when online
    /// and `HF_HUB_OFFLINE` is not set.
    pub fn new(source: Source) -> ModelFiles {
        ModelFiles {
            source,
            cache: hub_cache_dir(),
            allow_download: !offline(),
        }
    }

    /// Uses another Hub cache folder.
    pub fn with_cache(mut self, cache: PathBuf) -> ModelFiles {
        self.cache = cache;
        self
    }

    /// Forbids (or allows) downloads.
    pub fn with_download(mut self, allow: bool) -> ModelFiles {
        self.allow_download = allow;
        self
    }

    /// The source these files come from.
    pub fn source(&self) -> &Source {
        &self.source
    }

    /// The folder local files are looked up in (the folder, or the file's folder).
    pub fn local_dir(&self) -> Option<PathBuf> {
        match &self.source {
            Source::Folder(p) => Some(p.clone()),
            Source::File(p) => Some(
                p.parent()
                    .filter(|d| !d.as_os_str().is_empty())
                    .map_or_else(|| PathBuf::from("."), Path::to_path_buf),
            ),
            Source::Repo { .. } => None,
        }
    }

    /// The path of `file` (relative to the model root, e.g. `unet/config.json`), downloading it
    /// when allowed; a typed error lists every place searched and how to get it.
    pub fn get(&self, file: &str) -> Result<PathBuf> {
        self.get_optional(file)?
            .ok_or_else(|| self.not_found(file, None))
    }

    /// Like [`ModelFiles::get`], but `Ok(None)` when the file does not exist in the model
    /// (for optional files such as `generation_config.json`).
    pub fn get_optional(&self, file: &str) -> Result<Option<PathBuf>> {
        if file.split(['/', '\\']).any(|p| p == ".." || p.is_empty())
            || Path::new(file).is_absolute()
        {
            return Err(HubError::BadSource { input: file.into() });
        }
        match &self.source {
            Source::Folder(_) | Source::File(_) => {
                let dir = self.local_dir().unwrap_or_default();
                let p = dir.join(file);
                check_link(&p)?;
                Ok(p.is_file().then_some(p))
            }
            Source::Repo { id, revision } => {
                let repo = CachedRepo::new(&self.cache, id, revision);
                if let Some(p) = repo.get(file) {
                    return Ok(Some(p));
                }
                if repo.known_absent(file) || !self.allow_download {
                    // Offline: a file absent from a present snapshot is absent; without a
                    // snapshot we cannot tell, so the caller's error explains how to get it.
                    return if repo.commit().is_some() || repo.known_absent(file) {
                        Ok(None)
                    } else {
                        Err(self.not_found(file, None))
                    };
                }
                self.download(id, revision, file)
            }
        }
    }

    fn download(&self, id: &str, revision: &str, file: &str) -> Result<Option<PathBuf>> {
        use hf_hub::api::sync::ApiBuilder;
        let mut builder = ApiBuilder::new()
            .with_cache_dir(self.cache.clone())
            .with_token(hub_token())
            .with_progress(true);
        if let Ok(endpoint) = std::env::var("HF_ENDPOINT") {
            builder = builder.with_endpoint(endpoint);
        }
        let api = builder
            .build()
            .map_err(|e| self.download_error(file, e.to_string()))?;
        let repo = api.repo(hf_hub::Repo::with_revision(
            id.to_string(),
            hf_hub::RepoType::Model,
            revision.to_string(),
        ));
        match repo.download(file) {
            Ok(p) => Ok(Some(p)),
            Err(e) => {
                let msg = e.to_string();
                if msg.contains("status code 404") {
                    Ok(None)
                } else {
                    Err(self.download_error(file, msg))
                }
            }
        }
    }

    fn download_error(&self, file: &str, message: String) -> HubError {
        let (repo, revision) = self.repo_and_revision();
        HubError::Download {
            hint: self.hint(file),
            repo,
            revision,
            file: file.to_string(),
            message,
        }
    }

    fn repo_and_revision(&self) -> (String, String) {
        match &self.source {
            Source::Repo { id, revision } => (id.clone(), revision.clone()),
            Source::Folder(p) | Source::File(p) => (p.display().to_string(), "(local)".into()),
        }
    }

    /// The error for a file that cannot be found, listing the places searched.
    pub fn not_found(&self, file: &str, extra_hint: Option<&str>) -> HubError {
        let (repo, revision) = self.repo_and_revision();
        let searched = match &self.source {
            Source::Repo { id, revision } => {
                CachedRepo::new(&self.cache, id, revision).candidates(file)
            }
            _ => vec![self.local_dir().unwrap_or_default().join(file)],
        };
        let mut hint = self.hint(file);
        if let Some(extra) = extra_hint {
            hint = format!("{extra}\n{hint}");
        }
        HubError::NotFound {
            repo,
            revision,
            file: file.to_string(),
            searched,
            hint,
        }
    }

    fn hint(&self, file: &str) -> String {
        match &self.source {
            Source::Repo { id, revision } => {
                let why = if self.allow_download {
                    "downloading failed".to_string()
                } else {
                    "downloads are off (HF_HUB_OFFLINE is set)".to_string()
                };
                format!(
                    "{why}; get it with `huggingface-cli download {id} {file} --revision {revision}`, or point HF_HOME / HF_HUB_CACHE at a cache that holds it (now {})",
                    self.cache.display()
                )
            }
            _ => {
                "check the path, or pass a repo id (org/name) to use the Hugging Face cache".into()
            }
        }
    }
}
