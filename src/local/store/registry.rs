//! Pulls from OCI registries (the distribution API): anonymous, basic auth
//! and the bearer-token flow Docker Hub and GHCR use (from the
//! `WWW-Authenticate` challenge's realm, service and scope); OCI and Docker v2
//! manifests, indexes resolved to the host's platform. Blobs are downloaded
//! into the store's `tmp/` and become layers only once their digest matched;
//! pulls of one layer in this process share one download. Loopback registries
//! may be plain HTTP; others need TLS unless listed insecure. Credentials and
//! tokens never reach logs or errors.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};

use futures_util::StreamExt;

use super::digest::Digest;
use super::image::{Document, ImageConfig, MAX_DOCUMENT, pick_manifest};
use super::layout::RunConfig;
use super::{Store, StoreError, TemplateRecord};

const ACCEPT: &str = "application/vnd.oci.image.index.v1+json, application/vnd.oci.image.manifest.v1+json, \
                      application/vnd.docker.distribution.manifest.list.v2+json, \
                      application/vnd.docker.distribution.manifest.v2+json";

/// A registry user and password (never printed: `Debug` hides the password).
#[derive(Clone)]
pub struct Credentials {
    pub username: String,
    pub password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Credentials({}, <hidden>)", self.username)
    }
}

#[derive(Debug, Clone, Default)]
pub struct PullOptions {
    /// Registries (`HOST[:PORT]`) reachable over plain HTTP.
    pub insecure_registries: Vec<String>,
    pub credentials: Option<Credentials>,
}

/// `[REGISTRY/]REPOSITORY[:TAG][@DIGEST]`, split.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reference {
    pub registry: String,
    pub repository: String,
    /// A tag or a digest.
    pub reference: String,
}

impl Reference {
    pub fn parse(text: &str) -> Result<Reference, StoreError> {
        let bad =
            || StoreError::BadImage(format!("bad image reference {text:?} (expected [REGISTRY/]REPO[:TAG][@DIGEST])"));
        let (rest, digest) = match text.split_once('@') {
            Some((rest, digest)) => (rest, Some(Digest::parse(digest)?.to_string())),
            None => (text, None),
        };
        let (registry, path) = match rest.split_once('/') {
            Some((first, path)) if first.contains(['.', ':']) || first == "localhost" => (first.to_owned(), path),
            _ => ("docker.io".to_owned(), rest),
        };
        let (repository, tag) = match path.rsplit_once(':') {
            Some((repo, tag)) if !tag.contains('/') => (repo, Some(tag)),
            _ => (path, None),
        };
        let valid = |s: &str| {
            !s.is_empty() && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-/".contains(&b))
        };
        if !valid(repository)
            || tag.is_some_and(|t| t.is_empty() || !t.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b)))
        {
            return Err(bad());
        }
        let repository = if registry == "docker.io" && !repository.contains('/') {
            format!("library/{repository}")
        } else {
            repository.to_owned()
        };
        let reference = digest.or_else(|| tag.map(str::to_owned)).unwrap_or_else(|| "latest".to_owned());
        Ok(Reference { registry, repository, reference })
    }

    fn base_url(&self, insecure: &[String]) -> String {
        let host = if self.registry == "docker.io" { "registry-1.docker.io" } else { &self.registry };
        let name = host.rsplit_once(':').map_or(host, |(h, _)| h).trim_matches(['[', ']']);
        let loopback = name == "localhost" || name.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback());
        let scheme = if loopback || insecure.iter().any(|i| i == &self.registry) { "http" } else { "https" };
        format!("{scheme}://{host}/v2/{}", self.repository)
    }
}

/// One registry session: the client and the authorization it earned.
struct Session {
    client: reqwest::Client,
    base: String,
    registry: String,
    credentials: Option<Credentials>,
    auth: Option<String>,
}

fn net(registry: &str, e: reqwest::Error) -> StoreError {
    // reqwest errors name the URL, never credentials (they travel in headers).
    StoreError::Registry(format!("{registry}: {}", with_causes(e.without_url())))
}

/// An error and its causes, joined (reqwest's own text is often just "error decoding response body").
fn with_causes(e: reqwest::Error) -> String {
    let mut text = e.to_string();
    let mut cause = std::error::Error::source(&e);
    while let Some(inner) = cause {
        let part = inner.to_string();
        if !text.contains(&part) {
            text = format!("{text}: {part}");
        }
        cause = inner.source();
    }
    text
}

impl Session {
    /// GET `url`, answering one 401 challenge (basic, or a bearer token from the realm).
    async fn get(&mut self, url: &str, accept: &str) -> Result<reqwest::Response, StoreError> {
        for _ in 0..2 {
            let mut request = self.client.get(url).header(reqwest::header::ACCEPT, accept);
            if let Some(auth) = &self.auth {
                request = request.header(reqwest::header::AUTHORIZATION, auth);
            }
            let response = request.send().await.map_err(|e| net(&self.registry, e))?;
            if response.status() != reqwest::StatusCode::UNAUTHORIZED {
                return check(response, &self.registry).await;
            }
            if self.auth.is_some() && !self.retryable() {
                return Err(StoreError::Registry(format!("{}: the credentials were refused", self.registry)));
            }
            let challenge = response
                .headers()
                .get(reqwest::header::WWW_AUTHENTICATE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned();
            self.authorize(&challenge).await?;
        }
        Err(StoreError::Registry(format!("{}: authorization was refused", self.registry)))
    }

    fn retryable(&self) -> bool {
        self.auth.as_deref().is_some_and(|a| a.starts_with("Bearer"))
    }

    async fn authorize(&mut self, challenge: &str) -> Result<(), StoreError> {
        let missing = || {
            StoreError::Registry(format!(
                "{} needs credentials: pass --username USER and the password in SANDBOX_MCP_REGISTRY_PASSWORD",
                self.registry
            ))
        };
        let (scheme, params) = challenge.split_once(' ').unwrap_or((challenge, ""));
        if scheme.eq_ignore_ascii_case("basic") {
            let c = self.credentials.as_ref().ok_or_else(missing)?;
            if self.auth.is_some() {
                return Err(StoreError::Registry(format!("{}: the credentials were refused", self.registry)));
            }
            use base64::Engine;
            let token = base64::engine::general_purpose::STANDARD.encode(format!("{}:{}", c.username, c.password));
            self.auth = Some(format!("Basic {token}"));
            return Ok(());
        }
        if !scheme.eq_ignore_ascii_case("bearer") {
            return Err(StoreError::Registry(format!(
                "{}: unsupported authentication scheme {scheme:?}",
                self.registry
            )));
        }
        let params = challenge_params(params);
        let realm = params
            .get("realm")
            .ok_or_else(|| StoreError::Registry(format!("{}: bearer challenge without a realm", self.registry)))?;
        let mut query: Vec<(&str, &str)> = Vec::new();
        for key in ["service", "scope"] {
            if let Some(value) = params.get(key) {
                query.push((key, value));
            }
        }
        let mut request = self.client.get(realm).query(&query);
        if let Some(c) = &self.credentials {
            request = request.basic_auth(&c.username, Some(&c.password));
        }
        let response = request.send().await.map_err(|e| net(&self.registry, e))?;
        if response.status() == reqwest::StatusCode::UNAUTHORIZED {
            return Err(if self.credentials.is_some() {
                StoreError::Registry(format!("{}: the credentials were refused", self.registry))
            } else {
                missing()
            });
        }
        let body: serde_json::Value =
            check(response, &self.registry).await?.json().await.map_err(|e| net(&self.registry, e))?;
        let token = body.get("token").or_else(|| body.get("access_token")).and_then(|t| t.as_str());
        let token =
            token.ok_or_else(|| StoreError::Registry(format!("{}: the token service sent no token", self.registry)))?;
        self.auth = Some(format!("Bearer {token}"));
        Ok(())
    }

    async fn document(&mut self, reference: &str) -> Result<(Vec<u8>, Document), StoreError> {
        let url = format!("{}/manifests/{reference}", self.base);
        let bytes = read_capped(self.get(&url, ACCEPT).await?, MAX_DOCUMENT, &self.registry).await?;
        if let Ok(digest) = Digest::parse(reference)
            && Digest::of(&bytes) != digest
        {
            return Err(StoreError::DigestMismatch {
                expected: digest.to_string(),
                actual: Digest::of(&bytes).to_string(),
            });
        }
        let doc = Document::parse(&bytes)?;
        Ok((bytes, doc))
    }
}

async fn check(response: reqwest::Response, registry: &str) -> Result<reqwest::Response, StoreError> {
    let status = response.status();
    if status.is_success() {
        return Ok(response);
    }
    let what = match status.as_u16() {
        401 | 403 => "access denied (wrong or missing credentials)",
        404 => "not found (check the repository and tag)",
        _ => "request failed",
    };
    Err(StoreError::Registry(format!("{registry}: {what} (HTTP {status})")))
}

async fn read_capped(response: reqwest::Response, max: u64, registry: &str) -> Result<Vec<u8>, StoreError> {
    let mut out = Vec::new();
    let mut stream = response.bytes_stream();
    while let Some(chunk) = stream.next().await {
        out.extend_from_slice(&chunk.map_err(|e| net(registry, e))?);
        if out.len() as u64 > max {
            return Err(StoreError::TooLarge(format!("a registry document is larger than {max} bytes")));
        }
    }
    Ok(out)
}

/// `key="value", key2="value2"` of a challenge.
fn challenge_params(text: &str) -> HashMap<String, String> {
    let mut out = HashMap::new();
    let mut rest = text.trim();
    while let Some((key, after)) = rest.split_once('=') {
        let key = key.trim().trim_start_matches(',').trim().to_ascii_lowercase();
        let (value, next) = match after.strip_prefix('"') {
            Some(quoted) => quoted.split_once('"').unwrap_or((quoted, "")),
            None => after.split_once(',').unwrap_or((after, "")),
        };
        out.insert(key, value.to_owned());
        rest = next.trim_start_matches(',').trim();
    }
    out
}

/// Downloads in flight in this process, by layer digest (a second pull of the layer waits, then
/// finds it stored).
static DOWNLOADS: LazyLock<Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>> = LazyLock::new(Default::default);

/// Pulls `reference` into the store as template `name`.
pub async fn pull(
    store: &Store,
    name: &str,
    reference: &str,
    options: &PullOptions,
) -> Result<TemplateRecord, StoreError> {
    store.check_name(name)?;
    let image = fetch(store, reference, options).await?;
    let (store2, name2, label) = (store.clone(), name.to_owned(), format!("pull:{reference}"));
    tokio::task::spawn_blocking(move || {
        let _lock = store2.lock()?;
        store2.commit_template(&name2, image.layers, image.config, label)
    })
    .await
    .map_err(|e| StoreError::Extract(format!("commit task: {e}")))?
}

/// An image's layers, stored, and its config (not registered as a template).
#[derive(Debug, Clone)]
pub struct FetchedImage {
    pub layers: Vec<Digest>,
    pub config: RunConfig,
    /// The digest of the image's config blob (what identifies the image's content).
    pub config_digest: Digest,
}

/// Downloads `reference`'s layers into the store (those not stored yet) and reads its config.
pub async fn fetch(store: &Store, reference: &str, options: &PullOptions) -> Result<FetchedImage, StoreError> {
    let parsed = Reference::parse(reference)?;
    let client = reqwest::Client::builder()
        .user_agent(concat!("sandbox-mcp/", env!("CARGO_PKG_VERSION")))
        .connect_timeout(std::time::Duration::from_secs(15))
        .build()
        .map_err(|e| net(&parsed.registry, e))?;
    let mut session = Session {
        client,
        base: parsed.base_url(&options.insecure_registries),
        registry: parsed.registry.clone(),
        credentials: options.credentials.clone(),
        auth: None,
    };
    let (_, mut doc) = session.document(&parsed.reference).await?;
    for _ in 0..3 {
        if !doc.is_index() {
            break;
        }
        let digest = Digest::parse(&pick_manifest(&doc)?.digest)?;
        doc = session.document(digest.as_str()).await?.1;
    }
    let config_desc = doc.config.clone().ok_or_else(|| StoreError::BadImage("the manifest has no config".into()))?;
    let config_digest = Digest::parse(&config_desc.digest)?;
    let url = format!("{}/blobs/{config_digest}", session.base);
    let config_bytes = read_capped(session.get(&url, "*/*").await?, MAX_DOCUMENT, &parsed.registry).await?;
    if Digest::of(&config_bytes) != config_digest {
        return Err(StoreError::DigestMismatch {
            expected: config_digest.to_string(),
            actual: Digest::of(&config_bytes).to_string(),
        });
    }
    let config = ImageConfig::parse(&config_bytes)?;
    let mut layers = Vec::new();
    for (i, layer) in doc.layers.iter().enumerate() {
        let digest = Digest::parse(&layer.digest)?;
        let gate = crate::sync::lock(&DOWNLOADS).entry(digest.to_string()).or_default().clone();
        let _turn = gate.lock().await;
        if store.layout.layer_meta(&digest).is_none() {
            let remaining = store.limit_bytes().saturating_sub(store.usage_bytes());
            if layer.size > remaining {
                return Err(StoreError::LimitReached {
                    limit_mb: store.limit_bytes() >> 20,
                    used_mb: store.usage_bytes() >> 20,
                });
            }
            let response = session.get(&format!("{}/blobs/{digest}", session.base), "*/*").await?;
            stream_layer(
                store,
                response,
                &digest,
                config.diff_id(i),
                remaining.min(layer_cap(layer.size)),
                &parsed.registry,
            )
            .await?;
        }
        tracing::info!(layer = %digest, "layer ready");
        layers.push(digest);
    }
    Ok(FetchedImage { layers, config: config.run_config(), config_digest })
}

/// The most a layer announced as `size` bytes may send (any size when the manifest says 0).
fn layer_cap(size: u64) -> u64 {
    if size > 0 { size } else { u64::MAX }
}

/// Downloads one layer blob and extracts it as it arrives (the decompression and the extraction
/// on two threads beside the download), verifies it, and stores it under the store's lock.
async fn stream_layer(
    store: &Store,
    response: reqwest::Response,
    digest: &Digest,
    diff_id: Option<Digest>,
    max_bytes: u64,
    registry: &str,
) -> Result<(), StoreError> {
    let (chunks, mut received_chunks) = tokio::sync::mpsc::channel::<std::io::Result<bytes::Bytes>>(32);
    let (store2, digest2) = (store.clone(), digest.clone());
    let extractor = tokio::task::spawn_blocking(move || {
        let blob = super::pipeline::ChunkReader::new(move || received_chunks.blocking_recv());
        store2.extract_layer(blob, Some(&digest2), diff_id.as_ref())
    });
    let mut stream = response.bytes_stream();
    let mut received = 0u64;
    let mut download = Ok(());
    while let Some(chunk) = stream.next().await {
        let chunk = match chunk {
            Ok(chunk) => chunk,
            Err(e) => {
                let why = with_causes(e.without_url());
                download = Err(StoreError::Registry(format!("{registry}: downloading layer {digest}: {why}")));
                break;
            }
        };
        received += chunk.len() as u64;
        if received > max_bytes {
            download = Err(StoreError::TooLarge(format!("layer {digest} is larger than announced or allowed")));
            break;
        }
        if chunks.send(Ok(chunk)).await.is_err() {
            break; // the extractor stopped: its error says why
        }
    }
    if download.is_err() {
        // The extractor must not take a cut stream for a whole one.
        let _ = chunks.send(Err(std::io::Error::other("the download failed"))).await;
    }
    drop(chunks);
    let extracted = extractor.await.map_err(|e| StoreError::Extract(format!("layer task: {e}")));
    // A download error explains a broken stream better than the extractor's view of it.
    download?;
    let prepared = extracted??;
    let store2 = store.clone();
    tokio::task::spawn_blocking(move || {
        let _lock = store2.lock()?;
        store2.commit_layer(prepared)
    })
    .await
    .map_err(|e| StoreError::Extract(format!("layer task: {e}")))??;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_and_challenges_parse() {
        let r = Reference::parse("debian:bookworm").unwrap();
        assert_eq!(
            (r.registry.as_str(), r.repository.as_str(), r.reference.as_str()),
            ("docker.io", "library/debian", "bookworm")
        );
        let r = Reference::parse("127.0.0.1:5000/team/img").unwrap();
        assert_eq!((r.registry.as_str(), r.reference.as_str()), ("127.0.0.1:5000", "latest"));
        assert!(r.base_url(&[]).starts_with("http://127.0.0.1:5000/v2/team/img"));
        let r = Reference::parse("ghcr.io/o/i:1").unwrap();
        assert!(r.base_url(&[]).starts_with("https://ghcr.io/"));
        assert!(r.base_url(&["ghcr.io".into()]).starts_with("http://"));
        assert!(Reference::parse("Bad/Upper").is_err());
        let p = challenge_params(
            r#"realm="https://auth.docker.io/token",service="registry.docker.io",scope="repository:library/debian:pull""#,
        );
        assert_eq!(p["realm"], "https://auth.docker.io/token");
        assert_eq!(p["scope"], "repository:library/debian:pull");
        let c = Credentials { username: "u".into(), password: "hunter2".into() };
        assert!(!format!("{c:?}").contains("hunter2"));
    }
}
