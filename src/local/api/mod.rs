//! The E2B-compatible control plane over HTTP
//! (`docs/provider-contract.md#control-plane`): routes, API
//! key check, JSON bodies with size limits, `{code, message}` errors, and the
//! switch that sends `E2b-Sandbox-Id` traffic to the data-plane proxy (`proxy`, its kept-alive
//! agent connections `agent_pool`). The list
//! query's parsing is `list_query`, the error answer `control_error`; template builds and
//! `GET /templates` are `builds` and `templates`.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use http::{HeaderValue, StatusCode};
use http_body_util::BodyExt;
use serde::de::DeserializeOwned;
use subtle::ConstantTimeEq;

pub mod agent_pool;
mod builds;
pub mod control_error;
pub mod list_query;
pub mod proxy;
mod snapshots;
mod templates;

use crate::e2b::wire::{
    self, ConnectSandbox, HEADER_API_KEY, HEADER_NEXT_TOKEN, HEADER_SANDBOX_ID, NewSandbox, SandboxDetail,
    SandboxState, SetTimeout,
};
use crate::local::control::record::{Lifecycle, SandboxRecord, rfc3339_ms};
use crate::local::control::sandbox_table::{CreateParams, SandboxTable};
use control_error::ControlError;

/// Shared state of the HTTP layer.
pub struct AppState {
    pub provider: Arc<SandboxTable>,
    /// Template builds; `None` when the template store could not be opened.
    pub builds: Option<Arc<crate::local::build::Builds>>,
    /// Kept-alive connections of the data-plane proxy to the sandboxes' agents.
    pub agents: Arc<agent_pool::AgentConnections>,
}

impl AppState {
    pub fn new(provider: Arc<SandboxTable>) -> AppState {
        let builds = match crate::local::build::Builds::new(provider.clone()) {
            Ok(builds) => Some(builds),
            Err(err) => {
                tracing::warn!(%err, "template builds are off");
                None
            }
        };
        AppState { provider, builds, agents: Arc::default() }
    }
}

type ApiResult<T> = Result<T, ControlError>;

/// Builds the whole app: control plane plus data-plane switch.
pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/health", get(|| async { StatusCode::OK }))
        .route("/sandboxes", post(create).get(list_v1))
        .route("/v2/sandboxes", post(create).get(list_v2))
        .route("/sandboxes/{id}", get(info).delete(kill))
        .route("/sandboxes/{id}/connect", post(connect))
        .route("/v2/sandboxes/{id}/connect", post(connect))
        .route("/sandboxes/{id}/resume", post(resume))
        .route("/sandboxes/{id}/timeout", post(set_timeout))
        .route("/sandboxes/{id}/pause", post(pause))
        .route("/sandboxes/{id}/metrics", get(metrics))
        .route("/sandboxes/{id}/network", put(update_network))
        .route("/sandboxes/{id}/snapshots", post(snapshots::create))
        .route("/sandboxes/{id}/fork", post(snapshots::fork))
        .route("/snapshots", get(snapshots::list))
        .route("/templates", get(templates::list))
        .route("/v3/templates", post(builds::request))
        .route("/templates/{id}", axum::routing::delete(builds::delete))
        .route("/templates/{id}/files/{hash}", get(builds::file_link).put(builds::upload))
        .route("/v2/templates/{id}/builds/{build}", post(builds::start))
        .route("/templates/{id}/builds/{build}/status", get(builds::status))
        .route("/templates/aliases/{alias}", get(builds::alias))
        .route("/templates/tags", post(builds::assign_tags).delete(builds::delete_tags))
        .route("/templates/{id}/tags", get(builds::list_tags))
        .fallback(|| async { ControlError::new(StatusCode::NOT_FOUND, "no such route") })
        .method_not_allowed_fallback(|| async {
            ControlError::new(StatusCode::METHOD_NOT_ALLOWED, "method not allowed on this route")
        })
        .layer(middleware::from_fn_with_state(state.clone(), check_api_key))
        .layer(middleware::from_fn_with_state(state.clone(), route_data_plane))
        // The API key and the sandboxes' access tokens never show in a logged or debugged request.
        .layer(tower_http::sensitive_headers::SetSensitiveRequestHeadersLayer::new([
            http::HeaderName::from_static("x-api-key"),
            http::HeaderName::from_static("x-access-token"),
            http::HeaderName::from_static(wire::HEADER_TRAFFIC_ACCESS_TOKEN),
            http::header::AUTHORIZATION,
        ]))
        // A bug that panics in a handler answers 500 in E2B's error shape instead of a reset connection.
        .layer(tower_http::catch_panic::CatchPanicLayer::custom(|_panic: Box<dyn std::any::Any + Send>| {
            tracing::error!("a control-plane handler panicked");
            ControlError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal error in the local provider").into_response()
        }))
        .with_state(state)
}

/// Requests with `E2b-Sandbox-Id` go to the sandbox's agent; requests for a `{port}-{sandboxID}.`
/// host to that port in the sandbox (the agent for envd's port); the rest to the control plane.
async fn route_data_plane(State(state): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    if let Some(id) = req.headers().get(HEADER_SANDBOX_ID) {
        let id = id.to_str().unwrap_or("").to_owned();
        return proxy::forward(state.provider.clone(), &state.agents, &id, req).await;
    }
    let host = req.headers().get(http::header::HOST).and_then(|h| h.to_str().ok()).unwrap_or("");
    if let Some((port, id)) = crate::local::net::inbound::parse_host(host)
        && let Some(entry) = state.provider.get_public(id)
    {
        let id = id.to_owned();
        if port == wire::ENVD_PORT {
            return proxy::forward(state.provider.clone(), &state.agents, &id, req).await;
        }
        return inbound(&state.provider, &entry, &id, port, req).await;
    }
    next.run(req).await
}

/// A request for a port of a sandbox, from outside. The traffic token is checked first, so a
/// caller without it learns nothing of the sandbox's state or ports.
async fn inbound(
    provider: &SandboxTable,
    entry: &crate::local::control::sandbox_table::SandboxEntry,
    id: &str,
    port: u16,
    req: Request,
) -> Response {
    let (checked, running, auto_resume) = entry.read(|rec| {
        let token = rec.traffic_access_token.as_deref();
        let checked = crate::local::net::inbound::check_traffic(&req, rec.network.allow_public_traffic, token);
        (checked, rec.state == SandboxState::Running, rec.lifecycle.auto_resume)
    });
    if let Err(why) = checked {
        tracing::debug!(sandbox = %id, port, ?why, "inbound request refused: traffic access token");
        return crate::local::net::inbound::refusal(id, why);
    }
    if !running {
        if !auto_resume {
            return ControlError::new(
                StatusCode::BAD_GATEWAY,
                format!("sandbox {id} is paused; connect to it to resume it"),
            )
            .into_response();
        }
        if let Err(err) = provider.connect(id, None).await {
            return ControlError::from(err).into_response();
        }
    }
    let Some(netns) = entry.netns() else {
        return ControlError::new(StatusCode::BAD_GATEWAY, format!("sandbox {id} has no network")).into_response();
    };
    crate::local::net::inbound::forward(&netns, id, port, req).await
}

async fn check_api_key(State(state): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    // A build file upload carries its own token (E2B's presigned upload URLs need no API key).
    if req.uri().path() == "/health" || builds::is_upload(&req) {
        return next.run(req).await;
    }
    let given = req.headers().get(HEADER_API_KEY).map(HeaderValue::as_bytes);
    let ok = match (&state.provider.cfg.api_key, given) {
        (_, None) => false,
        (None, Some(_)) => true,
        (Some(key), Some(given)) => bool::from(given.ct_eq(key.as_bytes())),
    };
    if !ok {
        return ControlError::new(StatusCode::UNAUTHORIZED, "missing or invalid X-API-Key").into_response();
    }
    next.run(req).await
}

/// Reads a JSON body of at most the configured size; empty bodies decode as `{}`.
async fn json_body<T: DeserializeOwned>(state: &AppState, body: Body) -> ApiResult<T> {
    let limit = state.provider.cfg.max_control_body_bytes;
    let bytes = match http_body_util::Limited::new(body, limit).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(err) if err.downcast_ref::<http_body_util::LengthLimitError>().is_some() => {
            return Err(ControlError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("request body exceeds {limit} bytes"),
            ));
        }
        Err(err) => return Err(ControlError::new(StatusCode::BAD_REQUEST, format!("cannot read request body: {err}"))),
    };
    let bytes: &[u8] = if bytes.iter().all(u8::is_ascii_whitespace) { b"{}" } else { &bytes };
    serde_json::from_slice(bytes)
        .map_err(|e| ControlError::new(StatusCode::BAD_REQUEST, format!("invalid JSON body: {e}")))
}

fn sandbox_view(rec: &SandboxRecord, domain: Option<&str>) -> wire::Sandbox {
    wire::Sandbox {
        template_id: rec.template.clone(),
        sandbox_id: rec.id.clone(),
        alias: None,
        client_id: "local".into(),
        envd_version: wire::ENVD_VERSION.into(),
        envd_access_token: Some(rec.envd_access_token.clone()),
        traffic_access_token: rec.traffic_access_token.clone(),
        domain: domain.map(str::to_owned),
    }
}

/// The record's network settings in E2B's form.
fn network_view(rec: &SandboxRecord) -> wire::SandboxNetwork {
    wire::SandboxNetwork {
        allow_out: Some(rec.network.allow_out.clone()),
        deny_out: Some(rec.network.deny_out.clone()),
        allow_public_traffic: Some(rec.network.allow_public_traffic),
        ..Default::default()
    }
}

fn detail_view(provider: &SandboxTable, rec: &SandboxRecord, with_token: bool) -> SandboxDetail {
    let memory_mb = provider.cfg.memory_limit_mb.unwrap_or_else(total_memory_mb);
    SandboxDetail {
        template_id: rec.template.clone(),
        sandbox_id: rec.id.clone(),
        alias: None,
        client_id: "local".into(),
        started_at: rfc3339_ms(rec.started_at_ms),
        end_at: rfc3339_ms(rec.end_at_ms),
        envd_version: wire::ENVD_VERSION.into(),
        envd_access_token: with_token.then(|| rec.envd_access_token.clone()),
        domain: provider.cfg.network.domain.clone(),
        cpu_count: std::thread::available_parallelism().map(|n| n.get() as u32).unwrap_or(1),
        memory_mb,
        disk_size_mb: provider.disk_limit_bytes().map(|b| b / (1024 * 1024)).unwrap_or(0),
        metadata: rec.metadata.clone(),
        state: rec.state,
        allow_internet_access: Some(rec.allow_internet_access),
        network: Some(network_view(rec)),
        lifecycle: Some(wire::SandboxLifecycle {
            auto_resume: rec.lifecycle.auto_resume,
            on_timeout: if rec.lifecycle.on_timeout_pause { "pause" } else { "kill" }.into(),
        }),
    }
}

fn total_memory_mb() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines().find_map(|l| l.strip_prefix("MemTotal:")?.trim().strip_suffix("kB")?.trim().parse().ok())
        })
        .map(|kib: u64| kib / 1024)
        .unwrap_or(0)
}

/// Sandbox `id`, unless it is unknown or a template build's step sandbox (its build's own, not
/// the API's): 404 for both alike.
fn public(state: &AppState, id: &str) -> ApiResult<Arc<crate::local::control::sandbox_table::SandboxEntry>> {
    state
        .provider
        .get_public(id)
        .ok_or_else(|| ControlError::new(StatusCode::NOT_FOUND, format!("sandbox {id} not found")))
}

fn check_id(id: &str) -> ApiResult<()> {
    if crate::local::control::ids::is_valid_sandbox_id(id) {
        Ok(())
    } else {
        Err(ControlError::new(StatusCode::NOT_FOUND, format!("sandbox {id} not found")))
    }
}

async fn create(State(state): State<Arc<AppState>>, body: Body) -> ApiResult<Response> {
    let req: NewSandbox = json_body(&state, body).await?;
    if req.template_id.trim().is_empty() {
        return Err(ControlError::new(StatusCode::BAD_REQUEST, "templateID must not be empty"));
    }
    let network = req.network.unwrap_or_default();
    refuse_unsupported(network.unsupported_fields())?;
    let lifecycle = lifecycle_of(req.auto_pause, req.auto_pause_memory, req.auto_resume)?;
    let params = CreateParams {
        template: req.template_id,
        timeout_secs: req.timeout,
        metadata: req.metadata.unwrap_or_default(),
        env_vars: req.env_vars.unwrap_or_default(),
        allow_internet_access: req.allow_internet_access.unwrap_or(true),
        network: crate::local::net::policy::NetworkConfig {
            allow_out: network.allow_out.unwrap_or_default(),
            deny_out: network.deny_out.unwrap_or_default(),
            // E2B's documented default: sandbox URLs are public unless the create says otherwise
            // (the gateway always says: false unless its tool call asks for public traffic).
            allow_public_traffic: network.allow_public_traffic.unwrap_or(true),
        },
        lifecycle,
        ..CreateParams::default()
    };
    let rec = state.provider.create(params).await?;
    Ok((StatusCode::CREATED, Json(sandbox_view(&rec, state.provider.cfg.network.domain.as_deref()))).into_response())
}

/// The create's `autoPause`, `autoPauseMemory` and `autoResume` as the sandbox's lifecycle;
/// combinations E2B refuses are a 400 here too.
fn lifecycle_of(
    auto_pause: Option<bool>,
    auto_pause_memory: Option<bool>,
    auto_resume: Option<wire::AutoResume>,
) -> ApiResult<Lifecycle> {
    let on_timeout_pause = auto_pause.unwrap_or(false);
    let auto_resume = auto_resume.is_some_and(|r| r.enabled);
    let filesystem_pause = on_timeout_pause && auto_pause_memory == Some(false);
    if auto_resume && !on_timeout_pause {
        return Err(ControlError::new(
            StatusCode::BAD_REQUEST,
            "autoResume needs autoPause (lifecycle on_timeout \"pause\"): a killed sandbox cannot resume",
        ));
    }
    if auto_resume && filesystem_pause {
        return Err(ControlError::new(
            StatusCode::BAD_REQUEST,
            "autoResume cannot be combined with a filesystem-only pause (autoPauseMemory false): such a sandbox is \
             resumed explicitly, with connect",
        ));
    }
    Ok(Lifecycle { on_timeout_pause, auto_resume, filesystem_pause })
}

fn refuse_unsupported(fields: Vec<&'static str>) -> ApiResult<()> {
    if fields.is_empty() {
        return Ok(());
    }
    Err(ControlError::new(
        StatusCode::BAD_REQUEST,
        format!(
            "network.{} is not supported by the local provider (it filters egress by IP address and has no egress \
             HTTP proxy); remove it, or use E2B",
            fields.join(", network.")
        ),
    ))
}

/// `PUT /sandboxes/{id}/network`: replaces the egress rules of a running sandbox (204).
async fn update_network(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
    body: Body,
) -> ApiResult<StatusCode> {
    check_id(&id)?;
    let req: wire::NetworkUpdate = json_body(&state, body).await?;
    public(&state, &id)?;
    let unsupported = wire::SandboxNetwork { egress_proxy: req.egress_proxy, rules: req.rules, ..Default::default() };
    refuse_unsupported(unsupported.unsupported_fields())?;
    state
        .provider
        .update_network(
            &id,
            req.allow_out.unwrap_or_default(),
            req.deny_out.unwrap_or_default(),
            req.allow_internet_access,
        )
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn connect(State(state): State<Arc<AppState>>, Path(id): Path<String>, body: Body) -> ApiResult<Response> {
    check_id(&id)?;
    let req: ConnectSandbox = json_body(&state, body).await?;
    public(&state, &id)?;
    let (rec, resumed) = state.provider.connect(&id, req.timeout).await?;
    let status = if resumed { StatusCode::CREATED } else { StatusCode::OK };
    Ok((status, Json(sandbox_view(&rec, state.provider.cfg.network.domain.as_deref()))).into_response())
}

/// Deprecated `POST /sandboxes/{id}/resume`: 201 when resumed, 409 when not paused.
async fn resume(State(state): State<Arc<AppState>>, Path(id): Path<String>, body: Body) -> ApiResult<Response> {
    check_id(&id)?;
    let req: ConnectSandbox = json_body(&state, body).await?;
    let paused = state.provider.get_public(&id).map(|e| e.snapshot().state == SandboxState::Paused);
    match paused {
        None => Err(ControlError::new(StatusCode::NOT_FOUND, format!("sandbox {id} not found"))),
        Some(false) => Err(ControlError::new(StatusCode::CONFLICT, format!("sandbox {id} is not paused"))),
        Some(true) => {
            let (rec, _) = state.provider.connect(&id, req.timeout).await?;
            let view = sandbox_view(&rec, state.provider.cfg.network.domain.as_deref());
            Ok((StatusCode::CREATED, Json(view)).into_response())
        }
    }
}

async fn kill(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> ApiResult<StatusCode> {
    check_id(&id)?;
    public(&state, &id)?;
    tracing::info!(sandbox = %id, "kill requested");
    state.provider.kill(&id).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn set_timeout(State(state): State<Arc<AppState>>, Path(id): Path<String>, body: Body) -> ApiResult<StatusCode> {
    check_id(&id)?;
    let req: SetTimeout = json_body(&state, body).await?;
    public(&state, &id)?;
    state.provider.set_timeout(&id, req.timeout)?;
    Ok(StatusCode::NO_CONTENT)
}

async fn pause(State(state): State<Arc<AppState>>, Path(id): Path<String>, body: Body) -> ApiResult<StatusCode> {
    check_id(&id)?;
    let _: serde_json::Value = json_body(&state, body).await?;
    public(&state, &id)?;
    state.provider.pause(&id).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn info(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> ApiResult<Json<SandboxDetail>> {
    check_id(&id)?;
    let entry = public(&state, &id)?;
    Ok(Json(detail_view(&state.provider, &entry.snapshot(), true)))
}

async fn metrics(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> ApiResult<Json<serde_json::Value>> {
    check_id(&id)?;
    let entry = public(&state, &id)?;
    let rec = entry.snapshot();
    let mem_used = crate::local::isolation::cgroups::memory_usage(&rec.cgroups).unwrap_or(0);
    let mem_total = state.provider.cfg.memory_limit_mb.unwrap_or_else(total_memory_mb) * 1024 * 1024;
    let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    // The sandbox's root as its agent sees it: statvfs reports the overlay's upper filesystem,
    // i.e. the sandbox's disk image when the limit is on.
    let disk = crate::local::isolation::disk::usage(std::path::Path::new(&format!("/proc/{}/root/", rec.envd_pid)))
        .unwrap_or((0, 0));
    Ok(Json(serde_json::json!([{
        "timestampUnix": chrono::Utc::now().timestamp(),
        "timestamp": rfc3339_ms(crate::local::control::record::now_ms()),
        "cpuCount": cpus,
        "cpuUsedPct": 0.0,
        "memUsed": mem_used,
        "memTotal": mem_total,
        "memCache": crate::local::isolation::cgroups::memory_cache(&rec.cgroups).unwrap_or(0),
        "diskUsed": disk.0,
        "diskTotal": disk.1,
    }])))
}

async fn list_v1(State(state): State<Arc<AppState>>, req: Request) -> ApiResult<Response> {
    list(&state, req.uri().query().unwrap_or(""), true)
}

async fn list_v2(State(state): State<Arc<AppState>>, req: Request) -> ApiResult<Response> {
    list(&state, req.uri().query().unwrap_or(""), false)
}

fn list(state: &AppState, query: &str, v1: bool) -> ApiResult<Response> {
    let q = list_query::parse(query).map_err(|e| ControlError::new(StatusCode::BAD_REQUEST, e.to_string()))?;
    let states = if v1 { vec![SandboxState::Running] } else { q.states.clone() };
    let mut recs: Vec<SandboxRecord> = state
        .provider
        .all_public()
        .iter()
        .map(|e| e.snapshot())
        .filter(|r| states.is_empty() || states.contains(&r.state))
        .filter(|r| q.metadata_matches(&r.metadata))
        .collect();
    recs.sort_by(|a, b| (a.started_at_ms, &a.id).cmp(&(b.started_at_ms, &b.id)));
    if q.descending {
        recs.reverse();
    }
    let start = match &q.next_token {
        Some(token) => recs
            .iter()
            .position(|r| {
                let key = list_query::page_key(r);
                if q.descending { key < *token } else { key > *token }
            })
            .unwrap_or(recs.len()),
        None => 0,
    };
    let limit = if v1 { usize::MAX } else { q.limit };
    let page: Vec<&SandboxRecord> = recs.iter().skip(start).take(limit).collect();
    let more = start + page.len() < recs.len();
    let items: Vec<SandboxDetail> = page.iter().map(|r| detail_view(&state.provider, r, false)).collect();
    let mut response = Json(items).into_response();
    if more
        && let Some(last) = page.last()
        && let Ok(value) = HeaderValue::from_str(&list_query::page_key(last))
    {
        response.headers_mut().insert(HEADER_NEXT_TOKEN, value);
    }
    Ok(response)
}
