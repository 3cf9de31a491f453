//! The MCP gateway: axum app, auth, sessions and MCP tools.

/// Arguments of `sandbox-mcp serve`.
#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// TOML config file.
    #[arg(long)]
    pub config: Option<std::path::PathBuf>,
    /// Address to listen on (overrides the config).
    #[arg(long)]
    pub listen: Option<std::net::SocketAddr>,
}

/// Runs the gateway until SIGINT/SIGTERM.
pub fn run_serve(_args: ServeArgs) -> anyhow::Result<()> {
    anyhow::bail!("the gateway is not implemented yet")
}
