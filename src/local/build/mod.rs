//! Template builds, as E2B's template build API runs them (`POST /v3/templates`, then the
//! build's start with its steps, then its status): the table of builds of this provider
//! process, each build's status and log, and the queue that runs at most
//! [`CONCURRENT_BUILDS`] at once. How one build runs is `run`; its steps and their cache keys
//! are `steps`; the uploaded files of `COPY` steps are `files`; turning a step sandbox's
//! written files into a layer is the store's `harvest`.
//!
//! Builds live in memory: after a provider restart a build in flight is gone (its status
//! answers 404) and nothing of it was registered; finished steps stay cached in the store.

pub mod files;
mod run;
pub mod steps;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::store::{self, StoreError};
use crate::local::control::sandbox_table::SandboxTable;

/// Builds that run at once; later ones wait (status `waiting`).
pub const CONCURRENT_BUILDS: usize = 2;
/// Finished builds kept for their status.
const KEPT_FINISHED: usize = 256;
/// Log lines a build keeps (the oldest are dropped past it).
const MAX_LOG_LINES: usize = 20_000;
/// Bytes of log messages a running build keeps (the oldest lines are dropped past it), so a
/// step printing without end holds bounded memory.
const MAX_LOG_BYTES: usize = 4 << 20;
/// Bytes of log messages a finished build keeps (its last lines), for [`KEPT_FINISHED`] of them.
const KEPT_LOG_BYTES: usize = 256 << 10;
/// Longest log message; a longer one is cut (at a character boundary) and marked.
pub const MAX_LINE_BYTES: usize = 8 << 10;
/// Lines of a failed step's output quoted in the failure reason.
pub const REASON_TAIL_LINES: usize = 20;

/// Errors of requesting or starting a build (those of running one are in its status).
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// E2B's `TemplateBuildStatus`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Waiting,
    Building,
    Ready,
    Error,
}

/// One line of a build's log (E2B's `BuildLogEntry`).
#[derive(Debug, Clone, Serialize)]
pub struct LogLine {
    pub timestamp: DateTime<Utc>,
    pub level: &'static str,
    pub message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
}

/// Why a build failed (E2B's `BuildStatusReason`).
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Failure {
    pub message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
    pub log_entries: Vec<LogLine>,
}

#[derive(Debug)]
struct BuildState {
    status: Status,
    started: bool,
    logs: std::collections::VecDeque<LogLine>,
    /// Bytes of the messages in `logs`.
    log_bytes: usize,
    /// Lines dropped from the front of `logs` (offsets stay those of the whole log).
    dropped: usize,
    failure: Option<Failure>,
    finished: Option<DateTime<Utc>>,
}

impl BuildState {
    /// Drops the oldest lines until at most `lines` lines of at most `bytes` bytes are left.
    fn trim(&mut self, lines: usize, bytes: usize) {
        while self.logs.len() > lines || (self.log_bytes > bytes && self.logs.len() > 1) {
            let Some(old) = self.logs.pop_front() else { break };
            self.log_bytes -= old.message.len();
            self.dropped += 1;
        }
    }
}

/// `line` cut to [`MAX_LINE_BYTES`] (at a character boundary), marked when cut.
pub fn clip_line(mut line: String) -> String {
    if line.len() > MAX_LINE_BYTES {
        let mut at = MAX_LINE_BYTES;
        while !line.is_char_boundary(at) {
            at -= 1;
        }
        line.truncate(at);
        line.push_str(" [cut]");
    }
    line
}

/// One requested build.
#[derive(Debug)]
pub struct Build {
    pub template_id: String,
    pub build_id: String,
    pub name: String,
    pub tags: Vec<String>,
    pub cpu_count: Option<u32>,
    pub memory_mb: Option<u64>,
    state: Mutex<BuildState>,
}

/// A page of a build's status.
#[derive(Debug, Clone)]
pub struct StatusPage {
    pub status: Status,
    pub logs: Vec<LogLine>,
    pub failure: Option<Failure>,
}

impl Build {
    /// Appends a log line (`step`: the step's number, `base` or `finalize`, as E2B names them).
    pub fn log(&self, level: &'static str, step: Option<&str>, message: impl Into<String>) {
        let message = clip_line(message.into());
        let mut state = crate::sync::lock(&self.state);
        state.log_bytes += message.len();
        state.logs.push_back(LogLine { timestamp: Utc::now(), level, message, step: step.map(str::to_owned) });
        state.trim(MAX_LOG_LINES, MAX_LOG_BYTES);
    }

    fn set_status(&self, status: Status) {
        crate::sync::lock(&self.state).status = status;
    }

    fn fail(&self, failure: Failure) {
        let mut state = crate::sync::lock(&self.state);
        state.status = Status::Error;
        state.finished = Some(Utc::now());
        state.failure = Some(failure);
        state.trim(MAX_LOG_LINES, KEPT_LOG_BYTES);
    }

    fn succeed(&self) {
        let mut state = crate::sync::lock(&self.state);
        state.status = Status::Ready;
        state.finished = Some(Utc::now());
        state.trim(MAX_LOG_LINES, KEPT_LOG_BYTES);
    }

    /// The last `n` lines of the log.
    pub fn tail(&self, n: usize) -> Vec<LogLine> {
        let state = crate::sync::lock(&self.state);
        state.logs.iter().skip(state.logs.len().saturating_sub(n)).cloned().collect()
    }

    /// Status and the log lines from `offset` (an index into the whole log), at most `limit`,
    /// only those of `level` or above when given.
    pub fn page(&self, offset: usize, limit: usize, level: Option<&str>) -> StatusPage {
        let rank = |l: &str| match l {
            "debug" => 0,
            "info" => 1,
            "warn" => 2,
            _ => 3,
        };
        let min = level.map(rank).unwrap_or(0);
        let state = crate::sync::lock(&self.state);
        let from = offset.saturating_sub(state.dropped).min(state.logs.len());
        let logs = state.logs.iter().skip(from).filter(|l| rank(l.level) >= min).take(limit).cloned().collect();
        StatusPage { status: state.status, logs, failure: state.failure.clone() }
    }
}

/// The builds of this provider process.
pub struct Builds {
    provider: Arc<SandboxTable>,
    table: Mutex<HashMap<String, Arc<Build>>>,
    queue: Arc<tokio::sync::Semaphore>,
    pub files: files::Uploads,
}

/// `name` or `name:tag` of a build request, split and checked.
pub fn split_name(raw: &str) -> Result<(String, Option<String>), BuildError> {
    let (name, tag) = store::split_tag(raw);
    store::validate_name(name).map_err(|e| BuildError::BadRequest(e.to_string()))?;
    if let Some(tag) = tag {
        validate_tag(tag)?;
    }
    Ok((name.to_owned(), tag.map(str::to_owned)))
}

/// Tags are names too: 1-64 of `a-z A-Z 0-9 . _ -`.
pub fn validate_tag(tag: &str) -> Result<(), BuildError> {
    let ok =
        !tag.is_empty() && tag.len() <= 64 && tag.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(BuildError::BadRequest(format!("invalid tag {tag:?}: use 1-64 characters of a-z A-Z 0-9 . _ -")))
    }
}

impl Builds {
    pub fn new(provider: Arc<SandboxTable>) -> Result<Arc<Builds>, BuildError> {
        let store = provider
            .template_store()
            .ok_or_else(|| BuildError::Conflict("the template store could not be opened".into()))?;
        let files = files::Uploads::new(store.clone())?;
        Ok(Arc::new(Builds {
            provider,
            table: Mutex::new(HashMap::new()),
            queue: Arc::new(tokio::sync::Semaphore::new(CONCURRENT_BUILDS)),
            files,
        }))
    }

    fn store(&self) -> Result<&store::Store, BuildError> {
        self.provider
            .template_store()
            .ok_or_else(|| BuildError::Conflict("the template store could not be opened; builds are off".into()))
    }

    /// `POST /v3/templates`: a new build of template `name` (`name:tag` adds the tag). The
    /// template keeps its id across builds; the template is registered only when the build is
    /// ready.
    pub fn request(
        &self,
        raw_name: &str,
        tags: Vec<String>,
        cpu_count: Option<u32>,
        memory_mb: Option<u64>,
    ) -> Result<Arc<Build>, BuildError> {
        let (name, tag) = split_name(raw_name.trim())?;
        let mut all_tags = Vec::new();
        for t in tag.into_iter().chain(tags) {
            validate_tag(&t)?;
            if !all_tags.contains(&t) {
                all_tags.push(t);
            }
        }
        if all_tags.is_empty() {
            all_tags.push("default".to_owned());
        }
        let store = self.store()?;
        store.check_name(&name).map_err(|e| BuildError::BadRequest(e.to_string()))?;
        let existing = store.layout.read_record(&name)?.map(|r| r.template_id);
        let mut table = crate::sync::lock(&self.table);
        let pending = table.values().find(|b| b.name == name).map(|b| b.template_id.clone());
        let template_id = existing.or(pending).unwrap_or_else(store::new_template_id);
        let build = Arc::new(Build {
            template_id,
            build_id: store::new_build_id(),
            name,
            tags: all_tags,
            cpu_count,
            memory_mb,
            state: Mutex::new(BuildState {
                status: Status::Waiting,
                started: false,
                logs: std::collections::VecDeque::new(),
                log_bytes: 0,
                dropped: 0,
                failure: None,
                finished: None,
            }),
        });
        prune(&mut table);
        table.insert(build.build_id.clone(), build.clone());
        Ok(build)
    }

    /// A build by template id (or name) and build id.
    pub fn get(&self, template: &str, build_id: &str) -> Option<Arc<Build>> {
        let table = crate::sync::lock(&self.table);
        table.get(build_id).filter(|b| b.template_id == template || b.name == template).cloned()
    }

    /// Whether a build (not yet finished or finished) uses `template_id` (so uploads for it are
    /// accepted before its template exists).
    pub fn knows_template(&self, template_id: &str) -> bool {
        crate::sync::lock(&self.table).values().any(|b| b.template_id == template_id)
    }

    /// Starts a requested build with its steps; it runs in the background (see `status`).
    pub fn start(self: &Arc<Self>, build: Arc<Build>, spec: steps::BuildSpec) -> Result<(), BuildError> {
        let plan = steps::plan(&spec)?;
        {
            let mut state = crate::sync::lock(&build.state);
            if state.started {
                return Err(BuildError::Conflict(format!("build {} was already started", build.build_id)));
            }
            state.started = true;
        }
        let builds = self.clone();
        tokio::spawn(async move {
            let Ok(_turn) = builds.queue.clone().acquire_owned().await else { return };
            build.set_status(Status::Building);
            run::run(&builds, &build, plan).await;
        });
        Ok(())
    }
}

/// Drops the oldest finished builds past [`KEPT_FINISHED`].
fn prune(table: &mut HashMap<String, Arc<Build>>) {
    let mut finished: Vec<(DateTime<Utc>, String)> =
        table.iter().filter_map(|(id, b)| crate::sync::lock(&b.state).finished.map(|at| (at, id.clone()))).collect();
    if finished.len() < KEPT_FINISHED {
        return;
    }
    finished.sort();
    for (_, id) in finished.iter().take(finished.len() + 1 - KEPT_FINISHED) {
        table.remove(id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn build() -> Build {
        Build {
            template_id: "t".into(),
            build_id: "b".into(),
            name: "n".into(),
            tags: Vec::new(),
            cpu_count: None,
            memory_mb: None,
            state: Mutex::new(BuildState {
                status: Status::Building,
                started: true,
                logs: std::collections::VecDeque::new(),
                log_bytes: 0,
                dropped: 0,
                failure: None,
                finished: None,
            }),
        }
    }

    #[test]
    fn a_step_flooding_its_log_holds_bounded_memory() {
        let build = build();
        // Long lines (a step printing 64 KiB without a newline), many of them.
        let long = "é".repeat(40_000);
        for i in 0..2_000 {
            build.log("info", Some("1"), format!("{i} {long}"));
        }
        let kept = |b: &Build| {
            let state = crate::sync::lock(&b.state);
            (state.logs.len(), state.logs.iter().map(|l| l.message.len()).sum::<usize>(), state.log_bytes)
        };
        let (lines, bytes, counted) = kept(&build);
        assert_eq!(bytes, counted);
        assert!(bytes <= MAX_LOG_BYTES && lines > 1, "{lines} lines, {bytes} bytes");
        let last = build.tail(1).pop().unwrap();
        assert!(last.message.starts_with("1999 ") && last.message.ends_with(" [cut]"));
        assert!(last.message.len() <= MAX_LINE_BYTES + 6);
        // Offsets stay those of the whole log: the first kept line is line 2000 - lines.
        let page = build.page(0, 1, None);
        assert!(page.logs[0].message.starts_with(&format!("{} ", 2_000 - lines)));
        assert!(build.page(2_000, 10, None).logs.is_empty());
        // Many short lines: bounded by count.
        for i in 0..(MAX_LOG_LINES + 10) {
            build.log("info", Some("1"), i.to_string());
        }
        assert_eq!(kept(&build).0, MAX_LOG_LINES);
        // Finished: only the last lines stay.
        build.succeed();
        let (lines, bytes, _) = kept(&build);
        assert!(bytes <= KEPT_LOG_BYTES && lines > 0);
        assert_eq!(build.tail(1)[0].message, (MAX_LOG_LINES + 9).to_string());
    }
}
