//! Test helpers for sessions in Redis: a private `redis-server`, a provider
//! whose log counts kill calls, and replica configs.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::gateway_support::*;

/// A `redis-server` on a private port with its data (append-only file) in a temp dir.
pub struct RedisProc {
    child: Option<Child>,
    pub port: u16,
    dir: tempfile::TempDir,
}

impl RedisProc {
    /// None (after a loud skip) when redis-server is missing.
    pub fn start(test: &str) -> Option<Self> {
        if Command::new("redis-server").arg("--version").output().is_err() {
            eprintln!("SKIPPED {test}: redis-server is not installed (scripts/test.sh installs it)");
            assert!(
                std::env::var_os("SANDBOX_MCP_NO_SKIP").is_none(),
                "SANDBOX_MCP_NO_SKIP is set (scripts/test.sh): this test may not skip"
            );
            return None;
        }
        let mut redis = Self { child: None, port: free_port(), dir: tempfile::tempdir().expect("tempdir") };
        redis.spawn();
        Some(redis)
    }

    pub fn spawn(&mut self) {
        let child = Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &self.port.to_string(), "--save", "", "--appendonly", "yes"])
            .args(["--appendfsync", "always", "--protected-mode", "no", "--dir"])
            .arg(self.dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn redis-server");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if self.cli(&["PING"]).trim() == "PONG" {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("redis-server did not start on port {}", self.port);
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Runs a command with redis-cli (or a raw RESP exchange) and returns the reply text.
    pub fn cli(&self, args: &[&str]) -> String {
        let output = Command::new("redis-cli").args(["-p", &self.port.to_string()]).args(args).output();
        match output {
            Ok(out) => String::from_utf8_lossy(&out.stdout).to_string(),
            Err(_) => String::new(),
        }
    }

    /// Stops the server (its data stays in the append-only file).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(child.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
            let _ = child.wait();
        }
    }
}

impl Drop for RedisProc {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A `sandbox-mcp provider` whose log is captured (to count the kill calls it receives).
pub struct CountingProvider {
    pub inner: ProviderProc,
    log: Arc<Mutex<String>>,
    _tmp: tempfile::TempDir,
}

impl CountingProvider {
    pub fn start() -> Self {
        let tmp = tempfile::tempdir().expect("tempdir");
        let state_dir: PathBuf = tmp.path().join("state");
        let api_key = "redis-test-provider-key-0123456789";
        let mut child = Command::new(BIN)
            .args(["provider", "--listen", "127.0.0.1:0", "--state-dir"])
            .arg(&state_dir)
            .args(["--api-key", api_key])
            .env("RUST_LOG", "warn,sandbox_mcp::local::api=info")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn provider");
        let stdout = child.stdout.take().expect("stdout");
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).expect("provider stdout");
        let addr: SocketAddr = line
            .trim()
            .rsplit("http://")
            .next()
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("provider did not print its address: {line:?}"));
        let log = Arc::new(Mutex::new(String::new()));
        let sink = Arc::clone(&log);
        let stderr = child.stderr.take().expect("stderr");
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let mut log = sink.lock().unwrap();
                log.push_str(&line);
                log.push('\n');
            }
        });
        let inner = ProviderProc::adopt(child, addr, api_key, &state_dir);
        Self { inner, log, _tmp: tmp }
    }

    /// Kill calls the provider received for `sandbox_id`.
    pub fn kills(&self, sandbox_id: &str) -> usize {
        self.log.lock().unwrap().lines().filter(|l| l.contains("kill requested") && l.contains(sandbox_id)).count()
    }
}

pub fn redis_config(redis: &RedisProc, prefix: &str, idle_secs: u64) -> String {
    format!(
        "[server]\nsession_idle_timeout_secs = {idle_secs}\n[sessions]\nstore = \"{}\"\nkey_prefix = \"{prefix}\"\n\
         sweep_interval_secs = 1\ncleanup_lease_secs = 3\ntimeout_ms = 500\n",
        redis.url()
    )
}

pub fn replica(provider: &CountingProvider, config: &str) -> GatewayProc {
    GatewayProc::start_e2b(&provider.inner, config, &[])
}

pub fn unique_prefix(test: &str) -> String {
    format!("t{}-{test}", std::process::id())
}

/// The only session id in Redis (the tests run one session per prefix).
pub fn session_ids(redis: &RedisProc, prefix: &str) -> Vec<String> {
    redis
        .cli(&["ZRANGE", &format!("{prefix}:expiry"), "0", "-1"])
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(str::to_string)
        .collect()
}

pub async fn wait_until(timeout: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if check() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    check()
}
