//! Every gateway route answers errors as [`agl_wire::ApiError`]'s
//! `{"error": {"message", "type"}}`; these are the fallbacks for unknown
//! routes and wrong methods (store errors map in `agl-store`, extractor
//! rejections in `extract.rs`).

use axum::http::StatusCode;

pub use agl_wire::ApiError;

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
