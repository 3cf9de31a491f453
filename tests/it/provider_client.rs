//! The provider client against the REAL local provider (`sandbox-mcp provider`
//! as a separate process): lifecycle, commands, output, stdin, users, files,
//! deadlines, kill, isolation and error reporting. Needs root (namespaces);
//! skips loudly otherwise.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

use crate::common;
use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use common::{Provider, eventually, host_processes_with, require_root};
use sandbox_mcp::connect_rpc::Code;
use sandbox_mcp::e2b::wire::{self, ProcessEvent};
use sandbox_mcp::e2b::{CallOptions, E2bClient, E2bError, EnvdClient, OutputLimits, Signal};

fn provider() -> Option<Provider> {
    require_root!(None);
    Some(Provider::start())
}

fn new_sandbox(timeout: u64) -> wire::NewSandbox {
    wire::NewSandbox { template_id: "base".into(), timeout: Some(timeout), ..Default::default() }
}

async fn create(client: &E2bClient) -> (wire::Sandbox, EnvdClient) {
    let sandbox = client.create_sandbox(&new_sandbox(120)).await.expect("create");
    let envd = client.envd(&sandbox);
    (sandbox, envd)
}

fn bash(script: &str) -> wire::StartRequest {
    wire::StartRequest::login_shell(script)
}

async fn run_ok(envd: &EnvdClient, script: &str, opts: &CallOptions) -> String {
    let out = envd.run(&bash(script), opts, OutputLimits::default()).await.expect("run");
    assert_eq!(out.exit_code, 0, "{script}: {out:?}");
    String::from_utf8(out.stdout).unwrap()
}

async fn wait_until_no_host_process(needle: &str) -> Vec<String> {
    for _ in 0..100 {
        let left = host_processes_with(needle);
        if left.is_empty() {
            return left;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    host_processes_with(needle)
}

#[tokio::test]
async fn lifecycle_create_get_list_connect_timeout_pause_kill() {
    let Some(provider) = provider() else { return };
    let client = provider.client();
    client.health().await.unwrap();

    let tag = format!("lifecycle-{}", std::process::id());
    let req = wire::NewSandbox {
        metadata: Some(HashMap::from([
            ("suite".to_owned(), tag.clone()),
            ("with space".to_owned(), "a b/c".to_owned()),
        ])),
        env_vars: Some(HashMap::from([("SANDBOX_LEVEL".to_owned(), "from-create".to_owned())])),
        ..new_sandbox(60)
    };
    let sandbox = client.create_sandbox(&req).await.unwrap();
    assert!(!sandbox.sandbox_id.is_empty());
    assert_eq!(sandbox.template_id, "base");
    let envd = client.envd(&sandbox);
    envd.health().await.unwrap();
    assert_eq!(run_ok(&envd, "echo $SANDBOX_LEVEL", &CallOptions::default()).await, "from-create\n");

    let detail = client.get_sandbox(&sandbox.sandbox_id).await.unwrap();
    assert_eq!(detail.sandbox_id, sandbox.sandbox_id);
    assert_eq!(detail.state, wire::SandboxState::Running);
    assert_eq!(detail.metadata.get("suite"), Some(&tag));

    // Metadata filter (with characters that need the SDK's double encoding).
    let filter = vec![("suite".to_owned(), tag.clone()), ("with space".to_owned(), "a b/c".to_owned())];
    let listed = client.list_all_sandboxes(&filter).await.unwrap();
    assert_eq!(listed.iter().map(|s| s.sandbox_id.as_str()).collect::<Vec<_>>(), vec![sandbox.sandbox_id.as_str()]);
    let none = client.list_all_sandboxes(&[("suite".to_owned(), "other".to_owned())]).await.unwrap();
    assert!(none.iter().all(|s| s.sandbox_id != sandbox.sandbox_id));
    let (page, _) = client
        .list_sandboxes(&wire::ListQuery { metadata: filter.clone(), limit: Some(1), ..Default::default() })
        .await
        .unwrap();
    assert_eq!(page.len(), 1);

    // set_timeout moves the deadline; connect with a timeout moves it again.
    client.set_timeout(&sandbox.sandbox_id, 10).await.unwrap();
    let end =
        chrono::DateTime::parse_from_rfc3339(&client.get_sandbox(&sandbox.sandbox_id).await.unwrap().end_at).unwrap();
    let left = end.signed_duration_since(chrono::Utc::now()).num_seconds();
    assert!((5..=11).contains(&left), "deadline {left}s away after set_timeout(10)");
    let connected = client.connect_sandbox(&sandbox.sandbox_id, Some(90)).await.unwrap();
    assert_eq!(connected.sandbox_id, sandbox.sandbox_id);
    let end =
        chrono::DateTime::parse_from_rfc3339(&client.get_sandbox(&sandbox.sandbox_id).await.unwrap().end_at).unwrap();
    assert!(end.signed_duration_since(chrono::Utc::now()).num_seconds() > 60);

    // Pause, pause again (already paused), resume through connect.
    envd.write_file("/tmp/kept.txt", Bytes::from_static(b"survives pause"), &CallOptions::default()).await.unwrap();
    assert!(client.pause_sandbox(&sandbox.sandbox_id).await.unwrap());
    assert!(!client.pause_sandbox(&sandbox.sandbox_id).await.unwrap());
    assert_eq!(client.get_sandbox(&sandbox.sandbox_id).await.unwrap().state, wire::SandboxState::Paused);
    let resumed = client.connect_sandbox(&sandbox.sandbox_id, None).await.unwrap();
    assert_eq!(client.get_sandbox(&sandbox.sandbox_id).await.unwrap().state, wire::SandboxState::Running);
    let envd = client.envd(&resumed);
    assert_eq!(&envd.read_file("/tmp/kept.txt", &CallOptions::default()).await.unwrap()[..], b"survives pause");

    assert!(client.kill_sandbox(&sandbox.sandbox_id).await.unwrap());
    assert!(!client.kill_sandbox(&sandbox.sandbox_id).await.unwrap());
    let err = client.get_sandbox(&sandbox.sandbox_id).await.unwrap_err();
    assert!(matches!(err, E2bError::NotFound { .. }), "{err:?}");
    let text = err.to_string();
    assert!(text.contains("get_sandbox") && text.contains(&sandbox.sandbox_id), "{text}");
    let err = client.connect_sandbox(&sandbox.sandbox_id, None).await.unwrap_err();
    assert!(err.is_not_found() && err.op() == "connect_sandbox", "{err:?}");
    let err = envd.health().await.unwrap_err();
    assert!(matches!(err, E2bError::SandboxNotRunning { .. }), "{err:?}");
    provider.shutdown().await;
}

#[tokio::test]
async fn commands_exit_codes_signals_and_stream_separation() {
    let Some(provider) = provider() else { return };
    let client = provider.client();
    let (_sandbox, envd) = create(&client).await;
    let opts = CallOptions::default();

    let out = envd.run(&bash("echo out; echo err >&2; exit 3"), &opts, OutputLimits::default()).await.unwrap();
    assert_eq!((out.exit_code, out.exited), (3, true), "{out:?}");
    assert_eq!(out.stdout, b"out\n");
    assert_eq!(out.stderr, b"err\n");
    assert_eq!(out.status, "exit status 3");
    let out = envd.run(&bash("true"), &opts, OutputLimits::default()).await.unwrap();
    assert_eq!((out.exit_code, out.exited, out.error.as_deref()), (0, true, None), "{out:?}");

    // Signals: TERM and KILL of a running process; it is listed while it runs.
    for (signal, status) in [(Signal::Term, "signal: terminated"), (Signal::Kill, "signal: killed")] {
        let mut stream = envd.start(&bash("echo ready; exec sleep 300"), &opts).await.unwrap();
        let pid = stream.pid();
        assert!(matches!(stream.next_event().await.unwrap(), Some(ProcessEvent::Data(_))));
        let listed = envd.list_processes(&opts).await.unwrap();
        assert!(listed.iter().any(|p| p.pid == pid), "pid {pid} not in {listed:?}");
        envd.send_signal(pid, signal, &opts).await.unwrap();
        let end = loop {
            match stream.next_event().await.unwrap() {
                Some(ProcessEvent::End(end)) => break end,
                Some(_) => continue,
                None => panic!("stream ended without an end event"),
            }
        };
        assert_eq!((end.exit_code, end.exited, end.status.as_str()), (-1, false, status));
        assert!(stream.next_event().await.unwrap().is_none());
    }

    // connect_process attaches to a running process and sees its live output.
    let mut background = envd.start(&bash("sleep 0.5; echo late; sleep 0.2"), &opts).await.unwrap();
    let mut attached = envd.connect_process(background.pid(), &opts).await.unwrap();
    assert_eq!(attached.pid(), background.pid());
    let mut seen = Vec::new();
    while let Some(event) = attached.next_event().await.unwrap() {
        if let ProcessEvent::Data(data) = event {
            seen.extend(data.stdout.unwrap_or_default());
        }
    }
    assert_eq!(seen, b"late\n");
    while background.next_event().await.unwrap().is_some() {}

    // Unknown pid: not_found from envd, with the op and sandbox in the message.
    let err = envd.send_signal(999_999, Signal::Kill, &opts).await.unwrap_err();
    assert!(matches!(err, E2bError::Rpc { code: Code::NotFound, .. }), "{err:?}");
    assert!(err.to_string().contains("process.SendSignal") && err.to_string().contains(envd.sandbox_id()));
    let err = envd.connect_process(999_999, &opts).await.unwrap_err();
    assert!(err.is_not_found(), "{err:?}");

    // A command timeout kills the command and is reported as Timeout.
    let started = std::time::Instant::now();
    let short = CallOptions { user: None, timeout: Some(Duration::from_millis(700)) };
    let err = envd.run(&bash("exec sleep 4141"), &short, OutputLimits::default()).await.unwrap_err();
    assert!(matches!(err, E2bError::Timeout { .. }), "{err:?}");
    assert!(started.elapsed() < Duration::from_secs(5));
    let left = wait_until_no_host_process("sleep 4141").await;
    assert!(left.is_empty(), "timed-out command survived: {left:?}");
    provider.shutdown().await;
}

#[tokio::test]
async fn large_output_is_byte_exact_and_counted_past_the_cap() {
    let Some(provider) = provider() else { return };
    let client = provider.client();
    let (_sandbox, envd) = create(&client).await;
    let opts = CallOptions::default();
    const SIZE: usize = 8 * 1024 * 1024 + 123;
    let script = format!("head -c {SIZE} /dev/urandom > /tmp/big.bin && cat /tmp/big.bin");
    let out = envd.run(&bash(&script), &opts, OutputLimits::unlimited()).await.unwrap();
    assert_eq!(out.exit_code, 0, "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.stdout.len(), SIZE);
    assert_eq!(out.stdout_total, SIZE as u64);
    assert!(!out.stdout_truncated);
    let file = envd.read_file("/tmp/big.bin", &opts).await.unwrap();
    assert!(file[..] == out.stdout[..], "stdout differs from the file it printed");

    // Capped: keeps the first MiB, counts everything, stderr unaffected.
    let limits = OutputLimits { max_stdout: 1 << 20, max_stderr: 16 };
    let out = envd.run(&bash("cat /tmp/big.bin; printf 'e%.0s' {1..100} >&2"), &opts, limits).await.unwrap();
    assert_eq!(out.stdout.len(), 1 << 20);
    assert_eq!(out.stdout_total, SIZE as u64);
    assert!(out.stdout_truncated);
    assert_eq!(&out.stdout[..], &file[..1 << 20]);
    assert_eq!((out.stderr.len(), out.stderr_total, out.stderr_truncated), (16, 100, true));
    provider.shutdown().await;
}

#[tokio::test]
async fn stdin_cwd_env_and_users() {
    let Some(provider) = provider() else { return };
    let client = provider.client();
    let (_sandbox, envd) = create(&client).await;
    let opts = CallOptions::default();

    let mut req = bash("cat; echo done");
    req.stdin = Some(true);
    let mut stream = envd.start(&req, &opts).await.unwrap();
    envd.send_stdin(stream.pid(), b"hello ", &opts).await.unwrap();
    envd.send_stdin(stream.pid(), b"stdin\n", &opts).await.unwrap();
    envd.close_stdin(stream.pid(), &opts).await.unwrap();
    let mut stdout = Vec::new();
    let mut exit = None;
    while let Some(event) = stream.next_event().await.unwrap() {
        match event {
            ProcessEvent::Data(d) => stdout.extend(d.stdout.unwrap_or_default()),
            ProcessEvent::End(end) => exit = Some(end.exit_code),
            _ => {}
        }
    }
    assert_eq!(String::from_utf8(stdout).unwrap(), "hello stdin\ndone\n");
    assert_eq!(exit, Some(0));

    let mut req = bash("pwd; echo $GREETING");
    req.process.cwd = Some("/tmp".into());
    req.process.envs = HashMap::from([("GREETING".to_owned(), "hi there".to_owned())]);
    let out = envd.run(&req, &opts, OutputLimits::default()).await.unwrap();
    assert_eq!(String::from_utf8(out.stdout).unwrap(), "/tmp\nhi there\n");

    assert_eq!(run_ok(&envd, "id -un", &opts).await, "user\n");
    assert_eq!(run_ok(&envd, "id -un; echo $HOME", &CallOptions::user("root")).await, "root\n/root\n");
    // Files honour the user too: a root-only directory is not writable by `user`.
    envd.make_dir("/root/only-root", &CallOptions::user("root")).await.unwrap();
    let err = envd.write_file("/root/only-root/x", Bytes::from_static(b"x"), &opts).await.unwrap_err();
    assert!(err.is_permission_denied(), "envd's 403 is permission denied, not an auth failure: {err:?}");
    let written = envd.write_file("/tmp/owned", Bytes::from_static(b"x"), &opts).await.unwrap();
    assert_eq!(written.path, "/tmp/owned");
    assert_eq!(envd.stat("/tmp/owned", &opts).await.unwrap().owner, "user");

    let mut bad = bash("true");
    bad.process.cwd = Some("/does/not/exist".into());
    let err = envd.run(&bad, &opts, OutputLimits::default()).await.unwrap_err();
    assert!(matches!(err, E2bError::Rpc { code: Code::InvalidArgument, .. }), "{err:?}");
    provider.shutdown().await;
}

/// envd keeps the accounts it resolved while `/etc/passwd` and `/etc/group` are unchanged: an account
/// added, rewritten in place (same size, at once) or removed by root in the sandbox applies to the very
/// next command and file call, cached or not.
#[tokio::test]
async fn accounts_changed_in_the_sandbox_apply_to_the_next_call() {
    let Some(provider) = provider() else { return };
    let client = provider.client();
    let (_sandbox, envd) = create(&client).await;
    let (root, bob) = (CallOptions::user("root"), CallOptions::user("bob"));
    let unknown = |err: E2bError| err.to_string().contains("'bob' does not exist in the sandbox");

    let err = envd.run(&bash("true"), &bob, OutputLimits::default()).await.unwrap_err();
    assert!(unknown(err), "no bob yet");
    run_ok(&envd, "echo 'bob:x:1234:1234::/tmp:/bin/bash' >> /etc/passwd && echo 'bob:x:1234:' >> /etc/group", &root)
        .await;
    assert_eq!(run_ok(&envd, "id -u; echo $HOME", &bob).await, "1234\n/tmp\n");

    // Once the files have settled, bob's account is kept (and used) ...
    tokio::time::sleep(Duration::from_millis(1200)).await;
    for _ in 0..3 {
        assert_eq!(run_ok(&envd, "id -u; echo $HOME", &bob).await, "1234\n/tmp\n");
    }
    envd.write_file("/tmp/by-bob", Bytes::from_static(b"x"), &bob).await.unwrap();
    assert_eq!(envd.stat("/tmp/by-bob", &bob).await.unwrap().owner, "bob");
    // ... until root rewrites the file in place, same size: the next call sees the new uid and home.
    let rewrite =
        r#"p=$(cat /etc/passwd) && printf '%s\n' "${p/bob:x:1234:1234::\/tmp/bob:x:4321:1234::\/usr}" > /etc/passwd"#;
    run_ok(&envd, rewrite, &root).await;
    assert_eq!(run_ok(&envd, "id -u; echo $HOME", &bob).await, "4321\n/usr\n");
    assert_eq!(envd.stat("/tmp/by-bob", &root).await.unwrap().owner, "1234", "uid 1234 has no name any more");

    // Kept again once settled; rewritten in place and settled before bob's next call: still seen.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(run_ok(&envd, "id -u", &bob).await, "4321\n");
    run_ok(&envd, r#"p=$(cat /etc/passwd) && printf '%s\n' "${p/bob:x:4321:/bob:x:4322:}" > /etc/passwd"#, &root).await;
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(run_ok(&envd, "id -u", &bob).await, "4322\n");

    // Removed by a rename (as `sed -i` and `userdel` do): unknown at once.
    run_ok(&envd, "sed -i '/^bob:/d' /etc/passwd", &root).await;
    let err = envd.run(&bash("true"), &bob, OutputLimits::default()).await.unwrap_err();
    assert!(unknown(err), "bob removed");
    provider.shutdown().await;
}

#[tokio::test]
async fn files_round_trip_list_and_manage() {
    let Some(provider) = provider() else { return };
    let client = provider.client();
    let (_sandbox, envd) = create(&client).await;
    let opts = CallOptions::default();

    let entry = envd.write_file("/tmp/dir/sub/hello.txt", Bytes::from("héllo\n"), &opts).await.unwrap();
    assert_eq!((entry.name.as_str(), entry.entry_type.as_str()), ("hello.txt", "file"));
    assert_eq!(&envd.read_file("/tmp/dir/sub/hello.txt", &opts).await.unwrap()[..], "héllo\n".as_bytes());
    let binary: Vec<u8> = (0..=255u8).cycle().take(4096).collect();
    envd.write_file("/tmp/dir/bin", Bytes::from(binary.clone()), &opts).await.unwrap();
    assert_eq!(envd.read_file("/tmp/dir/bin", &opts).await.unwrap().to_vec(), binary);
    let big: Vec<u8> = (0..10 * 1024 * 1024u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    envd.write_file("/tmp/dir/big", Bytes::from(big.clone()), &opts).await.unwrap();
    let back = envd.read_file("/tmp/dir/big", &opts).await.unwrap();
    assert!(back.len() == big.len() && back[..] == big[..], "10 MiB round trip differs");
    assert_eq!(run_ok(&envd, "stat -c %s /tmp/dir/big", &opts).await, format!("{}\n", big.len()));
    let err = envd.read_file_limited("/tmp/dir/big", 1024, &opts).await.unwrap_err();
    assert!(matches!(err, E2bError::TooLarge { limit: 1024, .. }), "{err:?}");
    // Ranged reads (206 / 416 as Go's http.ServeContent answers them): the bytes and the file's size.
    for (offset, len) in [(0u64, 1u64), (12_345, 16_384), (big.len() as u64 - 10, 16_384), (3, 10 << 20)] {
        let range = envd.read_file_range("/tmp/dir/big", offset, len, &opts).await.unwrap();
        let end = (offset + len).min(big.len() as u64) as usize;
        assert_eq!(range.size, big.len() as u64);
        assert!(range.data[..] == big[offset as usize..end], "range {offset}+{len} differs");
    }
    let past = envd.read_file_range("/tmp/dir/big", big.len() as u64, 100, &opts).await.unwrap();
    assert_eq!((past.data.len(), past.size), (0, big.len() as u64));
    envd.write_file("/tmp/dir/empty", Bytes::new(), &opts).await.unwrap();
    let empty = envd.read_file_range("/tmp/dir/empty", 0, 100, &opts).await.unwrap();
    assert_eq!((empty.data.len(), empty.size), (0, 0));
    let err = envd.read_file_range("/tmp/nope.txt", 0, 10, &opts).await.unwrap_err();
    assert!(err.is_not_found() && !err.is_sandbox_gone(), "{err:?}");
    envd.remove("/tmp/dir/empty", &opts).await.unwrap();
    // Overwrite replaces the content.
    envd.write_file("/tmp/dir/bin", Bytes::from_static(b"short"), &opts).await.unwrap();
    assert_eq!(&envd.read_file("/tmp/dir/bin", &opts).await.unwrap()[..], b"short");

    let stat = envd.stat("/tmp/dir/big", &opts).await.unwrap();
    assert_eq!((stat.size, stat.file_type.as_str()), (big.len() as i64, wire::FILE_TYPE_FILE));
    let mut names: Vec<_> = envd.list_dir("/tmp/dir", 1, &opts).await.unwrap().into_iter().map(|e| e.name).collect();
    names.sort();
    assert_eq!(names, ["big", "bin", "sub"]);
    let deep = envd.list_dir("/tmp/dir", 2, &opts).await.unwrap();
    assert!(deep.iter().any(|e| e.path == "/tmp/dir/sub/hello.txt"), "{deep:?}");

    assert!(envd.make_dir("/tmp/dir/new/a/b", &opts).await.unwrap());
    assert!(!envd.make_dir("/tmp/dir/new/a/b", &opts).await.unwrap());
    assert_eq!(envd.stat("/tmp/dir/new/a/b", &opts).await.unwrap().file_type, wire::FILE_TYPE_DIRECTORY);
    let moved = envd.rename("/tmp/dir/bin", "/tmp/dir/new/moved", &opts).await.unwrap();
    assert_eq!(moved.path, "/tmp/dir/new/moved");
    assert!(envd.stat("/tmp/dir/bin", &opts).await.unwrap_err().is_not_found());
    envd.remove("/tmp/dir/new", &opts).await.unwrap();
    let err = envd.stat("/tmp/dir/new/moved", &opts).await.unwrap_err();
    assert!(matches!(err, E2bError::Rpc { code: Code::NotFound, .. }), "{err:?}");
    let err = envd.read_file("/tmp/nope.txt", &opts).await.unwrap_err();
    assert!(err.is_not_found() && !err.is_sandbox_gone(), "{err:?}");
    assert!(err.to_string().contains("files.read") && err.to_string().contains(envd.sandbox_id()), "{err}");
    let err = envd.read_file("/tmp/dir", &opts).await.unwrap_err();
    assert!(matches!(err, E2bError::Rpc { code: Code::InvalidArgument, .. }), "reading a directory: {err:?}");
    provider.shutdown().await;
}

#[tokio::test]
async fn deadline_expiry_removes_the_sandbox() {
    let Some(provider) = provider() else { return };
    let client = provider.client();
    let sandbox = client.create_sandbox(&new_sandbox(2)).await.unwrap();
    let envd = client.envd(&sandbox);
    let mut stream = envd.start(&bash("exec sleep 4545"), &CallOptions::default()).await.unwrap();
    client.get_sandbox(&sandbox.sandbox_id).await.unwrap();
    let mut gone = false;
    for _ in 0..85 {
        match client.get_sandbox(&sandbox.sandbox_id).await {
            Err(err) if err.is_not_found() => {
                gone = true;
                break;
            }
            Ok(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            Err(err) => panic!("unexpected error: {err}"),
        }
    }
    assert!(gone, "sandbox still exists 8.5 s after a 2 s deadline");
    // Its process is gone and its stream ended (with or without an end event).
    let left = wait_until_no_host_process("sleep 4545").await;
    assert!(left.is_empty(), "processes survived the deadline: {left:?}");
    tokio::time::timeout(Duration::from_secs(5), async { while let Ok(Some(_)) = stream.next_event().await {} })
        .await
        .expect("the stream of an expired sandbox must end");
    let err = envd.health().await.unwrap_err();
    assert!(err.is_sandbox_gone(), "{err:?}");
    provider.shutdown().await;
}

#[tokio::test]
async fn kill_while_busy_leaves_no_process() {
    let Some(provider) = provider() else { return };
    let client = provider.client();
    let (sandbox, envd) = create(&client).await;
    let opts = CallOptions::default();
    let _sleeper = envd.start(&bash("sleep 4242 & sleep 4242; wait"), &opts).await.unwrap();
    let busy = envd.clone();
    let runner = tokio::spawn(async move {
        busy.run(&bash("while :; do :; done"), &CallOptions::default(), OutputLimits::default()).await
    });
    // bash plus its two sleepers, and the busy loop, all running.
    let running = eventually(Duration::from_secs(10), || async {
        host_processes_with("sleep 4242").len() == 3 && !host_processes_with("while :; do :; done").is_empty()
    })
    .await;
    assert!(running, "the sleepers should be visible from the host: {:?}", host_processes_with("sleep 4242"));
    let started = std::time::Instant::now();
    assert!(client.kill_sandbox(&sandbox.sandbox_id).await.unwrap());
    eprintln!("kill of a busy sandbox took {:?}", started.elapsed());
    let left = wait_until_no_host_process("sleep 4242").await;
    assert!(left.is_empty(), "processes survived kill: {left:?}");
    let result = tokio::time::timeout(Duration::from_secs(10), runner).await.expect("run must end after kill").unwrap();
    assert!(result.is_err(), "a command in a killed sandbox cannot succeed: {result:?}");
    let err = envd.run(&bash("true"), &opts, OutputLimits::default()).await.unwrap_err();
    assert!(err.is_sandbox_gone(), "{err:?}");
    provider.shutdown().await;
}

#[tokio::test]
async fn sandboxes_are_isolated_from_each_other_and_the_host() {
    let Some(provider) = provider() else { return };
    let client = provider.client();
    let (_a, envd_a) = create(&client).await;
    let (_b, envd_b) = create(&client).await;
    let root = CallOptions::user("root");

    envd_a.write_file("/tmp/secret-a", Bytes::from_static(b"a only"), &root).await.unwrap();
    assert!(envd_b.stat("/tmp/secret-a", &root).await.unwrap_err().is_not_found());
    let _sleeper = envd_a.start(&bash("exec sleep 4343"), &root).await.unwrap();
    let b_procs = envd_b.list_processes(&root).await.unwrap();
    assert!(b_procs.iter().all(|p| !p.config.args.join(" ").contains("4343")), "{b_procs:?}");
    let seen =
        run_ok(&envd_b, "cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' ' | grep -c 'sleep 434[3]' || true", &root)
            .await;
    assert_eq!(seen.trim(), "0", "sandbox B sees A's process");
    // Writes to / and /etc as root stay inside the sandbox.
    let marker = format!("sandbox-mcp-isolation-{}", envd_a.sandbox_id());
    envd_a.write_file(&format!("/etc/{marker}"), Bytes::from_static(b"x"), &root).await.unwrap();
    run_ok(&envd_a, &format!("echo x > /{marker}"), &root).await;
    assert!(!Path::new(&format!("/etc/{marker}")).exists(), "sandbox wrote the host's /etc");
    assert!(!Path::new(&format!("/{marker}")).exists(), "sandbox wrote the host's /");
    assert!(envd_b.stat(&format!("/etc/{marker}"), &root).await.unwrap_err().is_not_found());
    // Its own pid namespace: few processes, its envd among the first pids.
    let count = run_ok(&envd_a, "ls -d /proc/[0-9]* | wc -l", &root).await;
    assert!(count.trim().parse::<u32>().unwrap() < 20, "sandbox sees {count} processes");
    provider.shutdown().await;
}

#[tokio::test]
async fn unknown_sandboxes_and_bad_keys_give_clear_errors() {
    let Some(provider) = provider() else { return };
    let client = provider.client();
    let err = client.get_sandbox("no-such-sandbox").await.unwrap_err();
    assert!(matches!(err, E2bError::NotFound { .. }), "{err:?}");
    assert!(err.to_string().contains("get_sandbox (sandbox no-such-sandbox)"), "{err}");
    assert!(!client.kill_sandbox("no-such-sandbox").await.unwrap());
    assert!(client.connect_sandbox("no-such-sandbox", None).await.unwrap_err().is_not_found());
    assert!(client.set_timeout("no-such-sandbox", 5).await.unwrap_err().is_not_found());
    let ghost = wire::Sandbox { sandbox_id: "no-such-sandbox".into(), ..Default::default() };
    let envd = client.envd(&ghost);
    let err = envd.run(&bash("true"), &CallOptions::default(), OutputLimits::default()).await.unwrap_err();
    assert!(matches!(err, E2bError::SandboxNotRunning { .. }), "{err:?}");
    assert!(err.to_string().contains("process.Start") && err.to_string().contains("no-such-sandbox"), "{err}");
    let err = envd.read_file("/etc/hostname", &CallOptions::default()).await.unwrap_err();
    assert!(matches!(err, E2bError::SandboxNotRunning { .. }), "{err:?}");

    let bad_key = "e2b_ffffffffffffffffffffffffffffffffffffffff";
    let wrong = provider.client_with_key(Some(bad_key));
    let err = wrong.create_sandbox(&new_sandbox(30)).await.unwrap_err();
    assert!(matches!(err, E2bError::Auth { status: 401, .. }), "{err:?}");
    assert!(!err.to_string().contains(bad_key) && !format!("{err:?}").contains(bad_key));
    let err = provider.client_with_key(None).list_all_sandboxes(&[]).await.unwrap_err();
    assert!(matches!(err, E2bError::Auth { .. }), "{err:?}");
    let err =
        client.create_sandbox(&wire::NewSandbox { template_id: "no-such-template".into(), ..Default::default() }).await;
    assert!(matches!(err, Err(E2bError::NotFound { .. } | E2bError::Api { status: 400, .. })), "{err:?}");
    provider.shutdown().await;
}
