//! The official E2B Python SDK (`e2b==2.63.0`) against the real local
//! provider: runs `tests/interop/e2b_sdk_compat.py` with the python named by
//! `$SANDBOX_MCP_PYTHON` (which must have the SDK installed). Skips loudly when
//! that variable is unset or when not running as root.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

use crate::common;
use std::path::Path;
use std::process::Command;

use common::{API_KEY, Provider, require_env, require_root, testnet};

#[tokio::test]
async fn official_python_sdk_works_against_the_local_provider() {
    let python = require_env!("SANDBOX_MCP_PYTHON", "a python with e2b==2.63.0");
    require_root!();
    let mut net = testnet::TestNet::new();
    net.http(net.internet_addr, 8080, "internet-ok");
    let test_host = format!("{}:8080", net.internet_addr);
    let provider = Provider::start_with(&["--domain", "sandbox.test"]);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/interop/e2b_sdk_compat.py");
    let url = provider.url();
    let output = tokio::task::spawn_blocking(move || {
        Command::new(python)
            .arg(script)
            .env("PROVIDER_URL", url)
            .env("E2B_API_KEY", API_KEY)
            .env("NETWORK_TEST_HOST", test_host)
            .output()
    })
    .await
    .unwrap()
    .expect("run the SDK script");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    println!("{stdout}");
    assert!(output.status.success(), "the SDK script failed ({}):\n{stdout}\n{stderr}", output.status);
    assert!(stdout.contains(" passed, 0 failed"), "unexpected output:\n{stdout}\n{stderr}");
    let left = provider.client().list_all_sandboxes(&[]).await.unwrap();
    assert!(left.is_empty(), "the SDK script left sandboxes behind: {left:?}");
    provider.shutdown().await;
}
