//! The Redis connections shared by the session store (`redis_store.rs`) and
//! the SSE event log (`event_log.rs`): the pool (used round robin), the key
//! prefix, every call bounded by `timeout_ms`, and their one error type,
//! [`StoreError`], with the answer a request gets when Redis is down (503,
//! `Retry-After`, a JSON-RPC error saying to retry).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use redis::IntoConnectionInfo;
use redis::aio::ConnectionManager;

use crate::config::SessionsConfig;

/// Seconds a client should wait before retrying when Redis is down.
const RETRY_AFTER_SECS: &str = "2";

/// Errors of the Redis session store (all retryable by the client).
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    #[error("session store (Redis) unavailable: {0}; retry in a few seconds")]
    Unavailable(String),
    #[error("session store (Redis) did not answer within {0:?}; retry in a few seconds")]
    Timeout(Duration),
    #[error("unreadable data in the session store: {0}")]
    Corrupt(String),
}

/// The answer when Redis cannot be reached: 503, `Retry-After`, and a JSON-RPC error saying to retry.
impl IntoResponse for StoreError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({
            "jsonrpc": "2.0",
            "id": null,
            "error": { "code": -32000, "message": self.to_string(), "data": { "retryable": true } }
        });
        (
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::RETRY_AFTER, RETRY_AFTER_SECS), (header::CONTENT_TYPE, "application/json")],
            body.to_string(),
        )
            .into_response()
    }
}

/// Unix time in milliseconds (Redis scores, deadlines and stream entry ids).
pub fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or_default()
}

/// The connection pool, the key prefix and the call timeout (cheap to clone).
#[derive(Clone)]
pub struct RedisPool {
    pool: Vec<ConnectionManager>,
    next: Arc<AtomicUsize>,
    prefix: String,
    timeout: Duration,
}

impl RedisPool {
    /// Connects the pool (fails start-up with a clear error when Redis is unreachable or the URL is bad).
    pub async fn connect(config: &SessionsConfig) -> Result<Self, StoreError> {
        let url = config.redis_url().ok_or_else(|| StoreError::Unavailable("sessions.store is memory".into()))?;
        let mut info =
            url.into_connection_info().map_err(|e| StoreError::Unavailable(format!("bad sessions.store URL: {e}")))?;
        if info.redis_settings().password().is_none()
            && let Ok(password) = std::env::var(&config.password_env)
            && !password.is_empty()
        {
            let settings = info.redis_settings().clone().set_password(password);
            info = info.set_redis_settings(settings);
        }
        let client = redis::Client::open(info).map_err(|e| StoreError::Unavailable(e.to_string()))?;
        let timeout = Duration::from_millis(config.timeout_ms);
        let manager_config = redis::aio::ConnectionManagerConfig::new()
            .set_response_timeout(Some(timeout))
            .set_connection_timeout(Some(timeout))
            .set_number_of_retries(2)
            .set_max_delay(Duration::from_millis(500));
        let mut pool = Vec::with_capacity(config.pool_size);
        for _ in 0..config.pool_size {
            let manager = tokio::time::timeout(
                timeout * 3,
                ConnectionManager::new_with_config(client.clone(), manager_config.clone()),
            )
            .await
            .map_err(|_| StoreError::Timeout(timeout * 3))?
            .map_err(|e| StoreError::Unavailable(e.to_string()))?;
            pool.push(manager);
        }
        Ok(Self { pool, next: Arc::new(AtomicUsize::new(0)), prefix: config.key_prefix.clone(), timeout })
    }

    /// The next connection of the pool (round robin).
    pub fn conn(&self) -> ConnectionManager {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.pool.len();
        self.pool[i].clone()
    }

    /// The bound on each call (`timeout_ms`).
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Bounds a Redis call by the configured timeout.
    pub async fn bounded<T>(&self, call: impl Future<Output = redis::RedisResult<T>>) -> Result<T, StoreError> {
        match tokio::time::timeout(self.timeout, call).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(err)) => Err(StoreError::Unavailable(err.to_string())),
            Err(_) => Err(StoreError::Timeout(self.timeout)),
        }
    }

    /// A key under the configured prefix.
    pub fn key(&self, suffix: &str) -> String {
        format!("{}:{suffix}", self.prefix)
    }
}
