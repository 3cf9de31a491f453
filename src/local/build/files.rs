//! The files of `COPY` steps: E2B's SDK asks `GET /templates/{id}/files/{hash}` whether a tar
//! of them is cached and, when not, uploads it to the link it gets. The local provider is its
//! own upload server: the link is `PUT /templates/{id}/files/{hash}?token=…` on the provider,
//! the token an HMAC of the template id and hash under a key of this provider process (so a
//! link works without the API key, as E2B's presigned URLs do, and only for that file).
//! Uploads are kept per template under `STATE/store/files/<template id>/<hash>.tar`, written
//! to the store's `tmp/` first and renamed whole, and bounded together: the uploads kept, the
//! ones under way and the store's layers fit in the store's limit.

use std::os::unix::fs::DirBuilderExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use futures_util::{Stream, StreamExt};
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;
use tokio::io::AsyncWriteExt;

use super::BuildError;
use crate::local::store::{Store, StoreError};

type HmacSha256 = Hmac<Sha256>;

/// The folder of uploads under the store.
const FILES: &str = "files";

/// Whether `hash` is what the SDKs send: 64 lowercase hex digits (a SHA-256).
pub fn valid_hash(hash: &str) -> bool {
    hash.len() == 64 && hash.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Whether `id` can name a template's folder (ids, names and aliases all qualify).
pub fn valid_template_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 64
        && !id.starts_with('.')
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

/// The upload cache.
pub struct Uploads {
    store: Store,
    key: [u8; 32],
    /// Bytes received by uploads under way.
    in_flight: AtomicU64,
}

/// Takes an upload's bytes off [`Uploads::in_flight`] when it ends, however it ends.
struct InFlight<'a> {
    counter: &'a AtomicU64,
    bytes: u64,
}

impl InFlight<'_> {
    fn add(&mut self, bytes: u64) -> u64 {
        self.bytes += bytes;
        self.counter.fetch_add(bytes, Ordering::SeqCst) + bytes
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.counter.fetch_sub(self.bytes, Ordering::SeqCst);
    }
}

impl Uploads {
    pub fn new(store: Store) -> Result<Uploads, BuildError> {
        let dir = store.layout.dir.join(FILES);
        std::fs::DirBuilder::new().mode(0o700).recursive(true).create(&dir).map_err(|e| StoreError::io(&dir, e))?;
        Ok(Uploads { store, key: rand::random(), in_flight: AtomicU64::new(0) })
    }

    fn check(template_id: &str, hash: &str) -> Result<(), BuildError> {
        if !valid_template_id(template_id) {
            return Err(BuildError::BadRequest(format!("invalid template id {template_id:?}")));
        }
        if !valid_hash(hash) {
            return Err(BuildError::BadRequest(format!("invalid files hash {hash:?} (expected 64 hex digits)")));
        }
        Ok(())
    }

    /// Where the files of `hash` for `template_id` are (whether or not they are there yet).
    pub fn path(&self, template_id: &str, hash: &str) -> Result<PathBuf, BuildError> {
        Self::check(template_id, hash)?;
        Ok(self.store.layout.dir.join(FILES).join(template_id).join(format!("{hash}.tar")))
    }

    /// Bytes of the uploads kept.
    fn kept_bytes(&self) -> u64 {
        let dir = self.store.layout.dir.join(FILES);
        let templates = std::fs::read_dir(&dir).into_iter().flatten().flatten();
        templates
            .flat_map(|t| std::fs::read_dir(t.path()).into_iter().flatten().flatten())
            .filter_map(|f| f.metadata().ok())
            .filter(|m| m.is_file())
            .map(|m| m.len())
            .sum()
    }

    /// Whether the files are cached, and the upload token for them.
    pub fn link(&self, template_id: &str, hash: &str) -> Result<(bool, String), BuildError> {
        let present = self.path(template_id, hash)?.is_file();
        Ok((present, self.token(template_id, hash)))
    }

    fn mac(&self, template_id: &str, hash: &str) -> Option<HmacSha256> {
        let mut mac = HmacSha256::new_from_slice(&self.key).ok()?;
        mac.update(template_id.as_bytes());
        mac.update(b"/");
        mac.update(hash.as_bytes());
        Some(mac)
    }

    fn token(&self, template_id: &str, hash: &str) -> String {
        self.mac(template_id, hash).map(|m| hex::encode(m.finalize().into_bytes())).unwrap_or_default()
    }

    /// Stores an upload after checking its token; a partial upload leaves nothing.
    pub async fn upload<S, E>(&self, template_id: &str, hash: &str, token: &str, body: S) -> Result<u64, BuildError>
    where
        S: Stream<Item = Result<bytes::Bytes, E>> + Unpin,
        E: std::fmt::Display,
    {
        let dest = self.path(template_id, hash)?;
        let valid = hex::decode(token)
            .ok()
            .zip(self.mac(template_id, hash))
            .is_some_and(|(given, mac)| mac.verify_slice(&given).is_ok());
        if !valid {
            return Err(BuildError::NotFound(
                "this upload link is not valid (it belongs to another file, or the provider restarted): ask for a new \
                 one with GET /templates/{templateID}/files/{hash}"
                    .into(),
            ));
        }
        let limit = self.store.limit_bytes().saturating_sub(self.store.usage_bytes()).saturating_sub(self.kept_bytes());
        let mut in_flight = InFlight { counter: &self.in_flight, bytes: 0 };
        let scratch = self.store.layout.scratch("upload")?;
        let part = scratch.path.join("files.tar");
        let mut file = tokio::fs::File::create(&part).await.map_err(|e| StoreError::io(&part, e))?;
        let mut body = body;
        let mut received = 0u64;
        while let Some(chunk) = body.next().await {
            let chunk = chunk.map_err(|e| BuildError::BadRequest(format!("the upload was cut off: {e}")))?;
            received += chunk.len() as u64;
            // This upload's bytes and those of the others under way.
            if in_flight.add(chunk.len() as u64) > limit {
                return Err(BuildError::Store(StoreError::LimitReached {
                    limit_mb: self.store.limit_bytes() >> 20,
                    used_mb: self.store.usage_bytes() >> 20,
                }));
            }
            file.write_all(&chunk).await.map_err(|e| StoreError::io(&part, e))?;
        }
        file.sync_all().await.map_err(|e| StoreError::io(&part, e))?;
        drop(file);
        if let Some(parent) = dest.parent() {
            std::fs::DirBuilder::new()
                .mode(0o700)
                .recursive(true)
                .create(parent)
                .map_err(|e| StoreError::io(parent, e))?;
        }
        std::fs::rename(&part, &dest).map_err(|e| StoreError::io(&dest, e))?;
        drop(scratch);
        drop(in_flight);
        Ok(received)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn uploads_need_their_own_token_and_land_whole() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), 1).unwrap();
        let uploads = Uploads::new(store).unwrap();
        let hash = "ab".repeat(32);
        let (present, token) = uploads.link("tmpl", &hash).unwrap();
        assert!(!present);
        let chunks = || futures_util::stream::iter(vec![Ok::<_, std::io::Error>(bytes::Bytes::from_static(b"tar"))]);
        // Another file's token, a made-up one: refused.
        let (_, other) = uploads.link("tmpl", &"cd".repeat(32)).unwrap();
        assert!(uploads.upload("tmpl", &hash, &other, chunks()).await.is_err());
        assert!(uploads.upload("tmpl", &hash, "00", chunks()).await.is_err());
        assert_eq!(uploads.upload("tmpl", &hash, &token, chunks()).await.unwrap(), 3);
        assert!(uploads.link("tmpl", &hash).unwrap().0);
        assert_eq!(std::fs::read(uploads.path("tmpl", &hash).unwrap()).unwrap(), b"tar");
        // Past the store's free space (1 MiB): refused, nothing kept.
        let big = futures_util::stream::iter(vec![Ok::<_, std::io::Error>(bytes::Bytes::from(vec![0u8; 2 << 20]))]);
        let hash2 = "ef".repeat(32);
        let token2 = uploads.link("tmpl", &hash2).unwrap().1;
        assert!(uploads.upload("tmpl", &hash2, &token2, big).await.is_err());
        assert!(!uploads.link("tmpl", &hash2).unwrap().0);
        // Kept uploads count: several uploads that each fit cannot together pass the limit.
        let part =
            || futures_util::stream::iter(vec![Ok::<_, std::io::Error>(bytes::Bytes::from(vec![0u8; 400 << 10]))]);
        let mut stored = 0;
        for i in 0..4u8 {
            let hash = format!("{:02x}", i + 0x10).repeat(32);
            let token = uploads.link("tmpl", &hash).unwrap().1;
            if uploads.upload("tmpl", &hash, &token, part()).await.is_ok() {
                stored += 1;
            }
        }
        assert_eq!(stored, 2, "two of 400 KiB fit in 1 MiB (with 3 bytes kept), a third does not");
        assert_eq!(uploads.in_flight.load(Ordering::SeqCst), 0);
        assert!(uploads.path("../x", &hash).is_err() && uploads.path("tmpl", "xyz").is_err());
    }
}
