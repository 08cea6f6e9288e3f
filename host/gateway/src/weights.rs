//! `/v1/weights`: the published weight versions. Whoever updates the
//! engine's weights (`agl run` in-process, `agl train` over this API)
//! records the version here between the proxy's pause and resume; every
//! call recorded after it carries it.

use axum::extract::State;
use axum::response::Json;

use super::AppState;
use super::error::ApiError;
use super::extract::ApiJson;
use agl_wire::api::{LatestWeights, RecordWeightVersion, WeightVersion};
use agl_wire::error::ErrorBody;

/// The newest published weight version.
#[utoipa::path(
    get,
    path = "/v1/weights",
    operation_id = "latest_weights",
    tag = "publish",
    security(("admin_key" = [])),
    responses((status = 200, description = "The newest version, if any.", body = LatestWeights)),
)]
pub async fn latest(State(st): State<AppState>) -> Result<Json<LatestWeights>, ApiError> {
    Ok(Json(LatestWeights {
        latest: st.store.latest_weight_version().await?,
    }))
}

/// Record that the engine now serves a new weight version.
///
/// Every call recorded from then on carries it.
#[utoipa::path(
    post,
    path = "/v1/weights",
    operation_id = "record_weights",
    tag = "publish",
    security(("admin_key" = [])),
    request_body = RecordWeightVersion,
    responses(
        (status = 200, description = "The version as recorded.", body = WeightVersion),
        (status = 409, description = "That version was recorded before.", body = ErrorBody),
    ),
)]
pub async fn record(
    State(st): State<AppState>,
    ApiJson(body): ApiJson<RecordWeightVersion>,
) -> Result<Json<WeightVersion>, ApiError> {
    Ok(Json(
        st.store
            .record_weight_version(body.version, body.meta)
            .await?,
    ))
}
