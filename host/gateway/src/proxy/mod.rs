//! The OpenAI-compatible training proxy:
//! `POST /proxy/{rollout_id}/{attempt}/{train|val}/openai/v1/chat/completions`
//! and `.../completions`, so `OPENAI_BASE_URL=<...>/openai/v1` works with any
//! OpenAI client.
//!
//! Each call is checked (token, rollout state, attempt, pause), rewritten
//! (model, temperature, token ids and logprobs, see `rewrite.rs`), sent to
//! the rollout's pinned engine with retries (`upstream.rs`) and recorded as a
//! `model_request` event that is committed before the client gets the end of
//! the response (`forward.rs`, `call.rs`, `stream.rs`). A client that leaves
//! stops its engine work, and its call is recorded as cancelled.

mod assemble;
mod call;
mod dedup;
mod forward;
mod models;
mod record;
mod rendered;
mod rewrite;
mod stream;
mod upstream;

use std::time::Instant;

use crate::ConstrainedCalls;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::header::RETRY_AFTER;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::value::RawValue;

pub use dedup::RetryIndex;
pub use rendered::ChainIndex;
pub use upstream::{Upstream, UpstreamError};

use super::AppState;
use super::auth::Principal;
use super::control::now_ms;
use super::error::ApiError;
use super::extract::{ApiBody, ApiPath};
use agl_store::{Mode, Render};
use agl_wire::json;
use agl_wire::rollout::ApiKind;
use call::Call;
use rendered::RenderedCall;

const PREFIX: &str = "/proxy/{rollout_id}/{attempt}/{mode}/openai/v1";
const ANTHROPIC: &str = "/proxy/{rollout_id}/{attempt}/{mode}/anthropic/v1";

/// The proxy's routes, merged into the gateway router.
pub fn routes() -> axum::Router<AppState> {
    axum::Router::new()
        .route(&format!("{PREFIX}/chat/completions"), post(chat))
        .route(&format!("{PREFIX}/completions"), post(completions))
        .route(&format!("{PREFIX}/responses"), post(responses))
        .route(&format!("{ANTHROPIC}/messages"), post(messages))
        .route(
            &format!("{ANTHROPIC}/messages/count_tokens"),
            post(models::count_tokens),
        )
        .route(&format!("{PREFIX}/models"), get(models::openai))
        .route(&format!("{ANTHROPIC}/models"), get(models::anthropic))
}

type ProxyPath = ApiPath<(String, u32, String)>;

async fn chat(
    st: State<AppState>,
    path: ProxyPath,
    headers: HeaderMap,
    body: Result<ApiBody, ApiError>,
) -> Response {
    serve(ApiKind::ChatCompletions, st, path, headers, body).await
}

async fn completions(
    st: State<AppState>,
    path: ProxyPath,
    headers: HeaderMap,
    body: Result<ApiBody, ApiError>,
) -> Response {
    serve(ApiKind::Completions, st, path, headers, body).await
}

async fn responses(
    st: State<AppState>,
    path: ProxyPath,
    headers: HeaderMap,
    body: Result<ApiBody, ApiError>,
) -> Response {
    serve(ApiKind::Responses, st, path, headers, body).await
}

/// Anthropic Messages (`?beta=true` and other query strings tolerated).
async fn messages(
    st: State<AppState>,
    path: ProxyPath,
    headers: HeaderMap,
    body: Result<ApiBody, ApiError>,
) -> Response {
    serve(ApiKind::AnthropicMessages, st, path, headers, body).await
}

/// The one handler behind every proxied API: body rejections and errors
/// become JSON responses in the API's own shape.
async fn serve(
    api: ApiKind,
    State(st): State<AppState>,
    ApiPath(path): ProxyPath,
    headers: HeaderMap,
    body: Result<ApiBody, ApiError>,
) -> Response {
    let body = body.map(|b| b.0);
    handle(st, api, path, headers, body)
        .await
        .unwrap_or_else(|e| error_response(api, e))
}

/// An error in the shape of the API that was called.
fn error_response(api: ApiKind, e: ApiError) -> Response {
    match api {
        ApiKind::AnthropicMessages => (e.status, axum::Json(e.anthropic_body())).into_response(),
        _ => e.into_response(),
    }
}

/// A request or response body as its record keeps it: checked JSON with
/// one level of nesting left for the record it sits in.
fn record_body(text: &str) -> Result<Box<RawValue>, String> {
    json::check(text, json::MAX_DEPTH - 1)?;
    RawValue::from_string(text.to_owned()).map_err(|e| e.to_string())
}

/// 429 while the proxy is paused (e.g. during a weight update), in the
/// called API's shape: every SDK retries it after `Retry-After`.
fn paused(api: ApiKind) -> Response {
    let err = ApiError::new(
        StatusCode::TOO_MANY_REQUESTS,
        "rate_limit_error",
        "the proxy is paused; retry shortly",
    );
    ([(RETRY_AFTER, "1")], error_response(api, err)).into_response()
}

async fn handle(
    st: AppState,
    api: ApiKind,
    (rollout_id, attempt, mode): (String, u32, String),
    headers: HeaderMap,
    body: Result<Bytes, ApiError>,
) -> Result<Response, ApiError> {
    if let Principal::Rollout(own) = st.auth.identify(&headers)? {
        own.check(&rollout_id, attempt)?;
    }
    let path_mode = Mode::parse(&mode)
        .ok_or_else(|| ApiError::not_found(format!("unknown proxy mode `{mode}`")))?;
    let body = body?;
    let mut forward = rewrite::parse(&body).map_err(ApiError::bad_request)?;
    let choices = rewrite::choices(forward.get("n").map(|v| v.get()), api, st.config.max_n)
        .map_err(ApiError::bad_request)?;
    // Verbatim, as the harness sent it, checked against the limits every
    // stored document keeps.
    let request = std::str::from_utf8(&body)
        .map_err(|_| ApiError::bad_request("invalid JSON body: not UTF-8"))
        .and_then(|text| {
            record_body(text).map_err(|e| ApiError::bad_request(format!("invalid JSON body: {e}")))
        })?;
    let rec = st.store.rollout_gate(&rollout_id).await?;
    if rec.status.is_terminal() {
        return Err(ApiError::conflict(format!(
            "rollout `{rollout_id}` is finished"
        )));
    }
    if attempt != rec.attempt {
        return Err(ApiError::conflict(format!(
            "attempt {attempt} of rollout `{rollout_id}` is not current (current: {})",
            rec.attempt
        )));
    }
    // Sampling follows the rollout's record; the agent cannot pick its
    // temperature by choosing the other path.
    if path_mode != rec.mode {
        return Err(ApiError::forbidden(format!(
            "rollout `{rollout_id}` is a {} rollout; call its proxy_base_url",
            rec.mode.as_str()
        )));
    }
    let mode = rec.mode;
    // Registered before the pause check, so a drain that starts between the
    // two still sees this call.
    let guard = st.control.register(&rollout_id, attempt);
    if st.control.paused() {
        return Ok(paused(api));
    }
    let engines = st.store.list_engines().await?;
    let engine = upstream::pick(engines, &rollout_id).ok_or_else(|| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            UpstreamError::NoEngine.to_string(),
        )
    })?;
    let weight_version = st
        .store
        .latest_weight_version()
        .await?
        .map_or(0, |w| w.version);
    let temperature = match mode {
        Mode::Train => st.config.train_temperature,
        Mode::Val => st.config.val_temperature,
    };
    rewrite::rewrite(&mut forward, api, &engine.model, temperature);
    let streaming = rewrite::is_stream(&forward);
    let own_render = matches!(api, ApiKind::AnthropicMessages | ApiKind::Responses);
    if own_render && engine.render != Render::Gateway {
        return Err(ApiError::bad_request(format!(
            "this API is served by the gateway's own rendering; engine `{}` is registered \
             with render = \"engine\" (set render = \"gateway\")",
            engine.name
        )));
    }
    let renders = own_render || api == ApiKind::ChatCompletions;
    let rendered = if renders && engine.render == Render::Gateway {
        let renderer = st.policies.for_engine(&engine).await?;
        Some(
            RenderedCall::prepare(
                renderer,
                (api, &body, choices),
                &engine,
                (&st.chains, &st.store),
                (&rollout_id, attempt),
            )
            .await?,
        )
    } else {
        None
    };
    // What the engine samples under: on the rendered path what the gateway
    // sends it (a forced call of a family without a grammar is only written
    // into the prompt, and not constrained).
    let constrained = match &rendered {
        Some(r) => r.constraint_field(),
        None => rewrite::constraint_field(&forward, api),
    };
    if let Some(field) = constrained
        && st.config.constrained == ConstrainedCalls::Refuse
    {
        return Err(ApiError::bad_request(format!(
            "`{field}` asks for constrained decoding, which this gateway refuses \
             (gateway.constrained = \"refuse\"): its logprobs would not be the policy's"
        )));
    }
    // The room the policy's context leaves (and the configured cap): none
    // is that API's context-length error (a streamed Responses call gets it
    // as the `response.failed` event Codex reads).
    let mut room = None;
    let context_len = engine.context_len.and_then(|n| usize::try_from(n).ok());
    if let (Some(r), Some(context)) = (&rendered, context_len) {
        let prompt = r.prompt_ids.len();
        if prompt >= context {
            let e = ApiError::context_length(prompt, context);
            if api == ApiKind::Responses && streaming {
                return Ok(rendered::failed_response_stream(r, &rollout_id, &e));
            }
            return Err(e);
        }
        room = st.config.clamp_max_tokens.then_some(context - prompt);
    }
    if let Some(cap) = st.config.max_tokens {
        room = Some(room.map_or(cap as usize, |r| r.min(cap as usize)));
    }
    let url = match (api, &rendered) {
        (_, Some(r)) => r.url(&engine),
        (ApiKind::ChatCompletions, None) => format!("{}/chat/completions", engine.base_url),
        _ => format!("{}/completions", engine.base_url),
    };
    let call = Call {
        rollout_id,
        attempt,
        api,
        request,
        engine,
        weight_version,
        tags: record::agl_tags(&headers),
        started_ms: now_ms(),
        started: Instant::now(),
        _guard: guard,
        st: st.clone(),
        rendered,
        constrained: constrained.is_some(),
        choices,
    };
    let out = match &call.rendered {
        Some(r) => Bytes::from(r.engine_body(forward, streaming, room)),
        None => Bytes::from(serde_json::to_vec(&forward).unwrap_or_default()),
    };
    Ok(forward::run(call, url, out, streaming).await)
}
