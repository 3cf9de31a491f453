//! Benchmark of the template store and template builds (issue 24 §6) against a real
//! `sandbox-mcp provider`:
//! 1. create → ready of a sandbox from a stored OCI template (a Debian image imported with
//!    `sandbox-mcp template import`) against one from `base`, interleaved;
//! 2. builds through E2B's template build API as the SDK calls it (`POST /v3/templates`,
//!    `POST /v2/templates/{id}/builds/{buildID}` with the steps, status polled every 200 ms until
//!    ready): an unchanged rebuild of a 3-step template (all steps cached), and a 3-step build over
//!    the stored base whose steps' commands are trivial (a new value per build, so nothing is
//!    cached), with the steps' own run time (from the build log's timestamps) taken out;
//! 3. a pull (`sandbox-mcp template pull`) of the Debian python3 image, one gzip layer of about
//!    98 MB (93 MiB; the target is for ~80 MB), from a `docker-registry` on loopback into an empty store;
//! 4. the disk of ten templates built on one base, each adding a small RUN layer, against the
//!    base's.
//!
//! `cargo build --release && cargo run --release --example bench_templates -- [--only create,build,pull,disk]`
//!
//! Needs root, `docker-registry` (apt-get install docker-registry) and the Debian root filesystem
//! tars the OCI tests use (target/oci-test-cache, made with `mmdebstrap` when missing; or give
//! their paths in `BENCH_DEBIAN_ROOTFS` and `BENCH_DEBIAN_PYTHON_ROOTFS`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

#[path = "../tests/it/common/mod.rs"]
mod common;
#[path = "../tests/it/oci.rs"]
mod oci;
#[path = "../tests/it/registry.rs"]
mod registry;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use chrono::{DateTime, Utc};
use clap::Parser;
use common::stats::{Summary, ms, p50, print_header, print_row};
use common::{API_KEY, Provider};
use sandbox_mcp::e2b::{CallOptions, E2bClient, OutputLimits, wire};
use serde_json::{Value, json};

#[derive(Parser)]
struct Args {
    /// The sandbox-mcp binary to start (default: target/release/sandbox-mcp next to this example).
    #[arg(long)]
    bin: Option<PathBuf>,
    /// Creates of each kind (OCI template, base), interleaved.
    #[arg(long, default_value_t = 20)]
    creates: usize,
    /// Builds of each kind (unchanged rebuild, 3 new steps).
    #[arg(long, default_value_t = 7)]
    builds: usize,
    /// Pulls, each into a fresh state directory.
    #[arg(long, default_value_t = 3)]
    pulls: usize,
    /// Templates built on one base for the disk figure.
    #[arg(long, default_value_t = 10)]
    templates: usize,
    /// Parts to run, comma-separated: create, build, pull, disk (default: all).
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
}

impl Args {
    fn wants(&self, part: &str) -> bool {
        self.only.is_empty() || self.only.iter().any(|p| p == part)
    }
}

/// The SDK's status poll interval (`Template._logs_refresh_frequency`).
const POLL: Duration = Duration::from_millis(200);

/// A rootfs tar: from `var`, else the OCI tests' cached one (made with mmdebstrap when missing).
fn rootfs(var: &str, cached: fn() -> Option<PathBuf>) -> anyhow::Result<PathBuf> {
    if let Some(path) = std::env::var_os(var).filter(|v| !v.is_empty()) {
        return Ok(PathBuf::from(path));
    }
    cached().with_context(|| format!("no Debian rootfs: install mmdebstrap, or set {var}"))
}

/// An OCI image layout of `layers` in a new directory under target/.
fn layout(layers: &[Vec<u8>]) -> anyhow::Result<tempfile::TempDir> {
    let dir = tempfile::tempdir_in(Path::new(env!("CARGO_MANIFEST_DIR")).join("target"))?;
    oci::write_layout(dir.path(), layers);
    Ok(dir)
}

/// `sandbox-mcp template --state-dir STATE ARGS...`, failing with its output.
fn template_cli(bin: &Path, state: &Path, args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new(bin).arg("template").arg("--state-dir").arg(state).args(args).output()?;
    if !out.status.success() {
        bail!("sandbox-mcp template {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// Imports the Debian image (its rootfs and a second, small layer) as template `deb`.
fn import_debian(bin: &Path, state: &Path, rootfs: &Path) -> anyhow::Result<()> {
    let dir = layout(&[std::fs::read(rootfs)?, oci::second_layer()])?;
    let started = Instant::now();
    let out = template_cli(bin, state, &["import", "deb", dir.path().to_str().context("path")?])?;
    report!("{out} in {:.1} s", started.elapsed().as_secs_f64());
    Ok(())
}

fn new_sandbox(template: &str) -> wire::NewSandbox {
    wire::NewSandbox { template_id: template.into(), timeout: Some(300), ..Default::default() }
}

/// Runs `sh -c script` in a sandbox, returning its stdout.
async fn sh(client: &E2bClient, sandbox: &wire::Sandbox, script: &str) -> anyhow::Result<String> {
    let request = wire::StartRequest {
        process: wire::ProcessConfig {
            cmd: "/bin/sh".into(),
            args: vec!["-c".into(), script.into()],
            ..Default::default()
        },
        stdin: Some(false),
        ..Default::default()
    };
    let out = client.envd(sandbox).run(&request, &CallOptions::default(), OutputLimits::default()).await?;
    if out.exit_code != 0 {
        bail!("{script:?} exited {}: {}", out.exit_code, String::from_utf8_lossy(&out.stderr));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// Part 1: create → ready from `deb` and from `base`, interleaved (the order swapped every round).
async fn creates(client: &E2bClient, n: usize) -> anyhow::Result<()> {
    for template in ["base", "deb"] {
        let sandbox = client.create_sandbox(&new_sandbox(template)).await?;
        let release = sh(client, &sandbox, "cat /etc/debian_version 2>/dev/null || echo none").await?;
        report!("warm-up sandbox of {template}: /etc/debian_version {release}");
        client.kill_sandbox(&sandbox.sandbox_id).await?;
    }
    let (mut base, mut oci) = (Vec::new(), Vec::new());
    for i in 0..n {
        let order = if i % 2 == 0 { ["base", "deb"] } else { ["deb", "base"] };
        for template in order {
            let started = Instant::now();
            let sandbox = client.create_sandbox(&new_sandbox(template)).await?;
            let elapsed = ms(started.elapsed());
            if template == "base" { &mut base } else { &mut oci }.push(elapsed);
            tokio::time::sleep(Duration::from_millis(100)).await;
            if !client.kill_sandbox(&sandbox.sandbox_id).await? {
                bail!("kill of {} reported not found", sandbox.sandbox_id);
            }
        }
    }
    let (base_median, oci_median) = (p50(&mut base.clone()), p50(&mut oci.clone()));
    print_header();
    print_row("create → ready, base", "ms", &Summary::of(&mut base), Some(40.0));
    let target = (base_median * 1.1 * 100.0).round() / 100.0;
    print_row("create → ready, OCI template", "ms", &Summary::of(&mut oci), Some(target));
    let ratio = oci_median / base_median;
    report!(
        "create → ready from the imported Debian image (2 layers) against base, {n} interleaved pairs: \
         medians {oci_median:.2} ms / {base_median:.2} ms = {ratio:.3} (target ≤ 1.10: {})",
        if ratio <= 1.1 { "ok" } else { "MISSED" }
    );
    Ok(())
}

/// E2B's template build API on the provider, called as the SDK calls it.
struct BuildApi {
    http: reqwest::Client,
    base: String,
}

/// One line of a build's log.
struct LogEntry {
    timestamp: DateTime<Utc>,
    message: String,
    step: Option<String>,
}

/// A finished build: wall time as the SDK sees it, and its log.
struct Built {
    wall: Duration,
    logs: Vec<LogEntry>,
}

impl Built {
    fn first(&self, step: &str, message: &str) -> Option<DateTime<Utc>> {
        self.logs.iter().find(|l| l.step.as_deref() == Some(step) && l.message == message).map(|l| l.timestamp)
    }

    /// The log's span, first line to last (the provider's own time for the build).
    fn server_time(&self) -> Duration {
        match (self.logs.first(), self.logs.last()) {
            (Some(a), Some(b)) => (b.timestamp - a.timestamp).to_std().unwrap_or_default(),
            _ => Duration::ZERO,
        }
    }
}

impl BuildApi {
    async fn send(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> anyhow::Result<(u16, Value)> {
        let mut request = self.http.request(method, format!("{}{path}", self.base)).header("x-api-key", API_KEY);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await?;
        let status = response.status().as_u16();
        let text = response.text().await?;
        Ok((status, serde_json::from_str(&text).unwrap_or(Value::String(text))))
    }

    /// Builds template `name` from `spec` (TemplateBuildStartV2), failing with the build's reason.
    async fn build(&self, name: &str, spec: Value) -> anyhow::Result<Built> {
        let started = Instant::now();
        let (status, requested) =
            self.send(reqwest::Method::POST, "/v3/templates", Some(json!({"name": name}))).await?;
        if status != 202 {
            bail!("POST /v3/templates: {status} {requested}");
        }
        let template_id = requested["templateID"].as_str().context("templateID")?.to_owned();
        let build_id = requested["buildID"].as_str().context("buildID")?.to_owned();
        let path = format!("/v2/templates/{template_id}/builds/{build_id}");
        let (status, answer) = self.send(reqwest::Method::POST, &path, Some(spec)).await?;
        if status != 202 {
            bail!("POST {path}: {status} {answer}");
        }
        let mut logs = Vec::new();
        loop {
            let path = format!("/templates/{template_id}/builds/{build_id}/status?logsOffset={}", logs.len());
            let (code, page) = self.send(reqwest::Method::GET, &path, None).await?;
            if code != 200 {
                bail!("GET {path}: {code} {page}");
            }
            let entries = page["logEntries"].as_array().cloned().unwrap_or_default();
            let drained = entries.is_empty();
            for entry in entries {
                logs.push(LogEntry {
                    timestamp: entry["timestamp"].as_str().context("timestamp")?.parse()?,
                    message: entry["message"].as_str().unwrap_or_default().to_owned(),
                    step: entry["step"].as_str().map(str::to_owned),
                });
            }
            match page["status"].as_str() {
                // As the SDK: once finished, read the log to its end.
                Some("ready") if drained => break,
                Some("ready") => continue,
                Some("error") => bail!("build of {name} failed: {}", page["reason"]),
                _ => tokio::time::sleep(POLL).await,
            }
        }
        Ok(Built { wall: started.elapsed(), logs })
    }
}

/// The steps JSON the SDK sends for `Template().from_template("deb")` and a RUN as root per command.
fn spec(commands: &[String]) -> Value {
    let steps: Vec<Value> =
        commands.iter().map(|c| json!({"type": "RUN", "args": [c, "root"], "force": false})).collect();
    json!({"fromTemplate": "deb", "force": false, "steps": steps})
}

/// Part 2: an unchanged rebuild (all steps cached) and a build of 3 new trivial steps.
async fn builds(api: &BuildApi, n: usize) -> anyhow::Result<()> {
    let fixed: Vec<String> = (1..=3).map(|i| format!("echo {i} > /opt/f{i}")).collect();
    let first = api.build("bench-cached", spec(&fixed)).await?;
    report!("first build of the 3-step template: {:.0} ms", ms(first.wall));
    let (mut rebuild, mut rebuild_server) = (Vec::new(), Vec::new());
    for _ in 0..n {
        let built = api.build("bench-cached", spec(&fixed)).await?;
        let cached = built.logs.iter().filter(|l| l.message.starts_with("CACHED ")).count();
        if cached != 3 {
            bail!("an unchanged rebuild ran {} steps", 3 - cached);
        }
        rebuild.push(ms(built.wall));
        rebuild_server.push(ms(built.server_time()));
    }

    let nonce = Utc::now().timestamp_nanos_opt().unwrap_or_default();
    let (mut wall, mut own, mut overhead, mut server, mut per_step) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for round in 0..n {
        // Each step's command prints a line as it starts and one as it ends: its own run time is
        // the time between the two in the build log.
        let commands: Vec<String> =
            (1..=3).map(|i| format!("echo begin; echo {nonce}-{round} > /opt/f{i}; echo end")).collect();
        let built = api.build(&format!("bench-new-{round}"), spec(&commands)).await?;
        let mut steps_time = Duration::ZERO;
        for i in 1..=3 {
            let step = i.to_string();
            let (begin, end) = (built.first(&step, "begin"), built.first(&step, "end"));
            let (Some(begin), Some(end)) = (begin, end) else { bail!("step {i} logged no begin/end lines") };
            steps_time += (end - begin).to_std().unwrap_or_default();
            let label = built.logs.iter().find(|l| l.step.as_deref() == Some(step.as_str())).map(|l| l.timestamp);
            let after = if i == 3 { "finalize".to_owned() } else { (i + 1).to_string() };
            let next = built.logs.iter().find(|l| l.step.as_deref() == Some(after.as_str())).map(|l| l.timestamp);
            if let (Some(a), Some(b)) = (label, next) {
                per_step.push(ms((b - a).to_std().unwrap_or_default()));
            }
        }
        wall.push(ms(built.wall));
        own.push(ms(steps_time));
        overhead.push(ms(built.wall.saturating_sub(steps_time)));
        server.push(ms(built.server_time()));
    }
    print_header();
    print_row("unchanged rebuild (3 cached steps)", "ms", &Summary::of(&mut rebuild), Some(1000.0));
    print_row("  the provider's part (log span)", "ms", &Summary::of(&mut rebuild_server), None);
    print_row("3 new steps: wall", "ms", &Summary::of(&mut wall), None);
    print_row("  sum of the steps' own run time", "ms", &Summary::of(&mut own), None);
    print_row("  wall minus the steps' run time", "ms", &Summary::of(&mut overhead), Some(2000.0));
    print_row("  the provider's part (log span)", "ms", &Summary::of(&mut server), None);
    print_row("  one step, start to next (log)", "ms", &Summary::of(&mut per_step), None);
    report!(
        "builds through the HTTP API polled every {} ms as the SDK does (wall includes up to one poll \
         interval after the build is ready); {n} of each",
        POLL.as_millis()
    );
    Ok(())
}

/// Part 3: pulls of the python3 image (one gzip layer) from a loopback registry into empty stores.
async fn pulls(bin: &Path, rootfs: &Path, n: usize) -> anyhow::Result<()> {
    let tar = std::fs::read(rootfs)?;
    let image = layout(std::slice::from_ref(&tar))?;
    let compressed: u64 = std::fs::read_dir(image.path().join("blobs/sha256"))?
        .flatten()
        .filter_map(|e| e.metadata().ok())
        .map(|m| m.len())
        .sum();
    let registry = registry::Registry::start(None)
        .context("docker-registry (apt-get install docker-registry apache2-utils) is needed")?;
    registry.push("bench/python", "bookworm", image.path()).await;
    let reference = format!("{}/bench/python:bookworm", registry.addr);
    let mut samples = Vec::new();
    // The stores are removed after the last pull, not between pulls: on ext4 without a journal
    // (these test machines), inodes freed in the last minutes are skipped one by one when new
    // ones are allocated, so a pull right after deleting a store of the same size pays for the
    // benchmark's own clean-up (measured: 3.7 s becomes 9.7 s).
    let mut stores = Vec::new();
    for _ in 0..n {
        let state = tempfile::tempdir_in(Path::new(env!("CARGO_MANIFEST_DIR")).join("target"))?;
        let started = Instant::now();
        let out = template_cli(bin, &state.path().join("state"), &["pull", "py", &reference])?;
        samples.push(ms(started.elapsed()));
        report!("{out}");
        stores.push(state);
    }
    drop(stores);
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    print_header();
    let name = format!("pull, {:.0} MiB gzip, empty store", mib(compressed));
    print_row(&name, "ms", &Summary::of(&mut samples), Some(3000.0));
    report!(
        "pulled image: Debian bookworm + python3, one layer, {:.1} MiB compressed ({compressed} bytes, image total), \
         {:.1} MiB as a tar; `sandbox-mcp template pull` wall time (process start to exit), {n} runs, a fresh \
         state directory each",
        mib(compressed),
        mib(tar.len() as u64)
    );
    Ok(())
}

/// `du -s -B1` of `paths` (`--apparent-size` when `apparent`), in bytes; hard links once.
fn du(paths: &[PathBuf], apparent: bool) -> anyhow::Result<u64> {
    let mut command = Command::new("du");
    command.args(["-s", "-c", "-B1"]);
    if apparent {
        command.arg("--apparent-size");
    }
    let out = command.args(paths).output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let total = text.lines().last().and_then(|l| l.split_whitespace().next()).context("du printed nothing")?;
    Ok(total.parse()?)
}

/// Part 4: the store's layers after `n` templates built on `deb`, against `deb`'s own layers.
async fn disk(api: &BuildApi, state: &Path, n: usize) -> anyhow::Result<()> {
    for i in 0..n {
        api.build(&format!("bench-disk-{i}"), spec(&[format!("echo {i} > /opt/t{i}")])).await?;
    }
    let record: Value = serde_json::from_slice(&std::fs::read(state.join("store/templates/deb.json"))?)?;
    let base_layers: Vec<PathBuf> = record["layers"]
        .as_array()
        .context("layers")?
        .iter()
        .filter_map(Value::as_str)
        .map(|d| state.join("store/layers").join(d.trim_start_matches("sha256:")))
        .collect();
    let all = [state.join("store/layers")];
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    let layers = std::fs::read_dir(&all[0])?.count();
    print_header();
    for (apparent, what) in [(false, "real"), (true, "apparent")] {
        let (store, base) = (du(&all, apparent)?, du(&base_layers, apparent)?);
        let ratio = store as f64 / base as f64;
        print_row(&format!("store / base, {what} size"), "x", &Summary::of(&mut [ratio]), Some(1.1));
        report!(
            "{n} templates on one base ({layers} layers stored): store/layers {:.1} MiB, the base's {} layers \
             {:.1} MiB ({what} size, du), ratio {ratio:.3}",
            mib(store),
            base_layers.len(),
            mib(base)
        );
    }
    Ok(())
}

/// Starts a provider of `bin` and imports the Debian image into its store.
async fn provider_with_debian(bin: &Path, debian: &Path) -> anyhow::Result<(Provider, E2bClient, BuildApi)> {
    let provider = Provider::builder().bin(bin).try_start().map_err(anyhow::Error::msg)?;
    report!("provider: {} ({})", provider.url(), bin.display());
    import_debian(bin, &provider.state_dir, debian)?;
    let client = provider.client();
    client.health().await.context("provider health")?;
    let api = BuildApi { http: reqwest::Client::new(), base: provider.url() };
    Ok((provider, client, api))
}

async fn run() -> anyhow::Result<()> {
    let args = Args::parse();
    if !nix::unistd::geteuid().is_root() {
        bail!("run as root: the local provider needs namespaces");
    }
    let bin = args.bin.clone().unwrap_or_else(common::binary);
    if !bin.exists() {
        bail!("{} does not exist: run `cargo build --release` first, or pass --bin", bin.display());
    }
    let debian = rootfs("BENCH_DEBIAN_ROOTFS", oci::debian_rootfs)?;
    if args.wants("create") || args.wants("build") {
        let (provider, client, api) = provider_with_debian(&bin, &debian).await?;
        let mut result = Ok(());
        if args.wants("create") {
            result = creates(&client, args.creates).await.context("creates");
        }
        if result.is_ok() && args.wants("build") {
            result = builds(&api, args.builds).await.context("builds");
        }
        provider.shutdown().await;
        result?;
    }
    if args.wants("pull") {
        let python = rootfs("BENCH_DEBIAN_PYTHON_ROOTFS", oci::debian_python_rootfs)?;
        pulls(&bin, &python, args.pulls).await.context("pulls")?;
    }
    if args.wants("disk") {
        let (provider, _client, api) = provider_with_debian(&bin, &debian).await?;
        let result = disk(&api, &provider.state_dir, args.templates).await.context("disk");
        provider.shutdown().await;
        result?;
    }
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let outcome = run().await;
    common::results::finish("bench_templates", &outcome)?;
    outcome
}
