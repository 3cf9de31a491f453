//! MCP task ids (the `io.modelcontextprotocol/tasks` extension, see
//! `mcp_tasks`): what an id stands for ([`McpTaskId`]: sandbox, supervisor
//! task, creation time, the tool that started it) and its text form
//! (`sbx1.…`), sealed with an HMAC under the key of `state::mcp_task_key`
//! bound to the tenant, so no gateway memory is needed and another tenant or
//! a forged id resolves to nothing. Not to be confused with the supervisor's
//! own task id ([`TaskId`], 32 hex characters), which an MCP task id carries.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::Mac;

use crate::gateway::state::mcp_task_key::{HmacSha256, McpTaskIdKey};
use crate::gateway::tools::args::validate_sandbox_id;
use crate::tasks::TaskId;

/// Version tag of the task-id format.
const ID_PREFIX: &str = "sbx1";
/// Bytes of the HMAC kept in the id (128 bits).
const MAC_BYTES: usize = 16;

/// What an MCP task id stands for.
#[derive(Debug, Clone, PartialEq)]
pub struct McpTaskId {
    pub sandbox_id: String,
    /// The supervisor's task in that sandbox.
    pub task_id: TaskId,
    /// Creation time, Unix milliseconds.
    pub created_ms: u64,
    /// The tool that started it (its result takes that tool's shape).
    pub kind: McpTaskKind,
}

impl McpTaskId {
    fn mac_state(&self, key: &McpTaskIdKey, tenant: &str) -> Option<HmacSha256> {
        let (created, kind) = (self.created_ms.to_string(), self.kind.encode());
        key.mac_of(&[tenant, self.sandbox_id.as_str(), self.task_id.as_str(), &created, &kind])
    }

    /// The opaque text of this MCP task id, bound to `tenant`.
    pub fn encode(&self, key: &McpTaskIdKey, tenant: &str) -> String {
        let tag = self.mac_state(key, tenant).map(|m| m.finalize().into_bytes().to_vec()).unwrap_or_default();
        let mac = URL_SAFE_NO_PAD.encode(&tag[..MAC_BYTES.min(tag.len())]);
        format!("{ID_PREFIX}.{}.{}.{}.{}.{mac}", self.sandbox_id, self.task_id, self.created_ms, self.kind.encode())
    }

    /// The task behind an MCP task id's text, if it is well formed and was issued to `tenant`.
    pub fn decode(key: &McpTaskIdKey, tenant: &str, raw: &str) -> Option<Self> {
        let mut parts = raw.split('.');
        let (prefix, sandbox, task, created) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        let (kind, mac) = (parts.next()?, parts.next()?);
        if prefix != ID_PREFIX || parts.next().is_some() {
            return None;
        }
        validate_sandbox_id(sandbox).ok()?;
        let id = Self {
            sandbox_id: sandbox.to_string(),
            task_id: TaskId::parse(task).ok()?,
            created_ms: created.parse().ok()?,
            kind: McpTaskKind::decode(kind)?,
        };
        let given = URL_SAFE_NO_PAD.decode(mac).ok()?;
        if given.len() != MAC_BYTES {
            return None;
        }
        // Constant-time comparison of the truncated tag.
        id.mac_state(key, tenant)?.verify_truncated_left(&given).ok()?;
        Some(id)
    }
}

/// The tool a task-augmented call was made to.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum McpTaskKind {
    RunCommand,
    /// `start_task`, with the task's timeout (part of start_task's result).
    StartTask {
        timeout: u64,
    },
}

impl McpTaskKind {
    fn encode(self) -> String {
        match self {
            McpTaskKind::RunCommand => "r".into(),
            McpTaskKind::StartTask { timeout } => format!("s{timeout}"),
        }
    }

    fn decode(raw: &str) -> Option<Self> {
        match raw.strip_prefix('s') {
            _ if raw == "r" => Some(McpTaskKind::RunCommand),
            Some(timeout) if !timeout.is_empty() && timeout.len() <= 6 => {
                Some(McpTaskKind::StartTask { timeout: timeout.parse().ok()? })
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mcp_id() -> McpTaskId {
        McpTaskId {
            sandbox_id: "sbx-1".into(),
            task_id: TaskId::parse("0123456789abcdef0123456789abcdef").expect("valid id"),
            created_ms: 1_700_000_000_000,
            kind: McpTaskKind::StartTask { timeout: 300 },
        }
    }

    #[test]
    fn ids_round_trip_for_their_tenant_only() {
        let key = McpTaskIdKey::from_secret(b"k1");
        let id = mcp_id().encode(&key, "acme");
        assert_eq!(McpTaskId::decode(&key, "acme", &id), Some(mcp_id()));
        assert_eq!(McpTaskId::decode(&key, "beta", &id), None, "another tenant must not resolve the id");
        assert_eq!(
            McpTaskId::decode(&McpTaskIdKey::from_secret(b"k2"), "acme", &id),
            None,
            "another key must not resolve it"
        );
    }

    #[test]
    fn forged_and_malformed_ids_are_refused() {
        let key = McpTaskIdKey::from_secret(b"k1");
        let id = mcp_id().encode(&key, "acme");
        let forged = id.replace("sbx-1", "sbx-2");
        assert_eq!(McpTaskId::decode(&key, "acme", &forged), None);
        let other_kind = id.replace(".s300.", ".r.");
        assert_ne!(other_kind, id);
        assert_eq!(McpTaskId::decode(&key, "acme", &other_kind), None);
        let mut tampered = id.clone();
        tampered.pop();
        tampered.push(if id.ends_with('A') { 'B' } else { 'A' });
        assert_eq!(McpTaskId::decode(&key, "acme", &tampered), None);
        for bad in
            ["", "sbx1", "sbx1.a.b.c.d", "sbx1.a.b.c.d.e", "tasks-conformance-nonexistent-12345", &format!("{id}.x")]
        {
            assert_eq!(McpTaskId::decode(&key, "acme", bad), None, "{bad}");
        }
    }
}
