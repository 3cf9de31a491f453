//! E2B's snapshot and fork routes (`docs/snapshots.md`): `POST /sandboxes/{id}/snapshots` (a
//! filesystem snapshot registered as a template of the store; a memory snapshot is refused with
//! the mode that works), `GET /snapshots` (paged, filtered by source sandbox or name) and
//! `POST /sandboxes/{id}/fork` (one entry per fork, each a sandbox or an error). A snapshot is
//! deleted as the template it is (`DELETE /templates/{id}`, in `builds`).

use std::sync::Arc;

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::response::{IntoResponse, Response};
use http::{HeaderValue, StatusCode};
use serde::{Deserialize, Serialize};

use super::control_error::ControlError;
use super::{ApiResult, AppState, check_id, json_body, public, sandbox_view};
use crate::e2b::wire::HEADER_NEXT_TOKEN;
use crate::local::control::provider_config::SnapshotMode;
use crate::local::control::sandbox_table::ProviderError;
use crate::local::store::{NewTemplate, SnapshotOf, TemplateRecord};

/// What a memory snapshot's refusal says: the mode that works, in both SDKs' spelling.
pub const FULL_SNAPSHOT_REFUSED: &str = "the local provider takes filesystem snapshots only: a memory snapshot \
     needs a process checkpointer, which this host does not have. Ask for mode=\"filesystem\" (Python SDK: \
     sandbox.create_snapshot(mode=\"filesystem\"); API: \"memory\": false): sandboxes made from it start with the \
     snapshot's files and none of its processes. A client that cannot name a mode (the JavaScript SDK's \
     createSnapshot) gets filesystem snapshots where the provider's operator sets local.default_snapshot_mode = \
     \"filesystem\"";

/// Body of `POST /sandboxes/{id}/snapshots` (E2B's `SandboxSnapshotRequest`).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct SnapshotRequest {
    #[serde(default)]
    name: Option<String>,
    /// `false`: filesystem only; absent or `true`: with memory (the SDKs' default, refused here).
    #[serde(default)]
    memory: Option<bool>,
}

/// E2B's `SnapshotInfo`.
#[derive(Debug, Serialize)]
struct SnapshotInfo {
    #[serde(rename = "snapshotID")]
    snapshot_id: String,
    names: Vec<String>,
}

/// Body of `POST /sandboxes/{id}/fork` (E2B's `SandboxForkRequest`).
#[derive(Debug, Default, Deserialize)]
struct ForkRequest {
    #[serde(default)]
    timeout: Option<u64>,
    #[serde(default)]
    count: Option<u32>,
}

/// The id E2B gives a snapshot: its name and tag.
fn snapshot_id(record: &TemplateRecord) -> String {
    format!("{}:default", record.name)
}

fn info(record: &TemplateRecord) -> SnapshotInfo {
    SnapshotInfo { snapshot_id: snapshot_id(record), names: vec![snapshot_id(record)] }
}

/// `POST /sandboxes/{id}/snapshots`: 201 with the snapshot's id and names.
pub(super) async fn create(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
    body: Body,
) -> ApiResult<Response> {
    check_id(&id)?;
    let req: SnapshotRequest = json_body(&state, body).await?;
    public(&state, &id)?;
    let filesystem = match req.memory {
        Some(memory) => !memory,
        None => state.provider.cfg.default_snapshot_mode == SnapshotMode::Filesystem,
    };
    if !filesystem {
        return Err(ControlError::new(StatusCode::BAD_REQUEST, FULL_SNAPSHOT_REFUSED));
    }
    let provider = &state.provider;
    let store = provider
        .template_store()
        .ok_or_else(|| ControlError::new(StatusCode::SERVICE_UNAVAILABLE, "the template store cannot be opened"))?;
    let name = match req.name.as_deref().map(str::trim).filter(|n| !n.is_empty()) {
        Some(name) => {
            let name = name.strip_suffix(":default").unwrap_or(name).to_owned();
            store.check_name(&name).map_err(|e| ControlError::new(StatusCode::BAD_REQUEST, e.to_string()))?;
            // Checked again under the store's lock; here so that a refused name freezes nothing.
            replaces(store, &name)?;
            Some(name)
        }
        None => None,
    };
    let max = provider.cfg.max_snapshots;
    let source = id.clone();
    let record = provider
        .snapshot_layers(&id, move |store, lineage, config| {
            let replaces = match &name {
                Some(name) => replaces(store, name)?,
                None => false,
            };
            let records = store.list().map_err(|e| ProviderError::Internal(e.to_string()))?;
            let count = records.iter().filter(|r| r.snapshot.is_some()).count();
            if !replaces && count >= max {
                return Err(ProviderError::Quota(format!(
                    "the provider keeps at most {max} snapshots (local.max_snapshots); delete one first \
                     (Sandbox.delete_snapshot)"
                )));
            }
            let template_id = crate::local::store::new_template_id();
            let name = name.unwrap_or_else(|| template_id.clone());
            let snapshot = SnapshotOf {
                sandbox_id: source.clone(),
                root_template: lineage.root_template.clone(),
                extra: lineage.extra.clone(),
            };
            let layers = lineage
                .layers
                .iter()
                .map(|d| crate::local::store::Digest::parse(d))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| ProviderError::Internal(e.to_string()))?;
            store
                .commit(NewTemplate {
                    name: &name,
                    layers,
                    config,
                    source: format!("snapshot:{source}"),
                    template_id: if replaces { None } else { Some(template_id) },
                    snapshot: Some(snapshot),
                    ..NewTemplate::default()
                })
                .map_err(|e| ProviderError::Internal(e.to_string()))
        })
        .await?;
    tracing::info!(sandbox = %id, snapshot = %record.name, "snapshot taken");
    Ok((StatusCode::CREATED, Json(info(&record))).into_response())
}

/// Whether a snapshot named `name` replaces a snapshot of that name (true) or is a new one
/// (false); a 400 when the name is another template's (a name, id or alias of a template that is
/// not a snapshot, or another snapshot's id).
fn replaces(store: &crate::local::store::Store, name: &str) -> Result<bool, ProviderError> {
    match store.lookup(name).map_err(|e| ProviderError::Internal(e.to_string()))? {
        None => Ok(false),
        Some(existing) if existing.snapshot.is_some() && existing.name == name => Ok(true),
        Some(_) => Err(ProviderError::BadRequest(format!(
            "template {name:?} exists and is not a snapshot of that name; choose another snapshot name"
        ))),
    }
}

/// `GET /snapshots?sandboxID=&name=&limit=&nextToken=`: the snapshots, oldest first, in pages
/// (`X-Next-Token` while more follow).
pub(super) async fn list(State(state): State<Arc<AppState>>, req: Request) -> ApiResult<Response> {
    let query = req.uri().query().unwrap_or("");
    let mut sandbox = None;
    let mut name = None;
    let mut limit = 100usize;
    let mut next = None;
    for (key, value) in url::form_urlencoded::parse(query.as_bytes()) {
        match key.as_ref() {
            "sandboxID" => sandbox = Some(value.into_owned()),
            "name" => name = Some(value.into_owned()),
            "limit" => {
                limit = value.parse::<usize>().ok().filter(|n| (1..=1000).contains(n)).ok_or_else(|| {
                    ControlError::new(StatusCode::BAD_REQUEST, format!("limit must be 1 to 1000 (got {value:?})"))
                })?;
            }
            "nextToken" => next = Some(value.into_owned()),
            _ => {}
        }
    }
    let Some(store) = state.provider.template_store() else {
        return Ok(Json(Vec::<SnapshotInfo>::new()).into_response());
    };
    let mut records: Vec<TemplateRecord> = store
        .list()
        .map_err(super::builds::store_error)?
        .into_iter()
        .filter(|r| r.snapshot.as_ref().is_some_and(|s| sandbox.as_ref().is_none_or(|id| &s.sandbox_id == id)))
        .filter(|r| name.as_ref().is_none_or(|n| names_match(r, n)))
        .collect();
    records.sort_by(|a, b| (&a.created, &a.template_id).cmp(&(&b.created, &b.template_id)));
    let start = match &next {
        Some(token) => records.iter().position(|r| &r.template_id == token).map(|i| i + 1).unwrap_or(records.len()),
        None => 0,
    };
    let page: Vec<&TemplateRecord> = records.iter().skip(start).take(limit).collect();
    let more = start + page.len() < records.len();
    let items: Vec<SnapshotInfo> = page.iter().map(|r| info(r)).collect();
    let mut response = Json(items).into_response();
    if more
        && let Some(last) = page.last()
        && let Ok(value) = HeaderValue::from_str(&last.template_id)
    {
        response.headers_mut().insert(HEADER_NEXT_TOKEN, value);
    }
    Ok(response)
}

/// Whether `wanted` names the snapshot: its name, id or snapshot id, with or without the tag.
fn names_match(record: &TemplateRecord, wanted: &str) -> bool {
    let (bare, tag) = crate::local::store::split_tag(wanted);
    if tag.is_some_and(|t| !record.tags.iter().any(|have| have == t)) {
        return false;
    }
    record.name == bare || record.template_id == bare || record.aliases.iter().any(|a| a == bare)
}

/// `POST /sandboxes/{id}/fork`: 201 with one entry per fork.
pub(super) async fn fork(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
    body: Body,
) -> ApiResult<Response> {
    check_id(&id)?;
    let req: ForkRequest = json_body(&state, body).await?;
    public(&state, &id)?;
    let results = state.provider.fork(&id, req.count.unwrap_or(1), req.timeout).await?;
    let domain = state.provider.cfg.network.domain.as_deref();
    let entries: Vec<serde_json::Value> = results
        .into_iter()
        .map(|result| match result {
            Ok(rec) => serde_json::json!({ "sandbox": sandbox_view(&rec, domain) }),
            Err(err) => {
                tracing::warn!(parent = %id, err = %crate::logging::escaped(&err), "a fork failed to start");
                serde_json::json!({ "error": { "code": err.status(), "message": err.to_string() } })
            }
        })
        .collect();
    Ok((StatusCode::CREATED, Json(entries)).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::e2b::wire::AutoResume;
    use crate::local::control::record::Lifecycle;

    fn record(name: &str, id: &str, tags: &[&str]) -> TemplateRecord {
        TemplateRecord {
            name: name.into(),
            template_id: id.into(),
            aliases: vec![name.into()],
            tags: tags.iter().map(|t| (*t).to_owned()).collect(),
            build_id: "b".into(),
            layers: Vec::new(),
            config: Default::default(),
            size_bytes: 0,
            created: String::new(),
            cpu_count: 2,
            memory_mb: 512,
            source: String::new(),
            snapshot: Some(SnapshotOf::default()),
        }
    }

    #[test]
    fn a_snapshot_is_named_by_its_name_id_or_snapshot_id_with_a_tag_it_has() {
        let r = record("mine", "abc123", &["default"]);
        assert_eq!(snapshot_id(&r), "mine:default");
        for wanted in ["mine", "mine:default", "abc123", "abc123:default"] {
            assert!(names_match(&r, wanted), "{wanted}");
        }
        for wanted in ["min", "mine:v2", "other", "abc", ""] {
            assert!(!names_match(&r, wanted), "{wanted}");
        }
    }

    #[test]
    fn lifecycles_e2b_refuses_are_refused() {
        let on = Some(AutoResume { enabled: true });
        let ok = super::super::lifecycle_of(Some(true), None, on).unwrap();
        assert_eq!(ok, Lifecycle { on_timeout_pause: true, auto_resume: true, filesystem_pause: false });
        let fs = super::super::lifecycle_of(Some(true), Some(false), None).unwrap();
        assert!(fs.filesystem_pause && fs.on_timeout_pause && !fs.auto_resume);
        assert_eq!(super::super::lifecycle_of(None, None, None).unwrap(), Lifecycle::default());
        // A filesystem-only pause without autoPause means nothing: no pause at all.
        assert!(!super::super::lifecycle_of(Some(false), Some(false), None).unwrap().filesystem_pause);
        assert!(super::super::lifecycle_of(None, None, on).is_err(), "autoResume without autoPause");
        assert!(super::super::lifecycle_of(Some(true), Some(false), on).is_err(), "autoResume with a filesystem pause");
        assert!(super::super::lifecycle_of(Some(false), None, Some(AutoResume { enabled: false })).is_ok());
    }
}
