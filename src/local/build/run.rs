//! How one build runs: its base (an image pulled into the store, or a stored template), then
//! each step, from the cache when its key is known, else in a step sandbox of the layers so
//! far (a sandbox like any other: user namespace, network namespace with the default egress
//! policy, seccomp, limits) whose writes become the step's layer; then the template is
//! registered. A failing step fails the build with the step, its exit code and the last lines
//! of its output, and registers nothing.

use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use super::steps::{Base, Context, Plan, Step, cache_key};
use super::{Build, Builds, Failure, REASON_TAIL_LINES};
use crate::e2b::CallOptions;
use crate::e2b::wire::{self, ProcessEvent};
use crate::local::control::sandbox_table::CreateParams;
use crate::local::control::template_start::run_user;
use crate::local::store::harvest;
use crate::local::store::registry::{self, PullOptions};
use crate::local::store::{Digest, NewTemplate, RunConfig, Store, env_map, write_atomic};
use crate::local::template::TemplateRoot;

/// Longest a step may run.
const STEP_TIMEOUT: Duration = Duration::from_secs(3600);
/// The user and directory a build's steps start with (E2B's).
const DEFAULT_USER: &str = "user";
const DEFAULT_WORKDIR: &str = "/home/user";
/// Lines of a failed step's output quoted in the build's error message.
const MESSAGE_TAIL_LINES: usize = 5;
/// The folder of step cache entries under the store.
const CACHE: &str = "cache";

/// Why a build stopped.
struct Stop {
    step: Option<String>,
    message: String,
}

fn stop(step: &str, message: impl Into<String>) -> Stop {
    Stop { step: Some(step.to_owned()), message: message.into() }
}

/// A cached step: its layer (none for ENV, USER) and the context after it.
#[derive(Debug, Serialize, Deserialize)]
struct CacheEntry {
    layer: Option<String>,
    #[serde(flatten)]
    context: Context,
}

/// What a step runs in its sandbox: `script` (`sh -c`, with `args` as `$1…`) as `user`, with
/// `tar` put into the sandbox's private /tmp first (its path as `$0`).
struct Job<'a> {
    user: String,
    script: &'a str,
    args: Vec<String>,
    tar: Option<PathBuf>,
}

/// The build a step belongs to, and the step's number (E2B's name for it).
struct StepOf<'a> {
    builds: &'a Builds,
    build: &'a Build,
    store: &'a Store,
    n: &'a str,
}

/// `WORKDIR`: the directory, made (owned by the build's user) when missing.
const WORKDIR_SCRIPT: &str = "[ -d \"$1\" ] || { mkdir -p -- \"$1\" && chown -- \"$2\" \"$1\"; }";
/// `RUN`: the command, by bash when the image has it (as E2B runs it), else by sh.
const RUN_SCRIPT: &str = "if command -v bash >/dev/null 2>&1; then exec bash -c \"$1\"; else exec sh -c \"$1\"; fi";

pub(super) async fn run(builds: &Builds, build: &Build, plan: Plan) {
    let started = std::time::Instant::now();
    match execute(builds, build, plan).await {
        Ok(()) => {
            build.log(
                "info",
                Some("finalize"),
                format!(
                    "Template {} is ready (template id {}, build {}) in {:.1} s",
                    build.name,
                    build.template_id,
                    build.build_id,
                    started.elapsed().as_secs_f64()
                ),
            );
            build.succeed();
        }
        Err(Stop { step, message }) => {
            build.log("error", step.as_deref(), message.clone());
            let log_entries = build.tail(REASON_TAIL_LINES);
            tracing::info!(build = %build.build_id, template = %build.name, "template build failed");
            build.fail(Failure { message, step, log_entries });
        }
    }
}

fn chain(previous: &str, key: &str, layer: Option<&Digest>) -> String {
    let mut hash = Sha256::new();
    hash.update(previous.as_bytes());
    hash.update(b"\n");
    hash.update(key.as_bytes());
    hash.update(b"\n");
    hash.update(layer.map(Digest::as_str).unwrap_or("-").as_bytes());
    hex::encode(hash.finalize())
}

async fn execute(builds: &Builds, build: &Build, plan: Plan) -> Result<(), Stop> {
    let store = builds.store().map_err(|e| stop("base", e.to_string()))?.clone();
    let (mut layers, base_config, mut previous) = base(&store, build, &plan.base).await?;
    let mut context =
        Context { user: DEFAULT_USER.to_owned(), workdir: DEFAULT_WORKDIR.to_owned(), env: base_config.env.clone() };
    let total = plan.steps.len();
    let mut forced = plan.force;
    for (i, (step, force)) in plan.steps.iter().enumerate() {
        let n = (i + 1).to_string();
        forced |= *force;
        let key = cache_key(&previous, step, &context);
        let label = format!("[{}/{total}] {}", i + 1, step.describe());
        if !forced && let Some(entry) = cached(&store, &key) {
            let layer = match &entry.layer {
                Some(d) => Some(Digest::parse(d).map_err(|e| stop(&n, e.to_string()))?),
                None => None,
            };
            build.log("info", Some(&n), format!("CACHED {label}"));
            context = entry.context;
            previous = chain(&previous, &key, layer.as_ref());
            layers.extend(layer);
            continue;
        }
        build.log("info", Some(&n), label);
        let (job, workdir) = match step {
            Step::Env(pairs) => {
                for (k, v) in pairs {
                    context.set_env(k, v);
                }
                (None, None)
            }
            Step::User(user) => {
                context.user = user.clone();
                (None, None)
            }
            Step::Workdir(dir) => {
                // Made from the current directory; the next steps run in it.
                let dir = context.resolve(dir);
                let args = vec![dir.clone(), context.user.clone()];
                (Some(Job { user: "root".into(), script: WORKDIR_SCRIPT, args, tar: None }), Some(dir))
            }
            Step::Run { command, user } => {
                let user = run_user(user.as_deref().unwrap_or(&context.user));
                (Some(Job { user, script: RUN_SCRIPT, args: vec![command.clone()], tar: None }), None)
            }
            Step::Copy { src, dest, owner, mode, files_hash } => {
                let tar = builds.files.path(&build.template_id, files_hash).map_err(|e| stop(&n, e.to_string()))?;
                if !tar.is_file() {
                    return Err(stop(
                        &n,
                        format!(
                            "the files of step {n} (COPY {src} {dest}) were never uploaded (files hash {files_hash}): \
                             the SDK uploads them before it starts the build"
                        ),
                    ));
                }
                let owner = owner.clone().unwrap_or_else(|| context.user.clone());
                let args = vec![src.clone(), dest.clone(), owner, mode.clone().unwrap_or_default()];
                (Some(Job { user: "root".into(), script: COPY_SCRIPT, args, tar: Some(tar) }), None)
            }
        };
        let layer = match job {
            Some(job) => {
                let of = StepOf { builds, build, store: &store, n: &n };
                Some(step_in_sandbox(&of, &layers, &context, job).await?)
            }
            None => None,
        };
        if let Some(dir) = workdir {
            context.workdir = dir;
        }
        let entry = CacheEntry { layer: layer.as_ref().map(|d| d.to_string()), context: context.clone() };
        remember(&store, &key, &entry);
        previous = chain(&previous, &key, layer.as_ref());
        layers.extend(layer);
    }
    let config = RunConfig {
        env: context.env,
        workdir: context.workdir,
        user: context.user,
        start_cmd: plan.start_cmd,
        ready_cmd: plan.ready_cmd,
        ..base_config
    };
    let (store2, name, template_id, build_id, tags) =
        (store.clone(), build.name.clone(), build.template_id.clone(), build.build_id.clone(), build.tags.clone());
    let (cpu_count, memory_mb) = (build.cpu_count, build.memory_mb);
    tokio::task::spawn_blocking(move || {
        let _lock = store2.lock()?;
        store2.commit(NewTemplate {
            name: &name,
            layers,
            config,
            source: format!("build:{build_id}"),
            template_id: Some(template_id),
            build_id: Some(build_id.clone()),
            tags: Some(tags),
            cpu_count,
            memory_mb,
            snapshot: None,
        })
    })
    .await
    .map_err(|e| stop("finalize", format!("registering the template failed: {e}")))?
    .map_err(|e| stop("finalize", format!("registering the template failed: {e}")))?;
    Ok(())
}

/// The base's layers and config, and the cache key every step chains from.
async fn base(store: &Store, build: &Build, base: &Base) -> Result<(Vec<Digest>, RunConfig, String), Stop> {
    match base {
        Base::Image { reference, credentials } => {
            build.log("info", Some("base"), format!("FROM {reference}"));
            let options = PullOptions { insecure_registries: Vec::new(), credentials: credentials.clone() };
            let image = registry::fetch(store, reference, &options)
                .await
                .map_err(|e| stop("base", format!("cannot pull {reference}: {e}")))?;
            let key = format!("image:{}", image.config_digest);
            Ok((image.layers, image.config, key))
        }
        Base::Template(raw) => {
            build.log("info", Some("base"), format!("FROM TEMPLATE {raw}"));
            let record = store.lookup(raw).map_err(|e| stop("base", e.to_string()))?.ok_or_else(|| {
                stop(
                    "base",
                    format!(
                        "no stored template {raw:?} to build on (a build starts from an image or a template of \
                             the store: built, pulled or imported; `base` and `local.templates` directories cannot \
                             be built on)"
                    ),
                )
            })?;
            let layers: Vec<Digest> = record
                .layers
                .iter()
                .map(|d| Digest::parse(d))
                .collect::<Result<_, _>>()
                .map_err(|e| stop("base", e.to_string()))?;
            let key = format!("layers:{}", record.layers.join(","));
            Ok((layers, record.config, key))
        }
    }
}

fn cache_path(store: &Store, key: &str) -> PathBuf {
    store.layout.dir.join(CACHE).join(format!("{key}.json"))
}

/// The cache entry of `key`, when its layer is still stored.
fn cached(store: &Store, key: &str) -> Option<CacheEntry> {
    let entry: CacheEntry = serde_json::from_slice(&std::fs::read(cache_path(store, key)).ok()?).ok()?;
    match &entry.layer {
        Some(digest) => store.layout.layer_meta(&Digest::parse(digest).ok()?).map(|_| entry),
        None => Some(entry),
    }
}

fn remember(store: &Store, key: &str, entry: &CacheEntry) {
    let dir = store.layout.dir.join(CACHE);
    let written = std::fs::create_dir_all(&dir)
        .map_err(|e| e.to_string())
        .and_then(|()| serde_json::to_vec(entry).map_err(|e| e.to_string()))
        .and_then(|json| write_atomic(&store.layout.tmp(), &cache_path(store, key), &json).map_err(|e| e.to_string()));
    if let Err(err) = written {
        tracing::warn!(%err, "cannot write a build cache entry; the step will run again next time");
    }
}

/// Copies the files of a `COPY` step into place, run as root in the step sandbox:
/// `$0` the uploaded tar (in the sandbox's private /tmp), `$1` the source (a path or a glob in
/// the uploaded files), `$2` the destination (relative to the working directory), `$3` the
/// owner (`user[:group]`, the user's own group when none), `$4` the mode. A directory's contents are merged into the destination; a file goes
/// into the destination when it ends with `/`, is a directory or several files match, else it
/// becomes the destination.
const COPY_SCRIPT: &str = r#"set -eu
tar_file=$0; src=${1#./}; dest=$2; owner=$3; mode=$4
case $owner in *:*) ;; *) group=$(id -g "$owner") && owner=$owner:$group ;; esac
work=$(mktemp -d /tmp/.sandbox-mcp-copy.XXXXXX)
tar -xf "$tar_file" -C "$work"
rm -f "$tar_file"
case $dest in /*) ;; *) dest=$PWD/$dest ;; esac
cd "$work"
case $src in *'*'*|*'?'*|*'['*) set -- $src ;; *) set -- "$src" ;; esac
many=0; [ $# -gt 1 ] && many=1
for entry in "$@"; do
  if [ ! -e "$entry" ] && [ ! -L "$entry" ]; then echo "COPY: $entry is not among the uploaded files" >&2; exit 1; fi
  chown -hR "$owner" "$entry"
  if [ -n "$mode" ] && [ ! -L "$entry" ]; then chmod -R "$mode" "$entry"; fi
  if [ -d "$entry" ] && [ ! -L "$entry" ]; then
    mkdir -p "$dest"; cp -a "$entry/." "$dest/"
  elif [ $many = 1 ] || [ -d "$dest" ] || [ "${dest%/}" != "$dest" ]; then
    mkdir -p "$dest"; cp -a "$entry" "$dest/"
  else
    mkdir -p "$(dirname "$dest")"; cp -a "$entry" "$dest"
  fi
done
cd /; rm -rf "$work"
"#;

/// Runs `job` in a fresh sandbox of `layers` (in `context`'s directory and environment),
/// streams its output to the build's log, and turns what it wrote into a layer.
async fn step_in_sandbox(of: &StepOf<'_>, layers: &[Digest], context: &Context, job: Job<'_>) -> Result<Digest, Stop> {
    let (provider, n) = (&of.builds.provider, of.n);
    let lowers = of.store.layer_stack(layers).map_err(|d| stop(n, format!("the layer {d} is no longer stored")))?;
    let root = TemplateRoot::stacked(lowers).ok_or_else(|| stop(n, "a build step needs at least one layer"))?;
    let params = CreateParams {
        template: format!("build:{}", of.build.name),
        timeout_secs: Some(provider.cfg.max_timeout_secs.min(STEP_TIMEOUT.as_secs())),
        allow_internet_access: true,
        root: Some(root),
        build_step_of: Some(of.build.build_id.clone()),
        ..CreateParams::default()
    };
    let rec = provider.create(params).await.map_err(|e| stop(n, format!("cannot start the step's sandbox: {e}")))?;
    let outcome = run_and_harvest(of, context, job, &rec.id).await;
    if let Err(err) = provider.kill(&rec.id).await {
        tracing::warn!(sandbox = %rec.id, err = %crate::logging::escaped(&err), "cannot kill a build step's sandbox");
    }
    outcome
}

async fn run_and_harvest(of: &StepOf<'_>, context: &Context, job: Job<'_>, id: &str) -> Result<Digest, Stop> {
    let (build, store, n, provider) = (of.build, of.store, of.n, &of.builds.provider);
    let entry = provider.get(id).ok_or_else(|| stop(n, "the step's sandbox is gone"))?;
    let disk = entry.take_kept_disk();
    if disk.is_none() && provider.disk_limit_bytes().is_some() {
        return Err(stop(
            n,
            "template builds need the kernel's detached mounts for sandbox disks (or local.disk_limit_mb = 0)",
        ));
    }
    // The sandbox's own files (overlay upper, private /tmp): on its disk, else in its directory.
    let data = match &disk {
        Some(fd) => PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd())),
        None => entry.dir.clone(),
    };
    let mut argv = vec!["-c".to_owned(), job.script.to_owned()];
    match &job.tar {
        Some(tar) => {
            let name = place_in_tmp(&data, tar, provider.cfg.id_map.host(0)).map_err(|e| stop(n, e.to_string()))?;
            argv.push(format!("/tmp/{name}"));
        }
        None => argv.push("sh".to_owned()),
    }
    argv.extend(job.args);
    let client = provider.agent_client(id, Duration::from_secs(30)).map_err(|e| stop(n, e.to_string()))?;
    let request = wire::StartRequest {
        process: wire::ProcessConfig {
            cmd: "/bin/sh".into(),
            args: argv,
            envs: env_map(&context.env),
            cwd: Some(context.workdir.clone()),
        },
        stdin: Some(false),
        ..Default::default()
    };
    let opts = CallOptions::user(job.user).with_timeout(STEP_TIMEOUT);
    let mut stream =
        client.start(&request, &opts).await.map_err(|e| stop(n, format!("step {n} did not start: {e}")))?;
    let (mut out, mut err) = (LineBuffer::default(), LineBuffer::default());
    let mut tail: std::collections::VecDeque<String> = std::collections::VecDeque::new();
    let mut keep = |line: String| {
        let line = super::clip_line(line);
        if tail.len() == MESSAGE_TAIL_LINES {
            tail.pop_front();
        }
        tail.push_back(line.clone());
        build.log("info", Some(n), line);
    };
    let exit = loop {
        match stream.next_event().await {
            Ok(Some(ProcessEvent::Data(data))) => {
                for line in out.push(data.stdout.as_deref().unwrap_or_default()) {
                    keep(line);
                }
                for line in err.push(data.stderr.as_deref().unwrap_or_default()) {
                    keep(line);
                }
            }
            Ok(Some(ProcessEvent::End(end))) => break end,
            Ok(Some(_)) => {}
            Ok(None) => return Err(stop(n, format!("step {n}: the process stream ended without an exit status"))),
            Err(e) => return Err(stop(n, format!("step {n} failed: {e}"))),
        }
    };
    for line in out.finish().into_iter().chain(err.finish()) {
        keep(line);
    }
    if !exit.exited || exit.exit_code != 0 {
        let how = if exit.exited { format!("exit code {}", exit.exit_code) } else { exit.status.clone() };
        let output = if tail.is_empty() {
            " and printed nothing".to_owned()
        } else {
            format!("; its last output:\n{}", Vec::from(tail).join("\n"))
        };
        return Err(stop(n, format!("step {n} failed with {how}{output}")));
    }
    // Nothing may change the upper layer while it is read: every process of the sandbox freezes.
    provider.pause(id).await.map_err(|e| stop(n, format!("cannot freeze the step's sandbox: {e}")))?;
    let frozen = provider.get(id).map(|e| e.snapshot().pause_method).unwrap_or_default();
    if frozen.as_deref() != Some("freezer") {
        return Err(stop(n, "template builds need the cgroup freezer (to read a step's files while nothing runs)"));
    }
    let (store2, upper, id_base) = (store.clone(), data.join("upper"), provider.cfg.id_map.host(0));
    let layer = tokio::task::spawn_blocking(move || {
        let _lock = store2.lock()?;
        let layer = harvest::upper_to_layer(&store2, &upper, id_base);
        drop(disk);
        layer
    })
    .await
    .map_err(|e| stop(n, format!("committing the step failed: {e}")))?
    .map_err(|e| stop(n, format!("committing the step failed: {e}")))?;
    Ok(layer)
}

/// Why a step's files did not get into its sandbox's /tmp.
#[derive(Debug, thiserror::Error)]
enum PlaceError {
    #[error("cannot put the step's files into its sandbox: {0}")]
    Write(std::io::Error),
    #[error("cannot read the uploaded files: {0}")]
    Read(std::io::Error),
}

/// Copies `tar` into the step sandbox's private /tmp (before anything of the step runs there),
/// never through a name the sandbox made: a fresh name, `O_EXCL | O_NOFOLLOW`.
fn place_in_tmp(data: &Path, tar: &Path, sandbox_root: u32) -> Result<String, PlaceError> {
    let name = format!(".sandbox-mcp-files-{}.tar", hex::encode(rand::random::<[u8; 8]>()));
    let dest = data.join("tmp.d").join(&name);
    let mut out = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&dest)
        .map_err(PlaceError::Write)?;
    let mut input = std::fs::File::open(tar).map_err(PlaceError::Read)?;
    std::io::copy(&mut input, &mut out).map_err(PlaceError::Write)?;
    // The sandbox's root owns it (and so may remove it from the sticky /tmp).
    std::os::unix::fs::fchown(&out, Some(sandbox_root), Some(sandbox_root)).map_err(PlaceError::Write)?;
    Ok(name)
}

/// Splits a byte stream into lines (the last, unfinished one kept until more comes).
#[derive(Default)]
struct LineBuffer {
    pending: Vec<u8>,
}

impl LineBuffer {
    fn push(&mut self, bytes: &[u8]) -> Vec<String> {
        self.pending.extend_from_slice(bytes);
        let mut lines = Vec::new();
        while let Some(at) = self.pending.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = self.pending.drain(..=at).collect();
            lines.push(String::from_utf8_lossy(&line[..line.len() - 1]).trim_end_matches('\r').to_owned());
        }
        // A line with no end in sight is cut, so one endless line cannot hold memory.
        if self.pending.len() > 64 * 1024 {
            lines.push(String::from_utf8_lossy(&std::mem::take(&mut self.pending)).into_owned());
        }
        lines
    }

    fn finish(&mut self) -> Option<String> {
        (!self.pending.is_empty()).then(|| String::from_utf8_lossy(&std::mem::take(&mut self.pending)).into_owned())
    }
}
