//! Graceful shutdown's state, [`Drain`]: whether shutdown has begun, and the
//! count of `/mcp` POST requests until their response body has been fully sent
//! (an MCP tool result travels in the SSE body, after the handler returns),
//! so that graceful shutdown can wait for in-flight calls to be *delivered*:
//! the [`InFlight`] count and the middleware that keeps it; once shutdown has
//! begun, the middleware also closes each connection after its response
//! (`Connection: close`), so a client's next request opens a new connection,
//! which a load balancer sends to a ready replica.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::{HeaderValue, header};
use axum::middleware::Next;
use axum::response::Response;

/// Whether shutdown has begun, and the `/mcp` requests still in flight (a cheap handle: held by
/// `GatewayCore`, a clone handed to the middleware).
#[derive(Clone, Default)]
pub struct Drain {
    shutting_down: Arc<AtomicBool>,
    pub in_flight: Arc<InFlight>,
}

impl Drain {
    /// Marks the start of shutdown: readiness goes off and connections close after their response.
    pub fn begin(&self) {
        self.shutting_down.store(true, Ordering::SeqCst);
    }

    pub fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::SeqCst)
    }
}

/// Wraps every `/mcp` POST so it counts as in flight until its body ends or is dropped.
pub async fn track_in_flight(State(drain): State<Drain>, request: Request, next: Next) -> Response {
    let mut response = if request.method() != http::Method::POST {
        next.run(request).await
    } else {
        let guard = drain.in_flight.enter_owned();
        crate::guarded_body::guard_response(next.run(request).await, guard)
    };
    if drain.is_shutting_down() {
        response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

/// Counts `/mcp` POST requests in progress, responses included (graceful shutdown waits for zero).
#[derive(Default)]
pub struct InFlight {
    count: AtomicUsize,
    idle: tokio::sync::Notify,
}

/// Decrements the in-flight count when dropped.
pub struct InFlightGuard(Arc<InFlight>);

impl InFlight {
    /// Counts one request in flight until the guard is dropped.
    pub fn enter_owned(self: &Arc<Self>) -> InFlightGuard {
        self.count.fetch_add(1, Ordering::SeqCst);
        InFlightGuard(Arc::clone(self))
    }

    pub fn current(&self) -> usize {
        self.count.load(Ordering::SeqCst)
    }

    /// Waits until no call is in flight, or the timeout passes; returns the count left.
    pub async fn wait_idle(&self, timeout: Duration) -> usize {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let notified = self.idle.notified();
            if self.current() == 0 {
                return 0;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return self.current();
            }
        }
    }
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        let in_flight = &self.0;
        if in_flight.count.fetch_sub(1, Ordering::SeqCst) == 1 {
            in_flight.idle.notify_waiters();
        }
    }
}
