//! Reconnectable tasks outlive their MCP session and their gateway process:
//! start, end the session (DELETE) or SIGKILL the gateway, then read the
//! whole output and the exit code from a fresh session. Also: session end
//! kills owned sandboxes without tasks and keeps those with started tasks.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

use crate::{common, tasks_support};
use std::time::Duration;

use common::{eventually, require_root};
use serde_json::{Value, json};
use tasks_support::{Env, Mcp, sandbox_alive};

/// 200 numbered lines on stdout, 3 on stderr, then exit 7 after a short sleep.
const COMMAND: &str =
    "for i in $(seq 1 200); do echo \"line $i\"; done; echo e1 >&2; echo e2 >&2; echo e3 >&2; sleep 2; exit 7";

fn expected_stdout() -> String {
    (1..=200).map(|i| format!("line {i}\n")).collect()
}

async fn check_finished(mcp: &Mcp, sandbox_id: &str, task_id: &str) {
    let done = mcp.wait_done(sandbox_id, task_id, Duration::from_secs(60)).await;
    assert_eq!(done["state"], "failed", "{done}");
    assert_eq!(done["exit_code"], 7);
    assert!(done["finished_at"].as_f64().unwrap() >= done["started_at"].as_f64().unwrap());
    let (stdout, last) = mcp.read_stream(sandbox_id, task_id, "stdout", 333).await;
    assert_eq!(stdout, expected_stdout());
    assert_eq!(last["stdout_size"].as_u64().unwrap(), stdout.len() as u64);
    assert_eq!(last["stdout_truncated"], false);
    let (stderr, _) = mcp.read_stream(sandbox_id, task_id, "stderr", 4).await;
    assert_eq!(stderr, "e1\ne2\ne3\n");
    // Replay returns the same page.
    let a = mcp.get_task(sandbox_id, task_id, json!({"stdout_offset": 10, "limit": 100})).await;
    let b = mcp.get_task(sandbox_id, task_id, json!({"stdout_offset": 10, "limit": 100})).await;
    assert_eq!(a["stdout"], b["stdout"]);
    assert_eq!(a["stdout"].as_str().unwrap(), &expected_stdout()[10..110]);
}

async fn start(mcp: &Mcp, sandbox_id: &str) -> String {
    let started = mcp.start_task(sandbox_id, COMMAND, json!({})).await;
    assert_eq!(started["sandbox_id"], sandbox_id);
    assert!(matches!(started["state"].as_str(), Some("running" | "failed")), "{started}");
    let task_id = started["task_id"].as_str().unwrap().to_string();
    assert_eq!(task_id.len(), 32);
    task_id
}

#[tokio::test(flavor = "multi_thread")]
async fn task_outlives_its_session_and_retention_decides_cleanup() {
    require_root!();
    let (_env, serve, mcp) = Env::local("").await;
    let with_task = mcp.create_sandbox().await;
    let without_task = mcp.create_sandbox().await;
    let task_id = start(&mcp, &with_task).await;
    // The default sandbox is `without_task` (created last); list_tasks there is empty.
    let listed = mcp.call("list_tasks", json!({})).await.ok();
    assert_eq!(listed["sandbox_id"], without_task.as_str());
    assert_eq!(listed["tasks"], json!([]));
    mcp.close().await; // DELETE

    // The owned sandbox without a task is killed; the one with a task is kept.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while sandbox_alive(&serve.mcp_url(), &without_task).await {
        assert!(std::time::Instant::now() < deadline, "owned sandbox without tasks survived its session");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(sandbox_alive(&serve.mcp_url(), &with_task).await);

    let fresh = Mcp::connect(&serve.mcp_url()).await;
    let listed = fresh.call("list_tasks", json!({"sandbox_id": with_task})).await.ok();
    assert_eq!(listed["tasks"][0]["task_id"], task_id.as_str());
    assert!(listed["tasks"][0]["command_first_line"].as_str().unwrap().starts_with("for i in"));
    check_finished(&fresh, &with_task, &task_id).await;
    // get/list never make the sandbox owned: closing this session keeps it. Its end is logged
    // (the only session that looked at `with_task` and owned nothing), then the sandbox must be there.
    fresh.close().await;
    let ended =
        |log: String| log.lines().any(|l| l.contains("session ended; nothing to kill") && l.contains(&with_task));
    let logged = eventually(Duration::from_secs(10), || async { ended(serve.log_text()) }).await;
    assert!(logged, "the inspecting session's end was not logged:\n{}", serve.log_text());
    assert!(sandbox_alive(&serve.mcp_url(), &with_task).await, "closing a session that only looked killed the sandbox");
    let last = Mcp::connect(&serve.mcp_url()).await;
    last.call("kill_sandbox", json!({"sandbox_id": with_task})).await.ok();
    last.close().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn task_survives_gateway_sigkill_with_external_provider() {
    task_survives_gateway_sigkill(true).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn task_survives_gateway_sigkill_with_embedded_provider() {
    task_survives_gateway_sigkill(false).await;
}

/// Start a task, SIGKILL the gateway, restart it with the same config: a new
/// session lists the task and reads all its output and its exit code. With
/// the embedded provider, the restarted gateway's provider re-adopts the
/// sandbox from its state directory.
async fn task_survives_gateway_sigkill(external_provider: bool) {
    require_root!();
    let env = Env::new();
    let provider = external_provider.then(|| env.provider());
    let config = env.write_config(provider.as_ref().map(|p| p.url()).as_deref(), "");
    let mut serve = env.serve(&config);
    let mcp = Mcp::connect(&serve.mcp_url()).await;
    let sandbox_id = mcp.create_sandbox().await;
    let task_id = start(&mcp, &sandbox_id).await;
    serve.kill9();
    drop(mcp);

    let serve = env.serve(&config);
    let fresh = Mcp::connect(&serve.mcp_url()).await;
    let v: Value = fresh.call("list_tasks", json!({"sandbox_id": sandbox_id})).await.ok();
    assert_eq!(v["tasks"][0]["task_id"], task_id.as_str(), "{v}");
    check_finished(&fresh, &sandbox_id, &task_id).await;
    fresh.call("kill_sandbox", json!({"sandbox_id": sandbox_id})).await.ok();
    fresh.close().await;
}

async fn summary(mcp: &Mcp, sandbox_id: &str) -> Value {
    let v = mcp.call("list_sandboxes", json!({})).await.ok();
    v["sandboxes"].as_array().unwrap().iter().find(|s| s["sandbox_id"] == sandbox_id).cloned().unwrap_or(Value::Null)
}

#[tokio::test(flavor = "multi_thread")]
async fn task_tools_retain_but_never_extend_or_own() {
    require_root!();
    let (_env, serve, mcp) = Env::local("").await;
    // A 300 s timeout, under the 600 s that renewal on use asks for: the first renewal of a new
    // sandbox is not throttled, so one by a task tool would show at once (checked below).
    let created = mcp.call("create_sandbox", json!({"timeout": 300})).await.ok();
    let sandbox_id = created["sandbox_id"].as_str().unwrap().to_string();
    let before = summary(&mcp, &sandbox_id).await;
    let task_id = start(&mcp, &sandbox_id).await;
    mcp.get_task(&sandbox_id, &task_id, json!({"wait_seconds": 1})).await;
    mcp.call("list_tasks", json!({"sandbox_id": sandbox_id})).await.ok();
    mcp.call("cancel_task", json!({"sandbox_id": sandbox_id, "task_id": task_id})).await.ok();
    let after = summary(&mcp, &sandbox_id).await;
    assert_eq!(before["end_at"], after["end_at"], "a task tool changed the sandbox deadline");
    let roles = after["session_roles"].to_string();
    assert!(roles.contains("retained") && roles.contains("owned"), "{after}");

    // Another session that only inspects the task neither owns nor retains the sandbox.
    let other = Mcp::connect(&serve.mcp_url()).await;
    other.get_task(&sandbox_id, &task_id, json!({})).await;
    other.call("list_tasks", json!({"sandbox_id": sandbox_id})).await.ok();
    let seen = summary(&other, &sandbox_id).await;
    let roles = seen["session_roles"].to_string();
    assert!(!roles.contains("owned") && !roles.contains("retained"), "{seen}");
    assert_eq!(seen["end_at"], before["end_at"]);
    // The check can fail: an ordinary tool (run_command) does renew the deadline, as a task tool would have.
    mcp.call("run_command", json!({"sandbox_id": sandbox_id, "command": "true"})).await.ok();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while summary(&mcp, &sandbox_id).await["end_at"] == before["end_at"] {
        assert!(std::time::Instant::now() < deadline, "run_command did not renew; the deadline check is blind");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    other.close().await;
    mcp.call("kill_sandbox", json!({"sandbox_id": sandbox_id})).await.ok();
    mcp.close().await;
}
