//! Benchmark of a provider through the provider client: create→ready, kill,
//! `true` over envd, 1 MiB write+read, envd RSS per idle sandbox, and 50
//! sandboxes alive at once.
//!
//! `cargo build --release && cargo run --release --example bench_provider -- [--provider-url URL]`
//!
//! Without `--provider-url` it starts `target/release/sandbox-mcp provider` itself
//! (root needed) on a free loopback port with a temporary state directory. RSS
//! is read from the host's /proc (the sandbox's envd process, found by its
//! sandbox id on the command line), so it is only reported for a local provider.

#[path = "../tests/support/provider_process.rs"]
mod provider_process;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bytes::Bytes;
use clap::Parser;
use futures_util::StreamExt;
use provider_process::{ProviderProcess, TEST_API_KEY};
use sandbox_mcp::e2b::wire;
use sandbox_mcp::e2b::{CallOptions, E2bClient, OutputLimits, ProviderEndpoint};

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

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// VmRSS (KiB) of the envd process of `sandbox_id`, found on the host.
fn envd_rss_kib(sandbox_id: &str) -> Option<u64> {
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else { continue };
        let text = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if text.contains(" envd ") && text.contains(sandbox_id) {
            let status = std::fs::read_to_string(entry.path().join("status")).ok()?;
            let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
            return line.split_whitespace().nth(1)?.parse().ok();
        }
    }
    None
}

fn true_request() -> wire::StartRequest {
    wire::StartRequest {
        process: wire::ProcessConfig { cmd: "/bin/true".into(), ..Default::default() },
        stdin: Some(false),
        ..Default::default()
    }
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
    rows.push(Row { name: "create → ready".into(), samples: create, unit: "ms", target: Some(50.0) });
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

fn print_table(rows: &mut [Row]) {
    println!("{:<28} {:>9} {:>9} {:>8} {:>5}  verdict", "metric", "median", "p90", "target", "n");
    for row in rows.iter_mut() {
        row.samples.sort_by(f64::total_cmp);
        let median = percentile(&row.samples, 0.5);
        let p90 = percentile(&row.samples, 0.9);
        let (target, verdict) = match row.target {
            Some(t) if row.samples.is_empty() => (format!("{t}"), "n/a"),
            Some(t) => (format!("{t}"), if median <= t { "ok" } else { "MISSED" }),
            None => ("-".into(), ""),
        };
        println!(
            "{:<28} {:>6.2} {:<2} {:>6.2} {:<2} {:>6} {:>5}  {}",
            row.name,
            median,
            row.unit,
            p90,
            row.unit,
            target,
            row.samples.len(),
            verdict
        );
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let mut own_provider = None;
    let client = match &args.provider_url {
        Some(url) => E2bClient::new(ProviderEndpoint {
            api_url: url.clone(),
            sandbox_url: Some(url.clone()),
            domain: "localhost".into(),
            api_key: args.api_key.clone().or_else(|| Some(TEST_API_KEY.into())),
            request_timeout: Duration::from_secs(30),
        })?,
        None => {
            let bin = match &args.bin {
                Some(bin) => bin.clone(),
                None => std::env::current_exe()?
                    .parent()
                    .and_then(|examples| examples.parent())
                    .map(|dir| dir.join("sandbox-mcp"))
                    .context("cannot locate target/<profile>/sandbox-mcp")?,
            };
            if !bin.exists() {
                bail!("{} does not exist: run `cargo build --release` first, or pass --bin", bin.display());
            }
            let provider = ProviderProcess::spawn(&bin).map_err(anyhow::Error::msg)?;
            println!("provider: {} ({})", provider.url, bin.display());
            let client = provider.client();
            own_provider = Some(provider);
            client
        }
    };
    client.health().await.context("provider health")?;
    let mut rows = Vec::new();
    let result = bench(&client, &args, &mut rows).await;
    let fleet_result = match &result {
        Ok(()) => Some(fleet(&client, args.fleet).await),
        Err(_) => None,
    };
    if let Some(provider) = own_provider {
        provider.shutdown().await;
    }
    result?;
    print_table(&mut rows);
    let (elapsed, total_rss, kill_elapsed) = fleet_result.context("fleet test did not run")??;
    let rss = total_rss.map_or("n/a (remote provider)".to_owned(), |r| format!("{r:.1} MiB envd RSS total"));
    println!(
        "{} sandboxes alive at once: created + `echo ok` verified in {:.0} ms, {rss}, all killed in {:.0} ms",
        args.fleet,
        ms(elapsed),
        ms(kill_elapsed)
    );
    Ok(())
}
