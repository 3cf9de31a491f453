//! Template builds attacked from inside and outside, end to end on a real provider with a real
//! Debian image: a RUN step that leaves a daemon swapping a directory for a symlink to the
//! host's `/`, fifos, hard links, set-uid files and a gzip-looking file (the built template
//! holds what the step wrote and nothing of the host; no step process survives); a provider
//! restart in the middle of a step (the step sandbox is killed at start-up, no half layer); and
//! an image whose `/proc`, `/sys`, `/dev`, `/tmp`, `/home` and `/root` are symlinks to host paths
//! (nothing on the host changes, the sandbox sees no host path; a tiny such image is refused with
//! 400 naming the links); a step sandbox invisible to the sandbox API mid-build; and a build or
//! import refused a configured directory template's name. Needs root (skips otherwise).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

use crate::{common, harness, oci};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use harness::*;
use oci::*;
use reqwest::Method;
use serde_json::{Value, json};

fn import(state: &Path, name: &str, layers: &[Vec<u8>]) {
    let src = tempfile::tempdir_in(Path::new(env!("CARGO_MANIFEST_DIR")).join("target")).unwrap();
    write_layout(src.path(), layers);
    let out = Command::new(common::binary())
        .arg("template")
        .arg("--state-dir")
        .arg(state)
        .args(["import", name, src.path().to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// Requests and starts a build of `name` from `spec`; returns (template id, build id).
async fn start_build(p: &Provider, name: &str, spec: Value) -> (String, String) {
    let (status, req) = p.call(Method::POST, "/v3/templates", Some(json!({"name": name}))).await;
    assert_eq!(status, reqwest::StatusCode::ACCEPTED, "{req}");
    let (tid, bid) = (req["templateID"].as_str().unwrap().to_owned(), req["buildID"].as_str().unwrap().to_owned());
    let (status, v) = p.call(Method::POST, &format!("/v2/templates/{tid}/builds/{bid}"), Some(spec)).await;
    assert_eq!(status, reqwest::StatusCode::ACCEPTED, "{v}");
    (tid, bid)
}

async fn wait_build(p: &Provider, tid: &str, bid: &str) -> Value {
    let deadline = std::time::Instant::now() + Duration::from_secs(300);
    loop {
        let (_, v) = p.call(Method::GET, &format!("/templates/{tid}/builds/{bid}/status?logsOffset=0"), None).await;
        if v["status"] == "ready" || v["status"] == "error" {
            return v;
        }
        assert!(std::time::Instant::now() < deadline, "build still running: {v}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// The id of build `bid`'s step sandbox, from the provider's state directory (the sandbox API
/// does not show step sandboxes).
fn step_sandbox(p: &Provider, bid: &str) -> Option<String> {
    std::fs::read_dir(p.state.join("sandboxes")).ok()?.flatten().find_map(|e| {
        let rec: Value = serde_json::from_slice(&std::fs::read(e.path().join("record.json")).ok()?).ok()?;
        (rec["build_step_of"] == bid).then(|| e.file_name().to_string_lossy().into_owned())
    })
}

/// Host processes whose command line contains `marker`.
fn processes_with(marker: &str) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()))
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(marker) && *pid != std::process::id() as i32)
        })
        .collect()
}

fn mount_count() -> usize {
    std::fs::read_to_string("/proc/self/mountinfo").unwrap().lines().count()
}

fn layer_paths(state: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(state.join("store/layers")).unwrap().flatten().map(|e| e.path()).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_hostile_run_step_keeps_to_its_own_files() {
    require_root!();
    let Some(rootfs) = debian_rootfs() else { return };
    let p = Provider::start(&[]);
    import(&p.state, "deb", &[std::fs::read(&rootfs).unwrap()]);
    // A host file the step's symlink would reach if the harvest followed it.
    let host = tempfile::tempdir_in("/var/tmp").unwrap();
    let host_marker = format!("host-marker-{}", std::process::id());
    std::fs::write(host.path().join(&host_marker), "host secret").unwrap();
    let daemon = format!("swapper{}", std::process::id());
    let run = format!(
        r#"set -e
mkdir -p /opt/a/d && echo inner > /opt/a/d/file
mkfifo /opt/a/fifo
ln /opt/a/d/file /opt/a/hard
cp /bin/true /opt/a/suid && chmod 4755 /opt/a/suid
printf '\037\213\010\000' > /opt/a/looks-gzip
mkdir -p /opt/a/.wh..wh..opq-not-really
echo evil > /etc/hostname
for i in $(seq 1 2000); do : > /opt/a/many.$i; done
nohup bash -c 'exec -a {daemon} bash -c "while :; do mv /opt/a/d /opt/a/d2; ln -s {host} /opt/a/d; rm /opt/a/d; mv /opt/a/d2 /opt/a/d; echo x >> /opt/a/grow; done"' >/dev/null 2>&1 &
sleep 1
"#,
        host = host.path().display()
    );
    let spec = json!({"fromTemplate": "deb", "steps": [{"type": "RUN", "args": [run, "root"]}]});
    let (tid, bid) = start_build(&p, "hostile", spec).await;
    let status = wait_build(&p, &tid, &bid).await;
    eprintln!("build: {} {}", status["status"], status["reason"]);
    // The daemon runs during the step only.
    assert!(
        wait_until(Duration::from_secs(10), || processes_with(&daemon).is_empty()),
        "a step's process outlived its build"
    );
    let (_, sandboxes) = p.call(Method::GET, "/sandboxes", None).await;
    assert_eq!(sandboxes.as_array().map(Vec::len), Some(0), "step sandboxes are gone: {sandboxes}");
    // Whatever the freeze caught (a directory or the symlink), the store holds nothing of the host.
    for layer in layer_paths(&p.state) {
        let out = Command::new("find").arg(&layer).args(["-name", &host_marker]).output().unwrap();
        assert!(out.stdout.is_empty(), "a host file reached a layer: {}", String::from_utf8_lossy(&out.stdout));
    }
    // The freeze stops the daemon for the whole read: the build never sees a change mid-walk
    // (a step that does fails naming it, which the harvest's unit tests cover).
    assert_eq!(status["status"], "ready", "{status}");
    let sbx = p.create(json!({"templateID": "hostile", "timeout": 60})).await;
    let id = id_of(&sbx);
    let check = r#"set -e
[ "$(cat /etc/hostname)" = "$(hostname)" ] && echo hostname-ok
[ -p /opt/a/fifo ] && echo fifo-ok
[ "$(stat -c %i /opt/a/hard)" = "$(stat -c %i /opt/a/d2/file 2>/dev/null || stat -c %i /opt/a/d/file)" ] && echo hard-ok
[ "$(stat -c %a:%u /opt/a/suid)" = "4755:0" ] && echo suid-ok
[ "$(head -c2 /opt/a/looks-gzip | od -An -tx1 | tr -d ' ')" = "1f8b" ] && echo gzip-ok
[ "$(ls /opt/a | grep -c '^many\.')" = 2000 ] && echo many-ok
ls -la /opt/a/d/ 2>&1 | grep -c host-marker || true
"#;
    let (code, out) = p.run(&sbx, check, Some("root")).await;
    assert_eq!(code, 0, "{out}");
    for ok in ["hostname-ok", "fifo-ok", "hard-ok", "suid-ok", "gzip-ok", "many-ok"] {
        assert!(out.contains(ok), "{ok} missing: {out}");
    }
    assert!(out.trim_end().ends_with('0'), "the sandbox sees the host's file: {out}");
    let _ = p.call(Method::DELETE, &format!("/sandboxes/{id}"), None).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_restart_in_the_middle_of_a_step_kills_its_sandbox_and_keeps_no_half_layer() {
    require_root!();
    let Some(rootfs) = debian_rootfs() else { return };
    let mut p = Provider::start(&[]);
    import(&p.state, "deb", &[std::fs::read(&rootfs).unwrap()]);
    let layers_before = layer_paths(&p.state).len();
    let marker = format!("endless{}", std::process::id());
    let run = format!("exec -a {marker} sleep 3600");
    let spec = json!({"fromTemplate": "deb", "steps": [{"type": "RUN", "args": [run]}]});
    let (tid, bid) = start_build(&p, "endless", spec).await;
    assert!(wait_until(Duration::from_secs(60), || !processes_with(&marker).is_empty()), "the step never started");
    // The API does not show a build's step sandbox: found in the state directory.
    let step_id = step_sandbox(&p, &bid).unwrap_or_else(|| panic!("no step sandbox of build {bid}"));
    let rec = p.record(&step_id);
    let pid = rec["envd_pid"].as_i64().unwrap() as i32;
    let cgroups = cgroups_of(&rec);

    p.crash();
    p.launch();
    assert_nothing_left(&p, &step_id, pid, &cgroups);
    assert!(processes_with(&marker).is_empty(), "the step's command outlived the restart");
    let (status, _) = p.call(Method::GET, &format!("/templates/{tid}/builds/{bid}/status"), None).await;
    assert_eq!(status, reqwest::StatusCode::NOT_FOUND, "a build does not outlive its provider");
    assert_eq!(layer_paths(&p.state).len(), layers_before, "no half layer");
    assert!(!p.state.join("store/templates/endless.json").exists());
    // A user's own sandbox dressed as a step (a `build:` template name, the old marking metadata)
    // is re-adopted as usual, listed and killable: only the build marks a step sandbox.
    import(&p.state, "build", &[std::fs::read(&rootfs).unwrap()]);
    let dressed = json!({"templateID": "build:default", "timeout": 120, "metadata": {"sandbox-mcp.build": bid}});
    let own = p.create(dressed).await;
    let (_, list) = p.call(Method::GET, "/sandboxes", None).await;
    assert!(list.to_string().contains(&id_of(&own)), "a user's sandbox is listed: {list}");
    p.crash();
    p.launch();
    let (status, _) = p.call(Method::GET, &format!("/sandboxes/{}", id_of(&own)), None).await;
    assert_eq!(status, reqwest::StatusCode::OK, "only build step sandboxes are killed at start-up");
    let (status, _) = p.call(Method::DELETE, &format!("/sandboxes/{}", id_of(&own)), None).await;
    assert_eq!(status, reqwest::StatusCode::NO_CONTENT, "a user's sandbox is killable");
}

/// A layer turning the mount points of a sandbox's set-up into symlinks to host paths (`all`:
/// `/dev`, `/home` and `/root` too).
fn symlink_layer(host: &Path, all: bool) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    let host = host.to_str().unwrap();
    let mut links = vec![("proc", "/etc".to_owned()), ("sys", "/".to_owned()), ("tmp", host.to_owned())];
    if all {
        links.push(("dev", "../../../../../../../../..".to_owned()));
        links.push(("home", format!("{host}/home")));
        links.push(("root", "/root".to_owned()));
    }
    for (path, target) in links {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(tar::EntryType::Symlink);
        header.set_size(0);
        header.set_mode(0o777);
        header.set_uid(0);
        header.set_gid(0);
        header.set_mtime(0);
        builder.append_link(&mut header, path, &target).unwrap();
    }
    builder.into_inner().unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn an_image_of_symlinked_mount_points_changes_nothing_on_the_host() {
    require_root!();
    let Some(rootfs) = debian_rootfs() else { return };
    let p = Provider::start(&[]);
    let host = tempfile::tempdir_in("/var/tmp").unwrap();
    std::fs::create_dir(host.path().join("home")).unwrap();
    std::fs::write(host.path().join("host-file"), "host").unwrap();
    let debian = std::fs::read(&rootfs).unwrap();
    import(&p.state, "links", &[debian.clone(), symlink_layer(host.path(), true)]);
    import(&p.state, "links2", &[debian, symlink_layer(host.path(), false)]);
    let listing = |dir: &Path| {
        let mut names: Vec<_> = std::fs::read_dir(dir).unwrap().flatten().map(|e| e.file_name()).collect();
        names.sort();
        names
    };
    let (host_before, mounts_before) = (listing(host.path()), mount_count());
    // Every such link: the create fails (or not) and the host is left as it was.
    let (status, v) = p.call(Method::POST, "/v2/sandboxes", Some(json!({"templateID": "links", "timeout": 60}))).await;
    if status == reqwest::StatusCode::CREATED {
        let _ = p.call(Method::DELETE, &format!("/sandboxes/{}", id_of(&v)), None).await;
    }
    eprintln!("all links: {status} {v}");
    // /proc, /sys and /tmp linked to host paths: the sandbox starts and sees none of them.
    let sbx = p.create(json!({"templateID": "links2", "timeout": 60})).await;
    let (code, out) =
        p.run(&sbx, "cat /tmp/host-file 2>&1; ls /sys /proc 2>&1 | head; readlink /tmp /proc", None).await;
    eprintln!("links2 ({code}): {out}");
    assert!(!out.contains("host\n") && !out.starts_with("host"), "the sandbox reads a host file: {out}");
    assert!(out.contains(host.path().to_str().unwrap()), "the links stay links in the sandbox's own tree: {out}");
    let _ = p.call(Method::DELETE, &format!("/sandboxes/{}", id_of(&sbx)), None).await;
    let sandboxes = p.state.join("sandboxes");
    assert!(wait_until(Duration::from_secs(10), || std::fs::read_dir(&sandboxes).unwrap().next().is_none()));
    assert_eq!(listing(host.path()), host_before, "the host directory changed");
    assert_eq!(mount_count(), mounts_before, "the host's mount table changed");
    assert!(std::fs::read_dir(host.path().join("home")).unwrap().next().is_none());
}

#[tokio::test(flavor = "multi_thread")]
async fn an_image_whose_mount_points_are_symlinks_is_refused_naming_the_path() {
    require_root!();
    let p = Provider::start(&[]);
    let host = tempfile::tempdir_in("/var/tmp").unwrap();
    std::fs::create_dir(host.path().join("home")).unwrap();
    // A tiny image (no Debian root): the set-up refuses it before anything of it runs.
    import(&p.state, "tinylinks", &[file_layer(&[("etc/tiny", b"tiny\n")]), symlink_layer(host.path(), true)]);
    let mounts_before = mount_count();
    let (status, v) =
        p.call(Method::POST, "/v2/sandboxes", Some(json!({"templateID": "tinylinks", "timeout": 60}))).await;
    eprintln!("tiny links: {status} {v}");
    assert_eq!(status, reqwest::StatusCode::BAD_REQUEST, "{v}");
    let message = v["message"].as_str().unwrap_or_default();
    assert!(message.contains("'tinylinks'") && message.contains("/dev") && message.contains("symlink"), "{v}");
    let sandboxes = p.state.join("sandboxes");
    assert!(wait_until(Duration::from_secs(10), || std::fs::read_dir(&sandboxes).unwrap().next().is_none()));
    assert_eq!(mount_count(), mounts_before, "the host's mount table changed");
    assert!(std::fs::read_dir(host.path().join("home")).unwrap().next().is_none());
    let (_, list) = p.call(Method::GET, "/sandboxes", None).await;
    assert_eq!(list.as_array().map(Vec::len), Some(0), "{list}");
}

/// A tiny image with a shell: the host's `sh` and `sleep`, the C library they need, an `/etc`.
fn shell_layer() -> Vec<u8> {
    let host_files = [
        ("bin/sh", "/bin/sh"),
        ("bin/sleep", "/bin/sleep"),
        ("lib64/ld-linux-x86-64.so.2", "/lib64/ld-linux-x86-64.so.2"),
        ("lib/x86_64-linux-gnu/libc.so.6", "/lib/x86_64-linux-gnu/libc.so.6"),
    ];
    let contents: Vec<(&str, Vec<u8>)> =
        host_files.iter().map(|&(path, host)| (path, std::fs::read(host).unwrap())).collect();
    let mut files: Vec<(&str, &[u8], u32)> = contents.iter().map(|(path, data)| (*path, &data[..], 0o755)).collect();
    // The set-up writes the accounts, hosts and resolver files into the image's /etc.
    files.push(("etc/passwd", b"root:x:0:0:root:/root:/bin/sh\n", 0o644));
    moded_file_layer(&files)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_build_step_sandbox_is_invisible_to_the_sandbox_api() {
    require_root!();
    if std::env::consts::ARCH != "x86_64" || !Path::new("/lib64/ld-linux-x86-64.so.2").exists() {
        return crate::common::gate::skip("the tiny shell image is made of the host's x86_64 /bin/sh");
    }
    let p = Provider::start(&[]);
    import(&p.state, "tinysh", &[shell_layer()]);
    let spec = json!({"fromTemplate": "tinysh", "steps": [{"type": "RUN", "args": ["sleep 8 && echo slept", "root"]}]});
    let (tid, bid) = start_build(&p, "stepped", spec).await;
    let mut step = None;
    assert!(
        wait_until(Duration::from_secs(60), || {
            step = step_sandbox(&p, &bid);
            step.is_some()
        }),
        "the step never started"
    );
    let step = step.unwrap();
    let (_, list) = p.call(Method::GET, "/sandboxes", None).await;
    assert_eq!(list.as_array().map(Vec::len), Some(0), "a step sandbox is listed: {list}");
    let (_, list) = p.call(Method::GET, "/v2/sandboxes?state=running,paused", None).await;
    assert_eq!(list.as_array().map(Vec::len), Some(0), "a step sandbox is listed: {list}");
    let tries: [(Method, String, Option<Value>); 9] = [
        (Method::GET, format!("/sandboxes/{step}"), None),
        (Method::GET, format!("/sandboxes/{step}/metrics"), None),
        (Method::POST, format!("/sandboxes/{step}/connect"), Some(json!({"timeout": 60}))),
        (Method::POST, format!("/v2/sandboxes/{step}/connect"), Some(json!({"timeout": 60}))),
        (Method::POST, format!("/sandboxes/{step}/pause"), Some(json!({}))),
        (Method::POST, format!("/sandboxes/{step}/resume"), Some(json!({"timeout": 60}))),
        (Method::POST, format!("/sandboxes/{step}/timeout"), Some(json!({"timeout": 1}))),
        (Method::PUT, format!("/sandboxes/{step}/network"), Some(json!({"allowOut": ["1.1.1.1"]}))),
        (Method::DELETE, format!("/sandboxes/{step}"), None),
    ];
    for (method, path, body) in tries {
        let (status, v) = p.call(method.clone(), &path, body).await;
        assert_eq!(status, reqwest::StatusCode::NOT_FOUND, "{method} {path}: {v}");
        assert_eq!(v["message"], format!("sandbox {step} not found"), "{method} {path}");
    }
    // Its agent through the data plane: answered as for an unknown sandbox.
    let envd =
        |id: String| p.http.get(p.url("/health")).header("X-API-Key", API_KEY).header("E2b-Sandbox-Id", id).send();
    let unknown = envd("ixxxxxxxxxxxxxxxxxxxx".to_owned()).await.unwrap().status();
    assert_eq!(envd(step.clone()).await.unwrap().status(), unknown);
    // The 404s prove nothing unless the step sandbox was alive through all of them.
    assert!(
        crate::common::agent_pid(&p.state, &step).is_some(),
        "the step sandbox ended before the API was tried; lengthen the step"
    );
    // The build is untouched by all of it, and its step sandbox goes with it.
    let status = wait_build(&p, &tid, &bid).await;
    assert_eq!(status["status"], "ready", "{status}");
    assert!(status.to_string().contains("slept"), "{status}");
    let sandboxes = p.state.join("sandboxes");
    assert!(wait_until(Duration::from_secs(10), || std::fs::read_dir(&sandboxes).unwrap().next().is_none()));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_build_or_import_cannot_take_a_configured_directory_templates_name() {
    require_root!();
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    std::fs::create_dir(dir.path().join("etc")).unwrap();
    let p = Provider::start(&["--template", &format!("mine={}", dir.path().display())]);
    for name in ["mine", "mine:v2", "base"] {
        let (status, v) = p.call(Method::POST, "/v3/templates", Some(json!({"name": name}))).await;
        assert_eq!(status, reqwest::StatusCode::BAD_REQUEST, "{name}: {v}");
        let message = v["message"].as_str().unwrap_or_default();
        let named = if name == "base" { "\"base\"" } else { "\"mine\"" };
        assert!(message.contains(named), "{name}: {v}");
        if name != "base" {
            assert!(message.contains("configured directory template"), "{name}: {v}");
        }
    }
    // The operator's CLI refuses it too, knowing the directory templates of its configuration.
    let config = p.state.join("names.toml");
    std::fs::write(&config, format!("[local.templates]\nmine = \"{}\"\n", dir.path().display())).unwrap();
    let src = tempfile::tempdir_in(Path::new(env!("CARGO_MANIFEST_DIR")).join("target")).unwrap();
    write_layout(src.path(), &[file_layer(&[("etc/tiny", b"tiny\n")])]);
    let out = Command::new(common::binary())
        .arg("template")
        .arg("--config")
        .arg(&config)
        .arg("--state-dir")
        .arg(&p.state)
        .args(["import", "mine", src.path().to_str().unwrap()])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("configured directory template"), "{stderr}");
    assert!(!p.state.join("store/templates/mine.json").exists());
    // Any other name is the store's.
    import(&p.state, "yours", &[file_layer(&[("etc/tiny", b"tiny\n")])]);
}
