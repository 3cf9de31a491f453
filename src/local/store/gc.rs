//! Garbage collection: layers that no template record and no sandbox (its
//! `spec.json` under `STATE/sandboxes/`) uses are removed, then the build cache
//! entries whose layer went with them, and uploaded build files older than a day
//! (an SDK uploads them again when a build needs them).

use std::collections::HashSet;
use std::path::Path;

use super::digest::Digest;
use super::{Store, StoreError};

/// What a collection removed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GcReport {
    pub removed_layers: usize,
    pub freed_bytes: u64,
    pub kept_layers: usize,
    /// Build cache entries and uploaded build files removed.
    pub removed_build_files: usize,
}

/// Uploaded build files older than this are removed.
const UPLOAD_MAX_AGE: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

/// The layers (by hex digest) some template record or some sandbox of `state_dir` uses.
fn used_layers(store: &Store, state_dir: &Path) -> Result<HashSet<String>, StoreError> {
    let layers_dir = store.layout.dir.join(super::layout::LAYERS);
    let mut used: HashSet<String> = HashSet::new();
    for record in store.layout.records()? {
        let extra = record.snapshot.iter().flat_map(|s| s.extra.values().flatten());
        used.extend(
            record.layers.iter().chain(extra).filter_map(|d| Digest::parse(d).ok()).map(|d| d.hex().to_owned()),
        );
    }
    // Running sandboxes keep their layers even when their template was removed.
    if let Ok(sandboxes) = std::fs::read_dir(state_dir.join("sandboxes")) {
        for sandbox in sandboxes.flatten() {
            let Ok(spec) = std::fs::read_to_string(sandbox.path().join(crate::local::isolation::spec::SPEC_FILE))
            else {
                continue;
            };
            for (hex, _) in std::fs::read_dir(&layers_dir).into_iter().flatten().flatten().filter_map(|e| {
                let name = e.file_name().to_str()?.to_owned();
                spec.contains(&name).then_some((name, ()))
            }) {
                used.insert(hex);
            }
        }
    }
    Ok(used)
}

/// Removes those of `candidates` (a deleted snapshot's layers) that nothing uses any more;
/// returns the bytes freed. The caller holds the lock.
pub fn collect_unused(store: &Store, state_dir: &Path, candidates: &[Digest]) -> Result<u64, StoreError> {
    let used = used_layers(store, state_dir)?;
    let mut freed = 0;
    for digest in candidates {
        if used.contains(digest.hex()) {
            continue;
        }
        let dir = store.layout.layer_dir(digest);
        if !dir.exists() {
            continue;
        }
        freed += store.layout.layer_meta(digest).map(|m| m.size_bytes).unwrap_or(0);
        std::fs::remove_dir_all(&dir).map_err(|e| StoreError::io(&dir, e))?;
    }
    Ok(freed)
}

pub fn collect(store: &Store, state_dir: &Path) -> Result<GcReport, StoreError> {
    let layers_dir = store.layout.dir.join(super::layout::LAYERS);
    let used = used_layers(store, state_dir)?;
    let mut report = GcReport::default();
    for entry in std::fs::read_dir(&layers_dir).map_err(|e| StoreError::io(&layers_dir, e))?.flatten() {
        let Some(name) = entry.file_name().to_str().map(str::to_owned) else { continue };
        if used.contains(&name) {
            report.kept_layers += 1;
            continue;
        }
        let size = Digest::parse(&format!("sha256:{name}"))
            .ok()
            .and_then(|d| store.layout.layer_meta(&d))
            .map(|m| m.size_bytes)
            .unwrap_or(0);
        std::fs::remove_dir_all(entry.path()).map_err(|e| StoreError::io(&entry.path(), e))?;
        report.removed_layers += 1;
        report.freed_bytes += size;
    }
    report.removed_build_files = collect_build_files(store);
    Ok(report)
}

/// Removes cache entries that name a missing layer and old uploads; returns how many.
fn collect_build_files(store: &Store) -> usize {
    let mut removed = 0;
    let cache = store.layout.dir.join("cache");
    for entry in std::fs::read_dir(&cache).into_iter().flatten().flatten() {
        let layer = std::fs::read(entry.path())
            .ok()
            .and_then(|bytes| serde_json::from_slice::<serde_json::Value>(&bytes).ok())
            .map(|v| v.get("layer").and_then(|l| l.as_str()).map(str::to_owned));
        let keep = match layer {
            Some(None) => true,
            Some(Some(digest)) => Digest::parse(&digest).ok().is_some_and(|d| store.layout.layer_meta(&d).is_some()),
            None => false,
        };
        if !keep && std::fs::remove_file(entry.path()).is_ok() {
            removed += 1;
        }
    }
    let files = store.layout.dir.join("files");
    for template in std::fs::read_dir(&files).into_iter().flatten().flatten() {
        for upload in std::fs::read_dir(template.path()).into_iter().flatten().flatten() {
            let old = upload.metadata().and_then(|m| m.modified()).ok().and_then(|t| t.elapsed().ok());
            if old.is_some_and(|age| age > UPLOAD_MAX_AGE) && std::fs::remove_file(upload.path()).is_ok() {
                removed += 1;
            }
        }
        let _ = std::fs::remove_dir(template.path()); // only when empty
    }
    removed
}
