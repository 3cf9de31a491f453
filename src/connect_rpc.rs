//! Connect protocol (v1, JSON codec) framing shared by the provider client and
//! the local provider's envd agent: envelopes, end-stream frames, error codes
//! and their HTTP status mapping.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use serde::{Deserialize, Serialize};

/// Envelope flag of an ordinary message.
pub const FLAG_MESSAGE: u8 = 0x00;
/// Envelope flag of a compressed message (never produced here; rejected).
pub const FLAG_COMPRESSED: u8 = 0x01;
/// Envelope flag of the end-stream frame (payload is always JSON).
pub const FLAG_END_STREAM: u8 = 0x02;
/// Largest envelope payload either side accepts.
pub const MAX_ENVELOPE_PAYLOAD: usize = 16 * 1024 * 1024;

/// Content type of server-streaming Connect JSON bodies.
pub const CONTENT_TYPE_STREAM_JSON: &str = "application/connect+json";
/// Content type of unary Connect JSON bodies.
pub const CONTENT_TYPE_UNARY_JSON: &str = "application/json";

/// Connect status codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Code {
    Canceled,
    Unknown,
    InvalidArgument,
    DeadlineExceeded,
    NotFound,
    AlreadyExists,
    PermissionDenied,
    ResourceExhausted,
    FailedPrecondition,
    Aborted,
    OutOfRange,
    Unimplemented,
    Internal,
    Unavailable,
    DataLoss,
    Unauthenticated,
}

impl Code {
    /// The wire name (`not_found`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Code::Canceled => "canceled",
            Code::Unknown => "unknown",
            Code::InvalidArgument => "invalid_argument",
            Code::DeadlineExceeded => "deadline_exceeded",
            Code::NotFound => "not_found",
            Code::AlreadyExists => "already_exists",
            Code::PermissionDenied => "permission_denied",
            Code::ResourceExhausted => "resource_exhausted",
            Code::FailedPrecondition => "failed_precondition",
            Code::Aborted => "aborted",
            Code::OutOfRange => "out_of_range",
            Code::Unimplemented => "unimplemented",
            Code::Internal => "internal",
            Code::Unavailable => "unavailable",
            Code::DataLoss => "data_loss",
            Code::Unauthenticated => "unauthenticated",
        }
    }

    /// Parses a wire name; unknown names map to [`Code::Unknown`].
    pub fn parse(name: &str) -> Code {
        serde_json::from_value(serde_json::Value::String(name.to_owned())).unwrap_or(Code::Unknown)
    }

    /// HTTP status used for a unary error with this code (Connect spec).
    pub fn http_status(self) -> u16 {
        match self {
            Code::InvalidArgument | Code::FailedPrecondition | Code::OutOfRange => 400,
            Code::Unauthenticated => 401,
            Code::PermissionDenied => 403,
            Code::NotFound => 404,
            Code::AlreadyExists | Code::Aborted => 409,
            Code::ResourceExhausted => 429,
            Code::Canceled => 499,
            Code::Unimplemented => 501,
            Code::Unavailable => 503,
            Code::DeadlineExceeded => 504,
            _ => 500,
        }
    }

    /// Code a client infers from a non-Connect HTTP error status.
    pub fn from_http_status(status: u16) -> Code {
        match status {
            400 => Code::InvalidArgument,
            401 => Code::Unauthenticated,
            403 => Code::PermissionDenied,
            404 => Code::NotFound,
            409 => Code::AlreadyExists,
            429 | 502 | 503 | 504 => Code::Unavailable,
            499 => Code::Canceled,
            501 => Code::Unimplemented,
            _ => Code::Unknown,
        }
    }
}

/// A Connect error: code plus human message (the JSON body of unary errors and
/// the `error` member of an end-stream frame).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{}: {message}", code.as_str())]
pub struct ConnectError {
    pub code: Code,
    #[serde(default)]
    pub message: String,
}

impl ConnectError {
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        Self { code, message: message.into() }
    }
}

/// Payload of the end-stream frame.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct EndStream {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ConnectError>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<serde_json::Map<String, serde_json::Value>>,
}

/// One decoded envelope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Envelope {
    pub flags: u8,
    pub payload: Bytes,
}

impl Envelope {
    pub fn is_end_stream(&self) -> bool {
        self.flags & FLAG_END_STREAM != 0
    }
}

/// Errors while decoding an envelope stream.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FrameError {
    #[error("envelope payload of {0} bytes exceeds the limit of {MAX_ENVELOPE_PAYLOAD} bytes")]
    TooLarge(usize),
    #[error("compressed envelopes are not supported (flags {0:#04x})")]
    Compressed(u8),
    #[error("stream ended inside an envelope ({0} bytes left over)")]
    Truncated(usize),
}

/// Frames one payload.
pub fn encode_envelope(flags: u8, payload: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(5 + payload.len());
    out.put_u8(flags);
    out.put_u32(payload.len() as u32);
    out.put_slice(payload);
    out.freeze()
}

/// Frames a JSON message.
pub fn encode_json_message<T: Serialize>(message: &T) -> Bytes {
    // Serializing our own plain data types cannot fail.
    let payload = serde_json::to_vec(message).unwrap_or_else(|_| b"{}".to_vec());
    encode_envelope(FLAG_MESSAGE, &payload)
}

/// Frames the end-stream frame, with an optional error.
pub fn encode_end_stream(error: Option<&ConnectError>) -> Bytes {
    let end = EndStream { error: error.cloned(), metadata: None };
    let payload = serde_json::to_vec(&end).unwrap_or_else(|_| b"{}".to_vec());
    encode_envelope(FLAG_END_STREAM, &payload)
}

/// Incremental envelope decoder: feed bytes as they arrive, take whole envelopes out.
#[derive(Debug, Default)]
pub struct EnvelopeDecoder {
    buf: BytesMut,
}

impl EnvelopeDecoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends received bytes.
    pub fn push(&mut self, chunk: &[u8]) {
        self.buf.extend_from_slice(chunk);
    }

    /// Returns the next complete envelope, if one is buffered.
    pub fn next_envelope(&mut self) -> Result<Option<Envelope>, FrameError> {
        if self.buf.len() < 5 {
            return Ok(None);
        }
        let flags = self.buf[0];
        let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]) as usize;
        if len > MAX_ENVELOPE_PAYLOAD {
            return Err(FrameError::TooLarge(len));
        }
        if flags & FLAG_COMPRESSED != 0 {
            return Err(FrameError::Compressed(flags));
        }
        if self.buf.len() < 5 + len {
            return Ok(None);
        }
        self.buf.advance(5);
        let payload = self.buf.split_to(len).freeze();
        Ok(Some(Envelope { flags, payload }))
    }

    /// Call at end of input: errors if a partial envelope is left.
    pub fn finish(&self) -> Result<(), FrameError> {
        if self.buf.is_empty() { Ok(()) } else { Err(FrameError::Truncated(self.buf.len())) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_split_envelopes() {
        let mut wire = Vec::new();
        wire.extend_from_slice(&encode_envelope(FLAG_MESSAGE, br#"{"a":1}"#));
        wire.extend_from_slice(&encode_end_stream(None));
        let mut dec = EnvelopeDecoder::new();
        let mut got = Vec::new();
        for byte in wire {
            dec.push(&[byte]);
            while let Some(env) = dec.next_envelope().unwrap() {
                got.push(env);
            }
        }
        assert_eq!(got.len(), 2);
        assert_eq!(&got[0].payload[..], br#"{"a":1}"#);
        assert!(got[1].is_end_stream());
        assert_eq!(&got[1].payload[..], b"{}");
        dec.finish().unwrap();
    }

    #[test]
    fn matches_contract_bytes() {
        let frame = encode_envelope(FLAG_MESSAGE, br#"{"event":{"start":{"pid":42}}}"#);
        assert_eq!(&frame[..5], &[0, 0, 0, 0, 0x1e]);
        let end = encode_end_stream(Some(&ConnectError::new(Code::NotFound, "process with pid 7 not found")));
        assert_eq!(end[0], FLAG_END_STREAM);
        assert_eq!(&end[5..], br#"{"error":{"code":"not_found","message":"process with pid 7 not found"}}"#);
        assert_eq!(end[4] as usize, end.len() - 5);
    }

    #[test]
    fn rejects_oversized_and_compressed_and_truncated() {
        let mut dec = EnvelopeDecoder::new();
        dec.push(&[0, 0xff, 0xff, 0xff, 0xff]);
        assert!(matches!(dec.next_envelope(), Err(FrameError::TooLarge(_))));
        let mut dec = EnvelopeDecoder::new();
        dec.push(&[1, 0, 0, 0, 1, b'x']);
        assert!(matches!(dec.next_envelope(), Err(FrameError::Compressed(1))));
        let mut dec = EnvelopeDecoder::new();
        dec.push(&[0, 0, 0, 0, 9, b'x']);
        assert_eq!(dec.next_envelope().unwrap(), None);
        assert_eq!(dec.finish(), Err(FrameError::Truncated(6)));
    }

    #[test]
    fn codes_map_to_http_and_back() {
        assert_eq!(Code::parse("not_found"), Code::NotFound);
        assert_eq!(Code::parse("bogus"), Code::Unknown);
        assert_eq!(Code::NotFound.http_status(), 404);
        assert_eq!(Code::from_http_status(404), Code::NotFound);
        assert_eq!(Code::InvalidArgument.as_str(), "invalid_argument");
    }
}
