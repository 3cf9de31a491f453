//! Opaque access tokens: RFC 7662 introspection at the authorization server
//! (client authenticated with HTTP Basic), with a short cache keyed by the
//! token's SHA-256 (the token itself is never stored or logged).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use super::OAuthError;
use super::config::{OAuthConfig, OAuthConfigError};
use super::jwks::without_url;

/// Most cached introspection answers (expired ones are purged first, then everything).
const MAX_CACHED: usize = 10_000;

/// The introspection client.
pub(crate) struct Introspector {
    endpoint: String,
    client_id: String,
    client_secret: String,
    http: reqwest::Client,
    cache_for: Duration,
    cache: Mutex<HashMap<[u8; 32], CachedAnswer>>,
}

/// Valid until, claims.
type CachedAnswer = (Instant, Map<String, Value>);

impl Introspector {
    /// None when no introspection endpoint is configured.
    pub(crate) fn new(config: &OAuthConfig, http: reqwest::Client) -> Result<Option<Self>, OAuthConfigError> {
        if config.introspection_endpoint.is_empty() {
            return Ok(None);
        }
        let env = &config.introspection_client_secret_env;
        let client_secret =
            std::env::var(env).map_err(|_| OAuthConfigError::MissingClientSecret { env: env.clone() })?;
        Ok(Some(Self {
            endpoint: config.introspection_endpoint.clone(),
            client_id: config.introspection_client_id.clone(),
            client_secret,
            http,
            cache_for: Duration::from_secs(config.introspection_cache_secs),
            cache: Mutex::default(),
        }))
    }

    /// The claims of an active token (`active: true`), from the cache or the authorization server.
    pub(crate) async fn claims(&self, token: &str) -> Result<Map<String, Value>, OAuthError> {
        let hash: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let cached = crate::sync::lock(&self.cache)
            .get(&hash)
            .filter(|(until, _)| Instant::now() < *until)
            .map(|(_, claims)| claims.clone());
        if let Some(claims) = cached {
            return Ok(claims);
        }
        let body = url::form_urlencoded::Serializer::new(String::new())
            .append_pair("token", token)
            .append_pair("token_type_hint", "access_token")
            .finish();
        let response = self
            .http
            .post(&self.endpoint)
            .basic_auth(&self.client_id, Some(&self.client_secret))
            .header(reqwest::header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body(body)
            .send()
            .await
            .map_err(|e| unavailable(&without_url(&e)))?;
        let status = response.status();
        if status.is_server_error() {
            return Err(unavailable(&format!("HTTP {status}")));
        }
        if !status.is_success() {
            tracing::warn!(%status, "token introspection refused the gateway's client credentials");
            return Err(OAuthError::Unavailable(
                "the identity provider refused this server's introspection request; the operator must check \
                 auth.oauth.introspection_client_id and its secret"
                    .into(),
            ));
        }
        let claims: Map<String, Value> = response.json().await.map_err(|_| unavailable("not a JSON object"))?;
        if claims.get("active").and_then(Value::as_bool) != Some(true) {
            return Err(OAuthError::Invalid("the token is not active (revoked, expired or unknown)".into()));
        }
        let mut ttl = self.cache_for;
        if let Some(exp) = claims.get("exp").and_then(Value::as_u64) {
            let now = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or_default();
            ttl = ttl.min(Duration::from_secs(exp.saturating_sub(now)));
        }
        if !ttl.is_zero() {
            let mut cache = crate::sync::lock(&self.cache);
            if cache.len() >= MAX_CACHED {
                let now = Instant::now();
                cache.retain(|_, (until, _)| *until > now);
                if cache.len() >= MAX_CACHED {
                    cache.clear();
                }
            }
            cache.insert(hash, (Instant::now() + ttl, claims.clone()));
        }
        Ok(claims)
    }
}

fn unavailable(why: &str) -> OAuthError {
    tracing::warn!(error = why, "token introspection failed");
    OAuthError::Unavailable(format!(
        "the identity provider is unreachable (token introspection: {why}); try again in a few seconds"
    ))
}
