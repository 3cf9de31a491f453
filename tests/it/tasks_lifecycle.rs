//! How tasks end and what is refused: timeout, cancel of a TERM-ignoring
//! task (KILL), cleanup of the task's process group (and the documented
//! escape of a child that called setsid), a killed supervisor (unknown; its
//! liveness probe through the files API), a
//! killed sandbox (clear error), the argument rejections, including
//! the 129th task, and later starts answered by the task server and run by
//! its spare daemon.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

use crate::{common, tasks_support};
use std::time::{Duration, Instant};

use common::{eventually, require_root};
use serde_json::{Value, json};
use tasks_support::{Env, Mcp};

async fn run(mcp: &Mcp, sandbox_id: &str, command: &str) -> Value {
    mcp.call("run_command", json!({"sandbox_id": sandbox_id, "command": command})).await.ok()
}

async fn pid_alive(mcp: &Mcp, sandbox_id: &str, pid: u64) -> bool {
    let v = run(mcp, sandbox_id, &format!("test -d /proc/{pid} && ! grep -q '^State:.*Z' /proc/{pid}/status")).await;
    v["exit_code"] == 0
}

#[tokio::test(flavor = "multi_thread")]
async fn timeout_cancel_group_cleanup_and_lost_supervisor() {
    require_root!();
    let (_env, serve, mcp) = Env::local("").await;
    let sandbox_id = mcp.create_sandbox().await;

    // Timeout: TERM at 1 s.
    let v = mcp.start_task(&sandbox_id, "sleep 600", json!({"timeout": 1})).await;
    let timed = mcp.wait_done(&sandbox_id, v["task_id"].as_str().unwrap(), Duration::from_secs(30)).await;
    assert_eq!(timed["state"], "timed_out", "{timed}");
    assert!(timed["exit_code"].is_i64());

    // A task that ignores TERM, with a child in its group and a child that escaped with setsid.
    let command = "trap '' TERM; sleep 900 & echo child=$!; setsid sleep 901 & echo escaped=$!; \
                   while true; do sleep 0.2; done";
    let v = mcp.start_task(&sandbox_id, command, json!({})).await;
    let task_id = v["task_id"].as_str().unwrap().to_string();
    let mut out = String::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !out.contains("escaped=") {
        assert!(Instant::now() < deadline, "no output: {out}");
        out = mcp.get_task(&sandbox_id, &task_id, json!({"wait_seconds": 2})).await["stdout"]
            .as_str()
            .unwrap()
            .to_string();
    }
    let pid_of = |key: &str| -> u64 { out.lines().find_map(|l| l.strip_prefix(key)).unwrap().trim().parse().unwrap() };
    let (child, escaped) = (pid_of("child="), pid_of("escaped="));
    assert!(pid_alive(&mcp, &sandbox_id, child).await);
    let t0 = Instant::now();
    let c = mcp.call("cancel_task", json!({"sandbox_id": sandbox_id, "task_id": task_id})).await.ok();
    assert_eq!(c["state"], "cancelled", "TERM ignored, KILL after the grace period: {c}");
    assert_eq!(c["cancel_confirmed"], true);
    assert_eq!(c["exit_code"], 137, "{c}");
    assert!(t0.elapsed() < Duration::from_secs(8));
    assert!(!pid_alive(&mcp, &sandbox_id, child).await, "a child in the task's group survived the cancel");
    assert!(pid_alive(&mcp, &sandbox_id, escaped).await, "the setsid child escapes (documented)");
    run(&mcp, &sandbox_id, &format!("kill -9 {escaped}")).await;
    // Cancel of a finished task: saved outcome, nothing signalled.
    let again = mcp.call("cancel_task", json!({"sandbox_id": sandbox_id, "task_id": task_id})).await.ok();
    assert_eq!((&again["state"], &again["finished_at"]), (&c["state"], &c["finished_at"]));

    // Killing the supervisor: the task reads as unknown; cancel does not claim success.
    let v = mcp.start_task(&sandbox_id, "sleep 902", json!({})).await;
    let task_id = v["task_id"].as_str().unwrap().to_string();
    let status = format!("/home/user/.sandbox-mcp/tasks/{task_id}/status.json");
    let pid = run(
        &mcp,
        &sandbox_id,
        &format!(
            "for i in $(seq 50); do test -s {status} && break; sleep 0.1; done; \
         python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[\"supervisor_pid\"])' {status}"
        ),
    )
    .await;
    let supervisor_pid: u64 = pid["stdout"].as_str().unwrap().trim().parse().unwrap();
    // get_task's liveness probe without a process: envd's files API reads the daemon's
    // status.json through its cwd while it lives, and not after.
    let probe = format!("/proc/{supervisor_pid}/cwd/status.json");
    let read = mcp.call("read_file", json!({"sandbox_id": sandbox_id, "path": probe})).await.ok();
    let record: Value = serde_json::from_str(read["content"].as_str().unwrap()).unwrap();
    assert_eq!(
        (record["task_id"].as_str(), record["supervisor_pid"].as_u64()),
        (Some(&*task_id), Some(supervisor_pid))
    );
    run(&mcp, &sandbox_id, &format!("kill -9 {supervisor_pid}")).await;
    // The probe path goes with the process (at once, or as soon as it is reaped).
    let read_probe = || mcp.call("read_file", json!({"sandbox_id": sandbox_id, "path": probe}));
    let gone = eventually(Duration::from_secs(10), || async { read_probe().await.is_error }).await;
    assert!(gone, "{probe} still reads after the supervisor was killed");
    assert!(!read_probe().await.err().is_empty());
    let lost = mcp.get_task(&sandbox_id, &task_id, json!({})).await;
    assert_eq!(lost["state"], "unknown", "{lost}");
    assert!(lost["error"].as_str().unwrap().contains("supervisor"));
    let c = mcp.call("cancel_task", json!({"sandbox_id": sandbox_id, "task_id": task_id})).await.ok();
    assert_eq!(c["cancel_confirmed"], false, "{c}");
    assert_ne!(c["state"], "cancelled");

    // Killing the sandbox: a clear error, also for a session that had it cached.
    let other = Mcp::connect(&serve.mcp_url()).await;
    other.call("kill_sandbox", json!({"sandbox_id": sandbox_id})).await.ok();
    let err = mcp.call("get_task", json!({"sandbox_id": sandbox_id, "task_id": task_id})).await.err();
    assert!(err.contains(&format!("sandbox {sandbox_id} not found or no longer running; its tasks are gone")), "{err}");
    let err = other.call("list_tasks", json!({"sandbox_id": sandbox_id})).await.err();
    assert!(err.contains("its tasks are gone"), "{err}");
    other.close().await;
    mcp.close().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_arguments_are_refused_before_any_connection() {
    require_root!();
    let (_env, _serve, mcp) = Env::local("").await;
    let tools = mcp.client.list_all_tools().await.unwrap();
    for name in ["start_task", "get_task", "cancel_task", "list_tasks"] {
        let tool = tools.iter().find(|t| t.name == name).unwrap_or_else(|| panic!("{name} is not listed"));
        assert_eq!(tool.input_schema.get("additionalProperties"), Some(&json!(false)), "{name}");
        assert!(tool.output_schema.is_some(), "{name} has no output schema");
    }
    let good_id = "0123456789abcdef0123456789abcdef";
    // No sandbox, no default.
    let err = mcp.call("start_task", json!({"command": "true"})).await.err();
    assert!(err.contains("create_sandbox"), "{err}");
    // Validation precedes the sandbox lookup: a missing sandbox is not what is reported.
    let ghost = "nosuchsandbox";
    let cases = [
        ("start_task", json!({"sandbox_id": ghost, "command": "a".repeat(65_537)}), "65,536"),
        ("start_task", json!({"sandbox_id": ghost, "command": "\u{1F600}".repeat(30_000)}), "98,304"),
        ("start_task", json!({"sandbox_id": ghost, "command": "true", "timeout": 0}), "timeout"),
        ("start_task", json!({"sandbox_id": ghost, "command": "true", "timeout": 3601}), "timeout"),
        ("start_task", json!({"sandbox_id": ghost, "command": "true", "envs": {"1BAD": "x"}}), "valid variable name"),
        ("start_task", json!({"sandbox_id": ghost, "command": "true", "cwd": "rel/dir"}), "cwd"),
        ("start_task", json!({"sandbox_id": ghost, "command": "true", "bogus": 1}), "bogus"),
        ("get_task", json!({"sandbox_id": ghost, "task_id": "xyz"}), "32 lowercase"),
        ("get_task", json!({"sandbox_id": ghost, "task_id": good_id.to_uppercase()}), "32 lowercase"),
        ("get_task", json!({"sandbox_id": ghost, "task_id": good_id, "stdout_offset": 1_048_577}), "stdout_offset"),
        ("get_task", json!({"sandbox_id": ghost, "task_id": good_id, "stderr_offset": 1_048_577}), "stderr_offset"),
        ("get_task", json!({"sandbox_id": ghost, "task_id": good_id, "limit": 0}), "limit"),
        ("get_task", json!({"sandbox_id": ghost, "task_id": good_id, "limit": 65_537}), "limit"),
        ("get_task", json!({"sandbox_id": ghost, "task_id": good_id, "wait_seconds": 31}), "wait_seconds"),
        ("get_task", json!({"sandbox_id": ghost, "task_id": good_id, "stdout_offset": -1}), "stdout_offset"),
        ("get_task", json!({"task_id": good_id}), "sandbox_id"),
        ("get_task", json!({"sandbox_id": ghost, "task_id": good_id, "extra": true}), "extra"),
        ("cancel_task", json!({"sandbox_id": ghost, "task_id": "../../etc/passwd"}), "32 lowercase"),
        ("cancel_task", json!({"sandbox_id": ghost, "task_id": good_id, "wait_seconds": 1}), "wait_seconds"),
        ("list_tasks", json!({"sandbox_id": ghost, "all": true}), "all"),
    ];
    for (tool, args, needle) in cases {
        let err = mcp.call(tool, args.clone()).await.err();
        assert!(err.contains(needle), "{tool} {args}: {err}");
        assert!(!err.contains("not found"), "{tool} {args}: validated after a lookup: {err}");
    }
    // A well-formed request for a sandbox that does not exist.
    let err = mcp.call("get_task", json!({"sandbox_id": ghost, "task_id": good_id})).await.err();
    assert!(err.contains("its tasks are gone"), "{err}");
    // An unknown task in a real sandbox.
    let sandbox_id = mcp.create_sandbox().await;
    let err = mcp.call("get_task", json!({"sandbox_id": sandbox_id, "task_id": good_id})).await.err();
    assert!(err.contains("list_tasks"), "{err}");
    // Exactly 65,536 characters is accepted.
    let v = mcp.start_task(&sandbox_id, &format!("true #{}", "a".repeat(65_530)), json!({})).await;
    assert_ne!(v["state"], "unknown");

    // 128 task directories, then the next start is refused.
    let starts = (1..128).map(|_| mcp.call("start_task", json!({"sandbox_id": sandbox_id, "command": "true"})));
    for reply in futures_util::future::join_all(starts).await {
        reply.ok();
    }
    let listed = mcp.call("list_tasks", json!({})).await.ok();
    assert_eq!(listed["tasks"].as_array().unwrap().len(), 128);
    let err = mcp.call("start_task", json!({"sandbox_id": sandbox_id, "command": "true"})).await.err();
    assert!(err.contains("128"), "{err}");
    mcp.call("kill_sandbox", json!({"sandbox_id": sandbox_id})).await.ok();
    mcp.close().await;
}

/// A new sandbox after a first start (`true`), which opens its task channel beside it.
async fn sandbox_after_a_first_task(mcp: &Mcp) -> String {
    let sandbox_id = mcp.create_sandbox().await;
    mcp.start_task(&sandbox_id, "true", json!({})).await;
    sandbox_id
}

/// A task channel the gateway gives up on does not linger in the sandbox: one whose supervisor
/// greets with another version is dropped and its stdin closed, so it and its spare exit at once
/// rather than after their idle time (5 minutes).
#[tokio::test(flavor = "multi_thread")]
async fn a_channel_the_gateway_gives_up_on_exits_with_its_spare() {
    require_root!();
    let (_env, serve, mcp) = Env::local("").await;
    let sandbox_id = sandbox_after_a_first_task(&mcp).await;
    // The installed supervisor made to greet with another version (and to leave a mark when its
    // channel starts), then the channel it already runs killed: the next start opens another.
    let script = sandbox_mcp::tasks::SUPERVISOR_PATH;
    let forge = format!(
        "python3 - <<'EOF'\n\
         path = {script:?}\n\
         text = open(path).read()\n\
         greeting = '{{\"version\": SUPERVISOR_VERSION,'\n\
         assert greeting in text and '    spare = Spare()\\n    spare.ensure()' in text\n\
         text = text.replace(greeting, '{{\"version\": \"forged\",')\n\
         text = text.replace('    spare = Spare()\\n    spare.ensure()', \"    open('/tmp/forged-channel', 'a').write('started\\\\n')\\n    spare = Spare()\\n    spare.ensure()\")\n\
         open(path, 'w').write(text)\n\
         EOF"
    );
    let forged = run(&mcp, &sandbox_id, &forge).await;
    assert_eq!(forged["exit_code"], 0, "{forged}");
    let channels = tasks_support::CHANNEL_PIDS;
    let killed = run(
        &mcp,
        &sandbox_id,
        &format!(
            "{}; kill -9 $c; while test -n \"$({channels})\"; do sleep 0.05; done; echo killed $c",
            tasks_support::await_channel_pids()
        ),
    )
    .await;
    assert!(killed["stdout"].as_str().unwrap().split_whitespace().count() >= 2, "no channel was running: {killed}");
    let second = mcp.start_task(&sandbox_id, "true", json!({})).await;
    assert!(second["task_id"].is_string(), "{second}");
    // The forged channel started, was dropped for its greeting, and ended with its spare.
    let gone = run(
        &mcp,
        &sandbox_id,
        &format!(
            "for i in $(seq 200); do test -s /tmp/forged-channel && test -z \"$({channels})\" && break; sleep 0.05; done; \
             cat /tmp/forged-channel; echo left: $({channels})"
        ),
    )
    .await;
    assert_eq!(gone["stdout"], "started\nleft:\n", "the dropped channel lingers: {gone}");
    drop(serve);
}

/// The record of a task, as its daemon saved it.
async fn task_record(mcp: &Mcp, sandbox_id: &str, task_id: &str) -> Value {
    let path = format!("/home/user/.sandbox-mcp/tasks/{task_id}/status.json");
    let record = mcp.call("read_file", json!({"sandbox_id": sandbox_id, "path": path})).await.ok();
    serde_json::from_str(record["content"].as_str().unwrap()).unwrap()
}

/// In a real sandbox (envd's user, its /proc, envd's SendInput): the first start opens the
/// sandbox's task channel, and a later start goes through it, answered before the command runs
/// with the first record naming the channel's spare; a cancel sent right after the answer reaches
/// it. Code in the sandbox cannot open the channel's streams, as the sandbox user or as root. With
/// the channel killed, the next start is answered by the task server through the bash client, its
/// record naming the server's spare. Each command runs exactly once.
#[tokio::test(flavor = "multi_thread")]
async fn later_starts_go_through_the_channel_or_else_the_task_server_and_its_spare() {
    require_root!();
    let (_env, serve, mcp) = Env::local("").await;
    let sandbox_id = sandbox_after_a_first_task(&mcp).await;
    // The channel process (`... channel` as its last argument: the lowest such pid, since its
    // spare is a fork of it with the same command line) and its spare, forked before it greets
    // the gateway.
    let find_channel = format!(
        "for i in $(seq 100); do c=$({} | head -1); \
        test -n \"$c\" && s=$(cat /proc/$c/task/$c/children) && test -n \"$s\" && break; sleep 0.05; done; \
        sleep 0.2; echo $c $s",
        tasks_support::CHANNEL_PIDS
    );
    let found = run(&mcp, &sandbox_id, &find_channel).await;
    let pids: Vec<u64> = found["stdout"].as_str().unwrap().split_whitespace().filter_map(|p| p.parse().ok()).collect();
    let [channel, channel_spare] = pids[..] else { panic!("no channel with a spare: {found}") };

    let marker = "/tmp/spare-runs";
    let started = mcp.start_task(&sandbox_id, &format!("echo x >> {marker}; sleep 600"), json!({})).await;
    assert_eq!(started["state"], "running", "{started}");
    assert!(started["started_at"].as_f64().is_some(), "{started}");
    let task_id = started["task_id"].as_str().unwrap();
    let record = task_record(&mcp, &sandbox_id, task_id).await;
    assert_eq!(record["supervisor_pid"].as_u64(), Some(channel_spare), "the channel's spare took the task: {record}");
    // Cancelled at once: the spare obeys it whether or not its command had started.
    let c = mcp.call("cancel_task", json!({"sandbox_id": sandbox_id, "task_id": task_id})).await.ok();
    assert_eq!((c["state"].as_str(), c["cancel_confirmed"].as_bool()), (Some("cancelled"), Some(true)), "{c}");
    let runs = run(&mcp, &sandbox_id, &format!("cat {marker} 2>/dev/null | wc -l")).await;
    assert!(matches!(runs["stdout"].as_str().unwrap().trim(), "0" | "1"), "{runs}");

    // The channel's streams are envd's pipes: code in the sandbox cannot open them to forge answers
    // or requests, neither as the sandbox user nor as root.
    for user in ["user", "root"] {
        let forge = json!({"sandbox_id": sandbox_id, "user": user,
            "command": format!("printf '1 0 {{}}\\n' > /proc/{channel}/fd/1 || printf '1 start\\n' > /proc/{channel}/fd/0")});
        let forged = mcp.call("run_command", forge).await.ok();
        assert_ne!(forged["exit_code"], 0, "{user} wrote into the task channel: {forged}");
        assert!(forged["stderr"].as_str().unwrap().contains("Permission denied"), "{forged}");
    }

    // The channel killed: the task server (forked by the first start) and its spare take the next.
    let pid_file = format!("/home/user/.sandbox-mcp/server-{}.pid", sandbox_mcp::tasks::supervisor_version());
    let server_spare = format!(
        "kill -9 {channel}; while test -e /proc/{channel}; do sleep 0.02; done; \
         for i in $(seq 100); do test -s {pid_file} && break; sleep 0.05; done; s=$(cut -d' ' -f1 {pid_file}); \
         for i in $(seq 100); do c=$(cat /proc/$s/task/$s/children); test -n \"$c\" && break; sleep 0.05; done; echo $c"
    );
    let children = run(&mcp, &sandbox_id, &server_spare).await;
    let spare: u64 = children["stdout"].as_str().unwrap().split_whitespace().next().unwrap().parse().unwrap();
    let second = mcp.start_task(&sandbox_id, &format!("echo y >> {marker}.2"), json!({})).await;
    let second_id = second["task_id"].as_str().unwrap();
    let record = task_record(&mcp, &sandbox_id, second_id).await;
    assert_eq!(record["supervisor_pid"].as_u64(), Some(spare), "the server's spare took the task: {record}");
    mcp.wait_done(&sandbox_id, second_id, Duration::from_secs(30)).await;
    let done = mcp.get_task(&sandbox_id, second_id, json!({})).await;
    assert_eq!(done["state"], "succeeded", "{done}");
    let runs = run(&mcp, &sandbox_id, &format!("cat {marker}.2")).await;
    assert_eq!(runs["stdout"], "y\n");
    drop(serve);
}
