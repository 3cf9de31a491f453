//! Hardened HTTP/1 serving shared by every listener (the gateway's main and
//! admin listeners, the local provider): a header-read timeout (slowloris), an
//! idle timeout for connections with no request in flight, a cap on
//! concurrent connections that evicts an idle connection instead of refusing
//! new ones (silent ones before ones that have been served, so a flood of idle
//! or trickling connections cannot lock out or reset a real client, and a
//! request in flight is never cut), and accept errors
//! (EMFILE…) that back off, evict an idle connection and never spin.
//! Graceful shutdown: stop accepting, let in-flight requests finish.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

/// Limits of one listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListenLimits {
    /// Most connections open at once (further ones evict the longest-idle connection, or wait).
    pub max_connections: usize,
    /// Time a client has to send a request's headers once the server waits for them.
    pub header_read_timeout: Duration,
    /// A connection with no request in flight for this long is closed.
    pub idle_timeout: Duration,
}

impl Default for ListenLimits {
    fn default() -> Self {
        ListenLimits {
            max_connections: DEFAULT_MAX_CONNECTIONS,
            header_read_timeout: Duration::from_secs(DEFAULT_HEADER_READ_TIMEOUT_SECS),
            idle_timeout: Duration::from_secs(DEFAULT_IDLE_TIMEOUT_SECS),
        }
    }
}

/// Default cap on concurrent connections per listener.
pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;
/// Default header-read timeout, seconds.
pub const DEFAULT_HEADER_READ_TIMEOUT_SECS: u64 = 10;
/// Default idle timeout, seconds.
pub const DEFAULT_IDLE_TIMEOUT_SECS: u64 = 30;
/// How often connections are checked for idleness.
const IDLE_CHECK: Duration = Duration::from_millis(500);
/// Longest back-off after accept errors.
const MAX_ACCEPT_BACKOFF: Duration = Duration::from_secs(1);

/// Raises the soft descriptor limit to the hard one (best effort) and returns the soft limit now
/// in force.
pub fn raise_fd_limit() -> u64 {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < hard => match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            Ok(()) => hard,
            Err(_) => soft,
        },
        Ok((soft, _)) => soft,
        Err(_) => 1024,
    }
}

impl ListenLimits {
    /// The cap actually used: at most a quarter of the descriptor limit, so connections of one
    /// listener can never take the descriptors that provider calls and sandbox spawns need.
    pub fn effective_max_connections(&self, fd_limit: u64) -> usize {
        let share = (fd_limit / 4).max(16);
        self.max_connections.clamp(1, usize::try_from(share).unwrap_or(usize::MAX))
    }
}

/// Live state of one connection.
struct ConnState {
    /// Requests whose response (head or body) is still being produced.
    busy: AtomicUsize,
    /// Milliseconds since the listener started, when the connection last became idle.
    idle_since_ms: AtomicU64,
    /// Whether a response has been completed on it: a client that has been served (a gateway's
    /// pooled keep-alive connection) is evicted only after every connection that never was.
    served: AtomicBool,
    close: CancellationToken,
}

struct Registry {
    started: Instant,
    conns: Mutex<HashMap<u64, Arc<ConnState>>>,
}

impl Registry {
    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// Closes an idle connection to make room: first the longest-idle one that never completed a
    /// request (a flood of silent or slowloris connections cannot push out a client that is
    /// being served, whose keep-alive connection would otherwise be reset under its next
    /// request), then the longest-idle of the rest. False if every connection is busy.
    fn evict_longest_idle(&self) -> bool {
        let conns = crate::sync::lock(&self.conns);
        let victim = conns
            .values()
            .filter(|c| c.busy.load(Ordering::SeqCst) == 0 && !c.close.is_cancelled())
            .min_by_key(|c| (c.served.load(Ordering::SeqCst), c.idle_since_ms.load(Ordering::SeqCst)));
        match victim {
            Some(conn) => {
                conn.close.cancel();
                true
            }
            None => false,
        }
    }
}

/// Marks a connection busy while a response is being produced (until its body is dropped).
struct BusyGuard {
    conn: Arc<ConnState>,
    registry: Arc<Registry>,
}

impl BusyGuard {
    fn new(conn: Arc<ConnState>, registry: Arc<Registry>) -> Self {
        conn.busy.fetch_add(1, Ordering::SeqCst);
        BusyGuard { conn, registry }
    }
}

impl Drop for BusyGuard {
    fn drop(&mut self) {
        self.conn.idle_since_ms.store(self.registry.now_ms(), Ordering::SeqCst);
        self.conn.served.store(true, Ordering::SeqCst);
        self.conn.busy.fetch_sub(1, Ordering::SeqCst);
    }
}

fn is_connection_error(err: &std::io::Error) -> bool {
    matches!(
        err.kind(),
        std::io::ErrorKind::ConnectionRefused
            | std::io::ErrorKind::ConnectionAborted
            | std::io::ErrorKind::ConnectionReset
    )
}

/// Serves `app` on `listener` with `limits` until `stop` completes, then waits for open
/// connections to finish their requests (idle ones close at once). `name` labels log lines.
pub async fn serve(
    name: &'static str,
    listener: TcpListener,
    app: Router,
    limits: ListenLimits,
    stop: impl Future<Output = ()> + Send + 'static,
) {
    let max = limits.effective_max_connections(raise_fd_limit());
    tracing::debug!(listener = name, max_connections = max, ?limits, "serving");
    let permits = Arc::new(Semaphore::new(max));
    let registry = Arc::new(Registry { started: Instant::now(), conns: Mutex::new(HashMap::new()) });
    let shutdown = CancellationToken::new();
    let mut stop = std::pin::pin!(stop);
    let mut next_id = 0u64;
    let mut backoff = Duration::from_millis(10);
    let mut last_error_log: Option<Instant> = None;
    let mut suppressed = 0u64;
    loop {
        // A slot first: when full, make room by closing the longest-idle connection.
        let permit = match Arc::clone(&permits).try_acquire_owned() {
            Ok(permit) => permit,
            Err(_) => {
                registry.evict_longest_idle();
                tokio::select! {
                    _ = &mut stop => break,
                    permit = Arc::clone(&permits).acquire_owned() => match permit {
                        Ok(permit) => permit,
                        Err(_) => break,
                    },
                }
            }
        };
        let accepted = tokio::select! {
            _ = &mut stop => break,
            accepted = listener.accept() => accepted,
        };
        let (tcp, _peer) = match accepted {
            Ok(conn) => {
                backoff = Duration::from_millis(10);
                conn
            }
            Err(err) if is_connection_error(&err) => continue,
            Err(err) => {
                // EMFILE/ENFILE/ENOMEM: free a descriptor if we can, back off, log at most once a second.
                registry.evict_longest_idle();
                if last_error_log.is_none_or(|t| t.elapsed() >= Duration::from_secs(1)) {
                    tracing::warn!(listener = name, error = %err, suppressed, "accept error; backing off");
                    last_error_log = Some(Instant::now());
                    suppressed = 0;
                } else {
                    suppressed += 1;
                }
                tokio::select! {
                    _ = &mut stop => break,
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(MAX_ACCEPT_BACKOFF);
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        next_id += 1;
        let id = next_id;
        let conn = Arc::new(ConnState {
            busy: AtomicUsize::new(0),
            idle_since_ms: AtomicU64::new(registry.now_ms()),
            served: AtomicBool::new(false),
            close: CancellationToken::new(),
        });
        crate::sync::lock(&registry.conns).insert(id, Arc::clone(&conn));
        tokio::spawn(serve_connection(
            tcp,
            app.clone(),
            limits,
            conn,
            Arc::clone(&registry),
            shutdown.clone(),
            id,
            permit,
        ));
    }
    // Stop: idle connections close now, busy ones after their requests.
    shutdown.cancel();
    let _ = permits.acquire_many(max as u32).await;
}

#[allow(clippy::too_many_arguments)]
async fn serve_connection(
    tcp: tokio::net::TcpStream,
    app: Router,
    limits: ListenLimits,
    conn: Arc<ConnState>,
    registry: Arc<Registry>,
    shutdown: CancellationToken,
    id: u64,
    _permit: tokio::sync::OwnedSemaphorePermit,
) {
    let service_conn = Arc::clone(&conn);
    let service_registry = Arc::clone(&registry);
    let service = hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
        let guard = BusyGuard::new(Arc::clone(&service_conn), Arc::clone(&service_registry));
        let app = app.clone();
        async move {
            let response = match tower::ServiceExt::oneshot(app, request.map(Body::new)).await {
                Ok(response) => response,
                Err(never) => match never {},
            };
            Ok::<_, Infallible>(crate::guarded_body::guard_response(response, guard))
        }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder.timer(TokioTimer::new()).header_read_timeout(limits.header_read_timeout);
    let connection = builder.serve_connection(TokioIo::new(tcp), service).with_upgrades();
    let mut connection = std::pin::pin!(connection);
    let mut check = tokio::time::interval(IDLE_CHECK);
    let mut draining = false;
    loop {
        tokio::select! {
            _ = connection.as_mut() => break,
            _ = conn.close.cancelled() => break, // evicted while idle: drop it
            _ = shutdown.cancelled(), if !draining => {
                draining = true;
                if conn.busy.load(Ordering::SeqCst) == 0 {
                    break;
                }
                connection.as_mut().graceful_shutdown();
            }
            _ = check.tick() => {
                let idle_ms = registry.now_ms().saturating_sub(conn.idle_since_ms.load(Ordering::SeqCst));
                if conn.busy.load(Ordering::SeqCst) == 0 && idle_ms >= limits.idle_timeout.as_millis() as u64 {
                    break;
                }
            }
        }
    }
    crate::sync::lock(&registry.conns).remove(&id);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_keeps_descriptor_headroom() {
        let limits = ListenLimits { max_connections: 10_000, ..Default::default() };
        assert_eq!(limits.effective_max_connections(1024), 256);
        assert_eq!(limits.effective_max_connections(1 << 20), 10_000);
        assert_eq!(ListenLimits { max_connections: 0, ..limits }.effective_max_connections(1024), 1);
    }

    fn conn(idle_since_ms: u64, served: bool, busy: usize) -> Arc<ConnState> {
        Arc::new(ConnState {
            busy: AtomicUsize::new(busy),
            idle_since_ms: AtomicU64::new(idle_since_ms),
            served: AtomicBool::new(served),
            close: CancellationToken::new(),
        })
    }

    #[test]
    fn eviction_spares_served_connections_until_no_silent_one_is_left() {
        let registry = Registry { started: Instant::now(), conns: Mutex::new(HashMap::new()) };
        let served_oldest = conn(1, true, 0);
        let silent_new = conn(50, false, 0);
        let silent_old = conn(10, false, 0);
        let busy = conn(0, false, 1);
        for (id, c) in [&served_oldest, &silent_new, &silent_old, &busy].into_iter().enumerate() {
            registry.conns.lock().unwrap().insert(id as u64, Arc::clone(c));
        }
        let cancelled = || [&silent_old, &silent_new, &served_oldest].map(|c| c.close.is_cancelled());
        assert!(registry.evict_longest_idle());
        assert_eq!(cancelled(), [true, false, false], "the longest-idle silent connection goes first");
        assert!(registry.evict_longest_idle());
        assert_eq!(cancelled(), [true, true, false], "then the other silent one, though served is older");
        assert!(registry.evict_longest_idle());
        assert_eq!(cancelled(), [true, true, true], "served connections go last, not never");
        assert!(!busy.close.is_cancelled(), "a busy connection is never evicted");
        assert!(!registry.evict_longest_idle(), "only a busy connection is left");
    }
}
