//! `/v1/rollouts/{id}/events`: append and list, for the admin and for the
//! rollout's own agent.

use axum::Extension;
use axum::extract::State;
use axum::response::Json;

use super::AppState;
use super::auth::Principal;
use super::error::ApiError;
use super::extract::{ApiJson, ApiPath, ApiQuery};
use agl_wire::api::{AppendEvent, EventAppended, EventList, ListEvents, RolloutPath};
use agl_wire::error::ErrorBody;
use agl_wire::record::{MODEL_REQUEST, ModelRequest};

const DEFAULT_PAGE: u32 = 100;
const MAX_KIND_LEN: usize = 128;

/// Record an event of the rollout (e.g. the harness's `reward`).
///
/// The rollout's own agent writes into its current attempt only.
#[utoipa::path(
    post,
    path = "/v1/rollouts/{id}/events",
    operation_id = "append_event",
    tag = "events",
    security(("admin_key" = []), ("rollout_token" = [])),
    params(RolloutPath),
    request_body = AppendEvent,
    responses(
        (status = 200, description = "The event's place.", body = EventAppended),
        (status = 404, description = "No such rollout.", body = ErrorBody),
        (status = 409, description = "That attempt has ended or is not the current one.",
         body = ErrorBody),
    ),
)]
pub async fn append(
    State(st): State<AppState>,
    Extension(who): Extension<Principal>,
    ApiPath(RolloutPath { id }): ApiPath<RolloutPath>,
    ApiJson(body): ApiJson<AppendEvent>,
) -> Result<Json<EventAppended>, ApiError> {
    if body.kind.is_empty() || body.kind.len() > MAX_KIND_LEN {
        return Err(ApiError::bad_request(format!(
            "`kind` must be 1..={MAX_KIND_LEN} bytes"
        )));
    }
    // Model calls are training data: only the proxy (or the admin) records
    // them, never the agent being trained.
    if body.kind == MODEL_REQUEST && who != Principal::Admin {
        return Err(ApiError::forbidden(
            "a rollout token cannot write model_request events",
        ));
    }
    // Written by the admin: it must read back as a record, or the export
    // of this rollout would have to drop it.
    if body.kind == MODEL_REQUEST
        && let Err(e) = serde_json::from_str::<ModelRequest>(body.payload.as_str())
    {
        return Err(ApiError::bad_request(format!(
            "a model_request payload must be a model_request record: {e}"
        )));
    }
    let rec = st.store.rollout_gate(&id).await?;
    let attempt = body.attempt.unwrap_or(rec.attempt);
    // An agent writes only into its own attempt, and only while it is the
    // current one.
    if let Principal::Rollout(own) = &who {
        own.check(&id, rec.attempt)?;
        own.check(&id, attempt)?;
    }
    // Checked here, not in the store: a rollout finishing between this read
    // and the append can still take one late event, which export keeps.
    if rec.status.is_terminal() || attempt < rec.attempt {
        return Err(ApiError::conflict(format!(
            "rollout `{id}` attempt {attempt} is finished"
        )));
    }
    let seq = st
        .store
        .append_event(&id, attempt, &body.kind, body.payload)
        .await?;
    st.metrics.event_written();
    Ok(Json(EventAppended {
        seq,
        rollout_id: id,
        attempt,
    }))
}

/// The rollout's events, oldest first, a page at a time.
#[utoipa::path(
    get,
    path = "/v1/rollouts/{id}/events",
    operation_id = "list_events",
    tag = "events",
    security(("admin_key" = []), ("rollout_token" = [])),
    params(RolloutPath, ListEvents),
    responses(
        (status = 200, description = "A page of events.", body = EventList),
        (status = 404, description = "No such rollout.", body = ErrorBody),
    ),
)]
pub async fn list(
    State(st): State<AppState>,
    Extension(who): Extension<Principal>,
    ApiPath(RolloutPath { id }): ApiPath<RolloutPath>,
    ApiQuery(q): ApiQuery<ListEvents>,
) -> Result<Json<EventList>, ApiError> {
    if let Principal::Rollout(own) = &who {
        own.check(&id, st.store.rollout_gate(&id).await?.attempt)?;
    }
    let events = st
        .store
        .list_events(&id, q.after, q.limit.unwrap_or(DEFAULT_PAGE))
        .await?;
    let last_seq = events.last().map(|e| e.seq);
    Ok(Json(EventList { events, last_seq }))
}
