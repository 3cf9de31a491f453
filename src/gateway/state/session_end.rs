//! The end of a session kept in this process's memory: the owned,
//! unretained sandboxes are killed in the background (each kill bounded),
//! and at shutdown every remaining session ends the same way. (Sessions kept
//! in Redis end once across replicas: `shared_sessions`.)

use std::sync::Arc;
use std::time::Duration;

use super::GatewayCore;
use super::sandboxes::forget_sandbox_in;
use crate::gateway::sessions::{EndReason, SessionEndHook, SessionState};

/// Bound on each kill during session cleanup.
const CLEANUP_KILL_TIMEOUT: Duration = Duration::from_secs(15);

impl GatewayCore {
    /// Ends every remaining session (server shutdown) and waits, bounded, for their cleanups.
    pub async fn end_all_sessions(&self, timeout: Duration) {
        if self.sessions.store().is_some() {
            // Sessions live on in Redis: another replica (or this one restarted) continues them.
            let left = self.sessions.take_all().len();
            tracing::info!(sessions = left, "sessions left in Redis for the other replicas");
        }
        for (id, state) in self.sessions.take_all() {
            self.session_ended(id, state, EndReason::Shutdown);
        }
        self.cleanups.close();
        if tokio::time::timeout(timeout, self.cleanups.wait()).await.is_err() {
            tracing::warn!("session cleanup did not finish within {timeout:?}; some sandboxes may outlive the gateway");
        }
    }
}

impl SessionEndHook for GatewayCore {
    fn session_ended(&self, session_id: String, state: SessionState, reason: EndReason) {
        let to_kill: Vec<String> = state.owned.difference(&state.retained).cloned().collect();
        let retained: Vec<String> = state.retained.iter().cloned().collect();
        let connected: Vec<String> = state.verified.keys().filter(|id| !state.owned.contains(*id)).cloned().collect();
        let tenant = state.tenant.clone().unwrap_or_default();
        if to_kill.is_empty() {
            tracing::info!(session = %session_id, tenant = %tenant, reason = reason.as_str(), ?retained,
                kept_not_owned = ?connected, "session ended; nothing to kill");
            return;
        }
        let provider = self.provider.clone();
        let registry = Arc::clone(&self.sessions);
        let renewals = Arc::clone(&self.renewals);
        self.cleanups.spawn(async move {
            let mut killed = Vec::new();
            let mut failed = Vec::new();
            for id in &to_kill {
                match tokio::time::timeout(CLEANUP_KILL_TIMEOUT, provider.kill_sandbox(id)).await {
                    Ok(Ok(_)) => killed.push(id.clone()),
                    Ok(Err(err)) if err.is_sandbox_gone() => killed.push(id.clone()),
                    Ok(Err(err)) => failed.push(format!("{id}: {err}")),
                    Err(_) => failed.push(format!("{id}: timed out")),
                }
                forget_sandbox_in(&registry, &renewals, id);
            }
            tracing::info!(session = %session_id, tenant = %tenant, reason = reason.as_str(), ?killed, ?failed,
                kept_retained = ?retained, kept_not_owned = ?connected,
                "session ended; killed its owned sandboxes (retained ones kept: tasks were started in them)");
        });
    }
}
