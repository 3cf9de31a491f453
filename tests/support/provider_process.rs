//! Runs the real `sandbox-mcp provider` binary on a free loopback port with a
//! temporary state directory, for integration tests and the benchmark.
//! Shutting down (or dropping) kills every sandbox it still has, then stops
//! the provider, so nothing is left behind.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sandbox_mcp::e2b::{E2bClient, ProviderEndpoint};

/// API key the provider is started with (any `e2b_` + 40 hex works for old SDKs too).
pub const TEST_API_KEY: &str = "e2b_00000000000000000000000000000000000000aa";

/// True when running as root (the provider needs namespaces and mounts).
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// A running provider process.
pub struct ProviderProcess {
    child: Option<Child>,
    pub url: url::Url,
    pub state_dir: tempfile::TempDir,
}

impl ProviderProcess {
    /// Starts `bin provider --listen 127.0.0.1:0 --state-dir <tmp> --api-key ...` and waits for its address.
    pub fn spawn(bin: &Path) -> Result<Self, String> {
        Self::spawn_with(bin, &[])
    }

    /// Like [`spawn`](Self::spawn) with extra provider flags.
    pub fn spawn_with(bin: &Path, extra_args: &[&str]) -> Result<Self, String> {
        let state_dir = tempfile::Builder::new()
            .prefix("sandbox-mcp-test-state-")
            .tempdir()
            .map_err(|e| format!("tempdir: {e}"))?;
        let mut child = Command::new(bin)
            .arg("provider")
            .args(["--listen", "127.0.0.1:0", "--api-key", TEST_API_KEY])
            .arg("--state-dir")
            .arg(state_dir.path())
            .args(extra_args)
            .env_remove("E2B_API_KEY")
            .env("RUST_LOG", std::env::var("PROVIDER_LOG").unwrap_or_else(|_| "warn".into()))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", bin.display()))?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            let mut sent = false;
            while let Some(Ok(line)) = lines.next() {
                if !sent && let Some(addr) = line.split("listening on ").nth(1) {
                    let _ = tx.send(addr.trim().to_owned());
                    sent = true;
                }
            }
        });
        let mut provider = Self { child: Some(child), url: "http://127.0.0.1:1".parse().unwrap(), state_dir };
        match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(addr) => {
                provider.url = addr.parse().map_err(|e| format!("bad address {addr:?}: {e}"))?;
                Ok(provider)
            }
            Err(_) => Err("the provider did not print its address within 30 s (see its stderr above)".into()),
        }
    }

    /// A client for this provider (control plane and envd at the same origin).
    /// The provider's host pid.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub fn client(&self) -> E2bClient {
        self.client_with_key(Some(TEST_API_KEY))
    }

    pub fn client_with_key(&self, key: Option<&str>) -> E2bClient {
        E2bClient::new(ProviderEndpoint {
            api_url: self.url.clone(),
            sandbox_url: Some(self.url.clone()),
            domain: "localhost".into(),
            api_key: key.map(str::to_owned),
            request_timeout: Duration::from_secs(30),
        })
        .expect("client")
    }

    /// Kills all sandboxes, then stops the provider.
    pub async fn shutdown(mut self) {
        kill_all_sandboxes(self.client()).await;
        self.stop_process();
    }

    fn stop_process(&mut self) {
        let Some(mut child) = self.child.take() else { return };
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(10) {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

async fn kill_all_sandboxes(client: E2bClient) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while Instant::now() < deadline {
        match client.list_all_sandboxes(&[]).await {
            Ok(list) if list.is_empty() => return,
            Ok(list) => {
                for sandbox in list {
                    let _ = client.kill_sandbox(&sandbox.sandbox_id).await;
                }
            }
            Err(err) => {
                eprintln!("provider clean-up: cannot list sandboxes: {err}");
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!("provider clean-up: sandboxes still listed after 15 s");
}

impl Drop for ProviderProcess {
    fn drop(&mut self) {
        if self.child.is_none() {
            return;
        }
        // A test failed before `shutdown`: clean up from a separate thread
        // (we may be inside a tokio runtime here).
        let client = self.client();
        let cleanup = std::thread::spawn(move || {
            if let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_all().build() {
                rt.block_on(kill_all_sandboxes(client));
            }
        });
        let _ = cleanup.join();
        self.stop_process();
    }
}
