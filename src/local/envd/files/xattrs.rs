//! User-defined file metadata: `X-Metadata-<key>` upload headers stored as
//! `user.e2b.<key>` extended attributes (as E2B envd does); `fsops::entry`
//! carries it back in `EntryInfo.metadata` (Stat/ListDir/MakeDir/Move).

use std::collections::BTreeMap;
use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use axum::http::HeaderMap;

use crate::connect_rpc::{Code, ConnectError};

/// Extended-attribute namespace of user metadata.
pub const XATTR_PREFIX: &str = "user.e2b.";
/// Upload header prefix (lowercase, as hyper delivers header names).
const HEADER_PREFIX: &str = "x-metadata-";
/// Largest metadata value read back.
const MAX_VALUE: usize = 64 * 1024;

/// Metadata from `X-Metadata-*` request headers (keys lowercased).
pub fn metadata_from_headers(headers: &HeaderMap) -> Result<BTreeMap<String, String>, ConnectError> {
    let mut metadata = BTreeMap::new();
    for (name, value) in headers {
        let Some(key) = name.as_str().strip_prefix(HEADER_PREFIX) else { continue };
        if key.is_empty() {
            return Err(ConnectError::new(Code::InvalidArgument, "empty metadata key in an X-Metadata- header"));
        }
        let value = value.to_str().map_err(|_| {
            ConnectError::new(Code::InvalidArgument, format!("metadata value of '{key}' must be printable US-ASCII"))
        })?;
        metadata.insert(key.to_ascii_lowercase(), value.to_owned());
    }
    Ok(metadata)
}

fn c_path(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

/// Stores `metadata` on `path` (run as the requesting user).
pub fn write_metadata(path: &Path, metadata: &BTreeMap<String, String>) -> io::Result<()> {
    let cpath = c_path(path)?;
    for (key, value) in metadata {
        let name =
            CString::new(format!("{XATTR_PREFIX}{key}")).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        // SAFETY: valid NUL-terminated strings and a buffer of the given length.
        let rc = unsafe { libc::setxattr(cpath.as_ptr(), name.as_ptr(), value.as_ptr().cast(), value.len(), 0) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Reads the `user.e2b.*` attributes of `path` (empty when there are none or they cannot be read).
pub fn read_metadata(path: &Path) -> BTreeMap<String, String> {
    let mut metadata = BTreeMap::new();
    let Ok(cpath) = c_path(path) else { return metadata };
    // SAFETY: a zero-length query returns the needed size.
    let size = unsafe { libc::listxattr(cpath.as_ptr(), std::ptr::null_mut(), 0) };
    if size <= 0 {
        return metadata;
    }
    let mut names = vec![0u8; size as usize];
    // SAFETY: the buffer has the length passed.
    let size = unsafe { libc::listxattr(cpath.as_ptr(), names.as_mut_ptr().cast(), names.len()) };
    if size <= 0 {
        return metadata;
    }
    names.truncate(size as usize);
    for raw in names.split(|&b| b == 0).filter(|n| !n.is_empty()) {
        let Ok(name) = std::str::from_utf8(raw) else { continue };
        let Some(key) = name.strip_prefix(XATTR_PREFIX) else { continue };
        let Ok(cname) = CString::new(raw) else { continue };
        let mut value = vec![0u8; MAX_VALUE];
        // SAFETY: the buffer has the length passed.
        let len = unsafe { libc::getxattr(cpath.as_ptr(), cname.as_ptr(), value.as_mut_ptr().cast(), value.len()) };
        if len < 0 {
            continue;
        }
        value.truncate(len as usize);
        metadata.insert(key.to_owned(), String::from_utf8_lossy(&value).into_owned());
    }
    metadata
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_become_lowercase_metadata() {
        let mut headers = HeaderMap::new();
        headers.insert("X-Metadata-Owner", "alice".parse().unwrap());
        headers.insert("content-type", "x".parse().unwrap());
        let metadata = metadata_from_headers(&headers).unwrap();
        assert_eq!(metadata, BTreeMap::from([("owner".to_string(), "alice".to_string())]));
    }

    #[test]
    fn metadata_round_trips_through_xattrs() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        std::fs::write(&file, "x").unwrap();
        let metadata = BTreeMap::from([("k".to_string(), "v 1".to_string())]);
        match write_metadata(&file, &metadata) {
            Ok(()) => assert_eq!(read_metadata(&file), metadata),
            // Some temp filesystems have no user xattrs; nothing to check there.
            Err(err) => crate::skip_gate::skip(&format!("the temp filesystem has no user xattrs: {err}")),
        }
    }
}
