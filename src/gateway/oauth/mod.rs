//! OAuth 2.1 resource server for `/mcp` (MCP authorization, 2025-11-25 and
//! 2026-07-28): validates access tokens issued by the configured authorization
//! server — JWTs against its cached JWKS, opaque tokens by introspection —
//! checks issuer, audience (RFC 8707), lifetime and scopes, derives the tenant
//! from a claim, and phrases refusals as RFC 6750 / RFC 9728 challenges.
//! `metadata.rs` serves the protected resource metadata.

pub mod config;
mod introspect;
mod jwks;
pub mod metadata;

use std::sync::Arc;
use std::time::Duration;

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use jsonwebtoken::{Algorithm, Validation};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

pub use config::{OAuthConfig, OAuthConfigError};
use introspect::Introspector;
use jwks::JwksCache;

/// Why a token was not accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OAuthError {
    /// No bearer token at all.
    #[error("missing bearer token (Authorization: Bearer <token>); sign in with the authorization server")]
    Missing,
    /// Not a valid token for this server (signature, issuer, audience, lifetime, ...).
    #[error("invalid access token: {0}")]
    Invalid(String),
    /// Valid, but without the scopes this server requires.
    #[error("the access token lacks the scope(s) {0} this server requires; sign in again granting them")]
    InsufficientScope(String),
    /// The authorization server could not be reached to check the token.
    #[error("{0}")]
    Unavailable(String),
}

/// Who a valid token speaks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// Tenant (from the configured claim).
    pub tenant: String,
    /// Stable identity of the caller (issuer + subject); MCP sessions are bound to it.
    pub id: String,
}

/// The OAuth resource server (one per gateway).
pub struct OAuth {
    config: OAuthConfig,
    algorithms: Vec<Algorithm>,
    jwks: JwksCache,
    introspector: Option<Introspector>,
    /// Public URL of our protected resource metadata (in every challenge).
    resource_metadata_url: String,
}

impl OAuth {
    /// Builds the resource server; None when `[auth.oauth]` has no issuer. Fetches nothing yet
    /// (start-up and `/readyz` never depend on the identity provider).
    pub fn from_config(config: &OAuthConfig) -> Result<Option<Arc<Self>>, OAuthConfigError> {
        if !config.is_enabled() {
            return Ok(None);
        }
        config.validate()?;
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(config.http_timeout_secs))
            .redirect(reqwest::redirect::Policy::limited(3))
            .user_agent(concat!("sandbox-mcp/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(OAuthConfigError::HttpClient)?;
        let algorithms = config
            .algorithms
            .iter()
            .map(|a| a.parse::<Algorithm>().map_err(|_| OAuthConfigError::UnknownAlgorithm { alg: a.clone() }))
            .collect::<Result<Vec<_>, _>>()?;
        let resource_metadata_url = metadata::resource_metadata_url(&config.audience)?;
        Ok(Some(Arc::new(Self {
            algorithms,
            jwks: JwksCache::new(config, http.clone()),
            introspector: Introspector::new(config, http)?,
            resource_metadata_url,
            config: config.clone(),
        })))
    }

    pub fn config(&self) -> &OAuthConfig {
        &self.config
    }

    /// Validates a bearer token and returns its principal.
    pub async fn authenticate(&self, token: &str) -> Result<Principal, OAuthError> {
        let claims = if looks_like_jwt(token) {
            self.jwt_claims(token).await?
        } else if let Some(introspector) = &self.introspector {
            let claims = introspector.claims(token).await?;
            self.check_introspected(&claims)?;
            claims
        } else {
            return Err(OAuthError::Invalid("not a JWT, and no introspection endpoint is configured".into()));
        };
        self.principal(&claims)
    }

    async fn jwt_claims(&self, token: &str) -> Result<Map<String, Value>, OAuthError> {
        let header = jsonwebtoken::decode_header(token)
            .map_err(|_| OAuthError::Invalid("malformed JWT header, or an algorithm that is never accepted".into()))?;
        if !self.algorithms.contains(&header.alg) {
            return Err(OAuthError::Invalid(format!("JWT algorithm {:?} is not accepted", header.alg)));
        }
        let key = self.jwks.key(header.kid.as_deref().unwrap_or("")).await?;
        let mut validation = Validation::new(header.alg);
        validation.set_issuer(&[&self.config.issuer]);
        validation.set_audience(&[&self.config.audience]);
        validation.set_required_spec_claims(&["exp", "iss", "aud"]);
        validation.leeway = self.config.leeway_secs;
        validation.validate_nbf = true;
        let data = jsonwebtoken::decode::<Map<String, Value>>(token, &key.key, &validation).map_err(|e| {
            use jsonwebtoken::errors::ErrorKind;
            OAuthError::Invalid(
                match e.kind() {
                    ErrorKind::ExpiredSignature => "the token has expired",
                    ErrorKind::ImmatureSignature => "the token is not valid yet (nbf)",
                    ErrorKind::InvalidAudience => "the token was issued for another resource (aud)",
                    ErrorKind::InvalidIssuer => "the token was issued by another issuer (iss)",
                    ErrorKind::InvalidSignature => "bad signature",
                    ErrorKind::InvalidAlgorithm => "the algorithm does not match the signing key",
                    ErrorKind::MissingRequiredClaim(_) => "a required claim (exp, iss, aud) is missing",
                    _ => "malformed token",
                }
                .to_string(),
            )
        })?;
        Ok(data.claims)
    }

    /// Introspection answers: issuer (when given) and audience must be ours.
    fn check_introspected(&self, claims: &Map<String, Value>) -> Result<(), OAuthError> {
        if let Some(iss) = claims.get("iss").and_then(Value::as_str)
            && iss != self.config.issuer
        {
            return Err(OAuthError::Invalid("the token was issued by another issuer (iss)".into()));
        }
        let aud_ok = match claims.get("aud") {
            Some(Value::String(aud)) => *aud == self.config.audience,
            Some(Value::Array(auds)) => auds.iter().any(|a| a.as_str() == Some(self.config.audience.as_str())),
            _ => false,
        };
        if !aud_ok {
            return Err(OAuthError::Invalid("the token was issued for another resource (aud)".into()));
        }
        Ok(())
    }

    /// Scopes, tenant and identity of validated claims.
    fn principal(&self, claims: &Map<String, Value>) -> Result<Principal, OAuthError> {
        let granted = scopes_of(claims);
        let missing: Vec<&str> = self
            .config
            .required_scopes
            .iter()
            .filter(|s| !granted.iter().any(|g| g == *s))
            .map(String::as_str)
            .collect();
        if !missing.is_empty() {
            return Err(OAuthError::InsufficientScope(missing.join(" ")));
        }
        let claim = &self.config.tenant_claim;
        let tenant = match claims.get(claim) {
            Some(Value::String(s)) if !s.is_empty() => tenant_name(s),
            Some(Value::Number(n)) => tenant_name(&n.to_string()),
            _ => return Err(OAuthError::Invalid(format!("the token has no {claim:?} claim naming the tenant"))),
        };
        let subject = ["sub", "client_id", "azp"]
            .iter()
            .find_map(|c| claims.get(*c).and_then(Value::as_str))
            .ok_or_else(|| OAuthError::Invalid("the token names no subject (sub)".into()))?;
        Ok(Principal { tenant, id: format!("oauth:{}#{subject}", self.config.issuer) })
    }

    /// The HTTP answer to a refused token: 401 / 403 with a `WWW-Authenticate` challenge, or 503.
    pub fn refusal(&self, error: &OAuthError) -> Response {
        let metadata = format!("resource_metadata=\"{}\"", self.resource_metadata_url);
        let scope = self.config.required_scopes.join(" ");
        let scope_param = if scope.is_empty() { String::new() } else { format!(", scope=\"{scope}\"") };
        let (status, challenge) = match error {
            OAuthError::Missing => (StatusCode::UNAUTHORIZED, format!("Bearer {metadata}{scope_param}")),
            OAuthError::Invalid(why) => (
                StatusCode::UNAUTHORIZED,
                format!(
                    "Bearer error=\"invalid_token\", error_description=\"{}\", {metadata}{scope_param}",
                    quoted_safe(why)
                ),
            ),
            OAuthError::InsufficientScope(_) => {
                (StatusCode::FORBIDDEN, format!("Bearer error=\"insufficient_scope\", scope=\"{scope}\", {metadata}"))
            }
            OAuthError::Unavailable(_) => {
                let mut response = (StatusCode::SERVICE_UNAVAILABLE, format!("{error}\n")).into_response();
                response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
                return response;
            }
        };
        let mut response = (status, format!("{error}\n")).into_response();
        if let Ok(value) = HeaderValue::from_str(&challenge) {
            response.headers_mut().insert(header::WWW_AUTHENTICATE, value);
        }
        response
    }
}

/// Three base64url segments: a JWS compact serialization.
fn looks_like_jwt(token: &str) -> bool {
    token.split('.').count() == 3 && token.starts_with("eyJ")
}

/// Granted scopes: `scope` (space-separated, RFC 9068) or `scp` (array or string: Entra, Okta).
fn scopes_of(claims: &Map<String, Value>) -> Vec<String> {
    let mut scopes = Vec::new();
    for claim in ["scope", "scp"] {
        match claims.get(claim) {
            Some(Value::String(s)) => scopes.extend(s.split_whitespace().map(str::to_string)),
            Some(Value::Array(items)) => scopes.extend(items.iter().filter_map(Value::as_str).map(str::to_string)),
            _ => {}
        }
    }
    scopes
}

/// A claim value as a tenant name: itself when it is a valid name, else a stable hash of it
/// (`h-` + 24 hex digits), so values such as `auth0|abc` still make distinct tenants.
pub fn tenant_name(value: &str) -> String {
    if crate::tenant::is_valid_tenant(value) {
        value.to_string()
    } else {
        format!("h-{}", &hex::encode(Sha256::digest(value.as_bytes()))[..24])
    }
}

/// Text safe inside a quoted-string of a challenge.
fn quoted_safe(text: &str) -> String {
    text.chars().filter(|c| *c != '"' && *c != '\\' && !c.is_control()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenant_names_are_valid_and_stable() {
        assert_eq!(tenant_name("acme"), "acme");
        let hashed = tenant_name("auth0|6543");
        assert!(hashed.starts_with("h-") && hashed.len() == 26 && crate::tenant::is_valid_tenant(&hashed));
        assert_eq!(hashed, tenant_name("auth0|6543"));
        assert_ne!(hashed, tenant_name("auth0_6543"));
    }

    #[test]
    fn scopes_from_scope_or_scp() {
        let claims: Map<String, Value> =
            serde_json::from_value(serde_json::json!({"scope": "a b", "scp": ["c"]})).unwrap_or_default();
        assert_eq!(scopes_of(&claims), vec!["a", "b", "c"]);
    }

    #[test]
    fn jwt_shape() {
        assert!(looks_like_jwt("eyJhbGciOiJSUzI1NiJ9.eyJ9.sig"));
        assert!(!looks_like_jwt("opaque-token-value"));
    }
}
