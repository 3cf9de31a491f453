//! Connect RPC plumbing for the envd handlers: serving one call (content
//! type, bounded body, errors in the call's framing), decoding unary and
//! server-streaming requests (JSON codec only) and building unary, error and
//! streaming responses.

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures_util::Stream;
use http_body_util::BodyExt;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::connect_rpc::{
    CONTENT_TYPE_STREAM_JSON, CONTENT_TYPE_UNARY_JSON, Code, ConnectError, EnvelopeDecoder, MAX_ENVELOPE_PAYLOAD,
    encode_end_stream,
};

/// The kind of Connect call a handler serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallKind {
    Unary,
    ServerStream,
}

/// A unary error response: Connect status mapping plus `{"code","message"}`.
pub fn unary_error(err: &ConnectError) -> Response {
    let status = StatusCode::from_u16(err.code.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    json_response(status, err)
}

/// A unary success response.
pub fn unary_ok<T: Serialize>(message: &T) -> Response {
    json_response(StatusCode::OK, message)
}

fn json_response<T: Serialize>(status: StatusCode, value: &T) -> Response {
    let body = serde_json::to_vec(value).unwrap_or_else(|_| b"{}".to_vec());
    (status, [(header::CONTENT_TYPE, HeaderValue::from_static(CONTENT_TYPE_UNARY_JSON))], body).into_response()
}

/// A streaming response made of already-framed envelopes.
pub fn stream_response<S>(frames: S) -> Response
where
    S: Stream<Item = Bytes> + Send + 'static,
{
    use futures_util::StreamExt;
    let body = Body::from_stream(frames.map(Ok::<Bytes, std::convert::Infallible>));
    let mut response = Response::new(body);
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(CONTENT_TYPE_STREAM_JSON));
    response
}

/// A streaming response holding only an error end-stream frame (HTTP 200, as Connect requires).
pub fn stream_error(err: &ConnectError) -> Response {
    let mut response = Response::new(Body::from(encode_end_stream(Some(err))));
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(CONTENT_TYPE_STREAM_JSON));
    response
}

/// Serves one call of `kind`: checks the content type, reads the body (at most `MAX_REQUEST_BODY`), runs
/// `call` on the headers and body, and answers its error, or any earlier one, in the call's framing.
pub async fn serve<F, Fut>(kind: CallKind, headers: HeaderMap, body: Body, call: F) -> Response
where
    F: FnOnce(HeaderMap, Bytes) -> Fut,
    Fut: Future<Output = Result<Response, ConnectError>>,
{
    if let Some(response) = content_type_rejection(&headers, kind) {
        return response;
    }
    let body = match read_body(body, MAX_REQUEST_BODY).await {
        Ok(body) => body,
        Err(err) => return error_for(kind, &err),
    };
    call(headers, body).await.unwrap_or_else(|err| error_for(kind, &err))
}

/// The answer to a method this envd does not serve (unary framing: the call is refused before it starts).
pub fn unimplemented(message: String) -> Response {
    unary_error(&ConnectError::new(Code::Unimplemented, message))
}

/// The error response for `kind`.
pub fn error_for(kind: CallKind, err: &ConnectError) -> Response {
    match kind {
        CallKind::Unary => unary_error(err),
        CallKind::ServerStream => stream_error(err),
    }
}

/// Checks the request content type: the 415 response (with a Connect JSON body) for anything but JSON.
pub fn content_type_rejection(headers: &HeaderMap, kind: CallKind) -> Option<Response> {
    let content_type = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
    let essence = content_type.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
    let expected = match kind {
        CallKind::Unary => CONTENT_TYPE_UNARY_JSON,
        CallKind::ServerStream => CONTENT_TYPE_STREAM_JSON,
    };
    if essence == expected {
        return None;
    }
    let message = if essence.contains("proto") {
        format!(
            "content type '{content_type}' is not supported: this envd speaks only the Connect JSON codec ('{expected}')"
        )
    } else {
        format!("unsupported content type '{content_type}': expected '{expected}'")
    };
    let err = ConnectError::new(Code::Unimplemented, message);
    let body = serde_json::to_vec(&err).unwrap_or_default();
    Some(
        (
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            [(header::CONTENT_TYPE, HeaderValue::from_static(CONTENT_TYPE_UNARY_JSON))],
            body,
        )
            .into_response(),
    )
}

/// Decodes a unary request body (the bare JSON message; empty means `{}`).
pub fn decode_unary<T: DeserializeOwned>(body: &[u8]) -> Result<T, ConnectError> {
    let body = if body.iter().all(u8::is_ascii_whitespace) { b"{}".as_slice() } else { body };
    serde_json::from_slice(body)
        .map_err(|err| ConnectError::new(Code::InvalidArgument, format!("invalid JSON request message: {err}")))
}

/// Reads a whole request body, at most `limit` bytes.
pub async fn read_body(body: Body, limit: usize) -> Result<Bytes, ConnectError> {
    let limited = http_body_util::Limited::new(body, limit);
    match limited.collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(err) => {
            if err.is::<http_body_util::LengthLimitError>() {
                Err(ConnectError::new(
                    Code::ResourceExhausted,
                    format!("request body exceeds the limit of {limit} bytes"),
                ))
            } else {
                Err(ConnectError::new(Code::Canceled, format!("reading the request body failed: {err}")))
            }
        }
    }
}

/// Decodes the single request envelope of a server-streaming call.
pub fn decode_stream_request<T: DeserializeOwned>(body: &[u8]) -> Result<T, ConnectError> {
    let invalid = |msg: String| ConnectError::new(Code::InvalidArgument, msg);
    let mut decoder = EnvelopeDecoder::new();
    decoder.push(body);
    let envelope = match decoder.next_envelope() {
        Ok(Some(envelope)) => envelope,
        Ok(None) => return Err(invalid(format!("request body of {} bytes holds no complete envelope", body.len()))),
        Err(err) => return Err(invalid(format!("malformed request envelope: {err}"))),
    };
    if envelope.is_end_stream() {
        return Err(invalid("expected a request message, got an end-stream envelope".into()));
    }
    match decoder.next_envelope() {
        Ok(None) => {}
        Ok(Some(_)) => return Err(invalid("a server-streaming call takes exactly one request message".into())),
        Err(err) => return Err(invalid(format!("malformed data after the request envelope: {err}"))),
    }
    decoder.finish().map_err(|err| invalid(format!("malformed request envelope: {err}")))?;
    serde_json::from_slice(&envelope.payload).map_err(|err| invalid(format!("invalid JSON request message: {err}")))
}

/// Largest request body a Connect call may have.
pub const MAX_REQUEST_BODY: usize = MAX_ENVELOPE_PAYLOAD + 5;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connect_rpc::{FLAG_END_STREAM, FLAG_MESSAGE, encode_envelope};

    #[test]
    fn decodes_one_envelope_and_rejects_garbage() {
        let ok = encode_envelope(FLAG_MESSAGE, br#"{"path":"/tmp"}"#);
        let v: serde_json::Value = decode_stream_request(&ok).unwrap();
        assert_eq!(v["path"], "/tmp");
        let err = decode_stream_request::<serde_json::Value>(b"\x00\x00\x00").unwrap_err();
        assert_eq!(err.code, Code::InvalidArgument);
        let err = decode_stream_request::<serde_json::Value>(&encode_envelope(FLAG_END_STREAM, b"{}")).unwrap_err();
        assert!(err.message.contains("end-stream"));
        let err = decode_stream_request::<serde_json::Value>(&encode_envelope(FLAG_MESSAGE, b"{nope")).unwrap_err();
        assert!(err.message.contains("invalid JSON"));
        let huge = [0u8, 0xff, 0xff, 0xff, 0xff];
        assert_eq!(decode_stream_request::<serde_json::Value>(&huge).unwrap_err().code, Code::InvalidArgument);
    }

    #[test]
    fn unary_empty_body_is_empty_message() {
        let v: serde_json::Value = decode_unary(b"").unwrap();
        assert_eq!(v, serde_json::json!({}));
        assert_eq!(decode_unary::<serde_json::Value>(b"[1,").unwrap_err().code, Code::InvalidArgument);
    }
}
