//! The MCP handler (`Gateway`, one per session, sharing one `GatewayCore`)
//! and the helpers every tool family uses: the caller's tenant and session,
//! sandbox resolution with the tenant check, session retention, timeout
//! renewal, secret masking, and the one-line-per-call log.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use http::request::Parts;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::tool::ToolCallContext;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CancelTaskParams, DiscoverResult, GetTaskParams, GetTaskResult,
    Implementation, ListToolsResult, PaginatedRequestParams, ProtocolVersion, ServerCapabilities, ServerConfig,
    UpdateTaskParams,
};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::{ErrorData as McpError, Json, ServerHandler, tool_handler};
use tokio_util::task::TaskTracker;

use super::auth::Tenant;
use super::masking::SecretMasker;
use super::metrics::GatewayMetrics;
use super::sessions::{EndReason, SessionEndHook, SessionRegistry, SessionState};
use super::{generation, mcp_tasks};
use crate::config::Config;
use crate::e2b::{E2bClient, E2bError, EnvdClient, wire};
use crate::tasks::service::TaskService;

/// Metadata keys the gateway puts on every sandbox it creates.
pub const META_TENANT: &str = "sandbox_mcp_tenant";
pub const META_SESSION: &str = "sandbox_mcp_session";
pub const META_DEPLOYMENT: &str = "sandbox_mcp_deployment";
/// Prefix reserved for the gateway's own metadata keys.
pub const META_RESERVED_PREFIX: &str = "sandbox_mcp_";
/// At most one timeout renewal per sandbox per this interval.
const RENEW_MIN_INTERVAL: Duration = Duration::from_secs(10);
/// Bound on each kill during session cleanup.
const CLEANUP_KILL_TIMEOUT: Duration = Duration::from_secs(15);

/// A tool result: structured value (plus its text copy), or an `isError` sentence.
pub(crate) type ToolResult<T> = Result<Json<T>, String>;

/// State shared by every session's handler.
pub struct GatewayCore {
    pub config: Arc<Config>,
    pub provider: E2bClient,
    pub sessions: Arc<SessionRegistry>,
    pub masker: SecretMasker,
    pub in_flight: InFlight,
    pub shutting_down: AtomicBool,
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
    pub(crate) task_key: super::mcp_tasks::TaskIdKey,
}

/// Most sandboxes remembered for sessionless callers (the cache is cleared when full).
const STATELESS_CACHE_MAX: usize = 4096;

/// sandbox id -> (last renewal by us, deadline we believe it has).
type Renewals = Mutex<HashMap<String, (Option<Instant>, SystemTime)>>;

/// Forgets a sandbox that no longer exists: in every session, and its renewal record.
fn forget_sandbox_in(sessions: &SessionRegistry, renewals: &Renewals, sandbox_id: &str) {
    sessions.forget_everywhere(sandbox_id);
    if let Ok(mut map) = renewals.lock() {
        map.remove(sandbox_id);
    }
}

impl GatewayCore {
    pub fn new(
        config: Arc<Config>,
        provider: E2bClient,
        sessions: Arc<SessionRegistry>,
        masker: SecretMasker,
        task_key: super::mcp_tasks::TaskIdKey,
    ) -> Self {
        let metrics = Arc::new(GatewayMetrics::new(Arc::clone(&sessions)));
        let tasks = TaskService::new(masker.values());
        let quotas = super::quotas::TenantQuotas::new(config.limits.clone());
        Self {
            tasks,
            quotas,
            config,
            provider,
            sessions,
            metrics,
            masker,
            in_flight: InFlight::default(),
            shutting_down: AtomicBool::new(false),
            cleanups: TaskTracker::new(),
            renewals: Arc::default(),
            stateless_verified: Mutex::default(),
            task_key,
        }
    }

    /// A sandbox already checked for this tenant by a sessionless call.
    fn stateless_cached(&self, tenant: &str, sandbox_id: &str) -> Option<wire::Sandbox> {
        let map = self.stateless_verified.lock().ok()?;
        map.get(sandbox_id).filter(|(t, _)| t == tenant).map(|(_, s)| s.clone())
    }

    fn stateless_remember(&self, tenant: &str, sandbox: &wire::Sandbox) {
        if let Ok(mut map) = self.stateless_verified.lock() {
            if map.len() >= STATELESS_CACHE_MAX {
                map.clear();
            }
            map.insert(sandbox.sandbox_id.clone(), (tenant.to_string(), sandbox.clone()));
        }
    }

    pub(crate) fn deployment(&self) -> &str {
        &self.config.provider.deployment
    }

    /// Records the deadline a sandbox was created or renewed with.
    pub(crate) fn note_deadline(&self, sandbox_id: &str, deadline: SystemTime) {
        if let Ok(mut map) = self.renewals.lock() {
            map.entry(sandbox_id.to_string()).or_insert((None, deadline)).1 = deadline;
        }
    }

    /// The deadline we believe a sandbox has (from its creation, renewal or last look-up).
    pub(crate) fn known_deadline(&self, sandbox_id: &str) -> Option<SystemTime> {
        self.renewals.lock().ok()?.get(sandbox_id).map(|(_, deadline)| *deadline)
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
            let Ok(mut map) = self.renewals.lock() else { return };
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
        if let Ok(mut map) = self.stateless_verified.lock() {
            map.remove(sandbox_id);
        }
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

/// Counts `/mcp` POST requests in progress, responses included (graceful shutdown waits for zero).
#[derive(Default)]
pub struct InFlight {
    count: AtomicUsize,
    idle: tokio::sync::Notify,
}

/// Decrements the in-flight count when dropped.
pub struct InFlightGuard(Arc<GatewayCore>);

impl InFlight {
    /// Counts one request in flight until the guard is dropped.
    pub fn enter_owned(&self, core: &Arc<GatewayCore>) -> InFlightGuard {
        self.count.fetch_add(1, Ordering::SeqCst);
        InFlightGuard(Arc::clone(core))
    }

    pub fn current(&self) -> usize {
        self.count.load(Ordering::SeqCst)
    }

    /// Waits until no call is in flight, or the timeout passes; returns the count left.
    pub async fn wait_idle(&self, timeout: Duration) -> usize {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let notified = self.idle.notified();
            if self.current() == 0 {
                return 0;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return self.current();
            }
        }
    }
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        let in_flight = &self.0.in_flight;
        if in_flight.count.fetch_sub(1, Ordering::SeqCst) == 1 {
            in_flight.idle.notify_waiters();
        }
    }
}

/// Who is calling: from the request's `Parts` (tenant set by the auth layer, session id header).
#[derive(Debug)]
pub(crate) struct CallContext {
    pub tenant: String,
    /// The MCP session (legacy protocol versions); None for sessionless 2026-07-28 requests.
    pub session_id: Option<String>,
    /// The sandbox this call acted on (for the log line).
    sandbox: Mutex<Option<String>>,
}

impl CallContext {
    pub(crate) fn set_sandbox(&self, sandbox_id: &str) {
        if let Ok(mut slot) = self.sandbox.lock() {
            *slot = Some(sandbox_id.to_string());
        }
    }

    fn sandbox(&self) -> String {
        self.sandbox.lock().ok().and_then(|s| s.clone()).unwrap_or_default()
    }

    /// The session id for log lines ("-" when sessionless).
    pub(crate) fn session_label(&self) -> &str {
        self.session_id.as_deref().unwrap_or("-")
    }

    /// A sessionless context (2026-07-28 requests, the tasks bridge).
    pub(crate) fn stateless(tenant: String) -> Self {
        Self { tenant, session_id: None, sandbox: Mutex::new(None) }
    }
}

/// A sandbox the caller may use, with its envd client.
pub(crate) struct ResolvedSandbox {
    pub id: String,
    pub envd: EnvdClient,
}

/// The per-session MCP handler.
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
    /// Every tool family, combined once (raw schemars schemas, legacy descriptions).
    pub fn tool_router() -> ToolRouter<Gateway> {
        Self::sandbox_router() + Self::exec_router() + Self::file_router() + Self::task_router()
    }

    /// Both generations' routers, built once and shared by every session and request.
    pub fn routers() -> Routers {
        super::generation::build_routers(Self::tool_router())
    }

    pub fn new(core: Arc<GatewayCore>, routers: Arc<Routers>) -> Self {
        Self { core, routers }
    }

    /// The tenant and session of the current call; refuses calls outside a live session of the tenant.
    pub(crate) fn call_context(&self, tool: &'static str, parts: &Parts) -> Result<CallContext, String> {
        let tenant = parts.extensions.get::<Tenant>().map(|t| t.0.clone());
        let session_id = parts.headers.get("mcp-session-id").and_then(|v| v.to_str().ok()).map(str::to_string);
        let stateless = super::generation::is_stateless_request(parts);
        let result = match (tenant, session_id) {
            (None, _) => Err("internal error: the request carries no tenant".to_string()),
            (Some(tenant), _) if stateless => Ok(CallContext::stateless(tenant)),
            (Some(_), None) => {
                Err("this tool needs an MCP session (Mcp-Session-Id); initialize a session first".into())
            }
            (Some(tenant), Some(session_id)) => match self.core.sessions.with_session(&session_id, &tenant, |_| ()) {
                Ok(()) => Ok(CallContext { tenant, session_id: Some(session_id), sandbox: Mutex::new(None) }),
                Err(err) => Err(err.to_string()),
            },
        };
        if let Err(err) = &result {
            self.core.metrics.record_tool_call(tool, false, None); // ops (metrics)
            tracing::info!(tool, outcome = "error", error = %err, "tool call");
        }
        result
    }

    /// Runs a tool body and logs one line with its outcome.
    pub(crate) async fn logged<T>(
        &self,
        tool: &'static str,
        call: &CallContext,
        body: impl Future<Output = Result<T, String>>,
    ) -> ToolResult<T> {
        let started = Instant::now();
        let result = match self.core.quotas.start_call(&call.tenant) {
            Ok(_permit) => body.await,
            Err(refusal) => Err(refusal),
        };
        let result = result.map_err(|e| self.core.masker.mask(&e).into_owned());
        let elapsed = started.elapsed();
        self.core.metrics.record_tool_call(tool, result.is_ok(), Some(elapsed)); // ops (metrics)
        let duration_ms = (elapsed.as_secs_f64() * 10_000.0).round() / 10.0;
        // Every client-supplied value that reaches the log is masked (a secret pasted as sandbox_id).
        let sandbox = call.sandbox();
        let sandbox = self.core.masker.mask(&sandbox);
        match &result {
            Ok(_) => tracing::info!(tool, session = %call.session_label(), tenant = %call.tenant,
                sandbox = %sandbox, duration_ms, outcome = "ok", "tool call"),
            Err(err) => tracing::info!(tool, session = %call.session_label(), tenant = %call.tenant,
                sandbox = %sandbox, duration_ms, outcome = "error", error = %err, "tool call"),
        }
        result.map(Json)
    }

    /// The sandbox a tool acts on: the given id or the session default, checked to belong to the
    /// caller's tenant (else "not found"), resumed if paused, with an envd client.
    pub(crate) async fn resolve_sandbox(
        &self,
        call: &CallContext,
        sandbox_id: Option<&str>,
    ) -> Result<ResolvedSandbox, String> {
        let id = self.sandbox_id_or_default(call, sandbox_id)?;
        call.set_sandbox(&id);
        let Some(session_id) = call.session_id.as_deref() else {
            let sandbox = match self.core.stateless_cached(&call.tenant, &id) {
                Some(sandbox) => sandbox,
                None => {
                    let sandbox = self.verify_and_connect(call, &id).await?;
                    self.core.stateless_remember(&call.tenant, &sandbox);
                    sandbox
                }
            };
            return Ok(ResolvedSandbox { envd: self.core.provider.envd(&sandbox), id });
        };
        let cached = self.core.sessions.with_session(session_id, &call.tenant, |s| s.verified.get(&id).cloned());
        let sandbox = match cached.map_err(|e| e.to_string())? {
            Some(sandbox) => sandbox,
            None => {
                let sandbox = self.verify_and_connect(call, &id).await?;
                let _ = self.core.sessions.with_session(session_id, &call.tenant, |s| {
                    s.verified.insert(id.clone(), sandbox.clone());
                });
                sandbox
            }
        };
        Ok(ResolvedSandbox { envd: self.core.provider.envd(&sandbox), id })
    }

    /// Checks the sandbox's tenant and deployment tags; answers "not found" for anyone else's.
    pub(crate) async fn check_owner(&self, call: &CallContext, id: &str) -> Result<wire::SandboxDetail, String> {
        let detail = self.core.provider.get_sandbox(id).await.map_err(|e| self.provider_error("look up", id, &e))?;
        let tenant_ok = detail.metadata.get(META_TENANT).map(String::as_str) == Some(call.tenant.as_str());
        let deployment_ok = detail.metadata.get(META_DEPLOYMENT).map(String::as_str) == Some(self.core.deployment());
        if !(tenant_ok && deployment_ok) {
            return Err(not_found_message(id));
        }
        if let Ok(end) = chrono::DateTime::parse_from_rfc3339(&detail.end_at) {
            let deadline = SystemTime::UNIX_EPOCH + Duration::from_secs(end.timestamp().max(0) as u64);
            self.core.note_deadline(id, deadline);
        }
        Ok(detail)
    }

    async fn verify_and_connect(&self, call: &CallContext, id: &str) -> Result<wire::Sandbox, String> {
        let detail = self.check_owner(call, id).await?;
        if detail.state == wire::SandboxState::Paused {
            return self
                .core
                .provider
                .connect_sandbox(id, None)
                .await
                .map_err(|e| self.provider_error("resume", id, &e));
        }
        Ok(wire::Sandbox {
            template_id: detail.template_id,
            sandbox_id: detail.sandbox_id,
            alias: detail.alias,
            client_id: detail.client_id,
            envd_version: detail.envd_version,
            envd_access_token: detail.envd_access_token,
            traffic_access_token: None,
            domain: detail.domain,
        })
    }

    /// The explicit id (validated) or the session default.
    pub(crate) fn sandbox_id_or_default(&self, call: &CallContext, sandbox_id: Option<&str>) -> Result<String, String> {
        match sandbox_id {
            Some(id) => {
                validate_sandbox_id(id)?;
                Ok(id.to_string())
            }
            None => {
                let Some(session_id) = call.session_id.as_deref() else {
                    return Err(super::generation::MISSING_SANDBOX_ID.to_string());
                };
                let default = self
                    .core
                    .sessions
                    .with_session(session_id, &call.tenant, |s| s.default_sandbox.clone())
                    .map_err(|e| e.to_string())?;
                default.ok_or_else(|| {
                    "no sandbox_id given and this session has no default sandbox: call create_sandbox (new sandbox) \
                     or connect_sandbox (existing one) first, or pass sandbox_id"
                        .to_string()
                })
            }
        }
    }

    /// Extends the sandbox deadline after ordinary use (best effort, background).
    pub(crate) fn renew_on_use(&self, sandbox_id: &str) {
        self.core.renew_on_use(sandbox_id);
    }

    /// Turns a provider error into a sentence an agent can act on; forgets sandboxes that are gone.
    pub(crate) fn provider_error(&self, action: &str, sandbox_id: &str, err: &E2bError) -> String {
        if err.is_sandbox_gone() {
            self.core.metrics.record_provider_error(err.op()); // ops (metrics)
            self.core.forget_sandbox(sandbox_id);
            return not_found_message(sandbox_id);
        }
        self.provider_failure(&format!("{action} sandbox {sandbox_id}"), err)
    }

    /// Counts a provider error and phrases it as "could not {what}: ...", telling the agent to retry
    /// when the error is transient. For calls that concern no particular sandbox (create, list).
    pub(crate) fn provider_failure(&self, what: &str, err: &E2bError) -> String {
        self.core.metrics.record_provider_error(err.op()); // ops (metrics)
        if let E2bError::RateLimited { message, .. } = err
            && message.contains("maximum of")
        {
            // The provider's global sandbox limit: not transient, and the way out is to free one.
            return format!(
                "could not {what}: the sandbox limit of the whole deployment is reached ({message}); kill a sandbox \
                 you no longer need (kill_sandbox; list_sandboxes shows yours) or ask the operator to raise \
                 local.max_sandboxes"
            );
        }
        if err.is_transient() {
            return format!(
                "could not {what}: the sandbox provider is unreachable or busy ({err}); try again in a few seconds"
            );
        }
        format!("could not {what}: {err}")
    }
}

/// The "not found" sentence (also used for other tenants' sandboxes).
pub(crate) fn not_found_message(sandbox_id: &str) -> String {
    format!(
        "sandbox {sandbox_id} not found: it does not exist, has been killed or expired, or is not yours; \
         call list_sandboxes to see your sandboxes or create_sandbox for a new one"
    )
}

/// Sandbox ids: 1-128 of `[A-Za-z0-9_-]`.
pub(crate) fn validate_sandbox_id(id: &str) -> Result<(), String> {
    if id.is_empty() || id.len() > 128 || !id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_') {
        return Err(format!(
            "invalid sandbox_id {:?}: expected the id returned by create_sandbox or list_sandboxes",
            crate::gateway::args::clip(id, 80)
        ));
    }
    Ok(())
}

#[tool_handler(router = self.routers.legacy)]
impl ServerHandler for Gateway {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().enable_tasks().build())
            .with_server_info(Implementation::new("sandbox-mcp", env!("CARGO_PKG_VERSION")))
            .with_instructions(generation::LEGACY_INSTRUCTIONS)
    }

    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        // Legacy versions keep sessions; 2026-07-28 requests are served without one.
        Cow::Borrowed(ProtocolVersion::known_up_to(&ProtocolVersion::V_2026_07_28))
    }

    async fn discover(&self, _context: RequestContext<RoleServer>) -> Result<DiscoverResult, McpError> {
        let info = self.get_info().with_instructions(generation::STATELESS_INSTRUCTIONS);
        Ok(DiscoverResult::from_server_info(self.supported_protocol_versions().into_owned(), info))
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let stateless = generation::is_stateless_protocol(context.protocol_version().as_ref());
        Ok(generation::list_tools(&self.routers, stateless))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        if mcp_tasks::wants_task(&request, &context) {
            return self.call_tool_as_task(request, context).await;
        }
        let stateless = generation::is_stateless_protocol(context.protocol_version().as_ref());
        let router = if stateless { &self.routers.modern } else { &self.routers.legacy };
        router.call(ToolCallContext::new(self, request, context)).await
    }

    async fn get_task(
        &self,
        request: GetTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, McpError> {
        self.mcp_get_task(&request.task_id, &context).await
    }

    async fn update_task(
        &self,
        request: UpdateTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        self.mcp_update_task(&request.task_id, &context).await
    }

    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        self.mcp_cancel_task(&request.task_id, &context).await
    }
}
