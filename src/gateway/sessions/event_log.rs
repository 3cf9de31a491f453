//! The SSE event log of legacy sessions in Redis (rmcp's `EventStore`, what
//! `Last-Event-ID` replays), and who may replay it.
//!
//! A request's SSE stream is written by the one replica serving that request,
//! so its events get their ids here (`<ms>-<seq>`, strictly increasing in this
//! process) and are written in the background by one writer that sends each
//! batch as a single pipeline: a tool call never waits for Redis to log its
//! events (and its priming event, which carries no message, is not written at
//! all: a replay from it needs only what follows). A resuming client loses nothing by it: an event it holds needs no
//! replay, and one written a moment later is found by the replay, which
//! follows an unfinished request stream until its response; graceful shutdown
//! flushes the queue ([`EventLog::flush_events`]). A session's standalone
//! (`<session>:common`) stream, which the replicas serving the session write
//! in turn, keeps Redis-assigned ids and is written at once.
//!
//! Every request stream is bound to the session that opened it (an owner key
//! beside the stream, queued before the client can see any of its event ids),
//! and a replay is given only to that session: `stream_belongs_to`.
//!
//! [`EventLog`] owns the writer and uses the session store's connections
//! (`redis_pool.rs`); the session store holds it (`RedisStore::events`).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::aio::ConnectionManager;
use rmcp::model::ServerJsonRpcMessage;
use rmcp::transport::streamable_http_server::session::{
    EventId, EventStore, EventStoreError, EventStream, ServerSseMessage,
};
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot};

use super::redis_pool::{RedisPool, StoreError, now_ms};

/// Events kept per SSE stream (older ones are trimmed).
const MAX_EVENTS_PER_STREAM: usize = 1000;
/// How often a replay polls for events another replica appends to a live request stream.
const REPLAY_POLL: Duration = Duration::from_millis(100);
/// Writes queued for the background writer before callers wait for room.
const QUEUE: usize = 8192;
/// Writes sent in one pipeline at most.
const MAX_BATCH: usize = 256;
/// How long a replay waits for the owner of a request stream to appear (its write may still be queued
/// on the replica serving the request).
const OWNER_WAIT: Duration = Duration::from_secs(2);

/// The suffix rmcp gives a session's standalone stream.
const COMMON_SUFFIX: &str = ":common";

/// An SSE event as stored (the id is the stream entry's).
#[derive(Serialize, Deserialize)]
struct StoredEvent {
    #[serde(skip_serializing_if = "Option::is_none", default)]
    message: Option<ServerJsonRpcMessage>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    retry_ms: Option<u64>,
}

/// One queued write.
enum Write {
    Event { key: String, entry: String, data: String },
    Owner { key: String, session: String },
    Flush(oneshot::Sender<()>),
}

/// The background writer's handle and the id generator (cheap to clone).
#[derive(Clone)]
pub struct EventWriter {
    queue: mpsc::Sender<Write>,
    last: Arc<Mutex<(u64, u64)>>,
}

impl EventWriter {
    /// Starts the writer on `conn`; every write expires after `ttl`, each batch is bounded by `timeout`.
    pub fn spawn(conn: ConnectionManager, ttl: Duration, timeout: Duration) -> Self {
        let (queue, rx) = mpsc::channel(QUEUE);
        tokio::spawn(run_writer(conn, rx, ttl.as_millis() as u64, timeout));
        Self { queue, last: Arc::new(Mutex::new((0, 0))) }
    }

    /// The next stream entry id of this process: `<ms>-<seq>`, strictly increasing.
    fn next_entry(&self) -> String {
        let mut last = crate::sync::lock(&self.last);
        let now = now_ms();
        *last = if now > last.0 { (now, 0) } else { (last.0, last.1 + 1) };
        format!("{}-{}", last.0, last.1)
    }

    async fn send(&self, write: Write) -> Result<(), StoreError> {
        self.queue.send(write).await.map_err(|_| StoreError::Unavailable("the event log writer has stopped".into()))
    }
}

/// Drains the queue in batches, one pipeline each; a failed batch is logged (the calls themselves got
/// their answers; only their replay is lost).
async fn run_writer(mut conn: ConnectionManager, mut rx: mpsc::Receiver<Write>, ttl_ms: u64, timeout: Duration) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    while rx.recv_many(&mut batch, MAX_BATCH).await > 0 {
        let mut pipe = redis::pipe();
        let mut writes = 0;
        let mut flushed = Vec::new();
        for write in batch.drain(..) {
            match write {
                Write::Event { key, entry, data } => {
                    pipe.cmd("XADD")
                        .arg(&key)
                        .arg("MAXLEN")
                        .arg("~")
                        .arg(MAX_EVENTS_PER_STREAM)
                        .arg(entry)
                        .arg("e")
                        .arg(data)
                        .ignore()
                        .cmd("PEXPIRE")
                        .arg(&key)
                        .arg(ttl_ms)
                        .ignore();
                    writes += 1;
                }
                Write::Owner { key, session } => {
                    pipe.cmd("SET").arg(key).arg(session).arg("PX").arg(ttl_ms).ignore();
                    writes += 1;
                }
                Write::Flush(done) => flushed.push(done),
            }
        }
        if writes > 0 {
            match tokio::time::timeout(timeout, pipe.query_async::<()>(&mut conn)).await {
                Ok(Ok(())) => {}
                Ok(Err(err)) => {
                    tracing::warn!(writes, error = %err, "SSE event log: cannot write to Redis (those events cannot be replayed)")
                }
                Err(_) => tracing::warn!(
                    writes,
                    "SSE event log: Redis did not answer within {timeout:?} (those events may not be replayable)"
                ),
            }
        }
        for done in flushed {
            let _ = done.send(());
        }
    }
}

/// How long SSE events (and their streams' owners) are kept: the session idle timeout, at least a minute.
fn event_ttl(idle: Duration) -> Duration {
    idle.max(Duration::from_secs(60))
}

/// Whether an event ends a request's SSE stream (its response or error).
fn is_terminal(event: &ServerSseMessage) -> bool {
    matches!(event.message.as_deref(), Some(ServerJsonRpcMessage::Response(_) | ServerJsonRpcMessage::Error(_)))
}

/// The SSE event log of legacy sessions (rmcp's `EventStore`; cheap to clone).
#[derive(Clone)]
pub struct EventLog {
    redis: RedisPool,
    /// The session idle timeout (bounds how long a replay follows a live stream).
    idle: Duration,
    writer: EventWriter,
}

impl EventLog {
    /// Starts the background writer on one connection of `redis`.
    pub fn spawn(redis: RedisPool, idle: Duration) -> Self {
        let writer = EventWriter::spawn(redis.conn(), event_ttl(idle), redis.timeout());
        Self { redis, idle, writer }
    }

    fn events_key(&self, stream_id: &str) -> String {
        self.redis.key(&format!("ev:{stream_id}"))
    }

    fn owner_key(&self, stream_id: &str) -> String {
        self.redis.key(&format!("ev:{stream_id}:owner"))
    }

    /// Binds a request stream to the session that opened it (queued: written before any later event of it).
    pub async fn bind_stream(&self, stream_id: &str, session_id: &str) -> Result<(), StoreError> {
        let write = Write::Owner { key: self.owner_key(stream_id), session: session_id.to_string() };
        self.writer.send(write).await
    }

    /// Whether `session_id` may replay the stream of `last_event_id` (its own request streams and its
    /// own standalone stream only).
    pub async fn stream_belongs_to(&self, last_event_id: &str, session_id: &str) -> Result<bool, StoreError> {
        let Some((stream_id, _)) = last_event_id.rsplit_once('#') else { return Ok(false) };
        if let Some(session) = stream_id.strip_suffix(COMMON_SUFFIX) {
            return Ok(session == session_id);
        }
        let key = self.owner_key(stream_id);
        let deadline = tokio::time::Instant::now() + OWNER_WAIT;
        loop {
            let mut conn = self.redis.conn();
            let owner: Option<String> = self.redis.bounded(redis::cmd("GET").arg(&key).query_async(&mut conn)).await?;
            match owner {
                Some(owner) => return Ok(owner == session_id),
                None if tokio::time::Instant::now() >= deadline => return Ok(false),
                None => tokio::time::sleep(REPLAY_POLL).await,
            }
        }
    }

    /// Waits (at most `timeout`) until every event queued so far is written (graceful shutdown).
    pub async fn flush_events(&self, timeout: Duration) {
        let (done, wait) = oneshot::channel();
        if self.writer.send(Write::Flush(done)).await.is_ok() && tokio::time::timeout(timeout, wait).await.is_err() {
            tracing::warn!("SSE event log: queued events not written within {timeout:?}");
        }
    }

    /// Events of `stream_id` after the entry `after` (exclusive), with their ids.
    async fn events_after(&self, stream_id: &str, after: &str) -> Result<Vec<ServerSseMessage>, StoreError> {
        let mut conn = self.redis.conn();
        let start = format!("({after}");
        let entries: Vec<(String, Vec<(String, String)>)> = self
            .redis
            .bounded(redis::cmd("XRANGE").arg(self.events_key(stream_id)).arg(start).arg("+").query_async(&mut conn))
            .await?;
        let mut events = Vec::with_capacity(entries.len());
        for (entry_id, fields) in entries {
            let Some((_, data)) = fields.into_iter().find(|(f, _)| f == "e") else { continue };
            let stored: StoredEvent = serde_json::from_str(&data).map_err(|e| StoreError::Corrupt(e.to_string()))?;
            let mut event = ServerSseMessage::default();
            event.event_id = Some(format!("{stream_id}#{entry_id}"));
            event.message = stored.message.map(Arc::new);
            event.retry = stored.retry_ms.map(Duration::from_millis);
            events.push(event);
        }
        Ok(events)
    }

    /// Writes a standalone-stream event now (Redis assigns the id: several replicas may write this stream).
    async fn store_common_event(&self, key: &str, data: String) -> Result<String, StoreError> {
        let mut pipe = redis::pipe();
        pipe.atomic()
            .cmd("XADD")
            .arg(key)
            .arg("MAXLEN")
            .arg("~")
            .arg(MAX_EVENTS_PER_STREAM)
            .arg("*")
            .arg("e")
            .arg(data)
            .cmd("PEXPIRE")
            .arg(key)
            .arg(event_ttl(self.idle).as_millis() as u64)
            .ignore();
        let mut conn = self.redis.conn();
        let (entry_id,): (String,) = self.redis.bounded(pipe.query_async(&mut conn)).await?;
        Ok(entry_id)
    }
}

#[async_trait::async_trait]
impl EventStore for EventLog {
    async fn store_event(&self, stream_id: &str, event: &ServerSseMessage) -> Result<EventId, EventStoreError> {
        let stored = StoredEvent {
            message: event.message.as_deref().cloned(),
            retry_ms: event.retry.map(|d| d.as_millis() as u64),
        };
        let data = serde_json::to_string(&stored)?;
        let key = self.events_key(stream_id);
        let entry = if stream_id.ends_with(COMMON_SUFFIX) {
            self.store_common_event(&key, data).await?
        } else if event.message.is_none() {
            // A priming event (a retry hint, no message): a replay from its id needs only the events after
            // it, so it gets an id in the stream's order and nothing is written.
            self.writer.next_entry()
        } else {
            let entry = self.writer.next_entry();
            self.writer.send(Write::Event { key, entry: entry.clone(), data }).await?;
            entry
        };
        Ok(format!("{stream_id}#{entry}"))
    }

    async fn replay_events_after(&self, last_event_id: &str) -> Result<EventStream, EventStoreError> {
        let (stream_id, entry_id) =
            last_event_id.rsplit_once('#').ok_or_else(|| StoreError::Corrupt("malformed Last-Event-ID".into()))?;
        let first = self.events_after(stream_id, entry_id).await?;
        // A request's stream that has not ended yet: follow it (its handler may run on another replica,
        // or its events may still be queued there) until the response arrives, bounded by the session
        // idle timeout.
        let follow = !stream_id.ends_with(COMMON_SUFFIX) && !first.iter().any(is_terminal);
        if !follow {
            return Ok(Box::pin(futures_util::stream::iter(first)));
        }
        let (tx, rx) = tokio::sync::mpsc::channel(64);
        let store = self.clone();
        let stream_id = stream_id.to_string();
        let mut last = first.last().and_then(|e| e.event_id.clone()).unwrap_or_else(|| last_event_id.to_string());
        tokio::spawn(async move {
            for event in first {
                if tx.send(event).await.is_err() {
                    return;
                }
            }
            let deadline = tokio::time::Instant::now() + store.idle;
            while tokio::time::Instant::now() < deadline && !tx.is_closed() {
                tokio::time::sleep(REPLAY_POLL).await;
                let after = last.rsplit_once('#').map(|(_, e)| e.to_string()).unwrap_or_default();
                let events = match store.events_after(&stream_id, &after).await {
                    Ok(events) => events,
                    Err(err) => {
                        tracing::warn!(error = %err, "SSE replay: cannot read further events");
                        continue;
                    }
                };
                for event in events {
                    let terminal = is_terminal(&event);
                    if let Some(id) = &event.event_id {
                        last = id.clone();
                    }
                    if tx.send(event).await.is_err() || terminal {
                        return;
                    }
                }
            }
        });
        Ok(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_ids_strictly_increase() {
        let last = Arc::new(Mutex::new((u64::MAX - 1, 0)));
        let (queue, _rx) = mpsc::channel(1);
        let writer = EventWriter { queue, last };
        let ids: Vec<(u64, u64)> = (0..1000)
            .map(|_| {
                let id = writer.next_entry();
                let (ms, seq) = id.split_once('-').unwrap();
                (ms.parse().unwrap(), seq.parse().unwrap())
            })
            .collect();
        assert!(ids.windows(2).all(|w| w[0] < w[1]), "ids must increase: {:?}", &ids[..3]);
    }
}
