//! Snapshots and forks: `snapshot_sandbox`, `fork_sandbox`, `list_snapshots`,
//! `delete_snapshot`, and whose a snapshot is.
//!
//! A snapshot lives in the provider's template namespace, shared by every
//! tenant of the deployment (and, on E2B, by every user of the team). The
//! gateway tells its tenants' snapshots apart by name: every snapshot it takes
//! is named `smcp-<12 hex of sha256(deployment NUL tenant)>-<name>`
//! ([`snapshot_prefix`]). A snapshot whose id and names do not carry the
//! caller's prefix is not the caller's: `create_sandbox` answers for it exactly
//! as for an unknown template, `list_templates` and `list_snapshots` leave it
//! out, and `delete_snapshot` says "not found".
//!
//! Forks inherit their parent's metadata, so the gateway's tenant and
//! deployment tags carry over (and the quota counts them); `sandbox_mcp_session`
//! carries over too and then names the parent's session: it is only a label,
//! nothing reads it. What owns a fork is the session registry, like a created
//! sandbox.

use std::time::{Duration, SystemTime};

use http::request::Parts;
use rmcp::handler::server::tool::Extension;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::{Json, tool, tool_router};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use sha2::Digest;

use super::args::{InvalidArgument, clip, validate_range, validate_sandbox_id, validate_template};
use super::calls::CallContext;
use super::error::{ProviderFailure, ToolError};
use super::sandbox::InboundAccess;
use crate::e2b::{E2bError, wire};
use crate::gateway::state::Gateway;

/// First part of every snapshot name the gateway gives.
pub const SNAPSHOT_NAME_PREFIX: &str = "smcp-";
/// Hex characters of the tenant's hash in a snapshot name.
const OWNER_HEX: usize = 12;
/// Longest snapshot name the provider's store takes.
pub const MAX_SNAPSHOT_NAME: usize = 64;
/// Longest `name` an agent may give: what the tenant prefix (`smcp-` + 12 hex + `-`) leaves.
pub const MAX_USER_SNAPSHOT_NAME: usize = MAX_SNAPSHOT_NAME - SNAPSHOT_NAME_PREFIX.len() - OWNER_HEX - 1;

/// What a snapshot keeps, for `snapshot_sandbox`'s answer.
pub const SNAPSHOT_CARRIES: &str = "a filesystem snapshot: the root filesystem, /home and /root as they are now; \
     not /tmp, not running processes, memory or open connections. Task files are copied, but no task is ever \
     reported running in a sandbox created from it.";
/// What a fork does not carry, when the provider does not say (its `fork.carries`).
pub const FORK_CARRIES: &str = "each fork starts with a copy of the parent's files; it does not carry the \
     parent's running processes, open connections or memory.";

/// The prefix of the snapshot names of `tenant` in `deployment`:
/// `smcp-<first 12 hex of sha256(deployment + "\0" + tenant)>-`.
pub fn snapshot_prefix(deployment: &str, tenant: &str) -> String {
    let mut hash = sha2::Sha256::new();
    hash.update(deployment.as_bytes());
    hash.update([0u8]);
    hash.update(tenant.as_bytes());
    let hex = hex::encode(hash.finalize());
    format!("{SNAPSHOT_NAME_PREFIX}{}-", &hex[..OWNER_HEX])
}

/// An agent's snapshot `name`: 1-46 of `[A-Za-z0-9._-]`, not starting with `.` or `-` (the store's
/// rule for the whole name, which the tenant prefix brings to at most 64 characters).
pub fn validate_snapshot_name(name: &str) -> Result<(), InvalidArgument> {
    let allowed = |b: u8| b.is_ascii_alphanumeric() || b"._-".contains(&b);
    if name.is_empty() || name.len() > MAX_USER_SNAPSHOT_NAME {
        return Err(InvalidArgument(format!(
            "name must be 1-{MAX_USER_SNAPSHOT_NAME} characters (the server adds a prefix of its own); got {} \
             characters",
            name.chars().count()
        )));
    }
    if !name.bytes().all(allowed) || name.starts_with(['.', '-']) {
        return Err(InvalidArgument(format!(
            "invalid name {:?}: use letters, digits, '.', '_' and '-', not starting with '.' or '-' (e.g. \
             \"after-setup\")",
            clip(name, 80)
        )));
    }
    Ok(())
}

/// A snapshot reference without its `namespace/` and its `:tag` (E2B's `team/name:tag`; the
/// local provider's ids are `NAME:default`).
fn bare(reference: &str) -> &str {
    let name = reference.rsplit_once('/').map_or(reference, |(_, name)| name);
    name.split_once(':').map_or(name, |(name, _)| name)
}

/// Whether the snapshot is the caller's: its id or one of its names carries the caller's prefix.
pub fn is_owned(snapshot: &wire::SnapshotInfo, prefix: &str) -> bool {
    std::iter::once(&snapshot.snapshot_id).chain(&snapshot.names).any(|r| bare(r).starts_with(prefix))
}

/// Whether `reference` (a template argument, a template's id or name) names this snapshot, in any
/// of its spellings (with or without namespace and tag).
pub fn refers_to(snapshot: &wire::SnapshotInfo, reference: &str) -> bool {
    let wanted = bare(reference);
    std::iter::once(&snapshot.snapshot_id)
        .chain(&snapshot.names)
        .any(|r| r == reference || (!wanted.is_empty() && bare(r) == wanted))
}

/// Whether `reference` carries the snapshot prefix of someone other than `prefix`'s owner (another
/// tenant, or another deployment): never the caller's, whatever the provider says.
pub fn has_foreign_prefix(reference: &str, prefix: &str) -> bool {
    let name = bare(reference);
    let Some(rest) = name.strip_prefix(SNAPSHOT_NAME_PREFIX) else { return false };
    let tagged = rest.len() > OWNER_HEX
        && rest.as_bytes()[OWNER_HEX] == b'-'
        && rest.as_bytes()[..OWNER_HEX].iter().all(|b| b.is_ascii_hexdigit());
    tagged && !name.starts_with(prefix)
}

/// The name a snapshot is shown by (without its `:tag`): the first of its names with the caller's
/// prefix, else its first name, else its id.
fn display_name(snapshot: &wire::SnapshotInfo, prefix: &str) -> String {
    let untagged = |r: &str| r.split_once(':').map_or(r, |(name, _)| name).to_owned();
    snapshot
        .names
        .iter()
        .find(|n| bare(n).starts_with(prefix))
        .or(snapshot.names.first())
        .map_or_else(|| untagged(&snapshot.snapshot_id), |n| untagged(n))
}

/// A per-fork error of the provider as the client's error type (for its classification).
fn fork_entry_error(parent: &str, error: &wire::ErrorBody) -> E2bError {
    let (op, sandbox_id, message) = ("fork_sandbox", Some(parent.to_owned()), error.message.clone());
    match error.code {
        429 => E2bError::RateLimited { op, sandbox_id, retry_after: None, message },
        status => E2bError::Api { op, sandbox_id, status: u16::try_from(status).unwrap_or(500), message },
    }
}

#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SnapshotSandboxArgs {
    /// Sandbox to snapshot; omit to use this session's default sandbox.
    #[serde(default)]
    pub sandbox_id: Option<String>,
    /// A name for the snapshot (1-46 of letters, digits, '.', '_', '-'; not starting with '.' or '-'),
    /// e.g. "after-setup". The server prefixes it with a tag of your own; the full name is returned.
    /// Reusing a name replaces your earlier snapshot of that name. Default: a random one.
    #[serde(default)]
    pub name: Option<String>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct SnapshotSandboxResult {
    /// The snapshot's id: pass it as create_sandbox's template to start a sandbox from it.
    pub snapshot_id: String,
    /// Its full name (your name with the server's prefix); create_sandbox's template takes it too.
    pub name: String,
    /// The sandbox it was taken of (still running, unchanged).
    pub sandbox_id: String,
    /// What the snapshot keeps and what it does not.
    pub carries: String,
}

#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ForkSandboxArgs {
    /// Sandbox to fork; omit to use this session's default sandbox.
    #[serde(default)]
    pub sandbox_id: Option<String>,
    /// How many forks to make (default 1; at most the server's limits.max_forks_per_call, usually 10).
    /// Each counts as one of your sandboxes.
    #[serde(default)]
    pub count: Option<u32>,
    /// Lifetime of each fork in seconds (default from the server config, usually 600; at most the
    /// server's sandbox.max_timeout_secs). Using a fork extends it.
    #[serde(default)]
    pub timeout: Option<u64>,
}

/// One fork: its sandbox, or why it failed (each fork succeeds or fails on its own).
#[derive(Debug, Serialize, JsonSchema)]
pub struct ForkOutcome {
    /// The new sandbox's id (absent when this fork failed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sandbox_id: Option<String>,
    /// Seconds until it is destroyed unless used or extended.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout_secs: Option<u64>,
    /// How to reach servers in it from outside (the URL host and the token).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inbound: Option<InboundAccess>,
    /// Why this fork failed (absent when it succeeded).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct ForkSandboxResult {
    /// The sandbox that was forked (unchanged, still running; the session's default sandbox is unchanged).
    pub parent: String,
    /// One entry per fork asked for, in order.
    pub forks: Vec<ForkOutcome>,
    /// How many forks were made.
    pub created: usize,
    /// True when this MCP session owns the forks (killed when the session ends unless a task was started
    /// in one); false for sessionless (2026-07-28) callers, whose forks live until their deadline or
    /// kill_sandbox.
    pub owned: bool,
    /// How long the forks live (sessionless callers only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lifetime: Option<String>,
    /// What a fork does not carry over from its parent.
    pub carries: String,
}

#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListSnapshotsArgs {
    /// Only the snapshots taken of this sandbox (its id from create_sandbox or list_sandboxes); omit for
    /// all of yours.
    #[serde(default)]
    pub sandbox_id: Option<String>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct SnapshotSummary {
    /// Pass it as create_sandbox's template, or to delete_snapshot.
    pub snapshot_id: String,
    /// Its name (create_sandbox's template takes it too).
    pub name: String,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct ListSnapshotsResult {
    /// Your snapshots.
    pub snapshots: Vec<SnapshotSummary>,
    /// True if the list was cut to keep the answer under the 1 MiB message limit.
    pub truncated: bool,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DeleteSnapshotArgs {
    /// The snapshot to delete: its snapshot_id (or name) from snapshot_sandbox or list_snapshots.
    pub snapshot_id: String,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct DeleteSnapshotResult {
    pub snapshot_id: String,
    /// True: deleted now; new sandboxes can no longer be created from it.
    pub deleted: bool,
}

/// The `snapshot_sandbox` tool's name (its function below must have this name: `tools::tests` checks).
pub const SNAPSHOT_SANDBOX: &str = "snapshot_sandbox";
/// The `fork_sandbox` tool's name (its function below must have this name: `tools::tests` checks).
pub const FORK_SANDBOX: &str = "fork_sandbox";
/// The `list_snapshots` tool's name (its function below must have this name: `tools::tests` checks).
pub const LIST_SNAPSHOTS: &str = "list_snapshots";
/// The `delete_snapshot` tool's name (its function below must have this name: `tools::tests` checks).
pub const DELETE_SNAPSHOT: &str = "delete_snapshot";

#[tool_router(router = snapshot_router, vis = "pub(crate)")]
impl Gateway {
    #[tool(description = "Save a sandbox's files as a snapshot to start new sandboxes from: pass the returned \
        snapshot_id (or name) as create_sandbox's template. It keeps the root filesystem, /home and /root; not \
        /tmp, running processes, memory or open connections (task files are copied, but no task runs in a \
        sandbox created from it). The sandbox keeps running. Omit sandbox_id to use the session's default \
        sandbox.")]
    pub async fn snapshot_sandbox(
        &self,
        Parameters(args): Parameters<SnapshotSandboxArgs>,
        Extension(parts): Extension<Parts>,
    ) -> Result<Json<SnapshotSandboxResult>, String> {
        let call = self.call_context(SNAPSHOT_SANDBOX, &parts)?;
        self.logged(SNAPSHOT_SANDBOX, &call, self.snapshot_sandbox_impl(&call, args)).await
    }

    #[tool(description = "Fork a sandbox of yours: make count new sandboxes (default 1), each starting with \
        a copy of its files and metadata as they are now (not its running processes, open connections or \
        memory). Each fork is owned by this session like a created sandbox (killed when the session ends \
        unless a task is started in it) and counts as one of your sandboxes; the session's default sandbox does \
        not change. Returns each fork's sandbox_id and inbound access, or that fork's own error. Omit \
        sandbox_id to use the session's default sandbox.")]
    pub async fn fork_sandbox(
        &self,
        Parameters(args): Parameters<ForkSandboxArgs>,
        Extension(parts): Extension<Parts>,
    ) -> Result<Json<ForkSandboxResult>, String> {
        let call = self.call_context(FORK_SANDBOX, &parts)?;
        self.logged(FORK_SANDBOX, &call, self.fork_sandbox_impl(&call, args)).await
    }

    #[tool(description = "List your snapshots (taken with snapshot_sandbox): snapshot_id and name, each \
        usable as create_sandbox's template or with delete_snapshot.")]
    pub async fn list_snapshots(
        &self,
        Parameters(args): Parameters<ListSnapshotsArgs>,
        Extension(parts): Extension<Parts>,
    ) -> Result<Json<ListSnapshotsResult>, String> {
        let call = self.call_context(LIST_SNAPSHOTS, &parts)?;
        self.logged(LIST_SNAPSHOTS, &call, self.list_snapshots_impl(&call, args)).await
    }

    #[tool(description = "Delete a snapshot of yours (its snapshot_id or name from snapshot_sandbox or \
        list_snapshots): no new sandbox can be created from it afterwards.")]
    pub async fn delete_snapshot(
        &self,
        Parameters(args): Parameters<DeleteSnapshotArgs>,
        Extension(parts): Extension<Parts>,
    ) -> Result<Json<DeleteSnapshotResult>, String> {
        let call = self.call_context(DELETE_SNAPSHOT, &parts)?;
        self.logged(DELETE_SNAPSHOT, &call, self.delete_snapshot_impl(&call, args)).await
    }
}

impl Gateway {
    /// The caller's snapshot name prefix (see [`snapshot_prefix`]).
    pub(crate) fn snapshot_prefix_of(&self, call: &CallContext) -> String {
        snapshot_prefix(self.core.deployment(), &call.tenant)
    }

    /// The provider's snapshots, filtered by name (or id) and sandbox; none when the provider has no
    /// snapshot API (404).
    pub(crate) async fn provider_snapshots(
        &self,
        name: Option<&str>,
        sandbox_id: Option<&str>,
    ) -> Result<Vec<wire::SnapshotInfo>, ToolError> {
        match self.core.provider.list_all_snapshots(sandbox_id, name).await {
            Ok(snapshots) => Ok(snapshots),
            Err(E2bError::NotFound { .. }) => Ok(Vec::new()),
            Err(err) => Err(ToolError::provider("look up snapshots", err)),
        }
    }

    /// Refuses, exactly as an unknown template, a template that is someone else's snapshot (another
    /// tenant's or another deployment's): its existence is never revealed. The operator's default
    /// template is always allowed.
    pub(crate) async fn check_template_owner(&self, call: &CallContext, template: &str) -> Result<(), ToolError> {
        if template == self.core.config.sandbox.default_template {
            return Ok(());
        }
        let unknown = || ToolError::UnknownTemplate { template: template.to_owned() };
        let prefix = self.snapshot_prefix_of(call);
        if has_foreign_prefix(template, &prefix) {
            return Err(unknown());
        }
        // The provider answers the snapshots with this name or id (in any of its own spellings, such as
        // a snapshot's template id): any of them not the caller's means the template is not theirs.
        let snapshots = self.provider_snapshots(Some(template), None).await?;
        if snapshots.iter().any(|s| !is_owned(s, &prefix)) {
            return Err(unknown());
        }
        Ok(())
    }

    /// The caller's snapshot that `reference` (an id or a name) names, if any.
    async fn own_snapshot(&self, call: &CallContext, reference: &str) -> Result<Option<wire::SnapshotInfo>, ToolError> {
        let prefix = self.snapshot_prefix_of(call);
        if has_foreign_prefix(reference, &prefix) {
            return Ok(None);
        }
        let snapshots = self.provider_snapshots(Some(reference), None).await?;
        Ok(snapshots.into_iter().find(|s| refers_to(s, reference) && is_owned(s, &prefix)))
    }

    async fn snapshot_sandbox_impl(
        &self,
        call: &CallContext,
        args: SnapshotSandboxArgs,
    ) -> Result<SnapshotSandboxResult, ToolError> {
        if let Some(name) = &args.name {
            validate_snapshot_name(name)?;
        }
        let id = self.sandbox_id_or_default(call, args.sandbox_id.as_deref())?;
        call.set_sandbox(&id);
        self.check_owner(call, &id).await?;
        let suffix = args.name.unwrap_or_else(|| format!("{:08x}", rand::random::<u32>()));
        let prefix = self.snapshot_prefix_of(call);
        let name = format!("{prefix}{suffix}");
        // The tenant's snapshot limit; a name it already has is replaced, not added. Checked before
        // the provider is asked, one snapshot at a time per tenant (the create guard).
        let _guard = match self.core.quotas.limits().snapshots.max {
            0 => None,
            _ => {
                let guard = self.core.quotas.create_guard(&call.tenant).await;
                let mine: Vec<wire::SnapshotInfo> =
                    self.provider_snapshots(None, None).await?.into_iter().filter(|s| is_owned(s, &prefix)).collect();
                let replaces = mine.iter().any(|s| refers_to(s, &name));
                if !replaces {
                    self.core.quotas.check_snapshots(&call.tenant, mine.len())?;
                }
                Some(guard)
            }
        };
        let request = wire::NewSnapshot { name: Some(name.clone()), memory: Some(false) };
        let snapshot = self.core.provider.create_snapshot(&id, &request).await.map_err(|err| match err {
            E2bError::Api { status: 409, .. } => ToolError::invalid(format!(
                "a snapshot named {suffix:?} already exists: choose another name, or delete_snapshot the old one \
                 first (list_snapshots shows yours)"
            )),
            err => ToolError::sandbox_call("snapshot", &id, err),
        })?;
        Ok(SnapshotSandboxResult {
            snapshot_id: snapshot.snapshot_id,
            name,
            sandbox_id: id,
            carries: SNAPSHOT_CARRIES.to_owned(),
        })
    }

    async fn fork_sandbox_impl(
        &self,
        call: &CallContext,
        args: ForkSandboxArgs,
    ) -> Result<ForkSandboxResult, ToolError> {
        let cap = self.core.config.limits.max_forks_per_call;
        let count = args.count.unwrap_or(1);
        if count == 0 || count > cap {
            return Err(ToolError::invalid(format!(
                "count must be between 1 and {cap} (this server's limits.max_forks_per_call); got {count}. Fork \
                 in several calls for more, each within your sandbox limit"
            )));
        }
        let cfg = &self.core.config.sandbox;
        let timeout = args.timeout.unwrap_or(cfg.default_timeout_secs);
        validate_range("timeout", timeout, 1, cfg.max_timeout_secs)?;
        let parent = self.sandbox_id_or_default(call, args.sandbox_id.as_deref())?;
        call.set_sandbox(&parent);
        self.check_owner(call, &parent).await?;

        // Forks count against the tenant's sandbox limit like creates, under the same guard.
        let _create_guard = match self.core.quotas.max_sandboxes() {
            0 => None,
            _ => {
                let guard = self.core.quotas.create_guard(&call.tenant).await;
                let live = self.sandboxes_of(&call.tenant, "count your sandboxes").await?.len();
                self.core.quotas.check_forks(&call.tenant, live, count as usize)?;
                Some(guard)
            }
        };
        let request = wire::ForkSandbox { timeout: Some(timeout), count: Some(count) };
        let entries = self
            .core
            .provider
            .fork_sandbox(&parent, &request)
            .await
            .map_err(|err| ToolError::sandbox_call("fork", &parent, err))?;
        let forks: Vec<wire::Sandbox> = entries.iter().filter_map(|e| e.sandbox.clone()).collect();
        if forks.is_empty() {
            let first = entries.iter().find_map(|e| e.error.as_ref());
            let err = match first {
                Some(error) => fork_entry_error(&parent, error),
                None => E2bError::Protocol {
                    op: "fork_sandbox",
                    sandbox_id: Some(parent.clone()),
                    detail: "no forks".into(),
                },
            };
            return Err(ToolError::Provider {
                action: format!("fork sandbox {parent}"),
                failure: ProviderFailure::classify(err),
            });
        }
        let deadline = SystemTime::now() + Duration::from_secs(timeout);
        for fork in &forks {
            self.core.note_deadline(&fork.sandbox_id, deadline);
        }
        let owned = match call.session_id.as_deref() {
            None => false,
            Some(session_id) => {
                let recorded = self
                    .core
                    .sessions
                    .update(session_id, &call.tenant, |s| {
                        for fork in &forks {
                            s.owned.insert(fork.sandbox_id.clone());
                            s.verified.insert(fork.sandbox_id.clone(), fork.clone());
                        }
                    })
                    .await;
                if let Err(err) = recorded {
                    // Nobody owns the forks: they must not outlive this call (as create_sandbox).
                    tracing::info!(session = %session_id, parent = %parent, error = %err,
                        "cannot record the forks in the session; killing them");
                    for fork in &forks {
                        let _ = self.core.kill_and_forget(&fork.sandbox_id).await;
                    }
                    let store = match err {
                        crate::gateway::sessions::SessionError::Store(reason) => Some(reason),
                        _ => None,
                    };
                    return Err(ToolError::SandboxNotRecorded { store });
                }
                true
            }
        };
        // What a fork does not carry, as the provider words it (best effort).
        let carries = match self.core.provider.get_sandbox(&forks[0].sandbox_id).await {
            Ok(detail) => detail.metadata.get(wire::META_FORK_CARRIES).filter(|c| !c.trim().is_empty()).cloned(),
            Err(_) => None,
        };
        let outcomes = entries
            .into_iter()
            .map(|entry| match (entry.sandbox, entry.error) {
                (Some(sandbox), _) => ForkOutcome {
                    inbound: Some(self.inbound_access(&sandbox)),
                    sandbox_id: Some(sandbox.sandbox_id),
                    timeout_secs: Some(timeout),
                    error: None,
                },
                (None, error) => {
                    let text = error.map_or_else(
                        || "the provider gave no reason".to_owned(),
                        |e| format!("{} (provider code {})", e.message, e.code),
                    );
                    ForkOutcome {
                        sandbox_id: None,
                        timeout_secs: None,
                        inbound: None,
                        error: Some(self.core.masker.mask(&text).into_owned()),
                    }
                }
            })
            .collect();
        let lifetime = (!owned).then(|| {
            format!(
                "no MCP session (protocol 2026-07-28): each fork lives until its deadline ({timeout} s from now, \
                 extended when run_command or the file tools use it) or until kill_sandbox; pass its sandbox_id to \
                 every tool."
            )
        });
        Ok(ForkSandboxResult {
            parent,
            created: forks.len(),
            forks: outcomes,
            owned,
            lifetime,
            carries: carries.unwrap_or_else(|| FORK_CARRIES.to_owned()),
        })
    }

    async fn list_snapshots_impl(
        &self,
        call: &CallContext,
        args: ListSnapshotsArgs,
    ) -> Result<ListSnapshotsResult, ToolError> {
        if let Some(id) = &args.sandbox_id {
            validate_sandbox_id(id)?;
            call.set_sandbox(id);
        }
        let prefix = self.snapshot_prefix_of(call);
        let snapshots = self.provider_snapshots(None, args.sandbox_id.as_deref()).await?;
        let mut result = ListSnapshotsResult {
            snapshots: snapshots
                .into_iter()
                .filter(|s| is_owned(s, &prefix))
                .map(|s| SnapshotSummary { name: display_name(&s, &prefix), snapshot_id: s.snapshot_id })
                .collect(),
            truncated: false,
        };
        result.truncated = super::result_size::fit_list(&mut result, |r| &mut r.snapshots);
        Ok(result)
    }

    async fn delete_snapshot_impl(
        &self,
        call: &CallContext,
        args: DeleteSnapshotArgs,
    ) -> Result<DeleteSnapshotResult, ToolError> {
        let reference = args.snapshot_id;
        validate_template(&reference).map_err(|_| {
            ToolError::invalid(format!(
                "invalid snapshot_id {:?}: use the snapshot_id from snapshot_sandbox or list_snapshots",
                clip(&reference, 80)
            ))
        })?;
        let not_found = || ToolError::SnapshotNotFound { snapshot: reference.clone() };
        let Some(snapshot) = self.own_snapshot(call, &reference).await? else { return Err(not_found()) };
        let deleted = self
            .core
            .provider
            .delete_snapshot(&snapshot.snapshot_id)
            .await
            .map_err(|err| ToolError::provider(format!("delete snapshot {}", snapshot.snapshot_id), err))?;
        if !deleted {
            return Err(not_found());
        }
        Ok(DeleteSnapshotResult { snapshot_id: snapshot.snapshot_id, deleted: true })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snapshot(id: &str, names: &[&str]) -> wire::SnapshotInfo {
        wire::SnapshotInfo { snapshot_id: id.into(), names: names.iter().map(|n| (*n).to_owned()).collect() }
    }

    #[test]
    fn the_prefix_is_the_tenants_and_the_deployments() {
        let alice = snapshot_prefix("default", "alice");
        assert!(alice.starts_with("smcp-") && alice.ends_with('-') && alice.len() == 18, "{alice}");
        assert!(alice[5..17].bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()), "{alice}");
        // sha256("default\0alice"), its first 12 hex.
        let expected = hex::encode(sha2::Sha256::digest(b"default\0alice"));
        assert_eq!(alice, format!("smcp-{}-", &expected[..12]));
        assert_ne!(alice, snapshot_prefix("default", "bob"));
        assert_ne!(alice, snapshot_prefix("prod", "alice"));
        // The separator keeps ("ab", "c") and ("a", "bc") apart.
        assert_ne!(snapshot_prefix("ab", "c"), snapshot_prefix("a", "bc"));
        assert_eq!(alice.len() + MAX_USER_SNAPSHOT_NAME, MAX_SNAPSHOT_NAME);
    }

    #[test]
    fn snapshot_names_are_checked_with_a_sentence() {
        for good in ["after-setup", "v1.2", "A_b-c", "x", &"a".repeat(MAX_USER_SNAPSHOT_NAME)] {
            assert!(validate_snapshot_name(good).is_ok(), "{good}");
        }
        for bad in [".hidden", "-flag", "a b", "a/b", "a:b", "é", "a\0b"] {
            let message = validate_snapshot_name(bad).unwrap_err().0;
            assert!(message.starts_with("invalid name") && message.contains("not starting with"), "{bad}: {message}");
        }
        for bad in [String::new(), "a".repeat(MAX_USER_SNAPSHOT_NAME + 1)] {
            let message = validate_snapshot_name(&bad).unwrap_err().0;
            assert!(message.contains("name must be 1-46 characters"), "{message}");
        }
    }

    #[test]
    fn ownership_is_read_from_the_id_or_a_name_in_any_spelling() {
        let mine = snapshot_prefix("default", "alice");
        let theirs = snapshot_prefix("default", "bob");
        let own = snapshot(&format!("{mine}x:default"), &[&format!("{mine}x")]);
        let foreign = snapshot(&format!("{theirs}x:default"), &[&format!("{theirs}x")]);
        assert!(is_owned(&own, &mine) && !is_owned(&foreign, &mine) && is_owned(&foreign, &theirs));
        // E2B's opaque id with a namespaced, tagged name.
        let e2b = snapshot("k1c2d3", &[&format!("team/{mine}x:v2")]);
        assert!(is_owned(&e2b, &mine));
        assert!(!is_owned(&snapshot("base", &["base"]), &mine));
        // A name of the caller's prefix nested inside another's is not the caller's.
        assert!(!is_owned(&snapshot(&format!("{theirs}{mine}x:default"), &[]), &mine));

        for reference in [format!("{mine}x"), format!("{mine}x:default"), format!("ns/{mine}x:default")] {
            assert!(refers_to(&own, &reference), "{reference}");
        }
        assert!(refers_to(&e2b, "k1c2d3") && refers_to(&e2b, &format!("{mine}x")));
        assert!(!refers_to(&own, "base") && !refers_to(&own, &format!("{mine}y")));
    }

    #[test]
    fn another_owners_prefix_is_recognised_without_asking_the_provider() {
        let mine = snapshot_prefix("default", "alice");
        let theirs = snapshot_prefix("default", "bob");
        assert!(has_foreign_prefix(&format!("{theirs}x"), &mine));
        assert!(has_foreign_prefix(&format!("team/{theirs}x:default"), &mine));
        assert!(!has_foreign_prefix(&format!("{mine}x"), &mine));
        assert!(!has_foreign_prefix(&format!("{mine}{theirs}x"), &mine), "the caller's own name");
        for ordinary in ["base", "smcp", "smcp-tools", "smcp-notahexvalue-x", "smcp-0123456789ab"] {
            assert!(!has_foreign_prefix(ordinary, &mine), "{ordinary}");
        }
    }

    #[test]
    fn snapshots_are_shown_by_the_callers_name() {
        let mine = snapshot_prefix("default", "alice");
        assert_eq!(display_name(&snapshot("id1", &["other", &format!("{mine}a")]), &mine), format!("{mine}a"));
        assert_eq!(display_name(&snapshot(&format!("{mine}b:default"), &[]), &mine), format!("{mine}b"));
        let local = snapshot(&format!("{mine}c:default"), &[&format!("{mine}c:default")]);
        assert_eq!(display_name(&local, &mine), format!("{mine}c"), "as snapshot_sandbox named it");
    }

    #[test]
    fn per_fork_errors_keep_their_class() {
        let limit = wire::ErrorBody { code: 429, message: "reached the maximum of 5 sandboxes".into() };
        assert!(matches!(
            ProviderFailure::classify(fork_entry_error("p", &limit)),
            ProviderFailure::DeploymentLimit { .. }
        ));
        let busy = wire::ErrorBody { code: 503, message: "busy".into() };
        assert!(ProviderFailure::classify(fork_entry_error("p", &busy)).is_transient());
    }
}
