//! A real registry on loopback for the OCI tests: Debian's `docker-registry`
//! (distribution) with htpasswd basic auth or anonymous, and a push of an OCI
//! image layout over the distribution API (blob upload POST/PUT, skipping
//! blobs the repository has; manifest PUT). Needs the apt packages
//! docker-registry and apache2-utils. The including crate names `oci.rs` `oci`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly
#![allow(dead_code)] // each test binary uses a part of it

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::oci::manifest_digest;

/// A `docker-registry` child, killed (by its pid) when dropped.
pub struct Registry {
    child: Child,
    /// `127.0.0.1:PORT`.
    pub addr: String,
    /// Basic credentials it requires (`None`: anonymous pulls and pushes).
    pub auth: Option<(String, String)>,
    dir: tempfile::TempDir,
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Registry {
    /// Starts a registry on a free loopback port, with htpasswd auth when `auth` is given; `None`
    /// after a loud skip when docker-registry is not installed.
    pub fn start(auth: Option<(&str, &str)>) -> Option<Registry> {
        if Command::new("docker-registry").arg("--version").output().is_err() {
            crate::common::gate::skip("docker-registry (apt-get install docker-registry apache2-utils) is needed");
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let mut auth_section = String::new();
        if let Some((user, password)) = auth {
            let htpasswd =
                Command::new("htpasswd").args(["-Bbn", user, password]).output().expect("htpasswd (apache2-utils)");
            std::fs::write(dir.path().join("htpasswd"), htpasswd.stdout).unwrap();
            auth_section =
                format!("auth:\n  htpasswd:\n    realm: test\n    path: {}\n", dir.path().join("htpasswd").display());
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let addr = format!("127.0.0.1:{port}");
        let config = format!(
            "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: {addr}\n\
             {auth_section}",
            dir.path().join("data").display(),
        );
        std::fs::write(dir.path().join("config.yml"), config).unwrap();
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(dir.path().join("config.yml"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("registry.log")).unwrap())
            .spawn()
            .unwrap();
        let auth = auth.map(|(u, p)| (u.to_owned(), p.to_owned()));
        let registry = Registry { child, addr, auth, dir };
        assert!(
            crate::common::wait_until(Duration::from_secs(20), || std::net::TcpStream::connect(&registry.addr).is_ok()),
            "the registry did not start"
        );
        Some(registry)
    }

    /// The last lines of the registry's own log (for a failure message).
    pub fn log_tail(&self, lines: usize) -> String {
        let log = std::fs::read_to_string(self.dir.path().join("registry.log")).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(lines).collect();
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    }

    fn authed(&self, req: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.auth {
            Some((user, password)) => req.basic_auth(user, Some(password)),
            None => req,
        }
    }

    /// Pushes every blob of an OCI layout the repository lacks, then its manifest as `repo:tag`.
    pub async fn push(&self, repo: &str, tag: &str, layout: &Path) {
        let http = reqwest::Client::new();
        let base = format!("http://{}/v2/{repo}", self.addr);
        let manifest = manifest_digest(layout);
        for entry in std::fs::read_dir(layout.join("blobs/sha256")).unwrap().flatten() {
            let digest = format!("sha256:{}", entry.file_name().to_str().unwrap());
            if digest == manifest {
                continue;
            }
            let head = self.authed(http.head(format!("{base}/blobs/{digest}"))).send().await.unwrap();
            if head.status() == 200 {
                continue;
            }
            let start = self.authed(http.post(format!("{base}/blobs/uploads/"))).send().await.unwrap();
            assert_eq!(start.status(), 202, "blob upload start");
            let location = start.headers()["location"].to_str().unwrap().to_owned();
            let location =
                if location.starts_with("http") { location } else { format!("http://{}{location}", self.addr) };
            let sep = if location.contains('?') { '&' } else { '?' };
            let body = std::fs::read(entry.path()).unwrap();
            let put = self
                .authed(http.put(format!("{location}{sep}digest={digest}")))
                .header("content-type", "application/octet-stream")
                .body(body)
                .send()
                .await
                .unwrap();
            assert_eq!(put.status(), 201, "blob upload of {digest}");
        }
        let body = std::fs::read(layout.join("blobs/sha256").join(&manifest[7..])).unwrap();
        let put = self
            .authed(http.put(format!("{base}/manifests/{tag}")))
            .header("content-type", "application/vnd.oci.image.manifest.v1+json")
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(put.status(), 201, "manifest put: {}", put.text().await.unwrap());
    }
}
