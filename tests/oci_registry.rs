//! Pulls from a real registry on loopback: Debian's `docker-registry`
//! (distribution) with htpasswd basic auth, holding a Debian image the test
//! packs and pushes itself over the distribution API (blob upload POST/PUT,
//! manifest PUT). `sandbox-mcp template pull` without credentials fails with
//! a clear error, with wrong ones too, with the right ones it stores the
//! template, and a sandbox created from it runs the image's `dpkg`. Needs root
//! and the apt packages docker-registry, apache2-utils, zstd, mmdebstrap.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

mod common;
#[path = "local_provider_support/harness.rs"]
mod harness;
#[path = "oci_support/image.rs"]
mod oci;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use harness::*;
use oci::*;
use serde_json::json;

/// A `docker-registry` child, killed (by its pid) when dropped.
struct Registry {
    child: Child,
    addr: String,
    _dir: tempfile::TempDir,
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_registry(user: &str, password: &str) -> Option<Registry> {
    if Command::new("docker-registry").arg("--version").output().is_err() {
        common::gate::skip("docker-registry (apt-get install docker-registry apache2-utils) is needed");
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let htpasswd = Command::new("htpasswd").args(["-Bbn", user, password]).output().expect("htpasswd (apache2-utils)");
    std::fs::write(dir.path().join("htpasswd"), htpasswd.stdout).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let addr = format!("127.0.0.1:{port}");
    let config = format!(
        "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: {addr}\n\
         auth:\n  htpasswd:\n    realm: test\n    path: {}\n",
        dir.path().join("data").display(),
        dir.path().join("htpasswd").display()
    );
    std::fs::write(dir.path().join("config.yml"), config).unwrap();
    let child = Command::new("docker-registry")
        .arg("serve")
        .arg(dir.path().join("config.yml"))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.path().join("registry.log")).unwrap())
        .spawn()
        .unwrap();
    eprintln!("registry log: {}", dir.path().join("registry.log").display());
    let registry = Registry { child, addr, _dir: dir };
    assert!(
        wait_until(Duration::from_secs(20), || std::net::TcpStream::connect(&registry.addr).is_ok()),
        "the registry did not start"
    );
    Some(registry)
}

/// Pushes every blob of an OCI layout, then its manifest as `repo:tag`.
async fn push(addr: &str, repo: &str, tag: &str, layout: &Path, user: &str, password: &str) {
    let http = reqwest::Client::new();
    let base = format!("http://{addr}/v2/{repo}");
    let manifest = manifest_digest(layout);
    for entry in std::fs::read_dir(layout.join("blobs/sha256")).unwrap().flatten() {
        let digest = format!("sha256:{}", entry.file_name().to_str().unwrap());
        if digest == manifest {
            continue;
        }
        let start = http.post(format!("{base}/blobs/uploads/")).basic_auth(user, Some(password)).send().await.unwrap();
        assert_eq!(start.status(), 202, "blob upload start");
        let location = start.headers()["location"].to_str().unwrap().to_owned();
        let location = if location.starts_with("http") { location } else { format!("http://{addr}{location}") };
        let sep = if location.contains('?') { '&' } else { '?' };
        let body = std::fs::read(entry.path()).unwrap();
        let put = http
            .put(format!("{location}{sep}digest={digest}"))
            .basic_auth(user, Some(password))
            .header("content-type", "application/octet-stream")
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(put.status(), 201, "blob upload of {digest}");
    }
    let body = std::fs::read(layout.join("blobs/sha256").join(&manifest[7..])).unwrap();
    let put = http
        .put(format!("{base}/manifests/{tag}"))
        .basic_auth(user, Some(password))
        .header("content-type", "application/vnd.oci.image.manifest.v1+json")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), 201, "manifest put: {}", put.text().await.unwrap());
}

fn pull(state: &Path, name: &str, reference: &str, creds: Option<(&str, &str)>) -> std::process::Output {
    let mut command = Command::new(common::binary());
    command.arg("template").arg("--state-dir").arg(state).args(["pull", name, reference]);
    command.env_remove("SANDBOX_MCP_REGISTRY_PASSWORD");
    if let Some((user, password)) = creds {
        command.args(["--username", user]).env("SANDBOX_MCP_REGISTRY_PASSWORD", password);
    }
    command.output().unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_private_loopback_registry_image_is_pulled_with_basic_auth_and_runs() {
    require_root!();
    let Some(rootfs) = debian_rootfs() else { return };
    let (user, password) = ("pusher", "s3cret-registry-pass");
    let Some(registry) = start_registry(user, password) else { return };
    let layout = tempfile::tempdir_in(Path::new(env!("CARGO_MANIFEST_DIR")).join("target")).unwrap();
    write_layout(layout.path(), &[std::fs::read(&rootfs).unwrap(), second_layer()]);
    push(&registry.addr, "team/debian", "bookworm", layout.path(), user, password).await;
    let p = Provider::start(&[]);
    let reference = format!("{}/team/debian:bookworm", registry.addr);

    let out = pull(&p.state, "deb", &reference, None);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("needs credentials"), "{stderr}");
    let out = pull(&p.state, "deb", &reference, Some((user, "not-the-password-42")));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("refused"), "{stderr}");
    assert!(!stderr.contains("not-the-password-42"), "no credential in the output: {stderr}");

    let started = std::time::Instant::now();
    let out = pull(&p.state, "deb", &reference, Some((user, password)));
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    if !out.status.success() {
        let log = std::fs::read_to_string(registry._dir.path().join("registry.log")).unwrap();
        let tail: Vec<&str> = log.lines().rev().take(6).collect();
        panic!("{stderr}\n{}", tail.join("\n"));
    }
    eprintln!("pulled in {:?}: {stdout}", started.elapsed());
    assert!(!stdout.contains(password) && !stderr.contains(password));
    assert_eq!(std::fs::read_dir(p.state.join("store/tmp")).unwrap().count(), 0, "no download left behind");

    let sbx = p.create(json!({"templateID": "deb", "timeout": 60})).await;
    let (code, out) =
        p.run(&sbx, "dpkg -s apt | grep -c '^Status: install ok installed'; cat /opt/layer2/hello", None).await;
    assert_eq!((code, out.as_str()), (0, "1\nfrom the second layer\n"));
    let (status, _) = p.call(reqwest::Method::DELETE, &format!("/sandboxes/{}", id_of(&sbx)), None).await;
    assert_eq!(status, reqwest::StatusCode::NO_CONTENT);
}
