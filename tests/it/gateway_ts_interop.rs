//! Interop with the official TypeScript MCP client (`@modelcontextprotocol/client`) and its
//! Tasks extension package (`@modelcontextprotocol/ext-tasks`), installed pinned by
//! scripts/test.sh into `$SANDBOX_MCP_TS_CLIENT_DIR`, run on `$SANDBOX_MCP_NODE_BIN`'s Node 24:
//! tests/interop/ts_client.mjs against a real `serve` with a bearer token.
//! 2026-07-28 (client pinned to it): create -> run -> task-augmented run_command polled with
//! `tasks/get` until terminal -> `tasks/cancel` of a second (start_task) task -> kill. Legacy
//! session: create -> run -> start_task / get_task / cancel_task -> kill. The SDK must print no
//! warning (AJV schema warnings included). Skipped loudly when either variable is unset.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

use crate::common;
use common::*;
use serde_json::Value;

fn run_client(mode: &str) -> Option<Value> {
    let node_bin = require_env!("SANDBOX_MCP_NODE_BIN", "the Node 24 bin dir", None);
    let client_dir = require_env!("SANDBOX_MCP_TS_CLIENT_DIR", "the pinned TypeScript client install", None);
    require_root!(None);
    let token = "ts-interop-token-0123456789";
    let gateway = gateway_with_token("ts", token);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/interop/ts_client.mjs");
    let mut node = std::process::Command::new(std::path::Path::new(&node_bin).join("node"));
    let (stdout, _) =
        run_checked(node.arg(script).arg(gateway.mcp_url()).arg(token).arg(&client_dir).arg(mode), Some(&gateway));
    let seen: Value = serde_json::from_str(stdout.lines().last().unwrap_or_default()).expect("summary line");
    println!("{seen}");
    assert_eq!(seen["tools"], TOOLS.len(), "{seen}");
    assert_eq!(seen["stdout"], "ts\n", "{seen}");
    assert_eq!(seen["exit_code"], 0, "{seen}");
    assert_eq!(seen["cancelled_state"], "cancelled", "{seen}");
    assert_eq!(seen["killed"], true, "{seen}");
    assert_eq!(seen["warnings"], serde_json::json!([]), "the SDK printed warnings: {seen}");
    Some(seen)
}

#[test]
fn typescript_client_2026_07_28_with_mcp_tasks() {
    let Some(seen) = run_client("2026-07-28") else { return };
    assert_eq!(seen["era"], "modern", "the client negotiated 2026-07-28: {seen}");
    assert_eq!(seen["owned"], false, "a sessionless sandbox is not owned: {seen}");
    assert_eq!(seen["task_execution"], true, "ext-tasks sees the server's tasks extension: {seen}");
    assert_eq!(seen["task_cancellation"], true, "{seen}");
    // The task-augmented run_command: a real task, polled with tasks/get until completed.
    assert_eq!(seen["task_kind"], "task", "run_command came back as an MCP task: {seen}");
    assert_eq!(seen["task_id_given"], true, "{seen}");
    assert!(seen["task_gets"].as_u64().is_some_and(|n| n >= 1), "tasks/get was polled: {seen}");
    assert_eq!(seen["task_outcome"], "completed", "{seen}");
    assert_eq!(seen["task_stdout"], "task\n", "{seen}");
    assert_eq!(seen["task_exit_code"], 2, "a nonzero exit is data: {seen}");
    // The second task, cancelled with tasks/cancel.
    assert_eq!(seen["second_kind"], "task", "{seen}");
    assert_eq!(seen["cancel_sent"], 1, "one tasks/cancel: {seen}");
    assert_eq!(seen["cancelled_outcome"], "cancelled", "{seen}");
}

#[test]
fn typescript_client_legacy_session() {
    let Some(seen) = run_client("legacy") else { return };
    assert_eq!(seen["era"], "legacy", "{seen}");
    assert_eq!(seen["owned"], true, "a session's sandbox is owned: {seen}");
    assert_eq!(seen["task_state"], "running", "{seen}");
}
