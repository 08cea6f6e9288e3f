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
mod engine_conn;
mod forward;
mod front;
mod models;
mod record;
mod rendered;
mod rewrite;
mod serving;
mod stream;
mod token_scan;
mod upstream;

use std::time::Instant;

use crate::ConstrainedCalls;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::header::RETRY_AFTER;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::value::RawValue;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use rewrite::Body;

pub use dedup::RetryIndex;
pub use rendered::ChainIndex;
pub use upstream::{Upstream, UpstreamError};

use super::AppState;
use super::auth::Principal;
use super::control::now_ms;
use super::error::ApiError;
use super::extract::{ApiBody, ApiPath};
use agl_store::{Engine, Mode};
use agl_wire::rollout::ApiKind;
use agl_wire::{json, urls};
use call::Call;
use front::Front;
use serving::Serving;

/// The proxy's routes, merged into the gateway router.
pub fn routes() -> OpenApiRouter<AppState> {
    front::routes()
        .routes(routes!(models::openai))
        .routes(routes!(models::count_tokens))
        .routes(routes!(models::anthropic))
}

/// The path of a proxy route, or why it does not parse (answered in the
/// called API's shape).
type ProxyPath = Result<ApiPath<urls::ProxyPath>, ApiError>;

/// The one handler behind every proxied API: path and body rejections and
/// errors become JSON responses in the API's own shape.
async fn serve(
    front: &'static dyn Front,
    State(st): State<AppState>,
    path: ProxyPath,
    headers: HeaderMap,
    body: Result<ApiBody, ApiError>,
) -> Response {
    let answer = match path {
        Ok(ApiPath(p)) => {
            let body = body.map(|b| b.0);
            // On the heap once: the call's future is ~7 KB, and every
            // layer above (axum's handler, the middleware, hyper's
            // dispatch) would otherwise move it by value.
            let call = (p.rollout_id, p.attempt, p.mode);
            Box::pin(handle(st, front, call, headers, body)).await
        }
        Err(e) => Err(e),
    };
    answer.unwrap_or_else(|e| front.error(e))
}

/// An error in the shape of the API `path` belongs to (Anthropic's on the
/// Anthropic routes), for what answers before a handler does.
pub fn error_for_path(path: &str, e: ApiError) -> Response {
    if path.starts_with("/proxy/") && path.contains("/anthropic/") {
        front::of(ApiKind::AnthropicMessages).error(e)
    } else {
        e.into_response()
    }
}

/// A request or response body as its record keeps it: checked JSON with
/// one level of nesting left for the record it sits in.
fn record_body(text: &str) -> Result<Box<RawValue>, String> {
    let raw = RawValue::from_string(text.to_owned()).map_err(|e| e.to_string())?;
    json::check_raw(&raw, json::MAX_DEPTH - 1)?;
    Ok(raw)
}

/// 429 while the proxy is paused (e.g. during a weight update), in the
/// called API's shape: every SDK retries it after `Retry-After`.
fn paused(front: &dyn Front) -> Response {
    let err = ApiError::new(
        StatusCode::TOO_MANY_REQUESTS,
        "rate_limit_error",
        "the proxy is paused; retry shortly",
    );
    ([(RETRY_AFTER, "1")], front.error(err)).into_response()
}

/// A call that passed the checks, with its engine, its body read once
/// for the way that engine serves it.
struct Checked {
    engine: Engine,
    body: Body,
    choices: u32,
    mode: Mode,
}

/// The checks every call passes first: the token is the rollout attempt's,
/// the rollout runs this attempt in the path's mode, an engine serves it,
/// the body is a JSON object within the stored limits.
async fn check(
    st: &AppState,
    front: &'static dyn Front,
    (rollout_id, attempt, mode): (&str, u32, &str),
    headers: &HeaderMap,
    body: Result<Bytes, ApiError>,
) -> Result<Checked, ApiError> {
    if let Principal::Rollout(own) = st.auth.identify(headers)? {
        own.check(rollout_id, attempt)?;
    }
    let path_mode = Mode::parse(mode)
        .ok_or_else(|| ApiError::not_found(format!("unknown proxy mode `{mode}`")))?;
    let bytes = body?;
    let rec = st.store.rollout_gate(rollout_id).await?;
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
    let engines = st.store.list_engines().await?;
    let engine = upstream::pick(engines, rollout_id).ok_or_else(|| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            UpstreamError::NoEngine.to_string(),
        )
    })?;
    let body =
        Body::read(&bytes, Serving::renders(front, &engine)).map_err(ApiError::bad_request)?;
    let choices = rewrite::choices(
        body.forward.get("n").map(|v| v.get()),
        front,
        st.config.max_n,
    )
    .map_err(ApiError::bad_request)?;
    Ok(Checked {
        engine,
        body,
        choices,
        mode: rec.mode,
    })
}

/// Checks the call, then serves it the way its engine is served
/// ([`Serving`], chosen once).
async fn handle(
    st: AppState,
    front: &'static dyn Front,
    (rollout_id, attempt, mode): (String, u32, String),
    headers: HeaderMap,
    body: Result<Bytes, ApiError>,
) -> Result<Response, ApiError> {
    let Checked {
        engine,
        body:
            Body {
                mut forward,
                record: request,
                tree,
            },
        choices,
        mode,
    } = check(&st, front, (&rollout_id, attempt, &mode), &headers, body).await?;
    // Registered before the pause check, so a drain that starts between the
    // two still sees this call.
    let guard = st.control.register(&rollout_id, attempt);
    if st.control.paused() {
        return Ok(paused(front));
    }
    let weight_version = st
        .store
        .latest_weight_version()
        .await?
        .map_or(0, |w| w.version);
    let temperature = match mode {
        Mode::Train => st.config.train_temperature,
        Mode::Val => st.config.val_temperature,
    };
    rewrite::rewrite(&mut forward, front, &engine.model, temperature);
    let streaming = rewrite::is_stream(&forward);
    let serving =
        Serving::choose(&st, (front, tree, choices), &engine, (&rollout_id, attempt)).await?;
    // What the engine samples under: on the rendered path what the gateway
    // sends it (a forced call of a family without a grammar is only written
    // into the prompt, and not constrained).
    let constrained = serving.constraint_field(&forward);
    if let Some(field) = constrained
        && st.config.constrained == ConstrainedCalls::Refuse
    {
        return Err(ApiError::bad_request(format!(
            "`{field}` asks for constrained decoding, which this gateway refuses \
             (gateway.constrained = \"refuse\"): its logprobs would not be the policy's"
        )));
    }
    let room = match room(&st, &serving, &engine) {
        Ok(room) => room,
        Err(e) => return serving.context_error(streaming, &rollout_id, e),
    };
    let (url, out) = serving.request(&engine, forward, streaming, room);
    let call = Call {
        rollout_id,
        attempt,
        front,
        request,
        engine,
        weight_version,
        temperature,
        tags: record::agl_tags(&headers),
        started_ms: now_ms(),
        started: Instant::now(),
        _guard: guard,
        st: st.clone(),
        serving,
        constrained: constrained.is_some(),
        choices,
    };
    Ok(forward::run(call, url, out, streaming).await)
}

/// The most tokens the answer may take: the room the policy's context
/// leaves a rendered prompt (with `gateway.clamp_max_tokens`) and the
/// configured cap. A prompt that leaves none is the API's context-length
/// error.
fn room(st: &AppState, serving: &Serving, engine: &Engine) -> Result<Option<usize>, ApiError> {
    let mut room = None;
    let context = engine.context_len.and_then(|n| usize::try_from(n).ok());
    if let (Some(prompt), Some(context)) = (serving.prompt_len(), context) {
        if prompt >= context {
            return Err(ApiError::context_length(prompt, context));
        }
        room = st.config.clamp_max_tokens.then_some(context - prompt);
    }
    if let Some(cap) = st.config.max_tokens {
        room = Some(room.map_or(cap as usize, |r| r.min(cap as usize)));
    }
    Ok(room)
}
