//! Sandbox lifecycle tools: `create_sandbox`, `connect_sandbox`,
//! `kill_sandbox`, `list_sandboxes`.

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use http::request::Parts;
use rmcp::handler::server::tool::Extension;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::{Json, tool, tool_router};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::access::{META_DEPLOYMENT, META_RESERVED_PREFIX, META_SESSION, META_TENANT};
use super::args::{
    InvalidArgument, validate_envs, validate_metadata, validate_range, validate_sandbox_id, validate_template,
};
use super::calls::CallContext;
use super::error::ToolError;
use crate::e2b::wire;
use crate::gateway::sessions::SessionState;
use crate::gateway::state::Gateway;

#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSandboxArgs {
    /// Template to start from: a name, alias or template_id from list_templates, or a snapshot_id or
    /// name from snapshot_sandbox / list_snapshots. Default "base" (a stock Linux with python3).
    #[serde(default)]
    pub template: Option<String>,
    /// Lifetime in seconds before the sandbox is destroyed automatically (default from the server
    /// config, usually 600; the maximum is the server's sandbox.max_timeout_secs). Using the sandbox
    /// with run_command or the file tools extends it.
    #[serde(default)]
    pub timeout: Option<u64>,
    /// Environment variables set for every command in the sandbox.
    #[serde(default)]
    pub envs: Option<HashMap<String, String>>,
    /// Your own key/value labels (at most 32; keys starting with "sandbox_mcp_" or "fork." are reserved).
    #[serde(default)]
    pub metadata: Option<HashMap<String, String>>,
    /// Network rules. Outbound default: the internet is reachable, private and internal addresses
    /// are not. Inbound default: servers in the sandbox answer only requests that carry its
    /// traffic_access_token (see allow_public_traffic).
    #[serde(default)]
    pub network: Option<NetworkArgs>,
}

/// Network rules of a new sandbox (E2B's semantics: allow_out wins over deny_out).
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NetworkArgs {
    /// Destinations the sandbox may reach even when denied otherwise: CIDR blocks ("10.1.0.0/16")
    /// or IP addresses ("192.168.1.5"); at most 64. Loopback and link-local addresses (cloud
    /// metadata) are never allowed, in any spelling (IPv4-mapped, -compatible or NAT64 IPv6
    /// forms count as the IPv4 address they carry); the provider host's own addresses are never
    /// reachable.
    #[serde(default)]
    pub allow_out: Option<Vec<String>>,
    /// Destinations the sandbox may not reach: CIDR blocks or IP addresses ("0.0.0.0/0" blocks
    /// everything not in allow_out); at most 64.
    #[serde(default)]
    pub deny_out: Option<Vec<String>>,
    /// false: no outbound access except allow_out (default true).
    #[serde(default)]
    pub allow_internet_access: Option<bool>,
    /// true: servers listening in the sandbox answer anyone who can reach its port URLs, without
    /// a token. Default false: every request to one of its ports must carry the
    /// traffic_access_token this tool returns, in the e2b-traffic-access-token header.
    #[serde(default)]
    pub allow_public_traffic: Option<bool>,
}

/// Prefix of the metadata keys a provider sets on a fork (`fork.parent`, `fork.carries`): not the
/// user's to set, so that a sandbox's `parent` is always the provider's word.
const FORK_METADATA_PREFIX: &str = "fork.";

/// Whether a create failed for its template: a 404 (a create names no sandbox; the local
/// provider and E2B answer an unknown template so), or E2B's 400 naming the template.
fn is_unknown_template(err: &crate::e2b::E2bError) -> bool {
    match err {
        crate::e2b::E2bError::NotFound { sandbox_id: None, .. } => true,
        crate::e2b::E2bError::Api { status: 400, message, .. } => {
            let text = message.to_lowercase();
            text.contains("template") && text.contains("not found")
        }
        _ => false,
    }
}

/// Most entries in each of `allow_out` and `deny_out`.
const MAX_NETWORK_RULES: usize = 64;

/// Checks the network argument; loopback and link-local destinations may never be allowed through
/// the gateway (they would reach the host's services or a cloud metadata endpoint).
fn validate_network(network: &NetworkArgs) -> Result<(), InvalidArgument> {
    for (name, list) in [("allow_out", &network.allow_out), ("deny_out", &network.deny_out)] {
        let list = list.as_deref().unwrap_or_default();
        if list.len() > MAX_NETWORK_RULES {
            return Err(InvalidArgument(format!(
                "network.{name} has {} entries; at most {MAX_NETWORK_RULES}",
                list.len()
            )));
        }
        for entry in list {
            super::args::validate_network_entry(name, entry)?;
        }
    }
    Ok(())
}

/// How to reach a server listening in the sandbox from outside it.
#[derive(Debug, Serialize, JsonSchema)]
pub struct InboundAccess {
    /// true: its ports answer requests without a token (created with allow_public_traffic).
    pub public: bool,
    /// Host name of the sandbox's port N from outside, with "{port}" to replace by N
    /// ("{port}-<sandbox_id>.<domain>", https on E2B); absent when the provider reports no sandbox
    /// domain (then its ports are reachable only on the provider's host).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// The header that must carry traffic_access_token on every request to a port (not public).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_header: Option<String>,
    /// The sandbox's traffic access token (not public). A credential: do not print or share it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub traffic_access_token: Option<String>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct CreateSandboxResult {
    /// Id of the new sandbox; it is now this session's default sandbox.
    pub sandbox_id: String,
    pub template: String,
    /// Seconds until it is destroyed unless used or extended.
    pub timeout_secs: u64,
    /// True when this MCP session owns the sandbox (killed when the session ends); false for sessionless
    /// (2026-07-28) callers, whose sandboxes live until their deadline or kill_sandbox.
    pub owned: bool,
    /// How long the sandbox lives (sessionless callers only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lifetime: Option<String>,
    /// How to reach servers in the sandbox from outside (the URL host and the token).
    pub inbound: InboundAccess,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SandboxIdArgs {
    /// Id of the sandbox (from create_sandbox or list_sandboxes).
    pub sandbox_id: String,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct ConnectSandboxResult {
    /// The sandbox, now this session's default sandbox.
    pub sandbox_id: String,
    pub template: String,
    /// "running" (a paused sandbox is resumed).
    pub state: String,
    /// When it will be destroyed unless used or extended (RFC 3339).
    pub end_at: String,
    /// Whether this session owns it (only sandboxes it created); connected sandboxes survive the session.
    pub owned: bool,
    /// How to reach servers in the sandbox from outside (the URL host and the token).
    pub inbound: InboundAccess,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct KillSandboxResult {
    pub sandbox_id: String,
    /// True if the sandbox was running and has been destroyed; false if it was already gone.
    pub killed: bool,
}

#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListSandboxesArgs {}

#[derive(Debug, Serialize, JsonSchema)]
pub struct SandboxSummary {
    pub sandbox_id: String,
    pub template: String,
    /// "running" or "paused".
    pub state: String,
    /// RFC 3339.
    pub started_at: String,
    /// RFC 3339: when it will be destroyed unless used or extended.
    pub end_at: String,
    /// Your own metadata (the gateway's sandbox_mcp_* keys and the provider's fork.* keys removed).
    pub metadata: HashMap<String, String>,
    /// For a fork (fork_sandbox): the id of the sandbox it was forked from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// What this session thinks of it: any of "default", "owned" (killed when the session ends),
    /// "retained" (a task was started in it: kept when the session ends).
    pub session_roles: Vec<String>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct ListSandboxesResult {
    /// Your tenant's sandboxes.
    pub sandboxes: Vec<SandboxSummary>,
    /// This session's default sandbox, if any (never for sessionless callers).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub default_sandbox: Option<String>,
    /// True if the list was cut to keep the answer under the 1 MiB message limit.
    pub truncated: bool,
}

/// The `create_sandbox` tool's name (its function below must have this name: `tools::tests` checks).
pub const CREATE_SANDBOX: &str = "create_sandbox";
/// The `connect_sandbox` tool's name (its function below must have this name: `tools::tests` checks).
pub const CONNECT_SANDBOX: &str = "connect_sandbox";
/// The `kill_sandbox` tool's name (its function below must have this name: `tools::tests` checks).
pub const KILL_SANDBOX: &str = "kill_sandbox";
/// The `list_sandboxes` tool's name (its function below must have this name: `tools::tests` checks).
pub const LIST_SANDBOXES: &str = "list_sandboxes";

#[tool_router(router = sandbox_router, vis = "pub(crate)")]
impl Gateway {
    #[tool(description = "Create a new Linux sandbox. It becomes this session's default sandbox (tools that \
        omit sandbox_id use it) and is owned by this session: it is killed when the MCP session ends, \
        unless a task was started in it. Returns its sandbox_id, and in inbound how to reach a server \
        it runs (host name and traffic access token; no token needed with network.allow_public_traffic).")]
    pub async fn create_sandbox(
        &self,
        Parameters(args): Parameters<CreateSandboxArgs>,
        Extension(parts): Extension<Parts>,
    ) -> Result<Json<CreateSandboxResult>, String> {
        let call = self.call_context(CREATE_SANDBOX, &parts)?;
        self.logged(CREATE_SANDBOX, &call, self.create_sandbox_impl(&call, args)).await
    }

    #[tool(description = "Connect to an existing sandbox of yours (resuming it if paused) and make it this \
        session's default sandbox. The session does not own it: it is not killed when the session ends.")]
    pub async fn connect_sandbox(
        &self,
        Parameters(args): Parameters<SandboxIdArgs>,
        Extension(parts): Extension<Parts>,
    ) -> Result<Json<ConnectSandboxResult>, String> {
        let call = self.call_context(CONNECT_SANDBOX, &parts)?;
        self.logged(CONNECT_SANDBOX, &call, self.connect_sandbox_impl(&call, args)).await
    }

    #[tool(description = "Destroy a sandbox of yours now: every process in it stops and its files are lost. \
        sandbox_id is required.")]
    pub async fn kill_sandbox(
        &self,
        Parameters(args): Parameters<SandboxIdArgs>,
        Extension(parts): Extension<Parts>,
    ) -> Result<Json<KillSandboxResult>, String> {
        let call = self.call_context(KILL_SANDBOX, &parts)?;
        self.logged(KILL_SANDBOX, &call, self.kill_sandbox_impl(&call, args)).await
    }

    #[tool(description = "List your sandboxes (running or paused), with what this session thinks of each: \
        default, owned (killed when this session ends) or retained (kept: a task runs in it), and for a fork its \
        parent.")]
    pub async fn list_sandboxes(
        &self,
        Parameters(_args): Parameters<ListSandboxesArgs>,
        Extension(parts): Extension<Parts>,
    ) -> Result<Json<ListSandboxesResult>, String> {
        let call = self.call_context(LIST_SANDBOXES, &parts)?;
        self.logged(LIST_SANDBOXES, &call, self.list_sandboxes_impl(&call)).await
    }
}

impl Gateway {
    /// What an agent needs to reach the sandbox's ports, from a create or connect answer: public
    /// exactly when the provider gave no traffic access token (so a provider that ignored
    /// `allowPublicTraffic: false` is reported as public, which it is).
    pub(super) fn inbound_access(&self, sandbox: &wire::Sandbox) -> InboundAccess {
        let token = sandbox.traffic_access_token.clone().filter(|t| !t.is_empty());
        let host = self
            .core
            .provider
            .sandbox_domain(sandbox.domain.as_deref())
            .map(|domain| format!("{{port}}-{}.{domain}", sandbox.sandbox_id));
        InboundAccess {
            public: token.is_none(),
            host,
            token_header: token.as_ref().map(|_| wire::HEADER_TRAFFIC_ACCESS_TOKEN.to_owned()),
            traffic_access_token: token,
        }
    }

    /// The sandboxes of `tenant` in this deployment, as the provider lists them (what the sandbox quota
    /// counts and list_sandboxes shows); `action` says what failed ("could not {action}: ...").
    pub(super) async fn sandboxes_of(&self, tenant: &str, action: &str) -> Result<Vec<wire::SandboxDetail>, ToolError> {
        let filter = [
            (META_TENANT.to_string(), tenant.to_string()),
            (META_DEPLOYMENT.to_string(), self.core.deployment().to_owned()),
        ];
        self.core.provider.list_all_sandboxes(&filter).await.map_err(|err| ToolError::provider(action, err))
    }

    /// Refuses when the tenant is at its sandbox limit (`limits.max_sandboxes_per_tenant`, by default
    /// its share of the deployment); the guard serialises the tenant's creates until the new sandbox
    /// exists, so a tenant has at most one create in flight per replica.
    async fn check_tenant_sandboxes(
        &self,
        tenant: &str,
    ) -> Result<Option<tokio::sync::OwnedMutexGuard<()>>, ToolError> {
        let max = self.core.quotas.max_sandboxes();
        if max == 0 {
            return Ok(None);
        }
        let guard = self.core.quotas.create_guard(tenant).await;
        let live = self.sandboxes_of(tenant, "count your sandboxes").await?.len();
        if live >= max {
            return Err(self.core.quotas.sandbox_refusal(tenant, live).into());
        }
        Ok(Some(guard))
    }

    async fn create_sandbox_impl(
        &self,
        call: &CallContext,
        args: CreateSandboxArgs,
    ) -> Result<CreateSandboxResult, ToolError> {
        let cfg = &self.core.config.sandbox;
        let template = args.template.unwrap_or_else(|| cfg.default_template.clone());
        validate_template(&template)?;
        let timeout = args.timeout.unwrap_or(cfg.default_timeout_secs);
        validate_range("timeout", timeout, 1, cfg.max_timeout_secs)?;
        let envs = args.envs.unwrap_or_default();
        validate_envs(&envs)?;
        let mut metadata = args.metadata.unwrap_or_default();
        validate_metadata(&metadata, META_RESERVED_PREFIX)?;
        if let Some(key) = metadata.keys().find(|k| k.starts_with(FORK_METADATA_PREFIX)) {
            return Err(ToolError::invalid(format!(
                "metadata key {key:?} is reserved (keys starting with {FORK_METADATA_PREFIX:?} are set by the \
                 provider on forks)"
            )));
        }
        metadata.insert(META_TENANT.into(), call.tenant.clone());
        if let Some(session_id) = &call.session_id {
            metadata.insert(META_SESSION.into(), session_id.clone());
        }
        metadata.insert(META_DEPLOYMENT.into(), self.core.deployment().to_owned());
        let network = args.network.unwrap_or_default();
        validate_network(&network)?;

        let request = wire::NewSandbox {
            template_id: template.clone(),
            timeout: Some(timeout),
            metadata: Some(metadata),
            env_vars: (!envs.is_empty()).then_some(envs),
            allow_internet_access: network.allow_internet_access,
            // Always explicit: a provider's own default (E2B's is public) must not open a sandbox's
            // ports to everyone who can reach them (on the local provider, every host user).
            network: Some(wire::SandboxNetwork {
                allow_out: network.allow_out,
                deny_out: network.deny_out,
                allow_public_traffic: Some(network.allow_public_traffic.unwrap_or(false)),
                ..Default::default()
            }),
            ..Default::default()
        };
        // Another tenant's snapshot reads as an unknown template (before any quota or create).
        self.check_template_owner(call, &template).await?;
        let _create_guard = self.check_tenant_sandboxes(&call.tenant).await?;
        let sandbox = self.core.provider.create_sandbox(&request).await.map_err(|err| {
            if is_unknown_template(&err) {
                return ToolError::UnknownTemplate { template: template.clone() };
            }
            ToolError::provider(format!("create a sandbox from template {template:?}"), err)
        })?;
        let id = sandbox.sandbox_id.clone();
        call.set_sandbox(&id);
        self.core.note_deadline(&id, SystemTime::now() + Duration::from_secs(timeout));
        let inbound = self.inbound_access(&sandbox);
        let Some(session_id) = call.session_id.as_deref() else {
            return Ok(CreateSandboxResult {
                sandbox_id: id,
                template,
                timeout_secs: timeout,
                owned: false,
                lifetime: Some(format!(
                    "no MCP session (protocol 2026-07-28): this sandbox lives until its deadline ({timeout} s from \
                     now, extended when run_command or the file tools use it) or until kill_sandbox; it is not \
                     killed when you disconnect. Pass its sandbox_id to every tool."
                )),
                inbound,
            });
        };
        let recorded = self
            .core
            .sessions
            .update(session_id, &call.tenant, |s| {
                s.owned.insert(id.clone());
                s.default_sandbox = Some(id.clone());
                s.verified.insert(id.clone(), sandbox.clone());
            })
            .await;
        if let Err(err) = recorded {
            // The session ended while we were creating (or its record cannot be written): nobody owns the
            // sandbox, so it must not outlive this call.
            tracing::info!(session = %session_id, sandbox = %id, error = %err, "cannot record the new sandbox in the session; killing it");
            let _ = self.core.kill_and_forget(&id).await;
            let store = match err {
                crate::gateway::sessions::SessionError::Store(reason) => Some(reason),
                _ => None,
            };
            return Err(ToolError::SandboxNotRecorded { store });
        }
        Ok(CreateSandboxResult {
            sandbox_id: id,
            template,
            timeout_secs: timeout,
            owned: true,
            lifetime: None,
            inbound,
        })
    }

    async fn connect_sandbox_impl(
        &self,
        call: &CallContext,
        args: SandboxIdArgs,
    ) -> Result<ConnectSandboxResult, ToolError> {
        validate_sandbox_id(&args.sandbox_id)?;
        let id = args.sandbox_id;
        call.set_sandbox(&id);
        let detail = self.check_owner(call, &id).await?;
        let sandbox = self
            .core
            .provider
            .connect_sandbox(&id, None)
            .await
            .map_err(|e| ToolError::sandbox_call("connect to", &id, e))?;
        let owned = match call.session_id.as_deref() {
            Some(session_id) => {
                self.core
                    .sessions
                    .update(session_id, &call.tenant, |s| {
                        s.default_sandbox = Some(id.clone());
                        s.verified.insert(id.clone(), sandbox.clone());
                        s.owned.contains(&id)
                    })
                    .await?
            }
            None => false,
        };
        // connect may have resumed it and moved its deadline: read the fresh one (best effort).
        let end_at = match self.core.provider.get_sandbox(&id).await {
            Ok(fresh) => fresh.end_at,
            Err(_) => detail.end_at,
        };
        Ok(ConnectSandboxResult {
            inbound: self.inbound_access(&sandbox),
            sandbox_id: id,
            template: detail.template_id,
            state: "running".into(),
            end_at,
            owned,
        })
    }

    async fn kill_sandbox_impl(&self, call: &CallContext, args: SandboxIdArgs) -> Result<KillSandboxResult, ToolError> {
        validate_sandbox_id(&args.sandbox_id)?;
        let id = args.sandbox_id;
        call.set_sandbox(&id);
        self.check_owner(call, &id).await?;
        // A sandbox gone meanwhile is reported "not found" (and forgotten when the error is reported).
        let killed = self.core.kill_and_forget(&id).await.map_err(|err| ToolError::sandbox_call("kill", &id, err))?;
        Ok(KillSandboxResult { sandbox_id: id, killed })
    }

    async fn list_sandboxes_impl(&self, call: &CallContext) -> Result<ListSandboxesResult, ToolError> {
        let details = self.sandboxes_of(&call.tenant, "list sandboxes").await?;
        let summarize = |s: Option<&SessionState>| {
            let sandboxes = details
                .into_iter()
                // Belt and braces: never show another tenant's sandbox even if a provider ignores the filter.
                .filter(|d| d.metadata.get(META_TENANT) == Some(&call.tenant))
                .map(|d| SandboxSummary {
                    session_roles: s
                        .map(|s| s.roles_of(&d.sandbox_id).into_iter().map(String::from).collect())
                        .unwrap_or_default(),
                    parent: d.metadata.get(wire::META_FORK_PARENT).filter(|p| !p.is_empty()).cloned(),
                    metadata: d
                        .metadata
                        .into_iter()
                        .filter(|(k, _)| !k.starts_with(META_RESERVED_PREFIX) && !k.starts_with(FORK_METADATA_PREFIX))
                        .collect(),
                    sandbox_id: d.sandbox_id,
                    template: d.template_id,
                    state: d.state.as_str().to_string(),
                    started_at: d.started_at,
                    end_at: d.end_at,
                })
                .collect();
            ListSandboxesResult {
                sandboxes,
                default_sandbox: s.and_then(|s| s.default_sandbox.clone()),
                truncated: false,
            }
        };
        let fit = |mut result: ListSandboxesResult| {
            result.truncated = super::result_size::fit_list(&mut result, |r| &mut r.sandboxes);
            result
        };
        let Some(session_id) = call.session_id.as_deref() else { return Ok(fit(summarize(None))) };
        // Roles and default read under the session's tenant check (no copy of its state).
        Ok(fit(self.core.sessions.with_session(session_id, &call.tenant, |s| summarize(Some(s)))?))
    }
}
