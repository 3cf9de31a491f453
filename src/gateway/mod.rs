//! The MCP gateway (`sandbox-mcp serve`): axum app, bearer auth, MCP
//! sessions, and the MCP tools. One folder per concern, lowest first (a
//! folder imports only the ones above it in this list):
//!
//! - `oauth/`, `provider.rs`: the OAuth 2.1 resource server; choosing and
//!   starting the provider;
//! - `sessions/`: legacy MCP sessions (the registry, its Redis store and SSE
//!   event log);
//! - `http/`: what `/mcp` does at the HTTP level before MCP: bearer auth,
//!   per-tenant limits, body checks, refusals as JSON-RPC, quick JSON
//!   answers, graceful drain, metrics, the protocol generation of a request;
//! - `state/`: what every session shares ([`GatewayCore`]), the handler type
//!   ([`Gateway`]) and the work on that state outside a tool call (deadline
//!   renewal, session-end clean-up, Redis-shared sessions, the MCP task-id
//!   key);
//! - `tools/`: the MCP tools, one file per family, and what a call needs
//!   (caller, quota, errors, sandbox resolution, argument limits);
//! - `mcp/`: the MCP surface: the `ServerHandler`, the two protocol
//!   generations, MCP Tasks and their ids;
//! - `server.rs`: the app (routes, middleware order, listeners, shutdown);
//!   `tool_tests/` drives that app against a scripted provider.

pub mod http;
pub mod mcp;
pub mod oauth;
pub mod provider;
pub mod server;
pub mod sessions;
pub mod state;
pub mod tools;

#[cfg(test)]
mod tool_tests;

pub use sessions::{SessionRegistry, SessionState};
pub use state::{Gateway, GatewayCore};
pub use tools::error::ToolError;

/// Arguments of `sandbox-mcp serve`.
#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// TOML config file (see config/local.toml). Every key can also be set with
    /// SANDBOX_MCP_<SECTION>__<KEY> environment variables.
    #[arg(long)]
    pub config: Option<std::path::PathBuf>,
    /// Address to listen on (overrides the config).
    #[arg(long)]
    pub listen: Option<std::net::SocketAddr>,
    /// Allow listening on a non-loopback address without any auth configured.
    #[arg(long)]
    pub insecure_no_auth: bool,
}

/// Runs the gateway until SIGINT/SIGTERM.
pub fn run_serve(args: ServeArgs) -> anyhow::Result<()> {
    let mut config = crate::config::Config::load(args.config.as_deref())?;
    if let Some(listen) = args.listen {
        config.server.listen = listen;
    }
    if args.insecure_no_auth {
        config.server.insecure_no_auth = true;
    }
    crate::logging::init(config.server.log_format);
    server::check_auth_policy(&config)?;
    let runtime = gateway_runtime(config.server.worker_threads)?;
    runtime.block_on(server::serve(config))
}

/// The gateway's runtime: `worker_threads` workers (0 = one per CPU core).
///
/// One by default. A tool call is a chain of small tasks (the connection, rmcp's session worker and
/// request task, the provider client's connection); on one worker each wakes the next in place, where
/// with several, every spawn also wakes an idle worker that steals work and bounces the call between
/// CPUs. `bench_gateway` measured that hop at about a fifth of the gateway's CPU per call and more of
/// its latency on a loaded machine. A gateway needing more than a core for MCP alone sets more (or runs
/// more replicas); the embedded provider has a runtime of its own either way.
fn gateway_runtime(worker_threads: usize) -> anyhow::Result<tokio::runtime::Runtime> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if worker_threads > 0 {
        builder.worker_threads(worker_threads);
    }
    builder.enable_all().build().map_err(|e| anyhow::anyhow!("cannot start the async runtime: {e}"))
}
