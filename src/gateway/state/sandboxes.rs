//! What the gateway remembers about sandboxes between calls: the deadline it
//! believes each has and when it last renewed it (renew on use, at most once
//! per 10 s, never shortening), the sandboxes already checked for
//! sessionless callers, and forgetting a sandbox that is gone everywhere.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use super::GatewayCore;
use crate::e2b::{E2bError, wire};
use crate::gateway::sessions::SessionRegistry;

/// At most one timeout renewal per sandbox per this interval.
const RENEW_MIN_INTERVAL: Duration = Duration::from_secs(10);
/// Most sandboxes remembered for sessionless callers (the cache is cleared when full).
const STATELESS_CACHE_MAX: usize = 4096;

/// sandbox id -> (last renewal by us, deadline we believe it has).
pub(super) type Renewals = Mutex<HashMap<String, (Option<Instant>, SystemTime)>>;

/// Forgets a sandbox that no longer exists: in every session, and its renewal record.
pub(super) fn forget_sandbox_in(sessions: &SessionRegistry, renewals: &Renewals, sandbox_id: &str) {
    sessions.forget_everywhere(sandbox_id);
    crate::sync::lock(renewals).remove(sandbox_id);
}

impl GatewayCore {
    /// A sandbox already checked for this tenant by a sessionless call.
    pub(crate) fn stateless_cached(&self, tenant: &str, sandbox_id: &str) -> Option<wire::Sandbox> {
        let map = crate::sync::lock(&self.stateless_verified);
        map.get(sandbox_id).filter(|(t, _)| t == tenant).map(|(_, s)| s.clone())
    }

    pub(crate) fn stateless_remember(&self, tenant: &str, sandbox: &wire::Sandbox) {
        let mut map = crate::sync::lock(&self.stateless_verified);
        if map.len() >= STATELESS_CACHE_MAX {
            map.clear();
        }
        map.insert(sandbox.sandbox_id.clone(), (tenant.to_string(), sandbox.clone()));
    }

    /// Drops a sandbox from the sessionless callers' cache (it is looked up again next time).
    pub(crate) fn stateless_forget(&self, sandbox_id: &str) {
        crate::sync::lock(&self.stateless_verified).remove(sandbox_id);
    }

    /// Records the deadline a sandbox was created or renewed with.
    pub(crate) fn note_deadline(&self, sandbox_id: &str, deadline: SystemTime) {
        crate::sync::lock(&self.renewals).entry(sandbox_id.to_string()).or_insert((None, deadline)).1 = deadline;
    }

    /// The deadline we believe a sandbox has (from its creation, renewal or last look-up).
    pub(crate) fn known_deadline(&self, sandbox_id: &str) -> Option<SystemTime> {
        crate::sync::lock(&self.renewals).get(sandbox_id).map(|(_, deadline)| *deadline)
    }

    /// Extends a sandbox's deadline to now + `renew_on_use_secs` in the background (best effort,
    /// at most once per 10 s per sandbox, never shortening a deadline we know to be later).
    pub(crate) fn renew_on_use(self: &Arc<Self>, sandbox_id: &str) {
        let secs = self.config.sandbox.renew_on_use_secs;
        if secs == 0 {
            return;
        }
        let wanted = SystemTime::now() + Duration::from_secs(secs);
        {
            let mut map = crate::sync::lock(&self.renewals);
            if let Some((last, deadline)) = map.get(sandbox_id)
                && (last.is_some_and(|t| t.elapsed() < RENEW_MIN_INTERVAL) || *deadline >= wanted)
            {
                return;
            }
            map.insert(sandbox_id.to_string(), (Some(Instant::now()), wanted));
        }
        let core = Arc::clone(self);
        let id = sandbox_id.to_string();
        tokio::spawn(async move {
            if let Err(err) = core.provider.set_timeout(&id, secs).await {
                tracing::debug!(sandbox = %id, error = %err, "timeout renewal failed (best effort)");
            }
        });
    }

    pub(crate) fn forget_sandbox(&self, sandbox_id: &str) {
        forget_sandbox_in(&self.sessions, &self.renewals, sandbox_id);
        crate::sync::lock(&self.stateless_verified).remove(sandbox_id);
    }

    /// Kills a sandbox the caller is allowed to kill, and forgets it everywhere.
    pub(crate) async fn kill_and_forget(&self, sandbox_id: &str) -> Result<bool, E2bError> {
        let killed = self.provider.kill_sandbox(sandbox_id).await?;
        self.forget_sandbox(sandbox_id);
        Ok(killed)
    }
}
