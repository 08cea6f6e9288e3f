//! `/v1/rollouts`: batch create, list, get, patch status, cancel, retry.

use axum::extract::State;
use axum::response::Json;

use super::AppState;
use super::error::ApiError;
use super::extract::{ApiJson, ApiPath, ApiQuery};
use agl_store::{RolloutFilter, RolloutRecord};
use agl_wire::api::{
    Changes, CreateRollouts, GetRollout, ListRollouts, RolloutList, RolloutPath, RolloutView,
    StatusPatch, WaitChanges,
};
use agl_wire::error::ErrorBody;
use agl_wire::rollout::{Mode, Rollout, RolloutStatus};
use agl_wire::urls;

/// Page size when the caller names none.
const DEFAULT_PAGE: u32 = 100;

impl AppState {
    /// A stored rollout as the API shows it, with the URLs and token its
    /// agent needs.
    pub fn view(&self, r: RolloutRecord) -> RolloutView {
        RolloutView {
            proxy_base_url: urls::proxy_base_url(&self.public_base, &r.id, r.attempt, r.mode),
            anthropic_base_url: urls::anthropic_base_url(
                &self.public_base,
                &r.id,
                r.attempt,
                r.mode,
            ),
            events_url: urls::events_url(&self.public_base, &r.id),
            token: self.auth.rollout_token(&r.id, r.attempt),
            id: r.id,
            group_id: r.group_id,
            mode: r.mode,
            status: r.status,
            attempt: r.attempt,
            reason: r.reason,
            failure: r.failure,
            input: r.input,
            config: r.config,
            created_ms: r.created_ms,
            updated_ms: r.updated_ms,
            calls: None,
        }
    }
}

/// Create rollouts, `queued`.
///
/// An id that exists already answers the existing rollout.
#[utoipa::path(
    post,
    path = "/v1/rollouts",
    operation_id = "create_rollouts",
    tag = "rollouts",
    security(("admin_key" = [])),
    request_body = CreateRollouts,
    responses((status = 200, description = "The rollouts, in the order asked.", body = RolloutList)),
)]
pub async fn create(
    State(st): State<AppState>,
    ApiJson(body): ApiJson<CreateRollouts>,
) -> Result<Json<RolloutList>, ApiError> {
    if body.rollouts.is_empty() {
        return Err(ApiError::bad_request("`rollouts` is empty"));
    }
    let created = st.store.create_rollouts(body.rollouts).await?;
    Ok(Json(RolloutList {
        rollouts: created.into_iter().map(|r| st.view(r)).collect(),
        next_cursor: None,
    }))
}

/// List rollouts, oldest first, a page at a time.
#[utoipa::path(
    get,
    path = "/v1/rollouts",
    operation_id = "list_rollouts",
    tag = "rollouts",
    security(("admin_key" = [])),
    params(ListRollouts),
    responses((status = 200, description = "A page of rollouts.", body = RolloutList)),
)]
pub async fn list(
    State(st): State<AppState>,
    ApiQuery(q): ApiQuery<ListRollouts>,
) -> Result<Json<RolloutList>, ApiError> {
    let status = match q.status.as_deref() {
        None | Some("") => None,
        Some(s) => Some(
            RolloutStatus::parse(s)
                .ok_or_else(|| ApiError::bad_request(format!("unknown status `{s}`")))?,
        ),
    };
    let mode =
        match q.mode.as_deref() {
            None | Some("") => None,
            Some(m) => Some(Mode::parse(m).ok_or_else(|| {
                ApiError::bad_request(format!("unknown mode `{m}` (train | val)"))
            })?),
        };
    let filter = RolloutFilter {
        status,
        group_id: q.group_id.filter(|g| !g.is_empty()),
        mode,
    };
    // An empty cursor is the first page, as an empty filter is none.
    let cursor = q.cursor.as_deref().filter(|c| !c.is_empty());
    let page = st
        .store
        .list_rollouts(filter, cursor, q.limit.unwrap_or(DEFAULT_PAGE))
        .await?;
    Ok(Json(RolloutList {
        rollouts: page.rollouts.into_iter().map(|r| st.view(r)).collect(),
        next_cursor: page.next_cursor,
    }))
}

/// One rollout.
#[utoipa::path(
    get,
    path = "/v1/rollouts/{id}",
    operation_id = "get_rollout",
    tag = "rollouts",
    security(("admin_key" = [])),
    params(RolloutPath, GetRollout),
    responses(
        (status = 200, description = "The rollout.", body = RolloutView),
        (status = 404, description = "No such rollout.", body = ErrorBody),
    ),
)]
pub async fn get(
    State(st): State<AppState>,
    ApiPath(RolloutPath { id }): ApiPath<RolloutPath>,
    ApiQuery(q): ApiQuery<GetRollout>,
) -> Result<Json<RolloutView>, ApiError> {
    if q.calls {
        // Two reads: a patch landing between them may leave the calls one
        // attempt behind the record, which a caller can see from `attempt`.
        let rec = st.store.get_rollout(&id).await?;
        let exported = st.store.export_rollout(&id).await?;
        let mut view = st.view(rec);
        view.calls = Some(exported.calls);
        return Ok(Json(view));
    }
    Ok(Json(st.view(st.store.get_rollout(&id).await?)))
}

/// Move the current attempt to a status.
///
/// `queued -> running` claims it (attempt-checked, so an attempt never
/// starts twice); a `failed` patch names its failure kind, and a system
/// failure within the retries re-queues the rollout as its next attempt.
#[utoipa::path(
    patch,
    path = "/v1/rollouts/{id}",
    operation_id = "patch_rollout",
    tag = "rollouts",
    security(("admin_key" = [])),
    params(RolloutPath),
    request_body = StatusPatch,
    responses(
        (status = 200, description = "The rollout after the change.", body = RolloutView),
        (status = 404, description = "No such rollout.", body = ErrorBody),
        (status = 409, description = "Not the current attempt, or a transition the state \
            machine refuses.", body = ErrorBody),
    ),
)]
pub async fn patch(
    State(st): State<AppState>,
    ApiPath(RolloutPath { id }): ApiPath<RolloutPath>,
    ApiJson(body): ApiJson<StatusPatch>,
) -> Result<Json<RolloutView>, ApiError> {
    let rec = st.store.set_status(&id, &body).await?;
    if rec.status.is_terminal() {
        st.retries.forget(&id);
        st.chains.forget(&id);
    }
    Ok(Json(st.view(rec)))
}

/// Cancel a rollout that has not ended.
#[utoipa::path(
    post,
    path = "/v1/rollouts/{id}/cancel",
    operation_id = "cancel_rollout",
    tag = "rollouts",
    security(("admin_key" = [])),
    params(RolloutPath),
    responses(
        (status = 200, description = "The rollout, `cancelled`.", body = RolloutView),
        (status = 404, description = "No such rollout.", body = ErrorBody),
        (status = 409, description = "It has ended already.", body = ErrorBody),
    ),
)]
pub async fn cancel(
    State(st): State<AppState>,
    ApiPath(RolloutPath { id }): ApiPath<RolloutPath>,
) -> Result<Json<RolloutView>, ApiError> {
    let rec = st.store.cancel(&id).await?;
    st.retries.forget(&id);
    st.chains.forget(&id);
    Ok(Json(st.view(rec)))
}

/// The rollout as the trainer takes it (the rollout JSONL shape): its
/// current attempt's calls, numbered, and its events.
#[utoipa::path(
    get,
    path = "/v1/rollouts/{id}/export",
    operation_id = "export_rollout",
    tag = "rollouts",
    security(("admin_key" = [])),
    params(RolloutPath),
    responses(
        (status = 200, description = "The exported rollout.", body = Rollout),
        (status = 404, description = "No such rollout.", body = ErrorBody),
    ),
)]
pub async fn export(
    State(st): State<AppState>,
    ApiPath(RolloutPath { id }): ApiPath<RolloutPath>,
) -> Result<Json<Rollout>, ApiError> {
    Ok(Json(st.store.export_rollout(&id).await?))
}

/// Queue a failed or cancelled rollout again, as its next attempt.
#[utoipa::path(
    post,
    path = "/v1/rollouts/{id}/retry",
    operation_id = "retry_rollout",
    tag = "rollouts",
    security(("admin_key" = [])),
    params(RolloutPath),
    responses(
        (status = 200, description = "The rollout, `queued` as its next attempt.",
         body = RolloutView),
        (status = 404, description = "No such rollout.", body = ErrorBody),
        (status = 409, description = "Its status cannot go back to `queued`.", body = ErrorBody),
    ),
)]
pub async fn retry(
    State(st): State<AppState>,
    ApiPath(RolloutPath { id }): ApiPath<RolloutPath>,
) -> Result<Json<RolloutView>, ApiError> {
    Ok(Json(st.view(st.store.retry(&id).await?)))
}

/// The longest `GET /v1/changes` holds a request.
const MAX_WAIT_MS: u64 = 60_000;

/// Wait for the store's change counter to move.
///
/// Answers once the counter differs from `after`, or after `wait_ms`: a
/// trainer elsewhere (`agl train`) waits on rollouts with it instead of
/// polling each one.
#[utoipa::path(
    get,
    path = "/v1/changes",
    operation_id = "wait_changes",
    tag = "rollouts",
    security(("admin_key" = [])),
    params(WaitChanges),
    responses((status = 200, description = "The counter now.", body = Changes)),
)]
pub async fn changes(
    State(st): State<AppState>,
    ApiQuery(q): ApiQuery<WaitChanges>,
) -> Result<Json<Changes>, ApiError> {
    if q.wait_ms > MAX_WAIT_MS {
        return Err(ApiError::bad_request(format!(
            "wait_ms must be at most {MAX_WAIT_MS}"
        )));
    }
    let mut rx = st.store.changes();
    let wait = std::time::Duration::from_millis(q.wait_ms);
    let _ = tokio::time::timeout(wait, rx.wait_for(|g| *g != q.after)).await;
    let generation = *rx.borrow();
    Ok(Json(Changes { generation }))
}
