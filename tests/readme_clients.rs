//! The README's client set-ups cannot rot: every fenced block tagged
//! `readme-test` is extracted from README.md. The Python SDK v2 and
//! TypeScript snippets run against a real `serve` (with
//! `$SANDBOX_MCP_PYTHON_V2`, `$SANDBOX_MCP_NODE_BIN` + `$SANDBOX_MCP_TS_CLIENT_DIR`;
//! skipped loudly when unset); the Claude Code command and the VS Code / Cursor `mcp.json` are
//! checked for shape (transport, URL on /mcp, bearer header).

mod gateway_support;

use gateway_support::*;
use serde_json::Value;

/// The README's `readme-test` blocks: (info string, body).
fn blocks() -> Vec<(String, String)> {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).expect("README.md");
    let mut out = Vec::new();
    let mut current: Option<(String, String)> = None;
    for line in readme.lines() {
        match (&mut current, line.strip_prefix("```")) {
            (None, Some(info)) if info.contains("readme-test") => current = Some((info.to_string(), String::new())),
            (Some(_), Some("")) => out.extend(current.take()),
            (Some((_, body)), _) => {
                body.push_str(line);
                body.push('\n');
            }
            _ => {}
        }
    }
    out
}

fn block(tag: &str) -> String {
    blocks()
        .into_iter()
        .find(|(info, _)| info.split_whitespace().collect::<Vec<_>>().join(" ") == tag)
        .unwrap_or_else(|| panic!("README has no ```{tag} block"))
        .1
}

#[test]
fn readme_python_v2_snippet_runs() {
    let snippet = block("python readme-test");
    let Some(python) = std::env::var_os("SANDBOX_MCP_PYTHON_V2") else {
        eprintln!("SKIPPED readme_python_v2_snippet_runs: set SANDBOX_MCP_PYTHON_V2 to a python with mcp==2.3.0");
        assert!(
            std::env::var_os("SANDBOX_MCP_NO_SKIP").is_none(),
            "SANDBOX_MCP_NO_SKIP is set (scripts/test.sh): this test may not skip"
        );
        return;
    };
    if !require_root("readme_python_v2_snippet_runs") {
        return;
    }
    let token = "readme-token-0123456789";
    let config = format!("[auth]\ntokens = [ {{ tenant = \"readme\", sha256 = \"{}\" }} ]\n", sha256_hex(token));
    let gateway = GatewayProc::start(&config, &[]);
    let dir = tempfile::tempdir().expect("tempdir");
    let script = dir.path().join("snippet.py");
    std::fs::write(&script, snippet).expect("write snippet");
    let output = std::process::Command::new(python)
        .arg(&script)
        .env("SANDBOX_MCP_URL", gateway.mcp_url())
        .env("SANDBOX_MCP_TOKEN", token)
        .output()
        .expect("run snippet");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "README snippet failed:\n{stdout}\n{stderr}");
    assert_eq!(stdout.trim(), "Linux", "{stdout}\n{stderr}");
}

#[test]
fn readme_typescript_snippet_runs() {
    let snippet = block("js readme-test");
    let (Some(node_bin), Some(client_dir)) =
        (std::env::var_os("SANDBOX_MCP_NODE_BIN"), std::env::var_os("SANDBOX_MCP_TS_CLIENT_DIR"))
    else {
        eprintln!("SKIPPED readme_typescript_snippet_runs: set SANDBOX_MCP_NODE_BIN and SANDBOX_MCP_TS_CLIENT_DIR");
        assert!(
            std::env::var_os("SANDBOX_MCP_NO_SKIP").is_none(),
            "SANDBOX_MCP_NO_SKIP is set (scripts/test.sh): this test may not skip"
        );
        return;
    };
    if !require_root("readme_typescript_snippet_runs") {
        return;
    }
    let token = "readme-ts-token-0123456789";
    let config = format!("[auth]\ntokens = [ {{ tenant = \"readme\", sha256 = \"{}\" }} ]\n", sha256_hex(token));
    let gateway = GatewayProc::start(&config, &[]);
    // Beside the installed client's node_modules, so the bare import resolves.
    let script = std::path::Path::new(&client_dir).join(format!("readme-snippet-{}.mjs", std::process::id()));
    std::fs::write(&script, snippet).expect("write snippet");
    let output = std::process::Command::new(std::path::Path::new(&node_bin).join("node"))
        .arg(&script)
        .env("SANDBOX_MCP_URL", gateway.mcp_url())
        .env("SANDBOX_MCP_TOKEN", token)
        .output();
    let _ = std::fs::remove_file(&script);
    let output = output.expect("run node");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "README TypeScript snippet failed:\n{stdout}\n{stderr}");
    assert_eq!(stdout.trim(), "Linux", "{stdout}\n{stderr}");
}

fn check_server_entry(entry: &Value, needs_type: bool) {
    if needs_type {
        assert_eq!(entry["type"], "http", "{entry}");
    }
    let url = entry["url"].as_str().expect("url");
    assert!(url.starts_with("http") && url.ends_with("/mcp"), "{url}");
    let auth = entry["headers"]["Authorization"].as_str().expect("Authorization header");
    assert!(auth.starts_with("Bearer ") && auth.len() > 7, "{auth}");
}

#[test]
fn readme_client_configs_have_the_right_shape() {
    let vscode: Value = serde_json::from_str(&block("json readme-test vscode")).expect("VS Code mcp.json parses");
    check_server_entry(&vscode["servers"]["sandbox"], true);
    let cursor: Value = serde_json::from_str(&block("json readme-test cursor")).expect("Cursor mcp.json parses");
    check_server_entry(&cursor["mcpServers"]["sandbox"], false);

    let claude = block("sh readme-test");
    let words: Vec<&str> = claude.split_whitespace().collect();
    assert_eq!(&words[..3], ["claude", "mcp", "add"], "{claude}");
    let transport = words.iter().position(|w| *w == "--transport").expect("--transport");
    assert_eq!(words[transport + 1], "http");
    assert!(words.iter().any(|w| w.starts_with("http://") && w.ends_with("/mcp")), "{claude}");
    assert!(claude.contains("--header \"Authorization: Bearer "), "{claude}");
}
