//! Why a tool call failed: [`ToolError`], the gateway's one error type for
//! tool bodies. Each variant's `Display` is the sentence the agent reads;
//! [`super::calls`] is the one place a `ToolError` is turned into that
//! sentence, masked, logged and counted (and where a sandbox the provider
//! reported gone is forgotten). Building a `ToolError` has no side effects.

use crate::e2b::E2bError;
use crate::tasks::id::InvalidTaskId;
use crate::tasks::launch::LaunchError;
use crate::tasks::page::PageError;
use crate::tasks::service::TaskError;

use super::args::{InvalidArgument, MAX_LIST_ENTRIES, MAX_LIST_RESPONSE_BYTES, RUN_MAX_TIMEOUT_SECS};
use crate::gateway::http::quotas::QuotaRefusal;
use crate::gateway::sessions::SessionError;

/// A failed tool call, before it becomes a sentence.
#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    /// A bad argument, refused before any provider call.
    #[error(transparent)]
    InvalidArgument(#[from] InvalidArgument),
    /// The auth layer set no tenant (a wiring bug, never a client's fault).
    #[error("internal error: the request carries no tenant")]
    NoTenant,
    /// A legacy-protocol call without `Mcp-Session-Id`.
    #[error("this tool needs an MCP session (Mcp-Session-Id); initialize a session first")]
    NeedsSession,
    /// The MCP session is unknown, ended, another tenant's, or its store failed.
    #[error(transparent)]
    Session(#[from] SessionError),
    /// A per-tenant limit (`[limits]`).
    #[error(transparent)]
    Quota(#[from] QuotaRefusal),
    /// A sessionless (2026-07-28) call without `sandbox_id`.
    #[error(
        "sandbox_id is required: requests of MCP 2026-07-28 have no session, so there is no default sandbox. \
         Pass the sandbox_id returned by create_sandbox (or one from list_sandboxes)."
    )]
    MissingSandboxId,
    /// A session call without `sandbox_id` before any create/connect.
    #[error(
        "no sandbox_id given and this session has no default sandbox: call create_sandbox (new sandbox) or \
         connect_sandbox (existing one) first, or pass sandbox_id"
    )]
    NoDefaultSandbox,
    /// Missing, killed, expired, or another tenant's: one answer for all, so ids cannot be probed.
    #[error("{}", not_found_sentence(.sandbox_id, *.for_tasks))]
    SandboxNotFound {
        sandbox_id: String,
        /// The provider said the sandbox is gone (`E2bError::op`): it is forgotten everywhere.
        /// `None` when it exists but is not the caller's.
        gone: Option<&'static str>,
        /// Worded for the task tools ("its tasks are gone").
        for_tasks: bool,
    },
    /// create_sandbox named a template the provider does not have.
    #[error(
        "template {template:?} not found: call list_templates to see the templates you can use (pass a \
         template's name, one of its aliases or its template_id), or omit template for the default"
    )]
    UnknownTemplate { template: String },
    /// A snapshot that does not exist or is not the caller's: one answer for both.
    #[error(
        "snapshot {snapshot:?} not found: it does not exist, has been deleted, or is not yours; call \
         list_snapshots to see your snapshots"
    )]
    SnapshotNotFound { snapshot: String },
    /// The sandbox provider failed (`action` says what was being done, e.g. "kill sandbox X").
    #[error("could not {action}: {failure}")]
    Provider { action: String, failure: ProviderFailure },
    /// A file or directory the tool was asked about does not exist (a normal answer: not counted).
    #[error("{path}: no such file or directory in sandbox {sandbox_id}")]
    FileNotFound { path: String, sandbox_id: String },
    /// The sandbox user the tool acted as may not read, write or list the path (mode, ownership):
    /// a normal answer, not a provider failure.
    #[error(
        "permission denied: user \"{user}\" may not {action} {path} in sandbox {sandbox_id}; check its owner and \
         mode (list_files of its directory, or run_command \"ls -ld\"), or pass user \"root\""
    )]
    FilePermissionDenied { action: &'static str, path: String, user: &'static str, sandbox_id: String },
    /// A file larger than the read cap.
    #[error("{path} is larger than {limit} bytes; read a part with run_command (head, tail, split)")]
    FileTooLarge { path: String, limit: u64, op: &'static str },
    /// A directory listing larger than the gateway reads.
    #[error(
        "the listing of {path} at depth {depth} is larger than {} bytes (far more than {} entries); list a \
         subdirectory or a smaller depth, or use run_command (find, ls | head)",
        MAX_LIST_RESPONSE_BYTES,
        MAX_LIST_ENTRIES
    )]
    ListingTooLarge { path: String, depth: u32 },
    /// `run_command` reached its timeout; the command was killed.
    #[error(
        "the command did not finish within {timeout} s in sandbox {sandbox_id} and was killed; run long work with \
         start_task (it keeps running and can be checked with get_task), or raise timeout (at most {} s)",
        RUN_MAX_TIMEOUT_SECS
    )]
    CommandTimedOut { timeout: u64, sandbox_id: String },
    /// A sandbox was created but could not be recorded in the session, so it was destroyed.
    #[error("{}", not_recorded_sentence(.store))]
    SandboxNotRecorded {
        /// The session store's failure, if that was the cause (else the session had ended).
        store: Option<String>,
    },
    /// A task tool failed (task not found, supervisor refusal or failure, bad task arguments).
    #[error(transparent)]
    Task(#[from] TaskError),
}

/// How the sandbox provider failed.
#[derive(Debug, thiserror::Error)]
pub enum ProviderFailure {
    /// The provider's global sandbox limit: not transient, and the way out is to free one.
    #[error(
        "the sandbox limit of the whole deployment is reached ({message}); a slot frees when any sandbox is \
         killed or reaches its deadline: kill one you no longer need (kill_sandbox; list_sandboxes shows \
         yours), or ask the operator to raise local.max_sandboxes or lower limits.max_sandboxes_per_tenant"
    )]
    DeploymentLimit { message: String, op: &'static str },
    /// Unreachable, busy, timed out: the same call may well succeed in a few seconds.
    #[error("the sandbox provider is unreachable or busy ({0}); try again in a few seconds")]
    Transient(E2bError),
    /// Anything else: retrying will not help.
    #[error("{0}")]
    Permanent(E2bError),
}

impl ProviderFailure {
    /// Classifies a provider error (the deployment limit, transient, permanent).
    pub fn classify(err: E2bError) -> Self {
        match err {
            E2bError::RateLimited { op, message, .. } if message.contains("maximum of") => {
                Self::DeploymentLimit { message, op }
            }
            err if err.is_transient() => Self::Transient(err),
            err => Self::Permanent(err),
        }
    }

    fn op(&self) -> &'static str {
        match self {
            Self::DeploymentLimit { op, .. } => op,
            Self::Transient(err) | Self::Permanent(err) => err.op(),
        }
    }

    /// Whether retrying the same call soon may succeed.
    pub fn is_transient(&self) -> bool {
        matches!(self, Self::Transient(_))
    }
}

impl ToolError {
    /// A provider call about no particular sandbox failed ("could not {what}: ...").
    pub fn provider(what: impl Into<String>, err: E2bError) -> Self {
        Self::Provider { action: what.into(), failure: ProviderFailure::classify(err) }
    }

    /// A provider call on one sandbox failed: "not found" when the provider says it is gone,
    /// else "could not {action} sandbox {id}: ...".
    pub fn sandbox_call(action: &str, sandbox_id: &str, err: E2bError) -> Self {
        if err.is_sandbox_gone() {
            return Self::SandboxNotFound { sandbox_id: sandbox_id.to_owned(), gone: Some(err.op()), for_tasks: false };
        }
        Self::provider(format!("{action} sandbox {sandbox_id}"), err)
    }

    /// A file operation of `user` failed: a gone sandbox, a missing path, a path the user may not
    /// touch, a size cap, or the provider.
    pub fn file_call(action: &'static str, path: &str, user: &'static str, sandbox_id: &str, err: E2bError) -> Self {
        if err.is_sandbox_gone() {
            return Self::sandbox_call(action, sandbox_id, err);
        }
        if err.is_not_found() {
            return Self::FileNotFound { path: path.to_owned(), sandbox_id: sandbox_id.to_owned() };
        }
        if err.is_permission_denied() {
            return Self::FilePermissionDenied {
                action,
                path: path.to_owned(),
                user,
                sandbox_id: sandbox_id.to_owned(),
            };
        }
        if let E2bError::TooLarge { limit, op, .. } = err {
            return Self::FileTooLarge { path: path.to_owned(), limit, op };
        }
        Self::provider(format!("{action} {path} in sandbox {sandbox_id}"), err)
    }

    /// The sandbox is another tenant's (or not this deployment's): answered as not found.
    pub fn not_yours(sandbox_id: &str) -> Self {
        Self::SandboxNotFound { sandbox_id: sandbox_id.to_owned(), gone: None, for_tasks: false }
    }

    /// An invalid argument, described by `sentence`.
    pub fn invalid(sentence: impl Into<String>) -> Self {
        Self::InvalidArgument(InvalidArgument(sentence.into()))
    }

    /// The same error worded for the task tools (a missing sandbox means its tasks are gone).
    pub fn for_tasks(self) -> Self {
        match self {
            Self::SandboxNotFound { sandbox_id, gone, .. } => {
                Self::SandboxNotFound { sandbox_id, gone, for_tasks: true }
            }
            other => other,
        }
    }

    /// The sandbox or task does not exist (for this caller).
    pub fn is_not_found(&self) -> bool {
        matches!(
            self,
            Self::SandboxNotFound { .. }
                | Self::SnapshotNotFound { .. }
                | Self::Task(TaskError::SandboxGone(_) | TaskError::TaskNotFound { .. })
        )
    }

    /// The call was refused for its arguments (nothing was sent anywhere).
    pub fn is_invalid_argument(&self) -> bool {
        matches!(
            self,
            Self::InvalidArgument(_)
                | Self::UnknownTemplate { .. }
                | Self::Task(TaskError::Launch(_) | TaskError::Page(_))
        )
    }

    /// Whether retrying the same call soon may succeed (provider busy or unreachable).
    pub fn is_transient(&self) -> bool {
        matches!(self, Self::Provider { failure, .. } if failure.is_transient())
            || matches!(self, Self::Task(TaskError::Unavailable { .. }))
    }

    /// The provider operation that failed, for the provider-error metric (a missing file is not counted).
    pub fn provider_op(&self) -> Option<&'static str> {
        match self {
            Self::Provider { failure, .. } => Some(failure.op()),
            Self::SandboxNotFound { gone, .. } => *gone,
            Self::FileTooLarge { op, .. } => Some(op),
            _ => None,
        }
    }

    /// A sandbox the provider reported gone: to be forgotten in every session.
    pub fn gone_sandbox(&self) -> Option<&str> {
        match self {
            Self::SandboxNotFound { sandbox_id, gone: Some(_), .. } => Some(sandbox_id),
            // The task transport reports only what the provider said is gone.
            Self::Task(TaskError::SandboxGone(sandbox_id)) => Some(sandbox_id),
            _ => None,
        }
    }
}

impl From<InvalidTaskId> for ToolError {
    fn from(err: InvalidTaskId) -> Self {
        Self::invalid(err.to_string())
    }
}

impl From<LaunchError> for ToolError {
    fn from(err: LaunchError) -> Self {
        Self::Task(TaskError::Launch(err))
    }
}

impl From<PageError> for ToolError {
    fn from(err: PageError) -> Self {
        Self::Task(TaskError::Page(err))
    }
}

fn not_found_sentence(sandbox_id: &str, for_tasks: bool) -> String {
    if for_tasks {
        return TaskError::SandboxGone(sandbox_id.to_owned()).to_string();
    }
    format!(
        "sandbox {sandbox_id} not found: it does not exist, has been killed or expired, or is not yours; call \
         list_sandboxes to see your sandboxes or create_sandbox for a new one"
    )
}

fn not_recorded_sentence(store: &Option<String>) -> String {
    match store {
        Some(reason) => {
            format!("{reason} (the sandbox could not be recorded in the session and has been destroyed)")
        }
        None => "this MCP session ended while the sandbox was being created; it has been destroyed".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(status: u16, message: &str) -> E2bError {
        E2bError::Api { op: "create_sandbox", sandbox_id: None, status, message: message.into() }
    }

    #[test]
    fn provider_failures_are_classified() {
        let busy = ToolError::provider("create a sandbox", api(503, "overloaded"));
        assert!(busy.is_transient() && !busy.is_not_found() && !busy.is_invalid_argument());
        assert_eq!(busy.provider_op(), Some("create_sandbox"));
        assert!(busy.to_string().ends_with("; try again in a few seconds"), "{busy}");

        let broken = ToolError::provider("create a sandbox", api(400, "bad template"));
        assert!(!broken.is_transient());
        assert_eq!(
            broken.to_string(),
            "could not create a sandbox: create_sandbox: provider API error (HTTP 400): bad template"
        );

        let full = E2bError::RateLimited {
            op: "create_sandbox",
            sandbox_id: None,
            retry_after: None,
            message: "reached the maximum of 5 sandboxes".into(),
        };
        let full = ToolError::provider("create a sandbox", full);
        assert!(!full.is_transient(), "the deployment limit does not go away by retrying");
        assert!(full.to_string().contains("the sandbox limit of the whole deployment is reached"), "{full}");
    }

    #[test]
    fn a_gone_sandbox_reads_as_not_found_and_is_to_be_forgotten() {
        let gone = E2bError::NotFound { op: "get_sandbox", sandbox_id: Some("sbx1".into()), message: "gone".into() };
        let err = ToolError::sandbox_call("look up", "sbx1", gone);
        assert!(err.is_not_found());
        assert_eq!(err.gone_sandbox(), Some("sbx1"));
        assert_eq!(err.provider_op(), Some("get_sandbox"));
        assert!(err.to_string().starts_with("sandbox sbx1 not found: it does not exist"), "{err}");
        // Another tenant's: the same sentence, nothing forgotten, nothing counted.
        let theirs = ToolError::not_yours("sbx1");
        assert_eq!(theirs.to_string(), err.to_string());
        assert_eq!((theirs.gone_sandbox(), theirs.provider_op()), (None, None));
        // Worded for tasks.
        let for_tasks = ToolError::not_yours("sbx1").for_tasks();
        assert_eq!(for_tasks.to_string(), "sandbox sbx1 not found or no longer running; its tasks are gone");
        // The task transport only reports a sandbox gone when the provider said so.
        assert_eq!(ToolError::from(TaskError::SandboxGone("sbx2".into())).gone_sandbox(), Some("sbx2"));
    }

    #[test]
    fn file_errors_distinguish_missing_paths_from_missing_sandboxes() {
        let missing = E2bError::Rpc {
            op: "files.read_range",
            sandbox_id: Some("sbx1".into()),
            code: crate::connect_rpc::Code::NotFound,
            message: "no such file".into(),
        };
        let err = ToolError::file_call("read", "/x", "user", "sbx1", missing);
        assert_eq!(err.to_string(), "/x: no such file or directory in sandbox sbx1");
        assert_eq!((err.provider_op(), err.gone_sandbox()), (None, None), "a missing file is a normal answer");
        let gone = E2bError::SandboxNotRunning {
            op: "files.read_range",
            sandbox_id: Some("sbx1".into()),
            message: "sandbox sbx1 was not found".into(),
        };
        assert_eq!(ToolError::file_call("read", "/x", "user", "sbx1", gone).gone_sandbox(), Some("sbx1"));
        let big = E2bError::TooLarge { op: "files.read", sandbox_id: None, limit: 10 };
        let big = ToolError::file_call("read", "/x", "user", "sbx1", big);
        assert_eq!(big.to_string(), "/x is larger than 10 bytes; read a part with run_command (head, tail, split)");
        assert_eq!(big.provider_op(), Some("files.read"));
    }

    #[test]
    fn a_path_the_user_may_not_touch_is_permission_denied_with_the_path_and_the_user() {
        // envd answers 403 on /files (mapped to Connect's permission_denied) and permission_denied on its RPCs.
        let denied = E2bError::Rpc {
            op: "files.write",
            sandbox_id: Some("sbx1".into()),
            code: crate::connect_rpc::Code::PermissionDenied,
            message: "permission denied for '/srv/x'".into(),
        };
        let err = ToolError::file_call("write", "/srv/x", "user", "sbx1", denied);
        assert_eq!(
            err.to_string(),
            "permission denied: user \"user\" may not write /srv/x in sandbox sbx1; check its owner and mode \
             (list_files of its directory, or run_command \"ls -ld\"), or pass user \"root\""
        );
        assert_eq!((err.provider_op(), err.gone_sandbox()), (None, None), "the user's answer, not a provider failure");
        assert!(!err.is_transient() && !err.is_not_found());
        // A bad credential stays an authentication failure.
        let auth = E2bError::Auth { op: "files.read", sandbox_id: None, status: 401, message: "bad token".into() };
        let err = ToolError::file_call("read", "/x", "user", "sbx1", auth);
        assert!(err.to_string().contains("authentication failed (HTTP 401)"), "{err}");
    }

    #[test]
    fn argument_errors_are_recognised() {
        assert!(ToolError::invalid("path must not be empty").is_invalid_argument());
        assert!(ToolError::from(LaunchError::EmptyCommand).is_invalid_argument());
        assert!(ToolError::from(PageError::LimitOutOfRange).is_invalid_argument());
        assert!(ToolError::from(InvalidTaskId).is_invalid_argument());
        assert!(!ToolError::NoDefaultSandbox.is_invalid_argument());
    }
}
