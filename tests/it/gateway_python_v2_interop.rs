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

use crate::common;
use common::*;
use serde_json::Value;

/// Runs `tests/interop/SCRIPT URL TOKEN MODE` with the v2 python against a gateway of its own; its
/// summary line (None when the test is skipped) and its stderr.
fn run_script(script: &str, mode: &str) -> Option<(Value, String)> {
    let python = require_env!("SANDBOX_MCP_PYTHON_V2", "a python with mcp==2.3.0", None);
    require_root!(None);
    let token = "interop-v2-token-0123456789";
    let gateway = gateway_with_token("interop", token);
    let script = format!("{}/tests/interop/{script}", env!("CARGO_MANIFEST_DIR"));
    let mut python = std::process::Command::new(python);
    let (stdout, stderr) = run_checked(python.arg(script).arg(gateway.mcp_url()).arg(token).arg(mode), Some(&gateway));
    let seen: Value = serde_json::from_str(stdout.lines().last().unwrap_or_default()).expect("summary line");
    println!("{seen}");
    Some((seen, stderr))
}

fn run_client(mode: &str) {
    let Some((seen, stderr)) = run_script("mcp_v2_client.py", mode) else { return };
    assert!(!stderr.contains("Session termination failed"), "{stderr}");
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

/// Issue 25.2: the worst-case results (tests/interop/large_results_v2.py) through a client whose
/// transport refuses a message over 1 MiB: nothing fails, cuts carry the truncation flags and counts,
/// and paging reads every byte.
fn large_results(mode: &str) {
    let Some((seen, _)) = run_script("large_results_v2.py", mode) else { return };
    let mut runs = vec![&seen["run"]];
    if mode != "legacy" {
        runs.push(&seen["task_run"]);
        assert_eq!(seen["tasks_created"], 1, "run_command ran as an MCP task: {seen}");
    }
    for run in runs {
        assert_eq!(run["only_control"], true, "{seen}");
        assert_eq!((run["stdout_truncated"].as_bool(), run["stderr_truncated"].as_bool()), (Some(true), Some(true)));
        assert_eq!((run["stdout_bytes"].as_u64(), run["stderr_bytes"].as_u64()), (Some(65536), Some(65536)));
        let kept = run["stdout_len"].as_u64().unwrap() + run["stderr_len"].as_u64().unwrap();
        // 13 bytes a byte as sent: about 1 MiB / 13 of output fits, and no less than 90 % of it.
        assert!((70_000..=81_000).contains(&kept), "{kept} bytes kept: {seen}");
    }
    assert_eq!(seen["task_log"]["state"], "succeeded", "{seen}");
    assert_eq!(seen["task_log"]["stdout_ok"], true, "the task log paged to its end: {seen}");
    assert!(seen["task_log"]["pages"].as_u64().unwrap() >= 2, "{seen}");
    let read = &seen["read_file"];
    assert_eq!(read["size"], 5 * 1024 * 1024, "{seen}");
    assert_eq!(read["sha_ok"], true, "{seen}");
    assert!(read["pages"].as_u64().unwrap() >= 10, "{seen}");
    // About 1100 bytes an entry as sent: about 900 of the 3000 fit.
    let listed = &seen["list_files"];
    assert_eq!(listed["truncated"], true, "{seen}");
    assert!((700..3000).contains(&listed["entries"].as_u64().unwrap()), "{seen}");
}

#[test]
fn python_sdk_v2_legacy_large_results() {
    large_results("legacy");
}

#[test]
fn python_sdk_v2_stateless_large_results() {
    large_results("2026-07-28");
}
