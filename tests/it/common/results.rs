//! The benches' results files: every figure a bench prints is also recorded here, and the bench
//! writes them at its end to `bench/results/<bench>-<date>-<host>.json`, so a new measurement
//! changes a results file, never prose.

use std::path::PathBuf;
use std::sync::Mutex;

use serde_json::{Value, json};

use super::stats::Summary;

/// What a bench recorded so far: its summary rows and its printed figure lines, in order.
static RECORDED: Mutex<Vec<Value>> = Mutex::new(Vec::new());

fn record(entry: Value) {
    RECORDED.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).push(entry);
}

/// Records one summary row (what [`super::stats::print_row`] prints).
pub fn row(name: &str, unit: &str, summary: &Summary, target: Option<f64>) {
    let finite = |v: f64| if v.is_finite() { json!(v) } else { Value::Null };
    record(json!({
        "metric": name.trim(),
        "unit": unit,
        "median": finite(summary.median),
        "p90": finite(summary.p90),
        "max": finite(summary.max),
        "n": summary.n,
        "target": target.map(finite),
        "verdict": summary.verdict(target),
    }));
}

/// Records one printed figure line.
pub fn line(text: &str) {
    record(json!({ "line": text }));
}

/// Prints a line and records it in the results file.
#[macro_export]
macro_rules! report {
    () => {{ println!(); }};
    ($($arg:tt)*) => {{
        let text = format!($($arg)*);
        println!("{text}");
        $crate::common::results::line(&text);
    }};
}

fn host() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname").map_or_else(|_| "unknown".into(), |h| h.trim().to_string())
}

fn read_trimmed(path: &str) -> Option<String> {
    std::fs::read_to_string(path).ok().map(|s| s.trim().to_string())
}

fn git_commit() -> Option<String> {
    let out = std::process::Command::new("git").args(["rev-parse", "--short", "HEAD"]).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Writes what was recorded to `bench/results/<bench>-<date>-<host>.json` (or `$BENCH_RESULTS_DIR`)
/// with the machine's facts and the bench's outcome, and prints the path.
pub fn finish(bench: &str, outcome: &anyhow::Result<()>) -> anyhow::Result<PathBuf> {
    let now = chrono::Utc::now();
    let host = host();
    let dir = std::env::var_os("BENCH_RESULTS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("bench/results"));
    std::fs::create_dir_all(&dir)?;
    let safe_host: String = host.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '_' }).collect();
    let path = dir.join(format!("{bench}-{}-{safe_host}.json", now.format("%Y-%m-%dT%H%M%SZ")));
    let entries = std::mem::take(&mut *RECORDED.lock().unwrap_or_else(|poisoned| poisoned.into_inner()));
    let (rows, lines): (Vec<Value>, Vec<Value>) = entries.into_iter().partition(|e| e.get("metric").is_some());
    let document = json!({
        "bench": bench,
        "started_at": now.to_rfc3339(),
        "host": host,
        "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        "kernel": read_trimmed("/proc/sys/kernel/osrelease"),
        "load_average": read_trimmed("/proc/loadavg"),
        "git_commit": git_commit(),
        "profile": if cfg!(debug_assertions) { "debug" } else { "release" },
        "outcome": match outcome { Ok(()) => "ok".to_string(), Err(err) => format!("failed: {err:#}") },
        "rows": rows,
        "lines": lines,
    });
    std::fs::write(&path, serde_json::to_vec_pretty(&document)?)?;
    println!("results written to {}", path.display());
    Ok(path)
}
