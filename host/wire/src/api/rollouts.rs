//! Rollouts (`/v1/rollouts...`), their events, and the store's change
//! counter (`/v1/changes`).

use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use crate::rollout::{FailureKind, JsonText, Mode, ModelCall, RolloutStatus};

/// `POST /v1/rollouts`: create a batch.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateRollouts {
    /// At least one.
    #[schema(min_items = 1)]
    pub rollouts: Vec<NewRollout>,
}

/// One rollout to create. Creating an id that exists returns the existing
/// rollout.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewRollout {
    /// Caller-supplied id (also read as `rollout_id`): 1..=128 of
    /// `A-Z a-z 0-9 . _ -`, not `.` or `..`; none = the store makes one up.
    #[serde(default, alias = "rollout_id")]
    #[schema(pattern = "^[A-Za-z0-9._-]{1,128}$")]
    pub id: Option<String>,
    #[serde(default)]
    pub group_id: String,
    /// Default `train`.
    #[serde(default = "train")]
    pub mode: Mode,
    #[serde(default)]
    pub input: JsonText,
    /// Opaque to the store; read by the controller.
    #[serde(default)]
    pub config: JsonText,
}

fn train() -> Mode {
    Mode::Train
}

/// A rollout as the API shows it: the stored record plus what an agent of it
/// needs (its proxy base URL, events URL and token).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct RolloutView {
    pub id: String,
    pub group_id: String,
    pub mode: Mode,
    pub status: RolloutStatus,
    pub attempt: u32,
    /// Why it failed (or was cancelled), in words.
    #[serde(default)]
    pub reason: Option<String>,
    /// Who is to blame for a failure; set exactly when `status` is `failed`.
    #[serde(default)]
    pub failure: Option<FailureKind>,
    #[serde(default)]
    pub input: JsonText,
    #[serde(default)]
    pub config: JsonText,
    pub created_ms: u64,
    pub updated_ms: u64,
    /// The OpenAI-style base URL the agent calls the model at.
    pub proxy_base_url: String,
    /// The same for Anthropic clients (`ANTHROPIC_BASE_URL`: they append
    /// `/v1/messages`).
    #[serde(default)]
    pub anthropic_base_url: String,
    /// Where the agent posts its events (e.g. its reward).
    pub events_url: String,
    /// The agent's bearer token for both URLs.
    pub token: String,
    /// The current attempt's calls, with `GET /v1/rollouts/{id}?calls=true`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calls: Option<Vec<ModelCall>>,
}

/// `GET /v1/rollouts?status=&group_id=&mode=&cursor=&limit=`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListRollouts {
    /// Only rollouts in this status (empty: any).
    #[serde(default)]
    #[param(value_type = Option<RolloutStatus>)]
    pub status: Option<String>,
    /// Only this group's rollouts.
    #[serde(default)]
    pub group_id: Option<String>,
    /// Only rollouts of this mode (empty: either).
    #[serde(default)]
    #[param(value_type = Option<Mode>)]
    pub mode: Option<String>,
    /// A `next_cursor` from the page before (empty: the first page).
    #[serde(default)]
    pub cursor: Option<String>,
    /// Page size (default 100).
    #[serde(default)]
    pub limit: Option<u32>,
}

/// `GET /v1/rollouts/{id}?calls=`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct GetRollout {
    /// Also the current attempt's model calls, as the export numbers them.
    #[serde(default)]
    pub calls: bool,
}

/// The `{id}` of `/v1/rollouts/{id}/...`.
#[derive(Debug, Clone, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct RolloutPath {
    /// The rollout: 1..=128 of `A-Z a-z 0-9 . _ -`, not `.` or `..`.
    #[param(pattern = "^[A-Za-z0-9._-]{1,128}$")]
    pub id: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct RolloutList {
    pub rollouts: Vec<RolloutView>,
    /// Pass back as `cursor` for the next page; `None` = this was the last.
    pub next_cursor: Option<String>,
}

/// `PATCH /v1/rollouts/{id}`: move the current attempt to `status`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StatusPatch {
    pub attempt: u32,
    pub status: RolloutStatus,
    #[serde(default)]
    pub reason: Option<String>,
    /// Required with `failed` (`system` | `agent`), refused otherwise.
    #[serde(default)]
    pub failure: Option<FailureKind>,
}

impl StatusPatch {
    /// Attempt `attempt` moves to `status` (not `failed`: see [`Self::failed`]).
    pub fn to(attempt: u32, status: RolloutStatus) -> Self {
        StatusPatch {
            attempt,
            status,
            reason: None,
            failure: None,
        }
    }

    /// Attempt `attempt` failed, blamed on `failure`, because `reason`.
    pub fn failed(attempt: u32, failure: FailureKind, reason: impl Into<String>) -> Self {
        StatusPatch {
            attempt,
            status: RolloutStatus::Failed,
            reason: Some(reason.into()),
            failure: Some(failure),
        }
    }

    /// The patch's own consistency: `failure` is given exactly with `failed`.
    pub fn check(&self) -> Result<(), String> {
        match (self.status, self.failure) {
            (RolloutStatus::Failed, None) => {
                Err("`failure` (`system` | `agent`) is required with status `failed`".into())
            }
            (RolloutStatus::Failed, Some(_)) | (_, None) => Ok(()),
            (other, Some(_)) => Err(format!(
                "`failure` is only for status `failed`, not `{}`",
                other.as_str()
            )),
        }
    }
}

/// `POST /v1/rollouts/{id}/events`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AppendEvent {
    /// Default: the rollout's current attempt.
    #[serde(default)]
    pub attempt: Option<u32>,
    /// 1..=128 bytes, e.g. `reward`, `tool_call`; `model_request` only
    /// from the admin, and then `payload` must be a `model_request` record.
    #[schema(min_length = 1, max_length = 128)]
    pub kind: String,
    #[serde(default)]
    pub payload: JsonText,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct EventAppended {
    pub seq: u64,
    pub rollout_id: String,
    pub attempt: u32,
}

/// `GET /v1/rollouts/{id}/events?after=&limit=`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListEvents {
    /// Only events after this `seq` (a page's `last_seq`).
    #[serde(default)]
    pub after: u64,
    /// Page size (default 100).
    #[serde(default)]
    pub limit: Option<u32>,
}

/// One stored event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct EventRecord {
    /// Global, strictly increasing across the whole store.
    pub seq: u64,
    pub rollout_id: String,
    pub attempt: u32,
    pub kind: String,
    pub payload: JsonText,
    pub created_ms: u64,
    /// A `model_request` the client retried names the call that replaced it.
    pub superseded_by: Option<u64>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct EventList {
    pub events: Vec<EventRecord>,
    /// Pass back as `after` for the next page.
    pub last_seq: Option<u64>,
}

/// `GET /v1/changes?after=&wait_ms=`: waits up to `wait_ms` (at most a
/// minute) for the store's change counter to move from `after`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct WaitChanges {
    /// The generation the caller has seen.
    #[serde(default)]
    pub after: u64,
    /// How long to wait for another one (at most 60000).
    #[serde(default)]
    #[param(maximum = 60_000)]
    pub wait_ms: u64,
}

/// The store's change counter: bumped after every committed change of a
/// rollout's state (created, patched, retried, cancelled).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Changes {
    pub generation: u64,
}
