//! Task output through MCP: 20 concurrent tasks each writing 3 MiB keep a
//! byte-identical first MiB (paged back with odd limits), exact sizes and
//! truncation flags; secret masking (split across pipe reads, look-alikes
//! kept, gateway-configured secrets masked even across a page edge);
//! lossy UTF-8 at page edges; `wait_seconds` returning early.
//!
//! Byte-exact checks use ASCII (hex of SHA-256 blocks) so that the text
//! pages are the stored bytes exactly; binary storage is covered by the
//! supervisor's own tests.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

use crate::{common, tasks_support};
use std::time::{Duration, Instant};

use common::{eventually, host_processes_with, require_root};
use serde_json::json;
use sha2::{Digest, Sha256};
use tasks_support::{Env, Mcp};

const MIB: usize = 1 << 20;
const STDOUT_BYTES: usize = 3 * MIB;
const STDERR_BYTES: usize = 70_001;

/// Hex of sha256("{seed}:{i}") for i = 0, 1, ... (64 ASCII bytes per block).
fn expected_text(seed: u32, len: usize) -> String {
    let mut out = String::with_capacity(len + 64);
    let mut i = 0u64;
    while out.len() < len {
        out.push_str(&hex::encode(Sha256::digest(format!("{seed}:{i}").as_bytes())));
        i += 1;
    }
    out.truncate(len);
    out
}

fn generator_command(seed: u32) -> String {
    format!(
        "python3 -c 'import hashlib,sys\nw=sys.stdout.write\nfor i in range({blocks}): w(hashlib.sha256(b\"{seed}:%d\" % i).hexdigest())' > /tmp/rand{seed}.txt && \
         head -c {STDOUT_BYTES} /tmp/rand{seed}.txt && head -c {STDERR_BYTES} /tmp/rand{seed}.txt >&2",
        blocks = STDOUT_BYTES / 64 + 1
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn twenty_concurrent_tasks_keep_exact_prefixes() {
    require_root!();
    let (_env, serve, mcp) = Env::local("").await;
    let sandbox_id = mcp.create_sandbox().await;

    let starts = (0..20u32).map(|seed| {
        let mcp = &mcp;
        let sandbox_id = &sandbox_id;
        async move {
            let v = mcp.start_task(sandbox_id, &generator_command(seed), json!({})).await;
            assert!(matches!(v["state"].as_str(), Some("running" | "succeeded")), "{v}");
            (seed, v["task_id"].as_str().unwrap().to_string())
        }
    });
    let tasks = futures_util::future::join_all(starts).await;

    let checks = tasks.iter().map(|(seed, task_id)| {
        let mcp = &mcp;
        let sandbox_id = &sandbox_id;
        async move {
            let done = mcp.wait_done(sandbox_id, task_id, Duration::from_secs(180)).await;
            assert_eq!(done["state"], "succeeded", "task {seed}: {done}");
            assert_eq!(done["stdout_size"], MIB as u64);
            assert_eq!(done["stdout_total_bytes"], STDOUT_BYTES as u64);
            assert_eq!(done["stdout_truncated"], true);
            assert_eq!(done["stderr_size"], STDERR_BYTES as u64);
            assert_eq!(done["stderr_truncated"], false);
            let expected = expected_text(*seed, MIB);
            let (stdout, last) = mcp.read_stream(sandbox_id, task_id, "stdout", 65_521).await;
            assert!(stdout == expected, "task {seed}: stdout prefix differs");
            assert_eq!(last["stdout_next_offset"], MIB as u64);
            let (stderr, _) = mcp.read_stream(sandbox_id, task_id, "stderr", 33_333).await;
            assert!(stderr == expected[..STDERR_BYTES], "task {seed}: stderr differs");
        }
    });
    futures_util::future::join_all(checks).await;
    mcp.close().await; // retained: kill it explicitly
    let admin = Mcp::connect(&serve.mcp_url()).await;
    admin.call("kill_sandbox", json!({"sandbox_id": sandbox_id})).await.ok();
    admin.close().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn secrets_are_masked_and_look_alikes_kept() {
    require_root!();
    let (_env, _serve, mcp) = Env::local("[tasks]\nsecrets = [\"gateway-configured-secret-42\"]\n").await;
    let sandbox_id = mcp.create_sandbox().await;

    // The env secret is written in two pieces, with a pause, so the supervisor sees two pipe reads.
    let command = "printf 'A:tok-abc'; sleep 0.5; printf 'def-123456 B:tok-abcdef-12345X C:%s D:gateway-configured-secret-4X E:false\\n' gateway-configured-secret-42";
    let envs =
        json!({"API_TOKEN": "tok-abcdef-123456", "TOKENIZERS_PARALLELISM": "false", "PLAIN": "tok-abcdef-123456"});
    let v = mcp.start_task(&sandbox_id, command, json!({"envs": envs})).await;
    let task_id = v["task_id"].as_str().unwrap().to_string();
    let done = mcp.wait_done(&sandbox_id, &task_id, Duration::from_secs(30)).await;
    assert_eq!(done["state"], "succeeded", "{done}");
    let page = mcp.get_task(&sandbox_id, &task_id, json!({})).await;
    assert_eq!(
        page["stdout"], "A:*** B:tok-abcdef-12345X C:*** D:gateway-configured-secret-4X E:false\n",
        "env secret split across reads masked by the supervisor; gateway secret masked by the gateway"
    );
    // A page edge inside the gateway secret: neither page shows any part of it.
    // Stored: "A:*** B:tok-abcdef-12345X C:" is 28 bytes, the secret follows (28 bytes).
    let first = mcp.get_task(&sandbox_id, &task_id, json!({"limit": 40})).await;
    assert_eq!(first["stdout"], "A:*** B:tok-abcdef-12345X C:***");
    assert_eq!(first["stdout_next_offset"], 40);
    let second = mcp.get_task(&sandbox_id, &task_id, json!({"stdout_offset": 40, "limit": 20})).await;
    assert_eq!(second["stdout"], "*** D:g");
    assert!(!second.to_string().contains("secret-42"));
    mcp.call("kill_sandbox", json!({"sandbox_id": sandbox_id})).await.ok();
    mcp.close().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn split_characters_read_as_replacement_and_wait_returns_early() {
    require_root!();
    let (_env, serve, mcp) = Env::local("").await;
    let sandbox_id = mcp.create_sandbox().await;

    let v = mcp.start_task(&sandbox_id, "printf 'aé'; sleep 2; echo late; sleep 600", json!({})).await;
    let task_id = v["task_id"].as_str().unwrap().to_string();
    // Wait for the first output (present at once or shortly).
    let first = mcp.get_task(&sandbox_id, &task_id, json!({"wait_seconds": 10})).await;
    assert_eq!(first["stdout"], "aé");
    let split = mcp.get_task(&sandbox_id, &task_id, json!({"limit": 2})).await;
    assert_eq!(split["stdout"], "a\u{fffd}");
    assert_eq!(split["stdout_next_offset"], 2);
    let rest = mcp.get_task(&sandbox_id, &task_id, json!({"stdout_offset": 2, "limit": 1})).await;
    assert_eq!(rest["stdout"], "\u{fffd}");

    // New output ends the wait early (about 2 s after start, not 25 s).
    let t0 = Instant::now();
    let more = mcp.get_task(&sandbox_id, &task_id, json!({"stdout_offset": 3, "wait_seconds": 25})).await;
    assert_eq!(more["stdout"], "late\n");
    assert!(t0.elapsed() < Duration::from_secs(10), "wait did not return on new output: {:?}", t0.elapsed());

    // A state change ends the wait early: cancel from a second session while this one waits.
    let other = Mcp::connect(&serve.mcp_url()).await;
    let waiting = mcp.get_task(&sandbox_id, &task_id, json!({"stdout_offset": 8, "wait_seconds": 25}));
    let cancelling = async {
        // Cancel once the wait is under way: the supervisor's `status --wait` for this task runs.
        let waiting_now = || host_processes_with(&task_id).iter().any(|p| p.contains("--wait-stdout-offset 8 "));
        let under_way = eventually(Duration::from_secs(10), || async { waiting_now() }).await;
        assert!(under_way, "the waiting get_task never reached the supervisor: {:?}", host_processes_with(&task_id));
        other.call("cancel_task", json!({"sandbox_id": sandbox_id, "task_id": task_id})).await.ok()
    };
    let t0 = Instant::now();
    let (waited, cancelled) = tokio::join!(waiting, cancelling);
    assert!(t0.elapsed() < Duration::from_secs(10), "wait did not return on a state change: {:?}", t0.elapsed());
    assert_eq!(cancelled["state"], "cancelled");
    assert_eq!(cancelled["cancel_confirmed"], true);
    assert_eq!(waited["state"], "cancelled", "{waited}");
    // A finished task does not wait at all.
    let t0 = Instant::now();
    mcp.get_task(&sandbox_id, &task_id, json!({"stdout_offset": 8, "wait_seconds": 5})).await;
    assert!(t0.elapsed() < Duration::from_secs(3), "waited on a finished task: {:?}", t0.elapsed());
    // A running task with no new output: the whole wait elapses, then the page comes back.
    let quiet = mcp.start_task(&sandbox_id, "sleep 30", json!({})).await;
    let quiet_id = quiet["task_id"].as_str().unwrap().to_string();
    let t0 = Instant::now();
    let v = mcp.get_task(&sandbox_id, &quiet_id, json!({"wait_seconds": 1})).await;
    let waited = t0.elapsed();
    assert_eq!((v["state"].as_str(), v["stdout"].as_str()), (Some("running"), Some("")), "{v}");
    assert!(waited >= Duration::from_millis(950) && waited < Duration::from_secs(5), "wait took {waited:?}");
    other.close().await;
    mcp.call("kill_sandbox", json!({"sandbox_id": sandbox_id})).await.ok();
    mcp.close().await;
}
