//! Pulls from a real registry on loopback: Debian's `docker-registry`
//! (distribution) with htpasswd basic auth, holding a Debian image the test
//! packs and pushes itself over the distribution API (blob upload POST/PUT,
//! manifest PUT). `sandbox-mcp template pull` without credentials fails with
//! a clear error, with wrong ones too, with the right ones it stores the
//! template, and a sandbox created from it runs the image's `dpkg`. Needs root
//! and the apt packages docker-registry, apache2-utils, zstd, mmdebstrap.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

use crate::{common, harness, oci, registry};
use std::path::Path;
use std::process::Command;

use harness::*;
use oci::*;
use serde_json::json;

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
    let Some(registry) = registry::Registry::start(Some((user, password))) else { return };
    let layout = tempfile::tempdir_in(Path::new(env!("CARGO_MANIFEST_DIR")).join("target")).unwrap();
    write_layout(layout.path(), &[std::fs::read(&rootfs).unwrap(), second_layer()]);
    registry.push("team/debian", "bookworm", layout.path()).await;
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
        panic!("{stderr}\n{}", registry.log_tail(6));
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

/// A registry speaking the bearer-token flow (as Docker Hub and GHCR do), served by the test: a
/// token endpoint that wants basic credentials and the right scope, and a multi-platform index.
#[tokio::test(flavor = "multi_thread")]
async fn the_bearer_token_flow_and_an_image_index_resolve_to_the_host_platform() {
    require_root!();
    use axum::extract::{Path as UrlPath, Query, State};
    use axum::http::{HeaderMap, StatusCode, header};
    use axum::response::IntoResponse;
    use std::collections::HashMap;
    use std::sync::Arc;

    let layer = file_layer(&[("etc/tiny", b"tiny!\n")]);
    let blob = gzip(&layer);
    let digest = |b: &[u8]| format!("sha256:{}", hex::encode(<sha2::Sha256 as sha2::Digest>::digest(b)));
    let config = serde_json::to_vec(&json!({"architecture": "amd64", "os": "linux", "config": {"Env": ["A=1"]},
        "rootfs": {"type": "layers", "diff_ids": [digest(&layer)]}}))
    .unwrap();
    let manifest = serde_json::to_vec(&json!({"schemaVersion": 2,
        "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
        "config": {"mediaType": "application/vnd.docker.container.image.v1+json", "digest": digest(&config), "size": config.len()},
        "layers": [{"mediaType": "application/vnd.docker.image.rootfs.diff.tar.gzip", "digest": digest(&blob), "size": blob.len()}]}))
    .unwrap();
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    };
    let index = serde_json::to_vec(&json!({"schemaVersion": 2,
        "mediaType": "application/vnd.docker.distribution.manifest.list.v2+json",
        "manifests": [
            {"mediaType": "application/vnd.docker.distribution.manifest.v2+json", "digest": digest(b"other platform"), "size": 1,
             "platform": {"architecture": "s390x", "os": "linux"}},
            {"mediaType": "application/vnd.docker.distribution.manifest.v2+json", "digest": digest(&manifest), "size": manifest.len(),
             "platform": {"architecture": arch, "os": "linux"}}]}))
    .unwrap();
    let mut docs: HashMap<String, Vec<u8>> = HashMap::new();
    docs.insert("v1".into(), index);
    docs.insert(digest(&manifest), manifest);
    let mut blobs: HashMap<String, Vec<u8>> = HashMap::new();
    blobs.insert(digest(&config), config);
    blobs.insert(digest(&blob), blob);

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    struct S {
        docs: HashMap<String, Vec<u8>>,
        blobs: HashMap<String, Vec<u8>>,
        realm: String,
        blob_gets: std::sync::atomic::AtomicUsize,
    }
    let state = Arc::new(S { docs, blobs, realm: format!("http://{addr}/token"), blob_gets: Default::default() });
    let counter = state.clone();
    let challenge = |s: &S| {
        let value = format!(r#"Bearer realm="{}",service="test-registry",scope="repository:team/img:pull""#, s.realm);
        (StatusCode::UNAUTHORIZED, [(header::WWW_AUTHENTICATE, value)]).into_response()
    };
    let authorized = |h: &HeaderMap| h.get(header::AUTHORIZATION).is_some_and(|v| v == "Bearer good-token");
    let app = axum::Router::new()
        .route(
            "/token",
            axum::routing::get(|h: HeaderMap, Query(q): Query<HashMap<String, String>>| async move {
                use base64::Engine;
                let basic = format!("Basic {}", base64::engine::general_purpose::STANDARD.encode("alice:pw"));
                let scope_ok = q.get("scope").is_some_and(|s| s == "repository:team/img:pull")
                    && q.get("service").is_some_and(|s| s == "test-registry");
                if !scope_ok || h.get(header::AUTHORIZATION).is_none_or(|v| v != basic.as_str()) {
                    return StatusCode::UNAUTHORIZED.into_response();
                }
                axum::Json(json!({"token": "good-token"})).into_response()
            }),
        )
        .route(
            "/v2/team/img/manifests/{reference}",
            axum::routing::get(move |State(s): State<Arc<S>>, h: HeaderMap, UrlPath(r): UrlPath<String>| async move {
                if !authorized(&h) {
                    return challenge(&s);
                }
                match s.docs.get(&r) {
                    Some(doc) => doc.clone().into_response(),
                    None => StatusCode::NOT_FOUND.into_response(),
                }
            }),
        )
        .route(
            "/v2/team/img/blobs/{digest}",
            axum::routing::get(move |State(s): State<Arc<S>>, h: HeaderMap, UrlPath(d): UrlPath<String>| async move {
                if !authorized(&h) {
                    return challenge(&s);
                }
                s.blob_gets.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                match s.blobs.get(&d) {
                    Some(b) => b.clone().into_response(),
                    None => StatusCode::NOT_FOUND.into_response(),
                }
            }),
        )
        .with_state(state);
    let server = tokio::spawn(async move { axum::serve(listener, app).await });

    let state_dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let reference = format!("{addr}/team/img:v1");
    let anonymous = tokio::task::spawn_blocking({
        let (s, r) = (state_dir.path().to_owned(), reference.clone());
        move || pull(&s, "tiny", &r, None)
    })
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&anonymous.stderr);
    assert!(!anonymous.status.success() && stderr.contains("needs credentials"), "{stderr}");
    let out = tokio::task::spawn_blocking({
        let (s, r) = (state_dir.path().to_owned(), reference.clone());
        move || pull(&s, "tiny", &r, Some(("alice", "pw")))
    })
    .await
    .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(state_dir.path().join("store/templates/tiny.json")).unwrap()).unwrap();
    assert_eq!(record["config"]["env"], json!(["A=1"]));
    let layer_hex = record["layers"][0].as_str().unwrap().trim_start_matches("sha256:").to_owned();
    let file = state_dir.path().join("store/layers").join(layer_hex).join("fs/etc/tiny");
    assert_eq!(std::fs::read_to_string(file).unwrap(), "tiny!\n");

    // Two pulls of the image at once in one process: each blob is downloaded once.
    let shared = tempfile::tempdir_in("/var/tmp").unwrap();
    let store = sandbox_mcp::local::store::Store::open(shared.path(), 1024).unwrap();
    use sandbox_mcp::local::store::registry::{Credentials, PullOptions, pull as pull_in};
    let options = PullOptions {
        insecure_registries: Vec::new(),
        credentials: Some(Credentials { username: "alice".into(), password: "pw".into() }),
    };
    let before = counter.blob_gets.load(std::sync::atomic::Ordering::SeqCst);
    let (a, b) = tokio::join!(pull_in(&store, "a", &reference, &options), pull_in(&store, "b", &reference, &options));
    assert_eq!(a.unwrap().layers, b.unwrap().layers);
    let gets = counter.blob_gets.load(std::sync::atomic::Ordering::SeqCst) - before;
    assert_eq!(gets, 3, "the config twice (small documents are not shared), the layer once");
    server.abort();
}

/// A registry that injects faults a real one cannot produce on demand: a layer blob cut off
/// mid-stream, one with the right length and wrong bytes, and one longer than its manifest says.
/// Layers are extracted while they download, so each fault must fail the pull with a clear error
/// and leave no layer, no template and no scratch directory behind; the intact blob then pulls.
#[tokio::test(flavor = "multi_thread")]
async fn cut_tampered_and_oversized_layer_downloads_leave_nothing_behind() {
    require_root!();
    use axum::extract::{Path as UrlPath, State};
    use axum::http::{StatusCode, header};
    use axum::response::IntoResponse;
    use std::sync::{Arc, Mutex};

    // A layer of a few MiB that compresses poorly, so the download spans many chunks.
    let mut noise = vec![0u8; 6 << 20];
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for b in noise.iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    let layer = file_layer(&[("opt/noise.bin", &noise)]);
    let blob = gzip(&layer);
    let digest = |b: &[u8]| format!("sha256:{}", hex::encode(<sha2::Sha256 as sha2::Digest>::digest(b)));
    let config = serde_json::to_vec(&json!({"architecture": "amd64", "os": "linux",
        "rootfs": {"type": "layers", "diff_ids": [digest(&layer)]}}))
    .unwrap();
    let manifest = serde_json::to_vec(&json!({"schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": digest(&config), "size": config.len()},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": digest(&blob), "size": blob.len()}]}))
    .unwrap();

    #[derive(Clone, Copy, PartialEq, Debug)]
    enum Fault {
        Cut,
        Tampered,
        Oversized,
        None,
    }
    struct S {
        manifest: Vec<u8>,
        config: (String, Vec<u8>),
        blob: Vec<u8>,
        fault: Mutex<Fault>,
    }
    let state =
        Arc::new(S { manifest, config: (digest(&config), config), blob: blob.clone(), fault: Mutex::new(Fault::Cut) });
    let app = axum::Router::new()
        .route(
            "/v2/img/manifests/{reference}",
            axum::routing::get(|State(s): State<Arc<S>>| async move {
                ([(header::CONTENT_TYPE, "application/vnd.oci.image.manifest.v1+json")], s.manifest.clone())
                    .into_response()
            }),
        )
        .route(
            "/v2/img/blobs/{digest}",
            axum::routing::get(|State(s): State<Arc<S>>, UrlPath(d): UrlPath<String>| async move {
                if d == s.config.0 {
                    return s.config.1.clone().into_response();
                }
                let fault = *s.fault.lock().unwrap();
                let mut bytes = s.blob.clone();
                match fault {
                    Fault::Cut => {
                        // Announce the whole length, send half, then drop the connection.
                        let half = bytes::Bytes::from(bytes[..bytes.len() / 2].to_vec());
                        let chunks: Vec<Result<bytes::Bytes, std::io::Error>> =
                            vec![Ok(half), Err(std::io::Error::other("connection cut"))];
                        let body = axum::body::Body::from_stream(futures_util::stream::iter(chunks));
                        return ([(header::CONTENT_LENGTH, s.blob.len().to_string())], body).into_response();
                    }
                    Fault::Tampered => {
                        let at = bytes.len() * 3 / 4;
                        bytes[at] ^= 0x55;
                    }
                    Fault::Oversized => bytes.extend_from_slice(&[0u8; 4096]),
                    Fault::None => {}
                }
                (StatusCode::OK, bytes).into_response()
            }),
        )
        .with_state(state.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let reference = format!("{}/img:v1", listener.local_addr().unwrap());
    let server = tokio::spawn(async move { axum::serve(listener, app).await });

    let state_dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let store_dir = state_dir.path().join("store");
    let left_behind = |sub: &str| -> Vec<String> {
        std::fs::read_dir(store_dir.join(sub))
            .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
            .unwrap_or_default()
    };
    for (fault, expected) in
        [(Fault::Cut, "downloading layer"), (Fault::Tampered, "corrupt"), (Fault::Oversized, "larger than announced")]
    {
        *state.fault.lock().unwrap() = fault;
        let out = tokio::task::spawn_blocking({
            let (s, r) = (state_dir.path().to_owned(), reference.clone());
            move || pull(&s, "noise", &r, None)
        })
        .await
        .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{fault:?}: the pull must fail: {stderr}");
        assert!(stderr.to_lowercase().contains(expected), "{fault:?}: want {expected:?} in: {stderr}");
        assert!(!stderr.contains("panicked"), "{fault:?}: {stderr}");
        assert_eq!(left_behind("layers"), Vec::<String>::new(), "{fault:?}: a layer was stored");
        assert_eq!(left_behind("templates"), Vec::<String>::new(), "{fault:?}: a template was registered");
        assert_eq!(left_behind("tmp"), Vec::<String>::new(), "{fault:?}: scratch left in tmp/");
    }
    *state.fault.lock().unwrap() = Fault::None;
    let out = tokio::task::spawn_blocking({
        let (s, r) = (state_dir.path().to_owned(), reference.clone());
        move || pull(&s, "noise", &r, None)
    })
    .await
    .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stored = store_dir.join("layers").join(digest(&blob).trim_start_matches("sha256:")).join("fs/opt/noise.bin");
    assert_eq!(std::fs::read(stored).unwrap(), noise, "the intact pull stores the layer's bytes");
    server.abort();
}
