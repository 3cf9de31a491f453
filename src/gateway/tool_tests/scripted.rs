//! The scripted provider of the tool tests: a small axum server answering
//! the E2B API routes (create, get, list, kill, connect, timeout, health,
//! snapshots and forks) and
//! the envd routes (process Start, file reads) the tools use, from an
//! in-memory table, with one-shot faults injected per route and every
//! request recorded.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};

use crate::connect_rpc::encode_json_message;
use crate::e2b::wire::{self, DataEvent, EndEvent, ProcessEvent, ProcessEventMessage, StartEvent};
use crate::gateway::tools::access::{META_DEPLOYMENT, META_TENANT};

/// A fault the scripted provider answers once instead of the normal response.
#[derive(Clone)]
struct Fault {
    status: u16,
    body: Value,
}

/// The scripted provider's state: sandboxes, files, injected faults, and every request seen.
#[derive(Default)]
pub(super) struct Provider {
    pub(super) sandboxes: Mutex<HashMap<String, wire::SandboxDetail>>,
    pub(super) files: Mutex<HashMap<(String, String), Vec<u8>>>,
    pub(super) snapshots: Mutex<Vec<wire::SnapshotInfo>>,
    faults: Mutex<HashMap<&'static str, Vec<Fault>>>,
    requests: Mutex<Vec<String>>,
    next_id: Mutex<u32>,
}

pub(super) type Shared = Arc<Provider>;

impl Provider {
    fn seen(&self, what: String) {
        self.requests.lock().unwrap().push(what);
    }

    pub(super) fn requests(&self) -> Vec<String> {
        self.requests.lock().unwrap().clone()
    }

    fn fault(&self, route: &'static str) -> Option<Response> {
        let fault = self.faults.lock().unwrap().get_mut(route).and_then(Vec::pop)?;
        let status = StatusCode::from_u16(fault.status).unwrap();
        Some((status, axum::Json(fault.body)).into_response())
    }

    pub(super) fn inject(&self, route: &'static str, status: u16, body: Value) {
        self.faults.lock().unwrap().entry(route).or_default().push(Fault { status, body });
    }

    /// A sandbox the provider holds (as created by some other client).
    pub(super) fn add(&self, id: &str, tenant: &str) {
        let detail = detail(id, [(META_TENANT, tenant), (META_DEPLOYMENT, "default")]);
        self.sandboxes.lock().unwrap().insert(id.to_owned(), detail);
    }

    pub(super) fn exists(&self, id: &str) -> bool {
        self.sandboxes.lock().unwrap().contains_key(id)
    }
}

fn detail<'a>(id: &str, metadata: impl IntoIterator<Item = (&'a str, &'a str)>) -> wire::SandboxDetail {
    let end = chrono::DateTime::<chrono::Utc>::from(SystemTime::now() + Duration::from_secs(600));
    wire::SandboxDetail {
        template_id: "base".into(),
        sandbox_id: id.into(),
        alias: None,
        client_id: "scripted".into(),
        started_at: chrono::Utc::now().to_rfc3339(),
        end_at: end.to_rfc3339(),
        envd_version: wire::ENVD_VERSION.into(),
        envd_access_token: Some(format!("token-{id}")),
        domain: None,
        cpu_count: 1,
        memory_mb: 512,
        disk_size_mb: 1024,
        metadata: metadata.into_iter().map(|(k, v)| (k.to_owned(), v.to_owned())).collect(),
        state: wire::SandboxState::Running,
        allow_internet_access: None,
        network: None,
        lifecycle: None,
    }
}

fn sandbox_of(d: &wire::SandboxDetail) -> wire::Sandbox {
    wire::Sandbox {
        template_id: d.template_id.clone(),
        sandbox_id: d.sandbox_id.clone(),
        client_id: d.client_id.clone(),
        envd_version: d.envd_version.clone(),
        envd_access_token: d.envd_access_token.clone(),
        ..Default::default()
    }
}

fn not_found(what: &str) -> Response {
    (StatusCode::NOT_FOUND, axum::Json(json!({"code": 404, "message": format!("{what} not found")}))).into_response()
}

async fn create(State(p): State<Shared>, axum::Json(req): axum::Json<wire::NewSandbox>) -> Response {
    p.seen(format!("create {}", req.template_id));
    if let Some(fault) = p.fault("create") {
        return fault;
    }
    let id = {
        let mut next = p.next_id.lock().unwrap();
        *next += 1;
        format!("sbx{next:04}")
    };
    let mut d = detail(&id, []);
    d.metadata = req.metadata.unwrap_or_default();
    let sandbox = sandbox_of(&d);
    p.sandboxes.lock().unwrap().insert(id, d);
    (StatusCode::CREATED, axum::Json(sandbox)).into_response()
}

/// `POST /sandboxes/{id}/snapshots`: named `NAME:default`, like the local provider's.
async fn snapshot(State(p): State<Shared>, Path(id): Path<String>, body: Bytes) -> Response {
    p.seen(format!("snapshot {id} {}", String::from_utf8_lossy(&body)));
    if !p.exists(&id) {
        return not_found(&format!("sandbox {id}"));
    }
    let Ok(req) = serde_json::from_slice::<wire::NewSnapshot>(&body) else {
        return StatusCode::BAD_REQUEST.into_response();
    };
    let name = req.name.unwrap_or_else(|| "unnamed".into());
    let info = wire::SnapshotInfo { snapshot_id: format!("{name}:default"), names: vec![name] };
    let mut all = p.snapshots.lock().unwrap();
    if all.iter().any(|s| s.snapshot_id == info.snapshot_id) {
        return (StatusCode::CONFLICT, axum::Json(json!({"code": 409, "message": "snapshot exists"}))).into_response();
    }
    all.push(info.clone());
    (StatusCode::CREATED, axum::Json(info)).into_response()
}

/// `GET /snapshots?name=`: by name or id.
async fn list_snapshots(State(p): State<Shared>, Query(query): Query<HashMap<String, String>>) -> Response {
    p.seen("list snapshots".into());
    let name = query.get("name");
    let all = p.snapshots.lock().unwrap();
    let items: Vec<_> =
        all.iter().filter(|s| name.is_none_or(|n| s.snapshot_id == *n || s.names.contains(n))).cloned().collect();
    axum::Json(items).into_response()
}

/// `DELETE /templates/{snapshotID}`.
async fn delete_snapshot(State(p): State<Shared>, Path(id): Path<String>) -> Response {
    p.seen(format!("delete snapshot {id}"));
    let mut all = p.snapshots.lock().unwrap();
    let before = all.len();
    all.retain(|s| s.snapshot_id != id);
    if all.len() == before { not_found(&format!("template {id}")) } else { StatusCode::NO_CONTENT.into_response() }
}

/// `POST /sandboxes/{id}/fork`: `count` copies with the parent's metadata and `fork.parent`.
async fn fork(
    State(p): State<Shared>,
    Path(id): Path<String>,
    axum::Json(req): axum::Json<wire::ForkSandbox>,
) -> Response {
    p.seen(format!("fork {id}"));
    if let Some(fault) = p.fault("fork") {
        return fault;
    }
    let Some(parent) = p.sandboxes.lock().unwrap().get(&id).cloned() else {
        return not_found(&format!("sandbox {id}"));
    };
    let mut entries = Vec::new();
    for _ in 0..req.count.unwrap_or(1) {
        let fork_id = {
            let mut next = p.next_id.lock().unwrap();
            *next += 1;
            format!("sbx{next:04}")
        };
        let mut d = detail(&fork_id, []);
        d.metadata = parent.metadata.clone();
        d.metadata.insert(wire::META_FORK_PARENT.into(), id.clone());
        d.metadata.insert(wire::META_FORK_CARRIES.into(), "no processes (scripted)".into());
        entries.push(json!({"sandbox": sandbox_of(&d)}));
        p.sandboxes.lock().unwrap().insert(fork_id, d);
    }
    (StatusCode::CREATED, axum::Json(entries)).into_response()
}

async fn get_one(State(p): State<Shared>, Path(id): Path<String>) -> Response {
    p.seen(format!("get {id}"));
    if let Some(fault) = p.fault("get") {
        return fault;
    }
    match p.sandboxes.lock().unwrap().get(&id) {
        Some(d) => axum::Json(d.clone()).into_response(),
        None => not_found(&format!("sandbox {id}")),
    }
}

async fn kill(State(p): State<Shared>, Path(id): Path<String>) -> Response {
    p.seen(format!("kill {id}"));
    match p.sandboxes.lock().unwrap().remove(&id) {
        Some(_) => StatusCode::NO_CONTENT.into_response(),
        None => not_found(&format!("sandbox {id}")),
    }
}

async fn connect(State(p): State<Shared>, Path(id): Path<String>) -> Response {
    p.seen(format!("connect {id}"));
    match p.sandboxes.lock().unwrap().get(&id) {
        Some(d) => axum::Json(sandbox_of(d)).into_response(),
        None => not_found(&format!("sandbox {id}")),
    }
}

async fn list(State(p): State<Shared>, Query(query): Query<HashMap<String, String>>) -> Response {
    p.seen("list".into());
    if let Some(fault) = p.fault("list") {
        return fault;
    }
    // The SDK's filter: urlencode({k: v}) of the wanted metadata pairs.
    let wanted: Vec<(String, String)> = query
        .get("metadata")
        .map(|m| url::form_urlencoded::parse(m.as_bytes()).into_owned().collect())
        .unwrap_or_default();
    let all = p.sandboxes.lock().unwrap();
    let items: Vec<_> =
        all.values().filter(|d| wanted.iter().all(|(k, v)| d.metadata.get(k) == Some(v))).cloned().collect();
    axum::Json(items).into_response()
}

fn sandbox_header(headers: &HeaderMap) -> String {
    headers.get(wire::HEADER_SANDBOX_ID).and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned()
}

/// envd's answer for a sandbox the provider no longer has.
fn envd_gone(id: &str) -> Response {
    (StatusCode::BAD_GATEWAY, axum::Json(json!({"message": format!("sandbox {id} was not found")}))).into_response()
}

/// `process.Start`: the "command" prints its own command line and exits 0.
async fn start(State(p): State<Shared>, headers: HeaderMap, body: Bytes) -> Response {
    let id = sandbox_header(&headers);
    p.seen(format!("start {id}"));
    if let Some(fault) = p.fault("start") {
        return fault;
    }
    if !p.exists(&id) {
        return envd_gone(&id);
    }
    let request: wire::StartRequest = match body.get(5..).map(serde_json::from_slice) {
        Some(Ok(request)) => request,
        _ => return StatusCode::BAD_REQUEST.into_response(),
    };
    let line = format!("{}\n", request.process.args.last().cloned().unwrap_or_default());
    let event = |event| encode_json_message(&ProcessEventMessage { event });
    let chunks = vec![
        event(ProcessEvent::Start(StartEvent { pid: 7 })),
        event(ProcessEvent::Data(DataEvent { stdout: Some(line.into_bytes()), ..Default::default() })),
        event(ProcessEvent::End(EndEvent { exited: true, status: "exit status 0".into(), ..Default::default() })),
        crate::connect_rpc::encode_end_stream(None),
    ];
    let body = Body::from_stream(futures_util::stream::iter(chunks.into_iter().map(Ok::<_, Infallible>)));
    ([("content-type", "application/connect+json")], body).into_response()
}

async fn read_file(
    State(p): State<Shared>,
    headers: HeaderMap,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    let id = sandbox_header(&headers);
    let path = query.get("path").cloned().unwrap_or_default();
    p.seen(format!("read {id} {path}"));
    if !p.exists(&id) {
        return envd_gone(&id);
    }
    match p.files.lock().unwrap().get(&(id, path.clone())) {
        Some(data) => data.clone().into_response(),
        None => not_found(&format!("path {path}")),
    }
}

pub(super) async fn serve(router: Router) -> (std::net::SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    (addr, task)
}

/// The scripted provider on a loopback port.
pub(super) async fn scripted_provider() -> (Shared, url::Url, tokio::task::JoinHandle<()>) {
    let state = Shared::default();
    let router = Router::new()
        .route("/health", get(|| async { StatusCode::OK }))
        .route("/v2/sandboxes", post(create).get(list))
        .route("/sandboxes/{id}", get(get_one).delete(kill))
        .route("/sandboxes/{id}/timeout", post(|| async { StatusCode::NO_CONTENT }))
        .route("/sandboxes/{id}/snapshots", post(snapshot))
        .route("/sandboxes/{id}/fork", post(fork))
        .route("/snapshots", get(list_snapshots))
        .route("/templates/{id}", axum::routing::delete(delete_snapshot))
        .route("/v2/sandboxes/{id}/connect", post(connect))
        .route("/process.Process/Start", post(start))
        .route("/files", get(read_file))
        .with_state(Arc::clone(&state));
    let (addr, task) = serve(router).await;
    (state, format!("http://{addr}").parse().unwrap(), task)
}
