//! `sandbox-mcp healthcheck`: a probe for container HEALTHCHECKs in images
//! that carry no curl: GET a URL on the local gateway, succeed on 2xx.

use std::time::Duration;

use anyhow::{Context, bail};

/// Arguments of `sandbox-mcp healthcheck`.
#[derive(Debug, Clone, clap::Args)]
pub struct HealthcheckArgs {
    /// URL to probe.
    #[arg(long, env = "SANDBOX_MCP_HEALTHCHECK_URL", default_value = "http://127.0.0.1:8080/healthz")]
    pub url: url::Url,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 3)]
    pub timeout_secs: u64,
}

/// Probes the URL once.
pub fn run(args: HealthcheckArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(async {
        let client = reqwest::Client::builder().timeout(Duration::from_secs(args.timeout_secs)).build()?;
        let response = client.get(args.url.clone()).send().await.with_context(|| format!("GET {}", args.url))?;
        if !response.status().is_success() {
            bail!("GET {} answered {}", args.url, response.status());
        }
        Ok(())
    })
}
