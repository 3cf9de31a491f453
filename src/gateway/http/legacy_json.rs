//! Plain `application/json` answers for quick legacy (2025-11-25, session-based) requests.
//!
//! rmcp answers every POST of a legacy session with an SSE stream (a priming event, then the
//! response), even when the result is ready at once. The 2025-11-25 streamable HTTP transport lets
//! the server answer either way, and a JSON body costs a client less than an SSE parser. This layer
//! reads such a stream for up to `server.legacy_json_window_ms`: when the stream ends within it
//! having carried only the JSON-RPC response (one `data:` event; priming events with empty data and
//! comments skipped), the answer is that JSON as `application/json` with the same status and every
//! other header (`Mcp-Session-Id` included). Anything else (a notification or request before the
//! response, a stream still open at the deadline, an event type, too many bytes) passes through as
//! SSE with the bytes already read put back in front: nothing is lost or reordered.
//!
//! Only POSTs with an `Mcp-Session-Id` that accept `application/json`, and never a request whose
//! `params._meta` carries a `progressToken` (its client wants progress as it happens, not held
//! back; `parse_guard` marks it). GET streams and stateless (2026-07-28) answers, JSON already, are
//! not touched. Off with Redis sessions: there every answer
//! keeps its SSE event id, which clients use to resume and replay a stream on another replica.

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use futures_util::StreamExt;
use http::{HeaderValue, Method, header};
use serde::Deserialize;

use super::parse_guard::AsksProgress;

/// Past this many bytes read the stream passes through (a result is at most about 1 MiB).
const MAX_BUFFERED_BYTES: usize = 2 * 1024 * 1024;

/// Middleware state: how long a stream is read before it passes through as SSE.
#[derive(Clone, Copy, Debug)]
pub struct JsonWindow(pub Duration);

/// The middleware (see the module docs).
pub async fn answer_json(State(window): State<JsonWindow>, request: Request, next: Next) -> Response {
    if !eligible(&request) {
        return next.run(request).await;
    }
    // `parse_guard` (outside this layer) read the body once and marked a request asking for progress.
    let wants_progress = request.extensions().get::<AsksProgress>().is_some();
    let response = next.run(request).await;
    if wants_progress || !is_event_stream(&response) {
        return response;
    }
    collect(response, window.0).await
}

/// A legacy POST of a session that takes JSON.
fn eligible(request: &Request) -> bool {
    request.method() == Method::POST
        && request.headers().contains_key("mcp-session-id")
        && request
            .headers()
            .get_all(header::ACCEPT)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .any(|v| v.split(',').any(|t| t.trim().to_ascii_lowercase().starts_with("application/json")))
}

fn is_event_stream(response: &Response) -> bool {
    response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim_start().to_ascii_lowercase().starts_with("text/event-stream"))
}

/// Reads the stream for up to `window`; the JSON answer, or the stream with what was read put back.
async fn collect(response: Response, window: Duration) -> Response {
    let (mut parts, body) = response.into_parts();
    let mut stream = body.into_data_stream();
    let deadline = tokio::time::Instant::now() + window;
    let mut read: Vec<Bytes> = Vec::new();
    let mut total = 0usize;
    let ended = loop {
        match tokio::time::timeout_at(deadline, stream.next()).await {
            Ok(Some(Ok(chunk))) => {
                total += chunk.len();
                read.push(chunk);
                if total > MAX_BUFFERED_BYTES {
                    break false;
                }
            }
            Ok(Some(Err(err))) => {
                // Hand the error on where it happened, after what came before it.
                tracing::debug!(error = %err, "legacy stream failed while read for a JSON answer");
                let front = futures_util::stream::iter(read.into_iter().map(Ok::<_, axum::Error>));
                let rest = futures_util::stream::once(async move { Err::<Bytes, _>(err) });
                return Response::from_parts(parts, Body::from_stream(front.chain(rest)));
            }
            Ok(None) => break true,
            Err(_) => break false,
        }
    };
    if ended && let Some(json) = sole_response(&Bytes::from(read.concat())) {
        parts.headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        parts.headers.remove(header::CONTENT_LENGTH);
        return Response::from_parts(parts, Body::from(json));
    }
    let front = futures_util::stream::iter(read.into_iter().map(Ok::<_, axum::Error>));
    Response::from_parts(parts, Body::from_stream(front.chain(stream)))
}

/// The data of the stream's only non-empty event when it is a JSON-RPC response (or error);
/// `None` for anything else (more events, a named event, a notification or request, not JSON).
/// Lines end with LF, CRLF or CR (the SSE rules); a one-line `data:` field (what rmcp sends) is a
/// slice of `stream`, not a copy, and the JSON is checked without building a document of it.
fn sole_response(stream: &Bytes) -> Option<Bytes> {
    let bytes = stream.as_ref();
    let mut found: Option<Bytes> = None;
    let mut data = EventData::None;
    let mut at = 0;
    loop {
        let (line_end, next) = match bytes[at..].iter().position(|&b| b == b'\n' || b == b'\r') {
            Some(i) if bytes[at + i] == b'\r' && bytes.get(at + i + 1) == Some(&b'\n') => (at + i, at + i + 2),
            Some(i) => (at + i, at + i + 1),
            None => (bytes.len(), bytes.len()),
        };
        let line = &bytes[at..line_end];
        if line.is_empty() {
            // A blank line (or the end of the stream) ends the event.
            if let Some(event) = data.take(stream).filter(|d| !d.is_empty())
                && found.replace(event).is_some()
            {
                return None;
            }
            if at == bytes.len() {
                break;
            }
        } else if line[0] != b':' {
            let (field, mut value) = match line.iter().position(|&b| b == b':') {
                Some(colon) => (&line[..colon], at + colon + 1),
                None => (line, line_end),
            };
            if value < line_end && bytes[value] == b' ' {
                value += 1;
            }
            match field {
                b"data" => data.push(value..line_end, bytes),
                b"event" if &bytes[value..line_end] != b"message" => return None,
                _ => {}
            }
        }
        at = next;
    }
    let json = found?;
    std::str::from_utf8(&json).ok()?;
    let message: Message = serde_json::from_slice(&json).ok()?;
    let is_response = !message.method && message.id && (message.result || message.error);
    is_response.then_some(json)
}

/// The `data` of one event being read: one line (a range of the stream), or several joined by LF.
enum EventData {
    None,
    Line(std::ops::Range<usize>),
    Lines(Vec<u8>),
}

impl EventData {
    fn push(&mut self, value: std::ops::Range<usize>, bytes: &[u8]) {
        *self = match std::mem::replace(self, EventData::None) {
            EventData::None => EventData::Line(value),
            EventData::Line(first) => EventData::Lines([&bytes[first], b"\n", &bytes[value]].concat()),
            EventData::Lines(mut lines) => {
                lines.push(b'\n');
                lines.extend_from_slice(&bytes[value]);
                EventData::Lines(lines)
            }
        };
    }

    fn take(&mut self, stream: &Bytes) -> Option<Bytes> {
        match std::mem::replace(self, EventData::None) {
            EventData::None => None,
            EventData::Line(range) => Some(stream.slice(range)),
            EventData::Lines(lines) => Some(Bytes::from(lines)),
        }
    }
}

/// Which of a JSON-RPC message's members are present (`null` counts), the values skipped unread.
#[derive(Deserialize)]
struct Message {
    #[serde(default, deserialize_with = "present")]
    method: bool,
    #[serde(default, deserialize_with = "present")]
    id: bool,
    #[serde(default, deserialize_with = "present")]
    result: bool,
    #[serde(default, deserialize_with = "present")]
    error: bool,
}

fn present<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<bool, D::Error> {
    serde::de::IgnoredAny::deserialize(deserializer).map(|_| true)
}

#[cfg(test)]
mod tests {
    use super::*;

    const RESPONSE: &str = r#"{"jsonrpc":"2.0","id":3,"result":{"ok":true}}"#;

    #[test]
    fn only_a_lone_response_becomes_json() {
        let primed = format!("id: 0\nretry: 3000\ndata:\n\n:ping\n\nid: 1\ndata: {RESPONSE}\n\n");
        let sole = |stream: &str| sole_response(&Bytes::copy_from_slice(stream.as_bytes()));
        assert_eq!(sole(&primed).as_deref(), Some(RESPONSE.as_bytes()));
        assert_eq!(sole(&format!("data: {RESPONSE}\r\n\r\n")).as_deref(), Some(RESPONSE.as_bytes()));
        assert_eq!(sole(&format!(":x\rdata: {RESPONSE}\r\r")).as_deref(), Some(RESPONSE.as_bytes()));
        assert_eq!(sole(&format!("event: message\ndata: {RESPONSE}")).as_deref(), Some(RESPONSE.as_bytes()));
        let error = r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"parse"}}"#;
        assert_eq!(sole(&format!("data: {error}\n\n")).as_deref(), Some(error.as_bytes()));
        // Data split over lines is joined by LF (still one event, still valid JSON).
        let split = "data: {\"jsonrpc\":\"2.0\",\ndata: \"id\":1,\"result\":{}}\n\n";
        assert_eq!(sole(split).as_deref(), Some(&b"{\"jsonrpc\":\"2.0\",\n\"id\":1,\"result\":{}}"[..]));
        let note = r#"{"jsonrpc":"2.0","method":"notifications/progress","params":{"progress":1}}"#;
        assert_eq!(sole(&format!("data: {note}\n\ndata: {RESPONSE}\n\n")), None);
        assert_eq!(sole(&format!("data: {RESPONSE}\n\ndata: {RESPONSE}\n\n")), None);
        assert_eq!(sole(&format!("data: {note}\n\n")), None);
        assert_eq!(sole(&format!("event: other\ndata: {RESPONSE}\n\n")), None);
        assert_eq!(sole(r#"data: {"jsonrpc":"2.0","id":1}"#), None, "neither result nor error");
        assert_eq!(sole(r#"data: [1, 2]"#), None);
        assert_eq!(sole("data: not json\n\n"), None);
        assert_eq!(sole("id: 0\ndata:\n\n"), None);
    }

    fn sse(chunks: Vec<&'static str>, hold_open: bool) -> Response {
        let stream = futures_util::stream::iter(chunks.into_iter().map(|c| Ok::<_, std::io::Error>(Bytes::from(c))));
        let body = if hold_open {
            Body::from_stream(stream.chain(futures_util::stream::pending()))
        } else {
            Body::from_stream(stream)
        };
        Response::builder()
            .header(header::CONTENT_TYPE, "text/event-stream")
            .header("mcp-session-id", "s1")
            .body(body)
            .unwrap()
    }

    #[tokio::test]
    async fn a_quick_answer_is_json_with_the_headers_kept() {
        let response = collect(
            sse(vec!["id: 0\ndata:\n\n", "data: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}\n\n"], false),
            Duration::from_secs(1),
        )
        .await;
        assert_eq!(response.headers()[header::CONTENT_TYPE], "application/json");
        assert_eq!(response.headers()["mcp-session-id"], "s1");
        let body = axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap();
        assert_eq!(body, r#"{"jsonrpc":"2.0","id":1,"result":{}}"#);
    }

    #[tokio::test]
    async fn other_streams_pass_through_whole_and_in_order() {
        let note = "data: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\",\"params\":{}}\n\n";
        let answer = "data: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}\n\n";
        let response = collect(sse(vec!["id: 0\ndata:\n\n", note, answer], false), Duration::from_secs(1)).await;
        assert_eq!(response.headers()[header::CONTENT_TYPE], "text/event-stream");
        let body = axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap();
        assert_eq!(body, format!("id: 0\ndata:\n\n{note}{answer}"));
        // Still open at the deadline: what was read comes first, the rest follows.
        let response = collect(sse(vec!["id: 0\ndata:\n\n"], true), Duration::from_millis(50)).await;
        assert_eq!(response.headers()[header::CONTENT_TYPE], "text/event-stream");
        let mut stream = response.into_body().into_data_stream();
        assert_eq!(stream.next().await.unwrap().unwrap(), "id: 0\ndata:\n\n");
    }
}
