//! `process.Process` Connect RPCs: Start, Connect (server streams), List,
//! SendSignal, SendInput, CloseStdin (unary).
//!
//! Differences from E2B envd, on purpose: SendSignal and the
//! `connect-timeout-ms` kill deadline signal the process's whole process
//! group (each process gets its own group), so `bash -c` pipelines and their
//! children die with it. PTY requests are refused (unimplemented).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::HeaderMap;
use axum::response::Response;
use bytes::Bytes;
use futures_util::Stream;
use tokio::sync::mpsc;

use super::spawn::{self, SpawnError, SpawnSpec, SpawnedChild};
use super::table::{self, Attach, ProcOutput};
use crate::connect_rpc::{Code, ConnectError, FLAG_MESSAGE, encode_end_stream, encode_envelope, encode_json_message};
use crate::e2b::wire::{
    Empty, Empty2, EndEvent, ListProcessesResponse, ProcessEvent, ProcessEventMessage, ProcessRequest, ProcessSelector,
    SendInputRequest, SendSignalRequest, StartEvent, StartRequest, signal_number,
};
use crate::local::envd::EnvdState;
use crate::local::envd::files::fsops::resolve_path;
use crate::local::envd::rpc::{self, CallKind};
use crate::local::envd::users::{UserAccount, request_user};

/// Keepalive interval when the client sends no `Keepalive-Ping-Interval`.
const DEFAULT_KEEPALIVE: Duration = Duration::from_secs(90);

/// Dispatches `POST /process.Process/{method}`.
pub async fn handle(state: Arc<EnvdState>, method: String, headers: HeaderMap, body: Body) -> Response {
    let kind = match method.as_str() {
        "Start" | "Connect" => CallKind::ServerStream,
        "List" | "SendSignal" | "SendInput" | "CloseStdin" => CallKind::Unary,
        "StreamInput" | "Update" => return rpc::unimplemented(format!("process.Process/{method} is not supported")),
        _ => return rpc::unimplemented(format!("unknown method process.Process/{method}")),
    };
    rpc::serve(kind, headers, body, |headers, body| async move {
        match method.as_str() {
            "Start" => start(&state, &headers, &body).await,
            "Connect" => connect(&state, &headers, &body),
            "List" => rpc::decode_unary::<serde_json::Map<String, serde_json::Value>>(&body)
                .map(|_| rpc::unary_ok(&ListProcessesResponse { processes: state.processes.list() })),
            "SendSignal" => send_signal(&state, &body),
            "SendInput" => send_input(&state, &body).await,
            _ => close_stdin(&state, &body).await,
        }
    })
    .await
}

fn not_found(selector: &ProcessSelector) -> ConnectError {
    match (selector.pid, &selector.tag) {
        (Some(pid), _) => ConnectError::new(Code::NotFound, format!("process with pid {pid} not found")),
        (None, Some(tag)) => ConnectError::new(Code::NotFound, format!("process with tag {tag} not found")),
        (None, None) => ConnectError::new(Code::InvalidArgument, "process selector needs a pid or a tag"),
    }
}

/// A header holding a positive whole number (anything else counts as absent).
fn positive_header(headers: &HeaderMap, name: &str) -> Option<u64> {
    headers.get(name).and_then(|v| v.to_str().ok()).and_then(|v| v.trim().parse::<u64>().ok()).filter(|&n| n > 0)
}

fn keepalive_interval(headers: &HeaderMap) -> Duration {
    positive_header(headers, "keepalive-ping-interval").map(Duration::from_secs).unwrap_or(DEFAULT_KEEPALIVE)
}

fn connect_timeout(headers: &HeaderMap) -> Option<Duration> {
    positive_header(headers, "connect-timeout-ms").map(Duration::from_millis)
}

/// Resolves the working directory as file paths are resolved (`~`, relative
/// to the home, `.`/`..` removed); defaults to the home (or `/` if the home is
/// missing). It must be an existing directory.
fn working_dir(user: &UserAccount, requested: Option<&str>) -> Result<PathBuf, ConnectError> {
    let requested = requested.filter(|c| !c.is_empty());
    let Some(cwd) = requested else {
        return Ok(if user.home.is_dir() { user.home.clone() } else { PathBuf::from("/") });
    };
    let path = resolve_path(user, cwd).map_err(|err| ConnectError::new(err.code, format!("cwd: {}", err.message)))?;
    match std::fs::metadata(&path) {
        Ok(meta) if meta.is_dir() => Ok(path),
        Ok(_) => Err(ConnectError::new(Code::InvalidArgument, format!("cwd '{}' is not a directory", path.display()))),
        Err(err) => Err(ConnectError::new(Code::InvalidArgument, format!("cwd '{}': {err}", path.display()))),
    }
}

async fn start(state: &Arc<EnvdState>, headers: &HeaderMap, body: &[u8]) -> Result<Response, ConnectError> {
    let user = request_user(headers, &state.opts.default_user)?;
    let request: StartRequest = rpc::decode_stream_request(body)?;
    if request.pty.is_some() {
        return Err(ConnectError::new(Code::Unimplemented, "PTY processes are not supported by this envd"));
    }
    if request.process.cmd.is_empty() {
        return Err(ConnectError::new(Code::InvalidArgument, "process.cmd is empty"));
    }
    let cwd = working_dir(&user, request.process.cwd.as_deref())?;
    let spec = SpawnSpec {
        cmd: request.process.cmd.clone(),
        args: request.process.args.clone(),
        env: spawn::build_env(&user, &state.opts.env_vars, &request.process.envs),
        cwd,
        user,
        pipe_stdin: request.stdin.unwrap_or(true),
    };
    let reaper = state.reaper()?;
    let (child, exit) = reaper
        .spawn_registered(|| spawn::spawn(&spec), |child: &SpawnedChild| child.pid)
        .map_err(|err: SpawnError| ConnectError::new(Code::InvalidArgument, err.to_string()))?;
    let SpawnedChild { pid, stdin, stdout, stderr } = child;
    let stdin = stdin.and_then(|fd| tokio::net::unix::pipe::Sender::from_owned_fd(fd).ok());
    let (entry, events) = state.processes.insert(pid, request.process, request.tag, stdin, exit);
    tokio::spawn(table::pump_output(state.processes.clone(), entry.clone(), stdout, stderr));
    if let Some(timeout) = connect_timeout(headers) {
        table::spawn_kill_deadline(&entry, timeout);
    }
    tracing::debug!(pid, "started process");
    Ok(rpc::stream_response(event_stream(pid, Attach::Live(events), keepalive_interval(headers))))
}

fn connect(state: &Arc<EnvdState>, headers: &HeaderMap, body: &[u8]) -> Result<Response, ConnectError> {
    let request: ProcessRequest = rpc::decode_stream_request(body)?;
    let selector = request.process;
    let Some((pid, attach)) = state.processes.attach(selector.pid, selector.tag.as_deref()) else {
        return Err(not_found(&selector));
    };
    Ok(rpc::stream_response(event_stream(pid, attach, keepalive_interval(headers))))
}

fn send_signal(state: &Arc<EnvdState>, body: &[u8]) -> Result<Response, ConnectError> {
    let request: SendSignalRequest = rpc::decode_unary(body)?;
    let Some(signal) = signal_number(&request.signal) else {
        return Err(ConnectError::new(
            Code::Unimplemented,
            format!("signal {} is not supported (use SIGNAL_SIGKILL or SIGNAL_SIGTERM)", request.signal),
        ));
    };
    let entry = state.processes.running(request.process.pid, request.process.tag.as_deref());
    let Some(entry) = entry.filter(|e| e.exit.status().is_none()) else {
        return Err(not_found(&request.process));
    };
    spawn::signal_group(entry.pid, signal)
        .map_err(|err| ConnectError::new(Code::Internal, format!("signalling pid {}: {err}", entry.pid)))?;
    Ok(rpc::unary_ok(&Empty {}))
}

async fn send_input(state: &Arc<EnvdState>, body: &[u8]) -> Result<Response, ConnectError> {
    use tokio::io::AsyncWriteExt;
    let request: SendInputRequest = rpc::decode_unary(body)?;
    if request.input.pty.is_some() {
        return Err(ConnectError::new(Code::Unimplemented, "PTY input is not supported by this envd"));
    }
    let Some(entry) = state.processes.running(request.process.pid, request.process.tag.as_deref()) else {
        return Err(not_found(&request.process));
    };
    let data = request.input.stdin.unwrap_or_default();
    let mut stdin = entry.stdin.lock().await;
    let Some(writer) = stdin.as_mut() else {
        return Err(ConnectError::new(
            Code::FailedPrecondition,
            format!("stdin of pid {} is closed or was not requested (start the process with stdin=true)", entry.pid),
        ));
    };
    if let Err(err) = writer.write_all(&data).await {
        *stdin = None;
        return Err(ConnectError::new(
            Code::FailedPrecondition,
            format!("writing to stdin of pid {}: {err}", entry.pid),
        ));
    }
    Ok(rpc::unary_ok(&Empty {}))
}

async fn close_stdin(state: &Arc<EnvdState>, body: &[u8]) -> Result<Response, ConnectError> {
    let request: ProcessRequest = rpc::decode_unary(body)?;
    let Some(entry) = state.processes.running(request.process.pid, request.process.tag.as_deref()) else {
        return Err(not_found(&request.process));
    };
    if entry.stdin.lock().await.take().is_none() {
        return Err(ConnectError::new(
            Code::FailedPrecondition,
            format!("stdin of pid {} is already closed or was not requested", entry.pid),
        ));
    }
    Ok(rpc::unary_ok(&Empty {}))
}

enum Phase {
    Start(Attach),
    Live(mpsc::Receiver<ProcOutput>),
    StoredEnd(EndEvent),
    EndStream(Option<ConnectError>),
    Done,
}

fn event_frame(event: ProcessEvent) -> Bytes {
    encode_json_message(&ProcessEventMessage { event })
}

/// A data event frame, `{"event":{"data":{"<stream>":"<base64>"}}}`, built without
/// a serde pass over the (large, escape-free) base64 text.
fn data_frame(stream: &str, bytes: &[u8]) -> Bytes {
    use base64::Engine;
    let mut payload = Vec::with_capacity(40 + bytes.len().div_ceil(3) * 4);
    payload.extend_from_slice(br#"{"event":{"data":{""#);
    payload.extend_from_slice(stream.as_bytes());
    payload.extend_from_slice(br#"":""#);
    let start = payload.len();
    payload.resize(start + bytes.len().div_ceil(3) * 4, 0);
    let written = base64::engine::general_purpose::STANDARD.encode_slice(bytes, &mut payload[start..]).unwrap_or(0);
    payload.truncate(start + written);
    payload.extend_from_slice(br#""}}}"#);
    encode_envelope(FLAG_MESSAGE, &payload)
}

/// The response stream of Start/Connect: `start`, then data/keepalive, one `end`, then the end-stream frame.
fn event_stream(pid: u32, attach: Attach, keepalive: Duration) -> impl Stream<Item = Bytes> + Send + 'static {
    futures_util::stream::unfold(Phase::Start(attach), move |phase| async move {
        match phase {
            Phase::Start(attach) => {
                let next = match attach {
                    Attach::Live(rx) => Phase::Live(rx),
                    Attach::Exited(end) => Phase::StoredEnd(end),
                };
                Some((event_frame(ProcessEvent::Start(StartEvent { pid })), next))
            }
            Phase::StoredEnd(end) => Some((event_frame(ProcessEvent::End(end)), Phase::EndStream(None))),
            Phase::Live(mut rx) => {
                tokio::select! {
                    event = rx.recv() => match event {
                        Some(ProcOutput::Stdout(bytes)) => Some((data_frame("stdout", &bytes), Phase::Live(rx))),
                        Some(ProcOutput::Stderr(bytes)) => Some((data_frame("stderr", &bytes), Phase::Live(rx))),
                        Some(ProcOutput::End(end)) => Some((event_frame(ProcessEvent::End(end)), Phase::EndStream(None))),
                        None => {
                            let err = ConnectError::new(Code::Internal, format!("output of pid {pid} ended without an end event"));
                            Some((encode_end_stream(Some(&err)), Phase::Done))
                        }
                    },
                    _ = tokio::time::sleep(keepalive) => {
                        Some((event_frame(ProcessEvent::Keepalive(Empty2 {})), Phase::Live(rx)))
                    }
                }
            }
            Phase::EndStream(err) => Some((encode_end_stream(err.as_ref()), Phase::Done)),
            Phase::Done => None,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::e2b::wire::DataEvent;

    #[test]
    fn data_frames_match_the_serde_encoding() {
        for len in [0usize, 1, 2, 3, 4, 65536] {
            let bytes: Vec<u8> = (0..len).map(|i| (i * 7) as u8).collect();
            let data = DataEvent { stderr: Some(bytes.clone()), ..Default::default() };
            assert_eq!(data_frame("stderr", &bytes), event_frame(ProcessEvent::Data(data)));
        }
    }
}
