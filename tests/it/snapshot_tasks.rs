//! Background tasks across a fork and a snapshot, through the gateway's tools (`serve` with its
//! embedded local provider): with a task in flight and a finished one in the parent, a fork and a
//! sandbox made from a snapshot read the in-flight task as `unknown` with the reason that it was
//! copied without its process (never `running`, never an exit code), keep the finished task's real
//! outcome, and a `cancel_task` there signals nothing; the parent's task runs on and finishes as
//! it would have. A paused sandbox's task resumes with it when `get_task` connects to it.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

use std::time::Duration;

use serde_json::{Value, json};

use crate::common::require_root;
use crate::tasks_support::{Env, Mcp};

const COPIED: &str = "copied from another sandbox";

/// Checks that `task` (a get_task or cancel_task answer) is a copied task's honest view.
#[track_caller]
fn assert_copied(task: &Value, what: &str) {
    assert_eq!(task["state"], "unknown", "{what}: {task}");
    assert!(task["exit_code"].is_null(), "{what}: no exit code may be made up: {task}");
    assert!(task["error"].as_str().unwrap_or("").contains(COPIED), "{what}: the reason: {task}");
}

#[tokio::test]
async fn a_task_in_flight_is_unknown_in_forks_and_snapshots_and_runs_on_in_its_parent() {
    require_root!();
    let (_env, serve, mcp) = Env::local("").await;
    let parent = mcp.create_sandbox().await;
    let done = mcp.start_task(&parent, "echo finished-before", json!({})).await;
    let done_id = done["task_id"].as_str().unwrap().to_owned();
    let finished = mcp.wait_done(&parent, &done_id, Duration::from_secs(30)).await;
    assert_eq!(
        (finished["state"].as_str(), finished["exit_code"].as_i64()),
        (Some("succeeded"), Some(0)),
        "{finished}"
    );
    let flight =
        mcp.start_task(&parent, "echo started; sleep 6; echo parent-finished > /home/user/flight.out", json!({})).await;
    let flight_id = flight["task_id"].as_str().unwrap().to_owned();
    let running = mcp.get_task(&parent, &flight_id, json!({})).await;
    assert_eq!(running["state"], "running", "{running}");

    // A fork while the task runs.
    let forked = mcp.call("fork_sandbox", json!({"sandbox_id": parent, "count": 1})).await.ok();
    let fork_id = forked["forks"][0]["sandbox_id"].as_str().unwrap_or_else(|| panic!("no fork in {forked}")).to_owned();
    assert_copied(&mcp.get_task(&fork_id, &flight_id, json!({})).await, "get_task in the fork");
    let listed = mcp.call("list_tasks", json!({"sandbox_id": fork_id})).await.ok();
    let entry = listed["tasks"].as_array().unwrap().iter().find(|t| t["task_id"] == flight_id.as_str()).cloned();
    let entry = entry.unwrap_or_else(|| panic!("the copied task is not listed: {listed}"));
    assert_eq!(entry["state"], "unknown", "list_tasks in the fork: {entry}");
    let cancelled = mcp.call("cancel_task", json!({"sandbox_id": fork_id, "task_id": flight_id})).await.ok();
    assert_copied(&cancelled, "cancel_task in the fork");
    let kept = mcp.get_task(&fork_id, &done_id, json!({})).await;
    assert_eq!((kept["state"].as_str(), kept["exit_code"].as_i64()), (Some("succeeded"), Some(0)), "{kept}");
    assert!(kept["stdout"].as_str().unwrap().contains("finished-before"), "{kept}");

    // A snapshot while the task still runs, and a sandbox from it.
    let snap = mcp.call("snapshot_sandbox", json!({"sandbox_id": parent})).await.ok();
    let snapshot_id = snap["snapshot_id"].as_str().unwrap_or_else(|| panic!("no snapshot_id in {snap}")).to_owned();
    let child = mcp.call("create_sandbox", json!({"template": snapshot_id})).await.ok();
    let child_id = child["sandbox_id"].as_str().unwrap().to_owned();
    assert_copied(&mcp.get_task(&child_id, &flight_id, json!({})).await, "get_task in the snapshot's sandbox");

    // The parent's task was untouched by all of it: it runs on, and finishes as it would have.
    let end = mcp.wait_done(&parent, &flight_id, Duration::from_secs(60)).await;
    assert_eq!((end["state"].as_str(), end["exit_code"].as_i64()), (Some("succeeded"), Some(0)), "{end}");
    let end = mcp.get_task(&parent, &flight_id, json!({})).await;
    assert!(end["stdout"].as_str().unwrap().contains("started"), "{end}");
    let out = mcp.call("read_file", json!({"sandbox_id": parent, "path": "/home/user/flight.out"})).await.ok();
    assert_eq!(out["content"], "parent-finished\n", "{out}");
    // ... and never in the copies, which still say unknown.
    assert_copied(&mcp.get_task(&fork_id, &flight_id, json!({})).await, "get_task in the fork, later");
    let absent = mcp.call("read_file", json!({"sandbox_id": fork_id, "path": "/home/user/flight.out"})).await;
    assert!(absent.is_error, "the parent's task wrote into the fork: {}", absent.text);

    mcp.call("delete_snapshot", json!({"snapshot_id": snapshot_id})).await.ok();
    mcp.close().await;
    drop(serve);
}

#[tokio::test]
async fn a_paused_sandboxs_task_resumes_with_it_when_get_task_connects() {
    require_root!();
    let env = Env::new();
    let provider = env.provider();
    let serve = env.serve(&env.write_config(Some(&provider.url()), ""));
    let mcp = Mcp::connect(&serve.mcp_url()).await;
    let sandbox = mcp.create_sandbox().await;
    let task = mcp.start_task(&sandbox, "for i in 1 2 3 4 5 6; do echo tick $i; sleep 0.5; done", json!({})).await;
    let task_id = task["task_id"].as_str().unwrap().to_owned();
    let client = provider.client();
    client.pause_sandbox(&sandbox).await.unwrap();
    let before = client.get_sandbox(&sandbox).await.unwrap();
    assert_eq!(before.state, sandbox_mcp::e2b::wire::SandboxState::Paused);
    tokio::time::sleep(Duration::from_secs(4)).await;
    // The same session, which had the sandbox's agent at hand: it is resumed, not lost.
    let same = mcp.get_task(&sandbox, &task_id, json!({})).await;
    assert_eq!(same["state"], "running", "{same}");
    client.pause_sandbox(&sandbox).await.unwrap();
    // A new session, as after a lost conversation: get_task resumes the sandbox through connect.
    let other = Mcp::connect(&serve.mcp_url()).await;
    let seen = other.get_task(&sandbox, &task_id, json!({})).await;
    assert_eq!(seen["state"], "running", "the task was frozen with its sandbox, not lost: {seen}");
    let after = client.get_sandbox(&sandbox).await.unwrap();
    assert_eq!(after.state, sandbox_mcp::e2b::wire::SandboxState::Running);
    // No longer a deadline than the resume's own (the provider's default lifetime, 600 s here).
    let end = chrono::DateTime::parse_from_rfc3339(&after.end_at).unwrap();
    let resume_gives = chrono::Utc::now() + chrono::Duration::seconds(605);
    assert!(end <= resume_gives, "get_task extended the deadline past a resume's: {end}");
    // The file and command tools of the same session resume it alike.
    client.pause_sandbox(&sandbox).await.unwrap();
    let ran = mcp.call("run_command", json!({"sandbox_id": sandbox, "command": "echo resumed"})).await.ok();
    assert_eq!(ran["stdout"], "resumed\n", "{ran}");
    client.pause_sandbox(&sandbox).await.unwrap();
    let listed = mcp.call("list_files", json!({"sandbox_id": sandbox, "path": "/home/user"})).await;
    assert!(!listed.is_error, "list_files on a paused sandbox: {}", listed.text);
    let end = other.wait_done(&sandbox, &task_id, Duration::from_secs(30)).await;
    assert_eq!(end["exit_code"], 0, "{end}");
    let end = other.get_task(&sandbox, &task_id, json!({})).await;
    assert!(end["stdout"].as_str().unwrap().contains("tick 6"), "{end}");
    other.close().await;
    mcp.close().await;
    drop(serve);
}
