//! The template store: content-addressed, read-only layers shared between
//! templates, and template records (ordered layer digests plus config and E2B
//! metadata) under `STATE/store/` (see `layout`). A sandbox of a stored
//! template stacks the template's layers under its own writable layer.
//!
//! Every layer is extracted into `tmp/` and renamed into `layers/` only after
//! its blob matched its digest, so a killed pull or import leaves nothing a
//! template could use (leftovers are removed the next time the store opens).
//! Writers (import, pull, `rm`, `gc`, builds, snapshots) hold the store's lock;
//! readers (the provider's creates) only read finished records and layers. What a
//! sandbox wrote (a build step's, a snapshot's) becomes a layer through `harvest`.

pub mod cli;
mod digest;
pub mod extract;
mod gc;
pub mod harvest;
mod image;
mod import;
mod layout;
mod pipeline;
pub mod registry;
mod whiteout;

use std::io::Read;
use std::path::{Path, PathBuf};

pub use digest::Digest;
pub use gc::GcReport;
pub use layout::{LayerMeta, Layout, Lineage, RunConfig, SnapshotOf, StoreLock, TemplateRecord, env_map, write_atomic};

/// A layer read by [`Store::extract_layer`], waiting for [`Store::commit_layer`].
#[derive(Debug)]
pub enum PreparedLayer {
    /// The layer was stored already.
    Stored(Digest),
    /// Extracted and verified into a scratch directory (removed if dropped uncommitted).
    Extracted { scratch: layout::Scratch, digest: Digest, size_bytes: u64 },
}

/// Default `local.template_store_limit_mb`.
pub const DEFAULT_STORE_LIMIT_MB: u64 = 51200;

/// Errors of the template store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("invalid digest {0:?} (expected sha256:<64 hex digits>)")]
    BadDigest(String),
    #[error("blob digest mismatch: expected {expected}, got {actual} (the download or file is corrupt)")]
    DigestMismatch { expected: String, actual: String },
    #[error("refusing a hostile layer entry {0}")]
    HostileLayer(String),
    #[error("cannot extract a layer: {0}")]
    Extract(String),
    #[error("layer too large: {0}")]
    TooLarge(String),
    #[error(
        "the template store would pass its limit of {limit_mb} MiB (local.template_store_limit_mb; it holds \
         {used_mb} MiB): remove templates with `sandbox-mcp template rm NAME` and run `sandbox-mcp template gc`, \
         or raise the limit"
    )]
    LimitReached { limit_mb: u64, used_mb: u64 },
    #[error("not an image: {0}")]
    BadImage(String),
    #[error(
        "invalid template name {0:?}: use 1-64 characters of a-z A-Z 0-9 . _ - (not starting with . or -), \
         not `base`"
    )]
    BadName(String),
    #[error(
        "template name {0:?} is taken by a configured directory template (`--template {0}=DIR` or \
         local.templates), which a create of {0:?} would start instead: choose another name"
    )]
    Reserved(String),
    #[error("no template {0:?} in the store (see `sandbox-mcp template list`)")]
    NotFound(String),
    #[error("registry: {0}")]
    Registry(String),
    #[error("corrupt store entry: {0}")]
    Corrupt(String),
}

impl StoreError {
    pub fn io(path: &Path, source: std::io::Error) -> StoreError {
        StoreError::Io { path: path.to_owned(), source }
    }
}

/// Checks a template name (also a file name under `templates/`).
pub fn validate_name(name: &str) -> Result<(), StoreError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name != "base"
        && !name.starts_with(['.', '-'])
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    if ok { Ok(()) } else { Err(StoreError::BadName(name.to_owned())) }
}

/// A template to register ([`Store::commit`]).
#[derive(Debug, Default)]
pub struct NewTemplate<'a> {
    pub name: &'a str,
    pub layers: Vec<Digest>,
    pub config: RunConfig,
    /// Where it came from (`import:FILE`, `pull:REF`, `build:ID`).
    pub source: String,
    pub template_id: Option<String>,
    pub build_id: Option<String>,
    pub tags: Option<Vec<String>>,
    pub cpu_count: Option<u32>,
    pub memory_mb: Option<u64>,
    /// A snapshot's origin ([`TemplateRecord::snapshot`]).
    pub snapshot: Option<SnapshotOf>,
}

/// `NAME:TAG` split (E2B's way to name a template's tag), or `NAME` alone.
pub fn split_tag(raw: &str) -> (&str, Option<&str>) {
    match raw.rsplit_once(':') {
        Some((name, tag)) => (name, Some(tag)),
        None => (raw, None),
    }
}

/// A new template id: 20 hex digits.
pub fn new_template_id() -> String {
    hex::encode(rand::random::<[u8; 10]>())
}

/// A new build id, a UUID as E2B's are.
pub fn new_build_id() -> String {
    let b = hex::encode(rand::random::<[u8; 16]>());
    format!("{}-{}-{}-{}-{}", &b[..8], &b[8..12], &b[12..16], &b[16..20], &b[20..])
}

/// One provider state directory's template store.
#[derive(Debug, Clone)]
pub struct Store {
    pub layout: Layout,
    limit_bytes: u64,
    /// Names no stored template may take: the configured directory templates', which a create
    /// starts first (see [`Store::reserving`]).
    reserved: std::sync::Arc<std::collections::BTreeSet<String>>,
}

impl Store {
    /// Opens (creating) the store of `state_dir`; removes leftovers of interrupted writers when no
    /// writer is running.
    pub fn open(state_dir: &Path, limit_mb: u64) -> Result<Store, StoreError> {
        let layout = Layout::new(state_dir);
        layout.create()?;
        // Work in progress is named `<what>-<pid>-<random>`: what a dead process left is removed.
        if let Ok(entries) = std::fs::read_dir(layout.tmp()) {
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                let pid = name.split('-').nth(1).and_then(|p| p.parse::<u32>().ok());
                if pid.is_some_and(|p| p != std::process::id() && Path::new(&format!("/proc/{p}")).exists()) {
                    continue;
                }
                if pid == Some(std::process::id()) {
                    continue;
                }
                tracing::info!(path = %entry.path().display(), "removing an interrupted template store write");
                let _ = std::fs::remove_dir_all(entry.path()).or_else(|_| std::fs::remove_file(entry.path()));
            }
        }
        Ok(Store { layout, limit_bytes: limit_mb.saturating_mul(1 << 20), reserved: Default::default() })
    }

    /// The same store, refusing to register a template under any of `names` (the configured
    /// directory templates: `--template NAME=DIR`, `local.templates`).
    pub fn reserving(self, names: impl IntoIterator<Item = String>) -> Store {
        Store { reserved: std::sync::Arc::new(names.into_iter().collect()), ..self }
    }

    /// Checks that a template may be registered as `name`: a valid name ([`validate_name`]),
    /// neither `base` nor a configured directory template's.
    pub fn check_name(&self, name: &str) -> Result<(), StoreError> {
        validate_name(name)?;
        if self.reserved.contains(name) {
            return Err(StoreError::Reserved(name.to_owned()));
        }
        Ok(())
    }

    /// Takes the writers' lock (waiting for another import, pull or gc to finish).
    pub fn lock(&self) -> Result<StoreLock, StoreError> {
        StoreLock::take(&self.layout, true)?.ok_or_else(|| StoreError::Corrupt("store lock not taken".into()))
    }

    /// A template by name, template id or alias, or `NAME:TAG` (the template when it has that tag).
    pub fn lookup(&self, name: &str) -> Result<Option<TemplateRecord>, StoreError> {
        if let (name, Some(tag)) = split_tag(name) {
            return Ok(self.lookup(name)?.filter(|r| r.tags.iter().any(|t| t == tag)));
        }
        if validate_name(name).is_ok()
            && let Some(record) = self.layout.read_record(name)?
        {
            return Ok(Some(record));
        }
        Ok(self.layout.records()?.into_iter().find(|r| r.template_id == name || r.aliases.iter().any(|a| a == name)))
    }

    pub fn list(&self) -> Result<Vec<TemplateRecord>, StoreError> {
        self.layout.records()
    }

    /// The overlay lower directories of a template, bottom first (see [`Store::layer_stack`]).
    pub fn lowers(&self, record: &TemplateRecord) -> Result<Vec<PathBuf>, StoreError> {
        let layers = record.layers.iter().map(|d| Digest::parse(d)).collect::<Result<Vec<_>, _>>()?;
        self.layer_stack(&layers).map_err(|missing| {
            StoreError::Corrupt(format!("template {:?} names the missing layer {missing}", record.name))
        })
    }

    /// The overlay lower directories of `layers`, bottom first; `Err` names a layer that is not
    /// stored. A layer that appears more than once (an image's repeated empty layers, two build
    /// steps that wrote the same files) is stacked once, at its topmost place: overlayfs takes a
    /// directory only once, and everything the lower copy shows the upper one shows again.
    pub fn layer_stack(&self, layers: &[Digest]) -> Result<Vec<PathBuf>, Digest> {
        let mut stack = Vec::with_capacity(layers.len());
        for (i, digest) in layers.iter().enumerate() {
            if layers[i + 1..].contains(digest) {
                continue;
            }
            let fs = self.layout.layer_fs(digest);
            if !fs.is_dir() {
                return Err(digest.clone());
            }
            stack.push(fs);
        }
        Ok(stack)
    }

    /// Bytes the store's layers take (from their `layer.json`).
    pub fn usage_bytes(&self) -> u64 {
        let dir = self.layout.dir.join(layout::LAYERS);
        let Ok(entries) = std::fs::read_dir(&dir) else { return 0 };
        entries
            .flatten()
            .filter_map(|e| e.file_name().to_str().and_then(|hex| Digest::parse(&format!("sha256:{hex}")).ok()))
            .filter_map(|d| self.layout.layer_meta(&d))
            .map(|m| m.size_bytes)
            .sum()
    }

    pub fn limit_bytes(&self) -> u64 {
        self.limit_bytes
    }

    fn limit_error(&self) -> StoreError {
        StoreError::LimitReached { limit_mb: self.limit_bytes >> 20, used_mb: self.usage_bytes() >> 20 }
    }

    /// Adds one layer from its blob `raw` (compressed or not). `expected` is the blob's digest
    /// (checked; the layer is kept only on a match) or `None` to name the layer by what was read
    /// (a `docker save` layer, a build's own layer); `diff_id` is the uncompressed digest, checked
    /// when given. Returns the layer's digest; a layer already stored is not read again. The
    /// caller holds the lock.
    pub fn ingest_layer(
        &self,
        raw: impl Read + Send,
        expected: Option<&Digest>,
        diff_id: Option<&Digest>,
    ) -> Result<Digest, StoreError> {
        match self.extract_layer(raw, expected, diff_id)? {
            PreparedLayer::Stored(digest) => Ok(digest),
            prepared => self.commit_layer(prepared),
        }
    }

    /// The part of [`Store::ingest_layer`] that needs no lock: extracts and verifies `raw` into a
    /// scratch directory of this process (nothing a template can use until
    /// [`Store::commit_layer`], under the lock, renames it into `layers/`). The decompression runs
    /// on a thread of its own beside the extraction.
    pub fn extract_layer(
        &self,
        raw: impl Read + Send,
        expected: Option<&Digest>,
        diff_id: Option<&Digest>,
    ) -> Result<PreparedLayer, StoreError> {
        if let Some(digest) = expected
            && self.layout.layer_meta(digest).is_some()
        {
            return Ok(PreparedLayer::Stored(digest.clone()));
        }
        let left = self.limit_bytes.saturating_sub(self.usage_bytes());
        if left == 0 {
            return Err(self.limit_error());
        }
        let scratch = self.layout.scratch("layer")?;
        let fs = scratch.path.join("fs");
        std::fs::create_dir(&fs).map_err(|e| StoreError::io(&fs, e))?;
        let limits = extract::Limits { max_bytes: left, ..extract::Limits::default() };
        let ((done, uncompressed), actual) = pipeline::decode_beside(raw, |plain| {
            let (plain, plain_state) = digest::HashingReader::new(plain);
            let done = match extract::extract(plain, &fs, limits) {
                Err(StoreError::TooLarge(_)) if left < extract::Limits::default().max_bytes => {
                    return Err(self.limit_error());
                }
                other => other?,
            };
            Ok((done, plain_state.digest()))
        })?;
        if let Some(expected) = expected
            && &actual != expected
        {
            return Err(StoreError::DigestMismatch { expected: expected.to_string(), actual: actual.to_string() });
        }
        if let Some(diff_id) = diff_id
            && &uncompressed != diff_id
        {
            return Err(StoreError::DigestMismatch { expected: diff_id.to_string(), actual: uncompressed.to_string() });
        }
        if done.dropped_devices > 0 {
            tracing::info!(layer = %actual, count = done.dropped_devices, "device nodes left out of a layer");
        }
        let meta = LayerMeta { digest: actual.to_string(), size_bytes: done.size_bytes, entries: done.entries };
        let json = serde_json::to_vec(&meta).map_err(|e| StoreError::Extract(e.to_string()))?;
        std::fs::write(scratch.path.join("layer.json"), json).map_err(|e| StoreError::io(&scratch.path, e))?;
        Ok(PreparedLayer::Extracted { scratch, digest: actual, size_bytes: done.size_bytes })
    }

    /// Makes an extracted layer a stored one (checking the size limit again). The caller holds
    /// the lock.
    pub fn commit_layer(&self, prepared: PreparedLayer) -> Result<Digest, StoreError> {
        let (scratch, digest, size_bytes) = match prepared {
            PreparedLayer::Stored(digest) => return Ok(digest),
            PreparedLayer::Extracted { scratch, digest, size_bytes } => (scratch, digest, size_bytes),
        };
        if self.layout.layer_meta(&digest).is_some() {
            return Ok(digest); // stored meanwhile under the same digest
        }
        if self.usage_bytes() + size_bytes > self.limit_bytes {
            return Err(self.limit_error());
        }
        let dest = self.layout.layer_dir(&digest);
        let _ = std::fs::remove_dir_all(&dest); // a layer dir without layer.json is not a layer
        scratch.commit(&dest)?;
        Ok(digest)
    }

    /// Registers (or replaces) a template made of stored layers. The caller holds the lock.
    pub fn commit_template(
        &self,
        name: &str,
        layers: Vec<Digest>,
        config: RunConfig,
        source: String,
    ) -> Result<TemplateRecord, StoreError> {
        self.commit(NewTemplate { name, layers, config, source, ..NewTemplate::default() })
    }

    /// Registers (or replaces) a template; what `new` leaves `None` is kept from a template of the
    /// same name, else made up (ids) or defaulted (tags `default`). The caller holds the lock.
    pub fn commit(&self, new: NewTemplate<'_>) -> Result<TemplateRecord, StoreError> {
        let NewTemplate { name, layers, config, source, template_id, build_id, tags, cpu_count, memory_mb, snapshot } =
            new;
        self.check_name(name)?;
        let mut size = 0;
        let extra = snapshot.iter().flat_map(|s| s.extra.values().flatten()).filter_map(|d| Digest::parse(d).ok());
        for layer in layers.iter().cloned().chain(extra) {
            size += self
                .layout
                .layer_meta(&layer)
                .map(|m| m.size_bytes)
                .ok_or_else(|| StoreError::Corrupt(format!("layer {layer} is not in the store")))?;
        }
        let previous = self.layout.read_record(name)?;
        let record = TemplateRecord {
            name: name.to_owned(),
            template_id: template_id
                .or_else(|| previous.as_ref().map(|p| p.template_id.clone()))
                .unwrap_or_else(new_template_id),
            aliases: previous.as_ref().map(|p| p.aliases.clone()).unwrap_or_else(|| vec![name.to_owned()]),
            tags: tags
                .or_else(|| previous.as_ref().map(|p| p.tags.clone()))
                .unwrap_or_else(|| vec!["default".to_owned()]),
            build_id: build_id.unwrap_or_else(new_build_id),
            layers: layers.iter().map(|d| d.to_string()).collect(),
            config,
            size_bytes: size,
            created: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            cpu_count: cpu_count.unwrap_or(2),
            memory_mb: memory_mb.unwrap_or(512),
            source,
            snapshot,
        };
        self.layout.write_record(&record)?;
        Ok(record)
    }

    /// Removes a template's record (its layers stay until `gc`) and returns it. The caller holds
    /// the lock.
    pub fn remove(&self, name: &str) -> Result<TemplateRecord, StoreError> {
        let record = self.lookup(name)?.ok_or_else(|| StoreError::NotFound(name.to_owned()))?;
        let path = self.layout.record(&record.name);
        std::fs::remove_file(&path).map_err(|e| StoreError::io(&path, e))?;
        Ok(record)
    }

    /// Removes the layers of the deleted snapshot `record` that no template and no sandbox of
    /// `state_dir` uses (a snapshot's space is free at its delete, not at the next `gc`); returns
    /// the bytes freed. The caller holds the lock.
    pub fn free_snapshot_layers(&self, record: &TemplateRecord, state_dir: &Path) -> Result<u64, StoreError> {
        let extra = record.snapshot.iter().flat_map(|s| s.extra.values().flatten());
        let candidates: Vec<Digest> = record.layers.iter().chain(extra).filter_map(|d| Digest::parse(d).ok()).collect();
        gc::collect_unused(self, state_dir, &candidates)
    }

    /// Imports an OCI image layout (directory or tar) or a `docker save` tarball as `name`.
    pub fn import(&self, name: &str, source: &Path) -> Result<TemplateRecord, StoreError> {
        import::import(self, name, source)
    }

    /// Removes layers no template and no sandbox of `state_dir` uses. The caller holds the lock.
    pub fn gc(&self, state_dir: &Path) -> Result<GcReport, StoreError> {
        gc::collect(self, state_dir)
    }
}

#[cfg(test)]
mod tests;
