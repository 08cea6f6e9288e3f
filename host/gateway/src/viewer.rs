//! The rollout viewer: `/ui`, a page served from the binary (`ui/`: plain
//! HTML, CSS and JS, nothing fetched from elsewhere), and the management
//! API routes it reads beyond the rollout ones: `GET /v1/steps` (the run's
//! `metrics.jsonl`) and `GET /v1/rollouts/{id}/samples` (what the hosting
//! process's adapter makes of a rollout). The page holds no data itself:
//! it asks the API with the admin key the user types in (kept in the
//! browser session only), so the API's auth is the viewer's.

use std::path::PathBuf;
use std::sync::Arc;

use axum::extract::State;
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use axum::response::{IntoResponse, Json, Response};

use super::AppState;
use super::error::ApiError;
use super::extract::ApiPath;
use super::plugins::PluginFuture;
use agl_wire::api::{RolloutPath, SampleList, StepList};
use agl_wire::error::ErrorBody;
use agl_wire::rollout::Rollout;

/// What the process hosting the gateway makes of a rollout for the
/// viewer: its adapter's samples, decoded, and its reward. `agl run` and
/// `agl serve` with `plugins.adapter` set register one.
pub trait SampleViewer: Send + Sync {
    fn samples(&self, rollout: Rollout) -> PluginFuture<'_, SampleList>;
}

pub type SharedSampleViewer = Arc<dyn SampleViewer>;

/// Where the viewer's data comes from besides the store.
#[derive(Clone, Default)]
pub struct ViewerSources {
    /// The run's `metrics.jsonl`.
    pub metrics_file: Option<PathBuf>,
    pub samples: Option<SharedSampleViewer>,
}

/// The run's step records (its `metrics.jsonl`), oldest first.
///
/// Empty when the gateway knows of no run, or the run has no step yet.
#[utoipa::path(
    get,
    path = "/v1/steps",
    operation_id = "list_steps",
    tag = "viewer",
    security(("admin_key" = [])),
    responses((status = 200, description = "Every step so far.", body = StepList)),
)]
pub async fn steps(State(st): State<AppState>) -> Result<Json<StepList>, ApiError> {
    let Some(path) = &st.viewer.metrics_file else {
        return Ok(Json(StepList { steps: Vec::new() }));
    };
    let text = match tokio::fs::read(path).await {
        Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(ApiError::internal(format!("{}: {e}", path.display()))),
    };
    let (steps, _torn) = agl_wire::metrics::parse_records(&text)
        .map_err(|e| ApiError::internal(format!("{}: {e}", path.display())))?;
    Ok(Json(StepList { steps }))
}

/// A rollout's training samples as the hosting process's adapter builds
/// them, decoded with the policy's tokenizer, and its reward.
#[utoipa::path(
    get,
    path = "/v1/rollouts/{id}/samples",
    operation_id = "rollout_samples",
    tag = "viewer",
    security(("admin_key" = [])),
    params(RolloutPath),
    responses(
        (status = 200, description = "The samples of the current attempt.", body = SampleList),
        (status = 404, description = "No such rollout, or this gateway builds no samples \
            (`agl serve` without `plugins.adapter`).", body = ErrorBody),
        (status = 422, description = "The adapter failed on this rollout.", body = ErrorBody),
    ),
)]
pub async fn samples(
    State(st): State<AppState>,
    ApiPath(RolloutPath { id }): ApiPath<RolloutPath>,
) -> Result<Json<SampleList>, ApiError> {
    let viewer = st.viewer.samples.as_ref().ok_or_else(|| {
        ApiError::not_found(
            "this gateway builds no samples: start it with `agl run`, or `agl serve` with \
             plugins.adapter set",
        )
    })?;
    let rollout = st.store.export_rollout(&id).await?;
    Ok(Json(viewer.samples(rollout).await?))
}

const PAGE: &str = include_str!("../ui/index.html");
const SCRIPT: &str = include_str!("../ui/app.js");
const STYLE: &str = include_str!("../ui/style.css");

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [(CONTENT_TYPE, content_type), (CACHE_CONTROL, "no-cache")],
        body,
    )
        .into_response()
}

/// The rollout viewer: a page that asks this API with the admin key typed
/// into it (kept in the browser session only).
#[utoipa::path(
    get,
    path = "/ui",
    operation_id = "viewer_page",
    tag = "viewer",
    responses((status = 200, description = "The page.", content_type = "text/html",
               body = String)),
)]
pub async fn page() -> Response {
    asset("text/html; charset=utf-8", PAGE)
}

/// The viewer's script.
#[utoipa::path(
    get,
    path = "/ui/app.js",
    operation_id = "viewer_script",
    tag = "viewer",
    responses((status = 200, description = "The script.", content_type = "text/javascript",
               body = String)),
)]
pub async fn script() -> Response {
    asset("text/javascript; charset=utf-8", SCRIPT)
}

/// The viewer's style sheet.
#[utoipa::path(
    get,
    path = "/ui/style.css",
    operation_id = "viewer_style",
    tag = "viewer",
    responses((status = 200, description = "The style sheet.", content_type = "text/css",
               body = String)),
)]
pub async fn style() -> Response {
    asset("text/css; charset=utf-8", STYLE)
}
