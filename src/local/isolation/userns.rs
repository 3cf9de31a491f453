//! The sandbox's user namespace: the subordinate id range (`local.id_range`,
//! `START:COUNT` as in `/etc/subuid`) that root and every other user inside a
//! sandbox map to on the host, and the in-sandbox steps that use it: a user
//! namespace with that mapping, idmapped (read-only) mounts of the template
//! layers so their host-root-owned files appear owned by root inside, and
//! finally entering the namespace.
//!
//! The user namespace is entered after the mounts and `pivot_root`, so the
//! sandbox's mount, PID, UTS, IPC and network namespaces stay owned by the
//! host's initial user namespace: root inside has no capability over them.
//!
//! Each sandbox gets a user namespace of its own. The provider makes them
//! ahead of time in a small pool ([`UsernsPool`]) and hands one to each new
//! sandbox's agent as a descriptor, so a create does not wait for the helper
//! process a new user namespace needs; a namespace nobody took dies with the
//! provider's descriptor.

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use anyhow::Context;
use serde::{Deserialize, Serialize};

/// Ids inside a sandbox that must be mapped: root, `user` (1000) and `nobody` (65534).
const MIN_COUNT: u32 = 65536;

/// A contiguous range of host uids and gids: id `n` inside a sandbox is `host_base + n` outside.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdMap {
    pub host_base: u32,
    pub count: u32,
}

impl Default for IdMap {
    /// 1000000000:65536, inside the range systemd reserves for containers, far from login users.
    fn default() -> Self {
        IdMap { host_base: 1_000_000_000, count: MIN_COUNT }
    }
}

/// A `local.id_range` that is not a usable `START:COUNT` (the text as given).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "local.id_range must be START:COUNT with START > 0 and COUNT >= {MIN_COUNT} (as in /etc/subuid), \
     e.g. \"1000000000:65536\"; got {0:?}"
)]
pub struct IdMapParseError(pub String);

impl std::str::FromStr for IdMap {
    type Err = IdMapParseError;

    /// Parses `START:COUNT` (as in `/etc/subuid`).
    fn from_str(s: &str) -> Result<Self, IdMapParseError> {
        let bad = || IdMapParseError(s.to_owned());
        let (start, count) = s.trim().split_once(':').ok_or_else(bad)?;
        let host_base: u32 = start.trim().parse().map_err(|_| bad())?;
        let count: u32 = count.trim().parse().map_err(|_| bad())?;
        if host_base == 0 || count < MIN_COUNT || host_base.checked_add(count).is_none() {
            return Err(bad());
        }
        Ok(IdMap { host_base, count })
    }
}

impl IdMap {
    /// The host id of id `inside` of a sandbox.
    pub fn host(&self, inside: u32) -> u32 {
        self.host_base.saturating_add(inside)
    }

    /// The line written to `uid_map` / `gid_map`.
    fn map_line(&self) -> String {
        format!("0 {} {}\n", self.host_base, self.count)
    }
}

/// Creates a user namespace with `map` and returns a descriptor of it. A throw-away child is
/// cloned into the new namespace so that this (privileged, host-root) process can write its maps;
/// `proc_dir` is a procfs of the caller's PID namespace (where the child's pid means the child).
/// The child only makes async-signal-safe calls, so the caller may be multi-threaded.
pub fn create(map: &IdMap, proc_dir: &Path) -> anyhow::Result<OwnedFd> {
    let (hold_r, hold_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).context("pipe2")?;
    let (hold_fd, hold_w_fd) = (hold_r.as_raw_fd(), hold_w.as_raw_fd());
    let pid = super::agent_spawn::raw_clone(libc::CLONE_NEWUSER).context("clone(CLONE_NEWUSER)")?;
    if pid == 0 {
        // SAFETY: the child only blocks on a pipe and exits (async-signal-safe calls only).
        unsafe {
            libc::close(hold_w_fd);
            let mut byte = 0u8;
            while libc::read(hold_fd, (&mut byte as *mut u8).cast(), 1) > 0 {}
            libc::_exit(0);
        }
    }
    drop(hold_r);
    let result = (|| -> anyhow::Result<OwnedFd> {
        for file in ["uid_map", "gid_map"] {
            std::fs::write(proc_dir.join(format!("{pid}/{file}")), map.map_line())
                .with_context(|| format!("writing {file} {}", map.map_line().trim()))?;
        }
        let ns = std::fs::File::open(proc_dir.join(format!("{pid}/ns/user"))).context("opening the user namespace")?;
        Ok(OwnedFd::from(ns))
    })();
    drop(hold_w);
    let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), None);
    result
}

/// User namespaces kept ready.
const POOL_SIZE: usize = 8;

/// User namespaces with the sandboxes' id map, made ahead of time on a blocking thread.
pub struct UsernsPool {
    map: IdMap,
    ready: Mutex<Vec<OwnedFd>>,
    refilling: AtomicBool,
}

impl UsernsPool {
    pub fn new(map: IdMap) -> Arc<UsernsPool> {
        Arc::new(UsernsPool { map, ready: Mutex::new(Vec::new()), refilling: AtomicBool::new(false) })
    }

    /// A user namespace for a new sandbox: from the pool, or made now if it is empty (which also
    /// starts a refill). After a pooled one the caller refills ([`UsernsPool::refill`]) once its
    /// create no longer needs the CPU.
    pub async fn take(self: &Arc<Self>) -> anyhow::Result<OwnedFd> {
        let pooled = crate::sync::lock(&self.ready).pop();
        match pooled {
            Some(userns) => Ok(userns),
            None => {
                self.refill();
                let map = self.map;
                tokio::task::spawn_blocking(move || create(&map, Path::new("/proc"))).await.context("userns task")?
            }
        }
    }

    /// Fills the pool up to its size on a blocking thread (one refill at a time).
    pub fn refill(self: &Arc<Self>) {
        if crate::sync::lock(&self.ready).len() >= POOL_SIZE || self.refilling.swap(true, Ordering::AcqRel) {
            return;
        }
        let pool = self.clone();
        tokio::task::spawn_blocking(move || {
            while crate::sync::lock(&pool.ready).len() < POOL_SIZE {
                match create(&pool.map, Path::new("/proc")) {
                    Ok(userns) => crate::sync::lock(&pool.ready).push(userns),
                    Err(err) => {
                        tracing::warn!(err = format!("{err:#}"), "cannot prepare a sandbox user namespace");
                        break;
                    }
                }
            }
            pool.refilling.store(false, Ordering::Release);
        });
    }
}

/// `struct mount_attr` of `mount_setattr(2)`.
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

const MOUNT_ATTR_RDONLY: u64 = 0x1;
const MOUNT_ATTR_NODEV: u64 = 0x4;
const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;
const OPEN_TREE_CLONE: libc::c_uint = 1;
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;

/// `mount_setattr(2)` on a detached mount tree.
fn set_mount_attr(tree: &OwnedFd, attr: &MountAttr) -> std::io::Result<()> {
    // SAFETY: mount_setattr on a detached tree we own, with an empty NUL-terminated path and a
    // correctly sized mount_attr.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH as libc::c_uint,
            attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if ret != 0 { Err(std::io::Error::last_os_error()) } else { Ok(()) }
}

/// Mounts `source` read-only at `target` with its ids shifted by the user namespace `userns`
/// (host root's files appear owned by root inside; nothing is changed on disk).
pub fn idmapped_bind(source: &Path, target: &Path, userns: &OwnedFd) -> anyhow::Result<()> {
    let src = CString::new(source.as_os_str().as_bytes()).context("path contains a NUL byte")?;
    let dst = CString::new(target.as_os_str().as_bytes()).context("path contains a NUL byte")?;
    let empty = c"";
    // SAFETY: open_tree with a NUL-terminated path; returns a new descriptor or -1.
    let tree = unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            libc::AT_FDCWD,
            src.as_ptr(),
            OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint,
        )
    };
    if tree < 0 {
        return Err(std::io::Error::last_os_error()).with_context(|| format!("open_tree({})", source.display()));
    }
    // SAFETY: open_tree returned a descriptor that nothing else owns.
    let tree = unsafe { OwnedFd::from_raw_fd(tree as i32) };
    let attr = MountAttr {
        attr_set: MOUNT_ATTR_IDMAP | MOUNT_ATTR_RDONLY | MOUNT_ATTR_NODEV,
        attr_clr: 0,
        propagation: 0,
        userns_fd: userns.as_raw_fd() as u64,
    };
    if let Err(err) = set_mount_attr(&tree, &attr) {
        if err.raw_os_error() != Some(libc::EINVAL) {
            return Err(err).with_context(|| {
                format!(
                    "idmapped mount of {} (needs Linux >= 5.12 and a filesystem that supports idmapped mounts)",
                    source.display()
                )
            });
        }
        // The filesystem cannot be idmapped (e.g. a container's own overlayfs root): fall back
        // to a plain read-only view. The template's files then appear owned by `nobody` inside,
        // so root in the sandbox can read and run them but not change them.
        eprintln!(
            "sandbox-mcp envd: {} cannot be idmapped ({err}); it is mounted read-only without an id map",
            source.display()
        );
        let plain =
            MountAttr { attr_set: MOUNT_ATTR_RDONLY | MOUNT_ATTR_NODEV, attr_clr: 0, propagation: 0, userns_fd: 0 };
        set_mount_attr(&tree, &plain).with_context(|| format!("read-only bind of {}", source.display()))?;
    }
    // SAFETY: move_mount of our detached tree onto a NUL-terminated target path.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            empty.as_ptr(),
            libc::AT_FDCWD,
            dst.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH,
        )
    };
    if ret != 0 {
        return Err(std::io::Error::last_os_error()).with_context(|| format!("move_mount to {}", target.display()));
    }
    Ok(())
}

/// Enters the user namespace and becomes its root (host uid/gid `map.host_base`), with no
/// supplementary groups. Must be called while the process is single-threaded.
pub fn enter(userns: &OwnedFd) -> anyhow::Result<()> {
    nix::sched::setns(userns, nix::sched::CloneFlags::CLONE_NEWUSER).context("setns(user namespace)")?;
    let root_gid = nix::unistd::Gid::from_raw(0);
    let root_uid = nix::unistd::Uid::from_raw(0);
    nix::unistd::setgroups(&[]).context("setgroups([])")?;
    nix::unistd::setresgid(root_gid, root_gid, root_gid).context("setresgid(0) in the user namespace")?;
    nix::unistd::setresuid(root_uid, root_uid, root_uid).context("setresuid(0) in the user namespace")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn id_range_parses_like_subuid_and_rejects_unusable_ranges() {
        assert_eq!("100000:65536".parse::<IdMap>().unwrap(), IdMap { host_base: 100000, count: 65536 });
        for bad in ["", "0:65536", "100000", "100000:1000", "4294967000:65536", "a:b"] {
            let err = bad.parse::<IdMap>().unwrap_err().to_string();
            assert!(err.contains("local.id_range"), "{err}");
        }
        assert_eq!(
            "a:b".parse::<IdMap>().unwrap_err().to_string(),
            "local.id_range must be START:COUNT with START > 0 and COUNT >= 65536 (as in /etc/subuid), \
             e.g. \"1000000000:65536\"; got \"a:b\""
        );
        assert_eq!(IdMap::default().host(1000), 1_000_001_000);
    }
}
