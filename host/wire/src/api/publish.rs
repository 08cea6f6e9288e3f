//! Publishing weights: the proxy's pause, drain and resume
//! (`/v1/proxy/...`) and the weight versions recorded between them
//! (`/v1/weights`).

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::json::JsonText;

/// A published weight version: calls recorded from its creation on carry it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct WeightVersion {
    pub version: u64,
    pub created_ms: u64,
    pub meta: JsonText,
}

/// `POST /v1/weights`: record that the engine now serves `version` (the
/// store refuses a version twice: 409).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RecordWeightVersion {
    pub version: u64,
    #[serde(default)]
    pub meta: JsonText,
}

/// `GET /v1/weights`: the newest published version, if any.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct LatestWeights {
    pub latest: Option<WeightVersion>,
}

/// `POST /v1/proxy/drain`: wait up to `timeout_ms` for in-flight calls.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DrainRequest {
    /// At most 600000 (ten minutes).
    #[schema(maximum = 600_000)]
    pub timeout_ms: u64,
}

/// One model call the proxy is serving.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct InFlightCall {
    /// Process-local id of the registration.
    pub id: u64,
    pub rollout_id: String,
    pub attempt: u32,
    pub started_ms: u64,
}

/// `GET /v1/proxy/state` (and the answer to pause and resume).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ProxyState {
    /// New calls are answered 429 + `Retry-After` while paused.
    pub paused: bool,
    pub in_flight: Vec<InFlightCall>,
}

/// `POST /v1/proxy/drain`'s answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Drained {
    /// No call was left in flight within `timeout_ms`.
    pub drained: bool,
    pub paused: bool,
    /// The calls still in flight.
    pub in_flight: Vec<InFlightCall>,
}
