//! Moving a layer's bytes between threads, so a layer uses two cores: a decoder thread hashes
//! and decompresses the blob while the caller's thread hashes and extracts the tar, and a
//! download task hands its chunks to the extracting thread as they arrive (a pulled layer is
//! extracted while it downloads, never written to disk whole first).

use std::io::Read;

use super::StoreError;
use super::digest::{Digest, HashingReader};

/// Decompressed chunks handed from the decoder thread to the extractor.
const CHUNK: usize = 256 * 1024;
/// Chunks in flight between the two threads (bounded: a slow extractor slows the decoder).
const IN_FLIGHT: usize = 8;

/// A reader over chunks produced elsewhere: `next` yields the next chunk, an error to return, or
/// `None` at the end of the stream.
pub struct ChunkReader<B, F> {
    next: F,
    chunk: Option<B>,
    offset: usize,
}

impl<B: AsRef<[u8]>, F: FnMut() -> Option<std::io::Result<B>>> ChunkReader<B, F> {
    pub fn new(next: F) -> ChunkReader<B, F> {
        ChunkReader { next, chunk: None, offset: 0 }
    }
}

impl<B: AsRef<[u8]>, F: FnMut() -> Option<std::io::Result<B>>> Read for ChunkReader<B, F> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        loop {
            if let Some(chunk) = &self.chunk {
                let left = &chunk.as_ref()[self.offset..];
                if !left.is_empty() {
                    let n = left.len().min(buf.len());
                    buf[..n].copy_from_slice(&left[..n]);
                    self.offset += n;
                    return Ok(n);
                }
            }
            match (self.next)() {
                None => return Ok(0),
                Some(Err(e)) => return Err(e),
                Some(Ok(chunk)) => {
                    self.chunk = Some(chunk);
                    self.offset = 0;
                }
            }
        }
    }
}

/// Reads `raw` (a compressed or plain blob) on a thread of its own, hashing it and decompressing
/// it, and runs `consume` on this thread over the decompressed stream. Returns what `consume`
/// returned and the digest of `raw` as read (`None` when the decoder failed: its error then
/// reached `consume` as a read error, or is returned when `consume` did not read it).
pub fn decode_beside<T>(
    raw: impl Read + Send,
    consume: impl FnOnce(&mut dyn Read) -> Result<T, StoreError>,
) -> Result<(T, Digest), StoreError> {
    std::thread::scope(|scope| {
        let (sender, receiver) = std::sync::mpsc::sync_channel::<std::io::Result<Vec<u8>>>(IN_FLIGHT);
        let decoder = scope.spawn(move || -> Result<Digest, StoreError> {
            let (hashed, state) = HashingReader::new(raw);
            let decoded = super::image::decompress(hashed).and_then(|mut plain| {
                loop {
                    let mut chunk = vec![0u8; CHUNK];
                    let filled = fill(&mut plain, &mut chunk)
                        .map_err(|e| StoreError::Extract(format!("the layer is not a readable tar: {e}")))?;
                    if filled == 0 {
                        return Ok(());
                    }
                    chunk.truncate(filled);
                    if sender.send(Ok(chunk)).is_err() {
                        return Ok(()); // the extractor stopped; its error is the one to report
                    }
                }
            });
            match decoded {
                Ok(()) => Ok(state.digest()),
                Err(e) => {
                    let _ = sender.send(Err(std::io::Error::other(e.to_string())));
                    Err(e)
                }
            }
        });
        let mut plain = ChunkReader::new(move || receiver.recv().ok());
        let consumed = consume(&mut plain);
        drop(plain); // a decoder still sending now sees the channel closed
        let decoded = decoder.join().map_err(|_| StoreError::Extract("the layer decoder thread failed".into()))?;
        match (consumed, decoded) {
            (Ok(value), Ok(digest)) => Ok((value, digest)),
            (Err(e), _) => Err(e),
            (Ok(_), Err(e)) => Err(e),
        }
    })
}

/// Reads into `buf` until it is full or the stream ends; returns the bytes read.
fn fill(reader: &mut dyn Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match reader.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use super::*;

    #[test]
    fn chunk_readers_join_chunks_and_pass_errors_on() {
        let mut chunks = vec![Ok(b"ab".to_vec()), Ok(Vec::new()), Ok(b"cde".to_vec())].into_iter();
        let mut reader = ChunkReader::new(move || chunks.next());
        let mut out = String::new();
        reader.read_to_string(&mut out).unwrap();
        assert_eq!(out, "abcde");
        let mut failing = vec![Ok(b"x".to_vec()), Err(std::io::Error::other("cut"))].into_iter();
        let mut reader = ChunkReader::new(move || failing.next());
        let err = reader.read_to_end(&mut Vec::new()).unwrap_err();
        assert_eq!(err.to_string(), "cut");
    }

    #[test]
    fn the_decoder_thread_hashes_the_raw_blob_and_hands_over_every_plain_byte() {
        let plain: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        std::io::Write::write_all(&mut gz, &plain).unwrap();
        let blob = gz.finish().unwrap();
        let (read, digest) = decode_beside(&blob[..], |r| {
            let mut all = Vec::new();
            r.read_to_end(&mut all).map_err(|e| StoreError::Extract(e.to_string()))?;
            Ok(all)
        })
        .unwrap();
        assert_eq!(read, plain);
        assert_eq!(digest, Digest::of(&blob));
    }

    #[test]
    fn a_corrupt_blob_fails_and_an_early_stop_does_not_hang() {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        std::io::Write::write_all(&mut gz, &vec![7u8; 4_000_000]).unwrap();
        let mut blob = gz.finish().unwrap();
        let middle = blob.len() / 2;
        blob[middle..middle + 64].fill(0xff);
        let err = decode_beside(&blob[..], |r| {
            r.read_to_end(&mut Vec::new()).map_err(|e| StoreError::Extract(e.to_string()))
        })
        .unwrap_err();
        assert!(err.to_string().contains("corrupt") || err.to_string().contains("invalid"), "{err}");
        // The consumer stops after one byte: the decoder, blocked on a full channel, must end too.
        let plain = vec![1u8; 64 * CHUNK];
        let err = decode_beside(&plain[..], |r| {
            r.read_exact(&mut [0u8; 1]).map_err(|e| StoreError::Extract(e.to_string()))?;
            Err::<(), _>(StoreError::Extract("stopped early".into()))
        })
        .unwrap_err();
        assert_eq!(err.to_string(), StoreError::Extract("stopped early".into()).to_string());
    }
}
