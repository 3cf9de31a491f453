//! Safe extraction of one layer tar into an empty directory. Hostile layers
//! are expected: every parent is opened with `O_NOFOLLOW | O_DIRECTORY` from
//! the layer's root (so no entry lands outside it, through `..`, an absolute
//! path or a symlinked parent), hard links only join entries of the layer,
//! symlinks are stored as they are and never followed, device nodes are
//! dropped, set-id bits survive only for ids the sandbox's user namespace maps,
//! whiteouts become overlay whiteouts (see `whiteout`), and size and
//! entry-count limits stop decompression bombs.

use std::ffi::{OsStr, OsString};
use std::io::Read;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, openat};
use nix::sys::stat::{FileStat, Mode, SFlag, fstatat, mkdirat, mknodat};
use nix::unistd::{Gid, Uid, UnlinkatFlags, fchown, fchownat, linkat, symlinkat, unlinkat};

use super::StoreError;
use super::digest::LimitExceeded;
use super::whiteout;

/// Ids below this are mapped in every sandbox's user namespace (`local.id_range` has at least
/// 65536 ids); files of other ids are stored as `nobody` and lose their set-id bits.
pub const MAPPED_IDS: u64 = 65536;
const NOBODY: u32 = 65534;

/// Caps on one layer.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Uncompressed bytes of the tar stream.
    pub max_bytes: u64,
    /// Entries of the tar.
    pub max_entries: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { max_bytes: 64 << 30, max_entries: 1_000_000 }
    }
}

/// What an extraction produced.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Extracted {
    pub entries: u64,
    /// File bytes plus 4 KiB per entry (roughly the disk used).
    pub size_bytes: u64,
    /// Device nodes left out.
    pub dropped_devices: u64,
}

fn hostile(entry: &[u8], why: &str) -> StoreError {
    StoreError::HostileLayer(format!("{}: {why}", String::from_utf8_lossy(entry)))
}

/// The path of an entry as components below the layer's root: leading `/` and `.` are dropped
/// (tar paths are relative to the layer), `..` is refused.
pub fn components(raw: &[u8]) -> Result<Vec<OsString>, StoreError> {
    let mut out = Vec::new();
    for part in raw.split(|b| *b == b'/') {
        match part {
            b"" | b"." => {}
            b".." => return Err(hostile(raw, "the path leaves the layer (`..`)")),
            name if name.contains(&0) => return Err(hostile(raw, "NUL in the path")),
            name => out.push(OsString::from_vec(name.to_vec())),
        }
    }
    if raw.len() > 4096 {
        return Err(hostile(&raw[..64], "path longer than 4096 bytes"));
    }
    Ok(out)
}

/// Opens (creating when `create`) the directory `parts` below `root`, never through a symlink.
pub fn open_dir(root: &OwnedFd, parts: &[OsString], create: bool, entry: &[u8]) -> Result<OwnedFd, StoreError> {
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let mut dir = openat(root.as_fd(), ".", flags, Mode::empty()).map_err(|e| errno(entry, e))?;
    for part in parts {
        let next = match openat(dir.as_fd(), part.as_os_str(), flags, Mode::empty()) {
            Err(Errno::ENOENT) if create => {
                mkdirat(dir.as_fd(), part.as_os_str(), Mode::from_bits_truncate(0o755)).map_err(|e| errno(entry, e))?;
                openat(dir.as_fd(), part.as_os_str(), flags, Mode::empty())
            }
            other => other,
        };
        dir = match next {
            Ok(fd) => fd,
            Err(Errno::ELOOP | Errno::ENOTDIR) => {
                return Err(hostile(entry, "a parent is a symlink or not a directory"));
            }
            Err(Errno::ENOENT) => return Err(hostile(entry, "names an entry that is not in the layer")),
            Err(e) => return Err(errno(entry, e)),
        };
    }
    Ok(dir)
}

fn errno(entry: &[u8], e: Errno) -> StoreError {
    StoreError::Extract(format!("{}: {e}", String::from_utf8_lossy(entry)))
}

fn stat_at(dir: &OwnedFd, name: &OsStr) -> Option<FileStat> {
    fstatat(dir.as_fd(), name, AtFlags::AT_SYMLINK_NOFOLLOW).ok()
}

fn is_dir(stat: &FileStat) -> bool {
    SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT == SFlag::S_IFDIR
}

/// Removes whatever `name` is in `dir` (a directory with everything below it).
fn remove(dir: &OwnedFd, name: &OsStr, layer: &Path, rel: &[OsString], entry: &[u8]) -> Result<(), StoreError> {
    let Some(stat) = stat_at(dir, name) else { return Ok(()) };
    if is_dir(&stat) {
        // Every parent was just opened as a real directory inside the layer: the path is safe.
        let path: std::path::PathBuf = rel.iter().fold(layer.to_path_buf(), |p, c| p.join(c));
        std::fs::remove_dir_all(&path).map_err(|e| StoreError::io(&path, e))
    } else {
        unlinkat(dir.as_fd(), name, UnlinkatFlags::NoRemoveDir).map_err(|e| errno(entry, e))
    }
}

/// Owner, group and mode as the sandbox may hold them.
fn ownership(uid: u64, gid: u64, mode: u32) -> (u32, u32, u32) {
    let mut mode = mode & 0o7777;
    let uid = if uid < MAPPED_IDS { uid as u32 } else { NOBODY };
    let gid = if gid < MAPPED_IDS { gid as u32 } else { NOBODY };
    if uid == NOBODY {
        mode &= !0o4000;
    }
    if gid == NOBODY {
        mode &= !0o2000;
    }
    (uid, gid, mode)
}

/// Extracts the tar `stream` (already decompressed) into the empty directory `layer`.
pub fn extract(stream: impl Read, layer: &Path, limits: Limits) -> Result<Extracted, StoreError> {
    let limited = super::digest::LimitedReader::new(stream, limits.max_bytes);
    let mut archive = tar::Archive::new(limited);
    let root = nix::fcntl::open(layer, OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC, Mode::empty())
        .map_err(|e| StoreError::io(layer, e.into()))?;
    let mut done = Extracted::default();
    let entries = archive.entries().map_err(|e| read_error(e, limits))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| read_error(e, limits))?;
        done.entries += 1;
        if done.entries > limits.max_entries {
            return Err(StoreError::TooLarge(format!("the layer has more than {} entries", limits.max_entries)));
        }
        let raw = entry.path_bytes().into_owned();
        let mut parts = components(&raw)?;
        let Some(name) = parts.pop() else { continue }; // the layer's root itself
        let header = entry.header();
        let kind = header.entry_type();
        let mode = header.mode().map_err(|e| read_error(e, limits))?;
        let (uid, gid, mode) = ownership(
            header.uid().map_err(|e| read_error(e, limits))?,
            header.gid().map_err(|e| read_error(e, limits))?,
            mode,
        );
        let parent = open_dir(&root, &parts, true, &raw)?;
        done.size_bytes += 4096;
        if whiteout::apply(&parent, &name, &raw)? {
            continue;
        }
        let mut rel = parts.clone();
        rel.push(name.clone());
        let chown = |fd: &OwnedFd| fchown(fd.as_fd(), Some(Uid::from_raw(uid)), Some(Gid::from_raw(gid)));
        let chmod = |fd: &OwnedFd| nix::sys::stat::fchmod(fd.as_fd(), Mode::from_bits_truncate(mode));
        // The entry itself, never what a symlink names.
        let chown_entry = || {
            let (owner, group) = (Some(Uid::from_raw(uid)), Some(Gid::from_raw(gid)));
            fchownat(parent.as_fd(), name.as_os_str(), owner, group, AtFlags::AT_SYMLINK_NOFOLLOW)
        };
        use tar::EntryType as T;
        match kind {
            T::Regular | T::Continuous => {
                remove(&parent, &name, layer, &rel, &raw)?;
                let flags = OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
                let fd = openat(parent.as_fd(), name.as_os_str(), flags, Mode::from_bits_truncate(0o600))
                    .map_err(|e| errno(&raw, e))?;
                let mut file = std::fs::File::from(fd);
                done.size_bytes += std::io::copy(&mut entry, &mut file).map_err(|e| read_error(e, limits))?;
                let fd = OwnedFd::from(file);
                chown(&fd).and_then(|()| chmod(&fd)).map_err(|e| errno(&raw, e))?;
                let mtime = header_mtime(entry.header());
                let _ = nix::sys::stat::futimens(fd.as_fd(), &mtime, &mtime);
            }
            T::Directory => {
                if !stat_at(&parent, &name).is_some_and(|s| is_dir(&s)) {
                    remove(&parent, &name, layer, &rel, &raw)?;
                    mkdirat(parent.as_fd(), name.as_os_str(), Mode::from_bits_truncate(0o755))
                        .map_err(|e| errno(&raw, e))?;
                }
                let dir = open_dir(&parent_as_root(&parent)?, std::slice::from_ref(&name), false, &raw)?;
                chown(&dir).and_then(|()| chmod(&dir)).map_err(|e| errno(&raw, e))?;
            }
            T::Symlink => {
                let target = entry.link_name_bytes().ok_or_else(|| hostile(&raw, "symlink without a target"))?;
                if target.len() > 4096 || target.contains(&0) {
                    return Err(hostile(&raw, "bad symlink target"));
                }
                remove(&parent, &name, layer, &rel, &raw)?;
                symlinkat(OsStr::from_bytes(&target), parent.as_fd(), name.as_os_str()).map_err(|e| errno(&raw, e))?;
                chown_entry().map_err(|e| errno(&raw, e))?;
            }
            T::Link => {
                let target = entry.link_name_bytes().ok_or_else(|| hostile(&raw, "hard link without a target"))?;
                let mut target_parts = components(&target)?;
                let target_name = target_parts.pop().ok_or_else(|| hostile(&raw, "hard link to the layer's root"))?;
                let target_dir = open_dir(&root, &target_parts, false, &raw)?;
                match stat_at(&target_dir, &target_name) {
                    None => return Err(hostile(&raw, "hard link to an entry that is not in the layer")),
                    Some(stat) if is_dir(&stat) => return Err(hostile(&raw, "hard link to a directory")),
                    Some(_) => {}
                }
                if target_parts == parts && target_name == name {
                    continue;
                }
                remove(&parent, &name, layer, &rel, &raw)?;
                // No AT_SYMLINK_FOLLOW: a link to a symlink links the symlink itself.
                linkat(target_dir.as_fd(), target_name.as_os_str(), parent.as_fd(), name.as_os_str(), AtFlags::empty())
                    .map_err(|e| errno(&raw, e))?;
            }
            T::Fifo => {
                remove(&parent, &name, layer, &rel, &raw)?;
                mknodat(parent.as_fd(), name.as_os_str(), SFlag::S_IFIFO, Mode::from_bits_truncate(mode & 0o777), 0)
                    .map_err(|e| errno(&raw, e))?;
                chown_entry().map_err(|e| errno(&raw, e))?;
            }
            T::Char | T::Block => {
                // The sandbox's user namespace cannot use device nodes of its own (its /dev is
                // the provider's): left out, as rootless container runtimes do.
                done.dropped_devices += 1;
            }
            T::XGlobalHeader | T::XHeader | T::GNULongName | T::GNULongLink => {}
            other => return Err(hostile(&raw, &format!("unsupported tar entry type {other:?}"))),
        }
    }
    // Read to the end (padding after the end-of-archive marker), so the digests cover the whole blob.
    let mut rest = archive.into_inner();
    std::io::copy(&mut rest, &mut std::io::sink()).map_err(|e| read_error(e, limits))?;
    Ok(done)
}

/// A duplicate of a directory descriptor, used as the root of a one-level [`open_dir`].
fn parent_as_root(parent: &OwnedFd) -> Result<OwnedFd, StoreError> {
    parent.try_clone().map_err(|e| StoreError::Extract(format!("dup: {e}")))
}

fn header_mtime(header: &tar::Header) -> nix::sys::time::TimeSpec {
    let secs = header.mtime().unwrap_or(0).min(i64::MAX as u64) as i64;
    nix::sys::time::TimeSpec::new(secs, 0)
}

/// Maps a read error, telling a limit hit (a bomb) from a broken archive.
fn read_error(err: std::io::Error, limits: Limits) -> StoreError {
    let is_limit = err.get_ref().is_some_and(|inner| inner.is::<LimitExceeded>())
        || err.to_string().contains(&LimitExceeded(limits.max_bytes).to_string());
    if is_limit {
        StoreError::TooLarge(format!("the layer is larger than {} bytes uncompressed", limits.max_bytes))
    } else {
        StoreError::Extract(format!("the layer is not a readable tar: {err}"))
    }
}
