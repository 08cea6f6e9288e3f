//! HTTP handlers: parse, record, apply faults, answer from the script.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Json;
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};

use super::api::{Params, VllmError};
use super::faults::Action;
use super::plan::Plan;
use super::response::Call;
use super::script::{Endpoint, EngineRequest, Reply};
use super::server::ConnKill;
use super::state::{EngineState, RecordedRequest};
use super::stream;

/// The engine's routes over `state`; serve it anywhere. Reset faults need
/// [`super::TestEngine`]'s own server; elsewhere they abort the response body.
pub fn router(state: Arc<EngineState>) -> Router {
    let router = Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/generate", post(sglang_generate))
        .route("/v1/models", get(models));
    super::admin::routes(router)
        .fallback(not_found)
        .with_state(state)
}

async fn chat(State(state): State<Arc<EngineState>>, req: Request) -> Response {
    generate(&state, Endpoint::Chat, req).await
}

async fn completions(State(state): State<Arc<EngineState>>, req: Request) -> Response {
    generate(&state, Endpoint::Completions, req).await
}

async fn sglang_generate(State(state): State<Arc<EngineState>>, req: Request) -> Response {
    generate(&state, Endpoint::Generate, req).await
}

async fn models(State(state): State<Arc<EngineState>>) -> Json<Value> {
    Json(json!({"object": "list", "data": [{
        "id": state.model, "object": "model", "created": 0, "owned_by": "agl-testengine",
    }]}))
}

async fn not_found(req: Request) -> VllmError {
    VllmError::with_status(
        StatusCode::NOT_FOUND,
        format!("no route {}", req.uri().path()),
    )
}

async fn generate(state: &EngineState, endpoint: Endpoint, req: Request) -> Response {
    state.admin.wait_released().await;
    let (parts, body) = req.into_parts();
    let bytes = match axum::body::to_bytes(body, state.body_limit).await {
        Ok(bytes) => bytes,
        Err(e) => {
            return VllmError::with_status(StatusCode::PAYLOAD_TOO_LARGE, e.to_string())
                .into_response();
        }
    };
    if state.logs_requests() {
        state.record(RecordedRequest {
            method: parts.method.to_string(),
            path: parts.uri.path().to_owned(),
            headers: parts
                .headers
                .iter()
                .map(|(k, v)| {
                    (
                        k.as_str().to_owned(),
                        String::from_utf8_lossy(v.as_bytes()).into(),
                    )
                })
                .collect(),
            body: serde_json::from_slice(&bytes).ok(),
            raw: String::from_utf8_lossy(&bytes).into_owned(),
        });
    }
    let params = match super::body::Body::parse(endpoint, &bytes)
        .and_then(|body| Params::parse(endpoint, body, &state.model, &state.codec))
    {
        Ok(params) => params,
        Err(e) => return e.into_response(),
    };
    let decision = state.faults.decide(params.stream);
    let answering = state.answering();
    if !decision.first_byte_latency.is_zero() {
        tokio::time::sleep(decision.first_byte_latency).await;
    }
    match decision.action {
        Action::Reset => {
            answering.done();
            return reset(parts.extensions.get::<ConnKill>()).await;
        }
        Action::Fail {
            status,
            retry_after,
        } => {
            answering.done();
            return failure(status, retry_after);
        }
        Action::Serve | Action::CutStream(_) => {}
    }
    let request = EngineRequest::new(endpoint, bytes, params.prompt_text.clone());
    let mut reply = state.scripter.reply(&request);
    if endpoint != Endpoint::Chat {
        // Completions have no tool parser: the calls stay in the text.
        reply = Reply::text(reply.sampled_text());
    }
    let prefix = match endpoint {
        Endpoint::Chat => "chatcmpl",
        Endpoint::Completions => "cmpl",
        Endpoint::Generate => "rid",
    };
    let call = Call {
        id: format!("{prefix}-{}", state.next_id()),
        created: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        plan: Plan::new(&reply, params.max_tokens, state.chunk_chars, &state.codec),
        params,
        weight_version: state.admin.weight_version(),
    };
    if call.params.stream {
        stream::respond(&call, decision, answering)
    } else {
        answering.done();
        ([(header::CONTENT_TYPE, "application/json")], call.body()).into_response()
    }
}

/// Drops the connection without answering.
async fn reset(kill: Option<&ConnKill>) -> Response {
    match kill {
        Some(ConnKill(notify)) => {
            notify.notify_one();
            // The connection task drops this future with the connection.
            std::future::pending().await
        }
        None => {
            // Served by someone else's server: abort the body instead.
            let failed = futures_util::stream::once(async {
                Err::<Bytes, _>(std::io::Error::other("connection reset by fault injection"))
            });
            Body::from_stream(failed).into_response()
        }
    }
}

fn failure(status: u16, retry_after: Option<u32>) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response =
        VllmError::with_status(status, format!("injected failure ({status})")).into_response();
    if let Some(secs) = retry_after {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(secs));
    }
    response
}
