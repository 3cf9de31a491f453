//! How the task service reaches a sandbox: [`EnvdTransport`] runs the
//! supervisor through the sandbox's envd (process `Start`, the files API) as
//! `user`, and sorts a provider failure by what may have reached the sandbox
//! (not sent, uncertain, sandbox gone). It also opens a sandbox's task channel: the supervisor's
//! `channel` started with its stdin open, its output stream kept.

use std::collections::HashMap;
use std::time::Duration;

use bytes::Bytes;

use super::access::ResolvedSandbox;
use crate::connect_rpc::Code;
use crate::e2b::wire::ProcessEvent;
use crate::e2b::{CallOptions, E2bError, OutputLimits, wire};
use crate::gateway::state::Gateway;
use crate::tasks::transport::{ChannelIo, ExecOutput, FileSlice, SendInput, SupervisorTransport, TransportError};

/// The sandbox user the supervisor runs as.
const TASK_USER: &str = "user";
/// Output kept from one supervisor call (a status page is at most ~200 KB of JSON).
const SUPERVISOR_MAX_STDOUT: usize = 4 << 20;
const SUPERVISOR_MAX_STDERR: usize = 64 << 10;
/// Deadline of one write to a task channel's stdin.
const CHANNEL_SEND_TIMEOUT: Duration = Duration::from_secs(10);
/// Deadline of one direct read of a task file.
const READ_TIMEOUT: Duration = Duration::from_secs(20);

/// Runs the supervisor through the sandbox's envd (process Start, files API), as `user`.
pub(crate) struct EnvdTransport<'a> {
    pub(crate) gateway: &'a Gateway,
    pub(crate) sandbox: &'a ResolvedSandbox,
}

impl EnvdTransport<'_> {
    /// Counts the provider error and sorts it by what may have reached the sandbox. A sandbox gone is
    /// forgotten when the resulting task error is reported (`TaskError::SandboxGone`).
    fn classify(&self, err: &E2bError) -> TransportError {
        self.gateway.core.metrics.record_provider_error(err.op()); // ops (metrics)
        sort_error(err)
    }
}

/// A provider failure sorted by what may have reached the sandbox.
fn sort_error(err: &E2bError) -> TransportError {
    if err.is_sandbox_gone() {
        return TransportError::SandboxGone;
    }
    match err {
        // The request never left: nothing can have run.
        E2bError::Transport { source, .. } if source.is_connect() => TransportError::NotSent(err.to_string()),
        E2bError::Config { .. } => TransportError::NotSent(err.to_string()),
        _ => TransportError::Uncertain(err.to_string()),
    }
}

impl SupervisorTransport for EnvdTransport<'_> {
    async fn exec(
        &self,
        argv: Vec<String>,
        env: Vec<(String, String)>,
        stdin: Option<Vec<u8>>,
        timeout: Duration,
    ) -> Result<ExecOutput, TransportError> {
        let mut argv = argv.into_iter();
        let cmd = argv.next().unwrap_or_default();
        let envs: HashMap<String, String> = env.into_iter().collect();
        let request = wire::StartRequest {
            process: wire::ProcessConfig { cmd, args: argv.collect(), envs, cwd: None },
            stdin: Some(stdin.is_some()),
            ..Default::default()
        };
        let options = CallOptions::user(TASK_USER).with_timeout(timeout);
        let limits = OutputLimits { max_stdout: SUPERVISOR_MAX_STDOUT, max_stderr: SUPERVISOR_MAX_STDERR };
        let envd = &self.sandbox.envd;
        let out = match &stdin {
            Some(input) => envd.run_with_input(&request, &options, limits, input).await,
            None => envd.run(&request, &options, limits).await,
        }
        .map_err(|e| self.classify(&e))?;
        Ok(ExecOutput { exit_code: out.exit_code, stdout: out.stdout.to_vec(), stderr: out.stderr.to_vec() })
    }

    /// The channel runs with no deadline (it ends itself when idle); its output is forwarded
    /// until the process ends, its stream breaks, or the channel is dropped, and in the last two
    /// cases its stdin is closed (`CloseStdin`), which ends it.
    async fn open_channel(&self, argv: Vec<String>) -> Result<ChannelIo, TransportError> {
        let mut argv = argv.into_iter();
        let cmd = argv.next().unwrap_or_default();
        let request = wire::StartRequest {
            process: wire::ProcessConfig { cmd, args: argv.collect(), envs: HashMap::new(), cwd: None },
            stdin: Some(true),
            ..Default::default()
        };
        let options = CallOptions::user(TASK_USER).with_timeout(Duration::ZERO);
        let mut stream = self.sandbox.envd.start(&request, &options).await.map_err(|e| self.classify(&e))?;
        let pid = stream.pid();
        let (forward, output) = tokio::sync::mpsc::channel(64);
        let closer = self.sandbox.envd.clone();
        let forwarder = tokio::spawn(async move {
            let ended = loop {
                let event = tokio::select! {
                    event = stream.next_event() => event,
                    () = forward.closed() => break false,
                };
                match event {
                    Ok(Some(ProcessEvent::Data(wire::DataEvent { stdout: Some(bytes), .. }))) => {
                        if forward.send(bytes).await.is_err() {
                            break false;
                        }
                    }
                    Ok(Some(ProcessEvent::Data(_) | ProcessEvent::Start(_) | ProcessEvent::Keepalive(_))) => {}
                    Ok(Some(ProcessEvent::End(_)) | None) => break true,
                    Err(_) => break false,
                }
            };
            if !ended {
                // Given up on (it misbehaved) or out of reach (its stream broke) while it may live:
                // its stdin's end makes it exit now, with its spare, rather than when idle.
                let options = CallOptions::user(TASK_USER).with_timeout(CHANNEL_SEND_TIMEOUT);
                if let Err(err) = closer.close_stdin(pid, &options).await {
                    tracing::debug!(pid, error = %err, "could not close a dropped task channel's stdin");
                }
            }
        });
        let envd = self.sandbox.envd.clone();
        let send: SendInput = Box::new(move |data: Vec<u8>| {
            let envd = envd.clone();
            Box::pin(async move {
                let options = CallOptions::user(TASK_USER).with_timeout(CHANNEL_SEND_TIMEOUT);
                envd.send_stdin(pid, &data, &options).await.map_err(|e| match e.rpc_code() {
                    // The process is gone, or its stdin closed: no line reached it whole.
                    Some(Code::NotFound | Code::FailedPrecondition) => TransportError::NotSent(e.to_string()),
                    _ => sort_error(&e),
                })
            })
        });
        Ok(ChannelIo { send, output, forwarder: Some(forwarder) })
    }

    async fn install(&self, path: &str, content: &'static [u8]) -> Result<(), TransportError> {
        // The files API creates the parent directory; the supervisor tightens it to 0700 on first use.
        // Written aside and renamed over, so a concurrent reader never runs a half-written script.
        let options = CallOptions::user(TASK_USER);
        let tmp = format!("{path}.tmp{:016x}", rand::random::<u64>());
        let envd = &self.sandbox.envd;
        envd.write_file(&tmp, Bytes::from_static(content), &options).await.map_err(|e| self.classify(&e))?;
        envd.rename(&tmp, path, &options).await.map_err(|e| self.classify(&e))?;
        Ok(())
    }

    async fn read_range(&self, path: &str, offset: u64, len: u64) -> Result<Option<FileSlice>, TransportError> {
        let options = CallOptions::user(TASK_USER).with_timeout(READ_TIMEOUT);
        match self.sandbox.envd.read_file_range(path, offset, len, &options).await {
            Ok(range) => Ok(Some(FileSlice { data: range.data.to_vec(), size: range.size })),
            Err(err) if err.is_not_found() && !err.is_sandbox_gone() => Ok(None),
            Err(err) => Err(self.classify(&err)),
        }
    }
}
