//! Errors of the provider client. Every variant names the operation and, when
//! there is one, the sandbox, so a message alone says what failed where.
//! Messages never contain the API key or the envd access token.

use std::time::Duration;

use crate::connect_rpc::Code;

/// Error of any provider-client call.
#[derive(Debug, thiserror::Error)]
pub enum E2bError {
    /// The sandbox (control plane 404) or an envd resource (file, process) does not exist.
    #[error("{op}{}: not found: {message}", on(.sandbox_id))]
    NotFound { op: &'static str, sandbox_id: Option<String>, message: String },
    /// envd answered 502 "... was not found": the sandbox is gone or not running.
    #[error("{op}{}: sandbox is not running: {message}", on(.sandbox_id))]
    SandboxNotRunning { op: &'static str, sandbox_id: Option<String>, message: String },
    /// Control plane 401/403 (bad API key), envd 401 (bad access token, signature or envd user).
    /// envd's 403 is not this but `Rpc` with `permission_denied` (see [`E2bError::is_permission_denied`]).
    #[error("{op}{}: authentication failed (HTTP {status}): {message}", on(.sandbox_id))]
    Auth { op: &'static str, sandbox_id: Option<String>, status: u16, message: String },
    /// 429 (after the retries, if the call retries).
    #[error("{op}{}: rate limited: {message}", on(.sandbox_id))]
    RateLimited { op: &'static str, sandbox_id: Option<String>, retry_after: Option<Duration>, message: String },
    /// Any other control-plane HTTP error.
    #[error("{op}{}: provider API error (HTTP {status}): {message}", on(.sandbox_id))]
    Api { op: &'static str, sandbox_id: Option<String>, status: u16, message: String },
    /// An envd Connect error (unary error body or end-stream error).
    #[error("{op}{}: {}: {message}", on(.sandbox_id), .code.as_str())]
    Rpc { op: &'static str, sandbox_id: Option<String>, code: Code, message: String },
    /// The call's deadline passed.
    #[error("{op}{}: timed out after {}", on(.sandbox_id), secs(.after))]
    Timeout { op: &'static str, sandbox_id: Option<String>, after: Duration },
    /// Connection, TLS or I/O failure.
    #[error("{op}{}: transport error: {}", on(.sandbox_id), chain(.source))]
    Transport {
        op: &'static str,
        sandbox_id: Option<String>,
        #[source]
        source: reqwest::Error,
    },
    /// The peer broke the protocol (bad JSON, truncated envelope, missing start event, ...).
    #[error("{op}{}: protocol error: {detail}", on(.sandbox_id))]
    Protocol { op: &'static str, sandbox_id: Option<String>, detail: String },
    /// The client was configured with an unusable value (bad URL, key with control characters).
    #[error("{op}{}: invalid configuration: {detail}", on(.sandbox_id))]
    Config { op: &'static str, sandbox_id: Option<String>, detail: String },
    /// A download was larger than the caller's limit.
    #[error("{op}{}: content exceeds the limit of {limit} bytes", on(.sandbox_id))]
    TooLarge { op: &'static str, sandbox_id: Option<String>, limit: u64 },
}

fn on(sandbox_id: &Option<String>) -> String {
    match sandbox_id {
        Some(id) => format!(" (sandbox {id})"),
        None => String::new(),
    }
}

fn secs(d: &Duration) -> String {
    format!("{:.3}s", d.as_secs_f64())
}

fn chain(err: &reqwest::Error) -> String {
    let mut text = err.to_string();
    let mut source = std::error::Error::source(err);
    while let Some(inner) = source {
        let inner_text = inner.to_string();
        if !text.contains(&inner_text) {
            text.push_str(": ");
            text.push_str(&inner_text);
        }
        source = inner.source();
    }
    text
}

impl E2bError {
    /// The operation that failed (`create_sandbox`, `process.Start`, ...).
    pub fn op(&self) -> &'static str {
        self.context().0
    }

    /// The sandbox concerned, if any.
    pub fn sandbox_id(&self) -> Option<&str> {
        self.context().1
    }

    /// What every variant records: the operation and the sandbox concerned.
    fn context(&self) -> (&'static str, Option<&str>) {
        match self {
            E2bError::NotFound { op, sandbox_id, .. }
            | E2bError::SandboxNotRunning { op, sandbox_id, .. }
            | E2bError::Auth { op, sandbox_id, .. }
            | E2bError::RateLimited { op, sandbox_id, .. }
            | E2bError::Api { op, sandbox_id, .. }
            | E2bError::Rpc { op, sandbox_id, .. }
            | E2bError::Timeout { op, sandbox_id, .. }
            | E2bError::Transport { op, sandbox_id, .. }
            | E2bError::Protocol { op, sandbox_id, .. }
            | E2bError::Config { op, sandbox_id, .. }
            | E2bError::TooLarge { op, sandbox_id, .. } => (op, sandbox_id.as_deref()),
        }
    }

    /// True for anything "not found": the sandbox (control plane), a sandbox
    /// gone on the data plane, or an envd resource (`Rpc` with `not_found`).
    pub fn is_not_found(&self) -> bool {
        matches!(
            self,
            E2bError::NotFound { .. } | E2bError::SandboxNotRunning { .. } | E2bError::Rpc { code: Code::NotFound, .. }
        )
    }

    /// True when envd refused a path to the user it acts as (file mode, ownership): HTTP 403 on
    /// `/files`, or Connect's `permission_denied`.
    pub fn is_permission_denied(&self) -> bool {
        matches!(self, E2bError::Rpc { code: Code::PermissionDenied, .. })
    }

    /// True when the sandbox itself is gone (control-plane 404 or envd 502 "was not found").
    pub fn is_sandbox_gone(&self) -> bool {
        matches!(self, E2bError::NotFound { .. } | E2bError::SandboxNotRunning { .. })
    }

    /// True when trying again later may succeed.
    pub fn is_transient(&self) -> bool {
        match self {
            E2bError::RateLimited { .. } | E2bError::Timeout { .. } => true,
            E2bError::Transport { source, .. } => source.is_connect() || source.is_timeout() || source.is_request(),
            E2bError::Api { status, .. } => matches!(status, 502..=504),
            E2bError::Rpc { code, .. } => matches!(code, Code::Unavailable | Code::ResourceExhausted | Code::Aborted),
            _ => false,
        }
    }

    /// The Connect code if this is an envd RPC error.
    pub fn rpc_code(&self) -> Option<Code> {
        match self {
            E2bError::Rpc { code, .. } => Some(*code),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_the_op_and_the_sandbox() {
        let err = E2bError::Rpc {
            op: "filesystem.Stat",
            sandbox_id: Some("sbx1".into()),
            code: Code::NotFound,
            message: "no such file".into(),
        };
        assert_eq!(err.to_string(), "filesystem.Stat (sandbox sbx1): not_found: no such file");
        assert!(err.is_not_found());
        assert!(!err.is_sandbox_gone());
        let err = E2bError::Timeout { op: "create_sandbox", sandbox_id: None, after: Duration::from_millis(1500) };
        assert_eq!(err.to_string(), "create_sandbox: timed out after 1.500s");
        assert!(err.is_transient());
        assert_eq!(err.op(), "create_sandbox");
    }
}
