//! MCP task ids (the `io.modelcontextprotocol/tasks` extension, see
//! `mcp_tasks`): what an id stands for ([`TaskHandle`]: sandbox, task,
//! creation time, the tool that started it) and the key that binds it to its
//! tenant ([`TaskIdKey`]: an HMAC, so no gateway memory is needed and another
//! tenant or a forged id resolves to nothing), with where that key comes from.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, KeyInit, Mac};
use sha2::{Digest, Sha256};

use super::args::validate_sandbox_id;
use crate::config::Config;
use crate::tasks::TaskId;

/// Version tag of the task-id format.
const ID_PREFIX: &str = "sbx1";
/// Bytes of the HMAC kept in the id (128 bits).
const MAC_BYTES: usize = 16;

type HmacSha256 = Hmac<Sha256>;

/// The key binding MCP task ids to tenants.
#[derive(Clone)]
pub struct TaskIdKey([u8; 32]);

impl std::fmt::Debug for TaskIdKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TaskIdKey(***)")
    }
}

impl TaskIdKey {
    /// A key from secret material (hashed, any length).
    pub fn from_secret(secret: &[u8]) -> Self {
        let mut hasher = Sha256::new();
        hasher.update(b"sandbox-mcp task ids v1\0");
        hasher.update(secret);
        Self(hasher.finalize().into())
    }

    /// The configured key (`tasks.task_id_key`), else one derived from the provider API key and the
    /// deployment (shared by every replica of a deployment), else a random one for this process only
    /// (MCP task ids then do not survive a restart: logged as a warning).
    pub fn resolve(config: &Config, provider_api_key: Option<&str>, embedded: bool) -> Self {
        if !config.tasks.task_id_key.is_empty() {
            return Self::from_secret(config.tasks.task_id_key.as_bytes());
        }
        if let (Some(api_key), false) = (provider_api_key, embedded) {
            let material = format!("{api_key}\0{}", config.provider.deployment);
            return Self::from_secret(material.as_bytes());
        }
        if embedded {
            // The embedded provider's API key is new at each start; its state dir is not.
            let path = config.local.resolved_state_dir().join("mcp-task-id.key");
            match load_or_create_key_file(&path) {
                Ok(secret) => return Self::from_secret(&secret),
                Err(err) => tracing::warn!(path = %path.display(), error = %err, "cannot keep the MCP task-id key"),
            }
        }
        tracing::warn!(
            "no tasks.task_id_key configured (SANDBOX_MCP_TASKS__TASK_ID_KEY) and no provider API key to derive \
             one from: MCP task ids are valid for this process only"
        );
        Self::from_secret(&rand::random::<[u8; 32]>())
    }

    fn mac_state(&self, tenant: &str, handle: &TaskHandle) -> Option<HmacSha256> {
        let mut mac = HmacSha256::new_from_slice(&self.0).ok()?;
        let (created, kind) = (handle.created_ms.to_string(), handle.kind.encode());
        for part in [tenant, handle.sandbox_id.as_str(), handle.task_id.as_str(), &created, &kind] {
            mac.update(&(part.len() as u64).to_be_bytes());
            mac.update(part.as_bytes());
        }
        Some(mac)
    }

    /// The opaque MCP task id of a sandbox task, bound to `tenant`.
    pub fn encode(&self, tenant: &str, handle: &TaskHandle) -> String {
        let tag = self.mac_state(tenant, handle).map(|m| m.finalize().into_bytes().to_vec()).unwrap_or_default();
        let mac = URL_SAFE_NO_PAD.encode(&tag[..MAC_BYTES.min(tag.len())]);
        format!(
            "{ID_PREFIX}.{}.{}.{}.{}.{mac}",
            handle.sandbox_id,
            handle.task_id,
            handle.created_ms,
            handle.kind.encode()
        )
    }

    /// The task behind an MCP task id, if the id is well formed and was issued to `tenant`.
    pub fn decode(&self, tenant: &str, raw: &str) -> Option<TaskHandle> {
        let mut parts = raw.split('.');
        let (prefix, sandbox, task, created) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        let (kind, mac) = (parts.next()?, parts.next()?);
        if prefix != ID_PREFIX || parts.next().is_some() {
            return None;
        }
        validate_sandbox_id(sandbox).ok()?;
        let handle = TaskHandle {
            sandbox_id: sandbox.to_string(),
            task_id: TaskId::parse(task).ok()?,
            created_ms: created.parse().ok()?,
            kind: TaskKind::decode(kind)?,
        };
        let given = URL_SAFE_NO_PAD.decode(mac).ok()?;
        if given.len() != MAC_BYTES {
            return None;
        }
        // Constant-time comparison of the truncated tag.
        self.mac_state(tenant, &handle)?.verify_truncated_left(&given).ok()?;
        Some(handle)
    }
}

/// Reads the 32-byte key file, or creates it (mode 0600) with a random key.
fn load_or_create_key_file(path: &std::path::Path) -> std::io::Result<Vec<u8>> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    match std::fs::read(path) {
        Ok(secret) if secret.len() >= 32 => return Ok(secret),
        Ok(_) => return Err(std::io::Error::other("key file shorter than 32 bytes")),
        Err(err) if err.kind() != std::io::ErrorKind::NotFound => return Err(err),
        Err(_) => {}
    }
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let secret = rand::random::<[u8; 32]>();
    let tmp = path.with_extension(format!("tmp{:08x}", rand::random::<u32>()));
    let mut file = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp)?;
    file.write_all(&secret)?;
    file.sync_all()?;
    // A concurrent creator may win: keep whichever file is in place.
    if std::fs::hard_link(&tmp, path).is_err() {
        let _ = std::fs::remove_file(&tmp);
        return std::fs::read(path);
    }
    let _ = std::fs::remove_file(&tmp);
    Ok(secret.to_vec())
}

/// What an MCP task id stands for.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskHandle {
    pub sandbox_id: String,
    pub task_id: TaskId,
    /// Creation time, Unix milliseconds.
    pub created_ms: u64,
    /// The tool that started it (its result takes that tool's shape).
    pub kind: TaskKind,
}

/// The tool a task-augmented call was made to.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum TaskKind {
    RunCommand,
    /// `start_task`, with the task's timeout (part of start_task's result).
    StartTask {
        timeout: u64,
    },
}

impl TaskKind {
    fn encode(self) -> String {
        match self {
            TaskKind::RunCommand => "r".into(),
            TaskKind::StartTask { timeout } => format!("s{timeout}"),
        }
    }

    fn decode(raw: &str) -> Option<Self> {
        match raw.strip_prefix('s') {
            _ if raw == "r" => Some(TaskKind::RunCommand),
            Some(timeout) if !timeout.is_empty() && timeout.len() <= 6 => {
                Some(TaskKind::StartTask { timeout: timeout.parse().ok()? })
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn handle() -> TaskHandle {
        TaskHandle {
            sandbox_id: "sbx-1".into(),
            task_id: TaskId::parse("0123456789abcdef0123456789abcdef").expect("valid id"),
            created_ms: 1_700_000_000_000,
            kind: TaskKind::StartTask { timeout: 300 },
        }
    }

    #[test]
    fn ids_round_trip_for_their_tenant_only() {
        let key = TaskIdKey::from_secret(b"k1");
        let id = key.encode("acme", &handle());
        assert_eq!(key.decode("acme", &id), Some(handle()));
        assert_eq!(key.decode("beta", &id), None, "another tenant must not resolve the id");
        assert_eq!(TaskIdKey::from_secret(b"k2").decode("acme", &id), None, "another key must not resolve it");
    }

    #[test]
    fn forged_and_malformed_ids_are_refused() {
        let key = TaskIdKey::from_secret(b"k1");
        let id = key.encode("acme", &handle());
        let forged = id.replace("sbx-1", "sbx-2");
        assert_eq!(key.decode("acme", &forged), None);
        let other_kind = id.replace(".s300.", ".r.");
        assert_ne!(other_kind, id);
        assert_eq!(key.decode("acme", &other_kind), None);
        let mut tampered = id.clone();
        tampered.pop();
        tampered.push(if id.ends_with('A') { 'B' } else { 'A' });
        assert_eq!(key.decode("acme", &tampered), None);
        for bad in
            ["", "sbx1", "sbx1.a.b.c.d", "sbx1.a.b.c.d.e", "tasks-conformance-nonexistent-12345", &format!("{id}.x")]
        {
            assert_eq!(key.decode("acme", bad), None, "{bad}");
        }
    }
}
