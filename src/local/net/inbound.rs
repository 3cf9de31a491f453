//! Inbound traffic, the E2B way: a request whose `Host` is
//! `{port}-{sandboxID}.{domain}` is forwarded to that port inside the
//! sandbox's network namespace (its loopback, so servers bound to `0.0.0.0`
//! or `127.0.0.1` are reachable), with HTTP upgrades (WebSocket) spliced
//! through. A sandbox created with `allowPublicTraffic: false` requires its
//! traffic access token in `e2b-traffic-access-token` (compared in constant
//! time, stripped before forwarding); a refusal is E2B's 403 with
//! `{sandboxId, message, code}`.

use std::net::{Ipv4Addr, SocketAddr};
use std::os::fd::OwnedFd;

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use http::{HeaderValue, Request, StatusCode, header};
use hyper_util::rt::TokioIo;
use subtle::ConstantTimeEq;

use crate::e2b::wire::HEADER_TRAFFIC_ACCESS_TOKEN;

/// `{port}-{sandboxID}` from the first label of a `Host` value, if it has that form.
pub fn parse_host(host: &str) -> Option<(u16, &str)> {
    let host = host.rsplit_once(':').filter(|_| !host.starts_with('[')).map_or(host, |(name, _)| name);
    let label = host.split('.').next()?;
    let (port, id) = label.split_once('-')?;
    if id.is_empty() || !id.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()) {
        return None;
    }
    let port: u16 = port.parse().ok().filter(|p| *p > 0)?;
    Some((port, id))
}

/// Why a request for a non-public sandbox's port was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrafficRefusal {
    /// No `e2b-traffic-access-token` header.
    Missing,
    /// A token that is not this sandbox's (or the sandbox has none to compare with).
    Invalid,
}

/// Whether the request may reach a port of a sandbox: any request when it is public
/// (`allow_public`), else only one carrying its `token`. A non-public sandbox without a token
/// refuses everything.
pub fn check_traffic(req: &Request<Body>, allow_public: bool, token: Option<&str>) -> Result<(), TrafficRefusal> {
    if allow_public {
        return Ok(());
    }
    let Some(given) = req.headers().get(HEADER_TRAFFIC_ACCESS_TOKEN) else {
        return Err(TrafficRefusal::Missing);
    };
    match token {
        Some(token) if !token.is_empty() && bool::from(given.as_bytes().ct_eq(token.as_bytes())) => Ok(()),
        _ => Err(TrafficRefusal::Invalid),
    }
}

/// The answer to a refused request, in the shape of E2B's client proxy (403,
/// `{"sandboxId", "message", "code": 403}`), saying which of the two went wrong.
pub fn refusal(sandbox_id: &str, why: TrafficRefusal) -> Response {
    let what = match why {
        TrafficRefusal::Missing => format!("the '{HEADER_TRAFFIC_ACCESS_TOKEN}' header is missing"),
        TrafficRefusal::Invalid => format!("the token in the '{HEADER_TRAFFIC_ACCESS_TOKEN}' header is invalid"),
    };
    let message = format!(
        "sandbox {sandbox_id} only accepts requests carrying its traffic access token (trafficAccessToken of its \
         create or connect response): {what}"
    );
    let body = serde_json::json!({ "sandboxId": sandbox_id, "message": message, "code": 403 });
    (StatusCode::FORBIDDEN, axum::Json(body)).into_response()
}

fn error(status: StatusCode, message: String) -> Response {
    let body = serde_json::json!({ "code": status.as_u16(), "message": message });
    (status, axum::Json(body)).into_response()
}

/// Forwards one request to `port` inside the namespace `netns`.
pub async fn forward(netns: &OwnedFd, sandbox_id: &str, port: u16, mut req: Request<Body>) -> Response {
    let socket = {
        let netns = match netns.try_clone() {
            Ok(fd) => fd,
            Err(err) => return error(StatusCode::BAD_GATEWAY, format!("cannot reach sandbox {sandbox_id}: {err}")),
        };
        match tokio::task::spawn_blocking(move || super::netns::tcp_socket_in(&netns)).await {
            Ok(Ok(socket)) => socket,
            _ => return error(StatusCode::BAD_GATEWAY, format!("cannot reach sandbox {sandbox_id}")),
        }
    };
    let connect = async {
        let socket = tokio::net::TcpSocket::from_std_stream(socket);
        socket.connect(SocketAddr::from((Ipv4Addr::LOCALHOST, port))).await
    };
    let stream = match tokio::time::timeout(std::time::Duration::from_secs(10), connect).await {
        Ok(Ok(stream)) => stream,
        _ => {
            return error(
                StatusCode::BAD_GATEWAY,
                format!("The sandbox {sandbox_id} is running but port {port} is not open inside it"),
            );
        }
    };
    let _ = stream.set_nodelay(true);
    let (mut sender, conn) = match hyper::client::conn::http1::handshake(TokioIo::new(stream)).await {
        Ok(pair) => pair,
        Err(err) => return error(StatusCode::BAD_GATEWAY, format!("port {port} in sandbox {sandbox_id}: {err}")),
    };
    tokio::spawn(async move {
        let _ = conn.with_upgrades().await;
    });
    let upgrade_from_client = hyper::upgrade::on(&mut req);
    let (mut parts, body) = req.into_parts();
    parts.headers.remove(HEADER_TRAFFIC_ACCESS_TOKEN);
    let path = parts.uri.path_and_query().map(|p| p.as_str()).unwrap_or("/").to_owned();
    parts.uri = match path.parse() {
        Ok(uri) => uri,
        Err(_) => return error(StatusCode::BAD_REQUEST, "invalid request path".to_owned()),
    };
    parts.version = http::Version::HTTP_11;
    if !parts.headers.contains_key(header::HOST) {
        parts.headers.insert(header::HOST, HeaderValue::from_static("localhost"));
    }
    let outgoing = Request::from_parts(parts, body);
    let mut response = match sender.send_request(outgoing).await {
        Ok(response) => response,
        Err(err) => return error(StatusCode::BAD_GATEWAY, format!("port {port} in sandbox {sandbox_id}: {err}")),
    };
    if response.status() == StatusCode::SWITCHING_PROTOCOLS {
        let upgrade_from_sandbox = hyper::upgrade::on(&mut response);
        tokio::spawn(async move {
            if let (Ok(client), Ok(sandbox)) = (upgrade_from_client.await, upgrade_from_sandbox.await) {
                let mut client = TokioIo::new(client);
                let mut sandbox = TokioIo::new(sandbox);
                let _ = tokio::io::copy_bidirectional(&mut client, &mut sandbox).await;
            }
        });
    }
    response.map(Body::new)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_forms() {
        assert_eq!(parse_host("8000-abc123.sandbox.test"), Some((8000, "abc123")));
        assert_eq!(parse_host("49983-abc123.e2b.app:443"), Some((49983, "abc123")));
        assert_eq!(parse_host("8000-abc123"), Some((8000, "abc123")));
        assert_eq!(parse_host("8000-abc123:3000"), Some((8000, "abc123")));
        assert_eq!(parse_host("[::1]:3000"), None);
        assert_eq!(parse_host("127.0.0.1:3000"), None);
        assert_eq!(parse_host("localhost"), None);
        assert_eq!(parse_host("0-abc.x"), None);
        assert_eq!(parse_host("70000-abc.x"), None);
        assert_eq!(parse_host("80-ABC.x"), None);
        assert_eq!(parse_host("80-.x"), None);
    }

    fn request(token: Option<&str>) -> Request<Body> {
        let mut builder = Request::builder().uri("/").header(header::HOST, "8000-abc.x");
        if let Some(token) = token {
            builder = builder.header(HEADER_TRAFFIC_ACCESS_TOKEN, token);
        }
        builder.body(Body::empty()).unwrap()
    }

    #[test]
    fn traffic_token_rules() {
        let own = "0123456789abcdef0123456789abcdef01234567";
        assert_eq!(check_traffic(&request(None), true, None), Ok(()));
        assert_eq!(check_traffic(&request(Some("anything")), true, Some(own)), Ok(()));
        assert_eq!(check_traffic(&request(Some(own)), false, Some(own)), Ok(()));
        assert_eq!(check_traffic(&request(None), false, Some(own)), Err(TrafficRefusal::Missing));
        assert_eq!(check_traffic(&request(Some("wrong")), false, Some(own)), Err(TrafficRefusal::Invalid));
        assert_eq!(check_traffic(&request(Some(&own[..39])), false, Some(own)), Err(TrafficRefusal::Invalid));
        assert_eq!(check_traffic(&request(Some("")), false, Some(own)), Err(TrafficRefusal::Invalid));
        // Not public but no token recorded: nothing gets in, not even an empty header.
        assert_eq!(check_traffic(&request(Some("")), false, None), Err(TrafficRefusal::Invalid));
        assert_eq!(check_traffic(&request(Some("")), false, Some("")), Err(TrafficRefusal::Invalid));
    }
}
