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
//! Only POSTs with an `Mcp-Session-Id` that accept `application/json`, and never a request carrying a
//! `progressToken` (its client wants progress as it happens, not held back). GET streams and stateless
//! (2026-07-28) answers, JSON already, are not touched. Off with Redis sessions: there every answer
//! keeps its SSE event id, which clients use to resume and replay a stream on another replica.

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use futures_util::StreamExt;
use http::{HeaderValue, Method, header};

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
    // The body was read and checked by `parse_guard` (outside this layer): collecting it again is a copy
    // of a reference.
    let (parts, body) = request.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, usize::MAX).await else {
        return next.run(Request::from_parts(parts, Body::empty())).await;
    };
    let wants_progress = contains_bytes(&bytes, b"\"progressToken\"");
    let response = next.run(Request::from_parts(parts, Body::from(bytes))).await;
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

fn contains_bytes(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
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
    if ended && let Some(json) = sole_response(&read.concat()) {
        parts.headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        parts.headers.remove(header::CONTENT_LENGTH);
        return Response::from_parts(parts, Body::from(json));
    }
    let front = futures_util::stream::iter(read.into_iter().map(Ok::<_, axum::Error>));
    Response::from_parts(parts, Body::from_stream(front.chain(stream)))
}

/// The data of the stream's only non-empty event when it is a JSON-RPC response (or error);
/// `None` for anything else (more events, a named event, a notification or request, not JSON).
fn sole_response(stream: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(stream).ok()?;
    let text = text.replace("\r\n", "\n").replace('\r', "\n");
    let mut found: Option<String> = None;
    for event in text.split("\n\n") {
        let mut data: Option<String> = None;
        for line in event.lines() {
            if line.is_empty() || line.starts_with(':') {
                continue;
            }
            let (field, value) = line.split_once(':').unwrap_or((line, ""));
            let value = value.strip_prefix(' ').unwrap_or(value);
            match field {
                "data" => match &mut data {
                    Some(data) => {
                        data.push('\n');
                        data.push_str(value);
                    }
                    None => data = Some(value.to_string()),
                },
                "event" if value != "message" => return None,
                _ => {}
            }
        }
        if let Some(data) = data.filter(|d| !d.is_empty())
            && found.replace(data).is_some()
        {
            return None;
        }
    }
    let json = found?;
    let message: serde_json::Value = serde_json::from_str(&json).ok()?;
    let is_response = message.get("method").is_none()
        && message.get("id").is_some()
        && (message.get("result").is_some() || message.get("error").is_some());
    is_response.then_some(json)
}

#[cfg(test)]
mod tests {
    use super::*;

    const RESPONSE: &str = r#"{"jsonrpc":"2.0","id":3,"result":{"ok":true}}"#;

    #[test]
    fn only_a_lone_response_becomes_json() {
        let primed = format!("id: 0\nretry: 3000\ndata:\n\n:ping\n\nid: 1\ndata: {RESPONSE}\n\n");
        assert_eq!(sole_response(primed.as_bytes()).as_deref(), Some(RESPONSE));
        assert_eq!(sole_response(format!("data: {RESPONSE}\r\n\r\n").as_bytes()).as_deref(), Some(RESPONSE));
        let note = r#"{"jsonrpc":"2.0","method":"notifications/progress","params":{"progress":1}}"#;
        assert_eq!(sole_response(format!("data: {note}\n\ndata: {RESPONSE}\n\n").as_bytes()), None);
        assert_eq!(sole_response(format!("data: {note}\n\n").as_bytes()), None);
        assert_eq!(sole_response(format!("event: other\ndata: {RESPONSE}\n\n").as_bytes()), None);
        assert_eq!(sole_response(b"data: not json\n\n"), None);
        assert_eq!(sole_response(b"id: 0\ndata:\n\n"), None);
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
