//! Counts `/mcp` POST requests until their response body has been fully sent
//! (an MCP tool result travels in the SSE body, after the handler returns),
//! so that graceful shutdown can wait for in-flight calls to be *delivered*.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;

use super::handler::GatewayCore;

/// Wraps every `/mcp` POST so it counts as in flight until its body ends or is dropped.
pub async fn track_in_flight(State(core): State<Arc<GatewayCore>>, request: Request, next: Next) -> Response {
    if request.method() != http::Method::POST {
        return next.run(request).await;
    }
    let guard = core.in_flight.enter_owned(&core);
    crate::guarded_body::guard_response(next.run(request).await, guard)
}
