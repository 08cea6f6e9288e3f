//! `/v1/engines`: register, list and remove OpenAI-compatible engines.

use axum::extract::State;
use axum::response::Json;
use serde::Deserialize;
use serde_json::{Value, json};

use super::AppState;
use super::error::ApiError;
use super::extract::{ApiJson, ApiPath};
use crate::store::Engine;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegisterBody {
    name: String,
    base_url: String,
    model: String,
}

pub async fn register(
    State(st): State<AppState>,
    ApiJson(body): ApiJson<RegisterBody>,
) -> Result<Json<Engine>, ApiError> {
    if body.name.is_empty() || body.name.contains('/') {
        return Err(ApiError::bad_request(
            "`name` must be non-empty without `/`",
        ));
    }
    if !(body.base_url.starts_with("http://") || body.base_url.starts_with("https://")) {
        return Err(ApiError::bad_request("`base_url` must be an http(s) URL"));
    }
    let engine = st
        .store
        .register_engine(&body.name, body.base_url.trim_end_matches('/'), &body.model)
        .await?;
    Ok(Json(engine))
}

pub async fn list(State(st): State<AppState>) -> Result<Json<Value>, ApiError> {
    Ok(Json(json!({ "engines": st.store.list_engines().await? })))
}

pub async fn remove(
    State(st): State<AppState>,
    ApiPath(name): ApiPath<String>,
) -> Result<Json<Value>, ApiError> {
    st.store.remove_engine(&name).await?;
    Ok(Json(json!({ "deleted": name })))
}
