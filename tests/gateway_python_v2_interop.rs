//! Interop with the official MCP Python SDK v2 (`mcp.Client`, pinned in
//! tests/interop/requirements-mcp2.txt) in 2026-07-28 mode and in legacy
//! (session) mode: runs tests/interop/mcp_v2_client.py against a real
//! `serve` (embedded provider, bearer token). create -> run ->
//! task-augmented run_command resolved through tasks/get -> tasks/cancel of
//! a task-augmented start_task -> kill. Needs `$SANDBOX_MCP_PYTHON_V2` (a
//! python with mcp 2.x; scripts/test.sh makes .venv-mcp2); skipped loudly
//! when unset. Also checks that closing the legacy session logs no
//! "Session termination failed" (DELETE answers 204).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

mod common;

use common::*;
use serde_json::Value;

fn run_client(mode: &str) {
    let python = require_env!("SANDBOX_MCP_PYTHON_V2", "a python with mcp==2.3.0");
    require_root!();
    let token = "interop-v2-token-0123456789";
    let gateway = gateway_with_token("interop", token);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/interop/mcp_v2_client.py");
    let mut python = std::process::Command::new(python);
    let (stdout, stderr) = run_checked(python.arg(script).arg(gateway.mcp_url()).arg(token).arg(mode), Some(&gateway));
    assert!(!stderr.contains("Session termination failed"), "{stderr}");
    let seen: Value = serde_json::from_str(stdout.lines().last().unwrap_or_default()).expect("summary line");
    println!("{seen}");
    assert_eq!(seen["run_stdout"], "hi\n", "{seen}");
    assert_eq!(seen["cancelled_state"], "cancelled", "{seen}");
    assert_eq!(seen["killed"], true, "{seen}");
    if mode == "legacy" {
        assert_eq!(seen["owned"], true, "{seen}");
    } else {
        assert_eq!(seen["owned"], false, "a sessionless sandbox is not owned: {seen}");
        assert_eq!(seen["task_stdout"], "task\n", "{seen}");
        assert_eq!(seen["task_exit_code"], 2, "{seen}");
        assert_eq!(seen["cancel_ack"], "complete", "{seen}");
    }
}

#[test]
fn python_sdk_v2_stateless_mode_with_tasks() {
    run_client("2026-07-28");
}

#[test]
fn python_sdk_v2_legacy_mode() {
    run_client("legacy");
}
