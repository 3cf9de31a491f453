//! Process streams over envd's server-streaming Connect RPCs (`Start`,
//! `Connect`): envelopes are decoded incrementally from the body as it
//! arrives; `run` collects a command's output with caps (`run_with_input` after
//! writing bytes to its stdin).
//!
//! Deadlines: the stream's deadline (see the module docs of `e2b`) is enforced
//! here, and sent to envd as `connect-timeout-ms` plus [`ENVD_KILL_GRACE`], so
//! envd kills a process whose client has given up. `run` also kills the
//! process itself (SIGKILL) when its deadline passes.

use std::pin::Pin;
use std::time::Duration;

use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use reqwest::Method;
use reqwest::header::CONTENT_TYPE;
use serde::Serialize;
use tokio::time::Instant;

use super::envd::{EnvdClient, rpc};
use super::error::E2bError;
use super::transport::{self, CallCtx, RetryPolicy};
use super::wire::{self, ProcessEvent};
use super::{CallOptions, DEFAULT_COMMAND_TIMEOUT, Signal};
use crate::connect_rpc::{self, Code, EnvelopeDecoder};

/// Extra time envd gives a process past the client's deadline before killing it.
pub const ENVD_KILL_GRACE: Duration = Duration::from_secs(2);
/// How long a finished stream waits for the end of its HTTP body (see `release_connection`).
const TRAILER_GRACE: Duration = Duration::from_millis(100);
/// Keepalive interval asked of envd (seconds), as the SDK does.
const KEEPALIVE_PING_INTERVAL_SECS: &str = "50";

/// Caps on the output `run` keeps (it keeps counting past them).
#[derive(Debug, Clone, Copy)]
pub struct OutputLimits {
    pub max_stdout: usize,
    pub max_stderr: usize,
}

impl OutputLimits {
    /// Keep everything.
    pub fn unlimited() -> Self {
        Self { max_stdout: usize::MAX, max_stderr: usize::MAX }
    }
}

impl Default for OutputLimits {
    /// 1 MiB of each stream.
    fn default() -> Self {
        Self { max_stdout: 1 << 20, max_stderr: 1 << 20 }
    }
}

/// Result of [`EnvdClient::run`].
#[derive(Debug, Clone, Default)]
pub struct CommandOutput {
    pub pid: u32,
    /// Exit code; -1 when killed by a signal.
    pub exit_code: i32,
    /// True if the process exited normally (false: killed by a signal).
    pub exited: bool,
    /// envd's status text (`exit status 3`, `signal: killed`).
    pub status: String,
    pub error: Option<String>,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    /// Bytes the process wrote, including those past the cap.
    pub stdout_total: u64,
    pub stderr_total: u64,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
}

type BodyStream = Pin<Box<dyn Stream<Item = reqwest::Result<Bytes>> + Send>>;

/// A live `Start`/`Connect` stream. The `start` event is consumed when it is
/// opened (see [`ProcessStream::pid`]); keepalives are skipped.
pub struct ProcessStream {
    pid: u32,
    op: &'static str,
    sandbox_id: String,
    body: BodyStream,
    decoder: EnvelopeDecoder,
    deadline: Option<Instant>,
    timeout: Option<Duration>,
    saw_end_event: bool,
    finished: bool,
}

impl std::fmt::Debug for ProcessStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessStream").field("pid", &self.pid).field("sandbox_id", &self.sandbox_id).finish()
    }
}

impl ProcessStream {
    /// pid from the `start` event.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The sandbox the process runs in.
    pub fn sandbox_id(&self) -> &str {
        &self.sandbox_id
    }

    fn protocol(&self, detail: impl Into<String>) -> E2bError {
        E2bError::Protocol { op: self.op, sandbox_id: Some(self.sandbox_id.clone()), detail: detail.into() }
    }

    fn timeout_error(&self) -> E2bError {
        E2bError::Timeout {
            op: self.op,
            sandbox_id: Some(self.sandbox_id.clone()),
            after: self.timeout.unwrap_or_default(),
        }
    }

    /// Reads the HTTP body past the end-stream frame to its end, so that the connection goes back to
    /// the pool instead of being closed (a body dropped before its end costs the next call a new
    /// connection: before this, one call in four through the local provider paid for one). The chunked
    /// terminator is often still on its way (through a proxy it comes in a packet of its own); waiting
    /// for it here measured faster than leaving it to a background task. Bounded by [`TRAILER_GRACE`];
    /// anything after the end-stream frame is ignored.
    async fn release_connection(&mut self) {
        let drain = async { while let Some(Ok(_)) = self.body.next().await {} };
        let _ = tokio::time::timeout(TRAILER_GRACE, drain).await;
    }

    /// Next event (`data` or `end`); `Ok(None)` once the stream has ended
    /// cleanly. An end-stream error frame is returned as [`E2bError::Rpc`].
    pub async fn next_event(&mut self) -> Result<Option<ProcessEvent>, E2bError> {
        loop {
            if self.finished {
                return Ok(None);
            }
            let envelope = self.decoder.next_envelope().map_err(|e| {
                self.finished = true;
                self.protocol(e.to_string())
            })?;
            if let Some(envelope) = envelope {
                if envelope.is_end_stream() {
                    self.finished = true;
                    self.release_connection().await;
                    let end: connect_rpc::EndStream = serde_json::from_slice(&envelope.payload)
                        .map_err(|e| self.protocol(format!("invalid end-stream frame: {e}")))?;
                    return match end.error {
                        Some(err) => Err(E2bError::Rpc {
                            op: self.op,
                            sandbox_id: Some(self.sandbox_id.clone()),
                            code: err.code,
                            message: err.message,
                        }),
                        None => Ok(None),
                    };
                }
                let message: wire::ProcessEventMessage = serde_json::from_slice(&envelope.payload).map_err(|e| {
                    let preview: String = String::from_utf8_lossy(&envelope.payload).chars().take(200).collect();
                    self.protocol(format!("invalid process event ({e}): {preview}"))
                })?;
                match message.event {
                    ProcessEvent::Keepalive(_) => continue,
                    ProcessEvent::End(end) => {
                        self.saw_end_event = true;
                        return Ok(Some(ProcessEvent::End(end)));
                    }
                    other => return Ok(Some(other)),
                }
            }
            let chunk = match self.deadline {
                Some(deadline) => match tokio::time::timeout_at(deadline, self.body.next()).await {
                    Ok(chunk) => chunk,
                    Err(_) => {
                        self.finished = true;
                        return Err(self.timeout_error());
                    }
                },
                None => self.body.next().await,
            };
            match chunk {
                Some(Ok(bytes)) => self.decoder.push(&bytes),
                Some(Err(err)) => {
                    self.finished = true;
                    let ctx = CallCtx {
                        op: self.op,
                        sandbox_id: Some(&self.sandbox_id),
                        plane: transport::Plane::Envd,
                        retry: RetryPolicy::Never,
                        timeout: self.timeout,
                    };
                    return Err(ctx.reqwest_error(err));
                }
                None => {
                    self.finished = true;
                    self.decoder.finish().map_err(|e| self.protocol(e.to_string()))?;
                    if self.saw_end_event {
                        // Tolerated like the SDK: EOF after `end` without the end-stream frame.
                        return Ok(None);
                    }
                    return Err(self.protocol("stream ended before the process end event"));
                }
            }
        }
    }
}

impl EnvdClient {
    /// Deadline of a process stream: the option, else 60 s; zero = none.
    fn stream_timeout(opts: &CallOptions) -> Option<Duration> {
        let t = opts.timeout.unwrap_or(DEFAULT_COMMAND_TIMEOUT);
        (!t.is_zero()).then_some(t)
    }

    async fn open_stream<Req: Serialize>(
        &self,
        (path, op): (&str, &'static str),
        body: &Req,
        opts: &CallOptions,
        retry: RetryPolicy,
    ) -> Result<ProcessStream, E2bError> {
        let timeout = Self::stream_timeout(opts);
        let deadline = timeout.map(|t| Instant::now() + t);
        // The response head must arrive within the stream deadline, or the
        // unary timeout when the stream has none.
        let head_timeout = timeout.or_else(|| self.unary_timeout(&CallOptions::default()));
        let ctx = self.ctx(op, retry, None);
        let frame = connect_rpc::encode_json_message(body);
        let envd_ms = timeout.map(|t| (t + ENVD_KILL_GRACE).as_millis());
        let send = transport::send(&ctx, || {
            let request = self
                .request(Method::POST, path)
                .header(CONTENT_TYPE, connect_rpc::CONTENT_TYPE_STREAM_JSON)
                .header("connect-content-encoding", "identity")
                .header("connect-accept-encoding", "identity")
                .header("keepalive-ping-interval", KEEPALIVE_PING_INTERVAL_SECS)
                .body(frame.clone());
            Self::connect_headers(request, opts, envd_ms)
        });
        let response = match head_timeout {
            Some(t) => tokio::time::timeout(t, send).await.map_err(|_| E2bError::Timeout {
                op,
                sandbox_id: Some(self.sandbox_id().to_owned()),
                after: t,
            })??,
            None => send.await?,
        };
        let ctx = self.ctx(op, retry, timeout);
        if !response.status().is_success() {
            return Err(transport::error_from_response(&ctx, response).await);
        }
        let content_type = response.headers().get(CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
        if !content_type.starts_with(connect_rpc::CONTENT_TYPE_STREAM_JSON) {
            if content_type.starts_with("application/json") {
                // Some proxies answer a Connect error as unary JSON with 200 (read as any error body: capped).
                let (body, _) = transport::read_capped(response, transport::MAX_ERROR_BODY)
                    .await
                    .map_err(|e| ctx.reqwest_error(e))?;
                return Err(transport::error_from_parts(&ctx, reqwest::StatusCode::INTERNAL_SERVER_ERROR, None, &body));
            }
            return Err(ctx.protocol(format!("unexpected content type {content_type:?} for a stream")));
        }
        let mut stream = ProcessStream {
            pid: 0,
            op,
            sandbox_id: self.sandbox_id().to_owned(),
            body: Box::pin(response.bytes_stream()),
            decoder: EnvelopeDecoder::new(),
            deadline,
            timeout,
            saw_end_event: false,
            finished: false,
        };
        match stream.next_event().await? {
            Some(ProcessEvent::Start(start)) => {
                stream.pid = start.pid;
                Ok(stream)
            }
            Some(other) => Err(stream.protocol(format!("expected the start event, got {other:?}"))),
            None => Err(stream.protocol("stream ended before the start event")),
        }
    }

    /// `process.Start`: starts a process and streams its events. Never retried.
    pub async fn start(&self, req: &wire::StartRequest, opts: &CallOptions) -> Result<ProcessStream, E2bError> {
        self.open_stream(rpc::START, req, opts, RetryPolicy::Never).await
    }

    /// `process.Connect`: attaches to a running process (live output only).
    pub async fn connect_process(&self, pid: u32, opts: &CallOptions) -> Result<ProcessStream, E2bError> {
        let body = wire::ProcessRequest { process: wire::ProcessSelector::pid(pid) };
        self.open_stream(rpc::CONNECT, &body, opts, RetryPolicy::ConnectErrors).await
    }

    /// Starts a command and collects its output until it ends. Output past the
    /// caps is counted, not kept. When the deadline passes the process is
    /// killed and [`E2bError::Timeout`] returned.
    pub async fn run(
        &self,
        req: &wire::StartRequest,
        opts: &CallOptions,
        limits: OutputLimits,
    ) -> Result<CommandOutput, E2bError> {
        let stream = self.start(req, opts).await?;
        self.collect(stream, opts, limits).await
    }

    /// [`EnvdClient::run`] for a process started with `stdin: true`: writes `input` to its stdin
    /// (`SendInput`; stdin is left open) before collecting its output. The output is collected
    /// even when the input could not be sent: the process may have ended before reading it (a
    /// missing program), or must notice itself that nothing arrived; what it says decides.
    pub async fn run_with_input(
        &self,
        req: &wire::StartRequest,
        opts: &CallOptions,
        limits: OutputLimits,
        input: &[u8],
    ) -> Result<CommandOutput, E2bError> {
        let stream = self.start(req, opts).await?;
        if let Err(err) = self.send_stdin(stream.pid(), input, opts).await {
            tracing::debug!(sandbox_id = self.sandbox_id(), pid = stream.pid(), error = %err, "cannot write to the process's stdin");
        }
        self.collect(stream, opts, limits).await
    }

    /// Reads a started process's events until it ends (see [`EnvdClient::run`]).
    async fn collect(
        &self,
        mut stream: ProcessStream,
        opts: &CallOptions,
        limits: OutputLimits,
    ) -> Result<CommandOutput, E2bError> {
        let mut out = CommandOutput { pid: stream.pid(), ..Default::default() };
        let mut ended = false;
        loop {
            match stream.next_event().await {
                Ok(Some(ProcessEvent::Data(data))) => {
                    if let Some(bytes) = data.stdout.or(data.pty) {
                        append(
                            &mut out.stdout,
                            &mut out.stdout_total,
                            &mut out.stdout_truncated,
                            &bytes,
                            limits.max_stdout,
                        );
                    }
                    if let Some(bytes) = data.stderr {
                        append(
                            &mut out.stderr,
                            &mut out.stderr_total,
                            &mut out.stderr_truncated,
                            &bytes,
                            limits.max_stderr,
                        );
                    }
                }
                Ok(Some(ProcessEvent::End(end))) => {
                    ended = true;
                    out.exit_code = end.exit_code;
                    out.exited = end.exited;
                    out.status = end.status;
                    out.error = end.error.filter(|e| !e.is_empty());
                }
                Ok(Some(ProcessEvent::Start(_) | ProcessEvent::Keepalive(_))) => {}
                Ok(None) => break,
                Err(err) if ended => {
                    // The process finished; a broken trailer does not change its result.
                    tracing::debug!(sandbox_id = self.sandbox_id(), pid = out.pid, error = %err, "error after the end event");
                    break;
                }
                Err(err @ (E2bError::Timeout { .. } | E2bError::Rpc { code: Code::DeadlineExceeded, .. })) => {
                    let kill_opts = CallOptions { user: opts.user.clone(), timeout: Some(Duration::from_secs(5)) };
                    if let Err(kill_err) = self.send_signal(out.pid, Signal::Kill, &kill_opts).await {
                        tracing::debug!(sandbox_id = self.sandbox_id(), pid = out.pid, error = %kill_err, "kill after timeout failed");
                    }
                    return Err(match err {
                        E2bError::Timeout { .. } => err,
                        _ => E2bError::Timeout {
                            op: rpc::START.1,
                            sandbox_id: Some(self.sandbox_id().to_owned()),
                            after: Self::stream_timeout(opts).unwrap_or_default(),
                        },
                    });
                }
                Err(err) => return Err(err),
            }
        }
        if !ended {
            return Err(stream.protocol("stream ended without the process end event"));
        }
        Ok(out)
    }
}

fn append(buf: &mut Vec<u8>, total: &mut u64, truncated: &mut bool, bytes: &[u8], cap: usize) {
    *total += bytes.len() as u64;
    let room = cap.saturating_sub(buf.len());
    if bytes.len() > room {
        *truncated = true;
    }
    buf.extend_from_slice(&bytes[..bytes.len().min(room)]);
}
