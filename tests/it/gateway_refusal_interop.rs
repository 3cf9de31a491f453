//! What a user sees when the gateway refuses a request at the HTTP level, with the real clients:
//! the official Python SDK v2 (`$SANDBOX_MCP_PYTHON_V2`, tests/interop/refusals_v2.py) and the
//! TypeScript client (`$SANDBOX_MCP_NODE_BIN` + `$SANDBOX_MCP_TS_CLIENT_DIR`,
//! tests/interop/refusals_ts.mjs), both in legacy (session) mode against a real `serve`. Each
//! refusal (401 wrong token, 403 Host not allowed, 404 unknown session, 413 body too large, 415 wrong
//! Content-Type, 429 session limit) is a JSON-RPC error body, so the client shows the gateway's reason
//! rather than a bare status. Skipped loudly when the clients are not installed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

use crate::common;
use common::*;
use serde_json::Value;

const TOKEN: &str = "refusal-token-0123456789";
const CASES: [&str; 5] = ["401", "404", "413", "415", "429"];

/// (case, what the user's message must contain).
const EXPECTED: [(&str, &str); 6] = [
    ("401", "invalid bearer token"),
    ("403", "Host header is not allowed"),
    ("404", "session not found"),
    ("413", "request body larger than 2048 bytes"),
    ("415", "content-type must be application/json"),
    ("429", "tenant limit reached"),
];

/// A gateway refusing bodies over 2 KiB and a tenant's second session; another whose allowed Host
/// is not the one the clients use (403).
fn gateways() -> (Gateway, Gateway) {
    let limits = format!(
        "{}[server]\nmax_body_bytes = 2048\n[limits]\nmax_sessions_per_tenant = 1\n",
        tokens_config(&[("refusals", TOKEN)])
    );
    let hosts = format!("{}[server]\nallowed_hosts = [\"only.example\"]\n", tokens_config(&[("refusals", TOKEN)]));
    (Gateway::start(&limits, &[]), Gateway::start(&hosts, &[]))
}

fn check(client: &str, seen: &Value) {
    for (case, expected) in EXPECTED {
        let message = seen[case].as_str().unwrap_or_else(|| panic!("{client}: no {case} case: {seen}"));
        assert!(
            message.to_lowercase().contains(&expected.to_lowercase()),
            "{client}, HTTP {case}: the user sees {message:?}, not {expected:?}"
        );
    }
}

fn last_json_line(stdout: &str) -> Value {
    serde_json::from_str(stdout.lines().last().unwrap_or_default()).expect("summary line")
}

fn merged(a: Value, b: Value) -> Value {
    let mut a = a.as_object().cloned().unwrap_or_default();
    a.extend(b.as_object().cloned().unwrap_or_default());
    Value::Object(a)
}

#[test]
fn python_sdk_v2_shows_the_reason_of_each_refusal() {
    let python = require_env!("SANDBOX_MCP_PYTHON_V2", "a python with mcp==2.3.0");
    require_root!();
    let (limits, hosts) = gateways();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/interop/refusals_v2.py");
    let run = |gateway: &Gateway, cases: &[&str]| {
        let mut python = std::process::Command::new(&python);
        let (stdout, _) = run_checked(python.arg(script).arg(gateway.mcp_url()).arg(TOKEN).args(cases), Some(gateway));
        last_json_line(&stdout)
    };
    let seen = merged(run(&limits, &CASES), run(&hosts, &["403"]));
    println!("{seen}");
    check("python", &seen);
}

#[test]
fn typescript_client_shows_the_reason_of_each_refusal() {
    let node_bin = require_env!("SANDBOX_MCP_NODE_BIN", "the Node 24 bin dir");
    let client_dir = require_env!("SANDBOX_MCP_TS_CLIENT_DIR", "the pinned TypeScript client install");
    require_root!();
    let (limits, hosts) = gateways();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/interop/refusals_ts.mjs");
    let run = |gateway: &Gateway, cases: &[&str]| {
        let mut node = std::process::Command::new(std::path::Path::new(&node_bin).join("node"));
        let command = node.arg(script).arg(gateway.mcp_url()).arg(TOKEN).arg(&client_dir).args(cases);
        last_json_line(&run_checked(command, Some(gateway)).0)
    };
    let seen = merged(run(&limits, &CASES), run(&hosts, &["403"]));
    println!("{seen}");
    check("typescript", &seen);
}
