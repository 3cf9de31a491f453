//! Legacy MCP sessions in Redis (`[sessions] store = "redis://…"`): two or
//! more real `serve` replicas on one real `sandbox-mcp provider` and one real
//! `redis-server` (started here on a free port in a temp dir, killed at the
//! end). Kill calls are counted in the provider's own log.
//!
//! Needs root (the provider) and `redis-server` (installed by scripts/test.sh);
//! the Python test also needs `$SANDBOX_MCP_PYTHON` (mcp==1.30.0).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

use crate::common;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::redis_server::Redis;
use common::*;
use serde_json::json;

/// The test's redis-server, None after a loud skip when redis-server is not installed.
/// `persistent` only for a test that stops and starts it again: its data is then synced to disk on
/// every write, which a busy disk can hold up for long enough to turn a call into the retryable 503
/// that the tests without an outage must never see (a CI run failed with such a 503; the slow fsync
/// is the likely cause, not a proven one).
fn start_redis(persistent: bool) -> Option<Redis> {
    require_command!("redis-server", None);
    Some(Redis::start(persistent))
}

/// A `sandbox-mcp provider` whose log is captured (to count the kill calls it receives).
struct CountingProvider {
    inner: Provider,
}

impl CountingProvider {
    fn start() -> Self {
        let inner = Provider::builder().log_filter("warn,sandbox_mcp::local::api=info").echo(false).start();
        Self { inner }
    }

    /// Kill calls the provider received for `sandbox_id`.
    fn kills(&self, sandbox_id: &str) -> usize {
        self.inner.log.text().lines().filter(|l| l.contains("kill requested") && l.contains(sandbox_id)).count()
    }
}

/// The replicas' config: `timeout_ms` 2000, so that a busy CI machine stalling a replica or Redis for a
/// moment does not turn into a 503 in a test that is not about an outage (the outage test uses 500).
fn redis_config(redis: &Redis, prefix: &str, idle_secs: u64) -> String {
    redis_config_with_timeout(redis, prefix, idle_secs, 2000)
}

fn redis_config_with_timeout(redis: &Redis, prefix: &str, idle_secs: u64, timeout_ms: u64) -> String {
    format!(
        "[server]\nsession_idle_timeout_secs = {idle_secs}\n[sessions]\nstore = \"{}\"\nkey_prefix = \"{prefix}\"\n\
         sweep_interval_secs = 1\ncleanup_lease_secs = 3\ntimeout_ms = {timeout_ms}\n",
        redis.url()
    )
}

fn replica(provider: &CountingProvider, config: &str) -> Gateway {
    Gateway::start_e2b(&provider.inner, config, &[])
}

fn unique_prefix(test: &str) -> String {
    format!("t{}-{test}", std::process::id())
}

/// The only session id in Redis (the tests run one session per prefix).
fn session_ids(redis: &Redis, prefix: &str) -> Vec<String> {
    redis
        .cli(&["ZRANGE", &format!("{prefix}:expiry"), "0", "-1"])
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(str::to_string)
        .collect()
}

/// How long "exactly once" watches for a second kill after a session's cleanup is over (nothing of
/// it left in Redis): one sweep interval (`sweep_interval_secs = 1`) and a margin, in which another
/// replica's sweep would have cleaned up again had the lease let it. A fixed wait is the check here.
const QUIET_AFTER_CLEANUP: Duration = Duration::from_millis(1200);

/// Waits until the session's cleanup is over (it is gone from Redis, so no replica can take it up
/// again), then [`QUIET_AFTER_CLEANUP`]; false when the session stays in Redis.
async fn cleanup_over(redis: &Redis, prefix: &str) -> bool {
    let gone = wait_until(Duration::from_secs(20), || session_ids(redis, prefix).is_empty()).await;
    tokio::time::sleep(QUIET_AFTER_CLEANUP).await;
    gone
}

/// Wall-clock milliseconds, the clock of the session deadlines in Redis.
fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

async fn wait_until(timeout: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if check() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    check()
}

#[test]
fn python_client_session_moves_between_replicas() {
    let python = require_env!("SANDBOX_MCP_PYTHON", "a python with mcp==1.30.0");
    require_root!();
    let Some(redis) = start_redis(false) else { return };
    let provider = CountingProvider::start();
    let prefix = unique_prefix("py");
    let config = redis_config(&redis, &prefix, 120);
    let mut r1 = replica(&provider, &config);
    let r2 = replica(&provider, &config);
    let pid = r1.pid();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/interop/redis_sessions.py");
    let output = Command::new(python)
        .arg(script)
        .arg(r1.base())
        .arg(r2.base())
        .arg(pid.to_string())
        .output()
        .expect("run python");
    let stdout = String::from_utf8_lossy(&output.stdout).to_string();
    let stderr = String::from_utf8_lossy(&output.stderr);
    println!("{stdout}");
    let logs = format!("replica 1:\n{}\nreplica 2:\n{}", r1.log_text(), r2.log_text());
    assert!(output.status.success(), "python session failed:\n{stdout}\n{stderr}\n{logs}");
    let summary = stdout.lines().last().unwrap_or_default();
    assert!(summary.ends_with(" passed, 0 failed") && !summary.starts_with("0 passed"), "{summary}");
    // The session's DELETE (sent to replica 2) killed its sandbox exactly once.
    let sandbox = stdout.lines().find_map(|l| l.strip_prefix("SANDBOX ")).expect("sandbox id").trim().to_string();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        assert!(wait_gone(&provider.inner.client(), &sandbox, Duration::from_secs(20)).await, "{logs}");
        assert!(cleanup_over(&redis, &prefix).await, "the session stays in Redis after its DELETE\n{logs}");
    });
    assert_eq!(provider.kills(&sandbox), 1, "the session's sandbox must be killed exactly once\n{logs}");
    let task_sandbox =
        stdout.lines().find_map(|l| l.strip_prefix("TASK_SANDBOX ")).expect("task sandbox id").trim().to_string();
    assert_eq!(provider.kills(&task_sandbox), 0, "a retained sandbox is never killed\n{logs}");
    r1.wait_exit(Duration::from_secs(10)); // SIGKILLed by the script
}

#[test]
fn expiry_cleans_up_once_across_replicas_after_a_crash_and_a_dead_lease() {
    require_root!();
    let Some(redis) = start_redis(false) else { return };
    let provider = CountingProvider::start();
    let prefix = unique_prefix("expiry");
    let config = redis_config(&redis, &prefix, 4);
    let mut r1 = replica(&provider, &config);
    let r2 = replica(&provider, &config);
    let r3 = replica(&provider, &config);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let client = connect(&r1.mcp_url(), None).await;
        let a = ok(&client, "create_sandbox", empty()).await["sandbox_id"].as_str().unwrap().to_string();
        let c = ok(&client, "create_sandbox", empty()).await["sandbox_id"].as_str().unwrap().to_string();
        let b = ok(&client, "create_sandbox", empty()).await["sandbox_id"].as_str().unwrap().to_string();
        ok(&client, "start_task", json!({ "command": "sleep 600" })).await; // retains b (the default)
        let ids = session_ids(&redis, &prefix);
        assert_eq!(ids.len(), 1, "one session in Redis: {ids:?}");
        let session = ids[0].clone();
        // Replica 1 crashes (no shutdown, no DELETE).
        r1.kill9();
        drop(client);
        // A replica that died midway through this session's cleanup: it killed c and holds the lease.
        assert!(provider.inner.client().kill_sandbox(&c).await.unwrap());
        redis.cli(&["SREM", &format!("{prefix}:s:{session}:owned"), &c]);
        let lease = format!("{prefix}:s:{session}:lease");
        assert_eq!(redis.cli(&["SET", &lease, "dead-replica", "PX", "6000"]).trim(), "OK");
        // While the dead replica's lease lasts (6 s), nobody cleans up: checked once the session is past
        // its idle deadline (4 s) and each replica has swept since. A fixed wait is the check here.
        let expires = deadline_of(&redis, &prefix, &session);
        assert!(expires > 0, "session deadline in Redis");
        tokio::time::sleep(Duration::from_millis(expires.saturating_sub(now_ms())) + QUIET_AFTER_CLEANUP).await;
        assert!(sandbox_exists(&provider.inner.client(), &a).await, "cleaned up under another replica's lease");
        // Then a survivor takes it over: a killed once, b (retained) kept, c not killed again.
        let logs = || format!("r2:\n{}\nr3:\n{}", r2.log_text(), r3.log_text());
        assert!(wait_gone(&provider.inner.client(), &a, Duration::from_secs(20)).await, "{}", logs());
        assert!(
            wait_until(Duration::from_secs(10), || session_ids(&redis, &prefix).is_empty()).await,
            "the session stays in Redis after its cleanup\n{}",
            logs()
        );
        tokio::time::sleep(QUIET_AFTER_CLEANUP).await; // then no second kill (see the constant)
        assert_eq!(provider.kills(&a), 1, "owned sandbox killed exactly once\n{}", logs());
        assert_eq!(provider.kills(&c), 1, "a sandbox the dead replica killed is not killed again\n{}", logs());
        assert_eq!(provider.kills(&b), 0, "a retained sandbox is never killed\n{}", logs());
        assert!(sandbox_exists(&provider.inner.client(), &b).await);
        assert_eq!(redis.cli(&["EXISTS", &format!("{prefix}:s:{session}")]).trim(), "0");
        let cleaners = [&r2, &r3].iter().filter(|r| r.log_text().contains("session ended; killed")).count();
        assert_eq!(cleaners, 1, "exactly one replica ran the cleanup\n{}", logs());
        let _ = provider.inner.client().kill_sandbox(&b).await;
    });
}

#[test]
fn delete_on_another_replica_ends_the_session_everywhere() {
    require_root!();
    let Some(redis) = start_redis(false) else { return };
    let provider = CountingProvider::start();
    let prefix = unique_prefix("delete");
    let config = redis_config(&redis, &prefix, 120);
    let r1 = replica(&provider, &config);
    let r2 = replica(&provider, &config);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let client = connect(&r1.mcp_url(), None).await;
        let a = ok(&client, "create_sandbox", empty()).await["sandbox_id"].as_str().unwrap().to_string();
        let session = session_ids(&redis, &prefix).pop().expect("session in Redis");
        let http = reqwest::Client::new();
        let delete = http
            .delete(r2.mcp_url())
            .header("mcp-session-id", &session)
            .header("mcp-protocol-version", "2025-11-25")
            .send()
            .await
            .unwrap();
        assert_eq!(delete.status().as_u16(), 204, "DELETE on replica 2");
        assert!(wait_gone(&provider.inner.client(), &a, Duration::from_secs(20)).await);
        // Replica 1 (which still had the session in memory) now refuses it.
        let call = http
            .post(r1.mcp_url())
            .header("mcp-session-id", &session)
            .header("mcp-protocol-version", "2025-11-25")
            .header("accept", "application/json, text/event-stream")
            .json(&json!({"jsonrpc": "2.0", "id": 9, "method": "tools/call",
                "params": {"name": "list_sandboxes", "arguments": {}}}))
            .send()
            .await
            .unwrap();
        assert_eq!(call.status().as_u16(), 404, "a call on the ended session on replica 1");
        let again = http
            .delete(r1.mcp_url())
            .header("mcp-session-id", &session)
            .header("mcp-protocol-version", "2025-11-25")
            .send()
            .await
            .unwrap();
        assert_eq!(again.status().as_u16(), 404, "second DELETE");
        assert!(cleanup_over(&redis, &prefix).await, "the session stays in Redis after its DELETE");
        assert_eq!(provider.kills(&a), 1, "r1:\n{}\nr2:\n{}", r1.log_text(), r2.log_text());
    });
}

#[test]
fn redis_outage_fails_readiness_and_calls_retryably_then_recovers() {
    require_root!();
    let Some(mut redis) = start_redis(true) else { return };
    let provider = CountingProvider::start();
    let prefix = unique_prefix("outage");
    let r1 = replica(&provider, &redis_config_with_timeout(&redis, &prefix, 120, 500));
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let http = reqwest::Client::new();
        let client = connect(&r1.mcp_url(), None).await;
        let a = ok(&client, "create_sandbox", empty()).await["sandbox_id"].as_str().unwrap().to_string();
        let session = session_ids(&redis, &prefix).pop().expect("session in Redis");
        redis.stop();

        let ready = http.get(format!("{}/readyz", r1.base())).send().await.unwrap();
        assert_eq!(ready.status().as_u16(), 503);
        assert!(ready.text().await.unwrap().contains("Redis"));
        let call = http
            .post(r1.mcp_url())
            .header("mcp-session-id", &session)
            .header("mcp-protocol-version", "2025-11-25")
            .header("accept", "application/json, text/event-stream")
            .json(&json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
                "params": {"name": "run_command", "arguments": {"command": "true"}}}))
            .send()
            .await
            .unwrap();
        assert_eq!(call.status().as_u16(), 503);
        assert!(call.headers().get("retry-after").is_some());
        let body = call.text().await.unwrap();
        assert!(body.contains("retry") && body.contains("Redis"), "{body}");
        // The replica's log says why it answered 503 (the client's error alone does not).
        // (Its log reaches the test through a reader thread: wait for the line, do not race it.)
        let logged = r1.wait_log("cannot refresh the session in Redis; answered 503", Duration::from_secs(10)).await;
        assert!(logged, "{}", r1.log_text());
        let init = http
            .post(r1.mcp_url())
            .header("accept", "application/json, text/event-stream")
            .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": "2025-11-25", "capabilities": {},
                "clientInfo": {"name": "t", "version": "0"}}}))
            .send()
            .await
            .unwrap();
        assert_eq!(init.status().as_u16(), 503, "initialize while Redis is down");

        redis.spawn().expect("restart redis-server on its port");
        let base = r1.base();
        let recovered = async {
            for _ in 0..100 {
                if let Ok(r) = http.get(format!("{base}/readyz")).send().await
                    && r.status().is_success()
                {
                    return true;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            false
        };
        assert!(recovered.await, "readiness did not recover without a restart\n{}", r1.log_text());
        // The same session continues, default sandbox intact (its record survived in Redis).
        let out = ok(&client, "run_command", json!({ "command": "echo back" })).await;
        assert_eq!(out["sandbox_id"].as_str(), Some(a.as_str()));
        assert_eq!(out["stdout"].as_str().map(str::trim), Some("back"));
        close(client).await;
        assert!(wait_gone(&provider.inner.client(), &a, Duration::from_secs(20)).await);
    });
}

/// Writes the rolling-update balancer's control file atomically (the Python side reads it every 100 ms).
fn write_control(path: &std::path::Path, backends: &[&Gateway], done: bool) {
    let text = json!({ "backends": backends.iter().map(|r| r.base()).collect::<Vec<_>>(), "done": done });
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text.to_string()).expect("write control");
    std::fs::rename(&tmp, path).expect("rename control");
}

#[test]
fn python_client_keeps_its_session_through_a_rolling_update() {
    let python = require_env!("SANDBOX_MCP_PYTHON", "a python with mcp==1.30.0");
    require_root!();
    let Some(redis) = start_redis(false) else { return };
    let provider = CountingProvider::start();
    let prefix = unique_prefix("roll");
    let config = redis_config(&redis, &prefix, 120);
    let mut r1 = replica(&provider, &config);
    let r2 = replica(&provider, &config);
    let dir = tempfile::tempdir().expect("tempdir");
    let control = dir.path().join("control.json");
    write_control(&control, &[&r1, &r2], false);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/interop/redis_rolling_update.py");
    let mut child = Command::new(python)
        .arg(script)
        .arg(&control)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run python");
    let out = Arc::new(Mutex::new(String::new()));
    let err = Arc::new(Mutex::new(String::new()));
    let mut readers = Vec::new();
    for (pipe, sink) in [
        (Box::new(child.stdout.take().expect("stdout")) as Box<dyn std::io::Read + Send>, Arc::clone(&out)),
        (Box::new(child.stderr.take().expect("stderr")), Arc::clone(&err)),
    ] {
        readers.push(std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                let mut text = sink.lock().unwrap();
                text.push_str(&line);
                text.push('\n');
            }
        }));
    }
    let output = || format!("stdout:\n{}\nstderr:\n{}", out.lock().unwrap(), err.lock().unwrap());
    let deadline = Instant::now() + Duration::from_secs(60);
    while !out.lock().unwrap().contains("READY\n") {
        assert!(Instant::now() < deadline, "the client did not start calling\n{}", output());
        std::thread::sleep(Duration::from_millis(100));
    }
    // READY: the client has called through r1 and keeps calling.
    let sandbox =
        out.lock().unwrap().lines().find_map(|l| l.strip_prefix("SANDBOX ")).expect("sandbox id").trim().to_string();

    // The rolling update: a new process comes up, then the old one gets SIGTERM (and hands its sessions over).
    let r3 = replica(&provider, &config);
    write_control(&control, &[&r1, &r3, &r2], false);
    // The balancer has seen r3 ready, so the client moves there (not to r2) once r1 turns unready.
    let r3_ready = format!(" {} ready\n", r3.base());
    let seen = common::wait_until(Duration::from_secs(30), || out.lock().unwrap().contains(&r3_ready));
    assert!(seen, "the balancer never saw r3 ready\n{}", output());
    assert!(r1.shutdown(), "replica 1 did not shut down cleanly\n{}", r1.log_text());
    write_control(&control, &[&r3, &r2], false);
    let logs = || format!("r1:\n{}\nr2:\n{}\nr3:\n{}", r1.log_text(), r2.log_text(), r3.log_text());
    // The session goes on from r3, with the record r1 left in Redis.
    let moved =
        common::wait_until(Duration::from_secs(30), || r3.log.contains("session taken over from the shared store"));
    assert!(moved, "r3 never took the session over\n{}\n{}", output(), logs());
    assert_eq!(provider.kills(&sandbox), 0, "the rolling update killed the session's sandbox\n{}", logs());
    assert!(r1.log_text().contains("sessions left in Redis"), "{}", logs());
    assert_eq!(session_ids(&redis, &prefix).len(), 1, "the session is still in Redis");

    write_control(&control, &[&r3, &r2], true);
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait python") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the client did not finish\n{}\n{}", output(), logs());
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    for reader in readers {
        reader.join().expect("pipe reader"); // the last lines are copied once the pipes close
    }
    let stdout = out.lock().unwrap().clone();
    println!("{stdout}");
    assert!(status.success(), "the client saw an error\n{}\n{}", output(), logs());
    let summary = stdout.lines().last().unwrap_or_default();
    assert!(summary.ends_with(" passed, 0 failed") && !summary.starts_with("0 passed"), "{summary}");
    let backends = stdout.lines().find_map(|l| l.strip_prefix("BACKENDS ")).unwrap_or_default();
    assert!(backends.contains(&r1.base()) && backends.contains(&r3.base()), "moved from r1 to r3: {backends}");
    // The client's DELETE at the end killed the sandbox, once.
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        assert!(wait_gone(&provider.inner.client(), &sandbox, Duration::from_secs(20)).await, "{}", logs());
        assert!(cleanup_over(&redis, &prefix).await, "the session stays in Redis after its DELETE\n{}", logs());
    });
    assert_eq!(provider.kills(&sandbox), 1, "{}", logs());
}

/// A legacy session opened with raw HTTP: its id (initialize + initialized done).
async fn raw_session(http: &reqwest::Client, url: &str, token: Option<&str>) -> String {
    let mut init = http
        .post(url)
        .header("accept", "application/json, text/event-stream")
        .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}}));
    if let Some(token) = token {
        init = init.bearer_auth(token);
    }
    let init = init.send().await.unwrap();
    assert!(init.status().is_success(), "initialize: {}", init.status());
    let session = init.headers().get("mcp-session-id").expect("session id").to_str().unwrap().to_string();
    let _ = init.bytes().await;
    let mut done =
        raw_post(http, url, &session, token, json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    done = done.header("accept", "application/json, text/event-stream");
    assert!(done.send().await.unwrap().status().is_success());
    session
}

fn raw_post(
    http: &reqwest::Client,
    url: &str,
    session: &str,
    token: Option<&str>,
    body: serde_json::Value,
) -> reqwest::RequestBuilder {
    let mut request = http
        .post(url)
        .header("accept", "application/json, text/event-stream")
        .header("mcp-session-id", session)
        .header("mcp-protocol-version", "2025-11-25")
        .json(&body);
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    request
}

/// A tool call in a session; returns the SSE text of its answer.
async fn raw_call(
    http: &reqwest::Client,
    url: &str,
    session: &str,
    id: u64,
    tool: &str,
    args: serde_json::Value,
) -> String {
    let body = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": tool, "arguments": args}});
    let response = raw_post(http, url, session, None, body).send().await.unwrap();
    assert!(response.status().is_success(), "{tool}: {}", response.status());
    response.text().await.unwrap()
}

/// `GET /mcp` with `Last-Event-ID` in `session`: the replayed SSE text (whatever arrives within 5 s).
async fn replay(http: &reqwest::Client, url: &str, session: &str, last_event_id: &str) -> String {
    let response = http
        .get(url)
        .header("accept", "text/event-stream")
        .header("mcp-session-id", session)
        .header("mcp-protocol-version", "2025-11-25")
        .header("last-event-id", last_event_id)
        .send()
        .await
        .unwrap();
    let mut response = response;
    let mut text = String::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), async {
        while let Ok(Some(chunk)) = response.chunk().await {
            text.push_str(&String::from_utf8_lossy(&chunk));
        }
    })
    .await;
    text
}

#[test]
fn last_event_id_replay_is_bound_to_its_session() {
    require_root!();
    let Some(redis) = start_redis(false) else { return };
    let provider = CountingProvider::start();
    let config = redis_config(&redis, &unique_prefix("replay"), 120);
    let r1 = replica(&provider, &config);
    let r2 = replica(&provider, &config);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let http = reqwest::Client::new();
        let a = raw_session(&http, &r1.mcp_url(), None).await;
        let b = raw_session(&http, &r1.mcp_url(), None).await;
        let created = raw_call(&http, &r1.mcp_url(), &a, 2, "create_sandbox", json!({})).await;
        assert!(created.contains("sandbox_id"), "{created}");
        let answer = raw_call(&http, &r1.mcp_url(), &a, 3, "run_command", json!({"command": "echo secret-of-a"})).await;
        assert!(answer.contains("secret-of-a"), "{answer}");
        // The request stream's first event (priming) is where a client resumes from after a break.
        let first_id = answer
            .lines()
            .find_map(|l| l.strip_prefix("id:"))
            .map(|id| id.trim().to_string())
            .unwrap_or_else(|| panic!("no event id in {answer:?}"));
        for replica in [&r1, &r2] {
            // Session A resumes its own stream (on either replica) and gets its result...
            let own = replay(&http, &replica.mcp_url(), &a, &first_id).await;
            assert!(own.contains("secret-of-a"), "A's own replay on {}: {own:?}", replica.base());
            // ...session B presenting A's event id gets none of it.
            let foreign = replay(&http, &replica.mcp_url(), &b, &first_id).await;
            assert!(!foreign.contains("secret-of-a") && !foreign.contains("result"), "B got A's events: {foreign:?}");
            let common = replay(&http, &replica.mcp_url(), &b, &format!("{a}:common#0-0")).await;
            assert!(!common.contains("data: {"), "B got A's standalone stream: {common:?}");
        }
        let log = format!("{}{}", r1.log_text(), r2.log_text());
        assert!(log.contains("Last-Event-ID names a stream of another session"), "{log}");
        for session in [&a, &b] {
            let _ = http.delete(r1.mcp_url()).header("mcp-session-id", session.as_str()).send().await;
        }
    });
}

/// The idle deadline of a session in Redis (ms).
fn deadline_of(redis: &Redis, prefix: &str, session: &str) -> u64 {
    redis.cli(&["ZSCORE", &format!("{prefix}:expiry"), session]).trim().parse().unwrap_or(0)
}

#[test]
fn a_request_that_fails_auth_neither_refreshes_nor_reads_a_session() {
    require_root!();
    let Some(redis) = start_redis(false) else { return };
    let provider = CountingProvider::start();
    let prefix = unique_prefix("authfirst");
    let (acme, beta) = ("acme-token-0123456789abcdef", "beta-token-0123456789abcdef");
    let config = format!(
        "{}[auth]\ntokens = [ {{ tenant = \"acme\", sha256 = \"{}\" }}, {{ tenant = \"beta\", sha256 = \"{}\" }} ]\n",
        redis_config(&redis, &prefix, 120),
        sha256_hex(acme),
        sha256_hex(beta)
    );
    let r1 = replica(&provider, &config);
    let r2 = replica(&provider, &config);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let http = reqwest::Client::new();
        let session = raw_session(&http, &r1.mcp_url(), Some(acme)).await;
        let list = json!({"jsonrpc": "2.0", "id": 5, "method": "tools/call",
            "params": {"name": "list_sandboxes", "arguments": {}}});
        let before = deadline_of(&redis, &prefix, &session);
        assert!(before > 0, "session deadline in Redis");
        // Past the instant of the last refresh (deadline - idle), a refresh would move the deadline.
        let last_refresh = before - 120_000;
        let later = wait_until(Duration::from_secs(5), || now_ms() > last_refresh + 5).await;
        assert!(later, "the clock did not move past the session's last refresh");
        // r2 has never seen the session (nothing cached): Redis alone must refuse.
        for replica in [&r2, &r1] {
            let anonymous = raw_post(&http, &replica.mcp_url(), &session, None, list.clone()).send().await.unwrap();
            assert_eq!(anonymous.status().as_u16(), 401, "no token");
            let wrong = raw_post(&http, &replica.mcp_url(), &session, Some("not-a-token"), list.clone());
            assert_eq!(wrong.send().await.unwrap().status().as_u16(), 401, "bad token");
            let other = raw_post(&http, &replica.mcp_url(), &session, Some(beta), list.clone()).send().await.unwrap();
            assert_eq!(other.status().as_u16(), 404, "another tenant's token");
            let body = other.text().await.unwrap();
            assert!(!body.contains("sandboxes"), "{body}");
            let stream = http
                .get(replica.mcp_url())
                .bearer_auth(beta)
                .header("accept", "text/event-stream")
                .header("mcp-session-id", &session)
                .header("mcp-protocol-version", "2025-11-25")
                .send()
                .await
                .unwrap();
            assert_eq!(stream.status().as_u16(), 404, "another tenant's GET");
        }
        assert_eq!(deadline_of(&redis, &prefix, &session), before, "a refused request moved the idle deadline");
        // The session's own tenant, on the replica that never saw it: served, and the deadline moves.
        let own = raw_post(&http, &r2.mcp_url(), &session, Some(acme), list).send().await.unwrap();
        assert!(own.status().is_success(), "{}", own.status());
        assert!(own.text().await.unwrap().contains("sandboxes"));
        assert!(deadline_of(&redis, &prefix, &session) > before, "the owner's request refreshes the deadline");
        let _ = http.delete(r1.mcp_url()).bearer_auth(acme).header("mcp-session-id", &session).send().await;
    });
}
