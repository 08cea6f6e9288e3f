//! What a harness asks before it calls: `GET .../openai/v1/models` and
//! `GET .../anthropic/v1/models` (the policy, in each API's list shape), and
//! `POST .../anthropic/v1/messages/count_tokens` (the prompt's length as the
//! gateway would render it, continuation included; nothing is recorded).

use axum::Json;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde_json::Value;

use super::{ProxyPath, error_response, upstream};
use crate::ApiError;
use crate::AppState;
use crate::auth::Principal;
use crate::extract::{ApiBody, ApiPath};
use agl_conversation::anthropic;
use agl_store::Engine;
use agl_wire::anthropic as wire_anthropic;
use agl_wire::openai;
use agl_wire::rollout::ApiKind;

/// The engine serving the caller's rollout, once its token is checked.
async fn engine_for(
    st: &AppState,
    rollout_id: &str,
    attempt: u32,
    headers: &HeaderMap,
) -> Result<Engine, ApiError> {
    if let Principal::Rollout(own) = st.auth.identify(headers)? {
        own.check(rollout_id, attempt)?;
    }
    let engines = st.store.list_engines().await?;
    upstream::pick(engines, rollout_id)
        .ok_or_else(|| ApiError::unavailable("no engine is registered"))
}

pub async fn openai(
    State(st): State<AppState>,
    ApiPath((id, attempt, _)): ProxyPath,
    headers: HeaderMap,
) -> Response {
    match engine_for(&st, &id, attempt, &headers).await {
        Ok(e) => {
            let card = openai::ModelCard::new(e.model, e.created_ms / 1000, "agl");
            Json(openai::ModelList::of(vec![card])).into_response()
        }
        Err(e) => e.into_response(),
    }
}

pub async fn anthropic(
    State(st): State<AppState>,
    ApiPath((id, attempt, _)): ProxyPath,
    headers: HeaderMap,
) -> Response {
    match engine_for(&st, &id, attempt, &headers).await {
        Ok(e) => {
            let model = wire_anthropic::ModelInfo::named(&e.model);
            Json(wire_anthropic::ModelList::of(vec![model])).into_response()
        }
        Err(e) => error_response(ApiKind::AnthropicMessages, e),
    }
}

pub async fn count_tokens(
    State(st): State<AppState>,
    ApiPath((id, attempt, _)): ProxyPath,
    headers: HeaderMap,
    body: Result<ApiBody, ApiError>,
) -> Response {
    let counted = async {
        let engine = engine_for(&st, &id, attempt, &headers).await?;
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
        let conv =
            anthropic::conversation(&value).map_err(|e| ApiError::bad_request(e.to_string()))?;
        // A copy: counting neither waits on nor changes the chains.
        let chains = st.chains.snapshot(&st.store, &id, attempt).await?;
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
        Err(e) => error_response(ApiKind::AnthropicMessages, e),
    }
}
