//! The real `sandbox-mcp serve` for the tests and benches: [`GatewayBuilder`] writes its config,
//! starts it on 127.0.0.1 port 0, reads the bound address back from its JSON log and waits for
//! `/healthz`; [`Gateway`] keeps its log, stops it, and on drop also kills what its embedded
//! provider left. [`with_free_port`] is for the few processes that cannot bind port 0 and report
//! it (a config that names its own URL, `redis-server`): it retries on a port collision.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use super::process::{Log, ProcessGuard, binary, spawn_listening};
use super::provider::{Provider, reap_sandboxes};

/// The environment variable [`e2b_config`] names for the provider's key.
pub const PROVIDER_KEY_ENV: &str = "TEST_PROVIDER_KEY";

/// Config text for a gateway backed by a separate provider (`kind = "e2b"`) with `extra` appended;
/// the key comes from [`PROVIDER_KEY_ENV`], which [`GatewayBuilder::provider`] sets.
pub fn e2b_config(provider: &Provider, extra: &str) -> String {
    format!(
        "[provider]\nkind = \"e2b\"\napi_url = \"{url}\"\nsandbox_url = \"{url}\"\napi_key_env = \"{PROVIDER_KEY_ENV}\"\n\
         request_timeout_secs = 10\n{extra}\n",
        url = provider.url()
    )
}

/// How a gateway is started.
pub struct GatewayBuilder {
    bin: PathBuf,
    config: Config,
    env: Vec<(OsString, OsString)>,
    listen: SocketAddr,
    state_dir: Option<PathBuf>,
    log_filter: String,
}

enum Config {
    Text(String),
    File(PathBuf),
}

impl GatewayBuilder {
    /// A gateway with this config text (the embedded local provider unless it says otherwise).
    pub fn new(config_text: &str) -> Self {
        Self {
            bin: binary(),
            config: Config::Text(config_text.to_string()),
            env: Vec::new(),
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            state_dir: None,
            log_filter: "info,rmcp=warn".into(),
        }
    }

    /// A gateway backed by `provider` (the E2B code path), with `extra` config.
    pub fn provider(provider: &Provider, extra: &str) -> Self {
        Self::new(&e2b_config(provider, extra)).env(PROVIDER_KEY_ENV, &provider.api_key)
    }

    /// A gateway reading this config file.
    pub fn config_file(path: &Path) -> Self {
        let mut builder = Self::new("");
        builder.config = Config::File(path.to_path_buf());
        builder
    }

    pub fn bin(mut self, bin: impl Into<PathBuf>) -> Self {
        self.bin = bin.into();
        self
    }

    pub fn env(mut self, key: impl Into<OsString>, value: impl Into<OsString>) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    pub fn envs(mut self, env: &[(&str, &str)]) -> Self {
        self.env.extend(env.iter().map(|(k, v)| (OsString::from(k), OsString::from(v))));
        self
    }

    /// A fixed address (for configs that name their own URL; see [`with_free_port`]); default port 0.
    pub fn listen(mut self, addr: SocketAddr) -> Self {
        self.listen = addr;
        self
    }

    /// The embedded provider's state directory (default: a temporary one).
    pub fn state_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.state_dir = Some(dir.into());
        self
    }

    /// `RUST_LOG` (default `info,rmcp=warn`; the listening line is always enabled).
    pub fn log_filter(mut self, filter: &str) -> Self {
        self.log_filter = filter.to_string();
        self
    }

    /// Starts the gateway (panics with its log if it does not come up).
    #[track_caller]
    pub fn start(self) -> Gateway {
        self.try_start().unwrap_or_else(|e| panic!("{e}"))
    }

    /// Starts the gateway and waits until `/healthz` answers; the error holds its log.
    pub fn try_start(self) -> Result<Gateway, String> {
        let tmp = tempfile::Builder::new().prefix("sandbox-mcp-gw-").tempdir().map_err(|e| format!("tempdir: {e}"))?;
        let config = match &self.config {
            Config::File(path) => path.clone(),
            Config::Text(text) => {
                let path = tmp.path().join("config.toml");
                std::fs::write(&path, text).map_err(|e| format!("writing {}: {e}", path.display()))?;
                path
            }
        };
        let state_dir = self.state_dir.clone().unwrap_or_else(|| tmp.path().join("state"));
        let mut command = Command::new(&self.bin);
        command
            .args(["serve", "--config"])
            .arg(&config)
            .args(["--listen", &self.listen.to_string()])
            .env("SANDBOX_MCP_SERVER__LOG_FORMAT", "json")
            .env("SANDBOX_MCP_LOCAL__STATE_DIR", &state_dir)
            .env("RUST_LOG", format!("{},sandbox_mcp::gateway::server=info", self.log_filter))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        for (k, v) in &self.env {
            command.env(k, v);
        }
        let echo = std::env::var_os("GATEWAY_TEST_LOG").is_some().then(|| "[serve] ".to_string());
        let log = Log::default();
        let (process, addr) =
            spawn_listening(&mut command, Duration::from_secs(30), &log, echo, Duration::from_secs(60))?;
        let mut gateway = Gateway { process: Some(process), addr, log, state_dir, _tmp: tmp };
        gateway.wait_healthy()?;
        Ok(gateway)
    }
}

/// A running `sandbox-mcp serve` with its captured log.
pub struct Gateway {
    process: Option<ProcessGuard>,
    pub addr: SocketAddr,
    /// Its stderr (the JSON log), captured.
    pub log: Log,
    /// State directory of the embedded provider (when `provider.kind = "local"`).
    pub state_dir: PathBuf,
    _tmp: tempfile::TempDir,
}

impl Gateway {
    /// A gateway with this config text and environment.
    #[track_caller]
    pub fn start(config_text: &str, env: &[(&str, &str)]) -> Self {
        GatewayBuilder::new(config_text).envs(env).start()
    }

    /// A gateway backed by a separate `sandbox-mcp provider` (the E2B code path).
    #[track_caller]
    pub fn start_e2b(provider: &Provider, extra_config: &str, env: &[(&str, &str)]) -> Self {
        GatewayBuilder::provider(provider, extra_config).envs(env).start()
    }

    fn wait_healthy(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(mut stream) = std::net::TcpStream::connect(self.addr) {
                use std::io::{Read, Write};
                let _ = stream.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
                let mut answer = String::new();
                let _ = stream.read_to_string(&mut answer);
                if answer.starts_with("HTTP/1.1 200") {
                    return Ok(());
                }
            }
            if let Some(status) = self.process.as_mut().and_then(ProcessGuard::try_status) {
                return Err(format!("serve exited early with {status}; log:\n{}", self.log_text()));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(format!("serve did not become healthy; log:\n{}", self.log_text()))
    }

    /// `http://ADDR`.
    pub fn base(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// `http://ADDR/mcp`.
    pub fn mcp_url(&self) -> String {
        format!("http://{}/mcp", self.addr)
    }

    pub fn log_text(&self) -> String {
        self.log.text()
    }

    /// Waits until the log contains `needle`.
    pub async fn wait_log(&self, needle: &str, timeout: Duration) -> bool {
        self.log.wait_for(needle, timeout).await
    }

    /// The `addr` of the first JSON log line whose message contains `message` (e.g. the metrics
    /// admin listener's, started on port 0).
    pub fn logged_addr(&self, message: &str) -> Option<SocketAddr> {
        self.log_text().lines().find_map(|line| {
            let value: serde_json::Value = serde_json::from_str(line).ok()?;
            value.get("message")?.as_str()?.contains(message).then_some(())?;
            value.get("addr")?.as_str()?.parse().ok()
        })
    }

    pub fn pid(&self) -> u32 {
        self.process.as_ref().map_or(0, ProcessGuard::pid)
    }

    /// Sends SIGTERM without waiting.
    pub fn signal_term(&self) {
        if let Some(process) = &self.process {
            process.signal(nix::sys::signal::Signal::SIGTERM);
        }
    }

    /// SIGTERM and wait (40 s at most) for the exit; true when it exited successfully.
    pub fn shutdown(&mut self) -> bool {
        let Some(mut process) = self.process.take() else { return false };
        process.signal(nix::sys::signal::Signal::SIGTERM);
        match process.wait_timeout(Duration::from_secs(40)) {
            Some(status) => status.success(),
            None => {
                process.kill9();
                false
            }
        }
    }

    /// The exit status once the gateway has exited on its own (after [`signal_term`](Self::signal_term)).
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let status = self.process.as_mut()?.wait_timeout(timeout);
        if status.is_some() {
            self.process = None;
        }
        status
    }

    /// The process, taken out (for a test that waits for it itself).
    pub fn take_process(&mut self) -> Option<ProcessGuard> {
        self.process.take()
    }

    /// SIGKILL (a crash: the embedded provider's sandboxes keep running).
    pub fn kill9(&mut self) {
        if let Some(mut process) = self.process.take() {
            process.kill9();
        }
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        if let Some(mut process) = self.process.take() {
            process.terminate(Duration::from_secs(30));
        }
        reap_sandboxes(&self.state_dir);
    }
}

/// True when a start failure is a port collision.
pub fn is_port_collision(error: &str) -> bool {
    error.contains("Address already in use") || error.contains("address already in use") || error.contains("EADDRINUSE")
}

/// Runs `start` with a loopback port nothing listens on, again with another one (up to 5 times)
/// when it fails with a port collision: for processes that cannot listen on port 0 and report the
/// port (another process may take the port between the choice and the start).
#[track_caller]
pub fn with_free_port<T>(mut start: impl FnMut(u16) -> Result<T, String>) -> T {
    let mut last = String::new();
    for _ in 0..5 {
        let port = unused_port();
        match start(port) {
            Ok(value) => return value,
            Err(err) if is_port_collision(&err) => last = err,
            Err(err) => panic!("{err}"),
        }
    }
    panic!("5 port collisions in a row; the last: {last}")
}

/// A loopback port that nothing listened on a moment ago: only for [`with_free_port`].
fn unused_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).unwrap_or(0)
}
