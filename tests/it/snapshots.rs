//! Snapshots and forks through the real `serve` binary backed by a real
//! `sandbox-mcp provider` (the E2B code path), with two tenants:
//! `snapshot_sandbox` then `create_sandbox` from the snapshot sees its files;
//! `fork_sandbox` makes owned, independent copies that `list_sandboxes` shows
//! with their parent and that end with the session (unless a task retains
//! one); the fork cap and the sandbox quota; and another tenant can neither
//! create from, list, nor delete the first tenant's snapshot, nor snapshot or
//! fork its sandbox, and is answered exactly as for things that do not exist.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

use crate::common;
use std::time::Duration;

use common::*;
use serde_json::{Value, json};

const ALICE: &str = "snapshots-alice-token-0123456789";
const BOB: &str = "snapshots-bob-token-0123456789";

/// A gateway of tenants alice and bob on `provider`, with `limits` as its `[limits]` section.
fn gateway(provider: &Provider, limits: &str) -> Gateway {
    let extra = format!("{}[limits]\n{limits}\n", tokens_config(&[("alice", ALICE), ("bob", BOB)]));
    Gateway::start_e2b(provider, &extra, &[])
}

/// The answer for a template that does not exist (or is not the caller's to see).
fn unknown_template(template: &str) -> String {
    format!(
        "template {template:?} not found: call list_templates to see the templates you can use (pass a template's \
         name, one of its aliases or its template_id), or omit template for the default"
    )
}

fn not_found(sandbox_id: &str) -> String {
    format!(
        "sandbox {sandbox_id} not found: it does not exist, has been killed or expired, or is not yours; call \
         list_sandboxes to see your sandboxes or create_sandbox for a new one"
    )
}

fn snapshot_not_found(snapshot: &str) -> String {
    format!(
        "snapshot {snapshot:?} not found: it does not exist, has been deleted, or is not yours; call list_snapshots \
         to see your snapshots"
    )
}

fn id_of(value: &Value) -> String {
    value["sandbox_id"].as_str().unwrap_or_else(|| panic!("no sandbox_id in {value}")).to_owned()
}

async fn read(client: &McpClient, sandbox_id: &str, path: &str) -> Result<String, String> {
    let result = call(client, "read_file", json!({"path": path, "sandbox_id": sandbox_id})).await;
    if result.is_error == Some(true) {
        return Err(text(&result));
    }
    Ok(result.structured_content.unwrap()["content"].as_str().unwrap().to_owned())
}

/// A sessionless (MCP 2026-07-28) `tools/call` of `tool` as `token`; the JSON-RPC result.
async fn sessionless(url: &str, token: &str, tool: &str, arguments: Value) -> Value {
    let meta = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientInfo": {"name": "snapshots-test", "version": "0"},
        "io.modelcontextprotocol/clientCapabilities": {},
    });
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": tool, "arguments": arguments, "_meta": meta}});
    let response = reqwest::Client::new()
        .post(url)
        .bearer_auth(token)
        .header("Accept", "application/json, text/event-stream")
        .header("MCP-Protocol-Version", "2026-07-28")
        .header("Mcp-Method", "tools/call")
        .header("Mcp-Name", tool)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert!(!response.headers().contains_key("mcp-session-id"), "a 2026-07-28 call opened a session");
    let answer: Value = response.json().await.unwrap();
    answer["result"].clone()
}

/// Whether the provider still lists the snapshot (by id).
async fn snapshot_listed(provider: &sandbox_mcp::e2b::E2bClient, snapshot_id: &str) -> bool {
    provider.list_all_snapshots(None, None).await.unwrap().iter().any(|s| s.snapshot_id == snapshot_id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_starts_sandboxes_with_its_files_and_is_its_tenants_alone() {
    require_root!();
    let provider = Provider::start();
    let gateway = gateway(&provider, "");
    let direct = provider.client();
    let alice = connect(&gateway.mcp_url(), Some(ALICE)).await;
    let bob = connect(&gateway.mcp_url(), Some(BOB)).await;

    let parent = id_of(&ok(&alice, "create_sandbox", json!({})).await);
    ok(&alice, "write_file", json!({"path": "/home/user/notes/a.txt", "content": "from the parent\n"})).await;
    ok(&alice, "write_file", json!({"path": "/root/r.txt", "content": "root's\n", "user": "root"})).await;
    ok(&alice, "write_file", json!({"path": "/tmp/scratch.txt", "content": "temporary\n"})).await;

    // Argument errors come before any provider call, with a sentence.
    for (args, expected) in [
        (json!({"name": ".hidden"}), "invalid name \".hidden\""),
        (json!({"name": "a b"}), "not starting with '.' or '-'"),
        (json!({"name": "x".repeat(47)}), "name must be 1-46 characters"),
        (json!({"name": "ok", "memory": true}), "unknown field"),
    ] {
        let message = err(&alice, "snapshot_sandbox", args.clone()).await;
        assert!(message.contains(expected), "{args}: {message}");
    }

    // A named snapshot of the default sandbox: the name carries the tenant's prefix.
    let snap = ok(&alice, "snapshot_sandbox", json!({"name": "after-setup"})).await;
    let snapshot_id = snap["snapshot_id"].as_str().unwrap().to_owned();
    let name = snap["name"].as_str().unwrap().to_owned();
    assert_eq!(snap["sandbox_id"], json!(parent));
    assert!(name.starts_with("smcp-") && name.ends_with("-after-setup") && name.len() == 18 + 11, "{snap}");
    assert!(snap["carries"].as_str().unwrap().contains("/tmp"), "{snap}");
    assert!(snapshot_listed(&direct, &snapshot_id).await, "the provider does not list {snapshot_id}");
    // The parent keeps running, unchanged.
    assert_eq!(read(&alice, &parent, "/home/user/notes/a.txt").await.unwrap(), "from the parent\n");

    // A sandbox created from it (by id, and by name) starts with its files; not with /tmp.
    for template in [&snapshot_id, &name] {
        let created = ok(&alice, "create_sandbox", json!({"template": template})).await;
        let child = id_of(&created);
        assert_eq!(created["owned"], json!(true));
        assert_eq!(read(&alice, &child, "/home/user/notes/a.txt").await.unwrap(), "from the parent\n");
        let root = call(&alice, "read_file", json!({"path": "/root/r.txt", "sandbox_id": child, "user": "root"})).await;
        assert_eq!(root.structured_content.unwrap()["content"], json!("root's\n"));
        let scratch = read(&alice, &child, "/tmp/scratch.txt").await.unwrap_err();
        assert!(scratch.contains("no such file"), "/tmp is not part of a snapshot: {scratch}");
        // Its files are its own: a write does not reach the parent.
        ok(&alice, "write_file", json!({"path": "/home/user/notes/a.txt", "content": "child\n", "sandbox_id": child}))
            .await;
        assert_eq!(read(&alice, &parent, "/home/user/notes/a.txt").await.unwrap(), "from the parent\n");
        ok(&alice, "kill_sandbox", json!({"sandbox_id": child})).await;
    }

    // A random name when none is given; list_snapshots shows alice's own, by id and name.
    let unnamed = ok(&alice, "snapshot_sandbox", json!({"sandbox_id": parent})).await;
    let unnamed_id = unnamed["snapshot_id"].as_str().unwrap().to_owned();
    let listed = ok(&alice, "list_snapshots", json!({})).await;
    let mut ids: Vec<&str> =
        listed["snapshots"].as_array().unwrap().iter().filter_map(|s| s["snapshot_id"].as_str()).collect();
    ids.sort();
    let mut expected = vec![snapshot_id.as_str(), unnamed_id.as_str()];
    expected.sort();
    assert_eq!(ids, expected, "{listed}");
    assert!(listed["snapshots"].as_array().unwrap().iter().any(|s| s["name"] == json!(name)), "{listed}");
    let of_parent = ok(&alice, "list_snapshots", json!({"sandbox_id": parent})).await;
    assert_eq!(of_parent["snapshots"].as_array().unwrap().len(), 2, "{of_parent}");

    // Alice's list_templates shows her snapshot, as one.
    let templates = ok(&alice, "list_templates", json!({})).await;
    let mine = templates["templates"].as_array().unwrap().iter().find(|t| t["name"] == json!(name));
    assert_eq!(mine.map(|t| t["kind"].clone()), Some(json!("snapshot")), "{templates}");

    // Bob: every spelling of alice's snapshot reads as an unknown template, and nothing is created.
    let before = direct.list_all_sandboxes(&[]).await.unwrap().len();
    for template in [&snapshot_id, &name] {
        assert_eq!(err(&bob, "create_sandbox", json!({"template": template})).await, unknown_template(template));
    }
    assert_eq!(direct.list_all_sandboxes(&[]).await.unwrap().len(), before, "bob's refused creates made sandboxes");
    assert_eq!(
        err(&bob, "create_sandbox", json!({"template": "no-such-template-xyz"})).await,
        unknown_template("no-such-template-xyz"),
        "an unknown template reads the same"
    );
    // Bob sees none of alice's snapshots, and cannot delete them.
    assert_eq!(ok(&bob, "list_snapshots", json!({})).await["snapshots"], json!([]));
    let bob_templates = ok(&bob, "list_templates", json!({})).await.to_string();
    assert!(!bob_templates.contains(&name) && !bob_templates.contains(&snapshot_id), "{bob_templates}");
    for reference in [&snapshot_id, &name] {
        assert_eq!(
            err(&bob, "delete_snapshot", json!({"snapshot_id": reference})).await,
            snapshot_not_found(reference)
        );
    }
    assert!(snapshot_listed(&direct, &snapshot_id).await, "bob's delete reached the provider");
    // Nor snapshot or fork alice's sandbox.
    assert_eq!(err(&bob, "snapshot_sandbox", json!({"sandbox_id": parent})).await, not_found(&parent));
    assert_eq!(err(&bob, "fork_sandbox", json!({"sandbox_id": parent})).await, not_found(&parent));

    // Alice deletes hers: gone at the provider, and then unknown to her too.
    let deleted = ok(&alice, "delete_snapshot", json!({"snapshot_id": snapshot_id})).await;
    assert_eq!(deleted["deleted"], json!(true));
    assert!(!snapshot_listed(&direct, &snapshot_id).await);
    assert_eq!(
        err(&alice, "delete_snapshot", json!({"snapshot_id": snapshot_id})).await,
        snapshot_not_found(&snapshot_id)
    );
    let message = err(&alice, "create_sandbox", json!({"template": snapshot_id})).await;
    assert_eq!(message, unknown_template(&snapshot_id));
    ok(&alice, "delete_snapshot", json!({"snapshot_id": unnamed_id})).await;

    close(alice).await;
    close(bob).await;
    assert!(wait_gone(&direct, &parent, Duration::from_secs(15)).await, "the owned parent survived the session");
    let log = gateway.log_text();
    assert!(log.lines().any(|l| l.contains("\"tool call\"") && l.contains("snapshot_sandbox")), "no log line");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forks_are_owned_independent_copies_that_show_their_parent() {
    require_root!();
    let provider = Provider::start();
    let gateway = gateway(&provider, "max_forks_per_call = 3\nmax_sandboxes_per_tenant = 6");
    let direct = provider.client();
    let alice = connect(&gateway.mcp_url(), Some(ALICE)).await;

    let parent = id_of(&ok(&alice, "create_sandbox", json!({"metadata": {"k": "v"}})).await);
    ok(&alice, "write_file", json!({"path": "/home/user/data.txt", "content": "parent\n"})).await;

    // Over the cap: a sentence naming the limit, before anything is made.
    let message = err(&alice, "fork_sandbox", json!({"count": 4})).await;
    assert!(
        message.starts_with("count must be between 1 and 3 (this server's limits.max_forks_per_call); got 4"),
        "{message}"
    );
    let message = err(&alice, "fork_sandbox", json!({"count": 0})).await;
    assert!(message.contains("count must be between 1 and 3"), "{message}");
    assert!(err(&alice, "fork_sandbox", json!({"copies": 2})).await.contains("unknown field"));
    assert_eq!(direct.list_all_sandboxes(&[]).await.unwrap().len(), 1, "a refused fork made sandboxes");

    let forked = ok(&alice, "fork_sandbox", json!({"count": 3})).await;
    assert_eq!((forked["parent"].as_str(), forked["created"].as_u64()), (Some(parent.as_str()), Some(3)), "{forked}");
    assert_eq!(forked["owned"], json!(true));
    assert!(!forked["carries"].as_str().unwrap().is_empty(), "{forked}");
    let forks: Vec<String> = forked["forks"].as_array().unwrap().iter().map(id_of).collect();
    assert_eq!(forks.len(), 3);
    for fork in forked["forks"].as_array().unwrap() {
        assert!(fork.get("error").is_none() && fork["inbound"].is_object() && fork["timeout_secs"].is_u64(), "{fork}");
    }
    // Each fork is a new sandbox with the parent's files and the gateway's tags (its tenant's).
    for (i, fork) in forks.iter().enumerate() {
        assert_ne!(fork, &parent);
        assert_eq!(read(&alice, fork, "/home/user/data.txt").await.unwrap(), "parent\n");
        let detail = direct.get_sandbox(fork).await.unwrap();
        assert_eq!(detail.metadata.get("sandbox_mcp_tenant").map(String::as_str), Some("alice"));
        assert_eq!(detail.metadata.get("fork.parent"), Some(&parent));
        ok(
            &alice,
            "write_file",
            json!({"path": "/home/user/data.txt", "content": format!("fork {i}\n"), "sandbox_id": fork}),
        )
        .await;
    }
    // Writes are independent: each fork keeps its own, the parent its.
    for (i, fork) in forks.iter().enumerate() {
        assert_eq!(read(&alice, fork, "/home/user/data.txt").await.unwrap(), format!("fork {i}\n"));
    }
    assert_eq!(read(&alice, &parent, "/home/user/data.txt").await.unwrap(), "parent\n");
    // The session's default sandbox is still the parent.
    assert_eq!(ok(&alice, "run_command", json!({"command": "true"})).await["sandbox_id"], json!(parent));

    // list_sandboxes: each fork owned, with its parent and the inherited user metadata (no fork.* keys).
    let listed = ok(&alice, "list_sandboxes", json!({})).await;
    let entries = listed["sandboxes"].as_array().unwrap();
    assert_eq!(entries.len(), 4, "{listed}");
    for entry in entries {
        let id = entry["sandbox_id"].as_str().unwrap();
        assert_eq!(entry["metadata"], json!({"k": "v"}), "{entry}");
        assert!(entry["session_roles"].as_array().unwrap().contains(&json!("owned")), "{entry}");
        if id == parent {
            assert!(entry.get("parent").is_none(), "{entry}");
        } else {
            assert!(forks.iter().any(|f| f == id), "{entry}");
            assert_eq!(entry["parent"], json!(parent), "{entry}");
        }
    }

    // Forks count against the tenant's sandboxes: 4 live of 6, so 3 more would pass the limit.
    let message = err(&alice, "fork_sandbox", json!({"count": 3})).await;
    assert!(
        message.starts_with("tenant limit reached: tenant alice has 4 live sandboxes and 3 forks would pass its limit")
            && message.contains("limits.max_sandboxes_per_tenant = 6")
            && message.contains("ask for at most 2 forks"),
        "{message}"
    );
    assert_eq!(direct.list_all_sandboxes(&[]).await.unwrap().len(), 4);

    // A sessionless (2026-07-28) caller's fork is not owned: it lives until its deadline or kill_sandbox.
    let url = gateway.mcp_url();
    let loose = sessionless(&url, ALICE, "fork_sandbox", json!({"sandbox_id": forks[0], "timeout": 120})).await;
    let loose = loose["structuredContent"].clone();
    assert_eq!((loose["owned"].clone(), loose["created"].clone()), (json!(false), json!(1)), "{loose}");
    assert!(loose["lifetime"].as_str().unwrap().contains("kill_sandbox"), "{loose}");
    let loose_id = id_of(&loose["forks"][0]);
    assert_eq!(read(&alice, &loose_id, "/home/user/data.txt").await.unwrap(), "fork 0\n");
    let missing = sessionless(&url, ALICE, "fork_sandbox", json!({})).await;
    assert!(missing["content"][0]["text"].as_str().unwrap().starts_with("sandbox_id is required"), "{missing}");

    // A task started in a fork retains it; at the session's end the other owned forks and the parent go.
    ok(&alice, "start_task", json!({"command": "sleep 300", "sandbox_id": forks[2]})).await;
    close(alice).await;
    for id in [&parent, &forks[0], &forks[1]] {
        assert!(wait_gone(&direct, id, Duration::from_secs(15)).await, "owned {id} survived the session");
    }
    assert!(sandbox_exists(&direct, &forks[2]).await, "a fork with a task was killed at the session's end");
    assert!(sandbox_exists(&direct, &loose_id).await, "a sessionless fork was killed with the session");
    for id in [&loose_id, &forks[2]] {
        let killed = sessionless(&url, ALICE, "kill_sandbox", json!({"sandbox_id": id})).await;
        assert_eq!(killed["structuredContent"]["killed"], json!(true), "{killed}");
    }
}
