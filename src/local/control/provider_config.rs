//! The local provider's settings, written once: [`LocalConfig`] is the `[local]` section of the
//! configuration file (defaults here, `SANDBOX_MCP_LOCAL__<KEY>` overrides in `crate::config`),
//! which the flags of `sandbox-mcp provider` override field by field; [`LocalProviderConfig`] is
//! everything a running provider needs, built from the configuration by
//! `Config::local_provider` (in `config.rs`) for both entry points (`serve`'s embedded provider and
//! `sandbox-mcp provider`).

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Default `local.max_sandboxes`: most sandboxes alive at once (paused ones count).
pub const DEFAULT_MAX_SANDBOXES: u32 = 100;
/// Default `local.memory_limit_mb`: per-sandbox memory limit, MiB.
pub const DEFAULT_MEMORY_LIMIT_MB: u64 = 2048;
/// Default `local.pids_limit`: per-sandbox process limit (cgroup pids controller).
pub const DEFAULT_PIDS_LIMIT: u64 = 1024;
/// Default `local.disk_limit_mb`: per-sandbox disk limit, MiB.
pub const DEFAULT_DISK_LIMIT_MB: u64 = 10240;
/// Default `local.id_range`: inside the range systemd reserves for containers, far from login users.
pub const DEFAULT_ID_RANGE: &str = "1000000000:65536";
/// Default `local.template_store_limit_mb`.
pub const DEFAULT_TEMPLATE_STORE_LIMIT_MB: u64 = crate::local::store::DEFAULT_STORE_LIMIT_MB;
/// Default `local.template_ready_timeout_secs`: how long a create waits for a stored template's
/// ready command.
pub const DEFAULT_TEMPLATE_READY_TIMEOUT_SECS: u64 = 60;
/// Default `local.max_snapshots`: most snapshots the provider keeps (its one tenant's quota).
pub const DEFAULT_MAX_SNAPSHOTS: u32 = 100;
/// Default `local.paused_retention_secs`: how long a sandbox paused at its deadline
/// (`lifecycle.on_timeout = "pause"`) is kept before it is removed.
pub const DEFAULT_PAUSED_RETENTION_SECS: u64 = 24 * 3600;
/// Lifetime of a sandbox created without `timeout`, seconds (E2B's default). The gateway always
/// sends one (`sandbox.default_timeout_secs`), so this matters to direct API clients only.
pub const DEFAULT_SANDBOX_TIMEOUT_SECS: u64 = 300;
/// Default `sandbox.max_timeout_secs`: the longest timeout a client may ask for, seconds.
pub const DEFAULT_MAX_SANDBOX_TIMEOUT_SECS: u64 = 24 * 3600;

/// `[local]`: the local provider's own settings, shared by `serve`'s embedded provider and
/// `sandbox-mcp provider` (whose flags override them one by one).
///
/// A limit of `None` is no limit; the file, the environment and the flags spell it `0`, as they
/// always have. An empty `state_dir` or `domain` is the same as leaving it out.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LocalConfig {
    /// Where sandbox records, writable layers and the template store live; `None`: see
    /// [`default_state_dir`].
    #[serde(with = "empty_is_none")]
    pub state_dir: Option<PathBuf>,
    /// Most sandboxes alive at once (paused ones count).
    pub max_sandboxes: u32,
    /// Per-sandbox memory limit (cgroup), MiB.
    #[serde(with = "zero_is_none")]
    pub memory_limit_mb: Option<u64>,
    /// Per-sandbox process limit (cgroup pids controller).
    #[serde(with = "zero_is_none")]
    pub pids_limit: Option<u64>,
    /// Upstream resolvers of the sandboxes' DNS forwarder; empty: the host's `/etc/resolv.conf`.
    pub dns_servers: Vec<IpAddr>,
    /// Host addresses sandboxes may reach when their `allow_out` names them; empty: none of the
    /// host's own addresses is ever reachable.
    pub open_host_addresses: Vec<IpAddr>,
    /// Domain of `{port}-{sandboxID}.{domain}` inbound hosts reported to clients; `None`: none.
    #[serde(with = "empty_is_none")]
    pub domain: Option<String>,
    /// Host uid/gid range `START:COUNT` (as in `/etc/subuid`) that ids inside sandboxes map to.
    pub id_range: String,
    /// Per-sandbox disk limit, MiB (a sparse ext4 image per sandbox).
    #[serde(with = "zero_is_none")]
    pub disk_limit_mb: Option<u64>,
    /// Extra templates: name → root filesystem directory.
    pub templates: BTreeMap<String, PathBuf>,
    /// Most MiB the template store's layers may take (`sandbox-mcp template import/pull`).
    pub template_store_limit_mb: u64,
    /// Seconds a create waits for a stored template's ready command to succeed (its start command
    /// runs at every create); past them the sandbox is killed and the create fails.
    pub template_ready_timeout_secs: u64,
    /// Most snapshots kept at once (`POST /sandboxes/{id}/snapshots`); 429 past it.
    pub max_snapshots: u32,
    /// Seconds a sandbox paused at its deadline (`lifecycle.on_timeout = "pause"`) is kept before
    /// it is removed; 0: one second.
    pub paused_retention_secs: u64,
    /// What a snapshot request that names no mode gets: `full` (E2B's default: refused here, with
    /// the mode that works) or `filesystem` (for clients that cannot name one, such as the
    /// JavaScript SDK 2.51's `createSnapshot`).
    pub default_snapshot_mode: SnapshotMode,
}

/// A snapshot's kind (E2B's `mode`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum SnapshotMode {
    /// Memory and filesystem (not supported by the local provider).
    #[default]
    Full,
    /// The filesystem only.
    Filesystem,
}

impl Default for LocalConfig {
    fn default() -> Self {
        Self {
            state_dir: None,
            max_sandboxes: DEFAULT_MAX_SANDBOXES,
            memory_limit_mb: Some(DEFAULT_MEMORY_LIMIT_MB),
            pids_limit: Some(DEFAULT_PIDS_LIMIT),
            dns_servers: Vec::new(),
            open_host_addresses: Vec::new(),
            domain: None,
            id_range: DEFAULT_ID_RANGE.into(),
            disk_limit_mb: Some(DEFAULT_DISK_LIMIT_MB),
            templates: BTreeMap::new(),
            template_store_limit_mb: DEFAULT_TEMPLATE_STORE_LIMIT_MB,
            template_ready_timeout_secs: DEFAULT_TEMPLATE_READY_TIMEOUT_SECS,
            max_snapshots: DEFAULT_MAX_SNAPSHOTS,
            paused_retention_secs: DEFAULT_PAUSED_RETENTION_SECS,
            default_snapshot_mode: SnapshotMode::Full,
        }
    }
}

impl LocalConfig {
    /// The provider's network settings from this section.
    pub fn network(&self) -> crate::local::net::NetConfig {
        let mut net = crate::local::net::NetConfig::default();
        if !self.dns_servers.is_empty() {
            net.dns_servers = self.dns_servers.clone();
        }
        net.domain = self.domain.clone();
        net.open_host_addresses = self.open_host_addresses.clone();
        net
    }

    /// The state directory: configured, else [`default_state_dir`].
    pub fn resolved_state_dir(&self) -> PathBuf {
        self.state_dir.clone().unwrap_or_else(default_state_dir)
    }
}

/// Everything the local provider needs; `Default` gives a working loopback set-up.
#[derive(Debug, Clone, PartialEq)]
pub struct LocalProviderConfig {
    /// Where sandbox records and writable layers live.
    pub state_dir: PathBuf,
    /// Required `X-API-Key`. `None`: any key is accepted (the header must still be present);
    /// only allowed when listening on loopback.
    pub api_key: Option<String>,
    /// Most sandboxes alive at once (paused ones count).
    pub max_sandboxes: usize,
    /// Per-sandbox memory limit (cgroup), MiB; `None`: no limit.
    pub memory_limit_mb: Option<u64>,
    /// Per-sandbox process limit (cgroup pids controller); `None`: no limit.
    pub pids_limit: Option<u64>,
    /// Lifetime of a sandbox created without `timeout`, seconds.
    pub default_timeout_secs: u64,
    /// Longest timeout a client may ask for, seconds.
    pub max_timeout_secs: u64,
    /// Template name → root filesystem directory (lower layer). `base` is built by the provider
    /// from an allow-list of the host (see `template`) unless overridden here.
    pub templates: HashMap<String, PathBuf>,
    /// Most MiB the template store may take (`local.template_store_limit_mb`).
    pub template_store_limit_mb: u64,
    /// How long a create waits for a stored template's ready command, seconds
    /// (`local.template_ready_timeout_secs`).
    pub template_ready_timeout_secs: u64,
    /// Most snapshots kept at once (`local.max_snapshots`).
    pub max_snapshots: usize,
    /// How long a sandbox paused at its deadline is kept, seconds (`local.paused_retention_secs`).
    pub paused_retention_secs: u64,
    /// The mode of a snapshot request that names none (`local.default_snapshot_mode`).
    pub default_snapshot_mode: SnapshotMode,
    /// Host uid/gid range that ids inside every sandbox map to (`local.id_range`).
    pub id_map: crate::local::isolation::userns::IdMap,
    /// Per-sandbox disk limit, MiB (`local.disk_limit_mb`); `None`: no limit.
    pub disk_limit_mb: Option<u64>,
    /// Largest control-plane request body, bytes.
    pub max_control_body_bytes: usize,
    /// Largest data-plane (envd) request body, bytes.
    pub max_data_body_bytes: u64,
    /// The executable started as each sandbox's agent (`envd`). Default `/proc/self/exe`: the
    /// lean `sandbox-mcp-envd` beside this binary when it is from the same build, else this very
    /// binary (see `agent_binary`); an embedding in another executable (a test binary) must point
    /// it at the real `sandbox-mcp` or `sandbox-mcp-envd`.
    pub agent_binary: PathBuf,
    /// Sandbox networking (DNS upstreams, namespace pool, inbound domain).
    pub network: crate::local::net::NetConfig,
    /// Connection cap and timeouts of the provider's HTTP listener.
    pub listen_limits: crate::listen::ListenLimits,
}

impl Default for LocalProviderConfig {
    /// The settings of a default `[local]` (see [`LocalConfig::default`]), the API key from
    /// `E2B_API_KEY` if set, and the default listener limits.
    fn default() -> Self {
        let local = LocalConfig::default();
        LocalProviderConfig {
            state_dir: local.resolved_state_dir(),
            api_key: std::env::var("E2B_API_KEY").ok().filter(|k| !k.is_empty()),
            max_sandboxes: usize::try_from(local.max_sandboxes).unwrap_or(usize::MAX),
            memory_limit_mb: local.memory_limit_mb,
            pids_limit: local.pids_limit,
            default_timeout_secs: DEFAULT_SANDBOX_TIMEOUT_SECS,
            max_timeout_secs: DEFAULT_MAX_SANDBOX_TIMEOUT_SECS,
            templates: HashMap::new(),
            template_store_limit_mb: local.template_store_limit_mb,
            template_ready_timeout_secs: local.template_ready_timeout_secs,
            max_snapshots: usize::try_from(local.max_snapshots).unwrap_or(usize::MAX),
            paused_retention_secs: local.paused_retention_secs,
            default_snapshot_mode: local.default_snapshot_mode,
            id_map: local.id_range.parse().unwrap_or_default(),
            disk_limit_mb: local.disk_limit_mb,
            max_control_body_bytes: 1024 * 1024,
            max_data_body_bytes: 1024 * 1024 * 1024,
            agent_binary: PathBuf::from(super::agent_binary::SELF_EXE),
            network: crate::local::net::NetConfig::default(),
            listen_limits: crate::listen::ListenLimits::default(),
        }
    }
}

/// `/var/lib/sandbox-mcp` for root, else `$XDG_STATE_HOME/sandbox-mcp` or `~/.local/state/sandbox-mcp`.
pub fn default_state_dir() -> PathBuf {
    if nix::unistd::geteuid().is_root() {
        return PathBuf::from("/var/lib/sandbox-mcp");
    }
    if let Some(xdg) = std::env::var_os("XDG_STATE_HOME").filter(|v| !v.is_empty()) {
        return PathBuf::from(xdg).join("sandbox-mcp");
    }
    let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/tmp"));
    home.join(".local/state/sandbox-mcp")
}

/// A limit that is `0` in the file, the environment and the flags, `None` in Rust.
mod zero_is_none {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(value: &Option<u64>, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_u64(value.unwrap_or(0))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<u64>, D::Error> {
        Ok(Some(u64::deserialize(deserializer)?).filter(|&n| n > 0))
    }
}

/// A string setting that is `""` when unset in the file and the environment, `None` in Rust.
mod empty_is_none {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<T: Serialize, S: Serializer>(value: &Option<T>, serializer: S) -> Result<S::Ok, S::Error> {
        match value {
            Some(value) => value.serialize(serializer),
            None => serializer.serialize_str(""),
        }
    }

    pub fn deserialize<'de, T: From<String>, D: Deserializer<'de>>(deserializer: D) -> Result<Option<T>, D::Error> {
        let text = String::deserialize(deserializer)?;
        Ok((!text.is_empty()).then(|| T::from(text)))
    }
}
