//! Counts `/mcp` POST requests until their response body has been fully sent
//! (an MCP tool result travels in the SSE body, after the handler returns),
//! so that graceful shutdown can wait for in-flight calls to be *delivered*;
//! and, once shutdown has begun, closes each connection after its response
//! (`Connection: close`), so a client's next request opens a new connection,
//! which a load balancer sends to a ready replica.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::extract::{Request, State};
use axum::http::{HeaderValue, header};
use axum::middleware::Next;
use axum::response::Response;

use super::handler::GatewayCore;

/// Wraps every `/mcp` POST so it counts as in flight until its body ends or is dropped.
pub async fn track_in_flight(State(core): State<Arc<GatewayCore>>, request: Request, next: Next) -> Response {
    let mut response = if request.method() != http::Method::POST {
        next.run(request).await
    } else {
        let guard = core.in_flight.enter_owned(&core);
        crate::guarded_body::guard_response(next.run(request).await, guard)
    };
    if core.shutting_down.load(Ordering::SeqCst) {
        response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}
