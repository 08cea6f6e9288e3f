//! `/v1/engines`: register, list and remove OpenAI-compatible engines. A
//! `base_url` may be the server root or its `/v1` URL; it is stored (and
//! listed) in the `/v1` form calls are made under.

use axum::extract::State;
use axum::response::Json;
use serde_json::Value;

use super::AppState;
use super::error::ApiError;
use super::extract::{ApiJson, ApiPath};
use agl_wire::api::{Engine, EngineList, EnginePath, EngineRemoved, RegisterEngine, Render};
use agl_wire::error::ErrorBody;
use agl_wire::urls;

/// Register an engine (again: its new registration replaces the old).
///
/// `render = "gateway"` needs a policy to render with: the `policy`
/// folder, loaded to check it, or the gateway's own.
#[utoipa::path(
    post,
    path = "/v1/engines",
    operation_id = "register_engine",
    tag = "engines",
    security(("admin_key" = [])),
    request_body = RegisterEngine,
    responses((status = 200, description = "The engine as stored.", body = Engine)),
)]
pub async fn register(
    State(st): State<AppState>,
    ApiJson(mut body): ApiJson<RegisterEngine>,
) -> Result<Json<Engine>, ApiError> {
    if body.name.is_empty() || body.name.contains('/') {
        return Err(ApiError::bad_request(
            "`name` must be non-empty without `/`",
        ));
    }
    if !(body.base_url.starts_with("http://") || body.base_url.starts_with("https://")) {
        return Err(ApiError::bad_request("`base_url` must be an http(s) URL"));
    }
    if body.context_len == Some(0) || body.context_len.is_some_and(|n| i64::try_from(n).is_err()) {
        return Err(ApiError::bad_request(
            "`context_len` must be a positive number of tokens",
        ));
    }
    // The server root and its `/v1` URL both work: stored in the `/v1` form.
    body.base_url = urls::engine_base_url(&body.base_url);
    body.policy = policy_folder(&st, &body).await?;
    if body.context_len.is_none() {
        body.context_len = reported_context(&st, &body.base_url).await;
    }
    Ok(Json(st.store.register_engine(&body).await?))
}

/// The policy folder `body` renders with, made absolute and loaded once
/// to check it: an engine that renders on the gateway without a policy to
/// render with is refused here, not at its first call.
async fn policy_folder(st: &AppState, body: &RegisterEngine) -> Result<Option<String>, ApiError> {
    match (&body.policy, body.render) {
        (Some(_), Render::Engine) => Err(ApiError::bad_request(
            "`policy` is the folder the gateway renders with: it needs render = \"gateway\"",
        )),
        (None, Render::Engine) => Ok(None),
        (None, Render::Gateway) if st.policies.has_own() => Ok(None),
        (None, Render::Gateway) => Err(ApiError::bad_request(format!(
            "engine `{}` asks for render = \"gateway\" but names no `policy` folder \
             (tokenizer.json and its chat template), and this gateway has no policy of its \
             own (model.path in its config)",
            body.name
        ))),
        (Some(folder), Render::Gateway) => {
            let path = std::fs::canonicalize(folder)
                .map_err(|e| ApiError::bad_request(format!("`policy` folder {folder}: {e}")))?;
            let path = path.to_string_lossy().into_owned();
            st.policies
                .folder(&path)
                .await
                .map_err(|e| ApiError::bad_request(e.message))?;
            Ok(Some(path))
        }
    }
}

/// `max_model_len` from the engine's `/v1/models` (vLLM, SGLang and agl's
/// own engine report it), when it answers within a few seconds.
async fn reported_context(st: &AppState, base_url: &str) -> Option<u64> {
    let url = format!("{base_url}/models");
    let asked = st
        .upstream
        .get(&url, std::time::Duration::from_secs(5))
        .await;
    let models: Value = match asked {
        Ok(body) => serde_json::from_slice(&body).ok()?,
        Err(error) => {
            tracing::info!(url, %error, "engine context length unknown");
            return None;
        }
    };
    models["data"][0]["max_model_len"]
        .as_u64()
        .filter(|n| *n > 0 && i64::try_from(*n).is_ok())
}

/// The registered engines.
#[utoipa::path(
    get,
    path = "/v1/engines",
    operation_id = "list_engines",
    tag = "engines",
    security(("admin_key" = [])),
    responses((status = 200, description = "Every engine.", body = EngineList)),
)]
pub async fn list(State(st): State<AppState>) -> Result<Json<EngineList>, ApiError> {
    Ok(Json(EngineList {
        engines: st.store.list_engines().await?,
    }))
}

/// Remove an engine.
#[utoipa::path(
    delete,
    path = "/v1/engines/{name}",
    operation_id = "remove_engine",
    tag = "engines",
    security(("admin_key" = [])),
    params(EnginePath),
    responses(
        (status = 200, description = "It is gone.", body = EngineRemoved),
        (status = 404, description = "No such engine.", body = ErrorBody),
    ),
)]
pub async fn remove(
    State(st): State<AppState>,
    ApiPath(EnginePath { name }): ApiPath<EnginePath>,
) -> Result<Json<EngineRemoved>, ApiError> {
    st.store.remove_engine(&name).await?;
    Ok(Json(EngineRemoved { deleted: name }))
}
