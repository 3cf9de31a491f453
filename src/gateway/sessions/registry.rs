//! MCP session state (default sandbox, owned set, retained set) and the
//! session-manager wrapper that learns when a session ends.
//!
//! `TrackingSessionManager` delegates everything to rmcp's
//! `LocalSessionManager`; its `create_session` registers a `SessionState` and
//! its `close_session` (which rmcp calls on DELETE *and* when the session
//! worker exits: idle expiry, shutdown) hands the state, exactly once, to the
//! `SessionEndHook` that kills owned, unretained sandboxes.
//!
//! With `[sessions] store = "redis://…"` the registry is a per-replica cache
//! of the records in Redis (`redis_store.rs`): changes go through `update`
//! (applied to Redis atomically), each request refreshes the cache
//! (`shared_sessions.rs`), and a session's end is Redis's business (idle
//! expiry or DELETE, cleaned once by whichever replica holds the lease), so a
//! replica dropping its local worker does not end the session.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

use futures_util::{FutureExt, Stream, StreamExt};
use rmcp::model::{ClientJsonRpcMessage, ServerJsonRpcMessage};
use rmcp::transport::streamable_http_server::session::local::{LocalSessionManager, LocalSessionManagerError};
use rmcp::transport::streamable_http_server::session::{
    EventStore, RestoreOutcome, ServerSseMessage, SessionId, SessionManager,
};

use super::redis_pool::StoreError;
use super::redis_store::{Record, RecordDiff, RedisStore};
use crate::e2b::wire;

/// What one MCP session knows about sandboxes.
#[derive(Debug, Clone)]
pub struct SessionState {
    /// Tenant bound at `initialize` (None until the HTTP layer has bound it).
    pub tenant: Option<String>,
    /// Principal (static token's tenant, or OAuth issuer + subject) bound at `initialize`.
    pub principal: Option<String>,
    /// The sandbox used when a tool omits `sandbox_id`.
    pub default_sandbox: Option<String>,
    /// Sandboxes this session created (killed when it ends, unless retained).
    pub owned: BTreeSet<String>,
    /// Sandboxes in which this session started a task (never killed on session end).
    pub retained: BTreeSet<String>,
    /// Sandboxes already checked to belong to the tenant, with their connection info
    /// (saves a provider round trip per call).
    pub verified: HashMap<String, wire::Sandbox>,
}

impl SessionState {
    fn new() -> Self {
        Self {
            tenant: None,
            principal: None,
            default_sandbox: None,
            owned: BTreeSet::new(),
            retained: BTreeSet::new(),
            verified: HashMap::new(),
        }
    }

    /// What this session thinks of a sandbox: any of `default`, `owned`, `retained`.
    pub fn roles_of(&self, sandbox_id: &str) -> Vec<&'static str> {
        let mut roles = Vec::new();
        if self.default_sandbox.as_deref() == Some(sandbox_id) {
            roles.push("default");
        }
        if self.owned.contains(sandbox_id) {
            roles.push("owned");
        }
        if self.retained.contains(sandbox_id) {
            roles.push("retained");
        }
        roles
    }

    /// Forgets a sandbox that no longer exists (killed).
    pub fn forget(&mut self, sandbox_id: &str) {
        if self.default_sandbox.as_deref() == Some(sandbox_id) {
            self.default_sandbox = None;
        }
        self.owned.remove(sandbox_id);
        self.retained.remove(sandbox_id);
        self.verified.remove(sandbox_id);
    }
}

/// Why a session ended (for the logs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndReason {
    /// DELETE from the client, idle expiry, or transport end (rmcp does not tell them apart).
    Closed,
    /// Server shutdown.
    Shutdown,
}

impl EndReason {
    pub fn as_str(self) -> &'static str {
        match self {
            EndReason::Closed => "closed",
            EndReason::Shutdown => "shutdown",
        }
    }
}

/// Called once per ended session, with its final state.
pub trait SessionEndHook: Send + Sync + 'static {
    fn session_ended(&self, session_id: String, state: SessionState, reason: EndReason);
}

/// Errors of session-state operations.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SessionError {
    #[error("this MCP session has ended or is unknown; start a new session (initialize)")]
    Unknown,
    #[error("this MCP session belongs to another tenant")]
    WrongTenant,
    #[error("{0}")]
    Store(String),
}

impl From<StoreError> for SessionError {
    fn from(err: StoreError) -> Self {
        SessionError::Store(err.to_string())
    }
}

impl SessionState {
    /// The part of the state shared through Redis.
    pub fn record(&self) -> Record {
        Record {
            tenant: self.tenant.clone(),
            principal: self.principal.clone(),
            default_sandbox: self.default_sandbox.clone(),
            owned: self.owned.clone(),
            retained: self.retained.clone(),
        }
    }

    /// Replaces the shared part with a fresher record (keeps the local `verified` cache of sandboxes
    /// the session still knows).
    fn refresh(&mut self, record: Record) {
        self.tenant = record.tenant;
        self.principal = record.principal;
        self.default_sandbox = record.default_sandbox;
        self.owned = record.owned;
        self.retained = record.retained;
        let known: BTreeSet<String> =
            self.owned.iter().chain(&self.retained).chain(&self.default_sandbox).cloned().collect();
        self.verified.retain(|id, _| known.contains(id));
    }
}

/// What `SessionRegistry::sandbox_counts` reports (for the metrics gauges).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SandboxCounts {
    pub sessions: usize,
    /// Distinct sandboxes created by live sessions (retained ones included).
    pub owned: usize,
    /// Distinct sandboxes that live sessions retain (a task was started in them).
    pub retained: usize,
}

/// All live sessions, shared by the session manager and the tool handler.
#[derive(Default)]
pub struct SessionRegistry {
    sessions: Mutex<HashMap<String, SessionState>>,
    /// Where session records are shared between replicas (None: this process only).
    store: Option<RedisStore>,
}

impl SessionRegistry {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// A registry caching the records kept in Redis.
    pub fn shared(store: RedisStore) -> Arc<Self> {
        Arc::new(Self { sessions: Mutex::default(), store: Some(store) })
    }

    /// The Redis store when sessions are shared.
    pub fn store(&self) -> Option<&RedisStore> {
        self.store.as_ref()
    }

    /// Like `with_session`, and writes the change to Redis (atomically) when sessions are shared.
    /// A Redis failure is `SessionError::Store` (retryable); a session ended elsewhere is `Unknown`.
    pub async fn update<R>(
        &self,
        session_id: &str,
        tenant: &str,
        f: impl FnOnce(&mut SessionState) -> R,
    ) -> Result<R, SessionError> {
        let (result, diff) = self.with_session(session_id, tenant, |state| {
            let before = state.record();
            let result = f(state);
            (result, RecordDiff::between(&before, &state.record()))
        })?;
        if let Some(store) = &self.store
            && !diff.is_empty()
            && !store.apply(session_id, &diff).await?
        {
            self.take(session_id);
            return Err(SessionError::Unknown);
        }
        Ok(result)
    }

    /// Binds a session just created by `initialize` to its tenant and principal (and writes it to Redis;
    /// always, even if something bound it locally first: `HSETNX` keeps the first binding).
    pub async fn bind_new(&self, session_id: &str, tenant: &str, principal: &str) -> Result<(), SessionError> {
        self.with_session(session_id, tenant, |state| {
            state.principal.get_or_insert_with(|| principal.to_string());
        })?;
        if let Some(store) = &self.store {
            let diff = RecordDiff {
                bind_tenant: Some(tenant.to_string()),
                bind_principal: Some(principal.to_string()),
                ..RecordDiff::default()
            };
            if !store.apply(session_id, &diff).await? {
                self.take(session_id);
                return Err(SessionError::Unknown);
            }
        }
        Ok(())
    }

    /// Replaces (or adds) a session's cached state with the record read from Redis.
    pub fn refresh(&self, session_id: &str, record: Record) {
        self.lock().entry(session_id.to_string()).or_insert_with(SessionState::new).refresh(record);
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, SessionState>> {
        // A panic while holding the lock cannot leave the map half-updated (single inserts/removes).
        crate::sync::lock(&self.sessions)
    }

    /// Registers a new session (tenant not yet known).
    pub fn register(&self, session_id: &str) {
        self.lock().entry(session_id.to_string()).or_insert_with(SessionState::new);
    }

    /// Binds the tenant of a session the first time; later binds must match.
    pub fn bind_tenant(&self, session_id: &str, tenant: &str) -> Result<(), SessionError> {
        self.with_session(session_id, tenant, |_| ())
    }

    /// Live sessions bound to `tenant`.
    pub fn sessions_of(&self, tenant: &str) -> usize {
        self.lock().values().filter(|s| s.tenant.as_deref() == Some(tenant)).count()
    }

    /// Whether a session is live.
    pub fn contains(&self, session_id: &str) -> bool {
        self.lock().contains_key(session_id)
    }

    /// Binds a session to the principal that opened it (first binding wins).
    pub fn bind_principal(&self, session_id: &str, principal: &str) {
        if let Some(state) = self.lock().get_mut(session_id) {
            state.principal.get_or_insert_with(|| principal.to_string());
        }
    }

    /// The principal a session is bound to (None if unknown session or not bound yet).
    pub fn principal_of(&self, session_id: &str) -> Option<String> {
        self.lock().get(session_id).and_then(|s| s.principal.clone())
    }

    /// The tenant a session is bound to (None if unknown session or not bound yet).
    pub fn tenant_of(&self, session_id: &str) -> Option<String> {
        self.lock().get(session_id).and_then(|s| s.tenant.clone())
    }

    /// Runs `f` on the state of a session of `tenant`; binds the tenant if the session has none yet.
    pub fn with_session<R>(
        &self,
        session_id: &str,
        tenant: &str,
        f: impl FnOnce(&mut SessionState) -> R,
    ) -> Result<R, SessionError> {
        let mut sessions = self.lock();
        let state = sessions.get_mut(session_id).ok_or(SessionError::Unknown)?;
        match &state.tenant {
            Some(bound) if bound != tenant => return Err(SessionError::WrongTenant),
            Some(_) => {}
            None => state.tenant = Some(tenant.to_string()),
        }
        Ok(f(state))
    }

    /// Marks a sandbox as retained by a session of `tenant`: it survives the session's end.
    pub fn retain(&self, session_id: &str, tenant: &str, sandbox_id: &str) -> Result<(), SessionError> {
        self.with_session(session_id, tenant, |s| {
            s.retained.insert(sandbox_id.to_string());
        })
    }

    /// Forgets a killed sandbox in every session (another session of the tenant may have killed it);
    /// with Redis, also in the records of the sessions this replica knows (in the background).
    pub fn forget_everywhere(&self, sandbox_id: &str) {
        let mut changed = Vec::new();
        for (id, state) in self.lock().iter_mut() {
            let before = state.record();
            state.forget(sandbox_id);
            let diff = RecordDiff::between(&before, &state.record());
            if !diff.is_empty() {
                changed.push((id.clone(), diff));
            }
        }
        if let (Some(store), Ok(runtime)) = (&self.store, tokio::runtime::Handle::try_current())
            && !changed.is_empty()
        {
            let store = store.clone();
            runtime.spawn(async move {
                for (id, diff) in changed {
                    if let Err(err) = store.apply(&id, &diff).await {
                        tracing::warn!(session = %id, error = %err, "cannot record a killed sandbox in Redis");
                    }
                }
            });
        }
    }

    /// Removes a session; returns its state only the first time (makes cleanup idempotent).
    pub fn take(&self, session_id: &str) -> Option<SessionState> {
        self.lock().remove(session_id)
    }

    /// Removes every session (server shutdown).
    pub fn take_all(&self) -> Vec<(String, SessionState)> {
        self.lock().drain().collect()
    }

    // ops (metrics): counts read at each /metrics scrape.
    /// Live sessions and the distinct sandboxes they own and retain.
    pub fn sandbox_counts(&self) -> SandboxCounts {
        let sessions = self.lock();
        let owned: BTreeSet<&String> = sessions.values().flat_map(|s| s.owned.iter()).collect();
        let retained: BTreeSet<&String> = sessions.values().flat_map(|s| s.retained.iter()).collect();
        SandboxCounts { sessions: sessions.len(), owned: owned.len(), retained: retained.len() }
    }
}

/// Errors of the tracking session manager: rmcp's own, or the shared store's.
#[derive(Debug, thiserror::Error)]
pub enum ManagerError {
    #[error(transparent)]
    Local(#[from] LocalSessionManagerError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("Last-Event-ID does not name an event stream of this session")]
    ForeignStream,
}

/// `LocalSessionManager` plus session-state bookkeeping.
pub struct TrackingSessionManager {
    inner: LocalSessionManager,
    registry: Arc<SessionRegistry>,
    hook: Arc<dyn SessionEndHook>,
}

impl TrackingSessionManager {
    pub fn new(inner: LocalSessionManager, registry: Arc<SessionRegistry>, hook: Arc<dyn SessionEndHook>) -> Self {
        Self { inner, registry, hook }
    }

    /// Ends the session's bookkeeping (idempotent) and runs the end hook once.
    /// With Redis, only forgets the local copy: the session lives on in Redis, and its end is the
    /// business of expiry / DELETE and the cleanup lease (`shared_sessions.rs`).
    pub fn end_session(&self, session_id: &str, reason: EndReason) {
        if let Some(state) = self.registry.take(session_id)
            && self.registry.store().is_none()
        {
            self.hook.session_ended(session_id.to_string(), state, reason);
        }
    }

    /// Stops this replica's worker of a session that ended elsewhere (no cleanup here).
    pub async fn drop_local(&self, id: &SessionId) {
        self.registry.take(id);
        if let Err(err) = self.inner.close_session(id).await {
            tracing::debug!(session = %id, error = %err, "closing the local worker of an ended session");
        }
    }
}

impl SessionManager for TrackingSessionManager {
    type Error = ManagerError;
    type Transport = <LocalSessionManager as SessionManager>::Transport;

    async fn create_session(&self) -> Result<(SessionId, Self::Transport), Self::Error> {
        let (id, transport) = self.inner.create_session().await?;
        if let Some(store) = self.registry.store()
            && let Err(err) = store.create(&id).await
        {
            let _ = self.inner.close_session(&id).await;
            return Err(err.into());
        }
        self.registry.register(&id);
        tracing::debug!(session = %id, "session created");
        Ok((id, transport))
    }

    async fn initialize_session(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<ServerJsonRpcMessage, Self::Error> {
        Ok(self.inner.initialize_session(id, message).await?)
    }

    async fn has_session(&self, id: &SessionId) -> Result<bool, Self::Error> {
        Ok(self.inner.has_session(id).await?)
    }

    async fn close_session(&self, id: &SessionId) -> Result<(), Self::Error> {
        let result = self.inner.close_session(id).await;
        self.end_session(id, EndReason::Closed);
        Ok(result?)
    }

    async fn create_stream(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        let mut stream = self.inner.create_stream(id, message).await?;
        let Some(store) = self.registry.store() else { return Ok(stream.left_stream()) };
        // The priming event (queued before the request was handed over; `session_config.sse_retry` is
        // set) names the request's stream in the event log: bind that stream to this session before the
        // client can see any of its ids, so only this session may replay it (`resume`).
        let first = stream.next().now_or_never().flatten();
        if let Some(stream_id) =
            first.as_ref().and_then(|event| event.event_id.as_deref()).and_then(|id| id.rsplit_once('#'))
        {
            store.events().bind_stream(stream_id.0, id).await?;
        }
        Ok(futures_util::stream::iter(first).chain(stream).right_stream())
    }

    async fn accept_message(&self, id: &SessionId, message: ClientJsonRpcMessage) -> Result<(), Self::Error> {
        Ok(self.inner.accept_message(id, message).await?)
    }

    async fn create_standalone_stream(
        &self,
        id: &SessionId,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        Ok(self.inner.create_standalone_stream(id).await?)
    }

    async fn resume(
        &self,
        id: &SessionId,
        last_event_id: String,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        // In memory, rmcp replays from the session's own worker; the shared log needs the check.
        if let Some(store) = self.registry.store()
            && !store.events().stream_belongs_to(&last_event_id, id).await?
        {
            tracing::warn!(session = %id, "Last-Event-ID names a stream of another session (or an unknown one): no replay");
            return Err(ManagerError::ForeignStream);
        }
        Ok(self.inner.resume(id, last_event_id).await?)
    }

    async fn restore_session(&self, id: SessionId) -> Result<RestoreOutcome<Self::Transport>, Self::Error> {
        if self.registry.store().is_none() {
            return Ok(RestoreOutcome::NotSupported);
        }
        let outcome = self.inner.restore_session(id.clone()).await?;
        if matches!(outcome, RestoreOutcome::Restored(_)) {
            // The record itself was read from Redis by the request that triggered the restore.
            self.registry.register(&id);
            tracing::info!(session = %id, "session taken over from the shared store");
        }
        Ok(outcome)
    }

    fn event_store(&self) -> Option<Arc<dyn EventStore>> {
        self.inner.event_store()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct RecordingHook(Mutex<Vec<(String, SessionState)>>);

    impl SessionEndHook for RecordingHook {
        fn session_ended(&self, session_id: String, state: SessionState, _reason: EndReason) {
            self.0.lock().unwrap().push((session_id, state));
        }
    }

    #[test]
    fn retain_survives_and_cleanup_runs_once() {
        let registry = SessionRegistry::new();
        let hook = Arc::new(RecordingHook::default());
        let manager = TrackingSessionManager::new(LocalSessionManager::default(), registry.clone(), hook.clone());
        registry.register("s1");
        registry
            .with_session("s1", "acme", |s| {
                s.owned.insert("sbx-a".into());
                s.owned.insert("sbx-b".into());
                s.default_sandbox = Some("sbx-b".into());
            })
            .unwrap();
        registry.retain("s1", "acme", "sbx-a").unwrap();
        assert_eq!(registry.with_session("s1", "acme", |s| s.roles_of("sbx-a")), Ok(vec!["owned", "retained"]));
        assert_eq!(registry.with_session("s1", "other", |_| ()), Err(SessionError::WrongTenant));
        assert_eq!(registry.retain("s1", "other", "sbx-b"), Err(SessionError::WrongTenant));
        assert_eq!(registry.bind_tenant("s1", "other"), Err(SessionError::WrongTenant));
        assert_eq!(registry.bind_tenant("s1", "acme"), Ok(()));
        manager.end_session("s1", EndReason::Closed);
        manager.end_session("s1", EndReason::Closed);
        let ended = hook.0.lock().unwrap();
        assert_eq!(ended.len(), 1, "cleanup must run exactly once");
        assert!(ended[0].1.retained.contains("sbx-a"));
        assert!(!ended[0].1.retained.contains("sbx-b"), "a wrong-tenant retain must not change the state");
        assert_eq!(registry.retain("s1", "acme", "sbx-a"), Err(SessionError::Unknown));
    }
}
