//! `/v1/rollouts`: batch create, list, get, patch status, cancel, retry.

use axum::extract::State;
use axum::response::Json;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::AppState;
use super::error::ApiError;
use super::extract::{ApiJson, ApiPath, ApiQuery};
use crate::rollout::{JsonText, ModelCall, RolloutStatus};
use crate::store::{Mode, NewRollout, RolloutRecord, state};

/// Longest caller-supplied rollout id accepted.
const MAX_ID_LEN: usize = 256;
/// Page size when the caller names none.
const DEFAULT_PAGE: u32 = 100;

/// A rollout as the API shows it: the stored record plus what an agent of it
/// needs (its proxy base URL and token).
#[derive(Serialize)]
pub struct RolloutView {
    pub id: String,
    pub group_id: String,
    pub mode: Mode,
    pub status: RolloutStatus,
    pub attempt: u32,
    pub reason: Option<String>,
    pub input: JsonText,
    pub config: JsonText,
    pub created_ms: u64,
    pub updated_ms: u64,
    pub proxy_base_url: String,
    pub token: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub calls: Option<Vec<ModelCall>>,
}

impl AppState {
    pub fn view(&self, r: RolloutRecord) -> RolloutView {
        RolloutView {
            proxy_base_url: format!(
                "{}/proxy/{}/{}/{}/openai/v1",
                self.public_base,
                r.id,
                r.attempt,
                r.mode.as_str()
            ),
            token: self.auth.rollout_token(&r.id),
            id: r.id,
            group_id: r.group_id,
            mode: r.mode,
            status: r.status,
            attempt: r.attempt,
            reason: r.reason,
            input: r.input,
            config: r.config,
            created_ms: r.created_ms,
            updated_ms: r.updated_ms,
            calls: None,
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateItem {
    #[serde(default, alias = "id")]
    rollout_id: Option<String>,
    #[serde(default)]
    group_id: String,
    #[serde(default = "train")]
    mode: Mode,
    #[serde(default)]
    input: JsonText,
    #[serde(default)]
    config: JsonText,
}

fn train() -> Mode {
    Mode::Train
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateBody {
    rollouts: Vec<CreateItem>,
}

pub async fn create(
    State(st): State<AppState>,
    ApiJson(body): ApiJson<CreateBody>,
) -> Result<Json<Value>, ApiError> {
    if body.rollouts.is_empty() {
        return Err(ApiError::bad_request("`rollouts` is empty"));
    }
    let mut batch = Vec::with_capacity(body.rollouts.len());
    for item in body.rollouts {
        if let Some(id) = &item.rollout_id
            && (id.is_empty() || id.len() > MAX_ID_LEN || id.contains('/'))
        {
            return Err(ApiError::bad_request(format!(
                "rollout_id must be 1..={MAX_ID_LEN} bytes without `/`"
            )));
        }
        batch.push(NewRollout {
            id: item.rollout_id,
            group_id: item.group_id,
            mode: item.mode,
            input: item.input,
            config: item.config,
        });
    }
    let created = st.store.create_rollouts(batch).await?;
    let views: Vec<RolloutView> = created.into_iter().map(|r| st.view(r)).collect();
    Ok(Json(json!({ "rollouts": views })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    status: Option<String>,
    cursor: Option<String>,
    limit: Option<u32>,
}

pub async fn list(
    State(st): State<AppState>,
    ApiQuery(q): ApiQuery<ListQuery>,
) -> Result<Json<Value>, ApiError> {
    let status = match q.status.as_deref() {
        None | Some("") => None,
        Some(s) => Some(
            state::parse_status(s)
                .ok_or_else(|| ApiError::bad_request(format!("unknown status `{s}`")))?,
        ),
    };
    let page = st
        .store
        .list_rollouts(status, q.cursor.as_deref(), q.limit.unwrap_or(DEFAULT_PAGE))
        .await?;
    let views: Vec<RolloutView> = page.rollouts.into_iter().map(|r| st.view(r)).collect();
    Ok(Json(
        json!({ "rollouts": views, "next_cursor": page.next_cursor }),
    ))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GetQuery {
    #[serde(default)]
    calls: bool,
}

pub async fn get(
    State(st): State<AppState>,
    ApiPath(id): ApiPath<String>,
    ApiQuery(q): ApiQuery<GetQuery>,
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

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PatchBody {
    attempt: u32,
    status: RolloutStatus,
    #[serde(default)]
    reason: Option<String>,
}

pub async fn patch(
    State(st): State<AppState>,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<PatchBody>,
) -> Result<Json<RolloutView>, ApiError> {
    let rec = st
        .store
        .set_status(&id, body.attempt, body.status, body.reason.as_deref())
        .await?;
    if crate::store::state::is_terminal(rec.status) {
        st.retries.forget(&id);
    }
    Ok(Json(st.view(rec)))
}

pub async fn cancel(
    State(st): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<RolloutView>, ApiError> {
    let rec = st.store.cancel(&id).await?;
    st.retries.forget(&id);
    Ok(Json(st.view(rec)))
}

pub async fn retry(
    State(st): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<RolloutView>, ApiError> {
    Ok(Json(st.view(st.store.retry(&id).await?)))
}
