//! Gateway lifecycle against real processes: the provider going down and
//! coming back (clear tool errors, `/readyz` failing then recovering), the
//! embedded local provider (the default with no config), and graceful
//! shutdown (readiness off, in-flight calls finish, owned sandboxes killed).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

use crate::common;
use std::time::Duration;

use common::*;
use serde_json::json;

async fn readyz(gateway: &Gateway) -> (u16, String) {
    match reqwest::Client::new().get(format!("{}/readyz", gateway.base())).send().await {
        Ok(r) => (r.status().as_u16(), r.text().await.unwrap_or_default()),
        Err(e) => (0, e.to_string()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provider_down_gives_clear_errors_and_recovers() {
    require_root!();
    let mut provider = Provider::start();
    let gateway = Gateway::start_e2b(&provider, "", &[]);
    let client = connect(&gateway.mcp_url(), None).await;
    let id = ok(&client, "create_sandbox", json!({})).await["sandbox_id"].as_str().unwrap().to_string();
    ok(&client, "write_file", json!({"path": "keep.txt", "content": "still here"})).await;
    assert_eq!(readyz(&gateway).await.0, 200);

    provider.stop();
    let (status, body) = readyz(&gateway).await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("provider"), "{body}");
    let message = err(&client, "run_command", json!({"command": "true"})).await;
    assert!(message.contains(&id) && message.contains("unreachable"), "{message}");
    let message = err(&client, "create_sandbox", json!({})).await;
    assert!(message.contains("unreachable"), "{message}");
    let message = err(&client, "list_sandboxes", empty()).await;
    assert!(message.contains("unreachable"), "{message}");
    assert!(!message.contains(&provider.api_key));

    // Same address, same state: the provider re-adopts the sandbox and the gateway recovers.
    provider.restart_on_same_address();
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while readyz(&gateway).await.0 != 200 {
        assert!(std::time::Instant::now() < deadline, "readyz did not recover");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let read = ok(&client, "read_file", json!({"path": "keep.txt"})).await;
    assert_eq!(read["content"], json!("still here"));
    let out = ok(&client, "run_command", json!({"command": "echo back"})).await;
    assert_eq!(out["stdout"], json!("back\n"));
    close(client).await;
    assert!(wait_gone(&provider.client(), &id, Duration::from_secs(15)).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_provider_and_graceful_shutdown() {
    require_root!();
    // No provider section at all: the embedded local provider on a private port.
    let mut gateway = Gateway::start("", &[]);
    assert_eq!(readyz(&gateway).await.0, 200);
    let client = connect(&gateway.mcp_url(), None).await;
    let created = ok(&client, "create_sandbox", json!({})).await;
    let id = created["sandbox_id"].as_str().unwrap().to_string();
    let out = ok(&client, "run_command", json!({"command": "echo embedded; id -un"})).await;
    assert_eq!(out["stdout"], json!("embedded\nuser\n"));

    // SIGTERM while a call is in flight: readiness fails at once, the call still completes.
    let slow = {
        let client = client.clone();
        tokio::spawn(async move { call(&client, "run_command", json!({"command": "sleep 2; echo done"})).await })
    };
    let running =
        eventually(Duration::from_secs(10), || async { !host_processes_with("sleep 2; echo done").is_empty() });
    assert!(running.await, "the slow call's command never started; log:\n{}", gateway.log_text());
    gateway.signal_term();
    let unready = eventually(Duration::from_secs(2), || async { readyz(&gateway).await.0 != 200 }).await;
    assert!(unready, "readiness still 200 two seconds after SIGTERM; log:\n{}", gateway.log_text());
    assert_eq!(readyz(&gateway).await.0, 503, "readiness must fail first");
    assert!(!slow.is_finished(), "readiness must fail before the in-flight call completes");
    let finished = slow.await.unwrap();
    assert_ne!(finished.is_error, Some(true), "{}", text(&finished));
    assert_eq!(finished.structured_content.unwrap()["stdout"], json!("done\n"));
    assert!(gateway.shutdown(), "serve did not exit cleanly; log:\n{}", gateway.log_text());
    let log = gateway.log_text();
    assert!(log.contains("killed its owned sandboxes") && log.contains("\"shutdown\""), "{log}");
    drop(client);

    // The owned sandbox is really gone: a provider on the same state dir finds nothing to re-adopt.
    let provider = Provider::builder().state_dir(&gateway.state_dir).start();
    let left = provider.client().list_all_sandboxes(&[]).await.unwrap();
    assert!(left.iter().all(|s| s.sandbox_id != id), "sandbox {id} survived the gateway's shutdown: {left:?}");
}

/// The gateway's runtime has `server.worker_threads` workers (one by default) and the embedded
/// provider a runtime of its own with one worker per core, as each logs at start-up.
#[tokio::test(flavor = "multi_thread")]
async fn gateway_and_embedded_provider_run_on_their_own_runtimes() {
    require_root!();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    for (env, gateway_workers) in [(vec![], 1), (vec![("SANDBOX_MCP_SERVER__WORKER_THREADS", "3")], 3)] {
        let gateway = Gateway::start("", &env);
        let log = gateway.log_text();
        let field = |message: &str, key: &str| {
            log.lines()
                .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
                .find(|line| line["message"].as_str().is_some_and(|m| m.contains(message)))
                .and_then(|line| line[key].as_u64())
        };
        assert_eq!(field("gateway listening", "workers"), Some(gateway_workers), "{env:?}: {log}");
        assert_eq!(field("embedded local provider started", "workers"), Some(cores as u64), "{env:?}: {log}");
        // Its threads are the provider runtime's own (named), beside the gateway's.
        let provider_threads = std::fs::read_dir(format!("/proc/{}/task", gateway.pid()))
            .unwrap()
            .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
            .filter(|name| name.trim() == "local-provider")
            .count();
        assert!(provider_threads >= cores, "{provider_threads} local-provider threads for {cores} cores");
    }
}
