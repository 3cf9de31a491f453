//! Uploads written aside and put in place only once complete, so an upload
//! that fails part-way (a corrupt gzip body, a client that disconnects)
//! leaves the file it was meant to replace exactly as it was, and no
//! half-written file behind.
//!
//! The data goes to a hidden staging file beside the target
//! (`.sandbox-mcp-upload-<16 hex>`: a fixed-length name, so it fits wherever
//! the target's name does), as the requesting user. On success it is renamed
//! over the target when that keeps the target's identity (a new file, or a
//! plain writable file of this user and of the staging file's group, with one
//! link and no extended attributes: its permission bits are carried over);
//! otherwise (a symlink, a hard-linked file, another user's or group's or a
//! read-only file, one carrying `user.e2b.*` metadata or ACLs) it is copied
//! into the target in place, as envd writes, with the same permission checks.
//! If the directory does not let the user create the staging file, the upload
//! writes the target in place directly.

use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use tokio::io::AsyncWriteExt;

use super::fsops::{io_error, run_as_user};
use crate::connect_rpc::{Code, ConnectError};
use crate::local::envd::users::UserAccount;

/// An upload in progress. Dropped without [`StagedUpload::commit`], it
/// removes its staging file.
pub struct StagedUpload {
    target: PathBuf,
    /// `None` when writing the target in place.
    staging: Option<PathBuf>,
    file: tokio::fs::File,
}

impl StagedUpload {
    /// Creates missing parent directories and the staging file, as the user,
    /// after refusing targets that are directories or not regular files.
    pub async fn begin(user: &UserAccount, target: &Path) -> Result<Self, ConnectError> {
        let target = target.to_path_buf();
        let (file, staging) = run_as_user(user, {
            let target = target.clone();
            move || open_staging(&target)
        })
        .await??;
        Ok(Self { target, staging, file: tokio::fs::File::from_std(file) })
    }

    pub async fn write(&mut self, data: &[u8]) -> Result<(), ConnectError> {
        let path = self.staging.as_deref().unwrap_or(&self.target);
        self.file.write_all(data).await.map_err(|e| io_error(path, &e))
    }

    /// Puts the complete upload in place.
    pub async fn commit(mut self, user: &UserAccount) -> Result<(), ConnectError> {
        let path = self.staging.clone().unwrap_or_else(|| self.target.clone());
        self.file.flush().await.map_err(|e| io_error(&path, &e))?;
        let Some(staging) = self.staging.take() else { return Ok(()) };
        let target = self.target.clone();
        // put_in_place removes the staging file itself, as the user, unless it
        // renamed it over the target.
        match run_as_user(user, {
            let (staging, uid) = (staging.clone(), user.uid);
            move || put_in_place(&staging, &target, uid)
        })
        .await
        {
            Ok(result) => result,
            Err(err) => {
                // The blocking task itself failed: leave the cleanup to Drop.
                self.staging = Some(staging);
                Err(err)
            }
        }
    }
}

impl Drop for StagedUpload {
    /// Removes the staging file of an upload that was not committed.
    fn drop(&mut self) {
        if let Some(staging) = self.staging.take() {
            let _ = std::fs::remove_file(staging);
        }
    }
}

fn open_staging(target: &Path) -> Result<(std::fs::File, Option<PathBuf>), ConnectError> {
    if let Some(parent) = target.parent() {
        std::fs::create_dir_all(parent).map_err(|e| io_error(parent, &e))?;
    }
    match std::fs::metadata(target) {
        Ok(meta) if meta.is_dir() => {
            return Err(ConnectError::new(
                Code::InvalidArgument,
                format!("path '{}' is a directory", target.display()),
            ));
        }
        Ok(meta) if !meta.is_file() => {
            return Err(ConnectError::new(
                Code::InvalidArgument,
                format!("path '{}' exists and is not a regular file", target.display()),
            ));
        }
        _ => {}
    }
    let staging = target.with_file_name(format!(".sandbox-mcp-upload-{:016x}", rand::random::<u64>()));
    match std::fs::OpenOptions::new().write(true).create_new(true).mode(0o666).open(&staging) {
        Ok(file) => Ok((file, Some(staging))),
        Err(err) if err.kind() == std::io::ErrorKind::PermissionDenied => {
            // The directory is not writable for the user: write the target in place.
            Ok((open_in_place(target)?, None))
        }
        Err(err) => Err(io_error(&staging, &err)),
    }
}

/// Renames the staging file over the target or copies it into the target;
/// removes the staging file unless it was renamed. Runs as the user.
fn put_in_place(staging: &Path, target: &Path, uid: u32) -> Result<(), ConnectError> {
    let rename = |mode: Option<u32>| -> Result<bool, ConnectError> {
        if let Some(mode) = mode {
            let mode = std::fs::Permissions::from_mode(mode);
            std::fs::set_permissions(staging, mode).map_err(|e| io_error(staging, &e))?;
        }
        std::fs::rename(staging, target).map_err(|e| io_error(target, &e))?;
        Ok(true)
    };
    let renamed = match std::fs::symlink_metadata(target) {
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => rename(None),
        Ok(meta) if may_rename_over(&meta, staging, target, uid) => rename(Some(meta.mode() & 0o7777)),
        _ => copy_into(staging, target).map(|()| false),
    };
    if !matches!(renamed, Ok(true)) {
        let _ = std::fs::remove_file(staging);
    }
    renamed.map(|_| ())
}

/// Whether renaming over the existing `target` keeps everything that writing
/// it in place would: a plain, singly linked file whose owner may write it
/// (so a read-only file stays refused), of the staging file's group, with no
/// extended attributes (`user.e2b.*` metadata, ACLs) to lose.
fn may_rename_over(meta: &std::fs::Metadata, staging: &Path, target: &Path, uid: u32) -> bool {
    meta.file_type().is_file()
        && meta.nlink() == 1
        && meta.uid() == uid
        && (uid == 0 || meta.mode() & 0o200 != 0)
        && std::fs::symlink_metadata(staging).is_ok_and(|staged| staged.gid() == meta.gid())
        && has_no_xattrs(target)
}

/// True when `path` has no extended attributes at all (or its filesystem
/// supports none); false when they cannot be listed.
fn has_no_xattrs(path: &Path) -> bool {
    let Ok(cpath) = std::ffi::CString::new(path.as_os_str().as_bytes()) else { return false };
    // SAFETY: a valid NUL-terminated path; a zero-length query writes nothing.
    let size = unsafe { libc::llistxattr(cpath.as_ptr(), std::ptr::null_mut(), 0) };
    size == 0 || (size < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ENOTSUP))
}

/// Copies the staged data into the target in place, keeping its identity
/// (symlink, links, owner, group, extended attributes).
fn copy_into(staging: &Path, target: &Path) -> Result<(), ConnectError> {
    let mut from = std::fs::File::open(staging).map_err(|e| io_error(staging, &e))?;
    let mut to = open_in_place(target)?;
    std::io::copy(&mut from, &mut to).map_err(|e| io_error(target, &e))?;
    Ok(())
}

/// Opens (creating, truncating) the target itself, as envd writes. O_NONBLOCK:
/// opening a FIFO created in the meantime fails instead of hanging.
fn open_in_place(target: &Path) -> Result<std::fs::File, ConnectError> {
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(target)
        .map_err(|e| io_error(target, &e))
}
