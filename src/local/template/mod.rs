//! Template roots: the read-only lower layers of a sandbox's filesystem.
//!
//! `base` is built by the provider from an allow-list of the host, never the
//! host's whole `/`: a generated `/etc` (only `root` and `user`, the sandbox's
//! resolver, the host's loader cache, CA certificates, shell start-up files,
//! alternatives, os-release), empty `/root`, `/home/user`, `/tmp`, `/var`,
//! `/opt`, `/srv`, and the host's programs (`/usr` and the merged-`/usr`
//! links) as extra copy-on-write layers. It is built once per input set and
//! cached in `STATE/templates/base-<fingerprint>`. Other templates are root
//! filesystem directories named in `[local.templates]`, or stored templates
//! (the template store's layers, stacked). The generated login profile is `shell_profile`.

pub mod shell_profile;

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The DNS server every sandbox's `/etc/resolv.conf` names (served by the provider's network layer).
pub const SANDBOX_NAMESERVER: &str = "169.254.0.22";

/// Bumped whenever the generated content changes, so cached roots are rebuilt.
const FORMAT: &str = "base-v2";

/// Host top-level entries that make up the programs of `base` (directories become layers,
/// symlinks into `/usr` are copied as links).
const PROGRAM_DIRS: &[&str] = &["usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32"];

/// Host `/etc` entries copied into the generated `/etc` (when present). Nothing here may hold a
/// secret or host state: no keys (`ssl/private`, `ssh`), no accounts, no service configuration.
const ETC_COPIES: &[&str] = &[
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "ssl/certs",
    "ssl/openssl.cnf",
    "ca-certificates",
    "ca-certificates.conf",
    "pki/tls/certs",
    "pki/ca-trust/extracted",
    "profile",
    "profile.d",
    "bash.bashrc",
    "bash_completion",
    "bash_completion.d",
    "skel",
    "alternatives",
    "os-release",
    "lsb-release",
    "debian_version",
    "inputrc",
    "mime.types",
    "protocols",
    "services",
    "localtime",
    "timezone",
    "locale.alias",
    "gai.conf",
    "host.conf",
    "networks",
    "shells",
    "ethertypes",
    "rpc",
    "magic",
    "magic.mime",
    "manpath.config",
];

/// Empty directories of every generated root (mode).
const EMPTY_DIRS: &[(&str, u32)] = &[
    ("root", 0o700),
    ("home", 0o755),
    ("home/user", 0o755),
    ("tmp", 0o1777),
    ("var", 0o755),
    ("var/tmp", 0o1777),
    ("var/log", 0o755),
    ("var/cache", 0o755),
    ("var/lib", 0o755),
    ("opt", 0o755),
    ("srv", 0o755),
    ("mnt", 0o755),
    ("run", 0o755),
    ("proc", 0o555),
    ("sys", 0o555),
    ("dev", 0o755),
];

/// An extra copy-on-write layer mounted at `target` (relative to the sandbox root) over `source`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Layer {
    pub target: String,
    pub source: PathBuf,
    /// Read-only layers stacked above `source`, bottom first: a snapshot's record of what a
    /// sandbox wrote below `/<target>` (see `local::snapshot`). Empty for `base` itself.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub above: Vec<PathBuf>,
}

/// A template's lower layers: the root directory, the read-only layers stacked above it (bottom
/// first; a stored template's), and the extra layers mounted inside it (`base`'s host `/usr`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateRoot {
    pub root: PathBuf,
    pub layers: Vec<Layer>,
    pub lowers: Vec<PathBuf>,
    /// A stored template: its sandboxes see the image's own `/home` and `/root` (through the
    /// overlay, not private binds). False for `base` and directory templates (a directory may be
    /// a host's `/`).
    pub stored: bool,
}

impl TemplateRoot {
    /// A one-layer template: a root filesystem directory.
    pub fn directory(root: PathBuf) -> TemplateRoot {
        TemplateRoot { root, layers: Vec::new(), lowers: Vec::new(), stored: false }
    }

    /// A stored template: its layers, bottom first (at least one).
    pub fn stacked(mut lowers: Vec<PathBuf>) -> Option<TemplateRoot> {
        if lowers.is_empty() {
            return None;
        }
        let root = lowers.remove(0);
        Some(TemplateRoot { root, layers: Vec::new(), lowers, stored: true })
    }
}

/// Errors of building the `base` root.
#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    #[error("cannot build the base template in {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
}

fn io_at(path: &Path) -> impl FnOnce(std::io::Error) -> TemplateError + '_ {
    move |source| TemplateError::Io { path: path.to_owned(), source }
}

/// Builds (or reuses) the `base` root under `STATE/templates` from the host under `host_root`
/// (`/` in production). Returns its root and the program layers.
pub fn build_base(state_dir: &Path, host_root: &Path) -> Result<TemplateRoot, TemplateError> {
    let dir = state_dir.join("templates");
    std::fs::DirBuilder::new().mode(0o700).recursive(true).create(&dir).map_err(io_at(&dir))?;
    let (fingerprint, layers, links) = inputs(host_root);
    let root = dir.join(format!("base-{}", &fingerprint[..16]));
    let marker = root.join(".sandbox-mcp-template");
    if marker.exists() {
        return Ok(TemplateRoot { root, layers, lowers: Vec::new(), stored: false });
    }
    let tmp = dir.join(format!(".base-{}.tmp-{}", &fingerprint[..16], std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    let built = populate(&tmp, host_root, &layers, &links);
    if let Err(err) = built {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(err);
    }
    std::fs::write(tmp.join(".sandbox-mcp-template"), format!("{FORMAT} {fingerprint}\n")).map_err(io_at(&tmp))?;
    if let Err(source) = std::fs::rename(&tmp, &root) {
        let _ = std::fs::remove_dir_all(&tmp);
        if !marker.exists() {
            return Err(TemplateError::Io { path: root, source });
        }
    }
    tracing::info!(root = %root.display(), "built the base template root");
    Ok(TemplateRoot { root, layers, lowers: Vec::new(), stored: false })
}

/// The fingerprint of everything `base` is made of, its program layers and its top-level links.
fn inputs(host_root: &Path) -> (String, Vec<Layer>, Vec<(String, PathBuf)>) {
    let mut hash = Sha256::new();
    hash.update(FORMAT.as_bytes());
    hash.update(host_root.as_os_str().as_encoded_bytes());
    let (mut layers, mut links) = (Vec::new(), Vec::new());
    for name in PROGRAM_DIRS {
        let source = host_root.join(name);
        match std::fs::symlink_metadata(&source) {
            Ok(meta) if meta.file_type().is_symlink() => {
                if let Ok(target) = std::fs::read_link(&source) {
                    hash.update(format!("link {name} {}\n", target.display()).as_bytes());
                    links.push(((*name).to_owned(), target));
                }
            }
            Ok(meta) if meta.is_dir() => {
                hash.update(format!("layer {name}\n").as_bytes());
                layers.push(Layer { target: (*name).to_owned(), source, above: Vec::new() });
            }
            _ => {}
        }
    }
    for rel in etc_sources(host_root) {
        walk(&host_root.join("etc").join(&rel), &mut |path, meta| {
            hash.update(path.as_os_str().as_encoded_bytes());
            hash.update(format!(" {} {} {} {}\n", meta.mode(), meta.len(), meta.mtime(), meta.mtime_nsec()).as_bytes());
        });
    }
    (hex::encode(hash.finalize()), layers, links)
}

/// The allow-listed `/etc` entries present on the host, plus `python3*` configuration dirs.
fn etc_sources(host_root: &Path) -> Vec<String> {
    let etc = host_root.join("etc");
    let mut out: Vec<String> =
        ETC_COPIES.iter().filter(|r| etc.join(r).symlink_metadata().is_ok()).map(|r| (*r).to_owned()).collect();
    if let Ok(entries) = std::fs::read_dir(&etc) {
        let mut python: Vec<String> = entries
            .flatten()
            .filter_map(|e| e.file_name().to_str().map(str::to_owned))
            .filter(|n| n.starts_with("python3"))
            .collect();
        python.sort();
        out.extend(python);
    }
    out
}

/// Calls `visit` for `path` and everything below it (symlinks are not followed).
fn walk(path: &Path, visit: &mut dyn FnMut(&Path, &std::fs::Metadata)) {
    let Ok(meta) = std::fs::symlink_metadata(path) else { return };
    visit(path, &meta);
    if meta.is_dir()
        && let Ok(entries) = std::fs::read_dir(path)
    {
        let mut children: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
        children.sort();
        for child in children {
            walk(&child, visit);
        }
    }
}

fn populate(root: &Path, host_root: &Path, layers: &[Layer], links: &[(String, PathBuf)]) -> Result<(), TemplateError> {
    let mkdir = |rel: &str, mode: u32| -> Result<(), TemplateError> {
        let path = root.join(rel);
        std::fs::DirBuilder::new().mode(mode).recursive(true).create(&path).map_err(io_at(&path))?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).map_err(io_at(&path))
    };
    mkdir("", 0o755)?;
    for (rel, mode) in EMPTY_DIRS {
        mkdir(rel, *mode)?;
    }
    std::os::unix::fs::chown(root.join("home/user"), Some(1000), Some(1000)).map_err(io_at(root))?;
    for layer in layers {
        mkdir(&layer.target, 0o755)?;
    }
    for (name, target) in links {
        let path = root.join(name);
        std::os::unix::fs::symlink(target, &path).map_err(io_at(&path))?;
    }
    mkdir("etc", 0o755)?;
    let etc = root.join("etc");
    for rel in etc_sources(host_root) {
        copy_tree(&host_root.join("etc").join(&rel), &etc.join(&rel))?;
    }
    // The host's profile without its `$(id -u)` process (`shell_profile`).
    let profile = etc.join("profile");
    shell_profile::lighten_file(&profile).map_err(io_at(&profile))?;
    for (name, mode, content) in generated_etc() {
        let path = etc.join(name);
        let mut file = std::fs::File::create(&path).map_err(io_at(&path))?;
        file.write_all(content.as_bytes()).map_err(io_at(&path))?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).map_err(io_at(&path))?;
    }
    Ok(())
}

/// The files of `/etc` that are written, not copied: accounts, name resolution.
fn generated_etc() -> Vec<(&'static str, u32, String)> {
    vec![
        (
            "passwd",
            0o644,
            "root:x:0:0:root:/root:/bin/bash\nuser:x:1000:1000:sandbox user:/home/user:/bin/bash\n".to_owned(),
        ),
        ("group", 0o644, "root:x:0:\ntty:x:5:\nuser:x:1000:\n".to_owned()),
        ("shadow", 0o600, "root:*:19000:0:99999:7:::\nuser:*:19000:0:99999:7:::\n".to_owned()),
        ("gshadow", 0o600, "root:*::\ntty:*::\nuser:*::\n".to_owned()),
        ("hosts", 0o644, "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n".to_owned()),
        ("hostname", 0o644, "sandbox\n".to_owned()),
        ("resolv.conf", 0o644, format!("nameserver {SANDBOX_NAMESERVER}\n")),
        (
            "nsswitch.conf",
            0o644,
            "passwd: files\ngroup: files\nshadow: files\ngshadow: files\nhosts: files dns\nnetworks: files\n\
             protocols: files\nservices: files\nethers: files\nrpc: files\n"
                .to_owned(),
        ),
    ]
}

/// Copies a file, symlink or directory tree (modes kept, owned by the caller; other file types skipped).
fn copy_tree(src: &Path, dst: &Path) -> Result<(), TemplateError> {
    let Ok(meta) = std::fs::symlink_metadata(src) else { return Ok(()) };
    if let Some(parent) = dst.parent() {
        std::fs::DirBuilder::new().mode(0o755).recursive(true).create(parent).map_err(io_at(parent))?;
    }
    let kind = meta.file_type();
    if kind.is_symlink() {
        let target = std::fs::read_link(src).map_err(io_at(src))?;
        std::os::unix::fs::symlink(target, dst).map_err(io_at(dst))?;
    } else if kind.is_dir() {
        std::fs::DirBuilder::new().mode(0o755).recursive(true).create(dst).map_err(io_at(dst))?;
        for entry in std::fs::read_dir(src).map_err(io_at(src))?.flatten() {
            copy_tree(&entry.path(), &dst.join(entry.file_name()))?;
        }
        std::fs::set_permissions(dst, std::fs::Permissions::from_mode(meta.mode() & 0o7777)).map_err(io_at(dst))?;
    } else if kind.is_file() {
        std::fs::copy(src, dst).map_err(io_at(src))?;
        // No set-id bits in a template's /etc.
        std::fs::set_permissions(dst, std::fs::Permissions::from_mode(meta.mode() & 0o777)).map_err(io_at(dst))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_is_built_from_the_allow_list_and_reused_until_an_input_changes() {
        let host = tempfile::tempdir().unwrap();
        let h = host.path();
        for dir in ["usr/bin", "etc/ssl/certs", "etc/ssl/private", "etc/ssh", "var/lib/secret", "home/alice"] {
            std::fs::create_dir_all(h.join(dir)).unwrap();
        }
        std::os::unix::fs::symlink("usr/bin", h.join("bin")).unwrap();
        std::fs::write(h.join("etc/shadow"), "root:$6$host:1::::::\n").unwrap();
        std::fs::write(h.join("etc/ssl/private/key.pem"), "KEY").unwrap();
        std::fs::write(h.join("etc/ssl/certs/ca.pem"), "CA").unwrap();
        std::fs::write(h.join("etc/profile"), "PS1=x\n").unwrap();
        std::fs::write(h.join("etc/service.toml"), "secret").unwrap();
        let state = tempfile::tempdir().unwrap();

        let base = build_base(state.path(), h).unwrap();
        let r = &base.root;
        assert_eq!(base.layers, vec![Layer { target: "usr".into(), source: h.join("usr"), above: Vec::new() }]);
        assert_eq!(std::fs::read_link(r.join("bin")).unwrap(), Path::new("usr/bin"));
        assert!(r.join("usr").is_dir() && r.join("tmp").is_dir() && r.join("home/user").is_dir());
        assert_eq!(std::fs::read_to_string(r.join("etc/ssl/certs/ca.pem")).unwrap(), "CA");
        assert_eq!(std::fs::read_to_string(r.join("etc/resolv.conf")).unwrap(), "nameserver 169.254.0.22\n");
        assert!(!std::fs::read_to_string(r.join("etc/shadow")).unwrap().contains("$6$host"));
        for absent in ["etc/ssl/private", "etc/ssh", "etc/service.toml", "var/lib/secret", "home/alice"] {
            assert!(!r.join(absent).exists(), "{absent} leaked into the template");
        }
        assert_eq!(build_base(state.path(), h).unwrap(), base, "unchanged inputs reuse the cached root");
        std::fs::write(h.join("etc/profile"), "PS1=changed\n").unwrap();
        let rebuilt = build_base(state.path(), h).unwrap();
        assert_ne!(rebuilt.root, base.root);
        assert_eq!(std::fs::read_to_string(rebuilt.root.join("etc/profile")).unwrap(), "PS1=changed\n");
    }
}
