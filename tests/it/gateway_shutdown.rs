//! Graceful shutdown of `sandbox-mcp serve` against a separate `sandbox-mcp
//! provider` (the E2B code path): on SIGTERM readiness fails first, the
//! in-flight call completes with its output, the process exits 0 within the
//! grace period, the session's owned sandbox is killed and the sandbox it
//! retained (a task runs there) survives, without the gateway's task channel. A
//! restarted gateway then logs the surviving sandbox of its deployment at start-up.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

use crate::common;
use crate::tasks_support::{CHANNEL_PIDS, await_channel_pids};
use std::time::{Duration, Instant};

use common::*;
use sandbox_mcp::e2b::{CallOptions, OutputLimits, wire};
use serde_json::json;

const GRACE_SECS: u64 = 15;

async fn status_of(url: String) -> u16 {
    match reqwest::Client::new().get(url).timeout(Duration::from_secs(2)).send().await {
        Ok(r) => r.status().as_u16(),
        Err(_) => 0,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_calls_kills_owned_keeps_retained() {
    require_root!();
    let provider = Provider::start();
    let provider_client = provider.client();
    let extra = format!("deployment = \"shutdown-test\"\n[server]\nshutdown_grace_secs = {GRACE_SECS}\n");
    let mut gateway = Gateway::start_e2b(&provider, &extra, &[]);
    assert_eq!(status_of(format!("{}/readyz", gateway.base())).await, 200);

    let client = connect(&gateway.mcp_url(), None).await;
    let s1 = ok(&client, "create_sandbox", json!({})).await["sandbox_id"].as_str().unwrap().to_string();
    let s2 = ok(&client, "create_sandbox", json!({})).await["sandbox_id"].as_str().unwrap().to_string();
    let task = ok(&client, "start_task", json!({"command": "sleep 120", "sandbox_id": s2})).await;
    assert!(task["task_id"].is_string(), "{task}");
    // The first start opened the sandbox's task channel beside it.
    let channels = format!("{}; echo $c", await_channel_pids());
    let opened = ok(&client, "run_command", json!({"command": channels, "sandbox_id": s2})).await;
    assert!(!opened["stdout"].as_str().unwrap().trim().is_empty(), "no task channel in {s2}: {opened}");

    let slow = {
        let client = client.clone();
        let s1 = s1.clone();
        tokio::spawn(async move {
            call(&client, "run_command", json!({"command": "sleep 3; echo done", "sandbox_id": s1})).await
        })
    };
    // In flight: its command runs in the sandbox (a host process, as sandboxes share the host's kernel).
    let running =
        eventually(Duration::from_secs(10), || async { !host_processes_with("sleep 3; echo done").is_empty() });
    assert!(running.await, "the slow call's command never started; log:\n{}", gateway.log_text());
    assert!(!slow.is_finished(), "the slow call ended before SIGTERM");

    gateway.signal_term();
    let term_sent = Instant::now();
    // Readiness must fail while the call is still in flight (and while the listener still answers).
    let mut ready = 200;
    while term_sent.elapsed() < Duration::from_secs(2) {
        ready = status_of(format!("{}/readyz", gateway.base())).await;
        if ready != 200 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(ready, 503, "readyz must answer 503 right after SIGTERM; log:\n{}", gateway.log_text());
    assert!(!slow.is_finished(), "readiness must flip before the in-flight call completes");
    assert_eq!(status_of(format!("{}/healthz", gateway.base())).await, 200, "liveness stays up during the drain");

    let finished = tokio::time::timeout(Duration::from_secs(GRACE_SECS), slow).await.expect("slow call").unwrap();
    assert_ne!(finished.is_error, Some(true), "{}", text(&finished));
    assert_eq!(finished.structured_content.unwrap()["stdout"], json!("done\n"));

    let mut child = gateway.take_process().expect("serve process");
    let deadline = term_sent + Duration::from_secs(GRACE_SECS + 5);
    let status = loop {
        if let Some(status) = child.try_status() {
            break status;
        }
        if Instant::now() > deadline {
            child.kill9();
            panic!("serve did not exit within the grace period; log:\n{}", gateway.log_text());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(status.success(), "serve exited with {status}; log:\n{}", gateway.log_text());
    let log = gateway.log_text();
    assert!(log.contains("killed its owned sandboxes") && log.contains("\"shutdown\""), "{log}");
    drop(client);

    assert!(!sandbox_exists(&provider_client, &s1).await, "owned sandbox {s1} survived the shutdown");
    assert!(sandbox_exists(&provider_client, &s2).await, "retained sandbox {s2} was killed by the shutdown");
    // The gateway ended its task channel there (rather than leave it to its 5-minute idle exit).
    let sandbox = provider_client.connect_sandbox(&s2, None).await.unwrap();
    let left =
        format!("for i in $(seq 60); do c=$({CHANNEL_PIDS}); test -z \"$c\" && break; sleep 0.05; done; echo left: $c");
    let options = CallOptions::user("user").with_timeout(Duration::from_secs(30));
    let out = provider_client
        .envd(&sandbox)
        .run(&wire::StartRequest::login_shell(left), &options, OutputLimits::default())
        .await
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "left:\n", "the gateway's task channel outlived it in {s2}");

    // A new gateway of the same deployment counts the survivor at start-up.
    let restarted = Gateway::start_e2b(&provider, &extra, &[]);
    assert!(
        restarted.wait_log("\"alive\":1", Duration::from_secs(15)).await,
        "start-up log lacks the sandbox count; log:\n{}",
        restarted.log_text()
    );
    assert!(restarted.log_text().contains("\"deployment\":\"shutdown-test\""), "{}", restarted.log_text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_with_overlong_call_still_exits_within_grace() {
    require_root!();
    const SHORT_GRACE_SECS: u64 = 4;
    let provider = Provider::start();
    let provider_client = provider.client();
    let extra = format!("[server]\nshutdown_grace_secs = {SHORT_GRACE_SECS}\n");
    let mut gateway = Gateway::start_e2b(&provider, &extra, &[]);
    let client = connect(&gateway.mcp_url(), None).await;
    let s1 = ok(&client, "create_sandbox", json!({})).await["sandbox_id"].as_str().unwrap().to_string();

    // A call far longer than the grace period: shutdown must not wait for it.
    let overlong = {
        let client = client.clone();
        tokio::spawn(async move {
            let Some(serde_json::Value::Object(args)) = Some(json!({"command": "sleep 60; echo late", "timeout": 120}))
            else {
                unreachable!()
            };
            let request = rmcp::model::CallToolRequestParams::new("run_command").with_arguments(args);
            tokio::time::timeout(Duration::from_secs(60), client.call_tool(request)).await
        })
    };
    let running =
        eventually(Duration::from_secs(10), || async { !host_processes_with("sleep 60; echo late").is_empty() });
    assert!(running.await, "the overlong call's command never started; log:\n{}", gateway.log_text());
    gateway.signal_term();
    let term_sent = Instant::now();

    let mut child = gateway.take_process().expect("serve process");
    let status = loop {
        if let Some(status) = child.try_status() {
            break status;
        }
        if term_sent.elapsed() > Duration::from_secs(30) {
            child.kill9();
            panic!("serve did not exit; log:\n{}", gateway.log_text());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let took = term_sent.elapsed();
    assert!(status.success(), "serve exited with {status}; log:\n{}", gateway.log_text());
    // The grace bounds the whole shutdown (drain + cleanup), plus at most ~1 s to close connections.
    assert!(
        took < Duration::from_secs(SHORT_GRACE_SECS) + Duration::from_millis(1500),
        "shutdown took {took:?} with a {SHORT_GRACE_SECS} s grace; log:\n{}",
        gateway.log_text()
    );
    let log = gateway.log_text();
    assert!(log.contains("grace period over"), "{log}");
    // The call did not complete normally, and the owned sandbox was still cleaned up.
    eprintln!("shutdown with an overlong call took {took:?} (grace {SHORT_GRACE_SECS} s)");
    if !overlong.is_finished() {
        // The client may wait for a response that will never come.
        overlong.abort();
    } else if let Ok(Ok(Ok(result))) = overlong.await {
        assert!(!text(&result).contains("late"), "the overlong call cannot have finished: {}", text(&result));
    }
    assert!(!sandbox_exists(&provider_client, &s1).await, "owned sandbox {s1} survived the shutdown; log:\n{log}");
    drop(client);
}

/// A gateway whose log pipe breaks (its reader gone, as when a log collector dies) goes on
/// serving tool calls, which log, and still stops on SIGTERM: a log line that cannot be written is
/// dropped, where it used to panic the task that logged, the one waiting for SIGTERM among them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_log_pipe_neither_fails_calls_nor_stops_sigterm() {
    require_root!();
    let tmp = tempfile::tempdir().unwrap();
    let (log_reader, log_writer) = std::io::pipe().unwrap();
    let mut command = std::process::Command::new(binary());
    command
        .args(["serve", "--listen", "127.0.0.1:0"])
        .env("SANDBOX_MCP_SERVER__LOG_FORMAT", "json")
        .env("SANDBOX_MCP_SERVER__SHUTDOWN_GRACE_SECS", GRACE_SECS.to_string())
        .env("SANDBOX_MCP_LOCAL__STATE_DIR", tmp.path().join("state"))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(log_writer);
    let mut gateway = ProcessGuard::spawn(&mut command, Duration::from_secs(5)).unwrap();
    // Its address from the log, which is then no longer read: the pipe breaks.
    let (found, address) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(log_reader).lines().map_while(Result::ok) {
            if line.contains("gateway listening") {
                let entry: serde_json::Value = serde_json::from_str(&line).unwrap_or_default();
                let _ = found.send(entry["addr"].as_str().unwrap_or_default().to_string());
                return;
            }
        }
    });
    let addr = address.recv_timeout(Duration::from_secs(60)).expect("the gateway's listening line");
    let client = connect(&format!("http://{addr}/mcp"), None).await;
    for _ in 0..3 {
        let created = ok(&client, "create_sandbox", json!({})).await;
        let sandbox_id = created["sandbox_id"].as_str().unwrap().to_string();
        let run = ok(&client, "run_command", json!({"command": "echo logged", "sandbox_id": sandbox_id})).await;
        assert_eq!(run["stdout"], "logged\n", "{run}");
        ok(&client, "kill_sandbox", json!({"sandbox_id": sandbox_id})).await;
    }
    drop(client);
    gateway.signal(nix::sys::signal::Signal::SIGTERM);
    let status = gateway.wait_timeout(Duration::from_secs(GRACE_SECS + 5));
    assert!(status.is_some_and(|s| s.success()), "serve did not stop on SIGTERM after its log pipe broke: {status:?}");
}
