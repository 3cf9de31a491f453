//! Checks a `POST /mcp` body before the MCP transport sees it: a body that is
//! not JSON gets 400 with the JSON-RPC parse error (-32700) (the transport
//! would answer 415), one over `server.max_body_bytes` gets 413, and a request
//! reusing the id of a request still in progress in the same legacy session
//! gets 400 with -32600 (the transport would route both answers to one stream
//! and leave the other caller waiting forever).

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

/// JSON-RPC 2.0 "Parse error".
pub const PARSE_ERROR: i64 = -32700;

/// JSON-RPC 2.0 "Invalid Request".
pub const INVALID_REQUEST: i64 = -32600;

/// Middleware state.
#[derive(Clone)]
pub struct RequestGuard {
    /// `server.max_body_bytes`.
    pub body_limit: usize,
    /// (session id, request id as JSON text) of every request whose response is still open.
    in_flight: Arc<Mutex<HashSet<(String, String)>>>,
}

impl RequestGuard {
    /// A guard with `body_limit` and no request in flight.
    pub fn new(body_limit: usize) -> Self {
        RequestGuard { body_limit, in_flight: Arc::default() }
    }

    /// Records `key` as in flight; `None` when it already is.
    fn enter(&self, key: (String, String)) -> Option<InFlightId> {
        let mut in_flight = crate::sync::lock(&self.in_flight);
        in_flight.insert(key.clone()).then(|| InFlightId { in_flight: Arc::clone(&self.in_flight), key })
    }
}

/// Removes its request id from the in-flight set when the response body ends or is dropped.
struct InFlightId {
    in_flight: Arc<Mutex<HashSet<(String, String)>>>,
    key: (String, String),
}

impl Drop for InFlightId {
    fn drop(&mut self) {
        crate::sync::lock(&self.in_flight).remove(&self.key);
    }
}

/// What the guard reads of a JSON-RPC message: only whether it has a `method` and its `id`; the
/// rest (`params`, possibly large) is skipped without being built.
#[derive(serde::Deserialize)]
struct Envelope {
    #[serde(default)]
    method: Option<serde::de::IgnoredAny>,
    #[serde(default)]
    id: Option<serde_json::Value>,
}

/// The body checked once: valid JSON, and the id if it is a single request (an object with
/// `method` and `id`); batches and other shapes are passed on for the transport to judge.
fn parse(bytes: &[u8]) -> Result<Option<serde_json::Value>, serde_json::Error> {
    match serde_json::from_slice::<Envelope>(bytes) {
        Ok(Envelope { method: Some(_), id }) => Ok(id),
        Ok(_) => Ok(None),
        Err(_) => serde_json::from_slice::<serde::de::IgnoredAny>(bytes).map(|_| None),
    }
}

/// The middleware (see the module docs).
pub async fn check_request(State(guard): State<RequestGuard>, request: Request, next: Next) -> Response {
    if request.method() != Method::POST {
        return next.run(request).await;
    }
    let (parts, body) = request.into_parts();
    let bytes: Bytes = match axum::body::to_bytes(body, guard.body_limit).await {
        Ok(bytes) => bytes,
        Err(_) => {
            return (StatusCode::PAYLOAD_TOO_LARGE, format!("request body larger than {} bytes\n", guard.body_limit))
                .into_response();
        }
    };
    let request_id = match parse(&bytes) {
        Ok(id) => id,
        Err(err) => {
            let message = format!("Parse error: the body is not valid JSON ({err})");
            return json_rpc_error(serde_json::Value::Null, PARSE_ERROR, message);
        }
    };
    let session = parts.headers.get("mcp-session-id").and_then(|v| v.to_str().ok()).map(str::to_owned);
    let in_flight = match (session, request_id) {
        (Some(session), Some(id)) => match guard.enter((session, id.to_string())) {
            Some(in_flight) => Some(in_flight),
            None => {
                let message = format!(
                    "Invalid Request: id {id} is already used by a request still in progress in this session; \
                     give every request its own id"
                );
                return json_rpc_error(id, INVALID_REQUEST, message);
            }
        },
        _ => None,
    };
    let response = next.run(Request::from_parts(parts, Body::from(bytes))).await;
    match in_flight {
        Some(in_flight) => crate::guarded_body::guard_response(response, in_flight),
        None => response,
    }
}

fn json_rpc_error(id: serde_json::Value, code: i64, message: String) -> Response {
    let body = serde_json::json!({ "jsonrpc": "2.0", "id": id, "error": { "code": code, "message": message } });
    (StatusCode::BAD_REQUEST, [(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
}
