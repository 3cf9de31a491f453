//! The per-session MCP handler, [`Gateway`] (the tool families add their
//! tools to it, `handler.rs` combines them and serves MCP), and the state it
//! shares with every session ([`GatewayCore`]): the provider client, the
//! session registry, the masker, quotas, metrics, the task service, graceful
//! shutdown; the bookkeeping of sandbox deadlines (renew on use) and of
//! sandboxes checked for sessionless callers; and the session-end hook that
//! kills a session's owned, unretained sandboxes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use rmcp::handler::server::router::tool::ToolRouter;
use tokio_util::task::TaskTracker;

use super::drain::Drain;
use super::metrics::GatewayMetrics;
use super::sessions::{EndReason, SessionEndHook, SessionRegistry, SessionState};
use super::task_ids::TaskIdKey;
use crate::config::Config;
use crate::e2b::{E2bClient, E2bError, wire};
use crate::masking::Masker;
use crate::tasks::service::TaskService;

/// At most one timeout renewal per sandbox per this interval.
const RENEW_MIN_INTERVAL: Duration = Duration::from_secs(10);
/// Bound on each kill during session cleanup.
const CLEANUP_KILL_TIMEOUT: Duration = Duration::from_secs(15);

/// The per-session MCP handler (one per session, sharing one [`GatewayCore`]).
#[derive(Clone)]
pub struct Gateway {
    pub(crate) core: Arc<GatewayCore>,
    pub(crate) routers: Arc<Routers>,
}

/// The tool routers of both protocol generations (same tools, descriptions for each; portable schemas).
pub struct Routers {
    pub legacy: ToolRouter<Gateway>,
    pub modern: ToolRouter<Gateway>,
}

impl Gateway {
    pub fn new(core: Arc<GatewayCore>, routers: Arc<Routers>) -> Self {
        Self { core, routers }
    }
}

/// State shared by every session's handler.
pub struct GatewayCore {
    pub config: Arc<Config>,
    pub provider: E2bClient,
    pub sessions: Arc<SessionRegistry>,
    pub masker: Masker,
    /// Graceful shutdown: whether it has begun, and the requests in flight.
    pub drain: Drain,
    /// Prometheus metrics (ops).
    pub metrics: Arc<GatewayMetrics>,
    /// Task tools' service: supervisor install cache and page masking (same secrets as `masker`).
    pub tasks: TaskService,
    /// Per-tenant limits (`[limits]`).
    pub quotas: Arc<super::quotas::TenantQuotas>,
    /// Session cleanups under way (awaited on shutdown).
    pub cleanups: TaskTracker,
    /// Renewal bookkeeping per sandbox (shared with session cleanups, which forget killed ones).
    renewals: Arc<Renewals>,
    /// Sandboxes checked for sessionless (2026-07-28) callers: sandbox id -> (tenant, connection info).
    stateless_verified: Mutex<HashMap<String, (String, wire::Sandbox)>>,
    /// Key binding MCP task ids to their tenant (see `mcp_tasks`).
    pub(crate) task_key: TaskIdKey,
}

/// Most sandboxes remembered for sessionless callers (the cache is cleared when full).
const STATELESS_CACHE_MAX: usize = 4096;

/// sandbox id -> (last renewal by us, deadline we believe it has).
type Renewals = Mutex<HashMap<String, (Option<Instant>, SystemTime)>>;

/// Forgets a sandbox that no longer exists: in every session, and its renewal record.
fn forget_sandbox_in(sessions: &SessionRegistry, renewals: &Renewals, sandbox_id: &str) {
    sessions.forget_everywhere(sandbox_id);
    crate::sync::lock(renewals).remove(sandbox_id);
}

impl GatewayCore {
    pub fn new(
        config: Arc<Config>,
        provider: E2bClient,
        sessions: Arc<SessionRegistry>,
        masker: Masker,
        task_key: TaskIdKey,
    ) -> Self {
        let metrics = Arc::new(GatewayMetrics::new(Arc::clone(&sessions)));
        let tasks = TaskService::new(masker.clone());
        let quotas = super::quotas::TenantQuotas::new(super::quotas::TenantLimits::from_config(&config));
        Self {
            tasks,
            quotas,
            config,
            provider,
            sessions,
            metrics,
            masker,
            drain: Drain::default(),
            cleanups: TaskTracker::new(),
            renewals: Arc::default(),
            stateless_verified: Mutex::default(),
            task_key,
        }
    }

    /// A sandbox already checked for this tenant by a sessionless call.
    pub(crate) fn stateless_cached(&self, tenant: &str, sandbox_id: &str) -> Option<wire::Sandbox> {
        let map = crate::sync::lock(&self.stateless_verified);
        map.get(sandbox_id).filter(|(t, _)| t == tenant).map(|(_, s)| s.clone())
    }

    pub(crate) fn stateless_remember(&self, tenant: &str, sandbox: &wire::Sandbox) {
        let mut map = crate::sync::lock(&self.stateless_verified);
        if map.len() >= STATELESS_CACHE_MAX {
            map.clear();
        }
        map.insert(sandbox.sandbox_id.clone(), (tenant.to_string(), sandbox.clone()));
    }

    pub(crate) fn deployment(&self) -> &str {
        &self.config.provider.deployment
    }

    /// Records the deadline a sandbox was created or renewed with.
    pub(crate) fn note_deadline(&self, sandbox_id: &str, deadline: SystemTime) {
        crate::sync::lock(&self.renewals).entry(sandbox_id.to_string()).or_insert((None, deadline)).1 = deadline;
    }

    /// The deadline we believe a sandbox has (from its creation, renewal or last look-up).
    pub(crate) fn known_deadline(&self, sandbox_id: &str) -> Option<SystemTime> {
        crate::sync::lock(&self.renewals).get(sandbox_id).map(|(_, deadline)| *deadline)
    }

    /// Extends a sandbox's deadline to now + `renew_on_use_secs` in the background (best effort,
    /// at most once per 10 s per sandbox, never shortening a deadline we know to be later).
    pub(crate) fn renew_on_use(self: &Arc<Self>, sandbox_id: &str) {
        let secs = self.config.sandbox.renew_on_use_secs;
        if secs == 0 {
            return;
        }
        let wanted = SystemTime::now() + Duration::from_secs(secs);
        {
            let mut map = crate::sync::lock(&self.renewals);
            if let Some((last, deadline)) = map.get(sandbox_id)
                && (last.is_some_and(|t| t.elapsed() < RENEW_MIN_INTERVAL) || *deadline >= wanted)
            {
                return;
            }
            map.insert(sandbox_id.to_string(), (Some(Instant::now()), wanted));
        }
        let core = Arc::clone(self);
        let id = sandbox_id.to_string();
        tokio::spawn(async move {
            if let Err(err) = core.provider.set_timeout(&id, secs).await {
                tracing::debug!(sandbox = %id, error = %err, "timeout renewal failed (best effort)");
            }
        });
    }

    pub(crate) fn forget_sandbox(&self, sandbox_id: &str) {
        forget_sandbox_in(&self.sessions, &self.renewals, sandbox_id);
        crate::sync::lock(&self.stateless_verified).remove(sandbox_id);
    }

    /// Kills a sandbox the caller is allowed to kill, and forgets it everywhere.
    pub(crate) async fn kill_and_forget(&self, sandbox_id: &str) -> Result<bool, E2bError> {
        let killed = self.provider.kill_sandbox(sandbox_id).await?;
        self.forget_sandbox(sandbox_id);
        Ok(killed)
    }

    /// Ends every remaining session (server shutdown) and waits, bounded, for their cleanups.
    pub async fn end_all_sessions(&self, timeout: Duration) {
        if self.sessions.store().is_some() {
            // Sessions live on in Redis: another replica (or this one restarted) continues them.
            let left = self.sessions.take_all().len();
            tracing::info!(sessions = left, "sessions left in Redis for the other replicas");
        }
        for (id, state) in self.sessions.take_all() {
            self.session_ended(id, state, EndReason::Shutdown);
        }
        self.cleanups.close();
        if tokio::time::timeout(timeout, self.cleanups.wait()).await.is_err() {
            tracing::warn!("session cleanup did not finish within {timeout:?}; some sandboxes may outlive the gateway");
        }
    }
}

impl SessionEndHook for GatewayCore {
    fn session_ended(&self, session_id: String, state: SessionState, reason: EndReason) {
        let to_kill: Vec<String> = state.owned.difference(&state.retained).cloned().collect();
        let retained: Vec<String> = state.retained.iter().cloned().collect();
        let connected: Vec<String> = state.verified.keys().filter(|id| !state.owned.contains(*id)).cloned().collect();
        let tenant = state.tenant.clone().unwrap_or_default();
        if to_kill.is_empty() {
            tracing::info!(session = %session_id, tenant = %tenant, reason = reason.as_str(), ?retained,
                kept_not_owned = ?connected, "session ended; nothing to kill");
            return;
        }
        let provider = self.provider.clone();
        let registry = Arc::clone(&self.sessions);
        let renewals = Arc::clone(&self.renewals);
        self.cleanups.spawn(async move {
            let mut killed = Vec::new();
            let mut failed = Vec::new();
            for id in &to_kill {
                match tokio::time::timeout(CLEANUP_KILL_TIMEOUT, provider.kill_sandbox(id)).await {
                    Ok(Ok(_)) => killed.push(id.clone()),
                    Ok(Err(err)) if err.is_sandbox_gone() => killed.push(id.clone()),
                    Ok(Err(err)) => failed.push(format!("{id}: {err}")),
                    Err(_) => failed.push(format!("{id}: timed out")),
                }
                forget_sandbox_in(&registry, &renewals, id);
            }
            tracing::info!(session = %session_id, tenant = %tenant, reason = reason.as_str(), ?killed, ?failed,
                kept_retained = ?retained, kept_not_owned = ?connected,
                "session ended; killed its owned sandboxes (retained ones kept: tasks were started in them)");
        });
    }
}
