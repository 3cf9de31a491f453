//! `GET /templates`: every template a sandbox can be created from (`base`, the
//! `local.templates` directories, the store's), in E2B's `Template` shape plus
//! the local provider's `kind`, `sizeBytes` and `python3`. The python3 version
//! is found on every listing by resolving `python3` on the sandbox's default
//! PATH through the template's layers as its overlay will show them
//! (whiteouts, opaque directories and symlinks included): a few `lstat`s per
//! template, nothing is run.

use std::collections::VecDeque;
use std::fs::Metadata;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use http::StatusCode;

use super::{ApiResult, AppState, total_memory_mb};
use crate::e2b::wire;
use crate::local::api::control_error::ControlError;
use crate::local::control::sandbox_table::SandboxTable;
use crate::local::template::TemplateRoot;

/// The directories of the sandbox's default PATH, in its order (`envd::process::spawn::DEFAULT_PATH`).
const PATH_DIRS: &[&str] = &["usr/local/sbin", "usr/local/bin", "usr/sbin", "usr/bin", "sbin", "bin"];
/// Most symlinks followed in one lookup (as the kernel's 40, but a template needs few).
const MAX_LINKS: usize = 16;
/// The overlay xattr of an opaque directory (what the store writes for `.wh..wh..opq`).
const OPAQUE_XATTR: &str = "trusted.overlay.opaque";

pub(super) async fn list(State(state): State<Arc<AppState>>) -> ApiResult<Json<Vec<wire::Template>>> {
    let provider = state.provider.clone();
    tokio::task::spawn_blocking(move || templates(&provider))
        .await
        .map_err(|e| ControlError::new(StatusCode::INTERNAL_SERVER_ERROR, format!("listing templates failed: {e}")))?
        .map(Json)
}

/// What every template of this provider shares: its sandboxes' limits.
fn common(provider: &SandboxTable) -> wire::Template {
    wire::Template {
        cpu_count: std::thread::available_parallelism().map(|n| n.get() as u32).unwrap_or(1),
        memory_mb: provider.cfg.memory_limit_mb.unwrap_or_else(total_memory_mb),
        disk_size_mb: provider.disk_limit_bytes().map(|b| b / (1024 * 1024)).unwrap_or(0),
        public: false,
        build_count: 1,
        envd_version: wire::ENVD_VERSION.into(),
        build_status: "ready".into(),
        ..Default::default()
    }
}

/// A directory's modification time, RFC 3339 (the creation time of a directory template).
fn modified(path: &Path) -> String {
    let time = std::fs::metadata(path).and_then(|m| m.modified()).ok().map(chrono::DateTime::<chrono::Utc>::from);
    time.unwrap_or_default().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

fn directory_entry(common: &wire::Template, name: &str, kind: &str, root: &TemplateRoot) -> wire::Template {
    let created = modified(&root.root);
    wire::Template {
        template_id: name.to_owned(),
        build_id: root.root.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
        aliases: vec![name.to_owned()],
        names: vec![name.to_owned()],
        updated_at: created.clone(),
        created_at: created,
        python3: python3_version(root),
        kind: Some(kind.to_owned()),
        ..common.clone()
    }
}

fn templates(provider: &SandboxTable) -> ApiResult<Vec<wire::Template>> {
    let common = common(provider);
    let configured = &provider.cfg.templates;
    let mut out = Vec::new();
    match configured.get("base") {
        Some(dir) => out.push(directory_entry(&common, "base", "directory", &TemplateRoot::directory(dir.clone()))),
        None => out.push(directory_entry(&common, "base", "base", provider.base_template())),
    }
    let mut dirs: Vec<(&String, &PathBuf)> = configured.iter().filter(|(name, _)| name.as_str() != "base").collect();
    dirs.sort();
    for (name, dir) in dirs {
        out.push(directory_entry(&common, name, "directory", &TemplateRoot::directory(dir.clone())));
    }
    let Some(store) = provider.template_store() else { return Ok(out) };
    let records = store.list().map_err(|e| {
        ControlError::new(StatusCode::INTERNAL_SERVER_ERROR, format!("cannot read the template store: {e}"))
    })?;
    for record in records {
        // A `local.templates` entry of the same name is what a create gets.
        if configured.contains_key(&record.name) {
            continue;
        }
        // A snapshot stacks over the template it was taken on (`base`'s host layers among them).
        let root = match &record.snapshot {
            Some(_) => provider.resolve_template(&record.template_id).ok().flatten().map(|r| r.root),
            None => store.lowers(&record).ok().and_then(TemplateRoot::stacked),
        };
        let mut names = vec![record.name.clone()];
        names.extend(record.aliases.iter().filter(|a| **a != record.name).cloned());
        out.push(wire::Template {
            template_id: record.template_id.clone(),
            build_id: record.build_id.clone(),
            aliases: record.aliases.clone(),
            names,
            created_at: record.created.clone(),
            updated_at: record.created.clone(),
            size_bytes: Some(record.size_bytes),
            python3: root.as_ref().and_then(python3_version),
            kind: Some(if record.snapshot.is_some() { "snapshot" } else { "stored" }.into()),
            ..common.clone()
        });
    }
    Ok(out)
}

/// The version of the `python3` a sandbox of `root` finds first on its PATH: `3.N` from the name
/// of the file it resolves to (or of a `python3.N` beside it), `3` when nothing names it, `None`
/// when there is no executable `python3`.
fn python3_version(root: &TemplateRoot) -> Option<String> {
    for dir in PATH_DIRS {
        let Some((path, meta)) = resolve(root, &format!("{dir}/python3")) else { continue };
        if !meta.is_file() || meta.permissions().mode() & 0o111 == 0 {
            continue;
        }
        let (parent, name) = path.rsplit_once('/').unwrap_or(("", path.as_str()));
        if let Some(version) = version_of(name) {
            return Some(version);
        }
        let beside = (0..=40)
            .rev()
            .find(|minor| resolve(root, &format!("{parent}/python3.{minor}")).is_some_and(|(_, meta)| meta.is_file()));
        return Some(beside.map_or_else(|| "3".to_owned(), |minor| format!("3.{minor}")));
    }
    None
}

fn version_of(name: &str) -> Option<String> {
    let minor = name.strip_prefix("python3.")?;
    (!minor.is_empty() && minor.bytes().all(|b| b.is_ascii_digit())).then(|| format!("3.{minor}"))
}

fn split(path: &str) -> VecDeque<String> {
    path.split('/').filter(|p| !p.is_empty() && *p != ".").map(str::to_owned).collect()
}

/// `rel` in the template's merged view, symlinks followed inside the view (absolute targets
/// from its root): the merged path and the entry's metadata.
fn resolve(root: &TemplateRoot, rel: &str) -> Option<(String, Metadata)> {
    let mut done: Vec<String> = Vec::new();
    let mut pending = split(rel);
    let mut links = 0;
    let mut last = None;
    while let Some(part) = pending.pop_front() {
        if part == ".." {
            done.pop();
            last = None;
            continue;
        }
        done.push(part);
        let (real, meta) = entry(root, &done)?;
        if meta.file_type().is_symlink() {
            links += 1;
            if links > MAX_LINKS {
                return None;
            }
            let target = std::fs::read_link(&real).ok()?;
            let target = target.to_str()?;
            done.pop();
            if target.starts_with('/') {
                done.clear();
            }
            let mut next = split(target);
            next.extend(pending);
            pending = next;
            last = None;
        } else {
            last = Some(meta);
        }
    }
    Some((done.join("/"), last?))
}

/// The topmost layer's entry at `parts`, or `None` when no layer has it or a whiteout or an
/// opaque directory above hides it.
fn entry(root: &TemplateRoot, parts: &[String]) -> Option<(PathBuf, Metadata)> {
    let rel: PathBuf = parts.iter().collect();
    // `base`'s program layers (the host's /usr) are mounted over their directory.
    if let Some(layer) = root.layers.iter().find(|l| parts.first().is_some_and(|p| *p == l.target)) {
        let path = layer.source.join(parts[1..].iter().collect::<PathBuf>());
        return std::fs::symlink_metadata(&path).ok().map(|meta| (path, meta));
    }
    for layer in root.lowers.iter().rev().chain(std::iter::once(&root.root)) {
        let path = layer.join(&rel);
        match std::fs::symlink_metadata(&path) {
            Ok(meta) if meta.file_type().is_char_device() && meta.rdev() == 0 => return None,
            Ok(meta) => return Some((path, meta)),
            Err(_) if hides_below(layer, parts) => return None,
            Err(_) => {}
        }
    }
    None
}

/// Whether a directory on the way to `parts` in `layer` is opaque (or not a directory).
fn hides_below(layer: &Path, parts: &[String]) -> bool {
    let mut dir = layer.to_path_buf();
    for part in &parts[..parts.len().saturating_sub(1)] {
        dir.push(part);
        match std::fs::symlink_metadata(&dir) {
            Ok(meta) if !meta.is_dir() => return true,
            Ok(_) => {
                if xattr::get(&dir, OPAQUE_XATTR).ok().flatten().is_some_and(|v| v == b"y") {
                    return true;
                }
            }
            Err(_) => return false,
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python3_is_found_through_links_and_hidden_by_whiteouts() {
        let dir = tempfile::tempdir().unwrap();
        let (low, up) = (dir.path().join("low"), dir.path().join("up"));
        std::fs::create_dir_all(low.join("usr/bin")).unwrap();
        std::fs::create_dir_all(up.join("usr/bin")).unwrap();
        std::os::unix::fs::symlink("usr/bin", low.join("bin")).unwrap();
        std::fs::write(low.join("usr/bin/python3.11"), "").unwrap();
        std::fs::set_permissions(low.join("usr/bin/python3.11"), std::fs::Permissions::from_mode(0o755)).unwrap();
        std::os::unix::fs::symlink("python3.11", low.join("usr/bin/python3")).unwrap();
        let one = TemplateRoot::directory(low.clone());
        assert_eq!(python3_version(&one).as_deref(), Some("3.11"));
        let two = TemplateRoot::stacked(vec![low.clone(), up.clone()]).unwrap();
        assert_eq!(python3_version(&two).as_deref(), Some("3.11"), "an upper layer without it keeps it");
        // A whiteout (0/0 character device, as the store writes them) removes it.
        if nix::sys::stat::mknod(
            &up.join("usr/bin/python3"),
            nix::sys::stat::SFlag::S_IFCHR,
            nix::sys::stat::Mode::empty(),
            0,
        )
        .is_ok()
        {
            assert_eq!(python3_version(&two), None);
        }
        // A plain python3 without a version in its name takes the one beside it.
        std::fs::remove_file(low.join("usr/bin/python3")).unwrap();
        std::fs::copy(low.join("usr/bin/python3.11"), low.join("usr/bin/python3")).unwrap();
        assert_eq!(python3_version(&one).as_deref(), Some("3.11"));
        std::fs::remove_file(low.join("usr/bin/python3.11")).unwrap();
        assert_eq!(python3_version(&one).as_deref(), Some("3"));
        std::fs::set_permissions(low.join("usr/bin/python3"), std::fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(python3_version(&one), None, "not executable");
    }
}
