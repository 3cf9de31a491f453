//! Benchmark of the local provider's filesystem snapshots and forks (`docs/snapshots.md`) against a
//! real `sandbox-mcp provider`, through E2B's API as the SDKs call it:
//! 1. `POST /sandboxes/{id}/snapshots` (`"memory": false`) of a sandbox with 100 MiB of new files
//!    (10 × 10 MiB of /dev/urandom in /home/user, written anew before each snapshot so that no
//!    layer dedups with the last one; each snapshot deleted after): the request's time, and how
//!    long the sandbox's processes were frozen (`frozen_ms` of the provider's "snapshot copied" log
//!    line);
//! 2. `POST /sandboxes/{id}/fork` of that sandbox, `count` 3 and 10 interleaved (the forks killed
//!    after each), every entry checked to be a sandbox;
//! 3. create → ready from a snapshot of that sandbox against one from `base`, interleaved;
//! 4. disk, on a provider of its own: one snapshot of a 100 MiB sandbox, then N forks each writing
//!    1 MiB of its own; the growth of the store's layers and the forks' own disks (allocated blocks
//!    of their sparse `disk.img`) against the one snapshot.
//!
//! `cargo build --release && cargo run --release --example bench_snapshots -- [--only snapshot,fork,create,disk]`
//!
//! Needs root (the provider makes namespaces). Before each fork and create the bench waits for the
//! provider's disk pool to be full again, so that no measurement pays for the previous one's
//! refill.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

#[path = "../tests/it/common/mod.rs"]
mod common;

use std::collections::HashSet;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Parser;
use common::stats::{Summary, ms, p50, print_header, print_row};
use common::{Log, Provider};
use sandbox_mcp::e2b::{CallOptions, E2bClient, OutputLimits, wire};
use sandbox_mcp::local::isolation::disk::POOL_SIZE;
use serde_json::Value;

#[derive(Parser)]
struct Args {
    /// The sandbox-mcp binary to start (default: target/release/sandbox-mcp next to this example).
    #[arg(long)]
    bin: Option<PathBuf>,
    /// Snapshots of the 100 MiB sandbox, each of fresh data.
    #[arg(long, default_value_t = 7)]
    snapshots: usize,
    /// Forks of each count (3 and 10), interleaved.
    #[arg(long, default_value_t = 7)]
    forks: usize,
    /// Creates of each kind (snapshot, base), interleaved.
    #[arg(long, default_value_t = 20)]
    creates: usize,
    /// Forks of one sandbox for the disk figure.
    #[arg(long, default_value_t = 10)]
    disk_forks: u32,
    /// Parts to run, comma-separated: snapshot, fork, create, disk (default: all).
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
}

impl Args {
    fn wants(&self, part: &str) -> bool {
        self.only.is_empty() || self.only.iter().any(|p| p == part)
    }
}

/// Files of random data the source sandbox holds, and the size of each.
const FILES: usize = 10;
const FILE_MIB: usize = 10;
/// Where they are written.
const DATA_DIR: &str = "/home/user/bench";
/// What each fork of the disk part writes of its own.
const FORK_WRITE_MIB: usize = 1;
/// The provider's log filter: `info` for the "snapshot copied" lines.
const LOG_FILTER: &str = "warn,sandbox_mcp=info";

const MIB: f64 = (1 << 20) as f64;

/// One line of the summary table.
struct Row {
    name: String,
    unit: &'static str,
    samples: Vec<f64>,
    target: Option<f64>,
}

impl Row {
    fn new(name: impl Into<String>, unit: &'static str, samples: Vec<f64>, target: Option<f64>) -> Self {
        Self { name: name.into(), unit, samples, target }
    }
}

fn print_table(rows: &mut [Row]) {
    print_header();
    for row in rows.iter_mut() {
        print_row(&row.name, row.unit, &Summary::of(&mut row.samples), row.target);
    }
}

fn load_average() -> String {
    let text = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    text.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
}

fn new_sandbox(template: &str) -> wire::NewSandbox {
    wire::NewSandbox { template_id: template.into(), timeout: Some(600), ..Default::default() }
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

/// Replaces the sandbox's data with 10 × 10 MiB of new random bytes (nothing of it in any layer).
async fn write_fresh_data(client: &E2bClient, sandbox: &wire::Sandbox) -> anyhow::Result<()> {
    let script = format!(
        "set -e; rm -rf {DATA_DIR}; mkdir -p {DATA_DIR}; i=0; while [ $i -lt {FILES} ]; do i=$((i+1)); \
         head -c {} /dev/urandom > {DATA_DIR}/f$i; done",
        FILE_MIB << 20
    );
    sh(client, sandbox, &script).await.map(drop)
}

async fn data_checksum(client: &E2bClient, sandbox: &wire::Sandbox) -> anyhow::Result<String> {
    sh(client, sandbox, &format!("cat {DATA_DIR}/f* | md5sum | cut -d' ' -f1")).await
}

fn filesystem_snapshot() -> wire::NewSnapshot {
    wire::NewSnapshot { name: None, memory: Some(false) }
}

/// Sandbox id and frozen time (ms) of each "snapshot copied" line of the provider's log, in order
/// (JSON lines, as the provider logs to a pipe; `key=value` text lines also read).
fn frozen_times(log: &Log) -> Vec<(String, f64)> {
    let text = log.text();
    text.lines()
        .filter(|line| line.contains("snapshot copied"))
        .filter_map(|line| {
            if let Ok(v) = serde_json::from_str::<Value>(line) {
                let fields = if v["fields"].is_object() { &v["fields"] } else { &v };
                return Some((fields["sandbox"].as_str()?.to_owned(), fields["frozen_ms"].as_f64()?));
            }
            let field = |key: &str| {
                line.split_whitespace().find_map(|w| w.strip_prefix(key)).map(|s| s.trim_matches('"').to_owned())
            };
            Some((field("sandbox=")?, field("frozen_ms=")?.parse().ok()?))
        })
        .collect()
}

/// The frozen time of the snapshot of `sandbox_id` logged after the first `seen` ones.
async fn next_frozen(log: &Log, seen: usize, sandbox_id: &str) -> anyhow::Result<f64> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if let Some((id, frozen)) = frozen_times(log).get(seen) {
            if id != sandbox_id {
                bail!("the provider logged a snapshot of {id}, not of {sandbox_id}");
            }
            return Ok(*frozen);
        }
        if Instant::now() > deadline {
            bail!("no new \"snapshot copied\" line (frozen_ms) in the provider's log (filter {LOG_FILTER})");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Disks ready in the provider's pool (finished images in `STATE/disk-pool`).
fn pooled_disks(state: &Path) -> usize {
    std::fs::read_dir(state.join("disk-pool"))
        .map(|entries| {
            entries
                .flatten()
                .filter(|e| e.file_name().to_str().is_some_and(|n| !n.starts_with('.') && n.ends_with(".img")))
                .count()
        })
        .unwrap_or(0)
}

/// Waits (30 s at most) until the provider's disk pool is full again, then a little more for its
/// other pools.
async fn settle(state: &Path) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while pooled_disks(state) < POOL_SIZE && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
}

async fn kill_all(client: &E2bClient, ids: &[String]) -> anyhow::Result<()> {
    let kills = futures_util::future::join_all(ids.iter().map(|id| client.kill_sandbox(id))).await;
    for (id, kill) in ids.iter().zip(kills) {
        if !kill.with_context(|| format!("kill of {id}"))? {
            bail!("kill of {id} reported not found");
        }
    }
    Ok(())
}

/// The sandboxes of a fork's answer; fails (after killing those made) unless every entry is one.
async fn fork_sandboxes(
    client: &E2bClient,
    entries: Vec<wire::ForkEntry>,
    count: u32,
) -> anyhow::Result<Vec<wire::Sandbox>> {
    let mut sandboxes = Vec::new();
    let mut errors = Vec::new();
    for entry in entries {
        match (entry.sandbox, entry.error) {
            (Some(sandbox), _) => sandboxes.push(sandbox),
            (None, Some(error)) => errors.push(format!("{} {}", error.code, error.message)),
            (None, None) => errors.push("an empty entry".into()),
        }
    }
    if !errors.is_empty() || sandboxes.len() != count as usize {
        let ids: Vec<String> = sandboxes.iter().map(|s| s.sandbox_id.clone()).collect();
        kill_all(client, &ids).await?;
        bail!("fork of {count}: {} sandboxes; errors: {}", ids.len(), errors.join("; "));
    }
    Ok(sandboxes)
}

async fn fork(client: &E2bClient, parent: &str, count: u32) -> anyhow::Result<(Duration, Vec<wire::Sandbox>)> {
    let request = wire::ForkSandbox { count: Some(count), timeout: Some(600) };
    let started = Instant::now();
    let entries = client.fork_sandbox(parent, &request).await.with_context(|| format!("fork of {count}"))?;
    let elapsed = started.elapsed();
    Ok((elapsed, fork_sandboxes(client, entries, count).await?))
}

/// A sandbox of `base` holding 100 MiB of new files.
async fn source_sandbox(client: &E2bClient) -> anyhow::Result<wire::Sandbox> {
    let sandbox = client.create_sandbox(&new_sandbox("base")).await?;
    let started = Instant::now();
    write_fresh_data(client, &sandbox).await?;
    report!(
        "source sandbox {}: {FILES} × {FILE_MIB} MiB of /dev/urandom written to {DATA_DIR} in {:.0} ms",
        sandbox.sandbox_id,
        ms(started.elapsed())
    );
    Ok(sandbox)
}

/// Part 1: snapshots of the 100 MiB sandbox, fresh data each, each deleted after.
async fn snapshots(
    client: &E2bClient,
    log: &Log,
    source: &wire::Sandbox,
    n: usize,
    rows: &mut Vec<Row>,
) -> anyhow::Result<()> {
    report!("snapshots: load average {}", load_average());
    let id = &source.sandbox_id;
    // Warm-up, and a check that a sandbox of the snapshot has the files.
    let seen = frozen_times(log).len();
    let started = Instant::now();
    let warm = client.create_snapshot(id, &filesystem_snapshot()).await.context("warm-up snapshot")?;
    let warm_ms = ms(started.elapsed());
    let warm_frozen = next_frozen(log, seen, id).await?;
    let child = client.create_sandbox(&new_sandbox(&warm.snapshot_id)).await?;
    let (theirs, ours) = (data_checksum(client, &child).await?, data_checksum(client, source).await?);
    kill_all(client, std::slice::from_ref(&child.sandbox_id)).await?;
    if theirs != ours {
        bail!("a sandbox of snapshot {} has other data (md5 {theirs}, the source's {ours})", warm.snapshot_id);
    }
    if !client.delete_snapshot(&warm.snapshot_id).await? {
        bail!("delete of {} reported not found", warm.snapshot_id);
    }
    report!(
        "warm-up snapshot {}: {warm_ms:.0} ms, frozen {warm_frozen:.1} ms; a sandbox of it has the same 100 MiB \
         (md5 {ours})",
        warm.snapshot_id
    );

    let (mut total, mut frozen) = (Vec::new(), Vec::new());
    for _ in 0..n {
        write_fresh_data(client, source).await?;
        let seen = frozen_times(log).len();
        let started = Instant::now();
        let snapshot = client.create_snapshot(id, &filesystem_snapshot()).await.context("snapshot")?;
        total.push(ms(started.elapsed()));
        frozen.push(next_frozen(log, seen, id).await?);
        if !client.delete_snapshot(&snapshot.snapshot_id).await? {
            bail!("delete of {} reported not found", snapshot.snapshot_id);
        }
    }
    report!(
        "snapshot of a sandbox with {} MiB of new files (fresh random data each time, {n} snapshots): medians \
         {:.0} ms for the request, {:.1} ms frozen (the provider's frozen_ms)",
        FILES * FILE_MIB,
        p50(&mut total.clone()),
        p50(&mut frozen.clone())
    );
    rows.push(Row::new("snapshot, 100 MiB new: request", "ms", total, Some(1000.0)));
    rows.push(Row::new("  source frozen (frozen_ms)", "ms", frozen, Some(200.0)));
    Ok(())
}

/// Part 2: forks of 3 and of 10 of the 100 MiB sandbox, interleaved, killed after each.
async fn forks(
    client: &E2bClient,
    log: &Log,
    state: &Path,
    source: &wire::Sandbox,
    n: usize,
    rows: &mut Vec<Row>,
) -> anyhow::Result<()> {
    report!("forks: load average {}", load_average());
    let id = &source.sandbox_id;
    settle(state).await;
    let (elapsed, warm) = fork(client, id, 1).await?;
    let (theirs, ours) = (data_checksum(client, &warm[0]).await?, data_checksum(client, source).await?);
    kill_all(client, &[warm[0].sandbox_id.clone()]).await?;
    if theirs != ours {
        bail!("a fork has other data (md5 {theirs}, the parent's {ours})");
    }
    report!("warm-up fork of 1: {:.0} ms; the fork has the parent's 100 MiB (md5 {ours})", ms(elapsed));

    let (mut three, mut ten, mut frozen) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..n {
        let order: [u32; 2] = if i % 2 == 0 { [3, 10] } else { [10, 3] };
        for count in order {
            settle(state).await;
            let seen = frozen_times(log).len();
            let (elapsed, sandboxes) = fork(client, id, count).await?;
            frozen.push(next_frozen(log, seen, id).await?);
            if count == 3 { &mut three } else { &mut ten }.push(ms(elapsed));
            let ids: Vec<String> = sandboxes.into_iter().map(|s| s.sandbox_id).collect();
            kill_all(client, &ids).await?;
        }
    }
    report!(
        "forks of the 100 MiB sandbox, {n} of each count interleaved, every entry a sandbox: medians {:.0} ms (3), \
         {:.0} ms (10), the parent frozen {:.1} ms",
        p50(&mut three.clone()),
        p50(&mut ten.clone()),
        p50(&mut frozen.clone())
    );
    rows.push(Row::new("fork, count 3", "ms", three, Some(1500.0)));
    rows.push(Row::new("fork, count 10", "ms", ten, Some(3000.0)));
    rows.push(Row::new("  parent frozen (frozen_ms)", "ms", frozen, Some(200.0)));
    Ok(())
}

/// Part 3: create → ready from a snapshot of the 100 MiB sandbox and from `base`, interleaved
/// (the order swapped every round), each killed right after.
async fn creates(
    client: &E2bClient,
    state: &Path,
    source: &wire::Sandbox,
    n: usize,
    rows: &mut Vec<Row>,
) -> anyhow::Result<()> {
    report!("creates: load average {}", load_average());
    let snapshot = client.create_snapshot(&source.sandbox_id, &filesystem_snapshot()).await?.snapshot_id;
    let result = creates_of(client, state, &snapshot, n, rows).await;
    client.delete_snapshot(&snapshot).await?;
    result
}

async fn creates_of(
    client: &E2bClient,
    state: &Path,
    snapshot: &str,
    n: usize,
    rows: &mut Vec<Row>,
) -> anyhow::Result<()> {
    for template in ["base", snapshot] {
        let sandbox = client.create_sandbox(&new_sandbox(template)).await?;
        kill_all(client, &[sandbox.sandbox_id]).await?;
    }
    let (mut base, mut of_snapshot) = (Vec::new(), Vec::new());
    for i in 0..n {
        let order = if i % 2 == 0 { ["base", snapshot] } else { [snapshot, "base"] };
        for template in order {
            settle(state).await;
            let started = Instant::now();
            let sandbox = client.create_sandbox(&new_sandbox(template)).await?;
            let elapsed = ms(started.elapsed());
            if template == "base" { &mut base } else { &mut of_snapshot }.push(elapsed);
            kill_all(client, &[sandbox.sandbox_id]).await?;
        }
    }
    let (base_median, snapshot_median) = (p50(&mut base.clone()), p50(&mut of_snapshot.clone()));
    let ratio = snapshot_median / base_median;
    report!(
        "create → ready from a snapshot of the 100 MiB sandbox against base, {n} interleaved pairs: medians \
         {snapshot_median:.2} ms / {base_median:.2} ms = {ratio:.3} (target ≤ 1.10: {})",
        if ratio <= 1.1 { "ok" } else { "MISSED" }
    );
    let target = (base_median * 1.1 * 100.0).round() / 100.0;
    rows.push(Row::new("create → ready, base", "ms", base, Some(40.0)));
    rows.push(Row::new("create → ready, snapshot", "ms", of_snapshot, Some(target)));
    rows.push(Row::new("  snapshot / base (medians)", "x", vec![ratio], Some(1.1)));
    Ok(())
}

/// Allocated bytes (st_blocks × 512) of everything under `path`, hard links counted once, as
/// `du` does; 0 when it does not exist.
fn allocated(path: &Path) -> u64 {
    fn walk(path: &Path, seen: &mut HashSet<(u64, u64)>) -> u64 {
        let Ok(meta) = std::fs::symlink_metadata(path) else { return 0 };
        let mut total = if seen.insert((meta.dev(), meta.ino())) { meta.blocks() * 512 } else { 0 };
        if meta.is_dir()
            && let Ok(entries) = std::fs::read_dir(path)
        {
            total += entries.flatten().map(|e| walk(&e.path(), seen)).sum::<u64>();
        }
        total
    }
    walk(path, &mut HashSet::new())
}

/// Allocated bytes of sandbox `id`'s sparse disk image.
fn disk_blocks(state: &Path, id: &str) -> anyhow::Result<u64> {
    let image = state.join("sandboxes").join(id).join("disk.img");
    Ok(std::fs::metadata(&image).with_context(|| format!("{}", image.display()))?.blocks() * 512)
}

/// Allocated bytes of one unused disk image of the provider's pool, if there is one.
fn pooled_disk_blocks(state: &Path) -> Option<u64> {
    let entries = std::fs::read_dir(state.join("disk-pool")).ok()?;
    let image = entries
        .flatten()
        .find(|e| e.file_name().to_str().is_some_and(|n| !n.starts_with('.') && n.ends_with(".img")))?;
    Some(image.metadata().ok()?.blocks() * 512)
}

/// Flushes a sandbox's writes to its disk image (`sync` of its filesystems).
async fn sync(client: &E2bClient, sandbox: &wire::Sandbox) -> anyhow::Result<()> {
    sh(client, sandbox, "sync").await.map(drop)
}

/// Part 4: the store's layers and the forks' disks after one snapshot and `n` forks writing
/// 1 MiB each, against the one snapshot.
async fn disk(client: &E2bClient, state: &Path, n: u32, rows: &mut Vec<Row>) -> anyhow::Result<()> {
    report!("disk: load average {}", load_average());
    let layers = state.join("store/layers");
    let source = source_sandbox(client).await?;
    sync(client, &source).await?;
    let before = allocated(&layers);
    let snapshot = client.create_snapshot(&source.sandbox_id, &filesystem_snapshot()).await?.snapshot_id;
    let after_snapshot = allocated(&layers);
    settle(state).await;
    let (_, sandboxes) = fork(client, &source.sandbox_id, n).await?;
    let after_forks = allocated(&layers);
    let ids: Vec<String> = sandboxes.iter().map(|s| s.sandbox_id.clone()).collect();
    let mut idle = 0;
    for sandbox in &sandboxes {
        sync(client, sandbox).await?;
        idle += disk_blocks(state, &sandbox.sandbox_id)?;
    }
    for sandbox in &sandboxes {
        let script = format!("head -c {} /dev/urandom > /home/user/own.bin && sync", FORK_WRITE_MIB << 20);
        sh(client, sandbox, &script).await?;
    }
    let mut disks = 0;
    for id in &ids {
        disks += disk_blocks(state, id)?;
    }
    let source_disk = disk_blocks(state, &source.sandbox_id)?;
    let after_writes = allocated(&layers);
    kill_all(client, &ids).await?;
    client.delete_snapshot(&snapshot).await?;
    let pooled = pooled_disk_blocks(state);

    let one_snapshot = after_snapshot.saturating_sub(before) as f64;
    let forks_layers = after_writes as f64 - after_snapshot as f64;
    let written = f64::from(n) * (FORK_WRITE_MIB as f64 * MIB);
    let cost = one_snapshot + forks_layers + disks as f64;
    let shared = cost / (one_snapshot + disks as f64);
    let strict = cost / (one_snapshot + written);
    let pooled = pooled.map_or("n/a".to_owned(), |b| format!("{:.2} MiB", b as f64 / MIB));
    report!(
        "disk: one snapshot of the 100 MiB sandbox added {:.1} MiB of store layers (its source's disk holds {:.1} MiB); \
         {n} forks of it then added {:.1} MiB of layers ({:.1} MiB right after the fork), and their own disks hold \
         {:.1} MiB after each wrote {FORK_WRITE_MIB} MiB, {:.2} MiB each before (an unused disk of the pool: {pooled}, \
         the empty ext4 any sandbox has)",
        one_snapshot / MIB,
        source_disk as f64 / MIB,
        forks_layers / MIB,
        (after_forks as f64 - after_snapshot as f64) / MIB,
        disks as f64 / MIB,
        idle as f64 / MIB / f64::from(n)
    );
    report!(
        "disk: snapshot + {n} forks cost {:.1} MiB = {shared:.3} × (one snapshot + the forks' own disks), \
         {strict:.3} × (one snapshot + {n} × {FORK_WRITE_MIB} MiB written; the rest is each fork's own empty ext4) \
         (allocated blocks, st_blocks × 512)",
        cost / MIB
    );
    rows.push(Row::new("one snapshot: store layers", "MiB", vec![one_snapshot / MIB], None));
    rows.push(Row::new(format!("{n} forks: store layers added"), "MiB", vec![forks_layers / MIB], None));
    rows.push(Row::new(format!("{n} forks: their own disks"), "MiB", vec![disks as f64 / MIB], None));
    rows.push(Row::new("  of which before their writes", "MiB", vec![idle as f64 / MIB], None));
    rows.push(Row::new("cost / (snapshot + forks' disks)", "x", vec![shared], Some(1.1)));
    rows.push(Row::new(format!("cost / (snapshot + {n} × {FORK_WRITE_MIB} MiB)"), "x", vec![strict], None));
    Ok(())
}

/// The provider's warnings and errors (its log is not echoed: it runs at `info`).
fn print_warnings(provider: &Provider) {
    for line in provider.log.text().lines().filter(|l| l.contains("\"WARN\"") || l.contains("\"ERROR\"")) {
        eprintln!("[provider] {line}");
    }
}

async fn start_provider(bin: &Path) -> anyhow::Result<(Provider, E2bClient)> {
    let provider =
        Provider::builder().bin(bin).log_filter(LOG_FILTER).echo(false).try_start().map_err(anyhow::Error::msg)?;
    report!("provider: {} ({})", provider.url(), bin.display());
    let client = provider.client();
    client.health().await.context("provider health")?;
    Ok((provider, client))
}

/// Parts 1-3 on one provider, on one 100 MiB source sandbox.
async fn source_parts(client: &E2bClient, provider: &Provider, args: &Args, rows: &mut Vec<Row>) -> anyhow::Result<()> {
    let source = source_sandbox(client).await?;
    if args.wants("snapshot") {
        snapshots(client, &provider.log, &source, args.snapshots, rows).await.context("snapshots")?;
    }
    if args.wants("fork") {
        forks(client, &provider.log, &provider.state_dir, &source, args.forks, rows).await.context("forks")?;
    }
    if args.wants("create") {
        creates(client, &provider.state_dir, &source, args.creates, rows).await.context("creates")?;
    }
    Ok(())
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
    let mut rows = Vec::new();
    let mut result = Ok(());
    if args.wants("snapshot") || args.wants("fork") || args.wants("create") {
        let (provider, client) = start_provider(&bin).await?;
        result = source_parts(&client, &provider, &args, &mut rows).await;
        print_warnings(&provider);
        provider.shutdown().await;
    }
    if result.is_ok() && args.wants("disk") {
        let (provider, client) = start_provider(&bin).await?;
        result = disk(&client, &provider.state_dir, args.disk_forks, &mut rows).await.context("disk");
        print_warnings(&provider);
        provider.shutdown().await;
    }
    print_table(&mut rows);
    report!("load average at the end: {}", load_average());
    result
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let outcome = run().await;
    common::results::finish("bench_snapshots", &outcome)?;
    outcome
}
