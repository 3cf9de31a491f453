//! Typed configuration: TOML file plus environment overrides.
//!
//! Sources, later ones winning: built-in defaults, the TOML file given with
//! `--config`, environment variables `SANDBOX_MCP_<SECTION>__<KEY>`, the
//! container convenience `SANDBOX_MCP_TOKENS="tenant:sha256hex,..."`, and
//! finally the CLI flags (applied by the caller). See `config/local.toml`.

use crate::e2b::wire::MAX_FORK_COUNT;
pub use crate::local::control::provider_config::LocalConfig;
use crate::local::control::provider_config::LocalProviderConfig;
pub use crate::tenant::is_valid_tenant;
use std::net::SocketAddr;
use std::path::Path;

use figment::Figment;
use figment::providers::{Env, Format, Serialized, Toml};
use serde::{Deserialize, Serialize};

use crate::logging::LogFormat;

/// Environment variable prefix of every override.
pub const ENV_PREFIX: &str = "SANDBOX_MCP_";
/// Convenience variable: `tenant:sha256hex,tenant2:sha256hex`.
pub const ENV_TOKENS: &str = "SANDBOX_MCP_TOKENS";

/// Configuration errors (bad file, bad value).
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file or the environment does not fit the schema (one plain line per problem).
    #[error("cannot read config: {0}")]
    Load(String),
    #[error("invalid config: {0}")]
    Invalid(String),
}

/// The whole configuration.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub server: ServerConfig,
    pub auth: AuthConfig,
    pub provider: ProviderConfig,
    pub local: LocalConfig,
    pub sandbox: SandboxConfig,
    pub metrics: MetricsConfig,
    pub tasks: TasksConfig,
    pub limits: LimitsConfig,
    pub sessions: SessionsConfig,
}

/// `[sessions]`: where legacy MCP sessions (protocol <= 2025-11-25) live.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SessionsConfig {
    /// `"memory"` (one process; sessions end with it) or `"redis://host:port/db"` / `"rediss://…"` (TLS):
    /// shared by every replica, so sessions survive restarts and move between replicas.
    pub store: String,
    /// Environment variable holding the Redis password (used when the URL has none).
    pub password_env: String,
    /// Prefix of every Redis key (one per deployment sharing a Redis).
    pub key_prefix: String,
    /// Bound on every Redis call, in milliseconds.
    pub timeout_ms: u64,
    /// Redis connections (multiplexed) per gateway.
    pub pool_size: usize,
    /// How long a replica may hold a session's cleanup before another one takes it over.
    pub cleanup_lease_secs: u64,
    /// How often each replica looks for expired sessions to clean up.
    pub sweep_interval_secs: u64,
}

impl Default for SessionsConfig {
    fn default() -> Self {
        Self {
            store: "memory".into(),
            password_env: "SANDBOX_MCP_REDIS_PASSWORD".into(),
            key_prefix: "sandbox-mcp".into(),
            timeout_ms: 1000,
            pool_size: 4,
            cleanup_lease_secs: 30,
            sweep_interval_secs: 5,
        }
    }
}

impl SessionsConfig {
    /// The Redis URL when sessions live in Redis.
    pub fn redis_url(&self) -> Option<&str> {
        (self.store != "memory").then_some(self.store.as_str())
    }
}

/// `[limits]`: per-tenant limits (0: no limit; unset: a fair-share default derived from the
/// deployment, see `gateway::http::quotas::TenantLimits`). The global sandbox limit is
/// `local.max_sandboxes` (or the remote provider's own).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LimitsConfig {
    /// Live sandboxes per tenant (counted at the provider, this deployment only).
    pub max_sandboxes_per_tenant: Option<usize>,
    /// Live MCP sessions per tenant.
    pub max_sessions_per_tenant: Option<usize>,
    /// Tool calls running at once per tenant.
    pub max_concurrent_calls_per_tenant: Option<usize>,
    /// Most forks one `fork_sandbox` call may ask for (1-20, the provider's own cap; default 10).
    /// Forks also count against `max_sandboxes_per_tenant`.
    pub max_forks_per_call: u32,
    /// Snapshots kept per tenant (`snapshot_sandbox`).
    pub max_snapshots_per_tenant: Option<usize>,
}

/// Default of `limits.max_forks_per_call`.
pub const DEFAULT_MAX_FORKS_PER_CALL: u32 = 10;

impl Default for LimitsConfig {
    fn default() -> Self {
        Self {
            max_sandboxes_per_tenant: None,
            max_sessions_per_tenant: None,
            max_concurrent_calls_per_tenant: None,
            max_forks_per_call: DEFAULT_MAX_FORKS_PER_CALL,
            max_snapshots_per_tenant: None,
        }
    }
}

/// `[server]`: the HTTP listener and MCP transport.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    pub listen: SocketAddr,
    pub allowed_hosts: Vec<String>,
    pub allowed_origins: Vec<String>,
    pub max_body_bytes: usize,
    pub session_idle_timeout_secs: u64,
    pub sse_keep_alive_secs: u64,
    /// A legacy (session) POST whose stream ends within this many milliseconds carrying only its
    /// response is answered as `application/json` instead of SSE; 0 = always SSE. Off with Redis
    /// sessions (their streams keep event ids for replay on another replica).
    pub legacy_json_window_ms: u64,
    pub shutdown_grace_secs: u64,
    pub insecure_no_auth: bool,
    pub log_format: LogFormat,
    /// Most connections open at once on each listener (gateway, admin, embedded provider); at the
    /// cap the longest-idle connection is closed to make room. At most a quarter of the
    /// descriptor limit is used whatever is set.
    pub max_connections: usize,
    /// Time a client has to send a request's headers once the server waits for them (slowloris).
    pub header_read_timeout_secs: u64,
    /// A connection with no request in flight for this long is closed.
    pub idle_timeout_secs: u64,
    /// Worker threads of the gateway's async runtime; 0 = one per CPU core. One by default: a call
    /// then never hops between threads (see `gateway_runtime` in `crate::gateway`). The embedded local provider
    /// runs on a runtime of its own with one worker per core whatever is set here.
    pub worker_threads: usize,
}

impl ServerConfig {
    /// The listener limits from this section.
    pub fn listen_limits(&self) -> crate::listen::ListenLimits {
        crate::listen::ListenLimits {
            max_connections: self.max_connections,
            header_read_timeout: std::time::Duration::from_secs(self.header_read_timeout_secs),
            idle_timeout: std::time::Duration::from_secs(self.idle_timeout_secs),
        }
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            allowed_hosts: vec!["localhost".into(), "127.0.0.1".into(), "::1".into()],
            allowed_origins: Vec::new(),
            max_body_bytes: 4 * 1024 * 1024,
            session_idle_timeout_secs: 900,
            sse_keep_alive_secs: 15,
            legacy_json_window_ms: 1000,
            shutdown_grace_secs: 20,
            insecure_no_auth: false,
            log_format: LogFormat::Auto,
            max_connections: crate::listen::DEFAULT_MAX_CONNECTIONS,
            header_read_timeout_secs: crate::listen::DEFAULT_HEADER_READ_TIMEOUT_SECS,
            idle_timeout_secs: crate::listen::DEFAULT_IDLE_TIMEOUT_SECS,
            worker_threads: 1,
        }
    }
}

/// Most worker threads `server.worker_threads` may ask for.
pub const MAX_WORKER_THREADS: usize = 256;

/// `[auth]`: static bearer tokens, stored as SHA-256 hashes.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuthConfig {
    pub tokens: Vec<TokenEntry>,
    /// `[auth.oauth]`: OAuth 2.1 access tokens from an authorization server (beside the static tokens).
    pub oauth: crate::gateway::oauth::OAuthConfig,
}

/// One bearer token: the tenant it maps to and the hex SHA-256 of the token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenEntry {
    pub tenant: String,
    pub sha256: String,
}

/// Which provider backs the sandboxes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProviderKind {
    /// The embedded local provider, started by `serve` on a private port.
    #[default]
    Local,
    /// Any E2B-compatible API (E2B cloud, self-hosted, or `sandbox-mcp provider`).
    E2b,
}

/// `[provider]`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ProviderConfig {
    pub kind: ProviderKind,
    pub api_url: String,
    pub sandbox_url: String,
    pub domain: String,
    pub api_key_env: String,
    pub request_timeout_secs: u64,
    pub deployment: String,
}

impl Default for ProviderConfig {
    fn default() -> Self {
        Self {
            kind: ProviderKind::Local,
            api_url: "https://api.e2b.app".into(),
            sandbox_url: String::new(),
            domain: "e2b.app".into(),
            api_key_env: "E2B_API_KEY".into(),
            request_timeout_secs: 30,
            deployment: "default".into(),
        }
    }
}

/// `[sandbox]`: defaults and limits of the sandboxes the tools create.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SandboxConfig {
    pub default_template: String,
    pub default_timeout_secs: u64,
    pub max_timeout_secs: u64,
    pub renew_on_use_secs: u64,
}

impl Default for SandboxConfig {
    fn default() -> Self {
        Self {
            default_template: "base".into(),
            default_timeout_secs: 600,
            max_timeout_secs: crate::local::control::provider_config::DEFAULT_MAX_SANDBOX_TIMEOUT_SECS,
            renew_on_use_secs: 600,
        }
    }
}

/// `[metrics]`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MetricsConfig {
    pub enabled: bool,
    pub listen: String,
    /// Hex SHA-256 of the token that may read `/metrics` on the main listener when auth is on
    /// (tenant tokens never can). Empty: with auth on, `/metrics` is only on `listen`.
    pub token_sha256: String,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        Self { enabled: true, listen: String::new(), token_sha256: String::new() }
    }
}

/// `[tasks]`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TasksConfig {
    /// Extra secret values masked in every output the gateway returns.
    pub secrets: Vec<String>,
    /// Key binding MCP task ids (Tasks extension) to tenants; every replica of a deployment must share
    /// it (SANDBOX_MCP_TASKS__TASK_ID_KEY). Empty: derived from the provider API key and deployment.
    pub task_id_key: String,
}

impl Config {
    /// The provider's configuration from `[local]`, the listener limits of `[server]` and
    /// `sandbox.max_timeout_secs`; the API key and the default sandbox timeout keep their defaults
    /// for the caller to set. Both entry points go through here (`serve` with its file,
    /// `sandbox-mcp provider` with its file and its flags applied), so the same settings make the
    /// same provider. Fails only on a `local.id_range` that is no usable range.
    pub fn local_provider(&self) -> Result<LocalProviderConfig, crate::local::isolation::userns::IdMapParseError> {
        let local = &self.local;
        Ok(LocalProviderConfig {
            state_dir: local.resolved_state_dir(),
            max_sandboxes: usize::try_from(local.max_sandboxes).unwrap_or(usize::MAX),
            memory_limit_mb: local.memory_limit_mb,
            pids_limit: local.pids_limit,
            max_timeout_secs: self.sandbox.max_timeout_secs,
            templates: local.templates.clone().into_iter().collect(),
            template_store_limit_mb: local.template_store_limit_mb,
            template_ready_timeout_secs: local.template_ready_timeout_secs,
            max_snapshots: usize::try_from(local.max_snapshots).unwrap_or(usize::MAX),
            paused_retention_secs: local.paused_retention_secs,
            default_snapshot_mode: local.default_snapshot_mode,
            id_map: local.id_range.parse()?,
            disk_limit_mb: local.disk_limit_mb,
            network: local.network(),
            listen_limits: self.server.listen_limits(),
            ..LocalProviderConfig::default()
        })
    }

    /// Loads defaults, then `file` (if any), then the environment, and validates the result.
    pub fn load(file: Option<&Path>) -> Result<Self, ConfigError> {
        Self::load_with_env(file, &std::env::vars().collect::<Vec<_>>())
    }

    /// Like [`Config::load`], with an explicit environment (testable without touching the process env).
    pub fn load_with_env(file: Option<&Path>, env: &[(String, String)]) -> Result<Self, ConfigError> {
        let mut figment = Figment::from(Serialized::defaults(Config::default()));
        if let Some(path) = file {
            if !path.is_file() {
                return Err(ConfigError::Invalid(format!("config file {} does not exist", path.display())));
            }
            figment = figment.merge(Toml::file_exact(path));
        }
        // Only `SECTION__KEY` variables are config keys; `SANDBOX_MCP_TOKENS` and friends are not.
        let env_pairs: Vec<(String, String)> = env
            .iter()
            .filter(|(k, _)| k.starts_with(ENV_PREFIX) && k[ENV_PREFIX.len()..].contains("__"))
            .cloned()
            .collect();
        let env_provider = Env::prefixed(ENV_PREFIX).split("__");
        figment = figment.merge(EnvPairs { env: env_provider, pairs: env_pairs });
        let mut config: Config = figment.extract().map_err(|e| ConfigError::Load(describe_load_error(e)))?;
        if let Some((_, value)) = env.iter().find(|(k, _)| k == ENV_TOKENS) {
            config.auth.tokens.extend(parse_token_list(value)?);
        }
        config.validate()?;
        Ok(config)
    }

    /// Checks values that types alone cannot.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |msg: String| Err(ConfigError::Invalid(msg));
        for token in &self.auth.tokens {
            if !is_valid_tenant(&token.tenant) {
                return invalid(format!(
                    "auth.tokens: tenant {:?} must be 1-64 characters of A-Z a-z 0-9 _ . -",
                    token.tenant
                ));
            }
            if token.sha256.len() != 64 || !token.sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
                return invalid(format!(
                    "auth.tokens: the sha256 of tenant {:?} must be 64 hex characters (the SHA-256 of the token, not the token)",
                    token.tenant
                ));
            }
        }
        if let Err(err) = self.local.id_range.parse::<crate::local::isolation::userns::IdMap>() {
            return invalid(err.to_string());
        }
        for (name, root) in &self.local.templates {
            if name.is_empty() || !root.is_absolute() {
                return invalid(format!(
                    "local.templates: {name:?} must map a name to an absolute root filesystem directory, got {}",
                    root.display()
                ));
            }
        }
        let m = &self.metrics.token_sha256;
        if !m.is_empty() && (m.len() != 64 || !m.bytes().all(|b| b.is_ascii_hexdigit())) {
            return invalid("metrics.token_sha256 must be 64 hex characters (the SHA-256 of the token)".into());
        }
        self.auth.oauth.validate().map_err(|e| ConfigError::Invalid(e.to_string()))?;
        let sessions = &self.sessions;
        if sessions.store != "memory"
            && !(sessions.store.starts_with("redis://") || sessions.store.starts_with("rediss://"))
        {
            return invalid(format!(
                "sessions.store must be \"memory\", \"redis://host:port[/db]\" or \"rediss://…\" (TLS), got {:?}",
                sessions.store.split('@').next_back().unwrap_or_default()
            ));
        }
        if sessions.timeout_ms == 0 || sessions.pool_size == 0 || sessions.cleanup_lease_secs == 0 {
            return invalid(
                "sessions.timeout_ms, sessions.pool_size and sessions.cleanup_lease_secs must be at least 1".into(),
            );
        }
        if sessions.sweep_interval_secs == 0 || sessions.key_prefix.is_empty() {
            return invalid("sessions.sweep_interval_secs must be at least 1 and sessions.key_prefix non-empty".into());
        }
        let s = &self.server;
        if s.max_body_bytes < 1024 {
            return invalid("server.max_body_bytes must be at least 1024".into());
        }
        if s.session_idle_timeout_secs == 0 {
            return invalid("server.session_idle_timeout_secs must be at least 1".into());
        }
        // Upper bounds: these become deadlines (`Instant + Duration`), which overflow into a panic.
        if s.shutdown_grace_secs > 3600 {
            return invalid(format!("server.shutdown_grace_secs must be at most 3600 (got {})", s.shutdown_grace_secs));
        }
        if self.sandbox.renew_on_use_secs > 86_400 {
            return invalid(format!(
                "sandbox.renew_on_use_secs must be at most 86400, a day (got {}); 0 turns renewal off",
                self.sandbox.renew_on_use_secs
            ));
        }
        if s.max_connections == 0 || s.header_read_timeout_secs == 0 || s.idle_timeout_secs == 0 {
            return invalid(
                "server.max_connections, server.header_read_timeout_secs and server.idle_timeout_secs must be at least 1"
                    .into(),
            );
        }
        if s.worker_threads > MAX_WORKER_THREADS {
            return invalid(format!(
                "server.worker_threads must be at most {MAX_WORKER_THREADS} (got {}); 0 means one per CPU core",
                s.worker_threads
            ));
        }
        for origin in &s.allowed_origins {
            if origin != "null" && !origin.contains("://") {
                return invalid(format!(
                    "server.allowed_origins: {origin:?} needs a scheme, like https://app.example.com"
                ));
            }
        }
        if self.provider.kind == ProviderKind::E2b {
            url::Url::parse(&self.provider.api_url)
                .map_err(|e| ConfigError::Invalid(format!("provider.api_url: {e}")))?;
            if !self.provider.sandbox_url.is_empty() {
                url::Url::parse(&self.provider.sandbox_url)
                    .map_err(|e| ConfigError::Invalid(format!("provider.sandbox_url: {e}")))?;
            }
        }
        if self.provider.request_timeout_secs == 0 {
            return invalid("provider.request_timeout_secs must be at least 1".into());
        }
        if self.provider.deployment.is_empty() || self.provider.deployment.len() > 64 {
            return invalid("provider.deployment must be 1-64 characters".into());
        }
        let forks = self.limits.max_forks_per_call;
        if forks == 0 || forks > MAX_FORK_COUNT {
            return invalid(format!(
                "limits.max_forks_per_call must be between 1 and {MAX_FORK_COUNT} (the provider's cap), got {forks}"
            ));
        }
        let sb = &self.sandbox;
        if sb.max_timeout_secs == 0 || sb.default_timeout_secs == 0 || sb.default_timeout_secs > sb.max_timeout_secs {
            return invalid("sandbox: need 0 < default_timeout_secs <= max_timeout_secs".into());
        }
        Ok(())
    }

    /// True when at least one bearer token or an OAuth issuer is configured.
    pub fn has_auth(&self) -> bool {
        !self.auth.tokens.is_empty() || self.auth.oauth.is_enabled()
    }
}

/// Parses `tenant:sha256hex,tenant2:sha256hex`.
pub fn parse_token_list(value: &str) -> Result<Vec<TokenEntry>, ConfigError> {
    value
        .split(',')
        .map(str::trim)
        .filter(|item| !item.is_empty())
        .map(|item| match item.split_once(':') {
            Some((tenant, hash)) => {
                Ok(TokenEntry { tenant: tenant.trim().to_string(), sha256: hash.trim().to_ascii_lowercase() })
            }
            None => Err(ConfigError::Invalid(format!("{ENV_TOKENS}: expected tenant:sha256hex items, got {item:?}"))),
        })
        .collect()
}

/// An `Env` provider fed from an explicit list of variables instead of the process environment.
struct EnvPairs {
    env: Env,
    pairs: Vec<(String, String)>,
}

/// One plain line per problem: where (the file, or the environment variable), the key path as
/// written (`server.listn`, without figment's profile prefix), and what is wrong, with the valid
/// keys for an unknown one.
fn describe_load_error(err: figment::Error) -> String {
    use figment::error::Kind;
    let lines: Vec<String> = err
        .into_iter()
        .map(|e| {
            let key = e.path.join(".");
            let source = match e.metadata.as_ref().and_then(|m| m.source.as_ref()) {
                Some(figment::Source::File(path)) => format!("in {}", path.display()),
                Some(_) | None if e.metadata.as_ref().is_some_and(|m| m.name.contains("environment")) => {
                    format!("in the environment (SANDBOX_MCP_{})", key.to_uppercase().replace('.', "__"))
                }
                _ => String::new(),
            };
            let what = match &e.kind {
                Kind::UnknownField(field, expected) => {
                    format!("unknown key \"{field}\"; valid keys here: {}", expected.join(", "))
                }
                Kind::MissingField(field) => format!("missing key \"{field}\""),
                Kind::InvalidType(actual, expected) => format!("expected {expected}, found {actual}"),
                Kind::InvalidValue(actual, expected) => format!("invalid value {actual}, expected {expected}"),
                Kind::UnknownVariant(variant, expected) => {
                    format!("unknown value \"{variant}\"; valid values: {}", expected.join(", "))
                }
                other => other.to_string(),
            };
            let key = if key.is_empty() { String::new() } else { format!("key \"{key}\" ") };
            format!("{key}{source}: {what}").trim_start().to_owned()
        })
        .collect();
    lines.join("; ")
}

impl figment::Provider for EnvPairs {
    fn metadata(&self) -> figment::Metadata {
        self.env.metadata()
    }

    fn data(&self) -> Result<figment::value::Map<figment::Profile, figment::value::Dict>, figment::Error> {
        use figment::value::{Dict, Map, Value};
        let mut dict = Dict::new();
        for (key, raw) in &self.pairs {
            let Some(rest) = key.strip_prefix(ENV_PREFIX) else { continue };
            let path: Vec<String> = rest.split("__").map(|p| p.to_ascii_lowercase()).collect();
            let value: Value = raw.parse().unwrap_or_else(|_| Value::from(raw.clone()));
            insert_path(&mut dict, &path, value);
        }
        let mut map = Map::new();
        map.insert(figment::Profile::Default, dict);
        Ok(map)
    }
}

fn insert_path(dict: &mut figment::value::Dict, path: &[String], value: figment::value::Value) {
    use figment::value::{Dict, Value};
    match path {
        [] => {}
        [last] => {
            dict.insert(last.clone(), value);
        }
        [first, rest @ ..] => {
            let entry = dict.entry(first.clone()).or_insert_with(|| Value::from(Dict::new()));
            if let Value::Dict(_, inner) = entry {
                insert_path(inner, rest, value);
            } else {
                let mut inner = Dict::new();
                insert_path(&mut inner, rest, value);
                *entry = Value::from(inner);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    /// A config file `name` holding `toml`, in a directory that lives as long as the returned guard.
    fn config_file(name: &str, toml: &str) -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(name);
        std::fs::write(&path, toml).unwrap();
        (dir, path)
    }

    /// Loads `toml` as the config file, with `vars` as the environment.
    fn load(toml: &str, vars: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let (_dir, path) = config_file("c.toml", toml);
        Config::load_with_env(Some(&path), &env(vars))
    }

    #[test]
    fn a_typo_is_reported_once_plainly_with_the_file_the_key_and_the_valid_keys() {
        let (_dir, path) = config_file("typo.toml", "[server]\nlistn = \"127.0.0.1:1\"\n");
        let message = Config::load_with_env(Some(&path), &[]).unwrap_err().to_string();
        assert_eq!(message.matches("listn").count(), 2, "once as the key path, once as the key: {message}");
        assert!(message.contains(&format!("key \"server.listn\" in {}", path.display())), "{message}");
        assert!(message.contains("valid keys here: listen, allowed_hosts"), "{message}");
        assert!(!message.contains("default.") && !message.contains('`'), "{message}");
        let message = Config::load_with_env(None, &env(&[("SANDBOX_MCP_SERVER__LISTN", "x")])).unwrap_err().to_string();
        assert!(message.contains("in the environment (SANDBOX_MCP_SERVER__LISTN)"), "{message}");
    }

    #[test]
    fn deadlines_that_would_overflow_are_refused() {
        for (key, value) in [
            ("SANDBOX_MCP_SERVER__SHUTDOWN_GRACE_SECS", "18446744073709551615"),
            ("SANDBOX_MCP_SANDBOX__RENEW_ON_USE_SECS", "18446744073709551615"),
        ] {
            let message = Config::load_with_env(None, &env(&[(key, value)])).unwrap_err().to_string();
            assert!(message.contains("must be at most"), "{key}: {message}");
        }
    }

    #[test]
    fn defaults_without_any_source() {
        let c = Config::load_with_env(None, &[]).unwrap();
        assert_eq!(c.server.listen.to_string(), "127.0.0.1:8080");
        assert_eq!(c.provider.kind, ProviderKind::Local);
        assert!(!c.has_auth());
        assert_eq!(c.sandbox.renew_on_use_secs, 600);
        assert_eq!(c.server.worker_threads, 1);
    }

    #[test]
    fn per_tenant_limits_are_unset_by_default_and_set_from_the_file_or_the_environment() {
        let c = Config::load_with_env(None, &[]).unwrap();
        assert_eq!(c.limits.max_sandboxes_per_tenant, None, "unset: derived by the gateway");
        let c = load(
            "[limits]\nmax_sandboxes_per_tenant = 0\nmax_sessions_per_tenant = 3\n",
            &[("SANDBOX_MCP_LIMITS__MAX_CONCURRENT_CALLS_PER_TENANT", "5")],
        )
        .unwrap();
        assert_eq!(c.limits.max_sandboxes_per_tenant, Some(0));
        assert_eq!(c.limits.max_sessions_per_tenant, Some(3));
        assert_eq!(c.limits.max_concurrent_calls_per_tenant, Some(5));
        assert_eq!(c.limits.max_forks_per_call, DEFAULT_MAX_FORKS_PER_CALL, "a key left out keeps its default");
    }

    #[test]
    fn max_forks_per_call_is_within_the_providers_cap() {
        assert_eq!(Config::load_with_env(None, &[]).unwrap().limits.max_forks_per_call, 10);
        let c = load("[limits]\nmax_forks_per_call = 3\n", &[]).unwrap();
        assert_eq!(c.limits.max_forks_per_call, 3);
        for bad in ["0", "21"] {
            let message = load("", &[("SANDBOX_MCP_LIMITS__MAX_FORKS_PER_CALL", bad)]).unwrap_err().to_string();
            assert!(message.contains("limits.max_forks_per_call must be between 1 and 20"), "{bad}: {message}");
        }
    }

    #[test]
    fn local_zero_and_empty_mean_none_in_the_file_and_the_environment() {
        let c = Config::load_with_env(None, &[]).unwrap();
        assert_eq!(
            (c.local.memory_limit_mb, c.local.pids_limit, c.local.disk_limit_mb),
            (Some(2048), Some(1024), Some(10240))
        );
        assert_eq!((c.local.state_dir.as_deref(), c.local.domain.as_deref()), (None, None));
        assert_eq!((c.local.template_store_limit_mb, c.local.template_ready_timeout_secs), (51200, 60));
        let c = load(
            "[local]\nmemory_limit_mb = 0\ndisk_limit_mb = 0\nstate_dir = \"\"\ndomain = \"\"\n",
            &[
                ("SANDBOX_MCP_LOCAL__PIDS_LIMIT", "0"),
                ("SANDBOX_MCP_LOCAL__TEMPLATE_STORE_LIMIT_MB", "7"),
                ("SANDBOX_MCP_LOCAL__TEMPLATE_READY_TIMEOUT_SECS", "3"),
            ],
        )
        .unwrap();
        assert_eq!((c.local.memory_limit_mb, c.local.pids_limit, c.local.disk_limit_mb), (None, None, None));
        assert_eq!((c.local.state_dir.as_deref(), c.local.domain.as_deref()), (None, None));
        assert_eq!((c.local.template_store_limit_mb, c.local.template_ready_timeout_secs), (7, 3));
        let c = load("[local]\nstate_dir = \"/srv/state\"\npids_limit = 10\n", &[]).unwrap();
        assert_eq!(c.local.resolved_state_dir(), Path::new("/srv/state"));
        assert_eq!(c.local.pids_limit, Some(10));
        assert_eq!(
            c.local.id_range.parse::<crate::local::isolation::userns::IdMap>(),
            Ok(crate::local::isolation::userns::IdMap::default()),
            "local.id_range's default is the id map's"
        );
        let message = load("[local]\npids_limit = -1\n", &[]).unwrap_err().to_string();
        assert!(message.contains("local.pids_limit"), "{message}");
    }

    #[test]
    fn worker_threads_are_bounded() {
        let c = Config::load_with_env(None, &env(&[("SANDBOX_MCP_SERVER__WORKER_THREADS", "0")])).unwrap();
        assert_eq!(c.server.worker_threads, 0, "0 = one per core");
        let message = Config::load_with_env(None, &env(&[("SANDBOX_MCP_SERVER__WORKER_THREADS", "100000")]))
            .unwrap_err()
            .to_string();
        assert!(message.contains("server.worker_threads must be at most 256"), "{message}");
    }

    #[test]
    fn file_then_env_override() {
        let c = load(
            "[server]\nlisten = \"127.0.0.1:9000\"\nsession_idle_timeout_secs = 5\n[provider]\nkind = \"e2b\"\napi_url = \"http://127.0.0.1:1\"\n",
            &[
                ("SANDBOX_MCP_SERVER__LISTEN", "127.0.0.1:9100"),
                ("SANDBOX_MCP_SANDBOX__RENEW_ON_USE_SECS", "0"),
                ("SANDBOX_MCP_SERVER__ALLOWED_HOSTS", "[\"a.example\", \"b.example\"]"),
                ("SANDBOX_MCP_PYTHON", "/usr/bin/python3"),
            ],
        )
        .unwrap();
        assert_eq!(c.server.listen.to_string(), "127.0.0.1:9100");
        assert_eq!(c.server.session_idle_timeout_secs, 5);
        assert_eq!(c.provider.kind, ProviderKind::E2b);
        assert_eq!(c.sandbox.renew_on_use_secs, 0);
        assert_eq!(c.server.allowed_hosts, vec!["a.example", "b.example"]);
    }

    #[test]
    fn tokens_from_env_convenience_and_validation() {
        let hash = "a".repeat(64);
        let c =
            Config::load_with_env(None, &env(&[("SANDBOX_MCP_TOKENS", &format!("acme:{hash}, beta:{hash}"))])).unwrap();
        assert_eq!(c.auth.tokens.len(), 2);
        assert_eq!(c.auth.tokens[1].tenant, "beta");
        let err = Config::load_with_env(None, &env(&[("SANDBOX_MCP_TOKENS", "acme:plaintext-token")])).unwrap_err();
        assert!(err.to_string().contains("64 hex"), "{err}");
    }

    #[test]
    fn unknown_keys_and_missing_file_are_errors() {
        let (dir, path) = config_file("c.toml", "[server]\nlisten_on = \"x\"\n");
        let err = Config::load_with_env(Some(&path), &[]).unwrap_err();
        assert!(err.to_string().contains("listen_on"), "{err}");
        assert!(Config::load_with_env(Some(&dir.path().join("none.toml")), &[]).is_err());
    }

    #[test]
    fn example_configs_parse() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("config");
        let local = Config::load_with_env(Some(&dir.join("local.toml")), &[]).unwrap();
        assert_eq!(local.provider.kind, ProviderKind::Local);
        assert_eq!(local.server.listen, Config::default().server.listen);
        let cloud = Config::load_with_env(Some(&dir.join("e2b-cloud.toml")), &[]).unwrap();
        assert_eq!(cloud.provider.kind, ProviderKind::E2b);
        assert_eq!(cloud.provider.deployment, "prod");
    }

    #[test]
    fn oauth_from_file_and_env() {
        let c = load(
            "[auth.oauth]\nissuer = \"https://idp.example.com\"\naudience = \"https://mcp.example.com/mcp\"\n",
            &[
                ("SANDBOX_MCP_AUTH__OAUTH__REQUIRED_SCOPES", "[\"sandbox\"]"),
                ("SANDBOX_MCP_AUTH__OAUTH__TENANT_CLAIM", "org"),
            ],
        )
        .unwrap();
        assert!(c.has_auth());
        assert_eq!(c.auth.oauth.required_scopes, vec!["sandbox"]);
        assert_eq!(c.auth.oauth.tenant_claim, "org");
        let err = Config::load_with_env(None, &env(&[("SANDBOX_MCP_AUTH__OAUTH__ISSUER", "https://idp.example.com")]))
            .unwrap_err();
        assert!(err.to_string().contains("auth.oauth.audience"), "{err}");
    }
}
