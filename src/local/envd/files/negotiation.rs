//! What a `/files` request negotiates besides the path, as E2B's envd
//! decides it: a byte range of a download (Go's `http.ServeContent`), a gzip
//! request body (`Content-Encoding`), and a gzip response (`Accept-Encoding`).

use axum::body::Body;
use axum::http::{HeaderMap, header};
use futures_util::StreamExt;

/// What a `Range` header asks of a file of a given size.
#[derive(Debug, PartialEq, Eq)]
pub enum ByteRange {
    /// No header, or one this server answers with the whole file (several ranges).
    Whole,
    /// 206 with these bytes.
    Part { start: u64, len: u64 },
    /// 416 with `Content-Range: bytes */SIZE` (starts at or past the end).
    NoOverlap,
    /// 416: malformed.
    Invalid,
}

/// Single-range `bytes=A-B`, `bytes=A-` and `bytes=-N`, as Go's
/// `http.ServeContent` (the real envd) interprets them.
pub fn byte_range(header: Option<&str>, size: u64) -> ByteRange {
    let Some(header) = header else { return ByteRange::Whole };
    let Some(spec) = header.trim().strip_prefix("bytes=") else { return ByteRange::Invalid };
    if spec.contains(',') {
        return ByteRange::Whole;
    }
    let Some((start, end)) = spec.trim().split_once('-') else { return ByteRange::Invalid };
    let (start, end) = (start.trim(), end.trim());
    let number = |v: &str| if v.bytes().all(|b| b.is_ascii_digit()) { v.parse::<u64>().ok() } else { None };
    if start.is_empty() {
        let Some(suffix) = number(end) else { return ByteRange::Invalid };
        let suffix = suffix.min(size);
        return if suffix == 0 { ByteRange::NoOverlap } else { ByteRange::Part { start: size - suffix, len: suffix } };
    }
    let Some(start) = number(start) else { return ByteRange::Invalid };
    if start >= size {
        return ByteRange::NoOverlap;
    }
    if end.is_empty() {
        return ByteRange::Part { start, len: size - start };
    }
    match number(end) {
        Some(end) if end >= start => ByteRange::Part { start, len: end.min(size - 1) - start + 1 },
        _ => ByteRange::Invalid,
    }
}

/// A content coding negotiation this envd cannot satisfy (the 400 answer's message).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodingError {
    /// The request body's `Content-Encoding` (as sent) is neither identity nor gzip.
    #[error("Content-Encoding '{0}' is not supported by this envd; upload uncompressed or with gzip")]
    UnsupportedUpload(String),
    /// `Accept-Encoding` refuses identity and offers nothing else this envd speaks.
    #[error("no acceptable encoding found, supported: [gzip]")]
    NoneAcceptable,
}

/// Whether the request body is gzip (`Ok(false)`: none or `identity`); an
/// error names an unsupported coding.
pub fn request_is_gzip(headers: &HeaderMap) -> Result<bool, CodingError> {
    let Some(value) = headers.get(header::CONTENT_ENCODING) else { return Ok(false) };
    let raw = value.to_str().unwrap_or("?");
    match coding_and_quality(raw).0.as_str() {
        "" | "identity" => Ok(false),
        "gzip" => Ok(true),
        _ => Err(CodingError::UnsupportedUpload(raw.trim().to_owned())),
    }
}

/// Whether to gzip a download, from `Accept-Encoding` (the best coding by
/// quality; identity is acceptable unless refused with `q=0`). An error
/// means nothing acceptable is on offer.
pub fn response_is_gzip(headers: &HeaderMap) -> Result<bool, CodingError> {
    let Some(value) = headers.get(header::ACCEPT_ENCODING) else { return Ok(false) };
    let raw = value.to_str().unwrap_or("");
    if raw.trim().is_empty() {
        return Ok(false);
    }
    let mut offered: Vec<(String, f64)> = raw.split(',').map(coding_and_quality).collect();
    offered.sort_by(|a, b| b.1.total_cmp(&a.1));
    let identity_refused = offered.iter().any(|(coding, q)| coding == "identity" && *q == 0.0);
    for (coding, quality) in &offered {
        match coding.as_str() {
            _ if *quality == 0.0 => {}
            "identity" => return Ok(false),
            "*" => return Ok(identity_refused),
            "gzip" => return Ok(true),
            _ => {}
        }
    }
    if identity_refused { Err(CodingError::NoneAcceptable) } else { Ok(false) }
}

/// `gzip;q=0.5` → `("gzip", 0.5)`; names are case-insensitive, quality defaults to 1.
fn coding_and_quality(value: &str) -> (String, f64) {
    let mut parts = value.split(';');
    let coding = parts.next().unwrap_or("").trim().to_ascii_lowercase();
    let quality = parts
        .filter_map(|p| p.trim().strip_prefix("q=").or_else(|| p.trim().strip_prefix("Q=")))
        .find_map(|q| q.trim().parse::<f64>().ok())
        .unwrap_or(1.0);
    (coding, quality)
}

/// A request body with its gzip coding removed (several members are read
/// one after another, as Go's `gzip.Reader` does); corrupt data surfaces as
/// a read error of the returned body.
pub fn gunzip(body: Body) -> Body {
    let compressed =
        tokio_util::io::StreamReader::new(body.into_data_stream().map(|c| c.map_err(std::io::Error::other)));
    let mut decoder = async_compression::tokio::bufread::GzipDecoder::new(compressed);
    decoder.multiple_members(true);
    Body::from_stream(tokio_util::io::ReaderStream::new(decoder))
}

/// A response body gzip-compressed on the fly (fastest level: the transfer
/// is local, CPU is the cost).
pub fn gzip<R: tokio::io::AsyncRead + Send + 'static>(reader: R, chunk: usize) -> Body {
    let buffered = tokio::io::BufReader::with_capacity(chunk, reader);
    let encoder =
        async_compression::tokio::bufread::GzipEncoder::with_quality(buffered, async_compression::Level::Fastest);
    Body::from_stream(tokio_util::io::ReaderStream::with_capacity(encoder, chunk))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_ranges_follow_go_serve_content() {
        assert_eq!(byte_range(None, 10), ByteRange::Whole);
        assert_eq!(byte_range(Some("bytes=0-3"), 10), ByteRange::Part { start: 0, len: 4 });
        assert_eq!(byte_range(Some("bytes=8-100"), 10), ByteRange::Part { start: 8, len: 2 });
        assert_eq!(byte_range(Some("bytes=4-"), 10), ByteRange::Part { start: 4, len: 6 });
        assert_eq!(byte_range(Some("bytes=-3"), 10), ByteRange::Part { start: 7, len: 3 });
        assert_eq!(byte_range(Some("bytes=-30"), 10), ByteRange::Part { start: 0, len: 10 });
        assert_eq!(byte_range(Some("bytes=10-20"), 10), ByteRange::NoOverlap);
        assert_eq!(byte_range(Some("bytes=0-5"), 0), ByteRange::NoOverlap);
        assert_eq!(byte_range(Some("bytes=-0"), 10), ByteRange::NoOverlap);
        assert_eq!(byte_range(Some("bytes=0-1,4-5"), 10), ByteRange::Whole);
        for bad in ["bytes=5-2", "bytes=a-b", "items=0-1", "bytes=-", "bytes=+1-2", "bytes=1"] {
            assert_eq!(byte_range(Some(bad), 10), ByteRange::Invalid, "{bad}");
        }
    }

    fn headers(name: header::HeaderName, value: &str) -> HeaderMap {
        let mut map = HeaderMap::new();
        map.insert(name, value.parse().unwrap());
        map
    }

    #[test]
    fn accept_encoding_is_negotiated_like_envd() {
        let accept = |v: &str| response_is_gzip(&headers(header::ACCEPT_ENCODING, v));
        assert_eq!(response_is_gzip(&HeaderMap::new()), Ok(false));
        assert_eq!(accept("gzip"), Ok(true));
        assert_eq!(accept("gzip, deflate, br"), Ok(true)); // what httpx sends
        assert_eq!(accept("br, deflate"), Ok(false));
        assert_eq!(accept("identity;q=1, gzip;q=0.5"), Ok(false));
        assert_eq!(accept("GZIP;q=0.8, identity;q=0.2"), Ok(true));
        assert_eq!(accept("gzip;q=0"), Ok(false));
        assert_eq!(accept("*"), Ok(false));
        assert_eq!(accept("*, identity;q=0"), Ok(true));
        assert_eq!(
            accept("br, identity;q=0").unwrap_err().to_string(),
            "no acceptable encoding found, supported: [gzip]"
        );
    }

    #[test]
    fn content_encoding_is_gzip_identity_or_refused() {
        let coding = |v: &str| request_is_gzip(&headers(header::CONTENT_ENCODING, v));
        assert_eq!(request_is_gzip(&HeaderMap::new()), Ok(false));
        assert_eq!(coding("identity"), Ok(false));
        assert_eq!(coding("GZip"), Ok(true));
        assert_eq!(
            coding(" br ").unwrap_err().to_string(),
            "Content-Encoding 'br' is not supported by this envd; upload uncompressed or with gzip"
        );
    }
}
