//! Fast tests of the tool layer, in process and without root: the gateway's
//! app (built by [`crate::gateway::server::build_app`], as `serve` builds it) on
//! 127.0.0.1:0, called over real MCP/HTTP by rmcp's client, against a
//! scripted provider — a small axum server answering the E2B API and envd
//! routes the tools use, with faults injected per route (the pattern of
//! `e2b/fault_tests.rs`). What they cover: argument errors before any provider
//! call, "not found" for unknown and other tenants' sandboxes, transient /
//! permanent provider failures, a sandbox gone behind the gateway's back,
//! secrets masked in output, errors and the log, the legacy session's default
//! sandbox, tenant quotas. `cargo test --lib gateway` runs them in seconds.

mod scripted;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResult, ClientCapabilities, ClientConfig, Implementation, ProtocolVersion,
};
use rmcp::service::RunningService;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{RoleClient, ServiceExt};
use serde_json::{Value, json};
use sha2::Digest;

use crate::config::{Config, ProviderKind, TokenEntry};
use crate::e2b::{E2bClient, ProviderEndpoint};
use crate::gateway::server::{GatewayApp, build_app};
use crate::gateway::tools::access::META_DEPLOYMENT;
use scripted::{Shared, scripted_provider, serve};

const PROVIDER_KEY: &str = "e2b_scripted0123456789abcdef0123456789abcd";
const SECRET: &str = "hunter22-configured-secret";
const ALICE: &str = "alice-token-0123456789";
const BOB: &str = "bob-token-0123456789";

fn sha256_hex(token: &str) -> String {
    hex::encode(sha2::Sha256::digest(token.as_bytes()))
}

/// A gateway app on a scripted provider, served on a loopback port.
struct Harness {
    provider: Shared,
    url: String,
    app: Arc<super::GatewayCore>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Harness {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

async fn harness(tweak: impl FnOnce(&mut Config)) -> Harness {
    let (provider, provider_url, provider_task) = scripted_provider().await;
    let mut config = Config::default();
    config.provider.kind = ProviderKind::E2b;
    config.provider.api_url = provider_url.to_string();
    config.provider.sandbox_url = provider_url.to_string();
    config.auth.tokens = vec![
        TokenEntry { tenant: "alice".into(), sha256: sha256_hex(ALICE) },
        TokenEntry { tenant: "bob".into(), sha256: sha256_hex(BOB) },
    ];
    config.tasks.secrets = vec![SECRET.into(), "abc".into()];
    config.sandbox.renew_on_use_secs = 0;
    tweak(&mut config);
    let client = E2bClient::new(ProviderEndpoint {
        api_url: provider_url.clone(),
        sandbox_url: Some(provider_url),
        domain: "localhost".into(),
        api_key: Some(PROVIDER_KEY.into()),
        request_timeout: Duration::from_secs(5),
    })
    .unwrap();
    let GatewayApp { router, core, .. } = build_app(Arc::new(config), client, Some(PROVIDER_KEY), false).await.unwrap();
    let (addr, gateway_task) = serve(router).await;
    Harness { provider, url: format!("http://{addr}/mcp"), app: core, tasks: vec![provider_task, gateway_task] }
}

type Client = RunningService<RoleClient, ClientConfig>;

impl Harness {
    /// A legacy (session) MCP client of a tenant.
    async fn session(&self, token: &str) -> Client {
        let config = StreamableHttpClientTransportConfig::with_uri(self.url.clone()).auth_header(token.to_owned());
        let info = ClientConfig::new(ClientCapabilities::default(), Implementation::new("tool-tests", "0"))
            .with_protocol_version(ProtocolVersion::V_2025_11_25);
        info.serve(StreamableHttpClientTransport::from_config(config)).await.expect("MCP initialize")
    }

    /// A sessionless (2026-07-28) tools/call; returns the JSON-RPC result.
    async fn stateless_call(&self, token: &str, tool: &str, arguments: Value) -> Value {
        let meta = json!({
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientInfo": {"name": "tool-tests", "version": "0"},
            "io.modelcontextprotocol/clientCapabilities": {},
        });
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": tool, "arguments": arguments, "_meta": meta}});
        let response = reqwest::Client::new()
            .post(&self.url)
            .bearer_auth(token)
            .header("Accept", "application/json, text/event-stream")
            .header("MCP-Protocol-Version", "2026-07-28")
            .header("Mcp-Method", "tools/call")
            .header("Mcp-Name", tool)
            .json(&body)
            .send()
            .await
            .unwrap();
        let answer: Value = response.json().await.unwrap();
        answer["result"].clone()
    }
}

async fn call(client: &Client, tool: &str, args: Value) -> CallToolResult {
    let Value::Object(map) = args else { panic!("arguments must be an object") };
    let request = client.call_tool(CallToolRequestParams::new(tool.to_owned()).with_arguments(map));
    tokio::time::timeout(Duration::from_secs(20), request).await.expect("answer in time").expect("tools/call")
}

fn text(result: &CallToolResult) -> String {
    result.content.iter().filter_map(|c| c.as_text().map(|t| t.text.clone())).collect::<Vec<_>>().join("\n")
}

async fn ok(client: &Client, tool: &str, args: Value) -> Value {
    let result = call(client, tool, args).await;
    assert_ne!(result.is_error, Some(true), "{tool} failed: {}", text(&result));
    result.structured_content.clone().expect("structured content")
}

async fn err(client: &Client, tool: &str, args: Value) -> String {
    let result = call(client, tool, args).await;
    assert_eq!(result.is_error, Some(true), "{tool} should have failed: {:?}", result.structured_content);
    text(&result)
}

fn not_found_sentence(id: &str) -> String {
    format!(
        "sandbox {id} not found: it does not exist, has been killed or expired, or is not yours; call list_sandboxes \
         to see your sandboxes or create_sandbox for a new one"
    )
}

#[tokio::test]
async fn argument_errors_are_refused_before_any_provider_call() {
    let h = harness(|_| {}).await;
    let alice = h.session(ALICE).await;
    let cases = [
        ("create_sandbox", json!({"template": "a b"}), "invalid template \"a b\""),
        ("create_sandbox", json!({"timeout": 0}), "timeout must be between 1 and"),
        ("create_sandbox", json!({"metadata": {"sandbox_mcp_tenant": "bob"}}), "is reserved"),
        ("create_sandbox", json!({"network": {"allow_out": ["127.0.0.1"]}}), "loopback or link-local"),
        ("create_sandbox", json!({"network": {"allow_out": ["::ffff:127.0.0.1"]}}), "loopback or link-local"),
        ("create_sandbox", json!({"network": {"allow_out": ["::127.0.0.1"]}}), "loopback or link-local"),
        ("create_sandbox", json!({"network": {"allow_out": ["64:ff9b::a9fe:4d01"]}}), "loopback or link-local"),
        ("run_command", json!({"command": " ", "sandbox_id": "sbx1"}), "command must not be empty"),
        ("run_command", json!({"command": "true", "sandbox_id": "bad id!"}), "invalid sandbox_id"),
        ("run_command", json!({"command": "true", "envs": {"1X": "v"}}), "not a valid variable name"),
        ("read_file", json!({"path": "", "sandbox_id": "sbx1"}), "path must not be empty"),
        ("write_file", json!({"path": "/a", "content": "!!", "encoding": "base64"}), "not valid base64"),
        ("list_files", json!({"depth": 11, "sandbox_id": "sbx1"}), "depth must be between 1 and 10"),
        ("get_task", json!({"sandbox_id": "sbx1", "task_id": "nope"}), "task_id must be exactly 32"),
        ("start_task", json!({"command": "true", "timeout": 0}), "timeout must be between 1 and 3600"),
    ];
    for (tool, args, expected) in cases {
        let message = err(&alice, tool, args.clone()).await;
        assert!(message.contains(expected), "{tool} {args}: {message}");
    }
    assert!(h.provider.requests().is_empty(), "argument errors reached the provider: {:?}", h.provider.requests());
}

#[tokio::test]
async fn other_tenants_and_unknown_sandboxes_are_not_found_alike() {
    let h = harness(|_| {}).await;
    let (alice, bob) = (h.session(ALICE).await, h.session(BOB).await);
    let created = ok(&alice, "create_sandbox", json!({})).await;
    let id = created["sandbox_id"].as_str().unwrap().to_owned();
    h.provider.add("sbx-elsewhere", "alice"); // alice's, created by another client of the provider
    for (tool, args) in [
        ("run_command", json!({"command": "id", "sandbox_id": id})),
        ("kill_sandbox", json!({"sandbox_id": id})),
        ("connect_sandbox", json!({"sandbox_id": id})),
        ("read_file", json!({"path": "/etc/hostname", "sandbox_id": id})),
    ] {
        assert_eq!(err(&bob, tool, args).await, not_found_sentence(&id), "{tool} by another tenant");
    }
    // An id that does not exist reads exactly the same (ids cannot be probed).
    assert_eq!(err(&bob, "kill_sandbox", json!({"sandbox_id": "sbx9999"})).await, not_found_sentence("sbx9999"));
    // The task tools word it for tasks.
    let message = err(&bob, "list_tasks", json!({"sandbox_id": id})).await;
    assert_eq!(message, format!("sandbox {id} not found or no longer running; its tasks are gone"));
    // Bob's list does not show it; alice's sandbox is untouched and still hers.
    assert_eq!(ok(&bob, "list_sandboxes", json!({})).await["sandboxes"], json!([]));
    assert!(h.provider.exists(&id));
    let mine = ok(&alice, "list_sandboxes", json!({})).await;
    let ids: Vec<&str> =
        mine["sandboxes"].as_array().unwrap().iter().filter_map(|s| s["sandbox_id"].as_str()).collect();
    assert!(ids.contains(&id.as_str()) && ids.contains(&"sbx-elsewhere"), "{mine}");
    assert_eq!(ok(&alice, "run_command", json!({"command": "id", "sandbox_id": id})).await["exit_code"], 0);
    // A sandbox of another deployment is not found either, even for its tenant.
    h.provider
        .sandboxes
        .lock()
        .unwrap()
        .get_mut("sbx-elsewhere")
        .unwrap()
        .metadata
        .insert(META_DEPLOYMENT.into(), "other-deployment".into());
    assert_eq!(
        err(&alice, "connect_sandbox", json!({"sandbox_id": "sbx-elsewhere"})).await,
        not_found_sentence("sbx-elsewhere")
    );
}

#[tokio::test]
async fn provider_failures_say_whether_to_retry() {
    let h = harness(|_| {}).await;
    let alice = h.session(ALICE).await;
    h.provider.inject("create", 503, json!({"code": 503, "message": "overloaded"}));
    let message = err(&alice, "create_sandbox", json!({})).await;
    assert!(message.starts_with("could not create a sandbox from template \"base\": "), "{message}");
    assert!(message.contains("unreachable or busy") && message.contains("try again in a few seconds"), "{message}");
    assert!(message.contains("overloaded"), "the provider's reason is kept: {message}");

    h.provider.inject("create", 400, json!({"code": 400, "message": "template base is broken"}));
    let message = err(&alice, "create_sandbox", json!({})).await;
    assert!(message.contains("provider API error (HTTP 400): template base is broken"), "{message}");
    assert!(!message.contains("try again"), "a permanent failure is not worth retrying: {message}");

    h.provider.inject("create", 429, json!({"code": 429, "message": "reached the maximum of 5 sandboxes"}));
    let message = err(&alice, "create_sandbox", json!({})).await;
    assert!(message.contains("the sandbox limit of the whole deployment is reached"), "{message}");
    assert!(message.contains("kill_sandbox") && message.contains("local.max_sandboxes"), "{message}");

    h.provider.inject("list", 500, json!({"code": 500, "message": "database down"}));
    let message = err(&alice, "list_sandboxes", json!({})).await;
    assert!(message.starts_with("could not list sandboxes: ") && message.contains("database down"), "{message}");

    // Each counted as a provider error, by operation.
    let metrics = h.app.metrics.render().unwrap();
    let line = metrics.lines().find(|l| l.contains("provider_errors") && l.contains("create_sandbox")).unwrap_or("");
    assert!(line.trim_end().ends_with(" 3"), "{line}\n{metrics}");
}

#[tokio::test]
async fn a_sandbox_gone_behind_the_gateway_is_not_found_and_forgotten() {
    let h = harness(|_| {}).await;
    let alice = h.session(ALICE).await;
    let id = ok(&alice, "create_sandbox", json!({})).await["sandbox_id"].as_str().unwrap().to_owned();
    assert_eq!(ok(&alice, "run_command", json!({"command": "true"})).await["sandbox_id"], json!(id));
    h.provider.sandboxes.lock().unwrap().remove(&id); // expired
    assert_eq!(err(&alice, "run_command", json!({"command": "true"})).await, not_found_sentence(&id));
    // Forgotten: it is no longer this session's default sandbox.
    let message = err(&alice, "run_command", json!({"command": "true"})).await;
    assert!(message.starts_with("no sandbox_id given and this session has no default sandbox"), "{message}");
    assert_eq!(ok(&alice, "list_sandboxes", json!({})).await["default_sandbox"], Value::Null);
}

/// The gateway's log (`sandbox_mcp` at INFO, the production default) of every test in this
/// process, captured by one global subscriber: a thread-local one would miss events whose callsite
/// another test's thread saw first.
#[derive(Clone, Default)]
struct LogBuffer(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for LogBuffer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogBuffer {
    type Writer = LogBuffer;
    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

impl LogBuffer {
    fn global() -> &'static LogBuffer {
        static LOGS: std::sync::OnceLock<LogBuffer> = std::sync::OnceLock::new();
        LOGS.get_or_init(|| {
            let logs = LogBuffer::default();
            let subscriber = tracing_subscriber::fmt()
                .with_writer(logs.clone())
                .with_ansi(false)
                .with_env_filter(tracing_subscriber::EnvFilter::new("sandbox_mcp=info"))
                .finish();
            tracing::subscriber::set_global_default(subscriber).expect("no other global subscriber in unit tests");
            logs
        })
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

#[tokio::test]
async fn secrets_are_masked_in_output_errors_and_the_log() {
    let logs = LogBuffer::global();
    let h = harness(|_| {}).await;
    let alice = h.session(ALICE).await;
    let id = ok(&alice, "create_sandbox", json!({})).await["sandbox_id"].as_str().unwrap().to_owned();
    let out = ok(&alice, "run_command", json!({"command": format!("echo {SECRET} {PROVIDER_KEY} abc")})).await;
    assert_eq!(out["stdout"], json!("echo *** *** abc\n"), "configured secret and provider key masked: {out}");
    h.provider.files.lock().unwrap().insert((id.clone(), "/home/user/notes".into()), format!("k={SECRET}\n").into());
    let read = ok(&alice, "read_file", json!({"path": "/home/user/notes"})).await;
    assert_eq!(read["content"], json!("k=***\n"));
    // An error quoting a secret (here: a path the agent made of it) is masked too.
    let message = err(&alice, "read_file", json!({"path": format!("/home/user/{SECRET}.txt")})).await;
    assert_eq!(message, format!("/home/user/***.txt: no such file or directory in sandbox {id}"));
    // A secret pasted as a sandbox id is masked in the answer and in the log line's sandbox field.
    let message = err(&alice, "run_command", json!({"command": "true", "sandbox_id": SECRET})).await;
    assert_eq!(message, not_found_sentence("***"));
    // Values under the minimum length ("abc") are reported, not masked.
    assert_eq!(h.app.masker.too_short(), 1);
    let log = logs.text();
    assert!(log.contains("/home/user/***.txt: no such file"), "masked error not logged:\n{log}");
    assert!(log.contains("sandbox=***"), "masked sandbox id not logged:\n{log}");
    // Each tool-call line carries the HTTP request's id (the gateway's request-id layer).
    let tool_lines: Vec<&str> =
        log.lines().filter(|l| l.contains("tool call") && l.contains("tool=\"run_command\"")).collect();
    assert!(!tool_lines.is_empty(), "no run_command line:\n{log}");
    assert!(
        tool_lines.iter().all(|l| l
            .split("request=")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .is_some_and(|id| id.len() == 36 && id.bytes().filter(|&b| b == b'-').count() == 4)),
        "a tool-call line without its request id:\n{log}"
    );
    assert!(!log.contains(SECRET), "a configured secret reached the log:\n{log}");
    assert!(!log.contains(PROVIDER_KEY), "the provider key reached the log:\n{log}");
}

#[tokio::test]
async fn the_session_default_sandbox_serves_calls_without_an_id() {
    let h = harness(|_| {}).await;
    let alice = h.session(ALICE).await;
    let message = err(&alice, "run_command", json!({"command": "true"})).await;
    assert_eq!(
        message,
        "no sandbox_id given and this session has no default sandbox: call create_sandbox (new sandbox) or \
         connect_sandbox (existing one) first, or pass sandbox_id"
    );
    let first = ok(&alice, "create_sandbox", json!({})).await["sandbox_id"].as_str().unwrap().to_owned();
    h.provider.add("sbx-existing", "alice");
    assert_eq!(ok(&alice, "run_command", json!({"command": "true"})).await["sandbox_id"], json!(first));
    let connected = ok(&alice, "connect_sandbox", json!({"sandbox_id": "sbx-existing"})).await;
    assert_eq!(connected["owned"], json!(false));
    assert_eq!(ok(&alice, "run_command", json!({"command": "true"})).await["sandbox_id"], json!("sbx-existing"));
    assert!(h.provider.requests().contains(&"start sbx-existing".to_owned()));
    let listed = ok(&alice, "list_sandboxes", json!({})).await;
    assert_eq!(listed["default_sandbox"], json!("sbx-existing"));
    // Another session of the same tenant has its own (empty) default.
    let other = h.session(ALICE).await;
    assert!(err(&other, "read_file", json!({"path": "/x"})).await.starts_with("no sandbox_id given"));
}

#[tokio::test]
async fn sessionless_calls_need_a_sandbox_id() {
    let h = harness(|_| {}).await;
    let result = h.stateless_call(ALICE, "run_command", json!({"command": "true"})).await;
    assert_eq!(result["isError"], json!(true), "{result}");
    let message = result["content"][0]["text"].as_str().unwrap_or_default();
    assert!(message.starts_with("sandbox_id is required: requests of MCP 2026-07-28 have no session"), "{message}");
    let created = h.stateless_call(ALICE, "create_sandbox", json!({})).await;
    let id = created["structuredContent"]["sandbox_id"].as_str().unwrap().to_owned();
    let theirs = h.stateless_call(BOB, "run_command", json!({"command": "true", "sandbox_id": id})).await;
    assert_eq!(theirs["content"][0]["text"], json!(not_found_sentence(&id)), "{theirs}");
    let mine = h.stateless_call(ALICE, "run_command", json!({"command": "true", "sandbox_id": id})).await;
    assert_eq!(mine["structuredContent"]["exit_code"], json!(0), "{mine}");
}

#[tokio::test]
async fn without_a_configured_limit_each_tenant_gets_its_share_of_the_deployment() {
    // Two tenants on an E2B provider: 20 assumed sandboxes, 10 each; stateless creates count too.
    let h = harness(|_| {}).await;
    let alice = h.session(ALICE).await;
    for _ in 0..5 {
        ok(&alice, "create_sandbox", json!({})).await;
        let created = h.stateless_call(ALICE, "create_sandbox", json!({})).await;
        assert!(created["structuredContent"]["sandbox_id"].is_string(), "{created}");
    }
    let refused = h.stateless_call(ALICE, "create_sandbox", json!({})).await;
    let message = refused["content"][0]["text"].as_str().unwrap_or_default();
    assert!(
        message.starts_with(
            "tenant limit reached: tenant alice already has 10 live sandboxes \
             (limits.max_sandboxes_per_tenant = 10, the default: 20 sandboxes (E2B's Hobby plan) shared by 2 tenants)"
        ),
        "{message}"
    );
    let bob = h.session(BOB).await;
    ok(&bob, "create_sandbox", json!({})).await;
}

#[tokio::test]
async fn tenant_sandbox_quota_is_enforced_with_an_actionable_sentence() {
    let h = harness(|c| c.limits.max_sandboxes_per_tenant = Some(1)).await;
    let (alice, bob) = (h.session(ALICE).await, h.session(BOB).await);
    let id = ok(&alice, "create_sandbox", json!({})).await["sandbox_id"].as_str().unwrap().to_owned();
    let message = err(&alice, "create_sandbox", json!({})).await;
    assert_eq!(
        message,
        "tenant limit reached: tenant alice already has 1 live sandboxes (limits.max_sandboxes_per_tenant = 1); \
         a slot frees when one is killed (kill_sandbox; list_sandboxes shows yours), when the MCP session that \
         created it ends (unless a task was started in it), or when it reaches its deadline; then create again"
    );
    ok(&bob, "create_sandbox", json!({})).await; // per tenant
    assert_eq!(ok(&alice, "kill_sandbox", json!({"sandbox_id": id})).await["killed"], json!(true));
    ok(&alice, "create_sandbox", json!({})).await;
}

#[tokio::test]
async fn snapshots_and_forks_are_checked_named_and_kept_per_tenant() {
    use crate::gateway::tools::snapshot::snapshot_prefix;
    let h = harness(|c| {
        c.limits.max_forks_per_call = 2;
        c.limits.max_sandboxes_per_tenant = Some(4);
        c.limits.max_snapshots_per_tenant = Some(1);
    })
    .await;
    let (alice, bob) = (h.session(ALICE).await, h.session(BOB).await);
    // Argument errors, before any provider call.
    for (tool, args, expected) in [
        ("snapshot_sandbox", json!({"sandbox_id": "sbx1", "name": "-x"}), "invalid name \"-x\""),
        ("snapshot_sandbox", json!({"sandbox_id": "sbx1", "name": "a".repeat(47)}), "name must be 1-46"),
        ("fork_sandbox", json!({"sandbox_id": "sbx1", "count": 3}), "count must be between 1 and 2"),
        ("fork_sandbox", json!({"sandbox_id": "sbx1", "timeout": 0}), "timeout must be between 1 and"),
        ("delete_snapshot", json!({"snapshot_id": "a b"}), "invalid snapshot_id \"a b\""),
        ("create_sandbox", json!({"metadata": {"fork.parent": "sbx9"}}), "\"fork.parent\" is reserved"),
    ] {
        let message = err(&alice, tool, args.clone()).await;
        assert!(message.contains(expected), "{tool} {args}: {message}");
    }
    assert!(h.provider.requests().is_empty(), "argument errors reached the provider: {:?}", h.provider.requests());

    let parent = ok(&alice, "create_sandbox", json!({})).await["sandbox_id"].as_str().unwrap().to_owned();
    let prefix = snapshot_prefix("default", "alice");
    let snap = ok(&alice, "snapshot_sandbox", json!({"name": "s1"})).await;
    assert_eq!(snap["name"], json!(format!("{prefix}s1")));
    assert_eq!(snap["snapshot_id"], json!(format!("{prefix}s1:default")));
    let sent = format!("snapshot {parent} {{\"name\":\"{prefix}s1\",\"memory\":false}}");
    assert!(h.provider.requests().contains(&sent), "always a filesystem snapshot: {:?}", h.provider.requests());
    let taken = err(&alice, "snapshot_sandbox", json!({"name": "s1"})).await;
    assert!(taken.starts_with("a snapshot named \"s1\" already exists: choose another name"), "{taken}");
    // The tenant's snapshot limit (one here): a new name is refused before the provider is asked.
    let before = h.provider.requests().len();
    let over = err(&alice, "snapshot_sandbox", json!({"name": "s2"})).await;
    assert!(over.starts_with("tenant limit reached: tenant alice already keeps 1 snapshots"), "{over}");
    assert!(over.contains("limits.max_snapshots_per_tenant = 1"), "{over}");
    assert!(!h.provider.requests()[before..].iter().any(|r| r.starts_with("snapshot ")), "the over-limit one was sent");

    // Bob: alice's snapshot is an unknown template (no create is sent), not listed, not deletable;
    // another tenant's prefix is refused without asking the provider.
    let bob_prefix = snapshot_prefix("default", "bob");
    for template in [format!("{prefix}s1"), format!("{prefix}s1:default"), format!("{prefix}never-made")] {
        let message = err(&bob, "create_sandbox", json!({"template": template})).await;
        assert!(message.starts_with(&format!("template {template:?} not found: call list_templates")), "{message}");
    }
    assert!(!h.provider.requests().iter().any(|r| r.starts_with(&format!("create {prefix}"))), "bob's create was sent");
    assert_eq!(ok(&bob, "list_snapshots", json!({})).await["snapshots"], json!([]));
    let message = err(&bob, "delete_snapshot", json!({"snapshot_id": format!("{prefix}s1:default")})).await;
    assert!(message.starts_with(&format!("snapshot \"{prefix}s1:default\" not found")), "{message}");
    assert!(!h.provider.requests().iter().any(|r| r.starts_with("delete snapshot")), "bob's delete was sent");
    assert!(!prefix.starts_with(&bob_prefix));
    // Alice creates from it (by name), lists it, deletes it.
    ok(&alice, "create_sandbox", json!({"template": format!("{prefix}s1")})).await;
    let listed = ok(&alice, "list_snapshots", json!({})).await;
    assert_eq!(
        listed["snapshots"],
        json!([{"snapshot_id": format!("{prefix}s1:default"), "name": format!("{prefix}s1")}])
    );

    // Forks: owned, with their parent; the default stays the created sandbox; the quota counts them.
    let forked = ok(&alice, "fork_sandbox", json!({"sandbox_id": parent, "count": 2})).await;
    assert_eq!((forked["created"].clone(), forked["owned"].clone()), (json!(2), json!(true)), "{forked}");
    assert_eq!(forked["carries"], json!("no processes (scripted)"), "the provider's own words");
    let forks: Vec<String> =
        forked["forks"].as_array().unwrap().iter().map(|f| f["sandbox_id"].as_str().unwrap().to_owned()).collect();
    let listed = ok(&alice, "list_sandboxes", json!({})).await;
    for fork in &forks {
        let entry = listed["sandboxes"].as_array().unwrap().iter().find(|s| s["sandbox_id"] == json!(fork)).unwrap();
        assert_eq!((entry["parent"].clone(), entry["session_roles"].clone()), (json!(parent), json!(["owned"])));
        assert_eq!(entry["metadata"], json!({}), "fork.* keys are not the user's metadata: {entry}");
    }
    let message = err(&alice, "fork_sandbox", json!({"sandbox_id": parent})).await;
    assert!(message.starts_with("tenant limit reached: tenant alice has 4 live sandboxes and 1 forks"), "{message}");
    assert_eq!(err(&bob, "fork_sandbox", json!({"sandbox_id": parent})).await, not_found_sentence(&parent));

    // When every fork fails, the call fails with the provider's reason, classified.
    let deleted = ok(&alice, "delete_snapshot", json!({"snapshot_id": format!("{prefix}s1")})).await;
    assert_eq!(deleted, json!({"snapshot_id": format!("{prefix}s1:default"), "deleted": true}));
    ok(&alice, "kill_sandbox", json!({"sandbox_id": forks[0]})).await;
    h.provider.inject("fork", 201, json!([{"error": {"code": 429, "message": "reached the maximum of 5 sandboxes"}}]));
    let message = err(&alice, "fork_sandbox", json!({"sandbox_id": parent})).await;
    assert!(message.starts_with(&format!("could not fork sandbox {parent}: the sandbox limit")), "{message}");
    // Sessionless: not owned, with its lifetime.
    let loose = h.stateless_call(ALICE, "fork_sandbox", json!({"sandbox_id": parent})).await;
    assert_eq!(loose["structuredContent"]["owned"], json!(false), "{loose}");
    assert!(loose["structuredContent"]["lifetime"].as_str().unwrap().contains("kill_sandbox"), "{loose}");
}
