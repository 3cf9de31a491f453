//! Harness of the local provider tests (`local_provider`, `sandbox_network`, `sandbox_privileges`):
//! the kit's provider (`tests/it/common`) with raw HTTP and envd calls, the sandbox records, and the
//! checks that nothing of a sandbox is left on the host.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly
#![allow(dead_code)] // each test binary uses a part of it

use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine;
use reqwest::StatusCode;
use sandbox_mcp::connect_rpc::{EnvelopeDecoder, encode_json_message};
/// Mount points in the host's mount namespace at or under a directory.
pub use sandbox_mcp::local::control::agent_process::host_mounts_under;
use serde_json::{Value, json};

pub(crate) use crate::common::require_root;
pub use crate::common::{API_KEY, ProcessGuard, agent_alive, wait_until};

/// A running `sandbox-mcp provider` (the kit's, state under /var/tmp) and a raw HTTP client.
pub struct Provider {
    pub inner: crate::common::Provider,
    /// Its state directory.
    pub state: PathBuf,
    pub http: reqwest::Client,
}

impl Provider {
    pub fn start(extra: &[&str]) -> Provider {
        let inner = crate::common::Provider::builder().args(extra).temp_in("/var/tmp").start();
        Provider { state: inner.state_dir.clone(), inner, http: reqwest::Client::new() }
    }

    /// `http://ADDR` of the running provider.
    pub fn base(&self) -> String {
        self.inner.url()
    }

    /// Starts the provider again (after [`crash`](Self::crash) or [`take_process`](Self::take_process)).
    pub fn launch(&mut self) {
        self.inner.restart();
    }

    /// SIGKILLs the provider process only (sandboxes keep running).
    pub fn crash(&mut self) {
        self.inner.crash();
    }

    /// The provider process, for a test that signals and waits for it itself.
    pub fn take_process(&mut self) -> ProcessGuard {
        self.inner.take_process().expect("the provider is running")
    }

    pub fn url(&self, path: &str) -> String {
        self.inner.url_of(path)
    }

    pub async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> (StatusCode, Value) {
        let mut req = self.http.request(method, self.url(path)).header("X-API-Key", API_KEY);
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
