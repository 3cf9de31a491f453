//! Command-line entry point: `serve` (the MCP gateway), `provider` (the
//! embedded E2B-compatible local provider alone), `template` (its template
//! store) and `envd` (the in-sandbox
//! agent, internal).

#![deny(unsafe_code)]

use std::io::Write;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "sandbox-mcp", version, about = "Linux sandboxes for AI agents over MCP")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the MCP gateway (streamable HTTP on /mcp).
    Serve(sandbox_mcp::gateway::ServeArgs),
    /// Run the embedded E2B-compatible local provider alone.
    Provider(Box<sandbox_mcp::local::ProviderArgs>),
    /// Manage the local provider's template store (import, pull, list, rm, gc).
    Template(sandbox_mcp::local::store::cli::TemplateArgs),
    /// Probe a running gateway's /healthz (for container HEALTHCHECKs).
    Healthcheck(sandbox_mcp::healthcheck::HealthcheckArgs),
}

fn main() -> ExitCode {
    // `envd` (internal, started by the local provider; not a clap subcommand, so absent from --help)
    // runs once per sandbox: parse only its own arguments, so that its start touches (and keeps
    // resident) none of the code that builds the full command line of `serve` and `provider`.
    if std::env::args_os().nth(1).is_some_and(|arg| arg == "envd") {
        return report(sandbox_mcp::local::run_envd_from_args(std::env::args_os().skip(2)));
    }
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Serve(args) => sandbox_mcp::gateway::run_serve(args),
        Command::Provider(args) => sandbox_mcp::local::run_provider(*args),
        Command::Healthcheck(args) => sandbox_mcp::healthcheck::run(args),
        Command::Template(args) => sandbox_mcp::local::store::cli::run(args),
    };
    report(result)
}

fn report(result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            // Not `eprintln!`, which panics when stderr is a broken pipe.
            let _ = writeln!(std::io::stderr(), "sandbox-mcp: {err:#}");
            ExitCode::FAILURE
        }
    }
}
