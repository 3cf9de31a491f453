//! Content digests (`sha256:<hex>`) and readers that hash what passes through
//! them, so a blob is checked against its digest before it becomes a layer.

use std::cell::RefCell;
use std::io::Read;
use std::rc::Rc;

use sha2::{Digest as _, Sha256};

use super::StoreError;

/// A validated `sha256:<64 hex>` digest (the only algorithm OCI images use in practice).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest(String);

impl Digest {
    /// Parses `sha256:<64 lowercase hex>`; anything else (other algorithms, path characters) is refused.
    pub fn parse(text: &str) -> Result<Digest, StoreError> {
        let hex = text.strip_prefix("sha256:").ok_or_else(|| StoreError::BadDigest(text.to_owned()))?;
        if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
            return Err(StoreError::BadDigest(text.to_owned()));
        }
        Ok(Digest(text.to_owned()))
    }

    /// The digest of `bytes`.
    pub fn of(bytes: &[u8]) -> Digest {
        Digest(format!("sha256:{}", hex::encode(Sha256::digest(bytes))))
    }

    /// The hex part: safe as a file name.
    pub fn hex(&self) -> &str {
        self.0.strip_prefix("sha256:").unwrap_or(&self.0)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for Digest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// What a [`HashingReader`] has seen so far (shared, so it stays readable after the reader has
/// been moved into a decompressor and a tar parser).
#[derive(Clone, Default)]
pub struct HashState(Rc<RefCell<(Sha256, u64)>>);

impl HashState {
    pub fn digest(&self) -> Digest {
        Digest(format!("sha256:{}", hex::encode(self.0.borrow().0.clone().finalize())))
    }
}

/// Hashes every byte read through it.
pub struct HashingReader<R> {
    inner: R,
    state: HashState,
}

impl<R: Read> HashingReader<R> {
    pub fn new(inner: R) -> (HashingReader<R>, HashState) {
        let state = HashState::default();
        (HashingReader { inner, state: state.clone() }, state)
    }
}

impl<R: Read> Read for HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        let mut state = self.state.0.borrow_mut();
        state.0.update(&buf[..n]);
        state.1 += n as u64;
        Ok(n)
    }
}

/// Fails reads past `limit` bytes (a decompression bomb stops here, not at the disk's end).
pub struct LimitedReader<R> {
    inner: R,
    left: u64,
    limit: u64,
}

impl<R: Read> LimitedReader<R> {
    pub fn new(inner: R, limit: u64) -> LimitedReader<R> {
        LimitedReader { inner, left: limit, limit }
    }
}

impl<R: Read> Read for LimitedReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.left == 0 {
            // One more byte means the stream is longer than allowed.
            let mut probe = [0u8; 1];
            return match self.inner.read(&mut probe)? {
                0 => Ok(0),
                _ => Err(std::io::Error::other(LimitExceeded(self.limit))),
            };
        }
        let max = buf.len().min(usize::try_from(self.left).unwrap_or(usize::MAX));
        let n = self.inner.read(&mut buf[..max])?;
        self.left -= n as u64;
        Ok(n)
    }
}

/// The error a [`LimitedReader`] returns (found again by [`super::extract`] to report it as such).
#[derive(Debug, thiserror::Error)]
#[error("more than {0} bytes")]
pub struct LimitExceeded(pub u64);

/// Reads a whole (small) blob, checking its digest and a size cap.
pub fn read_verified(path: &std::path::Path, digest: &Digest, max: u64) -> Result<Vec<u8>, StoreError> {
    let file = std::fs::File::open(path).map_err(|e| StoreError::io(path, e))?;
    let mut bytes = Vec::new();
    LimitedReader::new(file, max).read_to_end(&mut bytes).map_err(|e| StoreError::io(path, e))?;
    let actual = Digest::of(&bytes);
    if &actual != digest {
        return Err(StoreError::DigestMismatch { expected: digest.to_string(), actual: actual.to_string() });
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_are_validated_and_hashing_readers_see_every_byte() {
        assert!(Digest::parse("sha256:../../etc").is_err());
        assert!(Digest::parse("md5:00").is_err());
        let d = Digest::of(b"abc");
        assert_eq!(Digest::parse(d.as_str()).unwrap(), d);
        let (mut reader, state) = HashingReader::new(&b"abc"[..]);
        std::io::copy(&mut reader, &mut std::io::sink()).unwrap();
        assert_eq!(state.digest(), d);
        let mut limited = LimitedReader::new(&b"abcdef"[..], 3);
        assert!(std::io::copy(&mut limited, &mut std::io::sink()).is_err());
        let mut exact = LimitedReader::new(&b"abc"[..], 3);
        assert_eq!(std::io::copy(&mut exact, &mut std::io::sink()).unwrap(), 3);
    }
}
