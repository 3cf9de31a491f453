//! Fault-injection tests of the client against a scripted axum server, for
//! faults the real local provider cannot be made to produce: end-stream
//! errors mid-stream, truncated envelopes, byte-by-byte chunking, 503 with
//! `Retry-After`, stalled streams, and the exact request headers sent.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use bytes::Bytes;

use super::*;
use crate::connect_rpc::{Code, ConnectError, encode_end_stream, encode_json_message};
use crate::e2b::wire::{DataEvent, EndEvent, ProcessEvent, ProcessEventMessage, StartEvent};

#[derive(Default)]
struct Recorder {
    requests: Mutex<Vec<(String, HeaderMap)>>,
}

impl Recorder {
    fn push(&self, path: &str, headers: &HeaderMap) {
        self.requests.lock().unwrap().push((path.to_owned(), headers.clone()));
    }
    fn count(&self, path: &str) -> usize {
        self.requests.lock().unwrap().iter().filter(|(p, _)| p == path).count()
    }
    fn headers(&self, path: &str) -> HeaderMap {
        self.requests.lock().unwrap().iter().find(|(p, _)| p == path).map(|(_, h)| h.clone()).unwrap()
    }
}

/// Serves `router` on a free port; handlers may take `ConnectInfo<SocketAddr>` (the client's address).
async fn serve(router: Router) -> (url::Url, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        axum::serve(listener, router.into_make_service_with_connect_info::<std::net::SocketAddr>()).await.unwrap();
    });
    (format!("http://{addr}").parse().unwrap(), task)
}

fn client(url: &url::Url) -> E2bClient {
    E2bClient::new(ProviderEndpoint {
        api_url: url.clone(),
        sandbox_url: Some(url.clone()),
        domain: "local".into(),
        api_key: Some("e2b_0123456789abcdef0123456789abcdef01234567".into()),
        request_timeout: Duration::from_secs(5),
    })
    .unwrap()
}

fn sandbox(id: &str, token: Option<&str>) -> wire::Sandbox {
    wire::Sandbox {
        template_id: "base".into(),
        sandbox_id: id.into(),
        client_id: "local".into(),
        envd_version: wire::ENVD_VERSION.into(),
        envd_access_token: token.map(str::to_owned),
        ..Default::default()
    }
}

fn event(event: ProcessEvent) -> Bytes {
    encode_json_message(&ProcessEventMessage { event })
}

fn stream_response(chunks: Vec<Bytes>) -> Response {
    let body = Body::from_stream(futures_util::stream::iter(chunks.into_iter().map(Ok::<_, Infallible>)));
    ([("content-type", "application/connect+json")], body).into_response()
}

fn echo_request() -> wire::StartRequest {
    wire::StartRequest::login_shell("echo hi")
}

#[tokio::test]
async fn end_stream_error_mid_stream_is_surfaced_with_op_and_sandbox() {
    let router = Router::new().route(
        "/process.Process/Start",
        post(|| async {
            stream_response(vec![
                event(ProcessEvent::Start(StartEvent { pid: 7 })),
                event(ProcessEvent::Data(DataEvent { stdout: Some(b"partial".to_vec()), ..Default::default() })),
                encode_end_stream(Some(&ConnectError::new(Code::Internal, "envd blew up"))),
            ])
        }),
    );
    let (url, server) = serve(router).await;
    let envd = client(&url).envd(&sandbox("sbx-a", None));
    let mut stream = envd.start(&echo_request(), &CallOptions::default()).await.unwrap();
    assert_eq!(stream.pid(), 7);
    let first = stream.next_event().await.unwrap().unwrap();
    assert!(matches!(first, ProcessEvent::Data(DataEvent { stdout: Some(ref b), .. }) if b == b"partial"));
    let err = stream.next_event().await.unwrap_err();
    assert!(matches!(err, E2bError::Rpc { code: Code::Internal, .. }), "{err:?}");
    let text = err.to_string();
    assert!(text.contains("process.Start") && text.contains("sbx-a") && text.contains("envd blew up"), "{text}");
    assert!(stream.next_event().await.unwrap().is_none());
    // `run` reports the same failure instead of a result.
    let err = envd.run(&echo_request(), &CallOptions::default(), OutputLimits::default()).await.unwrap_err();
    assert!(matches!(err, E2bError::Rpc { code: Code::Internal, .. }), "{err:?}");
    server.abort();
}

#[tokio::test]
async fn truncated_envelope_is_a_protocol_error() {
    let router = Router::new().route(
        "/process.Process/Start",
        post(|| async {
            let data = event(ProcessEvent::Data(DataEvent { stdout: Some(vec![b'x'; 100]), ..Default::default() }));
            stream_response(vec![event(ProcessEvent::Start(StartEvent { pid: 9 })), data.slice(..40)])
        }),
    );
    let (url, server) = serve(router).await;
    let envd = client(&url).envd(&sandbox("sbx-t", None));
    let mut stream = envd.start(&echo_request(), &CallOptions::default()).await.unwrap();
    let err = stream.next_event().await.unwrap_err();
    assert!(matches!(err, E2bError::Protocol { .. }), "{err:?}");
    assert!(err.to_string().contains("stream ended inside an envelope"), "{err}");
    server.abort();
}

#[tokio::test]
async fn envelopes_split_byte_by_byte_decode_incrementally() {
    let router = Router::new().route(
        "/process.Process/Start",
        post(|| async {
            let mut wire = Vec::new();
            for frame in [
                event(ProcessEvent::Start(StartEvent { pid: 3 })),
                event(ProcessEvent::Keepalive(Default::default())),
                event(ProcessEvent::Data(DataEvent { stdout: Some(b"out".to_vec()), ..Default::default() })),
                event(ProcessEvent::Data(DataEvent { stderr: Some(b"err".to_vec()), ..Default::default() })),
                event(ProcessEvent::End(EndEvent {
                    exit_code: 3,
                    exited: true,
                    status: "exit status 3".into(),
                    error: Some("exit status 3".into()),
                })),
                encode_end_stream(None),
            ] {
                wire.extend_from_slice(&frame);
            }
            stream_response(wire.into_iter().map(|b| Bytes::from(vec![b])).collect())
        }),
    );
    let (url, server) = serve(router).await;
    let envd = client(&url).envd(&sandbox("sbx-b", None));
    let out = envd.run(&echo_request(), &CallOptions::default(), OutputLimits::unlimited()).await.unwrap();
    assert_eq!((out.pid, out.exit_code, out.exited), (3, 3, true));
    assert_eq!(out.stdout, b"out");
    assert_eq!(out.stderr, b"err");
    assert_eq!(out.status, "exit status 3");
    server.abort();
}

/// A finished command's stream whose body ends only after `then` (the chunked terminator in a
/// packet of its own, as it comes through a proxy), or never.
fn finished_command_then(then: futures_util::stream::BoxStream<'static, Result<Bytes, Infallible>>) -> Response {
    let frames = [
        event(ProcessEvent::Start(StartEvent { pid: 5 })),
        event(ProcessEvent::End(EndEvent { exit_code: 0, exited: true, status: "exit status 0".into(), error: None })),
        encode_end_stream(None),
    ];
    let head = futures_util::stream::iter(frames.into_iter().map(Ok::<_, Infallible>));
    let body = Body::from_stream(futures_util::StreamExt::chain(head, then));
    ([("content-type", "application/connect+json")], body).into_response()
}

#[tokio::test]
async fn a_finished_stream_reads_its_body_to_the_end_so_the_connection_is_reused() {
    let peers = Arc::new(Mutex::new(Vec::new()));
    let seen = peers.clone();
    let router = Router::new().route(
        "/process.Process/Start",
        post(move |axum::extract::ConnectInfo(peer): axum::extract::ConnectInfo<std::net::SocketAddr>| {
            seen.lock().unwrap().push(peer);
            async move {
                // The terminator comes 20 ms after the end-stream frame.
                let late_end = futures_util::stream::once(async {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    Ok::<_, Infallible>(Bytes::new())
                });
                finished_command_then(futures_util::StreamExt::boxed(late_end))
            }
        }),
    );
    let (url, server) = serve(router).await;
    let envd = client(&url).envd(&sandbox("sbx-r", None));
    for _ in 0..5 {
        let out = envd.run(&echo_request(), &CallOptions::default(), OutputLimits::default()).await.unwrap();
        assert_eq!((out.pid, out.exit_code, out.exited), (5, 0, true));
    }
    let peers = peers.lock().unwrap().clone();
    assert_eq!(peers.len(), 5);
    assert!(peers.iter().all(|p| *p == peers[0]), "each command opened a new connection: {peers:?}");
    server.abort();
}

#[tokio::test]
async fn a_body_that_never_ends_after_the_end_stream_frame_does_not_hold_up_the_result() {
    let router = Router::new().route(
        "/process.Process/Start",
        post(|| async { finished_command_then(futures_util::StreamExt::boxed(futures_util::stream::pending())) }),
    );
    let (url, server) = serve(router).await;
    let envd = client(&url).envd(&sandbox("sbx-p", None));
    let (request, options) = (echo_request(), CallOptions::default());
    let run = envd.run(&request, &options, OutputLimits::default());
    let out = tokio::time::timeout(Duration::from_secs(2), run).await.expect("the result waited for the body").unwrap();
    assert_eq!((out.exit_code, out.exited), (0, true));
    server.abort();
}

#[tokio::test]
async fn stalled_stream_times_out_and_run_kills_the_process() {
    let recorder = Arc::new(Recorder::default());
    let rec = recorder.clone();
    let rec2 = recorder.clone();
    let router = Router::new()
        .route(
            "/process.Process/Start",
            post(move |headers: HeaderMap| async move {
                rec.push("/process.Process/Start", &headers);
                let start = futures_util::stream::iter([Ok::<_, Infallible>(event(ProcessEvent::Start(StartEvent {
                    pid: 11,
                })))]);
                let body = Body::from_stream(futures_util::StreamExt::chain(start, futures_util::stream::pending()));
                ([("content-type", "application/connect+json")], body).into_response()
            }),
        )
        .route(
            "/process.Process/SendSignal",
            post(move |headers: HeaderMap, body: String| async move {
                rec2.push("/process.Process/SendSignal", &headers);
                assert!(body.contains("SIGNAL_SIGKILL") && body.contains("11"), "{body}");
                ([("content-type", "application/json")], "{}")
            }),
        );
    let (url, server) = serve(router).await;
    let envd = client(&url).envd(&sandbox("sbx-s", None));
    let opts = CallOptions { user: None, timeout: Some(Duration::from_millis(300)) };
    let started = std::time::Instant::now();
    let err = envd.run(&echo_request(), &opts, OutputLimits::default()).await.unwrap_err();
    assert!(matches!(err, E2bError::Timeout { .. }), "{err:?}");
    assert!(started.elapsed() < Duration::from_secs(3));
    assert_eq!(recorder.count("/process.Process/SendSignal"), 1);
    // envd is told the deadline plus the grace period.
    let sent = recorder.headers("/process.Process/Start");
    assert_eq!(sent["connect-timeout-ms"], "2300");
    server.abort();
}

#[tokio::test]
async fn retries_idempotent_get_on_503_honouring_retry_after() {
    let recorder = Arc::new(Recorder::default());
    let rec = recorder.clone();
    let router = Router::new().route(
        "/sandboxes/{id}",
        get(move |headers: HeaderMap| async move {
            rec.push("get", &headers);
            if rec.count("get") == 1 {
                return (StatusCode::SERVICE_UNAVAILABLE, [("retry-after", "1")], r#"{"code":503,"message":"busy"}"#)
                    .into_response();
            }
            let detail = serde_json::json!({
                "templateID": "base", "sandboxID": "sbx-r", "clientID": "local",
                "startedAt": "2026-01-01T00:00:00Z", "endAt": "2026-01-01T00:05:00Z",
                "envdVersion": "0.6.13", "cpuCount": 1, "memoryMB": 512, "diskSizeMB": 1024, "state": "running"
            });
            axum::Json(detail).into_response()
        }),
    );
    let (url, server) = serve(router).await;
    let client = client(&url);
    let started = std::time::Instant::now();
    let detail = client.get_sandbox("sbx-r").await.unwrap();
    assert_eq!(detail.sandbox_id, "sbx-r");
    assert_eq!(recorder.count("get"), 2);
    assert!(started.elapsed() >= Duration::from_millis(950), "Retry-After was not honoured");
    let sent = recorder.headers("get");
    assert_eq!(sent["x-api-key"], "e2b_0123456789abcdef0123456789abcdef01234567");
    assert!(sent.get("e2b-sandbox-id").is_none());
    server.abort();
}

#[tokio::test]
async fn create_is_never_retried() {
    let recorder = Arc::new(Recorder::default());
    let rec = recorder.clone();
    let router = Router::new().route(
        "/v2/sandboxes",
        post(move |headers: HeaderMap| async move {
            rec.push("create", &headers);
            (StatusCode::SERVICE_UNAVAILABLE, [("retry-after", "0")], r#"{"code":503,"message":"no capacity"}"#)
        }),
    );
    let (url, server) = serve(router).await;
    let err = client(&url)
        .create_sandbox(&wire::NewSandbox { template_id: "base".into(), ..Default::default() })
        .await
        .unwrap_err();
    assert!(matches!(err, E2bError::Api { status: 503, .. }), "{err:?}");
    assert!(err.to_string().contains("create_sandbox") && err.to_string().contains("no capacity"), "{err}");
    assert!(!err.to_string().contains("e2b_0123"), "the API key leaked: {err}");
    assert_eq!(recorder.count("create"), 1);
    server.abort();
}

#[tokio::test]
async fn envd_requests_carry_the_sdk_headers_and_502_means_not_running() {
    let recorder = Arc::new(Recorder::default());
    let rec = recorder.clone();
    let router = Router::new().fallback(any(move |uri: axum::http::Uri, headers: HeaderMap| async move {
        rec.push(uri.path(), &headers);
        if headers.get("e2b-sandbox-id").is_some_and(|v| v == "gone") {
            return (
                StatusCode::BAD_GATEWAY,
                [("content-type", "application/json")],
                r#"{"sandboxId":"gone","message":"The sandbox was not found","code":502}"#,
            )
                .into_response();
        }
        ([("content-type", "application/json")], r#"{"processes":[]}"#).into_response()
    }));
    let (url, server) = serve(router).await;
    let client = client(&url);
    let envd = client.envd(&sandbox("sbx-h", Some("tok-123")));
    let opts = CallOptions::user("root").with_timeout(Duration::from_millis(1500));
    assert!(envd.list_processes(&opts).await.unwrap().is_empty());
    let sent = recorder.headers("/process.Process/List");
    assert_eq!(sent["e2b-sandbox-id"], "sbx-h");
    assert_eq!(sent["e2b-sandbox-port"], "49983");
    assert_eq!(sent["x-access-token"], "tok-123");
    assert_eq!(sent["authorization"], "Basic cm9vdDo=");
    assert_eq!(sent["connect-protocol-version"], "1");
    assert_eq!(sent["connect-timeout-ms"], "1500");
    assert_eq!(sent["content-type"], "application/json");
    assert!(sent.get("x-api-key").is_none(), "the API key must not go to envd");

    let gone = client.envd(&sandbox("gone", None));
    let err = gone.health().await.unwrap_err();
    assert!(matches!(err, E2bError::SandboxNotRunning { .. }), "{err:?}");
    assert!(err.is_sandbox_gone() && err.to_string().contains("gone"));
    // Not retried even though health is idempotent: the sandbox is gone.
    assert_eq!(recorder.count("/health"), 1);
    server.abort();
}

#[tokio::test]
async fn range_reads_cope_with_servers_that_ignore_or_botch_the_range() {
    // /files?path=whole ignores Range (200, whole file); path=wrong answers a
    // different range than asked; path=huge ignores Range for a file past the cap.
    let router = Router::new().route(
        "/files",
        get(|uri: axum::http::Uri| async move {
            let query = uri.query().unwrap_or("");
            if query.contains("path=whole") {
                (StatusCode::OK, Body::from(&b"0123456789"[..])).into_response()
            } else if query.contains("path=wrong") {
                (StatusCode::PARTIAL_CONTENT, [("content-range", "bytes 0-3/10")], Body::from(&b"0123"[..]))
                    .into_response()
            } else {
                let huge = vec![b'x'; 17 * 1024 * 1024];
                (StatusCode::OK, Body::from(huge)).into_response()
            }
        }),
    );
    let (url, server) = serve(router).await;
    let client = client(&url);
    let envd = client.envd(&sandbox("sbx-r", None));
    let opts = CallOptions::default();
    let range = envd.read_file_range("whole", 3, 4, &opts).await.unwrap();
    assert_eq!((&range.data[..], range.size), (&b"3456"[..], 10));
    let past = envd.read_file_range("whole", 20, 4, &opts).await.unwrap();
    assert_eq!((past.data.len(), past.size), (0, 10));
    let err = envd.read_file_range("wrong", 5, 4, &opts).await.unwrap_err();
    assert!(matches!(err, E2bError::Protocol { .. }), "{err:?}");
    let err = envd.read_file_range("huge", 0, 16, &opts).await.unwrap_err();
    assert!(matches!(err, E2bError::TooLarge { limit, .. } if limit == 16 * 1024 * 1024), "{err:?}");
    server.abort();
}

#[tokio::test]
async fn snapshot_calls_follow_the_wire_contract() {
    use axum::extract::{Path, Query};
    use std::collections::HashMap;
    let recorder = Arc::new(Recorder::default());
    let (rec_create, rec_list, rec_delete) = (recorder.clone(), recorder.clone(), recorder.clone());
    let router = Router::new()
        .route(
            "/sandboxes/{id}/snapshots",
            post(move |Path(id): Path<String>, headers: HeaderMap, body: Bytes| async move {
                rec_create.push(&format!("snapshot {id} {}", String::from_utf8_lossy(&body)), &headers);
                if id == "gone" {
                    return (StatusCode::NOT_FOUND, r#"{"code":404,"message":"sandbox gone not found"}"#)
                        .into_response();
                }
                let answer = serde_json::json!({"snapshotID": "snap-1:default", "names": ["snap-1"]});
                (StatusCode::CREATED, axum::Json(answer)).into_response()
            }),
        )
        .route(
            "/snapshots",
            get(move |Query(q): Query<HashMap<String, String>>, headers: HeaderMap| async move {
                let mut keys: Vec<String> = q.iter().map(|(k, v)| format!("{k}={v}")).collect();
                keys.sort();
                rec_list.push(&format!("list {}", keys.join("&")), &headers);
                if !q.contains_key("nextToken") {
                    let page = serde_json::json!([{"snapshotID": "a:default", "names": ["a"]}]);
                    return ([("x-next-token", "page2")], axum::Json(page)).into_response();
                }
                axum::Json(serde_json::json!([{"snapshotID": "b:default"}])).into_response()
            }),
        )
        .route(
            "/templates/{id}",
            axum::routing::delete(move |Path(id): Path<String>, headers: HeaderMap| async move {
                rec_delete.push(&format!("delete {id}"), &headers);
                if id == "snap-1:default" {
                    return StatusCode::NO_CONTENT.into_response();
                }
                (StatusCode::NOT_FOUND, r#"{"code":404,"message":"not found"}"#).into_response()
            }),
        );
    let (url, server) = serve(router).await;
    let client = client(&url);

    let req = wire::NewSnapshot { name: Some("snap-1".into()), memory: Some(false) };
    let snapshot = client.create_snapshot("sbx1", &req).await.unwrap();
    assert_eq!((snapshot.snapshot_id.as_str(), snapshot.names.clone()), ("snap-1:default", vec!["snap-1".to_owned()]));
    assert_eq!(recorder.count(r#"snapshot sbx1 {"name":"snap-1","memory":false}"#), 1, "the body as E2B's");
    let sent = recorder.headers(r#"snapshot sbx1 {"name":"snap-1","memory":false}"#);
    assert_eq!(sent["x-api-key"], "e2b_0123456789abcdef0123456789abcdef01234567");
    let err = client.create_snapshot("gone", &req).await.unwrap_err();
    assert!(err.is_sandbox_gone() && err.sandbox_id() == Some("gone"), "{err:?}");

    // Paged while X-Next-Token is answered; the filters are sent as E2B names them.
    let all = client.list_all_snapshots(Some("sbx1"), Some("a")).await.unwrap();
    let ids: Vec<&str> = all.iter().map(|s| s.snapshot_id.as_str()).collect();
    assert_eq!(ids, ["a:default", "b:default"]);
    assert!(all[1].names.is_empty(), "names default to empty");
    assert_eq!(recorder.count("list limit=100&name=a&sandboxID=sbx1"), 1);
    assert_eq!(recorder.count("list limit=100&name=a&nextToken=page2&sandboxID=sbx1"), 1);

    // Deleted (204), or unknown (404: false); the id goes into the path as it is.
    assert!(client.delete_snapshot("snap-1:default").await.unwrap());
    assert!(!client.delete_snapshot("nope:default").await.unwrap());
    assert_eq!(recorder.count("delete snap-1:default"), 1);
    server.abort();
}

#[tokio::test]
async fn fork_is_never_retried_and_reads_each_entry() {
    use axum::extract::Path;
    let recorder = Arc::new(Recorder::default());
    let rec = recorder.clone();
    let router = Router::new().route(
        "/sandboxes/{id}/fork",
        post(move |Path(id): Path<String>, headers: HeaderMap, body: Bytes| async move {
            rec.push(&format!("fork {id}"), &headers);
            let body: wire::ForkSandbox = serde_json::from_slice(&body).unwrap();
            match id.as_str() {
                "busy" => (StatusCode::SERVICE_UNAVAILABLE, [("retry-after", "0")], r#"{"code":503,"message":"busy"}"#)
                    .into_response(),
                "gone" => (StatusCode::NOT_FOUND, r#"{"code":404,"message":"sandbox gone not found"}"#).into_response(),
                "short" => (StatusCode::CREATED, axum::Json(serde_json::json!([]))).into_response(),
                _ => {
                    assert_eq!(body, wire::ForkSandbox { timeout: Some(60), count: Some(2) });
                    let answer = serde_json::json!([
                        {"sandbox": {"templateID": "base", "sandboxID": "f1", "clientID": "local",
                            "envdVersion": "0.6.13", "envdAccessToken": "tok"}},
                        {"error": {"code": 429, "message": "reached the maximum of 5 sandboxes"}},
                    ]);
                    (StatusCode::CREATED, axum::Json(answer)).into_response()
                }
            }
        }),
    );
    let (url, server) = serve(router).await;
    let client = client(&url);
    let req = wire::ForkSandbox { timeout: Some(60), count: Some(2) };
    let entries = client.fork_sandbox("sbx1", &req).await.unwrap();
    assert_eq!(entries[0].sandbox.as_ref().map(|s| s.sandbox_id.as_str()), Some("f1"));
    assert_eq!(
        entries[1].error.as_ref().map(|e| (e.code, e.message.as_str())),
        Some((429, "reached the maximum of 5 sandboxes"))
    );

    let err = client.fork_sandbox("busy", &req).await.unwrap_err();
    assert!(matches!(err, E2bError::Api { status: 503, .. }), "{err:?}");
    assert_eq!(recorder.count("fork busy"), 1, "a fork makes sandboxes: never retried");
    let err = client.fork_sandbox("gone", &req).await.unwrap_err();
    assert!(err.is_sandbox_gone() && err.op() == "fork_sandbox", "{err:?}");
    let err = client.fork_sandbox("short", &req).await.unwrap_err();
    assert!(err.to_string().contains("asked for 2 forks, the answer has 0 entries"), "{err}");
    server.abort();
}
