//! `GET /healthz` and `GET /metrics`: what a supervisor and a scraper ask.

use axum::extract::State;
use axum::response::Json;

use super::AppState;
use agl_wire::api::Health;

/// Whether the gateway is up.
#[utoipa::path(
    get,
    path = "/healthz",
    operation_id = "healthz",
    tag = "service",
    responses((status = 200, description = "It is.", body = Health)),
)]
pub async fn healthz() -> Json<Health> {
    Json(Health::ok())
}

/// Prometheus metrics: requests by route, method and status, latency,
/// events written, upstream errors, open connections, the proxy's pause
/// and calls in flight (and a hosting run's own gauges).
#[utoipa::path(
    get,
    path = "/metrics",
    operation_id = "metrics",
    tag = "service",
    responses((status = 200, description = "Prometheus' text format.",
               content_type = "text/plain", body = String)),
)]
pub async fn metrics(State(st): State<AppState>) -> String {
    let mut text = st.metrics.render(&st.control);
    if let Some(extra) = &st.extra_metrics {
        extra.render(&mut text);
    }
    text
}
