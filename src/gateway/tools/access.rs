//! Which sandbox a call may act on: the gateway's metadata tags, the explicit
//! `sandbox_id` (validated) or the session's default, the tenant and
//! deployment check (anyone else's sandbox is "not found"), resuming a paused
//! sandbox, and the envd client of the result (cached per session, or per
//! tenant for sessionless callers).

use std::time::{Duration, SystemTime};

use super::args::validate_sandbox_id;
use super::calls::CallContext;
use super::error::ToolError;
use crate::e2b::{EnvdClient, wire};
use crate::gateway::state::Gateway;

/// Metadata keys the gateway puts on every sandbox it creates.
pub const META_TENANT: &str = "sandbox_mcp_tenant";
pub const META_SESSION: &str = "sandbox_mcp_session";
pub const META_DEPLOYMENT: &str = "sandbox_mcp_deployment";
/// Prefix reserved for the gateway's own metadata keys.
pub const META_RESERVED_PREFIX: &str = "sandbox_mcp_";

/// A sandbox the caller may use, with its envd client.
pub(crate) struct ResolvedSandbox {
    pub id: String,
    pub envd: EnvdClient,
}

impl Gateway {
    /// The sandbox a tool acts on: the given id or the session default, checked to belong to the
    /// caller's tenant (else "not found"), resumed if paused, with an envd client.
    pub(crate) async fn resolve_sandbox(
        &self,
        call: &CallContext,
        sandbox_id: Option<&str>,
    ) -> Result<ResolvedSandbox, ToolError> {
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
        let cached = self.core.sessions.with_session(session_id, &call.tenant, |s| s.verified.get(&id).cloned())?;
        let sandbox = match cached {
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
    pub(crate) async fn check_owner(&self, call: &CallContext, id: &str) -> Result<wire::SandboxDetail, ToolError> {
        let detail = self.core.provider.get_sandbox(id).await.map_err(|e| ToolError::sandbox_call("look up", id, e))?;
        let tenant_ok = detail.metadata.get(META_TENANT).map(String::as_str) == Some(call.tenant.as_str());
        let deployment_ok = detail.metadata.get(META_DEPLOYMENT).map(String::as_str) == Some(self.core.deployment());
        if !(tenant_ok && deployment_ok) {
            return Err(ToolError::not_yours(id));
        }
        if let Ok(end) = chrono::DateTime::parse_from_rfc3339(&detail.end_at) {
            let deadline = SystemTime::UNIX_EPOCH + Duration::from_secs(end.timestamp().max(0) as u64);
            self.core.note_deadline(id, deadline);
        }
        Ok(detail)
    }

    async fn verify_and_connect(&self, call: &CallContext, id: &str) -> Result<wire::Sandbox, ToolError> {
        let detail = self.check_owner(call, id).await?;
        if detail.state == wire::SandboxState::Paused {
            return self
                .core
                .provider
                .connect_sandbox(id, None)
                .await
                .map_err(|e| ToolError::sandbox_call("resume", id, e));
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

    /// Whether sandbox `id`, which an agent call found gone, is in fact the caller's and paused:
    /// then the cached look-ups of it are dropped, so that the next resolution resumes it through
    /// connect (which never extends its deadline beyond what a resume does).
    pub(crate) async fn resumable(&self, call: &CallContext, id: &str) -> bool {
        let Ok(detail) = self.check_owner(call, id).await else { return false };
        if detail.state != wire::SandboxState::Paused {
            return false;
        }
        if let Some(session_id) = call.session_id.as_deref() {
            let _ = self.core.sessions.with_session(session_id, &call.tenant, |s| s.verified.remove(id));
        }
        self.core.stateless_forget(id);
        true
    }

    /// The explicit id (validated) or the session default.
    pub(crate) fn sandbox_id_or_default(
        &self,
        call: &CallContext,
        sandbox_id: Option<&str>,
    ) -> Result<String, ToolError> {
        if let Some(id) = sandbox_id {
            validate_sandbox_id(id)?;
            return Ok(id.to_string());
        }
        let Some(session_id) = call.session_id.as_deref() else {
            return Err(ToolError::MissingSandboxId);
        };
        let default = self.core.sessions.with_session(session_id, &call.tenant, |s| s.default_sandbox.clone())?;
        default.ok_or(ToolError::NoDefaultSandbox)
    }

    /// Extends the sandbox deadline after ordinary use (best effort, background).
    pub(crate) fn renew_on_use(&self, sandbox_id: &str) {
        self.core.renew_on_use(sandbox_id);
    }
}
