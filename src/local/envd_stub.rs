//! Temporary stand-in for the in-sandbox agent (branch `envd` owns the real
//! one, `src/local/envd/`): answers `GET /health` only, so the provider's
//! lifecycle can be built and tested before the merge.

use std::collections::HashMap;

/// Options of the agent (same shape as the real `envd::EnvdOptions`).
#[derive(Debug, Clone)]
pub struct EnvdOptions {
    pub sandbox_id: String,
    pub env_vars: HashMap<String, String>,
    pub default_user: String,
    pub reap_orphans: bool,
}

/// Serves `GET /health` → 204 on `listener` until the process is killed.
pub async fn serve(listener: tokio::net::UnixListener, _opts: EnvdOptions) -> anyhow::Result<()> {
    let app = axum::Router::new().route("/health", axum::routing::get(|| async { http::StatusCode::NO_CONTENT }));
    axum::serve(listener, app).await?;
    Ok(())
}
