//! Extractors whose rejections answer in the gateway's error shape.
//!
//! `ApiJson` parses the body as JSON whatever its `Content-Type` when auth
//! is on (curl's `-d` sends form encoding; with auth off `local.rs` insists
//! on `application/json`); bodies over the configured limit are rejected by
//! the underlying `Bytes` extractor with 413, bodies slower than the body
//! timeout with 408.

use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use bytes::Bytes;
use serde::de::DeserializeOwned;

use super::error::ApiError;
use super::{AppState, GatewayConfig};
use axum::http::StatusCode;

/// A request body read in full within `gateway.body_timeout_secs` (408
/// after: a client trickling its upload cannot hold a connection) and the
/// body limit (413).
pub struct ApiBody(pub Bytes);

impl FromRequest<AppState> for ApiBody {
    type Rejection = ApiError;

    async fn from_request(req: Request, st: &AppState) -> Result<Self, ApiError> {
        let deadline = GatewayConfig::seconds(st.config.body_timeout_secs);
        match tokio::time::timeout(deadline, Bytes::from_request(req, st)).await {
            Ok(Ok(body)) => Ok(ApiBody(body)),
            Ok(Err(r)) => Err(ApiError::rejection(r.status(), r.body_text())),
            Err(_) => Err(ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                "invalid_request_error",
                format!(
                    "the request body did not arrive within {} s",
                    st.config.body_timeout_secs
                ),
            )),
        }
    }
}

pub struct ApiJson<T>(pub T);

impl<T> FromRequest<AppState> for ApiJson<T>
where
    T: DeserializeOwned,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, st: &AppState) -> Result<Self, ApiError> {
        let ApiBody(body) = ApiBody::from_request(req, st).await?;
        serde_json::from_slice(&body)
            .map(ApiJson)
            .map_err(|e| ApiError::bad_request(format!("invalid JSON body: {e}")))
    }
}

pub struct ApiQuery<T>(pub T);

impl<S, T> FromRequestParts<S> for ApiQuery<T>
where
    S: Send + Sync,
    T: DeserializeOwned,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        axum::extract::Query::<T>::from_request_parts(parts, state)
            .await
            .map(|q| ApiQuery(q.0))
            .map_err(|r| ApiError::bad_request(r.body_text()))
    }
}

pub struct ApiPath<T>(pub T);

impl<S, T> FromRequestParts<S> for ApiPath<T>
where
    S: Send + Sync,
    T: DeserializeOwned + Send,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        axum::extract::Path::<T>::from_request_parts(parts, state)
            .await
            .map(|p| ApiPath(p.0))
            .map_err(|r| ApiError::rejection(r.status(), r.body_text()))
    }
}
