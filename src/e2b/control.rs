//! Control-plane client: create, connect, kill, timeout, info, list, pause
//! and fork sandboxes, take, list and delete their snapshots, list templates
//! (`X-API-Key` auth, `/v2` paths, the SDK's status semantics), and the
//! factory for per-sandbox [`EnvdClient`]s.

use std::sync::Arc;
use std::time::Duration;

use reqwest::header::{CONTENT_TYPE, HeaderValue};
use reqwest::{Method, RequestBuilder, StatusCode};

use super::ProviderEndpoint;
use super::envd::EnvdClient;
use super::error::E2bError;
use super::transport::{self, CallCtx, Plane, RetryPolicy};
use super::wire::{self, ENVD_PORT, HEADER_API_KEY, HEADER_NEXT_TOKEN};

/// Domains where the SDK reaches envd through `https://sandbox.<domain>` (SDK `sandbox_domains.py`).
const CLOUD_SANDBOX_DOMAINS: &[&str] =
    &["e2b.app", "e2b.dev", "e2b.pro", "e2b-staging.dev", "e2b-tango.dev", "e2b-juliett.dev", "foxtrot-2.e2b.dev"];
/// Page size used by [`E2bClient::list_all_sandboxes`].
const LIST_PAGE_SIZE: u32 = 100;
/// Upper bound on pages followed by [`E2bClient::list_all_sandboxes`].
const MAX_LIST_PAGES: usize = 1000;
/// `User-Agent` of every request.
const USER_AGENT: &str = concat!("sandbox-mcp/", env!("CARGO_PKG_VERSION"));

/// Client of one E2B-compatible provider. Cheap to clone (shared connection pool).
#[derive(Clone)]
pub struct E2bClient {
    inner: Arc<Inner>,
}

struct Inner {
    http: reqwest::Client,
    endpoint: ProviderEndpoint,
    api_key: Option<HeaderValue>,
}

impl std::fmt::Debug for E2bClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("E2bClient").field("endpoint", &self.inner.endpoint).finish()
    }
}

/// How long an idle connection to a provider on this machine stays in the pool: less than the
/// shortest idle limit its listener may have (`server.header_read_timeout_secs` and
/// `server.idle_timeout_secs`, at least 1 s), so the gateway never reuses a connection the provider
/// is closing at that very moment, which resets the call (seen once in about 640,000 calls).
/// Opening a loopback connection costs far less than a call.
const LOOPBACK_POOL_IDLE: Duration = Duration::from_millis(500);
// Below the shortest listener limit the configuration accepts (1 s) and the defaults.
const _: () = assert!(
    LOOPBACK_POOL_IDLE.as_millis() < 1000
        && LOOPBACK_POOL_IDLE.as_secs() < crate::listen::DEFAULT_HEADER_READ_TIMEOUT_SECS
        && LOOPBACK_POOL_IDLE.as_secs() < crate::listen::DEFAULT_IDLE_TIMEOUT_SECS
);
/// The same for a remote provider, whose limits are unknown: long enough to spare TLS handshakes
/// between an agent's calls.
const REMOTE_POOL_IDLE: Duration = Duration::from_secs(90);

fn is_loopback(url: &url::Url) -> bool {
    match url.host() {
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        Some(url::Host::Domain(name)) => name == "localhost",
        None => false,
    }
}

fn config_error(detail: impl Into<String>) -> E2bError {
    E2bError::Config { op: "configure_client", sandbox_id: None, detail: detail.into() }
}

impl E2bClient {
    /// Builds the client (one connection pool for control plane and envd).
    pub fn new(endpoint: ProviderEndpoint) -> Result<Self, E2bError> {
        let mut urls = vec![&endpoint.api_url];
        urls.extend(endpoint.sandbox_url.as_ref());
        for url in &urls {
            if !matches!(url.scheme(), "http" | "https") || url.host().is_none() {
                return Err(config_error(format!("provider URL {url} must be an http(s) URL with a host")));
            }
        }
        if endpoint.sandbox_url.is_none() && endpoint.domain.trim().is_empty() {
            return Err(config_error("a sandbox domain is required when no sandbox URL is set"));
        }
        let api_key = match &endpoint.api_key {
            Some(key) => {
                let mut value = HeaderValue::from_str(key.trim())
                    .map_err(|_| config_error("the API key contains characters not allowed in an HTTP header"))?;
                value.set_sensitive(true);
                Some(value)
            }
            None => None,
        };
        let loopback = urls.iter().all(|u| is_loopback(u));
        let mut builder = reqwest::Client::builder()
            .user_agent(USER_AGENT)
            .pool_idle_timeout(if loopback { LOOPBACK_POOL_IDLE } else { REMOTE_POOL_IDLE })
            .pool_max_idle_per_host(64)
            .tcp_nodelay(true)
            .tcp_keepalive(Duration::from_secs(30));
        if !endpoint.request_timeout.is_zero() {
            builder = builder.connect_timeout(endpoint.request_timeout.min(Duration::from_secs(10)));
        }
        if loopback {
            builder = builder.no_proxy();
        }
        if urls.iter().all(|u| u.scheme() == "http") {
            builder = builder.http1_only();
        }
        let http = builder.build().map_err(|e| config_error(format!("cannot build the HTTP client: {e}")))?;
        Ok(Self { inner: Arc::new(Inner { http, endpoint, api_key }) })
    }

    /// The endpoint this client talks to.
    pub fn endpoint(&self) -> &ProviderEndpoint {
        &self.inner.endpoint
    }

    fn timeout(&self) -> Option<Duration> {
        let t = self.inner.endpoint.request_timeout;
        (!t.is_zero()).then_some(t)
    }

    fn ctx<'a>(&self, op: &'static str, sandbox_id: Option<&'a str>, retry: RetryPolicy) -> CallCtx<'a> {
        CallCtx { op, sandbox_id, plane: Plane::Control, retry, timeout: self.timeout() }
    }

    fn url(&self, segments: &[&str]) -> url::Url {
        let mut url = self.inner.endpoint.api_url.clone();
        if let Ok(mut path) = url.path_segments_mut() {
            path.pop_if_empty().extend(segments);
        }
        url
    }

    fn request(&self, method: Method, url: url::Url) -> RequestBuilder {
        let mut request = self.inner.http.request(method, url);
        if let Some(key) = &self.inner.api_key {
            request = request.header(HEADER_API_KEY, key.clone());
        }
        request
    }

    fn json_request<B: serde::Serialize>(&self, method: Method, url: url::Url, body: &B) -> RequestBuilder {
        // Serializing our own wire structs cannot fail.
        let body = serde_json::to_vec(body).unwrap_or_else(|_| b"{}".to_vec());
        self.request(method, url).header(CONTENT_TYPE, "application/json").body(body)
    }

    /// `GET {api_url}/health`: any 2xx is healthy.
    pub async fn health(&self) -> Result<(), E2bError> {
        let ctx = self.ctx("health", None, RetryPolicy::Idempotent);
        let url = self.url(&["health"]);
        let response = transport::send(&ctx, || self.request(Method::GET, url.clone())).await?;
        transport::expect_success(&ctx, response).await
    }

    /// `POST /v2/sandboxes`; returns once the sandbox is ready. Never retried.
    pub async fn create_sandbox(&self, req: &wire::NewSandbox) -> Result<wire::Sandbox, E2bError> {
        let ctx = self.ctx("create_sandbox", None, RetryPolicy::Never);
        let url = self.url(&["v2", "sandboxes"]);
        let response = transport::send(&ctx, || self.json_request(Method::POST, url.clone(), req)).await?;
        if response.status() == StatusCode::OK {
            tracing::debug!("provider answered create with 200 instead of 201; accepting it");
        }
        let sandbox: wire::Sandbox = transport::read_json(&ctx, response).await?;
        if sandbox.sandbox_id.is_empty() {
            return Err(ctx.protocol("create response has an empty sandboxID"));
        }
        Ok(sandbox)
    }

    /// `POST /v2/sandboxes/{id}/connect` (resumes a paused sandbox; 200 or 201).
    /// `timeout_secs` resets the sandbox's deadline; `None` leaves it alone.
    pub async fn connect_sandbox(&self, id: &str, timeout_secs: Option<u64>) -> Result<wire::Sandbox, E2bError> {
        let ctx = self.ctx("connect_sandbox", Some(id), RetryPolicy::Idempotent);
        let url = self.url(&["v2", "sandboxes", id, "connect"]);
        let body = wire::ConnectSandbox { timeout: timeout_secs, memory: None };
        let response = transport::send(&ctx, || self.json_request(Method::POST, url.clone(), &body)).await?;
        let mut sandbox: wire::Sandbox = transport::read_json(&ctx, response).await?;
        if sandbox.sandbox_id.is_empty() {
            sandbox.sandbox_id = id.to_owned();
        }
        Ok(sandbox)
    }

    /// `DELETE /sandboxes/{id}`: `true` if killed, `false` if it did not exist.
    pub async fn kill_sandbox(&self, id: &str) -> Result<bool, E2bError> {
        let ctx = self.ctx("kill_sandbox", Some(id), RetryPolicy::Idempotent);
        let url = self.url(&["sandboxes", id]);
        let response = transport::send(&ctx, || self.request(Method::DELETE, url.clone())).await?;
        if response.status() == StatusCode::NOT_FOUND {
            return Ok(false);
        }
        transport::expect_success(&ctx, response).await.map(|()| true)
    }

    /// `POST /sandboxes/{id}/timeout`: the sandbox dies `timeout_secs` from now.
    /// `PUT /sandboxes/{id}/network`: replaces the sandbox's egress rules (fields left out are
    /// cleared). Idempotent, so retried like the other idempotent calls.
    pub async fn update_network(&self, id: &str, update: &wire::NetworkUpdate) -> Result<(), E2bError> {
        let ctx = self.ctx("update_network", Some(id), RetryPolicy::Idempotent);
        let url = self.url(&["sandboxes", id, "network"]);
        let response = transport::send(&ctx, || self.json_request(Method::PUT, url.clone(), update)).await?;
        transport::expect_success(&ctx, response).await
    }

    pub async fn set_timeout(&self, id: &str, timeout_secs: u64) -> Result<(), E2bError> {
        let ctx = self.ctx("set_timeout", Some(id), RetryPolicy::Idempotent);
        let url = self.url(&["sandboxes", id, "timeout"]);
        let body = wire::SetTimeout { timeout: timeout_secs };
        let response = transport::send(&ctx, || self.json_request(Method::POST, url.clone(), &body)).await?;
        transport::expect_success(&ctx, response).await
    }

    /// `GET /sandboxes/{id}`.
    pub async fn get_sandbox(&self, id: &str) -> Result<wire::SandboxDetail, E2bError> {
        let ctx = self.ctx("get_sandbox", Some(id), RetryPolicy::Idempotent);
        let url = self.url(&["sandboxes", id]);
        let response = transport::send(&ctx, || self.request(Method::GET, url.clone())).await?;
        transport::read_json(&ctx, response).await
    }

    /// One page of `GET /v2/sandboxes`; the second value is the next page's token.
    pub async fn list_sandboxes(
        &self,
        q: &wire::ListQuery,
    ) -> Result<(Vec<wire::SandboxDetail>, Option<String>), E2bError> {
        let ctx = self.ctx("list_sandboxes", None, RetryPolicy::Idempotent);
        let url = self.url(&["v2", "sandboxes"]);
        let mut params: Vec<(&str, String)> = Vec::new();
        if !q.metadata.is_empty() {
            params.push(("metadata", encode_metadata_filter(&q.metadata)));
        }
        let states = if q.states.is_empty() {
            "running,paused".to_owned()
        } else {
            q.states.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(",")
        };
        params.push(("state", states));
        if let Some(limit) = q.limit {
            params.push(("limit", limit.to_string()));
        }
        if let Some(token) = &q.next_token {
            params.push(("nextToken", token.clone()));
        }
        let response = transport::send(&ctx, || self.request(Method::GET, url.clone()).query(&params)).await?;
        let next = next_token(&response);
        let items: Vec<wire::SandboxDetail> = transport::read_json(&ctx, response).await?;
        Ok((items, next))
    }

    /// Every running or paused sandbox whose metadata contains all `metadata` pairs (follows pages).
    pub async fn list_all_sandboxes(
        &self,
        metadata: &[(String, String)],
    ) -> Result<Vec<wire::SandboxDetail>, E2bError> {
        let query = wire::ListQuery { metadata: metadata.to_vec(), limit: Some(LIST_PAGE_SIZE), ..Default::default() };
        self.all_pages("list_sandboxes", "sandboxes", |next_token| {
            let page = wire::ListQuery { next_token, ..query.clone() };
            async move { self.list_sandboxes(&page).await }
        })
        .await
    }

    /// Every item of a paged list: `page` is called with each next-page token (`None` first) until
    /// the provider sends none; at most [`MAX_LIST_PAGES`] pages, and a token sent twice in a row
    /// is a protocol error (a provider that would page forever).
    async fn all_pages<T, Page>(
        &self,
        op: &'static str,
        what: &str,
        mut page: impl FnMut(Option<String>) -> Page,
    ) -> Result<Vec<T>, E2bError>
    where
        Page: std::future::Future<Output = Result<(Vec<T>, Option<String>), E2bError>>,
    {
        let mut token: Option<String> = None;
        let mut all = Vec::new();
        for _ in 0..MAX_LIST_PAGES {
            let (items, next) = page(token.clone()).await?;
            all.extend(items);
            match next {
                Some(next) if token.as_deref() == Some(next.as_str()) => {
                    let ctx = self.ctx(op, None, RetryPolicy::Never);
                    return Err(ctx.protocol("the provider returned the same next-page token twice"));
                }
                Some(next) => token = Some(next),
                None => return Ok(all),
            }
        }
        let ctx = self.ctx(op, None, RetryPolicy::Never);
        Err(ctx.protocol(format!("more than {MAX_LIST_PAGES} pages of {what}")))
    }

    /// `GET /templates`: the templates sandboxes can be created from (E2B: the team's).
    pub async fn list_templates(&self) -> Result<Vec<wire::Template>, E2bError> {
        let ctx = self.ctx("list_templates", None, RetryPolicy::Idempotent);
        let url = self.url(&["templates"]);
        let response = transport::send(&ctx, || self.request(Method::GET, url.clone())).await?;
        transport::read_json(&ctx, response).await
    }

    /// `POST /sandboxes/{id}/pause`: `true` if paused now, `false` if it already was (409).
    pub async fn pause_sandbox(&self, id: &str) -> Result<bool, E2bError> {
        let ctx = self.ctx("pause_sandbox", Some(id), RetryPolicy::ConnectErrors);
        let url = self.url(&["sandboxes", id, "pause"]);
        let body = serde_json::json!({});
        let response = transport::send(&ctx, || self.json_request(Method::POST, url.clone(), &body)).await?;
        if response.status() == StatusCode::CONFLICT {
            return Ok(false);
        }
        transport::expect_success(&ctx, response).await.map(|()| true)
    }

    /// `POST /sandboxes/{id}/snapshots` (201): a snapshot of the sandbox, usable as a create's
    /// `templateID`. Sent at most once unless the connection could not be made (a repeated named
    /// snapshot would be refused as existing).
    pub async fn create_snapshot(&self, id: &str, req: &wire::NewSnapshot) -> Result<wire::SnapshotInfo, E2bError> {
        let ctx = self.ctx("create_snapshot", Some(id), RetryPolicy::ConnectErrors);
        let url = self.url(&["sandboxes", id, "snapshots"]);
        let response = transport::send(&ctx, || self.json_request(Method::POST, url.clone(), req)).await?;
        let snapshot: wire::SnapshotInfo = transport::read_json(&ctx, response).await?;
        if snapshot.snapshot_id.is_empty() {
            return Err(ctx.protocol("snapshot response has an empty snapshotID"));
        }
        Ok(snapshot)
    }

    /// One page of `GET /snapshots`; the second value is the next page's token.
    pub async fn list_snapshots(
        &self,
        q: &wire::SnapshotQuery,
    ) -> Result<(Vec<wire::SnapshotInfo>, Option<String>), E2bError> {
        let ctx = self.ctx("list_snapshots", None, RetryPolicy::Idempotent);
        let url = self.url(&["snapshots"]);
        let mut params: Vec<(&str, String)> = Vec::new();
        if let Some(sandbox_id) = &q.sandbox_id {
            params.push(("sandboxID", sandbox_id.clone()));
        }
        if let Some(name) = &q.name {
            params.push(("name", name.clone()));
        }
        if let Some(limit) = q.limit {
            params.push(("limit", limit.to_string()));
        }
        if let Some(token) = &q.next_token {
            params.push(("nextToken", token.clone()));
        }
        let response = transport::send(&ctx, || self.request(Method::GET, url.clone()).query(&params)).await?;
        let next = next_token(&response);
        let items: Vec<wire::SnapshotInfo> = transport::read_json(&ctx, response).await?;
        Ok((items, next))
    }

    /// Every snapshot matching `sandbox_id` and `name` (either may be left out; follows pages).
    pub async fn list_all_snapshots(
        &self,
        sandbox_id: Option<&str>,
        name: Option<&str>,
    ) -> Result<Vec<wire::SnapshotInfo>, E2bError> {
        let query = wire::SnapshotQuery {
            sandbox_id: sandbox_id.map(str::to_owned),
            name: name.map(str::to_owned),
            limit: Some(LIST_PAGE_SIZE),
            next_token: None,
        };
        self.all_pages("list_snapshots", "snapshots", |next_token| {
            let page = wire::SnapshotQuery { next_token, ..query.clone() };
            async move { self.list_snapshots(&page).await }
        })
        .await
    }

    /// `DELETE /templates/{snapshotID}`: `true` if deleted, `false` if it did not exist (404).
    pub async fn delete_snapshot(&self, snapshot_id: &str) -> Result<bool, E2bError> {
        let ctx = self.ctx("delete_snapshot", None, RetryPolicy::Idempotent);
        let url = self.url(&["templates", snapshot_id]);
        let response = transport::send(&ctx, || self.request(Method::DELETE, url.clone())).await?;
        if response.status() == StatusCode::NOT_FOUND {
            return Ok(false);
        }
        transport::expect_success(&ctx, response).await.map(|()| true)
    }

    /// `POST /sandboxes/{id}/fork` (201): one entry per fork, each a sandbox (as create returns
    /// it) or its own error. Never retried (each attempt makes sandboxes). An answer with another
    /// number of entries than asked for is a protocol error.
    pub async fn fork_sandbox(&self, id: &str, req: &wire::ForkSandbox) -> Result<Vec<wire::ForkEntry>, E2bError> {
        let ctx = self.ctx("fork_sandbox", Some(id), RetryPolicy::Never);
        let url = self.url(&["sandboxes", id, "fork"]);
        let response = transport::send(&ctx, || self.json_request(Method::POST, url.clone(), req)).await?;
        let entries: Vec<wire::ForkEntry> = transport::read_json(&ctx, response).await?;
        let wanted = req.count.unwrap_or(1) as usize;
        if entries.len() != wanted {
            return Err(ctx.protocol(format!("asked for {wanted} forks, the answer has {} entries", entries.len())));
        }
        for entry in &entries {
            match (&entry.sandbox, &entry.error) {
                (Some(sandbox), None) if !sandbox.sandbox_id.is_empty() => {}
                (None, Some(_)) => {}
                _ => return Err(ctx.protocol("a fork entry must hold either a sandbox with its sandboxID or an error")),
            }
        }
        Ok(entries)
    }

    /// envd client of a sandbox returned by create/connect (shares this client's pool).
    pub fn envd(&self, sandbox: &wire::Sandbox) -> EnvdClient {
        let base = self.envd_url(&sandbox.sandbox_id, sandbox.domain.as_deref());
        EnvdClient::new(
            self.inner.http.clone(),
            base,
            sandbox.sandbox_id.clone(),
            sandbox.envd_access_token.as_deref(),
            self.inner.endpoint.request_timeout,
        )
    }

    /// envd base URL of a sandbox, resolved as the SDK does: the explicit
    /// sandbox URL; else `https://sandbox.<domain>` for E2B cloud domains;
    /// else `https://49983-<id>.<domain>` (the response's domain first).
    pub fn envd_url(&self, sandbox_id: &str, domain: Option<&str>) -> String {
        let endpoint = &self.inner.endpoint;
        if let Some(url) = &endpoint.sandbox_url {
            return url.as_str().trim_end_matches('/').to_owned();
        }
        let domain = domain.map(str::trim).filter(|d| !d.is_empty()).unwrap_or(endpoint.domain.trim());
        if CLOUD_SANDBOX_DOMAINS.contains(&domain) {
            format!("https://sandbox.{domain}")
        } else {
            format!("https://{ENVD_PORT}-{sandbox_id}.{domain}")
        }
    }

    /// The `{domain}` of a sandbox's `{port}-{sandboxID}.{domain}` hosts (what the SDK's
    /// `get_host(port)` builds): the domain the provider reported for it, else the configured one
    /// when sandboxes are reached through it (no shared sandbox URL); `None` when nothing says
    /// how a sandbox's ports are reached from outside.
    pub fn sandbox_domain(&self, reported: Option<&str>) -> Option<String> {
        let endpoint = &self.inner.endpoint;
        let configured = endpoint.sandbox_url.is_none().then_some(endpoint.domain.as_str());
        let usable = |d: &&str| !d.is_empty();
        reported.map(str::trim).filter(usable).or(configured.map(str::trim).filter(usable)).map(str::to_owned)
    }
}

/// The `X-Next-Token` of a list answer: there is another page.
fn next_token(response: &reqwest::Response) -> Option<String> {
    response
        .headers()
        .get(HEADER_NEXT_TOKEN)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .map(str::to_owned)
}

/// The SDK's metadata filter value: `urlencode({quote(k): quote(v)})` (the
/// query encoder then encodes it once more).
pub(crate) fn encode_metadata_filter(pairs: &[(String, String)]) -> String {
    use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
    // Python's urllib.parse.quote: unreserved characters plus '/' stay as they are.
    const QUOTE: &AsciiSet = &NON_ALPHANUMERIC.remove(b'_').remove(b'.').remove(b'-').remove(b'~').remove(b'/');
    let mut form = url::form_urlencoded::Serializer::new(String::new());
    for (key, value) in pairs {
        form.append_pair(&utf8_percent_encode(key, QUOTE).to_string(), &utf8_percent_encode(value, QUOTE).to_string());
    }
    form.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn endpoint(sandbox_url: Option<&str>, domain: &str) -> ProviderEndpoint {
        ProviderEndpoint {
            api_url: "http://127.0.0.1:9/api".parse().unwrap(),
            sandbox_url: sandbox_url.map(|u| u.parse().unwrap()),
            domain: domain.into(),
            api_key: Some("e2b_secret_key_value".into()),
            request_timeout: Duration::from_secs(5),
        }
    }

    #[test]
    fn metadata_filter_matches_the_sdk() {
        // SDK: metadata={"a": "b c"} is sent as metadata=a%3Db%252520c.
        let value = encode_metadata_filter(&[("a".into(), "b c".into())]);
        assert_eq!(value, "a=b%2520c");
        let mut url = url::Url::parse("http://x/").unwrap();
        url.query_pairs_mut().append_pair("metadata", &value);
        assert_eq!(url.query(), Some("metadata=a%3Db%252520c"));
    }

    #[test]
    fn envd_url_resolution_follows_the_sdk() {
        let client = E2bClient::new(endpoint(Some("http://127.0.0.1:7/"), "e2b.app")).unwrap();
        assert_eq!(client.envd_url("abc", Some("other.dev")), "http://127.0.0.1:7");
        let client = E2bClient::new(endpoint(None, "e2b.app")).unwrap();
        assert_eq!(client.envd_url("abc", None), "https://sandbox.e2b.app");
        assert_eq!(client.envd_url("abc", Some("my.host")), "https://49983-abc.my.host");
        let client = E2bClient::new(endpoint(None, "self.hosted")).unwrap();
        assert_eq!(client.envd_url("abc", Some("")), "https://49983-abc.self.hosted");
        assert_eq!(client.url(&["sandboxes", "a/b"]).as_str(), "http://127.0.0.1:9/api/sandboxes/a%2Fb");
    }

    #[test]
    fn sandbox_domain_is_reported_or_derived_only_without_a_shared_url() {
        let shared = E2bClient::new(endpoint(Some("http://127.0.0.1:7/"), "e2b.app")).unwrap();
        assert_eq!(shared.sandbox_domain(None), None);
        assert_eq!(shared.sandbox_domain(Some("sandbox.test")).as_deref(), Some("sandbox.test"));
        let cloud = E2bClient::new(endpoint(None, "e2b.app")).unwrap();
        assert_eq!(cloud.sandbox_domain(None).as_deref(), Some("e2b.app"));
        assert_eq!(cloud.sandbox_domain(Some(" ")).as_deref(), Some("e2b.app"));
        assert_eq!(cloud.sandbox_domain(Some("my.host")).as_deref(), Some("my.host"));
    }

    #[test]
    fn debug_redacts_the_key() {
        let client = E2bClient::new(endpoint(None, "e2b.app")).unwrap();
        let text = format!("{client:?}");
        assert!(!text.contains("secret"), "{text}");
        assert!(text.contains("<redacted>"));
    }

    #[test]
    fn rejects_bad_config() {
        let mut bad = endpoint(None, "e2b.app");
        bad.api_url = "ftp://x".parse().unwrap();
        assert!(matches!(E2bClient::new(bad), Err(E2bError::Config { .. })));
        let mut bad = endpoint(None, "e2b.app");
        bad.api_key = Some("e2b_\nx".into());
        let err = E2bClient::new(bad).unwrap_err().to_string();
        assert!(!err.contains("e2b_"), "{err}");
    }
}
