//! `/metrics` of a real `sandbox-mcp serve` (backed by a separate `sandbox-mcp
//! provider`): counters and gauges after real tool calls, bearer auth on the
//! main listener, the unauthenticated admin listener, and `enabled = false`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

use crate::common;
use std::time::{Duration, Instant};

use common::*;
use serde_json::json;

const TOKEN: &str = "metrics-test-token-0123456789";
/// The dedicated scrape token (`metrics.token_sha256`); tenant tokens never read `/metrics`.
const SCRAPE: &str = "metrics-scrape-token-9876543210";

fn auth_config() -> String {
    tokens_config(&[("acme", TOKEN)])
}

fn auth_and_scrape_config() -> String {
    format!("{}[metrics]\ntoken_sha256 = \"{}\"\n", auth_config(), sha256_hex(SCRAPE))
}

async fn get(url: &str, token: Option<&str>) -> (u16, String, String) {
    let mut request = reqwest::Client::new().get(url).timeout(Duration::from_secs(5));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request.send().await.unwrap_or_else(|e| panic!("GET {url}: {e}"));
    let status = response.status().as_u16();
    let content_type =
        response.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
    (status, content_type, response.text().await.unwrap_or_default())
}

/// The value of the sample line `series` (exact name and labels), if present.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_on_main_listener_count_calls_behind_auth() {
    require_root!();
    let provider = Provider::start();
    let gateway = Gateway::start_e2b(&provider, &auth_and_scrape_config(), &[]);
    let url = format!("{}/metrics", gateway.base());

    let (status, _, _) = get(&url, None).await;
    assert_eq!(status, 401, "/metrics must need the scrape token when auth is configured");
    let (status, _, _) = get(&url, Some("wrong-token-0123456789")).await;
    assert_eq!(status, 401);
    let (status, _, _) = get(&url, Some(TOKEN)).await;
    assert_eq!(status, 401, "a tenant token must never read /metrics (every tenant's activity)");

    let client = connect(&gateway.mcp_url(), Some(TOKEN)).await;
    let id = ok(&client, "create_sandbox", json!({})).await["sandbox_id"].as_str().unwrap().to_string();
    let message = err(&client, "read_file", json!({"path": "x", "sandbox_id": "no-such-sandbox"})).await;
    assert!(message.contains("not found"), "{message}");

    let (status, content_type, text) = get(&url, Some(SCRAPE)).await;
    assert_eq!(status, 200, "{text}");
    assert!(content_type.starts_with("application/openmetrics-text"), "{content_type}");
    assert_eq!(
        sample(&text, r#"sandbox_mcp_tool_calls_total{tool="create_sandbox",outcome="ok"}"#),
        Some(1.0),
        "{text}"
    );
    assert_eq!(sample(&text, r#"sandbox_mcp_tool_calls_total{tool="read_file",outcome="error"}"#), Some(1.0), "{text}");
    assert_eq!(sample(&text, r#"sandbox_mcp_tool_calls_total{tool="read_file",outcome="ok"}"#), None, "{text}");
    assert_eq!(sample(&text, r#"sandbox_mcp_tool_call_duration_seconds_count{tool="create_sandbox"}"#), Some(1.0));
    let create_secs = sample(&text, r#"sandbox_mcp_tool_call_duration_seconds_sum{tool="create_sandbox"}"#).unwrap();
    assert!(create_secs > 0.0 && create_secs < 120.0, "{create_secs}");
    assert_eq!(sample(&text, r#"sandbox_mcp_provider_errors_total{op="get_sandbox"}"#), Some(1.0), "{text}");
    assert_eq!(sample(&text, "sandbox_mcp_sessions"), Some(1.0), "{text}");
    assert_eq!(sample(&text, "sandbox_mcp_sandboxes_owned"), Some(1.0), "{text}");
    assert_eq!(sample(&text, "sandbox_mcp_sandboxes_retained"), Some(0.0), "{text}");
    assert_eq!(sample(&text, "sandbox_mcp_supervisor_installs_total"), Some(0.0), "{text}");
    assert_eq!(sample(&text, "sandbox_mcp_task_channel_starts_total"), Some(0.0), "{text}");
    assert!(text.trim_end().ends_with("# EOF"), "{text}");

    // A task installs the supervisor and retains the sandbox.
    ok(&client, "start_task", json!({"command": "true"})).await;
    let (_, _, text) = get(&url, Some(SCRAPE)).await;
    assert_eq!(sample(&text, "sandbox_mcp_sandboxes_retained"), Some(1.0), "{text}");
    assert!(sample(&text, "sandbox_mcp_supervisor_installs_total").unwrap() >= 1.0, "{text}");
    // That start opened the sandbox's task channel: once it has greeted, starts go through it.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        ok(&client, "start_task", json!({"command": "true"})).await;
        let (_, _, text) = get(&url, Some(SCRAPE)).await;
        if sample(&text, "sandbox_mcp_task_channel_starts_total").unwrap_or(0.0) >= 1.0 {
            break;
        }
        assert!(Instant::now() < deadline, "no start went through the task channel: {text}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // The session ends: the gauges drop.
    close(client).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, _, text) = get(&url, Some(SCRAPE)).await;
        if sample(&text, "sandbox_mcp_sessions") == Some(0.0) {
            assert_eq!(sample(&text, "sandbox_mcp_sandboxes_owned"), Some(0.0), "{text}");
            break;
        }
        assert!(Instant::now() < deadline, "sessions gauge did not drop to 0:\n{text}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(sandbox_exists(&provider.client(), &id).await, "the retained sandbox must survive its session");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_admin_listener_serves_without_auth_and_can_be_disabled() {
    require_root!();
    let provider = Provider::start();
    let config = format!("{}[metrics]\nlisten = \"127.0.0.1:0\"\n", auth_config());
    let gateway = Gateway::start_e2b(&provider, &config, &[]);
    let admin = gateway.logged_addr("metrics admin listener").expect("the admin listener logs its address");
    let client = connect(&gateway.mcp_url(), Some(TOKEN)).await;
    ok(&client, "list_sandboxes", empty()).await;

    let admin_url = format!("http://{admin}/metrics");
    let (status, _, text) = get(&admin_url, None).await;
    assert_eq!(status, 200, "admin listener must serve /metrics without auth: {text}");
    assert_eq!(sample(&text, r#"sandbox_mcp_tool_calls_total{tool="list_sandboxes",outcome="ok"}"#), Some(1.0));
    assert_eq!(sample(&text, "sandbox_mcp_sessions"), Some(1.0), "{text}");
    let (status, _, _) = get(&format!("{}/metrics", gateway.base()), Some(TOKEN)).await;
    assert_eq!(status, 404, "with an admin listener, the main listener has no /metrics");
    close(client).await;
    drop(gateway);

    // Auth on, no admin listener and no scrape token: no /metrics on the main listener at all.
    let closed = Gateway::start_e2b(&provider, &auth_config(), &[]);
    let (status, _, _) = get(&format!("{}/metrics", closed.base()), Some(TOKEN)).await;
    assert_eq!(status, 404, "tenant tokens must not read /metrics");
    drop(closed);

    let disabled = Gateway::start_e2b(&provider, "[metrics]\nenabled = false\n", &[]);
    let (status, _, _) = get(&format!("{}/metrics", disabled.base()), None).await;
    assert_eq!(status, 404, "metrics.enabled = false must remove the endpoint");
}
