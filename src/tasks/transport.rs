//! How the task service reaches one sandbox: the [`SupervisorTransport`] trait (run a process,
//! install a file, read part of a file, open a task channel), what its calls return, and how they
//! fail, sorted by what may have reached the sandbox. The envd transport implements it in
//! production (`gateway/tools/envd_transport.rs`), a local python3 in unit tests.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use tokio::sync::mpsc;

/// Output of one process run in the sandbox.
#[derive(Debug, Clone)]
pub struct ExecOutput {
    pub exit_code: i32,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

/// How a call into the sandbox failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum TransportError {
    /// The sandbox does not exist (any more) or is not running.
    #[error("sandbox not found or no longer running")]
    SandboxGone,
    /// The request certainly did not reach the sandbox.
    #[error("{0}")]
    NotSent(String),
    /// The request may have reached the sandbox (timeout, reset, bad answer).
    #[error("{0}")]
    Uncertain(String),
    /// The sandbox has no python3 3.8+ to run the supervisor (`found`: the version it has).
    #[error("no python3 3.8 or newer in the sandbox")]
    NoPython { found: Option<String> },
}

/// Part of a file in the sandbox, and the file's size.
#[derive(Debug, Clone, Default)]
pub struct FileSlice {
    pub data: Vec<u8>,
    pub size: u64,
}

/// Runs processes, reads and writes files in one sandbox, as the sandbox user.
pub trait SupervisorTransport: Send + Sync {
    /// Runs `argv` (argv[0] is the program, found on PATH) and collects its output. `stdin`,
    /// when given, is written to the process's standard input (which is otherwise empty): the
    /// way to hand it anything secret, since a process's argv is readable by every user of the
    /// host.
    ///
    /// `env`: variables added to the process's environment (the sandbox's own stay), a way to
    /// hand it something secret without a round trip for its stdin.
    fn exec(
        &self,
        argv: Vec<String>,
        env: Vec<(String, String)>,
        stdin: Option<Vec<u8>>,
        timeout: Duration,
    ) -> impl Future<Output = Result<ExecOutput, TransportError>> + Send;
    /// Replaces `path` with `content` atomically (creating parent directories),
    /// so a concurrent reader sees the old or the new script, never a mix.
    fn install(&self, path: &str, content: &'static [u8]) -> impl Future<Output = Result<(), TransportError>> + Send;
    /// Starts `argv` (the supervisor's `channel`) with its stdin open and hands over its stdin
    /// and output ([`super::channel`]). A transport without one says so (`NotSent`): starts then
    /// take the bash client's path.
    fn open_channel(&self, argv: Vec<String>) -> impl Future<Output = Result<ChannelIo, TransportError>> + Send {
        let _ = argv;
        async { Err(TransportError::NotSent("this transport opens no task channel".to_owned())) }
    }
    /// At most `len` (≥ 1) bytes of `path` from `offset`, and the file's
    /// size; `None` when the file does not exist.
    fn read_range(
        &self,
        path: &str,
        offset: u64,
        len: u64,
    ) -> impl Future<Output = Result<Option<FileSlice>, TransportError>> + Send;
}

/// What one write to a channel's stdin returns.
pub type SendFuture = Pin<Box<dyn Future<Output = Result<(), TransportError>> + Send>>;

/// Writes bytes to a channel process's stdin (envd's `SendInput`).
pub type SendInput = Box<dyn Fn(Vec<u8>) -> SendFuture + Send + Sync>;

/// A started channel process, as a transport hands it over.
pub struct ChannelIo {
    pub send: SendInput,
    /// The process's stdout, chunk by chunk; closed once it has ended or its stream broke.
    /// Dropping it gives the channel up: the transport then ends the process.
    pub output: mpsc::Receiver<Vec<u8>>,
    /// The transport's own task for the channel, if it has one: done once it has forwarded the
    /// output's end or ended a given-up channel (awaited at shutdown).
    pub forwarder: Option<tokio::task::JoinHandle<()>>,
}
