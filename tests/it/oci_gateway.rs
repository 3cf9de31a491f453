//! OCI templates through MCP: the real `serve` whose embedded provider uses a
//! state directory into which the test imported two Debian images with the
//! real `sandbox-mcp template import` (one with python3, one whose second
//! layer removes python3 with whiteouts). `list_templates` shows both with
//! their python3 flag, `create_sandbox` takes a name or a template id, the
//! image's own `dpkg` runs, a task runs where python3 is, `start_task` is
//! refused clearly where it is not, and an unknown template names
//! `list_templates`. Needs root and mmdebstrap (skips loudly otherwise).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

use crate::{common, oci};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use serde_json::{Value, json};

fn import(state: &Path, name: &str, layout: &Path) {
    let out = Command::new(binary())
        .arg("template")
        .arg("--state-dir")
        .arg(state)
        .args(["import", name, layout.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success(), "import {name}: {}", String::from_utf8_lossy(&out.stderr));
}

fn template<'a>(list: &'a Value, name: &str) -> &'a Value {
    list["templates"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == name)
        .unwrap_or_else(|| panic!("no template {name} in {list}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stored_templates_are_listed_created_by_name_or_id_and_tasks_need_python3() {
    require_root!();
    let Some(rootfs) = oci::debian_python_rootfs() else { return };
    let work = tempfile::tempdir_in(Path::new(env!("CARGO_MANIFEST_DIR")).join("target")).unwrap();
    let (with_py, without_py, state) = (work.path().join("py"), work.path().join("nopy"), work.path().join("state"));
    let started = Instant::now();
    let base_layer = std::fs::read(&rootfs).unwrap();
    oci::write_layout(&with_py, std::slice::from_ref(&base_layer));
    oci::write_layout(&without_py, &[base_layer, oci::whiteout_layer(&["usr/bin/python3", "usr/bin/python3.11"])]);
    import(&state, "debpy", &with_py);
    import(&state, "debnopy", &without_py);
    eprintln!("packed and imported both images in {:?}", started.elapsed());

    let gateway = GatewayBuilder::new("").state_dir(&state).start();
    let client = connect(&gateway.mcp_url(), None).await;

    let list = ok(&client, "list_templates", json!({})).await;
    assert_eq!(list["default_template"], "base");
    let py = template(&list, "debpy");
    assert_eq!(
        (py["kind"].as_str(), py["python3"].as_str(), py["tasks"].as_bool()),
        (Some("stored"), Some("3.11"), Some(true))
    );
    assert!(py["size_bytes"].as_u64().unwrap() > 100 << 20, "{py}");
    assert!(py["created"].as_str().unwrap().starts_with("20"), "{py}");
    let nopy = template(&list, "debnopy");
    assert_eq!((nopy.get("python3"), nopy["tasks"].as_bool()), (None, Some(false)), "{nopy}");
    let base = template(&list, "base");
    assert_eq!((base["kind"].as_str(), base["tasks"].as_bool()), (Some("base"), Some(true)), "{base}");

    // By template id; the image's own package database.
    let id = py["template_id"].as_str().unwrap();
    let sbx = ok(&client, "create_sandbox", json!({"template": id, "timeout": 300})).await;
    let sbx_id = sbx["sandbox_id"].as_str().unwrap().to_owned();
    let run = ok(&client, "run_command", json!({"command": "dpkg -l | head -5; python3 --version"})).await;
    assert_eq!(run["exit_code"], 0, "{run}");
    let stdout = run["stdout"].as_str().unwrap();
    assert!(stdout.contains("Desired=Unknown") && stdout.contains("Python 3.11"), "{stdout}");
    let task = ok(&client, "start_task", json!({"command": "dpkg -s python3 | head -2; echo task-done"})).await;
    assert_eq!(task["state"], "running", "{task}");
    let deadline = Instant::now() + Duration::from_secs(60);
    let view = loop {
        let view =
            ok(&client, "get_task", json!({"sandbox_id": sbx_id, "task_id": task["task_id"], "wait_seconds": 5})).await;
        if view["state"] != "running" || Instant::now() > deadline {
            break view;
        }
    };
    assert_eq!((view["state"].as_str(), view["exit_code"].as_i64()), (Some("succeeded"), Some(0)), "{view}");
    assert!(view["stdout"].as_str().unwrap().contains("Package: python3\n"), "{view}");

    // By name, without python3: a clear refusal, nothing started, the sandbox not retained.
    let sbx = ok(&client, "create_sandbox", json!({"template": "debnopy", "timeout": 120})).await;
    let nopy_id = sbx["sandbox_id"].as_str().unwrap().to_owned();
    let run =
        ok(&client, "run_command", json!({"command": "command -v python3 || echo none; dpkg -l | head -1"})).await;
    assert!(run["stdout"].as_str().unwrap().starts_with("none\n"), "{run}");
    let started = Instant::now();
    let message = err(&client, "start_task", json!({"command": "echo never"})).await;
    eprintln!("start_task refused in {:?}: {message}", started.elapsed());
    for part in ["debnopy", &nopy_id, "no python3", "3.8 or newer", "Nothing was started", "list_templates"] {
        assert!(message.contains(part), "{part:?} missing from: {message}");
    }
    let (code, out) = {
        let r = ok(&client, "run_command", json!({"command": "ls -A ~/.sandbox-mcp 2>/dev/null | wc -l"})).await;
        (r["exit_code"].clone(), r["stdout"].as_str().unwrap().trim().to_owned())
    };
    assert_eq!((code, out.as_str()), (json!(0), "0"), "nothing was installed");
    let sandboxes = ok(&client, "list_sandboxes", json!({})).await;
    let mine = sandboxes["sandboxes"].as_array().unwrap().iter().find(|s| s["sandbox_id"] == nopy_id).unwrap();
    assert!(!mine["session_roles"].as_array().unwrap().contains(&json!("retained")), "{mine}");
    assert_eq!(mine["template"], "debnopy");

    // run_command as an MCP task (2026-07-28, the tasks extension declared) is refused the same way.
    let answer = task_run_command(&gateway.mcp_url(), &nopy_id, "echo never").await;
    let result = &answer["result"];
    assert_eq!(result["isError"], true, "{answer}");
    let message = result["content"][0]["text"].as_str().unwrap_or_default();
    assert!(message.contains("debnopy") && message.contains("Nothing was started"), "{answer}");

    // An unknown template: the error says how to list them, and no sandbox is left.
    let before = sandboxes["sandboxes"].as_array().unwrap().len();
    let message = err(&client, "create_sandbox", json!({"template": "no-such-image"})).await;
    assert!(message.contains("\"no-such-image\" not found") && message.contains("list_templates"), "{message}");
    let after = ok(&client, "list_sandboxes", json!({})).await["sandboxes"].as_array().unwrap().len();
    assert_eq!(before, after);

    // The sessionless generation lists the same templates.
    let latest = connect_latest(&gateway.mcp_url(), None).await;
    let again = ok(&latest, "list_templates", json!({})).await;
    assert_eq!(template(&again, "debpy")["template_id"], py["template_id"]);
    close(latest).await;
    close(client).await;
}

/// A task-augmented `tools/call` of `run_command` as a 2026-07-28 client sends it; the JSON-RPC answer.
async fn task_run_command(url: &str, sandbox_id: &str, command: &str) -> Value {
    let meta = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientInfo": {"name": "oci-gateway-test", "version": "1.0.0"},
        "io.modelcontextprotocol/clientCapabilities": {"extensions": {"io.modelcontextprotocol/tasks": {}}},
    });
    let params =
        json!({"name": "run_command", "arguments": {"command": command, "sandbox_id": sandbox_id}, "_meta": meta});
    let response = reqwest::Client::new()
        .post(url)
        .header("Accept", "application/json, text/event-stream")
        .header("MCP-Protocol-Version", "2026-07-28")
        .header("Mcp-Method", "tools/call")
        .header("Mcp-Name", "run_command")
        .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}))
        .send()
        .await
        .unwrap();
    let text = response.text().await.unwrap();
    serde_json::from_str(&text).unwrap_or_else(|_| {
        text.lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
            .find(|v| v.get("id").is_some())
            .unwrap_or(Value::Null)
    })
}
