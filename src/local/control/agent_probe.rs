//! The provider's liveness probe of a sandbox agent (envd) over its Unix socket.

use std::path::Path;

use http::{Request, header};
use hyper_util::rt::TokioIo;

/// True if the agent behind `socket` answers `GET /health` with a 2xx within a second.
pub async fn agent_healthy(socket: &Path) -> bool {
    let attempt = async {
        let stream = tokio::net::UnixStream::connect(socket).await.ok()?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.ok()?;
        tokio::spawn(conn);
        let req = Request::get("/health")
            .header(header::HOST, "localhost")
            .body(http_body_util::Empty::<bytes::Bytes>::new())
            .ok()?;
        let resp = sender.send_request(req).await.ok()?;
        Some(resp.status().is_success())
    };
    tokio::time::timeout(std::time::Duration::from_secs(1), attempt).await.ok().flatten().unwrap_or(false)
}
