//! The legacy session `DELETE` answer: 204 when the session ended, 404 for
//! an unknown or already-ended one (rmcp itself answers 202 in both cases).

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::gateway::sessions::SessionRegistry;

/// Answers a legacy session `DELETE` as official clients expect: 204 when the session ended, 404 for
/// an unknown or already-ended one (rmcp itself answers 202 in both cases).
pub async fn session_delete(State(sessions): State<Arc<SessionRegistry>>, request: Request, next: Next) -> Response {
    if request.method() != Method::DELETE {
        return next.run(request).await;
    }
    let Some(id) = request.headers().get("mcp-session-id").and_then(|v| v.to_str().ok()).map(str::to_string) else {
        return next.run(request).await;
    };
    if !sessions.contains(&id) {
        return (StatusCode::NOT_FOUND, "session not found\n").into_response();
    }
    let mut response = next.run(request).await;
    if response.status() == StatusCode::ACCEPTED {
        *response.status_mut() = StatusCode::NO_CONTENT;
    }
    response
}
