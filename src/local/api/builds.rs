//! E2B's template build API on the local provider, as the SDKs' `Template` builders call it:
//! `POST /v3/templates` (request a build), `GET /templates/{id}/files/{hash}` (is a COPY
//! step's tar cached? else an upload link) and the upload itself (`PUT` on that link, checked
//! by its token instead of the API key), `POST /v2/templates/{id}/builds/{buildID}` (start it
//! with its steps), `GET /templates/{id}/builds/{buildID}/status` (status, log page, failure
//! reason), `GET /templates/aliases/{alias}`, `DELETE /templates/{id}` and the tags routes.

use std::sync::Arc;

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, Query, Request, State};
use axum::response::{IntoResponse, Response};
use http::{HeaderMap, StatusCode};
use serde::{Deserialize, Serialize};

use super::{ApiResult, AppState, json_body};
use crate::local::api::control_error::ControlError;
use crate::local::build::{BuildError, Builds, LogLine, Status, steps::BuildSpec, validate_tag};
use crate::local::store::{Store, StoreError, TemplateRecord, split_tag};

impl From<BuildError> for ControlError {
    fn from(err: BuildError) -> Self {
        let status = match &err {
            BuildError::BadRequest(_) => StatusCode::BAD_REQUEST,
            BuildError::NotFound(_) | BuildError::Store(StoreError::NotFound(_)) => StatusCode::NOT_FOUND,
            BuildError::Conflict(_) => StatusCode::CONFLICT,
            BuildError::Store(StoreError::BadName(_) | StoreError::Reserved(_)) => StatusCode::BAD_REQUEST,
            BuildError::Store(StoreError::LimitReached { .. }) => StatusCode::INSUFFICIENT_STORAGE,
            BuildError::Store(_) => StatusCode::INTERNAL_SERVER_ERROR,
        };
        ControlError::new(status, err.to_string())
    }
}

fn builds(state: &AppState) -> ApiResult<&Arc<Builds>> {
    state.builds.as_ref().ok_or_else(|| {
        ControlError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "template builds are off: the template store could not be opened (see the provider's log)",
        )
    })
}

fn store(state: &AppState) -> ApiResult<&Store> {
    state.provider.template_store().ok_or_else(|| {
        ControlError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "the template store could not be opened (see the provider's log)",
        )
    })
}

pub(super) fn store_error(err: StoreError) -> ControlError {
    ControlError::from(BuildError::Store(err))
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct BuildRequest {
    #[serde(default)]
    name: Option<String>,
    /// Deprecated by E2B for `name`.
    #[serde(default)]
    alias: Option<String>,
    #[serde(default)]
    tags: Vec<String>,
    #[serde(default)]
    cpu_count: Option<u32>,
    #[serde(default, rename = "memoryMB")]
    memory_mb: Option<u64>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct BuildRequested {
    #[serde(rename = "templateID")]
    template_id: String,
    #[serde(rename = "buildID")]
    build_id: String,
    public: bool,
    names: Vec<String>,
    aliases: Vec<String>,
    tags: Vec<String>,
}

/// `POST /v3/templates`.
pub(super) async fn request(State(state): State<Arc<AppState>>, body: Body) -> ApiResult<Response> {
    let req: BuildRequest = json_body(&state, body).await?;
    let name = req
        .name
        .or(req.alias)
        .filter(|n| !n.trim().is_empty())
        .ok_or_else(|| ControlError::new(StatusCode::BAD_REQUEST, "a template build needs a name"))?;
    let build = builds(&state)?.request(&name, req.tags, req.cpu_count, req.memory_mb)?;
    let answer = BuildRequested {
        template_id: build.template_id.clone(),
        build_id: build.build_id.clone(),
        public: false,
        names: vec![build.name.clone()],
        aliases: vec![build.name.clone()],
        tags: build.tags.clone(),
    };
    Ok((StatusCode::ACCEPTED, Json(answer)).into_response())
}

#[derive(Serialize)]
struct FileLink {
    present: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    url: Option<String>,
}

/// The provider's own address as the client reached it (the upload link points back at it).
fn base_url(headers: &HeaderMap) -> ApiResult<String> {
    let host = headers
        .get(http::header::HOST)
        .and_then(|h| h.to_str().ok())
        .filter(|h| !h.is_empty() && h.bytes().all(|b| b.is_ascii_graphic()))
        .ok_or_else(|| ControlError::new(StatusCode::BAD_REQUEST, "the request has no usable Host header"))?;
    let scheme = match headers.get("x-forwarded-proto").and_then(|h| h.to_str().ok()) {
        Some("https") => "https",
        _ => "http",
    };
    Ok(format!("{scheme}://{host}"))
}

/// `GET /templates/{templateID}/files/{hash}`.
pub(super) async fn file_link(
    State(state): State<Arc<AppState>>,
    Path((template_id, hash)): Path<(String, String)>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let builds = builds(&state)?;
    known_template(&state, builds, &template_id)?;
    let (present, token) = builds.files.link(&template_id, &hash)?;
    let url = (!present)
        .then(|| base_url(&headers))
        .transpose()?
        .map(|base| format!("{base}/templates/{template_id}/files/{hash}?token={token}"));
    Ok((StatusCode::CREATED, Json(FileLink { present, url })).into_response())
}

/// Uploads are taken for a template that exists or has a build requested.
fn known_template(state: &AppState, builds: &Builds, template_id: &str) -> ApiResult<()> {
    let stored = store(state)?.lookup(template_id).map_err(store_error)?.is_some();
    if stored || builds.knows_template(template_id) {
        Ok(())
    } else {
        Err(ControlError::new(
            StatusCode::NOT_FOUND,
            format!("no template {template_id:?}: request a build with POST /v3/templates first"),
        ))
    }
}

#[derive(Deserialize)]
pub(super) struct UploadQuery {
    #[serde(default)]
    token: String,
}

/// Whether a request is an upload to a file link (which carries its token instead of the API key).
pub(super) fn is_upload(req: &Request) -> bool {
    let path = req.uri().path();
    req.method() == http::Method::PUT
        && path.starts_with("/templates/")
        && path.split('/').nth(3) == Some("files")
        && req.uri().query().is_some_and(|q| q.contains("token="))
}

/// `PUT /templates/{templateID}/files/{hash}?token=…`.
pub(super) async fn upload(
    State(state): State<Arc<AppState>>,
    Path((template_id, hash)): Path<(String, String)>,
    Query(query): Query<UploadQuery>,
    body: Body,
) -> ApiResult<StatusCode> {
    let builds = builds(&state)?;
    let bytes = builds.files.upload(&template_id, &hash, &query.token, body.into_data_stream()).await?;
    tracing::info!(template = %template_id, bytes, "build files uploaded");
    Ok(StatusCode::OK)
}

/// `POST /v2/templates/{templateID}/builds/{buildID}`.
pub(super) async fn start(
    State(state): State<Arc<AppState>>,
    Path((template_id, build_id)): Path<(String, String)>,
    body: Body,
) -> ApiResult<StatusCode> {
    let spec: BuildSpec = json_body(&state, body).await?;
    let builds = builds(&state)?;
    let build = builds.get(&template_id, &build_id).ok_or_else(|| unknown_build(&template_id, &build_id))?;
    builds.start(build, spec)?;
    Ok(StatusCode::ACCEPTED)
}

fn unknown_build(template_id: &str, build_id: &str) -> ControlError {
    ControlError::new(
        StatusCode::NOT_FOUND,
        format!(
            "no build {build_id} of template {template_id} (builds live in the provider process: one requested \
             before a provider restart is gone; request it again)"
        ),
    )
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct StatusQuery {
    #[serde(default)]
    logs_offset: usize,
    #[serde(default)]
    limit: Option<usize>,
    #[serde(default)]
    level: Option<String>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct StatusAnswer {
    #[serde(rename = "templateID")]
    template_id: String,
    #[serde(rename = "buildID")]
    build_id: String,
    status: Status,
    logs: Vec<String>,
    log_entries: Vec<LogLine>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<crate::local::build::Failure>,
}

/// `GET /templates/{templateID}/builds/{buildID}/status`.
pub(super) async fn status(
    State(state): State<Arc<AppState>>,
    Path((template_id, build_id)): Path<(String, String)>,
    Query(query): Query<StatusQuery>,
) -> ApiResult<Json<serde_json::Value>> {
    let build = builds(&state)?.get(&template_id, &build_id).ok_or_else(|| unknown_build(&template_id, &build_id))?;
    let level = query.level.as_deref();
    if let Some(level) = level
        && !["debug", "info", "warn", "error"].contains(&level)
    {
        return Err(ControlError::new(StatusCode::BAD_REQUEST, "level must be debug, info, warn or error"));
    }
    let page = build.page(query.logs_offset, query.limit.unwrap_or(100).min(100), level);
    let answer = StatusAnswer {
        template_id: build.template_id.clone(),
        build_id: build.build_id.clone(),
        status: page.status,
        logs: page.logs.iter().map(|l| format!("[{}] {}", l.timestamp.to_rfc3339(), l.message)).collect(),
        log_entries: page.logs,
        reason: page.failure,
    };
    serde_json::to_value(answer)
        .map(Json)
        .map_err(|e| ControlError::new(StatusCode::INTERNAL_SERVER_ERROR, format!("status: {e}")))
}

/// `GET /templates/aliases/{alias}`: 200 when a template has that name or alias.
pub(super) async fn alias(State(state): State<Arc<AppState>>, Path(alias): Path<String>) -> ApiResult<Response> {
    let found = lookup(&state, &alias)?;
    match found {
        Some(record) => {
            Ok(Json(serde_json::json!({"templateID": record.template_id, "public": false})).into_response())
        }
        None => Err(ControlError::new(StatusCode::NOT_FOUND, format!("no template with the name or alias {alias:?}"))),
    }
}

fn lookup(state: &AppState, name: &str) -> ApiResult<Option<TemplateRecord>> {
    store(state)?.lookup(name).map_err(store_error)
}

/// `DELETE /templates/{templateID}`: removes a stored template (its layers go at the next
/// `sandbox-mcp template gc`); sandboxes of it keep running.
pub(super) async fn delete(
    State(state): State<Arc<AppState>>,
    Path(template_id): Path<String>,
) -> ApiResult<StatusCode> {
    if state.provider.cfg.templates.contains_key(&template_id) || template_id == "base" {
        return Err(ControlError::new(
            StatusCode::BAD_REQUEST,
            format!(
                "{template_id:?} is a template of the provider's configuration, not of the store: it cannot be deleted"
            ),
        ));
    }
    let store = store(&state)?.clone();
    let state_dir = state.provider.cfg.state_dir.clone();
    tokio::task::spawn_blocking(move || {
        let _lock = store.lock()?;
        let record = store.remove(&template_id)?;
        if record.snapshot.is_some() {
            let freed = store.free_snapshot_layers(&record, &state_dir)?;
            tracing::info!(snapshot = %record.name, freed_bytes = freed, "snapshot deleted");
        }
        Ok::<_, crate::local::store::StoreError>(())
    })
    .await
    .map_err(|e| ControlError::new(StatusCode::INTERNAL_SERVER_ERROR, format!("delete: {e}")))?
    .map_err(store_error)?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Deserialize)]
pub(super) struct AssignTags {
    target: String,
    tags: Vec<String>,
}

#[derive(Deserialize)]
pub(super) struct DeleteTags {
    name: String,
    tags: Vec<String>,
}

/// Changes a stored template's tags under the store's lock.
async fn retag(
    state: &AppState,
    name: String,
    change: impl FnOnce(&mut Vec<String>) -> ApiResult<()> + Send + 'static,
) -> ApiResult<TemplateRecord> {
    let store = store(state)?.clone();
    tokio::task::spawn_blocking(move || {
        let _lock = store.lock().map_err(store_error)?;
        let mut record = store
            .lookup(&name)
            .map_err(store_error)?
            .ok_or_else(|| ControlError::new(StatusCode::NOT_FOUND, format!("no template {name:?}")))?;
        change(&mut record.tags)?;
        store.layout.write_record(&record).map_err(store_error)?;
        Ok(record)
    })
    .await
    .map_err(|e| ControlError::new(StatusCode::INTERNAL_SERVER_ERROR, format!("tags: {e}")))?
}

/// `POST /templates/tags`: more tags for the build `target` (`name:tag`) names.
pub(super) async fn assign_tags(State(state): State<Arc<AppState>>, body: Body) -> ApiResult<Response> {
    let req: AssignTags = json_body(&state, body).await?;
    for tag in &req.tags {
        validate_tag(tag)?;
    }
    let (name, tag) = split_tag(&req.target);
    let (name, tag) = (name.to_owned(), tag.map(str::to_owned));
    let tags = req.tags.clone();
    let record = retag(&state, name, move |have| {
        if let Some(tag) = tag
            && !have.contains(&tag)
        {
            return Err(ControlError::new(StatusCode::NOT_FOUND, format!("the template has no tag {tag:?}")));
        }
        for tag in tags {
            if !have.contains(&tag) {
                have.push(tag);
            }
        }
        Ok(())
    })
    .await?;
    let answer = serde_json::json!({"tags": req.tags, "buildID": record.build_id});
    Ok((StatusCode::CREATED, Json(answer)).into_response())
}

/// `DELETE /templates/tags`.
pub(super) async fn delete_tags(State(state): State<Arc<AppState>>, body: Body) -> ApiResult<StatusCode> {
    let req: DeleteTags = json_body(&state, body).await?;
    let tags = req.tags;
    retag(&state, req.name, move |have| {
        have.retain(|t| !tags.contains(t));
        Ok(())
    })
    .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `GET /templates/{templateID}/tags`.
pub(super) async fn list_tags(
    State(state): State<Arc<AppState>>,
    Path(template_id): Path<String>,
) -> ApiResult<Json<Vec<serde_json::Value>>> {
    let record = lookup(&state, &template_id)?
        .ok_or_else(|| ControlError::new(StatusCode::NOT_FOUND, format!("no template {template_id:?}")))?;
    Ok(Json(
        record
            .tags
            .iter()
            .map(|tag| serde_json::json!({"tag": tag, "buildID": record.build_id, "createdAt": record.created}))
            .collect(),
    ))
}
