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

pub async fn latest(State(st): State<AppState>) -> Result<Json<LatestWeights>, ApiError> {
    Ok(Json(LatestWeights {
        latest: st.store.latest_weight_version().await?,
    }))
}

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
