//! Where the template store keeps things (`STATE/store/`), its lock, its
//! records, and the write-to-temp-then-rename discipline that makes every
//! layer and record appear whole or not at all.
//!
//! ```text
//! STATE/store/lock               flock: writers (import, pull, rm, gc) one at a time
//! STATE/store/layers/<hex>/fs     one layer's files (overlay lower), <hex> = its blob digest
//! STATE/store/layers/<hex>/layer.json   its size and entry count
//! STATE/store/templates/<name>.json     a template: layer digests + config + metadata
//! STATE/store/tmp/                work in progress; emptied at start-up (a SIGKILLed pull)
//! ```

use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::StoreError;
use super::digest::Digest;

/// The directory names under the store.
pub const LAYERS: &str = "layers";
pub const TEMPLATES: &str = "templates";
pub const TMP: &str = "tmp";

/// What the store knows about one layer.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct LayerMeta {
    pub digest: String,
    pub size_bytes: u64,
    pub entries: u64,
}

/// A template's process configuration (from the image config, or set by a build).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(default)]
pub struct RunConfig {
    /// `KEY=VALUE` entries.
    pub env: Vec<String>,
    pub workdir: String,
    pub user: String,
    pub entrypoint: Vec<String>,
    pub cmd: Vec<String>,
    /// E2B's start command (run when a sandbox of the template starts).
    pub start_cmd: Option<String>,
    /// E2B's ready command (create waits for it).
    pub ready_cmd: Option<String>,
}

/// `KEY=VALUE` entries (an image config's `Env`, a build's environment) as a map for a process;
/// entries without `=` are left out, a later one of a key wins.
pub fn env_map(env: &[String]) -> std::collections::HashMap<String, String> {
    env.iter().filter_map(|e| e.split_once('=')).map(|(k, v)| (k.to_owned(), v.to_owned())).collect()
}

/// What a sandbox's root is made of, in the store's terms: enough to stack a snapshot of it on
/// exactly the layers it ran on (see `local::snapshot`). A snapshot's template keeps the lineage
/// of the sandbox it was taken of, its own layers added.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(default)]
pub struct Lineage {
    /// `base` or a directory template's name when the root is one of those (not the store's);
    /// `None` when `layers` are the whole root.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub root_template: Option<String>,
    /// Store layers above the root, bottom first.
    pub layers: Vec<String>,
    /// Store layers above an extra layer of the root template (`base`'s `/usr`), by its target.
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub extra: std::collections::BTreeMap<String, Vec<String>>,
    /// The sandbox had private `/home` and `/root` (a `base` or directory root never stacked on):
    /// a snapshot carries them from the sandbox's private directories.
    pub private_home: bool,
}

/// A snapshot's origin (`POST /sandboxes/{id}/snapshots`, a fork).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct SnapshotOf {
    /// The sandbox it was taken of.
    pub sandbox_id: String,
    /// `base` or a directory template under the layers, when the root is one of those.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root_template: Option<String>,
    /// Layers above the root template's extra layers, by target (see [`Lineage::extra`]).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub extra: std::collections::BTreeMap<String, Vec<String>>,
}

/// One template: its layers (bottom first) and its config, plus the metadata E2B reports.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct TemplateRecord {
    pub name: String,
    pub template_id: String,
    #[serde(default)]
    pub aliases: Vec<String>,
    #[serde(default)]
    pub tags: Vec<String>,
    pub build_id: String,
    /// Layer digests, bottom first.
    pub layers: Vec<String>,
    #[serde(default)]
    pub config: RunConfig,
    /// Sum of its layers' sizes (shared layers counted in each template).
    pub size_bytes: u64,
    /// RFC 3339.
    pub created: String,
    #[serde(default)]
    pub cpu_count: u32,
    #[serde(default)]
    pub memory_mb: u64,
    /// Where it came from (`import:FILE`, `pull:REF`), for `template list`.
    #[serde(default)]
    pub source: String,
    /// A snapshot of a sandbox: what else it stacks on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<SnapshotOf>,
}

/// Paths of one store.
#[derive(Debug, Clone)]
pub struct Layout {
    pub dir: PathBuf,
}

impl Layout {
    pub fn new(state_dir: &Path) -> Layout {
        Layout { dir: state_dir.join("store") }
    }

    pub fn layer_dir(&self, digest: &Digest) -> PathBuf {
        self.dir.join(LAYERS).join(digest.hex())
    }

    /// The directory a sandbox's overlay stacks.
    pub fn layer_fs(&self, digest: &Digest) -> PathBuf {
        self.layer_dir(digest).join("fs")
    }

    pub fn record(&self, name: &str) -> PathBuf {
        self.dir.join(TEMPLATES).join(format!("{name}.json"))
    }

    pub fn tmp(&self) -> PathBuf {
        self.dir.join(TMP)
    }

    /// Creates the store's directories (root-only).
    pub fn create(&self) -> Result<(), StoreError> {
        for sub in ["", LAYERS, TEMPLATES, TMP] {
            let dir = self.dir.join(sub);
            std::fs::DirBuilder::new().mode(0o700).recursive(true).create(&dir).map_err(|e| StoreError::io(&dir, e))?;
        }
        Ok(())
    }

    /// A fresh directory under `tmp/`, removed when dropped unless it was renamed away.
    pub fn scratch(&self, what: &str) -> Result<Scratch, StoreError> {
        let path = self.tmp().join(format!("{what}-{}-{}", std::process::id(), hex::encode(rand::random::<[u8; 6]>())));
        std::fs::DirBuilder::new().mode(0o700).create(&path).map_err(|e| StoreError::io(&path, e))?;
        Ok(Scratch { path })
    }

    /// Writes `record` atomically (temp file, fsync, rename).
    pub fn write_record(&self, record: &TemplateRecord) -> Result<(), StoreError> {
        let json = serde_json::to_vec_pretty(record).map_err(|e| StoreError::Extract(e.to_string()))?;
        write_atomic(&self.tmp(), &self.record(&record.name), &json)
    }

    pub fn read_record(&self, name: &str) -> Result<Option<TemplateRecord>, StoreError> {
        let path = self.record(name);
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|e| StoreError::Corrupt(format!("{}: {e}", path.display()))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(StoreError::io(&path, e)),
        }
    }

    /// Every template record (unreadable ones are logged and skipped).
    pub fn records(&self) -> Result<Vec<TemplateRecord>, StoreError> {
        let dir = self.dir.join(TEMPLATES);
        let mut out = Vec::new();
        let entries = match std::fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
            Err(e) => return Err(StoreError::io(&dir, e)),
        };
        for entry in entries.flatten() {
            let file = entry.file_name();
            let Some(name) = file.to_str().and_then(|n| n.strip_suffix(".json")) else { continue };
            match self.read_record(name) {
                Ok(Some(record)) => out.push(record),
                Ok(None) => {}
                Err(err) => tracing::warn!(%err, "skipping an unreadable template record"),
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    pub fn layer_meta(&self, digest: &Digest) -> Option<LayerMeta> {
        let bytes = std::fs::read(self.layer_dir(digest).join("layer.json")).ok()?;
        serde_json::from_slice(&bytes).ok()
    }
}

/// Writes `bytes` to `dest` through a temp file in `tmp` (same filesystem), then renames.
pub fn write_atomic(tmp: &Path, dest: &Path, bytes: &[u8]) -> Result<(), StoreError> {
    use std::io::Write;
    let path = tmp.join(format!("write-{}-{}", std::process::id(), hex::encode(rand::random::<[u8; 6]>())));
    let result = (|| {
        let mut file = std::fs::File::create(&path)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        std::fs::rename(&path, dest)
    })();
    if let Err(e) = result {
        let _ = std::fs::remove_file(&path);
        return Err(StoreError::io(dest, e));
    }
    Ok(())
}

/// A directory of work in progress, removed on drop unless [`Scratch::keep`] moved it.
#[derive(Debug)]
pub struct Scratch {
    pub path: PathBuf,
}

impl Scratch {
    /// Renames the scratch directory to `dest` (atomic: same filesystem).
    pub fn commit(self, dest: &Path) -> Result<(), StoreError> {
        std::fs::rename(&self.path, dest).map_err(|e| StoreError::io(dest, e))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if self.path.exists() {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// The writers' lock (`STATE/store/lock`), held until dropped.
pub struct StoreLock {
    _lock: nix::fcntl::Flock<std::fs::File>,
}

impl StoreLock {
    /// Waits for the lock (`wait`) or fails at once when another writer holds it (`None`).
    pub fn take(layout: &Layout, wait: bool) -> Result<Option<StoreLock>, StoreError> {
        let path = layout.dir.join("lock");
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| StoreError::io(&path, e))?;
        let arg = if wait { nix::fcntl::FlockArg::LockExclusive } else { nix::fcntl::FlockArg::LockExclusiveNonblock };
        match nix::fcntl::Flock::lock(file, arg) {
            Ok(lock) => Ok(Some(StoreLock { _lock: lock })),
            Err((_, nix::errno::Errno::EWOULDBLOCK)) if !wait => Ok(None),
            Err((_, e)) => Err(StoreError::io(&path, e.into())),
        }
    }
}
