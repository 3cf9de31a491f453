//! Kept-alive HTTP/1.1 connections from the data-plane proxy to the sandboxes' agents, by agent
//! socket: a request goes out on an idle connection to its own sandbox's agent when there is one, on
//! a new one otherwise, and its connection comes back once the agent's answer has been read to its
//! end (a connection whose answer was dropped half-read is closed, never reused). Without it every
//! data-plane request paid a Unix connect, an HTTP handshake and a connection task in the provider,
//! and an accept and a connection task in the agent.
//!
//! Connections are keyed by the agent's socket path, which is the sandbox's own: a connection only
//! ever carries requests for the sandbox it was opened to. An idle connection is never reused after
//! [`IDLE_FOR`] and is closed by the next sweep (one every [`IDLE_FOR`], so it lives at most twice
//! that: a burst leaves no connections behind in the agent, whose memory the sandbox pays), or
//! when its agent goes away.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::Body;
use http::{Request, Response};
use http_body::{Frame, SizeHint};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;

/// The body of a request forwarded to an agent.
pub type AgentBody = http_body_util::Limited<Body>;
type Sender = SendRequest<AgentBody>;

/// Idle connections kept per agent: enough for a burst of concurrent calls on one sandbox.
const MAX_IDLE_PER_AGENT: usize = 32;
/// An idle connection older than this is closed rather than reused.
pub const IDLE_FOR: Duration = Duration::from_secs(10);

/// Whether an idle connection put back at `since` may still carry a request at `now`.
fn fresh(sender: &Sender, since: Instant, now: Instant) -> bool {
    !sender.is_closed() && now.duration_since(since) < IDLE_FOR
}

/// Why a request could not be forwarded.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("cannot connect to the agent: {0}")]
    Connect(#[source] std::io::Error),
    #[error("HTTP handshake with the agent failed: {0}")]
    Handshake(#[source] hyper::Error),
    #[error("{0}")]
    Request(#[source] hyper::Error),
}

/// Idle connections to agents, by socket path.
#[derive(Default)]
pub struct AgentConnections {
    idle: Mutex<HashMap<PathBuf, Vec<(Sender, Instant)>>>,
    /// Whether the sweep task runs (started by the first connection kept).
    sweeping: AtomicBool,
}

impl AgentConnections {
    /// Sends `request` to the agent listening on `socket`: on an idle connection when one is ready,
    /// else on a new one. A request that a reused connection could not take (the agent closed it
    /// meanwhile) goes out again on a new connection; one that was sent is never repeated.
    pub async fn send(
        self: &Arc<Self>,
        socket: &Path,
        request: Request<AgentBody>,
    ) -> Result<Response<Body>, AgentError> {
        let mut request = request;
        if let Some(mut sender) = self.take(socket).await {
            match sender.try_send_request(request).await {
                Ok(response) => return Ok(self.answer(socket, sender, response)),
                Err(mut err) => match err.take_message() {
                    Some(unsent) => request = unsent,
                    None => return Err(AgentError::Request(err.into_error())),
                },
            }
        }
        let stream = tokio::net::UnixStream::connect(socket).await.map_err(AgentError::Connect)?;
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.map_err(AgentError::Handshake)?;
        tokio::spawn(async move {
            if let Err(err) = conn.await {
                tracing::debug!(%err, "agent connection ended with an error");
            }
        });
        let response = sender.send_request(request).await.map_err(AgentError::Request)?;
        Ok(self.answer(socket, sender, response))
    }

    /// The agent's answer, its body returning `sender` to the pool once read to its end.
    fn answer(self: &Arc<Self>, socket: &Path, sender: Sender, response: Response<Incoming>) -> Response<Body> {
        let (parts, incoming) = response.into_parts();
        let back = Some(PutBack { pool: Arc::clone(self), socket: socket.to_path_buf(), sender });
        let body = if http_body::Body::is_end_stream(&incoming) {
            // Nothing to read (no one would poll it to its end): the connection is free now.
            if let Some(back) = back {
                back.put();
            }
            Body::new(incoming)
        } else {
            Body::new(Returning { inner: incoming, back })
        };
        Response::from_parts(parts, body)
    }

    /// An idle connection to `socket` ready for a request (the most recently used first).
    async fn take(&self, socket: &Path) -> Option<Sender> {
        loop {
            let (mut sender, since) = {
                let mut idle = crate::sync::lock(&self.idle);
                let list = idle.get_mut(socket)?;
                let entry = list.pop();
                if list.is_empty() {
                    idle.remove(socket);
                }
                entry?
            };
            if !fresh(&sender, since, Instant::now()) {
                continue;
            }
            // Its last answer was read to the end: the connection is idle, or about to be once its
            // task has seen that; a closed one fails here.
            if let Ok(Ok(())) = tokio::time::timeout(Duration::from_millis(50), sender.ready()).await {
                return Some(sender);
            }
        }
    }

    fn put(&self, socket: PathBuf, sender: Sender) {
        if sender.is_closed() {
            return;
        }
        let now = Instant::now();
        let mut idle = crate::sync::lock(&self.idle);
        let list = idle.entry(socket).or_default();
        list.retain(|(s, since)| fresh(s, *since, now));
        if list.len() < MAX_IDLE_PER_AGENT {
            list.push((sender, now));
        }
    }

    /// Starts the task closing expired idle connections, once; it ends with the pool.
    fn start_sweeping(self: &Arc<Self>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        if self.sweeping.swap(true, Ordering::Relaxed) {
            return;
        }
        let pool = Arc::downgrade(self);
        runtime.spawn(async move {
            let mut tick = tokio::time::interval(IDLE_FOR);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(pool) = pool.upgrade() else { break };
                let now = Instant::now();
                crate::sync::lock(&pool.idle).retain(|_, list| {
                    list.retain(|(s, since)| fresh(s, *since, now));
                    !list.is_empty()
                });
            }
        });
    }

    /// Idle connections held (for tests).
    pub fn idle_count(&self) -> usize {
        crate::sync::lock(&self.idle).values().map(Vec::len).sum()
    }
}

struct PutBack {
    pool: Arc<AgentConnections>,
    socket: PathBuf,
    sender: Sender,
}

impl PutBack {
    fn put(self) {
        self.pool.start_sweeping();
        self.pool.put(self.socket, self.sender);
    }
}

/// An agent's answer body: hands its connection back to the pool when read to its end. Dropped
/// before that, it drops the connection with it (hyper closes a connection whose body was not read).
struct Returning {
    inner: Incoming,
    back: Option<PutBack>,
}

impl http_body::Body for Returning {
    type Data = bytes::Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(None) => {
                if let Some(back) = self.back.take() {
                    back.put();
                }
            }
            // The last frame of a body with a length: its reader may stop polling here.
            Poll::Ready(Some(Ok(_))) if self.inner.is_end_stream() => {
                if let Some(back) = self.back.take() {
                    back.put();
                }
            }
            Poll::Ready(Some(Err(_))) => self.back = None,
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use http_body_util::BodyExt;

    use super::*;

    /// A real HTTP/1.1 server on a Unix socket: `/len` answers with a length, `/chunked` with a
    /// chunked body of two frames, `/close` with `Connection: close`; counts its accepted connections.
    async fn agent(dir: &Path) -> (PathBuf, Arc<AtomicUsize>) {
        let socket = dir.join("agent.sock");
        let listener = tokio::net::UnixListener::bind(&socket).unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = Arc::clone(&accepted);
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                let service = hyper::service::service_fn(|req: Request<Incoming>| async move {
                    let response = match req.uri().path() {
                        "/chunked" => {
                            let frames = futures_util::stream::iter([
                                Ok::<_, std::convert::Infallible>(Frame::data(bytes::Bytes::from_static(b"a"))),
                                Ok(Frame::data(bytes::Bytes::from_static(b"b"))),
                            ]);
                            Response::new(Body::new(http_body_util::StreamBody::new(frames)))
                        }
                        "/close" => Response::builder().header("connection", "close").body(Body::from("bye")).unwrap(),
                        _ => Response::new(Body::from("ok")),
                    };
                    Ok::<_, std::convert::Infallible>(response)
                });
                tokio::spawn(
                    hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service),
                );
            }
        });
        (socket, accepted)
    }

    fn get(path: &str) -> Request<AgentBody> {
        Request::get(path).header("host", "localhost").body(http_body_util::Limited::new(Body::empty(), 1024)).unwrap()
    }

    async fn read(response: Response<Body>) -> String {
        String::from_utf8(response.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap()
    }

    #[tokio::test]
    async fn answers_read_to_the_end_free_their_connection_for_the_next_request() {
        let dir = tempfile::tempdir().unwrap();
        let (socket, accepted) = agent(dir.path()).await;
        let pool = Arc::new(AgentConnections::default());
        for path in ["/len", "/chunked", "/len", "/chunked"] {
            let answer = read(pool.send(&socket, get(path)).await.unwrap()).await;
            assert_eq!(answer, if path == "/len" { "ok" } else { "ab" });
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 1, "four requests in turn share one connection");
        assert_eq!(pool.idle_count(), 1);
    }

    #[tokio::test]
    async fn a_half_read_answer_closes_its_connection_and_the_next_request_opens_another() {
        let dir = tempfile::tempdir().unwrap();
        let (socket, accepted) = agent(dir.path()).await;
        let pool = Arc::new(AgentConnections::default());
        let mut body = pool.send(&socket, get("/chunked")).await.unwrap().into_body();
        let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(&first[..], b"a");
        drop(body);
        assert_eq!(pool.idle_count(), 0, "a connection with unread bytes is never reused");
        assert_eq!(read(pool.send(&socket, get("/len")).await.unwrap()).await, "ok");
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_connection_the_agent_closed_is_not_reused() {
        let dir = tempfile::tempdir().unwrap();
        let (socket, accepted) = agent(dir.path()).await;
        let pool = Arc::new(AgentConnections::default());
        assert_eq!(read(pool.send(&socket, get("/close")).await.unwrap()).await, "bye");
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(read(pool.send(&socket, get("/len")).await.unwrap()).await, "ok");
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn connections_are_kept_per_agent() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let ((socket_a, accepted_a), (socket_b, accepted_b)) = (agent(a.path()).await, agent(b.path()).await);
        let pool = Arc::new(AgentConnections::default());
        for socket in [&socket_a, &socket_b, &socket_a, &socket_b] {
            assert_eq!(read(pool.send(socket, get("/len")).await.unwrap()).await, "ok");
        }
        assert_eq!((accepted_a.load(Ordering::SeqCst), accepted_b.load(Ordering::SeqCst)), (1, 1));
        assert_eq!(pool.idle_count(), 2);
    }
}
