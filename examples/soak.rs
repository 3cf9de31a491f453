//! Soak run (needs root for the embedded local provider), bounded to 10 minutes by default:
//!
//!   cargo build --release --bin sandbox-mcp --example soak && target/release/examples/soak
//!   SOAK_SECS=60 target/release/examples/soak        # a short variant
//!
//! Starts a real `sandbox-mcp serve` (embedded provider, two tenants) and drives it with
//! mixed traffic: per tenant, sessions that open, create a sandbox, run commands, write and
//! read files, start and poll a task, and close (killing their sandbox); one misbehaving
//! sandbox of tenant B that spams output, fills `/dev/shm` and exhausts its memory in a loop;
//! and bursts of idle connections against the public port. Every 30 s it samples the serve
//! process's RSS and open descriptors (the embedded provider lives in the same process), and
//! at the end prints the samples, the operation counts and errors, and whether RSS and
//! descriptors stayed flat (last sample within 25 % + 16 MiB / + 32 fds of the first
//! after warm-up).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

#[path = "../tests/it/common/mod.rs"]
mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use common::mcp::{McpClient, tool};
use common::{GatewayBuilder, rss_kib, tokens_config};
use serde_json::json;

const TOKENS: [(&str, &str); 2] = [("a", "soak-tenant-a-token-0123456789"), ("b", "soak-tenant-b-token-0123456789")];
const SAMPLE_EVERY: Duration = Duration::from_secs(30);

#[derive(Default)]
struct Counts {
    ops: AtomicU64,
    errors: AtomicU64,
    sessions: AtomicU64,
    misbehaviour: AtomicU64,
    flood_connections: AtomicU64,
}

fn binary() -> anyhow::Result<std::path::PathBuf> {
    let bin = common::binary();
    if !bin.exists() {
        bail!("{} not found: run `cargo build --release --bin sandbox-mcp` first", bin.display());
    }
    Ok(bin)
}

fn fds(pid: u32) -> u64 {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count() as u64).unwrap_or(0)
}

async fn client(url: &str, token: &str) -> anyhow::Result<McpClient> {
    common::mcp::try_connect(url, Some(token)).await
}

/// One session's life: create, use, close (the gateway kills the session's sandbox).
async fn session_round(url: &str, token: &str, round: u64, counts: &Counts) -> anyhow::Result<()> {
    let c = client(url, token).await?;
    counts.sessions.fetch_add(1, Ordering::Relaxed);
    let id = tool(&c, "create_sandbox", json!({})).await?["sandbox_id"].as_str().context("id")?.to_string();
    let content = format!("round {round}\n").repeat(100);
    tool(&c, "write_file", json!({"sandbox_id": id, "path": "/tmp/soak.txt", "content": content})).await?;
    let back = tool(&c, "read_file", json!({"sandbox_id": id, "path": "/tmp/soak.txt"})).await?;
    if back["content"].as_str() != Some(content.as_str()) {
        bail!("read_file returned other content");
    }
    tool(&c, "run_command", json!({"sandbox_id": id, "command": "ls -la /tmp; seq 1 2000 | tail -1"})).await?;
    tool(&c, "list_files", json!({"sandbox_id": id, "path": "/tmp"})).await?;
    let task =
        tool(&c, "start_task", json!({"sandbox_id": id, "command": "for i in 1 2 3; do echo $i; sleep 0.3; done"}))
            .await?;
    let task_id = task["task_id"].as_str().context("task id")?.to_string();
    tool(&c, "get_task", json!({"sandbox_id": id, "task_id": task_id, "wait_seconds": 3})).await?;
    tool(&c, "list_sandboxes", json!({})).await?;
    // The task retains the sandbox past the session: kill it, then end the session (DELETE).
    tool(&c, "kill_sandbox", json!({"sandbox_id": id})).await?;
    counts.ops.fetch_add(9, Ordering::Relaxed);
    let mut c = c;
    let _ = c.close_with_timeout(Duration::from_secs(10)).await;
    Ok(())
}

async fn run() -> anyhow::Result<()> {
    if !nix::unistd::geteuid().is_root() {
        bail!("run as root (the local provider needs namespaces)");
    }
    sandbox_mcp::listen::raise_fd_limit();
    let secs: u64 = std::env::var("SOAK_SECS").ok().and_then(|v| v.parse().ok()).unwrap_or(600).min(600);
    let bin = binary()?;
    let dir = tempfile::tempdir()?;
    let config = format!(
        "{}[local]\nstate_dir = \"{}\"\nmemory_limit_mb = 256\nmax_sandboxes = 40\n",
        tokens_config(&TOKENS),
        dir.path().join("state").display()
    );
    std::fs::write(dir.path().join("config.toml"), config)?;
    let serve = GatewayBuilder::config_file(&dir.path().join("config.toml"))
        .bin(&bin)
        .state_dir(dir.path().join("state"))
        .log_filter("warn")
        .try_start()
        .map_err(anyhow::Error::msg)?;
    let (pid, port, url) = (serve.pid(), serve.addr.port(), serve.mcp_url());
    report!("soak: {secs} s against serve pid {pid} on port {port}");
    let counts = Arc::new(Counts::default());
    let end = Instant::now() + Duration::from_secs(secs);
    let mut workers = Vec::new();
    // Two workers per tenant cycling sessions.
    for (worker, (_, token)) in TOKENS.iter().chain(TOKENS.iter()).enumerate() {
        let (url, counts) = (url.clone(), Arc::clone(&counts));
        workers.push(tokio::spawn(async move {
            let mut round = 0;
            while Instant::now() < end {
                round += 1;
                if let Err(err) = session_round(&url, token, round, &counts).await {
                    counts.errors.fetch_add(1, Ordering::Relaxed);
                    eprintln!("worker {worker}: {err:#}");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }));
    }
    // The misbehaving sandbox of tenant B: output spam, /dev/shm filler, memory hog, in a loop.
    {
        let (url, counts) = (url.clone(), Arc::clone(&counts));
        workers.push(tokio::spawn(async move {
            let Ok(c) = client(&url, TOKENS[1].1).await else { return };
            let Ok(created) = tool(&c, "create_sandbox", json!({"timeout": 900})).await else { return };
            let id = created["sandbox_id"].as_str().unwrap_or_default().to_string();
            let abuses = [
                "yes spam | head -c 50000000",
                "dd if=/dev/zero of=/dev/shm/fill bs=1M count=512 2>&1 | tail -1; rm -f /dev/shm/fill",
                "python3 -c 'a = bytearray(600 * 1024 * 1024)'",
            ];
            let mut i = 0;
            while Instant::now() < end {
                let command = abuses[i % abuses.len()];
                i += 1;
                // Failing is the point (ENOSPC, OOM kill); the sandbox must keep answering.
                let _ = tool(&c, "run_command", json!({"sandbox_id": id, "command": command, "timeout": 60})).await;
                if tool(&c, "run_command", json!({"sandbox_id": id, "command": "true"})).await.is_err() {
                    counts.errors.fetch_add(1, Ordering::Relaxed);
                    eprintln!("misbehaving sandbox stopped answering");
                }
                counts.misbehaviour.fetch_add(1, Ordering::Relaxed);
            }
            let _ = tool(&c, "kill_sandbox", json!({"sandbox_id": id})).await;
            let mut c = c;
            let _ = c.close_with_timeout(Duration::from_secs(10)).await;
        }));
    }
    // Bursts of idle connections against the public port.
    {
        let counts = Arc::clone(&counts);
        workers.push(tokio::spawn(async move {
            while Instant::now() < end {
                let mut held = Vec::new();
                for _ in 0..300 {
                    if let Ok(s) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await {
                        held.push(s);
                    }
                }
                counts.flood_connections.fetch_add(held.len() as u64, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_secs(5)).await;
                drop(held);
                tokio::time::sleep(Duration::from_secs(5)).await;
            }
        }));
    }
    let started = Instant::now();
    let mut samples = Vec::new();
    while Instant::now() < end {
        let sample = (started.elapsed().as_secs(), rss_kib(pid), fds(pid));
        report!(
            "t={:>4}s rss={:>7} KiB fds={:>5} ops={} sessions={} errors={}",
            sample.0,
            sample.1,
            sample.2,
            counts.ops.load(Ordering::Relaxed),
            counts.sessions.load(Ordering::Relaxed),
            counts.errors.load(Ordering::Relaxed)
        );
        samples.push(sample);
        tokio::time::sleep(SAMPLE_EVERY.min(end.saturating_duration_since(Instant::now()))).await;
    }
    for worker in workers {
        let _ = tokio::time::timeout(Duration::from_secs(150), worker).await;
    }
    // Nothing may outlive the soak: kill whatever a failed round left (tasks retain sandboxes).
    for (_, token) in TOKENS {
        if let Ok(c) = client(&url, token).await {
            if let Ok(list) = tool(&c, "list_sandboxes", json!({})).await {
                for s in list["sandboxes"].as_array().into_iter().flatten() {
                    let _ = tool(&c, "kill_sandbox", json!({"sandbox_id": s["sandbox_id"]})).await;
                }
            }
            let mut c = c;
            let _ = c.close_with_timeout(Duration::from_secs(10)).await;
        }
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let last = (started.elapsed().as_secs(), rss_kib(pid), fds(pid));
    samples.push(last);
    report!("t={:>4}s rss={:>7} KiB fds={:>5} (after the load)", last.0, last.1, last.2);
    // The first sample after warm-up (a minute in, or the second sample) is the baseline.
    let base = samples.iter().find(|s| s.0 >= 60).or(samples.get(1)).copied().unwrap_or(samples[0]);
    let peak_rss = samples.iter().map(|s| s.1).max().unwrap_or(0);
    let peak_fds = samples.iter().map(|s| s.2).max().unwrap_or(0);
    let rss_flat = last.1 <= base.1 + base.1 / 4 + 16 * 1024;
    let fds_flat = last.2 <= base.2 + 32;
    let warnings = serve
        .log_text()
        .lines()
        .filter(|l| l.contains("\"level\":\"WARN\"") || l.contains("\"level\":\"ERROR\""))
        .count();
    report!(
        "soak done: {} s, {} sessions, {} tool ops, {} misbehaviour rounds, {} flood connections, {} errors, \
         {} log lines at warn+",
        secs,
        counts.sessions.load(Ordering::Relaxed),
        counts.ops.load(Ordering::Relaxed),
        counts.misbehaviour.load(Ordering::Relaxed),
        counts.flood_connections.load(Ordering::Relaxed),
        counts.errors.load(Ordering::Relaxed),
        warnings
    );
    report!(
        "serve RSS: baseline {} KiB (t={}s), peak {peak_rss} KiB, end {} KiB -> {}; fds: baseline {}, peak {peak_fds}, end {} -> {}",
        base.1,
        base.0,
        last.1,
        if rss_flat { "flat" } else { "GROWING" },
        base.2,
        last.2,
        if fds_flat { "flat" } else { "GROWING" }
    );
    drop(serve);
    if !(rss_flat && fds_flat) {
        bail!("RSS or descriptors grew during the soak");
    }
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let outcome = run().await;
    common::results::finish("soak", &outcome)?;
    outcome
}
