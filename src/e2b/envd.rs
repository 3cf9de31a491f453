//! envd client of one sandbox: routing/auth headers, Connect JSON unary RPCs
//! (process control, filesystem) and `/files` download/upload. Process
//! streams live in `process.rs`.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use bytes::{Bytes, BytesMut};
use reqwest::header::{AUTHORIZATION, CONTENT_LENGTH, CONTENT_RANGE, CONTENT_TYPE, HeaderValue, RANGE};
use reqwest::{Method, RequestBuilder, Response, StatusCode};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::error::E2bError;
use super::transport::{self, CallCtx, Plane, RetryPolicy};
use super::wire::{self, ENVD_PORT, HEADER_ACCESS_TOKEN, HEADER_SANDBOX_ID, HEADER_SANDBOX_PORT};
use super::{CallOptions, Signal};
use crate::connect_rpc::{self, Code};

/// Client of one sandbox's envd. Cheap to clone.
#[derive(Clone)]
pub struct EnvdClient {
    pub(super) inner: Arc<EnvdInner>,
}

pub(super) struct EnvdInner {
    pub http: reqwest::Client,
    /// Base URL without a trailing slash.
    pub base: String,
    pub sandbox_id: String,
    pub access_token: Option<HeaderValue>,
    pub request_timeout: Duration,
}

impl std::fmt::Debug for EnvdClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EnvdClient")
            .field("sandbox_id", &self.inner.sandbox_id)
            .field("base", &self.inner.base)
            .field("access_token", &self.inner.access_token.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

/// `(URL path, op name)` of each RPC.
pub(super) mod rpc {
    pub const START: (&str, &str) = ("process.Process/Start", "process.Start");
    pub const CONNECT: (&str, &str) = ("process.Process/Connect", "process.Connect");
    pub const LIST: (&str, &str) = ("process.Process/List", "process.List");
    pub const SEND_SIGNAL: (&str, &str) = ("process.Process/SendSignal", "process.SendSignal");
    pub const SEND_INPUT: (&str, &str) = ("process.Process/SendInput", "process.SendInput");
    pub const CLOSE_STDIN: (&str, &str) = ("process.Process/CloseStdin", "process.CloseStdin");
    pub const STAT: (&str, &str) = ("filesystem.Filesystem/Stat", "filesystem.Stat");
    pub const LIST_DIR: (&str, &str) = ("filesystem.Filesystem/ListDir", "filesystem.ListDir");
    pub const MAKE_DIR: (&str, &str) = ("filesystem.Filesystem/MakeDir", "filesystem.MakeDir");
    pub const REMOVE: (&str, &str) = ("filesystem.Filesystem/Remove", "filesystem.Remove");
    pub const MOVE: (&str, &str) = ("filesystem.Filesystem/Move", "filesystem.Move");
}

/// `Authorization: Basic base64("<user>:")`, as the SDK sends the envd user.
pub(super) fn basic_auth(user: &str) -> String {
    format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(format!("{user}:")))
}

impl EnvdClient {
    pub(super) fn new(
        http: reqwest::Client,
        base: String,
        sandbox_id: String,
        access_token: Option<&str>,
        request_timeout: Duration,
    ) -> Self {
        let access_token = access_token.filter(|t| !t.is_empty()).and_then(|t| {
            let mut value = HeaderValue::from_str(t).ok()?;
            value.set_sensitive(true);
            Some(value)
        });
        Self { inner: Arc::new(EnvdInner { http, base, sandbox_id, access_token, request_timeout }) }
    }

    /// A client that reaches a local sandbox's agent directly over its Unix socket (the local
    /// provider's own calls into its sandboxes: template builds, start commands); no access
    /// token, as the agent's socket is reachable only by the provider.
    pub fn over_unix_socket(
        socket: &std::path::Path,
        sandbox_id: String,
        request_timeout: Duration,
    ) -> Result<Self, E2bError> {
        let http =
            reqwest::Client::builder().unix_socket(socket.to_path_buf()).no_proxy().http1_only().build().map_err(
                |e| E2bError::Config {
                    op: "configure_client",
                    sandbox_id: Some(sandbox_id.clone()),
                    detail: format!("cannot build a client for the agent's socket: {e}"),
                },
            )?;
        Ok(Self::new(http, "http://localhost".to_owned(), sandbox_id, None, request_timeout))
    }

    /// The sandbox this client talks to.
    pub fn sandbox_id(&self) -> &str {
        &self.inner.sandbox_id
    }

    /// The envd base URL.
    pub fn base_url(&self) -> &str {
        &self.inner.base
    }

    /// Deadline of a unary call: the option, else the endpoint's; zero = none.
    pub(super) fn unary_timeout(&self, opts: &CallOptions) -> Option<Duration> {
        let t = opts.timeout.unwrap_or(self.inner.request_timeout);
        (!t.is_zero()).then_some(t)
    }

    pub(super) fn ctx(&self, op: &'static str, retry: RetryPolicy, timeout: Option<Duration>) -> CallCtx<'_> {
        CallCtx { op, sandbox_id: Some(&self.inner.sandbox_id), plane: Plane::Envd, retry, timeout }
    }

    /// A request with the routing and access-token headers.
    pub(super) fn request(&self, method: Method, path: &str) -> RequestBuilder {
        let url = format!("{}/{}", self.inner.base, path);
        let mut request = self
            .inner
            .http
            .request(method, url)
            .header(HEADER_SANDBOX_ID, &self.inner.sandbox_id)
            .header(HEADER_SANDBOX_PORT, ENVD_PORT.to_string());
        if let Some(token) = &self.inner.access_token {
            request = request.header(HEADER_ACCESS_TOKEN, token.clone());
        }
        request
    }

    /// Adds the Connect headers common to unary and streaming RPCs.
    pub(super) fn connect_headers(
        request: RequestBuilder,
        opts: &CallOptions,
        timeout_ms: Option<u128>,
    ) -> RequestBuilder {
        let mut request = request.header("connect-protocol-version", "1");
        if let Some(ms) = timeout_ms {
            request = request.header("connect-timeout-ms", ms.to_string());
        }
        if let Some(user) = &opts.user {
            request = request.header(AUTHORIZATION, basic_auth(user));
        }
        request
    }

    async fn unary<Req: Serialize, Resp: DeserializeOwned>(
        &self,
        (path, op): (&str, &'static str),
        body: &Req,
        opts: &CallOptions,
        retry: RetryPolicy,
    ) -> Result<Resp, E2bError> {
        let ctx = self.ctx(op, retry, self.unary_timeout(opts));
        let response = self.send_unary(&ctx, path, body, opts).await?;
        transport::read_json(&ctx, response).await
    }

    /// Sends a unary call to `path` under `ctx` (its deadline, its retries): the response, whatever its status.
    async fn send_unary(
        &self,
        ctx: &CallCtx<'_>,
        path: &str,
        body: &impl Serialize,
        opts: &CallOptions,
    ) -> Result<Response, E2bError> {
        let body = Bytes::from(serde_json::to_vec(body).map_err(|e| ctx.protocol(format!("cannot encode: {e}")))?);
        transport::send(ctx, || {
            let request = self
                .request(Method::POST, path)
                .header(CONTENT_TYPE, connect_rpc::CONTENT_TYPE_UNARY_JSON)
                .body(body.clone());
            Self::connect_headers(request, opts, ctx.timeout.map(|t| t.as_millis()))
        })
        .await
    }

    /// `GET /health` of envd (2xx = running; 502 → [`E2bError::SandboxNotRunning`]).
    pub async fn health(&self) -> Result<(), E2bError> {
        let ctx = self.ctx("envd.health", RetryPolicy::Idempotent, self.unary_timeout(&CallOptions::default()));
        let response = transport::send(&ctx, || self.request(Method::GET, "health")).await?;
        transport::expect_success(&ctx, response).await
    }

    /// `process.List`: running processes started through envd.
    pub async fn list_processes(&self, opts: &CallOptions) -> Result<Vec<wire::ProcessInfo>, E2bError> {
        let response: wire::ListProcessesResponse =
            self.unary(rpc::LIST, &wire::Empty {}, opts, RetryPolicy::Idempotent).await?;
        Ok(response.processes)
    }

    /// `process.SendSignal`.
    pub async fn send_signal(&self, pid: u32, signal: Signal, opts: &CallOptions) -> Result<(), E2bError> {
        let body = wire::SendSignalRequest {
            process: wire::ProcessSelector::pid(pid),
            signal: serde_json::Value::String(signal.wire_name().to_owned()),
        };
        let _: wire::Empty = self.unary(rpc::SEND_SIGNAL, &body, opts, RetryPolicy::ConnectErrors).await?;
        Ok(())
    }

    /// `process.SendInput` with stdin bytes.
    pub async fn send_stdin(&self, pid: u32, data: &[u8], opts: &CallOptions) -> Result<(), E2bError> {
        let body = wire::SendInputRequest {
            process: wire::ProcessSelector::pid(pid),
            input: wire::ProcessInput { stdin: Some(data.to_vec()), pty: None },
        };
        let _: wire::Empty = self.unary(rpc::SEND_INPUT, &body, opts, RetryPolicy::ConnectErrors).await?;
        Ok(())
    }

    /// `process.CloseStdin`.
    pub async fn close_stdin(&self, pid: u32, opts: &CallOptions) -> Result<(), E2bError> {
        let body = wire::ProcessRequest { process: wire::ProcessSelector::pid(pid) };
        let _: wire::Empty = self.unary(rpc::CLOSE_STDIN, &body, opts, RetryPolicy::ConnectErrors).await?;
        Ok(())
    }

    /// `filesystem.Stat`.
    pub async fn stat(&self, path: &str, opts: &CallOptions) -> Result<wire::EntryInfo, E2bError> {
        let body = wire::PathRequest { path: path.to_owned() };
        let response: wire::EntryResponse = self.unary(rpc::STAT, &body, opts, RetryPolicy::Idempotent).await?;
        Ok(response.entry)
    }

    /// `filesystem.ListDir`; `depth` 0 is sent as 1 (the SDK default: direct children).
    pub async fn list_dir(&self, path: &str, depth: u32, opts: &CallOptions) -> Result<Vec<wire::EntryInfo>, E2bError> {
        let body = wire::ListDirRequest { path: path.to_owned(), depth: depth.max(1) };
        let response: wire::ListDirResponse = self.unary(rpc::LIST_DIR, &body, opts, RetryPolicy::Idempotent).await?;
        Ok(response.entries)
    }

    /// [`EnvdClient::list_dir`] that stops reading the answer past `max_bytes` (failing with
    /// [`E2bError::TooLarge`]), so a huge directory cannot grow the caller's memory.
    pub async fn list_dir_capped(
        &self,
        path: &str,
        depth: u32,
        max_bytes: u64,
        opts: &CallOptions,
    ) -> Result<Vec<wire::EntryInfo>, E2bError> {
        let body = wire::ListDirRequest { path: path.to_owned(), depth: depth.max(1) };
        let (rpc_path, op) = rpc::LIST_DIR;
        let ctx = self.ctx(op, RetryPolicy::Idempotent, self.unary_timeout(opts));
        let response = self.send_unary(&ctx, rpc_path, &body, opts).await?;
        if !response.status().is_success() {
            return Err(transport::error_from_response(&ctx, response).await);
        }
        let bytes = self.body_capped(&ctx, response, max_bytes).await?;
        let answer: wire::ListDirResponse =
            serde_json::from_slice(&bytes).map_err(|e| ctx.protocol(format!("bad ListDir answer: {e}")))?;
        Ok(answer.entries)
    }

    /// `filesystem.MakeDir` (with parents): `false` if it already existed.
    pub async fn make_dir(&self, path: &str, opts: &CallOptions) -> Result<bool, E2bError> {
        let body = wire::PathRequest { path: path.to_owned() };
        match self.unary::<_, wire::EntryResponse>(rpc::MAKE_DIR, &body, opts, RetryPolicy::ConnectErrors).await {
            Ok(_) => Ok(true),
            Err(E2bError::Rpc { code: Code::AlreadyExists, .. }) => Ok(false),
            Err(err) => Err(err),
        }
    }

    /// `filesystem.Remove` (files and directory trees).
    pub async fn remove(&self, path: &str, opts: &CallOptions) -> Result<(), E2bError> {
        let body = wire::PathRequest { path: path.to_owned() };
        let _: wire::Empty = self.unary(rpc::REMOVE, &body, opts, RetryPolicy::ConnectErrors).await?;
        Ok(())
    }

    /// `filesystem.Move`.
    pub async fn rename(&self, from: &str, to: &str, opts: &CallOptions) -> Result<wire::EntryInfo, E2bError> {
        let body = wire::MoveRequest { source: from.to_owned(), destination: to.to_owned() };
        let response: wire::EntryResponse = self.unary(rpc::MOVE, &body, opts, RetryPolicy::ConnectErrors).await?;
        Ok(response.entry)
    }

    /// `GET /files?path=`: the whole file.
    pub async fn read_file(&self, path: &str, opts: &CallOptions) -> Result<Bytes, E2bError> {
        self.read_file_limited(path, u64::MAX, opts).await
    }

    /// `GET /files?path=`, failing with [`E2bError::TooLarge`] past `max_bytes`.
    pub async fn read_file_limited(&self, path: &str, max_bytes: u64, opts: &CallOptions) -> Result<Bytes, E2bError> {
        let ctx = self.ctx("files.read", RetryPolicy::Idempotent, self.unary_timeout(opts));
        let query = file_query(path, opts);
        let response = transport::send(&ctx, || self.request(Method::GET, "files").query(&query)).await?;
        if !response.status().is_success() {
            return Err(transport::error_from_response(&ctx, response).await);
        }
        self.body_capped(&ctx, response, max_bytes).await
    }

    /// `GET /files?path=` with `Range: bytes=OFFSET-END`: at most `len` (≥ 1)
    /// bytes from `offset`, and the file's size. envd serves ranges with Go's
    /// `http.ServeContent`: 206 with `Content-Range`, or 416 `bytes */SIZE`
    /// past the end; a server that ignores the range (200) is sliced here.
    pub async fn read_file_range(
        &self,
        path: &str,
        offset: u64,
        len: u64,
        opts: &CallOptions,
    ) -> Result<FileRange, E2bError> {
        let ctx = self.ctx("files.read_range", RetryPolicy::Idempotent, self.unary_timeout(opts));
        if len == 0 {
            return Err(ctx.protocol("a range read needs a length of at least one byte"));
        }
        let query = file_query(path, opts);
        let last = offset.saturating_add(len - 1);
        let range = format!("bytes={offset}-{last}");
        let response =
            transport::send(&ctx, || self.request(Method::GET, "files").query(&query).header(RANGE, range.as_str()))
                .await?;
        let status = response.status();
        let content_range = response.headers().get(CONTENT_RANGE).and_then(|v| v.to_str().ok()).map(str::to_owned);
        match status {
            StatusCode::PARTIAL_CONTENT => {
                let Some((start, end, size)) = content_range.as_deref().and_then(parse_content_range) else {
                    return Err(ctx.protocol(format!("206 without a usable Content-Range: {content_range:?}")));
                };
                if start != offset || end < start || end > last || end >= size {
                    return Err(ctx.protocol(format!("asked for {range}, got Content-Range {content_range:?}")));
                }
                let data = self.body_capped(&ctx, response, end - start + 1).await?;
                if data.len() as u64 != end - start + 1 {
                    return Err(ctx.protocol("the range body is shorter than its Content-Range"));
                }
                Ok(FileRange { data, size })
            }
            StatusCode::RANGE_NOT_SATISFIABLE => {
                let size = content_range
                    .as_deref()
                    .and_then(|v| v.strip_prefix("bytes */"))
                    .and_then(|v| v.trim().parse::<u64>().ok())
                    .ok_or_else(|| ctx.protocol(format!("416 without a usable Content-Range: {content_range:?}")))?;
                Ok(FileRange { data: Bytes::new(), size })
            }
            StatusCode::OK => {
                let whole = self.body_capped(&ctx, response, MAX_UNRANGED_READ).await?;
                let size = whole.len() as u64;
                let start = offset.min(size) as usize;
                let end = last.saturating_add(1).min(size) as usize;
                Ok(FileRange { data: whole.slice(start..end), size })
            }
            _ => Err(transport::error_from_response(&ctx, response).await),
        }
    }

    /// A response body, failing with [`E2bError::TooLarge`] past `cap` bytes.
    async fn body_capped(
        &self,
        ctx: &CallCtx<'_>,
        mut response: reqwest::Response,
        cap: u64,
    ) -> Result<Bytes, E2bError> {
        let too_large =
            || E2bError::TooLarge { op: ctx.op, sandbox_id: Some(self.inner.sandbox_id.clone()), limit: cap };
        let declared = response.content_length();
        if declared.is_some_and(|n| n > cap) {
            return Err(too_large());
        }
        // Pre-allocate what is declared, but not more than 64 MiB on a server's word.
        let mut out = BytesMut::with_capacity(declared.unwrap_or(0).min(cap).min(64 * 1024 * 1024) as usize);
        while let Some(chunk) = response.chunk().await.map_err(|e| ctx.reqwest_error(e))? {
            if out.len() as u64 + chunk.len() as u64 > cap {
                return Err(too_large());
            }
            out.extend_from_slice(&chunk);
        }
        Ok(out.freeze())
    }

    /// `POST /files?path=` as `multipart/form-data` (field `file`), like the SDK;
    /// creates parent directories and overwrites.
    pub async fn write_file(
        &self,
        path: &str,
        data: Bytes,
        opts: &CallOptions,
    ) -> Result<wire::UploadedEntry, E2bError> {
        let ctx = self.ctx("files.write", RetryPolicy::ConnectErrors, self.unary_timeout(opts));
        let query = file_query(path, opts);
        let (content_type, body) = multipart_body(path, &data);
        let response = transport::send(&ctx, || {
            self.request(Method::POST, "files")
                .query(&query)
                .header(CONTENT_TYPE, content_type.as_str())
                .header(CONTENT_LENGTH, body.len())
                .body(body.clone())
        })
        .await?;
        let entries: Vec<wire::UploadedEntry> = transport::read_json(&ctx, response).await?;
        entries.into_iter().next().ok_or_else(|| ctx.protocol("upload response lists no file"))
    }
}

/// Largest whole file accepted when a server ignores a range request (200):
/// past it the read fails with [`E2bError::TooLarge`].
const MAX_UNRANGED_READ: u64 = 16 * 1024 * 1024;

/// Part of a file and the file's total size ([`EnvdClient::read_file_range`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileRange {
    pub data: Bytes,
    pub size: u64,
}

/// `bytes START-END/SIZE` → `(start, end, size)` (a `*` size is refused).
fn parse_content_range(value: &str) -> Option<(u64, u64, u64)> {
    let rest = value.trim().strip_prefix("bytes ")?;
    let (span, size) = rest.split_once('/')?;
    let (start, end) = span.split_once('-')?;
    Some((start.trim().parse().ok()?, end.trim().parse().ok()?, size.trim().parse().ok()?))
}

fn file_query(path: &str, opts: &CallOptions) -> Vec<(&'static str, String)> {
    let mut query = vec![("path", path.to_owned())];
    if let Some(user) = &opts.user {
        query.push(("username", user.clone()));
    }
    query
}

/// One-part `multipart/form-data` body (field `file`, filename = target path).
fn multipart_body(path: &str, data: &[u8]) -> (String, Bytes) {
    let boundary = format!("sandbox-mcp-{:032x}", rand::random::<u128>());
    let filename: String = path
        .chars()
        .map(|c| match c {
            '"' => "%22".to_owned(),
            '\r' => "%0D".to_owned(),
            '\n' => "%0A".to_owned(),
            c => c.to_string(),
        })
        .collect();
    let head = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{filename}\"\r\n\
         Content-Type: application/octet-stream\r\n\r\n"
    );
    let tail = format!("\r\n--{boundary}--\r\n");
    let mut body = BytesMut::with_capacity(head.len() + data.len() + tail.len());
    body.extend_from_slice(head.as_bytes());
    body.extend_from_slice(data);
    body.extend_from_slice(tail.as_bytes());
    (format!("multipart/form-data; boundary={boundary}"), body.freeze())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_range_is_parsed() {
        assert_eq!(parse_content_range("bytes 0-99/100"), Some((0, 99, 100)));
        assert_eq!(parse_content_range("bytes 5-5/6"), Some((5, 5, 6)));
        assert_eq!(parse_content_range("bytes */100"), None);
        assert_eq!(parse_content_range("items 0-1/2"), None);
        assert_eq!(parse_content_range("bytes 0-1/*"), None);
    }

    #[test]
    fn basic_auth_matches_the_sdk() {
        assert_eq!(basic_auth("root"), "Basic cm9vdDo=");
    }

    #[test]
    fn multipart_has_one_file_part() {
        let (ct, body) = multipart_body("/tmp/a\"b.txt", b"hello");
        let boundary = ct.strip_prefix("multipart/form-data; boundary=").unwrap();
        let text = String::from_utf8(body.to_vec()).unwrap();
        assert!(text.starts_with(&format!("--{boundary}\r\n")));
        assert!(text.contains("name=\"file\"; filename=\"/tmp/a%22b.txt\""));
        assert!(text.ends_with(&format!("\r\n\r\nhello\r\n--{boundary}--\r\n")));
    }
}
