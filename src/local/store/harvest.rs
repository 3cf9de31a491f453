//! What a sandbox wrote becomes a layer (a finished build step's, a snapshot's): its overlay upper
//! directory (and, for a snapshot, its private `/home` and `/root`), read while every process of
//! the sandbox is frozen, is written as a tar stream (owners mapped back from host ids to the
//! sandbox's ids, overlay whiteouts and opaque directories as OCI whiteouts, hard links kept) and
//! fed to the store's hostile-layer extractor, like any image layer: what code in the sandbox
//! wrote is never trusted. The files every sandbox start writes
//! itself (`/etc/hostname`, `/etc/hosts`, `/etc/resolv.conf`) are left out.
//!
//! The walk does not rely on the freeze alone: every directory and file is opened from its
//! parent's descriptor with `O_NOFOLLOW` and checked to be the entry just listed, so even a
//! process that ran during the walk (a sandbox thawed by an API call) could not make it read
//! anything outside the upper directory; a change seen fails the step. The walk is a loop,
//! not a recursion, bounded in depth and in entries.

use std::collections::HashMap;
use std::ffi::OsString;
use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nix::fcntl::{AtFlags, OFlag, openat};
use nix::sys::stat::{FileStat, Mode, SFlag, fstat, fstatat};
use xattr::FileExt as _;

use crate::local::store::extract::{Limits, MAPPED_IDS};
use crate::local::store::{Digest, Store, StoreError};

/// Files regenerated at every sandbox start: never part of a layer.
const REGENERATED: &[&str] = &["etc/hostname", "etc/hosts", "etc/resolv.conf"];
const OPAQUE_XATTR: &str = "trusted.overlay.opaque";
const REDIRECT_XATTR: &str = "trusted.overlay.redirect";
const METACOPY_XATTR: &str = "trusted.overlay.metacopy";
const NOBODY: u64 = 65534;
/// Deepest directory nesting a step may leave (each level holds a descriptor while it is walked).
pub const MAX_DEPTH: usize = 1024;

/// Turns `upper` (owned by host ids from `id_base` on) into a stored layer. The caller holds
/// the store's lock and has stopped every writer of `upper`.
pub fn upper_to_layer(store: &Store, upper: &Path, id_base: u32) -> Result<Digest, StoreError> {
    let (reader, writer) = std::io::pipe().map_err(|e| StoreError::io(upper, e))?;
    let parts = vec![Part::root(upper.to_path_buf())];
    let walker = std::thread::spawn(move || write_tar(&parts, id_base, writer));
    let stored = store.ingest_layer(reader, None, None);
    let walked = walker.join().map_err(|_| StoreError::Extract("the layer writer thread failed".into()))?;
    // A walk error explains a broken stream better than the extractor's view of it.
    walked?;
    stored
}

/// One directory of a sandbox's writable data and where it lands in the layer.
#[derive(Debug, Clone)]
pub struct Part {
    pub source: PathBuf,
    /// `""` for the layer's root, else a top-level directory's name (`home`).
    pub at: &'static str,
    /// Marks `at` opaque: it hides the directory of the layers below (a private `/home`).
    pub opaque: bool,
    /// Top-level names of `source` left out (only for the root part).
    pub skip: &'static [&'static str],
}

impl Part {
    /// An upper layer as the layer's root.
    pub fn root(source: PathBuf) -> Part {
        Part { source, at: "", opaque: false, skip: &[] }
    }
}

/// Writes `parts` (owned by host ids from `id_base` on) as one layer's tar stream to `out`; the
/// caller has stopped every writer of them.
pub fn write_tar(parts: &[Part], id_base: u32, out: impl Write) -> Result<(), StoreError> {
    let first = parts.first().map(|p| p.source.clone()).unwrap_or_default();
    let mut tar = tar::Builder::new(std::io::BufWriter::with_capacity(256 * 1024, out));
    tar.follow_symlinks(false);
    let mut walk = Walk { tar: &mut tar, id_base: u64::from(id_base), links: HashMap::new(), entries: 0 };
    for part in parts {
        walk.walk(part)?;
    }
    let mut out = tar.into_inner().map_err(|e| StoreError::io(&first, e))?;
    out.flush().map_err(|e| StoreError::io(&first, e))?;
    Ok(())
}

fn kind_of(stat: &FileStat) -> SFlag {
    SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT
}

fn has_xattr(file: &std::fs::File, name: &str) -> Option<Vec<u8>> {
    file.get_xattr(name).ok().flatten()
}

fn changed(rel: &Path) -> StoreError {
    StoreError::Extract(format!("/{} changed while the sandbox's files were read", rel.display()))
}

/// Opens `name` below `dir` with `O_NOFOLLOW` and checks it is the entry `stat` describes.
fn open_entry(
    dir: &OwnedFd,
    name: &OsString,
    flags: OFlag,
    stat: &FileStat,
    rel: &Path,
) -> Result<OwnedFd, StoreError> {
    let flags = flags | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_NOCTTY | OFlag::O_NONBLOCK;
    let fd = openat(dir.as_fd(), name.as_os_str(), flags, Mode::empty())
        .map_err(|e| StoreError::io(rel, std::io::Error::from(e)))?;
    let now = fstat(fd.as_fd()).map_err(|e| StoreError::io(rel, std::io::Error::from(e)))?;
    if (now.st_dev, now.st_ino) != (stat.st_dev, stat.st_ino) || kind_of(&now) != kind_of(stat) {
        return Err(changed(rel));
    }
    Ok(fd)
}

/// One directory being walked: its descriptor, its path in the layer, the names left.
struct Frame {
    dir: OwnedFd,
    rel: PathBuf,
    names: std::vec::IntoIter<OsString>,
}

struct Walk<'a, W: Write> {
    tar: &'a mut tar::Builder<W>,
    id_base: u64,
    /// First path of each (device, inode) with more than one link.
    links: HashMap<(u64, u64), PathBuf>,
    entries: u64,
}

impl<W: Write> Walk<'_, W> {
    fn map_id(&self, host: u32) -> u64 {
        let host = u64::from(host);
        if host >= self.id_base && host - self.id_base < MAPPED_IDS { host - self.id_base } else { NOBODY }
    }

    fn new_header(&self, stat: &FileStat, kind: tar::EntryType, mode: u32) -> tar::Header {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(kind);
        header.set_mode(mode);
        header.set_uid(self.map_id(stat.st_uid));
        header.set_gid(self.map_id(stat.st_gid));
        header.set_mtime(stat.st_mtime.max(0) as u64);
        header.set_size(0);
        header
    }

    fn header(
        &mut self,
        stat: &FileStat,
        kind: tar::EntryType,
        rel: &Path,
        data: impl std::io::Read,
        size: u64,
    ) -> Result<(), StoreError> {
        let mut header = self.new_header(stat, kind, stat.st_mode & 0o7777);
        header.set_size(size);
        self.tar.append_data(&mut header, rel, data).map_err(|e| StoreError::io(rel, e))
    }

    fn link(&mut self, stat: &FileStat, kind: tar::EntryType, rel: &Path, target: &Path) -> Result<(), StoreError> {
        let mut header = self.new_header(stat, kind, stat.st_mode & 0o7777);
        self.tar.append_link(&mut header, rel, target).map_err(|e| StoreError::io(rel, e))
    }

    fn header_empty(&mut self, stat: &FileStat, rel: &Path) -> Result<(), StoreError> {
        let mut header = self.new_header(stat, tar::EntryType::Regular, 0o644);
        self.tar.append_data(&mut header, rel, std::io::empty()).map_err(|e| StoreError::io(rel, e))
    }

    /// The directory `fd` (already written as `rel`): its opaque mark, and its names, sorted.
    fn open_frame(&mut self, fd: OwnedFd, stat: &FileStat, rel: PathBuf) -> Result<Frame, StoreError> {
        let file = std::fs::File::from(fd);
        if has_xattr(&file, REDIRECT_XATTR).is_some() {
            return Err(StoreError::Extract(format!(
                "/{} was renamed in the sandbox with overlay redirects on; build steps and snapshots need the \
                 overlay module's redirect_dir off",
                rel.display()
            )));
        }
        if has_xattr(&file, OPAQUE_XATTR).is_some_and(|v| v == b"y") {
            self.header_empty(stat, &rel.join(".wh..wh..opq"))?;
        }
        let fd = OwnedFd::from(file);
        let listing = fd.try_clone().map_err(|e| StoreError::io(&rel, e))?;
        let mut dir = nix::dir::Dir::from_fd(listing).map_err(|e| StoreError::io(&rel, e.into()))?;
        let mut names = Vec::new();
        for entry in dir.iter() {
            let entry = entry.map_err(|e| StoreError::io(&rel, e.into()))?;
            let name = entry.file_name().to_bytes();
            if name != b"." && name != b".." {
                names.push(OsString::from(std::ffi::OsStr::from_bytes(name)));
            }
        }
        names.sort();
        Ok(Frame { dir: fd, rel, names: names.into_iter() })
    }

    fn walk(&mut self, part: &Part) -> Result<(), StoreError> {
        let upper = part.source.as_path();
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        let root = nix::fcntl::open(upper, flags, Mode::empty()).map_err(|e| StoreError::io(upper, e.into()))?;
        let root_stat = fstat(root.as_fd()).map_err(|e| StoreError::io(upper, e.into()))?;
        // The first entry is the root itself: the stream never starts with a file's own bytes
        // (which the store would take for a compression header).
        let at = if part.at.is_empty() { PathBuf::from("./") } else { PathBuf::from(part.at) };
        self.header(&root_stat, tar::EntryType::Directory, &at, std::io::empty(), 0)?;
        if part.opaque {
            self.header_empty(&root_stat, &at.join(".wh..wh..opq"))?;
        }
        let mut first = self.open_frame(root, &root_stat, PathBuf::from(part.at))?;
        if !part.skip.is_empty() {
            let kept: Vec<OsString> = first.names.by_ref().filter(|n| !part.skip.iter().any(|s| n == s)).collect();
            first.names = kept.into_iter();
        }
        let mut stack = vec![first];
        let max_entries = Limits::default().max_entries;
        loop {
            let depth = stack.len();
            let Some(frame) = stack.last_mut() else { break };
            let Some(name) = frame.names.next() else {
                stack.pop();
                continue;
            };
            let rel = frame.rel.join(&name);
            if REGENERATED.iter().any(|r| rel == Path::new(r)) {
                continue;
            }
            self.entries += 1;
            if self.entries > max_entries {
                return Err(StoreError::TooLarge(format!("the sandbox wrote more than {max_entries} files")));
            }
            let dir = &frame.dir;
            let stat = match fstatat(dir.as_fd(), name.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW) {
                Ok(stat) => stat,
                Err(nix::errno::Errno::ENOENT) => return Err(changed(&rel)),
                Err(e) => return Err(StoreError::io(&rel, e.into())),
            };
            match kind_of(&stat) {
                SFlag::S_IFDIR => {
                    if depth >= MAX_DEPTH {
                        return Err(StoreError::Extract(format!(
                            "the sandbox wrote directories nested deeper than {MAX_DEPTH} levels (/{})",
                            frame.rel.display()
                        )));
                    }
                    let fd = open_entry(dir, &name, OFlag::O_RDONLY | OFlag::O_DIRECTORY, &stat, &rel)?;
                    self.header(&stat, tar::EntryType::Directory, &rel, std::io::empty(), 0)?;
                    let next = self.open_frame(fd, &stat, rel)?;
                    stack.push(next);
                }
                SFlag::S_IFCHR if stat.st_rdev == 0 => {
                    let name = format!(".wh.{}", name.to_string_lossy());
                    self.header_empty(&stat, &rel.with_file_name(name))?;
                }
                SFlag::S_IFLNK => {
                    let target = nix::fcntl::readlinkat(dir.as_fd(), name.as_os_str())
                        .map_err(|e| StoreError::io(&rel, e.into()))?;
                    self.link(&stat, tar::EntryType::Symlink, &rel, Path::new(&target))?;
                }
                SFlag::S_IFREG => {
                    if stat.st_nlink > 1 {
                        let key = (stat.st_dev as u64, stat.st_ino as u64);
                        if let Some(first) = self.links.get(&key).cloned() {
                            self.link(&stat, tar::EntryType::Link, &rel, &first)?;
                            continue;
                        }
                        self.links.insert(key, rel.clone());
                    }
                    let fd = open_entry(dir, &name, OFlag::O_RDONLY, &stat, &rel)?;
                    let file = std::fs::File::from(fd);
                    if has_xattr(&file, METACOPY_XATTR).is_some() {
                        return Err(StoreError::Extract(format!(
                            "/{} holds only metadata in the sandbox's upper layer (overlay metacopy on); build \
                             steps and snapshots need the overlay module's metacopy off",
                            rel.display()
                        )));
                    }
                    // What is read is what the header announces, even if the file's size were to change.
                    let announced = stat.st_size.max(0) as u64;
                    let body = std::io::Read::take(
                        std::io::Read::chain(std::io::Read::take(file, announced), std::io::repeat(0)),
                        announced,
                    );
                    self.header(&stat, tar::EntryType::Regular, &rel, body, announced)?;
                }
                SFlag::S_IFIFO => self.header(&stat, tar::EntryType::Fifo, &rel, std::io::empty(), 0)?,
                // Sockets and device nodes: nothing a layer keeps (the extractor drops devices too).
                _ => {}
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};

    use super::*;

    fn is_opaque(path: &Path) -> bool {
        xattr::get(path, OPAQUE_XATTR).ok().flatten().is_some_and(|v| v == b"y")
    }

    #[test]
    fn an_upper_layer_becomes_a_layer_with_sandbox_ids_and_oci_whiteouts() {
        if !nix::unistd::geteuid().is_root() {
            return crate::skip_gate::skip("turning an upper layer into a layer needs root (whiteouts, chown)");
        }
        let dir = tempfile::tempdir().unwrap();
        let (upper, state) = (dir.path().join("upper"), dir.path().join("state"));
        let base = 200_000u32;
        std::fs::create_dir_all(upper.join("etc")).unwrap();
        std::fs::create_dir_all(upper.join("opt/app")).unwrap();
        std::fs::create_dir_all(upper.join("var/cache")).unwrap();
        std::fs::write(upper.join("etc/hostname"), "sandbox-id\n").unwrap();
        std::fs::write(upper.join("opt/app/run.sh"), "#!/bin/sh\n").unwrap();
        std::os::unix::fs::chown(upper.join("opt/app/run.sh"), Some(base + 1000), Some(base + 1000)).unwrap();
        std::fs::set_permissions(upper.join("opt/app/run.sh"), std::fs::Permissions::from_mode(0o4755)).unwrap();
        std::fs::hard_link(upper.join("opt/app/run.sh"), upper.join("opt/app/again.sh")).unwrap();
        std::fs::write(upper.join("opt/stranger"), "x").unwrap();
        std::os::unix::fs::chown(upper.join("opt/stranger"), Some(7), Some(7)).unwrap(); // not a sandbox id
        std::os::unix::fs::symlink("/etc/shadow", upper.join("opt/link")).unwrap();
        nix::sys::stat::mknod(
            &upper.join("opt/gone"),
            nix::sys::stat::SFlag::S_IFCHR,
            nix::sys::stat::Mode::empty(),
            0,
        )
        .unwrap();
        xattr::set(upper.join("var/cache"), OPAQUE_XATTR, b"y").unwrap();
        let store = Store::open(&state, 1024).unwrap();
        let _lock = store.lock().unwrap();
        let digest = upper_to_layer(&store, &upper, base).unwrap();
        let fs = store.layout.layer_fs(&digest);
        assert!(!fs.join("etc/hostname").exists(), "regenerated files stay out");
        let run = std::fs::metadata(fs.join("opt/app/run.sh")).unwrap();
        assert_eq!((run.uid(), run.gid()), (1000, 1000), "host ids map back to the sandbox's");
        assert_eq!(run.mode() & 0o7777, 0o4755, "set-uid of a sandbox user is kept");
        assert_eq!(std::fs::metadata(fs.join("opt/app/again.sh")).unwrap().ino(), run.ino(), "hard links stay links");
        let stranger = std::fs::metadata(fs.join("opt/stranger")).unwrap();
        assert_eq!(stranger.uid(), NOBODY as u32, "an id outside the sandbox's range becomes nobody");
        assert_eq!(std::fs::read_link(fs.join("opt/link")).unwrap(), Path::new("/etc/shadow"), "kept, never followed");
        let gone = std::fs::symlink_metadata(fs.join("opt/gone")).unwrap();
        assert!(gone.file_type().is_char_device() && gone.rdev() == 0, "a whiteout stays a whiteout");
        assert!(is_opaque(&fs.join("var/cache")), "an opaque directory stays opaque");
        // The same files give the same layer (shared, stored once; `Store::layer_stack` stacks a
        // repeated layer once).
        assert_eq!(upper_to_layer(&store, &upper, base).unwrap(), digest);
    }

    #[test]
    fn an_entry_swapped_after_its_listing_is_never_followed() {
        let dir = tempfile::tempdir().unwrap();
        let upper = dir.path().join("upper");
        std::fs::create_dir_all(upper.join("a")).unwrap();
        let outside = dir.path().join("outside");
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("secret"), "host").unwrap();
        let root = nix::fcntl::open(&upper, OFlag::O_RDONLY | OFlag::O_DIRECTORY, Mode::empty()).unwrap();
        let name = OsString::from("a");
        let listed = fstatat(root.as_fd(), "a", AtFlags::AT_SYMLINK_NOFOLLOW).unwrap();
        let dir_flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY;
        assert!(open_entry(&root, &name, dir_flags, &listed, Path::new("a")).is_ok());
        // A directory swapped for a symlink to a host directory: refused, not followed.
        std::fs::rename(upper.join("a"), upper.join("kept")).unwrap(); // its inode stays taken
        std::os::unix::fs::symlink(&outside, upper.join("a")).unwrap();
        assert!(open_entry(&root, &name, dir_flags, &listed, Path::new("a")).is_err());
        // ... or for another directory: seen as a change.
        std::fs::remove_file(upper.join("a")).unwrap();
        std::fs::create_dir(upper.join("a")).unwrap();
        let err = open_entry(&root, &name, dir_flags, &listed, Path::new("a")).unwrap_err();
        assert!(err.to_string().contains("changed while"), "{err}");
        // A file swapped for a fifo is not opened as one (no hang) and not read.
        std::fs::write(upper.join("f"), "x").unwrap();
        let file = fstatat(root.as_fd(), "f", AtFlags::AT_SYMLINK_NOFOLLOW).unwrap();
        std::fs::remove_file(upper.join("f")).unwrap();
        nix::unistd::mkfifo(&upper.join("f"), Mode::from_bits_truncate(0o644)).unwrap();
        assert!(open_entry(&root, &OsString::from("f"), OFlag::O_RDONLY, &file, Path::new("f")).is_err());
    }

    #[test]
    fn a_step_nesting_directories_too_deep_fails_without_crashing() {
        let dir = tempfile::tempdir().unwrap();
        let (upper, state) = (dir.path().join("upper"), dir.path().join("state"));
        // Deeper than MAX_DEPTH, built from descriptors (the path grows past what a walk by
        // paths could open, and past what a recursive walk's stack holds in a debug build).
        std::fs::create_dir_all(&upper).unwrap();
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY;
        let mut fd = nix::fcntl::open(&upper, flags, Mode::empty()).unwrap();
        for _ in 0..(MAX_DEPTH + 600) {
            nix::sys::stat::mkdirat(fd.as_fd(), "d", Mode::from_bits_truncate(0o755)).unwrap();
            fd = openat(fd.as_fd(), "d", flags, Mode::empty()).unwrap();
        }
        let store = Store::open(&state, 1024).unwrap();
        let _lock = store.lock().unwrap();
        let err = upper_to_layer(&store, &upper, 200_000).unwrap_err();
        assert!(err.to_string().contains("nested deeper"), "{err}");
        // A metadata-only copy-up (overlay metacopy) is refused rather than stored as zeros.
        let upper2 = dir.path().join("upper2");
        std::fs::create_dir_all(&upper2).unwrap();
        std::fs::write(upper2.join("big"), "").unwrap();
        if xattr::set(upper2.join("big"), METACOPY_XATTR, b"").is_ok() {
            let err = upper_to_layer(&store, &upper2, 200_000).unwrap_err();
            assert!(err.to_string().contains("metacopy"), "{err}");
        }
    }
}
