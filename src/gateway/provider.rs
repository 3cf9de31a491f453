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
            let local = &config.local;
            let provider_config = LocalProviderConfig {
                state_dir: local.resolved_state_dir(),
                api_key: Some(api_key.clone()),
                max_sandboxes: local.max_sandboxes as usize,
                memory_limit_mb: (local.memory_limit_mb > 0).then_some(local.memory_limit_mb),
                pids_limit: (local.pids_limit > 0).then_some(local.pids_limit),
                default_timeout_secs: config.sandbox.default_timeout_secs,
                max_timeout_secs: config.sandbox.max_timeout_secs,
                network: local.network(),
                templates: local.templates.clone().into_iter().collect(),
                id_map: local.id_range.parse().map_err(anyhow::Error::msg)?,
                disk_limit_mb: (local.disk_limit_mb > 0).then_some(local.disk_limit_mb),
                listen_limits: config.server.listen_limits(),
                ..LocalProviderConfig::default()
            };
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
