//! Task tool latencies through MCP against a real `sandbox-mcp serve`
//! (embedded local provider): medians (and p90) of start_task to response,
//! get_task with a 16 KiB page, cancel_task of a TERM-obeying task, and the
//! supervisor's memory (RSS of an idle one, peak RSS of one draining 3 MiB).
//!
//! Run as root (the local provider needs namespaces):
//!
//! ```text
//! cargo build --release && cargo run --release --example bench_tasks [-- --bin target/release/sandbox-mcp --n 40]
//! ```

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use rmcp::model::{CallToolRequestParams, ClientConfig};
use rmcp::service::RunningService;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::{RoleClient, ServiceExt};
use serde_json::{Value, json};

type Client = RunningService<RoleClient, ClientConfig>;

async fn call(client: &Client, tool: &str, args: Value) -> anyhow::Result<Value> {
    let Value::Object(map) = args else { bail!("arguments must be an object") };
    let result = client.call_tool(CallToolRequestParams::new(tool.to_string()).with_arguments(map)).await?;
    if result.is_error == Some(true) {
        let text: Vec<String> = result.content.iter().filter_map(|c| c.as_text().map(|t| t.text.clone())).collect();
        bail!("{tool}: {}", text.join(" "));
    }
    result.structured_content.context("no structured content")
}

async fn timed(client: &Client, tool: &str, args: Value) -> anyhow::Result<(Duration, Value)> {
    let t0 = Instant::now();
    let v = call(client, tool, args).await?;
    Ok((t0.elapsed(), v))
}

fn summary(name: &str, target_ms: f64, mut samples: Vec<Duration>) {
    samples.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let median = ms(samples[samples.len() / 2]);
    let p90 = ms(samples[(samples.len() * 9 / 10).min(samples.len() - 1)]);
    let verdict = if median <= target_ms { "ok" } else { "OVER TARGET" };
    println!(
        "{name:<34} n={:<4} median {median:>8.1} ms   p90 {p90:>8.1} ms   (target <= {target_ms} ms: {verdict})",
        samples.len()
    );
}

struct Gateway {
    child: std::process::Child,
    url: String,
    _dir: tempfile::TempDir,
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_gateway(bin: &PathBuf) -> anyhow::Result<Gateway> {
    let dir = tempfile::tempdir()?;
    let config = dir.path().join("serve.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\nlisten = \"127.0.0.1:0\"\nlog_format = \"json\"\n[provider]\nkind = \"local\"\n\
             [local]\nstate_dir = \"{}\"\n",
            dir.path().join("state").display()
        ),
    )?;
    let mut child = Command::new(bin)
        .args(["serve", "--config", config.to_str().context("path")?])
        .env("RUST_LOG", "warn,sandbox_mcp::gateway::server=info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("spawning {}", bin.display()))?;
    let stderr = child.stderr.take().context("stderr")?;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Ok(v) = serde_json::from_str::<Value>(&line)
                && v["message"].as_str().is_some_and(|m| m.contains("gateway listening"))
                && let Some(addr) = v["addr"].as_str()
            {
                let _ = tx.send(addr.to_string());
            }
        }
    });
    let addr = rx.recv_timeout(Duration::from_secs(60)).context("serve did not report its address")?;
    Ok(Gateway { child, url: format!("http://{addr}/mcp"), _dir: dir })
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned();
    let n: usize = arg("--n").map(|v| v.parse()).transpose()?.unwrap_or(40);
    let bin = match arg("--bin") {
        Some(path) => PathBuf::from(path),
        // target/<profile>/examples/bench_tasks -> target/<profile>/sandbox-mcp
        None => std::env::current_exe()?.parent().and_then(|p| p.parent()).context("exe dir")?.join("sandbox-mcp"),
    };
    if !nix::unistd::geteuid().is_root() {
        bail!("run as root: the embedded local provider needs namespaces");
    }
    let gateway = start_gateway(&bin)?;
    let client = ClientConfig::default().serve(StreamableHttpClientTransport::from_uri(gateway.url.clone())).await?;
    let sandbox = call(&client, "create_sandbox", json!({"timeout": 1800})).await?;
    let sid = sandbox["sandbox_id"].as_str().context("sandbox_id")?.to_string();
    println!("sandbox {sid}; n = {n}; binary {}", bin.display());

    // Warm-up: installs the supervisor (first use per sandbox).
    let (first, _) = timed(&client, "start_task", json!({"sandbox_id": sid, "command": "true"})).await?;
    println!("first start_task (includes supervisor install): {:.1} ms", first.as_secs_f64() * 1000.0);

    // start_task of a TERM-obeying long task; these are then cancelled.
    let n = n.min(100);
    let mut starts = Vec::new();
    let mut ids = Vec::new();
    for _ in 0..n {
        let (d, v) = timed(&client, "start_task", json!({"sandbox_id": sid, "command": "sleep 600"})).await?;
        starts.push(d);
        ids.push(v["task_id"].as_str().context("task_id")?.to_string());
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
    let v = call(
        &client,
        "start_task",
        json!({"sandbox_id": sid, "command": "head -c 3145728 /dev/urandom | base64 -w 100"}),
    )
    .await?;
    let big = v["task_id"].as_str().context("task_id")?.to_string();
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
    let peak = call(
        &client,
        "run_command",
        json!({"sandbox_id": sid, "command": format!(
            "python3 -c 'import json,sys; print(json.load(open(sys.argv[1])).get(\"supervisor_max_rss_kb\"))' \
             /home/user/.sandbox-mcp/tasks/{big}/status.json")}),
    )
    .await?;

    println!();
    summary("start_task -> response", 30.0, starts);
    summary("get_task, 16 KiB page", 10.0, gets);
    summary("cancel_task (TERM-obeying task)", 100.0, cancels);
    println!("supervisor RSS, idle task:          {} KiB", rss["stdout"].as_str().unwrap_or("?").trim());
    println!("supervisor peak RSS, 3 MiB output:  {} KiB", peak["stdout"].as_str().unwrap_or("?").trim());

    let _ = call(&client, "kill_sandbox", json!({"sandbox_id": sid})).await;
    let _ = client.cancel().await;
    drop(gateway);
    Ok(())
}
