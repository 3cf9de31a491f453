//! Benchmark of a provider through the provider client: create→ready, kill,
//! `true` over envd, 1 MiB write+read, envd RSS per idle sandbox, and 50
//! sandboxes alive at once; and, for a local provider it starts itself, the
//! sandbox network: TCP throughput and connection set-up from a sandbox to a
//! test "internet" host (a network namespace in 198.18.0.0/15 made by the
//! bench) against the same transfer from the host, and the memory of one
//! sandbox's network (provider RSS and kernel memory per namespace).
//!
//! `cargo build --release && cargo run --release --example bench_provider -- [--provider-url URL]`
//!
//! Without `--provider-url` it starts `target/release/sandbox-mcp provider` itself
//! (root needed) on a free loopback port with a temporary state directory. RSS
//! is read from the host's /proc (the sandbox's envd process, found by its
//! sandbox id on the command line), so it is only reported for a local provider.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

#[path = "../tests/it/common/mod.rs"]
mod common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bytes::Bytes;
use clap::Parser;
use common::stats::{Summary, ms, p50, percentile, print_header, print_row};
use common::{API_KEY, Provider, agent_pid, rss_kib, testnet};
use futures_util::StreamExt;
use sandbox_mcp::e2b::wire;
use sandbox_mcp::e2b::{CallOptions, E2bClient, OutputLimits};

#[derive(Parser)]
struct Args {
    /// Use a running provider (control plane and envd at this origin) instead of starting one.
    #[arg(long)]
    provider_url: Option<url::Url>,
    /// API key for --provider-url.
    #[arg(long, env = "E2B_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// The sandbox-mcp binary to start (default: target/release/sandbox-mcp next to this example).
    #[arg(long)]
    bin: Option<PathBuf>,
    /// Samples per latency figure.
    #[arg(long, default_value_t = 30)]
    iterations: usize,
    /// Sandboxes alive at once in the fleet test.
    #[arg(long, default_value_t = 50)]
    fleet: usize,
}

struct Row {
    name: String,
    samples: Vec<f64>,
    unit: &'static str,
    target: Option<f64>,
}

/// The state directory of the provider this bench started (agents are found by the tag in
/// their sandbox's directory); unknown for a provider given by `--provider-url`.
static STATE_DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

/// VmRSS (KiB) of the envd process of `sandbox_id`, found on the host.
fn envd_rss_kib(sandbox_id: &str) -> Option<u64> {
    agent_pid(STATE_DIR.get()?, sandbox_id).map(rss_kib)
}

fn true_request() -> wire::StartRequest {
    wire::StartRequest {
        process: wire::ProcessConfig { cmd: "/bin/true".into(), ..Default::default() },
        stdin: Some(false),
        ..Default::default()
    }
}

/// A sink on the test host: port 9000 discards what it receives; port 9001 sends one byte per
/// connection and closes.
const NET_SERVERS: &str = r#"
import socket, sys, threading
addr = sys.argv[1]
def sink():
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind((addr, 9000)); s.listen(16)
    while True:
        c, _ = s.accept()
        def drain(c=c):
            while c.recv(1 << 20):
                pass
            c.sendall(b"k"); c.close()
        threading.Thread(target=drain, daemon=True).start()
threading.Thread(target=sink, daemon=True).start()
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind((addr, 9001)); s.listen(128)
while True:
    c, _ = s.accept(); c.sendall(b"x"); c.close()
"#;

/// Client side (run in a sandbox and on the host): prints "<Gbit/s> <median connect-to-first-byte µs>".
fn net_client(addr: &str, mib: usize, connections: usize) -> String {
    format!(
        "import socket, time\nbuf = b'x' * (1 << 20)\ns = socket.create_connection(('{addr}', 9000))\n\
         t = time.perf_counter()\nfor _ in range({mib}):\n    s.sendall(buf)\ns.shutdown(socket.SHUT_WR)\n\
         s.recv(1)\nrate = {mib} * 8 * 1048576 / (time.perf_counter() - t) / 1e9\nlat = []\n\
         for _ in range({connections}):\n    t = time.perf_counter()\n    c = socket.create_connection(('{addr}', 9001))\n    \
         c.recv(1)\n    lat.append(time.perf_counter() - t)\n    c.close()\nlat.sort()\n\
         print('%.2f %.0f' % (rate, lat[len(lat) // 2] * 1e6))\n"
    )
}

fn parse_net_result(text: &str) -> anyhow::Result<(f64, f64)> {
    let mut parts = text.split_whitespace();
    let rate = parts.next().context("no throughput")?.parse()?;
    let latency = parts.next().context("no latency")?.parse()?;
    Ok((rate, latency))
}

/// Kernel memory that network namespaces cost (slab + per-CPU), KiB.
fn kernel_kib() -> u64 {
    let text = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    text.lines()
        .filter(|l| l.starts_with("Slab:") || l.starts_with("Percpu:"))
        .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        .sum()
}

/// Sandbox network figures: throughput and connection set-up against the host doing the same, and
/// memory per sandbox network.
async fn network(client: &E2bClient, provider_pid: Option<u32>, args: &Args) -> anyhow::Result<()> {
    let mut net = testnet::TestNet::new();
    net.spawn_python(NET_SERVERS, &[net.internet_addr.to_string()]);
    std::thread::sleep(Duration::from_millis(500));
    let addr = net.internet_addr.to_string();
    let script = net_client(&addr, 1024, 200);
    let sandbox = client.create_sandbox(&new_sandbox()).await?;
    let envd = client.envd(&sandbox);
    let opts = CallOptions::default();
    let (mut sandbox_rate, mut sandbox_lat, mut host_rate, mut host_lat) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..3 {
        let mut run = true_request();
        run.process.cmd = "/usr/bin/python3".into();
        run.process.args = vec!["-c".into(), script.clone()];
        let out = envd.run(&run, &opts, OutputLimits::default()).await?;
        let (rate, lat) = parse_net_result(&String::from_utf8_lossy(&out.stdout))
            .with_context(|| format!("sandbox client: {}", String::from_utf8_lossy(&out.stderr)))?;
        sandbox_rate.push(rate);
        sandbox_lat.push(lat);
        let out = std::process::Command::new("python3").args(["-c", &script]).output()?;
        let (rate, lat) = parse_net_result(&String::from_utf8_lossy(&out.stdout))?;
        host_rate.push(rate);
        host_lat.push(lat);
    }
    client.kill_sandbox(&sandbox.sandbox_id).await?;
    let (sr, hr) = (p50(&mut sandbox_rate), p50(&mut host_rate));
    let (sl, hl) = (p50(&mut sandbox_lat), p50(&mut host_lat));
    report!("sandbox network (1 GiB upload and 200 connections to a test host, 3 runs, medians):");
    report!("  TCP throughput: sandbox {sr:.2} Gbit/s, host {hr:.2} Gbit/s (ratio {:.2}; target ≥ 1 Gbit/s)", sr / hr);
    report!("  connect → first byte: sandbox {sl:.0} µs, host {hl:.0} µs (added {:.0} µs; target ≤ 1000 µs)", sl - hl);

    // Memory: provider RSS and kernel memory with N idle sandboxes, per sandbox.
    if let Some(pid) = provider_pid {
        let n = args.fleet.min(20);
        let (rss_before, kernel_before) = (rss_kib(pid), kernel_kib());
        let mut ids = Vec::new();
        for _ in 0..n {
            ids.push(client.create_sandbox(&new_sandbox()).await?.sandbox_id);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        let (rss_after, kernel_after) = (rss_kib(pid), kernel_kib());
        for id in &ids {
            client.kill_sandbox(id).await?;
        }
        report!(
            "  per idle sandbox ({n} sandboxes): provider RSS {:+.0} KiB, kernel slab+percpu {:+.0} KiB (whole sandbox, \
             network included; target for the network part ≤ 2048 KiB)",
            (rss_after as f64 - rss_before as f64) / n as f64,
            (kernel_after as f64 - kernel_before as f64) / n as f64
        );
        let prepared_before = kernel_kib();
        let host = sandbox_mcp::local::net::host_addrs::HostAddrs::new(&[]);
        let prepared: Vec<_> = (0..n).filter_map(|_| sandbox_mcp::local::net::netns::prepare(&host).ok()).collect();
        let per_netns = (kernel_kib() as f64 - prepared_before as f64) / prepared.len().max(1) as f64;
        drop(prepared);
        report!(
            "  kernel memory of one prepared sandbox network namespace (TUN, nftables, listener): {per_netns:+.0} KiB"
        );
    }
    Ok(())
}

fn new_sandbox() -> wire::NewSandbox {
    wire::NewSandbox { template_id: "base".into(), timeout: Some(300), ..Default::default() }
}

async fn bench(client: &E2bClient, args: &Args, rows: &mut Vec<Row>) -> anyhow::Result<()> {
    let opts = CallOptions::default();
    // Warm-up: one sandbox end to end.
    let warm = client.create_sandbox(&new_sandbox()).await?;
    client.envd(&warm).run(&true_request(), &opts, OutputLimits::default()).await?;
    client.kill_sandbox(&warm.sandbox_id).await?;

    let (mut create, mut kill, mut rss) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..args.iterations {
        let started = Instant::now();
        let sandbox = client.create_sandbox(&new_sandbox()).await?;
        create.push(ms(started.elapsed()));
        tokio::time::sleep(Duration::from_millis(100)).await;
        if let Some(kib) = envd_rss_kib(&sandbox.sandbox_id) {
            rss.push(kib as f64 / 1024.0);
        }
        let started = Instant::now();
        if !client.kill_sandbox(&sandbox.sandbox_id).await? {
            bail!("kill of {} reported not found", sandbox.sandbox_id);
        }
        kill.push(ms(started.elapsed()));
    }
    rows.push(Row { name: "create → ready".into(), samples: create, unit: "ms", target: Some(20.0) });
    rows.push(Row { name: "kill".into(), samples: kill, unit: "ms", target: Some(20.0) });

    let sandbox = client.create_sandbox(&new_sandbox()).await?;
    let envd = client.envd(&sandbox);
    let (mut run_true, mut files) = (Vec::new(), Vec::new());
    let payload = Bytes::from((0..1 << 20).map(|i: u32| (i % 251) as u8).collect::<Vec<u8>>());
    for _ in 0..args.iterations {
        let started = Instant::now();
        let out = envd.run(&true_request(), &opts, OutputLimits::default()).await?;
        run_true.push(ms(started.elapsed()));
        if out.exit_code != 0 {
            bail!("true exited with {}", out.exit_code);
        }
        let started = Instant::now();
        envd.write_file("/tmp/bench.bin", payload.clone(), &opts).await?;
        let back = envd.read_file("/tmp/bench.bin", &opts).await?;
        files.push(ms(started.elapsed()));
        if back != payload {
            bail!("1 MiB round trip differs");
        }
    }
    client.kill_sandbox(&sandbox.sandbox_id).await?;
    rows.push(Row { name: "`true` start → end".into(), samples: run_true, unit: "ms", target: Some(5.0) });
    rows.push(Row { name: "1 MiB write + read".into(), samples: files, unit: "ms", target: Some(10.0) });
    rows.push(Row { name: "envd RSS per idle sandbox".into(), samples: rss, unit: "MiB", target: Some(8.0) });
    Ok(())
}

/// Creates `n` sandboxes back to back (one at a time, none killed in between), after giving the
/// provider's pools time to fill, then kills them. Returns each create's latency in order: the
/// first ones take a disk and a network namespace the provider prepared ahead, the later ones
/// wait for them to be made.
async fn burst(client: &E2bClient, n: usize) -> anyhow::Result<Vec<f64>> {
    tokio::time::sleep(Duration::from_secs(5)).await;
    let (mut latencies, mut ids) = (Vec::new(), Vec::new());
    let mut failure = None;
    for _ in 0..n {
        let started = Instant::now();
        match client.create_sandbox(&new_sandbox()).await {
            Ok(sandbox) => {
                latencies.push(ms(started.elapsed()));
                ids.push(sandbox.sandbox_id);
            }
            Err(err) => {
                failure = Some(err);
                break;
            }
        }
    }
    for id in &ids {
        client.kill_sandbox(id).await?;
    }
    match failure {
        Some(err) => Err(err).context("burst of creates"),
        None => Ok(latencies),
    }
}

/// Creates `n` sandboxes (10 at a time), checks each runs `echo ok`, measures RSS, kills all.
async fn fleet(client: &E2bClient, n: usize) -> anyhow::Result<(Duration, Option<f64>, Duration)> {
    let started = Instant::now();
    let created: Vec<_> = futures_util::stream::iter(0..n)
        .map(|_| async {
            let sandbox = client.create_sandbox(&new_sandbox()).await?;
            let mut echo = true_request();
            echo.process.cmd = "/bin/echo".into();
            echo.process.args = vec!["ok".into()];
            let out = client.envd(&sandbox).run(&echo, &CallOptions::default(), OutputLimits::default()).await;
            Ok::<_, anyhow::Error>((sandbox, out))
        })
        .buffer_unordered(10)
        .collect()
        .await;
    let elapsed = started.elapsed();
    let mut ids = Vec::new();
    let mut failure = None;
    for result in created {
        match result {
            Ok((sandbox, out)) => {
                ids.push(sandbox.sandbox_id.clone());
                match out {
                    Ok(out) if out.stdout == b"ok\n" => {}
                    Ok(out) => failure = Some(format!("{}: echo printed {:?}", sandbox.sandbox_id, out.stdout)),
                    Err(err) => failure = Some(err.to_string()),
                }
            }
            Err(err) => failure = Some(err.to_string()),
        }
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let rss: Vec<u64> = ids.iter().filter_map(|id| envd_rss_kib(id)).collect();
    let total_rss = (rss.len() == ids.len()).then(|| rss.iter().sum::<u64>() as f64 / 1024.0);
    let kill_started = Instant::now();
    let kills: Vec<_> =
        futures_util::stream::iter(ids.iter()).map(|id| client.kill_sandbox(id)).buffer_unordered(10).collect().await;
    let kill_elapsed = kill_started.elapsed();
    for kill in kills {
        kill.context("kill in the fleet test")?;
    }
    if let Some(failure) = failure {
        bail!("fleet test: {failure}");
    }
    if ids.len() != n {
        bail!("fleet test: only {} of {n} sandboxes were created", ids.len());
    }
    Ok((elapsed, total_rss, kill_elapsed))
}

/// The module whose `sandbox created` line carries a create's phases (`spawned_ms`, `ready_ms`, `ms`).
const CREATE_LOG_TARGET: &str = "sandbox_mcp::local::control::sandbox_table::create";

/// Medians of the phases of the single creates of [`bench`] (the `iterations` creates after the
/// warm-up), from the provider's JSON log: [agent cloned, agent ready, create answered] in ms;
/// `None` when the log has no `sandbox created` line.
fn create_phases(log: &str, iterations: usize) -> Option<[f64; 3]> {
    let mut phases = [Vec::new(), Vec::new(), Vec::new()];
    let created = log
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|v| v["message"] == "sandbox created")
        .skip(1)
        .take(iterations);
    for line in created {
        for (samples, key) in phases.iter_mut().zip(["spawned_ms", "ready_ms", "ms"]) {
            if let Some(value) = line[key].as_f64() {
                samples.push(value);
            }
        }
    }
    if phases.iter().any(Vec::is_empty) {
        return None; // no create line: nothing measured
    }
    Some(phases.map(|mut samples| p50(&mut samples)))
}

fn print_table(rows: &mut [Row]) {
    print_header();
    for row in rows.iter_mut() {
        print_row(&row.name, row.unit, &Summary::of(&mut row.samples), row.target);
    }
}

async fn run() -> anyhow::Result<()> {
    let args = Args::parse();
    let mut own_provider = None;
    let mut provider_pid = None;
    let client = match &args.provider_url {
        Some(url) => {
            let key = args.api_key.clone().unwrap_or_else(|| API_KEY.into());
            common::provider::client_for(url.as_str(), Some(&key)).map_err(anyhow::Error::msg)?
        }
        None => {
            let bin = args.bin.clone().unwrap_or_else(common::binary);
            if !bin.exists() {
                bail!("{} does not exist: run `cargo build --release` first, or pass --bin", bin.display());
            }
            // Quiet, except the create's own line, whose phases are reported below.
            let provider = Provider::builder()
                .bin(&bin)
                .echo(false)
                .log_filter(&format!("warn,{CREATE_LOG_TARGET}=info"))
                .try_start()
                .map_err(anyhow::Error::msg)?;
            report!("provider: {} ({})", provider.url(), bin.display());
            let client = provider.client();
            provider_pid = Some(provider.pid());
            let _ = STATE_DIR.set(provider.state_dir.clone());
            own_provider = Some(provider);
            client
        }
    };
    client.health().await.context("provider health")?;
    let mut rows = Vec::new();
    let result = bench(&client, &args, &mut rows).await;
    let phases = own_provider.as_ref().and_then(|p| create_phases(&p.log.text(), args.iterations));
    let burst_size = 2 * sandbox_mcp::local::isolation::disk::POOL_SIZE;
    let burst_result = match &result {
        Ok(()) => Some(burst(&client, burst_size).await),
        Err(_) => None,
    };
    let fleet_result = match &result {
        Ok(()) => Some(fleet(&client, args.fleet).await),
        Err(_) => None,
    };
    let network_result = match (&result, &own_provider) {
        (Ok(()), Some(_)) => Some(network(&client, provider_pid, &args).await),
        _ => None,
    };
    if let Some(provider) = own_provider {
        provider.shutdown().await;
    }
    result?;
    print_table(&mut rows);
    if let Some([spawned, ready, whole]) = phases {
        report!(
            "single create phases (provider log, p50 of {} creates): agent cloned at {spawned:.2} ms, ready at \
             {ready:.2} ms, answered at {whole:.2} ms",
            args.iterations
        );
    } else {
        report!("single create phases: not measured (no provider of the bench's own, or no create line in its log)");
    }
    let mut burst = burst_result.context("burst test did not run")??;
    let pooled = sandbox_mcp::local::isolation::disk::POOL_SIZE.min(burst.len());
    let mut rest = burst.split_off(pooled);
    burst.sort_by(f64::total_cmp);
    rest.sort_by(f64::total_cmp);
    report!(
        "burst of {burst_size} creates back to back (pools full at the start): first {pooled} p50 {:.2} ms, max {:.2} ms; \
         the next {} p50 {:.2} ms, max {:.2} ms",
        percentile(&burst, 0.5),
        burst.last().copied().unwrap_or(f64::NAN),
        rest.len(),
        percentile(&rest, 0.5),
        rest.last().copied().unwrap_or(f64::NAN)
    );
    let (elapsed, total_rss, kill_elapsed) = fleet_result.context("fleet test did not run")??;
    let rss = total_rss.map_or("n/a (remote provider)".to_owned(), |r| format!("{r:.1} MiB envd RSS total"));
    report!(
        "{} sandboxes alive at once: created + `echo ok` verified in {:.0} ms, {rss}, all killed in {:.0} ms",
        args.fleet,
        ms(elapsed),
        ms(kill_elapsed)
    );
    if let Some(network_result) = network_result {
        network_result.context("sandbox network figures")?;
    }
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let outcome = run().await;
    common::results::finish("bench_provider", &outcome)?;
    outcome
}
