//! Records the store takes and returns.

use serde::{Deserialize, Serialize};

use agl_wire::rollout::{FailureKind, JsonText, Mode, RolloutStatus};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RolloutRecord {
    pub id: String,
    pub group_id: String,
    pub mode: Mode,
    pub input: JsonText,
    pub config: JsonText,
    pub status: RolloutStatus,
    /// The current attempt, from 1.
    pub attempt: u32,
    pub reason: Option<String>,
    /// Whose failure it is; set exactly when `status` is `failed`.
    pub failure: Option<FailureKind>,
    pub created_ms: u64,
    pub updated_ms: u64,
}

/// What the proxy needs to admit a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RolloutGate {
    pub status: RolloutStatus,
    pub attempt: u32,
    /// Fixed at create: the sampling the proxy applies.
    pub mode: Mode,
}

/// Which rollouts a listing holds; `None` fields do not filter.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RolloutFilter {
    pub status: Option<RolloutStatus>,
    pub group_id: Option<String>,
    pub mode: Option<Mode>,
}

impl RolloutFilter {
    /// The rollouts in `status` (all of them for `None`).
    pub fn status(status: Option<RolloutStatus>) -> RolloutFilter {
        RolloutFilter {
            status,
            ..RolloutFilter::default()
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RolloutPage {
    pub rollouts: Vec<RolloutRecord>,
    /// Pass back to get the next page; `None` = this was the last.
    pub next_cursor: Option<String>,
}

pub use agl_wire::api::WeightVersion;
