//! The key that binds MCP task ids to their tenant ([`McpTaskIdKey`], an
//! HMAC-SHA256 key, see `mcp::mcp_task_id`) and where it comes from: the
//! configured `tasks.task_id_key`, else derived from the provider API key and
//! the deployment, else kept in the embedded provider's state directory, else
//! random for this process only.

use hmac::{Hmac, KeyInit, Mac};
use sha2::{Digest, Sha256};

use crate::config::Config;

/// HMAC-SHA256, as MCP task ids are sealed.
pub type HmacSha256 = Hmac<Sha256>;

/// The key binding MCP task ids to tenants.
#[derive(Clone)]
pub struct McpTaskIdKey([u8; 32]);

impl std::fmt::Debug for McpTaskIdKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("McpTaskIdKey(***)")
    }
}

impl McpTaskIdKey {
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

    /// The MAC state after `parts`, each fed with its length first (so no two lists of parts collide).
    pub fn mac_of(&self, parts: &[&str]) -> Option<HmacSha256> {
        let mut mac = HmacSha256::new_from_slice(&self.0).ok()?;
        for part in parts {
            mac.update(&(part.len() as u64).to_be_bytes());
            mac.update(part.as_bytes());
        }
        Some(mac)
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
