//! Shared harness of the task integration tests: spawns the real
//! `sandbox-mcp serve` (embedded local provider, or `kind = "e2b"` pointed
//! at a separate `sandbox-mcp provider` process) on 127.0.0.1 port 0, and
//! talks to it with rmcp's streamable HTTP client.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use rmcp::model::{CallToolRequestParams, CallToolResult, ClientConfig};
use rmcp::service::RunningService;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::{RoleClient, ServiceExt};
use serde_json::{Value, json};

pub const BIN: &str = env!("CARGO_BIN_EXE_sandbox-mcp");

/// True if the tests can create sandboxes here (root); prints a loud skip otherwise.
pub fn can_run() -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    eprintln!("\n!!!!! SKIPPED: task integration tests need root (namespaces for the local provider) !!!!!\n");
    assert!(
        std::env::var_os("SANDBOX_MCP_NO_SKIP").is_none(),
        "SANDBOX_MCP_NO_SKIP is set (scripts/test.sh): this test may not skip"
    );
    false
}

/// A child process killed (SIGKILL) and reaped on drop.
pub struct Proc {
    pub child: Child,
}

impl Proc {
    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM, then SIGKILL after `grace`.
    pub fn terminate(&mut self, grace: Duration) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid()), nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.kill9();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.terminate(Duration::from_secs(20));
        }
    }
}

/// Spawns `args`, copying its stderr (or stdout) to `log` and returning the first line for which `find` says Some.
fn spawn_and_find(
    args: &[&str],
    envs: &[(&str, &str)],
    log: &Path,
    from_stdout: bool,
    find: fn(&str) -> Option<String>,
) -> (Proc, String) {
    let mut cmd = Command::new(BIN);
    cmd.args(args).stdin(Stdio::null());
    for (k, v) in envs {
        cmd.env(k, v);
    }
    if from_stdout {
        cmd.stdout(Stdio::piped()).stderr(std::fs::File::create(log).unwrap());
    } else {
        cmd.stdout(Stdio::null()).stderr(Stdio::piped());
    }
    let mut child = cmd.spawn().expect("spawn sandbox-mcp");
    let pipe: Box<dyn std::io::Read + Send> =
        if from_stdout { Box::new(child.stdout.take().unwrap()) } else { Box::new(child.stderr.take().unwrap()) };
    let (tx, rx) = mpsc::channel();
    let log_path = log.to_path_buf();
    std::thread::spawn(move || {
        use std::io::Write;
        let mut out = std::fs::OpenOptions::new().create(true).append(true).open(log_path).unwrap();
        let mut sent = false;
        for line in BufReader::new(pipe).lines() {
            let Ok(line) = line else { break };
            let _ = writeln!(out, "{line}");
            if !sent && let Some(found) = find(&line) {
                let _ = tx.send(found);
                sent = true;
            }
        }
    });
    let proc = Proc { child };
    match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(found) => (proc, found),
        Err(_) => {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            panic!("{args:?} did not start; log:\n{text}");
        }
    }
}

/// A running `sandbox-mcp serve`.
pub struct Serve {
    pub proc: Proc,
    pub url: String,
}

/// A running `sandbox-mcp provider`.
pub struct Provider {
    pub proc: Proc,
    pub url: String,
}

pub struct Env {
    pub dir: tempfile::TempDir,
}

/// A test that fails part-way leaves its sandboxes behind (the provider keeps them across its own
/// exit, by design): kill whatever the embedded provider of this env still records, and remove
/// their cgroups, before the state dir goes.
impl Drop for Env {
    fn drop(&mut self) {
        let Ok(entries) = std::fs::read_dir(self.state_dir().join("sandboxes")) else { return };
        for entry in entries.flatten() {
            let Ok(text) = std::fs::read_to_string(entry.path().join("record.json")) else { continue };
            let Ok(record) = serde_json::from_str::<Value>(&text) else { continue };
            let pid = record["envd_pid"].as_i64().unwrap_or(0) as i32;
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            // Only a process that really is this sandbox's agent.
            if pid > 0 && String::from_utf8_lossy(&cmdline).contains(&*entry.path().to_string_lossy()) {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
                for _ in 0..100 {
                    if !Path::new(&format!("/proc/{pid}")).exists() {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
            for cgroup in record["cgroups"].as_array().into_iter().flatten().filter_map(Value::as_str) {
                let _ = std::fs::remove_dir(cgroup);
            }
        }
    }
}

impl Env {
    pub fn new() -> Self {
        Self { dir: tempfile::tempdir().unwrap() }
    }

    pub fn state_dir(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    /// Writes a serve config; `provider_url` selects `kind = "e2b"` against a separate provider.
    pub fn write_config(&self, provider_url: Option<&str>, extra: &str) -> PathBuf {
        let provider = match provider_url {
            Some(url) => format!(
                "[provider]\nkind = \"e2b\"\napi_url = \"{url}\"\nsandbox_url = \"{url}\"\napi_key_env = \"TASKS_TEST_PROVIDER_KEY\"\n"
            ),
            None => "[provider]\nkind = \"local\"\n".to_string(),
        };
        let text = format!(
            "[server]\nlisten = \"127.0.0.1:0\"\nlog_format = \"json\"\nshutdown_grace_secs = 5\n\n{provider}\n\
             [local]\nstate_dir = \"{}\"\nmax_sandboxes = 50\n\n[sandbox]\ndefault_timeout_secs = 600\n\n{extra}\n",
            self.state_dir().display()
        );
        let path = self.dir.path().join("serve.toml");
        std::fs::write(&path, text).unwrap();
        path
    }

    pub fn serve(&self, config: &Path) -> Serve {
        let log = self.dir.path().join(format!("serve-{}.log", rand_suffix()));
        let (proc, addr) = spawn_and_find(
            &["serve", "--config", config.to_str().unwrap()],
            &[("TASKS_TEST_PROVIDER_KEY", "provider-key-for-tests-123456"), ("RUST_LOG", "info")],
            &log,
            false,
            |line| {
                let v: Value = serde_json::from_str(line).ok()?;
                let msg = v.get("message")?.as_str()?;
                if msg.contains("gateway listening") { v.get("addr")?.as_str().map(str::to_string) } else { None }
            },
        );
        Serve { proc, url: format!("http://{addr}/mcp") }
    }

    pub fn provider(&self) -> Provider {
        let log = self.dir.path().join(format!("provider-{}.log", rand_suffix()));
        let state = self.dir.path().join("provider-state");
        let (proc, url) = spawn_and_find(
            &[
                "provider",
                "--listen",
                "127.0.0.1:0",
                "--state-dir",
                state.to_str().unwrap(),
                "--default-timeout",
                "600",
            ],
            &[("E2B_API_KEY", "provider-key-for-tests-123456")],
            &log,
            true,
            |line| line.strip_prefix("sandbox-mcp provider listening on ").map(|s| s.trim().to_string()),
        );
        Provider { proc, url }
    }
}

fn rand_suffix() -> String {
    format!("{:08x}", rand::random::<u32>())
}

/// One MCP session.
pub struct Mcp {
    pub client: RunningService<RoleClient, ClientConfig>,
}

/// A tool call's outcome.
#[derive(Debug)]
pub struct Reply {
    pub is_error: bool,
    pub value: Value,
    pub text: String,
}

impl Reply {
    #[track_caller]
    pub fn ok(self) -> Value {
        assert!(!self.is_error, "tool error: {}", self.text);
        self.value
    }

    #[track_caller]
    pub fn err(self) -> String {
        assert!(self.is_error, "expected a tool error, got {}", self.text);
        self.text
    }
}

impl Mcp {
    pub async fn connect(url: &str) -> Self {
        let transport = StreamableHttpClientTransport::from_uri(url.to_string());
        let client = ClientConfig::default().serve(transport).await.expect("MCP initialize");
        Self { client }
    }

    /// Ends the session (the client sends DELETE).
    pub async fn close(self) {
        let _ = self.client.cancel().await;
    }

    pub async fn call(&self, tool: &str, args: Value) -> Reply {
        let Value::Object(map) = args else { panic!("arguments must be an object") };
        let result: CallToolResult = self
            .client
            .call_tool(CallToolRequestParams::new(tool.to_string()).with_arguments(map))
            .await
            .unwrap_or_else(|e| panic!("{tool}: protocol error {e}"));
        let text =
            result.content.iter().filter_map(|c| c.as_text().map(|t| t.text.clone())).collect::<Vec<_>>().join("\n");
        Reply { is_error: result.is_error == Some(true), value: result.structured_content.unwrap_or(Value::Null), text }
    }

    pub async fn create_sandbox(&self) -> String {
        let v = self.call("create_sandbox", json!({})).await.ok();
        v["sandbox_id"].as_str().unwrap().to_string()
    }

    pub async fn start_task(&self, sandbox_id: &str, command: &str, extra: Value) -> Value {
        let mut args = json!({"sandbox_id": sandbox_id, "command": command});
        if let Value::Object(e) = extra {
            args.as_object_mut().unwrap().extend(e);
        }
        self.call("start_task", args).await.ok()
    }

    pub async fn get_task(&self, sandbox_id: &str, task_id: &str, extra: Value) -> Value {
        let mut args = json!({"sandbox_id": sandbox_id, "task_id": task_id});
        if let Value::Object(e) = extra {
            args.as_object_mut().unwrap().extend(e);
        }
        self.call("get_task", args).await.ok()
    }

    /// Polls get_task (with wait_seconds) until the task is no longer running.
    pub async fn wait_done(&self, sandbox_id: &str, task_id: &str, within: Duration) -> Value {
        let deadline = Instant::now() + within;
        loop {
            let v = self.get_task(sandbox_id, task_id, json!({"wait_seconds": 5, "limit": 1})).await;
            if v["state"] != "running" || Instant::now() > deadline {
                return v;
            }
        }
    }

    /// Reads a whole stream by paging with `limit`, checking offsets advance exactly.
    pub async fn read_stream(&self, sandbox_id: &str, task_id: &str, stream: &str, limit: u64) -> (String, Value) {
        let mut text = String::new();
        let mut offset = 0u64;
        let key = format!("{stream}_offset");
        let next_key = format!("{stream}_next_offset");
        loop {
            let v = self.get_task(sandbox_id, task_id, json!({ key.clone(): offset, "limit": limit })).await;
            let page = v[stream].as_str().unwrap();
            let next = v[next_key.as_str()].as_u64().unwrap();
            assert_eq!(next - offset, page.len() as u64, "offsets advance by the page's byte length (ASCII)");
            assert!(next - offset <= limit);
            text.push_str(page);
            if next == offset {
                return (text, v);
            }
            offset = next;
        }
    }
}

/// Is a sandbox still listed by the provider? (via list_sandboxes of a fresh session).
pub async fn sandbox_alive(url: &str, sandbox_id: &str) -> bool {
    let mcp = Mcp::connect(url).await;
    let v = mcp.call("list_sandboxes", json!({})).await.ok();
    mcp.close().await;
    v.to_string().contains(sandbox_id)
}
