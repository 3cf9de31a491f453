//! Interop with the official Python `mcp` SDK client (pinned in
//! tests/interop/requirements.txt): runs tests/interop/mcp_client_session.py
//! against a real `serve` with the embedded provider and with a bearer token.
//! Needs `$SANDBOX_MCP_PYTHON` (a python with `mcp` installed, e.g.
//! /work/venv-mcp/bin/python); skipped loudly when unset.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

use crate::common;
use common::*;

#[test]
fn python_sdk_client_session() {
    let python = require_env!("SANDBOX_MCP_PYTHON", "a python with mcp==1.30.0");
    require_root!();
    let token = "interop-token-0123456789";
    let gateway = gateway_with_token("interop", token);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/interop/mcp_client_session.py");
    let mut python = std::process::Command::new(python);
    let (stdout, _) = run_checked(python.arg(script).arg(gateway.mcp_url()).arg(token), Some(&gateway));
    println!("{stdout}");
    let summary = stdout.lines().last().unwrap_or_default();
    assert!(summary.ends_with(" passed, 0 failed") && !summary.starts_with("0 passed"), "{summary}");
}
