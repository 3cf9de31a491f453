//! OAuth 2.0 Protected Resource Metadata (RFC 9728): the document at
//! `/.well-known/oauth-protected-resource` and its path-suffixed form for the
//! MCP endpoint, served without auth but behind the Host check.

use std::sync::Arc;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::json;

use super::{OAuth, OAuthConfigError};

const WELL_KNOWN: &str = "/.well-known/oauth-protected-resource";

/// The public metadata URL for a resource URI: well-known inserted before its path (RFC 9728 §3.1).
pub fn resource_metadata_url(audience: &str) -> Result<String, OAuthConfigError> {
    let url = url::Url::parse(audience).map_err(OAuthConfigError::BadAudience)?;
    let path = url.path().trim_end_matches('/');
    Ok(format!("{}{WELL_KNOWN}{path}", url.origin().ascii_serialization()))
}

#[derive(Clone)]
struct MetadataState {
    document: Arc<String>,
    allowed_hosts: Arc<Vec<String>>,
}

/// Routes serving the metadata: the bare well-known path, `/mcp`'s suffixed form, and the
/// audience's own path when it differs (a gateway behind a path prefix).
pub fn router(oauth: &OAuth, allowed_hosts: &[String]) -> Router {
    let config = oauth.config();
    let document = json!({
        "resource": config.audience,
        "authorization_servers": [config.issuer],
        "scopes_supported": config.advertised_scopes(),
        "bearer_methods_supported": ["header"],
        "resource_name": "sandbox-mcp",
    });
    let state = MetadataState {
        document: Arc::new(document.to_string()),
        allowed_hosts: Arc::new(allowed_hosts.iter().map(|h| h.to_ascii_lowercase()).collect()),
    };
    let mut paths = vec![WELL_KNOWN.to_string(), format!("{WELL_KNOWN}/mcp")];
    if let Ok(url) = url::Url::parse(&config.audience) {
        let path = url.path().trim_end_matches('/');
        if !path.is_empty() {
            let suffixed = format!("{WELL_KNOWN}{path}");
            if !paths.contains(&suffixed) {
                paths.push(suffixed);
            }
        }
    }
    let mut router = Router::new();
    for path in paths {
        router = router.route(&path, get(serve_metadata));
    }
    router.with_state(state)
}

async fn serve_metadata(State(state): State<MetadataState>, request: Request) -> Response {
    let host = request.headers().get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or_default();
    if !host_allowed(host, &state.allowed_hosts) {
        return (StatusCode::FORBIDDEN, "Forbidden: Host header is not allowed\n").into_response();
    }
    let mut response = (StatusCode::OK, state.document.as_str().to_owned()).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    // Public document: browser-based MCP clients fetch it cross-origin.
    headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, HeaderValue::from_static("*"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("public, max-age=300"));
    response
}

/// Same rule as the MCP endpoint: empty list = no check; else the host (port ignored unless listed) must match.
fn host_allowed(host: &str, allowed: &[String]) -> bool {
    if allowed.is_empty() {
        return true;
    }
    let host = host.to_ascii_lowercase();
    let name = match host.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or_default().to_string(),
        None => host.rsplit_once(':').map_or(host.clone(), |(name, _)| name.to_string()),
    };
    allowed.iter().any(|a| *a == host || *a == name || a.trim_matches(|c| c == '[' || c == ']') == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_url_inserts_well_known() {
        assert_eq!(
            resource_metadata_url("https://mcp.example.com/mcp").ok().as_deref(),
            Some("https://mcp.example.com/.well-known/oauth-protected-resource/mcp")
        );
        assert_eq!(
            resource_metadata_url("https://mcp.example.com").ok().as_deref(),
            Some("https://mcp.example.com/.well-known/oauth-protected-resource")
        );
    }

    #[test]
    fn host_check() {
        let allowed = vec!["localhost".to_string(), "127.0.0.1".to_string(), "::1".to_string()];
        assert!(host_allowed("127.0.0.1:8080", &allowed));
        assert!(host_allowed("LOCALHOST", &allowed));
        assert!(host_allowed("[::1]:80", &allowed));
        assert!(!host_allowed("evil.example:8080", &allowed));
        assert!(!host_allowed("", &allowed));
        assert!(host_allowed("anything", &[]));
    }
}
