//! The embedded E2B-compatible local provider: control plane, per-sandbox
//! isolation, and the in-sandbox envd agent.

pub mod envd;

/// Arguments of `sandbox-mcp provider`.
#[derive(Debug, Clone, clap::Args)]
pub struct ProviderArgs {
    /// Address to listen on (control plane and envd data plane on one port).
    #[arg(long, default_value = "127.0.0.1:3000")]
    pub listen: std::net::SocketAddr,
}

/// Arguments of the internal `sandbox-mcp envd`.
#[derive(Debug, Clone, clap::Args)]
pub struct EnvdArgs {
    /// The sandbox's directory on the host (holds its spec and socket).
    #[arg(long)]
    pub sandbox_dir: std::path::PathBuf,
}

/// Runs the provider until SIGINT/SIGTERM.
pub fn run_provider(_args: ProviderArgs) -> anyhow::Result<()> {
    anyhow::bail!("the local provider is not implemented yet")
}

/// Runs the in-sandbox agent.
pub fn run_envd(_args: EnvdArgs) -> anyhow::Result<()> {
    anyhow::bail!("envd is not implemented yet")
}
