//! Fair shares between tenants (issue 23 §1), against a real `sandbox-mcp serve`
//! with its embedded local provider and two tenants with their own bearer
//! tokens, and no `[limits]` set: tenant A takes everything it can as fast as
//! it can (sandboxes through legacy sessions and sessionless 2026-07-28
//! creates, MCP sessions, `get_task` long-polls, MCP `tasks/get`) while tenant
//! B creates a sandbox, runs a command, starts and reads a task, each within
//! its latency without the flood, measured in the same test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

use crate::common;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::mcp::{try_call, try_connect};
use common::*;
use serde_json::{Value, json};

const TOKEN_A: &str = "fairness-tenant-a-token-0123456789";
const TOKEN_B: &str = "fairness-tenant-b-token-0123456789";
/// The deployment: 12 sandboxes (6 per tenant by default), 64 connections per listener (16 calls
/// and 16 sessions per tenant by default).
const MAX_SANDBOXES: usize = 12;
const MAX_CONNECTIONS: usize = 64;
const SHARE: usize = MAX_SANDBOXES / 2;
const CALLS: usize = MAX_CONNECTIONS / 4;
/// Tenant A's creating clients of each protocol generation, and its long-polls (more than its calls).
const CREATORS: usize = 3;
const LONG_POLLERS: usize = CALLS + 8;
/// B's rounds without and with the flood.
const ROUNDS: usize = 3;

/// How long each of B's steps took.
#[derive(Debug, Clone, Copy, Default)]
struct Round {
    connect: Duration,
    create: Duration,
    run: Duration,
    start: Duration,
    read: Duration,
}

impl Round {
    fn steps(&self) -> [(&'static str, Duration); 5] {
        [
            ("connect", self.connect),
            ("create_sandbox", self.create),
            ("run_command", self.run),
            ("start_task", self.start),
            ("get_task", self.read),
        ]
    }
}

/// Tenant B's normal work: a new session, a sandbox, a command, a task started and read to its end;
/// then the sandbox is killed (so the next round starts from the same state).
async fn b_round(url: &str) -> Round {
    let mut round = Round::default();
    let t = Instant::now();
    let b = connect(url, Some(TOKEN_B)).await;
    round.connect = t.elapsed();
    let t = Instant::now();
    let id = ok(&b, "create_sandbox", json!({})).await["sandbox_id"].as_str().unwrap().to_string();
    round.create = t.elapsed();
    let t = Instant::now();
    let out = ok(&b, "run_command", json!({"command": "echo hello-from-b"})).await;
    round.run = t.elapsed();
    assert_eq!(out["stdout"], json!("hello-from-b\n"), "{out}");
    let t = Instant::now();
    let started = ok(&b, "start_task", json!({"command": "echo task-of-b"})).await;
    round.start = t.elapsed();
    let task_id = started["task_id"].as_str().unwrap().to_string();
    let t = Instant::now();
    let mut view = json!({});
    for _ in 0..20 {
        view =
            ok(&b, "get_task", json!({"sandbox_id": id, "task_id": task_id, "wait_seconds": 10, "limit": 1000})).await;
        if view["state"] != json!("running") {
            break;
        }
    }
    round.read = t.elapsed();
    assert_eq!((view["state"].clone(), view["stdout"].clone()), (json!("succeeded"), json!("task-of-b\n")), "{view}");
    assert_eq!(ok(&b, "kill_sandbox", json!({"sandbox_id": id})).await["killed"], json!(true));
    close(b).await;
    round
}

/// The slowest of each step over `rounds`.
fn slowest(rounds: &[Round]) -> Round {
    let max = |f: fn(&Round) -> Duration| rounds.iter().map(f).max().unwrap_or_default();
    Round {
        connect: max(|r| r.connect),
        create: max(|r| r.create),
        run: max(|r| r.run),
        start: max(|r| r.start),
        read: max(|r| r.read),
    }
}

/// A 2026-07-28 request (no session) of tenant A with the MCP Tasks extension declared; the JSON-RPC answer.
async fn modern(http: &reqwest::Client, url: &str, method: &str, mut params: Value) -> Value {
    params["_meta"] = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientInfo": {"name": "fairness-test", "version": "0"},
        "io.modelcontextprotocol/clientCapabilities": {"extensions": {"io.modelcontextprotocol/tasks": {}}},
    });
    let name = params.get("name").or_else(|| params.get("taskId")).and_then(Value::as_str).unwrap_or("x").to_string();
    let response = http
        .post(url)
        .bearer_auth(TOKEN_A)
        .header("Accept", "application/json, text/event-stream")
        .header("MCP-Protocol-Version", "2026-07-28")
        .header("Mcp-Method", method)
        .header("Mcp-Name", name)
        .json(&json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}))
        .send()
        .await
        .expect("POST /mcp");
    let text = response.text().await.expect("body");
    let data = text.lines().filter_map(|l| l.strip_prefix("data:")).find(|d| d.contains("\"id\""));
    serde_json::from_str(data.unwrap_or(&text).trim()).unwrap_or(Value::Null)
}

/// One of tenant A's creating clients: a legacy session, or sessionless 2026-07-28 requests.
enum Creator {
    Legacy(McpClient),
    Modern(reqwest::Client, String),
}

impl Creator {
    /// One create_sandbox: Ok on success, Err(the refusal) when refused.
    async fn create(&self) -> Result<(), String> {
        match self {
            Creator::Legacy(client) => {
                let result = try_call(client, "create_sandbox", json!({}))
                    .await
                    .unwrap_or_else(|e| panic!("tenant A's create_sandbox broke the protocol: {e}"));
                if result.is_error == Some(true) { Err(text(&result)) } else { Ok(()) }
            }
            Creator::Modern(http, url) => {
                let answer = modern(http, url, "tools/call", json!({"name": "create_sandbox", "arguments": {}})).await;
                let result = &answer["result"];
                assert!(result.is_object(), "tenant A's sessionless create_sandbox: {answer}");
                if result["isError"] == json!(true) {
                    Err(result["content"][0]["text"].as_str().unwrap_or_default().to_string())
                } else {
                    Ok(())
                }
            }
        }
    }
}

/// Tenant A's creating loop until `stop`: every create as soon as the last answered; once refused,
/// the refusal is recorded and the loop keeps asking (20 ms apart).
fn creator(
    client: Creator,
    created: Arc<AtomicUsize>,
    refusal: Arc<std::sync::Mutex<Option<String>>>,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<Creator> {
    tokio::spawn(async move {
        while !stop.load(Ordering::Relaxed) {
            match client.create().await {
                Ok(()) => {
                    created.fetch_add(1, Ordering::Relaxed);
                }
                Err(refused) => {
                    *refusal.lock().unwrap() = Some(refused);
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }
        client
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_tenant_taking_all_it_can_leaves_the_other_its_share_and_latency() {
    require_root!();
    let config = format!(
        "{}[local]\nmax_sandboxes = {MAX_SANDBOXES}\n[server]\nmax_connections = {MAX_CONNECTIONS}\n",
        tokens_config(&[("a", TOKEN_A), ("b", TOKEN_B)])
    );
    let gateway = Gateway::start(&config, &[]);
    let url = gateway.mcp_url();

    // B's latency without any flood (the first round also warms up the template and the pools).
    b_round(&url).await;
    let quiet: Vec<Round> = rounds_of(ROUNDS, || b_round(&url)).await;
    let quiet = slowest(&quiet);

    // A: one sandbox with a long task (for its long-polls) and an MCP task (for tasks/get).
    let a = connect(&url, Some(TOKEN_A)).await;
    let home = ok(&a, "create_sandbox", json!({})).await["sandbox_id"].as_str().unwrap().to_string();
    let long = ok(&a, "start_task", json!({"command": "sleep 600", "timeout": 900})).await;
    let long_task = long["task_id"].as_str().unwrap().to_string();
    let http = reqwest::Client::new();
    let mcp_task = modern(
        &http,
        &url,
        "tools/call",
        json!({"name": "start_task", "arguments": {"sandbox_id": home, "command": "sleep 600", "timeout": 900}}),
    )
    .await;
    let mcp_task_id = mcp_task["result"]["taskId"].as_str().unwrap_or_else(|| panic!("{mcp_task}")).to_string();

    // A fills its sandbox share as fast as it can, through legacy sessions and sessionless creates.
    let stop = Arc::new(AtomicBool::new(false));
    let created = Arc::new(AtomicUsize::new(1));
    let refusal = Arc::new(std::sync::Mutex::new(None::<String>));
    // One of B's rounds runs while A fills its share.
    let during_fill = {
        let url = url.clone();
        tokio::spawn(async move { b_round(&url).await })
    };
    let mut creators = Vec::new();
    for _ in 0..CREATORS {
        let legacy = Creator::Legacy(connect(&url, Some(TOKEN_A)).await);
        let modern = Creator::Modern(reqwest::Client::new(), url.clone());
        for client in [legacy, modern] {
            creators.push(creator(client, Arc::clone(&created), Arc::clone(&refusal), Arc::clone(&stop)));
        }
    }
    let filling = Instant::now();
    while refusal.lock().unwrap().is_none() {
        assert!(filling.elapsed() < Duration::from_secs(120), "A was never refused; it created {created:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let refused = refusal.lock().unwrap().clone().unwrap();
    assert!(
        refused.contains(&format!(
            "limits.max_sandboxes_per_tenant = {SHARE}, the default: local.max_sandboxes = {MAX_SANDBOXES} \
             shared by 2 tenants"
        )) && refused.contains("a slot frees when one is killed"),
        "{refused}"
    );
    assert!(!refused.contains("whole deployment") && !refused.contains("try again"), "{refused}");

    // A opens sessions (each with its event stream) until refused.
    let mut sessions = Vec::new();
    let session_refusal = loop {
        assert!(sessions.len() < 4 * CALLS, "A's sessions were never refused");
        match tokio::time::timeout(Duration::from_secs(20), try_connect(&url, Some(TOKEN_A))).await {
            Ok(Ok(client)) => sessions.push(client),
            Ok(Err(e)) => break e.to_string(),
            Err(_) => panic!("A's initialize #{} hung: the listener is full", sessions.len() + 1),
        }
    };
    assert!(session_refusal.contains("429") || session_refusal.contains("tenant limit"), "{session_refusal}");
    assert_eq!(
        sessions.len() + 1 + CREATORS,
        CALLS,
        "A's sessions: the first, its creators' and these; {session_refusal}"
    );
    // At its session limit, A's sessionless (2026-07-28) requests open no session and still work.
    let listed = modern(&http, &url, "tools/call", json!({"name": "list_sandboxes", "arguments": {}})).await;
    assert_eq!(listed["result"]["structuredContent"]["sandboxes"].as_array().map(Vec::len), Some(SHARE), "{listed}");
    // A holds long-polls: more get_task waits than its calls limit, each re-asked as soon as it answers.
    let polls_refused = Arc::new(std::sync::Mutex::new(None::<String>));
    let polling = Arc::new(AtomicUsize::new(0));
    let mut pollers = Vec::new();
    for _ in 0..LONG_POLLERS {
        let peer = a.peer().clone();
        let (stop, refused, polling) = (Arc::clone(&stop), Arc::clone(&polls_refused), Arc::clone(&polling));
        let args = json!({"sandbox_id": home, "task_id": long_task, "wait_seconds": 30});
        pollers.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                polling.fetch_add(1, Ordering::Relaxed);
                let result = try_call(&peer, "get_task", args.clone()).await.expect("tenant A's get_task");
                polling.fetch_sub(1, Ordering::Relaxed);
                if result.is_error == Some(true) {
                    *refused.lock().unwrap() = Some(text(&result));
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }));
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while polls_refused.lock().unwrap().is_none() {
        assert!(Instant::now() < deadline, "A's long-polls were never refused ({polling:?} in flight)");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let polls_refused = polls_refused.lock().unwrap().clone().unwrap();
    assert!(
        polls_refused.contains(&format!(
            "limits.max_concurrent_calls_per_tenant = {CALLS}, the default: a quarter of server.max_connections \
             = {MAX_CONNECTIONS}"
        )),
        "{polls_refused}"
    );
    // With every call slot of A held by long-polls, A's MCP tasks/get is refused the same way.
    let mut tasks_get_refused = None;
    for _ in 0..50 {
        let answer = modern(&http, &url, "tasks/get", json!({"taskId": mcp_task_id})).await;
        if let Some(message) = answer["error"]["message"].as_str() {
            tasks_get_refused = Some(message.to_string());
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let tasks_get_refused = tasks_get_refused.expect("A's tasks/get went past its calls limit");
    assert!(tasks_get_refused.contains("limits.max_concurrent_calls_per_tenant"), "{tasks_get_refused}");

    // B, meanwhile: the same work, within its normal latency.
    let mut flooded: Vec<Round> = rounds_of(ROUNDS, || b_round(&url)).await;
    flooded.push(during_fill.await.expect("B's round while A filled its share"));
    let flooded = slowest(&flooded);
    println!("B's slowest steps without A's flood: {quiet:?}\nwith it: {flooded:?}");
    for ((step, before), (_, during)) in quiet.steps().into_iter().zip(flooded.steps()) {
        // Not a benchmark: a generous bound that a B queued behind A's creates or 30 s long-polls exceeds.
        let bound = before * 5 + Duration::from_secs(3);
        assert!(during <= bound, "B's {step} took {during:?} during A's flood, {before:?} without it");
    }

    // B can still take its whole share, and no more: A holds no more than its own (with one sandbox of A
    // too many, B's last create would meet the deployment's limit instead of its own).
    let b = connect(&url, Some(TOKEN_B)).await;
    for _ in 0..SHARE {
        ok(&b, "create_sandbox", json!({})).await;
    }
    let b_refused = err(&b, "create_sandbox", json!({})).await;
    assert!(b_refused.contains(&format!("tenant b already has {SHARE} live sandboxes")), "{b_refused}");
    stop.store(true, Ordering::Relaxed);
    for poller in pollers {
        poller.abort();
    }
    let mut clients = vec![b];
    for creator in creators {
        if let Creator::Legacy(client) = creator.await.expect("creator") {
            clients.push(client);
        }
    }
    assert_eq!(created.load(Ordering::Relaxed), SHARE, "A's successful creates");
    for client in clients.into_iter().chain(sessions) {
        close(client).await;
    }
    close(a).await;
}

/// Runs `n` of `make()` one after another (B's rounds are sequential: its latency, not its throughput).
async fn rounds_of<F, Fut>(n: usize, mut make: F) -> Vec<Round>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Round>,
{
    let mut rounds = Vec::with_capacity(n);
    for _ in 0..n {
        rounds.push(make().await);
    }
    rounds
}
