//! The client's own floor for the side-by-side comparison: an MCP endpoint that answers at once
//! with answers our gateway gave (its `initialize`, `tools/list` and one `run_command "true"`
//! result, taken from the real gateway just before), so that the official Python client's time
//! against it is what that client spends on our answers when the server costs nothing. No server
//! that gives those answers can be timed below it. A bench instrument only: it never runs a
//! command, and no test uses it.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use axum::Router;
use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Value, json};

/// Results of the three requests the client sends, as the gateway answered them.
struct Answers {
    initialize: Value,
    tools_list: Value,
    run_command: Value,
}

/// Takes the answers from the gateway at `gateway_url` (a legacy session on `sandbox_id`), then
/// serves them on a free loopback port; the endpoint's URL. It runs on a thread and runtime of its
/// own (the bench's runtime blocks on the Python client while it runs) and stops with the process.
pub fn start(gateway_url: &str, sandbox_id: &str) -> anyhow::Result<String> {
    let (gateway_url, sandbox_id) = (gateway_url.to_owned(), sandbox_id.to_owned());
    let (ready, url) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
            Ok(runtime) => runtime,
            Err(err) => return drop(ready.send(Err(anyhow::Error::from(err)))),
        };
        runtime.block_on(async move {
            let bound = async {
                let answers = Arc::new(capture(&gateway_url, &sandbox_id).await?);
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
                let url = format!("http://{}/mcp", listener.local_addr()?);
                anyhow::Ok((answers, listener, url))
            };
            match bound.await {
                Ok((answers, listener, url)) => {
                    let _ = ready.send(Ok(url));
                    let app = Router::new().route("/mcp", post(answer).get(no_stream).delete(end)).with_state(answers);
                    let _ = axum::serve(listener, app).await;
                }
                Err(err) => drop(ready.send(Err(err))),
            }
        });
    });
    url.recv_timeout(Duration::from_secs(30)).context("the replay endpoint did not start")?
}

/// The gateway's answers to what the Python client will ask, in a legacy session of its own (the
/// bench's raw caller, which makes `sandbox_id` the session's default sandbox).
async fn capture(url: &str, sandbox_id: &str) -> anyhow::Result<Answers> {
    let mut session = crate::LegacyCaller::open(url, sandbox_id).await?;
    let tools_list = session.request("tools/list", json!({})).await?;
    let run_command =
        session.request("tools/call", json!({"name": "run_command", "arguments": {"command": "true"}})).await?;
    if run_command["structuredContent"]["exit_code"] != 0 {
        bail!("the gateway's run_command answer to replay failed: {run_command}");
    }
    Ok(Answers { initialize: session.initialized, tools_list, run_command })
}

/// Answers one JSON-RPC message at once, as the gateway answers a quick one (`application/json`).
async fn answer(axum::extract::State(answers): axum::extract::State<Arc<Answers>>, body: Bytes) -> Response {
    let Ok(message) = serde_json::from_slice::<Value>(&body) else {
        return (StatusCode::BAD_REQUEST, "not JSON").into_response();
    };
    let Some(id) = message.get("id").cloned() else {
        return StatusCode::ACCEPTED.into_response();
    };
    let result = match message["method"].as_str() {
        Some("initialize") => &answers.initialize,
        Some("tools/list") => &answers.tools_list,
        Some("tools/call") if message["params"]["name"] == "run_command" => &answers.run_command,
        _ => {
            let error = json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32601, "message": "not replayed"}});
            return axum::Json(error).into_response();
        }
    };
    let mut headers = HeaderMap::new();
    headers.insert(header::CONTENT_TYPE, header::HeaderValue::from_static("application/json"));
    headers.insert("mcp-session-id", header::HeaderValue::from_static("replay"));
    (headers, json!({"jsonrpc": "2.0", "id": id, "result": result}).to_string()).into_response()
}

/// No server-initiated stream (the client's GET).
async fn no_stream() -> StatusCode {
    StatusCode::METHOD_NOT_ALLOWED
}

/// The client's DELETE at the end of its session.
async fn end() -> StatusCode {
    StatusCode::OK
}
