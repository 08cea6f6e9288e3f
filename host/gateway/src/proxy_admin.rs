//! `/v1/proxy/*`: pause, resume, drain and inspect the proxy.

use std::time::Duration;

use agl_wire::api::{DrainRequest, Drained, ProxyState};
use axum::extract::State;
use axum::response::Json;

use super::AppState;
use super::error::ApiError;
use super::extract::ApiJson;

/// Longest a drain may wait, so a request cannot hold a connection forever.
const MAX_DRAIN_MS: u64 = 10 * 60 * 1000;

fn state_of(st: &AppState) -> ProxyState {
    ProxyState {
        paused: st.control.paused(),
        in_flight: st.control.in_flight(),
    }
}

/// Pause the proxy: new calls get 429 + `Retry-After` until it resumes.
#[utoipa::path(
    post,
    path = "/v1/proxy/pause",
    operation_id = "pause_proxy",
    tag = "publish",
    security(("admin_key" = [])),
    responses((status = 200, description = "The proxy, paused.", body = ProxyState)),
)]
pub async fn pause(State(st): State<AppState>) -> Json<ProxyState> {
    st.control.pause();
    tracing::info!("proxy paused");
    Json(state_of(&st))
}

/// Resume the proxy.
#[utoipa::path(
    post,
    path = "/v1/proxy/resume",
    operation_id = "resume_proxy",
    tag = "publish",
    security(("admin_key" = [])),
    responses((status = 200, description = "The proxy, serving.", body = ProxyState)),
)]
pub async fn resume(State(st): State<AppState>) -> Json<ProxyState> {
    st.control.resume();
    tracing::info!("proxy resumed");
    Json(state_of(&st))
}

/// Whether the proxy is paused, and the calls it is serving.
#[utoipa::path(
    get,
    path = "/v1/proxy/state",
    operation_id = "proxy_state",
    tag = "publish",
    security(("admin_key" = [])),
    responses((status = 200, description = "The proxy now.", body = ProxyState)),
)]
pub async fn state(State(st): State<AppState>) -> Json<ProxyState> {
    Json(state_of(&st))
}

/// Wait up to `timeout_ms` for the calls in flight to end.
#[utoipa::path(
    post,
    path = "/v1/proxy/drain",
    operation_id = "drain_proxy",
    tag = "publish",
    security(("admin_key" = [])),
    request_body = DrainRequest,
    responses((status = 200, description = "Drained, or the calls still in flight.",
               body = Drained)),
)]
pub async fn drain(
    State(st): State<AppState>,
    ApiJson(body): ApiJson<DrainRequest>,
) -> Result<Json<Drained>, ApiError> {
    if body.timeout_ms > MAX_DRAIN_MS {
        return Err(ApiError::bad_request(format!(
            "timeout_ms must be at most {MAX_DRAIN_MS}"
        )));
    }
    let left = st
        .control
        .drain(Duration::from_millis(body.timeout_ms))
        .await;
    Ok(Json(Drained {
        drained: left.is_empty(),
        paused: st.control.paused(),
        in_flight: left,
    }))
}
