//! What every session shares: the per-session MCP handler type,
//! [`Gateway`] (the tool families in `tools/` add their tools to it,
//! `mcp::handler` combines them and serves MCP), and the state behind it
//! ([`GatewayCore`]): the provider client, the session registry, the masker,
//! quotas, metrics, the task service, graceful shutdown, the MCP task-id key.
//! The work done on that state outside a tool call lives beside it:
//! `sandboxes` (deadlines renewed on use, sandboxes checked for sessionless
//! callers, forgetting a sandbox that is gone), `session_end` (the clean-up of
//! a session kept in memory), `shared_sessions` (sessions kept in Redis) and
//! `mcp_task_key` (where the MCP task-id key comes from).

pub mod mcp_task_key;
pub mod sandboxes;
pub mod session_end;
pub mod shared_sessions;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use rmcp::handler::server::router::tool::ToolRouter;
use tokio_util::task::TaskTracker;

use self::mcp_task_key::McpTaskIdKey;
use self::sandboxes::Renewals;
use crate::config::Config;
use crate::e2b::{E2bClient, wire};
use crate::gateway::http::drain::Drain;
use crate::gateway::http::metrics::GatewayMetrics;
use crate::gateway::http::quotas::{TenantLimits, TenantQuotas};
use crate::gateway::sessions::SessionRegistry;
use crate::masking::Masker;
use crate::tasks::service::TaskService;

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
    pub quotas: Arc<TenantQuotas>,
    /// Session cleanups under way (awaited on shutdown).
    pub cleanups: TaskTracker,
    /// Renewal bookkeeping per sandbox (shared with session cleanups, which forget killed ones).
    renewals: Arc<Renewals>,
    /// Sandboxes checked for sessionless (2026-07-28) callers: sandbox id -> (tenant, connection info).
    stateless_verified: Mutex<HashMap<String, (String, wire::Sandbox)>>,
    /// Key binding MCP task ids to their tenant (see `mcp::mcp_task_id`).
    pub(crate) task_key: McpTaskIdKey,
}

impl GatewayCore {
    pub fn new(
        config: Arc<Config>,
        provider: E2bClient,
        sessions: Arc<SessionRegistry>,
        masker: Masker,
        task_key: McpTaskIdKey,
    ) -> Self {
        let metrics = Arc::new(GatewayMetrics::new(Arc::clone(&sessions)));
        let tasks = TaskService::new(masker.clone());
        let quotas = TenantQuotas::new(TenantLimits::from_config(&config));
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

    pub(crate) fn deployment(&self) -> &str {
        &self.config.provider.deployment
    }
}
