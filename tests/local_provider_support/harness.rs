//! Test harness for `tests/local_provider.rs`: runs the real `sandbox-mcp provider` binary with
//! its own state directory, speaks raw HTTP to it, and cleans up every sandbox it leaves.

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine;
use reqwest::StatusCode;
use sandbox_mcp::connect_rpc::{EnvelopeDecoder, encode_json_message};
/// Mount points in the host's mount namespace at or under a directory.
pub use sandbox_mcp::local::agent_process::host_mounts_under;
use serde_json::{Value, json};

pub const KEY: &str = "e2b_0000000000000000000000000000000000000000";

pub fn is_root() -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    eprintln!("SKIPPED: local provider tests need root (namespaces, overlayfs, cgroups)");
    assert!(
        std::env::var_os("SANDBOX_MCP_NO_SKIP").is_none(),
        "SANDBOX_MCP_NO_SKIP is set (scripts/test.sh): this test may not skip"
    );
    false
}

/// A running `sandbox-mcp provider` with its own state directory.
pub struct Provider {
    pub child: Option<Child>,
    pub base: String,
    pub state: PathBuf,
    _tmp: Option<tempfile::TempDir>,
    pub http: reqwest::Client,
    extra: Vec<String>,
}

impl Provider {
    pub fn start(extra: &[&str]) -> Provider {
        let tmp = tempfile::Builder::new().prefix("sbx-provider-test").tempdir_in("/var/tmp").unwrap();
        let state = tmp.path().join("state");
        let mut p = Provider {
            child: None,
            base: String::new(),
            state,
            _tmp: Some(tmp),
            http: reqwest::Client::new(),
            extra: extra.iter().map(|s| s.to_string()).collect(),
        };
        p.launch();
        p
    }

    pub fn launch(&mut self) {
        let mut child = Command::new(env!("CARGO_BIN_EXE_sandbox-mcp"))
            .args(["provider", "--listen", "127.0.0.1:0", "--api-key", KEY, "--state-dir"])
            .arg(&self.state)
            .args(&self.extra)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let url = line.trim().rsplit(' ').next().unwrap().to_owned();
        assert!(url.starts_with("http://127.0.0.1:"), "unexpected start line: {line:?}");
        self.base = url;
        self.child = Some(child);
    }

    /// SIGKILLs the provider process only (sandboxes keep running).
    pub fn crash(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().unwrap();
            child.wait().unwrap();
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> (StatusCode, Value) {
        let mut req = self.http.request(method, self.url(path)).header("X-API-Key", KEY);
        if let Some(body) = body {
            req = req.json(&body);
        }
        let resp = req.send().await.unwrap();
        let status = resp.status();
        let text = resp.text().await.unwrap();
        (status, if text.is_empty() { Value::Null } else { serde_json::from_str(&text).unwrap_or(Value::String(text)) })
    }

    pub async fn create(&self, body: Value) -> Value {
        let (status, v) = self.call(reqwest::Method::POST, "/v2/sandboxes", Some(body)).await;
        assert_eq!(status, StatusCode::CREATED, "{v}");
        v
    }

    pub fn record(&self, id: &str) -> Value {
        serde_json::from_slice(&std::fs::read(self.state.join("sandboxes").join(id).join("record.json")).unwrap())
            .unwrap()
    }

    /// Runs `bash -c cmd` in the sandbox through the envd Start RPC; returns (exit code, stdout+stderr).
    pub async fn run(&self, sbx: &Value, cmd: &str, user: Option<&str>) -> (i64, String) {
        let start = json!({"process": {"cmd": "/bin/bash", "args": ["-c", cmd]}, "stdin": false});
        let mut req = self
            .http
            .post(self.url("/process.Process/Start"))
            .header("E2b-Sandbox-Id", sbx["sandboxID"].as_str().unwrap())
            .header("X-Access-Token", sbx["envdAccessToken"].as_str().unwrap())
            .header("Content-Type", "application/connect+json")
            .header("Connect-Protocol-Version", "1")
            .body(encode_json_message(&start));
        if let Some(user) = user {
            let basic = base64::engine::general_purpose::STANDARD.encode(format!("{user}:"));
            req = req.header("Authorization", format!("Basic {basic}"));
        }
        let resp = req.send().await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        let mut dec = EnvelopeDecoder::new();
        dec.push(&resp.bytes().await.unwrap());
        let (mut out, mut code) = (String::new(), None);
        while let Some(env) = dec.next_envelope().unwrap() {
            let msg: Value = serde_json::from_slice(&env.payload).unwrap();
            if let Some(data) = msg.pointer("/event/data") {
                for stream in ["stdout", "stderr"] {
                    if let Some(b64) = data[stream].as_str() {
                        out.push_str(&String::from_utf8_lossy(
                            &base64::engine::general_purpose::STANDARD.decode(b64).unwrap(),
                        ));
                    }
                }
            }
            if let Some(end) = msg.pointer("/event/end") {
                code = Some(end["exitCode"].as_i64().unwrap_or(0));
            }
            if env.is_end_stream() {
                assert!(msg.get("error").is_none(), "stream error: {msg}");
            }
        }
        (code.expect("no end event"), out)
    }
}

impl Drop for Provider {
    fn drop(&mut self) {
        self.crash();
        // Sandboxes outlive their provider by design: kill what this test left, verified by start time.
        let Ok(entries) = std::fs::read_dir(self.state.join("sandboxes")) else { return };
        for entry in entries.flatten() {
            let Ok(bytes) = std::fs::read(entry.path().join("record.json")) else { continue };
            let Ok(rec) = serde_json::from_slice::<Value>(&bytes) else { continue };
            let pid = rec["envd_pid"].as_i64().unwrap_or(0) as i32;
            if agent_alive(pid, entry.path().as_path()) {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
                wait_until(Duration::from_secs(5), || !agent_alive(pid, entry.path().as_path()));
            }
            for cg in rec["cgroups"].as_array().into_iter().flatten() {
                let cg = Path::new(cg.as_str().unwrap_or("/nonexistent"));
                wait_until(Duration::from_secs(3), || std::fs::remove_dir(cg).is_ok() || !cg.exists());
            }
        }
    }
}

pub fn agent_alive(pid: i32, dir: &Path) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let zombie = stat.rsplit(')').next().is_some_and(|s| s.trim_start().starts_with('Z'));
    pid > 0
        && !zombie
        && std::fs::read(format!("/proc/{pid}/cmdline"))
            .is_ok_and(|c| String::from_utf8_lossy(&c).contains(&*dir.to_string_lossy()))
}

pub fn wait_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    cond()
}

/// Asserts nothing of sandbox `id` (agent `pid`) remains on the host.
pub fn assert_nothing_left(p: &Provider, id: &str, pid: i32, cgroups: &[String]) {
    let dir = p.state.join("sandboxes").join(id);
    assert!(
        wait_until(Duration::from_secs(10), || !agent_alive(pid, &dir) && !dir.exists()),
        "sandbox {id} left behind"
    );
    assert!(host_mounts_under(&dir).is_empty(), "mounts left under {}", dir.display());
    for cg in cgroups {
        assert!(wait_until(Duration::from_secs(5), || !Path::new(cg).exists()), "cgroup {cg} left behind");
    }
}

pub fn cgroups_of(rec: &Value) -> Vec<String> {
    rec["cgroups"].as_array().unwrap().iter().map(|v| v.as_str().unwrap().to_owned()).collect()
}

pub fn id_of(v: &Value) -> String {
    v["sandboxID"].as_str().unwrap().to_owned()
}
