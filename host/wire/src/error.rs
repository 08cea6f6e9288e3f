//! The error body every agl HTTP route answers with, in the OpenAI form
//! `{"error": {"message", "type"}}`: [`ApiError`] on the serving side,
//! [`ErrorBody`] for a client reading one back.

use http::StatusCode;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct ApiError {
    pub status: StatusCode,
    /// The OpenAI `type`: `invalid_request_error`, `not_found_error`, ...
    pub kind: &'static str,
    pub message: String,
    /// OpenAI's machine-readable `code` (e.g. `context_length_exceeded`).
    pub code: Option<&'static str>,
}

impl ApiError {
    pub fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            kind,
            message: message.into(),
            code: None,
        }
    }

    /// A prompt of `prompt` tokens leaves no room in a context of
    /// `context` tokens: OpenAI's `context_length_exceeded`, in words
    /// Anthropic's clients recognise too ("prompt is too long").
    pub fn context_length(prompt: usize, context: usize) -> Self {
        let mut e = Self::bad_request(format!(
            "prompt is too long: {prompt} tokens > {} maximum (this model's maximum context \
             length is {context} tokens, and at least one must be left for the answer)",
            context.saturating_sub(1)
        ));
        e.code = Some("context_length_exceeded");
        e
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

    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
    }

    /// Maps an extractor's rejection by its status, keeping its text.
    pub fn rejection(status: StatusCode, message: String) -> Self {
        let kind = match status {
            StatusCode::PAYLOAD_TOO_LARGE => "request_too_large",
            s if s.is_server_error() => "server_error",
            _ => "invalid_request_error",
        };
        Self::new(status, kind, message)
    }

    /// The body in Anthropic's shape, `{"type": "error", "error": {"type",
    /// "message"}}`, its type named as Anthropic names the status.
    pub fn anthropic_body(&self) -> AnthropicErrorBody {
        let kind = match self.status.as_u16() {
            400 | 409 | 415 | 422 => "invalid_request_error",
            401 => "authentication_error",
            403 => "permission_error",
            404 => "not_found_error",
            408 => "timeout_error",
            413 => "request_too_large",
            429 => "rate_limit_error",
            503 | 529 => "overloaded_error",
            _ => "api_error",
        };
        AnthropicErrorBody {
            kind: "error".into(),
            error: AnthropicErrorDetail {
                kind: kind.into(),
                message: self.message.clone(),
            },
        }
    }

    pub fn body(&self) -> ErrorBody {
        ErrorBody {
            error: ErrorDetail {
                message: self.message.clone(),
                kind: self.kind.to_string(),
                code: self.code.map(str::to_string),
            },
        }
    }
}

/// `{"error": {"message", "type"}}` as it travels.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ErrorDetail {
    pub message: String,
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
}

#[cfg(feature = "axum")]
impl axum::response::IntoResponse for ApiError {
    fn into_response(self) -> axum::response::Response {
        (self.status, axum::Json(self.body())).into_response()
    }
}

/// Anthropic's error body: `{"type": "error", "error": {"type", "message"}}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct AnthropicErrorBody {
    #[serde(rename = "type")]
    pub kind: String,
    pub error: AnthropicErrorDetail,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct AnthropicErrorDetail {
    #[serde(rename = "type")]
    pub kind: String,
    pub message: String,
}
