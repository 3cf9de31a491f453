//! The in-sandbox envd agent: serves the envd data plane
//! (`docs/provider-contract.md#envd-files-api` and `#envd-connect-rpc`)
//! as plain HTTP/1.1 on a Unix socket. The local provider reverse-proxies
//! every envd request of one sandbox to this socket after checking routing
//! and auth itself, so nothing here looks at `X-Access-Token`.
//!
//! Routes: `GET /health` (204), `GET /envs`, `GET /metrics`, `GET|POST /files`,
//! `POST /process.Process/{method}`, `POST /filesystem.Filesystem/{method}`
//! (Connect protocol, JSON codec only). Works on a current-thread runtime;
//! file operations use the runtime's blocking pool (cap it with
//! `max_blocking_threads` if RSS matters).
//!
//! Processes (`process/`): spawned with `std::process::Command` in their own
//! process group, exit statuses collected by one SIGCHLD reaper
//! (`process/reaper.rs`). With `reap_orphans` (PID 1 of a sandbox) the reaper
//! calls `waitpid(-1)`, so nothing else in the process may wait for its own
//! children (no `tokio::process`). Files (`files/`): operations run with the
//! requesting user's filesystem identity (`setfsuid`, see `files/fsops.rs`).
//! Shared by both: the Connect plumbing (`rpc.rs`) and who a request runs as
//! (`users.rs`, with the accounts it resolved kept in `account_cache.rs`).
//!
//! Compression: gzip-encoded uploads (`Content-Encoding: gzip`, raw and
//! multipart bodies alike) are decoded, and downloads are gzipped when
//! `Accept-Encoding` asks for it (range and conditional requests excepted).
//!
//! Not implemented: PTY, `StreamInput`, `Update`, `WatchDir` and the watcher
//! RPCs (all answer `unimplemented`).

mod account_cache;
mod files;
mod process;
mod rpc;
mod usage_metrics;
mod users;

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use axum::Router;
use axum::body::Body;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, get, post};

use crate::connect_rpc::{Code, ConnectError};
pub use process::reaper::ExitOutcome;
pub use process::spawn::DEFAULT_PATH;
use process::{reaper, table};

/// Configuration of one envd instance (one per sandbox). `Debug` shows the
/// names of the env vars, never their values (they may hold secrets).
#[derive(Clone)]
pub struct EnvdOptions {
    pub sandbox_id: String,
    /// Sandbox-level env vars (E2B `envVars`): default environment of every process.
    pub env_vars: HashMap<String, String>,
    /// Default user for requests without Basic auth / username (normally "user").
    pub default_user: String,
    /// True when running as PID 1 of the sandbox: also reap orphaned processes.
    pub reap_orphans: bool,
}

impl std::fmt::Debug for EnvdOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut names: Vec<&String> = self.env_vars.keys().collect();
        names.sort();
        f.debug_struct("EnvdOptions")
            .field("sandbox_id", &self.sandbox_id)
            .field("env_var_names", &names)
            .field("default_user", &self.default_user)
            .field("reap_orphans", &self.reap_orphans)
            .finish()
    }
}

/// State shared by every handler.
pub(crate) struct EnvdState {
    pub(crate) opts: EnvdOptions,
    pub(crate) processes: Arc<table::ProcessTable>,
    reaper: OnceLock<Arc<reaper::Reaper>>,
    cpu: usage_metrics::CpuSampler,
}

impl EnvdState {
    /// The reaper, started on first use (needs a runtime, which handlers have).
    pub(crate) fn reaper(&self) -> Result<Arc<reaper::Reaper>, ConnectError> {
        if let Some(reaper) = self.reaper.get() {
            return Ok(reaper.clone());
        }
        let started = reaper::Reaper::start(self.opts.reap_orphans)
            .map_err(|err| ConnectError::new(Code::Internal, format!("cannot listen for SIGCHLD: {err}")))?;
        Ok(self.reaper.get_or_init(|| started).clone())
    }
}

/// Serves the envd API on `listener` until the process is killed.
/// Must run inside a tokio runtime (a current-thread one is enough).
pub async fn serve(listener: tokio::net::UnixListener, opts: EnvdOptions) -> anyhow::Result<()> {
    let state = new_state(opts);
    // Start reaping at once: as PID 1, orphans must be collected even before the first RPC.
    state.reaper().map_err(|err| anyhow::anyhow!("{err}"))?;
    tracing::info!(sandbox_id = %state.opts.sandbox_id, "envd serving");
    axum::serve(listener, app(state)).await?;
    Ok(())
}

/// [`serve`] for a listener bound with std (e.g. before `pivot_root`): makes
/// it non-blocking and registers it with the current runtime.
pub async fn serve_std(listener: std::os::unix::net::UnixListener, opts: EnvdOptions) -> anyhow::Result<()> {
    listener.set_nonblocking(true)?;
    serve(tokio::net::UnixListener::from_std(listener)?, opts).await
}

/// Builds the envd axum Router (state included). The SIGCHLD reaper starts
/// with the first process, so this may be called outside a runtime; serve
/// the router on any tokio runtime.
pub fn router(opts: EnvdOptions) -> Router {
    app(new_state(opts))
}

fn new_state(opts: EnvdOptions) -> Arc<EnvdState> {
    Arc::new(EnvdState {
        opts,
        processes: Arc::new(table::ProcessTable::default()),
        reaper: OnceLock::new(),
        cpu: usage_metrics::CpuSampler::default(),
    })
}

fn app(state: Arc<EnvdState>) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/envs", get(envs))
        .route("/metrics", get(get_metrics))
        .route("/files", get(files::http::download).post(files::http::upload))
        .route("/process.Process/{method}", connect_service(process::process_rpc::handle))
        .route("/filesystem.Filesystem/{method}", connect_service(files::fs_rpc::handle))
        .fallback(fallback)
        .layer(DefaultBodyLimit::disable())
        .with_state(state)
}

async fn health() -> StatusCode {
    StatusCode::NO_CONTENT
}

async fn envs(State(state): State<Arc<EnvdState>>) -> Response {
    axum::Json(state.opts.env_vars.clone()).into_response()
}

async fn get_metrics(State(state): State<Arc<EnvdState>>) -> Response {
    axum::Json(usage_metrics::snapshot(&state.cpu)).into_response()
}

/// The route of a Connect service (`POST /<service>/{method}`), served by its `handle`.
fn connect_service<F, Fut>(handle: F) -> MethodRouter<Arc<EnvdState>>
where
    F: FnOnce(Arc<EnvdState>, String, HeaderMap, Body) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Response> + Send + 'static,
{
    post(move |State(state): State<Arc<EnvdState>>, Path(method): Path<String>, headers: HeaderMap, body: Body| {
        handle(state, method, headers, body)
    })
}

async fn fallback(uri: axum::http::Uri) -> Response {
    let path = uri.path();
    if path.starts_with("/process.") || path.starts_with("/filesystem.") {
        return rpc::unimplemented(format!("unknown method {path}"));
    }
    files::http::http_error(StatusCode::NOT_FOUND, format!("no envd route for {path}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_output_hides_env_values() {
        let opts = EnvdOptions {
            sandbox_id: "sb".into(),
            env_vars: HashMap::from([("API_TOKEN".to_string(), "s3cret-value".to_string())]),
            default_user: "user".into(),
            reap_orphans: true,
        };
        let shown = format!("{opts:?}");
        assert!(shown.contains("API_TOKEN") && !shown.contains("s3cret-value"), "{shown}");
    }
}
