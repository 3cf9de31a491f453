//! Per-tenant limits (`[limits]`): live sandboxes, live MCP sessions and
//! concurrent tool calls. Each refusal names the limit, its value and what to
//! do, and is never phrased as a transient failure.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::extract::{Request, State};
use axum::http::{Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::auth::Tenant;
use super::sessions::SessionRegistry;
use crate::config::LimitsConfig;

/// Counters behind the per-tenant limits.
#[derive(Default)]
pub struct TenantQuotas {
    limits: LimitsConfig,
    calls: Mutex<HashMap<String, usize>>,
    creates: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

/// A running tool call of a tenant (released on drop).
pub struct CallPermit {
    quotas: Arc<TenantQuotas>,
    tenant: String,
}

impl Drop for CallPermit {
    fn drop(&mut self) {
        let mut calls = self.quotas.calls.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(count) = calls.get_mut(&self.tenant) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                calls.remove(&self.tenant);
            }
        }
    }
}

impl TenantQuotas {
    pub fn new(limits: LimitsConfig) -> Arc<Self> {
        Arc::new(TenantQuotas { limits, ..Default::default() })
    }

    /// Admits one more tool call of `tenant`, or says which limit refused it.
    pub fn start_call(self: &Arc<Self>, tenant: &str) -> Result<CallPermit, QuotaRefusal> {
        let max = self.limits.max_concurrent_calls_per_tenant;
        let mut calls = self.calls.lock().unwrap_or_else(|p| p.into_inner());
        let count = calls.entry(tenant.to_owned()).or_default();
        if max > 0 && *count >= max {
            return Err(QuotaRefusal::Calls { tenant: tenant.to_owned(), running: *count, max });
        }
        *count += 1;
        Ok(CallPermit { quotas: Arc::clone(self), tenant: tenant.to_owned() })
    }

    /// Serialises sandbox creation per tenant so the live count cannot be overtaken by a
    /// concurrent create; hold the guard across the count and the create.
    pub async fn create_guard(&self, tenant: &str) -> tokio::sync::OwnedMutexGuard<()> {
        let lock =
            Arc::clone(self.creates.lock().unwrap_or_else(|p| p.into_inner()).entry(tenant.to_owned()).or_default());
        lock.lock_owned().await
    }

    /// The per-tenant sandbox limit (0: none).
    pub fn max_sandboxes(&self) -> usize {
        self.limits.max_sandboxes_per_tenant
    }

    /// The refusal when `tenant` already has `live` sandboxes.
    pub fn sandbox_refusal(&self, tenant: &str, live: usize) -> QuotaRefusal {
        QuotaRefusal::Sandboxes { tenant: tenant.to_owned(), live, max: self.limits.max_sandboxes_per_tenant }
    }
}

/// A per-tenant limit refusing a tool call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuotaRefusal {
    #[error(
        "tenant limit reached: {running} tool calls of tenant {tenant} are already running \
         (limits.max_concurrent_calls_per_tenant = {max}); wait for one to finish before calling again"
    )]
    Calls { tenant: String, running: usize, max: usize },
    #[error(
        "tenant limit reached: tenant {tenant} already has {live} live sandboxes \
         (limits.max_sandboxes_per_tenant = {max}); kill one you no longer need (kill_sandbox; \
         list_sandboxes shows yours) and create again"
    )]
    Sandboxes { tenant: String, live: usize, max: usize },
}

/// State of the session-limit middleware.
#[derive(Clone)]
pub struct SessionLimit {
    pub sessions: Arc<SessionRegistry>,
    pub max_per_tenant: usize,
}

/// Refuses a new MCP session (a POST without `Mcp-Session-Id`) when the tenant already has
/// `limits.max_sessions_per_tenant` live sessions: 429 with a JSON-RPC error saying so.
pub async fn limit_sessions(State(limit): State<SessionLimit>, request: Request, next: Next) -> Response {
    let new_session = request.method() == Method::POST && !request.headers().contains_key("mcp-session-id");
    if limit.max_per_tenant > 0
        && new_session
        && let Some(Tenant(tenant)) = request.extensions().get::<Tenant>()
    {
        let live = limit.sessions.sessions_of(tenant);
        if live >= limit.max_per_tenant {
            let message = format!(
                "tenant limit reached: tenant {tenant} already has {live} live MCP sessions \
                 (limits.max_sessions_per_tenant = {}); end a session you no longer use (HTTP DELETE with its \
                 Mcp-Session-Id, or close the client) or wait for idle ones to expire",
                limit.max_per_tenant
            );
            let body = serde_json::json!({"jsonrpc": "2.0", "id": null, "error": {"code": -32000, "message": message}});
            return (StatusCode::TOO_MANY_REQUESTS, [(header::CONTENT_TYPE, "application/json")], body.to_string())
                .into_response();
        }
    }
    next.run(request).await
}
