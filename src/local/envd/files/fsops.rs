//! File operations as a sandbox user, and `EntryInfo` construction.
//!
//! Permission model: envd runs as root, but every file operation runs on a
//! blocking-pool thread that temporarily switches its *filesystem* identity
//! (`setfsuid`/`setfsgid` plus per-thread supplementary groups through the
//! raw `setgroups` syscall) to the requesting user. The kernel then applies
//! exactly that user's permission checks, and files and directories created
//! are owned by the user. The identity is restored before the thread is
//! returned to the pool.

use std::io;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::connect_rpc::{Code, ConnectError};
use crate::e2b::wire::{EntryInfo, FILE_TYPE_DIRECTORY, FILE_TYPE_FILE, FILE_TYPE_SYMLINK, FILE_TYPE_UNSPECIFIED};
use crate::local::envd::users::{UserAccount, group_name, user_name};

/// Runs `op` on a blocking thread with the filesystem identity of `user`.
pub async fn run_as_user<T: Send + 'static>(
    user: &UserAccount,
    op: impl FnOnce() -> T + Send + 'static,
) -> Result<T, ConnectError> {
    let user = user.clone();
    tokio::task::spawn_blocking(move || {
        let _identity = FsIdentity::switch_to(&user).map_err(|err| {
            ConnectError::new(Code::Internal, format!("cannot take the file identity of user {}: {err}", user.uid))
        })?;
        Ok(op())
    })
    .await
    .map_err(|err| ConnectError::new(Code::Internal, format!("file operation failed: {err}")))?
}

/// The current thread's filesystem identity, restored on drop.
struct FsIdentity {
    saved: Option<(u32, u32, Vec<libc::gid_t>)>,
}

impl FsIdentity {
    /// Switches the calling thread's filesystem identity to `user`, checking every step: an
    /// operation must never run with root's rights because a switch silently failed.
    fn switch_to(user: &UserAccount) -> io::Result<FsIdentity> {
        /// An invalid id: `setfs[ug]id` with it changes nothing and returns the current id.
        const QUERY: u32 = u32::MAX;
        // Only root can switch; as non-root (tests on a host) operations run with our own rights.
        // SAFETY: plain syscalls affecting only the calling thread; `groups` outlives the calls
        // that read or write it.
        unsafe {
            if libc::geteuid() != 0 || user.uid == 0 {
                return Ok(FsIdentity { saved: None });
            }
            let count = libc::getgroups(0, std::ptr::null_mut());
            if count < 0 {
                return Err(io::Error::last_os_error());
            }
            let mut groups = vec![0 as libc::gid_t; count as usize];
            let count = libc::getgroups(groups.len() as libc::c_int, groups.as_mut_ptr());
            if count < 0 {
                return Err(io::Error::last_os_error());
            }
            groups.truncate(count as usize);
            let old_uid = libc::setfsuid(QUERY) as u32;
            let old_gid = libc::setfsgid(QUERY) as u32;
            // From here on, dropping `identity` (an early return) restores all three.
            let identity = FsIdentity { saved: Some((old_uid, old_gid, groups)) };
            if libc::syscall(libc::SYS_setgroups, user.groups.len(), user.groups.as_ptr()) != 0 {
                return Err(io::Error::last_os_error());
            }
            libc::setfsgid(user.gid);
            if libc::setfsgid(QUERY) as u32 != user.gid {
                return Err(io::Error::other(format!("setfsgid({}) did not take effect", user.gid)));
            }
            libc::setfsuid(user.uid);
            if libc::setfsuid(QUERY) as u32 != user.uid {
                return Err(io::Error::other(format!("setfsuid({}) did not take effect", user.uid)));
            }
            Ok(identity)
        }
    }
}

impl Drop for FsIdentity {
    fn drop(&mut self) {
        if let Some((uid, gid, groups)) = self.saved.take() {
            // SAFETY: plain syscalls affecting only the calling thread.
            unsafe {
                libc::setfsuid(uid);
                libc::setfsgid(gid);
                libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr());
            }
        }
    }
}

/// Resolves a request path: `~` and relative paths are relative to the user's home.
pub fn resolve_path(user: &UserAccount, raw: &str) -> Result<PathBuf, ConnectError> {
    if raw.is_empty() {
        return Err(ConnectError::new(Code::InvalidArgument, "path is empty"));
    }
    if raw.contains('\0') {
        return Err(ConnectError::new(Code::InvalidArgument, "path contains a NUL byte"));
    }
    let path = if raw == "~" {
        user.home.clone()
    } else if let Some(rest) = raw.strip_prefix("~/") {
        user.home.join(rest)
    } else if Path::new(raw).is_absolute() {
        PathBuf::from(raw)
    } else {
        user.home.join(raw)
    };
    Ok(normalize(&path))
}

/// Lexically removes `.` and `..` components (like Go's `filepath.Clean`).
fn normalize(path: &Path) -> PathBuf {
    use std::path::Component;
    let mut out = PathBuf::from("/");
    for component in path.components() {
        match component {
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(part) => out.push(part),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    out
}

/// Maps an I/O error on `path` to a Connect error.
pub fn io_error(path: &Path, err: &io::Error) -> ConnectError {
    let shown = path.display();
    let (code, message) = match err.kind() {
        io::ErrorKind::NotFound => (Code::NotFound, format!("path '{shown}' does not exist")),
        io::ErrorKind::PermissionDenied => (Code::PermissionDenied, format!("permission denied for '{shown}'")),
        io::ErrorKind::AlreadyExists => (Code::AlreadyExists, format!("'{shown}' already exists")),
        io::ErrorKind::NotADirectory => (Code::InvalidArgument, format!("a component of '{shown}' is not a directory")),
        io::ErrorKind::IsADirectory => (Code::InvalidArgument, format!("'{shown}' is a directory")),
        io::ErrorKind::StorageFull => (Code::ResourceExhausted, format!("no space left on device writing '{shown}'")),
        _ => (Code::Internal, format!("'{shown}': {err}")),
    };
    ConnectError::new(code, message)
}

/// Builds the `EntryInfo` of `path` (not following a final symlink, but describing its target).
pub fn entry_info(path: &Path) -> io::Result<EntryInfo> {
    let meta = std::fs::symlink_metadata(path)?;
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "/".into());
    let mut info = EntryInfo {
        name,
        path: path.to_string_lossy().into_owned(),
        size: meta.len() as i64,
        mode: meta.mode() & 0o777,
        permissions: go_mode_string(meta.mode()),
        owner: user_name(meta.uid()),
        group: group_name(meta.gid()),
        modified_time: modified_rfc3339(&meta),
        ..Default::default()
    };
    if meta.file_type().is_symlink() {
        info.is_symlink = true;
        match std::fs::canonicalize(path).and_then(|target| Ok((std::fs::metadata(&target)?, target))) {
            Ok((target_meta, target)) => {
                info.symlink_target = Some(target.to_string_lossy().into_owned());
                info.file_type = file_type_name(&target_meta).to_owned();
                info.mode = target_meta.permissions().mode() & 0o777;
            }
            Err(_) => {
                info.symlink_target = std::fs::read_link(path).ok().map(|t| t.to_string_lossy().into_owned());
                info.file_type = FILE_TYPE_SYMLINK.to_owned();
            }
        }
    } else {
        info.file_type = file_type_name(&meta).to_owned();
    }
    Ok(info)
}

fn file_type_name(meta: &std::fs::Metadata) -> &'static str {
    if meta.is_dir() {
        FILE_TYPE_DIRECTORY
    } else if meta.is_file() {
        FILE_TYPE_FILE
    } else {
        FILE_TYPE_UNSPECIFIED
    }
}

fn modified_rfc3339(meta: &std::fs::Metadata) -> Option<String> {
    let time = chrono::DateTime::from_timestamp(meta.mtime(), meta.mtime_nsec().clamp(0, 999_999_999) as u32)?;
    Some(time.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true))
}

/// Go's `os.FileMode.String()` for a raw `st_mode`, e.g. `-rw-r--r--`, `drwxr-xr-x`, `Lrwxrwxrwx`.
pub fn go_mode_string(mode: u32) -> String {
    let mut out = String::new();
    let kind = mode & libc::S_IFMT;
    if kind == libc::S_IFDIR {
        out.push('d');
    }
    if kind == libc::S_IFLNK {
        out.push('L');
    }
    if kind == libc::S_IFBLK || kind == libc::S_IFCHR {
        out.push('D');
    }
    if kind == libc::S_IFIFO {
        out.push('p');
    }
    if kind == libc::S_IFSOCK {
        out.push('S');
    }
    if mode & libc::S_ISUID != 0 {
        out.push('u');
    }
    if mode & libc::S_ISGID != 0 {
        out.push('g');
    }
    if kind == libc::S_IFCHR {
        out.push('c');
    }
    if mode & libc::S_ISVTX != 0 {
        out.push('t');
    }
    if out.is_empty() {
        out.push('-');
    }
    const RWX: &[u8; 9] = b"rwxrwxrwx";
    for (i, letter) in RWX.iter().enumerate() {
        out.push(if mode & (1 << (8 - i)) != 0 { *letter as char } else { '-' });
    }
    out
}

/// The entry of `path` with its user metadata.
pub fn entry(path: &Path) -> io::Result<EntryInfo> {
    let mut info = entry_info(path)?;
    info.metadata = super::xattrs::read_metadata(path);
    Ok(info)
}

/// Lists `dir` to `depth` levels (1 = direct children), in lexical walk order.
pub fn list_dir(dir: &Path, depth: u32, out: &mut Vec<EntryInfo>) -> io::Result<()> {
    let mut names: Vec<_> = std::fs::read_dir(dir)?.filter_map(|e| e.ok()).map(|e| e.file_name()).collect();
    names.sort();
    for name in names {
        let path = dir.join(&name);
        let Ok(entry) = entry(&path) else { continue };
        let descend = depth > 1 && !entry.is_symlink && entry.file_type == FILE_TYPE_DIRECTORY;
        out.push(entry);
        if descend {
            // Unreadable sub-directories are listed but not descended into.
            let _ = list_dir(&path, depth - 1, out);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mode_strings_match_go() {
        assert_eq!(go_mode_string(libc::S_IFREG | 0o644), "-rw-r--r--");
        assert_eq!(go_mode_string(libc::S_IFDIR | 0o755), "drwxr-xr-x");
        assert_eq!(go_mode_string(libc::S_IFLNK | 0o777), "Lrwxrwxrwx");
        assert_eq!(go_mode_string(libc::S_IFDIR | libc::S_ISVTX | 0o777), "dtrwxrwxrwx");
    }

    #[test]
    fn paths_resolve_against_home() {
        let user = UserAccount { name: "u".into(), uid: 1, gid: 1, home: "/home/u".into(), groups: vec![] };
        assert_eq!(resolve_path(&user, "a/b").unwrap(), PathBuf::from("/home/u/a/b"));
        assert_eq!(resolve_path(&user, "~/x").unwrap(), PathBuf::from("/home/u/x"));
        assert_eq!(resolve_path(&user, "/tmp/../etc/./x").unwrap(), PathBuf::from("/etc/x"));
        assert_eq!(resolve_path(&user, "a\0b").unwrap_err().code, Code::InvalidArgument);
        assert_eq!(resolve_path(&user, "").unwrap_err().code, Code::InvalidArgument);
    }
}
