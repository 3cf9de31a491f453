//! HTTP-level behaviour of `serve`: bearer auth (401 + WWW-Authenticate),
//! tenant isolation, Host/Origin allow-lists (403), health and readiness
//! probes, protocol-version capping, and the refusal to listen publicly
//! without auth.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

use crate::common;
use std::time::Duration;

use common::*;
use serde_json::json;

const TOKEN_ACME: &str = "acme-token-0123456789abcdef";
const TOKEN_BETA: &str = "beta-token-0123456789abcdef";

fn auth_config() -> String {
    format!(
        "{}[server]\nallowed_origins = [\"https://app.example.com\"]\n",
        tokens_config(&[("acme", TOKEN_ACME), ("beta", TOKEN_BETA)])
    )
}

fn initialize_body() -> serde_json::Value {
    json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}})
}

async fn post_initialize(gateway: &Gateway, headers: &[(&str, &str)]) -> reqwest::Response {
    let mut request = reqwest::Client::new()
        .post(gateway.mcp_url())
        .header("accept", "application/json, text/event-stream")
        .json(&initialize_body());
    for (k, v) in headers {
        request = request.header(*k, *v);
    }
    request.send().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_tenants_and_dns_rebinding_protection() {
    require_root!();
    let provider = Provider::start();
    let gateway = Gateway::start_e2b(&provider, &auth_config(), &[]);
    let direct = provider.client();

    // Missing and wrong tokens: 401 with a Bearer challenge.
    let missing = post_initialize(&gateway, &[]).await;
    assert_eq!(missing.status(), 401);
    assert!(missing.headers()["www-authenticate"].to_str().unwrap().starts_with("Bearer"));
    let wrong = post_initialize(&gateway, &[("authorization", "Bearer not-a-token")]).await;
    assert_eq!(wrong.status(), 401);
    assert!(wrong.headers()["www-authenticate"].to_str().unwrap().contains("invalid_token"));
    let hash_as_token = format!("Bearer {}", sha256_hex(TOKEN_ACME));
    assert_eq!(post_initialize(&gateway, &[("authorization", &hash_as_token)]).await.status(), 401);

    // Host and Origin allow-lists: 403 even with a valid token.
    let bearer = format!("Bearer {TOKEN_ACME}");
    let bad_host = post_initialize(&gateway, &[("authorization", &bearer), ("host", "evil.example.com")]).await;
    assert_eq!(bad_host.status(), 403);
    let bad_origin =
        post_initialize(&gateway, &[("authorization", &bearer), ("origin", "https://evil.example.com")]).await;
    assert_eq!(bad_origin.status(), 403);
    let good_origin =
        post_initialize(&gateway, &[("authorization", &bearer), ("origin", "https://app.example.com")]).await;
    assert_eq!(good_origin.status(), 200);
    assert_eq!(post_initialize(&gateway, &[("authorization", &bearer), ("host", "localhost")]).await.status(), 200);

    // Probes need no auth.
    let http = reqwest::Client::new();
    assert_eq!(http.get(format!("{}/healthz", gateway.base())).send().await.unwrap().status(), 200);
    assert_eq!(http.get(format!("{}/readyz", gateway.base())).send().await.unwrap().status(), 200);

    // Tenant isolation: beta can neither see, use, nor kill acme's sandbox.
    let acme = connect(&gateway.mcp_url(), Some(TOKEN_ACME)).await;
    let beta = connect(&gateway.mcp_url(), Some(TOKEN_BETA)).await;
    let id = ok(&acme, "create_sandbox", json!({})).await["sandbox_id"].as_str().unwrap().to_string();
    assert_eq!(
        direct.get_sandbox(&id).await.unwrap().metadata.get("sandbox_mcp_tenant").map(String::as_str),
        Some("acme")
    );
    let listed = ok(&beta, "list_sandboxes", empty()).await;
    assert_eq!(listed["sandboxes"], json!([]), "beta sees acme's sandbox");
    for (tool, args) in [
        ("run_command", json!({"command": "true", "sandbox_id": id})),
        ("read_file", json!({"path": "/etc/hostname", "sandbox_id": id})),
        ("write_file", json!({"path": "x", "content": "x", "sandbox_id": id})),
        ("list_files", json!({"sandbox_id": id})),
        ("connect_sandbox", json!({"sandbox_id": id})),
        ("kill_sandbox", json!({"sandbox_id": id})),
    ] {
        let message = err(&beta, tool, args).await;
        assert!(message.contains("not found"), "{tool} by another tenant: {message}");
    }
    assert!(sandbox_exists(&direct, &id).await, "another tenant killed the sandbox");
    let listed = ok(&acme, "list_sandboxes", empty()).await;
    assert_eq!(listed["sandboxes"].as_array().unwrap().len(), 1);

    // A session id is bound to its tenant: beta's token on acme's session is refused like an unknown session.
    let acme_session = post_initialize(&gateway, &[("authorization", &bearer)]).await;
    let session_id = acme_session.headers()["mcp-session-id"].to_str().unwrap().to_string();
    let hijack = http
        .post(gateway.mcp_url())
        .header("accept", "application/json, text/event-stream")
        .header("authorization", format!("Bearer {TOKEN_BETA}"))
        .header("mcp-session-id", &session_id)
        .header("mcp-protocol-version", "2025-11-25")
        .json(&json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}))
        .send()
        .await
        .unwrap();
    assert_eq!(hijack.status(), 404);

    close(beta).await;
    close(acme).await;
    assert!(wait_gone(&direct, &id, Duration::from_secs(15)).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protocol_versions_are_capped_to_keep_sessions() {
    require_root!();
    let provider = Provider::start();
    let gateway = Gateway::start_e2b(&provider, "", &[]);
    let response = reqwest::Client::new()
        .post(gateway.mcp_url())
        .header("accept", "application/json, text/event-stream")
        .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2026-07-28", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert!(response.headers().contains_key("mcp-session-id"), "sessions must stay on");
    let body = response.text().await.unwrap();
    assert!(body.contains("\"protocolVersion\":\"2025-11-25\""), "{body}");
}

#[test]
fn refuses_public_listener_without_auth() {
    let tmp = tempfile::tempdir().unwrap();
    let output = std::process::Command::new(binary())
        .args(["serve", "--listen", "0.0.0.0:0"])
        .env("SANDBOX_MCP_LOCAL__STATE_DIR", tmp.path())
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--insecure-no-auth") && stderr.contains("refusing"), "{stderr}");

    let bad_config = tmp.path().join("bad.toml");
    std::fs::write(&bad_config, "[server]\nlisten_address = \"x\"\n").unwrap();
    let output = std::process::Command::new(binary()).args(["serve", "--config"]).arg(&bad_config).output().unwrap();
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("listen_address"));
}
