//! `/v1/proxy/*`: pause, resume, drain and inspect the proxy.

use std::time::Duration;

use agl_wire::api::DrainRequest;
use axum::extract::State;
use axum::response::Json;
use serde_json::{Value, json};

use super::AppState;
use super::error::ApiError;
use super::extract::ApiJson;

/// Longest a drain may wait, so a request cannot hold a connection forever.
const MAX_DRAIN_MS: u64 = 10 * 60 * 1000;

fn state_json(st: &AppState) -> Value {
    json!({
        "paused": st.control.paused(),
        "in_flight": st.control.in_flight(),
    })
}

pub async fn pause(State(st): State<AppState>) -> Json<Value> {
    st.control.pause();
    tracing::info!("proxy paused");
    Json(state_json(&st))
}

pub async fn resume(State(st): State<AppState>) -> Json<Value> {
    st.control.resume();
    tracing::info!("proxy resumed");
    Json(state_json(&st))
}

pub async fn state(State(st): State<AppState>) -> Json<Value> {
    Json(state_json(&st))
}

pub async fn drain(
    State(st): State<AppState>,
    ApiJson(body): ApiJson<DrainRequest>,
) -> Result<Json<Value>, ApiError> {
    if body.timeout_ms > MAX_DRAIN_MS {
        return Err(ApiError::bad_request(format!(
            "timeout_ms must be at most {MAX_DRAIN_MS}"
        )));
    }
    let left = st
        .control
        .drain(Duration::from_millis(body.timeout_ms))
        .await;
    Ok(Json(json!({
        "drained": left.is_empty(),
        "paused": st.control.paused(),
        "in_flight": left,
    })))
}
