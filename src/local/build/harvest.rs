//! A finished build step's writes become a layer: the step sandbox's overlay upper directory,
//! read once every process of the sandbox is frozen (nothing can change it while it is read),
//! is written as a tar stream (owners mapped back from host ids to the sandbox's ids, overlay
//! whiteouts and opaque directories as OCI whiteouts, hard links kept) and fed to the store's
//! hostile-layer extractor, like any image layer: what code in the sandbox wrote is never
//! trusted. The files every sandbox start writes itself (`/etc/hostname`, `/etc/hosts`,
//! `/etc/resolv.conf`) are left out.

use std::collections::HashMap;
use std::fs::Metadata;
use std::io::{Read, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::local::store::extract::MAPPED_IDS;
use crate::local::store::{Digest, Store, StoreError};

/// Files regenerated at every sandbox start: never part of a layer.
const REGENERATED: &[&str] = &["etc/hostname", "etc/hosts", "etc/resolv.conf"];
const OPAQUE_XATTR: &str = "trusted.overlay.opaque";
const REDIRECT_XATTR: &str = "trusted.overlay.redirect";
const NOBODY: u64 = 65534;

/// Turns `upper` (owned by host ids from `id_base` on) into a stored layer. The caller holds
/// the store's lock and has stopped every writer of `upper`.
pub fn upper_to_layer(store: &Store, upper: &Path, id_base: u32) -> Result<Digest, StoreError> {
    let (reader, writer) = std::io::pipe().map_err(|e| StoreError::io(upper, e))?;
    let walk_root = upper.to_path_buf();
    let walker = std::thread::spawn(move || -> Result<(), StoreError> {
        let mut tar = tar::Builder::new(std::io::BufWriter::with_capacity(256 * 1024, writer));
        tar.follow_symlinks(false);
        let mut walk = Walk { tar: &mut tar, id_base: u64::from(id_base), links: HashMap::new() };
        // The first entry is the root itself: the stream never starts with a file's own bytes
        // (which the store would take for a compression header).
        let root_meta = std::fs::symlink_metadata(&walk_root).map_err(|e| StoreError::io(&walk_root, e))?;
        walk.header(&root_meta, tar::EntryType::Directory, Path::new("./"), std::io::empty())?;
        walk.dir(&walk_root, Path::new(""))?;
        let mut out = tar.into_inner().map_err(|e| StoreError::io(&walk_root, e))?;
        out.flush().map_err(|e| StoreError::io(&walk_root, e))?;
        Ok(())
    });
    let stored = store.ingest_layer(reader, None, None);
    let walked = walker.join().map_err(|_| StoreError::Extract("the layer writer thread failed".into()))?;
    // A walk error explains a broken stream better than the extractor's view of it.
    walked?;
    stored
}

fn is_opaque(path: &Path) -> bool {
    xattr::get(path, OPAQUE_XATTR).ok().flatten().is_some_and(|v| v == b"y")
}

struct Walk<'a, W: Write> {
    tar: &'a mut tar::Builder<W>,
    id_base: u64,
    /// First path of each (device, inode) with more than one link.
    links: HashMap<(u64, u64), PathBuf>,
}

impl<W: Write> Walk<'_, W> {
    fn map_id(&self, host: u32) -> u64 {
        let host = u64::from(host);
        if host >= self.id_base && host - self.id_base < MAPPED_IDS { host - self.id_base } else { NOBODY }
    }

    fn header(
        &mut self,
        meta: &Metadata,
        kind: tar::EntryType,
        rel: &Path,
        data: impl std::io::Read,
    ) -> Result<(), StoreError> {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(kind);
        header.set_mode(meta.mode() & 0o7777);
        header.set_uid(self.map_id(meta.uid()));
        header.set_gid(self.map_id(meta.gid()));
        header.set_mtime(meta.mtime().max(0) as u64);
        header.set_size(if kind == tar::EntryType::Regular { meta.len() } else { 0 });
        self.tar.append_data(&mut header, rel, data).map_err(|e| StoreError::io(rel, e))?;
        Ok(())
    }

    fn link(&mut self, meta: &Metadata, kind: tar::EntryType, rel: &Path, target: &Path) -> Result<(), StoreError> {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(kind);
        header.set_mode(meta.mode() & 0o7777);
        header.set_uid(self.map_id(meta.uid()));
        header.set_gid(self.map_id(meta.gid()));
        header.set_mtime(meta.mtime().max(0) as u64);
        header.set_size(0);
        self.tar.append_link(&mut header, rel, target).map_err(|e| StoreError::io(rel, e))?;
        Ok(())
    }

    fn dir(&mut self, dir: &Path, rel: &Path) -> Result<(), StoreError> {
        let mut names: Vec<_> = std::fs::read_dir(dir)
            .map_err(|e| StoreError::io(dir, e))?
            .map(|e| e.map(|e| e.file_name()))
            .collect::<Result<_, _>>()
            .map_err(|e| StoreError::io(dir, e))?;
        names.sort();
        for name in names {
            let path = dir.join(&name);
            let rel = rel.join(&name);
            if REGENERATED.iter().any(|r| rel == Path::new(r)) {
                continue;
            }
            let meta = std::fs::symlink_metadata(&path).map_err(|e| StoreError::io(&path, e))?;
            let kind = meta.file_type();
            if kind.is_dir() {
                if xattr::get(&path, REDIRECT_XATTR).ok().flatten().is_some() {
                    return Err(StoreError::Extract(format!(
                        "/{} was renamed by the step with overlay redirects on; build steps need the overlay module's \
                         redirect_dir off",
                        rel.display()
                    )));
                }
                self.header(&meta, tar::EntryType::Directory, &rel, std::io::empty())?;
                if is_opaque(&path) {
                    self.header_empty(&meta, &rel.join(".wh..wh..opq"))?;
                }
                self.dir(&path, &rel)?;
            } else if kind.is_char_device() && meta.rdev() == 0 {
                let name = format!(".wh.{}", name.to_string_lossy());
                self.header_empty(&meta, &rel.with_file_name(name))?;
            } else if kind.is_symlink() {
                let target = std::fs::read_link(&path).map_err(|e| StoreError::io(&path, e))?;
                self.link(&meta, tar::EntryType::Symlink, &rel, &target)?;
            } else if kind.is_file() {
                if meta.nlink() > 1 {
                    if let Some(first) = self.links.get(&(meta.dev(), meta.ino())).cloned() {
                        self.link(&meta, tar::EntryType::Link, &rel, &first)?;
                        continue;
                    }
                    self.links.insert((meta.dev(), meta.ino()), rel.clone());
                }
                let file = std::fs::OpenOptions::new()
                    .read(true)
                    .custom_flags(libc::O_NOFOLLOW)
                    .open(&path)
                    .map_err(|e| StoreError::io(&path, e))?;
                // What is read is what the header announces, even if the file's size were to change.
                let announced = meta.len();
                let body =
                    std::io::Read::take(std::io::Read::chain(file.take(announced), std::io::repeat(0)), announced);
                self.header(&meta, tar::EntryType::Regular, &rel, body)?;
            } else if kind.is_fifo() {
                self.header(&meta, tar::EntryType::Fifo, &rel, std::io::empty())?;
            }
            // Sockets and device nodes: nothing a layer keeps (the extractor drops devices too).
        }
        Ok(())
    }

    fn header_empty(&mut self, meta: &Metadata, rel: &Path) -> Result<(), StoreError> {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(tar::EntryType::Regular);
        header.set_mode(0o644);
        header.set_uid(self.map_id(meta.uid()));
        header.set_gid(self.map_id(meta.gid()));
        header.set_mtime(meta.mtime().max(0) as u64);
        header.set_size(0);
        self.tar.append_data(&mut header, rel, std::io::empty()).map_err(|e| StoreError::io(rel, e))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

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
        // The same upper gives the same layer (shared, stored once).
        assert_eq!(upper_to_layer(&store, &upper, base).unwrap(), digest);
    }
}
