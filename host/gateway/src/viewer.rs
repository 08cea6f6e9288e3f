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
use agl_wire::api::{SampleList, StepList};
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

/// `GET /v1/steps`.
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

/// `GET /v1/rollouts/{id}/samples`.
pub async fn samples(
    State(st): State<AppState>,
    ApiPath(id): ApiPath<String>,
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

/// `GET /ui`.
pub async fn page() -> Response {
    asset("text/html; charset=utf-8", PAGE)
}

/// `GET /ui/app.js`.
pub async fn script() -> Response {
    asset("text/javascript; charset=utf-8", SCRIPT)
}

/// `GET /ui/style.css`.
pub async fn style() -> Response {
    asset("text/css; charset=utf-8", STYLE)
}
