//! A response body that holds a guard until the body has been fully sent or dropped: how the
//! listeners know a connection is busy and the gateway knows a call is still in flight (an MCP
//! tool result travels in the SSE body, after the handler has returned).

use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use http_body::{Frame, SizeHint};

/// `inner`, keeping `guard` alive until the body ends or is dropped.
pub struct GuardedBody<G> {
    inner: Body,
    _guard: G,
}

impl<G> GuardedBody<G> {
    /// Wraps `inner`.
    pub fn new(inner: Body, guard: G) -> Self {
        GuardedBody { inner, _guard: guard }
    }
}

/// `response` with its body wrapped so that `guard` lives as long as the body.
pub fn guard_response<G: Send + Unpin + 'static>(response: Response, guard: G) -> Response {
    let (parts, body) = response.into_parts();
    Response::from_parts(parts, Body::new(GuardedBody::new(body, guard)))
}

impl<G: Unpin> http_body::Body for GuardedBody<G> {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
