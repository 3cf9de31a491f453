//! The local provider's HTTP error answer, for the control plane and the data-plane proxy:
//! a status with E2B's `{"code": <status>, "message": "..."}` body.

use axum::Json;
use axum::response::{IntoResponse, Response};
use http::{HeaderValue, StatusCode};

use crate::e2b::wire;
use crate::local::control::sandbox_table::ProviderError;

/// A control-plane error response: `{"code": <status>, "message": "..."}`.
#[derive(Debug)]
pub struct ControlError(StatusCode, String);

impl ControlError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        ControlError(status, message.into())
    }
}

impl IntoResponse for ControlError {
    fn into_response(self) -> Response {
        let body = wire::ErrorBody { code: i32::from(self.0.as_u16()), message: self.1 };
        let mut response = (self.0, Json(body)).into_response();
        if self.0 == StatusCode::PAYLOAD_TOO_LARGE {
            // The rest of the body is left unread: tell the client not to reuse this connection.
            response.headers_mut().insert(http::header::CONNECTION, HeaderValue::from_static("close"));
        }
        response
    }
}

impl From<ProviderError> for ControlError {
    fn from(err: ProviderError) -> Self {
        let status = StatusCode::from_u16(err.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        if status.is_server_error() {
            // Its text may quote what a sandbox printed (a start command's output, the agent's log).
            tracing::error!(err = %crate::logging::escaped(&err), "control-plane operation failed");
        }
        ControlError(status, err.to_string())
    }
}
