//! `[auth.oauth]`: the OAuth 2.1 resource-server settings (which authorization
//! server to trust, this server's resource URI, scopes, tenant claim, caches)
//! and their validation.

use serde::{Deserialize, Serialize};

/// Algorithms accepted by default: asymmetric only (never `none`, never HS*).
pub const DEFAULT_ALGORITHMS: [&str; 6] = ["RS256", "RS384", "RS512", "PS256", "ES256", "EdDSA"];

/// `[auth.oauth]`. OAuth is on when `issuer` is set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OAuthConfig {
    /// The authorization server's issuer identifier (exact `iss` of its tokens).
    pub issuer: String,
    /// This server's canonical resource URI (RFC 8707), e.g. `https://mcp.example.com/mcp`.
    pub audience: String,
    /// The issuer's JWKS URL; empty = from its RFC 8414 / OIDC discovery metadata.
    pub jwks_uri: String,
    /// RFC 7662 introspection endpoint for opaque tokens; empty = opaque tokens are refused.
    pub introspection_endpoint: String,
    /// Client id the gateway authenticates to the introspection endpoint with.
    pub introspection_client_id: String,
    /// Name of the environment variable holding the introspection client secret.
    pub introspection_client_secret_env: String,
    /// Scopes every token must carry (else 403 insufficient_scope).
    pub required_scopes: Vec<String>,
    /// Scopes advertised in the protected resource metadata (default: `required_scopes`).
    pub scopes_supported: Vec<String>,
    /// Claim naming the tenant (default `sub`: every user is a tenant of their own).
    pub tenant_claim: String,
    /// JWS algorithms accepted (asymmetric only).
    pub algorithms: Vec<String>,
    /// Clock leeway for `exp` / `nbf`, in seconds.
    pub leeway_secs: u64,
    /// Keys are refetched after this long even if no unknown `kid` shows up.
    pub jwks_cache_secs: u64,
    /// At most one JWKS fetch per this interval (unknown `kid`s cannot hammer the IdP).
    pub jwks_min_refresh_secs: u64,
    /// How long an introspection answer is reused (never past the token's `exp`).
    pub introspection_cache_secs: u64,
    /// Bound on each request to the authorization server.
    pub http_timeout_secs: u64,
}

impl Default for OAuthConfig {
    fn default() -> Self {
        Self {
            issuer: String::new(),
            audience: String::new(),
            jwks_uri: String::new(),
            introspection_endpoint: String::new(),
            introspection_client_id: String::new(),
            introspection_client_secret_env: "SANDBOX_MCP_OAUTH_CLIENT_SECRET".into(),
            required_scopes: Vec::new(),
            scopes_supported: Vec::new(),
            tenant_claim: "sub".into(),
            algorithms: DEFAULT_ALGORITHMS.iter().map(|a| a.to_string()).collect(),
            leeway_secs: 30,
            jwks_cache_secs: 3600,
            jwks_min_refresh_secs: 30,
            introspection_cache_secs: 60,
            http_timeout_secs: 5,
        }
    }
}

/// Why `[auth.oauth]` cannot be used; each message names the key to fix.
#[derive(Debug, thiserror::Error)]
pub enum OAuthConfigError {
    #[error("{key}: {value:?} is not a URL ({source})")]
    NotAUrl { key: String, value: String, source: url::ParseError },
    #[error("{key}: {value:?} must be an https URL (http only on localhost)")]
    NotHttps { key: String, value: String },
    #[error(
        "auth.oauth.audience is required with auth.oauth.issuer: this server's public MCP URL, e.g. \
         https://mcp.example.com/mcp"
    )]
    MissingAudience,
    #[error("auth.oauth.audience must not have a query or fragment (RFC 8707)")]
    AudienceWithQuery,
    #[error("auth.oauth.audience: {0}")]
    BadAudience(url::ParseError),
    #[error("auth.oauth.introspection_client_id is required with auth.oauth.introspection_endpoint")]
    MissingIntrospectionClientId,
    #[error("auth.oauth.introspection_endpoint is set but the client secret variable {env} is not")]
    MissingClientSecret { env: String },
    #[error("auth.oauth.tenant_claim must name a claim (default \"sub\")")]
    EmptyTenantClaim,
    #[error("auth.oauth.algorithms must list at least one algorithm, e.g. [\"RS256\"]")]
    NoAlgorithms,
    #[error(
        "auth.oauth.algorithms: {alg:?} is not accepted; use asymmetric ones (RS256, RS384, RS512, PS256, PS384, \
         PS512, ES256, ES384, EdDSA); `none` and HS* are never accepted"
    )]
    RefusedAlgorithm { alg: String },
    #[error("auth.oauth.algorithms: unknown algorithm {alg:?}")]
    UnknownAlgorithm { alg: String },
    #[error("auth.oauth.http_timeout_secs and auth.oauth.jwks_cache_secs must be at least 1")]
    ZeroDuration,
    #[error("cannot build the OAuth HTTP client: {0}")]
    HttpClient(reqwest::Error),
}

impl OAuthConfig {
    /// True when an issuer is configured.
    pub fn is_enabled(&self) -> bool {
        !self.issuer.is_empty()
    }

    /// Checks the settings; the message names the key to fix.
    pub fn validate(&self) -> Result<(), OAuthConfigError> {
        if !self.is_enabled() {
            return Ok(());
        }
        check_url("auth.oauth.issuer", &self.issuer)?;
        if self.audience.is_empty() {
            return Err(OAuthConfigError::MissingAudience);
        }
        let audience = check_url("auth.oauth.audience", &self.audience)?;
        if audience.fragment().is_some() || audience.query().is_some() {
            return Err(OAuthConfigError::AudienceWithQuery);
        }
        for (key, value) in [("jwks_uri", &self.jwks_uri), ("introspection_endpoint", &self.introspection_endpoint)] {
            if !value.is_empty() {
                check_url(&format!("auth.oauth.{key}"), value)?;
            }
        }
        if !self.introspection_endpoint.is_empty() && self.introspection_client_id.is_empty() {
            return Err(OAuthConfigError::MissingIntrospectionClientId);
        }
        if self.tenant_claim.is_empty() {
            return Err(OAuthConfigError::EmptyTenantClaim);
        }
        if self.algorithms.is_empty() {
            return Err(OAuthConfigError::NoAlgorithms);
        }
        for alg in &self.algorithms {
            if !DEFAULT_ALGORITHMS.contains(&alg.as_str()) && !["PS384", "PS512", "ES384"].contains(&alg.as_str()) {
                return Err(OAuthConfigError::RefusedAlgorithm { alg: alg.clone() });
            }
        }
        if self.http_timeout_secs == 0 || self.jwks_cache_secs == 0 {
            return Err(OAuthConfigError::ZeroDuration);
        }
        Ok(())
    }

    /// The scopes advertised in the protected resource metadata.
    pub fn advertised_scopes(&self) -> &[String] {
        if self.scopes_supported.is_empty() { &self.required_scopes } else { &self.scopes_supported }
    }
}

/// An absolute http(s) URL; plain http only for loopback hosts (tests, local IdPs).
fn check_url(key: &str, value: &str) -> Result<url::Url, OAuthConfigError> {
    let url = url::Url::parse(value).map_err(|source| OAuthConfigError::NotAUrl {
        key: key.to_string(),
        value: value.to_string(),
        source,
    })?;
    let loopback = match url.host() {
        Some(url::Host::Domain(d)) => d == "localhost",
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        None => false,
    };
    match url.scheme() {
        "https" => Ok(url),
        "http" if loopback => Ok(url),
        _ => Err(OAuthConfigError::NotHttps { key: key.to_string(), value: value.to_string() }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> OAuthConfig {
        OAuthConfig {
            issuer: "https://idp.example.com/realms/dev".into(),
            audience: "https://mcp.example.com/mcp".into(),
            ..OAuthConfig::default()
        }
    }

    #[test]
    fn validation_names_the_key() {
        assert!(OAuthConfig::default().validate().is_ok());
        assert!(base().validate().is_ok());
        let no_aud = OAuthConfig { audience: String::new(), ..base() };
        assert!(no_aud.validate().unwrap_err().to_string().contains("auth.oauth.audience"));
        let http = OAuthConfig { issuer: "http://idp.example.com".into(), ..base() };
        assert!(http.validate().unwrap_err().to_string().contains("https"));
        let local = OAuthConfig { issuer: "http://127.0.0.1:9999".into(), ..base() };
        assert!(local.validate().is_ok());
        for alg in ["HS256", "none"] {
            let bad = OAuthConfig { algorithms: vec![alg.into()], ..base() };
            assert!(bad.validate().unwrap_err().to_string().contains("never accepted"), "{alg}");
        }
        let frag = OAuthConfig { audience: "https://mcp.example.com/mcp#x".into(), ..base() };
        assert!(frag.validate().is_err());
        let intro = OAuthConfig { introspection_endpoint: "https://idp.example.com/introspect".into(), ..base() };
        assert!(intro.validate().unwrap_err().to_string().contains("introspection_client_id"));
    }
}
