//! Command-line entry point: `serve` (the MCP gateway), `provider` (the
//! embedded E2B-compatible local provider alone) and `envd` (the in-sandbox
//! agent, internal).

fn main() {
    eprintln!("sandbox-mcp: not yet wired");
    std::process::exit(2);
}
