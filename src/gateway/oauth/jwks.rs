//! The authorization server's signing keys: its JWKS, fetched once (URL from
//! config or from discovery metadata), kept in memory, refetched when a token
//! names an unknown `kid` or the cache is old, at most once per
//! `jwks_min_refresh_secs`, one fetch at a time.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use jsonwebtoken::DecodingKey;
use jsonwebtoken::jwk::{AlgorithmParameters, JwkSet, PublicKeyUse};

use super::OAuthError;
use super::config::OAuthConfig;

/// Most keys kept from one JWKS (a hostile or broken JWKS cannot fill memory).
const MAX_KEYS: usize = 64;
/// Largest JWKS / metadata document read.
const MAX_DOCUMENT_BYTES: usize = 512 * 1024;

/// One usable verification key.
pub(crate) struct Key {
    pub key: DecodingKey,
}

#[derive(Default)]
struct Snapshot {
    /// kid -> key ("" for a key without kid).
    keys: HashMap<String, Arc<Key>>,
    fetched_at: Option<Instant>,
}

/// The JWKS cache.
pub(crate) struct JwksCache {
    issuer: String,
    configured_uri: String,
    http: reqwest::Client,
    cache_for: Duration,
    min_refresh: Duration,
    snapshot: RwLock<Snapshot>,
    /// Serializes fetches; holds the discovered JWKS URL and when the last fetch was tried.
    fetch: tokio::sync::Mutex<FetchState>,
}

#[derive(Default)]
struct FetchState {
    jwks_uri: Option<String>,
    last_attempt: Option<Instant>,
    last_error: Option<FetchError>,
}

impl JwksCache {
    pub(crate) fn new(config: &OAuthConfig, http: reqwest::Client) -> Self {
        Self {
            issuer: config.issuer.clone(),
            configured_uri: config.jwks_uri.clone(),
            http,
            cache_for: Duration::from_secs(config.jwks_cache_secs),
            min_refresh: Duration::from_secs(config.jwks_min_refresh_secs),
            snapshot: RwLock::default(),
            fetch: tokio::sync::Mutex::default(),
        }
    }

    fn cached(&self, kid: &str) -> (Option<Arc<Key>>, bool) {
        let Ok(snapshot) = self.snapshot.read() else { return (None, true) };
        let fresh = snapshot.fetched_at.is_some_and(|t| t.elapsed() < self.cache_for);
        let key = match kid {
            "" if snapshot.keys.len() == 1 => snapshot.keys.values().next().cloned(),
            _ => snapshot.keys.get(kid).cloned(),
        };
        (key, fresh)
    }

    /// The key for `kid` ("" when the token names none): cached, else after a (rate-limited) refetch.
    pub(crate) async fn key(&self, kid: &str) -> Result<Arc<Key>, OAuthError> {
        let (key, fresh) = self.cached(kid);
        if let Some(key) = &key
            && fresh
        {
            return Ok(Arc::clone(key));
        }
        let mut fetch = self.fetch.lock().await;
        // Another request may have refreshed while we waited.
        let (again, fresh_now) = self.cached(kid);
        if let Some(key) = &again
            && fresh_now
        {
            return Ok(Arc::clone(key));
        }
        let throttled = fetch.last_attempt.is_some_and(|t| t.elapsed() < self.min_refresh);
        if !throttled {
            fetch.last_attempt = Some(Instant::now());
            match self.refresh(&mut fetch).await {
                Ok(()) => fetch.last_error = None,
                Err(err) => {
                    tracing::warn!(error = %err, "cannot fetch the authorization server's signing keys (JWKS)");
                    fetch.last_error = Some(err);
                }
            }
        }
        if let (Some(key), _) = self.cached(kid) {
            return Ok(key);
        }
        if let (Some(stale), Some(_)) = (key, &fetch.last_error) {
            return Ok(stale); // a cached key still verifies while the IdP is unreachable
        }
        match &fetch.last_error {
            Some(err) => Err(OAuthError::Unavailable(format!(
                "the identity provider is unreachable (cannot fetch its signing keys: {err}); try again in a few seconds"
            ))),
            None => Err(OAuthError::Invalid("the token's signing key (kid) is not published by the issuer".into())),
        }
    }

    async fn refresh(&self, fetch: &mut FetchState) -> Result<(), FetchError> {
        let uri = match (&fetch.jwks_uri, self.configured_uri.is_empty()) {
            (_, false) => self.configured_uri.clone(),
            (Some(uri), true) => uri.clone(),
            (None, true) => {
                let uri = discover_jwks_uri(&self.http, &self.issuer).await?;
                fetch.jwks_uri = Some(uri.clone());
                uri
            }
        };
        let set: JwkSet = get_json(&self.http, &uri).await?;
        let mut keys = HashMap::new();
        for jwk in set.keys.iter().take(MAX_KEYS) {
            if matches!(jwk.common.public_key_use, Some(PublicKeyUse::Encryption))
                || matches!(jwk.algorithm, AlgorithmParameters::OctetKey(_))
            {
                continue; // encryption keys and symmetric secrets never verify access tokens
            }
            match DecodingKey::from_jwk(jwk) {
                Ok(key) => {
                    keys.insert(jwk.common.key_id.clone().unwrap_or_default(), Arc::new(Key { key }));
                }
                Err(err) => tracing::debug!(kid = ?jwk.common.key_id, error = %err, "skipping an unusable JWKS key"),
            }
        }
        tracing::info!(jwks_uri = %uri, keys = keys.len(), "fetched the authorization server's signing keys");
        if let Ok(mut snapshot) = self.snapshot.write() {
            *snapshot = Snapshot { keys, fetched_at: Some(Instant::now()) };
        }
        Ok(())
    }
}

/// The JWKS URL from the issuer's RFC 8414 metadata, else its OpenID Connect discovery document.
async fn discover_jwks_uri(http: &reqwest::Client, issuer: &str) -> Result<String, FetchError> {
    let mut errors = Vec::new();
    for url in metadata_urls(issuer) {
        match get_json::<serde_json::Value>(http, &url).await {
            Ok(doc) => {
                if doc.get("issuer").and_then(|v| v.as_str()) != Some(issuer) {
                    errors.push(format!("{url}: its issuer is not {issuer}"));
                    continue;
                }
                if let Some(uri) = doc.get("jwks_uri").and_then(|v| v.as_str()) {
                    return Ok(uri.to_string());
                }
                errors.push(format!("{url}: no jwks_uri"));
            }
            Err(err) => errors.push(err.to_string()),
        }
    }
    Err(FetchError::Discovery { tried: errors.join("; ") })
}

/// RFC 8414 (well-known inserted before the issuer's path) then OIDC (appended).
pub(crate) fn metadata_urls(issuer: &str) -> Vec<String> {
    let trimmed = issuer.trim_end_matches('/');
    let mut urls = Vec::new();
    if let Ok(url) = url::Url::parse(trimmed) {
        let path = url.path().trim_end_matches('/');
        let origin = url.origin().ascii_serialization();
        urls.push(format!("{origin}/.well-known/oauth-authorization-server{path}"));
    }
    urls.push(format!("{trimmed}/.well-known/openid-configuration"));
    urls
}

/// GETs a JSON document (bounded size) with the client's timeout.
pub(crate) async fn get_json<T: serde::de::DeserializeOwned>(
    http: &reqwest::Client,
    url: &str,
) -> Result<T, FetchError> {
    let failed = |e: reqwest::Error| FetchError::Request { url: url.to_string(), kind: without_url(&e) };
    let response = http.get(url).send().await.map_err(failed)?;
    let status = response.status();
    if !status.is_success() {
        return Err(FetchError::Status { url: url.to_string(), status });
    }
    let body = response.bytes().await.map_err(failed)?;
    if body.len() > MAX_DOCUMENT_BYTES {
        return Err(FetchError::TooLarge { url: url.to_string() });
    }
    serde_json::from_slice(&body).map_err(|source| FetchError::NotJson { url: url.to_string(), source })
}

/// Why a document of the authorization server (metadata, JWKS) could not be had.
#[derive(Debug, thiserror::Error)]
pub(crate) enum FetchError {
    #[error("GET {url}: {kind}")]
    Request { url: String, kind: String },
    #[error("GET {url}: HTTP {status}")]
    Status { url: String, status: reqwest::StatusCode },
    #[error("GET {url}: document larger than {MAX_DOCUMENT_BYTES} bytes")]
    TooLarge { url: String },
    #[error("GET {url}: not the expected JSON ({source})")]
    NotJson { url: String, source: serde_json::Error },
    #[error("discovery failed ({tried}); set auth.oauth.jwks_uri")]
    Discovery { tried: String },
}

/// A reqwest error without the URL (callers already name it).
pub(crate) fn without_url(err: &reqwest::Error) -> String {
    let kind = if err.is_timeout() {
        "timed out"
    } else if err.is_connect() {
        "connection failed"
    } else {
        "request failed"
    };
    kind.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A JWKS endpoint that counts its fetches (what a real IdP cannot report).
    async fn counting_jwks() -> (String, Arc<AtomicUsize>) {
        let hits = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&hits);
        let app = axum::Router::new().route(
            "/jwks",
            axum::routing::get(move || {
                counter.fetch_add(1, Ordering::SeqCst);
                std::future::ready(r#"{"keys":[]}"#)
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/jwks", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        (url, hits)
    }

    fn cache(jwks_uri: &str) -> JwksCache {
        let config = OAuthConfig {
            issuer: "http://127.0.0.1:1".into(),
            jwks_uri: jwks_uri.into(),
            jwks_min_refresh_secs: 60,
            ..OAuthConfig::default()
        };
        JwksCache::new(&config, reqwest::Client::new())
    }

    #[tokio::test]
    async fn unknown_kids_cannot_hammer_the_idp() {
        let (url, hits) = counting_jwks().await;
        let cache = cache(&url);
        for i in 0..20 {
            let err = cache.key(&format!("kid-{i}")).await.err();
            assert!(matches!(err, Some(OAuthError::Invalid(_))), "{err:?}");
        }
        assert_eq!(hits.load(Ordering::SeqCst), 1, "one fetch per jwks_min_refresh_secs");
    }

    #[tokio::test]
    async fn unreachable_idp_is_unavailable_not_invalid() {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let cache = cache(&format!("http://127.0.0.1:{port}/jwks"));
        let err = cache.key("kid").await.err();
        assert!(matches!(&err, Some(OAuthError::Unavailable(m)) if m.contains("unreachable")), "{err:?}");
    }

    #[test]
    fn discovery_urls_follow_rfc8414_then_oidc() {
        assert_eq!(
            metadata_urls("https://kc.example.com/realms/dev"),
            vec![
                "https://kc.example.com/.well-known/oauth-authorization-server/realms/dev",
                "https://kc.example.com/realms/dev/.well-known/openid-configuration"
            ]
        );
        assert_eq!(
            metadata_urls("https://tenant.auth0.com/"),
            vec![
                "https://tenant.auth0.com/.well-known/oauth-authorization-server",
                "https://tenant.auth0.com/.well-known/openid-configuration"
            ]
        );
    }
}
