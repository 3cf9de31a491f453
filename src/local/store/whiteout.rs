//! OCI whiteouts as overlayfs understands them: `.wh.NAME` becomes a 0/0
//! character device `NAME` (hiding `NAME` of the layers below) and
//! `.wh..wh..opq` makes its directory opaque (`trusted.overlay.opaque=y`),
//! which is what the provider's overlay mounts (made as host root) read.

use std::ffi::{OsStr, OsString};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;

use nix::fcntl::AtFlags;
use nix::sys::stat::{Mode, SFlag, fstatat, mknodat};

use super::StoreError;

const PREFIX: &[u8] = b".wh.";
const OPAQUE: &[u8] = b".wh..wh..opq";
/// The overlay xattr of an opaque directory.
pub const OPAQUE_XATTR: &str = "trusted.overlay.opaque";

/// Applies `name` in `parent` if it is a whiteout; returns whether it was one (and so handled).
pub fn apply(parent: &OwnedFd, name: &OsString, entry: &[u8]) -> Result<bool, StoreError> {
    let bytes = name.as_bytes();
    if bytes == OPAQUE {
        let file = std::fs::File::from(parent.try_clone().map_err(|e| StoreError::Extract(format!("dup: {e}")))?);
        xattr::FileExt::set_xattr(&file, OPAQUE_XATTR, b"y").map_err(|e| {
            StoreError::Extract(format!(
                "{}: cannot mark the directory opaque ({e}; the store needs root and a filesystem with trusted xattrs)",
                String::from_utf8_lossy(entry)
            ))
        })?;
        return Ok(true);
    }
    let Some(hidden) = bytes.strip_prefix(PREFIX) else { return Ok(false) };
    if hidden.starts_with(b".wh.") {
        return Ok(true); // aufs bookkeeping (.wh..wh.plnk and the like): no meaning in OCI
    }
    if hidden.is_empty() || hidden == b"." || hidden == b".." {
        return Err(StoreError::HostileLayer(format!("{}: bad whiteout", String::from_utf8_lossy(entry))));
    }
    let hidden = OsStr::from_bytes(hidden);
    // An entry of this very layer is not hidden by a whiteout beside it (OCI: whiteouts apply to
    // the layers below).
    if fstatat(parent.as_fd(), hidden, AtFlags::AT_SYMLINK_NOFOLLOW).is_ok() {
        return Ok(true);
    }
    mknodat(parent.as_fd(), hidden, SFlag::S_IFCHR, Mode::empty(), 0).map_err(|e| {
        StoreError::Extract(format!(
            "{}: cannot make an overlay whiteout ({e}; the store needs root)",
            String::from_utf8_lossy(entry)
        ))
    })?;
    Ok(true)
}
