//! The real `sandbox-mcp provider` for the tests and benches: [`ProviderBuilder`] starts it on
//! 127.0.0.1 port 0 with a temporary state directory and reads the address it prints back;
//! [`Provider`] gives clients, stops, crashes and restarts it, and on drop kills every sandbox it
//! still has (through its API, then by the records in its state directory, so that nothing is
//! left behind even after a crash).

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sandbox_mcp::e2b::{E2bClient, ProviderEndpoint};
use serde_json::Value;

use super::process::{Log, ProcessGuard, binary, spawn_listening, wait_until};

/// The one API key of test providers (`e2b_` + 40 hex, which old E2B SDKs require).
pub const API_KEY: &str = "e2b_00000000000000000000000000000000000000aa";

/// How a provider is started.
#[derive(Clone)]
pub struct ProviderBuilder {
    bin: PathBuf,
    args: Vec<OsString>,
    state_dir: Option<PathBuf>,
    temp_in: Option<PathBuf>,
    api_key: String,
    log_filter: String,
    echo: bool,
    /// Environment variables set for the provider (on top of the test's).
    envs: Vec<(OsString, OsString)>,
}

impl Default for ProviderBuilder {
    fn default() -> Self {
        Self {
            bin: binary(),
            args: Vec::new(),
            state_dir: None,
            temp_in: None,
            api_key: API_KEY.to_string(),
            log_filter: std::env::var("PROVIDER_LOG").unwrap_or_else(|_| "warn".into()),
            echo: true,
            envs: Vec::new(),
        }
    }
}

impl ProviderBuilder {
    /// Sets an environment variable of the provider process (`PATH`, say).
    pub fn env(mut self, key: impl Into<OsString>, value: impl Into<OsString>) -> Self {
        self.envs.push((key.into(), value.into()));
        self
    }

    /// The `sandbox-mcp` binary to run (default: [`binary`]).
    pub fn bin(mut self, bin: impl Into<PathBuf>) -> Self {
        self.bin = bin.into();
        self
    }

    /// Extra provider flags.
    pub fn args<S: AsRef<std::ffi::OsStr>>(mut self, args: impl IntoIterator<Item = S>) -> Self {
        self.args.extend(args.into_iter().map(|a| a.as_ref().to_owned()));
        self
    }

    /// A state directory of the test's own (kept after drop); default: a temporary one.
    pub fn state_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.state_dir = Some(dir.into());
        self
    }

    /// Where the temporary state directory is made (default: the system's temp dir).
    pub fn temp_in(mut self, dir: impl Into<PathBuf>) -> Self {
        self.temp_in = Some(dir.into());
        self
    }

    pub fn api_key(mut self, key: &str) -> Self {
        self.api_key = key.to_string();
        self
    }

    /// `RUST_LOG` of the provider (default `$PROVIDER_LOG` or `warn`).
    pub fn log_filter(mut self, filter: &str) -> Self {
        self.log_filter = filter.to_string();
        self
    }

    /// Whether the provider's log lines are copied to stderr as well as captured (default: yes).
    pub fn echo(mut self, echo: bool) -> Self {
        self.echo = echo;
        self
    }

    /// Starts the provider (panics with its output if it does not come up).
    #[track_caller]
    pub fn start(self) -> Provider {
        self.try_start().unwrap_or_else(|e| panic!("{e}"))
    }

    /// Starts the provider; the error holds its output.
    pub fn try_start(self) -> Result<Provider, String> {
        let (tmp, state_dir) = match &self.state_dir {
            Some(dir) => (None, dir.clone()),
            None => {
                let mut builder = tempfile::Builder::new();
                builder.prefix("sandbox-mcp-test-");
                let tmp = match &self.temp_in {
                    Some(dir) => builder.tempdir_in(dir),
                    None => builder.tempdir(),
                }
                .map_err(|e| format!("temporary state directory: {e}"))?;
                let state = tmp.path().join("state");
                (Some(tmp), state)
            }
        };
        let mut provider = Provider {
            process: None,
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            api_key: self.api_key.clone(),
            state_dir,
            log: Log::default(),
            builder: self,
            _tmp: tmp,
        };
        provider.launch_on(SocketAddr::from(([127, 0, 0, 1], 0)))?;
        Ok(provider)
    }
}

/// A running `sandbox-mcp provider`.
pub struct Provider {
    process: Option<ProcessGuard>,
    /// Where it listens (control plane and envd at the same origin).
    pub addr: SocketAddr,
    pub api_key: String,
    pub state_dir: PathBuf,
    /// Its stderr (its log), captured.
    pub log: Log,
    builder: ProviderBuilder,
    _tmp: Option<tempfile::TempDir>,
}

impl Provider {
    pub fn builder() -> ProviderBuilder {
        ProviderBuilder::default()
    }

    /// A provider with default flags.
    #[track_caller]
    pub fn start() -> Self {
        Self::builder().start()
    }

    /// A provider with extra flags.
    #[track_caller]
    pub fn start_with(args: &[&str]) -> Self {
        Self::builder().args(args).start()
    }

    fn launch_on(&mut self, listen: SocketAddr) -> Result<(), String> {
        let mut command = Command::new(&self.builder.bin);
        command
            .arg("provider")
            .args(["--listen", &listen.to_string(), "--api-key", &self.api_key, "--state-dir"])
            .arg(&self.state_dir)
            .args(&self.builder.args)
            .env_remove("E2B_API_KEY")
            .env("RUST_LOG", &self.builder.log_filter)
            .envs(self.builder.envs.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let echo = self.builder.echo.then(|| "[provider] ".to_string());
        let (process, addr) =
            spawn_listening(&mut command, Duration::from_secs(10), &self.log, echo, Duration::from_secs(30))?;
        self.process = Some(process);
        self.addr = addr;
        Ok(())
    }

    /// `http://ADDR`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// `http://ADDR` followed by `path`.
    pub fn url_of(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// The process id (0 once stopped).
    pub fn pid(&self) -> u32 {
        self.process.as_ref().map_or(0, ProcessGuard::pid)
    }

    /// A provider client with the provider's key.
    pub fn client(&self) -> E2bClient {
        self.client_with_key(Some(&self.api_key))
    }

    /// A provider client with another key, or none.
    pub fn client_with_key(&self, key: Option<&str>) -> E2bClient {
        client_for(&self.url(), key).expect("provider client")
    }

    /// The process, taken out (the test signals and waits for it itself); `restart` starts another.
    pub fn take_process(&mut self) -> Option<ProcessGuard> {
        self.process.take()
    }

    /// SIGTERM and wait (sandboxes stay, to be re-adopted by a restart).
    pub fn stop(&mut self) {
        if let Some(mut process) = self.process.take() {
            process.terminate(Duration::from_secs(10));
        }
    }

    /// SIGKILL the provider process only (sandboxes keep running).
    pub fn crash(&mut self) {
        if let Some(mut process) = self.process.take() {
            process.kill9();
        }
    }

    /// Starts the provider again on the same state directory and flags, on a new port.
    #[track_caller]
    pub fn restart(&mut self) {
        self.stop();
        self.launch_on(SocketAddr::from(([127, 0, 0, 1], 0))).unwrap_or_else(|e| panic!("{e}"));
    }

    /// Starts the provider again on the same state directory, flags and address (for a gateway
    /// configured with that address).
    #[track_caller]
    pub fn restart_on_same_address(&mut self) {
        self.stop();
        let addr = self.addr;
        self.launch_on(addr).unwrap_or_else(|e| panic!("{e}"));
    }

    /// Kills every sandbox (through the API), then stops the provider.
    pub async fn shutdown(mut self) {
        kill_all_sandboxes(self.client()).await;
        self.stop();
    }

    /// Kills every sandbox through the API, blocking (usable from Drop inside a runtime).
    pub fn kill_all_sandboxes_blocking(&self) {
        let client = self.client();
        let _ = std::thread::spawn(move || {
            if let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_all().build() {
                rt.block_on(kill_all_sandboxes(client));
            }
        })
        .join();
    }
}

impl Drop for Provider {
    fn drop(&mut self) {
        if self.process.is_some() {
            self.kill_all_sandboxes_blocking();
            self.stop();
        }
        // After a crash, or sandboxes the API could not kill: by the records.
        reap_sandboxes(&self.state_dir);
    }
}

/// A provider client for a provider (control plane and envd) at `url`.
pub fn client_for(url: &str, key: Option<&str>) -> Result<E2bClient, String> {
    let origin: url::Url = url.parse().map_err(|e| format!("provider url {url:?}: {e}"))?;
    E2bClient::new(ProviderEndpoint {
        api_url: origin.clone(),
        sandbox_url: Some(origin),
        domain: "localhost".into(),
        api_key: key.map(str::to_owned),
        request_timeout: Duration::from_secs(30),
    })
    .map_err(|e| format!("provider client: {e}"))
}

/// Kills every sandbox the provider lists, until it lists none (15 s at most).
pub async fn kill_all_sandboxes(client: E2bClient) {
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

/// The argv of host process `pid` with NULs as spaces, and a space at both ends.
fn cmdline_text(pid: &str) -> Option<String> {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    Some(format!(" {} ", String::from_utf8_lossy(&cmdline).replace('\0', " ")))
}

/// The host pid of the agent (envd) of sandbox `sandbox_id` of the provider with `state_dir`,
/// found by the tag in its command line (`... envd --agent-tag TAG ...`, TAG from the sandbox
/// directory's `agent.tag`), whichever binary runs it.
pub fn agent_pid(state_dir: &Path, sandbox_id: &str) -> Option<u32> {
    let tag = std::fs::read_to_string(state_dir.join("sandboxes").join(sandbox_id).join("agent.tag")).ok()?;
    let needle = format!(" envd --agent-tag {} ", tag.trim());
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|entry| {
        let pid = entry.file_name().to_str()?.to_owned();
        cmdline_text(&pid)?.contains(&needle).then(|| pid.parse().ok())?
    })
}

/// True while `pid` is the live (not zombie) agent of the sandbox whose directory is `dir` (by
/// the tag in `dir`; once `dir` is gone, any live agent process at `pid`).
pub fn agent_alive(pid: i32, dir: &Path) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let zombie = stat.rsplit(')').next().is_some_and(|s| s.trim_start().starts_with('Z'));
    let needle = match std::fs::read_to_string(dir.join("agent.tag")) {
        Ok(tag) => format!(" envd --agent-tag {} ", tag.trim()),
        Err(_) => " envd --agent-tag ".to_owned(),
    };
    pid > 0 && !zombie && cmdline_text(&pid.to_string()).is_some_and(|c| c.contains(&needle))
}

/// Kills what a provider with `state_dir` left running (sandboxes outlive their provider by
/// design): each recorded agent that really is that sandbox's agent, then its cgroups.
pub fn reap_sandboxes(state_dir: &Path) {
    let Ok(entries) = std::fs::read_dir(state_dir.join("sandboxes")) else { return };
    for entry in entries.flatten() {
        let Ok(bytes) = std::fs::read(entry.path().join("record.json")) else { continue };
        let Ok(record) = serde_json::from_slice::<Value>(&bytes) else { continue };
        let pid = record["envd_pid"].as_i64().unwrap_or(0) as i32;
        let dir = entry.path();
        if agent_alive(pid, &dir) {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
            wait_until(Duration::from_secs(5), || !agent_alive(pid, &dir));
        }
        for cgroup in record["cgroups"].as_array().into_iter().flatten().filter_map(Value::as_str) {
            let cgroup = Path::new(cgroup);
            wait_until(Duration::from_secs(3), || std::fs::remove_dir(cgroup).is_ok() || !cgroup.exists());
        }
    }
}
