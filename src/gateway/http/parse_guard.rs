//! Checks a `POST /mcp` body before the MCP transport sees it: a body that is
//! not JSON gets 400 with the JSON-RPC parse error (-32700) (the transport
//! would answer 415), one over `server.max_body_bytes` gets 413, and a request
//! reusing the id of a request still in progress in the same legacy session
//! gets 400 with -32600 (the transport would route both answers to one stream
//! and leave the other caller waiting forever). The same single pass marks a
//! request whose `params._meta` has a `progressToken` ([`AsksProgress`]).

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

/// A request extension set on a POST whose message carries `params._meta.progressToken`: its
/// client wants progress as it happens (`legacy_json` then leaves the answer a stream).
#[derive(Clone, Copy, Debug)]
pub struct AsksProgress;

/// What the guard reads of a JSON-RPC message: whether it has a `method`, its `id`, and whether
/// `params._meta` holds a `progressToken`; the rest (`params`, possibly large) is skipped without
/// being built.
#[derive(serde::Deserialize)]
struct Envelope {
    #[serde(default)]
    method: Option<serde::de::IgnoredAny>,
    #[serde(default)]
    id: Option<serde_json::Value>,
    #[serde(default)]
    params: HasProgressToken,
}

/// What [`parse`] found in a valid body.
#[derive(Debug, Default, PartialEq)]
struct Checked {
    /// The id of a single request (an object with `method` and `id`).
    request_id: Option<serde_json::Value>,
    asks_progress: bool,
}

/// The body checked once: valid JSON, the id if it is a single request and whether it asks for
/// progress; batches and other shapes are passed on for the transport to judge.
fn parse(bytes: &[u8]) -> Result<Checked, serde_json::Error> {
    match serde_json::from_slice::<Envelope>(bytes) {
        Ok(Envelope { method: Some(_), id, params }) => Ok(Checked { request_id: id, asks_progress: params.0 }),
        Ok(Envelope { params, .. }) => Ok(Checked { request_id: None, asks_progress: params.0 }),
        Err(_) => serde_json::from_slice::<serde::de::IgnoredAny>(bytes).map(|_| Checked::default()),
    }
}

/// Whether `params._meta` holds a `progressToken`. Any other shape is false, never an error: the
/// guard judges only JSON syntax. Values are skipped unread.
#[derive(Default)]
struct HasProgressToken(bool);

impl<'de> serde::Deserialize<'de> for HasProgressToken {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        serde::de::DeserializeSeed::deserialize(Look::Params, deserializer).map(HasProgressToken)
    }
}

/// Where [`HasProgressToken`] is looking: in `params` for `_meta`, in `_meta` for `progressToken`.
#[derive(Clone, Copy)]
enum Look {
    Params,
    Meta,
}

impl<'de> serde::de::DeserializeSeed<'de> for Look {
    type Value = bool;

    fn deserialize<D: serde::Deserializer<'de>>(self, deserializer: D) -> Result<bool, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for Look {
    type Value = bool;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<bool, A::Error> {
        let mut found = false;
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            match (self, key.as_ref()) {
                (Look::Params, "_meta") => found |= map.next_value_seed(Look::Meta)?,
                (Look::Meta, "progressToken") => {
                    map.next_value::<serde::de::IgnoredAny>()?;
                    found = true;
                }
                _ => {
                    map.next_value::<serde::de::IgnoredAny>()?;
                }
            }
        }
        Ok(found)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<bool, A::Error> {
        while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
        Ok(false)
    }

    fn visit_bool<E>(self, _: bool) -> Result<bool, E> {
        Ok(false)
    }

    fn visit_i64<E>(self, _: i64) -> Result<bool, E> {
        Ok(false)
    }

    fn visit_u64<E>(self, _: u64) -> Result<bool, E> {
        Ok(false)
    }

    fn visit_f64<E>(self, _: f64) -> Result<bool, E> {
        Ok(false)
    }

    fn visit_str<E>(self, _: &str) -> Result<bool, E> {
        Ok(false)
    }

    fn visit_unit<E>(self) -> Result<bool, E> {
        Ok(false)
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
    let Checked { request_id, asks_progress } = match parse(&bytes) {
        Ok(checked) => checked,
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
    let mut request = Request::from_parts(parts, Body::from(bytes));
    if asks_progress {
        request.extensions_mut().insert(AsksProgress);
    }
    let response = next.run(request).await;
    match in_flight {
        Some(in_flight) => crate::guarded_body::guard_response(response, in_flight),
        None => response,
    }
}

fn json_rpc_error(id: serde_json::Value, code: i64, message: String) -> Response {
    let body = serde_json::json!({ "jsonrpc": "2.0", "id": id, "error": { "code": code, "message": message } });
    (StatusCode::BAD_REQUEST, [(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_id_and_a_progress_token_are_read_and_other_shapes_tolerated() {
        let checked = |body: &str| parse(body.as_bytes()).unwrap();
        let call =
            r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"x","arguments":{"progressToken":1}}}"#;
        assert_eq!(checked(call), Checked { request_id: Some(json!(7)), asks_progress: false });
        let asks =
            r#"{"jsonrpc":"2.0","id":"a","method":"tools/call","params":{"_meta":{"x":[1],"progressToken":"p"}}}"#;
        assert_eq!(checked(asks), Checked { request_id: Some(json!("a")), asks_progress: true });
        let nested = r#"{"id":1,"method":"m","params":{"arguments":{"_meta":{"progressToken":1}}}}"#;
        assert!(!checked(nested).asks_progress, "only params._meta counts");
        for odd in [
            r#"{"id":1,"method":"m","params":[{"_meta":{"progressToken":1}}]}"#,
            r#"{"id":1,"method":"m","params":{"_meta":"progressToken"}}"#,
            r#"{"id":1,"method":"m","params":null}"#,
            r#"{"id":1,"method":"m","params":{"_meta":[true, 1.5, -2, null]}}"#,
        ] {
            assert_eq!(checked(odd), Checked { request_id: Some(json!(1)), asks_progress: false }, "{odd}");
        }
        assert_eq!(checked(r#"[{"id":1,"method":"m"}]"#), Checked::default());
        assert_eq!(checked(r#"{"id":1,"result":{}}"#), Checked::default());
        assert!(parse(br#"{"id":1,"method":"m","params":{"_meta":{"progressToken":}}}"#).is_err());
    }
}
