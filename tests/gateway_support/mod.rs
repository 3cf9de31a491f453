//! Test support for the gateway integration tests: real `sandbox-mcp
//! provider` and `sandbox-mcp serve` processes on free loopback ports, an
//! rmcp HTTP client, and a direct provider client to check what the gateway
//! did. Every process is stopped (and every sandbox killed) on drop.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rmcp::model::{
    CallToolRequestParams, CallToolResult, ClientCapabilities, ClientConfig, Implementation, ProtocolVersion,
};
use rmcp::service::RunningService;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{RoleClient, ServiceExt};
use sandbox_mcp::e2b::{E2bClient, ProviderEndpoint};
use serde_json::{Value, json};

pub const BIN: &str = env!("CARGO_BIN_EXE_sandbox-mcp");

/// True when running as root (the local provider needs namespaces); prints why a test is skipped otherwise.
pub fn require_root(test: &str) -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    eprintln!("SKIPPED {test}: the local provider needs root (namespaces, overlayfs); run the tests as root");
    assert!(
        std::env::var_os("SANDBOX_MCP_NO_SKIP").is_none(),
        "SANDBOX_MCP_NO_SKIP is set (scripts/test.sh): this test may not skip"
    );
    false
}

/// A free 127.0.0.1 port (bound then released).
pub fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("addr").port()
}

fn terminate(child: &mut Child, wait: Duration) {
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
    let deadline = Instant::now() + wait;
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// A `sandbox-mcp provider` process.
pub struct ProviderProc {
    pub child: Option<Child>,
    pub addr: SocketAddr,
    pub api_key: String,
    pub state_dir: PathBuf,
    _tmp: Option<tempfile::TempDir>,
}

impl ProviderProc {
    pub fn start() -> Self {
        let tmp = tempfile::tempdir().expect("tempdir");
        let state_dir = tmp.path().join("state");
        let mut provider = Self::start_at(&state_dir, "127.0.0.1:0".parse().unwrap(), "test-provider-key-0123456789");
        provider._tmp = Some(tmp);
        provider
    }

    /// Starts (or restarts) a provider on `listen` with `state_dir`.
    pub fn start_at(state_dir: &Path, listen: SocketAddr, api_key: &str) -> Self {
        let mut child = Command::new(BIN)
            .args(["provider", "--listen", &listen.to_string(), "--state-dir"])
            .arg(state_dir)
            .args(["--api-key", api_key])
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn provider");
        let stdout = child.stdout.take().expect("stdout");
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).expect("provider stdout");
        let addr = line
            .trim()
            .rsplit("http://")
            .next()
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("provider did not print its address: {line:?}"));
        Self { child: Some(child), addr, api_key: api_key.to_string(), state_dir: state_dir.to_path_buf(), _tmp: None }
    }

    /// Wraps a provider process started by a test itself (e.g. with its log captured).
    pub fn adopt(child: Child, addr: SocketAddr, api_key: &str, state_dir: &Path) -> Self {
        Self { child: Some(child), addr, api_key: api_key.to_string(), state_dir: state_dir.to_path_buf(), _tmp: None }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A direct provider client (what the gateway talks to).
    pub fn client(&self) -> E2bClient {
        E2bClient::new(ProviderEndpoint {
            api_url: self.url().parse().unwrap(),
            sandbox_url: Some(self.url().parse().unwrap()),
            domain: "localhost".into(),
            api_key: Some(self.api_key.clone()),
            request_timeout: Duration::from_secs(30),
        })
        .expect("client")
    }

    /// Stops the process (sandboxes stay, to be re-adopted by a restart).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            terminate(&mut child, Duration::from_secs(10));
        }
    }

    /// Kills every sandbox (blocking; usable from Drop inside a runtime).
    pub fn kill_all_sandboxes(&self) {
        let client = self.client();
        let _ = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_all().build() else { return };
            rt.block_on(async {
                if let Ok(all) = client.list_all_sandboxes(&[]).await {
                    for sandbox in all {
                        let _ = client.kill_sandbox(&sandbox.sandbox_id).await;
                    }
                }
            });
        })
        .join();
    }
}

impl Drop for ProviderProc {
    fn drop(&mut self) {
        if self.child.is_some() {
            self.kill_all_sandboxes();
        }
        self.stop();
    }
}

/// A `sandbox-mcp serve` process with its captured log.
pub struct GatewayProc {
    pub child: Option<Child>,
    pub addr: SocketAddr,
    pub log: Arc<Mutex<String>>,
    /// State dir of the embedded provider (when `provider.kind = "local"`).
    pub state_dir: PathBuf,
    _tmp: tempfile::TempDir,
}

/// Config text for a gateway backed by a separate provider (`kind = "e2b"`).
pub fn e2b_config(provider: &ProviderProc, extra: &str) -> String {
    format!(
        "[provider]\nkind = \"e2b\"\napi_url = \"{url}\"\nsandbox_url = \"{url}\"\napi_key_env = \"TEST_PROVIDER_KEY\"\n\
         request_timeout_secs = 10\n{extra}\n",
        url = provider.url()
    )
}

impl GatewayProc {
    /// Starts `serve --config <config_text> --listen 127.0.0.1:PORT` and waits for /healthz.
    pub fn start(config_text: &str, env: &[(&str, &str)]) -> Self {
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        Self::start_on(addr, config_text, env)
    }

    /// Like [`GatewayProc::start`] on a given address (for configs that name their own URL).
    pub fn start_on(addr: SocketAddr, config_text: &str, env: &[(&str, &str)]) -> Self {
        let tmp = tempfile::tempdir().expect("tempdir");
        let config_path = tmp.path().join("config.toml");
        std::fs::write(&config_path, config_text).expect("write config");
        let mut command = Command::new(BIN);
        command
            .args(["serve", "--config"])
            .arg(&config_path)
            .args(["--listen", &addr.to_string()])
            .env("SANDBOX_MCP_SERVER__LOG_FORMAT", "json")
            .env("SANDBOX_MCP_LOCAL__STATE_DIR", tmp.path().join("state"))
            .env("RUST_LOG", "info,rmcp=warn")
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        for (k, v) in env {
            command.env(k, v);
        }
        let mut child = command.spawn().expect("spawn serve");
        let log = Arc::new(Mutex::new(String::new()));
        let stderr = child.stderr.take().expect("stderr");
        let sink = Arc::clone(&log);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if std::env::var_os("GATEWAY_TEST_LOG").is_some() {
                    eprintln!("[serve] {line}");
                }
                let mut log = sink.lock().unwrap();
                log.push_str(&line);
                log.push('\n');
            }
        });
        let state_dir = tmp.path().join("state");
        let mut gateway = Self { child: Some(child), addr, log, state_dir, _tmp: tmp };
        gateway.wait_healthy();
        gateway
    }

    /// A gateway backed by a separate `sandbox-mcp provider` (the E2B code path).
    pub fn start_e2b(provider: &ProviderProc, extra_config: &str, env: &[(&str, &str)]) -> Self {
        let mut all_env = vec![("TEST_PROVIDER_KEY", provider.api_key.as_str())];
        all_env.extend_from_slice(env);
        Self::start(&e2b_config(provider, extra_config), &all_env)
    }

    fn wait_healthy(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(mut stream) = std::net::TcpStream::connect(self.addr) {
                use std::io::{Read, Write};
                let _ = stream.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
                let mut answer = String::new();
                let _ = stream.read_to_string(&mut answer);
                if answer.starts_with("HTTP/1.1 200") {
                    return;
                }
            }
            if let Some(Ok(Some(status))) = self.child.as_mut().map(|c| c.try_wait()) {
                panic!("serve exited early with {status}; log:\n{}", self.log_text());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("serve did not become healthy; log:\n{}", self.log_text());
    }

    pub fn base(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn mcp_url(&self) -> String {
        format!("http://{}/mcp", self.addr)
    }

    pub fn log_text(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// Waits until the log contains `needle`.
    pub async fn wait_log(&self, needle: &str, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if self.log_text().contains(needle) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        false
    }

    /// Sends SIGTERM without waiting.
    pub fn signal_term(&self) {
        if let Some(child) = &self.child {
            let pid = nix::unistd::Pid::from_raw(child.id() as i32);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        }
    }

    /// SIGTERM and wait for exit; returns the exit status success.
    pub fn shutdown(&mut self) -> bool {
        let Some(mut child) = self.child.take() else { return false };
        let pid = nix::unistd::Pid::from_raw(child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(40);
        while Instant::now() < deadline {
            if let Ok(Some(status)) = child.try_wait() {
                return status.success();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
        false
    }
}

impl Drop for GatewayProc {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            terminate(&mut child, Duration::from_secs(30));
        }
    }
}

pub type McpClient = RunningService<RoleClient, ClientConfig>;

/// An MCP session (initialize done) with an optional bearer token.
pub async fn connect(url: &str, token: Option<&str>) -> McpClient {
    let mut config = StreamableHttpClientTransportConfig::with_uri(url.to_string());
    if let Some(token) = token {
        config = config.auth_header(token.to_string());
    }
    let transport = StreamableHttpClientTransport::from_config(config);
    let info = ClientConfig::new(ClientCapabilities::default(), Implementation::new("gateway-tests", "0"))
        .with_protocol_version(ProtocolVersion::V_2025_11_25);
    info.serve(transport).await.expect("MCP initialize")
}

/// Calls a tool; returns the raw result.
pub async fn call(client: &rmcp::Peer<RoleClient>, tool: &str, args: Value) -> CallToolResult {
    let Value::Object(map) = args else { panic!("arguments must be an object") };
    let request = client.call_tool(CallToolRequestParams::new(tool.to_string()).with_arguments(map));
    tokio::time::timeout(Duration::from_secs(120), request)
        .await
        .unwrap_or_else(|_| panic!("{tool}: no answer within 120 s"))
        .unwrap_or_else(|e| panic!("{tool}: protocol error {e}"))
}

/// Text content of a result.
pub fn text(result: &CallToolResult) -> String {
    result.content.iter().filter_map(|c| c.as_text().map(|t| t.text.clone())).collect::<Vec<_>>().join("\n")
}

/// Calls a tool that must succeed; returns its structured content.
pub async fn ok(client: &rmcp::Peer<RoleClient>, tool: &str, args: Value) -> Value {
    let result = call(client, tool, args).await;
    assert_ne!(result.is_error, Some(true), "{tool} failed: {}", text(&result));
    result.structured_content.clone().unwrap_or_else(|| panic!("{tool}: no structured content"))
}

/// Calls a tool that must fail; returns its error text.
pub async fn err(client: &rmcp::Peer<RoleClient>, tool: &str, args: Value) -> String {
    let result = call(client, tool, args).await;
    assert_eq!(result.is_error, Some(true), "{tool} should have failed: {:?}", result.structured_content);
    text(&result)
}

/// Ends an MCP session (the client sends DELETE).
pub async fn close(mut client: McpClient) {
    let _ = client.close_with_timeout(Duration::from_secs(10)).await;
}

/// True while the provider still knows the sandbox.
pub async fn sandbox_exists(provider: &E2bClient, id: &str) -> bool {
    match provider.get_sandbox(id).await {
        Ok(_) => true,
        Err(e) if e.is_not_found() => false,
        Err(e) => panic!("get_sandbox({id}): {e}"),
    }
}

/// Waits until the sandbox is gone from the provider.
pub async fn wait_gone(provider: &E2bClient, id: &str, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if !sandbox_exists(provider, id).await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    false
}

pub fn sha256_hex(token: &str) -> String {
    sandbox_mcp::gateway::auth::token_hash_hex(token)
}

pub fn empty() -> Value {
    json!({})
}
