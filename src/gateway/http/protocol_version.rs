//! Which protocol generation a request belongs to, from its
//! `MCP-Protocol-Version` header: legacy (2024-11-05 … 2025-11-25, with
//! sessions) or sessionless (2026-07-28 and later). One judgement for every
//! layer that asks (session limits, Redis sessions, the tools' caller).

use http::HeaderMap;
use http::request::Parts;

/// The first protocol version without sessions.
pub const STATELESS_VERSION: &str = "2026-07-28";

/// Whether a request is of the sessionless generation (2026-07-28 or later), from its headers.
pub fn is_stateless_headers(headers: &HeaderMap) -> bool {
    headers.get("mcp-protocol-version").and_then(|v| v.to_str().ok()).is_some_and(|v| is_stateless_version(v.trim()))
}

/// [`is_stateless_headers`] of a request's parts.
pub fn is_stateless_request(parts: &Parts) -> bool {
    is_stateless_headers(&parts.headers)
}

/// ISO dates compare lexically as they do chronologically.
pub fn is_stateless_version(version: &str) -> bool {
    version.len() == 10 && version >= STATELESS_VERSION
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_split_the_generations() {
        assert!(is_stateless_version("2026-07-28"));
        assert!(!is_stateless_version("2025-11-25"));
        assert!(!is_stateless_version("2024-11-05"));
        assert!(!is_stateless_version("garbage"));
        assert!(is_stateless_version("2027-01-01"));
        assert!(!is_stateless_version("2026-07-2") && !is_stateless_version(""));
        assert_eq!(STATELESS_VERSION, rmcp::model::ProtocolVersion::V_2026_07_28.as_str());
    }
}
