//! A private `redis-server` for the session-store tests and the gateway bench: on a loopback
//! port (redis-server cannot report a port 0 binding, so a collision starts it on another port),
//! its data in a temporary directory, stopped on drop.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::gateway::with_free_port;
use super::process::ProcessGuard;

pub struct Redis {
    process: Option<ProcessGuard>,
    pub port: u16,
    persistent: bool,
    dir: tempfile::TempDir,
}

impl Redis {
    /// Starts a redis-server; `persistent` keeps its data in an append-only file synced on every
    /// write (it survives [`stop`](Self::stop) + [`spawn`](Self::spawn)), else in memory only.
    #[track_caller]
    pub fn start(persistent: bool) -> Self {
        with_free_port(|port| {
            let dir = tempfile::tempdir().map_err(|e| format!("tempdir: {e}"))?;
            let mut redis = Self { process: None, port, persistent, dir };
            redis.spawn().map(|()| redis)
        })
    }

    /// Starts redis-server on `self.port`; the error holds its log (a port collision among others).
    pub fn spawn(&mut self) -> Result<(), String> {
        let log = self.dir.path().join("redis.log");
        let _ = std::fs::remove_file(&log);
        let mut command = Command::new("redis-server");
        command.args(["--bind", "127.0.0.1", "--port", &self.port.to_string(), "--save", "", "--protected-mode", "no"]);
        if self.persistent {
            command.args(["--appendonly", "yes", "--appendfsync", "always"]);
        } else {
            command.args(["--appendonly", "no"]);
        }
        command.arg("--logfile").arg(&log).arg("--dir").arg(self.dir.path());
        command.stdout(Stdio::null()).stderr(Stdio::null());
        let mut process = ProcessGuard::spawn(&mut command, Duration::from_secs(10))
            .map_err(|e| format!("cannot start redis-server: {e}"))?;
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            // Our server (not another one that took the port first) answers.
            if process.is_running() && self.cli(&["INFO", "server"]).contains(&format!("process_id:{}", process.pid()))
            {
                self.process = Some(process);
                return Ok(());
            }
            if let Some(status) = process.try_status() {
                let text = std::fs::read_to_string(&log).unwrap_or_default();
                return Err(format!("redis-server exited with {status}:\n{text}"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(format!("redis-server did not start on port {}", self.port))
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Runs a command with redis-cli and returns the reply text.
    pub fn cli(&self, args: &[&str]) -> String {
        let output = Command::new("redis-cli").args(["-p", &self.port.to_string()]).args(args).output();
        match output {
            Ok(out) => String::from_utf8_lossy(&out.stdout).to_string(),
            Err(_) => String::new(),
        }
    }

    /// Stops the server (with `persistent`, its data stays in the append-only file).
    pub fn stop(&mut self) {
        if let Some(mut process) = self.process.take() {
            process.terminate(Duration::from_secs(10));
        }
    }
}
