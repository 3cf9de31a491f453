//! `sandbox-mcp-envd`: the in-sandbox agent alone, started by the local provider as
//! `sandbox-mcp-envd envd --agent-tag TAG --sandbox-dir-fd FD ...` (the same arguments as
//! `sandbox-mcp envd`).
//! Linked with nothing of the gateway, so each sandbox's agent maps a fraction of the full
//! binary (see `local::control::agent_binary`).

#![deny(unsafe_code)]

use std::process::ExitCode;

fn main() -> ExitCode {
    let mut args = std::env::args_os().skip(1);
    let result = match args.next() {
        Some(first) if first == "--build-id" => {
            println!("{}", sandbox_mcp::local::control::agent_binary::BUILD_ID);
            return ExitCode::SUCCESS;
        }
        Some(first) if first == "envd" => sandbox_mcp::local::run_envd_from_args(args),
        _ => Err(anyhow::anyhow!(
            "internal program: the local provider starts it as `sandbox-mcp-envd envd --sandbox-dir-fd FD`; \
             run `sandbox-mcp` instead"
        )),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("sandbox-mcp-envd: {err:#}");
            ExitCode::FAILURE
        }
    }
}
