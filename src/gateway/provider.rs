//! Connects the gateway to its sandbox provider: E2B (cloud, self-hosted, or
//! a separate `sandbox-mcp provider`) or the embedded local provider, which
//! `serve` starts on a private 127.0.0.1 port with a random per-process API
//! key, on an async runtime of its own, and then talks to over HTTP exactly as
//! to E2B.

use std::time::Duration;

use anyhow::Context;
use rand::Rng;

use crate::config::{Config, ProviderKind};
use crate::e2b::{E2bClient, ProviderEndpoint};
use crate::local::{LocalProviderConfig, RunningProvider};

/// The provider client, the API key (to mask it), and the embedded provider if we started one.
pub struct ProviderConnection {
    pub client: E2bClient,
    pub api_key: Option<String>,
    pub embedded: Option<EmbeddedProvider>,
}

/// The embedded local provider and the runtime it runs on: its own, one worker per CPU core, so
/// sandbox work (spawns, mounts, file RPCs, egress relays) and MCP requests on the gateway's runtime
/// (`server.worker_threads`) never wait for each other's threads.
pub struct EmbeddedProvider {
    running: RunningProvider,
    runtime: OwnRuntime,
}

impl EmbeddedProvider {
    /// Starts the provider on a new runtime, listening on a free loopback port.
    async fn start(config: LocalProviderConfig) -> anyhow::Result<Self> {
        let runtime = OwnRuntime::new()?;
        let running = runtime
            .handle()
            .spawn(async move {
                // Bound inside the provider's runtime, so the listener's I/O is driven there.
                let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
                    .await
                    .context("binding a loopback port for the embedded provider")?;
                crate::local::start_provider(config, listener).await
            })
            .await
            .context("the embedded provider's start-up task failed")??;
        Ok(Self { running, runtime })
    }

    /// The address the provider listens on.
    pub fn addr(&self) -> std::net::SocketAddr {
        self.running.addr
    }

    /// Worker threads of the provider's runtime.
    pub fn workers(&self) -> usize {
        self.runtime.handle().metrics().num_workers()
    }

    /// Stops the provider (see [`RunningProvider::shutdown`]) on its runtime; the runtime winds down
    /// when `self` is dropped.
    pub async fn shutdown(self) {
        let _ = self.runtime.handle().spawn(self.running.shutdown()).await;
    }
}

/// A runtime owned from inside another one: dropping it lets its threads wind down in the background
/// (a plain `Runtime` dropped inside a runtime would block, which panics), on start-up errors too.
struct OwnRuntime {
    runtime: Option<tokio::runtime::Runtime>,
    handle: tokio::runtime::Handle,
}

impl OwnRuntime {
    fn new() -> anyhow::Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .thread_name("local-provider")
            .enable_all()
            .build()
            .context("starting the embedded provider's async runtime")?;
        Ok(Self { handle: runtime.handle().clone(), runtime: Some(runtime) })
    }

    fn handle(&self) -> &tokio::runtime::Handle {
        &self.handle
    }
}

impl Drop for OwnRuntime {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// The embedded provider's configuration: what `sandbox-mcp provider --config` makes of the same
/// file (see `Config::local_provider`), with the gateway's API key. The provider's
/// default sandbox timeout is left alone: every create from the gateway carries one.
pub fn embedded_provider_config(config: &Config, api_key: String) -> anyhow::Result<LocalProviderConfig> {
    let mut provider_config = config.local_provider()?;
    provider_config.api_key = Some(api_key);
    Ok(provider_config)
}

/// Builds the provider client; starts the embedded provider for `kind = "local"`.
pub async fn connect(config: &Config) -> anyhow::Result<ProviderConnection> {
    let timeout = Duration::from_secs(config.provider.request_timeout_secs);
    match config.provider.kind {
        ProviderKind::E2b => {
            let api_key = std::env::var(&config.provider.api_key_env).ok().filter(|k| !k.is_empty());
            if api_key.is_none() {
                tracing::warn!(env = %config.provider.api_key_env, "no provider API key in the environment; requests go unauthenticated");
            }
            let api_url = url::Url::parse(&config.provider.api_url).context("provider.api_url")?;
            let sandbox_url = match config.provider.sandbox_url.as_str() {
                "" => None,
                url => Some(url::Url::parse(url).context("provider.sandbox_url")?),
            };
            let endpoint = ProviderEndpoint {
                api_url,
                sandbox_url,
                domain: config.provider.domain.clone(),
                api_key: api_key.clone(),
                request_timeout: timeout,
            };
            let client = E2bClient::new(endpoint).context("building the provider client")?;
            Ok(ProviderConnection { client, api_key, embedded: None })
        }
        ProviderKind::Local => {
            let mut key_bytes = [0u8; 24];
            rand::rng().fill_bytes(&mut key_bytes);
            let api_key = format!("local_{}", hex::encode(key_bytes));
            let provider_config = embedded_provider_config(config, api_key.clone())?;
            let embedded = EmbeddedProvider::start(provider_config)
                .await
                .context("starting the embedded local provider (provider.kind = \"local\")")?;
            let addr = embedded.addr();
            let origin = url::Url::parse(&format!("http://{addr}")).context("embedded provider URL")?;
            tracing::info!(%addr, workers = embedded.workers(), "embedded local provider started (own runtime)");
            let endpoint = ProviderEndpoint {
                api_url: origin.clone(),
                sandbox_url: Some(origin),
                domain: "localhost".into(),
                api_key: Some(api_key.clone()),
                request_timeout: timeout,
            };
            let client = E2bClient::new(endpoint).context("building the provider client")?;
            Ok(ProviderConnection { client, api_key: Some(api_key), embedded: Some(embedded) })
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    /// `sandbox-mcp provider`'s arguments alone.
    #[derive(Parser)]
    struct ProviderCli {
        #[command(flatten)]
        args: crate::local::ProviderArgs,
    }

    fn provider_args(argv: &[&str]) -> crate::local::ProviderArgs {
        ProviderCli::try_parse_from(std::iter::once("provider").chain(argv.iter().copied())).unwrap().args
    }

    /// What `sandbox-mcp provider ARGV` runs with, given the loaded `config` (its file and environment).
    fn standalone(argv: &[&str], config: Config) -> LocalProviderConfig {
        let argv: Vec<&str> = ["--api-key", "key"].iter().chain(argv).copied().collect();
        provider_args(&argv).provider_config_from(config).unwrap()
    }

    /// What `serve` gives its embedded provider with `config`.
    fn embedded(config: &Config) -> LocalProviderConfig {
        embedded_provider_config(config, "key".into()).unwrap()
    }

    /// A sample configuration changing every key that reaches the provider.
    const SAMPLE: &str = r#"
[server]
max_connections = 50
header_read_timeout_secs = 3
idle_timeout_secs = 7

[sandbox]
max_timeout_secs = 7200

[local]
state_dir = "/var/tmp/sandbox-mcp-sample"
max_sandboxes = 7
memory_limit_mb = 0
pids_limit = 64
dns_servers = ["192.0.2.53"]
open_host_addresses = ["192.0.2.1"]
domain = "sbx.example.com"
id_range = "2000000000:65536"
disk_limit_mb = 0
template_store_limit_mb = 123
template_ready_timeout_secs = 9

[local.templates]
debian = "/srv/rootfs/debian"
"#;

    /// The flags that say what [`SAMPLE`] says.
    const SAMPLE_FLAGS: &[&str] = &[
        "--max-timeout",
        "7200",
        "--max-connections",
        "50",
        "--header-read-timeout",
        "3",
        "--idle-timeout",
        "7",
        "--state-dir",
        "/var/tmp/sandbox-mcp-sample",
        "--max-sandboxes",
        "7",
        "--memory-limit-mb",
        "0",
        "--pids-limit",
        "64",
        "--dns-server",
        "192.0.2.53",
        "--open-host-address",
        "192.0.2.1",
        "--domain",
        "sbx.example.com",
        "--id-range",
        "2000000000:65536",
        "--disk-limit-mb",
        "0",
        "--template-store-limit-mb",
        "123",
        "--template-ready-timeout-secs",
        "9",
        "--template",
        "debian=/srv/rootfs/debian",
    ];

    fn sample_file() -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sample.toml");
        std::fs::write(&path, SAMPLE).unwrap();
        (dir, path)
    }

    #[test]
    fn both_entry_points_make_the_same_provider_from_the_defaults() {
        let serve = embedded(&Config::default());
        assert_eq!(serve, standalone(&[], Config::default()));
        assert_eq!(serve.api_key.as_deref(), Some("key"));
        assert_eq!(
            (serve.memory_limit_mb, serve.pids_limit, serve.disk_limit_mb),
            (Some(2048), Some(1024), Some(10240))
        );
        assert_eq!((serve.max_sandboxes, serve.template_store_limit_mb), (100, 51200));
        assert_eq!(serve.template_ready_timeout_secs, 60);
        assert_eq!((serve.default_timeout_secs, serve.max_timeout_secs), (300, 86_400));
        assert_eq!(serve.id_map, crate::local::isolation::userns::IdMap::default());
        assert_eq!(serve.listen_limits, crate::listen::ListenLimits::default());
        assert_eq!(serve.state_dir, crate::local::control::provider_config::default_state_dir());
    }

    #[test]
    fn both_entry_points_make_the_same_provider_from_one_file_and_its_flags() {
        let (_dir, path) = sample_file();
        let config = Config::load_with_env(Some(&path), &[]).unwrap();
        let serve = embedded(&config);
        // `sandbox-mcp provider --config FILE`, through the same loading as `serve`.
        let mut from_file =
            provider_args(&["--api-key", "key", "--config", path.to_str().unwrap()]).provider_config().unwrap();
        assert_eq!(serve, from_file);
        // The same settings as flags, without a file.
        assert_eq!(serve, standalone(SAMPLE_FLAGS, Config::default()), "{SAMPLE_FLAGS:?}");
        // What the file says reaches the embedded provider, 0 meaning no limit.
        assert_eq!((serve.template_store_limit_mb, serve.template_ready_timeout_secs), (123, 9));
        assert_eq!((serve.memory_limit_mb, serve.pids_limit, serve.disk_limit_mb), (None, Some(64), None));
        assert_eq!((serve.max_sandboxes, serve.max_timeout_secs), (7, 7200));
        assert_eq!(serve.state_dir, std::path::Path::new("/var/tmp/sandbox-mcp-sample"));
        assert_eq!(
            serve.templates.get("debian").map(|p| p.as_path()),
            Some(std::path::Path::new("/srv/rootfs/debian"))
        );
        assert_eq!(serve.network.dns_servers, vec![std::net::IpAddr::from([192, 0, 2, 53])]);
        assert_eq!(serve.network.open_host_addresses, vec![std::net::IpAddr::from([192, 0, 2, 1])]);
        assert_eq!(serve.network.domain.as_deref(), Some("sbx.example.com"));
        assert_eq!(serve.id_map.host_base, 2_000_000_000);
        assert_eq!(serve.listen_limits.max_connections, 50);
        assert_eq!(serve.listen_limits.idle_timeout, Duration::from_secs(7));
        // Flags override the file key by key; the others stay as the file says.
        let overridden =
            standalone(&["--pids-limit", "0", "--memory-limit-mb", "512", "--template", "alpine=/srv/a"], config);
        from_file.pids_limit = None;
        from_file.memory_limit_mb = Some(512);
        from_file.templates.insert("alpine".into(), "/srv/a".into());
        assert_eq!(overridden, from_file);
    }

    #[test]
    fn a_bad_id_range_is_refused_by_both_entry_points() {
        let mut config = Config::default();
        config.local.id_range = "0:1".into();
        let message = embedded_provider_config(&config, "key".into()).unwrap_err().to_string();
        assert!(message.contains("local.id_range must be START:COUNT"), "{message}");
        let err = ProviderCli::try_parse_from(["provider", "--id-range", "0:1"]).err().unwrap().to_string();
        assert!(err.contains("local.id_range must be START:COUNT"), "{err}");
    }
}
