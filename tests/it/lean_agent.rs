//! Which binary runs as each sandbox's agent: the lean `sandbox-mcp-envd` built beside
//! `sandbox-mcp` from the same sources, and `sandbox-mcp` itself when the one beside it comes
//! from other sources. Real provider processes, real sandboxes; needs root.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

use crate::common;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{Provider, agent_pid, require_root};
use sandbox_mcp::e2b::wire;
use sandbox_mcp::e2b::{CallOptions, OutputLimits};

/// The executable of the agent of `sandbox_id`, read from the host's `/proc`.
fn agent_exe(state_dir: &Path, sandbox_id: &str) -> PathBuf {
    let pid =
        agent_pid(state_dir, sandbox_id).unwrap_or_else(|| panic!("no agent process found for sandbox {sandbox_id}"));
    std::fs::read_link(format!("/proc/{pid}/exe")).expect("the agent's exe link")
}

/// Creates a sandbox, checks a command runs in it, and returns its agent's executable.
async fn agent_of_a_new_sandbox(provider: &Provider) -> PathBuf {
    let client = provider.client();
    let new = wire::NewSandbox { template_id: "base".into(), timeout: Some(60), ..Default::default() };
    let sandbox = client.create_sandbox(&new).await.expect("create");
    let request = wire::StartRequest {
        process: wire::ProcessConfig {
            cmd: "/bin/sh".into(),
            args: vec!["-c".into(), "echo ok; id -u".into()],
            ..Default::default()
        },
        stdin: Some(false),
        ..Default::default()
    };
    let out = client
        .envd(&sandbox)
        .run(&request, &CallOptions::default().with_timeout(Duration::from_secs(30)), OutputLimits::default())
        .await
        .expect("run");
    assert_eq!((out.exit_code, String::from_utf8_lossy(&out.stdout).as_ref()), (0, "ok\n1000\n"), "{out:?}");
    agent_exe(&provider.state_dir, &sandbox.sandbox_id)
}

#[tokio::test]
async fn sandboxes_run_the_lean_agent_built_beside_the_binary() {
    require_root!();
    let lean = Path::new(env!("CARGO_BIN_EXE_sandbox-mcp-envd"));
    let out = std::process::Command::new(lean).arg("--build-id").output().expect("run sandbox-mcp-envd");
    assert!(out.status.success() && !out.stdout.is_empty(), "{out:?}");
    // Nothing else: the lean binary refuses to act as anything but the agent.
    let other = std::process::Command::new(lean).arg("serve").output().expect("run sandbox-mcp-envd");
    assert!(!other.status.success());
    assert!(String::from_utf8_lossy(&other.stderr).contains("internal program"), "{other:?}");

    let provider = Provider::start();
    let exe = agent_of_a_new_sandbox(&provider).await;
    assert_eq!(exe, lean.canonicalize().unwrap(), "the sandbox's agent should be the lean binary");
    provider.shutdown().await;
}

#[tokio::test]
async fn an_agent_binary_from_other_sources_is_not_used() {
    require_root!();
    // `sandbox-mcp` (hard-linked, so /proc/self/exe names this directory) beside a
    // `sandbox-mcp-envd` that reports another build.
    let real = Path::new(env!("CARGO_BIN_EXE_sandbox-mcp"));
    let dir = tempfile::Builder::new()
        .prefix("lean-agent-skew-")
        .tempdir_in(real.parent().expect("the binary's directory"))
        .expect("tempdir");
    let bin = dir.path().join("sandbox-mcp");
    std::fs::hard_link(real, &bin).expect("hard link sandbox-mcp");
    let stale = dir.path().join("sandbox-mcp-envd");
    std::fs::write(&stale, "#!/bin/sh\necho 0000000000000000\n").expect("write the stale agent");
    std::fs::set_permissions(&stale, std::os::unix::fs::PermissionsExt::from_mode(0o755)).expect("chmod");

    let provider = Provider::builder().bin(&bin).start();
    let exe = agent_of_a_new_sandbox(&provider).await;
    assert_eq!(exe, bin, "a stale lean agent must be passed over for the binary itself");
    provider.shutdown().await;
}
