//! Rejects a `POST /mcp` whose body is not JSON with 400 and the JSON-RPC
//! parse error (-32700), before the MCP transport sees it (which would answer
//! 415). Bodies over the configured limit pass through untouched so the
//! transport's own size error applies.

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

/// JSON-RPC 2.0 "Parse error".
pub const PARSE_ERROR: i64 = -32700;

/// Middleware state: the body limit (`server.max_body_bytes`).
#[derive(Clone, Copy)]
pub struct BodyLimit(pub usize);

/// The middleware (see the module docs).
pub async fn reject_malformed_json(State(limit): State<BodyLimit>, request: Request, next: Next) -> Response {
    if request.method() != Method::POST {
        return next.run(request).await;
    }
    let (parts, body) = request.into_parts();
    let bytes: Bytes = match axum::body::to_bytes(body, limit.0).await {
        Ok(bytes) => bytes,
        Err(_) => {
            return (StatusCode::PAYLOAD_TOO_LARGE, format!("request body larger than {} bytes\n", limit.0))
                .into_response();
        }
    };
    if let Err(err) = serde_json::from_slice::<serde::de::IgnoredAny>(&bytes) {
        let body = serde_json::json!({
            "jsonrpc": "2.0",
            "id": null,
            "error": { "code": PARSE_ERROR, "message": format!("Parse error: the body is not valid JSON ({err})") },
        });
        return (StatusCode::BAD_REQUEST, [(header::CONTENT_TYPE, "application/json")], body.to_string())
            .into_response();
    }
    next.run(Request::from_parts(parts, Body::from(bytes))).await
}
