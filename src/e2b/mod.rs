//! Client for any E2B-compatible provider (E2B cloud, self-hosted E2B, or the
//! embedded local provider): control plane ([`E2bClient`]), envd Connect RPCs
//! and files ([`EnvdClient`]), process streams ([`ProcessStream`]).
//!
//! It speaks the dialect of the official SDK (python `e2b` 2.63.0), see
//! `docs/provider-contract.md`. Timeouts: every unary call is bounded by
//! [`CallOptions::timeout`] or, when that is `None`, by
//! [`ProviderEndpoint::request_timeout`]. Process streams (`start`,
//! `connect_process`, `run`) are bounded by `CallOptions::timeout` or, when
//! `None`, by [`DEFAULT_COMMAND_TIMEOUT`] (the SDK's default); envd kills the
//! process when that deadline passes. `Some(Duration::ZERO)` means "no
//! deadline" (for streams: the process may run forever; for unary calls: wait
//! as long as the server takes).

mod control;
mod envd;
mod error;
mod process;
mod transport;
pub mod wire;

use std::time::Duration;

pub use control::E2bClient;
pub use envd::{EnvdClient, FileRange};
pub use error::E2bError;
pub use process::{CommandOutput, OutputLimits, ProcessStream};

/// Default deadline of a process stream when [`CallOptions::timeout`] is `None` (the SDK's 60 s).
pub const DEFAULT_COMMAND_TIMEOUT: Duration = Duration::from_secs(60);

/// Where a provider lives and how to authenticate to it.
#[derive(Clone)]
pub struct ProviderEndpoint {
    /// Control-plane base URL, e.g. `https://api.e2b.app` or `http://127.0.0.1:3000`.
    pub api_url: url::Url,
    /// envd base URL shared by every sandbox (routed by the `E2b-Sandbox-Id`
    /// header), e.g. the local provider's origin. `None`: derive per sandbox
    /// from the domain, as the SDK does.
    pub sandbox_url: Option<url::Url>,
    /// Sandbox domain used when the create/connect response names none (`e2b.app`).
    pub domain: String,
    /// API key sent as `X-API-Key`. Never logged; `Debug` redacts it.
    pub api_key: Option<String>,
    /// Deadline of each unary request (control plane and envd).
    pub request_timeout: Duration,
}

impl std::fmt::Debug for ProviderEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProviderEndpoint")
            .field("api_url", &self.api_url.as_str())
            .field("sandbox_url", &self.sandbox_url.as_ref().map(|u| u.as_str()))
            .field("domain", &self.domain)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("request_timeout", &self.request_timeout)
            .finish()
    }
}

/// Per-call options of envd calls.
#[derive(Debug, Clone, Default)]
pub struct CallOptions {
    /// envd user (`Authorization: Basic base64("user:")` on RPCs, `username=`
    /// on files). `None`: the sandbox's default user.
    pub user: Option<String>,
    /// Deadline of this call; see the module docs for `None` and `Some(ZERO)`.
    pub timeout: Option<Duration>,
}

impl CallOptions {
    /// Options running as `user`.
    pub fn user(user: impl Into<String>) -> Self {
        Self { user: Some(user.into()), timeout: None }
    }

    /// Same options with a deadline.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }
}

/// Signals `send_signal` can deliver (the two envd supports).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    Term,
    Kill,
}

impl Signal {
    /// The proto enum name on the wire.
    pub fn wire_name(self) -> &'static str {
        match self {
            Signal::Term => "SIGNAL_SIGTERM",
            Signal::Kill => "SIGNAL_SIGKILL",
        }
    }
}

#[cfg(test)]
mod fault_tests;
