//! The OpenAI-compatible training proxy:
//! `POST /proxy/{rollout_id}/{attempt}/{train|val}/openai/v1/chat/completions`
//! and `.../completions`, so `OPENAI_BASE_URL=<...>/openai/v1` works with any
//! OpenAI client.
//!
//! Each call is checked (token, rollout state, attempt, pause), rewritten
//! (model, temperature, token ids and logprobs, see `rewrite.rs`), sent to
//! the rollout's pinned engine with retries (`upstream.rs`) and recorded as a
//! `model_request` event that is committed before the client gets the end of
//! the response (`call.rs`, `stream.rs`).

mod assemble;
mod call;
mod dedup;
mod record;
mod rewrite;
mod stream;
mod upstream;

use std::time::Instant;

use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::header::{CONTENT_TYPE, RETRY_AFTER};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::Value;
use serde_json::value::RawValue;

pub use dedup::RetryIndex;
pub use upstream::{Upstream, UpstreamError};

use super::AppState;
use super::auth::Principal;
use super::control::now_ms;
use super::error::ApiError;
use super::extract::ApiPath;
use agl_store::Mode;
use agl_wire::rollout::{ApiKind, JsonText};
use call::{Call, CallOutcome};

const PREFIX: &str = "/proxy/{rollout_id}/{attempt}/{mode}/openai/v1";

/// The proxy's routes, merged into the gateway router.
pub fn routes() -> axum::Router<AppState> {
    axum::Router::new()
        .route(&format!("{PREFIX}/chat/completions"), post(chat))
        .route(&format!("{PREFIX}/completions"), post(completions))
}

type ProxyPath = ApiPath<(String, u32, String)>;

async fn chat(
    st: State<AppState>,
    path: ProxyPath,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    serve(ApiKind::ChatCompletions, st, path, headers, body).await
}

async fn completions(
    st: State<AppState>,
    path: ProxyPath,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    serve(ApiKind::Completions, st, path, headers, body).await
}

/// The one handler behind every proxied API: body rejections and errors
/// become OpenAI-shaped JSON responses.
async fn serve(
    api: ApiKind,
    State(st): State<AppState>,
    ApiPath(path): ProxyPath,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let body = body.map_err(|r| ApiError::rejection(r.status(), r.body_text()));
    handle(st, api, path, headers, body)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

/// 429 while the proxy is paused (e.g. during a weight update).
fn paused() -> Response {
    let err = ApiError::new(
        StatusCode::TOO_MANY_REQUESTS,
        "rate_limit_error",
        "the proxy is paused; retry shortly",
    );
    ([(RETRY_AFTER, "1")], err).into_response()
}

async fn handle(
    st: AppState,
    api: ApiKind,
    (rollout_id, attempt, mode): (String, u32, String),
    headers: HeaderMap,
    body: Result<Bytes, ApiError>,
) -> Result<Response, ApiError> {
    if let Principal::Rollout(own) = st.auth.identify(&headers)?
        && own != rollout_id
    {
        return Err(ApiError::forbidden(
            "this rollout token is not valid for that rollout",
        ));
    }
    let mode = Mode::parse(&mode)
        .ok_or_else(|| ApiError::not_found(format!("unknown proxy mode `{mode}`")))?;
    let body = body?;
    let mut forward = rewrite::parse(&body).map_err(ApiError::bad_request)?;
    // Verbatim, as the harness sent it; `parse` has validated it.
    let request = std::str::from_utf8(&body)
        .ok()
        .and_then(|text| RawValue::from_string(text.to_owned()).ok())
        .ok_or_else(|| ApiError::bad_request("invalid JSON body"))?;
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
    // Registered before the pause check, so a drain that starts between the
    // two still sees this call.
    let guard = st.control.register(&rollout_id, attempt);
    if st.control.paused() {
        return Ok(paused());
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
    let endpoint = match api {
        ApiKind::ChatCompletions => "chat/completions",
        _ => "completions",
    };
    let url = format!("{}/{endpoint}", engine.base_url);
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
    };
    let out = Bytes::from(serde_json::to_vec(&forward).unwrap_or_default());
    let resp = match st.upstream.send(&call.engine, &url, out).await {
        Ok(r) => r,
        Err(e) => {
            let message = e.to_string();
            call.commit(CallOutcome::failed(message.clone(), None))
                .await?;
            return Err(ApiError::new(
                StatusCode::BAD_GATEWAY,
                "server_error",
                message,
            ));
        }
    };
    let status = resp.status();
    if status.is_success() && streaming {
        return Ok(stream::respond(call, resp));
    }
    complete(call, resp).await
}

/// A non-streamed call (or an upstream error answer): read it whole, commit
/// the record, then answer.
async fn complete(call: Call, resp: reqwest::Response) -> Result<Response, ApiError> {
    let status = resp.status();
    let bytes = match resp.bytes().await {
        Ok(b) => b,
        Err(e) => {
            let message = format!("reading the engine's response: {e}");
            call.commit(CallOutcome::failed(message.clone(), Some(status.as_u16())))
                .await?;
            return Err(ApiError::new(
                StatusCode::BAD_GATEWAY,
                "server_error",
                message,
            ));
        }
    };
    // The engine's body is kept as its own JSON text; only the token
    // fields are read out of it.
    let raw: Option<Box<RawValue>> = serde_json::from_slice(&bytes).ok();
    let valid = raw.is_some();
    let outcome = match (raw, status.is_success()) {
        (Some(body), true) => CallOutcome {
            tokens: record::tokens_of_bytes(&bytes).unwrap_or_else(|| {
                let v = serde_json::from_str(body.get()).unwrap_or(Value::Null);
                record::tokens_of(call.api, &v)
            }),
            response: JsonText::from_raw(body),
            error: None,
            upstream_status: Some(status.as_u16()),
        },
        (None, true) => CallOutcome::failed(
            "engine answered with invalid JSON".into(),
            Some(status.as_u16()),
        ),
        (body, false) => CallOutcome {
            response: body.map(JsonText::from_raw).unwrap_or_default(),
            ..CallOutcome::failed(
                format!("engine answered HTTP {status}"),
                Some(status.as_u16()),
            )
        },
    };
    call.commit(outcome).await?;
    if status.is_success() && !valid {
        return Err(ApiError::new(
            StatusCode::BAD_GATEWAY,
            "server_error",
            "engine answered with invalid JSON",
        ));
    }
    // Client errors from the engine (bad parameters, context too long) are
    // the harness's to see, verbatim.
    Ok((status, [(CONTENT_TYPE, "application/json")], bytes).into_response())
}
