//! The one test kit of the integration tests (`mod common;`) and the benchmarks
//! (`#[path = "../tests/it/common/mod.rs"] mod common;`):
//! - [`gate`]: the skip gate (`require_root!`, `require_env!`, `require_command!`) that
//!   `SANDBOX_MCP_NO_SKIP=1` turns into a failure;
//! - [`process`]: the process guard (process group, stop and reap on drop), captured logs, the
//!   parser of the "listening" lines;
//! - [`provider`] and [`gateway`]: the real `sandbox-mcp provider` and `sandbox-mcp serve` on
//!   port 0, cleaned up on drop;
//! - [`mcp`]: the MCP client helpers;
//! - [`redis_server`]: a private `redis-server`;
//! - [`stats`]: percentiles and the benches' summary lines; [`results`]: the benches' results files;
//!   [`proc_cpu`]: a process tree's CPU time by process, from `/proc`;
//! - [`testnet`]: a network namespace standing in for the internet and a private network.
#![allow(dead_code, unused_imports, unused_macros)] // each test binary uses a part of this kit
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

pub mod gate;
pub mod gateway;
pub mod mcp;
pub mod proc_cpu;
pub mod process;
pub mod provider;
pub mod redis_server;
pub mod results;
pub mod stats;
pub mod testnet;

use std::time::{Duration, Instant};

pub use gateway::{Gateway, GatewayBuilder, e2b_config, with_free_port};

/// The gateway's tools, sorted: the one list the tests compare a live `tools/list` with.
pub const TOOLS: [&str; 17] = [
    "cancel_task",
    "connect_sandbox",
    "create_sandbox",
    "delete_snapshot",
    "fork_sandbox",
    "get_task",
    "kill_sandbox",
    "list_files",
    "list_sandboxes",
    "list_snapshots",
    "list_tasks",
    "list_templates",
    "read_file",
    "run_command",
    "snapshot_sandbox",
    "start_task",
    "write_file",
];
pub use mcp::{McpClient, call, close, connect, connect_latest, empty, err, ok, text};
pub use process::{Log, ProcessGuard, binary, eventually, host_processes_with, rss_kib, wait_until};
pub use provider::{API_KEY, Provider, ProviderBuilder, agent_alive, agent_pid};
use sandbox_mcp::e2b::E2bClient;

/// Returns from the calling test (or helper, with the value given) after a loud skip unless
/// running as root; under `SANDBOX_MCP_NO_SKIP=1` the skip is a failure.
macro_rules! require_root {
    () => {
        if !$crate::common::gate::root_or_skip() {
            return;
        }
    };
    ($otherwise:expr) => {
        if !$crate::common::gate::root_or_skip() {
            return $otherwise;
        }
    };
}

/// The value of an environment variable the test needs (`require_env!("VAR", "what to set")`);
/// returns from the test after a loud skip when unset (a failure under `SANDBOX_MCP_NO_SKIP=1`).
macro_rules! require_env {
    ($var:expr, $what:expr) => {
        match $crate::common::gate::env_or_skip($var, $what) {
            Some(value) => value,
            None => return,
        }
    };
    ($var:expr, $what:expr, $otherwise:expr) => {
        match $crate::common::gate::env_or_skip($var, $what) {
            Some(value) => value,
            None => return $otherwise,
        }
    };
}

/// Returns from the test after a loud skip when a program the test needs is not installed.
macro_rules! require_command {
    ($program:expr) => {
        if !$crate::common::gate::command_or_skip($program) {
            return;
        }
    };
    ($program:expr, $otherwise:expr) => {
        if !$crate::common::gate::command_or_skip($program) {
            return $otherwise;
        }
    };
}

pub(crate) use {require_command, require_env, require_root};

/// True while the provider still knows the sandbox.
pub async fn sandbox_exists(provider: &E2bClient, id: &str) -> bool {
    match provider.get_sandbox(id).await {
        Ok(_) => true,
        Err(e) if e.is_not_found() => false,
        Err(e) => panic!("get_sandbox({id}): {e}"),
    }
}

/// Waits until the sandbox is gone from the provider.
pub async fn wait_gone(provider: &E2bClient, id: &str, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if !sandbox_exists(provider, id).await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    false
}

/// A gateway (embedded provider) that accepts one bearer token, for one tenant.
#[track_caller]
pub fn gateway_with_token(tenant: &str, token: &str) -> Gateway {
    Gateway::start(&tokens_config(&[(tenant, token)]), &[])
}

/// Runs a client program (an SDK script, a README snippet) to its end and returns its stdout and
/// stderr; when it fails, panics with both and the log of `gateway`.
#[track_caller]
pub fn run_checked(command: &mut std::process::Command, gateway: Option<&Gateway>) -> (String, String) {
    let output = command.output().unwrap_or_else(|e| panic!("cannot run {command:?}: {e}"));
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    let log = gateway.map(Gateway::log_text).unwrap_or_default();
    assert!(output.status.success(), "{command:?} failed ({}):\n{stdout}\n{stderr}\nserve log:\n{log}", output.status);
    (stdout, stderr)
}

/// The `[auth] tokens` config of these (tenant, token) pairs.
pub fn tokens_config(tenants: &[(&str, &str)]) -> String {
    let entries: Vec<String> = tenants
        .iter()
        .map(|(tenant, token)| format!("{{ tenant = \"{tenant}\", sha256 = \"{}\" }}", sha256_hex(token)))
        .collect();
    format!("[auth]\ntokens = [ {} ]\n", entries.join(", "))
}

/// The SHA-256 (hex) of a gateway token, as `[auth] tokens` holds it.
pub fn sha256_hex(token: &str) -> String {
    sandbox_mcp::gateway::http::auth::token_hash_hex(token)
}
