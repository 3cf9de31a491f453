//! Abuse suite (issue 11): a real `sandbox-mcp serve` with its embedded local
//! provider and two tenants, attacked the way the issue describes, each case
//! bounded in time and count.
//!
//! Since every sandbox has its own network namespace, code inside a sandbox
//! cannot reach the gateway or provider ports (checked from inside a sandbox,
//! on the loopback and on the host's addresses). The connection floods and
//! slowloris connections are therefore driven from this test process on the
//! host, as against an exposed public port; the flood a sandbox *can* make
//! (outbound connections through the provider's egress relays) is driven from
//! inside sandboxes against the provider-wide egress budget; what has to be
//! inside a sandbox (descriptor inheritance, the `/dev/shm` filler, the memory
//! hog and envd's OOM score) runs inside real sandboxes.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

use crate::common;
use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::*;
use serde_json::json;
use tokio::io::AsyncWriteExt;

const TOKEN_A: &str = "abuse-tenant-a-token-0123456789";
const TOKEN_B: &str = "abuse-tenant-b-token-0123456789";
const SECRET: &str = "s3cret-value-abuse-7f3a9c";

fn two_tenants(extra: &str) -> String {
    format!("{}[tasks]\nsecrets = [\"{SECRET}\"]\n{extra}", tokens_config(&[("a", TOKEN_A), ("b", TOKEN_B)]))
}

/// The embedded provider's address, from the gateway's JSON log.
fn embedded_provider_addr(gateway: &Gateway) -> SocketAddr {
    let log = gateway.log_text();
    let line = log.lines().find(|l| l.contains("embedded local provider started")).expect("provider start line");
    let value: serde_json::Value = serde_json::from_str(line).expect("json log line");
    value["fields"]["addr"].as_str().or(value["addr"].as_str()).expect("addr field").parse().expect("address")
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count()).unwrap_or(0)
}

/// The host's non-loopback IPv4 addresses (`ip -4 -o addr`).
fn host_ipv4_addresses() -> Vec<std::net::IpAddr> {
    let out = std::process::Command::new("ip").args(["-4", "-o", "addr"]).output().expect("ip addr");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().skip_while(|w| *w != "inet").nth(1))
        .filter_map(|cidr| cidr.split('/').next()?.parse::<std::net::IpAddr>().ok())
        .filter(|ip| !ip.is_loopback())
        .collect()
}

/// Opens `count` idle connections and `slow` slowloris connections (a header byte every 300 ms)
/// to `addr`; keeps them until the returned handle is aborted.
/// A flood of `count` idle and `slow` slowloris connections to `addr`, and the number of its
/// connection attempts made so far (all `count + slow` once the flood is fully under way).
fn flood(addr: SocketAddr, count: usize, slow: usize) -> (tokio::task::JoinHandle<(usize, usize)>, Arc<AtomicUsize>) {
    let attempts = Arc::new(AtomicUsize::new(0));
    let counter = attempts.clone();
    let task = tokio::spawn(async move {
        let mut idle = Vec::new();
        for _ in 0..count {
            let connected = tokio::net::TcpStream::connect(addr).await;
            counter.fetch_add(1, Ordering::Relaxed);
            if let Ok(stream) = connected {
                idle.push(stream);
            }
        }
        let mut slow_tasks = Vec::new();
        for _ in 0..slow {
            let counter = counter.clone();
            slow_tasks.push(tokio::spawn(async move {
                let connected = tokio::net::TcpStream::connect(addr).await;
                let Ok(mut stream) = connected else {
                    counter.fetch_add(1, Ordering::Relaxed);
                    return false;
                };
                let written = stream.write_all(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ").await;
                counter.fetch_add(1, Ordering::Relaxed);
                if written.is_err() {
                    return true;
                }
                for _ in 0..200 {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    if stream.write_all(b"a").await.is_err() {
                        return true; // the server cut it
                    }
                }
                false
            }));
        }
        let mut cut = 0;
        for task in slow_tasks {
            cut += usize::from(task.await.unwrap_or(false));
        }
        (idle.len(), cut)
    });
    (task, attempts)
}

/// Waits (at most 30 s) until every connection attempt of a flood of `total` has been made.
async fn flood_under_way(attempts: &AtomicUsize, total: usize) {
    let under_way = eventually(Duration::from_secs(30), || async { attempts.load(Ordering::Relaxed) >= total }).await;
    assert!(under_way, "the flood made only {} of {total} connection attempts", attempts.load(Ordering::Relaxed));
}

fn p99(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[((samples.len() * 99).div_ceil(100)).saturating_sub(1)]
}

/// From inside a sandbox neither port can be reached at all. From the host side (as an exposed
/// public port would be), tenant A floods the gateway's port and the embedded provider's port with
/// idle and slowloris connections (far more than the cap); tenant B's calls, on fresh connections, keep
/// succeeding within 1 s p99, the slowloris connections are cut by the header-read timeout, and
/// the gateway's descriptor count stays bounded by the caps.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn connection_flood_and_slowloris_do_not_starve_another_tenant() {
    require_root!();
    let config = two_tenants("").replace(
        "[auth]",
        "[server]\nmax_connections = 64\nheader_read_timeout_secs = 2\nidle_timeout_secs = 3\n[auth]",
    );
    sandbox_mcp::listen::raise_fd_limit(); // this process holds the flood's connections
    let gateway = Gateway::start(&config, &[]);
    let gateway_pid = gateway.pid();
    let provider_addr = embedded_provider_addr(&gateway);
    let b = connect(&gateway.mcp_url(), Some(TOKEN_B)).await;
    let sandbox = ok(&b, "create_sandbox", json!({})).await["sandbox_id"].as_str().unwrap().to_string();
    let fds_before = open_fds(gateway_pid);

    // From inside tenant A's sandbox, the flood cannot even start: no connection to the gateway or the
    // provider opens, on the loopback (the sandbox's own) or on the host's addresses (issue 9).
    let a = connect(&gateway.mcp_url(), Some(TOKEN_A)).await;
    let inside = ok(&a, "create_sandbox", json!({})).await["sandbox_id"].as_str().unwrap().to_string();
    let mut targets = vec![gateway.addr, provider_addr];
    for host_ip in host_ipv4_addresses() {
        targets.push(SocketAddr::new(host_ip, gateway.addr.port()));
        targets.push(SocketAddr::new(host_ip, provider_addr.port()));
    }
    let targets: Vec<String> = targets.iter().map(|t| format!("('{}', {})", t.ip(), t.port())).collect();
    // A connection counts if it is answered: the egress relay accepts every outbound connection and
    // resets the denied ones before anything is read.
    let script = r#"
import socket
answered = 0
for host, port in [TARGETS]:
    for _ in range(50):
        s = socket.socket()
        s.settimeout(1)
        try:
            s.connect((host, port))
            s.sendall(b"GET /healthz HTTP/1.0\r\n\r\n")
            answered += 1 if s.recv(64) else 0
        except OSError:
            pass
print("answered", answered)
"#
    .replace("TARGETS", &targets.join(", "));
    let command = format!("python3 - <<'EOF'\n{script}\nEOF");
    let out = ok(&a, "run_command", json!({"sandbox_id": inside, "command": command})).await;
    assert_eq!(out["stdout"], "answered 0\n", "a sandbox reached the gateway or the provider: {out}");
    ok(&a, "kill_sandbox", json!({"sandbox_id": inside})).await;
    close(a).await;

    // From the host side (an exposed public port), the caps and timeouts hold.
    let floods = [flood(gateway.addr, 600, 30), flood(provider_addr, 600, 30)];
    for (_, attempts) in &floods {
        flood_under_way(attempts, 630).await;
    }
    let mut latencies = Vec::new();
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(8) {
        let t = Instant::now();
        let out = ok(&b, "run_command", json!({"sandbox_id": sandbox, "command": "echo ok"})).await;
        assert_eq!(out["stdout"], "ok\n", "{out}");
        latencies.push(t.elapsed());
        // A brand-new session (new connection, initialize) during the flood.
        if latencies.len() % 5 == 0 {
            let t = Instant::now();
            let fresh = connect(&gateway.mcp_url(), Some(TOKEN_B)).await;
            ok(&fresh, "list_sandboxes", empty()).await;
            latencies.push(t.elapsed());
            close(fresh).await;
        }
        let fds = open_fds(gateway_pid);
        assert!(fds < fds_before + 2 * 64 + 64, "gateway descriptors grew unbounded: {fds_before} -> {fds}");
    }
    let worst = p99(latencies.clone());
    assert!(worst < Duration::from_secs(1), "p99 {worst:?} over {} calls during the flood", latencies.len());
    let mut cut = 0;
    for (f, _) in floods {
        f.abort();
    }
    // Slowloris connections: the header-read timeout (2 s) cuts them; check with a fresh batch.
    let (_, slow_cut) = tokio::time::timeout(Duration::from_secs(30), flood(gateway.addr, 0, 5).0)
        .await
        .expect("slowloris connections must be cut")
        .expect("flood task");
    cut += slow_cut;
    assert_eq!(cut, 5, "every slowloris connection must be cut by the header-read timeout");
    // A flood connection that sends nothing is closed by the server (idle/header timeout).
    let mut idle = tokio::net::TcpStream::connect(gateway.addr).await.unwrap();
    let mut buf = [0u8; 16];
    let read = tokio::time::timeout(Duration::from_secs(10), tokio::io::AsyncReadExt::read(&mut idle, &mut buf)).await;
    assert!(matches!(read, Ok(Ok(0)) | Ok(Err(_))), "an idle connection must be closed: {read:?}");
    ok(&b, "kill_sandbox", json!({"sandbox_id": sandbox})).await;
    close(b).await;
    assert!(!gateway.log_text().contains("Too many open files"), "fd exhaustion in the gateway log");
}

/// Accepts connections on ADDR:PORT and holds them open without reading.
const HOLDING_SERVER: &str = r#"
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(4096)
held = []
while True:
    c, _ = s.accept()
    held.append(c)
"#;

/// Connections established to `port` inside the test network's namespace.
fn established_in(net: &testnet::TestNet, port: u16) -> usize {
    let out = std::process::Command::new("ip")
        .args(["netns", "exec", &net.name, "ss", "-Htn", "state", "established", &format!("( sport = :{port} )")])
        .output()
        .expect("ss");
    String::from_utf8_lossy(&out.stdout).lines().count()
}

/// Tenant A's sandboxes open far more outbound connections (to an allowed "internet" host) than
/// the provider-wide egress budget (an eighth of the descriptor limit): the relays stop at the
/// budget, the gateway (which embeds the provider) never runs out of descriptors, and tenant B
/// keeps creating sandboxes and running commands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbound_connection_flood_from_sandboxes_cannot_exhaust_the_gateway() {
    require_root!();
    let mut net = testnet::TestNet::new();
    let port = 18_000 + (std::process::id() % 1000) as u16;
    net.spawn_python(HOLDING_SERVER, &[net.internet_addr.to_string(), port.to_string()]);
    let gateway = Gateway::start(&two_tenants(""), &[]);
    let gateway_pid = gateway.pid();
    let fd_limit = 2048;
    let limited = std::process::Command::new("prlimit")
        .args(["--pid", &gateway_pid.to_string(), &format!("--nofile={fd_limit}:{fd_limit}")])
        .status()
        .is_ok_and(|s| s.success());
    assert!(limited, "prlimit on the gateway");
    let budget = fd_limit / 8;

    let a = connect(&gateway.mcp_url(), Some(TOKEN_A)).await;
    let script = format!(
        "python3 - <<'EOF'\nimport socket, time\nheld = []\nfor _ in range(700):\n    s = socket.socket()\n    \
         s.settimeout(2)\n    try:\n        s.connect(('{}', {port}))\n        held.append(s)\n    \
         except OSError:\n        pass\ntime.sleep(60)\nEOF",
        net.internet_addr
    );
    let mut sandboxes = Vec::new();
    for _ in 0..2 {
        let id = ok(&a, "create_sandbox", json!({})).await["sandbox_id"].as_str().unwrap().to_string();
        ok(&a, "start_task", json!({"sandbox_id": id, "command": script})).await;
        sandboxes.push(id);
    }
    let b = connect(&gateway.mcp_url(), Some(TOKEN_B)).await;
    let b_sandbox = ok(&b, "create_sandbox", json!({})).await["sandbox_id"].as_str().unwrap().to_string();
    let started = Instant::now();
    let mut peak_established = 0;
    let mut latencies = Vec::new();
    while started.elapsed() < Duration::from_secs(10) {
        let t = Instant::now();
        let out = ok(&b, "run_command", json!({"sandbox_id": b_sandbox, "command": "echo ok"})).await;
        assert_eq!(out["stdout"], "ok\n", "{out}");
        latencies.push(t.elapsed());
        peak_established = peak_established.max(established_in(&net, port));
        let fds = open_fds(gateway_pid);
        assert!(fds < fd_limit as usize - 64, "the gateway is running out of descriptors: {fds} of {fd_limit}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(peak_established > 0, "egress to an allowed host must work");
    assert!(peak_established <= budget as usize, "{peak_established} relays open, over the budget of {budget}");
    // Spawning still has descriptors: tenant B creates and uses another sandbox mid-flood.
    let second = ok(&b, "create_sandbox", json!({})).await["sandbox_id"].as_str().unwrap().to_string();
    let out = ok(&b, "run_command", json!({"sandbox_id": second, "command": "echo fine"})).await;
    assert_eq!(out["stdout"], "fine\n", "{out}");
    let worst = p99(latencies.clone());
    assert!(worst < Duration::from_secs(1), "p99 {worst:?} over {} calls during the flood", latencies.len());
    for id in &sandboxes {
        ok(&a, "kill_sandbox", json!({"sandbox_id": id})).await;
    }
    for id in [&b_sandbox, &second] {
        ok(&b, "kill_sandbox", json!({"sandbox_id": id})).await;
    }
    close(a).await;
    close(b).await;
    assert!(!gateway.log_text().contains("Too many open files"), "fd exhaustion in the gateway log");
}

/// A descriptor `serve` inherits from its parent never reaches a command or a task in a sandbox.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inherited_descriptors_are_not_visible_inside_a_sandbox() {
    require_root!();
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("root-only-host-file-abuse");
    let mut file = std::fs::File::create(&marker).unwrap();
    file.write_all(b"host secret\n").unwrap();
    // Make it inheritable (std opens everything close-on-exec).
    nix::fcntl::fcntl(&file, nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty())).unwrap();
    let gateway = Gateway::start(&two_tenants(""), &[]);
    let gateway_pid = gateway.pid();
    let inherited = std::fs::read_dir(format!("/proc/{gateway_pid}/fd"))
        .unwrap()
        .flatten()
        .any(|e| std::fs::read_link(e.path()).is_ok_and(|t| t == marker));
    assert!(inherited, "precondition: serve inherited the marker descriptor");
    drop(file);

    let a = connect(&gateway.mcp_url(), Some(TOKEN_A)).await;
    let sandbox = ok(&a, "create_sandbox", json!({})).await["sandbox_id"].as_str().unwrap().to_string();
    let listing = "for f in /proc/self/fd/*; do echo \"${f##*/} $(readlink $f)\"; done";
    let out = ok(&a, "run_command", json!({"sandbox_id": sandbox, "command": listing})).await;
    let stdout = out["stdout"].as_str().unwrap().to_string();
    assert!(!stdout.contains("abuse"), "the inherited descriptor is visible inside: {stdout}");
    for line in stdout.lines() {
        let fd: u32 = line.split_whitespace().next().unwrap().parse().unwrap();
        assert!(fd <= 3, "unexpected descriptor inside the sandbox: {line}\n{stdout}");
    }
    // envd itself (PID 1 of the sandbox) holds nothing from the host either.
    let out = ok(&a, "run_command", json!({"sandbox_id": sandbox, "command": "ls -l /proc/1/fd/ 2>&1"})).await;
    assert!(!out["stdout"].as_str().unwrap().contains("abuse"), "{out}");
    ok(&a, "kill_sandbox", json!({"sandbox_id": sandbox})).await;
    close(a).await;
}

/// `/dev/shm` is bounded (a filler gets ENOSPC instead of charging the cgroup), envd is the OOM
/// killer's last choice, and a process exhausting the sandbox's memory is killed while envd and
/// a running task survive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shm_filler_and_memory_hog_are_stopped_while_envd_and_a_task_survive() {
    require_root!();
    let gateway = Gateway::start(&two_tenants("[local]\nmemory_limit_mb = 256\n"), &[]);
    let a = connect(&gateway.mcp_url(), Some(TOKEN_A)).await;
    let sandbox = ok(&a, "create_sandbox", json!({})).await["sandbox_id"].as_str().unwrap().to_string();
    let task = ok(&a, "start_task", json!({"sandbox_id": sandbox, "command": "sleep 300"})).await;
    let task_id = task["task_id"].as_str().unwrap().to_string();

    let run = |command: &str| json!({"sandbox_id": sandbox, "command": command, "timeout": 60});
    let scores = ok(&a, "run_command", run("cat /proc/1/oom_score_adj /proc/self/oom_score_adj")).await;
    let scores: Vec<i32> = scores["stdout"].as_str().unwrap().lines().map(|l| l.parse().unwrap()).collect();
    assert_eq!(scores[1], 500, "commands run at +500");
    assert!(scores[0] <= 0, "envd (PID 1) at most 0 (-1000 where permitted): {scores:?}");

    let fill =
        ok(&a, "run_command", run("dd if=/dev/zero of=/dev/shm/fill bs=1M count=512 2>&1; df -m /dev/shm")).await;
    let text = fill["stdout"].as_str().unwrap();
    assert!(text.contains("No space left"), "the /dev/shm filler must hit the size limit: {text}");
    assert!(text.lines().last().is_some_and(|l| l.split_whitespace().nth(1) == Some("64")), "{text}");
    ok(&a, "run_command", run("rm -f /dev/shm/fill")).await;

    let hog = ok(&a, "run_command", run("python3 -c 'a = bytearray(600 * 1024 * 1024); print(len(a))'")).await;
    assert_ne!(hog["exit_code"], 0, "the memory hog must be killed: {hog}");
    let alive = ok(&a, "run_command", run("echo alive")).await;
    assert_eq!(alive["stdout"], "alive\n", "envd must survive: {alive}");
    let status = ok(&a, "get_task", json!({"sandbox_id": sandbox, "task_id": task_id})).await;
    assert_eq!(status["state"], "running", "the task must survive: {status}");
    ok(&a, "kill_sandbox", json!({"sandbox_id": sandbox})).await;
    close(a).await;
}

/// The edge cases: upper-case `BEARER`, malformed JSON, a secret cut by the output cap, a secret
/// passed as `sandbox_id` (never logged), `/metrics` never readable with a tenant token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn edge_cases_scheme_parse_error_masking_and_metrics() {
    require_root!();
    let gateway = Gateway::start(&two_tenants(""), &[]);
    let http = reqwest::Client::new();
    let initialize = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "abuse", "version": "0"}}});
    let response = http
        .post(gateway.mcp_url())
        .header("Authorization", format!("BEARER {TOKEN_A}"))
        .header("Accept", "application/json, text/event-stream")
        .json(&initialize)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200, "auth schemes are case-insensitive");
    let session = response.headers()["mcp-session-id"].to_str().unwrap().to_string();
    drop(response);
    reused_request_id_gets_an_error_not_a_hang(&http, &gateway.mcp_url(), &session).await;

    let response = http
        .post(gateway.mcp_url())
        .header("Authorization", format!("Bearer {TOKEN_A}"))
        .header("Accept", "application/json, text/event-stream")
        .header("Content-Type", "application/json")
        .body("{\"jsonrpc\": \"2.0\", \"id\": 1, \"method\": ")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 400);
    let body: serde_json::Value = response.json().await.unwrap();
    assert_eq!(body["error"]["code"], -32700, "{body}");

    let (status, _) = {
        let r = http.get(format!("{}/metrics", gateway.base())).bearer_auth(TOKEN_A).send().await.unwrap();
        (r.status().as_u16(), r.text().await.unwrap())
    };
    assert!(status == 401 || status == 404, "a tenant token must not read /metrics: {status}");

    let a = connect(&gateway.mcp_url(), Some(TOKEN_A)).await;
    let message = err(&a, "run_command", json!({"sandbox_id": SECRET, "command": "true"})).await;
    assert!(!message.contains(SECRET), "{message}");
    let sandbox = ok(&a, "create_sandbox", json!({})).await["sandbox_id"].as_str().unwrap().to_string();
    // The secret straddles the 64 KiB cap: 65,530 bytes of padding, then the secret.
    let command = format!("head -c 65530 /dev/zero | tr '\\0' x; printf '%s' '{SECRET}'");
    let out = ok(&a, "run_command", json!({"sandbox_id": sandbox, "command": command})).await;
    assert_eq!(out["stdout_truncated"], true, "{}", out["stdout_bytes"]);
    let stdout = out["stdout"].as_str().unwrap();
    assert!(!stdout.contains(&SECRET[..6]), "a clipped secret's prefix leaked: {}", &stdout[stdout.len() - 20..]);
    assert!(stdout.ends_with("x***"), "{}", &stdout[stdout.len() - 20..]);
    ok(&a, "kill_sandbox", json!({"sandbox_id": sandbox})).await;
    close(a).await;
    assert!(!gateway.log_text().contains(SECRET), "a secret reached the log");
}

/// Two requests of one session with the same JSON-RPC id, the second sent while the first runs:
/// the second gets 400 / -32600 at once, the first still gets its own result, and once it is
/// answered the id may be used again.
async fn reused_request_id_gets_an_error_not_a_hang(http: &reqwest::Client, url: &str, session: &str) {
    let post = |body: serde_json::Value| {
        http.post(url)
            .header("Authorization", format!("Bearer {TOKEN_A}"))
            .header("Accept", "application/json, text/event-stream")
            .header("Mcp-Session-Id", session)
            .header("MCP-Protocol-Version", "2025-06-18")
            .json(&body)
            .send()
    };
    post(json!({"jsonrpc": "2.0", "method": "notifications/initialized"})).await.unwrap();
    let call = |id: u64, command: &str| {
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": "run_command", "arguments": {"command": command}}})
    };
    let create = json!({"jsonrpc": "2.0", "id": 6, "method": "tools/call",
        "params": {"name": "create_sandbox", "arguments": {}}});
    let created = post(create).await.unwrap().text().await.unwrap();
    let sandbox = created.split("\\\"sandbox_id\\\":\\\"").nth(1).and_then(|rest| rest.split('\\').next());
    let sandbox = sandbox.unwrap_or_else(|| panic!("no sandbox id in {created}")).to_string();
    let first = tokio::spawn(post(call(7, "sleep 2.017; echo first")).await.unwrap().text());
    // The first call is in flight once its command runs in the sandbox (visible from the host).
    let running =
        eventually(Duration::from_secs(10), || async { !host_processes_with("sleep 2.017").is_empty() }).await;
    assert!(running, "the first call's command never started");
    let started = Instant::now();
    let second = tokio::time::timeout(Duration::from_secs(10), post(call(7, "echo second")))
        .await
        .expect("a reused request id must not hang")
        .unwrap();
    assert_eq!(second.status().as_u16(), 400);
    assert!(started.elapsed() < Duration::from_secs(1), "refused at once, not after the first call");
    let body: serde_json::Value = second.json().await.unwrap();
    assert_eq!(body["error"]["code"], -32600, "{body}");
    assert_eq!(body["id"], 7, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("already used"), "{body}");
    let first =
        tokio::time::timeout(Duration::from_secs(20), first).await.expect("first call answered").unwrap().unwrap();
    assert!(first.contains("first\\n") && first.contains("\"id\":7"), "{first}");
    // Answered: the id is free again.
    let again = post(call(7, "echo again")).await.unwrap().text().await.unwrap();
    assert!(again.contains("again\\n"), "{again}");
    let kill = json!({"jsonrpc": "2.0", "id": 8, "method": "tools/call",
        "params": {"name": "kill_sandbox", "arguments": {"sandbox_id": sandbox}}});
    let killed = post(kill).await.unwrap().text().await.unwrap();
    assert!(killed.contains("\"isError\":false"), "{killed}");
}

/// Processes whose command line carries `--agent-tag TAG` for a TAG in one of the sandbox
/// directories of `state_dir` (this provider's agents).
fn agents_of(state_dir: &std::path::Path) -> Vec<i32> {
    let needles: Vec<String> = std::fs::read_dir(state_dir.join("sandboxes"))
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.path().join("agent.tag")).ok())
        .map(|tag| format!("--agent-tag\0{}\0", tag.trim()))
        .collect();
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| needles.iter().any(|needle| c.windows(needle.len()).any(|w| w == needle.as_bytes())))
        })
        .collect()
}

/// A connection flood against a `sandbox-mcp provider` whose descriptor limit is low orphans
/// nothing: every sandbox stays tracked, listed and killable, and after killing them no agent
/// process or cgroup of this provider remains (counted from the host). Then reconciliation: an
/// untracked agent-like process of this state directory is killed and an untracked sandbox
/// directory removed, while a tracked sandbox is left alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_sandbox_is_orphaned_under_a_flood_and_reconciliation_kills_untracked_agents() {
    require_root!();
    let provider = Provider::start();
    let client = provider.client();
    let pid = provider.pid();
    sandbox_mcp::listen::raise_fd_limit(); // this process holds the flood's connections
    // Lower the provider's descriptor limit below its connection cap, so the flood reaches EMFILE.
    let limit = std::process::Command::new("prlimit")
        .args(["--pid", &pid.to_string(), "--nofile=512:512"])
        .status()
        .is_ok_and(|s| s.success());
    let request =
        sandbox_mcp::e2b::wire::NewSandbox { template_id: "base".into(), timeout: Some(300), ..Default::default() };
    let mut ids = Vec::new();
    for _ in 0..6 {
        ids.push(client.create_sandbox(&request).await.expect("create").sandbox_id);
    }
    let (flood_task, attempts) = flood(provider.addr, 1500, 10);
    flood_under_way(&attempts, 1510).await;
    if limit {
        assert!(open_fds(pid) <= 512, "descriptors beyond the limit?");
    }
    // The provider keeps answering during the flood and lists every sandbox.
    let listed = client.list_all_sandboxes(&[]).await.expect("list during the flood");
    for id in &ids {
        assert!(listed.iter().any(|s| &s.sandbox_id == id), "sandbox {id} dropped from the table");
    }
    assert_eq!(agents_of(&provider.state_dir).len(), ids.len(), "every agent alive and accounted for");
    flood_task.abort();

    // Reconciliation: a process posing as an untracked agent of this state dir, and an untracked dir.
    let fake_id = "zzzzuntrackedagent01";
    // Its directory (with the tag that names it) appears atomically, after the process exists.
    let fake_tag = "0123456789abcdef0123456789abcdef";
    let fake_prep = provider.state_dir.join("fake-agent-dir");
    std::fs::create_dir_all(&fake_prep).unwrap();
    std::fs::write(fake_prep.join("agent.tag"), fake_tag).unwrap();
    let mut fake = std::process::Command::new("python3")
        .args(["-c", "import time; time.sleep(120)", "--agent-tag", fake_tag])
        .spawn()
        .expect("python3");
    std::fs::rename(&fake_prep, provider.state_dir.join("sandboxes").join(fake_id)).unwrap();
    let stray_dir = provider.state_dir.join("sandboxes").join("zzzzstraydirectory01");
    std::fs::create_dir_all(stray_dir.join("upper")).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(Some(_)) = fake.try_wait() {
            break;
        }
        assert!(Instant::now() < deadline, "reconciliation did not kill the untracked agent");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let deadline = Instant::now() + Duration::from_secs(15);
    while stray_dir.exists() {
        assert!(Instant::now() < deadline, "reconciliation did not remove the untracked directory");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(client.list_all_sandboxes(&[]).await.unwrap().len(), ids.len(), "tracked sandboxes untouched");

    for id in &ids {
        client.kill_sandbox(id).await.expect("kill");
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while !agents_of(&provider.state_dir).is_empty() {
        assert!(Instant::now() < deadline, "agents left after kill: {:?}", agents_of(&provider.state_dir));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for id in &ids {
        for base in
            ["/sys/fs/cgroup/sandbox-mcp", "/sys/fs/cgroup/memory/sandbox-mcp", "/sys/fs/cgroup/pids/sandbox-mcp"]
        {
            let deadline = Instant::now() + Duration::from_secs(10);
            while std::path::Path::new(base).join(id).exists() {
                assert!(Instant::now() < deadline, "cgroup {base}/{id} left behind");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

async fn raw_initialize(gateway: &Gateway, token: &str) -> (u16, String) {
    let initialize = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "abuse", "version": "0"}}});
    let response = reqwest::Client::new()
        .post(gateway.mcp_url())
        .bearer_auth(token)
        .header("Accept", "application/json, text/event-stream")
        .json(&initialize)
        .send()
        .await
        .unwrap();
    (response.status().as_u16(), response.text().await.unwrap_or_default())
}

/// Per-tenant limits (sandboxes, sessions, concurrent calls) refuse with the limit's name, value
/// and the way out, never as a transient failure, and leave the other tenant unaffected; the
/// global sandbox limit's message is accurate too.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn per_tenant_limits_refuse_accurately_and_spare_the_other_tenant() {
    require_root!();
    let config = two_tenants(
        "[local]\nmax_sandboxes = 3\n[limits]\nmax_sandboxes_per_tenant = 2\nmax_sessions_per_tenant = 3\n\
         max_concurrent_calls_per_tenant = 2\n",
    );
    let gateway = Gateway::start(&config, &[]);
    let a = connect(&gateway.mcp_url(), Some(TOKEN_A)).await;
    let b = connect(&gateway.mcp_url(), Some(TOKEN_B)).await;
    let a1 = ok(&a, "create_sandbox", json!({})).await["sandbox_id"].as_str().unwrap().to_string();
    ok(&a, "create_sandbox", json!({})).await;
    let refusal = err(&a, "create_sandbox", json!({})).await;
    assert!(refusal.contains("limits.max_sandboxes_per_tenant = 2") && refusal.contains("kill_sandbox"), "{refusal}");
    assert!(!refusal.contains("try again in a few seconds"), "{refusal}");
    // Tenant B is not starved by A's sandboxes; then the global limit (3) speaks accurately.
    ok(&b, "create_sandbox", json!({})).await;
    let global = err(&b, "create_sandbox", json!({})).await;
    assert!(global.contains("sandbox limit of the whole deployment") && global.contains("kill"), "{global}");
    assert!(!global.contains("unreachable"), "{global}");

    // Sessions: A has 1; two more are fine, the fourth is refused with the limit.
    let a2 = connect(&gateway.mcp_url(), Some(TOKEN_A)).await;
    let a3 = connect(&gateway.mcp_url(), Some(TOKEN_A)).await;
    let (status, body) = raw_initialize(&gateway, TOKEN_A).await;
    assert_eq!(status, 429, "{body}");
    assert!(body.contains("limits.max_sessions_per_tenant = 3"), "{body}");
    let (status, _) = raw_initialize(&gateway, TOKEN_B).await;
    assert_eq!(status, 200, "tenant B's sessions are its own");

    // Concurrent calls: two long calls of A run; a third is refused; B's call goes through.
    let slow = json!({"sandbox_id": a1, "command": "sleep 3.019"});
    let (p2, p3) = (a2.peer().clone(), a3.peer().clone());
    let (s2, s3) = (slow.clone(), slow.clone());
    let first = tokio::spawn(async move { call(&p2, "run_command", s2).await });
    let second = tokio::spawn(async move { call(&p3, "run_command", s3).await });
    // Both are in flight once both commands run in the sandbox (visible from the host).
    let sleepers = || {
        let processes = host_processes_with("sleep 3.019");
        processes.iter().filter(|p| p.split_once(": ").is_some_and(|(_, cmd)| cmd.starts_with("sleep "))).count()
    };
    let running = eventually(Duration::from_secs(10), || async { sleepers() == 2 }).await;
    assert!(running, "the two long calls never both ran: {:?}", host_processes_with("sleep 3.019"));
    let refused = err(&a, "list_sandboxes", empty()).await;
    assert!(refused.contains("limits.max_concurrent_calls_per_tenant = 2"), "{refused}");
    ok(&b, "list_sandboxes", empty()).await;
    assert_ne!(first.await.unwrap().is_error, Some(true));
    assert_ne!(second.await.unwrap().is_error, Some(true));
    ok(&a, "list_sandboxes", empty()).await;
    for client in [a, a2, a3, b] {
        close(client).await;
    }
}

/// Gateway memory per call is bounded by the tools' own caps: three concurrent worst-case
/// `list_files` (20,000 entries with 200-character names, a listing over 10 MiB) and three concurrent
/// `read_file` of a 20 MiB file (default part size) keep the gateway's RSS growth under 96 MiB; the listing is refused
/// with guidance, and `read_file` answers 256 KiB pages with `next_offset` that reassemble the file.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn gateway_memory_is_bounded_and_read_file_pages() {
    require_root!();
    let gateway = Gateway::start(&two_tenants(""), &[]);
    let pid = gateway.pid();
    let a = connect(&gateway.mcp_url(), Some(TOKEN_A)).await;
    let sandbox = ok(&a, "create_sandbox", json!({})).await["sandbox_id"].as_str().unwrap().to_string();
    let make = "python3 -c \"import os\nos.makedirs('/tmp/many')\nfor i in range(20000): \
                open('/tmp/many/%0200d' % i, 'w').close()\"; \
                head -c 20971520 /dev/urandom | base64 -w 100 | head -c 20971520 > /tmp/big.txt; \
                seq 1 120000 > /tmp/pages.txt";
    let made = ok(&a, "run_command", json!({"sandbox_id": sandbox, "command": make, "timeout": 300})).await;
    assert_eq!(made["exit_code"], 0, "{made}");

    let before = rss_kib(pid);
    let peak = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(before));
    let sampler_peak = std::sync::Arc::clone(&peak);
    let sampler = tokio::spawn(async move {
        loop {
            sampler_peak.fetch_max(rss_kib(pid), std::sync::atomic::Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    let mut calls = Vec::new();
    for _ in 0..3 {
        let peer = a.peer().clone();
        let list = json!({"sandbox_id": sandbox, "path": "/tmp/many"});
        calls.push(tokio::spawn(async move { call(&peer, "list_files", list).await }));
        let peer = a.peer().clone();
        let read = json!({"sandbox_id": sandbox, "path": "/tmp/big.txt"});
        calls.push(tokio::spawn(async move { call(&peer, "read_file", read).await }));
    }
    for (i, c) in calls.into_iter().enumerate() {
        let result = c.await.unwrap();
        if i % 2 == 0 {
            assert_eq!(result.is_error, Some(true), "the huge listing must be refused");
            assert!(text(&result).contains("list a subdirectory"), "{}", text(&result));
        } else {
            assert_ne!(result.is_error, Some(true), "{}", text(&result));
            let part = result.structured_content.as_ref().unwrap();
            assert_eq!(part["length"], 256 * 1024, "the default part");
            assert_eq!(part["next_offset"], 256 * 1024);
            assert_eq!(part["size"], 20 * 1024 * 1024);
        }
    }
    sampler.abort();
    let growth_mib = peak.load(std::sync::atomic::Ordering::Relaxed).saturating_sub(before) / 1024;
    eprintln!("gateway RSS: {before} KiB before, peak growth {growth_mib} MiB during the concurrent calls");
    assert!(growth_mib < 96, "gateway RSS grew by {growth_mib} MiB during three worst-case calls of each");

    // Paging: the default part is 256 KiB; next_offset walks the whole file.
    let mut offset = 0u64;
    let mut whole = String::new();
    loop {
        let part =
            ok(&a, "read_file", json!({"sandbox_id": sandbox, "path": "/tmp/pages.txt", "offset": offset})).await;
        assert!(part["length"].as_u64().unwrap() <= 256 * 1024, "{}", part["length"]);
        whole.push_str(part["content"].as_str().unwrap());
        match part["next_offset"].as_u64() {
            Some(next) => {
                assert_eq!(part["truncated"], true);
                offset = next;
            }
            None => break,
        }
    }
    let expected: String = (1..=120000).map(|i| format!("{i}\n")).collect();
    assert_eq!(whole.len(), expected.len());
    assert!(whole == expected, "pages must reassemble the file");
    ok(&a, "kill_sandbox", json!({"sandbox_id": sandbox})).await;
    close(a).await;
}
