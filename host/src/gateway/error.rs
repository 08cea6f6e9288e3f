//! The one error shape every gateway route answers with, in the OpenAI form
//! `{"error": {"message", "type"}}`, and the mapping of store errors and
//! axum's extractor rejections onto it.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::store::StoreError;

#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct ApiError {
    pub status: StatusCode,
    pub kind: &'static str,
    pub message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            kind,
            message: message.into(),
        }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "authentication_error", message)
    }

    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, "permission_error", message)
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found_error", message)
    }

    pub fn conflict(message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, "conflict_error", message)
    }

    /// Maps an extractor's rejection by its status, keeping axum's text.
    pub fn rejection(status: StatusCode, message: String) -> Self {
        let kind = match status {
            StatusCode::PAYLOAD_TOO_LARGE => "request_too_large",
            s if s.is_server_error() => "server_error",
            _ => "invalid_request_error",
        };
        Self::new(status, kind, message)
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        use StoreError::*;
        match &e {
            RolloutNotFound(_) | EventNotFound(_) | EngineNotFound(_) => {
                ApiError::not_found(e.to_string())
            }
            IllegalTransition { .. }
            | StaleAttempt { .. }
            | Supersede { .. }
            | WeightVersionExists(_) => ApiError::conflict(e.to_string()),
            BadCursor(_) | OutOfRange(_) => ApiError::bad_request(e.to_string()),
            _ => {
                tracing::error!(error = %e, "store failure");
                ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "server_error",
                    e.to_string(),
                )
            }
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({"error": {"message": self.message, "type": self.kind}});
        (self.status, Json(body)).into_response()
    }
}

/// The fallback for paths no route matches.
pub async fn unknown_route(uri: axum::http::Uri) -> ApiError {
    ApiError::not_found(format!("no route for {}", uri.path()))
}

/// The fallback for a known path called with a method it does not take.
pub async fn wrong_method(method: axum::http::Method, uri: axum::http::Uri) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "invalid_request_error",
        format!("{} does not accept {method}", uri.path()),
    )
}
