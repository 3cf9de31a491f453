//! Bearer-token authentication for `/mcp`: static tokens map to tenants, are
//! stored as SHA-256 hashes and compared in constant time; other tokens go to
//! the OAuth resource server (`oauth/`) when configured. Also binds each new
//! MCP session to the tenant and principal that initialized it, and refuses a
//! session id used by another tenant or principal.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::config::TokenEntry;
use crate::gateway::oauth::{OAuth, OAuthError};
use crate::gateway::sessions::SessionRegistry;

/// The tenant of the current request (inserted into request extensions; tools read it from `Parts`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tenant(pub String);

/// The principal of the current request (static token's tenant, or OAuth issuer + subject), in request
/// extensions beside `Tenant`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal(pub String);

/// Tenant used when auth is off.
pub const DEFAULT_TENANT: &str = "default";

/// Configured tokens (hashes), or none = no auth.
#[derive(Clone)]
pub struct TokenSet {
    entries: Arc<Vec<(String, [u8; 32])>>,
}

impl TokenSet {
    /// Builds the set from config entries (already validated: 64 hex chars).
    pub fn new(entries: &[TokenEntry]) -> Self {
        let entries = entries
            .iter()
            .filter_map(|e| {
                let mut hash = [0u8; 32];
                hex::decode_to_slice(&e.sha256, &mut hash).ok()?;
                Some((e.tenant.clone(), hash))
            })
            .collect();
        Self { entries: Arc::new(entries) }
    }

    pub fn is_enabled(&self) -> bool {
        !self.entries.is_empty()
    }

    /// The tenant of a presented token; checks every entry so timing does not depend on which matched.
    pub fn tenant_for(&self, token: &str) -> Option<String> {
        let presented: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let mut found = None;
        for (tenant, hash) in self.entries.iter() {
            if bool::from(presented.ct_eq(hash)) && found.is_none() {
                found = Some(tenant.clone());
            }
        }
        found
    }
}

/// Hex SHA-256 of a token (what goes into the config).
pub fn token_hash_hex(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// State of the auth middleware.
#[derive(Clone)]
pub struct AuthState {
    pub tokens: TokenSet,
    pub sessions: Arc<SessionRegistry>,
    /// OAuth resource server (`[auth.oauth]`), if configured.
    pub oauth: Option<Arc<OAuth>>,
}

fn unauthorized(error: Option<&str>, message: &'static str) -> Response {
    let challenge = match error {
        Some(code) => format!("Bearer realm=\"sandbox-mcp\", error=\"{code}\""),
        None => "Bearer realm=\"sandbox-mcp\"".to_string(),
    };
    let mut response = (StatusCode::UNAUTHORIZED, message).into_response();
    if let Ok(value) = HeaderValue::from_str(&challenge) {
        response.headers_mut().insert(header::WWW_AUTHENTICATE, value);
    }
    response
}

/// The token of an `Authorization: Bearer <token>` value; the scheme is case-insensitive (RFC 9110 §11.1).
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim_start().split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim()).filter(|t| !t.is_empty())
}

/// Authenticates the request, then ties MCP sessions to tenants.
pub async fn require_tenant(State(state): State<AuthState>, mut request: Request, next: Next) -> Response {
    let (tenant, principal) = if state.tokens.is_enabled() || state.oauth.is_some() {
        let Some(value) = request.headers().get(header::AUTHORIZATION) else {
            return match &state.oauth {
                Some(oauth) => oauth.refusal(&OAuthError::Missing),
                None => unauthorized(None, "missing bearer token (Authorization: Bearer <token>)\n"),
            };
        };
        let token = value.to_str().ok().and_then(bearer_token);
        match (token.and_then(|t| state.tokens.tenant_for(t)), token, &state.oauth) {
            (Some(tenant), _, _) => (tenant.clone(), format!("token:{tenant}")),
            (None, Some(token), Some(oauth)) if !token.is_empty() => match oauth.authenticate(token).await {
                Ok(principal) => (principal.tenant, principal.id),
                Err(err) => {
                    tracing::info!(reason = %err, "bearer token refused"); // never the token itself
                    return oauth.refusal(&err);
                }
            },
            (None, _, Some(oauth)) => {
                return oauth.refusal(&OAuthError::Invalid("expected Authorization: Bearer <token>".into()));
            }
            (None, _, None) => return unauthorized(Some("invalid_token"), "invalid bearer token\n"),
        }
    } else {
        (DEFAULT_TENANT.to_string(), format!("token:{DEFAULT_TENANT}"))
    };

    let session_id = request.headers().get("mcp-session-id").and_then(|v| v.to_str().ok()).map(str::to_string);
    if let Some(id) = &session_id
        && (state.sessions.tenant_of(id).is_some_and(|bound| bound != tenant)
            || state.sessions.principal_of(id).is_some_and(|bound| bound != principal))
    {
        // Same answer as for an unknown session: do not reveal that it exists.
        return (StatusCode::NOT_FOUND, "session not found\n").into_response();
    }

    request.extensions_mut().insert(Tenant(tenant.clone()));
    request.extensions_mut().insert(Principal(principal.clone()));
    let response = next.run(request).await;
    if session_id.is_none()
        && let Some(new_id) = response.headers().get("mcp-session-id").and_then(|v| v.to_str().ok())
    {
        // `initialize` created a session: it belongs to this tenant from now on.
        if let Err(err @ crate::gateway::sessions::SessionError::Store(_)) =
            state.sessions.bind_new(new_id, &tenant, &principal).await
        {
            // With Redis, an unbound session must not be usable: end it and ask the client to retry.
            tracing::warn!(session = %new_id, error = %err, "cannot bind the new session to its tenant");
            if let Some(store) = state.sessions.store() {
                let _ = store.end_now(new_id).await;
            }
            return crate::gateway::sessions::redis_pool::StoreError::Unavailable(err.to_string()).into_response();
        }
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_map_to_tenants_by_hash() {
        let set = TokenSet::new(&[
            TokenEntry { tenant: "acme".into(), sha256: token_hash_hex("s3cret-a") },
            TokenEntry { tenant: "beta".into(), sha256: token_hash_hex("s3cret-b") },
        ]);
        assert!(set.is_enabled());
        assert_eq!(set.tenant_for("s3cret-a").as_deref(), Some("acme"));
        assert_eq!(set.tenant_for("s3cret-b").as_deref(), Some("beta"));
        assert_eq!(set.tenant_for("s3cret-c"), None);
        assert_eq!(set.tenant_for(""), None);
        assert!(!TokenSet::new(&[]).is_enabled());
    }

    #[test]
    fn the_bearer_scheme_is_case_insensitive() {
        assert_eq!(bearer_token("Bearer abc"), Some("abc"));
        assert_eq!(bearer_token("BEARER abc"), Some("abc"));
        assert_eq!(bearer_token("bEaReR  abc "), Some("abc"));
        assert_eq!(bearer_token("Basic abc"), None);
        assert_eq!(bearer_token("Bearer "), None);
        assert_eq!(bearer_token("Bearerabc"), None);
    }
}
