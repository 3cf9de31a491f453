//! The in-sandbox envd agent: serves the envd data plane (CONTRACT.md §4–5)
//! as plain HTTP/1.1 on a Unix socket. The local provider reverse-proxies
//! every envd request of one sandbox to this socket after checking routing
//! and auth itself, so nothing here looks at `X-Access-Token`.

use std::collections::HashMap;
use std::sync::Arc;

use axum::Router;
use axum::http::StatusCode;
use axum::routing::get;

/// Configuration of one envd instance (one per sandbox).
#[derive(Debug, Clone)]
pub struct EnvdOptions {
    pub sandbox_id: String,
    /// Sandbox-level env vars (E2B `envVars`): default environment of every process.
    pub env_vars: HashMap<String, String>,
    /// Default user for requests without Basic auth / username (normally "user").
    pub default_user: String,
    /// True when running as PID 1 of the sandbox: also reap orphaned processes.
    pub reap_orphans: bool,
}

/// State shared by every handler.
pub(crate) struct EnvdState {
    pub(crate) opts: EnvdOptions,
}

/// Serves the envd API on `listener` until the process is killed.
pub async fn serve(listener: tokio::net::UnixListener, opts: EnvdOptions) -> anyhow::Result<()> {
    let app = router(opts);
    axum::serve(listener, app).await?;
    Ok(())
}

/// Builds the envd axum Router.
pub fn router(opts: EnvdOptions) -> Router {
    let state = Arc::new(EnvdState { opts });
    Router::new().route("/health", get(health)).with_state(state)
}

async fn health() -> StatusCode {
    StatusCode::NO_CONTENT
}
