//! Legacy MCP sessions in Redis (`[sessions] store = "redis://…"`): the
//! connection pool, rmcp's `SessionStore` (the `initialize` parameters a
//! replica replays to take over a session), our per-session records (tenant,
//! principal, default sandbox, owned and retained sets), idle expiry and the
//! cleanup lease that makes session-end cleanup run exactly once across
//! replicas. The SSE event log (rmcp's `EventStore`) is `event_log.rs`; the
//! connections, key prefix and call timeout both use are `redis_pool.rs`.
//!
//! Keys (all under `key_prefix`): `:expiry` (sorted set: session id → idle
//! deadline in ms), `:s:<id>` (hash: tenant, principal, default), `:s:<id>:owned`
//! and `:s:<id>:retained` (sets), `:s:<id>:init` (rmcp state, JSON),
//! `:s:<id>:lease` (the replica cleaning the session up), `:ev:<stream>`
//! (Redis stream of SSE events) and `:ev:<stream>:owner` (its session).
//! Every call is bounded by `timeout_ms`; every multi-key change is one Lua
//! script (atomic, never half-written).

use std::collections::BTreeSet;
use std::time::Duration;

use redis::{AsyncCommands, Script};
use rmcp::transport::streamable_http_server::session::{
    SessionState as RmcpSessionState, SessionStore, SessionStoreError,
};

use super::event_log::EventLog;
use super::redis_pool::{RedisPool, StoreError, now_ms};
use crate::config::SessionsConfig;

/// A session's shared record (what `SessionState` holds besides the local `verified` cache).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Record {
    pub tenant: Option<String>,
    pub principal: Option<String>,
    pub default_sandbox: Option<String>,
    pub owned: BTreeSet<String>,
    pub retained: BTreeSet<String>,
}

/// A change to a record, applied atomically (set semantics, so concurrent changes from two replicas merge).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecordDiff {
    /// Bound once: `HSETNX` (the first binding wins).
    pub bind_tenant: Option<String>,
    pub bind_principal: Option<String>,
    /// `Some(Some(id))` sets the default sandbox, `Some(None)` clears it.
    pub default_sandbox: Option<Option<String>>,
    pub owned_add: Vec<String>,
    pub owned_remove: Vec<String>,
    pub retained_add: Vec<String>,
    pub retained_remove: Vec<String>,
}

impl RecordDiff {
    /// What changed from `before` to `after`.
    pub fn between(before: &Record, after: &Record) -> Self {
        Self {
            bind_tenant: if before.tenant.is_none() { after.tenant.clone() } else { None },
            bind_principal: if before.principal.is_none() { after.principal.clone() } else { None },
            default_sandbox: (before.default_sandbox != after.default_sandbox).then(|| after.default_sandbox.clone()),
            owned_add: after.owned.difference(&before.owned).cloned().collect(),
            owned_remove: before.owned.difference(&after.owned).cloned().collect(),
            retained_add: after.retained.difference(&before.retained).cloned().collect(),
            retained_remove: before.retained.difference(&after.retained).cloned().collect(),
        }
    }

    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// Refreshes a live session's idle deadline and returns its record; nil if unknown, expired or being cleaned;
/// 0 (and no refresh) if it is bound to another tenant or principal than the request's (ARGV[4], ARGV[5]).
const TOUCH: &str = r#"
if redis.call('EXISTS', KEYS[1]) == 0 or redis.call('EXISTS', KEYS[4]) == 1 then return false end
local score = redis.call('ZSCORE', KEYS[5], ARGV[1])
if (not score) or tonumber(score) < tonumber(ARGV[2]) then return false end
local bound = redis.call('HMGET', KEYS[1], 'tenant', 'principal')
if (bound[1] and bound[1] ~= ARGV[4]) or (bound[2] and bound[2] ~= ARGV[5]) then return 0 end
if tonumber(ARGV[3]) > 0 then redis.call('ZADD', KEYS[5], ARGV[3], ARGV[1]) end
return {redis.call('HGETALL', KEYS[1]), redis.call('SMEMBERS', KEYS[2]), redis.call('SMEMBERS', KEYS[3])}
"#;

/// Applies a `RecordDiff` to a live session (0 if the session is gone or being cleaned).
const APPLY: &str = r#"
if redis.call('EXISTS', KEYS[1]) == 0 or redis.call('EXISTS', KEYS[4]) == 1 then return 0 end
local i = 1
local function take() local v = ARGV[i]; i = i + 1; return v end
local n = tonumber(take())
for _ = 1, n do local f = take(); local v = take(); redis.call('HSETNX', KEYS[1], f, v) end
local op = take()
if op == 'set' then redis.call('HSET', KEYS[1], 'default', take()) elseif op == 'del' then redis.call('HDEL', KEYS[1], 'default') end
n = tonumber(take()); for _ = 1, n do redis.call('SADD', KEYS[2], take()) end
n = tonumber(take()); for _ = 1, n do redis.call('SREM', KEYS[2], take()) end
n = tonumber(take()); for _ = 1, n do redis.call('SADD', KEYS[3], take()) end
n = tonumber(take()); for _ = 1, n do redis.call('SREM', KEYS[3], take()) end
return 1
"#;

/// Marks a live session as ended now (DELETE): its deadline moves to 0 so a cleanup claims it.
const END_NOW: &str = r#"
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('ZADD', KEYS[2], 0, ARGV[1])
return 1
"#;

/// Deletes a cleaned session, only while this replica still holds its lease.
const FINISH: &str = r#"
if redis.call('GET', KEYS[4]) ~= ARGV[2] then return 0 end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5])
redis.call('ZREM', KEYS[6], ARGV[1])
return 1
"#;

/// Every operation on shared session state (cheap to clone).
#[derive(Clone)]
pub struct RedisStore {
    redis: RedisPool,
    idle: Duration,
    lease: Duration,
    touch: Script,
    apply: Script,
    end_now: Script,
    finish: Script,
    /// The SSE event log (`event_log.rs`).
    events: EventLog,
}

/// What `RedisStore::touch` found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Touched {
    /// A live session of the requester (its idle deadline refreshed).
    Live(Record),
    /// Unknown, expired or ending.
    Gone,
    /// A live session bound to another tenant or principal (not refreshed).
    NotYours,
}

impl RedisStore {
    /// Connects the pool (fails start-up with a clear error when Redis is unreachable or the URL is bad).
    pub async fn connect(config: &SessionsConfig, idle: Duration) -> Result<Self, StoreError> {
        let redis = RedisPool::connect(config).await?;
        let events = EventLog::spawn(redis.clone(), idle);
        Ok(Self {
            events,
            redis,
            idle,
            lease: Duration::from_secs(config.cleanup_lease_secs),
            touch: Script::new(TOUCH),
            apply: Script::new(APPLY),
            end_now: Script::new(END_NOW),
            finish: Script::new(FINISH),
        })
    }

    /// The SSE event log (rmcp's `EventStore`), on the same connections.
    pub fn events(&self) -> &EventLog {
        &self.events
    }

    /// Record keys of a session: hash, owned, retained, lease, init.
    fn session_keys(&self, id: &str) -> [String; 5] {
        let base = self.redis.key(&format!("s:{id}"));
        let owned = format!("{base}:owned");
        [base.clone(), owned, format!("{base}:retained"), format!("{base}:lease"), format!("{base}:init")]
    }

    /// `PING` (readiness).
    pub async fn ping(&self) -> Result<(), StoreError> {
        let mut conn = self.redis.conn();
        self.redis.bounded(redis::cmd("PING").query_async::<String>(&mut conn)).await.map(|_| ())
    }

    /// Registers a new session with a fresh idle deadline.
    pub async fn create(&self, id: &str) -> Result<(), StoreError> {
        let [hash, ..] = self.session_keys(id);
        let deadline = now_ms() + self.idle.as_millis() as u64;
        let mut pipe = redis::pipe();
        pipe.atomic().hset(&hash, "created", now_ms()).ignore().zadd(self.redis.key("expiry"), id, deadline).ignore();
        let mut conn = self.redis.conn();
        self.redis.bounded(pipe.query_async::<()>(&mut conn)).await
    }

    /// The record of a live session of `tenant` and `principal`, refreshing its idle deadline; a session
    /// bound to someone else is neither refreshed nor read.
    pub async fn touch(&self, id: &str, tenant: &str, principal: &str) -> Result<Touched, StoreError> {
        let [hash, owned, retained, lease, _init] = self.session_keys(id);
        let now = now_ms();
        let mut invocation = self.touch.key(&hash);
        invocation
            .key(&owned)
            .key(&retained)
            .key(&lease)
            .key(self.redis.key("expiry"))
            .arg(id)
            .arg(now)
            .arg(now + self.idle.as_millis() as u64)
            .arg(tenant)
            .arg(principal);
        let mut conn = self.redis.conn();
        let found: redis::Value = self.redis.bounded(invocation.invoke_async(&mut conn)).await?;
        let (fields, owned, retained): (Vec<String>, Vec<String>, Vec<String>) = match found {
            redis::Value::Nil => return Ok(Touched::Gone),
            redis::Value::Int(_) => return Ok(Touched::NotYours),
            found => redis::from_redis_value(found).map_err(|e| StoreError::Corrupt(e.to_string()))?,
        };
        Ok(Touched::Live({
            let mut record = Record {
                owned: owned.into_iter().collect(),
                retained: retained.into_iter().collect(),
                ..Record::default()
            };
            for pair in fields.chunks_exact(2) {
                let value = Some(pair[1].clone());
                match pair[0].as_str() {
                    "tenant" => record.tenant = value,
                    "principal" => record.principal = value,
                    "default" => record.default_sandbox = value,
                    _ => {}
                }
            }
            record
        }))
    }

    /// Applies a change to a live session; false if it has ended (nothing written).
    pub async fn apply(&self, id: &str, diff: &RecordDiff) -> Result<bool, StoreError> {
        let [hash, owned, retained, lease, _init] = self.session_keys(id);
        let mut invocation = self.apply.key(&hash);
        invocation.key(&owned).key(&retained).key(&lease);
        let binds: Vec<(&str, &String)> = [("tenant", &diff.bind_tenant), ("principal", &diff.bind_principal)]
            .into_iter()
            .filter_map(|(f, v)| v.as_ref().map(|v| (f, v)))
            .collect();
        invocation.arg(binds.len());
        for (field, value) in binds {
            invocation.arg(field).arg(value);
        }
        match &diff.default_sandbox {
            None => invocation.arg("keep"),
            Some(None) => invocation.arg("del"),
            Some(Some(id)) => invocation.arg("set").arg(id),
        };
        for list in [&diff.owned_add, &diff.owned_remove, &diff.retained_add, &diff.retained_remove] {
            invocation.arg(list.len());
            for item in list {
                invocation.arg(item);
            }
        }
        let mut conn = self.redis.conn();
        let applied: i64 = self.redis.bounded(invocation.invoke_async(&mut conn)).await?;
        Ok(applied == 1)
    }

    /// Ends a session now (DELETE); false if it was unknown.
    pub async fn end_now(&self, id: &str) -> Result<bool, StoreError> {
        let [hash, ..] = self.session_keys(id);
        let mut invocation = self.end_now.key(&hash);
        invocation.key(self.redis.key("expiry")).arg(id);
        let mut conn = self.redis.conn();
        let ended: i64 = self.redis.bounded(invocation.invoke_async(&mut conn)).await?;
        Ok(ended == 1)
    }

    /// Sessions whose idle deadline has passed (at most `limit`).
    pub async fn expired(&self, limit: isize) -> Result<Vec<String>, StoreError> {
        let mut conn = self.redis.conn();
        self.redis.bounded(conn.zrangebyscore_limit(self.redis.key("expiry"), "-inf", now_ms(), 0, limit)).await
    }

    /// Takes the cleanup lease of a session; returns its record when this replica got it.
    pub async fn lease(&self, id: &str, holder: &str) -> Result<Option<Record>, StoreError> {
        let [hash, owned, retained, lease, _init] = self.session_keys(id);
        let mut conn = self.redis.conn();
        let options = redis::SetOptions::default()
            .conditional_set(redis::ExistenceCheck::NX)
            .with_expiration(redis::SetExpiry::PX(self.lease.as_millis() as u64));
        let got: Option<String> = self.redis.bounded(conn.set_options(&lease, holder, options)).await?;
        if got.is_none() {
            return Ok(None);
        }
        let mut pipe = redis::pipe();
        pipe.hgetall(&hash).smembers(&owned).smembers(&retained);
        let (fields, owned, retained): (Vec<(String, String)>, BTreeSet<String>, BTreeSet<String>) =
            self.redis.bounded(pipe.query_async(&mut conn)).await?;
        let mut record = Record { owned, retained, ..Record::default() };
        for (field, value) in fields {
            match field.as_str() {
                "tenant" => record.tenant = Some(value),
                "principal" => record.principal = Some(value),
                "default" => record.default_sandbox = Some(value),
                _ => {}
            }
        }
        Ok(Some(record))
    }

    /// Records that an owned sandbox has been killed (so a replica taking the cleanup over skips it).
    pub async fn killed(&self, id: &str, sandbox_id: &str) -> Result<(), StoreError> {
        let [_hash, owned, ..] = self.session_keys(id);
        let mut conn = self.redis.conn();
        self.redis.bounded(conn.srem::<_, _, ()>(&owned, sandbox_id)).await
    }

    /// Deletes a cleaned-up session (only while `holder` still holds its lease).
    pub async fn finish(&self, id: &str, holder: &str) -> Result<bool, StoreError> {
        let [hash, owned, retained, lease, init] = self.session_keys(id);
        let mut invocation = self.finish.key(&hash);
        invocation.key(&owned).key(&retained).key(&lease).key(&init).key(self.redis.key("expiry")).arg(id).arg(holder);
        let mut conn = self.redis.conn();
        let done: i64 = self.redis.bounded(invocation.invoke_async(&mut conn)).await?;
        Ok(done == 1)
    }
}

#[async_trait::async_trait]
impl SessionStore for RedisStore {
    async fn load(&self, session_id: &str) -> Result<Option<RmcpSessionState>, SessionStoreError> {
        let [.., init] = self.session_keys(session_id);
        let mut conn = self.redis.conn();
        let data: Option<String> = self.redis.bounded(conn.get(&init)).await?;
        match data {
            Some(data) => Ok(Some(serde_json::from_str(&data)?)),
            None => Ok(None),
        }
    }

    async fn store(&self, session_id: &str, state: &RmcpSessionState) -> Result<(), SessionStoreError> {
        let [.., init] = self.session_keys(session_id);
        let data = serde_json::to_string(state)?;
        let mut conn = self.redis.conn();
        // Lives as long as the session: deleted with it by `finish` (and by rmcp on DELETE).
        self.redis.bounded(conn.set::<_, _, ()>(&init, data)).await?;
        Ok(())
    }

    async fn delete(&self, session_id: &str) -> Result<(), SessionStoreError> {
        // The session's keys go with its cleanup (`finish`), which must still find it after a DELETE.
        let _ = session_id;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn diff_is_set_based_and_binds_once() {
        let before = Record {
            tenant: Some("acme".into()),
            owned: ["a".to_string(), "b".to_string()].into(),
            default_sandbox: Some("a".into()),
            ..Record::default()
        };
        let mut after = before.clone();
        after.tenant = Some("other".into());
        after.principal = Some("token:acme".into());
        after.owned.remove("a");
        after.owned.insert("c".into());
        after.retained.insert("b".into());
        after.default_sandbox = None;
        let diff = RecordDiff::between(&before, &after);
        assert_eq!(diff.bind_tenant, None, "a bound tenant never changes");
        assert_eq!(diff.bind_principal.as_deref(), Some("token:acme"));
        assert_eq!(diff.default_sandbox, Some(None));
        assert_eq!((diff.owned_add, diff.owned_remove), (vec!["c".to_string()], vec!["a".to_string()]));
        assert_eq!(diff.retained_add, vec!["b".to_string()]);
        assert!(RecordDiff::between(&before, &before).is_empty());
    }
}
