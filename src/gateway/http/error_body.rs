//! Refusals every client can read: a 401, 403, 404 (an unknown or ended session), 413, 415 or 429
//! answered on /mcp with a plain-text (or empty) body is rewritten to a JSON-RPC error object sent as
//! `application/json` (id `null`: the request was refused before its id was read), keeping the
//! status and every other header (`WWW-Authenticate` included). The MCP SDKs surface such a body's
//! `error.message` to the user instead of a bare "Server returned an error response". Bodies that are
//! JSON already (the session-limit 429, OAuth refusals) pass unchanged.

use axum::body::{Body, to_bytes};
use axum::extract::Request;
use axum::middleware::Next;
use axum::response::Response;
use http::{HeaderValue, StatusCode, header};

// JSON-RPC "Invalid Request": the HTTP request was refused as a whole.
use super::parse_guard::INVALID_REQUEST;

/// The refusals rewritten.
const REWRITTEN: [StatusCode; 6] = [
    StatusCode::UNAUTHORIZED,
    StatusCode::FORBIDDEN,
    StatusCode::NOT_FOUND,
    StatusCode::PAYLOAD_TOO_LARGE,
    StatusCode::UNSUPPORTED_MEDIA_TYPE,
    StatusCode::TOO_MANY_REQUESTS,
];
/// A refusal's text is a sentence; anything longer is not read past this.
const MAX_TEXT_BYTES: usize = 4096;

/// The middleware (see the module docs).
pub async fn json_refusals(request: Request, next: Next) -> Response {
    let response = next.run(request).await;
    let status = response.status();
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim_start().to_ascii_lowercase().starts_with("application/json"));
    if !REWRITTEN.contains(&status) || is_json {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    let text = match to_bytes(body, MAX_TEXT_BYTES).await {
        Ok(bytes) => String::from_utf8_lossy(&bytes).trim().to_string(),
        Err(_) => String::new(),
    };
    let body = refusal_body(status, &text);
    parts.headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, Body::from(body))
}

/// The JSON-RPC error document for a refusal: the server's sentence, or the status's reason.
fn refusal_body(status: StatusCode, text: &str) -> String {
    let reason = status.canonical_reason().unwrap_or("refused");
    let message = if text.is_empty() {
        format!("HTTP {}: {reason}", status.as_u16())
    } else {
        format!("HTTP {}: {text}", status.as_u16())
    };
    let error = serde_json::json!({"code": INVALID_REQUEST, "message": message, "data": {"status": status.as_u16()}});
    serde_json::json!({"jsonrpc": "2.0", "id": null, "error": error}).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::Router;
    use axum::routing::post;
    use tower::ServiceExt;

    async fn answer(app: Router) -> (StatusCode, http::HeaderMap, serde_json::Value) {
        let request = Request::post("/").body(Body::empty()).unwrap();
        let response = app.oneshot(request).await.unwrap();
        let (parts, body) = response.into_parts();
        let bytes = to_bytes(body, 1 << 16).await.unwrap();
        (parts.status, parts.headers, serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null))
    }

    #[tokio::test]
    async fn a_text_refusal_becomes_a_json_rpc_error_keeping_its_headers() {
        let refuse = || async {
            (StatusCode::UNAUTHORIZED, [(header::WWW_AUTHENTICATE, "Bearer realm=\"x\"")], "invalid bearer token\n")
        };
        let app = Router::new().route("/", post(refuse)).layer(axum::middleware::from_fn(json_refusals));
        let (status, headers, body) = answer(app).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        assert_eq!(headers[header::CONTENT_TYPE], "application/json");
        assert_eq!(headers[header::WWW_AUTHENTICATE], "Bearer realm=\"x\"");
        assert_eq!(body["error"]["message"], "HTTP 401: invalid bearer token");
        assert_eq!(body["id"], serde_json::Value::Null);
    }

    #[tokio::test]
    async fn json_bodies_and_other_statuses_pass_unchanged() {
        let json = || async { (StatusCode::TOO_MANY_REQUESTS, axum::Json(serde_json::json!({"mine": 1}))) };
        let app = Router::new().route("/", post(json)).layer(axum::middleware::from_fn(json_refusals));
        assert_eq!(answer(app).await.2, serde_json::json!({"mine": 1}));
        let bad = || async { (StatusCode::BAD_REQUEST, "plain") };
        let app = Router::new().route("/", post(bad)).layer(axum::middleware::from_fn(json_refusals));
        let (status, headers, _) = answer(app).await;
        assert_eq!(
            (status, headers[header::CONTENT_TYPE].to_str().unwrap()),
            (StatusCode::BAD_REQUEST, "text/plain; charset=utf-8")
        );
    }
}
