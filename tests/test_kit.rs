//! The test kit's own tests (`tests/it/common`): the process guard stops a whole process group, the
//! listening lines of the provider and the gateway parse, `SANDBOX_MCP_NO_SKIP=1` turns a skip
//! into a failure, and the benches' percentiles. No root needed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

#[path = "it/common/mod.rs"]
mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::process::listening_addr;
use common::stats::{Summary, percentile};
use common::{ProcessGuard, wait_until};

fn gone(pid: u32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    stat.is_empty() || stat.rsplit(')').next().is_some_and(|s| s.trim_start().starts_with('Z'))
}

#[test]
fn process_guard_stops_the_whole_group_on_drop() {
    // A shell that ignores SIGTERM, with a child of its own in its process group.
    let mut command = Command::new("sh");
    command.args(["-c", "trap '' TERM; sleep 300 & echo $!; wait"]).stdout(Stdio::piped());
    let mut guard = ProcessGuard::spawn(&mut command, Duration::from_millis(200)).expect("spawn sh");
    let leader = guard.pid();
    let stdout = guard.child_mut().and_then(|c| c.stdout.take()).expect("stdout");
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).expect("the child's pid");
    let child: u32 = line.trim().parse().expect("a pid");
    assert!(!gone(leader) && !gone(child));
    drop(guard);
    assert!(gone(leader), "the leader outlived its guard");
    assert!(wait_until(Duration::from_secs(5), || gone(child)), "a member of the group outlived the guard");
}

#[test]
fn kill9_stops_only_the_leader() {
    let mut command = Command::new("sh");
    command.args(["-c", "sleep 300 & echo $!; wait"]).stdout(Stdio::piped());
    let mut guard = ProcessGuard::spawn(&mut command, Duration::ZERO).expect("spawn sh");
    let stdout = guard.child_mut().and_then(|c| c.stdout.take()).expect("stdout");
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).expect("the child's pid");
    let child: u32 = line.trim().parse().expect("a pid");
    let status = guard.kill9().expect("reaped");
    assert!(!status.success());
    assert!(!gone(child), "a crash of the leader must not take its group with it");
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(child as i32), nix::sys::signal::Signal::SIGKILL);
}

#[test]
fn listening_lines_of_the_provider_and_the_gateway_parse() {
    let provider = "sandbox-mcp provider listening on http://127.0.0.1:41234";
    assert_eq!(listening_addr(provider), Some("127.0.0.1:41234".parse().unwrap()));
    let gateway = r#"{"timestamp":"x","level":"INFO","message":"sandbox-mcp gateway listening (MCP on /mcp)","addr":"127.0.0.1:5001","auth":true}"#;
    assert_eq!(listening_addr(gateway), Some("127.0.0.1:5001".parse().unwrap()));
    let nested = r#"{"level":"INFO","fields":{"message":"sandbox-mcp gateway listening","addr":"[::1]:80"}}"#;
    assert_eq!(listening_addr(nested), Some("[::1]:80".parse().unwrap()));
    for other in [
        r#"{"message":"metrics admin listener serving /metrics (no auth)","addr":"127.0.0.1:9"}"#,
        "sandbox-mcp provider listening on nowhere",
        "listening on http://127.0.0.1:1",
        "",
    ] {
        assert_eq!(listening_addr(other), None, "{other:?}");
    }
}

/// Helper run by `no_skip_turns_a_skip_into_a_failure` in a process of its own.
#[test]
#[ignore = "helper process of no_skip_turns_a_skip_into_a_failure"]
fn skip_probe() {
    common::gate::skip("probe of the skip gate");
}

#[test]
fn no_skip_turns_a_skip_into_a_failure() {
    let probe = |no_skip: Option<&str>| {
        let mut command = Command::new(std::env::current_exe().unwrap());
        command.args(["skip_probe", "--exact", "--ignored", "--nocapture", "--test-threads=1"]);
        match no_skip {
            Some(value) => command.env(common::gate::NO_SKIP, value),
            None => command.env_remove(common::gate::NO_SKIP),
        };
        let output = command.output().expect("run the probe");
        (output.status.success(), String::from_utf8_lossy(&output.stderr).into_owned())
    };
    let (passed, stderr) = probe(None);
    assert!(passed && stderr.contains("SKIPPED skip_probe: probe of the skip gate"), "{stderr}");
    let (passed, stderr) = probe(Some("0"));
    assert!(passed, "SANDBOX_MCP_NO_SKIP=0 allows skips: {stderr}");
    let (passed, stderr) = probe(Some("1"));
    assert!(!passed && stderr.contains("may not skip"), "SANDBOX_MCP_NO_SKIP=1 must fail the test: {stderr}");
}

#[test]
fn percentiles_and_summaries() {
    let mut samples: Vec<f64> = (1..=10).rev().map(f64::from).collect();
    let summary = Summary::of(&mut samples);
    assert_eq!((summary.n, summary.median, summary.p90, summary.max), (10, 6.0, 9.0, 10.0));
    assert_eq!(summary.verdict(Some(6.0)), "ok");
    assert_eq!(summary.verdict(Some(5.0)), "MISSED");
    assert_eq!(summary.verdict(None), "");
    assert_eq!(Summary::of(&mut []).verdict(Some(1.0)), "n/a");
    assert!(percentile(&[], 0.5).is_nan());
    assert_eq!(percentile(&[1.0, 2.0, 3.0], 0.5), 2.0);
    assert_eq!(common::stats::p50(&mut [3.0, 1.0, 2.0, 4.0]), 3.0);
    assert!(Path::new(&common::binary()).exists(), "cargo's sandbox-mcp binary");
}
