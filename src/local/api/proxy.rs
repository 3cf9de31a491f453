//! The envd data plane: every request carrying `E2b-Sandbox-Id` is checked
//! (sandbox exists and runs, `X-Access-Token` or a file-URL signature) and
//! reverse-proxied, streaming both ways, to that sandbox's agent over its
//! Unix socket with HTTP/1.1 (kept-alive connections: `agent_pool`).

use std::sync::Arc;

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use base64::Engine;
use http::{HeaderMap, HeaderValue, Request, StatusCode, header};
use sha2::Digest;
use subtle::ConstantTimeEq;

use super::agent_pool::{AgentConnections, AgentError};
use super::control_error::ControlError;
use crate::e2b::wire::{HEADER_ACCESS_TOKEN, SandboxState};
use crate::local::control::sandbox_table::SandboxTable;

/// Headers that belong to one hop and are never forwarded.
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

fn not_found(sandbox_id: &str, detail: &str) -> Response {
    let body = serde_json::json!({
        "sandboxId": sandbox_id,
        "message": format!("The sandbox was not found{detail}"),
        "code": 502,
    });
    (StatusCode::BAD_GATEWAY, axum::Json(body)).into_response()
}

/// Handles one data-plane request for the agent of `sandbox_id`.
pub async fn forward(
    provider: Arc<SandboxTable>,
    agents: &Arc<AgentConnections>,
    sandbox_id: &str,
    req: Request<Body>,
) -> Response {
    // A build's step sandbox is its build's, not reachable from outside.
    let Some(entry) = provider.get_public(sandbox_id) else {
        return not_found(sandbox_id, "");
    };
    let (running, auto_resume, token_ok) = entry.read(|rec| {
        (rec.state == SandboxState::Running, rec.lifecycle.auto_resume, authorized(&req, &rec.envd_access_token))
    });
    if !running && !auto_resume {
        return not_found(sandbox_id, " (it is paused; connect to it to resume it)");
    }
    if !token_ok {
        return ControlError::new(StatusCode::UNAUTHORIZED, "missing or invalid X-Access-Token for this sandbox")
            .into_response();
    }
    // `lifecycle.auto_resume`: an authorized request resumes the paused sandbox, as connect does.
    if !running && let Err(err) = provider.connect(sandbox_id, None).await {
        tracing::warn!(sandbox = %sandbox_id, %err, "cannot resume the paused sandbox for a request");
        return ControlError::from(err).into_response();
    }
    if let Some(len) = req.headers().get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
        && len > provider.cfg.max_data_body_bytes
    {
        return ControlError::new(StatusCode::PAYLOAD_TOO_LARGE, "request body too large").into_response();
    }

    let (parts, body) = req.into_parts();
    let limit = usize::try_from(provider.cfg.max_data_body_bytes).unwrap_or(usize::MAX);
    let body = http_body_util::Limited::new(body, limit);
    let path_and_query = parts.uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
    let mut builder = Request::builder().method(parts.method).uri(path_and_query).version(http::Version::HTTP_11);
    if let Some(headers) = builder.headers_mut() {
        copy_end_to_end(&parts.headers, headers);
        headers.insert(header::HOST, HeaderValue::from_static("localhost"));
    }
    let Ok(outgoing) = builder.body(body) else {
        return ControlError::new(StatusCode::BAD_REQUEST, "request cannot be forwarded").into_response();
    };

    match agents.send(&entry.socket(), outgoing).await {
        Ok(mut response) => {
            let headers = std::mem::take(response.headers_mut());
            copy_end_to_end(&headers, response.headers_mut());
            response
        }
        Err(err @ (AgentError::Connect(_) | AgentError::Handshake(_))) => {
            tracing::warn!(sandbox = %sandbox_id, %err, "sandbox agent unreachable");
            not_found(sandbox_id, " (its agent does not answer)")
        }
        Err(AgentError::Request(err)) => {
            tracing::warn!(sandbox = %sandbox_id, %err, "forwarding to sandbox agent failed");
            let too_large = std::error::Error::source(&err)
                .is_some_and(|s| s.downcast_ref::<http_body_util::LengthLimitError>().is_some());
            if too_large {
                ControlError::new(StatusCode::PAYLOAD_TOO_LARGE, "request body too large").into_response()
            } else {
                ControlError::new(StatusCode::BAD_GATEWAY, format!("the sandbox agent failed to answer: {err}"))
                    .into_response()
            }
        }
    }
}

fn copy_end_to_end(from: &HeaderMap, to: &mut HeaderMap) {
    let listed: Vec<String> = from
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(',').map(|s| s.trim().to_ascii_lowercase()))
        .collect();
    for (name, value) in from {
        let n = name.as_str();
        if HOP_BY_HOP.contains(&n) || listed.iter().any(|l| l == n) || n == "host" {
            continue;
        }
        to.append(name.clone(), value.clone());
    }
}

/// Token check with envd's exemptions: `GET /health`, and `/files` with a valid signature.
fn authorized(req: &Request<Body>, token: &str) -> bool {
    if token.is_empty() || (req.uri().path() == "/health" && req.method() == http::Method::GET) {
        return true;
    }
    if let Some(given) = req.headers().get(HEADER_ACCESS_TOKEN) {
        return bool::from(given.as_bytes().ct_eq(token.as_bytes()));
    }
    if req.uri().path() == "/files" {
        return signature_valid(req, token);
    }
    false
}

/// Verifies `signature` (and `signature_expiration`) on a `/files` URL the way envd does.
fn signature_valid(req: &Request<Body>, token: &str) -> bool {
    let query = req.uri().query().unwrap_or("");
    let params: Vec<(String, String)> = url::form_urlencoded::parse(query.as_bytes()).into_owned().collect();
    let get = |k: &str| params.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
    let (Some(signature), Some(path)) = (get("signature"), get("path")) else {
        return false;
    };
    let operation = if req.method() == http::Method::GET { "read" } else { "write" };
    let user = get("username").unwrap_or("");
    let mut material = format!("{path}:{operation}:{user}:{token}");
    if let Some(exp) = get("signature_expiration") {
        let Ok(exp) = exp.parse::<i64>() else {
            return false;
        };
        if exp < chrono::Utc::now().timestamp() {
            return false;
        }
        material.push_str(&format!(":{exp}"));
    }
    let digest = sha2::Sha256::digest(material.as_bytes());
    let expected = format!("v1_{}", base64::engine::general_purpose::STANDARD_NO_PAD.encode(digest));
    bool::from(expected.as_bytes().ct_eq(signature.as_bytes()))
}
