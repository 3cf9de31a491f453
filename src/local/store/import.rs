//! `sandbox-mcp template import`: an OCI image layout (a directory, or a tar
//! of one) or a `docker save` tarball becomes a stored template, for hosts
//! without a registry. A tar is first unpacked into the store's `tmp/` (only
//! plain files, directories and links between them, inside the archive).

use std::io::Read;
use std::path::{Path, PathBuf};

use super::digest::{Digest, LimitedReader, read_verified};
use super::image::{Document, ImageConfig, MAX_DOCUMENT, pick_manifest};
use super::layout::Scratch;
use super::{Store, StoreError, TemplateRecord, extract::components};

pub fn import(store: &Store, name: &str, source: &Path) -> Result<TemplateRecord, StoreError> {
    store.check_name(name)?;
    let meta = std::fs::metadata(source).map_err(|e| StoreError::io(source, e))?;
    let _lock = store.lock()?;
    // Removed when this returns (dropped).
    let mut _unpacked: Option<Scratch> = None;
    let dir = if meta.is_dir() {
        source.to_path_buf()
    } else {
        let unpacked = store.layout.scratch("import")?;
        unpack_archive(source, &unpacked.path, store.limit_bytes())?;
        let path = unpacked.path.clone();
        _unpacked = Some(unpacked);
        path
    };
    let label = format!("import:{}", source.display());
    if dir.join("index.json").is_file() {
        import_oci_layout(store, name, &dir, label)
    } else if dir.join("manifest.json").is_file() {
        import_docker_save(store, name, &dir, label)
    } else {
        Err(StoreError::BadImage(format!(
            "{} is neither an OCI image layout (no index.json) nor a `docker save` archive (no manifest.json)",
            source.display()
        )))
    }
}

/// The path of a blob in an OCI layout.
fn blob_path(dir: &Path, digest: &Digest) -> PathBuf {
    dir.join("blobs/sha256").join(digest.hex())
}

fn import_oci_layout(store: &Store, name: &str, dir: &Path, label: String) -> Result<TemplateRecord, StoreError> {
    let index_path = dir.join("index.json");
    let mut bytes = Vec::new();
    let file = std::fs::File::open(&index_path).map_err(|e| StoreError::io(&index_path, e))?;
    LimitedReader::new(file, MAX_DOCUMENT).read_to_end(&mut bytes).map_err(|e| StoreError::io(&index_path, e))?;
    let mut doc = Document::parse(&bytes)?;
    // index.json → (nested indexes) → the host platform's manifest.
    for _ in 0..4 {
        if !doc.is_index() {
            break;
        }
        let chosen = if doc.manifests.len() == 1 { &doc.manifests[0] } else { pick_manifest(&doc)? };
        let digest = Digest::parse(&chosen.digest)?;
        doc = Document::parse(&read_verified(&blob_path(dir, &digest), &digest, MAX_DOCUMENT)?)?;
    }
    let config_desc = doc.config.as_ref().ok_or_else(|| StoreError::BadImage("the manifest has no config".into()))?;
    let config_digest = Digest::parse(&config_desc.digest)?;
    let config = ImageConfig::parse(&read_verified(&blob_path(dir, &config_digest), &config_digest, MAX_DOCUMENT)?)?;
    let mut layers = Vec::new();
    for (i, layer) in doc.layers.iter().enumerate() {
        let digest = Digest::parse(&layer.digest)?;
        let path = blob_path(dir, &digest);
        if layer.media_type.contains("nondistributable") || layer.media_type.contains("foreign") {
            return Err(StoreError::BadImage(format!("layer {digest} is a foreign layer ({})", layer.media_type)));
        }
        let file = std::fs::File::open(&path).map_err(|e| StoreError::io(&path, e))?;
        let len = file.metadata().map_err(|e| StoreError::io(&path, e))?.len();
        if layer.size != 0 && layer.size != len {
            return Err(StoreError::BadImage(format!(
                "layer {digest} is {len} bytes, the manifest says {}",
                layer.size
            )));
        }
        layers.push(store.ingest_layer(file, Some(&digest), config.diff_id(i).as_ref())?);
    }
    store.commit_template(name, layers, config.run_config(), label)
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "PascalCase")]
struct SaveManifest {
    config: String,
    layers: Vec<String>,
}

fn inside(dir: &Path, rel: &str) -> Result<PathBuf, StoreError> {
    Ok(components(rel.as_bytes())?.iter().fold(dir.to_path_buf(), |p, c| p.join(c)))
}

fn import_docker_save(store: &Store, name: &str, dir: &Path, label: String) -> Result<TemplateRecord, StoreError> {
    let path = dir.join("manifest.json");
    let bytes = std::fs::read(&path).map_err(|e| StoreError::io(&path, e))?;
    let manifests: Vec<SaveManifest> = serde_json::from_slice(&bytes)
        .map_err(|e| StoreError::BadImage(format!("bad docker save manifest.json: {e}")))?;
    let [manifest] = manifests.as_slice() else {
        return Err(StoreError::BadImage(format!(
            "the archive holds {} images; save one image per archive",
            manifests.len()
        )));
    };
    let config_path = inside(dir, &manifest.config)?;
    let mut config_bytes = Vec::new();
    let file = std::fs::File::open(&config_path).map_err(|e| StoreError::io(&config_path, e))?;
    LimitedReader::new(file, MAX_DOCUMENT)
        .read_to_end(&mut config_bytes)
        .map_err(|e| StoreError::io(&config_path, e))?;
    let config = ImageConfig::parse(&config_bytes)?;
    let mut layers = Vec::new();
    for (i, rel) in manifest.layers.iter().enumerate() {
        let path = inside(dir, rel)?;
        let file = std::fs::File::open(&path).map_err(|e| StoreError::io(&path, e))?;
        // Named by what was read; the config's diff_id (the uncompressed digest) is checked.
        layers.push(store.ingest_layer(file, None, config.diff_id(i).as_ref())?);
    }
    store.commit_template(name, layers, config.run_config(), label)
}

/// Unpacks the outer archive (OCI layout tar or `docker save`) into `dest`: files and
/// directories only, symlinks and hard links resolved to files of the archive.
fn unpack_archive(source: &Path, dest: &Path, max_bytes: u64) -> Result<(), StoreError> {
    let file = std::fs::File::open(source).map_err(|e| StoreError::io(source, e))?;
    let mut archive = tar::Archive::new(LimitedReader::new(file, max_bytes));
    let bad = |e: std::io::Error| StoreError::BadImage(format!("{} is not a readable tar: {e}", source.display()));
    let mut links = Vec::new();
    for entry in archive.entries().map_err(bad)? {
        let mut entry = entry.map_err(bad)?;
        let raw = entry.path_bytes().into_owned();
        let parts = components(&raw)?;
        let path = parts.iter().fold(dest.to_path_buf(), |p, c| p.join(c));
        use tar::EntryType as T;
        match entry.header().entry_type() {
            T::Directory => std::fs::create_dir_all(&path).map_err(|e| StoreError::io(&path, e))?,
            T::Regular | T::Continuous => {
                if let Some(parent) = path.parent() {
                    std::fs::create_dir_all(parent).map_err(|e| StoreError::io(parent, e))?;
                }
                let mut out = std::fs::File::create(&path).map_err(|e| StoreError::io(&path, e))?;
                std::io::copy(&mut entry, &mut out).map_err(bad)?;
            }
            kind @ (T::Symlink | T::Link) => {
                let target = entry.link_name_bytes().map(|t| t.into_owned()).unwrap_or_default();
                let mut base: Vec<std::ffi::OsString> = if kind == T::Symlink && !target.starts_with(b"/") {
                    parts[..parts.len().saturating_sub(1)].to_vec()
                } else {
                    Vec::new()
                };
                for part in target.split(|b| *b == b'/') {
                    match part {
                        b"" | b"." => {}
                        b".." => {
                            base.pop().ok_or_else(|| StoreError::HostileLayer("a link leaves the archive".into()))?;
                        }
                        p => base.push(std::ffi::OsString::from(String::from_utf8_lossy(p).into_owned())),
                    }
                }
                links.push((path, base.iter().fold(dest.to_path_buf(), |p, c| p.join(c))));
            }
            _ => {}
        }
    }
    for (link, target) in links {
        if let Some(parent) = link.parent() {
            std::fs::create_dir_all(parent).map_err(|e| StoreError::io(parent, e))?;
        }
        if std::fs::symlink_metadata(&target).is_ok_and(|m| m.is_file()) {
            std::fs::hard_link(&target, &link).map_err(|e| StoreError::io(&link, e))?;
        }
    }
    Ok(())
}
