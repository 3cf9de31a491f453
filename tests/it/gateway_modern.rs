//! MCP 2026-07-28 beside the legacy session protocol, against real `serve`
//! processes and a real `sandbox-mcp provider`, spoken as raw JSON-RPC over
//! HTTP (the exact wire a 2026-07-28 client sends): sessionless tool calls,
//! discover and cache hints, the Tasks extension backed by sandbox tasks
//! (tenant-bound ids, cancel, another replica, a SIGKILLed and restarted
//! gateway), and the legacy session DELETE answers (204, then 404).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

use crate::common;
use std::time::{Duration, Instant};

use common::{Gateway, Provider, require_root, tokens_config};
use reqwest::header::CONTENT_TYPE;
use serde_json::{Value, json};

const TOKEN_ACME: &str = "modern-token-acme-0123456789";
const TOKEN_BETA: &str = "modern-token-beta-0123456789";
const TASKS: &str = "io.modelcontextprotocol/tasks";

fn auth_config() -> String {
    tokens_config(&[("acme", TOKEN_ACME), ("beta", TOKEN_BETA)])
}

/// A 2026-07-28 client: every request carries its version, client info and capabilities.
struct Modern {
    http: reqwest::Client,
    url: String,
    token: &'static str,
    tasks: bool,
}

struct Answer {
    status: u16,
    content_type: String,
    session_header: bool,
    body: Value,
}

impl Modern {
    fn new(url: String, token: &'static str, tasks: bool) -> Self {
        Self { http: reqwest::Client::new(), url, token, tasks }
    }

    async fn send(&self, method: &str, mut params: Value) -> Answer {
        let extensions = if self.tasks { json!({ TASKS: {} }) } else { json!({}) };
        let mut meta = json!({
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientInfo": {"name": "gateway-modern-test", "version": "1.0.0"},
            "io.modelcontextprotocol/clientCapabilities": {"extensions": extensions},
        });
        if let Some(Value::Object(extra)) = params.get("_meta") {
            for (k, v) in extra {
                meta[k] = v.clone();
            }
        }
        params["_meta"] = meta;
        let mut request = self
            .http
            .post(&self.url)
            .bearer_auth(self.token)
            .header("Accept", "application/json, text/event-stream")
            .header("MCP-Protocol-Version", "2026-07-28")
            .header("Mcp-Method", method);
        if let Some(name) = params.get("name").or_else(|| params.get("taskId")).and_then(Value::as_str) {
            request = request.header("Mcp-Name", name);
        }
        let response = request
            .json(&json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}))
            .send()
            .await
            .expect("POST /mcp");
        let status = response.status().as_u16();
        let content_type =
            response.headers().get(CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
        let session_header = response.headers().contains_key("mcp-session-id");
        let text = response.text().await.expect("body");
        let body = if content_type.starts_with("text/event-stream") {
            text.lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
                .find(|v| v.get("id").is_some())
                .unwrap_or(Value::Null)
        } else {
            serde_json::from_str(&text).unwrap_or(Value::Null)
        };
        Answer { status, content_type, session_header, body }
    }

    async fn result(&self, method: &str, params: Value) -> Value {
        let answer = self.send(method, params).await;
        assert_eq!(answer.status, 200, "{method}: {}", answer.body);
        assert!(answer.body.get("error").is_none(), "{method}: {}", answer.body);
        answer.body["result"].clone()
    }

    async fn error_code(&self, method: &str, params: Value) -> i64 {
        let answer = self.send(method, params).await;
        answer.body["error"]["code"].as_i64().unwrap_or_else(|| panic!("{method}: expected an error: {}", answer.body))
    }

    async fn tool(&self, name: &str, arguments: Value) -> Value {
        self.result("tools/call", json!({"name": name, "arguments": arguments})).await
    }

    async fn tool_ok(&self, name: &str, arguments: Value) -> Value {
        let result = self.tool(name, arguments).await;
        assert_ne!(result["isError"], true, "{name}: {result}");
        result["structuredContent"].clone()
    }

    /// Polls tasks/get until a terminal status.
    async fn wait_terminal(&self, task_id: &str, timeout: Duration) -> Value {
        let deadline = Instant::now() + timeout;
        loop {
            let task = self.result("tasks/get", json!({"taskId": task_id})).await;
            if ["completed", "failed", "cancelled"].contains(&task["status"].as_str().unwrap_or_default()) {
                return task;
            }
            assert!(Instant::now() < deadline, "task {task_id} not terminal: {task}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

fn start_pair() -> Option<(Provider, Gateway)> {
    require_root!(None);
    let provider = Provider::start();
    let gateway = Gateway::start_e2b(&provider, &auth_config(), &[]);
    Some((provider, gateway))
}

#[tokio::test(flavor = "multi_thread")]
async fn sessionless_requests_discover_list_and_run() {
    let Some((_provider, gateway)) = start_pair() else { return };
    let acme = Modern::new(gateway.mcp_url(), TOKEN_ACME, false);

    let discover = acme.send("server/discover", json!({})).await;
    assert_eq!(discover.status, 200, "{}", discover.body);
    assert!(discover.content_type.starts_with("application/json"), "{}", discover.content_type);
    let info = &discover.body["result"];
    assert!(info["supportedVersions"].as_array().is_some_and(|v| v.contains(&json!("2026-07-28"))), "{info}");
    assert!(info["supportedVersions"].as_array().is_some_and(|v| v.contains(&json!("2025-11-25"))), "{info}");
    assert!(info["capabilities"]["extensions"][TASKS].is_object(), "{info}");
    let instructions = info["instructions"].as_str().unwrap_or_default();
    assert!(instructions.contains("no session") && !instructions.contains("session ends"), "{instructions}");

    let list = acme.send("tools/list", json!({})).await;
    assert!(list.content_type.starts_with("application/json"));
    assert!(!list.session_header, "a 2026-07-28 answer must not open a session");
    let tools = &list.body["result"];
    assert!(tools["ttlMs"].as_u64().is_some_and(|t| t > 0), "{}", tools["ttlMs"]);
    assert_eq!(tools["cacheScope"], "public");
    let text = tools.to_string();
    for bad in ["uint64", "\"int64\"", "\"double\"", "\"type\":["] {
        assert!(!text.contains(bad), "non-portable schema ({bad}) in tools/list");
    }
    let create = tools["tools"].as_array().unwrap().iter().find(|t| t["name"] == "create_sandbox").unwrap().clone();
    assert!(create["description"].as_str().unwrap().contains("NOT killed when you disconnect"), "{create}");

    // No session: a sandbox tool without sandbox_id says which id to pass.
    let missing = acme.tool("run_command", json!({"command": "true"})).await;
    assert_eq!(missing["isError"], true, "{missing}");
    assert!(missing.to_string().contains("create_sandbox"), "{missing}");

    let created = acme.tool_ok("create_sandbox", json!({})).await;
    let sandbox_id = created["sandbox_id"].as_str().expect("sandbox_id").to_string();
    assert_eq!(created["owned"], false, "{created}");
    assert!(created["lifetime"].as_str().unwrap_or_default().contains("kill_sandbox"), "{created}");

    let run = acme.tool_ok("run_command", json!({"sandbox_id": sandbox_id, "command": "echo hi; exit 4"})).await;
    assert_eq!(run["stdout"], "hi\n");
    assert_eq!(run["exit_code"], 4);

    // Another tenant cannot see or use it.
    let beta = Modern::new(gateway.mcp_url(), TOKEN_BETA, false);
    let theirs = beta.tool("run_command", json!({"sandbox_id": sandbox_id, "command": "true"})).await;
    assert_eq!(theirs["isError"], true);
    assert!(theirs.to_string().contains("not found"), "{theirs}");

    // A sessionless caller's sandbox outlives the request: it is still there for the next one.
    let listed = acme.tool_ok("list_sandboxes", json!({})).await;
    assert!(listed["sandboxes"].to_string().contains(&sandbox_id), "{listed}");
    let killed = acme.tool_ok("kill_sandbox", json!({"sandbox_id": sandbox_id})).await;
    assert_eq!(killed["killed"], true);
}

#[tokio::test(flavor = "multi_thread")]
async fn mcp_tasks_are_sandbox_tasks_across_replicas_and_tenants() {
    let Some((provider, gateway_a)) = start_pair() else { return };
    let gateway_b = Gateway::start_e2b(&provider, &auth_config(), &[]);
    let a = Modern::new(gateway_a.mcp_url(), TOKEN_ACME, true);
    let b = Modern::new(gateway_b.mcp_url(), TOKEN_ACME, true);

    let created = a.tool_ok("create_sandbox", json!({})).await;
    let sandbox_id = created["sandbox_id"].as_str().unwrap().to_string();

    // A task-augmented run_command on A: a CreateTaskResult at once.
    let started = a
        .tool("run_command", json!({"sandbox_id": sandbox_id, "command": "sleep 1; echo out; echo err >&2; exit 3"}))
        .await;
    assert_eq!(started["resultType"], "task", "{started}");
    assert_eq!(started["status"], "working", "{started}");
    assert!(started["ttlMs"].as_u64().is_some_and(|t| t > 0), "{started}");
    assert!(started["pollIntervalMs"].as_u64().is_some(), "{started}");
    let task_id = started["taskId"].as_str().unwrap().to_string();

    // Read on B (no gateway memory needed): completed, the nonzero exit is data.
    let done = b.wait_terminal(&task_id, Duration::from_secs(30)).await;
    assert_eq!(done["status"], "completed", "{done}");
    let result = &done["result"];
    assert_ne!(result["isError"], true, "{done}");
    assert_eq!(result["structuredContent"]["exit_code"], 3, "{done}");
    assert_eq!(result["structuredContent"]["stdout"], "out\n", "{done}");
    assert_eq!(result["structuredContent"]["stderr"], "err\n", "{done}");
    assert_eq!(result["structuredContent"]["state"], "failed", "{done}");
    assert!(result["content"].as_array().is_some_and(|c| !c.is_empty()), "{done}");

    // The sandbox task is visible to the task tools too.
    let listed = b.tool_ok("list_tasks", json!({"sandbox_id": sandbox_id})).await;
    assert!(listed.to_string().contains(&result["structuredContent"]["task_id"].as_str().unwrap().to_string()));

    // Another tenant, or a forged id, gets "not found" (-32602).
    let beta = Modern::new(gateway_a.mcp_url(), TOKEN_BETA, true);
    assert_eq!(beta.error_code("tasks/get", json!({"taskId": task_id})).await, -32602);
    assert_eq!(beta.error_code("tasks/cancel", json!({"taskId": task_id})).await, -32602);
    let forged = format!("{}x", &task_id[..task_id.len() - 1]);
    assert_eq!(a.error_code("tasks/get", json!({"taskId": forged})).await, -32602);
    assert_eq!(a.error_code("tasks/get", json!({"taskId": "tasks-conformance-nonexistent-12345"})).await, -32602);
    // Without the extension declared: -32021.
    let plain = Modern::new(gateway_a.mcp_url(), TOKEN_ACME, false);
    assert_eq!(plain.error_code("tasks/get", json!({"taskId": task_id})).await, -32021);

    // start_task as an MCP task, started on B, cancelled on A: TERM/KILL confirmed, then idempotent.
    let long = b.tool("start_task", json!({"sandbox_id": sandbox_id, "command": "sleep 120"})).await;
    assert_eq!(long["resultType"], "task", "{long}");
    let long_id = long["taskId"].as_str().unwrap().to_string();
    let working = a.result("tasks/get", json!({"taskId": long_id})).await;
    assert_eq!(working["status"], "working", "{working}");
    let started_cancel = Instant::now();
    let ack = a.result("tasks/cancel", json!({"taskId": long_id})).await;
    assert_eq!(ack, json!({"resultType": "complete"}), "cancel ack must be empty");
    assert!(started_cancel.elapsed() < Duration::from_secs(5), "cancel took {:?}", started_cancel.elapsed());
    let cancelled = b.result("tasks/get", json!({"taskId": long_id})).await;
    assert_eq!(cancelled["status"], "cancelled", "{cancelled}");
    assert_eq!(b.result("tasks/cancel", json!({"taskId": long_id})).await["resultType"], "complete");
    assert_eq!(a.result("tasks/cancel", json!({"taskId": task_id})).await["resultType"], "complete");
    assert_eq!(a.result("tasks/get", json!({"taskId": task_id})).await["status"], "completed");

    // A client requesting a ttlMs gets at most that.
    let mut params = json!({"name": "run_command", "arguments": {"sandbox_id": sandbox_id, "command": "true"}});
    params["_meta"] = json!({ TASKS: {"ttlMs": 5000} });
    let short = a.result("tools/call", params).await;
    assert_eq!(short["resultType"], "task", "{short}");
    assert!(short["ttlMs"].as_u64().is_some_and(|t| t <= 5000), "{short}");
    a.wait_terminal(short["taskId"].as_str().unwrap(), Duration::from_secs(30)).await;

    a.tool_ok("kill_sandbox", json!({"sandbox_id": sandbox_id})).await;
    assert_eq!(b.error_code("tasks/get", json!({"taskId": task_id})).await, -32602, "sandbox gone: not found");
}

#[tokio::test(flavor = "multi_thread")]
async fn mcp_task_survives_gateway_sigkill() {
    let Some((provider, mut gateway)) = start_pair() else { return };
    let client = Modern::new(gateway.mcp_url(), TOKEN_ACME, true);
    let sandbox_id = client.tool_ok("create_sandbox", json!({})).await["sandbox_id"].as_str().unwrap().to_string();
    let started =
        client.tool("run_command", json!({"sandbox_id": sandbox_id, "command": "sleep 3; echo survived"})).await;
    let task_id = started["taskId"].as_str().expect("a task").to_string();

    // SIGKILL: no shutdown, no cleanup.
    gateway.kill9();
    let restarted = Gateway::start_e2b(&provider, &auth_config(), &[]);
    let fresh = Modern::new(restarted.mcp_url(), TOKEN_ACME, true);
    let done = fresh.wait_terminal(&task_id, Duration::from_secs(30)).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["result"]["structuredContent"]["stdout"], "survived\n", "{done}");
    assert_eq!(done["result"]["structuredContent"]["exit_code"], 0, "{done}");
    fresh.tool_ok("kill_sandbox", json!({"sandbox_id": sandbox_id})).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn legacy_session_delete_answers_204_then_404() {
    let Some((_provider, gateway)) = start_pair() else { return };
    let http = reqwest::Client::new();
    let init = http
        .post(gateway.mcp_url())
        .bearer_auth(TOKEN_ACME)
        .header("Accept", "application/json, text/event-stream")
        .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "delete-test", "version": "1"}}}))
        .send()
        .await
        .expect("initialize");
    assert_eq!(init.status().as_u16(), 200);
    let session = init.headers().get("mcp-session-id").and_then(|v| v.to_str().ok()).expect("session id").to_string();
    let delete = |id: String| {
        let http = http.clone();
        let url = gateway.mcp_url();
        async move {
            http.delete(url)
                .bearer_auth(TOKEN_ACME)
                .header("mcp-session-id", id)
                .header("MCP-Protocol-Version", "2025-11-25")
                .send()
                .await
                .expect("DELETE")
                .status()
                .as_u16()
        }
    };
    assert_eq!(delete(session.clone()).await, 204);
    assert_eq!(delete(session).await, 404, "an ended session");
    assert_eq!(delete("no-such-session".into()).await, 404, "an unknown session");
}
