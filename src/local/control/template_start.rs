//! A stored template's start and ready commands (E2B's `set_start_cmd` and
//! `set_ready_cmd`), run by the provider at every create of a sandbox of that
//! template, over the agent's Unix socket: the start command in the
//! background (`/bin/sh -c`, as the template's user, in its workdir, with its
//! env), then the ready command tried every [`READY_POLL`] until it exits 0,
//! all bounded by `local.template_ready_timeout_secs`.
//!
//! E2B snapshots a sandbox with its start command already running and resumes
//! that snapshot at create; the local provider has no snapshots, so the start
//! command runs again at every create and the create costs the ready wait.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::e2b::wire::{ProcessConfig, ProcessEvent, StartRequest};
use crate::e2b::{CallOptions, EnvdClient, OutputLimits, ProcessStream};
use crate::local::store::{RunConfig, env_map};

/// How often the ready command is tried.
pub const READY_POLL: Duration = Duration::from_millis(150);
/// Bytes of output kept of the start command and of the last ready attempt.
const TAIL_BYTES: usize = 4096;
/// Lines of that output an error shows.
const TAIL_LINES: usize = 10;

/// Why a stored template's sandbox did not become ready.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("template '{template}': its start command `{cmd}` could not be started: {detail}")]
    Start { template: String, cmd: String, detail: String },
    #[error(
        "template '{template}': its ready command `{cmd}` did not succeed within {secs} s \
         (local.template_ready_timeout_secs); {last}{start}"
    )]
    NotReady { template: String, cmd: String, secs: u64, last: LastAttempt, start: String },
}

/// How the last try of a ready command went, when the wait for it gave up.
#[derive(Debug, thiserror::Error)]
pub enum LastAttempt {
    /// The deadline passed before a first try.
    #[error("it was never tried")]
    NeverTried,
    /// It ran to its end (or was stopped) without exiting 0: how, with its last output.
    #[error("the last attempt {0}")]
    Ended(String),
    /// No attempt finished; the last one failed to run.
    #[error("the last attempt failed: {0}")]
    Failed(crate::e2b::E2bError),
}

/// Whether `config` asks for anything at create.
pub fn has_commands(config: &RunConfig) -> bool {
    [&config.start_cmd, &config.ready_cmd].iter().any(|c| c.as_deref().is_some_and(|c| !c.trim().is_empty()))
}

/// Starts `config.start_cmd` (left running) and waits until `config.ready_cmd` exits 0, within
/// `timeout`. Without a ready command it returns once the start command has started.
pub async fn start_and_wait(
    client: &EnvdClient,
    template: &str,
    config: &RunConfig,
    timeout: Duration,
) -> Result<(), StartError> {
    let deadline = Instant::now() + timeout;
    let opts = CallOptions::user(run_user(&config.user));
    let nonempty = |c: &Option<String>| c.clone().filter(|c| !c.trim().is_empty());
    let (start_cmd, ready_cmd) = (nonempty(&config.start_cmd), nonempty(&config.ready_cmd));
    let start_tail = Arc::new(Mutex::new(Tail::default()));
    let mut pump = None;
    if let Some(cmd) = &start_cmd {
        let failed = |detail: String| StartError::Start { template: template.to_owned(), cmd: cmd.clone(), detail };
        // No stream deadline: the process outlives this call (envd keeps it when the stream closes).
        let (req, start_opts) = (request(cmd, config), opts.clone().with_timeout(Duration::ZERO));
        let stream = match tokio::time::timeout_at(deadline, client.start(&req, &start_opts)).await {
            Ok(Ok(stream)) => stream,
            Ok(Err(err)) => return Err(failed(err.to_string())),
            Err(_) => return Err(failed(format!("no answer within {} s", timeout.as_secs()))),
        };
        tracing::debug!(sandbox = client.sandbox_id(), pid = stream.pid(), "started the template's start command");
        if ready_cmd.is_none() {
            return Ok(());
        }
        pump = Some(tokio::spawn(keep_tail(stream, start_tail.clone())));
    }
    let Some(ready) = ready_cmd else { return Ok(()) };
    let outcome = poll_ready(client, &ready, config, &opts, deadline).await;
    // Dropping the stream leaves the start command running.
    if let Some(pump) = pump {
        pump.abort();
    }
    outcome.map_err(|last| {
        let start = match (&start_cmd, crate::sync::lock(&start_tail).render()) {
            (Some(_), Some(text)) => format!("; the start command {text}"),
            _ => String::new(),
        };
        StartError::NotReady { template: template.to_owned(), cmd: ready, secs: timeout.as_secs(), last, start }
    })
}

/// Tries `ready` until it exits 0 or `deadline` passes; the error describes the last attempt.
async fn poll_ready(
    client: &EnvdClient,
    ready: &str,
    config: &RunConfig,
    opts: &CallOptions,
    deadline: Instant,
) -> Result<(), LastAttempt> {
    let req = request(ready, config);
    let limits = OutputLimits { max_stdout: TAIL_BYTES, max_stderr: TAIL_BYTES };
    let mut last = LastAttempt::NeverTried;
    let mut completed = false;
    loop {
        let remaining = deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            return Err(last);
        }
        match client.run(&req, &opts.clone().with_timeout(remaining), limits).await {
            Ok(out) if out.exited && out.exit_code == 0 => return Ok(()),
            Ok(out) => {
                let mut tail = Tail::default();
                tail.push(&out.stdout);
                tail.push(&out.stderr);
                tail.end = Some(if out.exited { format!("exited with code {}", out.exit_code) } else { out.status });
                last = LastAttempt::Ended(tail.render().unwrap_or_default());
                completed = true;
            }
            // An attempt cut short by the deadline says less than the last one that finished.
            Err(err) if !completed => last = LastAttempt::Failed(err),
            Err(err) => {
                tracing::debug!(sandbox = client.sandbox_id(), err = %crate::logging::escaped(&err), "a ready attempt failed")
            }
        }
        tokio::time::sleep_until((Instant::now() + READY_POLL).min(deadline)).await;
    }
}

/// Keeps the last output of the start command while the create waits.
async fn keep_tail(mut stream: ProcessStream, tail: Arc<Mutex<Tail>>) {
    loop {
        match stream.next_event().await {
            Ok(Some(ProcessEvent::Data(data))) => {
                let mut tail = crate::sync::lock(&tail);
                for bytes in [data.stdout, data.stderr, data.pty].into_iter().flatten() {
                    tail.push(&bytes);
                }
            }
            Ok(Some(ProcessEvent::End(end))) => {
                crate::sync::lock(&tail).end =
                    Some(if end.exited { format!("exited with code {}", end.exit_code) } else { end.status });
            }
            Ok(Some(_)) => {}
            Ok(None) | Err(_) => return,
        }
    }
}

/// The last [`TAIL_BYTES`] of a command's output and how it ended.
#[derive(Debug, Default)]
struct Tail {
    bytes: Vec<u8>,
    end: Option<String>,
}

impl Tail {
    fn push(&mut self, bytes: &[u8]) {
        self.bytes.extend_from_slice(bytes);
        let excess = self.bytes.len().saturating_sub(TAIL_BYTES);
        self.bytes.drain(..excess);
    }

    /// `exited with code 1, output: ...` (the last lines), or `None` when there is nothing to say.
    fn render(&self) -> Option<String> {
        let text = String::from_utf8_lossy(&self.bytes);
        let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
        let output = lines[lines.len().saturating_sub(TAIL_LINES)..].join("\n");
        let output = (!output.is_empty()).then(|| format!("output:\n{output}"));
        match (&self.end, output) {
            (Some(end), Some(output)) => Some(format!("{end}, {output}")),
            (Some(end), None) => Some(format!("{end}, no output")),
            (None, Some(output)) => Some(format!("is running, {output}")),
            (None, None) => None,
        }
    }
}

/// `/bin/sh -c CMD` in the template's workdir (the user's home when empty) with its env.
fn request(cmd: &str, config: &RunConfig) -> StartRequest {
    StartRequest {
        process: ProcessConfig {
            cmd: "/bin/sh".into(),
            args: vec!["-c".into(), cmd.to_owned()],
            envs: env_map(&config.env),
            cwd: Some(config.workdir.clone()).filter(|w| !w.is_empty()),
        },
        stdin: Some(false),
        ..Default::default()
    }
}

/// The account a template's commands (and a build's steps) run as: the named user (an image's
/// or a build's `USER` may be `name:group` or `0`), `user` when it names none.
pub fn run_user(user: &str) -> String {
    match user.split(':').next().unwrap_or("").trim() {
        "" => "user".to_owned(),
        "0" => "root".to_owned(),
        name => name.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_run_as_the_templates_user_with_its_env_and_workdir() {
        assert_eq!(
            (run_user(""), run_user("0:0"), run_user("node:staff")),
            ("user".into(), "root".into(), "node".into())
        );
        let config = RunConfig {
            env: vec!["A=1".into(), "B=x=y".into(), "bad".into()],
            workdir: "/srv".into(),
            ..RunConfig::default()
        };
        let req = request("echo up", &config);
        assert_eq!(
            (req.process.cmd.as_str(), req.process.args.clone()),
            ("/bin/sh", vec!["-c".into(), "echo up".into()])
        );
        assert_eq!(req.process.envs.len(), 2);
        assert_eq!(req.process.envs["B"], "x=y");
        assert_eq!(req.process.cwd.as_deref(), Some("/srv"));
        assert_eq!(request("x", &RunConfig::default()).process.cwd, None);
        assert!(!has_commands(&RunConfig { start_cmd: Some("  ".into()), ..RunConfig::default() }));
        assert!(has_commands(&RunConfig { ready_cmd: Some("true".into()), ..RunConfig::default() }));
    }

    #[test]
    fn an_error_shows_the_last_lines_of_output_and_how_the_command_ended() {
        let mut tail = Tail::default();
        assert_eq!(tail.render(), None);
        for i in 0..20 {
            tail.push(format!("line {i}\n").as_bytes());
        }
        tail.push(&vec![b'x'; TAIL_BYTES - 9]);
        tail.push(b"\nthe end\n");
        assert_eq!(tail.bytes.len(), TAIL_BYTES);
        tail.end = Some("exited with code 3".into());
        let text = tail.render().unwrap();
        assert!(text.starts_with("exited with code 3, output:\n") && text.ends_with("\nthe end"), "{text}");
        assert!(!text.contains("line 0"), "{text}");
        assert_eq!(LastAttempt::NeverTried.to_string(), "it was never tried");
        let ended = LastAttempt::Ended(text.clone()).to_string();
        assert_eq!(ended, format!("the last attempt {text}"));
    }
}
