//! A build's definition as the SDKs send it (E2B's `TemplateBuildStartV2`: a base image or
//! template, registry credentials, steps, start and ready commands), checked into a plan of
//! typed steps, and the cache key of each step: a hash of the previous key, the step and the
//! state it runs in (user, working directory, environment), so that an unchanged step is
//! found again and a changed one invalidates everything after it.

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use super::BuildError;
use crate::local::store::registry::Credentials;

/// Most steps in one build.
pub const MAX_STEPS: usize = 500;

/// `fromImageRegistry` (only `type: registry`, a user and password, is served here).
#[derive(Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RegistryAuth {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub username: String,
    #[serde(default)]
    pub password: String,
}

impl std::fmt::Debug for RegistryAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RegistryAuth({}, {}, <hidden>)", self.kind, self.username)
    }
}

/// One step as sent (`TemplateStep`).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StepSpec {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub files_hash: Option<String>,
    #[serde(default)]
    pub force: Option<bool>,
}

/// The body of `POST /v2/templates/{templateID}/builds/{buildID}`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BuildSpec {
    #[serde(default)]
    pub from_image: Option<String>,
    #[serde(default)]
    pub from_template: Option<String>,
    #[serde(default)]
    pub from_image_registry: Option<RegistryAuth>,
    #[serde(default)]
    pub force: Option<bool>,
    #[serde(default)]
    pub steps: Vec<StepSpec>,
    #[serde(default)]
    pub start_cmd: Option<String>,
    #[serde(default)]
    pub ready_cmd: Option<String>,
}

/// Where a build starts.
#[derive(Debug, Clone)]
pub enum Base {
    /// `credentials` print as `<hidden>` (`Debug`), so a plan in a log shows no password.
    Image {
        reference: String,
        credentials: Option<Credentials>,
    },
    Template(String),
}

/// One checked step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// A shell command, as `user` when given (else the build's current user).
    Run {
        command: String,
        user: Option<String>,
    },
    /// The uploaded files of `files_hash` (their paths relative to the SDK's context) matching
    /// `src`, to `dest`, owned by `owner` (else the current user), with `mode` when given.
    Copy {
        src: String,
        dest: String,
        owner: Option<String>,
        mode: Option<String>,
        files_hash: String,
    },
    /// Environment of the following steps (`KEY`, `VALUE` pairs).
    Env(Vec<(String, String)>),
    Workdir(String),
    User(String),
}

impl Step {
    /// How the log names the step (E2B's style: `RUN cmd`).
    pub fn describe(&self) -> String {
        match self {
            Step::Run { command, .. } => format!("RUN {command}"),
            Step::Copy { src, dest, .. } => format!("COPY {src} {dest}"),
            Step::Env(pairs) => {
                let parts: Vec<String> = pairs.iter().map(|(k, v)| format!("{k}={v}")).collect();
                format!("ENV {}", parts.join(" "))
            }
            Step::Workdir(dir) => format!("WORKDIR {dir}"),
            Step::User(user) => format!("USER {user}"),
        }
    }
}

/// A checked build.
#[derive(Debug, Clone)]
pub struct Plan {
    pub base: Base,
    /// Rebuild everything, cached or not.
    pub force: bool,
    /// Steps with their own `force` flag.
    pub steps: Vec<(Step, bool)>,
    pub start_cmd: Option<String>,
    pub ready_cmd: Option<String>,
}

fn bad(detail: impl Into<String>) -> BuildError {
    BuildError::BadRequest(detail.into())
}

fn nonempty(arg: Option<&String>) -> Option<String> {
    arg.filter(|a| !a.trim().is_empty()).cloned()
}

/// Checks a build definition.
pub fn plan(spec: &BuildSpec) -> Result<Plan, BuildError> {
    let base = match (&spec.from_image, &spec.from_template) {
        (Some(image), None) if !image.trim().is_empty() => {
            let credentials = match &spec.from_image_registry {
                None => None,
                Some(auth) if auth.kind == "registry" => {
                    if auth.username.is_empty() || auth.password.is_empty() {
                        return Err(bad("fromImageRegistry needs both username and password"));
                    }
                    Some(Credentials { username: auth.username.clone(), password: auth.password.clone() })
                }
                Some(auth) => {
                    return Err(bad(format!(
                        "fromImageRegistry type {:?} is not served by the local provider (only \"registry\", a \
                         username and password)",
                        auth.kind
                    )));
                }
            };
            Base::Image { reference: image.trim().to_owned(), credentials }
        }
        (None, Some(template)) if !template.trim().is_empty() => Base::Template(template.trim().to_owned()),
        (Some(_), Some(_)) => return Err(bad("give fromImage or fromTemplate, not both")),
        _ => return Err(bad("a build needs fromImage or fromTemplate")),
    };
    if spec.steps.len() > MAX_STEPS {
        return Err(bad(format!("a build has at most {MAX_STEPS} steps")));
    }
    let mut steps = Vec::with_capacity(spec.steps.len());
    for (i, raw) in spec.steps.iter().enumerate() {
        let n = i + 1;
        let args = &raw.args;
        let step = match raw.kind.to_ascii_uppercase().as_str() {
            "RUN" => {
                let command = nonempty(args.first()).ok_or_else(|| bad(format!("step {n}: RUN needs a command")))?;
                Step::Run { command, user: nonempty(args.get(1)) }
            }
            "COPY" | "ADD" => {
                let (src, dest) = match (nonempty(args.first()), nonempty(args.get(1))) {
                    (Some(src), Some(dest)) => (src, dest),
                    _ => return Err(bad(format!("step {n}: COPY needs a source and a destination"))),
                };
                let files_hash = raw
                    .files_hash
                    .clone()
                    .filter(|h| super::files::valid_hash(h))
                    .ok_or_else(|| bad(format!("step {n}: COPY needs filesHash (64 hex digits)")))?;
                let mode = nonempty(args.get(3));
                if let Some(mode) = &mode
                    && (mode.len() > 5 || !mode.bytes().all(|b| (b'0'..=b'7').contains(&b)))
                {
                    return Err(bad(format!("step {n}: COPY mode {mode:?} is not an octal mode")));
                }
                Step::Copy { src, dest, owner: nonempty(args.get(2)), mode, files_hash }
            }
            "ENV" | "ARG" => {
                if args.len() % 2 != 0 || args.is_empty() {
                    return Err(bad(format!("step {n}: ENV needs KEY VALUE pairs")));
                }
                let pairs: Vec<(String, String)> = args.chunks(2).map(|p| (p[0].clone(), p[1].clone())).collect();
                if let Some((key, _)) = pairs.iter().find(|(k, _)| !valid_env_key(k)) {
                    return Err(bad(format!("step {n}: {key:?} is not an environment variable name")));
                }
                Step::Env(pairs)
            }
            "WORKDIR" => {
                Step::Workdir(nonempty(args.first()).ok_or_else(|| bad(format!("step {n}: WORKDIR needs a path")))?)
            }
            "USER" => {
                let user = nonempty(args.first()).ok_or_else(|| bad(format!("step {n}: USER needs a name")))?;
                if user.contains(['\0', '\n', '/']) {
                    return Err(bad(format!("step {n}: {user:?} is not a user name")));
                }
                Step::User(user)
            }
            other => return Err(bad(format!("step {n}: unknown step type {other:?} (RUN, COPY, ENV, WORKDIR, USER)"))),
        };
        steps.push((step, raw.force.unwrap_or(false)));
    }
    Ok(Plan {
        base,
        force: spec.force.unwrap_or(false),
        steps,
        start_cmd: spec.start_cmd.clone().filter(|c| !c.trim().is_empty()),
        ready_cmd: spec.ready_cmd.clone().filter(|c| !c.trim().is_empty()),
    })
}

fn valid_env_key(key: &str) -> bool {
    !key.is_empty()
        && !key.starts_with(|c: char| c.is_ascii_digit())
        && key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// What a step runs in (kept with each cached step as what it leaves to the next).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Context {
    pub user: String,
    pub workdir: String,
    /// `KEY=VALUE`, in order (the image's, then the build's ENV steps).
    pub env: Vec<String>,
}

impl Context {
    /// Sets `key` (replacing an earlier value).
    pub fn set_env(&mut self, key: &str, value: &str) {
        let prefix = format!("{key}=");
        self.env.retain(|e| !e.starts_with(&prefix));
        self.env.push(format!("{key}={value}"));
    }

    /// `dir` made absolute against the current working directory.
    pub fn resolve(&self, dir: &str) -> String {
        if dir.starts_with('/') { dir.to_owned() } else { format!("{}/{dir}", self.workdir.trim_end_matches('/')) }
    }
}

/// The cache key of `step` after `previous`, run in `context`.
pub fn cache_key(previous: &str, step: &Step, context: &Context) -> String {
    let mut hash = Sha256::new();
    let mut field = |bytes: &[u8]| {
        hash.update((bytes.len() as u64).to_le_bytes());
        hash.update(bytes);
    };
    field(b"sandbox-mcp-build-step-v2");
    field(previous.as_bytes());
    field(format!("{step:?}").as_bytes());
    field(context.user.as_bytes());
    field(context.workdir.as_bytes());
    for entry in &context.env {
        field(entry.as_bytes());
    }
    hex::encode(hash.finalize())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plan_never_prints_its_registry_password() {
        let spec: BuildSpec = serde_json::from_value(serde_json::json!({
            "fromImage": "registry.example/app:1",
            "fromImageRegistry": {"type": "registry", "username": "bob", "password": "hunter2-secret"},
            "steps": [{"type": "RUN", "args": ["true"]}],
        }))
        .unwrap();
        let plan = plan(&spec).unwrap();
        for shown in [format!("{plan:?}"), format!("{spec:?}")] {
            assert!(!shown.contains("hunter2-secret") && shown.contains("bob"), "{shown}");
        }
        let Base::Image { credentials: Some(c), .. } = &plan.base else { panic!("{plan:?}") };
        assert_eq!(c.password, "hunter2-secret", "kept for the pull");
    }

    fn spec(steps: serde_json::Value) -> BuildSpec {
        serde_json::from_value(serde_json::json!({"fromImage": "debian:bookworm", "steps": steps})).unwrap()
    }

    #[test]
    fn steps_parse_as_the_sdk_sends_them() {
        let plan = plan(&spec(serde_json::json!([
            {"type": "RUN", "args": ["apt-get update", "root"], "force": false},
            {"type": "COPY", "args": ["app", "/app/", "", "0755"], "filesHash": "a".repeat(64), "force": false},
            {"type": "ENV", "args": ["A", "1", "B", "two"], "force": true},
            {"type": "WORKDIR", "args": ["/app"]},
            {"type": "USER", "args": ["user"]},
        ])))
        .unwrap();
        assert_eq!(plan.steps.len(), 5);
        assert_eq!(plan.steps[0].0, Step::Run { command: "apt-get update".into(), user: Some("root".into()) });
        assert!(matches!(&plan.steps[1].0, Step::Copy { owner: None, mode: Some(m), .. } if m == "0755"));
        assert_eq!(plan.steps[2], (Step::Env(vec![("A".into(), "1".into()), ("B".into(), "two".into())]), true));
    }

    #[test]
    fn bad_definitions_are_refused_with_the_step() {
        for (steps, wanted) in [
            (serde_json::json!([{"type": "RUN", "args": []}]), "step 1: RUN needs a command"),
            (serde_json::json!([{"type": "COPY", "args": ["a", "/b"]}]), "filesHash"),
            (serde_json::json!([{"type": "ENV", "args": ["1X", "v"]}]), "not an environment variable"),
            (serde_json::json!([{"type": "FROB", "args": []}]), "unknown step type"),
        ] {
            let err = plan(&spec(steps)).unwrap_err().to_string();
            assert!(err.contains(wanted), "{err}");
        }
        let none: BuildSpec = serde_json::from_value(serde_json::json!({"steps": []})).unwrap();
        assert!(plan(&none).unwrap_err().to_string().contains("fromImage or fromTemplate"));
    }

    #[test]
    fn cache_keys_change_with_the_step_and_its_context() {
        let ctx = Context { user: "user".into(), workdir: "/home/user".into(), env: vec!["A=1".into()] };
        let run = Step::Run { command: "true".into(), user: None };
        let key = cache_key("base", &run, &ctx);
        assert_eq!(key, cache_key("base", &run, &ctx));
        assert_ne!(key, cache_key("other", &run, &ctx));
        assert_ne!(key, cache_key("base", &Step::Run { command: "false".into(), user: None }, &ctx));
        let mut env = ctx.clone();
        env.set_env("A", "2");
        assert_ne!(key, cache_key("base", &run, &env));
        assert_eq!(env.env, vec!["A=2".to_owned()]);
        assert_eq!(ctx.resolve("app"), "/home/user/app");
    }
}
