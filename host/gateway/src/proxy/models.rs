//! What a harness asks before it calls: `GET .../openai/v1/models` and
//! `GET .../anthropic/v1/models` (the policy, in each API's list shape), and
//! `POST .../anthropic/v1/messages/count_tokens` (the prompt's length as the
//! gateway would render it, continuation included; nothing is recorded).

use axum::Json;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde_json::Value;

use super::{ProxyPath, upstream};
use crate::ApiError;
use crate::AppState;
use crate::auth::Principal;
use crate::extract::{ApiBody, ApiPath};
use agl_store::{Engine, Mode};
use agl_wire::anthropic as wire_anthropic;
use agl_wire::error::{AnthropicErrorBody, ErrorBody};
use agl_wire::openai;
use agl_wire::rollout::ApiKind;
use agl_wire::urls;

/// The engine serving the caller's rollout, once its token is checked and
/// the path names a rollout and a mode there are (404 otherwise, as a call
/// is answered).
async fn engine_for(
    st: &AppState,
    (rollout_id, attempt, mode): (&str, u32, &str),
    headers: &HeaderMap,
) -> Result<Engine, ApiError> {
    if let Principal::Rollout(own) = st.auth.identify(headers)? {
        own.check(rollout_id, attempt)?;
    }
    if Mode::parse(mode).is_none() {
        return Err(ApiError::not_found(format!("unknown proxy mode `{mode}`")));
    }
    st.store.rollout_gate(rollout_id).await?;
    let engines = st.store.list_engines().await?;
    upstream::pick(engines, rollout_id)
        .ok_or_else(|| ApiError::unavailable("no engine is registered"))
}

/// The path's parameters, or why the path does not parse.
fn params_of(path: ProxyPath) -> Result<urls::ProxyPath, ApiError> {
    path.map(|ApiPath(p)| p)
}

/// The policy, as an OpenAI model list.
#[utoipa::path(
    get,
    path = "/proxy/{rollout_id}/{attempt}/{mode}/openai/v1/models",
    operation_id = "openai_models",
    tag = "openai",
    security(("rollout_token" = []), ("admin_key" = [])),
    params(urls::ProxyPath),
    responses(
        (status = 200, description = "The policy the rollout's engine serves.",
         body = openai::ModelList),
        (status = 404, description = "No such rollout, or no such mode.", body = ErrorBody),
        (status = 503, description = "No engine is registered.", body = ErrorBody),
    ),
)]
pub async fn openai(State(st): State<AppState>, path: ProxyPath, headers: HeaderMap) -> Response {
    let engine = async {
        let p = params_of(path)?;
        engine_for(&st, (&p.rollout_id, p.attempt, &p.mode), &headers).await
    };
    match engine.await {
        Ok(e) => {
            let card = openai::ModelCard::new(e.model, e.created_ms / 1000, "agl");
            Json(openai::ModelList::of(vec![card])).into_response()
        }
        Err(e) => e.into_response(),
    }
}

/// The policy, as an Anthropic model list.
#[utoipa::path(
    get,
    path = "/proxy/{rollout_id}/{attempt}/{mode}/anthropic/v1/models",
    operation_id = "anthropic_models",
    tag = "anthropic",
    security(("rollout_token" = []), ("rollout_token_x_api_key" = []), ("admin_key" = [])),
    params(urls::ProxyPath),
    responses(
        (status = 200, description = "The policy the rollout's engine serves.",
         body = wire_anthropic::ModelList),
        (status = 404, description = "No such rollout, or no such mode.",
         body = AnthropicErrorBody),
        (status = 503, description = "No engine is registered.", body = AnthropicErrorBody),
    ),
)]
pub async fn anthropic(
    State(st): State<AppState>,
    path: ProxyPath,
    headers: HeaderMap,
) -> Response {
    let engine = async {
        let p = params_of(path)?;
        engine_for(&st, (&p.rollout_id, p.attempt, &p.mode), &headers).await
    };
    match engine.await {
        Ok(e) => {
            let model = wire_anthropic::ModelInfo::named(&e.model);
            Json(wire_anthropic::ModelList::of(vec![model])).into_response()
        }
        Err(e) => super::front::of(ApiKind::AnthropicMessages).error(e),
    }
}

/// The prompt's length in tokens as the gateway would render it
/// (continuation included); nothing is recorded.
#[utoipa::path(
    post,
    path = "/proxy/{rollout_id}/{attempt}/{mode}/anthropic/v1/messages/count_tokens",
    operation_id = "anthropic_count_tokens",
    tag = "anthropic",
    security(("rollout_token" = []), ("rollout_token_x_api_key" = []), ("admin_key" = [])),
    params(urls::ProxyPath),
    request_body(content = Object, description = "A Messages request.",
                 content_type = "application/json"),
    responses(
        (status = 200, description = "The prompt's length.", body = wire_anthropic::TokenCount),
        (status = 404, description = "No such rollout, or no such mode.",
         body = AnthropicErrorBody),
        (status = 400, description = "Not a Messages request, or the engine renders itself \
            (`render = \"engine\"`).", body = AnthropicErrorBody),
        (status = 503, description = "No engine is registered.", body = AnthropicErrorBody),
    ),
)]
pub async fn count_tokens(
    State(st): State<AppState>,
    path: ProxyPath,
    headers: HeaderMap,
    body: Result<ApiBody, ApiError>,
) -> Response {
    let counted = async {
        let p = params_of(path)?;
        let (id, attempt) = (p.rollout_id.as_str(), p.attempt);
        let engine = engine_for(&st, (id, attempt, &p.mode), &headers).await?;
        let body = body?.0;
        if engine.render != agl_store::Render::Gateway {
            return Err(ApiError::bad_request(format!(
                "counting tokens needs the gateway's rendering; engine `{}` is registered \
                 with render = \"engine\"",
                engine.name
            )));
        }
        let renderer = st.policies.for_engine(&engine).await?;
        let value: Value = serde_json::from_slice(&body)
            .map_err(|e| ApiError::bad_request(format!("invalid JSON body: {e}")))?;
        let conv = super::front::of(ApiKind::AnthropicMessages)
            .conversation(&value)
            .map_err(|e| ApiError::bad_request(e.to_string()))?;
        // A copy: counting neither waits on nor changes the chains.
        let chains = st.chains.snapshot(&st.store, id, attempt).await?;
        let n = tokio::task::spawn_blocking(move || {
            chains.prompt(&renderer, &conv).map(|p| p.ids.len())
        })
        .await
        .map_err(|e| ApiError::internal(format!("counting: {e}")))?
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
        Ok::<_, ApiError>(n)
    };
    match counted.await {
        Ok(n) => Json(wire_anthropic::TokenCount { input_tokens: n }).into_response(),
        Err(e) => super::front::of(ApiKind::AnthropicMessages).error(e),
    }
}
