//! HTTP plumbing shared by the control-plane and envd clients: deadlines,
//! retries (idempotent calls only, honouring `Retry-After` / `Should-Retry`
//! like the SDK), and mapping of error responses to [`E2bError`].

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use reqwest::{RequestBuilder, Response, StatusCode};
use serde::de::DeserializeOwned;
use tokio::time::Instant;

use super::error::E2bError;
use crate::connect_rpc::Code;

/// Retries after the first attempt (the SDK's default `E2B_CONNECTION_RETRIES`).
const MAX_RETRIES: u32 = 3;
/// First backoff step; doubles per attempt (with jitter).
const BACKOFF_BASE: Duration = Duration::from_millis(100);
/// A `Retry-After` longer than this is not waited for: the error is returned.
const MAX_RETRY_WAIT: Duration = Duration::from_secs(10);
/// Largest error body read (the rest is dropped).
pub(crate) const MAX_ERROR_BODY: usize = 64 * 1024;
/// Longest error message kept from a non-JSON body.
const MAX_ERROR_TEXT: usize = 512;

/// Which API answered: decides how an error status is mapped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Plane {
    Control,
    Envd,
}

/// When a failed attempt may be repeated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RetryPolicy {
    /// Never (create, process Start).
    Never,
    /// Only when the connection could not be established (the request was not sent).
    ConnectErrors,
    /// Connection errors and 429/502/503/504 (idempotent calls).
    Idempotent,
}

/// What a call is, for retries, deadlines and error messages.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CallCtx<'a> {
    pub op: &'static str,
    pub sandbox_id: Option<&'a str>,
    pub plane: Plane,
    pub retry: RetryPolicy,
    /// Whole-call deadline including retries; `None` = none.
    pub timeout: Option<Duration>,
}

impl CallCtx<'_> {
    fn sid(&self) -> Option<String> {
        self.sandbox_id.map(str::to_owned)
    }

    pub fn timeout_error(&self) -> E2bError {
        E2bError::Timeout { op: self.op, sandbox_id: self.sid(), after: self.timeout.unwrap_or_default() }
    }

    pub fn protocol(&self, detail: impl Into<String>) -> E2bError {
        E2bError::Protocol { op: self.op, sandbox_id: self.sid(), detail: detail.into() }
    }

    /// Maps a reqwest failure (send or body read).
    pub fn reqwest_error(&self, err: reqwest::Error) -> E2bError {
        if err.is_timeout() {
            self.timeout_error()
        } else if err.is_decode() {
            self.protocol(format!("cannot decode the response body: {err}"))
        } else {
            E2bError::Transport { op: self.op, sandbox_id: self.sid(), source: err }
        }
    }
}

/// Sends the request built by `build` (called once per attempt), retrying per
/// `ctx.retry` within `ctx.timeout`. Returns the response of the last attempt
/// whatever its status, except that a retried envd 502 "was not found" is
/// returned as [`E2bError::SandboxNotRunning`] at once.
pub(crate) async fn send(ctx: &CallCtx<'_>, build: impl Fn() -> RequestBuilder) -> Result<Response, E2bError> {
    let deadline = ctx.timeout.map(|t| Instant::now() + t);
    let mut attempt = 0u32;
    loop {
        let mut request = build();
        if let Some(deadline) = deadline {
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                return Err(ctx.timeout_error());
            }
            request = request.timeout(remaining);
        }
        let may_retry = attempt < MAX_RETRIES && ctx.retry != RetryPolicy::Never;
        match request.send().await {
            Err(err) if may_retry && err.is_connect() && !err.is_timeout() => {
                tracing::debug!(op = ctx.op, sandbox_id = ctx.sandbox_id, attempt, error = %err, "connect failed; retrying");
                wait(backoff(attempt), deadline, ctx).await?;
            }
            Err(err) => return Err(ctx.reqwest_error(err)),
            Ok(response) => {
                if !(may_retry && ctx.retry == RetryPolicy::Idempotent) {
                    return Ok(response);
                }
                let Some(delay) = retry_delay(&response, attempt) else {
                    return Ok(response);
                };
                if delay > MAX_RETRY_WAIT || deadline.is_some_and(|d| Instant::now() + delay >= d) {
                    return Ok(response);
                }
                let status = response.status();
                let err = error_from_response(ctx, response).await;
                if matches!(err, E2bError::SandboxNotRunning { .. }) {
                    return Err(err);
                }
                tracing::debug!(
                    op = ctx.op,
                    sandbox_id = ctx.sandbox_id,
                    attempt,
                    status = status.as_u16(),
                    ?delay,
                    "retrying"
                );
                wait(delay, deadline, ctx).await?;
            }
        }
        attempt += 1;
    }
}

async fn wait(delay: Duration, deadline: Option<Instant>, ctx: &CallCtx<'_>) -> Result<(), E2bError> {
    if deadline.is_some_and(|d| Instant::now() + delay >= d) {
        return Err(ctx.timeout_error());
    }
    tokio::time::sleep(delay).await;
    Ok(())
}

fn backoff(attempt: u32) -> Duration {
    let full = BACKOFF_BASE.saturating_mul(1 << attempt.min(6));
    full.mul_f64(0.5 + rand::random::<f64>() * 0.5)
}

/// The SDK's rule: `Should-Retry` is authoritative when present; otherwise
/// 429/502/503/504 retry. `Retry-After` (whole seconds) overrides the backoff.
fn retry_delay(response: &Response, attempt: u32) -> Option<Duration> {
    let headers = response.headers();
    match headers.get("should-retry").and_then(|v| v.to_str().ok()) {
        Some(flag) if !flag.trim().eq_ignore_ascii_case("true") => return None,
        Some(_) => {}
        None if !matches!(response.status().as_u16(), 429 | 502 | 503 | 504) => return None,
        None => {}
    }
    Some(retry_after(response).unwrap_or_else(|| backoff(attempt)))
}

fn retry_after(response: &Response) -> Option<Duration> {
    let value = response.headers().get(reqwest::header::RETRY_AFTER)?.to_str().ok()?.trim();
    if value.is_empty() || value.len() > 10 || !value.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    value.parse::<u64>().ok().map(Duration::from_secs)
}

/// Reads the body of a non-success response and maps it to an error.
pub(crate) async fn error_from_response(ctx: &CallCtx<'_>, response: Response) -> E2bError {
    let status = response.status();
    let retry_after = retry_after(&response);
    let body = match read_capped(response, MAX_ERROR_BODY).await {
        Ok((body, _)) => body,
        Err(err) => return ctx.reqwest_error(err),
    };
    error_from_parts(ctx, status, retry_after, &body)
}

/// Maps an error status + body (`{"code": int|string, "message": ...}` or text).
pub(crate) fn error_from_parts(
    ctx: &CallCtx<'_>,
    status: StatusCode,
    retry_after: Option<Duration>,
    body: &[u8],
) -> E2bError {
    let parsed: Option<serde_json::Value> = serde_json::from_slice(body).ok();
    let message =
        parsed.as_ref().and_then(|v| v.get("message")).and_then(|m| m.as_str()).map(str::to_owned).unwrap_or_else(
            || {
                let text = String::from_utf8_lossy(body);
                let text = text.trim();
                if text.is_empty() {
                    status.canonical_reason().unwrap_or("no message").to_owned()
                } else {
                    text.chars().take(MAX_ERROR_TEXT).collect()
                }
            },
        );
    let connect_code = parsed.as_ref().and_then(|v| v.get("code")).and_then(|c| c.as_str()).map(Code::parse);
    let op = ctx.op;
    let sandbox_id = ctx.sid();
    let code = status.as_u16();
    if ctx.plane == Plane::Envd && code == 502 && message.contains("was not found") {
        return E2bError::SandboxNotRunning { op, sandbox_id, message };
    }
    match (ctx.plane, code) {
        // envd (E2B's and ours) answers 401 for every credential problem (access token, signature,
        // unknown user); its 403 is Connect's permission_denied: the user may not touch that path.
        (Plane::Control, 401 | 403) | (Plane::Envd, 401) => E2bError::Auth { op, sandbox_id, status: code, message },
        (_, 429) => E2bError::RateLimited { op, sandbox_id, retry_after, message },
        (Plane::Control, 404) => E2bError::NotFound { op, sandbox_id, message },
        (Plane::Control, _) => E2bError::Api { op, sandbox_id, status: code, message },
        (Plane::Envd, _) => {
            let code = connect_code.unwrap_or_else(|| Code::from_http_status(code));
            E2bError::Rpc { op, sandbox_id, code, message }
        }
    }
}

/// Reads a whole body, failing with `Ok((_, true))` truncation flag past `cap`.
pub(crate) async fn read_capped(mut response: Response, cap: usize) -> Result<(Bytes, bool), reqwest::Error> {
    let mut out = BytesMut::new();
    while let Some(chunk) = response.chunk().await? {
        let room = cap.saturating_sub(out.len());
        if chunk.len() > room {
            out.extend_from_slice(&chunk[..room]);
            return Ok((out.freeze(), true));
        }
        out.extend_from_slice(&chunk);
    }
    Ok((out.freeze(), false))
}

/// Checks for a 2xx status and decodes the JSON body.
pub(crate) async fn read_json<T: DeserializeOwned>(ctx: &CallCtx<'_>, response: Response) -> Result<T, E2bError> {
    if !response.status().is_success() {
        return Err(error_from_response(ctx, response).await);
    }
    let body = response.bytes().await.map_err(|e| ctx.reqwest_error(e))?;
    serde_json::from_slice(&body).map_err(|e| {
        let preview: String = String::from_utf8_lossy(&body).chars().take(200).collect();
        ctx.protocol(format!("invalid JSON response ({e}): {preview}"))
    })
}

/// Checks for a 2xx status and drains the body.
pub(crate) async fn expect_success(ctx: &CallCtx<'_>, response: Response) -> Result<(), E2bError> {
    if !response.status().is_success() {
        return Err(error_from_response(ctx, response).await);
    }
    response.bytes().await.map_err(|e| ctx.reqwest_error(e))?;
    Ok(())
}
