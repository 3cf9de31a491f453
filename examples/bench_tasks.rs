//! Task tool latencies through MCP against a real `sandbox-mcp serve`
//! (embedded local provider): medians (and p90) of start_task to response,
//! get_task with a 16 KiB page (of a finished and of a running task), cancel_task of a TERM-obeying task,
//! run_command "true" (a login shell), and the
//! supervisor's memory (RSS of an idle one, peak RSS of one draining 3 MiB),
//! and a breakdown: the same in-sandbox work timed through envd directly (with the floors the
//! targets are set against: `/bin/true`, `python3 -I -S -c pass`, `bash -l -c true`, `bash -c true`).
//! The gateway talks to a separate `sandbox-mcp provider` (kind = "e2b").
//!
//! Run as root (the local provider needs namespaces):
//!
//! ```text
//! cargo build --release && cargo run --release --example bench_tasks [-- --bin target/release/sandbox-mcp --n 40]
//! ```
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

#[path = "../tests/it/common/mod.rs"]
mod common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use common::mcp::McpClient as Client;
use common::stats::{Summary, print_header, print_row};
use common::{Gateway, GatewayBuilder, Provider};
use rmcp::model::ProtocolVersion;
use sandbox_mcp::e2b::{CallOptions, EnvdClient, OutputLimits, wire};
use sandbox_mcp::masking::Masker;
use sandbox_mcp::tasks::TaskId;
use sandbox_mcp::tasks::launch::{TaskSpec, start_launch};
use sandbox_mcp::tasks::service::TaskService;
use serde_json::{Value, json};

/// Pause before each timed start_task (a lone start, as an agent makes them): the previous
/// task's command launch, which follows its start's answer, has settled, and the task server has
/// forked its next spare (after `SPARE_DELAY`, 3 ms, of quiet in `supervisor.py`). The
/// back-to-back row shows starts that may find no spare yet.
const START_GAP: Duration = Duration::from_millis(30);

async fn call(client: &Client, tool: &str, args: Value) -> anyhow::Result<Value> {
    common::mcp::tool(client, tool, args).await
}

async fn timed(client: &Client, tool: &str, args: Value) -> anyhow::Result<(Duration, Value)> {
    let t0 = Instant::now();
    let v = call(client, tool, args).await?;
    Ok((t0.elapsed(), v))
}

/// Starts `command` as a task in `sandbox_id` and returns its task id.
async fn start_task(client: &Client, sandbox_id: &str, command: &str) -> anyhow::Result<String> {
    let v = call(client, "start_task", json!({"sandbox_id": sandbox_id, "command": command})).await?;
    Ok(v["task_id"].as_str().context("task_id")?.to_string())
}

fn summary(name: &str, target_ms: f64, samples: Vec<Duration>) {
    let target = target_ms.is_finite().then_some(target_ms);
    print_row(name, "ms", &Summary::of_durations(&samples), target);
}

/// A separate `sandbox-mcp provider` (so the bench can also time envd directly) and `serve` pointed at it.
fn start_gateway(bin: &PathBuf) -> anyhow::Result<(Provider, Gateway)> {
    let provider = Provider::builder().bin(bin).echo(false).try_start().map_err(anyhow::Error::msg)?;
    let gateway = GatewayBuilder::provider(&provider, "[server]\nlog_format = \"json\"\n")
        .bin(bin)
        .log_filter("warn")
        .try_start()
        .map_err(anyhow::Error::msg)?;
    Ok((provider, gateway))
}

/// Times `argv` run through envd directly (no gateway, no MCP), with `stdin` written to its stdin.
async fn time_envd(envd: &EnvdClient, argv: &[&str], stdin: Option<&[u8]>, n: usize) -> anyhow::Result<Vec<Duration>> {
    let request = wire::StartRequest {
        process: wire::ProcessConfig {
            cmd: argv[0].to_string(),
            args: argv[1..].iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        },
        stdin: Some(stdin.is_some()),
        ..Default::default()
    };
    let options = CallOptions::user("user").with_timeout(Duration::from_secs(30));
    let mut samples = Vec::new();
    for _ in 0..n {
        let t0 = Instant::now();
        let limits = OutputLimits { max_stdout: 1 << 22, max_stderr: 1 << 16 };
        let out = match stdin {
            Some(input) => envd.run_with_input(&request, &options, limits, input).await?,
            None => envd.run(&request, &options, limits).await?,
        };
        samples.push(t0.elapsed());
        if out.exit_code != 0 {
            bail!("{argv:?} exited {}: {}", out.exit_code, String::from_utf8_lossy(&out.stderr));
        }
    }
    Ok(samples)
}

async fn run() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned();
    let n: usize = arg("--n").map(|v| v.parse()).transpose()?.unwrap_or(40);
    let bin = match arg("--bin") {
        Some(path) => PathBuf::from(path),
        // target/<profile>/examples/bench_tasks -> target/<profile>/sandbox-mcp
        None => common::binary(),
    };
    if !nix::unistd::geteuid().is_root() {
        bail!("run as root: the embedded local provider needs namespaces");
    }
    let (provider, gateway) = start_gateway(&bin)?;
    let client = common::mcp::try_connect_as(&gateway.mcp_url(), None, ProtocolVersion::LATEST).await?;
    let sandbox = call(&client, "create_sandbox", json!({"timeout": 1800})).await?;
    let sid = sandbox["sandbox_id"].as_str().context("sandbox_id")?.to_string();
    report!("sandbox {sid}; n = {n}; binary {}", bin.display());

    // Warm-up: installs the supervisor (first use per sandbox).
    let (first, _) = timed(&client, "start_task", json!({"sandbox_id": sid, "command": "true"})).await?;
    report!("first start_task (includes supervisor install): {:.1} ms", first.as_secs_f64() * 1000.0);

    // start_task of a TERM-obeying long task; these are then cancelled. A start answers before its
    // command runs, so each start is timed after the previous task's launch has settled (the gap);
    // the back-to-back figure (each start while the previous command is being launched) is shown
    // beside it.
    let n = n.min(90); // with the back-to-back starts and the others, under the 128-task limit
    let mut starts = Vec::new();
    let mut back_to_back = Vec::new();
    let mut ids = Vec::new();
    for i in 0..n {
        tokio::time::sleep(START_GAP).await;
        let (d, v) = timed(&client, "start_task", json!({"sandbox_id": sid, "command": "sleep 600"})).await?;
        starts.push(d);
        ids.push(v["task_id"].as_str().context("task_id")?.to_string());
        if i < (n / 2).min(20) {
            let (d, v) = timed(&client, "start_task", json!({"sandbox_id": sid, "command": "sleep 600"})).await?;
            back_to_back.push(d);
            ids.push(v["task_id"].as_str().context("task_id")?.to_string());
        }
    }

    // Idle supervisor RSS (one of the sleeping tasks).
    let rss = call(
        &client,
        "run_command",
        json!({"sandbox_id": sid, "command": format!(
            "python3 -c 'import json,sys; p=json.load(open(sys.argv[1]))[\"supervisor_pid\"]; \
             print([l for l in open(\"/proc/%d/status\" % p) if l.startswith(\"VmRSS\")][0].split()[1])' \
             /home/user/.sandbox-mcp/tasks/{}/status.json", ids[0])}),
    )
    .await?;

    let mut cancels = Vec::new();
    for id in &ids {
        let (d, v) = timed(&client, "cancel_task", json!({"sandbox_id": sid, "task_id": id, "limit": 1})).await?;
        if v["cancel_confirmed"] != true {
            bail!("cancel not confirmed: {v}");
        }
        cancels.push(d);
    }

    // get_task with a 16 KiB page of a task that wrote 3 MiB (1 MiB kept).
    let big = start_task(&client, &sid, "head -c 3145728 /dev/urandom | base64 -w 100").await?;
    loop {
        let v = call(&client, "get_task", json!({"sandbox_id": sid, "task_id": big, "limit": 1, "wait_seconds": 5}))
            .await?;
        if v["state"] != "running" {
            break;
        }
    }
    let mut gets = Vec::new();
    for i in 0..n {
        let offset = (i * 16_384) % (1 << 20);
        let (d, v) = timed(
            &client,
            "get_task",
            json!({"sandbox_id": sid, "task_id": big, "stdout_offset": offset, "limit": 16384}),
        )
        .await?;
        if v["stdout"].as_str().map_or(0, str::len) != 16_384 {
            bail!("short page at {offset}");
        }
        gets.push(d);
    }
    // The same on a task still running: get_task also checks its supervisor is alive.
    let live = start_task(&client, &sid, "head -c 1048576 /dev/urandom | base64 -w 100; sleep 600").await?;
    loop {
        let v = call(
            &client,
            "get_task",
            json!({"sandbox_id": sid, "task_id": live, "stdout_offset": 1_000_000, "limit": 1, "wait_seconds": 5}),
        )
        .await?;
        if v["stdout_next_offset"] == 1_000_001 || v["state"] != "running" {
            break;
        }
    }
    let mut live_gets = Vec::new();
    for i in 0..n {
        let offset = (i * 16_384) % (1 << 19);
        let args = json!({"sandbox_id": sid, "task_id": live, "stdout_offset": offset, "limit": 16384});
        let (d, v) = timed(&client, "get_task", args).await?;
        if v["state"] != "running" || v["stdout"].as_str().map_or(0, str::len) != 16_384 {
            bail!("running task: unexpected page at {offset}: state {}", v["state"]);
        }
        live_gets.push(d);
    }
    call(&client, "cancel_task", json!({"sandbox_id": sid, "task_id": live, "limit": 1})).await?;
    let peak = call(
        &client,
        "run_command",
        json!({"sandbox_id": sid, "command": format!(
            "python3 -c 'import json,sys; print(json.load(open(sys.argv[1])).get(\"supervisor_max_rss_kb\"))' \
             /home/user/.sandbox-mcp/tasks/{big}/status.json")}),
    )
    .await?;

    // run_command "true" through the gateway (a login shell, `bash -l -c`, as E2B runs it).
    let mut commands = Vec::new();
    for _ in 0..n {
        let (d, v) = timed(&client, "run_command", json!({"sandbox_id": sid, "command": "true"})).await?;
        if v["exit_code"] != 0 {
            bail!("run_command true: {v}");
        }
        commands.push(d);
    }

    // Where the time goes: the same work through envd directly (no gateway, no MCP),
    // interleaved so that the floors are measured under the same load.
    let direct = provider.client();
    let envd = direct.envd(&direct.connect_sandbox(&sid, None).await?);
    let (mut envd_true, mut envd_python, mut envd_login, mut envd_bash) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..n {
        envd_true.extend(time_envd(&envd, &["/bin/true"], None, 1).await?);
        envd_python.extend(time_envd(&envd, &["python3", "-I", "-S", "-c", "pass"], None, 1).await?);
        envd_login.extend(time_envd(&envd, &["/bin/bash", "-l", "-c", "true"], None, 1).await?);
        envd_bash.extend(time_envd(&envd, &["/bin/bash", "-c", "true"], None, 1).await?);
    }
    // get_task's direct path: status.json, then both 16 KiB windows in parallel (see TaskService::status).
    let user = CallOptions::user("user").with_timeout(Duration::from_secs(30));
    let dir = format!("/home/user/.sandbox-mcp/tasks/{big}");
    let (status_path, out_path, err_path) =
        (format!("{dir}/status.json"), format!("{dir}/stdout"), format!("{dir}/stderr"));
    let mut envd_reads = Vec::new();
    for i in 0..n {
        let offset = ((i * 16_384) % (1 << 20)) as u64;
        let t0 = Instant::now();
        envd.read_file_range(&status_path, 0, 1 << 20, &user).await?;
        let (out, err) = tokio::join!(
            envd.read_file_range(&out_path, offset, 16_384, &user),
            envd.read_file_range(&err_path, 0, 16_384, &user)
        );
        envd_reads.push(t0.elapsed());
        if out?.data.len() != 16_384 {
            bail!("short direct read at {offset}");
        }
        err?;
    }

    // The supervisor's `start`, invoked exactly as the gateway does.
    let service = TaskService::new(Masker::default());
    let mut envd_start = Vec::new();
    for _ in 0..n {
        let spec = TaskSpec::new("sleep 600".into(), None, Default::default(), Some(600))?;
        let launch = start_launch(&TaskId::generate(), &spec)?;
        let argv = service.argv(&launch.args);
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        envd_start.extend(time_envd(&envd, &argv, Some(&launch.stdin), 1).await?);
    }

    report!();
    print_header();
    // Targets of issue 28: start_task within half of a python3 start measured in the same run.
    let python_ms = Summary::of_durations(&envd_python).median;
    summary("start_task -> response", python_ms / 2.0, starts);
    summary("  start_task right after another", f64::INFINITY, back_to_back);
    summary("get_task, 16 KiB page", 1.5, gets);
    summary("get_task, 16 KiB page, running task", 2.0, live_gets);
    summary("cancel_task (TERM-obeying task)", 15.0, cancels);
    summary("run_command \"true\" (bash -l -c)", 3.0, commands);
    report!("breakdown (envd directly, no gateway/MCP):");
    summary("  envd run /bin/true", f64::INFINITY, envd_true);
    summary("  envd run python3 -I -S -c pass", f64::INFINITY, envd_python);
    summary("  envd run bash -l -c true", f64::INFINITY, envd_login);
    summary("  envd run bash -c true", f64::INFINITY, envd_bash);
    summary("  envd status.json + 2 ranged reads", f64::INFINITY, envd_reads);
    summary("  envd run supervisor start", f64::INFINITY, envd_start);
    report!("supervisor RSS, idle task:          {} KiB", rss["stdout"].as_str().unwrap_or("?").trim());
    report!("supervisor peak RSS, 3 MiB output:  {} KiB", peak["stdout"].as_str().unwrap_or("?").trim());

    let _ = call(&client, "kill_sandbox", json!({"sandbox_id": sid})).await;
    let _ = client.cancel().await;
    drop(gateway);
    drop(provider);
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let outcome = run().await;
    common::results::finish("bench_tasks", &outcome)?;
    outcome
}
