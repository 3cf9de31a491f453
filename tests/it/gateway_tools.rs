//! Every MCP tool through the real `serve` binary, backed by a real
//! `sandbox-mcp provider` process (the E2B code path): defaults, ownership,
//! limits, unknown fields, and cleanup when a session ends (DELETE and idle
//! expiry), checked against the provider directly.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

use crate::common;
use std::time::Duration;

use common::*;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tools_work_end_to_end_with_session_defaults_and_ownership() {
    require_root!();
    let provider = Provider::start();
    let gateway = Gateway::start_e2b(&provider, "", &[]);
    let direct = provider.client();
    let client = connect(&gateway.mcp_url(), None).await;

    let tools = client.list_all_tools().await.unwrap();
    let mut names: Vec<_> = tools.iter().map(|t| t.name.to_string()).collect();
    names.sort();
    assert_eq!(names, TOOLS);
    for tool in &tools {
        assert_eq!(
            tool.input_schema.get("additionalProperties"),
            Some(&json!(false)),
            "{} accepts unknown fields",
            tool.name
        );
        assert!(tool.output_schema.is_some(), "{} has no output schema", tool.name);
        assert!(tool.description.as_ref().is_some_and(|d| d.len() > 40), "{} lacks a description", tool.name);
    }

    // An unknown tool's error names the tools that exist.
    let unknown = common::mcp::try_call(&client, "run_comand", json!({})).await.expect_err("unknown tool").to_string();
    assert!(
        unknown.contains("run_comand") && unknown.contains("run_command, snapshot_sandbox, start_task"),
        "{unknown}"
    );

    // No default sandbox yet: the error says what to do; nothing is created implicitly.
    let message = err(&client, "run_command", json!({"command": "true"})).await;
    assert!(message.contains("create_sandbox") && message.contains("connect_sandbox"), "{message}");
    assert!(direct.list_all_sandboxes(&[]).await.unwrap().is_empty());

    let created = ok(&client, "create_sandbox", json!({"envs": {"GREETING": "hi"}, "metadata": {"k": "v"}})).await;
    let id = created["sandbox_id"].as_str().unwrap().to_string();
    assert_eq!(created["owned"], json!(true));
    let detail = direct.get_sandbox(&id).await.unwrap();
    assert_eq!(detail.metadata.get("sandbox_mcp_tenant").map(String::as_str), Some("default"));
    assert_eq!(detail.metadata.get("sandbox_mcp_deployment").map(String::as_str), Some("default"));
    assert!(detail.metadata.contains_key("sandbox_mcp_session"));
    assert_eq!(detail.metadata.get("k").map(String::as_str), Some("v"));

    // run_command uses the default sandbox, the sandbox env, bash -l, user `user`, cwd /home/user.
    let out = ok(&client, "run_command", json!({"command": "echo $GREETING; whoami; pwd; echo err >&2; exit 3"})).await;
    assert_eq!(out["sandbox_id"], json!(id));
    assert_eq!(out["exit_code"], json!(3), "{out}");
    assert_eq!(out["stdout"], json!("hi\nuser\n/home/user\n"));
    assert_eq!(out["stderr"], json!("err\n"));
    assert_eq!(out["stdout_truncated"], json!(false));
    let root =
        ok(&client, "run_command", json!({"command": "id -u", "user": "root", "cwd": "/tmp", "envs": {"A": "1"}}))
            .await;
    assert_eq!(root["stdout"], json!("0\n"));

    // Output is capped per stream at 64 KiB with an explicit flag and the full count.
    let big = ok(&client, "run_command", json!({"command": "head -c 200000 /dev/zero | tr '\\0' x"})).await;
    assert_eq!(big["stdout"].as_str().unwrap().len(), 64 * 1024);
    assert_eq!(big["stdout_truncated"], json!(true));
    assert_eq!(big["stdout_bytes"], json!(200000));

    // A command past its timeout is killed, and the error points at start_task.
    let message = err(&client, "run_command", json!({"command": "sleep 30", "timeout": 1})).await;
    assert!(message.contains("start_task") && message.contains(&id), "{message}");

    // Files: text, base64, listing.
    ok(&client, "write_file", json!({"path": "/home/user/dir/a.txt", "content": "héllo\n"})).await;
    let read = ok(&client, "read_file", json!({"path": "dir/a.txt"})).await;
    assert_eq!(
        (read["encoding"].as_str(), read["content"].as_str(), read["size"].as_u64()),
        (Some("text"), Some("héllo\n"), Some(7))
    );
    ok(&client, "write_file", json!({"path": "dir/b.bin", "content": "AAEC/w==", "encoding": "base64"})).await;
    let read = ok(&client, "read_file", json!({"path": "/home/user/dir/b.bin"})).await;
    assert_eq!((read["encoding"].as_str(), read["content"].as_str()), (Some("base64"), Some("AAEC/w==")));
    let message = err(&client, "read_file", json!({"path": "/home/user/dir/b.bin", "encoding": "text"})).await;
    assert!(message.contains("base64"), "{message}");
    let listed = ok(&client, "list_files", json!({"path": "/home/user/dir"})).await;
    let mut entries: Vec<_> =
        listed["entries"].as_array().unwrap().iter().map(|e| (e["name"].clone(), e["type"].clone())).collect();
    entries.sort_by_key(|e| e.0.to_string());
    assert_eq!(entries, vec![(json!("a.txt"), json!("file")), (json!("b.bin"), json!("file"))]);
    let message = err(&client, "read_file", json!({"path": "/home/user/nope.txt"})).await;
    assert!(message.contains("no such file") && message.contains(&id), "{message}");
    // An error that would quote the provider API key shows it masked (in the answer and the log line).
    let message = err(&client, "read_file", json!({"path": format!("/home/user/{}.txt", provider.api_key)})).await;
    assert!(message.contains("no such file") && message.contains("/home/user/***.txt"), "{message}");
    assert!(!message.contains(&provider.api_key), "the provider API key leaked into a tool error: {message}");

    // A second session (same tenant) creates its own sandbox; the first connects to it: default, not owned.
    let other = connect(&gateway.mcp_url(), None).await;
    let other_id = ok(&other, "create_sandbox", json!({})).await["sandbox_id"].as_str().unwrap().to_string();
    let connected = ok(&client, "connect_sandbox", json!({"sandbox_id": other_id})).await;
    assert_eq!(connected["owned"], json!(false));
    let out = ok(&client, "run_command", json!({"command": "echo here"})).await;
    assert_eq!(out["sandbox_id"], json!(other_id), "connect_sandbox must make it the default");
    let listed = ok(&client, "list_sandboxes", empty()).await;
    let roles = |sid: &str| {
        listed["sandboxes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["sandbox_id"] == json!(sid))
            .map(|s| s["session_roles"].clone())
    };
    assert_eq!(roles(&id), Some(json!(["owned"])));
    assert_eq!(roles(&other_id), Some(json!(["default"])));
    assert_eq!(listed["default_sandbox"], json!(other_id));
    let user_meta =
        listed["sandboxes"].as_array().unwrap().iter().find(|s| s["sandbox_id"] == json!(id)).unwrap()["metadata"]
            .clone();
    assert_eq!(user_meta, json!({"k": "v"}), "the gateway's own keys are hidden");

    // Closing the first session kills what it owns (id) but not what it only connected to (other_id).
    close(client).await;
    assert!(wait_gone(&direct, &id, Duration::from_secs(15)).await, "owned sandbox survived DELETE");
    assert!(sandbox_exists(&direct, &other_id).await, "a connected (not owned) sandbox was killed");
    assert!(gateway.wait_log("session ended", Duration::from_secs(5)).await);

    // kill_sandbox: explicit, then the id is "not found".
    let killed = ok(&other, "kill_sandbox", json!({"sandbox_id": other_id})).await;
    assert_eq!(killed["killed"], json!(true));
    assert!(!sandbox_exists(&direct, &other_id).await);
    let message = err(&other, "run_command", json!({"command": "true"})).await;
    assert!(message.contains("create_sandbox"), "killed default must be forgotten: {message}");
    let message = err(&other, "run_command", json!({"command": "true", "sandbox_id": other_id})).await;
    assert!(message.contains("not found"), "{message}");
    close(other).await;

    // One log line per tool call, with the fields, never the provider key.
    let log = gateway.log_text();
    let call_line =
        log.lines().find(|l| l.contains("\"tool call\"") && l.contains("run_command")).expect("tool call log line");
    for field in ["\"tool\":", "\"session\":", "\"tenant\":", "\"sandbox\":", "\"duration_ms\":", "\"outcome\":"] {
        assert!(call_line.contains(field), "{field} missing from {call_line}");
    }
    let masked_line = log
        .lines()
        .find(|l| l.contains("\"tool call\"") && l.contains("/home/user/***.txt"))
        .expect("the read_file error quoting the key is logged, masked");
    assert!(masked_line.contains("\"outcome\":\"error\""), "{masked_line}");
    assert!(!log.contains(&provider.api_key), "the provider API key leaked into the log");
}

/// The secret the masking tests configure, and what replaces it (sandbox_mcp::masking::MASK).
const SECRET: &str = "gateway-configured-secret-42";
const MASK: &str = "***";

/// A gateway configured with [`SECRET`], a client and its session's default sandbox (the provider's
/// key is masked too).
async fn masking_gateway() -> (Provider, Gateway, McpClient, String) {
    let provider = Provider::start();
    let gateway = Gateway::start_e2b(&provider, &format!("[tasks]\nsecrets = [\"{SECRET}\"]\n"), &[]);
    let client = connect(&gateway.mcp_url(), None).await;
    let id = ok(&client, "create_sandbox", json!({})).await["sandbox_id"].as_str().unwrap().to_string();
    (provider, gateway, client, id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configured_secrets_and_the_provider_key_are_masked_in_output_files_and_errors() {
    require_root!();
    let (provider, gateway, client, id) = masking_gateway().await;
    let key = provider.api_key.clone();

    // run_command: both streams, the configured secret and the provider key; a look-alike is kept.
    let command = format!("echo \"a {SECRET} b gateway-configured-secret-4X\"; echo {key}; echo \"err {SECRET}\" >&2");
    let out = ok(&client, "run_command", json!({ "command": command })).await;
    assert_eq!(out["exit_code"], json!(0), "{out}");
    assert_eq!(out["stdout"], json!(format!("a {MASK} b gateway-configured-secret-4X\n{MASK}\n")), "{out}");
    assert_eq!(out["stderr"], json!(format!("err {MASK}\n")), "{out}");

    // A file holding the secret is stored as written, and read back masked (text encoding).
    let content = format!("token={SECRET}\nkey={key}\n");
    ok(&client, "write_file", json!({"path": "/home/user/conf.txt", "content": content})).await;
    let stored = ok(&client, "run_command", json!({"command": format!("grep -c -e {SECRET} -e {key} conf.txt")})).await;
    assert_eq!(stored["stdout"], json!("2\n"), "write_file must store the secret unchanged: {stored}");
    let read = ok(&client, "read_file", json!({"path": "/home/user/conf.txt"})).await;
    assert_eq!(read["encoding"], json!("text"));
    assert_eq!(read["content"], json!(format!("token={MASK}\nkey={MASK}\n")), "{read}");
    assert_eq!(read["size"], json!(content.len()), "size is the stored file's");
    // Read in pages cut inside the secret: no page shows a piece of it (each side of the cut masks).
    for cut in [8, 12, 20, 6 + SECRET.len() - 1] {
        let first = ok(&client, "read_file", json!({"path": "conf.txt", "length": cut})).await;
        let next = first["next_offset"].as_u64().unwrap();
        let second = ok(&client, "read_file", json!({"path": "conf.txt", "offset": next, "length": 40})).await;
        for page in [&first, &second] {
            let text = page["content"].as_str().unwrap();
            for piece in SECRET.as_bytes().windows(6) {
                assert!(!text.contains(std::str::from_utf8(piece).unwrap()), "cut at {cut}: {page}");
            }
        }
        assert!(second["content"].as_str().unwrap().starts_with(MASK), "cut at {cut}: {second}");
    }

    // Tool errors that would quote the secret: a missing file, a missing cwd.
    let message = err(&client, "read_file", json!({"path": format!("/home/user/{SECRET}/missing.txt")})).await;
    assert!(
        message.contains("no such file") && message.contains(&format!("/home/user/{MASK}/missing.txt")),
        "{message}"
    );
    assert!(!message.contains(SECRET), "{message}");
    let message = err(&client, "run_command", json!({"command": "true", "cwd": format!("/tmp/{SECRET}")})).await;
    assert!(message.contains(&format!("/tmp/{MASK}")) && message.contains(&id), "{message}");
    assert!(!message.contains(SECRET), "{message}");
    close(client).await;

    // The log carries the masked errors, never the secret or the key.
    let log = gateway.log_text();
    assert!(log.contains(&format!("/home/user/{MASK}/missing.txt")), "masked error not logged:\n{log}");
    assert!(!log.contains(SECRET), "a configured secret leaked into the log");
    assert!(!log.contains(&key), "the provider API key leaked into the log");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_are_masked_in_base64_reads_also_across_page_edges() {
    use base64::Engine;
    use base64::engine::general_purpose::STANDARD as BASE64;
    require_root!();
    let (provider, _gateway, client, _) = masking_gateway().await;
    let key = provider.api_key.clone();
    let decode = |page: &serde_json::Value| {
        assert_eq!(page["encoding"], json!("base64"), "{page}");
        BASE64.decode(page["content"].as_str().unwrap()).unwrap()
    };
    let contains = |hay: &[u8], needle: &[u8]| hay.windows(needle.len()).any(|w| w == needle);

    // A binary file (not UTF-8, so the automatic encoding is base64 too) holding the secret and the key.
    let head = b"\xff\x00bin ";
    let mut content = head.to_vec();
    content.extend_from_slice(format!("{SECRET} mid {key}").as_bytes());
    content.extend_from_slice(b"\xfe end");
    let written = BASE64.encode(&content);
    ok(&client, "write_file", json!({"path": "blob.bin", "content": written, "encoding": "base64"})).await;
    let stored = ok(&client, "run_command", json!({"command": format!("grep -c -a -e {SECRET} blob.bin")})).await;
    assert_eq!(stored["stdout"], json!("1\n"), "write_file must store the secret unchanged: {stored}");
    let mut expected = head.to_vec();
    expected.extend_from_slice(format!("{MASK} mid {MASK}").as_bytes());
    expected.extend_from_slice(b"\xfe end");
    for encoding in [Some("base64"), None] {
        let mut args = json!({"path": "blob.bin"});
        if let Some(encoding) = encoding {
            args["encoding"] = json!(encoding);
        }
        let read = ok(&client, "read_file", args).await;
        assert_eq!(decode(&read), expected, "encoding {encoding:?}: {read}");
        assert_eq!(read["size"], json!(content.len()), "size is the stored file's");
        assert_eq!(read["length"], json!(content.len()), "length counts the file's bytes");
    }

    // A text file read as base64, in pages cut inside the secret: no page carries a piece of it.
    let text = format!("token={SECRET}\n");
    ok(&client, "write_file", json!({"path": "conf.txt", "content": text})).await;
    let whole = ok(&client, "read_file", json!({"path": "conf.txt", "encoding": "base64"})).await;
    assert_eq!(decode(&whole), format!("token={MASK}\n").as_bytes(), "{whole}");
    for cut in [7, 12, 20, 6 + SECRET.len() - 1] {
        let first = ok(&client, "read_file", json!({"path": "conf.txt", "length": cut, "encoding": "base64"})).await;
        let next = first["next_offset"].as_u64().unwrap();
        let args = json!({"path": "conf.txt", "offset": next, "length": 40, "encoding": "base64"});
        let second = ok(&client, "read_file", args).await;
        for page in [&first, &second] {
            let bytes = decode(page);
            for piece in SECRET.as_bytes().windows(6) {
                assert!(!contains(&bytes, piece), "cut at {cut}: {page}");
            }
        }
        assert!(decode(&first).ends_with(MASK.as_bytes()), "cut at {cut}: {first}");
        assert!(decode(&second).starts_with(MASK.as_bytes()), "cut at {cut}: {second}");
    }
    close(client).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_arguments_are_rejected_before_any_provider_call() {
    require_root!();
    let provider = Provider::start();
    let gateway = Gateway::start_e2b(&provider, "[server]\nmax_body_bytes = 1048576\n", &[]);
    let direct = provider.client();
    let client = connect(&gateway.mcp_url(), None).await;

    // Unknown fields and wrong types are tool errors (isError), not protocol errors.
    let message = err(&client, "create_sandbox", json!({"templates": "base"})).await;
    assert!(message.contains("templates"), "{message}");
    err(&client, "create_sandbox", json!({"timeout": "soon"})).await;
    err(&client, "list_sandboxes", json!({"x": 1})).await;
    // Limits, each naming the argument.
    for (tool, args, needle) in [
        ("create_sandbox", json!({"timeout": 0}), "timeout"),
        ("create_sandbox", json!({"timeout": 10_000_000}), "timeout"),
        ("create_sandbox", json!({"template": "../../etc"}), "template"),
        ("create_sandbox", json!({"metadata": {"sandbox_mcp_tenant": "evil"}}), "reserved"),
        ("create_sandbox", json!({"envs": {"1BAD": "x"}}), "variable name"),
        ("run_command", json!({"command": "x".repeat(70_000), "sandbox_id": "abc"}), "65536"),
        ("run_command", json!({"command": "true", "timeout": 601, "sandbox_id": "abc"}), "timeout"),
        ("run_command", json!({"command": "true", "sandbox_id": "bad id!"}), "sandbox_id"),
        ("run_command", json!({"command": "true", "user": "admin", "sandbox_id": "abc"}), "user"),
        ("write_file", json!({"path": "a", "content": "%%%", "encoding": "base64", "sandbox_id": "abc"}), "base64"),
        ("list_files", json!({"depth": 99, "sandbox_id": "abc"}), "depth"),
        ("read_file", json!({"path": "", "sandbox_id": "abc"}), "path"),
    ] {
        let message = err(&client, tool, args).await;
        assert!(message.contains(needle), "{tool}: {message:?} should mention {needle}");
    }
    assert!(direct.list_all_sandboxes(&[]).await.unwrap().is_empty(), "a rejected call reached the provider");

    // A request body over server.max_body_bytes is refused by HTTP (413) and the session goes on.
    let http = reqwest::Client::new();
    let init = http
        .post(gateway.mcp_url())
        .header("accept", "application/json, text/event-stream")
        .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}}))
        .send()
        .await
        .unwrap();
    let session = init.headers()["mcp-session-id"].to_str().unwrap().to_string();
    let huge = http
        .post(gateway.mcp_url())
        .header("accept", "application/json, text/event-stream")
        .header("mcp-session-id", &session)
        .header("mcp-protocol-version", "2025-11-25")
        .json(&json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
            "name": "write_file", "arguments": {"path": "a", "content": "x".repeat(2 << 20)}}}))
        .send()
        .await
        .unwrap();
    assert_eq!(huge.status(), 413);
    let ok_after = ok(&client, "list_sandboxes", empty()).await;
    assert_eq!(ok_after["sandboxes"], json!([]));
    close(client).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_session_expiry_kills_owned_sandboxes() {
    require_root!();
    let provider = Provider::start();
    let gateway = Gateway::start_e2b(&provider, "[server]\nsession_idle_timeout_secs = 2\n", &[]);
    let direct = provider.client();
    let client = connect(&gateway.mcp_url(), None).await;
    let id = ok(&client, "create_sandbox", json!({})).await["sandbox_id"].as_str().unwrap().to_string();
    assert!(sandbox_exists(&direct, &id).await);
    // No traffic: the session expires and its owned sandbox is killed, without any DELETE.
    assert!(wait_gone(&direct, &id, Duration::from_secs(20)).await, "owned sandbox survived idle expiry");
    assert!(gateway.wait_log("killed its owned sandboxes", Duration::from_secs(5)).await);
    // The expired session is gone: a later call either fails or (rmcp's client recovers sessions)
    // runs in a fresh session that sees no sandbox.
    let after = client
        .call_tool(rmcp::model::CallToolRequestParams::new("list_sandboxes").with_arguments(serde_json::Map::new()))
        .await;
    if let Ok(result) = &after
        && result.is_error != Some(true)
    {
        assert_eq!(result.structured_content.as_ref().unwrap()["sandboxes"], json!([]));
    }
    drop(client);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn using_a_sandbox_renews_its_timeout() {
    require_root!();
    let provider = Provider::start();
    let gateway = Gateway::start_e2b(&provider, "[sandbox]\nrenew_on_use_secs = 900\n", &[]);
    let direct = provider.client();
    let client = connect(&gateway.mcp_url(), None).await;
    let id = ok(&client, "create_sandbox", json!({"timeout": 20})).await["sandbox_id"].as_str().unwrap().to_string();
    let deadline_of = |detail: sandbox_mcp::e2b::wire::SandboxDetail| {
        chrono::DateTime::parse_from_rfc3339(&detail.end_at).unwrap().timestamp() - chrono::Utc::now().timestamp()
    };
    assert!(deadline_of(direct.get_sandbox(&id).await.unwrap()) <= 20);
    ok(&client, "run_command", json!({"command": "true"})).await;
    let mut left = 0;
    for _ in 0..50 {
        left = deadline_of(direct.get_sandbox(&id).await.unwrap());
        if left > 600 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(left > 600, "run_command did not renew the deadline (left {left} s)");
    close(client).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_sandbox_network_rules_apply_and_the_gateway_is_unreachable_from_inside() {
    require_root!();
    let mut net = testnet::TestNet::new();
    net.http(net.internet_addr, 8080, "internet-ok");
    let internet = net.internet_addr.to_string();
    // The default deployment: `serve` with its embedded provider, no auth, on loopback.
    let gateway = Gateway::start("", &[]);
    let client = connect(&gateway.mcp_url(), None).await;
    let probe = |host: &str, port: u16| json!({"command": testnet::probe_script(host, port)});
    let stdout = |v: &serde_json::Value| v["stdout"].as_str().unwrap_or_default().trim().to_owned();

    ok(&client, "create_sandbox", json!({})).await;
    let out = ok(&client, "run_command", probe(&internet, 8080)).await;
    assert_eq!(stdout(&out), "OPEN internet-ok");
    let gateway_port = gateway.addr.port();
    let out = ok(&client, "run_command", probe("127.0.0.1", gateway_port)).await;
    assert!(stdout(&out).starts_with("CLOSED"), "sandboxed code reached the gateway: {out}");

    ok(&client, "create_sandbox", json!({"network": {"deny_out": [internet]}})).await;
    let out = ok(&client, "run_command", probe(&internet, 8080)).await;
    assert!(stdout(&out).starts_with("CLOSED"), "{out}");
    ok(&client, "create_sandbox", json!({"network": {"allow_internet_access": false}})).await;
    let out = ok(&client, "run_command", probe(&internet, 8080)).await;
    assert!(stdout(&out).starts_with("CLOSED"), "{out}");
    let private = net.private_addr.to_string();
    net.http(net.private_addr, 8080, "private-ok");
    ok(&client, "create_sandbox", json!({"network": {"allow_out": [format!("{private}/32")]}})).await;
    let out = ok(&client, "run_command", probe(&private, 8080)).await;
    assert_eq!(stdout(&out), "OPEN private-ok");

    for (network, needle) in [
        (json!({"allow_out": ["169.254.169.254"]}), "loopback or link-local"),
        (json!({"allow_out": ["127.0.0.0/8"]}), "loopback or link-local"),
        (json!({"allow_out": ["0.0.0.0/0"]}), "loopback or link-local"),
        (json!({"deny_out": ["not-an-address"]}), "not a CIDR block"),
        (json!({"allow_out": ["example.com"]}), "not a CIDR block"),
    ] {
        let message = err(&client, "create_sandbox", json!({"network": network})).await;
        assert!(message.contains(needle), "{message}");
    }
    close(client).await;
}

/// A file the sandbox user may not read or write (issue 23 §5): read_file, write_file and
/// list_files as `user` answer "permission denied" naming the path and the user (not
/// "authentication failed (HTTP 403)"), nothing is written, and the same calls as root succeed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permission_denied_file_errors_name_the_path_and_the_user() {
    require_root!();
    let provider = Provider::start();
    let gateway = Gateway::start_e2b(&provider, "", &[]);
    let client = connect(&gateway.mcp_url(), None).await;
    let id = ok(&client, "create_sandbox", json!({})).await["sandbox_id"].as_str().unwrap().to_string();
    let setup = "mkdir -p /srv/locked /srv/closed && echo root-only > /srv/secret.txt && chmod 600 /srv/secret.txt \
                 && chmod 755 /srv/locked && chmod 700 /srv/closed && touch /srv/closed/inside";
    let made = ok(&client, "run_command", json!({"command": setup, "user": "root"})).await;
    assert_eq!(made["exit_code"], json!(0), "{made}");

    let cases = [
        ("read_file", json!({"path": "/srv/secret.txt"}), "/srv/secret.txt", "read"),
        ("write_file", json!({"path": "/srv/locked/new.txt", "content": "x"}), "/srv/locked/new.txt", "write"),
        ("write_file", json!({"path": "/srv/secret.txt", "content": "x"}), "/srv/secret.txt", "write"),
        ("list_files", json!({"path": "/srv/closed"}), "/srv/closed", "list"),
    ];
    for (tool, args, path, verb) in cases {
        let message = err(&client, tool, args).await;
        assert!(message.contains("permission denied"), "{tool}: {message}");
        assert!(
            message.contains(path) && message.contains("user \"user\""),
            "{tool} must name {path} and the user: {message}"
        );
        assert!(message.contains(verb) && message.contains(&id), "{tool}: {message}");
        assert!(!message.contains("authentication") && !message.contains("403"), "{tool}: {message}");
    }
    // Nothing was written or changed; as root the same calls work.
    let after =
        ok(&client, "run_command", json!({"command": "cat /srv/secret.txt; ls /srv/locked", "user": "root"})).await;
    assert_eq!(after["stdout"], json!("root-only\n"), "{after}");
    let read = ok(&client, "read_file", json!({"path": "/srv/secret.txt", "user": "root"})).await;
    assert_eq!(read["content"], json!("root-only\n"));
    ok(&client, "write_file", json!({"path": "/srv/locked/new.txt", "content": "x", "user": "root"})).await;
    let listed = ok(&client, "list_files", json!({"path": "/srv/closed", "user": "root"})).await;
    assert_eq!(listed["entries"][0]["name"], json!("inside"), "{listed}");
    close(client).await;
}
