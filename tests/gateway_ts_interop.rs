//! Interop with the official TypeScript MCP client (`@modelcontextprotocol/client`,
//! installed pinned by scripts/test.sh into `$SANDBOX_MCP_TS_CLIENT_DIR`, run on
//! `$SANDBOX_MCP_NODE_BIN`'s Node 24): tests/interop/ts_client.mjs against a real
//! `serve`; the SDK must print no warning (AJV schema warnings included).
//! Skipped loudly when either variable is unset.

mod gateway_support;

use gateway_support::*;
use serde_json::Value;

#[test]
fn typescript_client_create_run_kill() {
    let (Some(node_bin), Some(client_dir)) =
        (std::env::var_os("SANDBOX_MCP_NODE_BIN"), std::env::var_os("SANDBOX_MCP_TS_CLIENT_DIR"))
    else {
        eprintln!("SKIPPED typescript_client_create_run_kill: set SANDBOX_MCP_NODE_BIN and SANDBOX_MCP_TS_CLIENT_DIR");
        assert!(
            std::env::var_os("SANDBOX_MCP_NO_SKIP").is_none(),
            "SANDBOX_MCP_NO_SKIP is set (scripts/test.sh): this test may not skip"
        );
        return;
    };
    if !require_root("typescript_client_create_run_kill") {
        return;
    }
    let token = "ts-interop-token-0123456789";
    let config = format!("[auth]\ntokens = [ {{ tenant = \"ts\", sha256 = \"{}\" }} ]\n", sha256_hex(token));
    let gateway = GatewayProc::start(&config, &[]);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/interop/ts_client.mjs");
    let output = std::process::Command::new(std::path::Path::new(&node_bin).join("node"))
        .arg(script)
        .arg(gateway.mcp_url())
        .arg(token)
        .arg(&client_dir)
        .output()
        .expect("run node");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "TypeScript client failed:\n{stdout}\n{stderr}");
    let seen: Value = serde_json::from_str(stdout.lines().last().unwrap_or_default()).expect("summary line");
    assert_eq!(seen["tools"], 12, "{seen}");
    assert_eq!(seen["stdout"], "ts\n", "{seen}");
    assert_eq!(seen["killed"], true, "{seen}");
    assert_eq!(seen["warnings"], serde_json::json!([]), "the SDK printed warnings: {seen}");
}
