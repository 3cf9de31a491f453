//! Shared harness of the task integration tests, on the test kit (`tests/it/common`): a
//! temporary environment whose `sandbox-mcp serve` uses the embedded local provider, or
//! `kind = "e2b"` pointed at a separate `sandbox-mcp provider`, and an MCP session
//! (2026-07-28, no session) with the task tools.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::common::mcp::{McpClient, call, connect_latest, text};
use crate::common::provider::reap_sandboxes;
use crate::common::{API_KEY, Gateway, GatewayBuilder, Provider};

/// Shell: the pids of the sandbox's task channel processes (the supervisor's `channel`, and its
/// spare, a fork with the same command line), lowest first, one per line.
pub const CHANNEL_PIDS: &str = "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null | \
    grep -q ' channel $' && echo ${p#/proc/}; done | sort -n";

/// Shell: waits up to 5 s for the sandbox's task channel; `$c` then holds its pids (empty if none).
pub fn await_channel_pids() -> String {
    format!("for i in $(seq 100); do c=$({CHANNEL_PIDS}); test -n \"$c\" && break; sleep 0.05; done")
}

/// A temporary directory with the serve config and the embedded provider's state. A test that
/// fails part-way leaves its sandboxes behind (the provider keeps them across its own exit, by
/// design): they are killed on drop, before the state dir goes.
pub struct Env {
    pub dir: tempfile::TempDir,
}

impl Drop for Env {
    fn drop(&mut self) {
        reap_sandboxes(&self.state_dir());
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

    /// `serve` with this config (its embedded provider on this env's state dir).
    pub fn serve(&self, config: &Path) -> Gateway {
        GatewayBuilder::config_file(config)
            .state_dir(self.state_dir())
            .env("TASKS_TEST_PROVIDER_KEY", API_KEY)
            .log_filter("info")
            .start()
    }

    /// An env whose `serve` uses the embedded provider with `extra` config, and a session to it.
    pub async fn local(extra: &str) -> (Env, Gateway, Mcp) {
        let env = Env::new();
        let serve = env.serve(&env.write_config(None, extra));
        let mcp = Mcp::connect(&serve.mcp_url()).await;
        (env, serve, mcp)
    }

    /// A separate `sandbox-mcp provider` (sandboxes time out after 600 s).
    pub fn provider(&self) -> Provider {
        Provider::builder().state_dir(self.dir.path().join("provider-state")).args(["--default-timeout", "600"]).start()
    }
}

/// One MCP session.
pub struct Mcp {
    pub client: McpClient,
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
        Self { client: connect_latest(url, None).await }
    }

    /// Ends the session (the client sends DELETE).
    pub async fn close(self) {
        let _ = self.client.cancel().await;
    }

    pub async fn call(&self, tool: &str, args: Value) -> Reply {
        let result = call(&self.client, tool, args).await;
        let text = text(&result);
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
