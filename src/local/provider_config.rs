//! Configuration of the embedded local provider and its defaults.

use std::collections::HashMap;
use std::path::PathBuf;

/// Default per-sandbox memory limit, MiB, of every provider (`serve`'s embedded one and
/// `sandbox-mcp provider`); 0 in a setting means no limit.
pub const DEFAULT_MEMORY_LIMIT_MB: u64 = 2048;
/// Default per-sandbox process limit (cgroup pids controller) of every provider.
pub const DEFAULT_PIDS_LIMIT: u64 = 1024;
/// Default per-sandbox disk limit, MiB, of every provider.
pub const DEFAULT_DISK_LIMIT_MB: u64 = 10240;

/// Everything the local provider needs; `Default` gives a working loopback set-up.
#[derive(Debug, Clone)]
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
    /// Host uid/gid range that ids inside every sandbox map to (`local.id_range`).
    pub id_map: super::userns::IdMap,
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
    pub network: super::net::NetConfig,
    /// Connection cap and timeouts of the provider's HTTP listener.
    pub listen_limits: crate::listen::ListenLimits,
}

impl Default for LocalProviderConfig {
    fn default() -> Self {
        LocalProviderConfig {
            state_dir: default_state_dir(),
            api_key: std::env::var("E2B_API_KEY").ok().filter(|k| !k.is_empty()),
            max_sandboxes: 100,
            memory_limit_mb: Some(DEFAULT_MEMORY_LIMIT_MB),
            pids_limit: Some(DEFAULT_PIDS_LIMIT),
            default_timeout_secs: 300,
            max_timeout_secs: 24 * 3600,
            templates: HashMap::new(),
            template_store_limit_mb: super::store::DEFAULT_STORE_LIMIT_MB,
            id_map: super::userns::IdMap::default(),
            disk_limit_mb: Some(DEFAULT_DISK_LIMIT_MB),
            max_control_body_bytes: 1024 * 1024,
            max_data_body_bytes: 1024 * 1024 * 1024,
            agent_binary: PathBuf::from(super::agent_binary::SELF_EXE),
            network: super::net::NetConfig::default(),
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
