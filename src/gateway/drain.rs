//! Counts `/mcp` POST requests until their response body has been fully sent
//! (an MCP tool result travels in the SSE body, after the handler returns),
//! so that graceful shutdown can wait for in-flight calls to be *delivered*.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use bytes::Bytes;
use http_body::{Frame, SizeHint};

use super::handler::{GatewayCore, InFlightGuard};

/// Wraps every `/mcp` POST so it counts as in flight until its body ends or is dropped.
pub async fn track_in_flight(State(core): State<Arc<GatewayCore>>, request: Request, next: Next) -> Response {
    if request.method() != http::Method::POST {
        return next.run(request).await;
    }
    let guard = core.in_flight.enter_owned(&core);
    let response = next.run(request).await;
    let (parts, body) = response.into_parts();
    Response::from_parts(parts, Body::new(GuardedBody { inner: body, _guard: guard }))
}

struct GuardedBody {
    inner: Body,
    _guard: InFlightGuard,
}

impl http_body::Body for GuardedBody {
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
