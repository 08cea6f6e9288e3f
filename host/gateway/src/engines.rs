//! `/v1/engines`: register, list and remove OpenAI-compatible engines. A
//! `base_url` may be the server root or its `/v1` URL; it is stored (and
//! listed) in the `/v1` form calls are made under.

use axum::extract::State;
use axum::response::Json;
use serde_json::{Value, json};

use super::AppState;
use super::error::ApiError;
use super::extract::{ApiJson, ApiPath};
use agl_wire::api::{Engine, EngineList, RegisterEngine};
use agl_wire::urls;

pub async fn register(
    State(st): State<AppState>,
    ApiJson(body): ApiJson<RegisterEngine>,
) -> Result<Json<Engine>, ApiError> {
    if body.name.is_empty() || body.name.contains('/') {
        return Err(ApiError::bad_request(
            "`name` must be non-empty without `/`",
        ));
    }
    if !(body.base_url.starts_with("http://") || body.base_url.starts_with("https://")) {
        return Err(ApiError::bad_request("`base_url` must be an http(s) URL"));
    }
    // The server root and its `/v1` URL both work: stored in the `/v1` form.
    let base_url = urls::engine_base_url(&body.base_url);
    let engine = st
        .store
        .register_engine(&body.name, &base_url, &body.model, body.render, body.api)
        .await?;
    Ok(Json(engine))
}

pub async fn list(State(st): State<AppState>) -> Result<Json<EngineList>, ApiError> {
    Ok(Json(EngineList {
        engines: st.store.list_engines().await?,
    }))
}

pub async fn remove(
    State(st): State<AppState>,
    ApiPath(name): ApiPath<String>,
) -> Result<Json<Value>, ApiError> {
    st.store.remove_engine(&name).await?;
    Ok(Json(json!({ "deleted": name })))
}
