//! Child processes of the tests and benches: [`ProcessGuard`] starts a command in a process group
//! of its own and stops it on drop (SIGTERM, a grace period, then SIGKILL to the whole group, and
//! reaps it); [`Log`] captures a child's output lines; [`watch`] copies a pipe into a log and
//! hands back the first line a parser accepts (the "listening on" line of `sandbox-mcp`).

use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill, killpg};
use nix::sys::wait::{Id, WaitPidFlag, waitid};
use nix::unistd::Pid;

/// The `sandbox-mcp` binary under test: cargo's for integration tests, else `$SANDBOX_MCP_BIN`, else
/// the one beside this example (`target/<profile>/examples/x` -> `target/<profile>/sandbox-mcp`).
pub fn binary() -> PathBuf {
    if let Some(bin) = option_env!("CARGO_BIN_EXE_sandbox-mcp") {
        return PathBuf::from(bin);
    }
    if let Some(bin) = std::env::var_os("SANDBOX_MCP_BIN").filter(|b| !b.is_empty()) {
        return PathBuf::from(bin);
    }
    let exe = std::env::current_exe().unwrap_or_default();
    exe.parent().and_then(|examples| examples.parent()).map(|dir| dir.join("sandbox-mcp")).unwrap_or_default()
}

/// A child process, in a process group of its own, stopped and reaped on drop.
pub struct ProcessGuard {
    child: Option<Child>,
    grace: Duration,
}

impl ProcessGuard {
    /// Spawns `command` as the leader of a new process group; `grace` is how long drop waits after SIGTERM.
    pub fn spawn(command: &mut Command, grace: Duration) -> std::io::Result<Self> {
        let child = command.process_group(0).spawn()?;
        Ok(Self { child: Some(child), grace })
    }

    /// The process id (also its process group id); 0 once stopped.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// The child itself (to take its pipes).
    pub fn child_mut(&mut self) -> Option<&mut Child> {
        self.child.as_mut()
    }

    /// True while the process has not exited.
    pub fn is_running(&mut self) -> bool {
        self.child.as_mut().is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// The exit status if the process has exited (reaped), without waiting.
    pub fn try_status(&mut self) -> Option<ExitStatus> {
        let status = self.child.as_mut()?.try_wait().ok()??;
        self.child = None;
        Some(status)
    }

    /// Sends `signal` to the process (not its group) and returns at once.
    pub fn signal(&self, signal: Signal) {
        if let Some(child) = &self.child {
            let _ = kill(Pid::from_raw(child.id() as i32), signal);
        }
    }

    /// Waits up to `timeout` for the process to exit by itself; reaps it and its group.
    pub fn wait_timeout(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let pid = Pid::from_raw(self.child.as_ref()?.id() as i32);
        let deadline = Instant::now() + timeout;
        loop {
            // WNOWAIT: the exited leader stays a zombie, so its group id cannot be reused before the
            // group's stragglers are killed.
            let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
            match waitid(Id::Pid(pid), flags) {
                Ok(nix::sys::wait::WaitStatus::StillAlive) => {}
                _ => break,
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = killpg(pid, Signal::SIGKILL);
        let mut child = self.child.take()?;
        child.wait().ok()
    }

    /// SIGTERM, up to `grace` to exit, then SIGKILL; the group's other members are killed, all reaped.
    pub fn terminate(&mut self, grace: Duration) -> Option<ExitStatus> {
        self.signal(Signal::SIGTERM);
        if let Some(status) = self.wait_timeout(grace) {
            return Some(status);
        }
        self.signal(Signal::SIGKILL);
        self.wait_timeout(Duration::from_secs(10))
    }

    /// SIGKILL to the process only (a crash: what it started in other sessions keeps running), reaped.
    pub fn kill9(&mut self) -> Option<ExitStatus> {
        let mut child = self.child.take()?;
        let _ = child.kill();
        child.wait().ok()
    }
}

impl Drop for ProcessGuard {
    fn drop(&mut self) {
        if self.child.is_some() {
            self.terminate(self.grace);
        }
    }
}

/// The captured output lines of a child process.
#[derive(Clone, Default)]
pub struct Log(Arc<Mutex<String>>);

impl Log {
    pub fn push_line(&self, line: &str) {
        let mut text = self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        text.push_str(line);
        text.push('\n');
    }

    pub fn text(&self) -> String {
        self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
    }

    pub fn contains(&self, needle: &str) -> bool {
        self.text().contains(needle)
    }

    /// Waits (async) until the log contains `needle`.
    pub async fn wait_for(&self, needle: &str, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if self.contains(needle) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        self.contains(needle)
    }
}

/// Copies the lines of `pipe` into `log` (and to stderr with `echo` as a prefix) on a thread of
/// its own; the returned channel gets the first line `find` accepts.
pub fn watch<T: Send + 'static>(
    pipe: impl Read + Send + 'static,
    log: Log,
    echo: Option<String>,
    find: impl Fn(&str) -> Option<T> + Send + 'static,
) -> mpsc::Receiver<T> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut sent = false;
        for line in BufReader::new(pipe).lines().map_while(Result::ok) {
            if let Some(prefix) = &echo {
                eprintln!("{prefix}{line}");
            }
            log.push_line(&line);
            if !sent && let Some(found) = find(&line) {
                let _ = tx.send(found);
                sent = true;
            }
        }
    });
    rx
}

/// The address in a "listening" line of `sandbox-mcp`: the provider's
/// `sandbox-mcp provider listening on http://ADDR` (stdout) or the gateway's JSON log line
/// `{"message": "sandbox-mcp gateway listening ...", "addr": "ADDR"}` (stderr).
pub fn listening_addr(line: &str) -> Option<SocketAddr> {
    if let Some(rest) = line.strip_prefix("sandbox-mcp provider listening on ") {
        return rest.trim().trim_start_matches("http://").trim_end_matches('/').parse().ok();
    }
    let value: serde_json::Value = serde_json::from_str(line).ok()?;
    let message = value.get("message").or_else(|| value.pointer("/fields/message"))?.as_str()?;
    if !message.contains("gateway listening") {
        return None;
    }
    value.get("addr").or_else(|| value.pointer("/fields/addr"))?.as_str()?.parse().ok()
}

/// Spawns `command`, copies its piped stdout and stderr into `log` (echoed to stderr with `echo`
/// as a prefix) and waits up to `timeout` for the listening address on either; on failure the
/// error holds the output.
pub fn spawn_listening(
    command: &mut Command,
    grace: Duration,
    log: &Log,
    echo: Option<String>,
    timeout: Duration,
) -> Result<(ProcessGuard, SocketAddr), String> {
    spawn_until(command, grace, log, echo, timeout, listening_addr)
}

/// Like [`spawn_listening`], waiting for the first output line that `find` accepts.
pub fn spawn_until<T: Send + 'static>(
    command: &mut Command,
    grace: Duration,
    log: &Log,
    echo: Option<String>,
    timeout: Duration,
    find: fn(&str) -> Option<T>,
) -> Result<(ProcessGuard, T), String> {
    // Named by program and arguments only: `{command:?}` would print the environment it was given.
    let name = std::iter::once(command.get_program())
        .chain(command.get_args())
        .map(|part| part.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ");
    let mut guard = ProcessGuard::spawn(command, grace).map_err(|e| format!("cannot start {name}: {e}"))?;
    let child = guard.child_mut().ok_or("no child")?;
    let (tx, found) = mpsc::channel();
    let pipes: [Option<Box<dyn Read + Send>>; 2] = [
        child.stdout.take().map(|p| Box::new(p) as Box<dyn Read + Send>),
        child.stderr.take().map(|p| Box::new(p) as Box<dyn Read + Send>),
    ];
    for pipe in pipes.into_iter().flatten() {
        let tx = tx.clone();
        let values = watch(pipe, log.clone(), echo.clone(), find);
        std::thread::spawn(move || {
            if let Ok(value) = values.recv() {
                let _ = tx.send(value);
            }
        });
    }
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if let Ok(value) = found.recv_timeout(Duration::from_millis(50)) {
            return Ok((guard, value));
        }
        if let Some(status) = guard.try_status() {
            // Let the reader threads copy the last lines.
            std::thread::sleep(Duration::from_millis(100));
            return Err(format!("{name} exited with {status} before it was ready; its output:\n{}", log.text()));
        }
    }
    Err(format!("{name} was not ready within {timeout:?}; its output:\n{}", log.text()))
}

/// VmRSS of a process in KiB (0 when it is gone).
pub fn rss_kib(pid: u32) -> u64 {
    i32::try_from(pid).ok().and_then(sandbox_mcp::procfs::rss_kib).unwrap_or(0)
}

/// Polls `condition` (blocking) every 20 ms until it holds or `timeout` passes; returns its last value.
pub fn wait_until(timeout: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if condition() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    condition()
}

/// Polls the async `condition` every 20 ms until it holds or `timeout` passes; returns its last value.
pub async fn eventually<F, Fut>(timeout: Duration, mut condition: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if condition().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    condition().await
}

/// Host processes whose command line (NULs as spaces) contains `needle`, as "PID: CMDLINE".
pub fn host_processes_with(needle: &str) -> Vec<String> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else { return found };
    for entry in entries.flatten() {
        let name = entry.file_name();
        if !name.to_string_lossy().bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        if let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) {
            let text = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            if text.contains(needle) {
                found.push(format!("{}: {}", name.to_string_lossy(), text));
            }
        }
    }
    found
}
