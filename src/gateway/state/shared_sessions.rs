//! The serving side of sessions kept in Redis: the `/mcp` middleware that
//! refreshes a session's cached record on every request (and turns a Redis
//! outage into a clear, retryable 503), `DELETE` ending a session for every
//! replica, and the reaper that cleans ended sessions up exactly once across
//! replicas (whoever takes the lease kills the owned, unretained sandboxes;
//! a lease left by a replica that died midway expires and another finishes).

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use rmcp::transport::streamable_http_server::session::SessionId;
use tokio_util::sync::CancellationToken;

use super::GatewayCore;
use crate::gateway::http::auth::{Principal, Tenant};
use crate::gateway::http::protocol_version::is_stateless_headers;
use crate::gateway::sessions::TrackingSessionManager;
use crate::gateway::sessions::redis_store::{RedisStore, Touched};

/// Bound on each kill during a session cleanup.
const CLEANUP_KILL_TIMEOUT: Duration = Duration::from_secs(15);
/// Expired sessions handled per sweep.
const SWEEP_BATCH: isize = 64;

/// What the middleware and the reaper share.
#[derive(Clone)]
pub struct Shared {
    pub store: RedisStore,
    pub core: Arc<GatewayCore>,
    pub manager: Arc<TrackingSessionManager>,
    /// This replica's name in cleanup leases.
    pub holder: Arc<str>,
}

impl Shared {
    pub fn new(store: RedisStore, core: Arc<GatewayCore>, manager: Arc<TrackingSessionManager>) -> Self {
        let holder = format!(
            "{}:{}:{:016x}",
            nix::unistd::gethostname().ok().and_then(|h| h.into_string().ok()).unwrap_or_default(),
            std::process::id(),
            rand::random::<u64>()
        );
        Self { store, core, manager, holder: holder.into() }
    }
}

/// `/mcp` middleware, inside auth: refreshes the session only for the tenant and principal it is bound to
/// (anyone else gets the 404 of an unknown session, and the session's idle deadline does not move).
pub async fn refresh(State(shared): State<Shared>, request: Request, next: Next) -> Response {
    let session_id = request.headers().get("mcp-session-id").and_then(|v| v.to_str().ok()).map(str::to_string);
    let Some(id) = session_id else {
        // A legacy `initialize` creates a session in Redis: refuse it cleanly while Redis is down.
        if request.method() == Method::POST
            && !is_stateless_headers(request.headers())
            && let Err(err) = shared.store.ping().await
        {
            tracing::warn!(error = %err, "initialize refused: Redis does not answer; answered 503");
            return err.into_response();
        }
        return next.run(request).await;
    };
    let (Some(Tenant(tenant)), Some(Principal(principal))) =
        (request.extensions().get::<Tenant>(), request.extensions().get::<Principal>())
    else {
        // Unreachable behind `require_tenant`; refuse rather than refresh for nobody.
        return (StatusCode::NOT_FOUND, "session not found\n").into_response();
    };
    match shared.store.touch(&id, tenant, principal).await {
        Err(err) => {
            // The client gets a retryable 503; the log says why (a Redis outage or a slow answer).
            tracing::warn!(session = %id, error = %err, "cannot refresh the session in Redis; answered 503");
            return err.into_response();
        }
        Ok(Touched::Gone) => {
            // Ended (DELETE elsewhere, expiry) or unknown: drop any local worker; rmcp answers 404.
            if shared.core.sessions.contains(&id) {
                shared.manager.drop_local(&SessionId::from(id.clone())).await;
            }
        }
        // Same answer as for an unknown session: do not reveal that it exists.
        Ok(Touched::NotYours) => return (StatusCode::NOT_FOUND, "session not found\n").into_response(),
        Ok(Touched::Live(record)) => shared.core.sessions.refresh(&id, record),
    }
    if request.method() != Method::DELETE {
        return next.run(request).await;
    }
    let response = next.run(request).await;
    if response.status().is_success() {
        match shared.store.end_now(&id).await {
            Ok(true) => {
                let shared = shared.clone();
                shared.core.cleanups.clone().spawn(async move { end_session(&shared, &id, "deleted").await });
            }
            Ok(false) => {}
            Err(err) => {
                tracing::warn!(session = %id, error = %err, "DELETE: cannot mark the session ended in Redis");
                return err.into_response();
            }
        }
    }
    response
}

/// Cleans up one ended session if this replica gets its lease: kills the owned, unretained sandboxes
/// (recording each kill, so a replica taking over after a crash skips it), then deletes the session.
pub async fn end_session(shared: &Shared, id: &str, reason: &'static str) {
    let record = match shared.store.lease(id, &shared.holder).await {
        Ok(Some(record)) => record,
        Ok(None) => return, // another replica is at it (or has finished)
        Err(err) => {
            tracing::warn!(session = %id, error = %err, "cannot take the cleanup lease; retrying at the next sweep");
            return;
        }
    };
    shared.manager.drop_local(&SessionId::from(id.to_string())).await;
    let to_kill: Vec<String> = record.owned.difference(&record.retained).cloned().collect();
    let mut killed = Vec::new();
    let mut failed = Vec::new();
    for sandbox in &to_kill {
        match tokio::time::timeout(CLEANUP_KILL_TIMEOUT, shared.core.provider.kill_sandbox(sandbox)).await {
            Ok(Ok(_)) => killed.push(sandbox.clone()),
            Ok(Err(err)) if err.is_sandbox_gone() => killed.push(sandbox.clone()),
            Ok(Err(err)) => {
                failed.push(format!("{sandbox}: {}", shared.core.masker.mask(&err.to_string())));
                continue;
            }
            Err(_) => {
                failed.push(format!("{sandbox}: timed out"));
                continue;
            }
        }
        shared.core.forget_sandbox(sandbox);
        if let Err(err) = shared.store.killed(id, sandbox).await {
            tracing::warn!(session = %id, sandbox = %sandbox, error = %err, "cannot record a cleanup kill in Redis");
        }
    }
    let tenant = record.tenant.unwrap_or_default();
    if !failed.is_empty() {
        // The lease expires and a later sweep (here or elsewhere) retries the rest.
        tracing::warn!(session = %id, tenant = %tenant, reason, ?killed, ?failed,
            "session cleanup incomplete; retrying after the lease expires");
        return;
    }
    match shared.store.finish(id, &shared.holder).await {
        Ok(_) => tracing::info!(session = %id, tenant = %tenant, reason, ?killed, kept_retained = ?record.retained,
            "session ended; killed its owned sandboxes (retained ones kept: tasks were started in them)"),
        Err(err) => tracing::warn!(session = %id, error = %err, "cannot delete the cleaned session from Redis"),
    }
}

/// Every `interval`, cleans up the sessions whose idle deadline passed (any replica's, a crashed one's too).
pub fn spawn_reaper(shared: Shared, interval: Duration, stop: CancellationToken) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(interval) => {}
            }
            match shared.store.expired(SWEEP_BATCH).await {
                Ok(ids) => {
                    for id in ids {
                        end_session(&shared, &id, "expired").await;
                    }
                }
                Err(err) => tracing::warn!(error = %err, "session sweep: Redis unreachable"),
            }
        }
    })
}
