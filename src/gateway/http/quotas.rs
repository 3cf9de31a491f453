//! Per-tenant limits (`[limits]`): live sandboxes, live MCP sessions and
//! concurrent tool calls, so that no tenant can take a whole shared pool
//! (the deployment's sandboxes, the listener's connections) from the others.
//! A key left unset gets a fair-share default derived from the deployment
//! ([`TenantLimits::from_config`]). Each refusal names the limit, its value,
//! where the value comes from and what frees a slot, and is never phrased as
//! a transient failure.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use axum::extract::{Request, State};
use axum::http::{Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::auth::Tenant;
use super::protocol_version::is_stateless_headers;
use crate::config::{Config, ProviderKind};
use crate::gateway::sessions::SessionRegistry;

/// The deployment size assumed for `provider.kind = "e2b"`, whose limit the gateway cannot read:
/// the concurrent sandboxes of E2B's smallest (Hobby) plan.
pub const E2B_ASSUMED_MAX_SANDBOXES: usize = 20;
/// The snapshots assumed for `provider.kind = "e2b"`, whose limit the gateway cannot read: as many
/// as the local provider keeps by default.
pub const E2B_ASSUMED_MAX_SNAPSHOTS: usize = 100;

/// One per-tenant limit in force.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Limit {
    /// 0: no limit.
    pub max: usize,
    /// The setting as a refusal quotes it: `limits.KEY = N`, and for a derived default, from what.
    pub setting: String,
}

impl Limit {
    fn configured(key: &str, max: usize) -> Self {
        Self { max, setting: format!("limits.{key} = {max}") }
    }

    fn derived(key: &str, max: usize, from: String) -> Self {
        Self { max, setting: format!("limits.{key} = {max}, the default: {from}") }
    }
}

/// The per-tenant limits of a deployment: `[limits]`, with unset keys derived from the deployment.
#[derive(Debug, Clone, Default)]
pub struct TenantLimits {
    pub sandboxes: Limit,
    pub sessions: Limit,
    pub calls: Limit,
    pub snapshots: Limit,
}

impl TenantLimits {
    /// Resolves `config.limits`. Unset keys:
    /// - sandboxes: the deployment's limit (`local.max_sandboxes`; [`E2B_ASSUMED_MAX_SANDBOXES`] for
    ///   E2B) divided by the tenants that can sign in (those of `auth.tokens`; at least 2 with OAuth,
    ///   where any number can), at least 1; none with a single tenant, who has no one to starve;
    /// - sessions and concurrent calls: a quarter of `server.max_connections` each, so one tenant's
    ///   calls in flight and sessions' event streams together hold at most half of the listener's
    ///   connections (and a quarter of the embedded provider's).
    pub fn from_config(config: &Config) -> Self {
        let limits = &config.limits;
        let tenants = tenants_that_can_sign_in(config);
        let sandboxes = match limits.max_sandboxes_per_tenant {
            Some(max) => Limit::configured("max_sandboxes_per_tenant", max),
            None if tenants <= 1 => Limit::derived(
                "max_sandboxes_per_tenant",
                0,
                "none with a single tenant (the deployment's limit applies)".into(),
            ),
            None => {
                let (deployment, source) = match config.provider.kind {
                    ProviderKind::Local => {
                        let max = usize::try_from(config.local.max_sandboxes).unwrap_or(usize::MAX);
                        (max, format!("local.max_sandboxes = {max}"))
                    }
                    ProviderKind::E2b => {
                        (E2B_ASSUMED_MAX_SANDBOXES, format!("{E2B_ASSUMED_MAX_SANDBOXES} sandboxes (E2B's Hobby plan)"))
                    }
                };
                let share = (deployment / tenants).max(1);
                Limit::derived("max_sandboxes_per_tenant", share, format!("{source} shared by {tenants} tenants"))
            }
        };
        let snapshots = match limits.max_snapshots_per_tenant {
            Some(max) => Limit::configured("max_snapshots_per_tenant", max),
            None if tenants <= 1 => Limit::derived(
                "max_snapshots_per_tenant",
                0,
                "none with a single tenant (the provider's limit applies)".into(),
            ),
            None => {
                let (deployment, source) = match config.provider.kind {
                    ProviderKind::Local => {
                        let max = usize::try_from(config.local.max_snapshots).unwrap_or(usize::MAX);
                        (max, format!("local.max_snapshots = {max}"))
                    }
                    ProviderKind::E2b => (E2B_ASSUMED_MAX_SNAPSHOTS, format!("{E2B_ASSUMED_MAX_SNAPSHOTS} snapshots")),
                };
                let share = (deployment / tenants).max(1);
                Limit::derived("max_snapshots_per_tenant", share, format!("{source} shared by {tenants} tenants"))
            }
        };
        let quarter = (config.server.max_connections / 4).max(1);
        let per_listener = |key: &str, value: Option<usize>| match value {
            Some(max) => Limit::configured(key, max),
            None => Limit::derived(
                key,
                quarter,
                format!("a quarter of server.max_connections = {}", config.server.max_connections),
            ),
        };
        Self {
            sandboxes,
            snapshots,
            sessions: per_listener("max_sessions_per_tenant", limits.max_sessions_per_tenant),
            calls: per_listener("max_concurrent_calls_per_tenant", limits.max_concurrent_calls_per_tenant),
        }
    }
}

/// How many tenants can use the deployment: the distinct tenants of `auth.tokens`, at least 2 when
/// OAuth is on (any number of tenants can sign in), at least 1 (no auth: one tenant).
fn tenants_that_can_sign_in(config: &Config) -> usize {
    let static_tenants = config.auth.tokens.iter().map(|t| t.tenant.as_str()).collect::<BTreeSet<_>>().len();
    let floor = if config.auth.oauth.is_enabled() { 2 } else { 1 };
    static_tenants.max(floor)
}

/// Counters behind the per-tenant limits.
#[derive(Default)]
pub struct TenantQuotas {
    limits: TenantLimits,
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
        let mut calls = crate::sync::lock(&self.quotas.calls);
        if let Some(count) = calls.get_mut(&self.tenant) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                calls.remove(&self.tenant);
            }
        }
    }
}

impl TenantQuotas {
    pub fn new(limits: TenantLimits) -> Arc<Self> {
        Arc::new(TenantQuotas { limits, ..Default::default() })
    }

    /// The limits in force.
    pub fn limits(&self) -> &TenantLimits {
        &self.limits
    }

    /// Admits one more tool call of `tenant`, or says which limit refused it.
    pub fn start_call(self: &Arc<Self>, tenant: &str) -> Result<CallPermit, QuotaRefusal> {
        let limit = &self.limits.calls;
        let mut calls = crate::sync::lock(&self.calls);
        let count = calls.entry(tenant.to_owned()).or_default();
        if limit.max > 0 && *count >= limit.max {
            return Err(QuotaRefusal::Calls {
                tenant: tenant.to_owned(),
                running: *count,
                setting: limit.setting.clone(),
            });
        }
        *count += 1;
        Ok(CallPermit { quotas: Arc::clone(self), tenant: tenant.to_owned() })
    }

    /// Serialises sandbox creation per tenant so the live count cannot be overtaken by a
    /// concurrent create; hold the guard across the count and the create.
    pub async fn create_guard(&self, tenant: &str) -> tokio::sync::OwnedMutexGuard<()> {
        let lock = Arc::clone(crate::sync::lock(&self.creates).entry(tenant.to_owned()).or_default());
        lock.lock_owned().await
    }

    /// The per-tenant sandbox limit (0: none).
    pub fn max_sandboxes(&self) -> usize {
        self.limits.sandboxes.max
    }

    /// The refusal when `tenant` already has `live` sandboxes.
    pub fn sandbox_refusal(&self, tenant: &str, live: usize) -> QuotaRefusal {
        QuotaRefusal::Sandboxes { tenant: tenant.to_owned(), live, setting: self.limits.sandboxes.setting.clone() }
    }

    /// Refuses another snapshot of `tenant`, who keeps `kept` now, at its snapshot limit.
    pub fn check_snapshots(&self, tenant: &str, kept: usize) -> Result<(), QuotaRefusal> {
        let max = self.limits.snapshots.max;
        if max == 0 || kept < max {
            return Ok(());
        }
        Err(QuotaRefusal::Snapshots { tenant: tenant.to_owned(), kept, setting: self.limits.snapshots.setting.clone() })
    }

    /// Refuses `count` more sandboxes (forks) of `tenant`, who has `live` now, when they would pass
    /// its sandbox limit; forks count like creates.
    pub fn check_forks(&self, tenant: &str, live: usize, count: usize) -> Result<(), QuotaRefusal> {
        let max = self.limits.sandboxes.max;
        if max == 0 || live.saturating_add(count) <= max {
            return Ok(());
        }
        Err(QuotaRefusal::Forks {
            tenant: tenant.to_owned(),
            live,
            count,
            free: max.saturating_sub(live),
            setting: self.limits.sandboxes.setting.clone(),
        })
    }
}

/// A per-tenant limit refusing a tool call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuotaRefusal {
    #[error(
        "tenant limit reached: {running} tool calls of tenant {tenant} are already running ({setting}); \
         a slot frees when one of them finishes (a get_task with wait_seconds holds one while it waits): \
         wait for one before calling again"
    )]
    Calls { tenant: String, running: usize, setting: String },
    #[error(
        "tenant limit reached: tenant {tenant} already has {live} live sandboxes ({setting}); a slot \
         frees when one is killed (kill_sandbox; list_sandboxes shows yours), when the MCP session that \
         created it ends (unless a task was started in it), or when it reaches its deadline; then create again"
    )]
    Sandboxes { tenant: String, live: usize, setting: String },
    #[error(
        "tenant limit reached: tenant {tenant} has {live} live sandboxes and {count} forks would pass its limit \
         ({setting}; forks count like created sandboxes); ask for at most {free} forks, or free slots first \
         (kill_sandbox; list_sandboxes shows yours)"
    )]
    Forks { tenant: String, live: usize, count: usize, free: usize, setting: String },
    #[error(
        "tenant limit reached: tenant {tenant} already keeps {kept} snapshots ({setting}); delete one first \
         (delete_snapshot; list_snapshots shows yours), or take this one again under the name of one you no \
         longer need (the same name replaces it)"
    )]
    Snapshots { tenant: String, kept: usize, setting: String },
}

/// State of the session-limit middleware.
#[derive(Clone)]
pub struct SessionLimit {
    pub sessions: Arc<SessionRegistry>,
    pub limit: Limit,
    /// `server.session_idle_timeout_secs`, for the refusal.
    pub idle_timeout_secs: u64,
}

/// Refuses a new MCP session (a legacy POST without `Mcp-Session-Id`) when the tenant already has
/// its limit of live sessions (`limits.max_sessions_per_tenant`): 429 with a JSON-RPC error saying so.
/// 2026-07-28 requests never open a session, so they are not refused here.
pub async fn limit_sessions(State(limit): State<SessionLimit>, request: Request, next: Next) -> Response {
    let headers = request.headers();
    let stateless = is_stateless_headers(headers);
    let new_session = request.method() == Method::POST && !headers.contains_key("mcp-session-id") && !stateless;
    if limit.limit.max > 0
        && new_session
        && let Some(Tenant(tenant)) = request.extensions().get::<Tenant>()
    {
        let live = limit.sessions.sessions_of(tenant);
        if live >= limit.limit.max {
            let message = format!(
                "tenant limit reached: tenant {tenant} already has {live} live MCP sessions ({}); a slot frees \
                 when one ends: end a session you no longer use (HTTP DELETE with its Mcp-Session-Id, or close \
                 the client) or wait for idle ones to expire ({} s without a request)",
                limit.limit.setting, limit.idle_timeout_secs
            );
            let body = serde_json::json!({"jsonrpc": "2.0", "id": null, "error": {"code": -32000, "message": message}});
            return (StatusCode::TOO_MANY_REQUESTS, [(header::CONTENT_TYPE, "application/json")], body.to_string())
                .into_response();
        }
    }
    next.run(request).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::TokenEntry;

    fn with_tenants(names: &[&str]) -> Config {
        let mut config = Config::default();
        config.auth.tokens = names.iter().map(|t| TokenEntry { tenant: (*t).into(), sha256: "a".repeat(64) }).collect();
        config
    }

    #[test]
    fn unset_sandbox_limit_is_the_deployments_limit_shared_by_the_tenants() {
        let limits = TenantLimits::from_config(&with_tenants(&["a", "b"]));
        assert_eq!(limits.sandboxes.max, 50);
        assert_eq!(
            limits.sandboxes.setting,
            "limits.max_sandboxes_per_tenant = 50, the default: local.max_sandboxes = 100 shared by 2 tenants"
        );
        // Tenants, not tokens: two tokens of one tenant count once.
        assert_eq!(TenantLimits::from_config(&with_tenants(&["a", "a", "b", "c"])).sandboxes.max, 33);
        // Never 0 (which would mean none), even with more tenants than sandboxes.
        let mut crowded = with_tenants(&["a", "b", "c"]);
        crowded.local.max_sandboxes = 2;
        assert_eq!(TenantLimits::from_config(&crowded).sandboxes.max, 1);
        // A single tenant has no one to starve: only the deployment's limit.
        assert_eq!(TenantLimits::from_config(&with_tenants(&["a"])).sandboxes.max, 0);
        assert_eq!(TenantLimits::from_config(&Config::default()).sandboxes.max, 0, "no auth: one tenant");
        // OAuth: any number of tenants may sign in, so at least two shares.
        let mut oauth = Config::default();
        oauth.auth.oauth.issuer = "https://idp.example.com".into();
        oauth.auth.oauth.audience = "https://mcp.example.com/mcp".into();
        assert!(oauth.auth.oauth.is_enabled());
        assert_eq!(TenantLimits::from_config(&oauth).sandboxes.max, 50);
        // E2B: the gateway cannot read the team's limit; the Hobby plan's 20 are assumed.
        let mut e2b = with_tenants(&["a", "b"]);
        e2b.provider.kind = ProviderKind::E2b;
        let limits = TenantLimits::from_config(&e2b);
        assert_eq!(limits.sandboxes.max, 10);
        assert!(limits.sandboxes.setting.contains("20 sandboxes (E2B's Hobby plan) shared by 2 tenants"));
    }

    #[test]
    fn unset_snapshot_limit_is_the_providers_snapshots_shared_by_the_tenants() {
        let limits = TenantLimits::from_config(&with_tenants(&["a", "b"]));
        assert_eq!(
            limits.snapshots.setting,
            "limits.max_snapshots_per_tenant = 50, the default: local.max_snapshots = 100 shared by 2 tenants"
        );
        assert_eq!(TenantLimits::from_config(&Config::default()).snapshots.max, 0, "none with a single tenant");
        let mut config = with_tenants(&["a", "b"]);
        config.limits.max_snapshots_per_tenant = Some(3);
        let quotas = TenantQuotas::new(TenantLimits::from_config(&config));
        assert!(quotas.check_snapshots("a", 2).is_ok());
        let refused = quotas.check_snapshots("a", 3).unwrap_err().to_string();
        assert!(refused.contains("already keeps 3 snapshots (limits.max_snapshots_per_tenant = 3)"), "{refused}");
    }

    #[test]
    fn configured_limits_win_and_zero_means_none() {
        let mut config = with_tenants(&["a", "b"]);
        config.limits.max_sandboxes_per_tenant = Some(0);
        config.limits.max_sessions_per_tenant = Some(3);
        config.limits.max_concurrent_calls_per_tenant = Some(7);
        let limits = TenantLimits::from_config(&config);
        assert_eq!(limits.sandboxes, Limit { max: 0, setting: "limits.max_sandboxes_per_tenant = 0".into() });
        assert_eq!(limits.sessions, Limit { max: 3, setting: "limits.max_sessions_per_tenant = 3".into() });
        assert_eq!(limits.calls, Limit { max: 7, setting: "limits.max_concurrent_calls_per_tenant = 7".into() });
    }

    #[test]
    fn unset_session_and_call_limits_are_a_quarter_of_the_listeners_connections() {
        let limits = TenantLimits::from_config(&Config::default());
        assert_eq!((limits.sessions.max, limits.calls.max), (256, 256));
        let mut small = Config::default();
        small.server.max_connections = 64;
        let limits = TenantLimits::from_config(&small);
        assert_eq!((limits.sessions.max, limits.calls.max), (16, 16));
        assert_eq!(
            limits.calls.setting,
            "limits.max_concurrent_calls_per_tenant = 16, the default: a quarter of server.max_connections = 64"
        );
        small.server.max_connections = 2;
        assert_eq!(TenantLimits::from_config(&small).calls.max, 1);
    }

    #[test]
    fn call_permits_are_per_tenant_and_released_on_drop() {
        let mut config = Config::default();
        config.limits.max_concurrent_calls_per_tenant = Some(1);
        let quotas = TenantQuotas::new(TenantLimits::from_config(&config));
        let first = quotas.start_call("a").unwrap();
        let refused = quotas.start_call("a").err().unwrap().to_string();
        assert!(
            refused.contains("limits.max_concurrent_calls_per_tenant = 1") && refused.contains("wait"),
            "{refused}"
        );
        let other = quotas.start_call("b").unwrap();
        drop(first);
        drop(quotas.start_call("a").unwrap());
        drop(other);
    }

    #[test]
    fn forks_count_against_the_sandbox_limit() {
        let mut config = with_tenants(&["a", "b"]);
        config.limits.max_sandboxes_per_tenant = Some(4);
        let quotas = TenantQuotas::new(TenantLimits::from_config(&config));
        assert!(quotas.check_forks("a", 1, 3).is_ok(), "exactly up to the limit");
        let refused = quotas.check_forks("a", 2, 3).unwrap_err().to_string();
        assert!(
            refused.starts_with("tenant limit reached: tenant a has 2 live sandboxes and 3 forks would pass its limit")
                && refused.contains("limits.max_sandboxes_per_tenant = 4")
                && refused.contains("ask for at most 2 forks"),
            "{refused}"
        );
        config.limits.max_sandboxes_per_tenant = Some(0);
        let unlimited = TenantQuotas::new(TenantLimits::from_config(&config));
        assert!(unlimited.check_forks("a", 100, 20).is_ok(), "0: no limit");
    }
}
