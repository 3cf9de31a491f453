//! The README's client set-ups cannot rot: every fenced block tagged
//! `readme-test` is extracted from README.md. The Python SDK v2,
//! TypeScript and MCP Inspector CLI snippets run against a real `serve` (with
//! `$SANDBOX_MCP_PYTHON_V2`, `$SANDBOX_MCP_NODE_BIN` + `$SANDBOX_MCP_TS_CLIENT_DIR`,
//! `$SANDBOX_MCP_NODE_BIN` + `$SANDBOX_MCP_INSPECTOR_DIR`; skipped loudly when unset); the
//! Claude Code command and the VS Code / Cursor `mcp.json` are checked for shape (transport,
//! URL on /mcp, bearer header).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

use crate::common;
use common::*;
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
    let python = require_env!("SANDBOX_MCP_PYTHON_V2", "a python with mcp==2.3.0");
    require_root!();
    let token = "readme-token-0123456789";
    let gateway = gateway_with_token("readme", token);
    let dir = tempfile::tempdir().expect("tempdir");
    let script = dir.path().join("snippet.py");
    std::fs::write(&script, snippet).expect("write snippet");
    let mut python = std::process::Command::new(python);
    let (stdout, stderr) = run_checked(
        python.arg(&script).env("SANDBOX_MCP_URL", gateway.mcp_url()).env("SANDBOX_MCP_TOKEN", token),
        Some(&gateway),
    );
    assert_eq!(stdout.trim(), "Linux", "{stdout}\n{stderr}");
}

#[test]
fn readme_typescript_snippet_runs() {
    run_typescript_block("js readme-test");
}

/// The MCP tasks snippet: ext-tasks with rawDispatch and v2RequestFraming, a task-run `uname -s`.
#[test]
fn readme_typescript_mcp_tasks_snippet_runs() {
    run_typescript_block("js readme-test tasks");
}

fn run_typescript_block(tag: &str) {
    let snippet = block(tag);
    let node_bin = require_env!("SANDBOX_MCP_NODE_BIN", "the Node 24 bin dir");
    let client_dir = require_env!("SANDBOX_MCP_TS_CLIENT_DIR", "the pinned TypeScript client install");
    require_root!();
    let token = "readme-ts-token-0123456789";
    let gateway = gateway_with_token("readme", token);
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

/// The README's example URL and token, replaced by the test gateway's.
const README_URL: &str = "http://127.0.0.1:8080/mcp";
const README_TOKEN: &str = "my-token";

/// Runs one README shell line (URL, token and `SANDBOX_ID` substituted) with the pinned Inspector's
/// directory as working directory, so its `npx` resolves the local install (offline: nothing is
/// downloaded). Returns (success, stdout, stderr).
fn run_inspector_line(line: &str, env: &InspectorEnv, url: &str, token: &str, sandbox: &str) -> (bool, String, String) {
    let line = line.replace(README_URL, url).replace(README_TOKEN, token).replace("SANDBOX_ID", sandbox);
    let output = std::process::Command::new("sh")
        .arg("-c")
        .arg(&line)
        .current_dir(&env.install_dir)
        .env("PATH", &env.path)
        .env("HOME", env.home.path())
        .env("npm_config_offline", "true")
        .env("npm_config_update_notifier", "false")
        .output()
        .expect("run sh");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    (output.status.success(), stdout, stderr)
}

struct InspectorEnv {
    install_dir: std::path::PathBuf,
    path: std::ffi::OsString,
    home: tempfile::TempDir,
    _shim: tempfile::TempDir,
}

/// `PATH` with an `npx` that runs the npm CLI shipped beside the wheel's Node (the wheel's own
/// `bin/npx` looks for a `lib/` it does not sit beside), then that Node.
fn inspector_env(node_bin: &std::path::Path, install_dir: &std::path::Path) -> InspectorEnv {
    use std::os::unix::fs::PermissionsExt;
    let shim = tempfile::tempdir().expect("tempdir");
    let npx = shim.path().join("npx");
    let cli = node_bin.join("../lib/node_modules/npm/bin/npx-cli.js");
    std::fs::write(&npx, format!("#!/bin/sh\nexec '{}' '{}' \"$@\"\n", node_bin.join("node").display(), cli.display()))
        .expect("write npx shim");
    std::fs::set_permissions(&npx, std::fs::Permissions::from_mode(0o755)).expect("chmod npx shim");
    let mut dirs = vec![shim.path().to_path_buf(), node_bin.to_path_buf()];
    dirs.extend(std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()));
    InspectorEnv {
        install_dir: install_dir.to_path_buf(),
        path: std::env::join_paths(dirs).expect("PATH"),
        home: tempfile::tempdir().expect("tempdir"),
        _shim: shim,
    }
}

/// The JSON document an Inspector CLI run printed (text mode: pretty-printed JSON on stdout).
fn inspector_json(stdout: &str) -> Value {
    let start = stdout.find('{').unwrap_or(0);
    serde_json::from_str(stdout[start..].trim())
        .unwrap_or_else(|e| panic!("Inspector output is not JSON ({e}):\n{stdout}"))
}

#[test]
fn readme_inspector_cli_snippet_runs_without_portability_findings() {
    let snippet = block("sh readme-test inspector");
    let node_bin = require_env!("SANDBOX_MCP_NODE_BIN", "the Node 24 bin dir");
    let install_dir = require_env!("SANDBOX_MCP_INSPECTOR_DIR", "the pinned MCP Inspector install");
    require_root!();
    let install_dir = std::path::PathBuf::from(install_dir);
    // The README pins the version scripts/test.sh installs.
    let package =
        std::fs::read_to_string(install_dir.join("node_modules/@modelcontextprotocol/inspector/package.json"))
            .expect("the pinned Inspector is installed");
    let installed: Value = serde_json::from_str(&package).expect("package.json");
    let pinned = format!("@modelcontextprotocol/inspector@{} --cli", installed["version"].as_str().unwrap_or("?"));
    let lines: Vec<&str> = snippet.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 4, "list, create, run, kill:\n{snippet}");
    for line in &lines {
        assert!(line.starts_with("npx -y ") && line.contains(&pinned), "{line} (installed: {pinned})");
        assert!(line.contains("--protocol-era modern"), "{line}");
    }

    let token = "readme-inspector-token-0123456789";
    let gateway = gateway_with_token("readme", token);
    let url = gateway.mcp_url();
    let env = inspector_env(std::path::Path::new(&node_bin), &install_dir);
    let run = |line: &str, sandbox: &str| {
        let (ok, stdout, stderr) = run_inspector_line(line, &env, &url, token, sandbox);
        assert!(ok, "Inspector failed: {line}\n{stdout}\n{stderr}\nserve log:\n{}", gateway.log_text());
        (stdout, stderr)
    };

    // tools/list in 2026-07-28 mode, as the README shows it, then the same in legacy (session)
    // mode: every tool, and no schema-portability finding (the CLI prints a one-line count on stderr
    // when there is any).
    for era_line in [lines[0].to_string(), lines[0].replace("--protocol-era modern", "--protocol-era legacy")] {
        let (stdout, stderr) = run(&era_line, "");
        assert_eq!(inspector_json(&stdout)["tools"].as_array().map(Vec::len), Some(TOOLS.len()), "{stdout}");
        assert!(!stderr.contains("portability"), "schema-portability findings: {stderr}");
        // --strict: the full lint, which fails (exit 6) on any error-severity finding.
        let (stdout, stderr) = run(&format!("{era_line} --strict --format json"), "");
        let envelope = inspector_json(&stdout);
        assert!(envelope.get("schemaFindings").is_none(), "findings: {envelope}\n{stderr}");
        assert!(!stderr.contains("portability"), "schema-portability findings: {stderr}");
    }

    // create -> run -> kill, as the README shows them.
    let (stdout, _) = run(lines[1], "");
    let created = inspector_json(&stdout);
    let sandbox = created["structuredContent"]["sandbox_id"].as_str().expect("sandbox_id").to_string();
    assert_eq!(created["structuredContent"]["owned"], false, "{created}");
    let (stdout, _) = run(lines[2], &sandbox);
    let ran = inspector_json(&stdout);
    assert_eq!(ran["structuredContent"]["stdout"], "Linux\n", "{ran}");
    assert_eq!(ran["structuredContent"]["exit_code"], 0, "{ran}");
    let (stdout, _) = run(lines[3], &sandbox);
    assert_eq!(inspector_json(&stdout)["structuredContent"]["killed"], true, "{stdout}");
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

/// Issue 25.1: the Inspector declares the tasks extension at `initialize` (legacy) but calls tools
/// plainly, so `run_command` and `start_task` answer their plain structured result there. In
/// 2026-07-28 mode its requests declare the extension themselves: `start_task` becomes an MCP task the
/// Inspector polls to its completed result.
#[test]
fn inspector_cli_runs_commands_and_starts_tasks_in_both_eras() {
    let snippet = block("sh readme-test inspector");
    let node_bin = require_env!("SANDBOX_MCP_NODE_BIN", "the Node 24 bin dir");
    let install_dir = require_env!("SANDBOX_MCP_INSPECTOR_DIR", "the pinned MCP Inspector install");
    require_root!();
    let lines: Vec<&str> = snippet.lines().filter(|l| !l.trim().is_empty()).collect();
    let token = "inspector-eras-token-0123456789";
    let gateway = gateway_with_token("readme", token);
    let url = gateway.mcp_url();
    let env = inspector_env(std::path::Path::new(&node_bin), std::path::Path::new(&install_dir));
    let run = |line: &str, sandbox: &str| {
        let (ok, stdout, stderr) = run_inspector_line(line, &env, &url, token, sandbox);
        assert!(ok, "Inspector failed: {line}\n{stdout}\n{stderr}\nserve log:\n{}", gateway.log_text());
        inspector_json(&stdout)
    };
    // Created in 2026-07-28 mode: not owned by a session, so it outlives each legacy CLI run.
    let sandbox = run(lines[1], "")["structuredContent"]["sandbox_id"].as_str().expect("sandbox_id").to_string();
    let start_line = lines[2]
        .replace("--tool-name run_command", "--tool-name start_task")
        .replace("\"command=uname -s\"", "\"command=sleep 1\"");
    for era in ["modern", "legacy"] {
        let era_of = |line: &str| line.replace("--protocol-era modern", &format!("--protocol-era {era}"));
        let ran = run(&era_of(lines[2]), &sandbox);
        assert_eq!(ran["structuredContent"]["stdout"], "Linux\n", "{era}: {ran}");
        assert_eq!(ran["structuredContent"]["exit_code"], 0, "{era}: {ran}");
        let started = run(&era_of(&start_line), &sandbox);
        let state = if era == "legacy" { "running" } else { "succeeded" };
        assert_eq!(started["structuredContent"]["state"], state, "{era}: {started}");
        assert!(started["structuredContent"]["task_id"].as_str().is_some_and(|t| !t.is_empty()), "{era}: {started}");
        assert!(started.get("task").is_none() && started["resultType"] != "task", "{era}: {started}");
    }
    assert_eq!(run(lines[3], &sandbox)["structuredContent"]["killed"], true);
}

/// The README's tools table, as (tool, its arguments): the first backticked word of each
/// comma-separated item (outside parentheses) of the arguments column.
fn readme_tools_table() -> std::collections::BTreeMap<String, std::collections::BTreeSet<String>> {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).expect("README.md");
    let section = readme.split("\n## Tools\n").nth(1).expect("a Tools section");
    let section = section.split("\n## ").next().unwrap_or_default();
    let mut table = std::collections::BTreeMap::new();
    for row in section.lines().filter(|l| l.starts_with("| `")) {
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        let name = cells[1].trim_matches('`').to_string();
        let (mut items, mut depth, mut item) = (Vec::new(), 0, String::new());
        for c in cells[2].chars() {
            match c {
                '(' => depth += 1,
                ')' => depth -= 1,
                ',' if depth == 0 => items.push(std::mem::take(&mut item)),
                _ => {}
            }
            item.push(c);
        }
        items.push(item);
        let args = items
            .iter()
            .filter_map(|i| i.trim_start_matches(',').trim().strip_prefix('`')?.split('`').next().map(str::to_string))
            .collect();
        table.insert(name, args);
    }
    table
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readme_tools_table_matches_the_live_tools_list() {
    require_root!();
    let token = "readme-tools-token-0123456789";
    let gateway = gateway_with_token("readme", token);
    let client = connect(&gateway.mcp_url(), Some(token)).await;
    let tools = client.list_all_tools().await.expect("tools/list");
    let live: std::collections::BTreeMap<String, std::collections::BTreeSet<String>> = tools
        .iter()
        .map(|t| {
            let properties = t.input_schema.get("properties").and_then(Value::as_object);
            (t.name.to_string(), properties.map(|p| p.keys().cloned().collect()).unwrap_or_default())
        })
        .collect();
    close(client).await;
    assert_eq!(readme_tools_table(), live, "README.md's tools table (left) against tools/list (right)");
}
